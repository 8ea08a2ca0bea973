"""etcd subnet managers on a real etcd for the store tests: set up on a prefix, leases acquired and
put by hand, renewals and events collected, an etcd reached through a proxy that can be cut."""

from __future__ import annotations

import asyncio
import contextlib
from ipaddress import IPv4Address

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.subnet.etcd.manager import (
    EtcdSubnetManager,
)
from flannel.subnet.watch import LeaseWatcher, Snapshot
from tests.support.proxy import CuttableProxy
from tests.support.waiting import async_wait_until

CONFIG = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.25.0" }'


async def acquire(sm: EtcdSubnetManager, lease_attrs: LeaseAttrs) -> Lease:
    """The manager's lease under the network config it holds now."""
    return await sm.acquire_lease(await sm.get_network_config(), lease_attrs)


def attrs(ip: str = "1.2.3.4") -> LeaseAttrs:
    return LeaseAttrs(public_ip=IPv4Address(ip))


async def setup(client: EtcdClient, prefix: str, config: str = CONFIG, **kwargs
                ) -> EtcdSubnetManager:
    await client.put(f"{prefix}/config".encode(), config.encode())
    return EtcdSubnetManager(client, prefix, **kwargs)


class Renewals:
    """The leases a manager has published as its own (``sm.lease``), as they change."""

    def __init__(self, sm: EtcdSubnetManager) -> None:
        self.sm = sm
        self.leases: list[Lease] = []

    def at_least(self, count: int):
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

    def __init__(self, sm: EtcdSubnetManager, own: Lease | None, config=None) -> None:
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

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


@contextlib.asynccontextmanager
async def partitionable(etcd):
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


async def put_lease(client: EtcdClient, prefix: str, third: int, ip: str) -> None:
    await client.put(f"{prefix}/subnets/10.3.{third}.0-24".encode(),
                     f'{{"PublicIP":"{ip}","PublicIPv6":null}}'.encode())
