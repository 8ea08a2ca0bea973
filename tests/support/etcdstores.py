"""The etcd store the behavioural tests run against, the in-memory one or a real etcd, and
what those tests share: a manager on it, the lease watch consumed in the background.

A test marked ``stores`` (tests/support/looptime.py) runs twice: ``[fake]`` on virtual time
with ``tests/support/fakeetcd.py``, ``[etcd]`` on real time against the session's etcd. Its
``kv`` fixture is the client the test writes with: the fake's ``FakeKV`` or the real
``EtcdClient`` (both answer ``get``, ``put``, ``delete``, ``get_prefix``, ``grant``,
``time_to_live``, ``leases`` and ``compact``); ``manager(kv, prefix)`` is an
``EtcdSubnetManager`` on the same store. Both run on the default clock, which reads the
running loop's time (virtual for ``[fake]``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from ipaddress import IPv4Address
from typing import Any

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.subnet.etcd.kv import KV, EtcdKV
from flannel.subnet.etcd.manager import EtcdSubnetManager
from flannel.subnet.watch import LeaseWatcher, Snapshot
from flannel.timing.clock import SYSTEM
from tests.support.fakeetcd import FakeEtcd, FakeKV
from tests.support.proxy import CuttableProxy
from tests.support.waiting import async_wait_until

CONFIG = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.25.0" }'
# Leases that tests write by hand lie above SubnetMax, so they never collide with ours.


@pytest.fixture
async def kv(request: pytest.FixtureRequest, store_kind: str) -> AsyncIterator[Any]:
    """A client of the variant's store: ``FakeKV`` of a fresh ``FakeEtcd``, or an
    ``EtcdClient`` of the session's etcd."""
    if store_kind == "fake":
        async with FakeEtcd(SYSTEM) as etcd:
            yield etcd.client()
        return
    server = request.getfixturevalue("etcd")
    client = EtcdClient(EtcdOptions(parse_endpoints(server.endpoint)))
    yield client
    await client.close()


def other_client(kv: Any) -> Any:
    """Another client of the store ``kv`` is a client of (another node's connection)."""
    if isinstance(kv, FakeKV):
        return kv.etcd.client()
    return EtcdClient(kv._options)


def as_kv(kv: Any) -> KV:
    return kv if isinstance(kv, FakeKV) else EtcdKV(kv)


def manager(kv: Any, prefix: str, **options: Any) -> EtcdSubnetManager:
    """A manager on ``kv``'s store, on virtual time with the fake, real time with etcd."""
    return EtcdSubnetManager(as_kv(kv), prefix, **options)


async def setup(kv: Any, prefix: str, config: str = CONFIG, **options: Any
                ) -> EtcdSubnetManager:
    await kv.put(f"{prefix}/config".encode(), config.encode())
    return manager(kv, prefix, **options)


async def acquire(sm: EtcdSubnetManager, lease_attrs: LeaseAttrs) -> Lease:
    """The manager's lease under the network config it holds now."""
    return await sm.acquire_lease(await sm.get_network_config(), lease_attrs)


def attrs(ip: str = "1.2.3.4") -> LeaseAttrs:
    return LeaseAttrs(public_ip=IPv4Address(ip))


async def raw_value(kv: Any, key: str) -> Any:
    found, _ = await kv.get(key.encode())
    return found


async def put_lease(kv: Any, prefix: str, third: int, ip: str) -> None:
    await kv.put(f"{prefix}/subnets/10.3.{third}.0-24".encode(),
                 f'{{"PublicIP":"{ip}","PublicIPv6":null}}'.encode())

def count_listings(kv: Any, monkeypatch: pytest.MonkeyPatch, then: Any = None) -> list[bytes]:
    """The prefixes the manager lists through ``kv`` (the real call; ``then`` runs after
    each listing returns)."""
    listed: list[bytes] = []
    real = kv.get_prefix

    async def get_prefix(key: bytes, **options: Any) -> Any:
        answer = await real(key, **options)
        listed.append(key)
        if then is not None:
            await then()
        return answer
    monkeypatch.setattr(kv, "get_prefix", get_prefix)
    return listed


@contextlib.asynccontextmanager
async def partitionable(etcd: Any) -> AsyncIterator[tuple[CuttableProxy, EtcdClient, EtcdClient]]:
    """A manager's client behind a cuttable proxy, and a direct client for the test."""
    proxy = CuttableProxy(etcd.client_port)
    await proxy.start()
    direct = EtcdClient(EtcdOptions(parse_endpoints(etcd.endpoint)))
    via_proxy = EtcdClient(EtcdOptions(parse_endpoints(proxy.endpoint), timeout=2))
    try:
        yield proxy, direct, via_proxy
    finally:
        await proxy.cut()
        await direct.close()
        await via_proxy.close()


class Renewals:
    """The leases a manager has published as its own (``sm.lease``), as they change."""

    def __init__(self, sm: EtcdSubnetManager) -> None:
        self.sm = sm
        self.leases: list[Lease] = []

    def at_least(self, count: int) -> Any:
        first = self.sm.lease

        async def enough() -> bool:
            current = self.sm.lease
            if current is not None and current is not first and (
                    not self.leases or self.leases[-1] is not current):
                self.leases.append(current)
            return len(self.leases) >= count
        return enough


class Collector:
    """Consumes watch_leases() in the background through a LeaseWatcher."""

    def __init__(self, sm: EtcdSubnetManager, own: Lease | None, config: Any = None) -> None:
        self.watcher = LeaseWatcher(own, config)
        self.events: list[tuple[EventType, str]] = []
        self.updates: list[object] = []
        self.own_removed = False
        self.ready_at_snapshots: list[bool] = []  # the store status as each snapshot arrived
        self.task = asyncio.create_task(self._run(sm))

    async def _run(self, sm: EtcdSubnetManager) -> None:
        async for update in sm.watch_leases(max_backoff=0.5):
            self.updates.append(update)
            if isinstance(update, Snapshot):
                self.ready_at_snapshots.append(sm.status.ready)
            result = self.watcher.apply(update)
            self.events += [(e.type, e.lease.key) for e in result.events]
            self.own_removed |= result.own_lease_removed

    async def wait_for(self, event: tuple[EventType, str], timeout: float = 10.0) -> None:
        async def seen() -> bool:
            return event in self.events
        await async_wait_until(seen, timeout, what=f"event {event}; got {self.events}")

    async def first_snapshot(self) -> Snapshot:
        async def arrived() -> bool:
            return bool(self.updates)
        await async_wait_until(arrived, what="the first snapshot")
        snapshot = self.updates[0]
        assert isinstance(snapshot, Snapshot)
        return snapshot

    def snapshots(self) -> int:
        return sum(isinstance(u, Snapshot) for u in self.updates)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
