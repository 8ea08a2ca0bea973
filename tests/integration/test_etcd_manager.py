"""The etcd subnet manager against a real etcd where the wire matters: partitions through a
proxy, compaction while cut off, restarts, many clients at once, the acquisition's listing
on an etcd of the test's own. The behaviour that any etcd shows runs against both the
in-memory etcd and a real one: tests/unit/test_etcd_behaviour.py."""

from __future__ import annotations

import asyncio
from ipaddress import IPv4Address

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.lease import EventType
from flannel.subnet.etcd.kv import EtcdKV
from flannel.subnet.etcd.manager import (
    EtcdSubnetManager,
)
from flannel.subnet.watch import Snapshot
from tests.support.etcdstores import (
    Collector,
    acquire,
    attrs,
    count_listings,
    partitionable,
    put_lease,
    setup,
)
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd



async def test_watch_resumes_from_last_revision_after_a_partition(etcd, prefix):
    async with partitionable(etcd) as (proxy, direct, via_proxy):
        sm = await setup(via_proxy, prefix)
        collector = Collector(sm, await acquire(sm, attrs()))
        await put_lease(direct, prefix, 220, "2.2.2.2")
        await collector.wait_for((EventType.ADDED, "10.3.220.0-24"))
        await proxy.cut()
        await put_lease(direct, prefix, 221, "2.2.2.3")
        await direct.delete(f"{prefix}/subnets/10.3.220.0-24".encode())
        await proxy.restore()
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"))
        # Resumed, not relisted: the events came as changes after the first snapshot.
        assert sum(isinstance(u, Snapshot) for u in collector.updates) == 1
        await collector.stop()


async def test_watch_relists_and_diffs_after_compaction(etcd, prefix):
    async with partitionable(etcd) as (proxy, direct, via_proxy):
        sm = await setup(via_proxy, prefix)
        collector = Collector(sm, await acquire(sm, attrs()))
        await put_lease(direct, prefix, 220, "2.2.2.2")
        await put_lease(direct, prefix, 222, "2.2.2.4")
        await collector.wait_for((EventType.ADDED, "10.3.222.0-24"))
        await proxy.cut()
        await direct.delete(f"{prefix}/subnets/10.3.220.0-24".encode())
        await put_lease(direct, prefix, 221, "2.2.2.3")
        revision = await direct.put(b"/compaction-marker", b"x")
        await direct.compact(revision)
        seen_before_restore = list(collector.events)
        assert seen_before_restore[-1] == (EventType.ADDED, "10.3.222.0-24"), collector.events
        await proxy.restore()
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"))
        # The diff reports only what changed: the untouched lease is not re-added.
        assert collector.events.count((EventType.ADDED, "10.3.222.0-24")) == 1
        assert sum(isinstance(u, Snapshot) for u in collector.updates) == 2
        await collector.stop()


async def test_watch_survives_an_etcd_restart(private_etcd, prefix):
    client = EtcdClient(EtcdOptions(parse_endpoints(private_etcd.endpoint), timeout=2))
    try:
        sm = await setup(client, prefix)
        own = await acquire(sm, attrs())
        collector = Collector(sm, own)

        async def watching() -> bool:
            return bool(collector.updates)
        await async_wait_until(watching, what="the first snapshot")
        await asyncio.to_thread(private_etcd.restart)
        await asyncio.to_thread(private_etcd.ctl, "put", f"{prefix}/subnets/10.3.223.0-24",
                                '{"PublicIP":"3.3.3.3","PublicIPv6":null}')
        await collector.wait_for((EventType.ADDED, "10.3.223.0-24"), timeout=20)
        # The lease survived the restart and is still renewable.
        renewed = await sm.renew_lease(own)
        assert renewed.subnet == own.subnet
        await collector.stop()
    finally:
        await client.close()


async def test_fifty_concurrent_acquirers_get_distinct_subnets(etcd, prefix):
    clients = [EtcdClient(EtcdOptions(parse_endpoints(etcd.endpoint))) for _ in range(50)]
    try:
        await clients[0].put(f"{prefix}/config".encode(), b'{"Network": "10.8.0.0/16"}')
        managers = [EtcdSubnetManager(EtcdKV(c), prefix) for c in clients]
        leases = await asyncio.gather(*(
            acquire(sm, attrs(f"192.0.2.{i + 1}")) for i, sm in enumerate(managers)))
        subnets = [lease.subnet for lease in leases]
        assert len(set(subnets)) == 50
        for i, a in enumerate(subnets):
            assert not any(a.overlaps(b) for b in subnets[i + 1:])
        stored, _ = await managers[0].list_leases()
        by_key = {x.key: x.attrs.public_ip for x in stored}
        assert {by_key[lease.key] for lease in leases} == {
            IPv4Address(f"192.0.2.{i + 1}") for i in range(50)}
    finally:
        await asyncio.gather(*(c.close() for c in clients))


DEEP_LEASE = ('{"PublicIP":"10.0.0.9","BackendType":"vxlan","BackendData":' + "[" * 1000
              + "]" * 1000 + "}").encode()
VALID_VALUE = b'{"PublicIP":"10.0.0.8","PublicIPv6":null,"BackendType":"vxlan"}'


async def test_the_acquisition_listing_is_the_first_snapshot(private_etcd, prefix, monkeypatch):
    # An etcd of its own: a write of another test between our listing and our creation
    # would (rightly) make the manager list again.
    client = EtcdClient(EtcdOptions(parse_endpoints(private_etcd.endpoint)))
    try:
        sm = await setup(client, prefix)
        await put_lease(client, prefix, 220, "2.2.2.2")
        listings = count_listings(client, monkeypatch)
        own = await acquire(sm, attrs())
        await put_lease(client, prefix, 221, "2.2.2.3")  # after our creation, before the watch
        collector = Collector(sm, own)
        try:
            snapshot = await collector.first_snapshot()
            await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
            assert len(listings) == 1  # the acquisition's only
            assert sorted(x.key for x in snapshot.leases) == sorted([own.key, "10.3.220.0-24"])
            listed, _ = await sm.list_leases()
            assert [x for x in snapshot.leases if x.key == own.key] == [
                x for x in listed if x.key == own.key]
            assert sm.status.ready and not collector.own_removed
        finally:
            await collector.stop()
    finally:
        await client.close()


async def test_compaction_between_acquisition_and_watch_relists(private_etcd, prefix):
    client = EtcdClient(EtcdOptions(parse_endpoints(private_etcd.endpoint)))
    try:
        sm = await setup(client, prefix)
        own = await acquire(sm, attrs())
        await put_lease(client, prefix, 221, "2.2.2.3")
        await client.compact(await client.put(b"/compaction-marker", b"x"))
        collector = Collector(sm, own)
        try:
            await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
            assert sum(isinstance(u, Snapshot) for u in collector.updates) == 2
            assert sm.status.compactions == 1
            assert not collector.own_removed
        finally:
            await collector.stop()
    finally:
        await client.close()
