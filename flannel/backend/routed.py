"""What backends that program routes share: the bounds of route adoption, the device check
when our lease is activated, and whose entry a refused route, neighbour or FDB entry was.

A subclass says what it needs locally (``ensure_local``) and what the kernel must hold for a
peer set (``desired_state``); the data plane does the rest.
Must not touch: the store; tasks, threads and readiness (the data plane's).
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Sequence
from typing import TypedDict

from flannel.backend.base import Backend, RouteLookup
from flannel.kernel.reconcile import DesiredState, IPNetwork
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease


class Ownership(TypedDict):
    """The ``DesiredState`` fields that bound route adoption."""

    networks: tuple[IPNetwork, ...]
    local_subnets: tuple[IPNetwork, ...]
    underlay: int


class RoutedBackend(Backend):
    @abstractmethod
    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        """The routes (and neighbours, FDB entries) the kernel must hold for ``peers``."""

    def ownership(self) -> Ownership:
        """The bounds of route adoption for ``DesiredState``: our Network(s), our own
        subnet(s) (never adopted) and the external interface."""
        networks = tuple(n for n in (self.config.network, self.config.ipv6_network)
                         if n is not None)
        lease = self.lease
        own = tuple(s for s in (lease.subnet, lease.ipv6_subnet) if s is not None) \
            if lease is not None else ()
        return {"networks": networks, "local_subnets": own, "underlay": self.ext.index}

    async def activate(self, lease: Lease) -> None:
        await super().activate(lease)
        # Once, before the data plane starts: device errors surface at startup.
        await asyncio.to_thread(self.ensure_local)

    def entry_peers(self, entry: object, peers: Sequence[Lease]) -> list[Lease]:
        """A route to a peer's subnet, a neighbour for its subnet's base (a VTEP), an FDB
        entry to its public address: that peer's (every peer's of that address: one node)."""
        if isinstance(entry, Route):
            return [p for p in peers if entry.dst in (str(p.subnet), str(p.ipv6_subnet))]
        if isinstance(entry, Neighbour):
            return [p for p in peers if any(
                s is not None and str(s.network_address) == entry.ip
                for s in (p.subnet, p.ipv6_subnet))]
        if isinstance(entry, FdbEntry):
            return [p for p in peers
                    if entry.dst in (str(p.attrs.public_ip), str(p.attrs.public_ipv6))]
        return []
