"""Exponential backoff for retried work: the one helper every retry loop uses.

Owns the delay sequence (``first``, doubling up to ``longest``, back to ``first`` on success)
and waiting it out, optionally cut short by a stop event. Must not touch: what is retried or
how failures are logged (see ``flannel.subnet.errors.RetryLog``).
"""

from __future__ import annotations

import asyncio
import contextlib


class Backoff:
    def __init__(self, first: float, longest: float, factor: float = 2.0) -> None:
        if not 0 < first <= longest or factor < 1:
            raise ValueError(f"bad backoff: first={first}, longest={longest}, factor={factor}")
        self.first = first
        self.longest = longest
        self.factor = factor
        self._next = first

    @property
    def delay(self) -> float:
        """The delay the next wait will use."""
        return self._next

    def grow(self) -> float:
        """The delay to wait now; later delays grow up to ``longest``."""
        current = self._next
        self._next = min(self._next * self.factor, self.longest)
        return current

    def reset(self) -> None:
        self._next = self.first

    async def wait(self, stop: asyncio.Event | None = None) -> None:
        """Sleep the current delay (then grow it), or until ``stop`` is set."""
        seconds = self.grow()
        if stop is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)
