"""Reconciliation: make the kernel's routes, neighbours and FDB entries match desired state.

Owns the diff between what a backend wants (derived from the current lease set) and what the
kernel has, the batched apply of that diff, and when it runs: at start, after every lease
change, on netlink events that show drift (within a second) and periodically. Everything we
install carries ``RTPROT_FLANNEL`` (routes) or sits on a device we own (neighbours, FDB), so
stale entries left by peers that went away while we were down are removed and nothing
foreign is touched.
Must not touch: the store; links and addresses (the backend's ``ensure_local`` does those).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from flannel.kernel import events, rtnl
from flannel.kernel.rtnl import AF_BRIDGE, FdbEntry, Neighbour, Route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DesiredState:
    """What the kernel must hold. Neighbours/FDB are managed only on ``devices``."""

    routes: frozenset[Route] = frozenset()
    neighbours: frozenset[Neighbour] = frozenset()
    fdb: frozenset[FdbEntry] = frozenset()
    devices: frozenset[int] = frozenset()
    families: tuple[int, ...] = (socket.AF_INET,)

    @functools.cached_property
    def route_dsts(self) -> frozenset[str]:
        return frozenset(r.dst for r in self.routes)

    @functools.cached_property
    def neighbour_keys(self) -> frozenset[tuple[int, str]]:
        return frozenset((n.ifindex, n.ip) for n in self.neighbours)


@dataclass(frozen=True)
class ActualState:
    routes: frozenset[Route]
    neighbours: frozenset[Neighbour]
    fdb: frozenset[FdbEntry]


def read_actual(sock: rtnl.Rtnl, desired: DesiredState) -> ActualState:
    routes = frozenset(
        route for family in desired.families for route, proto, table in sock.routes(family)
        if proto == rtnl.RTPROT_FLANNEL and table == rtnl.RT_TABLE_MAIN
        and route.kind == rtnl.RTN_UNICAST)
    neighbours: set[Neighbour] = set()
    fdb: set[FdbEntry] = set()
    if desired.devices:
        for family in desired.families:
            for entry, state, _flags in sock.neighbours(family):
                if entry.ifindex in desired.devices and state & rtnl.NUD_PERMANENT:
                    neighbours.add(entry)
        for entry, state, flags in sock.neighbours(AF_BRIDGE):
            if entry.ifindex in desired.devices and state & rtnl.NUD_PERMANENT \
                    and flags & rtnl.NTF_SELF:
                fdb.add(entry)
    return ActualState(routes, frozenset(neighbours), frozenset(fdb))


def plan(desired: DesiredState, actual: ActualState) -> list[tuple[str, object]]:
    """The requests that turn ``actual`` into ``desired``: adds first, in the order traffic
    needs them (neighbour, FDB, route), then deletions of what is no longer wanted.

    An entry is deleted only if nothing desired shares its identity, so that a replaced
    route or neighbour is never deleted after its replacement went in.
    """
    ops: list[tuple[str, object]] = []
    ops += [("replace", n) for n in sorted(desired.neighbours - actual.neighbours)]
    ops += [("replace", f) for f in sorted(desired.fdb - actual.fdb)]
    ops += [("replace", r) for r in sorted(desired.routes - actual.routes)]
    ops += [("delete", r) for r in sorted(actual.routes - desired.routes)
            if r.dst not in desired.route_dsts]
    ops += [("delete", f) for f in sorted(actual.fdb - desired.fdb)]
    ops += [("delete", n) for n in sorted(actual.neighbours - desired.neighbours)
            if (n.ifindex, n.ip) not in desired.neighbour_keys]
    return ops


def drift(desired: DesiredState, event: events.KernelEvent) -> str:
    """Why ``event`` means the kernel no longer matches ``desired`` ("" when it does not)."""
    obj = event.obj
    if isinstance(obj, events.LinkEvent):
        # Deleted, down, MAC or MTU changed: the device check will tell and repair.
        if obj.index in desired.devices:
            return f"device {obj.name or obj.index} {'deleted' if event.deleted else 'changed'}"
        return ""
    if isinstance(obj, Route):
        if obj.kind != rtnl.RTN_UNICAST:
            return ""  # blackhole routes are kernel/blackhole.py's
        if event.deleted:
            return f"route {obj.dst} deleted" if obj in desired.routes else ""
        if obj not in desired.routes and obj.dst in desired.route_dsts:
            return f"route {obj.dst} changed"
        if obj not in desired.routes and event.protocol == rtnl.RTPROT_FLANNEL:
            return f"stray route {obj.dst} with our protocol"
        return ""
    if isinstance(obj, Neighbour):
        if obj.ifindex not in desired.devices:
            return ""
        if event.deleted:
            return f"neighbour {obj.ip} deleted" if obj in desired.neighbours else ""
        if obj not in desired.neighbours and (obj.ifindex, obj.ip) in desired.neighbour_keys:
            return f"neighbour {obj.ip} changed"
        return ""
    if obj.ifindex in desired.devices and event.deleted and obj in desired.fdb:
        return f"fdb entry {obj.mac} deleted"
    return ""


@dataclass
class ReconcileStats:
    """What readiness needs: is the kernel in sync, and if not, why."""

    in_sync: bool = False
    last_error: str = ""


class Reconciler:
    """Runs reconciliation passes in a worker thread, serialised, on demand and periodically.

    ``ensure_local`` (may be None) recreates local devices and returns nothing; ``desired``
    computes the state to enforce after it, given a route lookup function. Both run in the
    worker thread.
    """

    def __init__(self, desired: Callable[[Callable], DesiredState],
                 ensure_local: Callable[[], None] | None = None, *,
                 interval: float = 30.0, netns: str | None = None) -> None:
        self._desired = desired
        self._ensure_local = ensure_local
        self.interval = interval
        self.netns = netns
        self.stats = ReconcileStats()
        self._wake = asyncio.Event()
        self._check_local = True
        self._sock: rtnl.Rtnl | None = None
        self._last: DesiredState = DesiredState()

    def trigger(self, why: str = "", check_local: bool = True) -> None:
        """Ask for a pass soon (coalesced with other requests).

        ``check_local=False`` (a lease change) skips re-checking local devices, which costs
        more than the rest of a pass.
        """
        if why:
            log.debug("reconcile requested: %s", why)
        self._check_local |= check_local
        self._wake.set()

    def run_once(self, check_local: bool = True) -> int:
        """One synchronous pass; returns how many changes it made."""
        if self._sock is None:
            self._sock = rtnl.Rtnl(self.netns)
        if check_local and self._ensure_local is not None:
            self._ensure_local()
        desired = self._desired(self._sock.route_get)
        self._last = desired
        actual = read_actual(self._sock, desired)
        ops = plan(desired, actual)
        failures = self._sock.run(ops) if ops else []
        if failures:
            raise rtnl.NetlinkError(failures[0].errno or errno.EIO,
                                    f"{len(failures)} of {len(ops)} changes failed, first: "
                                    f"{failures[0]}")
        return len(ops)

    async def run(self) -> None:
        backoff = 0.1
        self.trigger("start")
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.interval)
            except TimeoutError:
                self._check_local = True
            self._wake.clear()
            check_local, self._check_local = self._check_local, False
            started = time.monotonic()
            try:
                changes = await asyncio.to_thread(self.run_once, check_local)
            except Exception as err:
                if str(err) != self.stats.last_error:  # once per distinct failure, not per retry
                    log.error("reconcile failed (retrying with backoff): %s", err)
                self.stats.in_sync = False
                self.stats.last_error = str(err)
                self.close()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                self.trigger()
                continue
            backoff = 0.1
            if self.stats.last_error and not self.stats.last_error.startswith("repairing"):
                log.info("reconcile recovered")
            # Drift seen or peers changed during the pass: the next pass decides.
            self.stats.in_sync = not self._wake.is_set()
            self.stats.last_error = ""
            if changes:
                log.info("reconciled: %d change(s) in %.1f ms", changes,
                         (time.monotonic() - started) * 1000)

    def on_kernel_event(self, event: events.KernelEvent) -> None:
        """Trigger a pass when an event shows the kernel drifting from desired state."""
        why = drift(self._last, event)
        if why:
            log.info("kernel drifted from desired state (%s); repairing", why)
            self.stats.in_sync = False
            self.stats.last_error = f"repairing: {why}"
            self.trigger(why)

    async def watch_kernel(self) -> None:
        """Follow netlink events; repair drift as soon as it is seen."""
        await events.watch(self.on_kernel_event, lambda: self.trigger("event overrun"),
                           self.netns)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
