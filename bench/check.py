"""Benchmark: ``flannelctl check``'s probing of many peers, against one ``ping`` per peer.

One namespace where a local route makes every address of 10.50.0.0/16 answer. Per round
(variants interleaved, medians reported): the check's probing (``probe_all`` over one raw
socket: 3 echoes per peer 0.2 s apart) of N peers at two ``--parallel`` values, and the
baseline, iputils ``ping -c 3 -i 0.2`` per peer run by as many threads as the first
``--parallel``; wall time and CPU of this process and its children; the machine's 1-min
loadavg before each round.

    .venv/bin/python -m bench.check --peers 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from ipaddress import IPv4Network

from flannel.kernel.host import Host
from flannel.ops.check import PeerResult, probe_all
from flannel.ops.options import CheckOptions
from flannel.probing.icmp import Pinger
from tests.support import netns

COUNT, INTERVAL, TIMEOUT = 3, 0.2, 1.0


def cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def targets(n: int) -> list[str]:
    return [f"10.50.{i // 250}.{1 + i % 250}" for i in range(n)]


def run_check(ns: str, n: int, parallel: int) -> int:
    rows = [PeerResult(IPv4Network(f"{t}/32"), "", "vxlan", target=t) for t in targets(n)]
    with Host(ns).entered():
        pinger = Pinger([])
    args = CheckOptions(None, parallel=parallel, count=COUNT, interval=INTERVAL,
                        timeout=TIMEOUT, deadline=600)

    async def go() -> None:
        try:
            await probe_all(rows, pinger, args, "")
        finally:
            pinger.close()

    asyncio.run(go())
    return sum(row.verdict == "ok" for row in rows)


def run_ping(ns: str, n: int, parallel: int) -> int:
    ping = shutil.which("ping") or "ping"

    def one(target: str) -> bool:
        return subprocess.run(["ip", "netns", "exec", ns, ping, "-4", "-n", "-q", "-c",
                               str(COUNT), "-i", f"{INTERVAL:g}", "-W", f"{TIMEOUT:g}", target],
                              capture_output=True, timeout=30, check=False).returncode == 0

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return sum(pool.map(one, targets(n)))


def measure(run: Callable[[], int]) -> tuple[float, float, int]:
    start, used = time.monotonic(), cpu()
    ok = run()
    return time.monotonic() - start, cpu() - used, ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ns = netns.create("chk")
    try:
        netns.ip("route", "add", "local", "10.50.0.0/16", "dev", "lo", netns=ns)
        variants = {
            "check, --parallel 128": lambda: run_check(ns, args.peers, 128),
            "check, --parallel 256": lambda: run_check(ns, args.peers, 256),
            "ping per peer, 128 threads": lambda: run_ping(ns, args.peers, 128),
        }
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
        for round_ in range(args.rounds):
            names = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in names:
                load = os.getloadavg()[0]
                wall, used, ok = measure(variants[name])
                results[name].append((wall, used, ok))
                print(f"round {round_ + 1} {name}: {wall:.1f} s wall, {used:.1f} s CPU, "
                      f"{ok}/{args.peers} answered (load {load:.1f})", flush=True)
        base = statistics.median(r[1] for r in results["ping per peer, 128 threads"])
        for name, runs in results.items():
            wall = statistics.median(r[0] for r in runs)
            used = statistics.median(r[1] for r in runs)
            print(f"median {name}: {wall:.1f} s wall, {used:.2f} s CPU "
                  f"(CPU {used / base:.3f} of one ping per peer)")
    finally:
        netns.delete(ns)


if __name__ == "__main__":
    main()
