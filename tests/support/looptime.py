"""Virtual time for asyncio tests: an event loop whose clock jumps to its next timer as soon
as nothing else can run, so that a test of a 24 h lease renewal or a 30 s backoff takes no
real time, and what happens at a delay (and not before it) is exact.

``VirtualTimeLoop`` is asyncio's selector loop with ``time()`` read from a counter. Before
each wait it polls its sockets without blocking; when nothing is ready and a timer is
pending, time moves to that timer at once. So it suits code that waits only on the loop
(timers, events, queues, in-memory doubles): a thread or a real server still at work when
the loop goes idle does not hold time back. ``LoopClock`` is ``flannel.timing.clock.Clock``
on the running loop's time, the clock to hand to what a test runs on it.

The pytest plugin: a test marked ``virtual_time`` runs on a ``VirtualTimeLoop``; a test
marked ``stores`` runs twice, once on it with the in-memory etcd (``[fake]``) and once on
asyncio's own loop against a real etcd (``[etcd]``, marked ``etcd``); the ``store_kind``
fixture says which. Every other asynchronous test runs on asyncio's own loop, as before.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any

import pytest

from tests.support.clock import EPOCH

#: Where virtual time starts (seconds; any value would do, 0 would hide bugs of "unset").
START = 1000.0


class _Selector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls without blocking; when nothing is ready, moves the loop's time to its next timer
    instead of sleeping until it."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only I/O (or a thread) can wake the loop
            return super().select(None)
        self.loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        self.now = START
        selector.loop = self

    def time(self) -> float:
        return self.now


class LoopClock:
    """``Clock`` on the running event loop's time (virtual on a ``VirtualTimeLoop``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop or asyncio.get_running_loop()

    def monotonic(self) -> float:
        return self.loop.time()

    def time(self) -> float:
        return EPOCH + self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait(self, event: asyncio.Event, seconds: float) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            return False
        return True


_REAL = {"asyncio": asyncio.new_event_loop}
_VIRTUAL = {"virtual": VirtualTimeLoop}
_STORES = {"fake": VirtualTimeLoop, "etcd": asyncio.new_event_loop}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Any]:
    if item.get_closest_marker("stores"):
        return _STORES
    if item.get_closest_marker("virtual_time"):
        return _VIRTUAL
    return _REAL


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("stores") and store_kind_of(item) == "etcd":
            item.add_marker(pytest.mark.etcd)


def store_kind_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    factory = callspec.params.get("_asyncio_loop_factory") if callspec is not None else None
    return "fake" if factory is VirtualTimeLoop else "etcd"


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """``fake`` or ``etcd``: the store a ``stores`` test runs against this time."""
    return store_kind_of(request.node)
