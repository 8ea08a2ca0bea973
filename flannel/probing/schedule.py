"""When each peer is probed: every peer once per period, spread evenly, at most a global rate.

Owns the peers probed (each peer and IP family a slot), their order, the latest result of
each (kept in arrays: about 40 bytes a peer, so 5000 peers cost ~200 KB), and the pace: the
period is ``--peer-probe-interval``, stretched on a big cluster to ``peers / rate`` so that
no more than ``--peer-probe-rate`` probes a second leave however many peers there are; one
slot is due every ``period / peers`` seconds, round robin, handed out in batches: one wake-up
every ``BATCH`` seconds at most hands out the slots due by then (waking the event loop for
each probe of a big cluster cost more CPU than the probes). A peer new to the set is due
first; a peer set that changes keeps every other peer's turn and result. Time is read from
an injected ``Clock`` (``flannel/timing/clock.py``), so tests drive it.
Must not touch: the network (it says when; the prober probes).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from flannel.lease import Lease
from flannel.timing.clock import SYSTEM, Clock

#: What a slot's latest result is: none yet, reached, or the index of a cause + 2.
NONE, REACHED = 0, 1
#: Seconds between two batches of slots, at least (see the module docstring).
BATCH = 0.5


class Slots:
    """The peer families probed, in the order they are probed, with each one's latest
    result: ``leases`` and ``versions`` say which; ``probed`` when its latest probe began
    (the clock's reading; 0: never), ``results`` what the latest probe to conclude gave
    (``NONE``, ``REACHED``, or a cause's code) and ``resulted`` when that probe began (a
    probe that began earlier and ends later is stale; before the first result, when the
    slot joined), ``rtts`` its round trip over the
    overlay (seconds; 0: none)."""

    __slots__ = ("leases", "probed", "resulted", "results", "rtts", "versions")

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self.versions = array("b")
        self.probed = array("d")
        self.resulted = array("d")
        self.results = array("b")
        self.rtts = array("f")

    def __len__(self) -> int:
        return len(self.leases)

    def key(self, index: int) -> tuple[str, int]:
        return self.leases[index].key, self.versions[index]

    def replace(self, entries: Sequence[tuple[Lease, int]], first: int, now: float) -> None:
        """Hold ``entries`` (lease, IP version): those new to the set first (``resulted``
        set to ``now``, when they joined), then the others in their current turn from slot
        ``first`` on; their results kept."""
        old = {self.key(i): i for i in range(len(self.leases))}
        kept = {(lease.key, version) for lease, version in entries if (lease.key, version)
                in old}
        fresh = [(lease, version) for lease, version in entries
                 if (lease.key, version) not in kept]
        current = {(lease.key, version): lease for lease, version in entries}
        turn = [i for i in (*range(first, len(self.leases)), *range(first))
                if self.key(i) in kept]
        leases = [lease for lease, _ in fresh] + [current[self.key(i)] for i in turn]
        versions = array("b", [v for _, v in fresh] + [self.versions[i] for i in turn])
        zeros = [0] * len(fresh)
        self.probed = array("d", zeros + [self.probed[i] for i in turn])
        self.resulted = array("d", [now] * len(fresh) + [self.resulted[i] for i in turn])
        self.results = array("b", zeros + [self.results[i] for i in turn])
        self.rtts = array("f", zeros + [self.rtts[i] for i in turn])
        self.leases, self.versions = leases, versions

    def same(self, entries: Sequence[tuple[Lease, int]]) -> bool:
        """Whether ``entries`` are the slots held now (the same lease objects), in any
        order."""
        if len(entries) != len(self.leases):
            return False
        held = {id(lease) for lease in self.leases}
        return all(id(lease) in held for lease, _ in entries)


class Schedule:
    """Which slot is due next, and when (see the module docstring)."""

    def __init__(self, interval: float, rate: float, clock: Clock = SYSTEM) -> None:
        if interval <= 0 or rate <= 0:
            raise ValueError(f"interval and rate must be positive: {interval!r}, {rate!r}")
        self.interval = interval
        self.rate = rate
        self.clock = clock
        self.slots = Slots()
        self._cursor = 0
        self._due = 0.0  # when the next batch is due (0: at once)
        self._left = 0  # slots of the current batch not handed out yet

    @property
    def period(self) -> float:
        """Seconds between two probes of one peer: the interval, or longer where the rate
        cap needs it."""
        return max(self.interval, len(self.slots) / self.rate)

    @property
    def spacing(self) -> float:
        """Seconds between two probes (of any peers)."""
        return self.period / max(1, len(self.slots))

    @property
    def batch(self) -> int:
        """Slots handed out per wake-up: those due within ``BATCH`` seconds (at least 1)."""
        return max(1, int(BATCH / self.spacing + 1e-9))

    def set_peers(self, entries: Sequence[tuple[Lease, int]]) -> bool:
        """Probe ``entries`` (lease, IP version) from now on; whether the set changed."""
        if self.slots.same(entries):
            return False
        self.slots.replace(entries, self._cursor if self._cursor < len(self.slots) else 0,
                           self.clock.monotonic())
        self._cursor = 0
        return True

    async def next(self) -> int:
        """Wait until the next slot is due and hand it out (its ``probed`` set to now); the
        caller checks that slots exist first. The slots of one batch are handed out at
        once; the next batch is due when their spacings have passed."""
        if not self.slots:
            raise LookupError("no peer to probe")
        if self._left <= 0:
            wait = self._due - self.clock.monotonic()
            if wait > 0:
                await self.clock.sleep(wait)
            batch = self.batch
            # A caller that fell behind (probes in flight held it) does not catch up in a
            # burst: the next batch is due its spacings after this one is handed out.
            self._due = self.clock.monotonic() + batch * self.spacing
            self._left = batch
        self._left -= 1
        if self._cursor >= len(self.slots):
            self._cursor = 0
        index = self._cursor
        self._cursor += 1
        self.slots.probed[index] = self.clock.monotonic()
        return index

    def upcoming(self, count: int) -> list[int]:
        """The next ``count`` slots to be handed out (fewer when there are fewer)."""
        total = len(self.slots)
        start = self._cursor if self._cursor < total else 0
        return [(start + step) % total for step in range(min(count, total))]

    def oldest(self) -> float:
        """Seconds since the probe of the least recent result began, or since a slot with
        no result yet joined: how stale the oldest thing known is (0 with no slot)."""
        if not self.slots:
            return 0.0
        return self.clock.monotonic() - min(self.slots.resulted)
