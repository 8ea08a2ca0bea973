"""flanneld's probes of its peers: every peer it programmed, over the overlay, continuously
and bounded, and what the probes tell.

Owns, for one daemon run: which peers are probed (those the data plane programmed, less
those an engine refuses: a refused peer is named in /status already), their paths (the
backend's own description of each peer, ``Backend.peer_planner``, computed
``PLAN_AHEAD`` slots ahead in one worker thread, so a path is at most a period old and no
per-peer plan is kept beyond those), the pace (``schedule.py``: every
peer once per ``--peer-probe-interval``, stretched so that at most ``--peer-probe-rate``
probes leave a second), at most ``MAX_IN_FLIGHT`` probes at once, one pinger per IP family
(``icmp.py``) whose overlay echoes leave from this node's own overlay address, the
sequence of each probe (``sequence.py``), and the results: the latest of every peer (its
slot), and a record of every peer unreachable now (since when, which cause, what was
seen). A peer that becomes unreachable, changes cause, or is reached again is logged once.
``ProbeStatus`` is what /status, /probes and /metrics read. With ``--peer-probe-readiness``
it reports the ``peers`` readiness component (not ready while a peer is unreachable);
otherwise readiness never depends on it.
A probe that concludes nothing (this node cannot send, a flood of answers) changes no
result and is counted as a probe error.
Must not touch: the kernel (it only sends probes and reads routes), the store, the data
plane's state (it reads the peers it programmed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flannel.backend.plan import IPAddress, NodeView, versions
from flannel.kernel import rtnl
from flannel.lease import Lease
from flannel.log import V1
from flannel.probing.icmp import IcmpError, Pinger
from flannel.probing.schedule import NONE, REACHED, Schedule
from flannel.probing.sequence import CAUSES, FLOODED, OK, Outcome, Path, probe_path
from flannel.reporting.histogram import Durations
from flannel.timing.clock import SYSTEM, Clock

if TYPE_CHECKING:
    from flannel.backend.base import Backend
    from flannel.kernel.host import Host
    from flannel.reporting.readiness import Readiness
    from flannel.settings import ProbeSettings

log = logging.getLogger(__name__)

COMPONENT = "peers"
#: Slots whose paths are planned in one worker-thread call: a hand-over to the thread and
#: back wakes the event loop, which costs more CPU than planning many peers' paths (about
#: 7 us each without a route lookup), so a few hundred at a time (about 60 KB held).
PLAN_AHEAD = 256
#: Probes in flight at most (a peer that does not answer holds one ~2.5 s).
MAX_IN_FLIGHT = 64
#: Seconds between looks at the peer set while there is none, and between checks for this
#: node's overlay address (or an ICMP socket) while a family cannot be probed.
IDLE = 1.0
RECHECK = 10.0
#: Round trips over the overlay, in seconds: a lab answers in 0.1 ms, a region in 1-2 ms.
RTT_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: A cause's code in a slot's result (``schedule.Slots.results``).
CODES = {cause: code for code, cause in enumerate(CAUSES, start=REACHED + 1)}
CAUSE_OF = {code: cause for cause, code in CODES.items()}
#: What a probe that concludes nothing is counted as.
ERROR_KINDS = ("send", "flood", "socket", "plan")


@dataclass(slots=True)
class Failing:
    """A peer (one IP family) unreachable now: ``cause`` (one of ``CAUSES``), what was seen
    (``detail``), since when (``since``, wall clock), when it was last probed (``checked``,
    the prober's clock), the addresses probed."""

    cause: str
    detail: str
    since: float
    checked: float
    public: str
    target: str


@dataclass
class ProbeStatus:
    """What the probes found, for /status, /probes and /metrics: ``probes`` by result
    (reached, unreachable, inconclusive), ``errors`` by kind (send: this node could not
    send; flood: answers arrived faster than they are read; socket: no ICMP socket; plan:
    this node's routes could not be read to plan a probe),
    overlay round trips, the peers unreachable now by (lease key, IP version), the IP
    families not probed and why."""

    interval: int
    rate: int
    per_peer: bool = False
    probes: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    rtt: Durations = field(default_factory=lambda: Durations(RTT_BUCKETS))
    failing: dict[tuple[str, int], Failing] = field(default_factory=dict)
    unprobed: dict[int, str] = field(default_factory=dict)
    schedule: Schedule | None = None

    @property
    def peers(self) -> int:
        """Peer families probed."""
        return len(self.schedule.slots) if self.schedule is not None else 0

    @property
    def period(self) -> float:
        return self.schedule.period if self.schedule is not None else float(self.interval)

    def oldest(self) -> float:
        """Seconds since the least recent latest result, or since a peer without one
        joined (0: no peer)."""
        return self.schedule.oldest() if self.schedule is not None else 0.0

    def by_cause(self) -> dict[str, int]:
        """Peers unreachable now by cause (every cause, zeros included)."""
        counts = dict.fromkeys(CAUSES, 0)
        for failing in self.failing.values():
            counts[failing.cause] += 1
        return counts

    def results(self) -> list[tuple[str, int, str, float | None, float | None]]:
        """(lease key, IP version, result, seconds since its probe began, round trip) of
        every slot; result "none" before its first probe, "reached", or a cause."""
        schedule = self.schedule
        if schedule is None:
            return []
        slots, now = schedule.slots, schedule.clock.monotonic()
        out = []
        for index in range(len(slots)):
            code, began = slots.results[index], slots.resulted[index]
            result = "none" if code == NONE else "reached" if code == REACHED \
                else CAUSE_OF[code]
            rtt = slots.rtts[index]
            out.append((slots.leases[index].key, slots.versions[index], result,
                        now - began if code != NONE and began else None, rtt or None))
        return out


class PeerProber:
    """Probes the peers the data plane programmed (see the module docstring).

    ``programmed`` returns them; ``mtu`` is the pods' MTU (subnet.env's); ``pinger`` opens
    a pinger (IP version, sources, namespace) and ``probe`` runs one probe: both default to
    the real ones; ``clock`` paces the schedule."""

    def __init__(self, backend: Backend, settings: ProbeSettings, mtu: int,
                 programmed: Callable[[], Sequence[Lease]],
                 readiness: Readiness | None = None, *, clock: Clock = SYSTEM,
                 pinger: Callable[[int, Sequence[IPAddress], Host], Pinger] | None = None,
                 probe: Callable[[Pinger, Path], Awaitable[Outcome]] = probe_path,
                 wall: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.mtu = mtu
        self.clock = clock
        self._programmed = programmed
        self._readiness = readiness if settings.readiness else None
        self._open = pinger or (lambda version, sources, host: Pinger(sources, version, host))
        self._probe = probe
        self._wall = wall
        self.schedule = Schedule(settings.interval, settings.rate, clock)
        self.status = ProbeStatus(settings.interval, settings.rate, settings.per_peer_metrics,
                                  schedule=self.schedule)
        self._seen: Sequence[Lease] | None = None
        self._pingers: dict[int, Pinger] = {}
        self._retry: dict[int, float] = {}  # version -> when to try its pinger again
        self._planned: dict[tuple[str, int], tuple[Lease, Path | None]] = {}
        self._failure: BaseException | None = None
        own = backend.lease
        assert own is not None, "the prober starts once the backend holds our lease"
        self._host = backend.options.host
        self._rtnl: rtnl.Rtnl | None = None  # worker thread only
        self._node = NodeView(backend.config, own, public_ip=own.attrs.public_ip,
                              public_ipv6=own.attrs.public_ipv6, route_get=self._route_get)
        self._versions = versions(backend.config)
        self._local = type(backend).node_plan(self._node).local
        self._report()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Probe until cancelled. A probe's declared failures are counted; anything else
        (a bug) ends it."""
        loop = asyncio.get_running_loop()
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="probes")
        planner = type(self.backend).peer_planner(self._node)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                if self._failure is not None:
                    raise self._failure
                self._refresh()
                slots = self.schedule.slots
                if not slots:
                    await self.clock.sleep(IDLE)
                    continue
                index = await self.schedule.next()
                lease, version = slots.leases[index], slots.versions[index]
                pinger = self._pinger(version)
                if pinger is None:
                    continue
                planned = self._planned.pop((lease.key, version), None)
                if planned is None or planned[0] is not lease:
                    ahead = [slots.leases[i] for i in
                             (index, *self.schedule.upcoming(PLAN_AHEAD - 1))]
                    try:
                        self._planned = await loop.run_in_executor(
                            worker, self._plan, planner, ahead)
                    except OSError as err:  # a route lookup: planned again next time
                        self.status.errors["plan"] += 1
                        log.log(V1, "cannot plan the probes of %d peer(s): %s", len(ahead),
                                err)
                        continue
                    planned = self._planned.pop((lease.key, version), (lease, None))
                path = planned[1]
                if path is None:  # the backend plans nothing to probe for that family
                    continue
                while len(tasks) >= MAX_IN_FLIGHT:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                task = asyncio.ensure_future(self._one(pinger, lease, version, index, path,
                                                       slots.probed[index]))
                tasks.add(task)
                task.add_done_callback(self._ended)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for pinger in self._pingers.values():
                pinger.close()
            self._pingers.clear()
            closing = worker.submit(self._close_rtnl)
            worker.shutdown(wait=False)
            await asyncio.wrap_future(closing)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    def _refresh(self) -> None:
        """Follow the peers the data plane programmed (less those an engine refuses)."""
        peers = self._programmed()
        if peers is self._seen:
            return
        self._seen = peers
        refused: set[str] = set()
        for applier in self.backend.appliers():
            refused.update(applier.refused_peers())
        # On the lease's integers: a network and an address object per peer and family
        # cost ~0.3 s of the event loop at 20,000 peers.
        entries = [(lease, version) for lease in peers if lease.key not in refused
                   for version in self._versions if lease.family(version) is not None
                   and lease.attrs.public_number(version) is not None]
        if not self.schedule.set_peers(entries):
            return
        self._planned.clear()
        wanted = {(lease.key, version) for lease, version in entries}
        for key in [key for key in self.status.failing if key not in wanted]:
            log.log(V1, "peer %s (IPv%d) no longer probed: it is no peer of this node now",
                    *key)
            del self.status.failing[key]
        self._report()

    def _pinger(self, version: int) -> Pinger | None:
        """The pinger of IP ``version``, opened on first use; None while the family cannot
        be probed (``status.unprobed`` says why; tried again every ``RECHECK`` s)."""
        pinger = self._pingers.get(version)
        if pinger is not None and pinger.source is not None:
            return pinger
        now = self.clock.monotonic()
        if now < self._retry.get(version, 0.0):
            return None
        self._retry[version] = now + RECHECK
        local = self._local.get(version)
        if local is None:
            self._unprobed(version, "this node's lease has no subnet of that family")
            return None
        if pinger is None:
            try:
                pinger = self._open(version, [local], self._host)
            except IcmpError as err:
                self.status.errors["socket"] += 1
                self._unprobed(version, str(err))
                return None
            self._pingers[version] = pinger
        elif pinger.holds(local):
            pinger.source = local
        if pinger.source is None:
            self._unprobed(version, f"this node does not hold {local}, the address its "
                           "echoes leave from (its cni0 bridge's, there once it runs a pod)")
            return None
        if self.status.unprobed.pop(version, None) is not None:
            log.info("Probing peers over IPv%d from %s", version, local)
        return pinger

    def _unprobed(self, version: int, why: str) -> None:
        if self.status.unprobed.get(version) != why:
            log.warning("Not probing peers over IPv%d: %s", version, why)
            self.status.unprobed[version] = why

    # -- in the worker thread --------------------------------------------------------------

    def _route_get(self, ip: IPAddress) -> rtnl.Route | None:
        if self._rtnl is None:
            self._rtnl = rtnl.Rtnl(self._host)
        return self._rtnl.route_get(ip)

    def _close_rtnl(self) -> None:
        if self._rtnl is not None:
            sock, self._rtnl = self._rtnl, None
            sock.close()

    def _plan(self, planner: Callable[[Lease], Sequence[object]], leases: Sequence[Lease]
              ) -> dict[tuple[str, int], tuple[Lease, Path | None]]:
        """The paths of ``leases``' families, from the backend's own plan of each."""
        from flannel.backend.plan import FamilyPlan

        out: dict[tuple[str, int], tuple[Lease, Path | None]] = {}
        underlay = self.backend.ext.mtu
        try:
            for lease in leases:
                for version in self._versions:
                    out[(lease.key, version)] = (lease, None)
                for family in planner(lease):
                    assert isinstance(family, FamilyPlan)
                    if family.skipped or family.answers_on is None or family.public is None:
                        continue
                    out[(lease.key, family.version)] = (lease, Path(
                        family.version, family.answers_on, family.public, family.carrier,
                        self.mtu, underlay))
        except OSError:  # a route lookup failed: planned again at the next slot
            self._close_rtnl()
            raise
        return out

    # -- one probe -----------------------------------------------------------------------

    async def _one(self, pinger: Pinger, lease: Lease, version: int, index: int,
                   path: Path, began: float) -> None:
        try:
            outcome = await self._probe(pinger, path)
        except OSError as err:  # the socket itself failed: counted, the result kept
            self.status.errors["send"] += 1
            log.log(V1, "probe of %s (IPv%d) failed: %s", lease.key, version, err)
            return
        self._record(lease, version, index, path, outcome, began)

    def _record(self, lease: Lease, version: int, index: int, path: Path,
                outcome: Outcome, began: float) -> None:
        """Keep what the probe that began at ``began`` found, unless a probe of that peer
        that began later has concluded already (a slow failing probe overtaken by a quick
        answer must not undo it)."""
        status = self.status
        key = (lease.key, version)
        slots = self.schedule.slots
        if index >= len(slots) or slots.key(index) != key:
            found = next((i for i in range(len(slots)) if slots.key(i) == key), None)
            if found is None:
                return  # no longer a peer
            index = found
        if began < slots.resulted[index]:
            return
        if outcome.inconclusive:
            status.probes["inconclusive"] += 1
            status.errors["flood" if outcome.inconclusive == FLOODED else "send"] += 1
            log.log(V1, "probe of %s (IPv%d) concluded nothing: %s", lease.key, version,
                    outcome.inconclusive)
            return
        previous = status.failing.get(key)
        slots.resulted[index] = began
        slots.rtts[index] = outcome.rtt or 0.0
        if outcome.cause == OK:
            status.probes["reached"] += 1
            slots.results[index] = REACHED
            if outcome.rtt is not None:
                status.rtt.observe(outcome.rtt)
            if previous is not None:
                del status.failing[key]
                log.info("Peer %s (%s) reachable again over the overlay, after %s for %.0fs",
                         lease.key, path.node, CAUSES[previous.cause],
                         self._wall() - previous.since)
                self._report()
            return
        status.probes["unreachable"] += 1
        slots.results[index] = CODES[outcome.cause]
        now = self.clock.monotonic()
        if previous is not None and previous.cause == outcome.cause:
            previous.checked, previous.detail = now, outcome.detail
            return
        since = previous.since if previous is not None else self._wall()
        status.failing[key] = Failing(outcome.cause, outcome.detail, since, now,
                                      str(path.public), str(path.overlay))
        log.warning("Peer %s unreachable over the overlay: %s: %s", lease.key,
                    CAUSES[outcome.cause], outcome.detail)
        self._report()

    def _report(self) -> None:
        readiness = self._readiness
        if readiness is None:
            return
        failing = self.status.failing
        if not failing:
            readiness.report(COMPONENT, True)
            return
        (key, version), first = min(failing.items())
        counts = ", ".join(f"{n} {CAUSES[cause]}" for cause, n in
                           self.status.by_cause().items() if n)
        readiness.report(COMPONENT, False, f"peers unreachable ({counts}; "
                         "--peer-probe-readiness): " + f"{key} (IPv{version}): {first.detail}")
