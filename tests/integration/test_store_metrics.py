"""The etcd manager's watch and renewal counters (what /metrics and /status show) move as a
real etcd is cut off, compacted and brought back."""

from __future__ import annotations

import asyncio

import pytest

from flannel.lease import EventType
from tests.support.etcdstore import (
    Collector,
    acquire,
    attrs,
    partitionable,
    put_lease,
    setup,
)
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd


async def test_a_cut_watch_counts_a_reconnect_and_no_relist(etcd, prefix):
    async with partitionable(etcd) as (proxy, direct, via_proxy):
        sm = await setup(via_proxy, prefix)
        collector = Collector(sm, await acquire(sm, attrs()))
        await put_lease(direct, prefix, 220, "2.2.2.2")
        await collector.wait_for((EventType.ADDED, "10.3.220.0-24"))
        status = sm.status
        assert (status.watching, status.relists, status.reconnects) == (True, 1, 0)
        await proxy.cut()

        async def disconnected() -> bool:
            return not status.watching
        await async_wait_until(disconnected, 10, what="the watch to notice the cut")
        await proxy.restore()
        await put_lease(direct, prefix, 221, "2.2.2.3")
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        assert status.watching and status.reconnects >= 1
        assert (status.relists, status.compactions) == (1, 0)
        await collector.stop()


async def test_a_compacted_revision_counts_a_compaction_and_a_relist(etcd, prefix):
    async with partitionable(etcd) as (proxy, direct, via_proxy):
        sm = await setup(via_proxy, prefix)
        collector = Collector(sm, await acquire(sm, attrs()))
        await put_lease(direct, prefix, 222, "2.2.2.4")
        await collector.wait_for((EventType.ADDED, "10.3.222.0-24"))
        await proxy.cut()
        await put_lease(direct, prefix, 221, "2.2.2.3")
        revision = await direct.put(b"/compaction-marker", b"x")
        await direct.compact(revision)
        await proxy.restore()
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        assert (sm.status.compactions, sm.status.relists) == (1, 2)
        await collector.stop()


async def test_renewals_and_failed_renewals_are_counted(etcd, prefix):
    async with partitionable(etcd) as (proxy, _direct, via_proxy):
        sm = await setup(via_proxy, prefix, lease_ttl=3, renew_margin=2, renew_retry=0.2)
        lease = await acquire(sm, attrs())
        keeper = asyncio.create_task(sm.keep_lease(lease))
        try:
            def renewed(count: int):
                async def enough() -> bool:
                    return sm.status.renewals >= count
                return enough
            await async_wait_until(renewed(1), 10, what="a renewal")
            await proxy.cut()

            async def failed() -> bool:
                return sm.status.renewal_failures >= 1
            await async_wait_until(failed, 15, what="a failed renewal while etcd is cut off")
            renewals = sm.status.renewals
            await proxy.restore()
            await async_wait_until(renewed(renewals + 1), 15,
                                   what="a renewal once etcd is back")
        finally:
            keeper.cancel()
            await asyncio.gather(keeper, return_exceptions=True)
