"""The WireGuard engine on real wireguard-go in two namespaces joined by a veth.

This kernel has no WireGuard module, so every device here is wireguard-go (userspace), each
node with a private /run (its UAPI socket directory) via ``flannel.kernel.nsexec``; the
kernel path (generic netlink) is shown finding no "wireguard" family here and falling back.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from flannel.kernel import nsexec, rtnl
from flannel.kernel.host import Host
from flannel.wireguard.config import WireguardConfig
from flannel.wireguard.device import WireguardDevice, WireguardDeviceError
from flannel.wireguard.genl import GenlControl, GenlSocket, resolve_family
from flannel.wireguard.keys import public_key
from flannel.wireguard.peers import LocalEndpoints, WireguardPeers, desired_peers
from flannel.wireguard.uapi import (
    ControlError,
    DeviceUpdate,
    UapiControl,
    is_stale_socket,
)
from tests.support import netns
from tests.support.waiting import wait_until
from tests.support.wgengine import NETWORK, Node, linked_pair

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(shutil.which("wireguard-go") is None, reason="needs wireguard-go"),
]

PSK_A = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
PSK_B = "HyAhIiMkJSYnKCkqKywtLi8wMTIzNDU2Nzg5Ojs8PT4="


def ping(node: Node, dst: Node, count: int = 3, interval: float = 0.2, wait: int = 1
         ) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", node.ns, "ping", "-n", "-q", "-c", str(count), "-i",
         str(interval), "-W", str(wait), "-I", str(node.subnet.network_address),
         str(dst.subnet.network_address)],
        capture_output=True, text=True, timeout=60, check=False)


def loss(output: str) -> float:
    match = re.search(r"([\d.]+)% packet loss", output)
    assert match, output
    return float(match.group(1))


def wg(node: Node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(nsexec.command(["wg", *args], Host(), node.run_dir),
                          capture_output=True, text=True, timeout=20, check=True)


@pytest.fixture
def pair() -> Iterator[tuple[Node, Node]]:
    dirs: list[Path] = []

    def run_dir() -> Path:
        # Short paths: a unix socket path must fit in 108 bytes.
        dirs.append(Path(tempfile.mkdtemp(prefix="wgrun", dir="/tmp")))
        return dirs[-1]

    try:
        with linked_pair("wg", run_dir) as nodes:
            yield nodes
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


CFG = WireguardConfig()


def engine(node: Node, other: Node, cfg: WireguardConfig = CFG
           ) -> tuple[WireguardDevice, WireguardPeers, list]:
    device = WireguardDevice(node.spec())
    device.ensure()
    layout = cfg.devices(True, False)[0]
    desired = desired_peers(cfg, layout, [other.lease()], LocalEndpoints(node.underlay))
    return device, WireguardPeers(device), desired


def test_two_peers_configured_by_the_engine_ping_each_other(pair):
    a, b = pair
    dev_a, peers_a, want_a = engine(a, b)
    _dev_b, peers_b, want_b = engine(b, a)
    assert dev_a.kind == "userspace" and dev_a.pid is not None
    assert peers_a.reconcile(want_a).in_sync and peers_a.status.changes == 1
    assert peers_b.reconcile(want_b).in_sync
    result = ping(a, b)
    assert loss(result.stdout) == 0, result.stdout
    # The device holds exactly what Go flannel sets: endpoint, allowed IPs, no PSK.
    state = dev_a.control.get()
    peer = state.peers[public_key(b.key)].peer
    assert (peer.endpoint, peer.allowed_ips, peer.psk) == ("192.168.77.2:51820",
                                                           frozenset({"10.5.2.0/24"}), None)
    assert state.private_key == a.key and state.listen_port == 51820
    status = peers_a.reconcile(want_a)
    assert status.changes == 0 and status.handshake_age[public_key(b.key)] is not None
    assert status.summary() == "wireguard peers in sync"
    # The route to the cluster network goes through the device, as Go flannel sets it.
    route = netns.ip("route", "show", str(NETWORK), netns=a.ns).stdout
    assert route.strip() == f"{NETWORK} dev flannel-wg scope link"


def test_a_peer_removed_or_changed_by_hand_is_restored(pair):
    a, b = pair
    _dev_a, peers_a, want_a = engine(a, b)
    _dev_b, peers_b, want_b = engine(b, a)
    peers_a.reconcile(want_a)
    peers_b.reconcile(want_b)
    stop = threading.Event()

    def loop() -> None:
        # The daemon's cadence for non-netlink reconcilers (peers.py docstring).
        while not stop.wait(0.5):
            peers_a.reconcile(want_a)

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        key_b = public_key(b.key)
        wg(a, "set", "flannel-wg", "peer", key_b, "remove")
        assert key_b not in UapiControl(a.spec().socket_path).get().peers
        wait_until(lambda: key_b in UapiControl(a.spec().socket_path).get().peers,
                   timeout=30, interval=0.02, what="the removed peer to come back")
        wg(a, "set", "flannel-wg", "peer", key_b, "allowed-ips", "10.5.9.0/24", "endpoint",
           "192.168.77.9:4000")
        wait_until(lambda: UapiControl(a.spec().socket_path).get().peers[key_b].peer
                   == want_a[0], timeout=30, interval=0.02, what="the peer's fields back")
    finally:
        stop.set()
        worker.join()
    assert loss(ping(a, b).stdout) == 0


def test_a_restarted_engine_adopts_wireguard_go_without_losing_a_ping(pair):
    a, b = pair
    dev_a, peers_a, want_a = engine(a, b)
    _dev_b, peers_b, want_b = engine(b, a)
    peers_a.reconcile(want_a)
    peers_b.reconcile(want_b)
    assert loss(ping(a, b).stdout) == 0
    pinger = subprocess.Popen(
        ["ip", "netns", "exec", a.ns, "ping", "-n", "-c", "30", "-i", "0.1", "-W", "1",
         "-I", str(a.subnet.network_address), str(b.subnet.network_address)],
        stdout=subprocess.PIPE, text=True)
    try:
        replies = 0
        while replies < 5:
            line = pinger.stdout.readline()
            assert line, "ping ended early"
            replies += "bytes from" in line
        # A new flanneld while pings flow: new objects, same spec, nothing recreated.
        first_pid = dev_a.pid
        del dev_a, peers_a
        dev_new, peers_new, want_new = engine(a, b)
        status = peers_new.reconcile(want_new)
        out, _ = pinger.communicate(timeout=30)
    finally:
        pinger.kill()
    assert dev_new.pid == first_pid and dev_new.kind == "userspace"
    assert status.in_sync and status.changes == 0
    assert loss(out) == 0, out


def test_a_killed_wireguard_go_leaves_a_stale_socket_that_is_replaced(pair):
    a, b = pair
    dev_a, peers_a, want_a = engine(a, b)
    _dev_b, peers_b, want_b = engine(b, a)
    peers_a.reconcile(want_a)
    peers_b.reconcile(want_b)
    old_pid = dev_a.pid
    os.kill(old_pid, signal.SIGKILL)
    sock = a.spec().socket_path
    wait_until(lambda: is_stale_socket(sock), timeout=5, what="the socket to go stale")
    status = peers_a.reconcile(want_a)
    assert status.in_sync, status.last_error
    assert dev_a.pid not in (None, old_pid)
    assert UapiControl(sock).peer_pid() == dev_a.pid
    assert loss(ping(a, b).stdout) == 0


def test_a_psk_mismatch_shows_in_the_status(pair):
    a, b = pair
    cfg_a = WireguardConfig.from_backend({"PSK": PSK_A})
    cfg_b = WireguardConfig.from_backend({"PSK": PSK_B})
    _dev_a, peers_a, want_a = engine(a, b, cfg_a)
    _dev_b, peers_b, want_b = engine(b, a, cfg_b)
    assert peers_a.reconcile(want_a).in_sync and peers_b.reconcile(want_b).in_sync
    assert loss(ping(a, b, count=3).stdout) == 100
    # The event: a's handshake initiations reached b (b answered with its own PSK), so the
    # status below says "no handshake" because the PSKs differ, not because none was tried.
    key_a, key_b = public_key(a.key), public_key(b.key)
    wait_until(lambda: peers_b.reconcile(want_b).states[key_a].rx_bytes > 0, timeout=30,
               what="a's handshake initiation to reach b")
    status = peers_a.reconcile(want_a)
    assert status.in_sync and status.states[key_b].tx_bytes > 0
    assert status.without_handshake() == [key_b]
    assert peers_b.reconcile(want_b).without_handshake() == [key_a]
    assert status.summary() == (
        "no recent handshake with 1 of 1 peers (keys or PSK differ, or the peer is "
        f"unreachable): {public_key(b.key)}")
    assert PSK_A not in repr(status) and PSK_A not in status.summary()


NO_FAMILY = ('this kernel has no WireGuard (generic netlink has no "wireguard" family); '
             'load the wireguard module (`modprobe wireguard`)')


def test_this_kernels_generic_netlink_is_read_and_has_no_wireguard(pair):
    a, _b = pair
    with GenlSocket(rtnl.open_socket(Host(a.ns), protocol=16)) as sock:
        assert resolve_family(sock, "nlctrl") == 0x10  # the lookup itself works here
        assert resolve_family(sock, "wireguard") is None
        # nlctrl's own dump of every family: several messages, then NLMSG_DONE.
        seq = sock.next_seq()
        bodies, interrupted = sock.dump(rtnl.frame(
            0x10, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP, seq, struct.pack("=BBH", 3, 1, 0)),
            seq, "dump families")
    names = {rtnl.parse_attrs(body, 4)[2].rstrip(b"\0").decode() for body in bodies}
    assert {"nlctrl", "netdev"} <= names and "wireguard" not in names and not interrupted


def test_the_kernel_path_runs_no_wg_and_falls_back_to_wireguard_go(pair, tmp_path,
                                                                    monkeypatch, caplog):
    """A ``wg`` first in PATH that records being run: neither the kernel path nor the
    fallback runs it."""
    a, b = pair
    caplog.set_level("INFO")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "wg-ran"
    fake = bin_dir / "wg"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {ran}\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(WireguardDeviceError) as err:
        WireguardDevice(replace(a.spec(), implementation="kernel")).ensure()
    assert str(err.value) == f"cannot create flannel-wg: {NO_FAMILY}"
    control = GenlControl("flannel-wg", Host(a.ns))
    for call in (control.get, lambda: control.set(DeviceUpdate(listen_port=51820))):
        with pytest.raises(ControlError) as err:
            call()
        assert str(err.value) == NO_FAMILY
    dev_a, peers_a, want_a = engine(a, b)
    assert dev_a.kind == "userspace" and peers_a.reconcile(want_a).in_sync
    assert ('flannel-wg: this kernel has no WireGuard (generic netlink has no "wireguard" '
            "family); using wireguard-go (userspace)") in caplog.text
    assert not ran.exists()


def test_the_choice_is_logged_and_keys_never_are(pair, caplog):
    a, b = pair
    caplog.set_level("DEBUG")
    cfg = WireguardConfig.from_backend({"PSK": PSK_A})
    dev_a, peers_a, want_a = engine(a, b, cfg)
    peers_a.reconcile(want_a)
    assert ('flannel-wg: this kernel has no WireGuard (generic netlink has no "wireguard" '
            "family); using wireguard-go (userspace)") in caplog.text
    assert f"flannel-wg: wireguard-go started (pid {dev_a.pid}" in caplog.text
    assert f"add peer {public_key(b.key)} (endpoint, preshared key, keepalive, allowed IPs)" in (
        caplog.text)
    wg_log = (a.run_dir / "wireguard-go.log").read_text()
    for secret in (a.key, cfg.psk):
        for text in (secret.base64(), secret.hex()):
            assert text not in caplog.text and text not in wg_log


def test_kernel_only_and_foreign_devices_are_refused_with_a_message(pair):
    a, _b = pair
    spec = a.spec()
    with pytest.raises(WireguardDeviceError) as err:
        WireguardDevice(replace(spec, implementation="kernel")).ensure()
    assert str(err.value) == f"cannot create flannel-wg: {NO_FAMILY}"
    netns.ip("link", "add", "flannel-wg", "type", "bridge", netns=a.ns)
    with pytest.raises(WireguardDeviceError) as err:
        WireguardDevice(spec).ensure()
    assert str(err.value) == ("a bridge device named flannel-wg exists; remove it (`ip link "
                              "del flannel-wg`) so flannel can create its WireGuard device")


def test_a_socket_serving_another_namespace_is_not_taken_over(pair):
    a, b = pair
    engine(a, b)
    # Node b pointed at node a's socket directory: same socket, different namespace.
    shared = replace(b.spec(), run_dir=a.run_dir)
    with pytest.raises(WireguardDeviceError) as err:
        WireguardDevice(shared).ensure()
    assert str(err.value) == (
        f"a wireguard-go already answers on {a.run_dir}/wireguard/flannel-wg.sock but there is "
        "no flannel-wg in this network namespace; stop that wireguard-go (it serves another "
        "namespace) or give this node its own /run/wireguard")


def test_nsexec_gives_a_private_run_that_keeps_the_paths_asked_for(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "mine").write_text("node")
    kept = Path("/run") / f"{netns.RUN_PREFIX}keep"
    kept.mkdir()
    try:
        (kept / "state").write_text("lab")
        cmd = nsexec.command(["sh", "-c", 'ls /run; cat /run/mine "$0"/state', str(kept)],
                             Host(), run_dir, [kept])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
        assert out.stdout.split() == [*sorted(["mine", kept.name]), "nodelab"]
        # Outside /run nothing can be kept: said, and nothing runs.
        refused = subprocess.run(nsexec.command(["true"], Host(), run_dir, [tmp_path]),
                                 capture_output=True, text=True, timeout=30, check=False)
        assert (refused.returncode, refused.stderr) == (
            2, f"nsexec: --keep {tmp_path}: give a directory under /run\n")
    finally:
        shutil.rmtree(kept)
    assert os.listdir("/run").count(kept.name) == 0
