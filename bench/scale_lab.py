"""Benchmark: a 100-node lab (real etcd, one real flanneld per namespace node), end to end.

Phases, each printing the load average it ran under:
1. Mesh: node 1 is started alone (start -> subnet.env: the single-node baseline), then the
   other N-1 flanneld are started (at most --starting-at-once without a subnet yet) and the
   figure is the time from the first of them to the full mesh read from every node's kernel
   (N-1 routes of protocol 151 on each). Baseline: (N-1) x the single start, i.e. the same
   starts one after another with nothing to program.
2. Idle: CPU of every flanneld (its own and its reaped children's, e.g. iptables) over
   --idle-seconds after convergence, as % of one core, and RSS. Baseline, measured in the
   same window: a bare Python asyncio loop that wakes every 0.1 s (the floor any
   polling Python daemon pays).
3. Convergence: --joins synthetic peer leases PUT one at a time into etcd (each deleted
   before the next); figure: PUT -> route on every one of the N nodes (and on the first),
   and DELETE -> route gone on every node. Baseline: PUT -> the event on a bare etcd watch
   in the same driver process (the store's own notification latency).
4. Churn: --churn nodes leave (flanneld stopped, lease deleted, namespace removed) and as
   many join, while pings run at 10/s between --ping-pairs pairs of the remaining nodes;
   figure: first leave -> full mesh of the new set, and packets lost per pair.

    .venv/bin/python -m bench.scale_lab --nodes 100
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

from bench.converge import percentile
from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.kernel import events, rtnl
from flannel.kernel.host import Host
from flannel_lab.cli import decode_config
from flannel_lab.cluster import ETCD_PREFIX, Lab
from flannel_lab.mesh import (
    cpu_seconds,
    idle_cpu,
    ring,
    rss_bytes,
    start_nodes,
    start_pings,
    wait_full_mesh,
)

FLANNELD_ARGS = ("--ip-masq",)  # as flannel-lab up runs it
CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
IDLE_LOOP = "import asyncio\nasync def main():\n    while True:\n" \
            "        await asyncio.sleep(0.1)\nasyncio.run(main())\n"


def load() -> str:
    return "load " + " ".join(Path("/proc/loadavg").read_text().split()[:3])


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# -- convergence driver (runs in the underlay namespace, next to etcd) ----------------------

async def drive(endpoint: str, namespaces: list[str], joins: int) -> dict[str, list[float]]:
    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    loop = asyncio.get_running_loop()
    added: dict[str, dict[str, float]] = {}
    removed: dict[str, dict[str, float]] = {}
    watched: dict[str, float] = {}
    changed = asyncio.Event()
    socks = []

    async def read_routes(ns: str, sock) -> None:
        while True:
            data = await loop.sock_recv(sock, 1 << 20)
            now = time.perf_counter()
            for msg_type, _f, _s, body in rtnl.iter_messages(data):
                event = events.decode(msg_type, body)
                if event and isinstance(event.obj, rtnl.Route):
                    seen = removed if event.deleted else added
                    seen.setdefault(event.obj.dst, {}).setdefault(ns, now)
                    changed.set()

    prefix = f"{ETCD_PREFIX}/subnets/".encode()

    async def read_watch(revision: int) -> None:
        async for batch in client.watch(prefix, revision + 1):
            now = time.perf_counter()
            for ev in batch.events:
                watched.setdefault(ev.kv.key.decode().rsplit("/", 1)[1], now)

    async def until(done, deadline: float, what: str) -> None:
        while not done():
            changed.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise RuntimeError(f"{what} not seen within 30s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), min(remaining, 0.05))

    kvs, revision = await client.get_prefix(prefix)
    leased = {kv.key.decode().rsplit("/", 1)[1] for kv in kvs}
    free = [f"10.244.{k}.0-24" for k in range(255, 0, -1) if f"10.244.{k}.0-24" not in leased]
    tasks = [asyncio.create_task(read_watch(revision))]
    for ns in namespaces:
        sock = rtnl.open_socket(Host(ns), groups=rtnl.RTMGRP_IPV4_ROUTE)
        sock.setblocking(False)
        socks.append(sock)
        tasks.append(asyncio.create_task(read_routes(ns, sock)))
    out: dict[str, list[float]] = {"all": [], "first": [], "watch": [], "gone": []}
    try:
        for i in range(joins):
            key = free[i % len(free)]
            dst = key.replace("-", "/")
            for seen in (added, removed):
                seen.pop(dst, None)
            watched.pop(key, None)
            value = json.dumps({"PublicIP": f"192.168.111.{220 + i % 30}", "PublicIPv6": None,
                                "BackendType": "vxlan",
                                "BackendData": {"VNI": 1, "VtepMAC": f"0e:00:00:01:{i // 256:02x}"
                                                f":{i % 256:02x}"}}, separators=(",", ":"))
            start = time.perf_counter()
            await client.put(prefix + key.encode(), value.encode())
            await until(lambda d=dst, k=key: len(added.get(d, {})) == len(namespaces)
                        and k in watched, start + 30, f"route {dst} on every node")
            out["all"].append(max(added[dst].values()) - start)
            out["first"].append(min(added[dst].values()) - start)
            out["watch"].append(watched[key] - start)
            start = time.perf_counter()
            await client.delete(prefix + key.encode())
            await until(lambda d=dst: len(removed.get(d, {})) == len(namespaces), start + 30,
                        f"removal of {dst} on every node")
            out["gone"].append(max(removed[dst].values()) - start)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for sock in socks:
            sock.close()
        await client.close()
    return out


# -- phases --------------------------------------------------------------------------------

def phase_mesh(lab: Lab, nodes: int, at_once: int) -> dict:
    say(f"mesh: {load()}")
    single = start_nodes(lab, [1], *FLANNELD_ARGS, timeout=120)
    lab.attach_pod_bridge(1)
    say(f"single node start -> subnet.env: {single:.2f}s")
    rest = list(range(2, nodes + 1))
    start = time.monotonic()
    start_nodes(lab, rest, *FLANNELD_ARGS, starting_at_once=at_once, timeout=60 + 10 * nodes)
    took = wait_full_mesh(lab, list(range(1, nodes + 1)), timeout=300, since=start)
    baseline = single * len(rest)
    say(f"full mesh of {nodes} nodes ({nodes - 1} peer routes each, from the kernel) "
        f"{took:.1f}s after the first of {len(rest)} starts; baseline {len(rest)} x "
        f"{single:.2f}s = {baseline:.1f}s; ratio {took / baseline:.2f}; {load()}")
    for index in rest:
        lab.attach_pod_bridge(index)
    failed = [pair for pair in ring(list(range(1, nodes + 1))) if not lab.ping(*pair)]
    say(f"ring ping over {nodes} pairs: {'all ok' if not failed else f'FAILED {failed}'}")
    return {"mesh_s": took, "single_s": single, "ratio": took / baseline,
            "ring_failures": len(failed)}


def phase_idle(lab: Lab, seconds: float) -> dict:
    pids = [node.pid for node in lab.state.nodes]
    with subprocess.Popen([sys.executable, "-c", IDLE_LOOP]) as floor:
        try:
            time.sleep(3)  # settle: the floor's own start, the nodes' last log lines
            say(f"idle: measuring {len(pids)} flanneld over {seconds:g}s; {load()}")
            etcd_before = sum(cpu_seconds(lab.state.etcd_pid))
            cpu = idle_cpu([*pids, floor.pid], seconds)
            etcd = 100 * (sum(cpu_seconds(lab.state.etcd_pid)) - etcd_before) / seconds
        finally:
            floor.terminate()
    nodes, base = sorted(own + kids for own, kids in cpu[:-1]), cpu[-1][0]
    own = statistics.median(own for own, _ in cpu[:-1])
    kids = statistics.median(kids for _, kids in cpu[:-1])
    rss = [rss_bytes(pid) for pid in pids]
    say(f"idle CPU per flanneld: median {statistics.median(nodes):.3f}%, mean "
        f"{statistics.mean(nodes):.3f}%, max {nodes[-1]:.3f}% of a core (target < 0.5%; "
        f"median own {own:.3f}%, children {kids:.3f}%); "
        f"baseline asyncio loop waking at 10 Hz {base:.3f}%; ratio "
        f"{statistics.median(nodes) / base:.2f}; etcd {etcd:.2f}%; {load()}")
    say(f"RSS per flanneld: median {statistics.median(rss) / 2**20:.1f} MiB, max "
        f"{max(rss) / 2**20:.1f} MiB, total {sum(rss) / 2**30:.2f} GiB")
    return {"idle_median_pct": statistics.median(nodes), "idle_max_pct": nodes[-1],
            "own_pct": own, "children_pct": kids, "floor_pct": base,
            "rss_median_mib": statistics.median(rss) / 2**20}


def phase_joins(lab: Lab, joins: int) -> dict:
    say(f"convergence: {joins} joins, one at a time; {load()}")
    namespaces = [node.netns for node in lab.state.nodes]
    pids = [node.pid for node in lab.state.nodes]
    cpu_before = sum(sum(cpu_seconds(pid)) for pid in pids)
    result = subprocess.run(
        ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "bench.scale_lab",
         "--driver", lab.state.etcd_endpoint, ",".join(namespaces), "--joins", str(joins)],
        capture_output=True, text=True, timeout=60 + 60 * joins, check=False,
        cwd=Path(__file__).resolve().parent.parent)
    if result.returncode != 0:
        raise RuntimeError(f"convergence driver failed: {result.stderr[-2000:]}")
    cpu = sum(sum(cpu_seconds(pid)) for pid in pids) - cpu_before
    per_change = cpu / (2 * joins * len(pids))  # a join and a leave per round, on each node
    times = json.loads(result.stdout)
    for name, what in (("watch", "baseline PUT -> etcd watch event"),
                       ("first", "PUT -> route on the first node"),
                       ("all", f"PUT -> route on all {len(namespaces)} nodes"),
                       ("gone", f"DELETE -> route gone on all {len(namespaces)} nodes")):
        say(f"  {what}: p50 {ms(statistics.median(times[name]))}, "
            f"p99 {ms(percentile(times[name], 99))}")
    base, fig = times["watch"], times["all"]
    say(f"  ratio (all nodes / watch) p50 {statistics.median(fig) / statistics.median(base):.1f}"
        f", p99 {percentile(fig, 99) / percentile(base, 99):.1f}; {load()}")
    say(f"  flanneld CPU per lease change per node: {ms(per_change)} (all {len(pids)} nodes: "
        f"{ms(per_change * len(pids))} of CPU per change, on {os.cpu_count()} cores)")
    out = {name: (statistics.median(v), percentile(v, 99)) for name, v in times.items()}
    return {**out, "cpu_per_change_s": per_change}


def phase_churn(lab: Lab, nodes: int, churn: int, pairs: int, at_once: int) -> dict:
    leaving = list(range(nodes - churn + 1, nodes + 1))
    joining = list(range(nodes + 1, nodes + churn + 1))
    staying = [i for i in range(1, nodes + 1) if i not in leaving]
    step = max(1, len(staying) // (2 * pairs))
    chosen = staying[::step][:2 * pairs]
    ping_pairs = list(zip(chosen[::2], chosen[1::2], strict=False))
    say(f"churn: {churn} leave {leaving[0]}..{leaving[-1]}, {churn} join "
        f"{joining[0]}..{joining[-1]}; pings at 10/s on {ping_pairs}; {load()}")
    runs = start_pings(lab, ping_pairs, seconds=600)
    try:
        time.sleep(2)
        start = time.monotonic()
        for index in leaving:
            lab.remove_node(index)
        for index in joining:
            lab.add_node(index)
        start_nodes(lab, joining, *FLANNELD_ARGS, starting_at_once=at_once, timeout=300)
        for index in joining:
            lab.attach_pod_bridge(index)
        took = wait_full_mesh(lab, staying + joining, timeout=300, since=start)
        time.sleep(2)
    finally:
        counts = [run.stop() for run in runs]
    lost = {f"{r.src}->{r.dst}": sent - got for r, (sent, got) in zip(runs, counts,
                                                                      strict=True)}
    sent = sum(c[0] for c in counts)
    say(f"churn converged (full mesh of {len(staying) + churn}) {took:.1f}s after the first "
        f"leave; pings sent {sent}, lost per pair {lost}; {load()}")
    return {"churn_s": took, "sent": sent, "lost": sum(lost.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--joins", type=int, default=100)
    parser.add_argument("--churn", type=int, default=10)
    parser.add_argument("--ping-pairs", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=40)
    parser.add_argument("--starting-at-once", type=int, default=8)
    parser.add_argument("--driver", nargs=2, metavar=("ENDPOINT", "NAMESPACES"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        endpoint, namespaces = args.driver
        print(json.dumps(asyncio.run(drive(endpoint, namespaces.split(","), args.joins))))
        return
    text, _ = decode_config(CONFIG)
    print(f"scale lab: {args.nodes} nodes, vxlan, flanneld --ip-masq; {load()}; "
          f"{os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        lab = Lab(f"flscale{os.getpid() % 100000}", root=Path(tmp), progress=say)
        try:
            lab.create_underlay()
            lab.put_config(text)
            for index in range(1, args.nodes + 1):
                lab.add_node(index)
            results = {"mesh": phase_mesh(lab, args.nodes, args.starting_at_once)}
            results["idle"] = phase_idle(lab, args.idle_seconds)
            if args.joins:
                results["joins"] = phase_joins(lab, args.joins)
            if args.churn:
                results["churn"] = phase_churn(lab, args.nodes, args.churn, args.ping_pairs,
                                               args.starting_at_once)
            print(json.dumps(results), flush=True)
        finally:
            say("removing the lab")
            lab.down()


if __name__ == "__main__":
    main()
