"""The ipip backend's desired state, config checks and registration (no kernel involved):
one onlink route per peer via its public IP on flannel.ipip, DirectRouting peers on the
external interface, Go's config errors."""

import asyncio
import json
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend import backend_class
from flannel.backend.base import BackendError
from flannel.backend.ipip import IpipBackend
from flannel.config import check_network_config, parse_config
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.ipipdev import IpipSpec
from flannel.kernel.reconcile import LinkState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("203.0.113.1"), None)
TUNNEL = 9


def backend(direct_routing: object = None, **network: object) -> IpipBackend:
    cfg: dict[str, object] = {"Type": "ipip"}
    if direct_routing is not None:
        cfg["DirectRouting"] = direct_routing
    config = parse_config(json.dumps({"Network": "10.244.0.0/16", "Backend": cfg, **network}))
    check_network_config(config)
    ipip = IpipBackend(EXT, config)
    ipip.spec, ipip.index = IpipSpec("flannel.ipip", IPv4Address("192.168.1.1"), 1480), TUNNEL
    ipip.lease = Lease(IPv4Network("10.244.1.0/24"))
    return ipip


def peer(third: int, ip: str = "", backend_type: str = "ipip") -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(ip or f"192.168.7.{third}"), backend_type=backend_type))


def test_one_onlink_route_per_peer_via_its_public_ip_on_the_tunnel():
    state = backend().desired_state([peer(2), peer(3)], lambda _ip: None)
    assert state.routes == {Route("10.244.2.0/24", "192.168.7.2", TUNNEL, onlink=True),
                            Route("10.244.3.0/24", "192.168.7.3", TUNNEL, onlink=True)}
    assert not state.neighbours and not state.fdb


def test_the_device_its_address_and_the_adoption_bounds_are_described():
    state = backend().desired_state([peer(2)], lambda _ip: None)
    assert state.devices == {TUNNEL}
    assert state.links == {LinkState(TUNNEL, "flannel.ipip", 1480, "")}
    assert state.addresses == {(TUNNEL, "10.244.1.0/32")}
    assert state.networks == (IPv4Network("10.244.0.0/16"),)
    assert state.local_subnets == (IPv4Network("10.244.1.0/24"),)
    assert state.underlay == EXT.index


def test_direct_routing_puts_on_link_peers_on_the_external_interface():
    on_link = Route("192.168.1.5/32", None, EXT.index)
    routed = Route("192.168.7.3/32", "192.168.1.254", EXT.index)
    lookup = {"192.168.1.5": on_link, "192.168.7.3": routed}
    state = backend(direct_routing=True).desired_state(
        [peer(2, "192.168.1.5"), peer(3)], lambda ip: lookup.get(str(ip)))
    assert state.routes == {Route("10.244.2.0/24", "192.168.1.5", EXT.index, onlink=True),
                            Route("10.244.3.0/24", "192.168.7.3", TUNNEL, onlink=True)}


def test_without_direct_routing_on_link_peers_still_use_the_tunnel():
    on_link = Route("192.168.1.5/32", None, EXT.index)
    state = backend().desired_state([peer(2, "192.168.1.5")], lambda _ip: on_link)
    assert state.routes == {Route("10.244.2.0/24", "192.168.1.5", TUNNEL, onlink=True)}


def test_only_ipip_leases_are_wanted_and_leases_without_public_ip_are_skipped():
    ipip = backend()
    assert ipip.wants(peer(2)) and not ipip.wants(peer(3, backend_type="vxlan"))
    bare = Lease(IPv4Network("10.244.4.0/24"), attrs=LeaseAttrs(backend_type="ipip"))
    assert not ipip.desired_state([bare], lambda _ip: None).routes


def test_config_errors_say_what_is_wrong():
    with pytest.raises(BackendError) as err:
        backend(direct_routing="yes")
    assert str(err.value) == ('error decoding IPIP backend config: DirectRouting must be a '
                              'bool, got string "yes"')
    assert backend(direct_routing=True).ipip.direct_routing


def test_ipv6_is_refused_before_any_device_is_made():
    dual = backend(EnableIPv6=True, IPv6Network="fd00:10:244::/56")
    with pytest.raises(BackendError) as err:
        asyncio.run(dual.prepare())
    assert str(err.value) == ("the ipip backend carries IPv4 only: set EnableIPv6 to false "
                              "(and keep EnableIPv4), or choose the vxlan or wireguard backend "
                              "for IPv6")


def test_ipip_and_extension_are_registered():
    assert backend_class("ipip") is IpipBackend
    assert backend_class("extension").backend_type == "extension"
