"""The readiness object and the backoff helper."""

from __future__ import annotations

import asyncio

import pytest

from flannel.reporting.readiness import Readiness
from flannel.timing.backoff import Backoff


async def test_ready_only_when_every_component_reported_ready_and_first_reason_wins():
    readiness = Readiness(["subnet.env", "rules", "dataplane"])
    assert readiness.current() == (False, "subnet.env: starting")
    readiness.report("subnet.env", True)
    readiness.report("dataplane", False, "data plane: 3 peers not programmed")
    assert readiness.current() == (False, "rules: starting")
    readiness.report("rules", True)
    assert readiness.current() == (False, "data plane: 3 peers not programmed")
    readiness.report("dataplane", True)
    assert readiness.current() == (True, "")
    with pytest.raises(KeyError):
        readiness.report("metrics", True)


async def test_changes_are_announced_once_and_repeats_are_not():
    readiness = Readiness(["a", "b"])
    waiter = asyncio.create_task(readiness.wait_changed())
    readiness.report("a", True)
    assert await asyncio.wait_for(waiter, 1) == (False, "b: starting")
    readiness.report("a", True)  # no change: no wake-up
    again = asyncio.create_task(readiness.wait_changed())
    await asyncio.sleep(0)
    assert not again.done()
    readiness.report("b", True)
    assert await asyncio.wait_for(again, 1) == (True, "")


async def test_backoff_doubles_to_its_ceiling_resets_and_stops_early():
    backoff = Backoff(0.1, 0.5)
    assert [backoff.grow() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.delay == 0.1
    stop = asyncio.Event()
    stop.set()
    slow = Backoff(30, 60)
    await asyncio.wait_for(slow.wait(stop), 1)  # returns at once: stop is set
    assert slow.delay == 60
    with pytest.raises(ValueError):
        Backoff(1, 0.5)
