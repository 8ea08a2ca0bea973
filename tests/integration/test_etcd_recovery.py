"""The etcd subnet manager when the store misbehaves, against real etcd servers: paused during
acquisition, refusing a TTL, wiped, or restored from an older snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.daemon import acquire_lease
from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.etcd.manager import EtcdSubnetManager, LeaseTaken, PreviousSubnets
from tests.integration.test_etcd_manager import (
    CONFIG,
    Collector,
    Renewals,
    acquire,
    attrs,
    put_lease,
    setup,
)
from tests.support.proxy import CuttableProxy
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd


@contextlib.asynccontextmanager
async def via_proxy(etcd):
    """A client behind a proxy the test can pause or cut, with a 2 s request deadline."""
    proxy = CuttableProxy(etcd.client_port)
    await proxy.start()
    client = EtcdClient(EtcdOptions(parse_endpoints(proxy.endpoint), timeout=2))
    try:
        yield proxy, client
    finally:
        proxy.resume()
        await proxy.cut()
        await client.close()


@contextlib.asynccontextmanager
async def direct(etcd):
    client = EtcdClient(EtcdOptions(parse_endpoints(etcd.endpoint), timeout=2))
    try:
        yield client
    finally:
        await client.close()


async def test_acquisition_while_etcd_is_paused_is_retried_until_it_answers(
        etcd, prefix, caplog):
    async with via_proxy(etcd) as (proxy, client):
        sm = await setup(client, prefix)
        config = await sm.get_network_config()
        proxy.pause()
        with pytest.raises(StoreUnavailable, match="no etcd endpoint answered"):
            await sm.acquire_lease(config, attrs())
        caplog.set_level(logging.INFO, logger="flanneld")
        stop = asyncio.Event()
        acquiring = asyncio.create_task(acquire_lease(sm, config, attrs(), stop))

        async def failed_once() -> bool:
            return "Couldn't acquire a lease" in caplog.text
        await async_wait_until(failed_once, timeout=10, what="a failed attempt")
        assert not acquiring.done()
        proxy.resume()
        lease = await asyncio.wait_for(acquiring, 30)
        assert lease is not None and lease.subnet.subnet_of(IPv4Network("10.3.0.0/16"))
        messages = [r.getMessage() for r in caplog.records if r.name == "flanneld"]
        assert messages[0].startswith("Couldn't acquire a lease: no etcd endpoint answered")
        assert messages[-1].startswith("Couldn't acquire a lease: succeeded after")
        assert "Traceback" not in caplog.text


async def test_a_ttl_etcd_refuses_names_the_flag(client, prefix):
    sm = await setup(client, prefix, lease_ttl=10**10)
    with pytest.raises(StoreError) as failure:
        await acquire(sm, attrs())
    assert str(failure.value) == (
        "etcd refuses a subnet lease TTL of 10000000000 s: set --subnet-lease-ttl between 1s "
        "and 9000000000s (the default is 24h)")
    assert (await sm.list_leases())[0] == []


async def own_value(client: EtcdClient, sm: EtcdSubnetManager, key: str):
    kv, _ = await client.get(sm.lease_key(key))
    return kv


async def test_a_wiped_etcd_gets_our_lease_back_and_a_fresh_view(private_etcd, prefix, caplog):
    async with direct(private_etcd) as client, direct(private_etcd) as other:
        sm = await setup(client, prefix, check_interval=0.5, reset_grace=3)
        mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"), backend_type="vxlan",
                          backend_data='{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}')
        own = await acquire(sm, mine)
        value = (await own_value(client, sm, own.key)).value
        await put_lease(other, prefix, 220, "2.2.2.2")  # a peer that never comes back
        collector = Collector(sm, own)
        try:
            await collector.wait_for((EventType.ADDED, "10.3.220.0-24"))
            caplog.set_level(logging.INFO, logger="flannel.subnet.etcd.manager")
            await asyncio.to_thread(private_etcd.wipe)
            await other.put(f"{prefix}/config".encode(), CONFIG.encode())

            async def back() -> bool:
                kv = await own_value(other, sm, own.key)
                return kv is not None and kv.value == value
            await async_wait_until(back, timeout=20, what="our lease re-created")
            assert "etcd was wiped or restored from an older backup: the etcd revision went " \
                   "back from" in caplog.text
            kv = await own_value(other, sm, own.key)
            assert kv.lease == sm._own.etcd_lease_id != own.etcd_lease_id
            assert await other.time_to_live(kv.lease) > 86000
            assert not collector.own_removed
            # Not ready from the detection until the fresh view was applied, ready after.
            assert collector.ready_at_snapshots[:2] == [True, False]
            assert sm.status.ready
            # A node that joins after the reset is seen (the watch follows the new history).
            await put_lease(other, prefix, 221, "2.2.2.3")
            await collector.wait_for((EventType.ADDED, "10.3.221.0-24"))
            # The peer that did not come back keeps its routes for the grace, then goes.
            assert (EventType.REMOVED, "10.3.220.0-24") not in collector.events
            await collector.wait_for((EventType.REMOVED, "10.3.220.0-24"), timeout=10)
            assert sm.status.ready
        finally:
            await collector.stop()


async def test_renewal_renews_the_lease_recreated_after_a_wipe(private_etcd, prefix):
    async with direct(private_etcd) as client, direct(private_etcd) as other:
        sm = await setup(client, prefix, lease_ttl=6, check_interval=0.5, renew_margin=3,
                         renew_retry=0.5)
        own = await acquire(sm, attrs())
        keeping = asyncio.create_task(sm.keep_lease(own))
        collector = Collector(sm, own)
        try:
            async def listed() -> bool:
                return bool(collector.updates)
            await async_wait_until(listed, what="the first snapshot")
            await asyncio.to_thread(private_etcd.wipe)
            await other.put(f"{prefix}/config".encode(), CONFIG.encode())

            async def recovered() -> bool:
                return len(collector.ready_at_snapshots) >= 2 and sm.status.ready
            await async_wait_until(recovered, timeout=20, what="the recovery")
            renewed = Renewals(sm)
            await async_wait_until(renewed.at_least(2), timeout=20, what="two renewals")
            kv = await own_value(other, sm, own.key)
            # (the last or, if one more renewal just happened, the one before)
            assert kv is not None and kv.lease in {r.etcd_lease_id for r in renewed.leases[-2:]}
            assert 0 < await other.time_to_live(kv.lease) <= 6
        finally:
            keeping.cancel()
            await collector.stop()


async def test_a_restore_from_an_older_snapshot_is_detected_and_repaired(
        private_etcd, prefix, tmp_path, caplog):
    backup = tmp_path / "backup.db"
    async with direct(private_etcd) as client, direct(private_etcd) as other:
        sm = await setup(client, prefix, check_interval=0.5)
        own = await acquire(sm, attrs())
        await asyncio.to_thread(private_etcd.ctl, "snapshot", "save", str(backup))
        renewed = await sm.renew_lease(own)  # the backup's etcd lease is revoked now
        collector = Collector(sm, renewed)
        try:
            async def listed() -> bool:
                return bool(collector.updates)
            await async_wait_until(listed, what="the first snapshot")
            caplog.set_level(logging.INFO, logger="flannel.subnet.etcd.manager")
            await asyncio.to_thread(private_etcd.restore, backup)

            async def repaired() -> bool:
                kv = await own_value(other, sm, own.key)
                return kv is not None and kv.lease == sm._own.etcd_lease_id != renewed.etcd_lease_id
            await async_wait_until(repaired, timeout=15, what="our lease bound to a new lease")
            assert "the etcd revision went back from" in caplog.text
            assert not collector.own_removed
        finally:
            await collector.stop()


async def test_our_subnet_taken_after_a_reset_is_fatal(private_etcd, prefix):
    async with via_proxy(private_etcd) as (proxy, client), direct(private_etcd) as other:
        sm = await setup(client, prefix, check_interval=0.5)
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
            async def watching() -> bool:
                return bool(updates)
            await async_wait_until(watching, what="the first snapshot")
            await proxy.cut()  # our node does not see the reset until another took the subnet
            await asyncio.to_thread(private_etcd.wipe)
            await other.put(f"{prefix}/config".encode(), CONFIG.encode())
            thief = EtcdSubnetManager(other, prefix, previous=PreviousSubnets(own.subnet))
            assert (await acquire(thief, attrs("5.5.5.5"))).subnet == own.subnet
            await proxy.restore()
            await asyncio.wait_for(task, 20)
        finally:
            task.cancel()
        # Revision 3 again: the wipe shows in the record under our key, not in the revision.
        assert str(failure[0]).startswith(
            f"etcd was wiped or restored (this node's lease {own.key} now names another node "
            "(5.5.5.5))")
        assert str(failure[0]).endswith(
            f"and this node's subnet {own.key} is now held by {own.key} of the node at 5.5.5.5; "
            "this node must not keep using it: restart flanneld to acquire a new subnet")


async def test_our_key_deleted_on_purpose_is_not_recreated(client, prefix):
    """Upstream behaviour: deleting a node's key stops it; the periodic check leaves it."""
    sm = await setup(client, prefix, check_interval=0.2)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        async def listed() -> bool:
            return bool(collector.updates)
        await async_wait_until(listed, what="the first snapshot")
        await client.delete(sm.lease_key(own.key))

        async def flagged() -> bool:
            return collector.own_removed
        await async_wait_until(flagged, what="own lease removal")
        await asyncio.sleep(1.0)  # five checks' worth of time in which nothing may re-create it
        assert await own_value(client, sm, own.key) is None
    finally:
        await collector.stop()
