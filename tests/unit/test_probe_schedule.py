"""The pace of flanneld's probes (``flannel/probing/schedule.py``): every peer once per
interval, spread evenly, a global rate cap that stretches the interval on a big cluster,
slots handed out in batches (a few wake-ups a second however many peers), and a peer set
that changes without losing anyone's turn. Time is a ``FakeClock``: nothing waits for real."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.lease import Lease, LeaseAttrs
from flannel.probing.schedule import BATCH, REACHED, Schedule
from tests.support.clock import FakeClock


def leases(count: int, start: int = 0) -> list[tuple[Lease, int]]:
    """``count`` peers (IPv4), each a lease of its own /24."""
    return [(Lease(IPv4Network(f"10.{(n >> 8) & 255}.{n & 255}.0/24"),
                   attrs=LeaseAttrs(IPv4Address(f"192.168.{(n >> 8) & 255}.{n & 255}"))), 4)
            for n in range(start, start + count)]


async def handed_out(schedule: Schedule, clock: FakeClock, seconds: float
                     ) -> list[tuple[float, str]]:
    """(when, lease key) of every slot the schedule hands out in ``seconds`` of clock time."""
    out: list[tuple[float, str]] = []

    async def consume() -> None:
        while True:
            index = await schedule.next()
            out.append((clock.monotonic(), schedule.slots.leases[index].key))

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    try:
        await clock.advance(seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return out


def most_in_one_second(times: list[float]) -> int:
    """The most events in any window of one second (closed on the left)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0 - 1e-9:
            first += 1
        most = max(most, last - first + 1)
    return most


async def test_a_hundred_peers_are_each_probed_every_interval_spread_evenly():
    clock = FakeClock()
    schedule = Schedule(30, 20, clock)
    schedule.set_peers(leases(100))
    assert schedule.period == 30
    out = await handed_out(schedule, clock, 90)
    per_peer: dict[str, list[float]] = {}
    for at, key in out:
        per_peer.setdefault(key, []).append(at)
    assert len(per_peer) == 100
    gaps = [b - a for times in per_peer.values() for a, b in itertools.pairwise(times)]
    assert gaps and max(gaps) <= 30 + 1e-6 and min(gaps) >= 30 - 1e-6
    starts = [at for at, _ in out]
    spacing = [b - a for a, b in itertools.pairwise(starts)]
    assert min(spacing) == pytest.approx(0.3) and max(spacing) == pytest.approx(0.3)


async def test_the_rate_cap_stretches_the_interval_of_a_big_cluster():
    clock = FakeClock()
    schedule = Schedule(30, 20, clock)
    schedule.set_peers(leases(5000))
    # 5000 peers at 20 probes a second: each every 250 s, not every 30 s.
    assert schedule.period == pytest.approx(250)
    out = await handed_out(schedule, clock, 300)
    assert most_in_one_second([at for at, _ in out]) <= 20
    counts = Counter(key for _, key in out)
    assert len(counts) == 5000  # every peer within 5 minutes
    first = {key: at for at, key in reversed(out)}
    assert max(first.values()) - min(first.values()) <= 250


async def test_a_big_cluster_is_handed_out_in_batches_that_keep_the_period_and_the_cap():
    clock = FakeClock()
    schedule = Schedule(30, 20, clock)
    schedule.set_peers(leases(5000))
    out = await handed_out(schedule, clock, 60)
    wakeups = sorted({at for at, _ in out})
    # One wake-up every BATCH (0.5 s) hands out the 10 slots due by then, not one every
    # 50 ms: the event loop wakes 2 times a second, not 20.
    assert [b - a for a, b in itertools.pairwise(wakeups)] == pytest.approx(
        [BATCH] * (len(wakeups) - 1))
    assert Counter(at for at, _ in out) == dict.fromkeys(wakeups, 10)
    assert most_in_one_second([at for at, _ in out]) <= 20
    assert len(out) == pytest.approx(60 * 20, abs=10)
    assert len({key for _, key in out}) == len(out)  # round robin: nobody twice so soon


async def test_a_caller_that_falls_behind_does_not_catch_up_in_a_burst():
    clock = FakeClock()
    schedule = Schedule(10, 5, clock)
    schedule.set_peers(leases(10))
    await schedule.next()
    await clock.advance(5)  # the caller was held: 5 s with no slot taken
    times = []
    task = asyncio.create_task(schedule.next())
    await asyncio.sleep(0)
    assert task.done()  # overdue: handed out at once
    times.append(clock.monotonic())
    for _ in range(3):
        task = asyncio.create_task(schedule.next())
        await asyncio.sleep(0)
        assert not task.done()  # the next one waits its spacing (1 s), not 0
        await clock.advance(1)
        await task
        times.append(clock.monotonic())
    assert [b - a for a, b in itertools.pairwise(times)] == pytest.approx([1, 1, 1])


async def test_new_peers_come_first_and_the_others_keep_their_turn_and_result():
    clock = FakeClock()
    schedule = Schedule(30, 20, clock)
    old = leases(4)
    schedule.set_peers(old)
    for _ in range(2):  # peers 0 and 1 probed; 2 is next
        index = await schedule.next()
        schedule.slots.results[index] = REACHED
        await clock.advance(schedule.spacing)
    now = [*old[1:], *leases(1, start=9)]
    assert schedule.set_peers(now)  # 0 leaves, 9 joins
    order = [schedule.slots.leases[i].key for i in schedule.upcoming(4)]
    assert order == ["10.0.9.0-24", "10.0.2.0-24", "10.0.3.0-24", "10.0.1.0-24"]
    kept = schedule.slots.leases.index(old[1][0])
    assert schedule.slots.results[kept] == REACHED and schedule.slots.probed[kept] > 0
    assert not schedule.set_peers(now[::-1])  # the same leases: no change


async def test_the_oldest_result_counts_from_joining_until_a_peer_has_one():
    clock = FakeClock()
    schedule = Schedule(2, 20, clock)
    assert schedule.oldest() == 0
    schedule.set_peers(leases(2))
    await clock.advance(3)
    assert schedule.oldest() == pytest.approx(3)  # neither probed since they joined
    first = await schedule.next()
    schedule.slots.resulted[first] = clock.monotonic()
    assert schedule.oldest() == pytest.approx(3)
    await clock.advance(1)
    second = await schedule.next()
    schedule.slots.resulted[second] = clock.monotonic()
    await clock.advance(0.5)
    assert schedule.oldest() == pytest.approx(1.5)


def test_a_schedule_needs_a_positive_interval_and_rate():
    with pytest.raises(ValueError):
        Schedule(0, 20)
    with pytest.raises(ValueError):
        Schedule(30, 0)
