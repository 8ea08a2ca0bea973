"""Time as the data plane reads and waits for it, behind a seam tests can drive.

Owns the ``Clock`` protocol (a monotonic reading, a sleep, a wait for an event with a
timeout) and ``SYSTEM``, the real one (``time.monotonic`` and the event loop's timers).
A test hands the data plane a clock it advances itself (``tests/support/clock.py``), so
what must happen after a delay, and what must not happen before it, is asserted exactly and
at once. Must not touch: what is waited for.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (any thread may read it)."""

    async def sleep(self, seconds: float) -> None:
        """Return after ``seconds``."""

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        """Whether ``event`` was set within ``seconds`` (returns as soon as it is)."""


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

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
