"""Time as flanneld reads and waits for it, behind one seam tests can drive.

Owns the ``Clock`` protocol (a monotonic reading, the wall clock, a sleep, a wait for an
event with a timeout) and ``SYSTEM``, the real one (``time.monotonic``, ``time.time`` and
the event loop's timers). Whatever waits or measures a delay takes a clock: the data plane,
the stores (renewal, the lease watch and its checks), ``Backoff``. A test hands it a clock
it advances itself (``tests/support/clock.py``), or runs on a virtual-time event loop with
the clock of that loop (``tests/support/looptime.py``), so what must happen after a delay,
and what must not happen before it, is asserted exactly and at once.
Must not touch: what is waited for.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (any thread may read it)."""

    def time(self) -> float:
        """Seconds since the epoch: for times shown to people (a lease's expiry), never
        for measuring a delay."""

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds``."""

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Whether ``event`` was set within ``seconds`` (returns as soon as it is)."""


class SystemClock:
    """The real clock: the running event loop's time (on asyncio's own loops, which read
    ``time.monotonic``, the same reading; a virtual-time loop's in tests), or
    ``time.monotonic`` in a thread without a loop."""

    def monotonic(self) -> float:
        try:
            return asyncio.get_running_loop().time()
        except RuntimeError:  # a worker thread: no loop runs here
            return time.monotonic()

    def time(self) -> float:
        """The wall clock, moved as far as the loop's time is from ``time.monotonic``
        (nowhere on asyncio's own loops)."""
        return time.time() + self.monotonic() - time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        try:
            # Not wait_for: on 3.11 it can swallow a cancellation that races with the
            # wake-up.
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        return True


SYSTEM: Clock = SystemClock()
