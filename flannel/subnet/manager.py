"""The interface every subnet manager (etcd, kube) offers the daemon.

The errors are declared: a store failure is ``StoreUnavailable`` (retry later, with backoff) or
``StoreError`` (fatal; the message says what to fix), from ``flannel.subnet.errors``; a bad
network config is ``flannel.config.ConfigError``. The network config is handed to the calls
that need it, so there is no order of calls to respect. ``status`` says whether the manager's
view of the store can be trusted right now (it cannot while recovering from a wiped store)
and tells whoever follows it when that changes; its ``writes`` say whether this node's own
record, as flanneld keeps it after start, is written (kube: the annotations, the condition).
Must not touch: the kernel.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from ipaddress import IPv4Address, IPv6Address
from typing import NoReturn, Protocol

from flannel.config import NetworkConfig
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.skips import SkippedRecords
from flannel.subnet.watch import LeaseUpdate

StatusListener = Callable[[bool, str], None]


class WriteStatus:
    """The writes of this node's own record that a store keeps retrying after start (kube:
    ``annotations``, the published lease, and ``condition``, NetworkUnavailable=False).

    ``failing`` maps a write to its latest error while it fails; ``failures`` counts failed
    attempts since start, per write (for /metrics: the names are few and fixed). Only the
    writes declared ``blocking`` make the node not ready while they fail: ``ready()`` says so,
    with the reason, and followers hear of every change.
    """

    def __init__(self) -> None:
        self.failing: dict[str, str] = {}
        self.failures: dict[str, int] = {}
        self._blocking: set[str] = set()
        self._listeners: list[StatusListener] = []

    def track(self, write: str, *, blocking: bool) -> None:
        """Declare a write (shown from now on, as not failing)."""
        self.failures.setdefault(write, 0)
        if blocking:
            self._blocking.add(write)

    def failed(self, write: str, error: str, *, counted: bool = True) -> None:
        """``write`` fails with ``error``; ``counted=False`` when no attempt was made (there
        is nothing to write to)."""
        if counted:
            self.failures[write] = self.failures.get(write, 0) + 1
        self._change(write, error)

    def succeeded(self, write: str) -> None:
        self._change(write, None)

    def _change(self, write: str, error: str | None) -> None:
        before = self.ready()
        if error is None:
            self.failing.pop(write, None)
        else:
            self.failing[write] = error
        after = self.ready()
        if after != before:  # a new reason too: /readyz says the latest
            for listener in self._listeners:
                listener(*after)

    def ready(self) -> tuple[bool, str]:
        """(False, why) while a blocking write fails."""
        for write in sorted(self._blocking):
            if write in self.failing:
                return False, self.failing[write]
        return True, ""

    def follow(self, listener: StatusListener) -> None:
        """Call ``listener(ready, reason)`` now and after every change (in the loop's thread)."""
        self._listeners.append(listener)
        listener(*self.ready())


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
        self.writes = WriteStatus()
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
    #: True when this node's lease vanishing from the lease watch means it was revoked on
    #: purpose and flanneld must stop (etcd); False when the store keeps the lease itself and
    #: puts it back (kube: ``keep_lease`` re-publishes the node's annotations).
    revocable: bool
    #: Records of the store skipped because they cannot be decoded (a lease value, a Node),
    #: each logged once; /status and /metrics count them with the peers the watcher skips.
    undecodable: SkippedRecords

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
        """Keep ``lease`` (renewal; in kube the node's annotations and condition) for as long
        as the node runs; returns only by raising: ``OwnLeaseRevoked`` when it was removed on
        purpose, another ``StoreError`` (``LeaseLost`` among them) when it cannot be kept."""

    async def close(self) -> None:
        """Release connections."""
