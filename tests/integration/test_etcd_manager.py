"""The etcd subnet manager against a real etcd: acquisition, renewal, reservations, watch."""

from __future__ import annotations

import asyncio
import contextlib
import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel.config import ConfigError
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.subnet.errors import OwnLeaseRevoked
from flannel.subnet.etcd.manager import (
    AcquireError,
    ConfigNotFound,
    EtcdSubnetManager,
    PreviousSubnets,
)
from flannel.subnet.watch import LeaseWatcher, Snapshot
from tests.support.proxy import CuttableProxy
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd

CONFIG = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.25.0" }'
# Leases that tests write by hand lie above SubnetMax, so they never collide with ours.


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


async def raw_value(client: EtcdClient, key: str):
    kv, _ = await client.get(key.encode())
    return kv


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


async def test_config_not_found_gives_the_v3_hint(client, prefix):
    sm = EtcdSubnetManager(client, prefix)
    with pytest.raises(ConfigNotFound, match="Did you create your config using etcdv3 API"):
        await sm.get_network_config()


@pytest.mark.parametrize(("config", "message"), [
    ('{"Network": "10.3.0.0/16"', "not valid JSON"),
    ('{"Network": "10.3.0.0/29"}', "network is too small"),
    ('{"Network": "10.3.0.0/16", "SubnetMin": "10.9.0.0"}', "SubnetMin is not in the range"),
])
async def test_bad_config_is_a_clear_error(client, prefix, config, message):
    sm = await setup(client, prefix, config)
    with pytest.raises(ConfigError, match=message):
        await acquire(sm, attrs())


async def test_first_acquisition_writes_go_compatible_key_and_value(client, prefix):
    sm = await setup(client, prefix)
    for third in (1, 2, 4, 5, 31):
        await client.put(f"{prefix}/subnets/10.3.{third}.0-24".encode(),
                         b'{"PublicIP":"9.9.9.%d","PublicIPv6":null}' % third)
    lease = await acquire(sm, attrs())
    assert lease.subnet.prefixlen == 24
    assert IPv4Address("10.3.1.0") <= lease.subnet.network_address <= IPv4Address("10.3.25.0")
    assert lease.subnet.network_address.packed[2] not in (1, 2, 4, 5)
    kv = await raw_value(client, f"{prefix}/subnets/{lease.key}")
    assert kv.value == b'{"PublicIP":"1.2.3.4","PublicIPv6":null}'
    assert kv.lease == lease.etcd_lease_id != 0
    ttl = await client.time_to_live(kv.lease)
    assert 86300 < ttl <= 86400


async def test_same_public_ip_reuses_the_lease(client, prefix):
    sm = await setup(client, prefix)
    first = await acquire(sm, attrs())
    second = await acquire(sm, attrs())
    assert second.subnet == first.subnet
    leases, _ = await sm.list_leases()
    assert [x.key for x in leases] == [first.key]


async def test_reuse_by_public_ip_finds_an_escaped_ip_and_ignores_the_ip_elsewhere(
        client, prefix):
    sm = await setup(client, prefix)
    # Another node whose backend data happens to hold our address: not ours.
    await client.put(f"{prefix}/subnets/10.3.40.0-24".encode(),
                     b'{"PublicIP":"5.6.7.8","BackendData":{"Note":"1.2.3.4"}}')
    # Ours, written with JSON escapes (as any JSON encoder may): still ours.
    await client.put(f"{prefix}/subnets/10.3.21.0-24".encode(),
                     b'{"PublicIP":"\\u0031.2.3.4","PublicIPv6":null}')
    lease = await acquire(sm, attrs())
    assert lease.key == "10.3.21.0-24"  # inside SubnetMin..SubnetMax: reusable


async def test_previous_subnet_is_reused_when_compatible(client, prefix):
    sm = await setup(client, prefix,
                     previous=PreviousSubnets(IPv4Network("10.3.6.0/24")))
    assert (await acquire(sm, attrs())).subnet == IPv4Network("10.3.6.0/24")


async def test_previous_subnet_outside_the_network_is_not_reused(client, prefix):
    sm = await setup(client, prefix, previous=PreviousSubnets(IPv4Network("10.4.1.0/24")))
    assert (await acquire(sm, attrs())).subnet != IPv4Network("10.4.1.0/24")


async def test_previous_subnet_taken_by_another_node_is_not_reused(client, prefix):
    sm = await setup(client, prefix, previous=PreviousSubnets(IPv4Network("10.3.6.0/24")))
    await client.put(f"{prefix}/subnets/10.3.6.0-24".encode(),
                     b'{"PublicIP":"5.5.5.5","PublicIPv6":null}')
    assert (await acquire(sm, attrs())).subnet != IPv4Network("10.3.6.0/24")


async def test_config_change_forces_a_new_lease_and_drops_the_old(client, prefix):
    sm = await setup(client, prefix)
    old = await acquire(sm, attrs())
    await client.put(f"{prefix}/config".encode(), b'{ "Network": "10.4.0.0/16" }')
    new = await acquire(sm, attrs())
    assert new.subnet.subnet_of(IPv4Network("10.4.0.0/16"))
    assert await raw_value(client, f"{prefix}/subnets/{old.key}") is None


async def test_reservation_is_honoured_and_never_gets_a_ttl(client, prefix):
    sm = await setup(client, prefix)
    key = f"{prefix}/subnets/10.3.7.0-24"
    await client.put(key.encode(), b'{"PublicIP":"1.2.3.4","PublicIPv6":null}')
    lease = await acquire(sm, attrs())
    assert lease.subnet == IPv4Network("10.3.7.0/24") and lease.is_reservation
    renewed = await sm.renew_lease(lease)
    kv = await raw_value(client, key)
    assert kv.lease == 0 and renewed.expiration is None


async def test_reservation_of_another_node_is_never_allocated(client, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(client, prefix, config)
    await client.put(f"{prefix}/subnets/10.3.1.0-24".encode(),
                     b'{"PublicIP":"7.7.7.7","PublicIPv6":null}')
    assert (await acquire(sm, attrs())).subnet == IPv4Network("10.3.2.0/24")


async def test_out_of_subnets_is_a_clear_error(client, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(client, prefix, config)
    await acquire(sm, attrs("1.1.1.1"))
    await acquire(sm, attrs("1.1.1.2"))
    with pytest.raises(AcquireError, match=r"out of subnets.*10\.3\.1\.0 to 10\.3\.2\.0"):
        await acquire(sm, attrs("1.1.1.3"))


async def test_acquisitions_leave_no_unbound_etcd_lease(client, prefix):
    # Whatever the outcome, the only etcd lease an acquisition leaves behind is the one
    # its key is bound to.
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.2.0" }'
    sm = await setup(client, prefix, config)
    await client.put(f"{prefix}/subnets/10.3.2.0-24".encode(),
                     b'{"PublicIP":"5.5.5.5","PublicIPv6":null}')
    before = await client.leases()
    lease = await acquire(sm, attrs("1.1.1.1"))
    assert await client.leases() - before == {lease.etcd_lease_id}
    before = await client.leases()
    with pytest.raises(AcquireError, match="out of subnets"):
        await acquire(sm, attrs("1.1.1.2"))
    assert await client.leases() == before
    assert (await acquire(sm, attrs("5.5.5.5"))).is_reservation
    assert await client.leases() == before


async def test_renewal_keeps_the_value_byte_identical(client, prefix):
    sm = await setup(client, prefix, lease_ttl=600)
    mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"), backend_type="vxlan",
                      backend_data='{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}')
    lease = await acquire(sm, mine)
    before = await raw_value(client, f"{prefix}/subnets/{lease.key}")
    renewed = await sm.renew_lease(lease)
    after = await raw_value(client, f"{prefix}/subnets/{lease.key}")
    assert after.value == before.value
    assert after.lease == renewed.etcd_lease_id != lease.etcd_lease_id
    assert 590 < await client.time_to_live(after.lease) <= 600
    assert await client.time_to_live(lease.etcd_lease_id) == -1  # old one revoked


async def test_keep_lease_renews_before_expiry(client, prefix):
    sm = await setup(client, prefix, lease_ttl=3, renew_margin=2)
    lease = await acquire(sm, attrs())
    renewed = Renewals(sm)
    task = asyncio.create_task(sm.keep_lease(lease))
    try:
        await async_wait_until(renewed.at_least(2), timeout=10, what="two renewals")
        kv = await raw_value(client, f"{prefix}/subnets/{lease.key}")
        assert kv is not None and kv.lease == sm.lease.etcd_lease_id
        assert kv.lease in {r.etcd_lease_id for r in renewed.leases[-2:]}
    finally:
        task.cancel()


async def test_keep_lease_stops_rather_than_recreate_a_deleted_lease(client, prefix):
    sm = await setup(client, prefix, lease_ttl=3, renew_margin=2)
    lease = await acquire(sm, attrs())
    collector = Collector(sm, lease)
    try:
        async def listed() -> bool:
            return bool(collector.updates)
        await async_wait_until(listed, what="the first snapshot")
        await client.delete(f"{prefix}/subnets/{lease.key}".encode())
        with pytest.raises(OwnLeaseRevoked, match=f"lease {lease.key} was deleted from etcd"):
            await asyncio.wait_for(sm.keep_lease(lease), 10)
        assert await raw_value(client, f"{prefix}/subnets/{lease.key}") is None
    finally:
        await collector.stop()


async def test_foreign_entries_are_skipped_not_fatal(client, prefix):
    config = '{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.8.0", "SubnetMax": "10.3.10.0" }'
    sm = await setup(client, prefix, config)
    await client.put(f"{prefix}/subnets/10.3.9.0-24".encode(), b"this is not json")
    await client.put(f"{prefix}/subnets/not-a-subnet".encode(),
                     b'{"PublicIP":"9.9.9.9","PublicIPv6":null}')
    await client.put(f"{prefix}/subnets/10.3.8.0-24".encode(),
                     b'{"PublicIP":"8.8.8.8","PublicIPv6":null}')
    leases, _ = await sm.list_leases()
    assert [x.key for x in leases] == ["10.3.8.0-24"]
    # A key with an unreadable value still holds its subnet: the only free one is 10.3.10.0.
    lease = await acquire(sm, attrs())
    assert lease.subnet == IPv4Network("10.3.10.0/24")
    collector = Collector(sm, lease)
    try:
        await client.put(f"{prefix}/subnets/10.3.200.0-24".encode(), b"[garbage")
        await client.put(f"{prefix}/subnets/10.3.201.0-24".encode(),
                         b'{"PublicIP":"6.6.6.6","PublicIPv6":null}')
        await collector.wait_for((EventType.ADDED, "10.3.201.0-24"))
        assert (EventType.ADDED, "10.3.200.0-24") not in collector.events
    finally:
        await collector.stop()


async def test_other_nodes_appear_and_expire(client, prefix):
    sm = await setup(client, prefix)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        other = await setup(client, prefix, lease_ttl=2)
        theirs = await acquire(other, attrs("5.6.7.8"))
        await collector.wait_for((EventType.ADDED, theirs.key))
        # Nobody renews it: etcd expires it and the watch reports the removal.
        await collector.wait_for((EventType.REMOVED, theirs.key), timeout=15)
        assert all(key != own.key for _, key in collector.events)
        removed = [e for e in collector.watcher.leases if e.key == theirs.key]
        assert removed == []
    finally:
        await collector.stop()


async def test_own_lease_deletion_is_reported(client, prefix):
    sm = await setup(client, prefix)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        async def snapshot_seen() -> bool:
            return bool(collector.updates)
        await async_wait_until(snapshot_seen)
        await client.delete(f"{prefix}/subnets/{own.key}".encode())

        async def flagged() -> bool:
            return collector.own_removed
        await async_wait_until(flagged, what="own lease removal")
    finally:
        await collector.stop()


async def test_a_bug_in_the_watch_stream_ends_the_lease_watch(client, prefix, monkeypatch):
    sm = await setup(client, prefix)
    updates = sm.watch_leases(max_backoff=0.5)
    try:
        await asyncio.wait_for(anext(updates), 10)

        async def broken_watch(*args, **kwargs):
            raise TypeError("'NoneType' object is not subscriptable")
            yield  # an async generator, like the client's watch
        monkeypatch.setattr(sm.client, "watch", broken_watch)
        await client.put(f"{prefix}/subnets/10.3.200.0-24".encode(), b"{}")
        # Raised to the consumer (the daemon's supervised lease watch), not a silent stall.
        with pytest.raises(TypeError, match="not subscriptable"):
            await asyncio.wait_for(anext(updates), 10)
    finally:
        await updates.aclose()


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
        managers = [EtcdSubnetManager(c, prefix) for c in clients]
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


async def test_dual_stack_lease_key_and_value(client, prefix):
    config = json.dumps({"Network": "10.3.0.0/16", "EnableIPv6": True,
                         "IPv6Network": "fd00:10::/56"})
    sm = await setup(client, prefix, config)
    mine = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"),
                      public_ipv6=IPv6Address("fd00::4"))
    lease = await acquire(sm, mine)
    assert lease.ipv6_subnet is not None and lease.ipv6_subnet.prefixlen == 64
    assert "&fd00:10:0:" in lease.key
    kv = await raw_value(client, f"{prefix}/subnets/{lease.key}")
    assert kv.value == b'{"PublicIP":"1.2.3.4","PublicIPv6":"fd00::4"}'


async def test_ipv6_only_lease_key_is_go_compatible(client, prefix):
    config = json.dumps({"EnableIPv4": False, "EnableIPv6": True,
                         "IPv6Network": "fc00::/48"})
    sm = await setup(client, prefix, config)
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


DEEP_LEASE = ('{"PublicIP":"10.0.0.9","BackendType":"vxlan","BackendData":' + "[" * 1000
              + "]" * 1000 + "}").encode()
VALID_VALUE = b'{"PublicIP":"10.0.0.8","PublicIPv6":null,"BackendType":"vxlan"}'


async def test_hostile_leases_are_skipped_by_list_acquisition_and_watch(client, prefix, caplog):
    sm = await setup(client, prefix)
    hostile = {"10.3.30.0-24": DEEP_LEASE, "192.168.111.0-25": VALID_VALUE,
               "0.0.0.0-1": VALID_VALUE}
    for key, value in hostile.items():
        await client.put(f"{prefix}/subnets/{key}".encode(), value)
    leases, _ = await sm.list_leases()
    assert sorted(x.key for x in leases) == ["0.0.0.0-1", "192.168.111.0-25"]
    # 0.0.0.0-1 spans the whole Network, yet it does not make the Network look taken.
    own = await acquire(sm, attrs())
    assert own.subnet.subnet_of(IPv4Network("10.3.0.0/16")) and own.subnet.prefixlen == 24
    config = await sm.get_network_config()
    collector = Collector(sm, own, config)
    try:
        for key, value in hostile.items():  # delivered again, now by the watch
            await client.put(f"{prefix}/subnets/{key}".encode(), value)
        await client.put(f"{prefix}/subnets/10.3.31.0-24".encode(), VALID_VALUE)
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


async def test_relative_prefix_addresses_the_keys_go_does(client, prefix):
    """A prefix without a leading slash names keys without one, as Go's path.Join makes
    them (``coreos.com/network/config``), not the slash-led keys of the default prefix."""
    relative = prefix.lstrip("/") + "/"
    await client.put(f"{prefix}/config".encode(), b'{"Network": "10.99.0.0/16"}')
    await client.put(f"{relative}config".encode(), CONFIG.encode())
    sm = EtcdSubnetManager(client, relative)
    config = await sm.get_network_config()
    assert str(config.network) == "10.3.0.0/16"
    lease = await acquire(sm, attrs())
    kv, _ = await client.get(f"{relative}subnets/{lease.key}".encode())
    assert kv is not None
    kvs, _ = await client.get_prefix(f"{prefix}/subnets/".encode())
    assert kvs == []


async def test_keys_beside_the_subnets_directory_are_not_leases(client, prefix):
    """Go lists ``<prefix>/subnets`` as a bare key prefix and would take
    ``<prefix>/subnets-old/10.3.200.0-24`` for a lease; ours reads ``<prefix>/subnets/``."""
    sm = await setup(client, prefix)
    value = b'{"PublicIP":"192.0.2.9","PublicIPv6":null}'
    await client.put(f"{prefix}/subnets-old/10.3.200.0-24".encode(), value)
    await client.put(f"{prefix}/subnets/10.3.201.0-24".encode(), value)
    leases, _ = await sm.list_leases()
    assert [lease.key for lease in leases] == ["10.3.201.0-24"]


async def test_remote_lease_expirations_are_not_looked_up(client, prefix):
    """Go asks etcd for every listed key's TimeToLive (and consumes none of it); a listed
    lease here carries its etcd lease ID and no expiration."""
    sm = await setup(client, prefix)
    lease_id, _ = await client.grant(600)
    await client.put(f"{prefix}/subnets/10.3.202.0-24".encode(),
                     b'{"PublicIP":"192.0.2.9","PublicIPv6":null}', lease=lease_id)
    (lease,), _ = await sm.list_leases()
    assert (lease.etcd_lease_id, lease.expiration) == (lease_id, None)


def count_listings(client: EtcdClient, monkeypatch, then=None) -> list[bytes]:
    """The prefixes the manager lists through ``client`` (the real call; ``then`` runs after
    each listing returns)."""
    listed: list[bytes] = []
    real = client.get_prefix

    async def get_prefix(key: bytes, **options):
        answer = await real(key, **options)
        listed.append(key)
        if then is not None:
            await then()
        return answer
    monkeypatch.setattr(client, "get_prefix", get_prefix)
    return listed


async def first_snapshot(collector: Collector) -> Snapshot:
    async def arrived() -> bool:
        return bool(collector.updates)
    await async_wait_until(arrived, what="the first snapshot")
    snapshot = collector.updates[0]
    assert isinstance(snapshot, Snapshot)
    return snapshot


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
            snapshot = await first_snapshot(collector)
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


async def test_a_write_between_the_acquisition_listing_and_our_creation_is_not_lost(
        client, prefix, monkeypatch):
    sm = await setup(client, prefix)
    written: list[bool] = []

    async def write_once() -> None:
        if not written:
            written.append(True)
            await put_lease(client, prefix, 220, "2.2.2.2")
    count_listings(client, monkeypatch, then=write_once)
    own = await acquire(sm, attrs())
    collector = Collector(sm, own)
    try:
        snapshot = await first_snapshot(collector)
        assert sorted(x.key for x in snapshot.leases) == sorted([own.key, "10.3.220.0-24"])
    finally:
        await collector.stop()


async def test_a_repeated_acquisition_does_not_reuse_the_earlier_listing(client, prefix):
    sm = await setup(client, prefix)
    await acquire(sm, attrs())
    own = await acquire(sm, attrs())  # reused by public IP: rewritten with a new etcd lease
    collector = Collector(sm, own)
    try:
        snapshot = await first_snapshot(collector)
        assert [x.etcd_lease_id for x in snapshot.leases if x.key == own.key] == [
            own.etcd_lease_id]
        assert sm.status.ready
    finally:
        await collector.stop()


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
