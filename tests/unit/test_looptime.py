"""The virtual-time event loop the fast lane's asynchronous tests run on
(tests/support/looptime.py): time jumps to the next timer when nothing can run, never while
something can, and flanneld's default clock follows it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flannel.timing.backoff import Backoff
from flannel.timing.clock import SYSTEM

pytestmark = pytest.mark.virtual_time


async def test_an_hour_of_sleeping_takes_no_real_time():
    loop = asyncio.get_running_loop()
    started, real = loop.time(), time.monotonic()
    await asyncio.sleep(3600)
    assert loop.time() - started == pytest.approx(3600)
    assert time.monotonic() - real < 1
    assert SYSTEM.monotonic() == loop.time()


async def test_timers_fire_in_order_at_their_own_times():
    loop = asyncio.get_running_loop()
    start = loop.time()
    fired: list[tuple[str, float]] = []

    async def after(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        fired.append((name, loop.time() - start))
    await asyncio.gather(after("b", 20), after("a", 10), after("c", 30.5))
    assert fired == [("a", pytest.approx(10)), ("b", pytest.approx(20)),
                     ("c", pytest.approx(30.5))]


async def test_a_worker_thread_holds_time_back():
    """A wait with a timeout for a thread's answer does not time out while it works."""
    release = threading.Event()

    def work() -> str:
        release.wait(5)
        return "answer"
    timer = threading.Timer(0.2, release.set)
    timer.start()
    try:
        async with asyncio.timeout(1):
            assert await asyncio.to_thread(work) == "answer"
    finally:
        timer.cancel()


async def test_backoff_waits_its_delays_on_the_clock():
    loop = asyncio.get_running_loop()
    backoff = Backoff(0.5, 4)
    marks = []
    start = loop.time()
    for _ in range(5):
        await backoff.wait()
        marks.append(round(loop.time() - start, 6))
    assert marks == [0.5, 1.5, 3.5, 7.5, 11.5]
    stop = asyncio.Event()
    loop.call_later(1, stop.set)
    before = loop.time()
    await backoff.wait(stop)  # 4 s, cut short by the stop event after 1
    assert loop.time() - before == pytest.approx(1)
