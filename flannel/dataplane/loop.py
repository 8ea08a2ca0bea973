"""The data plane: makes the kernel, and any other engine, hold what the backend describes.

Owns, for one daemon run: the reconcile loop (a pass at the first peer set, after every peer
set change, within a second of a kernel event that shows drift, periodically, when an
applier asked to be re-checked, and retried with backoff after a failure), the kernel event
watch and what its socket filter lets through (not our own changes, not the neighbours and
FDB entries of devices that are not ours), the one worker thread every pass runs in, the
netlink request socket (created, used and closed in that thread only), the status, and the
``dataplane`` readiness component.

A pass is full (the kernel's tables read back and diffed) when it is the first, periodic,
after a failure, or asked for by drift, an event overrun or a restarted watch; a pass for a
peer set change alone is incremental: it applies the difference between the new desired
state and the one the previous pass programmed, without reading the kernel (with 99 peers,
reading the tables back was two thirds of a pass). The event watch and the periodic full
pass keep the kernel honest meanwhile.

A pass, in the worker thread: the peers the backend admits (``admit``: not those whose
data or identity it refuses, nor those the kernel refused and that are not due again), its
``ensure_local()`` (when devices may have changed), its ``desired_state(admitted,
route_get)`` reconciled through netlink (when not None), then each of its ``appliers()``
handed the same peers. When the kernel refuses entries of some peers (for what they hold:
an unreachable address, a MAC), those peers are parked and the pass is made again without
them, so that a bad peer never makes this node not ready; a refusal of a delete, of the
device, or of every one of several peers is this node's and fails the pass. A parked peer
is tried again when it is due (its backoff asks for a pass) or its lease changes. Peer
sets handed over while a pass runs are coalesced into the next pass.
Must not touch: the store; what to program (the backend describes it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from flannel.backend.base import Backend, BackendError
from flannel.dataplane import heap
from flannel.kernel import events, rtnl
from flannel.kernel.privilege import privilege_refusal
from flannel.kernel.reconcile import (
    DesiredState,
    Netlink,
    ReconcileError,
    drift,
    kind,
    reconcile,
    reconcile_difference,
)
from flannel.lease import Lease
from flannel.log import V1
from flannel.reporting.histogram import Durations
from flannel.reporting.readiness import Readiness
from flannel.timing.backoff import Backoff
from flannel.timing.clock import SYSTEM, Clock

log = logging.getLogger(__name__)

COMPONENT = "dataplane"
#: Every readiness reason of the data plane starts with this.
NOT_PROGRAMMED = "data plane not programmed: "

#: ``watch(on_event, on_overrun)``: deliver kernel events until cancelled.
EventWatch = Callable[[Callable[[events.KernelEvent], None], Callable[[], None]],
                      Awaitable[None]]


@dataclass
class DataplaneStatus:
    """What the data plane last achieved. Versions count the peer sets handed over (0: none
    yet); ``full_passes`` counts the passes that read the kernel back (the worker thread
    writes it); ``applied`` counts changes by kind (route, neighbour, fdb, or an applier's
    name); ``repaired`` counts drift repairs by kind of what drifted (link, address, route...).
    ``wanted_peers`` is the size of the latest peer set, ``programmed_peers`` that of the
    set the last successful pass programmed. The other counters run since start; all are
    written on the event loop except ``netlink_errors`` and ``full_passes`` (the worker
    thread's only)."""

    in_sync: bool = False
    wanted_version: int = 0
    programmed_version: int = 0
    last_error: str = ""
    passes: int = 0
    full_passes: int = 0
    applied: Counter[str] = field(default_factory=Counter)
    repaired: Counter[str] = field(default_factory=Counter)
    failed_passes: int = 0
    pass_durations: Durations = field(default_factory=Durations)
    wanted_peers: int = 0
    programmed_peers: int = 0
    netlink_errors: int = 0
    event_overruns: int = 0
    event_watch_failures: int = 0


#: A pass making at least this many changes is a burst (a snapshot programmed), after which
#: the freed C heap is given back (``heap``), as after every pass that read the kernel back.
BURST_CHANGES = 256

#: How often a pass is made again within itself after parking the peers the kernel
#: refused (each time without them); a pass still refused after that fails.
PARK_ATTEMPTS = 3
#: The kernel's refusals of an entry for what it holds (a peer's address, MAC): that peer's
#: problem. Any other (the device gone, no memory, no privilege) is this node's.
PEER_ERRNOS = frozenset({errno.EOPNOTSUPP, errno.ENETUNREACH, errno.EHOSTUNREACH,
                         errno.EINVAL, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT, errno.ERANGE})

#: What a pass may fail with and be retried for: I/O (netlink errors are OSErrors), the
#: backend's refusal and the kernel's; a backend adds its engines' (``Backend.pass_errors``).
#: Anything else is a bug: it ends flanneld with its traceback rather than being retried
#: as "reconcile failed" for ever.
PASS_ERRORS: tuple[type[Exception], ...] = (OSError, BackendError, ReconcileError)


class PassError(Exception):
    """A pass that left something unprogrammed; ``cause`` omits what varies per retry."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class Dataplane:
    """Runs the backend's description against the kernel; see the module docstring.

    ``netlink`` (a request-socket factory) and ``watch`` (a kernel event source) default to
    the real kernel in the backend's namespace; ``retry`` is the (first, longest) backoff
    after a failed pass; ``clock`` is what it reads and waits on.
    """

    def __init__(self, backend: Backend, readiness: Readiness, interval: float = 30.0, *,
                 netlink: Callable[[], Netlink] | None = None,
                 watch: EventWatch | None = None,
                 retry: tuple[float, float] = (0.1, 5.0), clock: Clock = SYSTEM) -> None:
        host = backend.options.host
        self.backend = backend
        self.readiness = readiness
        self.interval = interval
        self.status = DataplaneStatus()
        self._open_netlink = netlink or (lambda: rtnl.Rtnl(host))
        # What the event socket lets through: no echo of our request socket's changes, no
        # neighbour or FDB notification of a device that is not ours (none before the first
        # pass, which has no desired state to drift from).
        self._interest = events.EventFilter(devices=frozenset())
        self._watch = watch or (lambda on_event, on_overrun: events.watch(
            on_event, on_overrun, host, interest=self._interest))
        self._retry = Backoff(*retry)
        self._clock = clock
        backend.admission.use_clock(clock.monotonic)  # when parked peers are due
        self._errors = PASS_ERRORS + backend.pass_errors
        self._peers: tuple[Lease, ...] = ()
        self._first_peers = asyncio.Event()
        self._wake = asyncio.Event()
        self._check_local = True
        self._full_due = 0.0  # the clock's reading at the next periodic full pass
        self._recheck = 0.0  # the soonest re-check the appliers asked for (0: none)
        self._full = True  # the next pass reads the kernel back
        self._repairing = ""  # why readiness says "repairing", until a pass repairs it
        self._drifted: set[str] = set()
        self._logged_cause = ""
        # Worker thread only: the socket, and the state the last successful pass left.
        self._sock: Netlink | None = None
        self._programmed: DesiredState | None = None
        # Written by the worker thread, read by the event handler on the loop.
        self._last: DesiredState | None = None
        #: The peers the last successful pass programmed (those the backend admitted).
        self.programmed: tuple[Lease, ...] = ()

    def set_peers(self, peers: Sequence[Lease]) -> None:
        """Hand over the latest full set of remote leases; programmed by the next pass."""
        self._peers = tuple(p for p in peers if self.backend.wants(p))
        self.status.wanted_peers = len(self._peers)
        self.status.wanted_version += 1
        self.status.in_sync = False
        self._first_peers.set()
        self._wake.set()
        self._report()

    def trigger(self, why: str = "", check_local: bool = True) -> None:
        """Ask for a full pass soon (coalesced with other requests).

        ``check_local=False`` skips re-checking local devices, which costs more than the
        rest of a pass; a lease change does not need it.
        """
        if why:
            log.log(V1, "reconcile requested: %s", why)
        self._check_local |= check_local
        self._full = True
        self._wake.set()

    async def run(self) -> None:
        """Reconcile until cancelled. A failed pass is retried, never raised, but for one
        the kernel refused for want of privilege (PrivilegeError): no retry fixes that; an
        error no one declared (a bug) ends it too."""
        loop = asyncio.get_running_loop()
        clock = self._clock
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dataplane")
        watcher: asyncio.Task[None] | None = None
        self._report()
        try:
            # Never before the first peer set: a pass over an empty set would delete every
            # peer's entries left by the previous run.
            await self._first_peers.wait()
            watcher = asyncio.create_task(self._follow_kernel(), name="netlink-events")
            watcher.add_done_callback(self._watch_ended)
            while True:
                if watcher is not None and watcher.done():
                    watcher.result()
                if not self._wake.is_set():
                    timeout = self.interval
                    if self._recheck:
                        timeout = max(0.0, min(self._recheck,
                                               self._full_due - clock.monotonic()))
                    if not await clock.wait(self._wake, timeout) \
                            and clock.monotonic() >= self._full_due:
                        self._check_local = self._full = True
                self._wake.clear()
                check_local, self._check_local = self._check_local, False
                full, self._full = self._full, False
                if check_local:
                    self._full_due = clock.monotonic() + self.interval
                version, peers = self.status.wanted_version, self._peers
                started = clock.monotonic()
                try:
                    uses_netlink, changes, admitted = await loop.run_in_executor(
                        worker, self._pass, peers, check_local, full)
                except PassError as err:
                    self.status.pass_durations.observe(clock.monotonic() - started)
                    refusal = privilege_refusal(err)
                    if refusal is not None:
                        raise refusal from None
                    self._failed(err)
                    await clock.sleep(self._retry.grow())
                    self.trigger()
                    continue
                if not uses_netlink and watcher is not None:
                    watcher.cancel()  # nothing of ours in netlink: no drift to watch for
                    watcher = None
                self.status.pass_durations.observe(clock.monotonic() - started)
                self.programmed = admitted
                self._succeeded(version, changes, len(admitted))
                if full or check_local or changes.total() >= BURST_CHANGES:
                    # The tables read back, the requests encoded, the desired state this
                    # pass replaced, and the store's decoding of a snapshot before it are
                    # all free now, but kept by the C allocator.
                    heap.release_free_memory()
        finally:
            # A pass blocked on a cloud API must not hold the exit: cut it short.
            self.backend.interrupt()
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            closing = loop.run_in_executor(worker, self._close_netlink)
            worker.shutdown(wait=False)
            await closing

    @property
    def desired(self) -> DesiredState | None:
        """What the last pass asked netlink to hold (None before it, or without netlink)."""
        return self._last

    # -- in the worker thread --

    def _netlink(self) -> Netlink:
        if self._sock is None:
            self._sock = self._open_netlink()
            self._interest.set_port(self._sock.port)
        return self._sock

    def _close_netlink(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            self._interest.set_port(0)
            sock.close()

    def _pass(self, peers: tuple[Lease, ...], check_local: bool, full: bool
              ) -> tuple[bool, Counter[str], tuple[Lease, ...]]:
        """One pass (full, or incremental when allowed; see the module docstring): whether
        the backend has netlink state, the changes made by kind, and the peers it
        programmed (those the backend admits). Raises PassError if anything could not be
        programmed (all is still attempted); an error the backend does not declare (a bug)
        propagates."""
        started = self._clock.monotonic()
        backend = self.backend
        failures: list[tuple[str, str]] = []
        changes: Counter[str] = Counter()
        desired = None
        self._recheck = 0.0
        admitted = backend.admit(peers)
        try:
            if check_local:
                backend.ensure_local()
            admitted, desired, made = self._netlink_pass(peers, admitted, check_local, full)
            changes.update(made)
        except self._errors as err:
            self.status.netlink_errors += 1
            self._close_netlink()  # a fresh socket for the retry
            refusal = privilege_refusal(err)
            if refusal is not None:  # no retry fixes it: run() ends with it
                raise refusal from None
            failures.append((str(err), getattr(err, "cause", str(err))))
        for applier in backend.appliers():
            try:
                result = applier.apply(admitted)
            except self._errors as err:
                failures.append((f"{applier.name}: {err}", f"{applier.name}: {err}"))
                continue
            changes[applier.name] += result.changes
            if result.recheck > 0:
                self._recheck = min(self._recheck or result.recheck, result.recheck)
            if result.error:
                failures.append((f"{applier.name}: {result.error}",
                                 f"{applier.name}: {result.error}"))
        if failures:
            raise PassError(*failures[0])
        backend.admission.programmed(admitted)
        if (retry := backend.admission.retry_in()) > 0:  # a parked peer's next try
            self._recheck = min(self._recheck or retry, retry)
        total = sum(changes.values())
        if total:
            log.info("reconciled: %d change(s) in %.1f ms", total,
                     (self._clock.monotonic() - started) * 1000)
        return desired is not None, changes, admitted

    def _netlink_pass(self, peers: tuple[Lease, ...], admitted: tuple[Lease, ...],
                      check_local: bool, full: bool
                      ) -> tuple[tuple[Lease, ...], DesiredState | None, Counter[str]]:
        """The netlink part of a pass: (the peers programmed, desired state, the changes by
        kind).
        A peer whose entries the kernel refuses (``_park_refused`` says when a refusal is
        this node's instead) is parked by the backend's admission and the pass made again
        without it, reading the kernel back, so that the other peers are programmed and
        ready."""
        backend = self.backend
        for attempt in range(1, PARK_ATTEMPTS + 1):
            desired = backend.desired_state(admitted,
                                            lambda ip: self._netlink().route_get(ip))
            if desired is None:
                return admitted, None, Counter()
            if self._last is None or self._last.devices != desired.devices:
                self._interest.set_devices(desired.devices)
            self._last = desired
            programmed, self._programmed = self._programmed, None
            try:
                if full or check_local or programmed is None \
                        or not programmed.same_frame(desired):
                    made = reconcile(self._netlink(), desired, backend.failure_hint)
                    self.status.full_passes += 1
                else:
                    made = reconcile_difference(self._netlink(), programmed, desired,
                                                backend.failure_hint)
            except ReconcileError as err:
                if attempt == PARK_ATTEMPTS or not self._park_refused(err, admitted):
                    raise
                admitted, full = backend.admit(peers), True
                continue
            self._programmed = desired
            return admitted, desired, made
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _park_refused(self, err: ReconcileError, admitted: tuple[Lease, ...]) -> bool:
        """Park the peers whose entries the kernel refused for what they hold; False (park
        nothing) when a refusal is this node's own: a delete, an error about the device or
        the socket rather than the entry, an entry no peer owns, or every one of several
        peers refused alike (this node's underlay, not theirs). A lone peer refused is its
        own problem: at start it may be the first lease known."""
        backend = self.backend
        owners: dict[str, tuple[Lease, rtnl.NetlinkError]] = {}
        for failure in err.failures:
            if failure.verb == "delete" or failure.errno not in PEER_ERRNOS:
                return False
            found = backend.entry_peers(failure.entry, admitted)
            if not found:
                return False
            for lease in found:
                owners.setdefault(lease.key, (lease, failure))
        if not owners or 1 < len(admitted) == len(owners):
            return False
        for lease, failure in owners.values():
            hint = backend.failure_hint(failure)
            backend.admission.park(lease, f"{failure.strerror}{'; ' + hint if hint else ''}")
        return True

    # -- on the event loop --

    def _failed(self, err: PassError) -> None:
        cause = err.cause
        if cause != self._logged_cause:  # once per distinct failure, not per retry
            log.error("reconcile failed (retrying with backoff): %s", err)
            self._logged_cause = cause
        self.status.passes += 1
        self.status.failed_passes += 1
        self.status.in_sync = False
        self.status.last_error = str(err)
        self._report()

    def _succeeded(self, version: int, changes: Counter[str], peers: int) -> None:
        status = self.status
        status.passes += 1
        status.programmed_peers = peers
        status.applied.update(changes)
        status.programmed_version = version
        status.last_error = ""
        self._retry.reset()
        if self._logged_cause:
            log.info("reconcile recovered")
            self._logged_cause = ""
        # Drift seen or peers changed during the pass: the next pass decides, and
        # readiness keeps saying why meanwhile.
        if not self._wake.is_set():
            status.repaired.update(self._drifted)
            self._drifted.clear()
            self._repairing = ""
        status.in_sync = not self._wake.is_set() and version == status.wanted_version
        self._report()

    def _report(self) -> None:
        status = self.status
        if status.wanted_version == 0:
            reason = "waiting for the first lease snapshot"
        elif status.last_error:
            reason = status.last_error
        elif self._repairing:
            reason = f"repairing: {self._repairing}"
        elif status.programmed_version < status.wanted_version:
            reason = "latest lease changes not programmed yet"
        else:
            reason = "" if status.in_sync else "a pass is pending"
        self.readiness.report(COMPONENT, not reason, NOT_PROGRAMMED + reason)

    def _on_kernel_event(self, event: events.KernelEvent) -> None:
        """Trigger a pass when an event shows the kernel drifting from desired state.

        Readiness reports the drift until a pass has repaired it. Logged once per repair,
        not once per event (a flushed table sends one event per entry).
        """
        desired = self._last
        why = drift(desired, event) if desired is not None else ""
        if not why:
            return
        if self._repairing:
            log.log(V1, "kernel drifted from desired state (%s)", why)
        else:
            log.info("kernel drifted from desired state (%s); repairing", why)
            self._repairing = why
        self._drifted.add(kind(event.obj))
        self.status.in_sync = False
        self._report()
        # Only a device or its address needs the (costlier) device check.
        self.trigger(why, check_local=isinstance(event.obj, (rtnl.Link, rtnl.Address)))

    def _watch_ended(self, watcher: asyncio.Task[None]) -> None:
        """The event watch runs until cancelled: only a bug ends it otherwise, and the
        loop, woken, raises it."""
        if not watcher.cancelled():
            self._wake.set()

    def _on_overrun(self) -> None:
        self.status.event_overruns += 1
        self.trigger("event overrun")

    async def _follow_kernel(self) -> None:
        """Follow kernel events; if the watch fails, resync in full and subscribe again."""
        backoff = Backoff(1.0, 30.0)
        logged = ""
        while True:
            try:
                await self._watch(self._on_kernel_event, self._on_overrun)
                failure = "the event watch ended"
            except OSError as err:  # periodic passes cover the gap
                failure = str(err)
            self.status.event_watch_failures += 1
            if failure != logged:
                log.error("kernel event watch failed (periodic resyncs continue; "
                          "subscribing again): %s", failure)
                logged = failure
            self.trigger("event watch restarted")
            await self._clock.sleep(backoff.grow())
