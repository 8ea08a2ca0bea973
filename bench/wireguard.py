"""Benchmark: TCP throughput through wireguard-go devices set up by the WireGuard engine.

Two namespaces joined by a 1500-MTU veth; each gets ``flannel-wg`` (wireguard-go, private
/run via ``flannel.kernel.nsexec``) configured by ``WireguardDevice`` and
``WireguardPeers``. iperf3 single TCP stream through the tunnel, interleaved with the same
over the bare veth (the baseline, same run). Prints medians and the ratio.

    .venv/bin/python -m bench.wireguard --rounds 3 --seconds 5

With ``--lab``: two 2-node labs built by flanneld itself, one with the wireguard backend and
one with kernel vxlan (the baseline), iperf3 between the nodes' pod addresses, rounds
interleaved between the two.

    .venv/bin/python -m bench.wireguard --lab --rounds 3 --seconds 5

It then measures the idle CPU of each lab's flanneld processes (the wireguard backend
re-checks its peers every 0.5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

from flannel.kernel.host import Host
from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.config import WireguardConfig, encode_lease_data
from flannel.wireguard.device import DeviceSpec, WireguardDevice
from flannel.wireguard.keys import generate_private_key, public_key
from flannel.wireguard.peers import LocalEndpoints, WireguardPeers, desired_peers

NETWORK = IPv4Network("10.79.0.0/16")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


def iperf(ns: str, server: str, seconds: int) -> float:
    out = subprocess.run(["ip", "netns", "exec", ns, "iperf3", "-J", "-c", server, "-t",
                          str(seconds)], capture_output=True, text=True, check=True,
                         timeout=seconds + 30).stdout
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9


def iperf_between(client_ns: str, bind: str, server: str, seconds: int) -> float:
    out = subprocess.run(["ip", "netns", "exec", client_ns, "iperf3", "-J", "-B", bind,
                          "-c", server, "-t", str(seconds)], capture_output=True, text=True,
                         check=True, timeout=seconds + 30).stdout
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9


def lab_main(args: argparse.Namespace) -> None:
    from flannel_lab.cli import build, wait_for_mesh
    from flannel_lab.cluster import Lab
    from flannel_lab.mesh import idle_cpu

    root = Path(tempfile.mkdtemp(prefix="wgbl", dir="/tmp"))
    tag = os.getpid() % 100000
    labs: dict[str, Lab] = {}
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for backend in ("wireguard", "vxlan"):
            lab = Lab(f"wgb{backend[0]}{tag}", root=root)
            labs[backend] = lab
            build(lab, 2, {"Network": "10.244.0.0/16", "Backend": {"Type": backend}})
            wait_for_mesh(lab, [1, 2], ipv6=False, timeout=60)
            servers.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.node_ns(2), "iperf3", "-s", "-B",
                 lab.pod_address(2)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)  # iperf3 -s has no readiness signal; a failed connect raises below
        results: dict[str, list[float]] = {b: [] for b in labs}
        loads = []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for backend, lab in labs.items():
                results[backend].append(iperf_between(lab.node_ns(1), lab.pod_address(1),
                                                      lab.pod_address(2), args.seconds))
        wg, vx = (statistics.median(results[b]) for b in ("wireguard", "vxlan"))
        for backend, figure in (("wireguard lab", wg), ("vxlan lab (baseline)", vx)):
            rounds = [round(x, 2) for x in results[backend.split()[0]]]
            print(f"{backend}: {figure:.2f} Gbit/s (rounds {rounds})")
        print(f"ratio: {wg / vx:.3f}; load average before rounds: "
              f"{[round(x, 2) for x in loads]}")
        # What the 0.5 s peer re-check costs an idle flanneld, against vxlan's.
        pids = [lab.node(i).pid for lab in labs.values() for i in (1, 2)]
        cpu = idle_cpu(pids, args.idle)
        for n, backend in enumerate(labs):
            own = [round(c[0], 2) for c in cpu[2 * n:2 * n + 2]]
            print(f"idle flanneld CPU over {args.idle}s, {backend}: {own} % of a core")
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for lab in labs.values():
            lab.down()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--lab", action="store_true",
                        help="the wireguard lab against a kernel vxlan lab")
    parser.add_argument("--idle", type=int, default=20,
                        help="with --lab: seconds of idle CPU measured per flanneld")
    args = parser.parse_args()
    if args.lab:
        lab_main(args)
        return
    tag = f"flwgb{os.getpid() % 100000}"
    names = [f"{tag}a", f"{tag}b"]
    run_dirs = [Path(tempfile.mkdtemp(prefix="wgb", dir="/tmp")) for _ in names]
    created: list[str] = []
    servers: list[subprocess.Popen] = []
    try:
        for ns in names:
            ip("netns", "add", ns)
            created.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", names[0], "link", "add", "ul0", "type", "veth", "peer", "name", "ul0",
           "netns", names[1])
        keys = [generate_private_key() for _ in names]
        leases = []
        for n, ns in enumerate(names, 1):
            ip("-n", ns, "addr", "add", f"192.168.79.{n}/24", "dev", "ul0")
            ip("-n", ns, "link", "set", "ul0", "up")
            leases.append(Lease(IPv4Network(f"10.79.{n}.0/24"), attrs=LeaseAttrs(
                public_ip=IPv4Address(f"192.168.79.{n}"), backend_type="wireguard",
                backend_data=encode_lease_data(public_key(keys[n - 1]), 51820))))
        cfg = WireguardConfig()
        layout = cfg.devices(True, False)[0]
        for i, ns in enumerate(names):
            base = leases[i].subnet.network_address
            device = WireguardDevice(DeviceSpec(
                "flannel-wg", 51820, cfg.device_mtu(1500), keys[i],
                addresses=((base, NETWORK),), routes=(NETWORK,), host=Host(ns),
                run_dir=run_dirs[i], log_path=run_dirs[i] / "wg.log"))
            device.ensure()
            WireguardPeers(device).reconcile(desired_peers(
                cfg, layout, [leases[1 - i]], LocalEndpoints(leases[i].attrs.public_ip)))
        servers.append(subprocess.Popen(["ip", "netns", "exec", names[1], "iperf3", "-s"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)  # iperf3 -s has no readiness signal; a failed connect raises below
        tunnel, veth, loads = [], [], []
        for _ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            tunnel.append(iperf(names[0], "10.79.2.0", args.seconds))
            veth.append(iperf(names[0], "192.168.79.2", args.seconds))
        t, v = statistics.median(tunnel), statistics.median(veth)
        print(f"wireguard-go TCP: {t:.2f} Gbit/s (rounds {[round(x, 2) for x in tunnel]})")
        print(f"veth baseline:    {v:.2f} Gbit/s (rounds {[round(x, 2) for x in veth]})")
        print(f"ratio: {t / v:.3f}; load average before rounds: "
              f"{[round(x, 2) for x in loads]}")
    finally:
        for server in servers:
            server.kill()
            server.wait()
        for ns in created:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True, check=False).stdout.split()
            for pid in pids:
                os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], check=False)
        for d in run_dirs:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
