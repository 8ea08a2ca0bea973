"""The vxlan and host-gw backends' desired state, config checks and advice (no kernel
involved)."""

import dataclasses
import errno
import gc
import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest

from flannel.backend.base import BackendError
from flannel.backend.hostgw import HostGwBackend
from flannel.backend.vxlan import VxlanBackend, VxlanConfig, _Family
from flannel.config import check_network_config, parse_config
from flannel.kernel.device import VxlanSpec
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import LinkState, reconcile
from flannel.kernel.rtnl import FdbEntry, Neighbour, NetlinkError, Route
from flannel.lease import Lease, LeaseAttrs
from tests.support.fakenetlink import FakeKernel

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)


def backend(direct_routing: bool = False) -> VxlanBackend:
    config = parse_config(json.dumps({"Network": "10.244.0.0/16", "Backend": {
        "Type": "vxlan", "DirectRouting": direct_routing}}))
    check_network_config(config)
    vxlan = VxlanBackend(EXT, config)
    spec = VxlanSpec("flannel.1", 1, 0, EXT.iface_addr, 2, False, False, 1450,
                     "0e:00:00:00:00:01")
    vxlan.families[4] = _Family(spec, index=7, mac=spec.mac)
    return vxlan


def peer(third: int, mac: str, ip: str = "192.168.1.2", backend_type: str = "vxlan") -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(ip), backend_type=backend_type,
        backend_data=json.dumps({"VNI": 1, "VtepMAC": mac})))


def test_one_neighbour_fdb_entry_and_route_per_peer():
    state = backend().desired_state([peer(2, "0E:00:00:00:00:02")], lambda _ip: None)
    assert state.neighbours == {Neighbour(7, "10.244.2.0", "0e:00:00:00:00:02")}
    assert state.fdb == {FdbEntry(7, "0e:00:00:00:00:02", "192.168.1.2")}
    assert state.routes == {Route("10.244.2.0/24", "10.244.2.0", 7, onlink=True)}
    assert state.devices == {7}


def test_a_peer_handed_over_again_keeps_its_record_and_a_changed_one_gets_a_new_one():
    """One record per peer: the next desired state shares the lease and decoded MAC of
    unchanged peers (what the data plane programmed is referenced, not copied) and decodes
    a changed one again; the difference between the two states is the changed peer's
    entries alone."""
    vxlan = backend()
    same, moved = peer(2, "0e:00:00:00:00:02"), peer(3, "0e:00:00:00:00:03")
    first = vxlan.desired_state([same, moved], lambda _ip: None)
    macs = dict(first.fdb.tables[0].by_base)  # type: ignore[attr-defined]
    moved_again = peer(3, "0e:00:00:00:00:03", ip="192.168.1.9")
    second = vxlan.desired_state([same, moved_again], lambda _ip: None)
    table = second.fdb.tables[0]  # type: ignore[attr-defined]
    assert table.by_base[same.v4_base] is macs[same.v4_base]
    assert table.by_mac[table.by_base[moved.v4_base]] is moved_again
    assert FdbEntry(7, "0e:00:00:00:00:03", "192.168.1.9") in second.fdb
    assert FdbEntry(7, "0e:00:00:00:00:03", "192.168.1.2") not in second.fdb
    assert second.fdb - first.fdb == {FdbEntry(7, "0e:00:00:00:00:03", "192.168.1.9")}
    assert first.fdb - second.fdb == {FdbEntry(7, "0e:00:00:00:00:03", "192.168.1.2")}
    assert not second.neighbours - first.neighbours and not second.routes - first.routes


def test_the_compact_entries_answer_as_sets_of_the_entries_would():
    """Membership, identity and difference of the desired state's entries, against plain
    sets of the same entries (what the kernel's dumps are compared with)."""
    vxlan = backend()
    peers = [peer(2, "0e:00:00:00:00:02"), peer(3, "0e:00:00:00:00:03", ip="192.168.1.3")]
    state = vxlan.desired_state(peers, lambda _ip: None)
    plain = {"routes": set(state.routes), "neighbours": set(state.neighbours),
             "fdb": set(state.fdb)}
    assert plain["routes"] == {Route("10.244.2.0/24", "10.244.2.0", 7, onlink=True),
                               Route("10.244.3.0/24", "10.244.3.0", 7, onlink=True)}
    others = [Route("10.244.2.0/24", "10.244.2.0", 7), Route("10.244.2.0/25", "10.244.2.0", 7,
                                                              onlink=True),
              Route("10.244.2.0/24", "10.244.2.1", 7, onlink=True),
              Route("10.244.2.0/24", "10.244.2.0", 8, onlink=True),
              Neighbour(7, "10.244.2.0", "0e:00:00:00:00:03"), Neighbour(8, "10.244.2.0",
                                                                         "0e:00:00:00:00:02"),
              Neighbour(7, "10.244.4.0", "0e:00:00:00:00:02"),
              FdbEntry(7, "0e:00:00:00:00:02", "192.168.1.3"),
              FdbEntry(7, "0e:00:00:00:00:02", "192.168.1.2", port=4789),
              FdbEntry(7, "0e:00:00:00:00:04", "192.168.1.2")]
    for entry in [*plain["routes"], *plain["neighbours"], *plain["fdb"], *others]:
        for name, entries in plain.items():
            assert (entry in getattr(state, name)) == (entry in entries), (entry, name)
    assert state.wants_route_at("10.244.2.0/24", 0)
    assert not state.wants_route_at("10.244.2.0/24", 5)
    assert not state.wants_route_at("10.244.2.0/25", 0)
    assert state.wants_neighbour_at(7, "10.244.3.0") and not state.wants_neighbour_at(8,
                                                                                       "10.244.3.0")
    assert state.wants_fdb_at(7, "0e:00:00:00:00:03") and not state.wants_fdb_at(
        7, "0e:00:00:00:00:04")
    kernel = {Neighbour(7, "10.244.2.0", "0e:00:00:00:00:02"),
              Neighbour(7, "10.244.9.0", "0e:00:00:00:00:09")}
    assert state.neighbours - kernel == {Neighbour(7, "10.244.3.0", "0e:00:00:00:00:03")}
    assert kernel - state.neighbours == {Neighbour(7, "10.244.9.0", "0e:00:00:00:00:09")}
    assert len(state.routes) == len(state.neighbours) == len(state.fdb) == 2


def test_a_pass_over_the_same_peers_and_device_shares_the_sets_and_a_change_makes_new_ones():
    """A periodic pass hands over the same peer set: no new sets of every entry."""
    vxlan = backend()
    peers = (peer(2, "0e:00:00:00:00:02"),)
    first = vxlan.desired_state(peers, lambda _ip: None)
    again = vxlan.desired_state(peers, lambda _ip: None)
    assert again == first
    assert again.routes is first.routes and again.fdb is first.fdb
    vxlan.families[4].index = 8  # the device was re-created
    moved = vxlan.desired_state(peers, lambda _ip: None)
    assert moved.devices == {8} and Neighbour(8, "10.244.2.0", "0e:00:00:00:00:02") in \
        moved.neighbours
    grown = vxlan.desired_state((*peers, peer(3, "0e:00:00:00:00:03")), lambda _ip: None)
    assert len(grown.routes) == 2


def test_peers_with_unusable_backend_data_are_skipped():
    peers = [peer(3, "zz:00:00:00:00:03"), peer(4, "0e:00:00"),
             Lease(IPv4Network("10.244.5.0/24"), attrs=LeaseAttrs(
                 public_ip=IPv4Address("192.168.1.5"), backend_type="vxlan",
                 backend_data='"not an object"'))]
    state = backend().desired_state(peers, lambda _ip: None)
    assert not state.routes and not state.neighbours and not state.fdb


@pytest.mark.parametrize("mac", ["0e:00:00:00:00:02", "0E:AA:00:00:00:02", "0e:00:00:00:0002:",
                                 "0e:00:00:00:00:2", "::::::::::::::::a"])
@pytest.mark.parametrize("vni", ["1", "0", "-3", "01"])
def test_gos_compact_backend_data_gives_what_the_json_decoder_gives(mac, vni):
    """The backend data in the one spelling vxlan nodes write is read without the JSON
    decoder; the same data spelled otherwise is decoded: the entries must not differ."""
    def state(backend_data: str):
        lease = Lease(IPv4Network("10.244.2.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address("192.168.1.2"), backend_type="vxlan",
            backend_data=backend_data))
        found = backend().desired_state([lease], lambda _ip: None)
        return found.routes, found.neighbours, found.fdb

    compact = f'{{"VNI":{vni},"VtepMAC":"{mac}"}}'
    assert state(compact) == state(compact.replace(",", ", "))


def test_only_vxlan_leases_are_wanted():
    vxlan = backend()
    assert vxlan.wants(peer(2, "0e:00:00:00:00:02"))
    assert not vxlan.wants(peer(2, "0e:00:00:00:00:02", backend_type="host-gw"))


def test_direct_routing_uses_the_underlay_for_on_link_peers():
    on_link = Route("192.168.1.2/32", None, 2)
    via_router = Route("192.168.9.9/32", "192.168.1.254", 2)
    lookups = {"192.168.1.2": on_link, "192.168.9.9": via_router}
    state = backend(direct_routing=True).desired_state(
        [peer(2, "0e:00:00:00:00:02"), peer(9, "0e:00:00:00:00:09", ip="192.168.9.9")],
        lambda ip: lookups[str(ip)])
    assert Route("10.244.2.0/24", "192.168.1.2", 2) in state.routes
    assert Route("10.244.9.0/24", "10.244.9.0", 7, onlink=True) in state.routes
    assert {n.ip for n in state.neighbours} == {"10.244.9.0"}


def test_device_attributes_address_and_adoption_bounds_are_part_of_the_desired_state():
    vxlan = backend()
    vxlan.lease = Lease(IPv4Network("10.244.7.0/24"))
    state = vxlan.desired_state([], lambda _ip: None)
    assert state.links == {LinkState(7, "flannel.1", 1450, "0e:00:00:00:00:01")}
    assert state.addresses == {(7, "10.244.7.0/32")}
    assert state.networks == (IPv4Network("10.244.0.0/16"),)
    assert state.local_subnets == (IPv4Network("10.244.7.0/24"),)
    assert state.underlay == EXT.index


@pytest.mark.parametrize("mtu", [65536, 100000])
def test_an_mtu_above_the_kernel_limit_is_refused_naming_the_limit(mtu):
    with pytest.raises(BackendError) as caught:
        VxlanConfig.from_backend({"Type": "vxlan", "MTU": mtu})
    assert str(caught.value) == (
        f"error decoding VXLAN backend config: MTU {mtu} is too large: it is the underlay "
        "MTU, at most 65535, and the vxlan device gets it minus 50 bytes of encapsulation (at "
        "most 65485); give the underlay MTU (e.g. 1500 or 9000)")
    assert VxlanConfig.from_backend({"Type": "vxlan", "MTU": 65535}).mtu == 65535


def test_host_gw_explains_an_unreachable_peer():
    config = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                      "Backend": {"Type": "host-gw"}}))
    hostgw = HostGwBackend(EXT, config)
    unreachable = NetlinkError(errno.ENETUNREACH, "replace route 10.244.2.0/24 via 10.9.0.2")
    assert hostgw.failure_hint(unreachable) == (
        "host-gw needs every node on one L2 segment: a peer's public IP must be directly "
        "reachable on eth0, with no router in between; across routed networks use the vxlan "
        "backend (DirectRouting keeps direct routes for the peers on the same segment)")
    assert hostgw.failure_hint(NetlinkError(errno.EEXIST, "replace route x")) == ""


def test_the_ipv6_device_mtu_leaves_room_for_the_outer_ipv6_header():
    """Go flannel subtracts 50 for both families; the outer IPv6 header is 20 bytes longer."""
    ext = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), IPv6Address("fd00::1"),
                            IPv4Address("192.168.1.1"), IPv6Address("fd00::1"))
    config = parse_config(json.dumps({"Network": "10.244.0.0/16", "EnableIPv6": True,
                                      "IPv6Network": "fd10::/56",
                                      "Backend": {"Type": "vxlan"}}))
    check_network_config(config)
    vxlan = VxlanBackend(ext, config)
    assert (vxlan.device_mtu(4), vxlan.device_mtu(6)) == (1450, 1430)


class _CountingKernel(FakeKernel):
    """Keeps copies of what it is given, as a kernel does, and counts the Neighbour objects
    alive in the process when the first route arrives."""

    neighbours_alive: int | None = None

    def put(self, obj: object, protocol: int = 0) -> None:
        if isinstance(obj, Route) and self.neighbours_alive is None:
            self.neighbours_alive = sum(type(o) is Neighbour for o in gc.get_objects())
        super().put(dataclasses.replace(obj), protocol)


def test_a_first_pass_makes_and_drops_one_kind_of_entries_at_a_time():
    """vxlan's entries are made as a pass sends them, a kind at a time: when the routes go
    out, the neighbours sent before them are gone from flanneld (the kernel's copies are all
    that is left), so a first pass over thousands of peers never holds every request."""
    vxlan = backend()
    peers = [peer(third, f"0e:00:00:00:01:{third:02x}") for third in range(2, 202)]
    state = vxlan.desired_state(peers, lambda _ip: None)
    kernel = _CountingKernel()
    gc.collect()
    before = sum(type(o) is Neighbour for o in gc.get_objects())
    made = reconcile(kernel.open(), state)
    assert len(kernel.ours()) == 600
    # The kernel's 200 copies, and at most the few in flight (not the 200 sent before).
    assert kernel.neighbours_alive is not None
    assert 200 <= kernel.neighbours_alive - before < 210
    assert made == {"neighbour": 200, "fdb": 200, "route": 200}


class _FirstPutKernel(FakeKernel):
    """Keeps copies of what it is given, and counts the Neighbour objects alive in the
    process when the first neighbour arrives, and the order the neighbours arrive in."""

    neighbours_alive: int | None = None
    order: list[str]

    def put(self, obj: object, protocol: int = 0) -> None:
        if isinstance(obj, Neighbour):
            if self.neighbours_alive is None:
                self.neighbours_alive = sum(type(o) is Neighbour for o in gc.get_objects())
                self.order = []
            self.order.append(obj.ip)
        super().put(dataclasses.replace(obj), protocol)


def test_a_first_pass_makes_each_entry_as_it_is_sent_in_address_order():
    """Over a kernel without our entries, a pass makes vxlan's entries a datagram at a time
    (a first pass over 20,000 peers made and sorted each kind's 20,000 entries at once), by
    the peers' addresses, and skips those the kernel already holds."""
    vxlan = backend()
    peers = [Lease(IPv4Network(f"10.{244 + n // 250}.{n % 250}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address("192.168.1.2"), backend_type="vxlan",
        backend_data=json.dumps({"VNI": 1, "VtepMAC": f"0e:00:00:00:{n >> 8:02x}:{n & 255:02x}"})
    )) for n in reversed(range(900))]
    state = vxlan.desired_state(peers, lambda _ip: None)
    kernel = _FirstPutKernel()
    held = Neighbour(7, "10.244.5.0", "0e:00:00:00:00:05")
    FakeKernel.put(kernel, held)
    gc.collect()
    before = sum(type(o) is Neighbour for o in gc.get_objects())
    made = reconcile(kernel.open(), state)
    assert made == {"neighbour": 899, "fdb": 900, "route": 900}
    assert kernel.neighbours_alive is not None
    assert kernel.neighbours_alive - before <= 300  # one datagram's, not the 899
    expected = sorted({lease.subnet.network_address for lease in peers} - {IPv4Address(held.ip)})
    assert kernel.order == [str(address) for address in expected]
