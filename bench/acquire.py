"""Benchmark: N concurrent flanneld-style lease acquisitions against one real etcd.

Baseline, measured in the same run against the same etcd: N concurrent bare create-if-absent
transactions (etcd's own txn round trip, one client per node). The figure is the wall time
of the N acquisitions; the ratio is that time over the baseline's.

    .venv/bin/python -m bench.acquire --nodes 200 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
import uuid
from ipaddress import IPv4Address
from pathlib import Path

from flannel.lab.etcd import EtcdServer
from flannel.lease import LeaseAttrs
from flannel.subnet.etcd import EtcdSubnetManager
from flannel.subnet.etcdclient import EtcdClient, EtcdOptions, parse_endpoints


class RaceCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "took the subnet first" in record.getMessage():
            self.count += 1


async def connected_clients(endpoint: str, count: int) -> list[EtcdClient]:
    clients = [EtcdClient(EtcdOptions(parse_endpoints(endpoint))) for _ in range(count)]
    await asyncio.gather(*(c.get(b"/warm-up") for c in clients))
    return clients


async def baseline(clients: list[EtcdClient]) -> float:
    prefix = f"/bench-{uuid.uuid4().hex[:8]}/txn/"
    start = time.perf_counter()
    results = await asyncio.gather(*(
        c.create(f"{prefix}{i}".encode(), b'{"PublicIP":"0.0.0.0","PublicIPv6":null}')
        for i, c in enumerate(clients)))
    elapsed = time.perf_counter() - start
    assert all(ok for ok, _ in results)
    return elapsed


async def acquisitions(clients: list[EtcdClient]) -> float:
    prefix = f"/bench-{uuid.uuid4().hex[:8]}/network"
    await clients[0].put(f"{prefix}/config".encode(), b'{"Network": "10.0.0.0/8"}')
    managers = [EtcdSubnetManager(c, prefix) for c in clients]
    config = await managers[0].get_network_config()  # the daemon reads it once, before
    start = time.perf_counter()
    leases = await asyncio.gather(*(
        sm.acquire_lease(config, LeaseAttrs(
            public_ip=IPv4Address(int(IPv4Address("172.16.0.1")) + i)))
        for i, sm in enumerate(managers)))
    elapsed = time.perf_counter() - start
    assert len({lease.subnet for lease in leases}) == len(clients)
    return elapsed


async def run(nodes: int, rounds: int) -> None:
    races = RaceCounter()
    logging.getLogger("flannel.subnet.etcd").addHandler(races)
    logging.getLogger("flannel.subnet.etcd").setLevel(logging.INFO)
    with tempfile.TemporaryDirectory() as tmp, EtcdServer(Path(tmp)) as server:
        clients = await connected_clients(server.endpoint, nodes)
        try:
            base, acq = [], []
            for _ in range(rounds):
                base.append(await baseline(clients))
                acq.append(await acquisitions(clients))
        finally:
            await asyncio.gather(*(c.close() for c in clients))
    b, a = statistics.median(base), statistics.median(acq)
    print(f"nodes={nodes} rounds={rounds}")
    print(f"baseline: {nodes} concurrent create-if-absent txns: {b * 1000:.1f} ms (median)")
    print(f"figure:   {nodes} concurrent lease acquisitions:    {a * 1000:.1f} ms (median), "
          f"{a / nodes * 1000:.2f} ms per node, {races.count / rounds:.1f} lost races per round")
    print(f"ratio:    {a / b:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.nodes, args.rounds))


if __name__ == "__main__":
    main()
