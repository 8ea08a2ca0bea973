"""Benchmark: N concurrent flanneld-style lease acquisitions against one real etcd.

Baseline, measured in the same run against the same etcd: N concurrent bare create-if-absent
transactions (etcd's own txn round trip, one client per node). The figure is the wall time
of the N acquisitions; the ratio is that time over the baseline's.

    .venv/bin/python -m bench.acquire --nodes 200 --rounds 5
    .venv/bin/python -m bench.acquire --nodes 1000 --rounds 3 --network 10.0.0.0/12

Each node acquires as flanneld does (flannel.daemon.acquire_lease: a store that does not
answer is retried with backoff, any other error makes the node exit). Every round also
checks what a user would notice: no two nodes got the same subnet and no node exited (both
counts are printed and must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.daemon import acquire_lease as daemon_acquire
from flannel.lease import LeaseAttrs
from flannel.subnet.etcd.kv import EtcdKV
from flannel.subnet.etcd.manager import EtcdSubnetManager
from flannel_lab.etcd import EtcdServer

WARM_UP_BATCH = 50


class RaceCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "took the subnet first" in record.getMessage():  # a lost creation race
            self.count += 1


async def connected_clients(endpoint: str, count: int) -> list[EtcdClient]:
    clients = [EtcdClient(EtcdOptions(parse_endpoints(endpoint))) for _ in range(count)]
    # Connect in batches: a thousand simultaneous handshakes time out on a loaded machine.
    for i in range(0, count, WARM_UP_BATCH):
        await asyncio.gather(*(c.get(b"/warm-up") for c in clients[i:i + WARM_UP_BATCH]))
    return clients


async def baseline(clients: list[EtcdClient]) -> tuple[float, float]:
    """Wall time and this process's CPU time of the bare transactions."""
    prefix = f"/bench-{uuid.uuid4().hex[:8]}/txn/"
    start, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*(
        c.create(f"{prefix}{i}".encode(), b'{"PublicIP":"0.0.0.0","PublicIPv6":null}')
        for i, c in enumerate(clients)))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert all(created for created, _listing, _revision in results)
    return elapsed, cpu


@dataclass
class Outcome:
    elapsed: float
    cpu: float  # this process's CPU time: the client side of every simulated node
    duplicates: int  # nodes whose subnet another node also got
    failures: list[str]  # why nodes gave up (flanneld would exit)


async def acquisitions(clients: list[EtcdClient], network: str) -> Outcome:
    prefix = f"/bench-{uuid.uuid4().hex[:8]}/network"
    config = json.dumps({"Network": network, "SubnetLen": 24}).encode()
    await clients[0].put(f"{prefix}/config".encode(), config)
    managers = [EtcdSubnetManager(EtcdKV(c), prefix) for c in clients]
    config = await managers[0].get_network_config()  # the daemon reads it once, before
    first_ip = int(IPv4Address("172.16.0.1"))  # consecutive public IPs, as in a rack
    start, cpu = time.perf_counter(), time.process_time()
    stop = asyncio.Event()  # never set: nodes keep trying while the store is unavailable
    results = await asyncio.gather(*(
        daemon_acquire(sm, config, LeaseAttrs(public_ip=IPv4Address(first_ip + i)), stop)
        for i, sm in enumerate(managers)), return_exceptions=True)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    subnets = [r.subnet for r in results if not isinstance(r, BaseException)]
    failures = [str(r) for r in results if isinstance(r, BaseException)]
    return Outcome(elapsed, cpu, len(subnets) - len(set(subnets)), failures)


async def run(nodes: int, rounds: int, network: str) -> int:
    races = RaceCounter()
    logging.getLogger("flannel.subnet.etcd.manager").addHandler(races)
    logging.getLogger("flannel.subnet.etcd.manager").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp, EtcdServer(Path(tmp)) as server:
        clients = await connected_clients(server.endpoint, nodes)
        try:
            base, acq, lost, base_cpu, acq_cpu = [], [], [], [], []
            duplicates, failures = 0, []
            for _ in range(rounds):
                elapsed, cpu = await baseline(clients)
                base.append(elapsed)
                base_cpu.append(cpu)
                before = races.count
                outcome = await acquisitions(clients, network)
                acq.append(outcome.elapsed)
                acq_cpu.append(outcome.cpu)
                lost.append(races.count - before)
                duplicates += outcome.duplicates
                failures += outcome.failures
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    b, a = statistics.median(base), statistics.median(acq)
    print(f"nodes={nodes} rounds={rounds} network={network} (/24 subnets) "
          f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"baseline: {nodes} concurrent create-if-absent txns: {b * 1000:.1f} ms (median)")
    print(f"figure:   {nodes} concurrent lease acquisitions:    {a * 1000:.1f} ms (median), "
          f"{a / nodes * 1000:.2f} ms per node")
    print(f"lost races per round: {lost} (median {statistics.median(lost):g}, "
          f"{statistics.median(lost) / nodes:.1%} of nodes)")
    print(f"ratio:    {a / b:.2f}")
    bc, ac = statistics.median(base_cpu), statistics.median(acq_cpu)
    print(f"client CPU (this process, median): baseline {bc * 1000:.1f} ms, acquisitions "
          f"{ac * 1000:.1f} ms ({ac / nodes * 1000:.2f} ms per node, {ac / bc:.2f}x)")
    print(f"duplicate subnets: {duplicates}, nodes that gave up: {len(failures)}")
    for reason in sorted(set(failures)):
        print(f"  gave up: {reason}")
    return 1 if duplicates or failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--network", default="10.0.0.0/8",
                        help="the IPv4 Network of the config (SubnetLen 24)")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(run(args.nodes, args.rounds, args.network)))


if __name__ == "__main__":
    main()
