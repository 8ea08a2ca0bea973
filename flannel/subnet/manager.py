"""The interface every subnet manager (etcd, kube) offers the daemon.

The errors are declared: a store failure is ``StoreUnavailable`` (retry later, with backoff) or
``StoreError`` (fatal; the message says what to fix), from ``flannel.subnet.errors``; a bad
network config is ``flannel.config.ConfigError``. The network config is handed to the calls
that need it, so there is no order of calls to respect. ``status`` says whether the manager's
view of the store can be trusted right now (it cannot while recovering from a wiped store)
and tells whoever follows it when that changes.
Must not touch: the kernel.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from ipaddress import IPv4Address, IPv6Address
from typing import NoReturn, Protocol

from flannel.config import NetworkConfig
from flannel.lease import Lease, LeaseAttrs
from flannel.subnet.watch import LeaseUpdate

StatusListener = Callable[[bool, str], None]


class StoreStatus:
    """Whether the store view is complete; when not, ``reason`` says why (for /readyz).

    Also what the lease watch and renewal went through since start, for /metrics and
    /status: whether the watch is connected now, how often it resumed after a cut,
    found its revision compacted (410 Gone in kube), listed every lease (the first
    listing included), and how many renewals succeeded and failed.
    """

    def __init__(self) -> None:
        self.ready = True
        self.reason = ""
        self.watching = False
        self.reconnects = 0
        self.compactions = 0
        self.relists = 0
        self.renewals = 0
        self.renewal_failures = 0
        self._listeners: list[StatusListener] = []

    def set(self, ready: bool, reason: str = "") -> None:
        reason = "" if ready else reason
        if (ready, reason) == (self.ready, self.reason):
            return
        self.ready, self.reason = ready, reason
        for listener in self._listeners:
            listener(ready, reason)

    def follow(self, listener: StatusListener) -> None:
        """Call ``listener(ready, reason)`` now and after every change (in the loop's thread)."""
        self._listeners.append(listener)
        listener(self.ready, self.reason)


class SubnetManager(Protocol):
    name: str
    status: StoreStatus

    @property
    def lease(self) -> Lease | None:
        """This node's lease as the store holds it now (renewals and recoveries replace it)."""

    async def get_network_config(self) -> NetworkConfig:
        """The validated network config; raises ConfigError or a store error."""

    async def public_ip_overrides(self) -> tuple[IPv4Address | None, IPv6Address | None]:
        """Public IPs the store imposes on this node (kube annotations), if any."""

    async def acquire_lease(self, config: NetworkConfig, attrs: LeaseAttrs) -> Lease:
        """This node's lease under ``config``, published with ``attrs``."""

    def watch_leases(self, config: NetworkConfig) -> AsyncGenerator[LeaseUpdate, None]:
        """A snapshot of every lease, then changes, forever (close it with ``aclose``)."""

    async def keep_lease(self, lease: Lease) -> NoReturn:
        """Keep ``lease`` (renewal, node condition) for as long as the node runs; returns
        only by raising: ``OwnLeaseRevoked`` when it was removed on purpose, another
        ``StoreError`` (``LeaseLost`` among them) when it cannot be kept."""

    async def close(self) -> None:
        """Release connections."""
