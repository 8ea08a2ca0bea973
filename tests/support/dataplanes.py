"""The data plane under a fake clock and a fake kernel, for its unit tests: backends, peers and
routes to give it, running it, and waiting for its passes, parked retries and readiness."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.alloc import AllocBackend
from flannel.backend.base import Applier, Backend
from flannel.backend.hostgw import HostGwBackend
from flannel.config import check_network_config, parse_config
from flannel.dataplane.loop import COMPONENT, Dataplane
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.readiness import Readiness
from tests.support.clock import FakeClock
from tests.support.fakenetlink import FakeKernel
from tests.support.waiting import async_wait_until

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)


OWN = Lease(IPv4Network("10.244.1.0/24"))


def config(backend_type: str):
    parsed = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                      "Backend": {"Type": backend_type}}))
    check_network_config(parsed)
    return parsed


def hostgw() -> HostGwBackend:
    backend = HostGwBackend(EXT, config("host-gw"))
    backend.lease = OWN
    return backend


def peer(third: int, backend_type: str = "host-gw") -> Lease:
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(f"192.168.1.{third}"), backend_type=backend_type))


def route(third: int, gateway: str = "") -> Route:
    return Route(f"10.244.{third}.0/24", gateway or f"192.168.1.{third}", EXT.index)


@contextlib.asynccontextmanager
async def running(backend: Backend, kernel: FakeKernel, interval: float = 300,
                  clock: FakeClock | None = None) -> AsyncIterator[Dataplane]:
    dataplane = Dataplane(backend, Readiness([COMPONENT]), interval=interval,
                          netlink=kernel.open, watch=kernel.watch, retry=(0.05, 0.2),
                          clock=clock or FakeClock())
    task = asyncio.create_task(dataplane.run())
    try:
        yield dataplane
    finally:
        kernel.gate.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(condition: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    async def check() -> object:
        return condition()
    await async_wait_until(check, timeout, interval=0.005, what=what)


def readiness(dataplane: Dataplane) -> tuple[bool, str]:
    return dataplane.readiness.current()


async def programmed(dataplane: Dataplane) -> None:
    await until(lambda: readiness(dataplane)[0], f"ready, not {readiness(dataplane)}")


async def parked(clock: FakeClock, delay: float) -> None:
    """Until the data plane waits on the clock, for ``delay`` seconds and for nothing else:
    no pass runs or is due before the clock reaches it."""
    await until(lambda: clock.timers() == pytest.approx([delay]),
                f"a wait of {delay} s, not {clock.timers()}")


async def retried(clock: FakeClock) -> None:
    """Move the clock to the end of the pending retry wait."""
    await until(lambda: len(clock.timers()) == 1, "a retry wait")
    await clock.advance(clock.timers()[0])


class AllocWithEngine(AllocBackend):
    """A backend with no netlink state and one applier: all a new backend has to write."""

    def __init__(self, engine: Applier) -> None:
        super().__init__(EXT, config("alloc"))
        self.engine = engine

    def appliers(self) -> Sequence[Applier]:
        return (self.engine,)
