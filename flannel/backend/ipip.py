"""The ipip backend: IPv4-in-IPv4 tunnels through one device, wire-compatible with Go flannel.

Owns the backend config (``DirectRouting``), the device ``flannel.ipip`` (local = the external
interface's address, remote any, MTU = the external MTU minus 20, the lease base as /32),
the lease (BackendType ``ipip``, no BackendData) and per peer one route: ``<peer subnet> via
<peer PublicIP> dev flannel.ipip onlink``; with DirectRouting, for a peer on-link on the
external interface, the same route on that interface (as Go, onlink kept).
IPv4 only, as in Go.
Must not touch: the store; routes of other protocols; other devices (``tunl0`` included).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from flannel.backend.base import (
    BackendError,
    BackendOptions,
    LocalNetwork,
    PeerPlanner,
    RouteLookup,
)
from flannel.backend.footprint import PER_PEER, Footprint, Link
from flannel.backend.plan import (
    PLAIN,
    Carrier,
    DevicePlan,
    FamilyPlan,
    NodePlan,
    NodeView,
    base_address,
    local_addresses,
)
from flannel.backend.routed import RoutedBackend
from flannel.backendconf.options import decode_options
from flannel.config import NetworkConfig
from flannel.kernel import device, ipipdev
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState, LinkState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease

log = logging.getLogger(__name__)

DEVICE = "flannel.ipip"


@dataclass(frozen=True)
class IpipConfig:
    direct_routing: bool = False

    @classmethod
    def from_backend(cls, backend: Mapping[str, object]) -> IpipConfig:
        fields = decode_options(backend, {"DirectRouting": (bool, False)},
                                "error decoding IPIP backend config")
        return cls(fields["DirectRouting"])


#: IP-in-IP: IP protocol 4 over IPv4, no port; the device takes it from any remote and
#: delivers the inner packet. A host without a tunnel for it answers "protocol
#: unreachable", which a probe would need a raw socket of protocol 4 to provoke.
IPIP = Carrier("IP-in-IP", ip_protocols=(socket.IPPROTO_IPIP,), versions=(4,),
               unprobed="IP-in-IP (IP protocol 4) has no port to send a probe to")


def peer_route(peer: Lease, index: int, underlay: int, direct_routing: bool,
               route_get: RouteLookup) -> Route | None:
    """The route to a peer's subnet: via its public address through the tunnel device, or
    with DirectRouting on the external interface when the peer is on-link there."""
    public = peer.attrs.public_ip
    if peer.subnet is None or public is None:
        return None
    oif = index
    if direct_routing:
        direct = route_get(public)
        if direct is not None and direct.gateway is None:
            oif = underlay
    return Route(str(peer.subnet), str(public), oif, onlink=True)


class IpipBackend(RoutedBackend):
    backend_type = "ipip"
    footprint = Footprint(PER_PEER, device=DEVICE,
                          links=(Link(r"flannel\.ipip", "ipip"),))
    pass_errors = (device.DeviceError,)
    option_names = ("DirectRouting",)

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        IpipConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.ipip = IpipConfig.from_backend(self.config.backend)
        self.spec: ipipdev.IpipSpec | None = None
        self.index = 0

    async def prepare(self) -> LocalNetwork:
        if self.config.enable_ipv6 or not self.config.enable_ipv4:
            raise BackendError("the ipip backend carries IPv4 only: set EnableIPv6 to false "
                               "(and keep EnableIPv4), or choose the vxlan or wireguard "
                               "backend for IPv6")
        local = self.ext.iface_addr
        if local is None:
            raise BackendError(f"ipip needs an IPv4 address on {self.ext.name}")
        mtu = self.ext.mtu - ipipdev.IPIP_OVERHEAD
        log.info("IPIP config: DirectRouting=%s", self.ipip.direct_routing)
        spec = ipipdev.IpipSpec(DEVICE, local, mtu)
        try:
            self.index = await asyncio.to_thread(ipipdev.ensure_ipip, spec,
                                                 self.options.host)
        except device.DeviceError as err:
            raise BackendError(str(err)) from None
        self.spec = spec
        return LocalNetwork("ipip", mtu)

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        # DirectRouting's peers on the segment take the underlay's plain routing.
        return (IPIP,)

    def ensure_local(self) -> None:
        assert self.lease is not None and self.spec is not None
        self.index = ipipdev.ensure_ipip(self.spec, self.options.host)
        if self.lease.subnet is not None:
            # The /32 is the source of host-to-pod traffic, so replies come back in the tunnel.
            device.ensure_address(self.index, self.lease.subnet.network_address,
                                  self.config.network, self.options.host)

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        routes: set[Route] = set()
        for peer in peers:
            route = peer_route(peer, self.index, self.ext.index, self.ipip.direct_routing,
                               route_get)
            if route is not None:
                routes.add(route)
        links = frozenset({LinkState(self.index, DEVICE, self.spec.mtu, "")}) \
            if self.spec is not None else frozenset()
        return DesiredState(frozenset(routes), devices=frozenset({self.index}),
                            families=(socket.AF_INET,), links=links,
                            addresses=self._addresses(), **self.ownership())

    def _addresses(self) -> frozenset[tuple[int, str]]:
        if self.lease is None or self.lease.subnet is None:
            return frozenset()
        base: IPv4Address = self.lease.subnet.network_address
        return frozenset({(self.index, f"{base}/32")})

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        return NodePlan(devices=(DevicePlan(DEVICE, 4, ipipdev.IPIP_OVERHEAD),),
                        local=local_addresses(node, on_base=True))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        direct_routing = IpipConfig.from_backend(node.config.backend).direct_routing
        index = node.device(DEVICE)

        def plan(peer: Lease) -> tuple[FamilyPlan, ...]:
            route = peer_route(peer, index, node.underlay, direct_routing, node.route_get)
            if route is None or peer.subnet is None:
                return ()
            direct = route.oif == node.underlay and route.oif != index
            return (FamilyPlan(4, peer.subnet, peer.attrs.public_ip, routes=frozenset({route}),
                               carrier=PLAIN if direct else IPIP,
                               answers_on=base_address(peer.subnet)),)

        return plan
