"""Virtual time for asyncio tests: an event loop whose clock jumps to its next timer as soon
as nothing else can run, so that a test of a 24 h lease renewal or a 30 s backoff takes no
real time, and what happens at a delay (and not before it) is exact.

``VirtualTimeLoop`` is asyncio's selector loop with ``time()`` read from a counter. Before
each wait it polls its sockets without blocking; when nothing is ready and a timer is
pending, time moves to that timer at once, unless a worker thread runs for the loop
(``asyncio.to_thread``): then it waits for real (and with sockets open, it first gives
their bytes ``SOCKET_GRACE`` to arrive). So it suits code that waits on the loop and
its threads (timers, events, queues, in-memory doubles, a double serving on the same loop):
a subprocess or a server in another thread or process still at work when the loop goes idle
does not hold time back. ``flannel.timing.clock.SYSTEM`` reads the running loop's time, so
what runs on this loop waits and measures on virtual time with the default clock.

The pytest plugin: a test marked ``virtual_time`` runs on a ``VirtualTimeLoop`` (one marked
``virtual_time(False)`` in a module that is, on asyncio's own loop: it measures work against
real time); a test
marked ``stores`` runs twice, once on it with the in-memory etcd (``[fake]``) and once on
asyncio's own loop against a real etcd (``[etcd]``, marked ``etcd``); the ``store_kind``
fixture says which. Every other asynchronous test runs on asyncio's own loop, as before.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Mapping
from typing import Any

import pytest

#: Real seconds a loop with sockets open waits for their bytes before time jumps.
SOCKET_GRACE = 0.002
#: Where virtual time starts (seconds; any value would do, 0 would hide bugs of "unset").
START = 1000.0


class _Selector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls without blocking; when nothing is ready, moves the loop's time to its next timer
    instead of sleeping until it. While a worker thread runs for the loop, it waits for real
    (and time moves as much): the thread's answer may be what the loop waits for."""

    loop: VirtualTimeLoop

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if self.loop.threads or timeout is None:
            started = time.monotonic()
            ready = super().select(timeout)
            self.loop.now += time.monotonic() - started
            return ready
        if len(self.get_map()) > 1:  # sockets besides the loop's own wake-up pipe
            # Bytes sent over loopback are normally readable at once; on a loaded host the
            # kernel may finish delivering them a little later.
            ready = super().select(min(timeout, SOCKET_GRACE))
            if ready:
                return ready
        self.loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        self.now = START
        self.threads = 0  # calls running in the executor for this loop
        selector.loop = self

    def time(self) -> float:
        return self.now

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self.threads += 1

        def done(_: object) -> None:
            self.threads -= 1
        future.add_done_callback(done)
        return future


_REAL = {"asyncio": asyncio.new_event_loop}
_VIRTUAL = {"virtual": VirtualTimeLoop}
_STORES = {"fake": VirtualTimeLoop, "etcd": asyncio.new_event_loop}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item
                                  ) -> Mapping[str, Any]:
    if item.get_closest_marker("stores"):
        return _STORES
    marker = item.get_closest_marker("virtual_time")
    if marker is not None and marker.args[:1] != (False,):
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
