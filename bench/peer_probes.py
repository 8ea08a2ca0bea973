"""Benchmark: what flanneld's probes of its peers cost (CPU, RSS) with N peers, against the
same flanneld with the probes off, in the same run; and whether every peer is probed in time.

Model: a real flanneld (etcd mode, a real etcd; host-gw, so that a peer's overlay address is
reached through its public address on one segment) in a namespace ``P``; N synthetic leases
in etcd. Their public addresses (172.30.X.Y) are all held by one responder namespace ``R``
on the other end of P's veth, which also answers for every peer's gateway address (a
``local`` route for the peers' 10.96.0.0/11, the kernel's echo replies): so each probe is
answered, as on a healthy cluster, by a kernel, and costs flanneld one echo. P gets a
``cni0`` bridge holding its gateway address once subnet.env is written (what the probes leave
from), and permanent neighbour entries for the peers (the host's neighbour table limits
would refuse 5000 dynamic ones). Once the peers are programmed and after a settling
pause, flanneld's CPU time (utime + stime from /proc) is read over ``--window`` seconds, and
its RSS at the end; its /status says the probe period and how many probes reached a peer.
The two cases alternate in each round; medians are printed.

    .venv/bin/python -m bench.peer_probes --peers 5000 --window 60 --rounds 1
    .venv/bin/python -m bench.peer_probes --peers 100 --window 60 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.memory import PREFIX, ROOT, SETTLE, programmed, rss_kib, stop, wait_for
from flannel_lab.etcd import EtcdServer
from tests.support.checkout import FLANNELD

NETWORK = {"Network": "10.0.0.0/8", "SubnetLen": 24, "SubnetMin": "10.1.0.0",
           "SubnetMax": "10.1.0.0", "Backend": {"Type": "host-gw"}}
PEERS_RANGE = "10.96.0.0/11"  # every synthetic peer's subnet (10.100.0.0 to 10.119.x)
TICKS = os.sysconf("SC_CLK_TCK")
RESPONDER_MAC = "02:00:00:00:00:01"


def peer(i: int) -> tuple[str, str]:
    """(subnet, public IP) of synthetic peer ``i``."""
    return f"10.{100 + i // 250}.{i % 250}.0/24", f"172.30.{1 + i // 250}.{1 + i % 250}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=120, capture_output=True)


def make_namespaces(probe: str, responder: str, peers: int, workdir: Path) -> None:
    for name in (probe, responder):
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")
    ip("-n", probe, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns",
       responder)
    ip("-n", probe, "addr", "add", "172.30.0.2/16", "dev", "veth0")
    ip("-n", probe, "link", "set", "veth0", "up")
    # The neighbour table's limits are the host's (not per namespace): the peers' addresses
    # are permanent entries, which the limits do not count.
    ours = workdir / "probe.batch"
    ours.write_text("".join(f"neigh add {peer(i)[1]} lladdr {RESPONDER_MAC} dev veth0 nud "
                            "permanent\n" for i in range(peers)))
    ip("-n", probe, "-batch", str(ours))
    batch = workdir / "responder.batch"
    lines = [f"link set veth1 address {RESPONDER_MAC}", "addr add 172.30.0.1/16 dev veth1",
             "link set veth1 up",
             f"route add local {PEERS_RANGE} dev lo", "route add 10.1.0.0/24 via 172.30.0.2"]
    lines += [f"addr add {peer(i)[1]}/16 dev veth1" for i in range(peers)]
    batch.write_text("\n".join(lines) + "\n")
    ip("-n", responder, "-batch", str(batch))


def put_leases(ns: str, endpoint: str, peers: int) -> None:
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.peer_probes",
                    "--put-leases", endpoint, str(peers)], cwd=ROOT, check=True, timeout=600)


async def _put(endpoint: str, peers: int) -> None:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    try:
        await client.put(f"{PREFIX}/config".encode(), json.dumps(NETWORK).encode())
        for i in range(peers):
            subnet, public_ip = peer(i)
            value = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": "host-gw"}
            await client.put(f"{PREFIX}/subnets/{subnet.replace('/', '-')}".encode(),
                             json.dumps(value, separators=(",", ":")).encode())
    finally:
        await client.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def status(workdir: Path) -> dict:
    out = subprocess.run(["curl", "-s", "--max-time", "10", "--unix-socket",
                          str(workdir / "flanneld.sock"), "http://flanneld/status"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return json.loads(out)


def measure(ns: str, workdir: Path, endpoint: str, peers: int, window: float,
            probes: bool) -> dict:
    env_file = workdir / "subnet.env"
    env_file.unlink(missing_ok=True)
    log = (workdir / "flanneld.log").open("wb")
    flags = [f"--etcd-endpoints={endpoint}", f"--subnet-file={env_file}", "--iface=veth0"]
    if not probes:
        flags.append("--peer-probe-interval=0")
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *FLANNELD, *flags], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(f"flanneld with {peers} peers programmed",
                 lambda: programmed(proc, workdir, env_file, ns, peers), timeout=600)
        subprocess.run(["ip", "-n", ns, "link", "add", "cni0", "type", "bridge"],
                       capture_output=True, timeout=20, check=False)
        ip("-n", ns, "addr", "replace", "10.1.0.1/24", "dev", "cni0")
        ip("-n", ns, "link", "set", "cni0", "up")
        time.sleep(SETTLE)
        before, started = cpu_seconds(proc.pid), time.monotonic()
        first = status(workdir).get("probes") or {}
        time.sleep(window)
        cpu = (cpu_seconds(proc.pid) - before) / (time.monotonic() - started)
        rss = rss_kib(proc.pid)[0]
        last = status(workdir).get("probes") or {}
        reached = (last.get("probes") or {}).get("reached", 0) - \
            (first.get("probes") or {}).get("reached", 0)
        return {"cpu_percent": 100 * cpu, "rss_kib": rss,
                "period": last.get("period_seconds"), "probes_per_second": reached / window,
                "unreachable": last.get("unreachable"), "errors": last.get("errors"),
                "oldest": last.get("oldest_result_seconds")}
    finally:
        stop(proc, 30)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=5000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--put-leases", nargs=2, metavar=("ENDPOINT", "N"))
    args = parser.parse_args()
    if args.put_leases:
        import asyncio

        asyncio.run(_put(args.put_leases[0], int(args.put_leases[1])))
        return
    print(f"load average at start: {os.getloadavg()}")
    tag = f"pp{os.getpid()}"
    probe, responder = f"{tag}-p", f"{tag}-r"
    results: dict[bool, list[dict]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="peer-probes-") as tmp:
        workdir = Path(tmp)
        try:
            make_namespaces(probe, responder, args.peers, workdir)
            with EtcdServer(workdir / "etcd", netns=probe) as server:
                put_leases(probe, server.endpoint, args.peers)
                for _ in range(args.rounds):
                    for probes in (False, True):
                        reading = measure(probe, workdir, server.endpoint, args.peers,
                                          args.window, probes)
                        print(("probes on " if probes else "probes off"), reading, flush=True)
                        results[probes].append(reading)
        finally:
            for name in (probe, responder):
                subprocess.run(["ip", "netns", "delete", name], timeout=60,
                               capture_output=True, check=False)
    off = {k: statistics.median(r[k] for r in results[False]) for k in ("cpu_percent",
                                                                        "rss_kib")}
    on = {k: statistics.median(r[k] for r in results[True]) for k in ("cpu_percent",
                                                                      "rss_kib")}
    print(f"{args.peers} peers, window {args.window:g}s, {args.rounds} round(s); "
          f"load average at end: {os.getloadavg()}")
    print(f"CPU: off {off['cpu_percent']:.2f}% of a core, on {on['cpu_percent']:.2f}% "
          f"(+{on['cpu_percent'] - off['cpu_percent']:.2f})")
    print(f"RSS: off {off['rss_kib'] / 1024:.1f} MiB, on {on['rss_kib'] / 1024:.1f} MiB "
          f"(+{(on['rss_kib'] - off['rss_kib']) / 1024:.2f})")


if __name__ == "__main__":
    main()
