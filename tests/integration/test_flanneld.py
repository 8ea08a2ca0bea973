"""flanneld as a process: a node in its own network namespace with its own etcd."""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.flanneld import FLANNELD, Flanneld
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

PREFIX = "/coreos.com/network"
CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "alloc"}}


@pytest.fixture
def node(ns, tmp_path):
    """A host: veth0 with 10.99.0.2-4/24 and a default route, and a real etcd inside."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    for address in ("10.99.0.2/24", "10.99.0.3/24", "10.99.0.4/24"):
        netns.ip("addr", "add", address, "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        yield ns, server


def flanneld(tmp_path: Path, ns: str, server: EtcdServer, *extra: str, name: str = "flanneld",
             subnet_file: Path | None = None, command: list[str] | None = None) -> Flanneld:
    subnet_file = subnet_file or tmp_path / name / "subnet.env"
    return Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}",
                               f"--subnet-file={subnet_file}", *extra], netns=ns, name=name,
                    command=command)


def leases(server: EtcdServer) -> dict[str, str]:
    out = server.ctl("get", "--prefix", f"{PREFIX}/subnets/").stdout.splitlines()
    return {out[i].rsplit("/", 1)[1]: out[i + 1] for i in range(0, len(out), 2)}


def read_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_lease_subnet_env_peers_and_hitless_restart(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_path = tmp_path / "a" / "subnet.env"
    first = flanneld(tmp_path, ns, server, name="a", subnet_file=env_path).start()
    try:
        wait_until(env_path.exists, what="subnet.env")
        env = read_env(env_path)
        assert env["FLANNEL_NETWORK"] == "10.5.0.0/16"
        assert env["FLANNEL_SUBNET"].endswith(".1/24")
        assert (env["FLANNEL_MTU"], env["FLANNEL_IPMASQ"]) == ("1500", "false")
        assert stat.S_IMODE(env_path.stat().st_mode) == 0o644
        key = env["FLANNEL_SUBNET"].replace(".1/24", ".0-24")
        assert leases(server) == {key: '{"PublicIP":"10.99.0.2","PublicIPv6":null}'}

        second = flanneld(tmp_path, ns, server, "--public-ip=10.99.0.3", name="b").start()
        try:
            first.wait_log("Subnet added")
            wait_until(lambda: len(leases(server)) == 2, what="second lease")
        finally:
            second.stop()

        first.signal(signal.SIGTERM)
        assert first.wait_exit() == 0
        assert key in leases(server)  # the lease outlives the process

        restarted = flanneld(tmp_path, ns, server, name="a", subnet_file=env_path)
        env_path.unlink()
        restarted.start()
        try:
            wait_until(env_path.exists, what="subnet.env after restart")
            assert read_env(env_path)["FLANNEL_SUBNET"] == env["FLANNEL_SUBNET"]
        finally:
            restarted.stop()
    finally:
        first.stop()


def test_waits_for_config_then_starts(node, tmp_path):
    ns, server = node
    env_path = tmp_path / "subnet.env"
    proc = flanneld(tmp_path, ns, server, subnet_file=env_path).start()
    try:
        proc.wait_log("Did you create your config using etcdv3 API?")
        assert proc.proc.poll() is None  # still waiting, not dead
        server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
        wait_until(env_path.exists, what="subnet.env once the config exists")
    finally:
        proc.stop()


def test_exits_zero_when_its_lease_is_deleted(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_path = tmp_path / "subnet.env"
    proc = flanneld(tmp_path, ns, server, subnet_file=env_path).start()
    try:
        wait_until(env_path.exists, what="subnet.env")
        proc.wait_log("Lease snapshot")
        server.ctl("del", "--prefix", f"{PREFIX}/subnets/")
        assert proc.wait_exit() == 0
        assert "Lease has been revoked. Shutting down daemon." in proc.log
    finally:
        proc.stop()


@pytest.mark.parametrize(("config", "needle"), [
    ({"Network": "10.5.0.0/16", "SubnetMin": "10.6.0.0", "Backend": {"Type": "alloc"}},
     "SubnetMin is not in the range of the Network"),
    ({"Network": "10.5.0.0/16", "Backend": {"Type": "bogus"}}, "unknown backend type: bogus"),
    ({"Network": "10.5.0.0/30"}, "network is too small"),
    ({"Network": "10.5.0.0/16", "Backend": {}},
     'invalid network config: Backend.Type is missing; name the backend, e.g. "Backend": '
     '{"Type": "vxlan"} (or host-gw, wireguard, ...)'),
    ({"Network": "10.5.0.0/16", "SubnetMin": "10.5.9.0", "SubnetMax": "10.5.3.0",
      "Backend": {"Type": "alloc"}},
     "invalid network config: SubnetMin 10.5.9.0 is greater than SubnetMax 10.5.3.0"),
    ({"Network": "224.0.0.0/16", "Backend": {"Type": "alloc"}},
     "invalid network config: config field 'Network': 224.0.0.0/16 overlaps the multicast "
     "range 224.0.0.0/4; use a private range such as 10.244.0.0/16"),
    ({"Network": "10.99.0.0/16", "Backend": {"Type": "alloc"}},
     "invalid network config: Network 10.99.0.0/16 contains this node's address 10.99.0.2; "
     "choose another Network that does not overlap the hosts' own network"),
    ('{"Network": "10.5.0.0/16", "Backend": {"Type": "alloc", "X": ' + "[" * 1000 + "]" * 1000
     + "}}",
     "invalid network config: network config nests JSON deeper than the limit of 32 levels"),
])
def test_bad_config_exits_one_with_a_clear_message(node, tmp_path, config, needle):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", config if isinstance(config, str) else json.dumps(config))
    proc = flanneld(tmp_path, ns, server).start()
    assert proc.wait_exit() == 1
    assert needle in proc.log
    assert leases(server) == {}
    assert not (tmp_path / "flanneld" / "subnet.env").exists()


def test_unknown_flag_exits_nonzero_naming_it():
    result = subprocess.run([FLANNELD, "--etcd-endpointz=x"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 2
    assert "--etcd-endpointz" in result.stderr


#: flanneld whose store takes a minute to close: a clean stop that waits on something slow.
SLOW_CLOSE = """
import asyncio
import sys

from flannel.cli import main
from flannel.subnet.etcd.manager import EtcdSubnetManager

async def close(self):
    await asyncio.sleep(60)

EtcdSubnetManager.close = close
sys.exit(main(sys.argv[1:]))
"""


def test_second_signal_exits_at_once(tmp_path):
    """The first SIGTERM starts a clean stop (which may wait on something slow: here the
    store's closing); a second one ends the process immediately."""
    with socket.socket() as silent:  # accepts TCP connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        proc = Flanneld(tmp_path, [f"--etcd-endpoints={endpoint}",
                                   f"--subnet-file={tmp_path / 'subnet.env'}"],
                        command=[sys.executable, "-c", SLOW_CLOSE]).start()
        try:
            proc.wait_log("etcd TLS is off")  # started, now waiting on the silent etcd
            proc.signal(signal.SIGTERM)
            proc.wait_log("send it again to exit immediately")
            started = time.monotonic()
            proc.signal(signal.SIGTERM)
            assert proc.wait_exit(timeout=3) == -signal.SIGTERM
            assert time.monotonic() - started < 3
        finally:
            proc.stop()


def test_previous_subnet_env_with_bad_bytes_still_gives_the_previous_subnet(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_path = tmp_path / "subnet.env"
    env_path.write_bytes(b"FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.77.1/24\n"
                         b"FLANNEL_\xff\xfe=1\n")
    proc = flanneld(tmp_path, ns, server, subnet_file=env_path).start()
    try:
        proc.wait_log("Wrote ")
        assert f"ignoring 1 line(s) of {env_path} that are not UTF-8 KEY=value (line 3)" \
            in proc.log
        assert list(leases(server)) == ["10.5.77.0-24"]
    finally:
        proc.stop()


def no_traceback(proc: Flanneld) -> None:
    assert "Traceback" not in proc.log, proc.log


def test_etcd_paused_at_start_is_waited_for(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_path = tmp_path / "subnet.env"
    server.proc.send_signal(signal.SIGSTOP)  # etcd stops answering; connections stay open
    try:
        proc = flanneld(tmp_path, ns, server, subnet_file=env_path).start()
        proc.wait_log("Couldn't fetch network config: no etcd endpoint answered", timeout=60)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    try:
        wait_until(env_path.exists, 60, what=f"subnet.env once etcd answers:\n{proc.log}")
        proc.wait_log("Couldn't fetch network config: succeeded after", timeout=30)
        no_traceback(proc)
    finally:
        proc.stop()


def test_subnet_file_naming_a_directory_does_not_crash(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_dir = tmp_path / "subnet.env"
    env_dir.mkdir()
    proc = flanneld(tmp_path, ns, server, subnet_file=env_dir).start()
    try:
        proc.wait_log(f"could not write {env_dir}")
        assert f"ignoring the previous {env_dir}: Is a directory; a new subnet may be chosen" \
            in proc.log
        assert proc.proc.poll() is None and "Traceback" not in proc.log
        assert len(leases(server)) == 1
        assert list(env_dir.iterdir()) == []  # no temp file left behind
    finally:
        proc.stop()


def enable_auth(server: EtcdServer) -> None:
    """root (password s3cret) and a user 'reader' that may only read the flannel prefix."""
    server.ctl("user", "add", "root", "--new-user-password=s3cret")
    server.ctl("user", "add", "reader", "--new-user-password=r")
    server.ctl("role", "add", "ro")
    server.ctl("role", "grant-permission", "ro", "read", f"{PREFIX}/", "--prefix=true")
    server.ctl("user", "grant-role", "reader", "ro")
    server.ctl("auth", "enable")


def test_read_only_etcd_user_exits_one_naming_the_permission(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    enable_auth(server)
    proc = flanneld(tmp_path, ns, server, "--etcd-username=reader", "--etcd-password=r")
    assert proc.start().wait_exit(timeout=60) == 1
    assert re.search(
        r"failed to acquire lease: etcd user 'reader' may not write "
        r"/coreos\.com/network/subnets/10\.5\.\d+\.0-24: grant it readwrite on the prefix "
        r"\(etcdctl role grant-permission <role> readwrite /coreos\.com/network/subnets/ "
        r"--prefix=true; etcdctl user grant-role reader <role>\)", proc.log), proc.log
    no_traceback(proc)
    assert server.ctl("get", "--prefix", f"{PREFIX}/subnets/", "--keys-only",
                      user="root:s3cret").stdout == ""


def test_wrong_etcd_password_says_so_on_every_retry(node, tmp_path):
    ns, server = node
    enable_auth(server)
    proc = flanneld(tmp_path, ns, server, "--etcd-username=root", "--etcd-password=wrong")
    try:
        proc.start().wait_log("still failing after", timeout=60)
        assert proc.proc.poll() is None  # retried: the password can be fixed on the server
        lines = [line for line in proc.log.splitlines() if "Couldn't fetch network config" in line]
        assert len(lines) >= 2
        for line in lines:
            assert ("etcd authentication as 'root' failed: wrong user name or password; check "
                    "--etcd-username and --etcd-password") in line, proc.log
        assert "user name is empty" not in proc.log
        no_traceback(proc)
    finally:
        proc.stop()


def test_a_lease_ttl_etcd_refuses_is_refused_naming_the_flag(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    proc = flanneld(tmp_path, ns, server, "--subnet-lease-ttl=3000000h").start()
    assert proc.wait_exit(timeout=60) in (1, 2)  # refused by etcd (1), or by the flag check (2)
    assert "--subnet-lease-ttl" in proc.log
    no_traceback(proc)
    assert leases(server) == {}


def test_unwritable_subnet_env_is_retried_until_it_works(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env_path = run_dir / "subnet.env"
    subprocess.run(["chattr", "+i", str(run_dir)], check=True)  # even root cannot write
    proc = flanneld(tmp_path, ns, server, "--healthz-ip=127.0.0.1", "--healthz-port=8081",
                    subnet_file=env_path)
    try:
        proc.start().wait_log(f"could not write {env_path}: Operation not permitted", timeout=60)
        status, body = http_get(ns, "http://127.0.0.1:8081/readyz")
        assert status == 503
        # The log names the path; /readyz, which anyone reaching the port reads, only the file.
        assert body == ("flanneld is not ready yet: could not write subnet.env: Operation "
                        "not permitted; pods on this node cannot start until it exists "
                        "(retrying)\n")
        subprocess.run(["chattr", "-i", str(run_dir)], check=True)
        wait_until(lambda: http_get(ns, "http://127.0.0.1:8081/readyz")[0] == 200, 90,
                   what=f"ready once the directory is writable:\n{proc.log}")
        assert read_env(env_path)["FLANNEL_NETWORK"] == "10.5.0.0/16"
        no_traceback(proc)
    finally:
        subprocess.run(["chattr", "-i", str(run_dir)], check=False)
        proc.stop()


def test_subnet_taken_while_etcd_was_wiped_exits_one_saying_so(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    env_path = tmp_path / "subnet.env"
    proc = flanneld(tmp_path, ns, server, subnet_file=env_path).start()
    try:
        proc.wait_log("Lease snapshot", timeout=60)
        key = next(iter(leases(server)))
        proc.signal(signal.SIGSTOP)  # this node sleeps through the wipe
        try:
            server.stop()
            shutil.rmtree(server.data_dir)
            server.start()
            server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
            server.ctl("put", f"{PREFIX}/subnets/{key}",
                       '{"PublicIP":"10.99.0.9","PublicIPv6":null}')
        finally:
            proc.signal(signal.SIGCONT)
        assert proc.wait_exit(timeout=60) == 1
        assert "leases failed: etcd was wiped or restored (" in proc.log, proc.log
        assert (f"and this node's subnet {key} is now held by {key} of the node at 10.99.0.9; "
                "this node must not keep using it: restart flanneld to acquire a new subnet"
                in proc.log), proc.log
        no_traceback(proc)
    finally:
        proc.stop()


#: flanneld with a bug injected into the alloc backend's description of the kernel state.
BUGGY_BACKEND = """
import sys

from flannel.backend.alloc import AllocBackend
from flannel.cli import main

def desired_state(self, peers, route_get):
    return len(peers) + " peers"

AllocBackend.desired_state = desired_state
sys.exit(main(sys.argv[1:]))
"""


def test_a_bug_in_a_backend_exits_one_with_its_traceback(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    proc = flanneld(tmp_path, ns, server, command=[sys.executable, "-c", BUGGY_BACKEND]).start()
    try:
        assert proc.wait_exit() == 1
    finally:
        proc.stop()
    log = proc.log
    assert "dataplane failed on a bug in flanneld; please report it with this traceback" in log
    assert "Traceback (most recent call last)" in log
    assert "TypeError: unsupported operand type(s) for +: 'int' and 'str'" in log
    assert log.rstrip().splitlines()[-1].endswith(
        "Exiting: dataplane failed: TypeError: unsupported operand type(s) for +: 'int' "
        "and 'str'")
    assert "reconcile failed" not in log  # not taken for a failure worth retrying
