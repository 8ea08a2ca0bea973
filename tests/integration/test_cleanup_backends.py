"""``flannelctl cleanup`` after the udp and wireguard backends (userspace WireGuard: this kernel
has no WireGuard module), on a node (a network namespace with its own /run) where foreign
TUN devices, a foreign wireguard-go and foreign files sit beside ours: --dry-run lists every
object of ours and changes nothing; cleanup stops our wireguard-go (its device and socket go
with it), removes the udp TUN, the network routes, the key and the logs, and nothing else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from flannel.kernel import nsexec
from flannel.kernel.host import Host
from flannel.udp.device import TunSpec, ensure_tun
from flannel.wireguard.device import DeviceSpec, WireguardDevice
from flannel.wireguard.keys import load_or_create_private_key
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(shutil.which("wireguard-go") is None, reason="needs wireguard-go"),
]

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
NETWORK = IPv4Network("10.5.0.0/16")


def run(ns: str, run_dir: Path, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` in the node: its network namespace, its /run."""
    result = subprocess.run(nsexec.command(list(cmd), Host(ns), run_dir), capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, f"{cmd}: {result.stdout}{result.stderr}"
    return result


def alive(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


@pytest.fixture
def node(ns):
    # Short path: a unix socket path must fit in 108 bytes.
    run_dir = Path(tempfile.mkdtemp(prefix="cleanrun", dir="/tmp"))
    try:
        yield ns, run_dir
    finally:
        netns.delete(ns)  # stops every wireguard-go left inside
        shutil.rmtree(run_dir, ignore_errors=True)


def wireguard_go(ns: str, run_dir: Path, name: str) -> subprocess.Popen:
    """A wireguard-go started as flanneld starts it, serving ``name``."""
    proc = subprocess.Popen(nsexec.command(["wireguard-go", name], Host(ns), run_dir),
                            env={"PATH": os.environ["PATH"], "WG_PROCESS_FOREGROUND": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    wait_until(lambda: (run_dir / "wireguard" / f"{name}.sock").exists(), 10,
               what=f"wireguard-go {name}'s socket")
    return proc


def test_cleanup_stops_our_wireguard_go_and_removes_the_udp_tun_keeping_foreign_ones(node,
                                                                                   tmp_path):
    ns, run_dir = node
    host = Host(ns)
    key_file = run_dir / "flannel" / "wgkey"
    key, _ = load_or_create_private_key(key_file)
    ours = WireguardDevice(DeviceSpec(
        "flannel-wg", 51820, 1420, key, addresses=((IPv4Address("10.5.1.0"), NETWORK),),
        routes=(NETWORK,), host=host, run_dir=run_dir,
        log_path=run_dir / "flannel" / "flannel-wg.log", implementation="userspace"))
    ours.ensure()
    assert ours.kind == "userspace" and ours.pid
    ensure_tun(TunSpec("flannel0", IPv4Address("10.6.1.0"), 1472, IPv4Network("10.6.0.0/16")),
               host)
    # flannel-wg-v6's wireguard-go was killed: its device went with it, its socket stayed.
    killed = wireguard_go(ns, run_dir, "flannel-wg-v6")
    killed.send_signal(signal.SIGKILL)
    killed.wait(10)
    # Foreign: another wireguard-go, a TUN with a route, files in the same directories.
    foreign = wireguard_go(ns, run_dir, "wg-foreign")
    netns.ip("tuntap", "add", "tun-foreign", "mode", "tun", netns=ns)
    netns.ip("link", "set", "tun-foreign", "up", netns=ns)
    netns.ip("route", "add", "10.77.0.0/16", "dev", "tun-foreign", "proto", "static", netns=ns)
    (run_dir / "flannel" / "other.conf").write_text("not ours\n")
    (run_dir / "flannel" / "subnet.env").write_text(
        "FLANNEL_NETWORK=10.5.0.0/16\nFLANNEL_SUBNET=10.5.1.1/24\nFLANNEL_MTU=1420\n"
        "FLANNEL_IPMASQ=false\n")
    empty = tmp_path / "none"
    options = ["--run-dir", "/run", "--cni-bin-dir", str(empty), "--cni-conf-dir", str(empty)]

    def state() -> tuple[str, str, list[str]]:
        return (run(ns, run_dir, "ip", "-br", "link").stdout,
                run(ns, run_dir, "ip", "route").stdout,
                sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")))

    before = state()
    assert "flannel-wg " in before[0] and "flannel0 " in before[0]
    dry = run(ns, run_dir, FLANNELCTL, "cleanup", "--dry-run", *options)
    assert state() == before
    listed = [line.removeprefix("would remove: ") for line in dry.stdout.splitlines()
              if line.startswith("would remove: ")]
    assert listed == [
        "route 10.5.0.0/16 dev flannel-wg proto boot",
        "route 10.6.0.0/16 dev flannel0 proto static",
        "device flannel0 (tun)",
        f"wireguard-go process {ours.pid} serving flannel-wg (socket "
        "/run/wireguard/flannel-wg.sock; its device goes with it)",
        "stale socket /run/wireguard/flannel-wg-v6.sock (its wireguard-go is gone)",
        "file /run/flannel/wgkey",
        "file /run/flannel/flannel-wg.log",
        "file /run/flannel/subnet.env",
    ], dry.stdout

    done = run(ns, run_dir, FLANNELCTL, "cleanup", *options)
    assert [line.removeprefix("removed: ") for line in done.stdout.splitlines()] == listed
    wait_until(lambda: not alive(ours.pid or 0), 10, what="our wireguard-go to stop")
    links, routes, files = state()
    assert "flannel" not in links and "flannel" not in routes
    assert files == ["flannel", "flannel/other.conf", "wireguard",
                     "wireguard/wg-foreign.sock"]
    assert "wg-foreign " in links and "tun-foreign " in links
    assert "10.77.0.0/16 dev tun-foreign proto static" in routes
    assert foreign.poll() is None

    again = run(ns, run_dir, FLANNELCTL, "cleanup", *options)
    assert again.stdout.strip() == "nothing of flannel's found"


def test_a_wireguard_key_file_that_holds_no_key_is_kept(node, tmp_path):
    ns, run_dir = node
    (run_dir / "flannel").mkdir()
    (run_dir / "flannel" / "wgkey").write_text("my notes\n")
    empty = tmp_path / "none"
    result = run(ns, run_dir, FLANNELCTL, "cleanup", "--subnet-file", str(empty / "x"),
                 "--cni-bin-dir", str(empty), "--cni-conf-dir", str(empty))
    assert result.stdout.splitlines() == [
        "kept (not flannel's): file /run/flannel/wgkey: does not hold a WireGuard key",
        "nothing of flannel's found"]
    assert (run_dir / "flannel" / "wgkey").read_text() == "my notes\n"
