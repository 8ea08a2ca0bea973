"""Benchmark: the cost of a /metrics scrape (and a /status answer) with N peers.

Figure: CPU milliseconds per scrape of a node that holds ``--peers`` remote leases (the lease
watcher's cache, a data plane status with every counter and histogram filled, rules, store,
readiness), taken two ways: rendering only (``HealthServer.answer``), and a full HTTP GET
over loopback to a running health server, as Prometheus does it (client and server CPU
both counted; its wall time too, which on a loaded machine includes waiting for a core).
Baselines, measured in the same run with rounds interleaved: an empty prometheus_client
registry rendered, the same node with no peer (the ratio to it is what the peers cost), and
a GET of /healthz over loopback (client and server CPU: the connection and the HTTP framing,
with nothing to render). Medians of the rounds.

    .venv/bin/python -m bench.metrics_scrape --peers 5000 --rounds 7

The target is a scrape under 10 ms with 5000 peers (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network

from prometheus_client import CollectorRegistry, generate_latest

from flannel.backend.hostgw import HostGwBackend
from flannel.config import parse_config
from flannel.daemon import COMPONENTS
from flannel.dataplane.loop import Dataplane
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs
from flannel.monitor.health import HealthServer
from flannel.monitor.nodestate import NodeState
from flannel.reporting.readiness import Readiness
from flannel.reporting.skips import SkippedRecords
from flannel.rules.manager import RulesStatus
from flannel.subnet.manager import StoreStatus
from flannel.subnet.watch import LeaseWatcher, Snapshot
from flannel_lab.etcd import free_port

CONFIG = parse_config('{"Network": "10.0.0.0/8", "Backend": {"Type": "host-gw"}}')
EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.0.2.1"), None,
                        IPv4Address("192.0.2.1"), None)
OWN = Lease(IPv4Network("10.0.0.0/24"), None,
            LeaseAttrs(public_ip=IPv4Address("192.0.2.1"), backend_type="host-gw"),
            expiration=time.time() + 86400, etcd_lease_id=7)


class Store:
    """What the node state reads of a subnet manager."""

    name = "etcd"

    def __init__(self) -> None:
        self.status = StoreStatus()
        self.status.relists, self.status.renewals, self.status.watching = 1, 12, True
        self.lease = OWN
        self.undecodable = SkippedRecords("lease")


def peer(i: int) -> Lease:
    return Lease(IPv4Network(((10 << 24) + ((i + 1) << 8), 24)), None,
                 LeaseAttrs(public_ip=IPv4Address((192 << 24) + (168 << 16) + i + 2),
                            backend_type="host-gw"), expiration=time.time() + 86400)


def node(peers: int) -> NodeState:
    """A node as a running flanneld holds it after programming ``peers`` peers."""
    readiness = Readiness(COMPONENTS)
    for component in COMPONENTS:
        readiness.report(component, True)
    state = NodeState(readiness, store=Store(), config=CONFIG)
    backend = HostGwBackend(EXT, CONFIG)
    backend.lease = OWN
    leases = [peer(i) for i in range(peers)]
    watcher = LeaseWatcher(OWN, CONFIG)
    watcher.apply(Snapshot([*leases, OWN]))
    dataplane = Dataplane(backend, readiness)
    dataplane.set_peers(watcher.leases)
    status = dataplane.status
    status.passes, status.programmed_peers = 40, peers
    status.applied.update(route=peers, neighbour=0, fdb=0)
    status.repaired.update(route=3, link=1)
    for i in range(1000):
        status.pass_durations.observe(0.0001 * (i % 500))
    # The desired state the last pass left (devices and routes are shown by /status).
    dataplane._last = backend.desired_state(
        leases, lambda ip: Route(str(ip), None, EXT.index))
    state.backend, state.dataplane, state.peers = backend, dataplane, watcher
    state.rules = RulesStatus(installed=True, reason="", mode="iptables-nft", checks=100)
    return state


def per_call_ms(fn: Callable[[], object], number: int) -> float:
    """CPU milliseconds per call: on a shared, loaded machine the wall time also counts
    the waits for a core, which are not the scrape's cost."""
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number * 1000


async def http_get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return data


async def http_ms(port: int, path: str, number: int) -> tuple[float, float]:
    """(CPU, wall) milliseconds per GET, client and server in this process."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(number):
        await http_get(port, path)
    return ((time.process_time() - cpu) / number * 1000,
            (time.perf_counter() - wall) / number * 1000)


async def run(peers: int, rounds: int, number: int) -> None:
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {peers} peers, "
          f"{rounds} rounds of {number} scrapes")
    big, empty_node = node(peers), node(0)
    servers = {"big": HealthServer(big.readiness.current, big),
               "none": HealthServer(empty_node.readiness.current, empty_node)}
    body = servers["big"].answer("GET", "/metrics").body
    assert b"flannel_peers_programmed " + str(float(peers)).encode() in body, body[-2000:]
    status = servers["big"].answer("GET", "/status", local=True).body
    empty_registry = CollectorRegistry()
    port = free_port()
    await servers["big"].start("127.0.0.1", port)
    figures: dict[str, list[float]] = {k: [] for k in (
        "empty registry", "metrics, no peer", "metrics", "metrics over HTTP",
        "HTTP, wall clock", "healthz over HTTP", "status")}
    try:
        for _ in range(rounds):
            figures["empty registry"].append(
                per_call_ms(lambda: generate_latest(empty_registry), number))
            figures["metrics, no peer"].append(
                per_call_ms(lambda: servers["none"].answer("GET", "/metrics"), number))
            figures["metrics"].append(
                per_call_ms(lambda: servers["big"].answer("GET", "/metrics"), number))
            cpu, wall = await http_ms(port, "/metrics", number)
            figures["metrics over HTTP"].append(cpu)
            figures["HTTP, wall clock"].append(wall)
            figures["healthz over HTTP"].append((await http_ms(port, "/healthz", number))[0])
            figures["status"].append(
                per_call_ms(lambda: servers["big"].answer("GET", "/status", local=True),
                            max(1, number // 10)))
    finally:
        await servers["big"].stop()
    median = {k: statistics.median(v) for k, v in figures.items()}
    print(f"/metrics is {len(body)} bytes, /status {len(status)} bytes")
    for name, value in median.items():
        print(f"{name:>18}: {value:8.3f} ms  (x{value / median['empty registry']:.0f} the "
              f"empty registry, x{value / median['metrics, no peer']:.2f} the node "
              "without peers)")
    verdict = "meets" if median["metrics over HTTP"] < 10 else "MISSES"
    print(f"scrape with {peers} peers over HTTP: {median['metrics over HTTP']:.3f} ms, "
          f"{verdict} the 10 ms target")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=50, help="scrapes per round and way")
    args = parser.parse_args()
    asyncio.run(run(args.peers, args.rounds, args.number))


if __name__ == "__main__":
    main()
