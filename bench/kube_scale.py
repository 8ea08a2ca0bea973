"""Benchmark: the lease watch at cluster scale, kube mode against the API-server test double
and etcd mode against a real etcd, with the same number of peers.

Three processes per mode: the *source* (kube: ``tests/support/kubeapi.py`` serving this node
and N annotated peer nodes; etcd: a writer in front of a real etcd holding the config and N
vxlan leases), the *driver* (the subnet manager's ``watch_leases`` feeding a ``LeaseWatcher``,
as the daemon's lease loop does, minus the kernel), and this orchestrator. Figures, each with
a baseline from the same rounds (rounds interleave figure and baseline; medians printed):

- initial sync: first snapshot applied by the LeaseWatcher, vs a bare list of the same
  objects from the same server (the kube client's ``list_nodes``; etcd ``get_prefix``):
  wall time, and the driver's own CPU (the source's share is not ours);
- RSS of the driver holding the synced cache (from /proc), vs the same process before;
- a storm of U updates that change nothing flannel publishes (kube: a heartbeat annotation
  and the Ready condition's heartbeat; etcd: every lease re-put with its value unchanged, as
  a renewal does): CPU per update and the lag behind the source, vs a bare watch consumer
  (the kube client's ``watch_nodes``; the etcd client's ``watch``) over the same storm; and the
  LeaseWatcher events and backend syncs (updates handed to the lease loop) it caused;
- a storm of U/10 updates that change a peer's public IP: the same, plus a check that every
  peer ends with its last published IP.

    .venv/bin/python -m bench.kube_scale --nodes 5000 --updates 50000 --rounds 3
    .venv/bin/python -m bench.kube_scale --nodes 1000 --updates 20000 --modes kube \
        --kubelet-nodes   # peers of a kubelet's size (status: conditions, 50 images)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.memory import NETWORK, PREFIX, peer

ROOT = Path(__file__).resolve().parents[1]
P = "flannel.alpha.coreos.com/"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:"))


def storm_ip(update: int, storm: int) -> str:
    """A public IP for ``update`` of public-IP storm number ``storm``: unique within a storm,
    and different from the previous storm's for the same peer."""
    return f"10.98.{(update // 250 + storm) % 250}.{1 + update % 250}"


def lease_value(i: int, public_ip: str | None = None) -> bytes:
    _subnet, ip, mac = peer(i)
    return json.dumps({"PublicIP": public_ip or ip, "PublicIPv6": None, "BackendType": "vxlan",
                       "BackendData": {"VNI": 1, "VtepMAC": mac}},
                      separators=(",", ":")).encode()


# -- sources ---------------------------------------------------------------------------------

async def lines():
    while line := await asyncio.to_thread(sys.stdin.readline):
        yield line.split()


def reply(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


async def serve_kube(nodes: int, kubelet: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.kubeapi import FakeKubeAPI, kubelet_node

    api = FakeKubeAPI()
    api.put_node("node0", ["10.1.0.0/24"])
    for i in range(nodes):
        subnet, public_ip, mac = peer(i)
        annotations = {
            P + "kube-subnet-manager": "true", P + "backend-type": "vxlan",
            P + "backend-data": json.dumps({"VNI": 1, "VtepMAC": mac}), P + "public-ip": public_ip}
        if kubelet:  # as a kubelet reports it: labels, managedFields, conditions, 50 images
            api.put_raw_node(f"peer{i}", kubelet_node(f"peer{i}", subnet, public_ip,
                                                      annotations=annotations))
        else:
            api.put_node(f"peer{i}", [subnet], annotations)
    await api.start()
    reply({"url": api.url})
    storms = 0
    async for _storm, kind, count in lines():
        storms += 1
        start, beat = time.time(), time.time()
        for update in range(int(count)):
            name = f"peer{update % nodes}"
            if kind == "noise":
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(beat + update))
                api.put_node(name, annotations={"example.com/heartbeat": stamp},
                             conditions=[{"type": "Ready", "status": "True",
                                          "lastHeartbeatTime": stamp}])
            else:
                api.put_node(name, annotations={P + "public-ip": storm_ip(update, storms)})
            if update % 64 == 63:
                await asyncio.sleep(0)  # let the watch streams run, as a real server would
        reply({"revision": api.rv, "done": time.time(), "seconds": time.time() - start})


async def serve_etcd(endpoint: str, nodes: int) -> None:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    prefix = f"{PREFIX}/subnets/"

    def key(i: int) -> bytes:
        return (prefix + peer(i)[0].replace("/", "-")).encode()

    async def put_all(pairs) -> int:
        revision = 0
        queue = list(pairs)
        async def worker():
            nonlocal revision
            while queue:
                k, v = queue.pop()
                revision = max(revision, await client.put(k, v))
        await asyncio.gather(*(worker() for _ in range(32)))
        return revision

    await client.put(f"{PREFIX}/config".encode(), json.dumps(NETWORK).encode())
    await put_all((key(i), lease_value(i)) for i in range(nodes))
    reply({"url": endpoint})
    storms = 0
    async for _storm, kind, count in lines():
        storms += 1
        start = time.time()
        revision = await put_all(
            (key(u % nodes),
             lease_value(u % nodes, None if kind == "noise" else storm_ip(u, storms)))
            for u in range(int(count)))
        reply({"revision": revision, "done": time.time(), "seconds": time.time() - start})
    await client.close()


# -- drivers ---------------------------------------------------------------------------------

class Driver:
    """Runs one consumer at a time (the manager, or a bare watch) and reports on it."""

    def __init__(self, mode: str, url: str, workdir: Path) -> None:
        self.mode, self.url, self.workdir = mode, url, workdir
        self.position = 0  # the newest revision/resourceVersion the consumer has seen
        self.task: asyncio.Task | None = None
        self.events: Counter[str] = Counter()
        self.syncs = 0
        self.watcher: Any = None
        self.closers: list = []

    def client(self) -> Any:
        if self.mode == "kube":
            from flannel.subnet.kube.manager import kube_client
            return kube_client(self.url, "", {})
        from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
        return EtcdClient(EtcdOptions(parse_endpoints(self.url)))

    async def bare_list(self) -> dict[str, Any]:
        client = self.client()
        start, cpu = time.perf_counter(), cpu_seconds()
        if self.mode == "kube":
            nodes, version = await client.list_nodes(lambda node: node)
            count = len(nodes)
            self.position = int(version)
        else:
            kvs, self.position = await client.get_prefix(f"{PREFIX}/subnets/".encode())
            count = len(kvs)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        self.closers.append(client)
        return {"seconds": seconds, "cpu": cpu, "objects": count}

    async def sync(self) -> dict[str, Any]:
        from flannel.lease import EventType, Lease, LeaseAttrs
        from flannel.subnet.watch import LeaseWatcher

        before = rss_kib()
        client = self.client()
        self.closers.append(client)
        if self.mode == "kube":
            from flannel.subnet.kube.annotations import Annotations
            from flannel.subnet.kube.manager import KubeSubnetManager
            conf = self.workdir / "net-conf.json"
            conf.write_text(json.dumps(NETWORK))
            sm = KubeSubnetManager(client, "node0", Annotations.for_prefix(P.rstrip("/")),
                                   str(conf))
            await sm.get_network_config()
        else:
            from flannel.subnet.etcd.kv import EtcdKV
            from flannel.subnet.etcd.manager import EtcdSubnetManager
            sm = EtcdSubnetManager(EtcdKV(client))
            watch = client.watch

            async def watch_and_note(*args: Any, **kwargs: Any):
                async for batch in watch(*args, **kwargs):
                    yield batch
                    self.position = batch.revision  # the lease loop is done with it

            client.watch = watch_and_note
        from ipaddress import IPv4Network
        self.watcher = LeaseWatcher(Lease(IPv4Network("10.1.0.0/24"), None, LeaseAttrs()))
        synced = asyncio.Event()
        start, cpu = time.perf_counter(), cpu_seconds()

        async def follow() -> None:
            updates = sm.watch_leases(await sm.get_network_config())
            async for update in updates:
                for event in self.watcher.apply(update).events:
                    if event.type is EventType.ADDED:
                        self.events[event.lease.key] += 1
                self.syncs += 1
                synced.set()

        self.task = asyncio.create_task(follow())
        await synced.wait()
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        if self.mode == "kube":
            # Seen = stored by the node watch and taken by the lease loop (nothing pending).
            self.position_of = lambda: (0 if sm._changed.is_set()
                                        else int(sm.resource_version or 0))
        return {"seconds": seconds, "cpu": cpu, "leases": len(self.watcher.leases),
                "rss_before_kib": before, "rss_kib": rss_kib()}

    async def bare_watch(self) -> dict[str, Any]:
        await self.bare_list()
        client = self.closers[-1]

        async def follow() -> None:
            if self.mode == "kube":
                async for _kind, node in client.watch_nodes(str(self.position)):
                    self.position = int(node["metadata"]["resourceVersion"])
            else:
                async for batch in client.watch(f"{PREFIX}/subnets/".encode(),
                                                self.position + 1):
                    self.position = batch.revision

        self.task = asyncio.create_task(follow())
        return {}

    def current(self) -> int:
        if self.watcher is not None and self.mode == "kube":
            return self.position_of()
        return self.position

    async def storm(self, revision: int) -> dict[str, Any]:
        """Wait until the consumer has seen ``revision``; CPU and wall time since ``mark``."""
        deadline = time.monotonic() + 600
        while self.current() < revision:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumer stuck at {self.current()} < {revision}")
            await asyncio.sleep(0.005)
        done = time.time()
        await asyncio.sleep(0.2)  # let the lease loop take the last coalesced batch
        return {"done": done, "cpu": cpu_seconds() - self.cpu0, "events": sum(self.events.values()),
                "nodes_with_events": len(self.events), "max_events_per_node":
                    max(self.events.values(), default=0), "syncs": self.syncs,
                "storm_ips": sum(1 for lease in (self.watcher.leases if self.watcher else [])
                                 if str(lease.attrs.public_ip).startswith("10.98."))}

    def mark(self) -> None:
        self.events.clear()
        self.syncs = 0
        self.cpu0 = cpu_seconds()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        for client in self.closers:
            await client.close()
        self.task, self.watcher, self.closers = None, None, []


async def drive(mode: str, url: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        driver = Driver(mode, url, Path(tmp))
        # Import the client and the manager first, so that RSS before a sync is the empty one.
        if mode == "kube":
            import flannel.subnet.kube.manager
        else:
            import flannel.subnet.etcd.manager  # noqa: F401
        await (driver.client()).close()
        reply({"ready": True})
        async for command, *rest in lines():
            if command == "list":
                result = await driver.bare_list()
            elif command == "sync":
                result = await driver.sync()
            elif command == "bare":
                result = await driver.bare_watch()
            elif command == "mark":
                driver.mark()
                result = {}
            elif command == "await":
                result = await driver.storm(int(rest[0]))
            else:
                await driver.stop()
                result = {}
            reply(result)


# -- orchestrator ----------------------------------------------------------------------------

class Proc:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.kube_scale", *args], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.first = self.read()

    def read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench process {self.proc.args[3:]} died")
        return json.loads(line)

    def ask(self, *words: Any) -> dict[str, Any]:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def storm(source: Proc, driver: Proc, kind: str, count: int) -> dict[str, Any]:
    driver.ask("mark")
    emitted = source.ask("storm", kind, count)
    seen = driver.ask("await", emitted["revision"])
    return {**seen, "source_seconds": emitted["seconds"], "lag": seen["done"] - emitted["done"],
            "cpu_per_update": seen["cpu"] / count}


def one_round(mode: str, source: Proc, driver: Proc, updates: int, manager_first: bool
              ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    order = ("manager", "bare") if manager_first else ("bare", "manager")
    for who in order:
        if who == "manager":
            out["sync"] = driver.ask("sync")
        else:
            out["list"] = driver.ask("list")
            driver.ask("stop")
            driver.ask("bare")
        out[f"{who}_noise"] = storm(source, driver, "noise", updates)
        out[f"{who}_ip"] = storm(source, driver, "ip", updates // 10)
        driver.ask("stop")
    return out


def med(rounds: list[dict], *path: str) -> float:
    values = []
    for r in rounds:
        value = r
        for part in path:
            value = value[part]
        values.append(value)
    return statistics.median(values)


def report(mode: str, nodes: int, updates: int, rounds: list[dict]) -> None:
    sync, base = med(rounds, "sync", "seconds"), med(rounds, "list", "seconds")
    print(f"{mode} mode, {nodes} peers, medians of {len(rounds)} rounds")
    print(f"  initial sync {sync * 1000:.0f} ms, bare list {base * 1000:.0f} ms, "
          f"ratio {sync / base:.2f}")
    sync_cpu, base_cpu = med(rounds, "sync", "cpu"), med(rounds, "list", "cpu")
    print(f"  initial sync, the driver's CPU {sync_cpu * 1000:.0f} ms, bare list "
          f"{base_cpu * 1000:.0f} ms, ratio {sync_cpu / base_cpu:.2f}")
    rss, rss0 = med(rounds, "sync", "rss_kib"), med(rounds, "sync", "rss_before_kib")
    print(f"  driver RSS {rss / 1024:.1f} MiB after sync, {rss0 / 1024:.1f} MiB before, "
          f"ratio {rss / rss0:.2f}")
    for kind, count in (("noise", updates), ("ip", updates // 10)):
        cpu, bare = (med(rounds, f"{who}_{kind}", "cpu_per_update") for who in ("manager", "bare"))
        lag, bare_lag = (med(rounds, f"{who}_{kind}", "lag") for who in ("manager", "bare"))
        source = med(rounds, f"manager_{kind}", "source_seconds")
        print(f"  storm {kind} x{count}: source {count / source:.0f} updates/s; CPU/update "
              f"{cpu * 1e6:.0f} us, bare watch {bare * 1e6:.0f} us, ratio {cpu / bare:.2f}; "
              f"lag after the source {lag:.2f} s (bare {bare_lag:.2f} s)")
        print(f"    lease events {[r[f'manager_{kind}']['events'] for r in rounds]}, on nodes "
              f"{[r[f'manager_{kind}']['nodes_with_events'] for r in rounds]}, max per node "
              f"{[r[f'manager_{kind}']['max_events_per_node'] for r in rounds]}, syncs "
              f"{[r[f'manager_{kind}']['syncs'] for r in rounds]}, peers with storm IPs "
              f"{[r[f'manager_{kind}']['storm_ips'] for r in rounds]}")


def run_mode(mode: str, nodes: int, updates: int, rounds: int, kubelet: bool = False
             ) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        etcd = None
        if mode == "kube":
            source = Proc("--serve-kube", str(nodes), *(["--kubelet-nodes"] if kubelet else []))
        else:
            from flannel_lab.etcd import EtcdServer
            etcd = EtcdServer(Path(tmp))
            etcd.start()
            source = Proc("--serve-etcd", etcd.endpoint, str(nodes))
        try:
            driver = Proc("--drive", mode, source.first["url"])
            try:
                for index in range(rounds):
                    results.append(one_round(mode, source, driver, updates, index % 2 == 0))
            finally:
                driver.close()
        finally:
            source.close()
            if etcd is not None:
                etcd.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--updates", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="kube,etcd")
    parser.add_argument("--kubelet-nodes", action="store_true",
                        help="kube mode: peers as a kubelet reports them (15 KB each: "
                             "managedFields, conditions, 50 images) rather than bare")
    parser.add_argument("--serve-kube", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-etcd", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--drive", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_kube is not None:
        asyncio.run(serve_kube(args.serve_kube, args.kubelet_nodes))
        return
    if args.serve_etcd:
        asyncio.run(serve_etcd(args.serve_etcd[0], int(args.serve_etcd[1])))
        return
    if args.drive:
        asyncio.run(drive(*args.drive))
        return
    print(f"load average at start: {Path('/proc/loadavg').read_text().strip()}")
    for mode in args.modes.split(","):
        report(mode, args.nodes, args.updates, run_mode(mode, args.nodes, args.updates,
                                                        args.rounds, args.kubelet_nodes))
        print(f"load average: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
