"""Benchmark: a real flanneld from process start to /readyz 200 with N vxlan leases in etcd.

One etcd (Debian ``etcd-server``) holds the network config and N synthetic vxlan leases
under the default prefix, and the config alone under a second prefix (the 0-lease case).
Every start runs in a fresh network namespace (underlay ``veth0``, etcd restarted inside it
on its data dir), so the kernel holds nothing of a previous start: flanneld creates the vxlan
device, installs its masquerade and forward rules (``--ip-masq``), acquires a lease, lists
and programs every peer. A driver inside the namespace takes the time just before it spawns
the process and polls ``/readyz`` every 20 ms (``--poll``); once it answers 200 the driver
checks that the kernel holds a route, a permanent neighbour and an FDB entry per peer (so
"ready" means programmed) and stops flanneld. Our lease is deleted from etcd after each
start, so every start acquires a new subnet, as a new node does.

Cases, interleaved in every round (order alternating): a bare ``python -c 'import asyncio'``
of the same interpreter (spawn to exit), flanneld with 0 leases, and for each N of
``--peers`` flanneld with N leases and the floor for N. The floor is the work nobody
programming these peers can skip, in a fresh namespace of the same shape: a vxlan device made
as flanneld makes it, then the kernel's own ``ip -batch`` of the same neighbours, ``bridge
-batch`` of the same FDB entries and ``ip -batch`` of the same routes (in flanneld's order:
neighbours, FDB entries, routes, each by address or MAC), plus one bare range of the same
etcd keys through the gateway flanneld speaks to (the answer's bytes read, not decoded).
``ip`` sends one request a datagram where flanneld sends 256. Medians are printed, with the
load average, and the CPU time each process had used when ready (user and system apart,
reaped children included; the kernel's handling of flanneld's netlink requests is its
system time), which the machine's load disturbs less. The flannel package's bytecode is
written first, as an install or the image has it (``--source-only`` leaves it out).

    .venv/bin/python -m bench.startup --peers 5000 --rounds 5
    .venv/bin/python -m bench.startup --peers 5000 20000 --rounds 1
    .venv/bin/python -m bench.startup --peers 5000 --rounds 1 --profile /tmp/start.prof
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import ipaddress
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.memory import FLANNELD, NETWORK
from flannel_lab.etcd import EtcdServer

ROOT = Path(__file__).resolve().parents[1]
EMPTY_PREFIX = "/bench/empty"
VXLAN = "flannel.1"
#: Each /readyz answer costs flanneld's event loop ~0.25 ms: polled every 5 ms, the probe
#: took ~75 ms of the CPU a 5000-lease start needs; every 20 ms, a quarter of that, for a
#: figure at most 20 ms late (10 ms on average).
POLL = 0.02
TIMEOUT = 300.0
#: The node's underlay address; peers' public IPs are in the same /16, outside the Network.
NODE_IP = "172.20.0.2/16"


def peer(i: int) -> tuple[str, str, str]:
    """(subnet, public IP, VTEP MAC) of synthetic peer ``i``."""
    second, third = 100 + i // 250, i % 250
    return (f"10.{second}.{third}.0/24", f"172.20.{1 + i // 250}.{1 + i % 250}",
            f"0e:00:00:00:{second:02x}:{third:02x}")


def make_ns(name: str) -> None:
    for cmd in (["netns", "add", name], ["-n", name, "link", "set", "lo", "up"],
                ["-n", name, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
                ["-n", name, "addr", "add", NODE_IP, "dev", "veth0"],
                ["-n", name, "link", "set", "veth0", "up"],
                ["-n", name, "link", "set", "veth1", "up"],
                ["-n", name, "route", "add", "default", "via", "172.20.0.1"]):
        subprocess.run(["ip", *cmd], check=True, timeout=20, capture_output=True)


def readyz(port: int) -> int:
    """The HTTP status of GET /readyz on loopback (0 when nothing answers yet)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            head = sock.recv(64)
    except OSError:
        return 0
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time of a process and its reaped children (the kernel's work on
    our netlink requests is the system time)."""
    fields = [int(value) for value in
              Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:15]]
    tick = os.sysconf("SC_CLK_TCK")
    return (fields[0] + fields[2]) / tick, (fields[1] + fields[3]) / tick


def count_lines(*cmd: str) -> int:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    return len(out.splitlines())


def drive(endpoint: str, prefix: str, peers: int, workdir: Path, profile: str,
          poll: float) -> dict:
    """In the namespace: start flanneld, time it to /readyz 200, check the kernel, stop it."""
    port = 17000 + os.getpid() % 1000
    env_file = workdir / "subnet.env"
    cmd = [*FLANNELD]
    if profile:  # cProfile runs the launcher in flanneld's stead
        cmd = [sys.executable, "-m", "cProfile", "-o", profile, FLANNELD[-1]]
    cmd += [f"--etcd-endpoints={endpoint}", f"--etcd-prefix={prefix}", "--ip-masq",
            f"--subnet-file={env_file}", "--healthz-ip=127.0.0.1", f"--healthz-port={port}"]
    log_path = workdir / "flanneld.log"
    with log_path.open("wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = started + TIMEOUT
        while readyz(port) != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"flanneld exited: {log_path.read_text()[-3000:]}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"flanneld not ready in {TIMEOUT:g} s")
            time.sleep(poll)
        ready = time.perf_counter() - started
        user, system = cpu_seconds(proc.pid)
        routes = count_lines("ip", "-4", "route", "show", "proto", "151")
        neighbours = count_lines("ip", "-4", "neigh", "show", "dev", "flannel.1", "nud",
                                 "permanent")
        fdb = count_lines("bridge", "fdb", "show", "dev", "flannel.1")
        if not routes == neighbours == fdb == peers:
            raise RuntimeError(f"ready with {routes} routes, {neighbours} neighbours and "
                               f"{fdb} FDB entries; want {peers} of each")
        subnet = next(line.split("=", 1)[1] for line in env_file.read_text().splitlines()
                      if line.startswith("FLANNEL_SUBNET="))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return {"seconds": ready, "cpu": user + system, "user": user, "system": system,
            "subnet": subnet}


def bare() -> dict:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import asyncio"], check=True, timeout=60)
    elapsed = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"seconds": elapsed, "cpu": usage.ru_utime + usage.ru_stime,
            "user": usage.ru_utime, "system": usage.ru_stime}


def prefix_of(peers: int) -> str:
    """The etcd prefix holding the network config and ``peers`` leases."""
    return f"/bench/peers{peers}" if peers else EMPTY_PREFIX


def kernel_batches(peers: int, workdir: Path) -> list[list[str]]:
    """The commands the floor times: the same entries flanneld programs for ``peers``, in
    its order (neighbours, FDB entries, routes), each kind by address or MAC as it orders
    them on a first pass."""
    entries = [peer(i) for i in range(peers)]
    by_address = sorted(entries, key=lambda entry: ipaddress.ip_network(entry[0]))
    neighbours = [(subnet.split("/")[0], mac) for subnet, _, mac in by_address]
    fdb = sorted((mac, public_ip) for _, public_ip, mac in entries)  # same width: as numbers
    routes = [subnet for subnet, _, _ in by_address]
    batches = {
        "neigh": [f"neigh replace {ip} lladdr {mac} dev {VXLAN} nud permanent"
                  for ip, mac in neighbours],
        "fdb": [f"fdb replace {mac} dev {VXLAN} dst {dst} self permanent" for mac, dst in fdb],
        "route": [f"route replace {dst} via {dst.split('/')[0]} dev {VXLAN} onlink proto 151"
                  for dst in routes]}
    commands = []
    for kind, lines in batches.items():
        path = workdir / f"{kind}.batch"
        path.write_text("\n".join(lines) + "\n")
        commands.append(["bridge" if kind == "fdb" else "ip", "-batch", str(path)])
    return commands


def bare_range(endpoint: str, prefix: str) -> tuple[float, bytes]:
    """One range of ``prefix``'s keys through etcd's JSON gateway, the answer read whole."""
    from flannel.clients.etcd import prefix_range_end

    key = prefix.encode()
    body = json.dumps({"key": base64.b64encode(key).decode(),
                       "range_end": base64.b64encode(prefix_range_end(key)).decode()})
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.connect()  # flanneld's connection is open before it lists
        started = time.perf_counter()
        conn.request("POST", "/v3/kv/range", body, {"Content-Type": "application/json"})
        answer = conn.getresponse().read()
        return time.perf_counter() - started, answer
    finally:
        conn.close()


def floor(endpoint: str, prefix: str, peers: int, workdir: Path) -> dict:
    """In the namespace: the kernel's own batches of the same entries into a vxlan device
    made as flanneld makes it, and a bare range of the same keys; times in seconds."""
    for cmd in (["link", "add", VXLAN, "type", "vxlan", "id", "1", "local",
                 NODE_IP.split("/")[0], "dev", "veth0", "dstport", "8472", "nolearning"],
                ["link", "set", VXLAN, "mtu", "1450", "up"],
                ["addr", "add", "10.1.0.0/32", "dev", VXLAN]):
        subprocess.run(["ip", *cmd], check=True, timeout=20, capture_output=True)
    result: dict = {}
    for cmd in kernel_batches(peers, workdir):
        started = time.perf_counter()
        subprocess.run(cmd, check=True, timeout=TIMEOUT, capture_output=True)
        result[Path(cmd[-1]).stem] = time.perf_counter() - started
    result["range"], answer = bare_range(endpoint, f"{prefix}/subnets/")
    listed = int(json.loads(answer).get("count", 0))
    routes = count_lines("ip", "-4", "route", "show", "proto", "151")
    neighbours = count_lines("ip", "-4", "neigh", "show", "dev", VXLAN, "nud", "permanent")
    fdb = count_lines("bridge", "fdb", "show", "dev", VXLAN)
    if not listed == routes == neighbours == fdb == peers:
        raise RuntimeError(f"floor with {listed} keys listed, {routes} routes, {neighbours} "
                           f"neighbours and {fdb} FDB entries; want {peers} of each")
    result["kernel"] = result["neigh"] + result["fdb"] + result["route"]
    result["seconds"] = result["kernel"] + result["range"]
    return result


async def put_leases(endpoint: str, sizes: list[int]) -> None:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    config = json.dumps(NETWORK).encode()
    try:
        for peers in [0, *sizes]:
            prefix = prefix_of(peers)
            await client.put(f"{prefix}/config".encode(), config)
            for i in range(peers):
                subnet, public_ip, mac = peer(i)
                value = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": "vxlan",
                         "BackendData": {"VNI": 1, "VtepMAC": mac}}
                await client.put(f"{prefix}/subnets/{subnet.replace('/', '-')}".encode(),
                                 json.dumps(value, separators=(",", ":")).encode())
    finally:
        await client.close()


def in_ns(ns: str, *args: str, tree: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": tree} if tree else None
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.startup",
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"bench driver failed: {out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-floor", action="store_true",
                        help="leave out the kernel's and etcd's floor")
    parser.add_argument("--profile", default="",
                        help="run the largest N-lease flanneld under cProfile, writing this "
                             "file (one round is enough; the figure is then not comparable)")
    parser.add_argument("--keep-logs", default="",
                        help="copy each flanneld log into this directory")
    parser.add_argument("--tree", default="",
                        help="start the flannel package of this source tree instead of the "
                             "installed one")
    parser.add_argument("--compare", default="", metavar="TREE",
                        help="also start the flannel package of another source tree (e.g. "
                             "`git archive` of an earlier commit), interleaved")
    parser.add_argument("--source-only", action="store_true",
                        help="do not write the trees' bytecode first (flanneld then compiles "
                             "every module at every start if PYTHONDONTWRITEBYTECODE is set)")
    parser.add_argument("--poll", type=float, default=POLL,
                        help="seconds between two GET /readyz (default %(default)s)")
    parser.add_argument("--drive", nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--floor", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--put-leases", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        endpoint, prefix, peers, workdir, profile, poll = args.drive
        print(json.dumps(drive(endpoint, prefix, int(peers), Path(workdir), profile,
                               float(poll))))
        return
    if args.floor:
        endpoint, prefix, peers, workdir = args.floor
        print(json.dumps(floor(endpoint, prefix, int(peers), Path(workdir))))
        return
    if args.bare:
        print(json.dumps(bare()))
        return
    if args.put_leases:
        asyncio.run(put_leases(args.put_leases[0], [int(n) for n in args.put_leases[1:]]))
        print("{}")
        return

    if not args.source_only:
        # As installed (pip compiles on install, the image ships the bytecode of what
        # loads): flanneld must not compile its modules at every start, which it does when
        # PYTHONDONTWRITEBYTECODE is set and no bytecode was written yet.
        for tree in {str(ROOT), args.tree or str(ROOT), args.compare or str(ROOT)}:
            subprocess.run([sys.executable, "-m", "compileall", "-q", f"{tree}/flannel"],
                           check=True, timeout=300, stdout=subprocess.DEVNULL)
    sizes = sorted(set(args.peers))
    # name -> (kind, leases, source tree); kind: bare interpreter, flanneld or floor.
    cases: dict[str, tuple[str, int, str]] = {"bare": ("bare", 0, ""),
                                              "0 leases": ("flanneld", 0, args.tree)}
    if args.compare:
        cases["0 leases, compared tree"] = ("flanneld", 0, args.compare)
    for peers in sizes:
        cases[f"{peers} leases"] = ("flanneld", peers, args.tree)
        if args.compare:
            cases[f"{peers} leases, compared tree"] = ("flanneld", peers, args.compare)
        if not args.no_floor:
            cases[f"floor {peers}"] = ("floor", peers, "")
    results: dict[str, list[dict]] = {name: [] for name in cases}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EtcdServer(Path(tmp) / "etcd")
        seeded = False
        for round_no in range(args.rounds):
            names = list(cases)
            for index, name in enumerate(names if round_no % 2 == 0 else names[::-1]):
                kind, leases, tree = cases[name]
                prefix = prefix_of(leases)
                ns = f"flstart{os.getpid() % 100000}r{round_no}c{index}"
                workdir = Path(tmp) / ns
                workdir.mkdir()
                make_ns(ns)
                try:
                    server.netns = ns
                    server.start()
                    try:
                        if not seeded:
                            in_ns(ns, "--put-leases", server.endpoint, *map(str, sizes))
                            seeded = True
                        loads.append(os.getloadavg()[0])
                        if kind == "bare":
                            result = in_ns(ns, "--bare")
                        elif kind == "floor":
                            result = in_ns(ns, "--floor", server.endpoint, prefix, str(leases),
                                           str(workdir))
                        else:
                            profile = (args.profile if leases == sizes[-1] and tree == args.tree
                                       else "")
                            result = in_ns(ns, "--drive", server.endpoint, prefix, str(leases),
                                           str(workdir), profile, str(args.poll), tree=tree)
                            if args.keep_logs:
                                shutil.copy(workdir / "flanneld.log",
                                            Path(args.keep_logs) / f"{ns}.log")
                            subnet = ipaddress.ip_network(result["subnet"], strict=False)
                            key = str(subnet).replace("/", "-")
                            server.ctl("del", f"{prefix}/subnets/{key}")
                    finally:
                        server.stop()
                    results[name].append(result)
                    if kind == "floor":
                        detail = ", ".join(f"{part} {result[part] * 1000:.0f}"
                                           for part in ("neigh", "fdb", "route", "range"))
                    else:
                        detail = (f"CPU {result['cpu'] * 1000:6.0f} ms (user "
                                  f"{result['user'] * 1000:.0f}, system "
                                  f"{result['system'] * 1000:.0f})")
                    print(f"round {round_no + 1}: {name:28s} {result['seconds'] * 1000:8.1f} ms"
                          f", {detail}  (load {loads[-1]:.1f})", flush=True)
                finally:
                    subprocess.run(["ip", "netns", "del", ns], check=False, timeout=20)

    def median(name: str, field: str = "seconds") -> float:
        return float(statistics.median(result[field] for result in results[name]))

    print(f"medians of {args.rounds} round(s); load average {min(loads):.1f}-{max(loads):.1f}")
    for name, (kind, _, _) in cases.items():
        if kind == "floor":
            print(f"  {name:28s} {median(name) * 1000:8.1f} ms: ip -batch neighbours "
                  f"{median(name, 'neigh') * 1000:.0f}, bridge -batch FDB "
                  f"{median(name, 'fdb') * 1000:.0f}, ip -batch routes "
                  f"{median(name, 'route') * 1000:.0f}, etcd range "
                  f"{median(name, 'range') * 1000:.0f} ms")
        else:
            print(f"  {name:28s} {median(name) * 1000:8.1f} ms, CPU to ready "
                  f"{median(name, 'cpu') * 1000:6.0f} ms (user {median(name, 'user') * 1000:.0f}"
                  f", system {median(name, 'system') * 1000:.0f})")
    for suffix in ("", ", compared tree") if args.compare else ("",):
        for peers in sizes:
            many = f"{peers} leases"
            figure = median(many + suffix)
            line = (f"start -> /readyz 200 with {many}{suffix}: {figure * 1000:.1f} ms; ratio "
                    f"to 0 leases {figure / median('0 leases' + suffix):.2f}, to the bare "
                    f"interpreter {figure / median('bare'):.2f}")
            if not args.no_floor:
                base = median(f"floor {peers}")
                added = figure - median("0 leases" + suffix)
                line += (f", to the floor {figure / base:.2f}; what the leases add to the "
                         f"0-lease start {added * 1000:.0f} ms, {added / base:.2f}x the floor")
            print(line)
        if len(sizes) > 1:
            small, large = sizes[0], sizes[-1]
            growth = median(f"{large} leases{suffix}") / median(f"{small} leases{suffix}")
            line = f"growth {small} -> {large} leases{suffix}: start x{growth:.2f}"
            if not args.no_floor:
                big, little = f"floor {large}", f"floor {small}"
                kernel = median(big, "kernel") / median(little, "kernel")
                line += (f", floor x{median(big) / median(little):.2f} (kernel "
                         f"x{kernel:.2f})")
            print(line + f" for x{large / small:g} the peers")


if __name__ == "__main__":
    main()
