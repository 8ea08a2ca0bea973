"""The vxlan backend's desired state for a peer set (no kernel involved)."""

import json
from ipaddress import IPv4Address, IPv4Network

from flannel.backend.vxlan import VxlanBackend, _Family
from flannel.config import check_network_config, parse_config
from flannel.kernel.device import VxlanSpec
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease, LeaseAttrs

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


def test_peers_with_unusable_backend_data_are_skipped():
    peers = [peer(3, "zz:00:00:00:00:03"), peer(4, "0e:00:00"),
             Lease(IPv4Network("10.244.5.0/24"), attrs=LeaseAttrs(
                 public_ip=IPv4Address("192.168.1.5"), backend_type="vxlan",
                 backend_data='"not an object"'))]
    state = backend().desired_state(peers, lambda _ip: None)
    assert not state.routes and not state.neighbours and not state.fdb


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
