"""The etcd subnet manager when etcd misbehaves, on the in-memory etcd and virtual time:
outages during acquisition and watch, compaction, progress notifications, a wiped store, a
restore from an older backup, our subnet taken after a reset, renewal on the hour, many
nodes acquiring at once. Each of these against a real etcd (slower: processes, proxies,
restarts) is in tests/integration/test_etcd_recovery.py and test_etcd_manager.py."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.clients.etcd import WatchBatch
from flannel.daemon import acquire_lease
from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.errors import StoreUnavailable
from flannel.subnet.etcd.manager import LeaseTaken, PreviousSubnets
from flannel.timing.clock import SYSTEM
from tests.support.etcdstores import (
    CONFIG,
    Collector,
    Renewals,
    acquire,
    attrs,
    manager,
    put_lease,
    raw_value,
    setup,
)
from tests.support.fakeetcd import FakeEtcd, FakeKV
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.virtual_time

PREFIX = "/coreos.com/network"


@pytest.fixture
async def etcd() -> AsyncIterator[FakeEtcd]:
    async with FakeEtcd(SYSTEM) as store:
        yield store


def now() -> float:
    return asyncio.get_running_loop().time()


async def own_value(kv: FakeKV, key: str) -> object:
    return await raw_value(kv, f"{PREFIX}/subnets/{key}")


async def test_renewal_happens_an_hour_before_a_day_long_lease_expires(etcd):
    sm = await setup(etcd.client(), PREFIX)  # the defaults: 24 h TTL, renewed 1 h before
    lease = await acquire(sm, attrs())
    start = now()
    renewals = Renewals(sm)
    keeping = asyncio.create_task(sm.keep_lease(lease))
    try:
        await async_wait_until(renewals.at_least(1), timeout=48 * 3600, interval=60,
                               what="a renewal")
        assert 23 * 3600 <= now() - start < 23 * 3600 + 61
        await async_wait_until(renewals.at_least(2), timeout=48 * 3600, interval=60,
                               what="a second renewal")
        assert 46 * 3600 <= now() - start < 46 * 3600 + 61
        found = await own_value(etcd.client(), lease.key)
        assert found.lease == sm.lease.etcd_lease_id
        assert etcd.leases() == {sm.lease.etcd_lease_id}  # the earlier ones revoked
    finally:
        keeping.cancel()


async def test_a_failed_renewal_is_retried_after_renew_retry(etcd, caplog):
    sm = await setup(etcd.client(), PREFIX, lease_ttl=600, renew_margin=120)
    lease = await acquire(sm, attrs())
    keeping = asyncio.create_task(sm.keep_lease(lease))
    start = now()
    try:
        await asyncio.sleep(480 - 1)
        etcd.outage("connection refused")
        await asyncio.sleep(2)
        assert sm.status.renewal_failures == 1
        assert "Error renewing lease (trying again in 1 min)" in caplog.text
        etcd.outage(None)
        await async_wait_until(Renewals(sm).at_least(1), timeout=120, interval=1,
                               what="the renewal retried")
        assert 480 + 60 <= now() - start < 480 + 62
        assert sm.status.renewals == 1
    finally:
        keeping.cancel()


async def test_a_lease_nobody_renews_expires_after_its_ttl(etcd):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        other = await setup(etcd.client(), PREFIX, lease_ttl=30)
        theirs = await acquire(other, attrs("5.6.7.8"))
        added = now()
        await collector.wait_for((EventType.ADDED, theirs.key))
        await collector.wait_for((EventType.REMOVED, theirs.key), timeout=60)
        assert 30 <= now() - added < 31
    finally:
        await collector.stop()


async def test_acquisition_during_an_outage_is_retried_until_etcd_answers(etcd, caplog):
    sm = await setup(etcd.client(), PREFIX)
    config = await sm.get_network_config()
    etcd.outage("connection refused")
    with pytest.raises(StoreUnavailable, match="no etcd endpoint answered"):
        await sm.acquire_lease(config, attrs())
    caplog.set_level(logging.INFO, logger="flanneld")
    acquiring = asyncio.create_task(acquire_lease(sm, config, attrs(), asyncio.Event()))
    await asyncio.sleep(30)
    assert not acquiring.done()
    etcd.outage(None)
    lease = await asyncio.wait_for(acquiring, 60)
    assert lease is not None and lease.subnet.subnet_of(IPv4Network("10.3.0.0/16"))
    messages = [r.getMessage() for r in caplog.records if r.name == "flanneld"]
    assert messages[0].startswith("Couldn't acquire a lease: no etcd endpoint answered")
    assert messages[-1].startswith("Couldn't acquire a lease: succeeded after")


async def test_two_managers_acquiring_at_once_get_different_subnets(etcd):
    """Both list the same free subnets and want the same one (their previous one): one
    creation wins, the loser chooses again from the failed transaction's listing."""
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    previous = PreviousSubnets(IPv4Network("10.3.1.0/24"))
    first = await setup(etcd.client(), PREFIX, config, previous=previous)
    second = manager(etcd.client(), PREFIX, previous=previous)
    leases = await asyncio.gather(acquire(first, attrs("1.1.1.1")),
                                  acquire(second, attrs("1.1.1.2")))
    assert {lease.subnet for lease in leases} == {IPv4Network("10.3.1.0/24"),
                                                  IPv4Network("10.3.2.0/24")}
    creations = [sm.client.calls.count("create") for sm in (first, second)]
    listings = [sm.client.calls.count("get_prefix") for sm in (first, second)]
    assert sorted(creations) == [1, 2] and listings == [1, 1]
    assert etcd.leases() == {lease.etcd_lease_id for lease in leases}


async def test_many_managers_racing_for_few_subnets_get_distinct_ones(etcd):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.40.0" }'
    await etcd.client().put(f"{PREFIX}/config".encode(), config.encode())
    managers = [manager(etcd.client(), PREFIX) for _ in range(30)]
    leases = await asyncio.gather(*(acquire(sm, attrs(f"192.0.2.{i + 1}"))
                                    for i, sm in enumerate(managers)))
    assert len({lease.subnet for lease in leases}) == 30
    stored, _ = await managers[0].list_leases()
    assert {x.key: x.attrs.public_ip for x in stored} == {
        lease.key: IPv4Address(f"192.0.2.{i + 1}") for i, lease in enumerate(leases)}
    assert etcd.leases() == {lease.etcd_lease_id for lease in leases}


async def test_the_watch_resumes_from_its_revision_after_an_outage(etcd):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    collector = Collector(sm, await acquire(sm, attrs()))
    await put_lease(kv, PREFIX, 220, "2.2.2.2")
    await collector.wait_for((EventType.ADDED, "10.3.220.0-24"))
    etcd.break_watches("connection reset")
    await put_lease(kv, PREFIX, 221, "2.2.2.3")  # while the manager's watch is broken
    await kv.delete(f"{PREFIX}/subnets/10.3.220.0-24".encode())
    await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
    await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"))
    assert collector.snapshots() == 1  # resumed, not relisted
    assert sm.status.reconnects == 1
    await collector.stop()


async def test_the_watch_relists_and_diffs_after_compaction(etcd):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    collector = Collector(sm, await acquire(sm, attrs()))
    await put_lease(kv, PREFIX, 220, "2.2.2.2")
    await put_lease(kv, PREFIX, 222, "2.2.2.4")
    await collector.wait_for((EventType.ADDED, "10.3.222.0-24"))
    etcd.break_watches("connection reset")
    await kv.delete(f"{PREFIX}/subnets/10.3.220.0-24".encode())
    await put_lease(kv, PREFIX, 221, "2.2.2.3")
    etcd.compact()
    await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
    await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"))
    assert collector.events.count((EventType.ADDED, "10.3.222.0-24")) == 1
    assert collector.snapshots() == 2
    assert sm.status.compactions == 1
    await collector.stop()


async def test_compaction_between_acquisition_and_watch_relists(etcd):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    own = await acquire(sm, attrs())
    await put_lease(kv, PREFIX, 221, "2.2.2.3")
    etcd.compact(await kv.put(b"/compaction-marker", b"x"))
    collector = Collector(sm, own)
    try:
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        assert collector.snapshots() == 2
        assert sm.status.compactions == 1
        assert not collector.own_removed
    finally:
        await collector.stop()


async def test_the_acquisition_listing_is_the_first_snapshot(etcd):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    await put_lease(kv, PREFIX, 220, "2.2.2.2")
    own = await acquire(sm, attrs())
    await put_lease(kv, PREFIX, 221, "2.2.2.3")  # after our creation, before the watch
    listed_before = kv.calls.count("get_prefix")
    collector = Collector(sm, own)
    try:
        snapshot = await collector.first_snapshot()
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        assert kv.calls.count("get_prefix") == listed_before  # no listing of its own
        assert sorted(x.key for x in snapshot.leases) == sorted([own.key, "10.3.220.0-24"])
        assert sm.status.ready and not collector.own_removed
    finally:
        await collector.stop()


async def test_a_progress_notification_moves_the_resume_point(etcd):
    """After a progress notification the watch resumes from the revision it reported, so
    history compacted up to there costs no relist."""
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    collector = Collector(sm, await acquire(sm, attrs()))
    await collector.first_snapshot()
    await kv.put(b"/elsewhere", b"x")  # revisions move, nothing under the prefix
    await kv.put(b"/elsewhere", b"y")
    etcd.notify_progress()
    await asyncio.sleep(1)
    etcd.compact()
    etcd.break_watches()
    await put_lease(kv, PREFIX, 221, "2.2.2.3")
    await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
    assert sm.status.compactions == 0 and collector.snapshots() == 1
    await collector.stop()


async def test_a_progress_revision_ahead_of_the_store_is_not_taken(etcd, caplog):
    kv = etcd.client()
    sm = await setup(kv, PREFIX)
    collector = Collector(sm, await acquire(sm, attrs()))
    await collector.first_snapshot()
    stream = next(iter(etcd._streams))
    stream.push(WatchBatch([], etcd.revision + 100, progress=True))
    await async_wait_until(lambda: _async(sm.status.reconnects == 1), what="the stream "
                           "dropped")
    assert "ahead of the store's" in caplog.text
    await put_lease(kv, PREFIX, 221, "2.2.2.3")
    await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
    await collector.stop()


async def _async(value: bool) -> bool:
    return value


async def test_a_wiped_etcd_gets_our_lease_back_and_a_fresh_view(etcd, caplog):
    kv, other = etcd.client(), etcd.client()
    sm = await setup(kv, PREFIX, check_interval=5, reset_grace=30)
    mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"), backend_type="vxlan",
                      backend_data='{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}')
    own = await acquire(sm, mine)
    value = (await own_value(kv, own.key)).value
    await put_lease(other, PREFIX, 220, "2.2.2.2")  # a peer that never comes back
    collector = Collector(sm, own)
    try:
        await collector.wait_for((EventType.ADDED, "10.3.220.0-24"))
        caplog.set_level(logging.INFO, logger="flannel.subnet.etcd.manager")
        etcd.wipe()
        wiped = now()
        await other.put(f"{PREFIX}/config".encode(), CONFIG.encode())

        async def back() -> bool:
            found = await own_value(other, own.key)
            return found is not None and found.value == value
        await async_wait_until(back, timeout=60, what="our lease re-created")
        assert now() - wiped <= 5 + 1  # found by the next check
        assert "etcd was wiped or restored from an older backup: the etcd cluster ID " \
               "changed" in caplog.text
        found = await own_value(other, own.key)
        assert found.lease == sm.lease.etcd_lease_id != own.etcd_lease_id
        assert await other.time_to_live(found.lease) > 86000
        assert not collector.own_removed
        assert collector.ready_at_snapshots[:2] == [True, False]
        assert sm.status.ready
        await put_lease(other, PREFIX, 221, "2.2.2.3")
        await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
        # The peer that did not come back keeps its routes for the grace, then goes.
        assert (EventType.REMOVED, "10.3.220.0-24") not in collector.events
        await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"), timeout=60)
        assert 30 <= now() - wiped <= 30 + 5 + 1
        assert sm.status.ready
    finally:
        await collector.stop()


async def test_renewal_renews_the_lease_recreated_after_a_wipe(etcd):
    kv, other = etcd.client(), etcd.client()
    sm = await setup(kv, PREFIX, lease_ttl=60, check_interval=5, renew_margin=30,
                     renew_retry=5)
    own = await acquire(sm, attrs())
    keeping = asyncio.create_task(sm.keep_lease(own))
    collector = Collector(sm, own)
    try:
        await collector.first_snapshot()
        etcd.wipe()
        await other.put(f"{PREFIX}/config".encode(), CONFIG.encode())

        async def recovered() -> bool:
            return len(collector.ready_at_snapshots) >= 2 and sm.status.ready
        await async_wait_until(recovered, timeout=60, what="the recovery")
        renewed = Renewals(sm)
        await async_wait_until(renewed.at_least(2), timeout=120, what="two renewals")
        found = await own_value(other, own.key)
        assert found is not None and found.lease == sm.lease.etcd_lease_id
        assert 30 <= await other.time_to_live(found.lease) <= 60
    finally:
        keeping.cancel()
        await collector.stop()


async def test_a_restore_from_an_older_backup_is_detected_and_repaired(etcd, caplog):
    kv, other = etcd.client(), etcd.client()
    sm = await setup(kv, PREFIX, check_interval=5)
    own = await acquire(sm, attrs())
    backup = etcd.snapshot()
    renewed = await sm.renew_lease(own)  # the backup's etcd lease is revoked now
    collector = Collector(sm, renewed)
    try:
        await collector.first_snapshot()
        caplog.set_level(logging.INFO, logger="flannel.subnet.etcd.manager")
        etcd.restore(backup)

        async def repaired() -> bool:
            found = await own_value(other, own.key)
            return found is not None and found.lease == sm.lease.etcd_lease_id \
                != renewed.etcd_lease_id
        await async_wait_until(repaired, timeout=30, what="our lease bound to a new lease")
        assert "the etcd revision went back from" in caplog.text
        assert not collector.own_removed
    finally:
        await collector.stop()


async def test_our_subnet_taken_after_a_reset_is_fatal(etcd):
    kv, other = etcd.client(), etcd.client()
    sm = await setup(kv, PREFIX, check_interval=5)
    own = await acquire(sm, attrs())
    failure: list[BaseException] = []
    updates: list[object] = []

    async def watch() -> None:
        try:
            async for update in sm.watch_leases(max_backoff=0.5):
                updates.append(update)
        except LeaseTaken as err:
            failure.append(err)
    task = asyncio.create_task(watch())
    try:
        await async_wait_until(lambda: _async(bool(updates)), what="the first snapshot")
        etcd.wipe()
        await other.put(f"{PREFIX}/config".encode(), CONFIG.encode())
        thief = manager(other, PREFIX, previous=PreviousSubnets(own.subnet))
        assert (await acquire(thief, attrs("5.5.5.5"))).subnet == own.subnet
        await asyncio.wait_for(task, 60)
    finally:
        task.cancel()
    assert str(failure[0]).startswith("etcd was wiped or restored (the etcd cluster ID "
                                      "changed")
    assert str(failure[0]).endswith(
        f"and this node's subnet {own.key} is now held by {own.key} of the node at 5.5.5.5; "
        "this node must not keep using it: restart flanneld to acquire a new subnet")


async def test_a_wipe_that_keeps_the_revision_shows_in_our_record(etcd):
    """The same cluster ID and a revision that caught up: only the record under our key,
    naming another node, tells (as after a restore that was written again)."""
    kv, other = etcd.client(), etcd.client()
    sm = await setup(kv, PREFIX, check_interval=5)
    own = await acquire(sm, attrs())
    empty = FakeEtcd(SYSTEM).snapshot()
    collector = Collector(sm, own)
    try:
        await collector.first_snapshot()
        etcd.restore(empty)  # the same cluster, empty again
        await other.put(f"{PREFIX}/config".encode(), CONFIG.encode())
        for i in range(10):
            await other.put(b"/filler", b"%d" % i)
        await other.put(f"{PREFIX}/subnets/{own.key}".encode(),
                        b'{"PublicIP":"5.5.5.5","PublicIPv6":null}')
        await async_wait_until(lambda: _async(collector.task.done()), timeout=30,
                               what="the watch ending")
        with pytest.raises(LeaseTaken, match="now names another node"):
            collector.task.result()
    finally:
        collector.task.cancel()
        await asyncio.gather(collector.task, return_exceptions=True)
