"""Benchmark: apply a snapshot of N vxlan peers (route + neighbour + FDB entry each) to an
empty network namespace through the reconciler, against ``ip -batch`` / ``bridge -batch``
doing the same operations in a fresh namespace in the same run (the baseline).

    .venv/bin/python -m bench.apply --peers 1000 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.kernel.host import Host
from flannel.kernel.reconcile import DesiredState, reconcile
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route, Rtnl

VXLAN = "flannel.1"


def make_namespace(name: str) -> int:
    """A namespace with an underlay veth and a vxlan device; returns the device index."""
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "-n", name, "link", "set", "lo", "up"],
        ["ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
        ["ip", "-n", name, "addr", "add", "172.30.0.2/16", "dev", "eth0"],
        ["ip", "-n", name, "link", "set", "eth0", "up"],
        ["ip", "-n", name, "link", "set", "eth1", "up"],
        ["ip", "-n", name, "link", "add", VXLAN, "type", "vxlan", "id", "1", "local",
         "172.30.0.2", "dev", "eth0", "dstport", "8472", "nolearning"],
        ["ip", "-n", name, "link", "set", VXLAN, "up"],
    ]
    for step in steps:
        subprocess.run(step, check=True, capture_output=True)
    links = json.loads(subprocess.run(["ip", "-n", name, "-j", "link"], check=True,
                                      capture_output=True, text=True).stdout)
    return next(link["ifindex"] for link in links if link["ifname"] == VXLAN)


def desired(peers: int, index: int) -> DesiredState:
    routes, neighbours, fdb = set(), set(), set()
    for i in range(peers):
        subnet = IPv4Network((int(IPv4Address("10.128.0.0")) + i * 256, 24))
        base = str(subnet.network_address)
        mac = f"0e:00:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}"
        public = str(IPv4Address(int(IPv4Address("172.30.1.0")) + i))
        neighbours.add(Neighbour(index, base, mac))
        fdb.add(FdbEntry(index, mac, public))
        routes.add(Route(str(subnet), base, index, onlink=True))
    return DesiredState(frozenset(routes), frozenset(neighbours), frozenset(fdb),
                        frozenset({index}))


def ip_batch(name: str, state: DesiredState, workdir: Path) -> float:
    ip_lines = [f"neigh replace {n.ip} lladdr {n.mac} dev {VXLAN} nud permanent"
                for n in state.neighbours]
    ip_lines += [f"route replace {r.dst} via {r.gateway} dev {VXLAN} onlink"
                 for r in state.routes]
    bridge_lines = [f"fdb replace {f.mac} dev {VXLAN} dst {f.dst} self permanent"
                    for f in state.fdb]
    (workdir / "ip.batch").write_text("\n".join(ip_lines) + "\n")
    (workdir / "bridge.batch").write_text("\n".join(bridge_lines) + "\n")
    start = time.perf_counter()
    subprocess.run(["ip", "-n", name, "-batch", str(workdir / "ip.batch")], check=True)
    subprocess.run(["ip", "netns", "exec", name, "bridge", "-batch",
                    str(workdir / "bridge.batch")], check=True)
    return time.perf_counter() - start


def apply_snapshot(name: str, peers: int, index: int) -> float:
    """What one data plane pass does for a snapshot: desired state, dump, diff, apply."""
    start = time.perf_counter()
    sock = Rtnl(Host(name))
    try:
        changes = reconcile(sock, desired(peers, index))
        elapsed = time.perf_counter() - start
    finally:
        sock.close()
    assert changes.total() == 3 * peers, changes
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    name = f"flbench{os.getpid()}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for peers in args.peers:
                ours, base = [], []
                for _ in range(args.rounds):
                    index = make_namespace(name)
                    base.append(ip_batch(name, desired(peers, index), Path(tmp)))
                    index = make_namespace(name)
                    ours.append(apply_snapshot(name, peers, index))
                o, b = statistics.median(ours), statistics.median(base)
                print(f"peers={peers} ({3 * peers} netlink operations), median of "
                      f"{args.rounds}:")
                print(f"  baseline ip -batch + bridge -batch: {b * 1000:.0f} ms")
                print(f"  figure   reconciler snapshot apply: {o * 1000:.0f} ms "
                      "(desired state, kernel dump, diff, batched apply)")
                print(f"  ratio    {o / b:.2f}")
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


if __name__ == "__main__":
    main()
