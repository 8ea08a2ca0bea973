"""Remote leases -> WireGuard peers as Go flannel sets them, and the minimal peer diff."""

import base64
import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.config import WireguardConfig, encode_lease_data
from flannel.wireguard.keys import Secret
from flannel.wireguard.peers import (
    LocalEndpoints,
    PeerStatus,
    WireguardPeers,
    desired_peers,
    diff_peers,
)
from flannel.wireguard.uapi import DeviceState, DeviceUpdate, Peer, PeerState, PeerUpdate

K1 = base64.b64encode(bytes([1]) * 32).decode()
K2 = base64.b64encode(bytes([2]) * 32).decode()
K3 = base64.b64encode(bytes([3]) * 32).decode()
PSK = Secret(bytes([9]) * 32)
LOCAL = LocalEndpoints(IPv4Address("192.168.1.1"), None)


def lease(n: int, key: str, port: int | None = 51820, ip: str = "192.168.1.2",
          ip6: str | None = None, v6_key: str | None = None, backend: str = "wireguard",
          v6_port: int = 51821) -> Lease:
    v4_data = (json.dumps({"PublicKey": key}) if port is None
               else encode_lease_data(key, port))
    return Lease(IPv4Network(f"10.5.{n}.0/24"),
                 IPv6Network(f"fd00:5:{n}::/64") if ip6 else None,
                 attrs=LeaseAttrs(public_ip=IPv4Address(ip),
                                  public_ipv6=IPv6Address(ip6) if ip6 else None,
                                  backend_type=backend, backend_data=v4_data,
                                  backend_v6_data=encode_lease_data(v6_key or key, v6_port)
                                  if ip6 else None))


def cfg(**backend) -> WireguardConfig:
    return WireguardConfig.from_backend(backend)


def test_separate_mode_ipv4_peer_as_go_sets_it():
    c = cfg(PSK=base64.b64encode(PSK.raw).decode(), PersistentKeepaliveInterval=25)
    layout = c.devices(True, False)[0]
    assert desired_peers(c, layout, [lease(2, K2)], LOCAL) == [
        Peer(K2, "192.168.1.2:51820", frozenset({"10.5.2.0/24"}), PSK, 25)]


def test_a_lease_without_port_gets_our_own_listen_port():
    c = cfg(ListenPort=4000)
    layout = c.devices(True, False)[0]
    assert desired_peers(c, layout, [lease(2, K2, port=None)], LOCAL)[0].endpoint == (
        "192.168.1.2:4000")
    assert desired_peers(c, layout, [lease(2, K2, port=5000)], LOCAL)[0].endpoint == (
        "192.168.1.2:5000")


def test_separate_mode_ipv6_device_uses_the_v6_key_address_and_port():
    c = cfg()
    layout = c.devices(True, True)[1]
    peers = desired_peers(c, layout, [lease(2, K2, ip6="fd00::2", v6_key=K3)], LOCAL)
    assert peers == [Peer(K3, "[fd00::2]:51821", frozenset({"fd00:5:2::/64"}), None, 0)]


def test_single_device_modes_carry_both_subnets_on_one_peer():
    c = cfg(Mode="ipv4")
    layout = c.devices(True, True)[0]
    [peer] = desired_peers(c, layout, [lease(2, K2, ip6="2001:db8::2")], LOCAL)
    assert peer.allowed_ips == {"10.5.2.0/24", "fd00:5:2::/64"}
    assert peer.endpoint == "192.168.1.2:51820"
    [peer6] = desired_peers(cfg(Mode="ipv6"), layout, [lease(2, K2, ip6="2001:db8::2")],
                            LOCAL)
    # The v6 data advertises ListenPortV6 (a Go quirk); the one open port is ListenPort.
    assert peer6.endpoint == "[2001:db8::2]:51820"


@pytest.mark.parametrize(("peer_v4", "peer_v6", "local", "endpoint"), [
    ("8.8.8.2", "2001:db8::2", LocalEndpoints(IPv4Address("8.8.8.1"),
                                               IPv6Address("2001:db8::1")), "8.8.8.2:51820"),
    ("192.168.1.2", "2001:db8::2", LocalEndpoints(IPv4Address("192.168.1.1"),
                                                   IPv6Address("2001:db8::1")),
     "[2001:db8::2]:51820"),
    ("192.168.1.2", "2001:db8::2", LocalEndpoints(IPv4Address("192.168.1.1"),
                                                   IPv6Address("fd00::1")), "192.168.1.2:51820"),
    ("192.168.1.2", "fd00::2", LocalEndpoints(IPv4Address("192.168.1.1"),
                                               IPv6Address("2001:db8::1")), "192.168.1.2:51820"),
    ("8.8.8.2", "2001:db8::2", LocalEndpoints(None, IPv6Address("2001:db8::1")),
     "[2001:db8::2]:51820"),
    ("192.168.1.2", None, LocalEndpoints(None, IPv6Address("2001:db8::1")),
     "192.168.1.2:51820"),
])
def test_auto_mode_endpoint_family_choice(peer_v4, peer_v6, local, endpoint):
    c = cfg(Mode="auto")
    layout = c.devices(True, peer_v6 is not None)[0]
    [peer] = desired_peers(c, layout, [lease(2, K2, ip=peer_v4, ip6=peer_v6)], local)
    assert peer.endpoint == endpoint


def test_other_backends_and_unusable_data_are_skipped():
    c = cfg()
    layout = c.devices(True, False)[0]
    bad = Lease(IPv4Network("10.5.4.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address("192.168.1.4"), backend_type="wireguard",
        backend_data='{"PublicKey":"nope"}'))
    assert desired_peers(c, layout, [lease(3, K3, backend="vxlan"), bad], LOCAL) == []


def state(*peers: Peer) -> dict[str, PeerState]:
    return {p.public_key: PeerState(p.normalised(), None) for p in peers}


P2 = Peer(K2, "192.168.1.2:51820", frozenset({"10.5.2.0/24"}), PSK, 25)


def test_diff_of_equal_sets_is_empty():
    assert diff_peers([P2], state(P2)) == ()


def test_diff_adds_in_full_and_removes_after():
    old = Peer(K3, "192.168.1.3:51820", frozenset({"10.5.3.0/24"}))
    assert diff_peers([P2], state(old)) == (
        PeerUpdate(K2, endpoint=P2.endpoint, psk=PSK, set_psk=True, keepalive=25,
                   allowed_ips=P2.allowed_ips),
        PeerUpdate(K3, remove=True))


def test_diff_changes_only_the_fields_that_differ():
    drifted = Peer(K2, "192.168.1.9:4000", frozenset({"10.5.2.0/24"}), PSK, 25)
    assert diff_peers([P2], state(drifted)) == (
        PeerUpdate(K2, update_only=True, endpoint="192.168.1.2:51820"),)
    no_psk = Peer(K2, P2.endpoint, frozenset({"10.5.9.0/24"}), None, 0)
    assert diff_peers([P2], state(no_psk)) == (
        PeerUpdate(K2, update_only=True, psk=PSK, set_psk=True, keepalive=25,
                   allowed_ips=frozenset({"10.5.2.0/24"})),)
    unwanted_psk = Peer(K2, P2.endpoint, P2.allowed_ips, PSK, 25)
    want = Peer(K2, P2.endpoint, P2.allowed_ips, None, 25)
    assert diff_peers([want], state(unwanted_psk)) == (
        PeerUpdate(K2, update_only=True, set_psk=True),)


class FakeDevice:
    """A device double for the reconciler's own logic: models UAPI get/set as a dict of peers
    (every set peer gets P2 and a handshake at t=1000). Used where a real wireguard-go cannot
    show the case (a set that does not take, a controlled clock); the real device is covered
    in tests/integration/test_wg_engine.py."""

    name = "flannel-wg"

    def __init__(self) -> None:
        self.peers: dict[str, PeerState] = {}
        self.control = self
        self.sets: list[DeviceUpdate] = []

    def get(self) -> DeviceState:
        return DeviceState(None, 51820, dict(self.peers))

    def set(self, update: DeviceUpdate) -> None:
        self.sets.append(update)
        for change in update.peers:
            if change.remove:
                self.peers.pop(change.public_key, None)
            else:
                self.peers[change.public_key] = PeerState(P2, 1000.0)


def test_the_reconciler_applies_once_then_reports_handshake_ages():
    device = FakeDevice()
    peers = WireguardPeers(device, clock=lambda: 1030.0)
    status = peers.reconcile([P2])
    assert status.in_sync and status.changes == 1 and len(device.sets) == 1
    assert status.handshake_age == {K2: 30.0} and status.without_handshake() == []
    assert peers.reconcile([P2]).changes == 0 and len(device.sets) == 1


def test_a_change_that_does_not_take_is_reported_not_hidden():
    device = FakeDevice()
    device.set = lambda update: None
    status = WireguardPeers(device).reconcile([P2])
    assert not status.in_sync
    assert status.summary() == ("wireguard peers not in sync: 1 peer changes did not take: "
                                f"add peer {K2} (endpoint, preshared key, keepalive, allowed "
                                "IPs)")
    assert "Secret" not in status.summary()


def test_status_without_handshake():
    status = PeerStatus(True, "", 0, {K1: None, K2: 10.0, K3: 500.0})
    assert status.without_handshake() == sorted([K1, K3])
