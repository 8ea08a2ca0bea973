"""Benchmark: what state flanneld does not own costs it, on a node under churn.

Builds a one-node vxlan lab (flanneld running, its pod bridge ``cni0``) and gives it 20 peer
leases. Quiet phase: flanneld's CPU share (% of a core, from /proc) and peak RSS over a
window, then the time from the etcd PUT of a new peer lease to its route in the node's
kernel (a lease change programmed), and from the deletion of a peer's route to its return
(a deleted route repaired). Churn phase, same run: a veth port on ``cni0`` gets --fdb static
foreign FDB entries (``bridge -batch``; what a pod flooding random source MACs makes the
bridge learn), while a sender in the lab's underlay namespace floods the node's underlay
with ARP requests for its address from random MACs and 1000 addresses
(--arp-rate a second, stopped at the end of the phase or after --flood-max seconds); the
same figures are taken, printed with their ratio to the quiet ones, and the load average.

Targets: CPU <= 5 % of a core, RSS within 5 MiB of the quiet figure, a lease change within
200 ms, a deleted route repaired within 1 s.

    .venv/bin/python -m bench.churn --fdb 1000000 --arp-rate 5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flannel.kernel import events, rtnl
from flannel.kernel.host import Host
from flannel_lab.cli import build
from flannel_lab.cluster import ETCD_PREFIX, UNDERLAYS, Lab, ip

ROOT = Path(__file__).resolve().parents[1]
BASE_PEERS = 20
NODE_ADDRESS = f"{UNDERLAYS[0][0]}.11"  # node 1 of the lab
TICK = os.sysconf("SC_CLK_TCK")


def peer(i: int) -> tuple[str, str, str]:
    """(subnet, public IP, VTEP MAC) of synthetic peer ``i``."""
    second, third = 100 + i // 250, i % 250
    return (f"10.{second}.{third}.0/24", f"172.30.{1 + i // 250}.{1 + i % 250}",
            f"0e:00:00:00:{second:02x}:{third:02x}")


# -- in the underlay namespace: the driver and the ARP flood ---------------------------------

def ours(sock: rtnl.Rtnl) -> dict[str, rtnl.Route]:
    return {route.dst: route for route, proto, _table in sock.routes(socket.AF_INET)
            if proto == rtnl.RTPROT_FLANNEL}


async def drive(mode: str, endpoint: str, node_ns: str, first: int, count: int,
                repairs: int) -> dict[str, list[float]]:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    prefix = f"{ETCD_PREFIX}/subnets/"

    async def put(i: int) -> None:
        subnet, public_ip, mac = peer(i)
        value = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": "vxlan",
                 "BackendData": {"VNI": 1, "VtepMAC": mac}}
        await client.put(f"{prefix}{subnet.replace('/', '-')}".encode(),
                         json.dumps(value, separators=(",", ":")).encode())

    try:
        if mode == "setup":
            for i in range(count):
                await put(i)
            with rtnl.Rtnl(Host(node_ns)) as sock:
                deadline = time.monotonic() + 60
                while len(ours(sock)) < count:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the base peers' routes did not appear in 60 s")
                    await asyncio.sleep(0.1)
            return {}
        return await measure(node_ns, put, first, count, repairs)
    finally:
        await client.close()


async def measure(node_ns: str, put, first: int, count: int,
                  repairs: int) -> dict[str, list[float]]:
    sock = rtnl.open_socket(Host(node_ns), groups=rtnl.RTMGRP_IPV4_ROUTE)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    waiting: dict[str, asyncio.Future[float]] = {}

    async def read_routes() -> None:
        while True:
            data = await loop.sock_recv(sock, 1 << 20)
            now = time.perf_counter()
            for msg_type, _f, _s, body in rtnl.iter_messages(data):
                event = events.decode(msg_type, body)
                if event and not event.deleted and isinstance(event.obj, rtnl.Route):
                    future = waiting.pop(event.obj.dst, None)
                    if future is not None and not future.done():
                        future.set_result(now)

    async def timed(dst: str, act) -> float:
        future = waiting[dst] = loop.create_future()
        start = time.perf_counter()
        await act()
        try:
            return await asyncio.wait_for(future, 120) - start
        except TimeoutError:
            waiting.pop(dst, None)
            return float("inf")

    reader = asyncio.create_task(read_routes())
    out: dict[str, list[float]] = {"lease": [], "repair": []}
    try:
        for i in range(first, first + count):
            out["lease"].append(await timed(peer(i)[0], lambda i=i: put(i)))
            await asyncio.sleep(0.2)
        with rtnl.Rtnl(Host(node_ns)) as req:
            routes = ours(req)
            for j in range(repairs):
                route = routes[peer(j)[0]]

                async def delete(route: rtnl.Route = route) -> None:
                    failures = await asyncio.to_thread(req.run, [("delete", route)])
                    if failures:
                        raise failures[0]
                out["repair"].append(await timed(route.dst, delete))
                await asyncio.sleep(0.5)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        sock.close()
    return out


def flood(device: str, target: str, rate: int, limit: float) -> None:
    """ARP requests for ``target`` from random MACs and 1000 addresses of 172.16.0.0/16, so
    that every address's neighbour entry on the node changes as often as the kernel allows
    (once a second: locktime) without filling its table (gc_thresh3 is 1024), ``rate`` a
    second, until killed or ``limit`` seconds have passed."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind((device, 0))
    tpa = socket.inet_aton(target)
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < limit:
        due = int(elapsed * rate) - sent
        for _ in range(max(0, due)):
            mac = b"\x02" + os.urandom(5)
            host = int.from_bytes(os.urandom(2), "big") % 1000
            spa = bytes([172, 16, host >> 8, host & 255])
            sock.send(b"\xff" * 6 + mac + b"\x08\x06"
                      + struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + mac + spa
                      + b"\0" * 6 + tpa)
        sent += max(0, due)
        time.sleep(0.005)


# -- the node, from outside ------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")) / 1024


class Sampler:
    """flanneld's CPU share and peak RSS between ``start()`` and ``stop()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._cpu = self._at = 0.0

    def start(self) -> None:
        self.peak = rss_mib(self.pid)
        self._cpu, self._at = cpu_seconds(self.pid), time.monotonic()

    def sample(self) -> None:
        self.peak = max(self.peak, rss_mib(self.pid))

    def stop(self) -> float:
        self.sample()
        return 100 * (cpu_seconds(self.pid) - self._cpu) / (time.monotonic() - self._at)

    def watch(self, seconds: float) -> float:
        self.start()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.5)
            self.sample()
        return self.stop()


def driver(lab: Lab, node_ns: str, mode: str, first: int, count: int, repairs: int
           ) -> dict[str, list[float]]:
    result = subprocess.run(
        ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "bench.churn",
         "--driver", mode, lab.state.etcd_endpoint, node_ns, str(first), str(count),
         str(repairs)], capture_output=True, text=True, timeout=1200, cwd=ROOT, check=False)
    if result.returncode:
        raise RuntimeError(f"driver {mode}: {result.stderr[-2000:]}")
    return json.loads(result.stdout or "{}")


def load_fdb(node_ns: str, entries: int, workdir: Path) -> float:
    """``entries`` static FDB entries on a new port of cni0; the seconds it took."""
    ip(node_ns, "link", "add", "vethmac0", "type", "veth", "peer", "name", "vethmac1")
    ip(node_ns, "link", "set", "vethmac0", "master", "cni0", "up")
    ip(node_ns, "link", "set", "vethmac1", "up")
    batch = workdir / "fdb.batch"
    with batch.open("w") as out:
        for i in range(entries):
            out.write(f"fdb add 02:{i >> 32 & 255:02x}:{i >> 24 & 255:02x}:{i >> 16 & 255:02x}:"
                      f"{i >> 8 & 255:02x}:{i & 255:02x} dev vethmac0 master static\n")
    started = time.monotonic()
    subprocess.run(["bridge", "-n", node_ns, "-batch", str(batch)], check=True,
                   capture_output=True, timeout=1800)
    return time.monotonic() - started


def ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def ratio(figure: float, baseline: float) -> str:
    return f"{figure / baseline:.2f}x" if baseline > 0 else "n/a (quiet figure 0)"


def run(args: argparse.Namespace, workdir: Path) -> None:
    lab = Lab(f"flchurn{os.getpid() % 100000}", root=workdir)
    flooder: subprocess.Popen | None = None
    try:
        build(lab, 1, {"Network": "10.0.0.0/8", "SubnetMin": "10.1.0.0",
                       "SubnetMax": "10.99.255.0", "Backend": {"Type": "vxlan"}},
              flanneld_args=(f"--reconcile-interval={args.interval}",))
        lab.wait_subnet_env(1)
        node_ns, pid = lab.node_ns(1), lab.node(1).pid
        if b"flanneld" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            raise RuntimeError(f"process {pid} is not flanneld")
        driver(lab, node_ns, "setup", 0, BASE_PEERS, 0)
        sampler = Sampler(pid)
        time.sleep(3)  # settle after the base peers
        quiet_cpu = sampler.watch(args.window)
        quiet_rss = sampler.peak
        quiet = driver(lab, node_ns, "measure", 100, args.leases, args.repairs)
        print(f"quiet: cpu {quiet_cpu:.2f} % of a core, rss {quiet_rss:.1f} MiB, lease "
              f"{ms(quiet['lease']):.1f} ms, repair {ms(quiet['repair']):.1f} ms "
              f"(load {os.getloadavg()[0]:.2f})", flush=True)

        flooder = subprocess.Popen(
            ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "bench.churn",
             "--flood", "br0", NODE_ADDRESS, str(args.arp_rate), str(args.flood_max)],
            cwd=ROOT)
        sampler.start()
        took = load_fdb(node_ns, args.fdb, workdir)
        load_cpu = sampler.stop()
        load_rss = sampler.peak
        print(f"{args.fdb} FDB entries on cni0 in {took:.1f} s, with the ARP flood; flanneld "
              f"meanwhile: cpu {load_cpu:.2f} %, rss peak {load_rss:.1f} MiB", flush=True)
        churn_cpu = sampler.watch(args.window)
        churn_rss = max(sampler.peak, load_rss)
        churn = driver(lab, node_ns, "measure", 200, args.leases, args.repairs)
        sampler.sample()
        churn_rss = max(churn_rss, sampler.peak)
        flood_alive = flooder.poll() is None
        load = os.getloadavg()
        print(f"churn ({args.fdb} foreign FDB entries, ARP flood {args.arp_rate}/s"
              f"{'' if flood_alive else ', flood ended before the measures did'}):")
        rows = [
            ("cpu (% of a core, flood only)", churn_cpu, quiet_cpu, "%", churn_cpu <= 5),
            ("cpu (% of a core, FDB load)", load_cpu, quiet_cpu, "%", load_cpu <= 5),
            ("rss peak (MiB)", churn_rss, quiet_rss, "MiB", churn_rss - quiet_rss <= 5),
            ("lease change (ms, median)", ms(churn["lease"]), ms(quiet["lease"]), "ms",
             max(churn["lease"]) <= 0.2),
            ("route repair (ms, median)", ms(churn["repair"]), ms(quiet["repair"]), "ms",
             max(churn["repair"]) <= 1.0),
        ]
        for name, figure, baseline, unit, ok in rows:
            print(f"  {name:32} {figure:9.2f} {unit:3}  quiet {baseline:9.2f}  ratio "
                  f"{ratio(figure, baseline):>8}  target {'met' if ok else 'MISSED'}")
        print(f"  lease changes (ms): {[round(v * 1000, 1) for v in churn['lease']]}")
        print(f"  repairs (ms):       {[round(v * 1000, 1) for v in churn['repair']]}")
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if flooder is not None:
            flooder.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                flooder.wait(timeout=10)
            if flooder.poll() is None:
                flooder.kill()
                flooder.wait(timeout=10)
        lab.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fdb", type=int, default=1_000_000)
    parser.add_argument("--arp-rate", type=int, default=5000)
    parser.add_argument("--flood-max", type=float, default=600.0)
    parser.add_argument("--window", type=float, default=10.0,
                        help="seconds over which CPU and RSS are sampled")
    parser.add_argument("--leases", type=int, default=5)
    parser.add_argument("--repairs", type=int, default=3)
    parser.add_argument("--interval", type=int, default=30, help="flanneld's reconcile interval")
    parser.add_argument("--driver", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--flood", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        mode, endpoint, node_ns, first, count, repairs = args.driver
        print(json.dumps(asyncio.run(drive(mode, endpoint, node_ns, int(first), int(count),
                                           int(repairs)))))
        return
    if args.flood:
        device, target, rate, limit = args.flood
        with contextlib.suppress(KeyboardInterrupt):
            flood(device, target, int(rate), float(limit))
        return
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        run(args, Path(tmp))


if __name__ == "__main__":
    main()
