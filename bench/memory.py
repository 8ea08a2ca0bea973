"""Benchmark: resident memory (RSS) of a real flanneld, idle and with 1000 peers, in both modes.

Each run starts a network namespace with an underlay (veth0 and a default route), the store
inside it (etcd mode: a real etcd holding the config and N synthetic vxlan leases; kube mode:
the API-server test double ``tests/support/kubeapi.py`` serving this node and N annotated
peer nodes, ``--kubelet-nodes``: each a whole Node as a kubelet reports it, ~15 KB of JSON),
then flanneld with the vxlan backend (real devices, routes, neighbours and FDB
entries; masquerade and forward rules on). Once subnet.env is written and the kernel holds a
route per peer, and after a settling pause, VmRSS (and Pss) of the flanneld process is read
from /proc ("programmed"); then again once ``--passes`` periodic full passes (the data plane's
resync that reads the kernel's tables back, every ``--interval`` seconds here instead of the
default 30) have run ("steady"): what a converged flanneld holds, the figure the targets are
about; "peak" is VmHWM then, the most it held at any time (in kube mode, during the node
list). Baseline, in the same rounds: a bare ``python -c 'import asyncio'`` process of the
same interpreter. ``--compare TREE`` also runs the flanneld of another source tree (e.g. a
`git archive` of an earlier commit) in the same rounds, each case once per tree.
Rounds are interleaved; medians are printed.

    .venv/bin/python -m bench.memory --peers 1000 --rounds 3
    .venv/bin/python -m bench.memory --peers 5000 --rounds 1 --passes 3 --interval 10
    .venv/bin/python -m bench.memory --peers 5000 --rounds 1 --modes kube --kubelet-nodes
    .venv/bin/python -m bench.memory --peers 0 --rounds 3 --modes etcd --passes 1 \
        --interval 10 --compare /tmp/before    # idle, against the tree before
    .venv/bin/python -m bench.memory --imports   # where import-time memory goes (kube mode)
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

from flannel_lab.etcd import EtcdServer
from tests.support.checkout import FLANNELD

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "/coreos.com/network"
KUBE_PORT = 16443
SETTLE = 3.0
PASSES = 3  # --passes: periodic full passes before the steady reading
INTERVAL = 10  # --interval: flanneld's --reconcile-interval, seconds (more than SETTLE)
DAEMON_ENV: dict[str, str] = {}  # --daemon-env: extra environment for flanneld
KUBELET_NODES = False  # --kubelet-nodes: kube mode's nodes as kubelets report them
TREES = {"": FLANNELD}  # case suffix -> the flanneld command of a source tree (--compare)
NETWORK = {"Network": "10.0.0.0/8", "SubnetLen": 24, "Backend": {"Type": "vxlan"}}


def peer(i: int) -> tuple[str, str, str]:
    """(subnet, public IP, VTEP MAC) of synthetic peer ``i``."""
    second, third = 100 + i // 250, i % 250
    return (f"10.{second}.{third}.0/24", f"172.30.{1 + i // 250}.{1 + i % 250}",
            f"0e:00:00:00:{second:02x}:{third:02x}")


def programmed(proc: subprocess.Popen, workdir: Path, env_file: Path, ns: str,
               peers: int) -> bool:
    """Whether flanneld (logging to ``workdir``/flanneld.log) wrote ``env_file`` and its
    namespace ``ns`` holds a route of its own to ``peers`` peers; raises if it exited."""
    if proc.poll() is not None:
        raise RuntimeError(f"flanneld exited: {(workdir / 'flanneld.log').read_text()}")
    if not env_file.exists():
        return False
    routes = ns_run(ns, "ip", "-4", "route", "show", "proto", "151").splitlines()
    return sum(" via " in line for line in routes) >= peers

def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, Pss) in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines()
               if line.startswith("VmRSS:"))
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    pss = next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return rss, pss


def peak_kib(pid: int) -> int:
    """VmHWM (the most RSS the process ever held) in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmHWM:"))


def ns_run(ns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                          check=True, timeout=60).stdout


def make_ns(name: str) -> None:
    for cmd in (["netns", "add", name], ["-n", name, "link", "set", "lo", "up"],
                ["-n", name, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"],
                ["-n", name, "addr", "add", "172.30.0.2/16", "dev", "veth0"],
                ["-n", name, "link", "set", "veth0", "up"],
                ["-n", name, "link", "set", "veth1", "up"],
                ["-n", name, "route", "add", "default", "via", "172.30.0.1"]):
        subprocess.run(["ip", *cmd], check=True, timeout=20, capture_output=True)


def wait_for(what: str, check, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


#: (VmRSS, Pss) programmed, then (VmRSS, Pss) steady, then VmHWM (the peak) at steady.
Reading = tuple[int, int, int, int, int]


def measure_daemon(ns: str, workdir: Path, flags: list[str], peers: int,
                   env: dict[str, str] | None = None, flanneld: list[str] = FLANNELD
                   ) -> Reading:
    env_file = workdir / "subnet.env"
    log = (workdir / "flanneld.log").open("wb")
    proc = subprocess.Popen(["ip", "netns", "exec", ns, *flanneld, *flags, "--ip-masq",
                             f"--reconcile-interval={INTERVAL}",
                             f"--subnet-file={env_file}"], stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, **DAEMON_ENV, **(env or {})})
    try:
        wait_for(f"flanneld with {peers} peers programmed",
                 lambda: programmed(proc, workdir, env_file, ns, peers))
        time.sleep(SETTLE)
        first = rss_kib(proc.pid)
        # The periodic passes come every INTERVAL after the pass that programmed the peers:
        # read SETTLE after the last of PASSES.
        time.sleep(PASSES * INTERVAL)
        if proc.poll() is not None:
            raise RuntimeError(f"flanneld exited: {(workdir / 'flanneld.log').read_text()}")
        return (*first, *rss_kib(proc.pid), peak_kib(proc.pid))
    finally:
        stop(proc, 15)
        log.close()


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, then SIGKILL when ``proc`` has not exited within ``grace`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def run_etcd(ns: str, workdir: Path, peers: int, flanneld: list[str] = FLANNELD) -> Reading:
    with EtcdServer(workdir / "etcd", netns=ns) as server:
        subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.memory",
                        "--put-leases", server.endpoint, str(peers)],
                       cwd=ROOT, check=True, timeout=300)
        return measure_daemon(ns, workdir, [f"--etcd-endpoints={server.endpoint}"], peers,
                              flanneld=flanneld)


def run_kube(ns: str, workdir: Path, peers: int, flanneld: list[str] = FLANNELD) -> Reading:
    api = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "bench.memory",
                            "--serve-kubeapi", str(KUBE_PORT), str(peers),
                            str(int(KUBELET_NODES))],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        if not (api.stdout.readline() or "").startswith("listening"):
            raise RuntimeError("the API-server test double did not start")
        conf = workdir / "net-conf.json"
        conf.write_text(json.dumps(NETWORK))
        return measure_daemon(ns, workdir, ["--kube-subnet-mgr",
                                            f"--kube-api-url=http://127.0.0.1:{KUBE_PORT}",
                                            f"--net-config-path={conf}"], peers,
                              env={"NODE_NAME": "node0"}, flanneld=flanneld)
    finally:
        api.terminate()
        api.wait(timeout=10)


def run_baseline() -> Reading:
    proc = subprocess.Popen([sys.executable, "-c",
                             "import asyncio, sys; print(flush=True); sys.stdin.read()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        return (*rss_kib(proc.pid), *rss_kib(proc.pid), peak_kib(proc.pid))
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


# -- drivers (run inside the namespace) ------------------------------------------------------

async def put_leases(endpoint: str, peers: int) -> None:
    from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints

    client = EtcdClient(EtcdOptions(parse_endpoints(endpoint)))
    try:
        await client.put(f"{PREFIX}/config".encode(), json.dumps(NETWORK).encode())
        for i in range(peers):
            subnet, public_ip, mac = peer(i)
            key = subnet.replace("/", "-")
            value = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": "vxlan",
                     "BackendData": {"VNI": 1, "VtepMAC": mac}}
            await client.put(f"{PREFIX}/subnets/{key}".encode(),
                             json.dumps(value, separators=(",", ":")).encode())
    finally:
        await client.close()


async def serve_kubeapi(port: int, peers: int, kubelet: int) -> None:
    """Serve this node and ``peers`` annotated peers; ``kubelet``: each peer a whole Node as
    a kubelet reports it (``kubelet_node``, ~15 KB of JSON), else only what flannel reads."""
    sys.path.insert(0, str(ROOT))
    from tests.support.kubeapi import FakeKubeAPI, kubelet_node

    api = FakeKubeAPI()
    api.put_node("node0", ["10.1.0.0/24"])
    prefix = "flannel.alpha.coreos.com/"
    for i in range(peers):
        subnet, public_ip, mac = peer(i)
        annotations = {
            prefix + "kube-subnet-manager": "true", prefix + "backend-type": "vxlan",
            prefix + "backend-data": json.dumps({"VNI": 1, "VtepMAC": mac}),
            prefix + "public-ip": public_ip}
        if kubelet:
            api.put_raw_node(f"peer{i}", kubelet_node(f"peer{i}", subnet, public_ip,
                                                      annotations=annotations))
        else:
            api.put_node(f"peer{i}", [subnet], annotations)
    await api.start("127.0.0.1", port)
    print("listening", flush=True)
    await asyncio.Event().wait()


IMPORT_STEPS = (
    ("interpreter", ""),
    ("asyncio (ssl included)", "import asyncio"),
    ("flannel.cli (flags)", "from flannel import cli"),
    ("flannel.daemon (wiring, rules, rtnl, health)", "from flannel import daemon"),
    ("kube client (flannel.clients.kube.client, kubeconfig, flannel.clients.http, h11)",
     "from flannel import flags, subnet; subnet.open_store(flags.parse_args(['--kube-subnet-mgr', "
     "'--kube-api-url=http://127.0.0.1:1'], {}).store)"),
    ("vxlan backend, interface snapshot (links.py)", "from flannel.backend import backend_class; "
     "backend_class('vxlan'); from flannel.kernel import iface; iface.read_snapshot()"),
)
STEP_PROBE = """
import gc, sys
def rss():
    gc.collect()
    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS:'))
trace = sys.argv[1] == 'trace'
if trace:
    import tracemalloc
    tracemalloc.start(32)
for code in sys.argv[2:]:
    exec(code)
    if not trace:
        print(rss(), flush=True)
if trace:
    import importlib, os
    from collections import Counter
    by_module = Counter()
    for stat in tracemalloc.take_snapshot().statistics('traceback'):
        frames = [f.filename for f in stat.traceback]
        # Attribute to the innermost real source file: the module whose import or code
        # allocated (importlib's own frames only load what that module asked for).
        real = [f for f in frames if not f.startswith('<')]
        name = real[-1] if real else frames[-1]
        parts = name.split(os.sep)
        marker = next((m for m in ('site-packages', 'python3.11', 'python3.12', 'python3.13')
                       if m in parts[:-1]), None)
        if marker:
            name = parts[parts.index(marker) + 1]
        if 'flannel' in parts:
            name = 'flannel'
        by_module[name] += stat.size
    total = sum(by_module.values())
    print(f'{total}')
    for name, size in by_module.most_common(int(os.environ.get('TOP', '12'))):
        print(f'{size} {name}')
"""


def import_report(top: int) -> None:
    """RSS after each step of what a kube-mode vxlan flanneld loads, in a fresh interpreter,
    then tracemalloc's top allocators (Python heap, by package) over the same steps."""
    codes = [code or "pass" for _, code in IMPORT_STEPS]
    steps = subprocess.run([sys.executable, "-c", STEP_PROBE, "rss", *codes],
                           capture_output=True, text=True, check=True, timeout=120,
                           cwd=ROOT).stdout.split()
    previous = 0
    print("RSS after each step (fresh interpreter, kube mode, vxlan):")
    for (label, _), value in zip(IMPORT_STEPS, steps, strict=True):
        kib = int(value)
        print(f"  {kib / 1024:6.1f} MiB  (+{(kib - previous) / 1024:4.1f})  {label}")
        previous = kib
    lines = subprocess.run([sys.executable, "-c", STEP_PROBE, "trace", *codes],
                           capture_output=True, text=True, check=True, timeout=300, cwd=ROOT,
                           env={**os.environ, "TOP": str(top)}).stdout.splitlines()
    print(f"tracemalloc: {int(lines[0]) / 1024 / 1024:.1f} MiB of Python heap allocated by "
          "these steps; top allocators:")
    for line in lines[1:]:
        size, name = line.split(" ", 1)
        print(f"  {int(size) / 1024 / 1024:6.2f} MiB  {name}")


def main() -> None:
    global PASSES, INTERVAL, KUBELET_NODES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--imports", action="store_true",
                        help="print where import-time memory goes in kube mode, and exit")
    parser.add_argument("--daemon-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for flanneld (e.g. MALLOC_ARENA_MAX=2)")
    parser.add_argument("--modes", default="etcd,kube", help="modes to measure")
    parser.add_argument("--passes", type=int, default=PASSES,
                        help="periodic full passes before the steady reading (0: none)")
    parser.add_argument("--interval", type=int, default=INTERVAL,
                        help=f"flanneld's --reconcile-interval in seconds (> {SETTLE:g})")
    parser.add_argument("--put-leases", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--kubelet-nodes", action="store_true",
                        help="kube mode: serve each peer as a kubelet reports its Node (~15 KB "
                             "of JSON: images, managedFields), not only what flannel reads")
    parser.add_argument("--serve-kubeapi", nargs=3, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--compare", default="", metavar="TREE",
                        help="also run the flanneld of another source tree (e.g. `git "
                             "archive` of an earlier commit) in the same rounds")
    args = parser.parse_args()
    if args.put_leases:
        asyncio.run(put_leases(args.put_leases[0], int(args.put_leases[1])))
        return
    if args.serve_kubeapi:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve_kubeapi(*args.serve_kubeapi))
        return
    if args.imports:
        import_report(15)
        return
    DAEMON_ENV.update(item.split("=", 1) for item in args.daemon_env)
    if args.passes < 0 or args.interval <= SETTLE:
        parser.error(f"--passes must be >= 0 and --interval more than {SETTLE:g} s")
    PASSES, INTERVAL, KUBELET_NODES = args.passes, args.interval, args.kubelet_nodes
    if args.compare:
        launcher = Path(args.compare).resolve() / "tests" / "support" / "launchers" / "flanneld"
        if not launcher.is_file():
            parser.error(f"--compare {args.compare}: no {launcher.relative_to(args.compare)}")
        TREES[", compared tree"] = [sys.executable, str(launcher)]
    cases = {"baseline (python -c 'import asyncio')": lambda ns, d: run_baseline()}
    runners = {"etcd": run_etcd, "kube": run_kube}
    for mode in args.modes.split(","):
        runner = runners[mode]
        for peers in dict.fromkeys((0, args.peers)):
            for suffix, flanneld in TREES.items():
                cases[f"{mode} mode, {peers} peers{suffix}"] = (
                    lambda ns, d, runner=runner, peers=peers, flanneld=flanneld:
                    runner(ns, d, peers, flanneld))
    results: dict[str, list[Reading]] = {name: [] for name in cases}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.rounds):
            for index, (name, case) in enumerate(cases.items()):
                ns = f"flmem{os.getpid() % 100000}r{round_no}c{index}"
                workdir = Path(tmp) / ns
                workdir.mkdir()
                make_ns(ns)
                try:
                    results[name].append(case(ns, workdir))
                finally:
                    subprocess.run(["ip", "netns", "del", ns], check=False, timeout=20)
    base = statistics.median(v[0] for v in results[next(iter(cases))])
    print(f"medians of {args.rounds} round(s); load average at start {load:.2f}, at end "
          f"{os.getloadavg()[0]:.2f}; programmed: {SETTLE:g} s after every peer was "
          f"programmed; steady: after {PASSES} periodic full pass(es), one every {INTERVAL} s")
    for name, values in results.items():
        rss, pss, steady, steady_pss, peak = (statistics.median(v[i] for v in values)
                                              for i in range(5))
        print(f"{name:56s} programmed RSS {rss / 1024:5.1f} MiB PSS {pss / 1024:5.1f} MiB"
              f" | steady RSS {steady / 1024:5.1f} MiB PSS {steady_pss / 1024:5.1f} MiB"
              f" | peak {peak / 1024:5.1f} MiB | steady/baseline {steady / base:4.2f}")


if __name__ == "__main__":
    main()
