"""The interface every subnet manager (etcd, kube) offers the daemon.

Store failures are ``StoreUnavailable`` (retry later) or ``StoreError`` (fatal; the message
says what to fix), from ``flannel.subnet.errors``. ``status`` says whether the manager's view
of the store can be trusted right now (it cannot while recovering from a wiped store).
Must not touch: the kernel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Protocol

from flannel.config import NetworkConfig
from flannel.lease import Lease, LeaseAttrs
from flannel.subnet.watch import LeaseUpdate


@dataclass
class StoreStatus:
    """Whether the store view is complete; when not, ``reason`` says why (for /readyz)."""

    ready: bool = True
    reason: str = ""


class SubnetManager(Protocol):
    name: str
    status: StoreStatus

    async def get_network_config(self) -> NetworkConfig:
        """The validated network config; raises ConfigError or a store error."""

    async def public_ip_overrides(self) -> tuple[IPv4Address | None, IPv6Address | None]:
        """Public IPs the store imposes on this node (kube annotations), if any."""

    async def acquire_lease(self, attrs: LeaseAttrs) -> Lease:
        """This node's lease, published with ``attrs``."""

    def watch_leases(self) -> AsyncIterator[LeaseUpdate]:
        """A snapshot of every lease, then changes, forever."""

    async def complete_lease(self, lease: Lease, renew_margin: float,
                             on_renewed: Callable[[Lease], None]) -> None:
        """What a node does with its lease once it is up (renewal, node condition)."""

    async def close(self) -> None:
        """Release connections."""
