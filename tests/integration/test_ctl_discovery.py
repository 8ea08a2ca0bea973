"""``flannelctl status`` and ``doctor`` with no flags find the node's flanneld.

A real flanneld runs in a network namespace of the test's with a private ``/run`` (as on a
host of its own: the default ``/run/flannel/subnet.env``, no health port, as a plain-host
install runs it) against a real etcd in that namespace, its prefix given only in its
environment. The tools, run in the namespace (``ip netns exec``), find it, read its status
through its socket and the leases through its store. Another user can neither use the
socket nor read the settings; a socket left by a killed flanneld is reported, not a
traceback, removed by ``flannelctl cleanup`` and replaced by the next flanneld.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.lab.etcd import EtcdServer
from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
PREFIX = "/discovery/network"
CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "alloc"}}
NOBODY = 65534


@pytest.fixture
def node(ns, tmp_path):
    """A host: veth0 with 10.99.0.2/24 and a default route, a real etcd inside, and a
    flanneld with a private /run that is given its prefix in FLANNELD_ETCD_PREFIX only."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
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
              f"         flannel.ctl.main(['status', '--socket={sock}'])]\n"
              "print(codes)\n")
    result = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", script],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout == "environ refused\n[3, 3]\n", result
    assert result.stderr == (
        "flannelctl status: only root may see which flanneld runs in this network namespace "
        "(and use its socket): run flannelctl as root\n"
        f"flannelctl status: {sock} is flanneld's and only root (or flanneld's user) may "
        "use it (Permission denied): run flannelctl as root\n")


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
