"""Benchmark: the encapsulation filter (``--encap-peers-only``) at N peers, in each rule
mode (nftables set, iptables-nft and iptables-legacy peers chain), in a namespace of its
own: the first install, one lease change (a node joins, another leaves) written as a
difference, and the periodic check (one listing, the whole set compared). Median of
``--rounds``, in milliseconds; the baseline is the first install in the same mode.
``--per-packet`` also times sending UDP datagrams to the filtered port from the peer the
filter matches last (iptables walks its chain in address order), against no filter: the
cost the filter adds to each encapsulated packet (best of 3 runs of 20000 sends).

    .venv/bin/python -m bench.encap_filter --peers 100 5000 --rounds 5 [--per-packet]
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from ipaddress import IPv4Address, ip_network

from flannel.kernel.host import Host
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules, peer_addresses

SPEC = FamilyRules(4, ip_network("10.42.0.0/16"), ip_network("10.42.1.0/24"), False, False,
                   encap_ports=(8472,))
MODES = {"nftables": (True, "auto"), "iptables-nft": (False, "nft"),
         "iptables-legacy": (False, "legacy")}


def addresses(count: int, first: int = 0) -> list[IPv4Address]:
    return [IPv4Address(int(IPv4Address("172.30.0.0")) + first + i) for i in range(count)]


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def measure(mode: str, peers: int, rounds: int) -> dict[str, float]:
    name = f"bench-encap-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        nft, iptables_mode = MODES[mode]
        traffic = TrafficManager([SPEC], nft, host=Host(name), iptables_mode=iptables_mode)
        traffic.prepare()
        base = addresses(peers)
        traffic.set_peers(peer_addresses(base))
        install = timed(traffic.ensure)
        changes, checks = [], []
        for n in range(rounds):
            # One node joins, the oldest leaves.
            current = base[n + 1:] + addresses(n + 1, peers)
            traffic.set_peers(peer_addresses(current))
            changes.append(timed(traffic.update_peers))
            checks.append(timed(traffic.ensure))
        assert traffic.rules.missing(traffic._peers) == "", "the set drifted"
        return {"install": install, "change": statistics.median(changes),
                "check": statistics.median(checks)}
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def per_packet(mode: str | None, peers: int, count: int = 20000) -> float:
    """Microseconds per datagram sent over a veth to the filtered port (see the docstring)."""
    node, sender = (f"bench-encap-{secrets.token_hex(4)}" for _ in range(2))
    for name in (node, sender):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        steps = [[node, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
                  sender], [node, "addr", "add", "10.60.0.1/24", "dev", "eth0"],
                 [sender, "addr", "add", "10.60.0.2/24", "dev", "eth0"],
                 [node, "link", "set", "eth0", "up"], [sender, "link", "set", "eth0", "up"]]
        for where, *step in steps:
            subprocess.run(["ip", "-n", where, *step], check=True)
        deadline = time.monotonic() + 30
        while subprocess.run(["ip", "netns", "exec", sender, "ping", "-c1", "-W1", "10.60.0.1"],
                             capture_output=True, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the veth pair never carried a ping")
        if mode is not None:
            nft, iptables_mode = MODES[mode]
            traffic = TrafficManager([SPEC], nft, host=Host(node), iptables_mode=iptables_mode)
            traffic.prepare()
            # Below the sender's address: it comes last in the peers chain.
            below = [IPv4Address(int(IPv4Address("10.1.0.0")) + i) for i in range(peers)]
            traffic.set_peers(peer_addresses([*below, IPv4Address("10.60.0.2")]))
            traffic.ensure()
        with Host(node).entered():
            receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with Host(sender).entered():
            out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with receiver, out:
            receiver.bind(("10.60.0.1", SPEC.encap_ports[0]))
            receiver.setblocking(False)
            out.bind(("10.60.0.2", 0))
            out.connect(("10.60.0.1", SPEC.encap_ports[0]))
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                for _ in range(count):
                    out.send(b"x" * 100)
                best = min(best, (time.perf_counter() - start) / count * 1e6)
                with contextlib.suppress(BlockingIOError):
                    while True:
                        receiver.recv(200)
            return best
    finally:
        for name in (node, sender):
            subprocess.run(["ip", "netns", "del", name], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-packet", action="store_true")
    args = parser.parse_args()
    print(f"{'mode':<16} {'peers':>6} {'install ms':>11} {'change ms':>10} {'check ms':>9} "
          f"{'change/install':>15}")
    for peers in args.peers:
        for mode in MODES:
            r = measure(mode, peers, args.rounds)
            print(f"{mode:<16} {peers:>6} {r['install']:>11.1f} {r['change']:>10.1f} "
                  f"{r['check']:>9.1f} {r['change'] / r['install']:>15.2f}")
    if args.per_packet:
        peers = max(args.peers)
        base = per_packet(None, peers)
        print(f"\nper datagram to the filtered port, sender last of {peers} peers")
        print(f"{'no filter':<16} {base:>7.2f} us")
        for mode in MODES:
            cost = per_packet(mode, peers)
            print(f"{mode:<16} {cost:>7.2f} us ({cost - base:+.2f})")


if __name__ == "__main__":
    main()
