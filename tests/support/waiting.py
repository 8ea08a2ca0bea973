"""Bounded waiting: poll a condition until a deadline instead of sleeping and hoping.

Every bound is scaled by the lab's slowness factor (``FLANNEL_LAB_SLOWNESS``, see
lab/flannel_lab/slowness.py): the same conditions, more patience on a loaded or emulated machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from flannel_lab import slowness

T = TypeVar("T")


def wait_until(condition: Callable[[], T], timeout: float = 10.0, interval: float = 0.05,
               what: str = "condition") -> T:
    deadline = time.monotonic() + slowness.scaled(timeout)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {slowness.within(timeout)} waiting for "
                                 f"{what}")
        time.sleep(interval)


async def async_wait_until(condition: Callable[[], Awaitable[T]], timeout: float = 10.0,
                           interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``condition`` until it holds, within ``timeout`` seconds (scaled by the lab's
    slowness factor) of the event loop's time (virtual on a virtual-time loop:
    tests/support/looptime.py)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + slowness.scaled(timeout)
    while True:
        value = await condition()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {slowness.within(timeout)} waiting for "
                                 f"{what}")
        await asyncio.sleep(interval)
