"""What a backend tells the operator tools it does with each peer (``Backend.describe``) is
what it programs: for the same peers and devices, the kernel entries of every peer it uses
are exactly its ``desired_state`` of the peers it admits, and the engine entries exactly
what its applier puts in the engine; the leases it does not use are named with flanneld's
reason (its admission's, for data it cannot use and identities a lease may not claim); what
carries a peer is what the traffic rules drop and filter. No kernel involved."""

from __future__ import annotations

import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from flannel.backend.base import Backend
from flannel.backend.extension import ExtensionBackend
from flannel.backend.hostgw import HostGwBackend
from flannel.backend.ipip import IpipBackend
from flannel.backend.ipsec import IKE_SA, IpsecBackend
from flannel.backend.plan import Description, NodeView, versions
from flannel.backend.udp import UdpBackend
from flannel.backend.vxlan import VxlanBackend, _Family
from flannel.backend.wireguard import WireguardBackend, peer_entry
from flannel.config import NetworkConfig, check_network_config, parse_config
from flannel.ipsec.config import connection_name
from flannel.kernel.device import VxlanSpec
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.ipipdev import IpipSpec
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs
from flannel.wireguard.peers import LocalEndpoints, desired_peers

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"),
                        IPv6Address("fd00:1::1"), IPv4Address("192.168.1.1"),
                        IPv6Address("fd00:1::1"))
OWN = Lease(IPv4Network("10.244.1.0/24"), IPv6Network("fd00:10:244:1::/64"),
            LeaseAttrs(public_ip=IPv4Address("192.168.1.1"),
                       public_ipv6=IPv6Address("fd00:1::1")), etcd_lease_id=7)
KEY = "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="


def config(backend: dict[str, object], dual: bool = False) -> NetworkConfig:
    doc: dict[str, object] = {"Network": "10.244.0.0/16", "Backend": backend}
    if dual:
        doc.update(EnableIPv6=True, IPv6Network="fd00:10:244::/56")
    parsed = parse_config(json.dumps(doc))
    check_network_config(parsed)
    return parsed


def lease(third: int, backend_type: str, data: str | None = None, v6: bool = False,
          ip: str = "", reservation: bool = False) -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"),
                 IPv6Network(f"fd00:10:244:{third:x}::/64") if v6 else None,
                 LeaseAttrs(public_ip=IPv4Address(ip or f"192.168.1.{third}"),
                            public_ipv6=IPv6Address(f"fd00:1::{third:x}") if v6 else None,
                            backend_type=backend_type, backend_data=data,
                            backend_v6_data=data if v6 else None),
                 etcd_lease_id=0 if reservation else 9)


def vtep(third: int) -> str:
    return json.dumps({"VNI": 1, "VtepMAC": f"0e:00:00:00:00:{third:02x}"})


def used(description: Description) -> dict[str, frozenset]:
    """The union of the kernel entries of the peers flanneld uses."""
    families = [f for p in description.peers if p.used for f in p.families if not f.skipped]
    return {"routes": frozenset().union(*(f.routes for f in families)),
            "neighbours": frozenset().union(*(f.neighbours for f in families)),
            "fdb": frozenset().union(*(f.fdb for f in families))}


def skipped(description: Description) -> dict[str, str]:
    return {p.lease.key: p.skipped for p in description.peers if p.skipped} | {
        f"{p.lease.key}/v{f.version}": f.skipped
        for p in description.peers for f in p.families if f.skipped}


def programmed(backend: Backend, peers: list[Lease], route_get=lambda _ip: None
               ) -> dict[str, frozenset]:
    """What the data plane reconciles: desired_state of the peers the backend wants and
    admits."""
    state = backend.desired_state(backend.admit([p for p in peers if backend.wants(p)]),
                                  route_get)
    assert state is not None
    return {"routes": state.routes, "neighbours": state.neighbours, "fdb": state.fdb}


OTHERS = [lease(40, "host-gw"), lease(41, "", reservation=True)]


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("direct_routing", [False, True])
def test_vxlan_plans_are_its_desired_state(direct_routing, dual):
    cfg = config({"Type": "vxlan", "DirectRouting": direct_routing}, dual)
    backend = VxlanBackend(EXT, cfg)
    backend.lease = OWN
    for version, index, name in ((4, 7, "flannel.1"), (6, 8, "flannel-v6.1")):
        if version == 4 or dual:
            spec = VxlanSpec(name, 1, 0, EXT.iface_addr, 2, False, False, 1450, "0e:00:00:00:00:01")
            backend.families[version] = _Family(spec, index=index, mac=spec.mac)
    # 192.168.1.x is on-link (no gateway); 192.168.9.x is routed.
    def route_get(ip):
        return Route(f"{ip}/32", None if str(ip).startswith(("192.168.1.", "fd00:1:")) else
                     "192.168.1.254", 2)
    peers = [lease(2, "vxlan", vtep(2), v6=dual), lease(3, "vxlan", vtep(3), ip="192.168.9.3"),
             lease(4, "vxlan", '{"VNI":1}', ip="192.168.9.4"), *OTHERS]
    node = NodeView(cfg, OWN, {"flannel.1": 7, "flannel-v6.1": 8}, 2, route_get=route_get)
    description = VxlanBackend.describe(node, peers)
    assert used(description) == programmed(backend, peers, route_get)
    assert skipped(description) == {
        "10.244.4.0-24": "its IPv4 backend data has no valid VtepMAC (a vxlan lease needs "
                            "{\"VtepMAC\":\"<6-byte MAC>\"}); the node that owns it rewrites it "
                            "on restart, or delete the lease",
        "10.244.40.0-24": "its node runs the host-gw backend, which this node's vxlan backend "
                          "cannot reach; every node of a network must run the same backend",
        "10.244.41.0-24": "a reservation for 192.168.1.41 that no node has taken yet: its node "
                          "runs no vxlan backend yet"}
    by_subnet = {p.lease.subnet: p for p in description.peers}
    on_link = by_subnet[IPv4Network("10.244.2.0/24")].family(4)
    routed = by_subnet[IPv4Network("10.244.3.0/24")].family(4)
    assert on_link is not None and routed is not None
    # A DirectRouting peer on the same segment gets the direct route only, and no VXLAN.
    assert (on_link.carrier.name, bool(on_link.neighbours)) == (
        ("plain routing", False) if direct_routing else ("VXLAN", True))
    assert (routed.carrier.name, routed.carrier.udp_ports) == ("VXLAN", (8472,))
    assert routed.answers_on == IPv4Address("10.244.3.0")
    assert by_subnet[IPv4Network("10.244.41.0/24")].reserved


@pytest.mark.parametrize("dual", [False, True])
def test_hostgw_plans_are_its_desired_state(dual):
    cfg = config({"Type": "host-gw"}, dual)
    backend = HostGwBackend(EXT, cfg)
    backend.lease = OWN
    peers = [lease(2, "host-gw", v6=dual), lease(3, "host-gw"), lease(40, "vxlan", vtep(40))]
    description = HostGwBackend.describe(NodeView(cfg, OWN, underlay=EXT.index), peers)
    assert used(description) == programmed(backend, peers)
    assert list(skipped(description)) == ["10.244.40.0-24"]
    family = description.peers[0].family(4)
    assert family is not None and family.answers_on == IPv4Address("10.244.2.1")
    assert not description.node.devices


def test_udp_plans_are_its_desired_state_reservations_included():
    cfg = config({"Type": "udp"})
    backend = UdpBackend(EXT, cfg)
    backend.lease, backend.tun_index = OWN, 5
    # Go's udp takes every lease without a BackendType, a reservation too.
    peers = [lease(2, ""), lease(3, "", reservation=True), lease(40, "vxlan", vtep(40))]
    description = UdpBackend.describe(NodeView(cfg, OWN, {"flannel0": 5}), peers)
    assert used(description) == programmed(backend, peers)
    assert list(skipped(description)) == ["10.244.40.0-24"]
    family = description.peers[0].family(4)
    assert family is not None and family.carrier.udp_ports == (8285,)
    assert [(d.name, d.overhead) for d in description.node.devices] == [("flannel0", 28)]


@pytest.mark.parametrize("direct_routing", [False, True])
def test_ipip_plans_are_its_desired_state(direct_routing):
    cfg = config({"Type": "ipip", "DirectRouting": direct_routing})
    backend = IpipBackend(EXT, cfg)
    backend.spec, backend.index, backend.lease = IpipSpec("flannel.ipip", EXT.iface_addr, 1480), \
        9, OWN

    def route_get(ip):
        return Route(f"{ip}/32", None if str(ip).startswith("192.168.1.") else "192.168.1.254", 2)
    peers = [lease(2, "ipip"), lease(3, "ipip", ip="192.168.9.3"), *OTHERS]
    description = IpipBackend.describe(
        NodeView(cfg, OWN, {"flannel.ipip": 9}, EXT.index, route_get=route_get), peers)
    assert used(description) == programmed(backend, peers, route_get)
    carriers = [p.families[0].carrier.name for p in description.peers if p.used]
    assert carriers == (["plain routing", "IP-in-IP"] if direct_routing else ["IP-in-IP"] * 2)


@pytest.mark.parametrize("mode", [None, "auto"])
def test_wireguard_plans_are_what_its_applier_puts_on_the_devices(mode):
    options: dict[str, object] = {"Type": "wireguard"}
    if mode:
        options["Mode"] = mode
    cfg = config(options, dual=True)
    backend = WireguardBackend(EXT, cfg)
    keys = [KEY[:-2] + f"{n}=" for n in "AEI"]
    data = [json.dumps({"PublicKey": key, "Port": 51820}) for key in keys]
    peers = [lease(2, "wireguard", data[0], v6=True), lease(3, "wireguard", data[1]),
             lease(4, "wireguard", '{"Port":51820}'), *OTHERS]
    description = WireguardBackend.describe(
        NodeView(cfg, OWN, {"flannel-wg": 5, "flannel-wg-v6": 6},
                 public_ip=EXT.ext_addr, public_ipv6=EXT.ext_v6_addr), peers)
    local = LocalEndpoints(EXT.ext_addr, EXT.ext_v6_addr)
    admitted = backend.admit([p for p in peers if backend.wants(p)])
    applied = {peer_entry(layout.name, peer)
               for layout in backend.wg.devices(True, True)
               for peer in desired_peers(backend.wg, layout, admitted, local)}
    planned = {entry for p in description.peers for f in p.families for entry in f.engine}
    assert planned == applied and len(applied) == (3 if mode is None else 2)
    assert sorted(skipped(description)) == ["10.244.4.0-24", "10.244.40.0-24",
                                            "10.244.41.0-24"]
    family = description.peers[0].family(6)
    # The port the peer's lease publishes.
    assert family is not None and family.carrier.udp_ports == (51820,)
    assert family.routes == {Route("fd00:10:244::/56", None, 6 if mode is None else 5)}


def test_ipsec_plans_are_the_connections_its_applier_loads():
    cfg = config({"Type": "ipsec", "PSK": "x" * 96})
    backend = IpsecBackend(EXT, cfg)
    backend.lease = OWN
    peers = [lease(2, "ipsec"), lease(3, "ipsec"), *OTHERS]
    loaded = set(backend._applier.pairs([p for p in peers if backend.wants(p)]))
    description = IpsecBackend.describe(NodeView(cfg, OWN, public_ip=EXT.ext_addr), peers)
    planned = {entry.key for p in description.peers for f in p.families for entry in f.engine
               if entry.kind == IKE_SA}
    assert planned == loaded == {connection_name(pair) for pair in
                                 backend._applier.pairs(peers[:2]).values()}
    assert used(description) == {"routes": frozenset(), "neighbours": frozenset(),
                                 "fdb": frozenset()}
    assert description.peers[0].families[0].carrier.udp_ports == (500, 4500)


def test_the_extension_says_its_carrier_cannot_be_probed():
    cfg = config({"Type": "extension", "SubnetAddCommand": "true"})
    description = ExtensionBackend.describe(NodeView(cfg, OWN), [lease(2, "extension")])
    carrier = description.peers[0].families[0].carrier
    assert carrier.unprobed.startswith("the extension's own commands")
    assert description.node.unjudged


def test_describe_admits_the_leases_as_flanneld_does():
    """The same admission as flanneld's, with our lease: a lease claiming our VTEP MAC or an
    older lease's from another address, or with a MAC the kernel refuses, is skipped with
    flanneld's why and kind; the lease it claimed against is planned as usual."""
    cfg = config({"Type": "vxlan"})
    own = lease(1, "vxlan", vtep(1)).replace(created=1)
    victim = lease(2, "vxlan", vtep(2)).replace(created=5)
    thieves = [lease(66, "vxlan", vtep(2)).replace(created=9),
               lease(67, "vxlan", vtep(1)).replace(created=2)]
    zero = lease(68, "vxlan", '{"VNI":1,"VtepMAC":"00:00:00:00:00:00"}')
    peers = [*thieves, victim, zero]
    backend = VxlanBackend(EXT, cfg)
    backend.admission.own(own)
    admitted = backend.admit(peers)
    description = VxlanBackend.describe(NodeView(cfg, own, {"flannel.1": 7}, 2), peers)
    assert [p.lease for p in description.peers if p.used] == list(admitted) == [victim]
    assert {p.lease.key: (p.refused, p.skipped) for p in description.peers if p.skipped} == {
        key: refusal for key, refusal in backend.admission.refused.items()}
    refused = {p.lease.key: p for p in description.peers}
    assert refused[thieves[0].key].skipped.startswith(
        f"its IPv4 VtepMAC 0e:00:00:00:00:02 belongs to the older lease {victim.key} (public "
        "IP 192.168.1.2)")
    assert refused[thieves[1].key].skipped.startswith(
        "its IPv4 VtepMAC 0e:00:00:00:00:01 is this node's own")
    assert refused[zero.key].refused == "invalid_data"
    family = refused[victim.key].family(4)
    assert family is not None and family.fdb  # the victim keeps its entries


def _dual(backend: dict[str, object]) -> NetworkConfig:
    return config(backend, dual=backend["Type"] in ("vxlan", "wireguard"))


@pytest.mark.parametrize(("options", "injectable"), [
    ({"Type": "vxlan", "Port": 4789}, (4789,)), ({"Type": "udp", "Port": 9000}, (9000,)),
    ({"Type": "wireguard", "ListenPort": 5000}, ()), ({"Type": "ipsec", "PSK": "x" * 96}, ()),
    ({"Type": "ipip"}, ())])
def test_what_carries_each_peer_is_what_the_rules_drop_from_pods(options, injectable):
    """One declaration (``carriers``): the port or protocol doctor probes for each peer is
    one the traffic rules drop from pods in that family of the underlay, and what any host
    may inject is what ``--encap-peers-only`` filters."""
    from flannel.backend import backend_class

    cfg = _dual(options)
    cls = backend_class(str(options["Type"]))
    data = {"vxlan": vtep(2), "wireguard": json.dumps({"PublicKey": KEY, "Port": 5000})}
    peer = lease(2, cls.backend_type, data.get(str(options["Type"])),
                 v6=cfg.enable_ipv6)
    description = cls.describe(NodeView(cfg, OWN, {"flannel.1": 7, "flannel0": 8,
                                                   "flannel-wg": 9, "flannel-wg-v6": 10,
                                                   "flannel.ipip": 11}, 2,
                                        public_ip=EXT.ext_addr, public_ipv6=EXT.ext_v6_addr),
                               [peer])
    encapsulation = cls(EXT, cfg).encapsulation()
    families = description.peers[0].families
    assert families and {f.version for f in families} == set(versions(cfg))
    for family in families:
        assert set(family.carrier.udp_ports) <= set(encapsulation.udp.get(family.version, ()))
        assert set(family.carrier.ip_protocols) <= set(
            encapsulation.protocols.get(family.version, ()))
        assert family.carrier.udp_ports or family.carrier.ip_protocols
    assert description.node.injectable == injectable
    assert encapsulation.authenticated == (not injectable and bool(encapsulation.udp))
