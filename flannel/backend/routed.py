"""The runtime shared by backends that program routes: a reconciler fed by lease changes.

Owns the peer set a backend was last handed, the reconciler task and the netlink event
task. A subclass says what it needs locally (``ensure_local``) and what the kernel must hold
for a peer set (``desired_state``).
Must not touch: the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from flannel.backend.base import Backend
from flannel.kernel.reconcile import DesiredState, Reconciler
from flannel.kernel.rtnl import NetlinkError
from flannel.lease import Lease

log = logging.getLogger(__name__)


def _report_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s stopped: %s; periodic resyncs continue", task.get_name(),
                  task.exception())


class RoutedBackend(Backend):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.peers: tuple[Lease, ...] = ()
        self.lease: Lease | None = None
        self.reconciler = Reconciler(self._desired, self.ensure_local,
                                     interval=self.options.reconcile_interval,
                                     netns=self.options.netns, hint=self.failure_hint)
        self._tasks: list[asyncio.Task] = []
        self._peers_version = -1  # no lease set handed over yet
        self._programmed_version = -1

    def ensure_local(self) -> None:
        """Recreate whatever local device state is missing (runs in a worker thread)."""

    def desired_state(self, peers: Sequence[Lease], route_get: Callable) -> DesiredState:
        raise NotImplementedError

    def failure_hint(self, failure: NetlinkError) -> str:
        """Advice for an operator when the kernel refused one of our changes ("" if none)."""
        return ""

    def ownership(self) -> dict[str, object]:
        """The bounds of route adoption for ``DesiredState``: our Network(s), our own
        subnet(s) (never adopted) and the external interface."""
        networks = tuple(n for n in (self.config.network, self.config.ipv6_network)
                         if n is not None)
        lease = self.lease
        own = tuple(s for s in (lease.subnet, lease.ipv6_subnet) if s is not None) \
            if lease is not None else ()
        return {"networks": networks, "local_subnets": own, "underlay": self.ext.index}

    def _desired(self, route_get: Callable) -> DesiredState:
        version = self._peers_version
        state = self.desired_state(self.peers, route_get)
        self._programmed_version = version
        return state

    async def activate(self, lease: Lease) -> None:
        self.lease = lease
        await asyncio.to_thread(self.ensure_local)

    async def sync_peers(self, peers: Sequence[Lease]) -> None:
        self.peers = tuple(p for p in peers if self.wants(p))
        self._peers_version += 1
        if not self._tasks:
            # Reconcile only once the full lease set is known: a pass over an empty peer
            # set would delete every peer's entries left by the previous run.
            self._tasks = [
                asyncio.create_task(self.reconciler.run(), name="reconcile"),
                asyncio.create_task(self.reconciler.watch_kernel(), name="netlink-events"),
            ]
            for task in self._tasks:
                task.add_done_callback(_report_failure)
        else:
            self.reconciler.trigger("lease change", check_local=False)

    def programmed(self) -> tuple[bool, str]:
        """Whether the kernel holds the latest peer set (for readiness)."""
        stats = self.reconciler.stats
        if self._peers_version < 0:
            return False, "waiting for the first lease snapshot"
        if not stats.in_sync:
            return False, stats.last_error or "data plane not programmed yet"
        if self._programmed_version < self._peers_version:
            return False, "latest lease changes not programmed yet"
        return True, ""

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.reconciler.close()
