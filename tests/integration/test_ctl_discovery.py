"""Every ``flannelctl`` verb with no flags finds the node's flanneld (``status``,
``doctor``, ``check``, ``leases``, ``bundle``).

A real flanneld runs in a network namespace of the test's with a private ``/run`` (as on a
host of its own: the default ``/run/flannel/subnet.env``, no health port, as a plain-host
install runs it) against a real etcd in that namespace, its prefix given only in its
environment. The tools, run in the namespace (``ip netns exec``), find it, read its status
through its socket and the leases through its store. Another user can neither use the
socket nor read the settings; a socket left by a killed flanneld is reported, not a
traceback, removed by ``flannelctl cleanup`` and replaced by the next flanneld. The same
holds on a systemd host whose flanneld has its settings in ``FLANNELD_*`` and a flag of its
own, and in kube-flannel's pod (flanneld PID 1 of the container, ``kubectl exec`` into it);
several flanneld are told apart by the subnet.env they write, or the tool says what to give.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
PREFIX = "/discovery/network"
CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "alloc"}}
NOBODY = 65534


def wire(ns: str) -> None:
    """veth0 with 10.99.0.2/24 and a default route: a host's uplink."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)


@pytest.fixture
def node(ns, tmp_path):
    """A host: veth0 with 10.99.0.2/24 and a default route, a real etcd inside, and a
    flanneld with a private /run that is given its prefix in FLANNELD_ETCD_PREFIX only."""
    wire(ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
        run_dir = tmp_path / "run"
        daemon = Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}"], netns=ns,
                          env={"FLANNELD_ETCD_PREFIX": PREFIX}, run_dir=run_dir)
        daemon.start()
        try:
            wait_until(lambda: (run_dir / "flannel" / "subnet.env").exists(), 30,
                       what=f"subnet.env written:\n{daemon.log}")
            yield ns, server, daemon, run_dir
        finally:
            daemon.stop()


def ctl(ns: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, FLANNELCTL, *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_status_and_doctor_find_flanneld_and_its_store_without_flags(node):
    ns, server, daemon, run_dir = node
    subnet = dict(line.split("=", 1) for line in
                  (run_dir / "flannel" / "subnet.env").read_text().splitlines())

    status = ctl(ns, "status", "--json")
    assert status.returncode in (0, 1), status
    doc = json.loads(status.stdout)
    assert doc["lease"]["subnet"] == str(ipaddress.ip_network(subnet["FLANNEL_SUBNET"],
                                                              strict=False))
    assert doc["flanneld"]["pid"] == daemon.proc.pid
    assert doc["flanneld"]["socket"] == "/run/flannel/flanneld.sock"
    assert doc["flanneld"]["health"] is None
    options = {o["name"]: (o["value"], o["source"]) for o in doc["flanneld"]["options"]}
    assert options["etcd-prefix"] == (PREFIX, "FLANNELD_ETCD_PREFIX")

    table = ctl(ns, "status")
    assert table.returncode in (0, 1), table
    assert re.search(rf"^store at +{re.escape(server.endpoint)}, prefix {PREFIX}$",
                     table.stdout, re.MULTILINE), table.stdout

    doctor = ctl(ns, "doctor", "--json")
    report = json.loads(doctor.stdout)
    assert [f for f in report["findings"] if f["check"] in ("store", "config", "subnet-env",
                                                             "lease", "flanneld")] == [], report
    assert report["store"] == (f"etcd {server.endpoint}, prefix {PREFIX}, from the settings "
                               "of the flanneld running here; subnet.env "
                               "/run/flannel/subnet.env")
    text = ctl(ns, "doctor")
    assert text.stdout.endswith(f"\nstore read: {report['store']}\n"), text.stdout


def test_other_users_cannot_use_the_socket_or_read_the_settings(node):
    ns, _server, daemon, run_dir = node
    sock = run_dir / "flannel" / "flanneld.sock"
    info = os.lstat(sock)
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == 0
    assert stat.S_IMODE(os.stat(sock.parent).st_mode) == 0o755
    # As nobody, in the node's namespace: the environment (FLANNELD_* and credentials) is
    # unreadable, and flannelctl status, told the socket or not, says to run it as root
    # (exit 3). The tool is loaded before
    # the uid changes: this host's Python lives where nobody may read.
    script = ("import os, sys\n"
              "import flannel.ctl, flannel.ops.status, flannel.ops.discover\n"
              f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
              "try:\n"
              f"    open('/proc/{daemon.proc.pid}/environ', 'rb').read()\n"
              "    print('environ readable')\n"
              "except PermissionError:\n"
              "    print('environ refused')\n"
              "codes = [flannel.ctl.main(['status']),\n"
              f"         flannel.ctl.main(['status', '--socket={sock}']),\n"
              "         flannel.ctl.main(['leases', 'list'])]\n"
              "print(codes)\n")
    result = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout == "environ refused\n[3, 3, 2]\n", result
    assert result.stderr == (
        "flannelctl status: only root may see which flanneld runs in this network namespace "
        "(and use its socket): run flannelctl as root\n"
        f"flannelctl status: {sock} is flanneld's and only root (or flanneld's user) may "
        "use it (Permission denied): run flannelctl as root\n"
        # Rather than guess (127.0.0.1:2379), leases says what to give.
        "flannelctl leases: cannot tell which store this node's flanneld uses: only root may "
        "see which flanneld runs in this network namespace (and use its socket): run "
        "flannelctl as root; or give flanneld's store flags (--etcd-endpoints, --etcd-prefix, "
        "--subnet-file... or --kube-subnet-mgr...)\n")


def test_a_socket_left_by_a_killed_flanneld_is_reported_and_replaced(node, tmp_path):
    ns, server, daemon, run_dir = node
    daemon.signal(signal.SIGKILL)
    daemon.wait_exit()
    sock = run_dir / "flannel" / "flanneld.sock"
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)  # left behind

    missing = ctl(ns, "status")
    assert missing.returncode == 3, missing
    assert "flanneld is not running in this network namespace" in missing.stderr
    assert "Traceback" not in missing.stderr

    stale = ctl(ns, "status", f"--subnet-file={run_dir / 'flannel' / 'subnet.env'}")
    assert stale.returncode == 3, stale
    assert stale.stderr == (f"flannelctl status: flanneld is not running: {sock} is a stale "
                            "socket left by a flanneld that ended (the next flanneld "
                            "replaces it)\n")

    # cleanup (flanneld is gone) removes the stale socket with the rest.
    env = run_dir / "flannel" / "subnet.env"
    dry = ctl(ns, "cleanup", "--dry-run", f"--run-dir={run_dir}", f"--subnet-file={env}",
              f"--cni-bin-dir={tmp_path / 'none'}", f"--cni-conf-dir={tmp_path / 'none'}")
    assert (f"would remove: socket {sock} (nobody listens: left by a flanneld that ended)"
            in dry.stdout.splitlines()), dry

    again = Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}"], netns=ns,
                     env={"FLANNELD_ETCD_PREFIX": PREFIX}, run_dir=run_dir, name="again")
    again.start()
    try:
        again.wait_log("to flannelctl on /run/flannel/flanneld.sock", timeout=30)
        wait_until(lambda: ctl(ns, "status").returncode == 0, 30, what="status ready")
        assert json.loads(ctl(ns, "status", "--json").stdout)["flanneld"]["pid"] == \
            again.proc.pid
    finally:
        again.stop()


#: The subnet.env of a host whose unit gives flanneld another one (as flanneld names it).
HOST_ENV = "/run/pyflannel/node.env"


@pytest.fixture
def host(ns, tmp_path):
    """A systemd host (deploy/flanneld.service): flanneld's settings in FLANNELD_* variables
    (its EnvironmentFile), a flag of its own for a subnet.env elsewhere than the default,
    and a private /run."""
    wire(ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
        run_dir = tmp_path / "run"
        daemon = Flanneld(tmp_path, [f"--subnet-file={HOST_ENV}", "--ip-masq"], netns=ns,
                          env={"FLANNELD_ETCD_ENDPOINTS": server.endpoint,
                               "FLANNELD_ETCD_PREFIX": PREFIX}, run_dir=run_dir)
        daemon.start()
        try:
            wait_until(lambda: (run_dir / "pyflannel" / "node.env").exists(), 30,
                       what=f"subnet.env written:\n{daemon.log}")
            yield ns, server, daemon, run_dir
        finally:
            daemon.stop()


def test_every_verb_finds_flanneld_run_with_its_own_flags_and_environment(host, tmp_path):
    ns, server, daemon, run_dir = host
    env_text = (run_dir / "pyflannel" / "node.env").read_text()
    own = str(ipaddress.ip_network(dict(line.split("=", 1) for line in env_text.splitlines())
                                   ["FLANNEL_SUBNET"], strict=False))
    source = (f"etcd {server.endpoint}, prefix {PREFIX}, from the settings of the flanneld "
              f"running here; subnet.env {HOST_ENV}")

    status = ctl(ns, "status", "--json")
    assert json.loads(status.stdout)["flanneld"]["pid"] == daemon.proc.pid, status
    doctor = json.loads(ctl(ns, "doctor", "--json").stdout)
    assert doctor["store"] == source
    assert [f for f in doctor["findings"] if f["check"] in (
        "store", "config", "subnet-env", "lease", "flanneld")] == [], doctor

    check = ctl(ns, "check", "--json")
    assert check.returncode == 0, check
    checked = json.loads(check.stdout)
    assert (checked["ok"], checked["node"]["subnet"], checked["node"]["public_ip"],
            checked["store"]) == (True, own, "10.99.0.2", source)

    listed = ctl(ns, "leases", "list")
    assert listed.returncode == 0, listed
    assert listed.stdout.splitlines()[1].split()[:3] == [own, "-", "10.99.0.2"]
    assert listed.stdout.splitlines()[-1] == f"store read: {source}"
    shown = ctl(ns, "leases", "show", "10.99.0.2", "--json")
    assert json.loads(shown.stdout)["subnet"] == own, shown

    archive = tmp_path / "host.tar.gz"
    bundled = ctl(ns, "bundle", "-o", str(archive))
    assert bundled.returncode == 0, bundled
    assert f"store read: {source}" in bundled.stdout.splitlines()
    with tarfile.open(archive) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                 for m in tar.getmembers()}
    assert files["subnet.env"] == env_text
    assert json.loads(files["status.txt"])["lease"]["subnet"] == own
    assert "flannel_lease_renewals_total" in files["metrics.txt"]
    assert json.loads(files["leases.json"])[0]["subnet"] == own


def test_several_flanneld_are_told_apart_by_the_subnet_env_they_write(host):
    ns, server, daemon, _run_dir = host
    # Another process calling itself flanneld (another unit, a test copy) in this namespace.
    other = subprocess.Popen(["ip", "netns", "exec", ns, "bash", "-c",
                              "exec -a flanneld sleep 120"])
    try:
        wait_until(lambda: len(ctl(ns, "leases", "list").stderr) > 0, 30,
                   what="the second flanneld seen")
        pids = sorted([daemon.proc.pid, other.pid])
        refused = ctl(ns, "leases", "list")
        assert (refused.returncode, refused.stdout, refused.stderr) == (2, "", (
            "flannelctl leases: cannot tell which store this node's flanneld uses: several "
            f"flanneld processes run in this network namespace (pids {pids[0]}, {pids[1]}): "
            "say which with --subnet-file (the subnet.env it writes); or give flanneld's "
            "store flags (--etcd-endpoints, --etcd-prefix, --subnet-file... or "
            "--kube-subnet-mgr...)\n"))
        assert ctl(ns, "check").returncode == 2

        # Named as flanneld names it, the file is read where that flanneld keeps it.
        picked = ctl(ns, "check", "--json", f"--subnet-file={HOST_ENV}")
        assert picked.returncode == 0, picked
        assert json.loads(picked.stdout)["store"] == (
            f"etcd {server.endpoint}, prefix {PREFIX}, from the settings of the flanneld "
            f"running here, overridden by --subnet-file; subnet.env /proc/{daemon.proc.pid}"
            f"/root{HOST_ENV}")
    finally:
        other.kill()
        other.wait(timeout=10)


ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    return [int(child) for child in
            Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def pod(ns, tmp_path):
    """kube-flannel's DaemonSet as a container runtime runs it: flanneld is PID 1 of its own
    PID and mount namespaces (its own /run and /proc) on the host's network, in kube mode,
    with the pod's environment (NODE_NAME...); the API server is the test double."""
    wire(ns)
    api = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m",
                            "tests.support.kubeapi", "--host", "10.99.0.2", "--node",
                            "node1=10.244.1.0/24"], cwd=ROOT, stdout=subprocess.PIPE,
                           text=True)
    try:
        port = api.stdout.readline().strip().rsplit(":", 1)[1]
        run_dir = tmp_path / "run"
        (run_dir / "kube-flannel").mkdir(parents=True)
        (run_dir / "kube-flannel" / "net-conf.json").write_text(json.dumps(
            {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}))
        env = {"NODE_NAME": "node1", "POD_NAME": "kube-flannel-ds-x1", "POD_NAMESPACE":
               "kube-flannel"}
        daemon = Flanneld(tmp_path, ["--ip-masq", "--kube-subnet-mgr",
                                     f"--kube-api-url=http://10.99.0.2:{port}",
                                     "--net-config-path=/run/kube-flannel/net-conf.json"],
                          netns=ns, env=env, run_dir=run_dir,
                          command=["unshare", "--pid", "--fork", "--mount-proc",
                                   str(Path(sys.executable).parent / "flanneld")])
        daemon.start()
        try:
            wait_until(lambda: (run_dir / "flannel" / "subnet.env").exists(), 30,
                       what=f"subnet.env written:\n{daemon.log}")
            [pid1] = children(daemon.proc.pid)  # unshare's child: PID 1 inside
            yield ns, pid1, env, run_dir, port
        finally:
            with contextlib.suppress(ProcessLookupError, ValueError, NameError):
                os.kill(pid1, signal.SIGTERM)
            daemon.stop()
    finally:
        api.terminate()
        api.wait(timeout=10)


def exec_in(pid: int, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """``kubectl exec <pod> -- flannelctl ARGS``: in every namespace of the container,
    with its environment."""
    return subprocess.run(["nsenter", f"--target={pid}", "--mount", "--pid", "--net", "--",
                           FLANNELCTL, *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, **env})


def test_in_the_pod_every_verb_finds_flanneld_as_pid_1(pod):
    _ns, pid1, env, run_dir, port = pod
    source = (f"the Kubernetes API (http://10.99.0.2:{port}), network config "
              "/run/kube-flannel/net-conf.json, from the settings of the flanneld running "
              "here; subnet.env /run/flannel/subnet.env")
    status = exec_in(pid1, env, "status", "--json")
    assert status.returncode == 0, status
    assert json.loads(status.stdout)["flanneld"]["pid"] == 1

    doctor = json.loads(exec_in(pid1, env, "doctor", "--json").stdout)
    assert doctor["store"] == source
    assert [f for f in doctor["findings"] if f["check"] in (
        "store", "config", "subnet-env", "lease", "flanneld")] == [], doctor

    check = exec_in(pid1, env, "check", "--json")
    assert check.returncode == 0, check
    assert (json.loads(check.stdout)["node"]["subnet"], json.loads(check.stdout)["store"]) == \
        ("10.244.1.0/24", source)

    listed = exec_in(pid1, env, "leases", "list")
    assert listed.returncode == 0, listed
    assert listed.stdout.splitlines()[1].split()[:2] == ["node1", "10.244.1.0/24"]

    bundled = exec_in(pid1, env, "bundle", "-o", "/run/pod.tar.gz")
    assert bundled.returncode == 0, bundled
    with tarfile.open(run_dir / "pod.tar.gz") as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()
                 for m in tar.getmembers()}
    assert files["subnet.env"] == (run_dir / "flannel" / "subnet.env").read_text()
    assert json.loads(files["status.txt"])["lease"]["subnet"] == "10.244.1.0/24"
