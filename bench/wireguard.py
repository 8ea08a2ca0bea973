"""Benchmark: TCP throughput through wireguard-go devices set up by the WireGuard engine.

Two namespaces joined by a 1500-MTU veth; each gets ``flannel-wg`` (wireguard-go, private
/run via ``flannel.wireguard.nsexec``) configured by ``WireguardDevice`` and
``WireguardPeers``. iperf3 single TCP stream through the tunnel, interleaved with the same
over the bare veth (the baseline, same run). Prints medians and the ratio.

    .venv/bin/python -m bench.wireguard --rounds 3 --seconds 5
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
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
