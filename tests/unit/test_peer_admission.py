"""Which peer leases a backend programs (``flannel/backend/admission.py``), with the real
vxlan and wireguard backends' declarations: data the kernel would refuse (zero, multicast
and broadcast VTEP MACs, no WireGuard key) refused with its reason; an identity (VTEP MAC,
public key) belonging to this node or to the oldest lease claiming it, a newer claimant
from another address refused and never merged; one node's leases sharing theirs; desired
state built from the admitted leases only, so removing a refused lease removes nothing of
its victim's; and each refusal logged once and counted."""

from __future__ import annotations

import base64
import json
import logging
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.vxlan import VxlanBackend, _Family
from flannel.backend.wireguard import WireguardBackend
from flannel.config import parse_config
from flannel.kernel import device
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import FdbEntry
from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.config import encode_lease_data

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)
NETWORK = '"Network": "10.244.0.0/16"'
OWN_MAC, VICTIM_MAC = "0e:00:00:00:00:01", "0e:00:00:00:00:02"
KEY = {n: base64.b64encode(bytes([n]) * 32).decode() for n in range(1, 6)}


def vxlan_lease(third: int, mac: str, ip: str = "", created: int = 0) -> Lease:
    data = json.dumps({"VNI": 1, "VtepMAC": mac}, separators=(",", ":"))
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(ip or f"192.168.1.{third}"), backend_type="vxlan",
        backend_data=data), created=created)


def vxlan() -> VxlanBackend:
    backend = VxlanBackend(EXT, parse_config(f'{{{NETWORK}, "Backend": {{"Type": "vxlan"}}}}'))
    spec = device.VxlanSpec(name="flannel.1", vni=1, port=0, local=EXT.iface_addr,
                            underlay_index=2, learning=False, gbp=False, mtu=1450, mac=OWN_MAC)
    backend.families = {4: _Family(spec, index=5, mac=OWN_MAC)}
    backend.lease = vxlan_lease(1, OWN_MAC)
    backend.admission.own(backend.lease)
    return backend


def fdb(backend: VxlanBackend, peers: tuple[Lease, ...]) -> set[FdbEntry]:
    return set(backend.desired_state(peers, lambda _ip: None).fdb)


@pytest.mark.parametrize(("mac", "why"), [
    ("00:00:00:00:00:00", "its IPv4 VtepMAC 00:00:00:00:00:00 is zero, which no VTEP has"),
    ("01:00:5e:00:00:01", "its IPv4 VtepMAC 01:00:5e:00:00:01 is a multicast or broadcast "
                          "MAC, not one VTEP's"),
    ("ff:ff:ff:ff:ff:ff", "its IPv4 VtepMAC ff:ff:ff:ff:ff:ff is a multicast or broadcast "
                          "MAC, not one VTEP's"),
    ("zz", 'its IPv4 backend data has no valid VtepMAC (a vxlan lease needs '
           '{"VtepMAC":"<6-byte MAC>"})'),
])
def test_a_vtep_mac_the_kernel_refuses_is_refused_and_the_others_admitted(mac, why, caplog):
    backend = vxlan()
    good, bad = vxlan_lease(2, VICTIM_MAC), vxlan_lease(3, mac)
    assert backend.admit((good, bad)) == (good,)
    reason = f"{why}; the node that owns it rewrites it on restart, or delete the lease"
    assert backend.admission.refused == {bad.key: ("invalid_data", reason)}
    assert backend.admit((good, bad)) == (good,)
    assert caplog.text.count(f"ignoring peer {bad.key}: {reason}") == 1  # once
    assert backend.admission.refusals == {"invalid_data": 1, "identity_taken": 0,
                                          "kernel_refused": 0}


def test_a_vtep_mac_belongs_to_the_oldest_lease_and_a_thief_takes_nothing(caplog):
    caplog.set_level(logging.WARNING)
    backend = vxlan()
    victim = vxlan_lease(2, VICTIM_MAC, created=10)
    thief = vxlan_lease(66, VICTIM_MAC, created=90)  # another address, newer
    bystander = vxlan_lease(3, "0e:00:00:00:00:03", created=95)
    assert backend.admit((thief, victim, bystander)) == (victim, bystander)
    assert backend.admission.refused == {thief.key: ("identity_taken", (
        "its IPv4 VtepMAC 0e:00:00:00:00:02 belongs to the older lease 10.244.2.0-24 (public "
        "IP 192.168.1.2): a lease may not take another node's identity; delete it, or "
        "restart the node that wrote it"))}
    victim_fdb = FdbEntry(5, VICTIM_MAC, "192.168.1.2")
    assert victim_fdb in fdb(backend, backend.admit((thief, victim, bystander)))
    # The thief's lease goes: nothing of the victim's goes with it.
    assert victim_fdb in fdb(backend, backend.admit((victim, bystander)))
    assert backend.admission.refused == {}
    # Order of arrival does not matter, the store's order does: every node agrees.
    older_thief = vxlan_lease(66, VICTIM_MAC, created=5)
    assert backend.admit((victim, older_thief)) == (older_thief,)
    assert caplog.text.count("ignoring peer 10.244.66.0-24") == 1


def test_ties_in_age_are_broken_by_the_key():
    backend = vxlan()
    first, second = vxlan_lease(2, VICTIM_MAC, created=7), vxlan_lease(9, VICTIM_MAC, created=7)
    assert backend.admit((second, first)) == (first,)


def test_this_nodes_own_identity_is_never_a_peers():
    backend = vxlan()
    thief = vxlan_lease(66, OWN_MAC, created=0)  # older than anything: still not ours to lose
    assert backend.admit((thief,)) == ()
    assert backend.admission.refused[thief.key] == ("identity_taken", (
        "its IPv4 VtepMAC 0e:00:00:00:00:01 is this node's own: a lease may not take another "
        "node's identity; delete it, or restart the node that wrote it"))


def test_one_nodes_leases_share_its_identity():
    # A node registered again under a new subnet while its old lease lives: same address.
    backend = vxlan()
    old, new = vxlan_lease(2, VICTIM_MAC, created=1), vxlan_lease(7, VICTIM_MAC, "192.168.1.2",
                                                                  created=2)
    assert backend.admit((old, new)) == (old, new)
    assert fdb(backend, (old, new)) == {FdbEntry(5, VICTIM_MAC, "192.168.1.2")}
    # Either going leaves the entry the other still needs.
    assert fdb(backend, backend.admit((new,))) == {FdbEntry(5, VICTIM_MAC, "192.168.1.2")}


def test_a_lease_refused_for_an_older_claim_frees_its_other_identities():
    # A (oldest) holds X; B claims X and Y and is refused; C's claim on Y then stands.
    backend = WireguardBackend(EXT, parse_config(f'{{{NETWORK}, "Backend": '
                                                 '{"Type": "wireguard"}}'))

    def wg(third: int, *keys: int, created: int) -> Lease:
        return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address(f"192.168.1.{third}"), backend_type="wireguard",
            backend_data=encode_lease_data(KEY[keys[0]], 51820),
            backend_v6_data=encode_lease_data(KEY[keys[-1]], 51821)), created=created)

    a, b, c = wg(2, 1, created=1), wg(3, 1, 2, created=2), wg(4, 2, created=3)
    assert backend.admit((c, b, a)) == (c, a)
    assert set(backend.admission.refused) == {b.key}


def test_a_wireguard_key_of_ours_or_an_older_leases_is_refused():
    backend = WireguardBackend(EXT, parse_config(f'{{{NETWORK}, "Backend": '
                                                 '{"Type": "wireguard"}}'))

    def wg(third: int, key: int, created: int) -> Lease:
        return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address(f"192.168.1.{third}"), backend_type="wireguard",
            backend_data=encode_lease_data(KEY[key], 51820)), created=created)

    backend.admission.own(wg(1, 1, created=50))
    victim, thief, ours = wg(2, 2, created=10), wg(66, 2, created=20), wg(67, 1, created=1)
    broken = Lease(IPv4Network("10.244.9.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address("192.168.1.9"), backend_type="wireguard",
        backend_data='{"PublicKey":"nope","Port":1}'))
    assert backend.admit((victim, thief, ours, broken)) == (victim,)
    refused = backend.admission.refused
    assert refused[thief.key][0] == refused[ours.key][0] == "identity_taken"
    assert f"its PublicKey {KEY[2]} belongs to the older lease {victim.key}" in \
        refused[thief.key][1]
    assert f"its PublicKey {KEY[1]} is this node's own" in refused[ours.key][1]
    assert refused[broken.key] == ("invalid_data", (
        'its wireguard backend data has no valid PublicKey and Port (a wireguard lease needs '
        '{"PublicKey":"<base64 key>","Port":<port>}); the node that owns it rewrites it on '
        "restart, or delete the lease"))


def test_an_unchanged_peer_set_gives_the_same_tuple_back():
    backend = vxlan()
    peers = (vxlan_lease(2, VICTIM_MAC), vxlan_lease(3, "0e:00:00:00:00:03"))
    first = backend.admit(peers)
    assert backend.admit(peers) is first
    assert backend.admit(tuple(peers)) is first  # another tuple of the same leases


def test_another_spelling_of_a_wireguard_key_is_the_same_key():
    # The last base64 digit before "=" carries two padding bits: four spellings, one key,
    # which the device reports in the one spelling with zero bits.
    backend = WireguardBackend(EXT, parse_config(f'{{{NETWORK}, "Backend": '
                                                 '{"Type": "wireguard"}}'))
    spelled = KEY[2][:-2] + chr(ord(KEY[2][-2]) + 3) + "="
    assert base64.b64decode(spelled) == base64.b64decode(KEY[2]) and spelled != KEY[2]

    def wg(third: int, key: str, created: int) -> Lease:
        return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address(f"192.168.1.{third}"), backend_type="wireguard",
            backend_data=json.dumps({"PublicKey": key, "Port": 51820})), created=created)

    victim, thief = wg(2, KEY[2], created=1), wg(66, spelled, created=2)
    assert backend.admit((victim, thief)) == (victim,)
    assert backend.identities(thief, backend.config) == (f"PublicKey {KEY[2]}",)


def test_a_peer_parked_by_the_kernel_then_refused_for_its_data_shows_that_reason():
    backend = vxlan()
    peer = vxlan_lease(2, VICTIM_MAC)
    assert backend.admit((peer,)) == (peer,)
    backend.admission.park(peer, "Network is unreachable (replace route ...)")
    assert backend.admission.refused[peer.key][0] == "kernel_refused"
    broken = vxlan_lease(2, "00:00:00:00:00:00")
    assert backend.admit((broken,)) == ()
    assert backend.admission.refused[peer.key][0] == "invalid_data"
    assert peer.key not in backend.admission.parked
