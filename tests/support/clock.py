"""A clock for the data plane (``flannel.timing.clock.Clock``) that moves only when a test moves it.

Models: ``time.monotonic`` and the event loop's timers. ``monotonic()`` reads the test's time;
``sleep``/``wait`` park the caller until ``advance`` moves time past their deadline (or the
event is set), firing due timers in deadline order and letting each woken task run before
the next fires. So a test asserts that nothing happens before a delay (advance to just
short of it: nothing can wake) and what happens at it, exactly and without real waiting.
``timers()`` lists the pending deadlines: a data plane parked on the clock waits for time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (self.now + max(seconds, 0.0), next(self._order), future))
        try:
            await future
        finally:
            future.cancel()  # cancelled waiters leave a done timer, skipped by timers()

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        waiter = asyncio.ensure_future(event.wait())
        timer = asyncio.ensure_future(self.sleep(seconds))
        try:
            await asyncio.wait((waiter, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()
            await asyncio.gather(waiter, timer, return_exceptions=True)
        return event.is_set()

    def timers(self) -> list[float]:
        """The deadlines of the sleeps and waits pending now, soonest first, relative to now."""
        return sorted(deadline - self.now for deadline, _, future in self._timers
                      if not future.done())

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, firing the timers that fall due on the way."""
        target = self.now + seconds
        # Advances that add up to a deadline reach it despite rounding.
        while self._timers and self._timers[0][0] <= target + 1e-9:
            deadline, _, future = heapq.heappop(self._timers)
            if future.done():
                continue
            self.now = max(self.now, deadline)
            future.set_result(None)
            for _ in range(5):  # the woken task, then what it wakes in turn
                await asyncio.sleep(0)
        self.now = target
