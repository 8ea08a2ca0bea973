"""Benchmark: what a converged flanneld costs (CPU, RSS) with N peers and nothing changing,
with its probes of its peers off and on, against the same flanneld with no peer, in the same
run; and whether every peer is probed in time.

Model: a real flanneld (etcd mode, a real etcd; ``--backend`` host-gw or vxlan) in a
namespace ``P``; N synthetic leases in etcd. Their public addresses (172.30.X.Y) are all held
by one responder namespace ``R`` on the other end of P's veth, which also answers for every
peer's gateway address (a ``local`` route for the peers' 10.96.0.0/11, the kernel's echo
replies): so each probe is answered, as on a healthy cluster, by a kernel, and costs flanneld
one echo. host-gw reaches a peer through its public address on the segment; with vxlan, R
holds one VXLAN device that takes every peer's encapsulated traffic in (an nftables ingress
rule marks the frames, addressed to each peer's VTEP MAC, as its own) and sends the replies
back to P's VTEP. P gets a ``cni0`` bridge holding its gateway address once subnet.env is
written (what the probes leave from), and permanent neighbour entries for the peers' public
addresses (the host's neighbour table limits would refuse 5000 dynamic ones). Once the peers
are programmed and after a settling pause, flanneld's CPU time is read from /proc over
``--window`` seconds: its own (utime + stime) and that of the commands it ran and reaped
meanwhile (the rules' checks: iptables), and its RSS at the end; its /status says the probe
period and how many probes reached a peer. The baseline is the same flanneld with no peer
(its own etcd prefix, holding the config only), probes on. The cases alternate in each round;
medians are printed.

    .venv/bin/python -m bench.peer_probes --peers 5000 --window 60 --rounds 1
    .venv/bin/python -m bench.peer_probes --peers 5000 --backend vxlan --window 600 --rounds 1
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

from bench import memory
from bench.memory import PREFIX, ROOT, SETTLE, programmed, rss_kib, stop, wait_for
from flannel_lab.etcd import EtcdServer
from tests.support.checkout import FLANNELD

#: The no-peer baseline's etcd prefix: the same config, no lease but flanneld's own.
EMPTY_PREFIX = "/empty.coreos.com/network"
PEERS_RANGE = "10.96.0.0/11"  # every synthetic peer's subnet (10.100.0.0 to 10.119.x)
TICKS = os.sysconf("SC_CLK_TCK")
RESPONDER_MAC = "02:00:00:00:00:01"
VXLAN_PORT = "8472"  # the kernel's (and flannel's) default


def network(backend: str) -> dict:
    return {"Network": "10.0.0.0/8", "SubnetLen": 24, "SubnetMin": "10.1.0.0",
            "SubnetMax": "10.1.0.0", "Backend": {"Type": backend}}


def peer(i: int) -> tuple[str, str]:
    """(subnet, public IP) of synthetic peer ``i``."""
    return f"10.{100 + i // 250}.{i % 250}.0/24", f"172.30.{1 + i // 250}.{1 + i % 250}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=120, capture_output=True)


def make_namespaces(probe: str, responder: str, peers: int, workdir: Path,
                    backend: str) -> None:
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
             "link set veth1 up", f"route add local {PEERS_RANGE} dev lo"]
    if backend == "vxlan":
        lines += [f"link add vx0 type vxlan id 1 dstport {VXLAN_PORT} dev veth1 nolearning",
                  "link set vx0 up"]
    else:
        lines += ["route add 10.1.0.0/24 via 172.30.0.2"]
    lines += [f"addr add {peer(i)[1]}/16 dev veth1" for i in range(peers)]
    batch.write_text("\n".join(lines) + "\n")
    ip("-n", responder, "-batch", str(batch))
    if backend == "vxlan":
        # Each peer's frames are addressed to its own VTEP MAC, not vx0's: take them in.
        subprocess.run(["ip", "netns", "exec", responder, "nft", "-f", "-"], check=True,
                       timeout=60, capture_output=True, text=True, input=(
                           "table netdev peers {\n chain in {\n  type filter hook ingress "
                           "device vx0 priority 0;\n  meta pkttype set host\n }\n}\n"))


def answer_over_vxlan(probe: str, responder: str) -> None:
    """R's way back to P's pods over VXLAN: P's VTEP (flannel.1) MAC, known once flanneld made
    the device, as the next hop of P's subnet."""
    mac = json.loads(subprocess.run(
        ["ip", "-n", probe, "-j", "link", "show", "flannel.1"], capture_output=True,
        text=True, timeout=20, check=True).stdout)[0]["address"]
    for cmd in (["neigh", "replace", "10.1.0.0", "lladdr", mac, "dev", "vx0", "nud",
                 "permanent"],
                ["route", "replace", "10.1.0.0/24", "via", "10.1.0.0", "dev", "vx0", "onlink"]):
        ip("-n", responder, *cmd)
    subprocess.run(["bridge", "-n", responder, "fdb", "replace", mac, "dev", "vx0", "dst",
                    "172.30.0.2", "self", "permanent"], check=True, timeout=20,
                   capture_output=True)


def put_leases(ns: str, endpoint: str, peers: int, backend: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.peer_probes",
                    "--put-leases", endpoint, str(peers), backend], cwd=ROOT, check=True,
                   timeout=600)


async def _put(endpoint: str, peers: int, backend: str) -> None:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    config = json.dumps(network(backend)).encode()
    try:
        await client.put(f"{PREFIX}/config".encode(), config)
        await client.put(f"{EMPTY_PREFIX}/config".encode(), config)
        for i in range(peers):
            subnet, public_ip = peer(i)
            value: dict = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": backend}
            if backend == "vxlan":
                value["BackendData"] = {"VNI": 1, "VtepMAC": memory.peer(i)[2]}
            await client.put(f"{PREFIX}/subnets/{subnet.replace('/', '-')}".encode(),
                             json.dumps(value, separators=(",", ":")).encode())
    finally:
        await client.close()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(the process's own CPU time, that of its children it reaped), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return ((int(fields[11]) + int(fields[12])) / TICKS,
            (int(fields[13]) + int(fields[14])) / TICKS)


def status(workdir: Path) -> dict:
    out = subprocess.run(["curl", "-s", "--max-time", "10", "--unix-socket",
                          str(workdir / "flanneld.sock"), "http://flanneld/status"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return json.loads(out)


def measure(ns: str, responder: str, workdir: Path, endpoint: str, peers: int,
            window: float, probes: bool, backend: str) -> dict:
    env_file = workdir / "subnet.env"
    env_file.unlink(missing_ok=True)
    log = (workdir / "flanneld.log").open("wb")
    flags = [f"--etcd-endpoints={endpoint}", f"--subnet-file={env_file}", "--iface=veth0"]
    if not peers:
        flags.append(f"--etcd-prefix={EMPTY_PREFIX}")
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
        if backend == "vxlan" and peers:
            answer_over_vxlan(ns, responder)
        time.sleep(SETTLE)
        (own0, children0), started = cpu_seconds(proc.pid), time.monotonic()
        first = status(workdir).get("probes") or {}
        time.sleep(window)
        own, children = cpu_seconds(proc.pid)
        elapsed = time.monotonic() - started
        rss = rss_kib(proc.pid)[0]
        last = status(workdir).get("probes") or {}
        reached = (last.get("probes") or {}).get("reached", 0) - \
            (first.get("probes") or {}).get("reached", 0)
        return {"cpu_percent": 100 * (own - own0) / elapsed,
                "children_percent": 100 * (children - children0) / elapsed,
                "rss_kib": rss, "period": last.get("period_seconds"),
                "probes_per_second": reached / window,
                "unreachable": last.get("unreachable"), "errors": last.get("errors"),
                "oldest": last.get("oldest_result_seconds")}
    finally:
        stop(proc, 30)
        log.close()


CASES = (("no peers, probes on", False, True), ("probes off", True, False),
         ("probes on", True, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=5000)
    parser.add_argument("--backend", choices=("host-gw", "vxlan"), default="host-gw")
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--put-leases", nargs=3, metavar=("ENDPOINT", "N", "BACKEND"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.put_leases:
        import asyncio

        endpoint, count, backend = args.put_leases
        asyncio.run(_put(endpoint, int(count), backend))
        return
    print(f"load average at start: {os.getloadavg()}")
    tag = f"pp{os.getpid()}"
    probe, responder = f"{tag}-p", f"{tag}-r"
    results: dict[str, list[dict]] = {name: [] for name, _, _ in CASES}
    with tempfile.TemporaryDirectory(prefix="peer-probes-") as tmp:
        workdir = Path(tmp)
        try:
            make_namespaces(probe, responder, args.peers, workdir, args.backend)
            with EtcdServer(workdir / "etcd", netns=probe) as server:
                put_leases(probe, server.endpoint, args.peers, args.backend)
                for _ in range(args.rounds):
                    for name, with_peers, probes in CASES:
                        reading = measure(probe, responder, workdir, server.endpoint,
                                          args.peers if with_peers else 0, args.window,
                                          probes, args.backend)
                        print(f"{name:20s}", reading, flush=True)
                        results[name].append(reading)
        finally:
            for name in (probe, responder):
                subprocess.run(["ip", "netns", "delete", name], timeout=60,
                               capture_output=True, check=False)
    medians = {name: {k: statistics.median(r[k] for r in readings)
                      for k in ("cpu_percent", "children_percent", "rss_kib")}
               for name, readings in results.items()}
    base = medians["no peers, probes on"]
    print(f"{args.peers} peers, {args.backend}, window {args.window:g}s, {args.rounds} "
          f"round(s); load average at end: {os.getloadavg()}")
    for name, m in medians.items():
        print(f"{name:20s} CPU {m['cpu_percent']:.3f}% of a core "
              f"(+{m['cpu_percent'] - base['cpu_percent']:.3f} over no peers), commands it ran "
              f"{m['children_percent']:.3f}%, RSS {m['rss_kib'] / 1024:.1f} MiB "
              f"(+{(m['rss_kib'] - base['rss_kib']) / 1024:.2f})")


if __name__ == "__main__":
    main()
