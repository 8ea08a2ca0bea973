"""Our generic netlink client against the kernel's own WireGuard: every request the engine
makes is one the kernel takes, and reads back as sent. Peers added with every field, replaced
(endpoint, allowed IPs, PSK cleared), fixed field by field (update only), removed; 1000
peers in one pass (split into the messages the kernel takes) and removed in one; a peer with
more allowed IPs than one message holds; two devices configured by the engine carrying
echoes. What the kernel holds is read back twice: by our client, and by ``wg`` (an
independent reader).

tests/unit/test_wg_genl.py checks the same messages byte by byte against the kernel's
header layout; here the kernel itself judges them. Runs wherever the kernel has WireGuard.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Network, ip_network
from pathlib import Path

import pytest

from flannel.kernel.host import Host
from flannel.wireguard.config import WireguardConfig
from flannel.wireguard.device import DeviceSpec, WireguardDevice
from flannel.wireguard.genl import MAX_MESSAGE, GenlControl, encode_set_device
from flannel.wireguard.keys import Secret, public_key
from flannel.wireguard.peers import LocalEndpoints, WireguardPeers, desired_peers
from flannel.wireguard.uapi import DeviceUpdate, Peer, PeerUpdate
from tests.support.kernelpaths import missing_kernel_wireguard
from tests.support.wgengine import Node as EngineNode
from tests.support.wgengine import linked_pair

pytestmark = pytest.mark.netns

PSK = Secret(bytes(range(32, 64)))
NETWORK = IPv4Network("10.5.0.0/16")


@pytest.fixture(scope="module", autouse=True)
def _kernel_with_wireguard() -> None:
    if reason := missing_kernel_wireguard():
        pytest.skip(reason)


@pytest.fixture
def pair() -> Iterator[tuple[EngineNode, EngineNode]]:
    """Two namespaces joined by a veth, each to get a kernel device (no /run of its own is
    needed: a kernel device has no socket)."""
    with linked_pair("wgk", lambda: Path("/nonexistent")) as nodes:
        yield nodes


def kernel_device(node: EngineNode) -> WireguardDevice:
    base = node.subnet.network_address
    device = WireguardDevice(DeviceSpec("flannel-wg", 51820, 1420, node.key,
                                        addresses=((base, NETWORK),), routes=(NETWORK,),
                                        host=Host(node.ns), implementation="kernel"))
    device.ensure()
    assert device.kind == "kernel" and device.pid is None
    return device


def wg_dump(node: EngineNode) -> dict[str, tuple[str, str, str, str]]:
    """What ``wg`` reads from the kernel: key -> (PSK, endpoint, allowed IPs, keepalive)."""
    out = subprocess.run(["ip", "netns", "exec", node.ns, "wg", "show", "flannel-wg", "dump"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    peers = {}
    for line in out.splitlines()[1:]:
        key, psk, endpoint, allowed, _handshake, _rx, _tx, keepalive = line.split("\t")
        peers[key] = (psk, endpoint, ",".join(sorted(allowed.split(","))), keepalive)
    return peers


def key(n: int) -> str:
    return base64.b64encode(n.to_bytes(2, "big") * 16).decode()


def test_peers_added_replaced_fixed_and_removed_are_what_the_kernel_holds(pair):
    a, _b = pair
    control = kernel_device(a).control
    assert isinstance(control, GenlControl)
    v4, v6 = key(1), key(2)
    control.set(DeviceUpdate(peers=(
        PeerUpdate(v4, endpoint="192.168.77.2:51820", psk=PSK, keepalive=25,
                   allowed_ips=frozenset({"10.5.2.0/24", "10.6.0.0/16"})),
        PeerUpdate(v6, endpoint="[fd00:77::2]:51821",
                   allowed_ips=frozenset({"fd00:10:244:2::/64"})))))
    state = control.get()
    assert state.private_key == a.key and state.listen_port == 51820
    assert {k: s.peer for k, s in state.peers.items()} == {
        v4: Peer(v4, "192.168.77.2:51820", frozenset({"10.5.2.0/24", "10.6.0.0/16"}), PSK, 25),
        v6: Peer(v6, "[fd00:77::2]:51821", frozenset({"fd00:10:244:2::/64"}))}
    assert wg_dump(a) == {v4: (PSK.base64(), "192.168.77.2:51820", "10.5.2.0/24,10.6.0.0/16",
                               "25"),
                          v6: ("(none)", "[fd00:77::2]:51821", "fd00:10:244:2::/64", "off")}
    # Replaced: a new endpoint, the allowed IPs replaced (not added to), the PSK cleared.
    control.set(DeviceUpdate(peers=(PeerUpdate(
        v4, endpoint="192.168.77.9:4000", set_psk=True, keepalive=0,
        allowed_ips=frozenset({"10.5.9.0/24"})),)))
    assert wg_dump(a)[v4] == ("(none)", "192.168.77.9:4000", "10.5.9.0/24", "off")
    # Fixed field by field, never created: the kernel ignores an update-only change of a
    # peer it does not hold.
    control.set(DeviceUpdate(peers=(PeerUpdate(v4, update_only=True,
                                               endpoint="192.168.77.2:51820"),)))
    assert wg_dump(a)[v4][1:3] == ("192.168.77.2:51820", "10.5.9.0/24")
    control.set(DeviceUpdate(peers=(PeerUpdate(key(3), update_only=True,
                                               endpoint="192.168.77.3:1"),)))
    assert key(3) not in control.get().peers
    # Removed.
    control.set(DeviceUpdate(peers=(PeerUpdate(v4, remove=True),)))
    assert set(control.get().peers) == set(wg_dump(a)) == {v6}


def test_a_thousand_peers_in_one_pass_and_out_in_another(pair):
    a, _b = pair
    control = kernel_device(a).control
    peers = tuple(PeerUpdate(key(n), endpoint=f"192.168.{n // 250}.{n % 250 + 1}:51820",
                             psk=PSK, keepalive=25,
                             allowed_ips=frozenset({f"10.{n // 256}.{n % 256}.0/24",
                                                    f"fd00:{n}::/64"}))
                  for n in range(1, 1001))
    update = DeviceUpdate(peers=peers)
    # More than one message: the pass is split, and the kernel takes every part.
    assert len(encode_set_device(0x1D, "flannel-wg", update, 1, MAX_MESSAGE)) > 1
    control.set(update)
    state = control.get()
    assert len(state.peers) == 1000
    assert {k: s.peer for k, s in state.peers.items()} == {
        p.public_key: Peer(p.public_key, p.endpoint, p.allowed_ips, PSK, 25) for p in peers}
    dumped = wg_dump(a)
    assert len(dumped) == 1000 and dumped[key(777)] == (
        PSK.base64(), "192.168.3.28:51820", "10.3.9.0/24,fd00:777::/64", "25")
    control.set(DeviceUpdate(peers=tuple(PeerUpdate(p.public_key, remove=True)
                                         for p in peers)))
    assert control.get().peers == {} and wg_dump(a) == {}


def test_a_peer_with_more_allowed_ips_than_one_message_holds(pair):
    a, _b = pair
    control = kernel_device(a).control
    nets = frozenset({f"10.{n // 256}.{n % 256}.0/24" for n in range(150)}
                     | {str(ip_network(f"fd00:{n}::/64")) for n in range(150)})
    update = DeviceUpdate(peers=(PeerUpdate(key(1), endpoint="192.168.77.2:51820",
                                            allowed_ips=nets),))
    assert len(encode_set_device(0x1D, "flannel-wg", update, 1, MAX_MESSAGE)) >= 3
    control.set(update)
    assert control.get().peers[key(1)].peer.allowed_ips == nets
    assert len(wg_dump(a)[key(1)][2].split(",")) == 300


def test_two_kernel_devices_configured_by_the_engine_carry_echoes(pair):
    a, b = pair
    config = WireguardConfig()
    layout = config.devices(True, False)[0]
    for node, other in ((a, b), (b, a)):
        peers = WireguardPeers(kernel_device(node))
        status = peers.reconcile(desired_peers(config, layout, [other.lease()],
                                               LocalEndpoints(node.underlay)))
        assert status.in_sync and status.changes == 1, status.last_error
    done = subprocess.run(["ip", "netns", "exec", a.ns, "ping", "-n", "-c", "3", "-i", "0.2",
                           "-W", "2", "-I", str(a.subnet.network_address),
                           str(b.subnet.network_address)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout
    assert wg_dump(a)[public_key(b.key)][1] == f"{b.underlay}:51820"
