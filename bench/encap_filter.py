"""Benchmark: the encapsulation filter (``--encap-peers-only``) at N peers, in each rule
mode (nftables set, iptables-nft and iptables-legacy peers chain), in a namespace of its
own: the first install, one lease change (a node joins, another leaves) written as a
difference, and the periodic check (one listing, the whole set compared). Median of
``--rounds``, in milliseconds; the baseline is the first install in the same mode.

    .venv/bin/python -m bench.encap_filter --peers 100 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import secrets
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[100, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"{'mode':<16} {'peers':>6} {'install ms':>11} {'change ms':>10} {'check ms':>9} "
          f"{'change/install':>15}")
    for peers in args.peers:
        for mode in MODES:
            r = measure(mode, peers, args.rounds)
            print(f"{mode:<16} {peers:>6} {r['install']:>11.1f} {r['change']:>10.1f} "
                  f"{r['check']:>9.1f} {r['change'] / r['install']:>15.2f}")


if __name__ == "__main__":
    main()
