"""The etcd subnet manager's behaviour, each test run twice (``stores``): against the
in-memory etcd on virtual time (tests/support/fakeetcd.py, the fast lane) and against a real
etcd (``[etcd]``), so that the fake cannot drift from etcd. Acquisition, reuse, reservations,
renewal, the lease watch, hostile records. What needs the real wire (TLS, authentication,
proxies, restarts, a hostile gateway) stays in tests/integration/."""

from __future__ import annotations

import asyncio
import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest

from flannel.clients.etcd import Code
from flannel.config import ConfigError
from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.errors import OwnLeaseRevoked, StoreError
from flannel.subnet.etcd.kv import Compacted
from flannel.subnet.etcd.manager import AcquireError, ConfigNotFound, PreviousSubnets
from tests.support.etcdstores import (
    CONFIG,
    Collector,
    Renewals,
    acquire,
    as_kv,
    attrs,
    count_listings,
    manager,
    other_client,
    put_lease,
    raw_value,
    setup,
)
from tests.support.fakeetcd import MIN_TTL
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.stores

DEEP_LEASE = ('{"PublicIP":"10.0.0.9","BackendType":"vxlan","BackendData":' + "[" * 1000
              + "]" * 1000 + "}").encode()
VALID_VALUE = b'{"PublicIP":"10.0.0.8","PublicIPv6":null,"BackendType":"vxlan"}'


async def test_config_not_found_gives_the_v3_hint(kv, prefix):
    sm = manager(kv, prefix)
    with pytest.raises(ConfigNotFound, match="Did you create your config using etcdv3 API"):
        await sm.get_network_config()


@pytest.mark.parametrize(("config", "message"), [
    ('{"Network": "10.3.0.0/16"', "not valid JSON"),
    ('{"Network": "10.3.0.0/29"}', "network is too small"),
    ('{"Network": "10.3.0.0/16", "SubnetMin": "10.9.0.0"}', "SubnetMin is not in the range"),
])
async def test_bad_config_is_a_clear_error(kv, prefix, config, message):
    sm = await setup(kv, prefix, config)
    with pytest.raises(ConfigError, match=message):
        await acquire(sm, attrs())


async def test_first_acquisition_writes_go_compatible_key_and_value(kv, prefix):
    sm = await setup(kv, prefix)
    for third in (1, 2, 4, 5, 31):
        await kv.put(f"{prefix}/subnets/10.3.{third}.0-24".encode(),
                     b'{"PublicIP":"9.9.9.%d","PublicIPv6":null}' % third)
    lease = await acquire(sm, attrs())
    assert lease.subnet.prefixlen == 24
    assert IPv4Address("10.3.1.0") <= lease.subnet.network_address <= IPv4Address("10.3.25.0")
    assert lease.subnet.network_address.packed[2] not in (1, 2, 4, 5)
    found = await raw_value(kv, f"{prefix}/subnets/{lease.key}")
    assert found.value == b'{"PublicIP":"1.2.3.4","PublicIPv6":null}'
    assert found.lease == lease.etcd_lease_id != 0
    ttl = await kv.time_to_live(found.lease)
    assert 86300 < ttl <= 86400


async def test_same_public_ip_reuses_the_lease(kv, prefix):
    sm = await setup(kv, prefix)
    first = await acquire(sm, attrs())
    second = await acquire(sm, attrs())
    assert second.subnet == first.subnet
    leases, _ = await sm.list_leases()
    assert [x.key for x in leases] == [first.key]


async def test_reuse_by_public_ip_finds_an_escaped_ip_and_ignores_the_ip_elsewhere(
        kv, prefix):
    sm = await setup(kv, prefix)
    # Another node whose backend data happens to hold our address: not ours.
    await kv.put(f"{prefix}/subnets/10.3.40.0-24".encode(),
                 b'{"PublicIP":"5.6.7.8","BackendData":{"Note":"1.2.3.4"}}')
    # Ours, written with JSON escapes (as any JSON encoder may): still ours.
    await kv.put(f"{prefix}/subnets/10.3.21.0-24".encode(),
                 b'{"PublicIP":"\\u0031.2.3.4","PublicIPv6":null}')
    lease = await acquire(sm, attrs())
    assert lease.key == "10.3.21.0-24"  # inside SubnetMin..SubnetMax: reusable


async def test_previous_subnet_is_reused_when_compatible(kv, prefix):
    sm = await setup(kv, prefix,
                     previous=PreviousSubnets(IPv4Network("10.3.6.0/24")))
    assert (await acquire(sm, attrs())).subnet == IPv4Network("10.3.6.0/24")


async def test_previous_subnet_outside_the_network_is_not_reused(kv, prefix):
    sm = await setup(kv, prefix, previous=PreviousSubnets(IPv4Network("10.4.1.0/24")))
    assert (await acquire(sm, attrs())).subnet != IPv4Network("10.4.1.0/24")


async def test_previous_subnet_taken_by_another_node_is_not_reused(kv, prefix):
    sm = await setup(kv, prefix, previous=PreviousSubnets(IPv4Network("10.3.6.0/24")))
    await kv.put(f"{prefix}/subnets/10.3.6.0-24".encode(),
                 b'{"PublicIP":"5.5.5.5","PublicIPv6":null}')
    assert (await acquire(sm, attrs())).subnet != IPv4Network("10.3.6.0/24")


async def test_config_change_forces_a_new_lease_and_drops_the_old(kv, prefix):
    sm = await setup(kv, prefix)
    old = await acquire(sm, attrs())
    await kv.put(f"{prefix}/config".encode(), b'{ "Network": "10.4.0.0/16" }')
    new = await acquire(sm, attrs())
    assert new.subnet.subnet_of(IPv4Network("10.4.0.0/16"))
    assert await raw_value(kv, f"{prefix}/subnets/{old.key}") is None


async def test_reservation_is_honoured_and_never_gets_a_ttl(kv, prefix):
    sm = await setup(kv, prefix)
    key = f"{prefix}/subnets/10.3.7.0-24"
    await kv.put(key.encode(), b'{"PublicIP":"1.2.3.4","PublicIPv6":null}')
    lease = await acquire(sm, attrs())
    assert lease.subnet == IPv4Network("10.3.7.0/24") and lease.is_reservation
    renewed = await sm.renew_lease(lease)
    found = await raw_value(kv, key)
    assert found.lease == 0 and renewed.expiration is None


async def test_reservation_of_another_node_is_never_allocated(kv, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(kv, prefix, config)
    await kv.put(f"{prefix}/subnets/10.3.1.0-24".encode(),
                 b'{"PublicIP":"7.7.7.7","PublicIPv6":null}')
    assert (await acquire(sm, attrs())).subnet == IPv4Network("10.3.2.0/24")


async def test_out_of_subnets_is_a_clear_error(kv, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(kv, prefix, config)
    await acquire(sm, attrs("1.1.1.1"))
    await acquire(sm, attrs("1.1.1.2"))
    with pytest.raises(AcquireError, match=r"out of subnets.*10\.3\.1\.0 to 10\.3\.2\.0"):
        await acquire(sm, attrs("1.1.1.3"))


async def test_acquisitions_leave_no_unbound_etcd_lease(kv, prefix):
    # Whatever the outcome, the only etcd lease an acquisition leaves behind is the one
    # its key is bound to.
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(kv, prefix, config)
    await kv.put(f"{prefix}/subnets/10.3.2.0-24".encode(),
                 b'{"PublicIP":"5.5.5.5","PublicIPv6":null}')
    before = await kv.leases()
    lease = await acquire(sm, attrs("1.1.1.1"))
    assert await kv.leases() - before == {lease.etcd_lease_id}
    before = await kv.leases()
    with pytest.raises(AcquireError, match="out of subnets"):
        await acquire(sm, attrs("1.1.1.2"))
    assert await kv.leases() == before
    assert (await acquire(sm, attrs("5.5.5.5"))).is_reservation
    assert await kv.leases() == before


async def test_renewal_keeps_the_value_byte_identical(kv, prefix):
    sm = await setup(kv, prefix, lease_ttl=600)
    mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"), backend_type="vxlan",
                      backend_data='{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}')
    lease = await acquire(sm, mine)
    before = await raw_value(kv, f"{prefix}/subnets/{lease.key}")
    renewed = await sm.renew_lease(lease)
    after = await raw_value(kv, f"{prefix}/subnets/{lease.key}")
    assert after.value == before.value
    assert after.lease == renewed.etcd_lease_id != lease.etcd_lease_id
    assert 590 < await kv.time_to_live(after.lease) <= 600
    assert await kv.time_to_live(lease.etcd_lease_id) == -1  # old one revoked


async def test_keep_lease_renews_before_expiry(kv, prefix):
    sm = await setup(kv, prefix, lease_ttl=3, renew_margin=2)
    lease = await acquire(sm, attrs())
    renewed = Renewals(sm)
    task = asyncio.create_task(sm.keep_lease(lease))
    try:
        await async_wait_until(renewed.at_least(2), timeout=10, what="two renewals")
        found = await raw_value(kv, f"{prefix}/subnets/{lease.key}")
        assert found is not None and found.lease == sm.lease.etcd_lease_id
        assert found.lease in {r.etcd_lease_id for r in renewed.leases[-2:]}
    finally:
        task.cancel()


async def test_keep_lease_stops_rather_than_recreate_a_deleted_lease(kv, prefix):
    sm = await setup(kv, prefix, lease_ttl=3, renew_margin=2)
    lease = await acquire(sm, attrs())
    collector = Collector(sm, lease)
    try:
        async def listed() -> bool:
            return bool(collector.updates)
        await async_wait_until(listed, what="the first snapshot")
        await kv.delete(f"{prefix}/subnets/{lease.key}".encode())
        with pytest.raises(OwnLeaseRevoked, match=f"lease {lease.key} was deleted from etcd"):
            await asyncio.wait_for(sm.keep_lease(lease), 10)
        assert await raw_value(kv, f"{prefix}/subnets/{lease.key}") is None
    finally:
        await collector.stop()


async def test_foreign_entries_are_skipped_not_fatal(kv, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.8.0", "SubnetMax": "10.3.10.0" }'
    sm = await setup(kv, prefix, config)
    await kv.put(f"{prefix}/subnets/10.3.9.0-24".encode(), b"this is not json")
    await kv.put(f"{prefix}/subnets/not-a-subnet".encode(),
                 b'{"PublicIP":"9.9.9.9","PublicIPv6":null}')
    await kv.put(f"{prefix}/subnets/10.3.8.0-24".encode(),
                 b'{"PublicIP":"8.8.8.8","PublicIPv6":null}')
    leases, _ = await sm.list_leases()
    assert [x.key for x in leases] == ["10.3.8.0-24"]
    # A key with an unreadable value still holds its subnet: the only free one is 10.3.10.0.
    lease = await acquire(sm, attrs())
    assert lease.subnet == IPv4Network("10.3.10.0/24")
    collector = Collector(sm, lease)
    try:
        await kv.put(f"{prefix}/subnets/10.3.200.0-24".encode(), b"[garbage")
        await kv.put(f"{prefix}/subnets/10.3.201.0-24".encode(),
                     b'{"PublicIP":"6.6.6.6","PublicIPv6":null}')
        await collector.wait_for((EventType.ADDED, "10.3.201.0-24"))
        assert (EventType.ADDED, "10.3.200.0-24") not in collector.events
    finally:
        await collector.stop()


async def test_other_nodes_appear_and_expire(kv, prefix):
    sm = await setup(kv, prefix)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        other = await setup(kv, prefix, lease_ttl=2)
        theirs = await acquire(other, attrs("5.6.7.8"))
        await collector.wait_for((EventType.ADDED, theirs.key))
        # Nobody renews it: etcd expires it and the watch reports the removal.
        await collector.wait_for((EventType.REMOVED, theirs.key), timeout=15)
        assert all(key != own.key for _, key in collector.events)
        removed = [e for e in collector.watcher.leases if e.key == theirs.key]
        assert removed == []
    finally:
        await collector.stop()


async def test_own_lease_deletion_is_reported(kv, prefix):
    sm = await setup(kv, prefix)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        async def snapshot_seen() -> bool:
            return bool(collector.updates)
        await async_wait_until(snapshot_seen)
        await kv.delete(f"{prefix}/subnets/{own.key}".encode())

        async def flagged() -> bool:
            return collector.own_removed
        await async_wait_until(flagged, what="own lease removal")
    finally:
        await collector.stop()


async def test_a_bug_in_the_watch_stream_ends_the_lease_watch(kv, prefix, monkeypatch):
    sm = await setup(kv, prefix)
    updates = sm.watch_leases(max_backoff=0.5)
    try:
        await asyncio.wait_for(anext(updates), 10)

        async def broken_watch(*args, **kwargs):
            raise TypeError("'NoneType' object is not subscriptable")
            yield  # an async generator, like the store's watch
        monkeypatch.setattr(sm.client, "watch", broken_watch)
        await kv.put(f"{prefix}/subnets/10.3.200.0-24".encode(), b"{}")
        # Raised to the consumer (the daemon's supervised lease watch), not a silent stall.
        with pytest.raises(TypeError, match="not subscriptable"):
            await asyncio.wait_for(anext(updates), 10)
    finally:
        await updates.aclose()


async def test_dual_stack_lease_key_and_value(kv, prefix):
    config = json.dumps({"Network": "10.3.0.0/16", "EnableIPv6": True,
                         "IPv6Network": "fd00:10::/56"})
    sm = await setup(kv, prefix, config)
    mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"),
                      public_ipv6=IPv6Address("fd00::4"))
    lease = await acquire(sm, mine)
    assert lease.ipv6_subnet is not None and lease.ipv6_subnet.prefixlen == 64
    assert "&fd00:10:0:" in lease.key
    found = await raw_value(kv, f"{prefix}/subnets/{lease.key}")
    assert found.value == b'{"PublicIP":"1.2.3.4","PublicIPv6":"fd00::4"}'


async def test_ipv6_only_lease_key_is_go_compatible(kv, prefix):
    config = json.dumps({"EnableIPv4": False, "EnableIPv6": True,
                         "IPv6Network": "fc00::/48"})
    sm = await setup(kv, prefix, config)
    lease = await acquire(sm, LeaseAttrs(public_ipv6=IPv6Address("fd00::4")))
    assert lease.subnet is None and lease.ipv6_subnet.prefixlen == 64
    assert lease.key.startswith("0.0.0.0-0&fc00:0:0:")
    stored, _ = await sm.list_leases()
    assert [(x.subnet, x.ipv6_subnet) for x in stored] == [(None, lease.ipv6_subnet)]
    assert (await acquire(sm, LeaseAttrs(public_ipv6=IPv6Address("fd00::5")))
            ).ipv6_subnet != lease.ipv6_subnet
    # The same IPv6-only node restarting gets its subnet back.
    assert (await acquire(sm, LeaseAttrs(public_ipv6=IPv6Address("fd00::4")))
            ).ipv6_subnet == lease.ipv6_subnet


async def test_hostile_leases_are_skipped_by_list_acquisition_and_watch(kv, prefix, caplog):
    sm = await setup(kv, prefix)
    hostile = {"10.3.30.0-24": DEEP_LEASE, "192.168.111.0-25": VALID_VALUE,
               "0.0.0.0-1": VALID_VALUE}
    for key, value in hostile.items():
        await kv.put(f"{prefix}/subnets/{key}".encode(), value)
    leases, _ = await sm.list_leases()
    assert sorted(x.key for x in leases) == ["0.0.0.0-1", "192.168.111.0-25"]
    # 0.0.0.0-1 spans the whole Network, yet it does not make the Network look taken.
    own = await acquire(sm, attrs())
    assert own.subnet.subnet_of(IPv4Network("10.3.0.0/16")) and own.subnet.prefixlen == 24
    config = await sm.get_network_config()
    collector = Collector(sm, own, config)
    try:
        for key, value in hostile.items():  # delivered again, now by the watch
            await kv.put(f"{prefix}/subnets/{key}".encode(), value)
        await kv.put(f"{prefix}/subnets/10.3.31.0-24".encode(), VALID_VALUE)
        await collector.wait_for((EventType.ADDED, "10.3.31.0-24"))
        assert collector.events == [(EventType.ADDED, "10.3.31.0-24")]
        assert collector.watcher.skipped.current == {
            "192.168.111.0-25": "subnet 192.168.111.0/25 lies outside the Network 10.3.0.0/16",
            "0.0.0.0-1": "subnet 0.0.0.0/1 covers the whole Network 10.3.0.0/16"}
        assert collector.watcher.skipped.total == 4  # snapshot and watch, two keys each
    finally:
        await collector.stop()
    deep_warnings = [r.getMessage() for r in caplog.records if "10.3.30.0-24" in r.getMessage()]
    assert deep_warnings == ["ignoring lease 10.3.30.0-24: lease value nests JSON deeper than "
                             "the limit of 32 levels"]


async def test_relative_prefix_addresses_the_keys_go_does(kv, prefix):
    """A prefix without a leading slash names keys without one, as Go's path.Join makes
    them (``coreos.com/network/config``), not the slash-led keys of the default prefix."""
    relative = prefix.lstrip("/") + "/"
    await kv.put(f"{prefix}/config".encode(), b'{"Network": "10.99.0.0/16"}')
    await kv.put(f"{relative}config".encode(), CONFIG.encode())
    sm = manager(kv, relative)
    config = await sm.get_network_config()
    assert str(config.network) == "10.3.0.0/16"
    lease = await acquire(sm, attrs())
    found, _ = await kv.get(f"{relative}subnets/{lease.key}".encode())
    assert found is not None
    kvs, _ = await kv.get_prefix(f"{prefix}/subnets/".encode())
    assert kvs == []


async def test_keys_beside_the_subnets_directory_are_not_leases(kv, prefix):
    """Go lists ``<prefix>/subnets`` as a bare key prefix and would take
    ``<prefix>/subnets-old/10.3.200.0-24`` for a lease; ours reads ``<prefix>/subnets/``."""
    sm = await setup(kv, prefix)
    value = b'{"PublicIP":"192.0.2.9","PublicIPv6":null}'
    await kv.put(f"{prefix}/subnets-old/10.3.200.0-24".encode(), value)
    await kv.put(f"{prefix}/subnets/10.3.201.0-24".encode(), value)
    leases, _ = await sm.list_leases()
    assert [lease.key for lease in leases] == ["10.3.201.0-24"]


async def test_remote_lease_expirations_are_not_looked_up(kv, prefix):
    """Go asks etcd for every listed key's TimeToLive (and consumes none of it); a listed
    lease here carries its etcd lease ID and no expiration."""
    sm = await setup(kv, prefix)
    lease_id, _ = await kv.grant(600)
    await kv.put(f"{prefix}/subnets/10.3.202.0-24".encode(),
                 b'{"PublicIP":"192.0.2.9","PublicIPv6":null}', lease=lease_id)
    (lease,), _ = await sm.list_leases()
    assert (lease.etcd_lease_id, lease.expiration) == (lease_id, None)




async def test_a_write_between_the_acquisition_listing_and_our_creation_is_not_lost(
        kv, prefix, monkeypatch):
    sm = await setup(kv, prefix)
    written: list[bool] = []

    async def write_once() -> None:
        if not written:
            written.append(True)
            await put_lease(kv, prefix, 220, "2.2.2.2")
    count_listings(kv, monkeypatch, then=write_once)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        snapshot = await collector.first_snapshot()
        assert sorted(x.key for x in snapshot.leases) == sorted([own.key, "10.3.220.0-24"])
    finally:
        await collector.stop()


async def test_a_repeated_acquisition_does_not_reuse_the_earlier_listing(kv, prefix):
    sm = await setup(kv, prefix)
    await acquire(sm, attrs())
    own = await acquire(sm, attrs())  # reused by public IP: rewritten with a new etcd lease
    collector = Collector(sm, own)
    try:
        snapshot = await collector.first_snapshot()
        assert [x.etcd_lease_id for x in snapshot.leases if x.key == own.key] == [
            own.etcd_lease_id]
        assert sm.status.ready
    finally:
        await collector.stop()


async def test_a_ttl_etcd_refuses_names_the_flag(kv, prefix):
    sm = await setup(kv, prefix, lease_ttl=10**10)
    with pytest.raises(StoreError) as failure:
        await acquire(sm, attrs())
    assert str(failure.value) == (
        "etcd refuses a subnet lease TTL of 10000000000 s: set --subnet-lease-ttl between 1s "
        "and 9000000000s (the default is 24h)")
    assert (await sm.list_leases())[0] == []


async def test_our_key_deleted_on_purpose_is_not_recreated(kv, prefix):
    """Upstream behaviour: deleting a node's key stops it; the periodic check leaves it."""
    sm = await setup(kv, prefix, check_interval=0.2)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        async def listed() -> bool:
            return bool(collector.updates)
        await async_wait_until(listed, what="the first snapshot")
        await kv.delete(sm.lease_key(own.key))

        async def flagged() -> bool:
            return collector.own_removed
        await async_wait_until(flagged, what="own lease removal")
        await asyncio.sleep(1.0)  # five checks' worth of time in which nothing may re-create it
        assert await raw_value(kv, sm.lease_key(own.key).decode()) is None
    finally:
        await collector.stop()


# -- the key-value seam itself: what the manager relies on, the same in both stores --------


async def test_each_write_takes_the_next_revision_and_a_lost_creation_none(kv, prefix):
    store = as_kv(kv)
    key = f"{prefix}/subnets/10.3.200.0-24".encode()
    first = await store.put(key, b"a")
    _, listed_at = await store.get_prefix(f"{prefix}/".encode())
    assert listed_at == first
    created, _, at = await store.create(key, b"b", else_list=f"{prefix}/subnets/".encode())
    assert (created, at) == (False, first)
    second = await store.put(key, b"c")
    assert second == first + 1
    found, _ = await store.get(key)
    assert (found.create_revision, found.mod_revision, found.value) == (first, second, b"c")
    assert await store.delete(key) == 1 and await store.delete(key) == 0


async def test_a_lost_creation_lists_the_prefix_by_name(kv, prefix):
    store = as_kv(kv)
    subnets = f"{prefix}/subnets/".encode()
    await store.put(subnets + b"10.3.200.0-24", b"taken")
    await store.put(subnets + b"10.3.201.0-24", b"other")
    created, listed, _ = await store.create(subnets + b"10.3.200.0-24", b"mine",
                                            else_list=subnets)
    assert not created
    assert [(x.key, x.value) for x in listed] == [(subnets + b"10.3.200.0-24", b""),
                                                  (subnets + b"10.3.201.0-24", b"")]


async def test_leases_bind_keys_and_revoking_deletes_them_at_once(kv, prefix):
    store = as_kv(kv)
    lease_id, ttl = await store.grant(600)
    assert ttl == 600 and 598 <= await store.time_to_live(lease_id) <= 600
    keys = [f"{prefix}/subnets/10.3.{i}.0-24".encode() for i in (200, 201)]
    for key in keys:
        await store.put(key, b"x", lease_id)
    before = store.revision
    await store.revoke(lease_id)
    assert [await store.get(key) for key in keys] == [(None, before + 1)] * 2
    assert await store.time_to_live(lease_id) == -1
    await store.revoke(lease_id)  # gone already: fine
    with pytest.raises(StoreError) as refused:
        await store.put(keys[0], b"x", lease_id)
    assert refused.value.code == Code.NOT_FOUND


async def test_a_lease_too_long_is_refused_and_a_too_short_one_raised(kv):
    store = as_kv(kv)
    with pytest.raises(StoreError) as refused:
        await store.grant(10**10)
    assert refused.value.code == Code.OUT_OF_RANGE
    lease_id, ttl = await store.grant(1)
    assert ttl == MIN_TTL
    await store.revoke(lease_id)


async def test_the_watch_replays_from_a_revision_and_refuses_a_compacted_one(kv, prefix):
    store = as_kv(kv)
    subnets = f"{prefix}/subnets/".encode()
    first = await store.put(subnets + b"a", b"1")
    await store.put(b"/elsewhere" + prefix.encode(), b"not watched")
    third = await store.put(subnets + b"b", b"2")
    await store.delete(subnets + b"a")
    stream = store.watch(subnets, first)
    created = await anext(stream)
    assert created.created and created.revision == first - 1 and not created.events
    seen: list[tuple[bool, bytes, int]] = []
    while len(seen) < 3:
        batch = await asyncio.wait_for(anext(stream), 10)
        seen += [(e.deleted, e.kv.key, e.kv.mod_revision) for e in batch.events]
    assert seen == [(False, subnets + b"a", first), (False, subnets + b"b", third),
                    (True, subnets + b"a", third + 1)]
    await stream.aclose()
    await kv.compact(third)
    stream = store.watch(subnets, third)  # the compaction's own revision is kept
    assert (await anext(stream)).created
    await stream.aclose()
    stream = store.watch(subnets, first)
    assert (await anext(stream)).created
    with pytest.raises(Compacted) as compacted:
        await asyncio.wait_for(anext(stream), 10)
    assert compacted.value.compact_revision == third
    await stream.aclose()


async def test_two_managers_wanting_the_same_subnet_at_once_get_one_each(kv, prefix):
    """Both would take their previous subnet: one creation wins it, the other node takes
    the only other free subnet."""
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    previous = PreviousSubnets(IPv4Network("10.3.1.0/24"))
    other = other_client(kv)
    try:
        first = await setup(kv, prefix, config, previous=previous)
        second = manager(other, prefix, previous=previous)
        leases = await asyncio.gather(acquire(first, attrs("1.1.1.1")),
                                      acquire(second, attrs("1.1.1.2")))
        assert sorted(str(lease.subnet) for lease in leases) == ["10.3.1.0/24", "10.3.2.0/24"]
        stored, _ = await first.list_leases()
        assert {x.key: str(x.attrs.public_ip) for x in stored} == {
            lease.key: ip for lease, ip in zip(leases, ("1.1.1.1", "1.1.1.2"), strict=True)}
    finally:
        await other.close()
