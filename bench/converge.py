"""Benchmark: convergence of a join, from the lease PUT in etcd to the route on a node.

Builds a one-node vxlan lab, then (inside the lab's underlay namespace, where etcd is) puts
N synthetic peer leases one at a time and times, for each, the PUT -> RTM_NEWROUTE for the
peer's subnet in the node's namespace (the figure) and the PUT -> etcd watch event seen by a
bare watcher (the baseline: the store's own notification latency). Prints p50 and p99.

    .venv/bin/python -m bench.converge --joins 100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.kernel import events, rtnl
from flannel.kernel.host import Host
from flannel_lab.cli import build
from flannel_lab.cluster import ETCD_PREFIX, Lab


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


async def drive(endpoint: str, node_ns: str, joins: int) -> dict[str, list[float]]:
    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    sock = rtnl.open_socket(Host(node_ns), groups=rtnl.RTMGRP_IPV4_ROUTE)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    routes_seen: dict[str, float] = {}
    watch_seen: dict[str, float] = {}
    seen = asyncio.Event()

    async def read_routes() -> None:
        while True:
            data = await loop.sock_recv(sock, 1 << 20)
            now = time.perf_counter()
            for msg_type, _f, _s, body in rtnl.iter_messages(data):
                event = events.decode(msg_type, body)
                if event and not event.deleted and isinstance(event.obj, rtnl.Route):
                    routes_seen.setdefault(event.obj.dst, now)
                    seen.set()

    prefix = f"{ETCD_PREFIX}/subnets/".encode()

    async def read_watch(revision: int) -> None:
        async for batch in client.watch(prefix, revision + 1):
            now = time.perf_counter()
            for ev in batch.events:
                watch_seen.setdefault(ev.kv.key.decode().rsplit("/", 1)[1], now)
            seen.set()

    _, revision = await client.get_prefix(prefix)
    tasks = [asyncio.create_task(read_routes()), asyncio.create_task(read_watch(revision))]
    figure, baseline = [], []
    try:
        for i in range(joins):
            second, third = 100 + i // 250, i % 250
            key = f"10.{second}.{third}.0-24"
            dst = f"10.{second}.{third}.0/24"
            value = json.dumps({"PublicIP": f"192.168.111.{20 + i % 200}", "PublicIPv6": None,
                                "BackendType": "vxlan",
                                "BackendData": {"VNI": 1, "VtepMAC":
                                                f"0e:00:00:00:{second:02x}:{third:02x}"}},
                               separators=(",", ":"))
            start = time.perf_counter()
            await client.put(prefix + key.encode(), value.encode())
            deadline = start + 10
            while dst not in routes_seen or key not in watch_seen:
                seen.clear()
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(seen.wait(), remaining)
            if dst not in routes_seen:
                raise RuntimeError(f"no route for {dst} within 10s")
            figure.append(routes_seen[dst] - start)
            baseline.append(watch_seen[key] - start)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        sock.close()
        await client.close()
    return {"figure": figure, "baseline": baseline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--joins", type=int, default=100)
    parser.add_argument("--driver", nargs=2, metavar=("ENDPOINT", "NODE_NS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        print(json.dumps(asyncio.run(drive(*args.driver, args.joins))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(f"flconv{os.getpid() % 100000}", root=Path(tmp))
        try:
            build(lab, 1, {"Network": "10.0.0.0/8", "SubnetMin": "10.1.0.0",
                           "SubnetMax": "10.99.255.0", "Backend": {"Type": "vxlan"}})
            lab.wait_subnet_env(1)
            result = subprocess.run(
                ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "bench.converge",
                 "--joins", str(args.joins), "--driver", lab.state.etcd_endpoint,
                 lab.node_ns(1)], capture_output=True, text=True, check=True, timeout=600,
                cwd=Path(__file__).resolve().parent.parent)
        finally:
            lab.down()
    times = json.loads(result.stdout)
    fig, base = times["figure"], times["baseline"]
    print(f"joins={args.joins}, one at a time, flanneld vxlan on one lab node")
    print(f"  baseline PUT -> etcd watch event: p50 {statistics.median(base) * 1000:.2f} ms, "
          f"p99 {percentile(base, 99) * 1000:.2f} ms")
    print(f"  figure   PUT -> route in node:    p50 {statistics.median(fig) * 1000:.2f} ms, "
          f"p99 {percentile(fig, 99) * 1000:.2f} ms")
    print(f"  ratio    p50 {statistics.median(fig) / statistics.median(base):.2f}, "
          f"p99 {percentile(fig, 99) / percentile(base, 99):.2f}")


if __name__ == "__main__":
    main()
