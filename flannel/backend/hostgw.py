"""The host-gw backend: plain routes to each peer's subnet via the peer's public IP.

Needs every node on one L2 segment. Owns one route per peer (and family) on the external
interface, tagged with our route protocol. Must not touch: the store; foreign routes.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

from flannel.backend.base import BackendError, LocalNetwork, PeerPlanner, RouteLookup
from flannel.backend.footprint import PER_PEER, Footprint
from flannel.backend.plan import (
    PLAIN,
    FamilyPlan,
    NodeView,
    family_subnet,
    gateway_address,
    versions,
)
from flannel.backend.routed import RoutedBackend
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import NetlinkError, Route
from flannel.lease import Lease


def peer_route(peer: Lease, version: int, underlay: int) -> Route | None:
    """The route to one IP family of a peer's subnet: via its public address on the
    external interface (None when the lease lacks that family)."""
    subnet, public = family_subnet(peer, version)
    if subnet is None or public is None:
        return None
    return Route(str(subnet), str(public), underlay)


class HostGwBackend(RoutedBackend):
    backend_type = "host-gw"
    footprint = Footprint(PER_PEER, dual_stack=True)

    async def prepare(self) -> LocalNetwork:
        ext = self.ext
        if ext.ext_addr != ext.iface_addr or ext.ext_v6_addr != ext.iface_v6_addr:
            raise BackendError("your PublicIP differs from interface IP, meaning that probably "
                               "you're on a NAT, which is not supported by host-gw backend")
        return LocalNetwork("host-gw", ext.mtu)

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        routes = set()
        for peer in peers:
            for version in versions(self.config):
                if (route := peer_route(peer, version, self.ext.index)) is not None:
                    routes.add(route)
        families = tuple(f for f, on in ((socket.AF_INET, self.config.enable_ipv4),
                                         (socket.AF_INET6, self.config.enable_ipv6)) if on)
        return DesiredState(frozenset(routes), families=families, **self.ownership())

    def failure_hint(self, failure: NetlinkError) -> str:
        if failure.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return ""
        # Part of the reconcile error, which is logged once and is the readiness reason.
        return (f"host-gw needs every node on one L2 segment: a peer's public IP must be "
                f"directly reachable on {self.ext.name}, with no router in between; across "
                "routed networks use the vxlan backend (DirectRouting keeps direct routes "
                "for the peers on the same segment)")

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        def plan(peer: Lease) -> tuple[FamilyPlan, ...]:
            out = []
            for version in versions(node.config):
                subnet, public = family_subnet(peer, version)
                route = peer_route(peer, version, node.underlay)
                if subnet is not None and route is not None:
                    out.append(FamilyPlan(version, subnet, public, routes=frozenset({route}),
                                          carrier=PLAIN, answers_on=gateway_address(subnet)))
            return tuple(out)

        return plan
