"""The kube subnet manager against the API-server test double (tests/support/kubeapi.py),
through the real API client (flannel.clients.kube.client) over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from ipaddress import IPv4Address, IPv6Address

import pytest

from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.kube import manager as kube
from flannel.subnet.kube.manager import KubeError, event_queue_depth
from flannel.subnet.watch import LeaseWatcher, Snapshot
from tests.support.kubeapi import FakeKubeAPI
from tests.support.kubestore import VXLAN, Follower, P, manager, remote
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.virtual_time


async def test_acquire_from_pod_cidr_publishes_annotations(api, tmp_path):
    api.put_node("node1", ["10.244.5.0/24"])
    sm = manager(api, tmp_path)
    try:
        config = await sm.get_network_config()
        lease = await sm.acquire_lease(config, VXLAN)
        assert str(lease.subnet) == "10.244.5.0/24" and lease.ipv6_subnet is None
        assert len(api.patches) == 1
        name, patch = api.patches[0]
        assert name == "node1" and list(patch) == ["metadata"]
        assert api.nodes["node1"]["metadata"]["annotations"] == {
            P + "backend-type": "vxlan", P + "kube-subnet-manager": "true",
            P + "backend-data": '{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}',
            P + "public-ip": "10.0.0.1"}
        await sm.acquire_lease(config, VXLAN)
        assert len(api.patches) == 1  # nothing changed: no second patch
    finally:
        await sm.close()


async def test_host_gw_dual_stack_and_overwrites(api, tmp_path):
    api.put_node("node1", ["10.244.5.0/24", "fd00:10:244:5::/64"], {
        P + "public-ip-overwrite": "172.18.0.2", P + "node-public-ip": "10.0.0.9"})
    sm = manager(api, tmp_path, {"Network": "10.244.0.0/16", "EnableIPv6": True,
                                 "IPv6Network": "fd00:10:244::/56",
                                 "Backend": {"Type": "host-gw"}})
    try:
        config = await sm.get_network_config()
        assert await sm.public_ip_overrides() == (IPv4Address("10.0.0.9"), None)
        attrs = LeaseAttrs(public_ip=IPv4Address("10.0.0.9"),
                           public_ipv6=IPv6Address("fd00::9"), backend_type="host-gw")
        lease = await sm.acquire_lease(config, attrs)
        assert str(lease.ipv6_subnet) == "fd00:10:244:5::/64"
        annotations = api.nodes["node1"]["metadata"]["annotations"]
        assert annotations[P + "public-ip"] == "172.18.0.2"
        assert annotations[P + "backend-data"] == "null"
        assert annotations[P + "backend-v6-data"] == "null"
        assert annotations[P + "public-ipv6"] == "fd00::9"
    finally:
        await sm.close()


@pytest.mark.parametrize("backend", ["extension", "alloc"])
async def test_every_dual_stack_backend_leases_both_families(api, tmp_path, backend):
    # Go leases IPv4 only to every backend but vxlan, host-gw and wireguard; the extension
    # and alloc backends carry IPv6 too (their footprint says so), and get its subnet.
    api.put_node("node1", ["10.244.5.0/24", "fd00:10:244:5::/64"])
    sm = manager(api, tmp_path, {"Network": "10.244.0.0/16", "EnableIPv6": True,
                                 "IPv6Network": "fd00:10:244::/56",
                                 "Backend": {"Type": backend}})
    try:
        config = await sm.get_network_config()
        attrs = LeaseAttrs(public_ip=IPv4Address("10.0.0.1"),
                           public_ipv6=IPv6Address("fd00::1"), backend_type=backend)
        lease = await sm.acquire_lease(config, attrs)
        assert (str(lease.subnet), str(lease.ipv6_subnet)) == ("10.244.5.0/24",
                                                               "fd00:10:244:5::/64")
    finally:
        await sm.close()


async def test_missing_pod_cidr_and_mismatched_network_say_what_to_fix(api, tmp_path):
    api.put_node("node1", [])
    # A node that never gets a pod CIDR is refused once the wait for one ends.
    sm = manager(api, tmp_path, pod_cidr_wait=0.3, retry_interval=0.05)
    try:
        config = await sm.get_network_config()
        with pytest.raises(KubeError, match=r'node "node1" pod cidr not assigned.*'
                                            r"allocate-node-cidrs"):
            await sm.acquire_lease(config, VXLAN)
        api.put_node("node1", ["10.9.0.0/24"])
        with pytest.raises(KubeError, match=re.escape(
                'subnet "10.244.0.0/16" specified in the flannel net config doesn\'t contain')):
            await sm.acquire_lease(config, VXLAN)
    finally:
        await sm.close()


async def test_node_condition_is_patched(api, tmp_path):
    api.put_node("node1", ["10.244.5.0/24"])
    sm = manager(api, tmp_path)
    try:
        lease = await sm.acquire_lease(await sm.get_network_config(), VXLAN)
        task = asyncio.create_task(sm.keep_lease(lease))

        async def patched():
            return len(api.patches) == 2
        await async_wait_until(patched)
        task.cancel()
        condition = api.nodes["node1"]["status"]["conditions"][0]
        assert {k: condition[k] for k in ("type", "status", "reason", "message")} == {
            "type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp",
            "message": "Flannel is running on this node"}
    finally:
        await sm.close()


async def test_node_name_from_the_pod(api, tmp_path):
    api.put_node("worker-3", ["10.244.3.0/24"])
    api.put_pod("kube-flannel", "kube-flannel-ds-abc", "worker-3")
    sm = manager(api, tmp_path, node="", environ={"POD_NAME": "kube-flannel-ds-abc",
                                                   "POD_NAMESPACE": "kube-flannel"})
    try:
        assert await sm.own_node_name() == "worker-3"
        assert sm.node_name == "worker-3"
    finally:
        await sm.close()
    sm = manager(api, tmp_path, node="", environ={})
    try:
        with pytest.raises(KubeError, match="POD_NAME and POD_NAMESPACE must be set"):
            await sm.own_node_name()
    finally:
        await sm.close()


@contextlib.asynccontextmanager
async def following(api: FakeKubeAPI, tmp_path):
    """node1's manager with its lease acquired, and a follower of the other nodes."""
    api.put_node("node1", ["10.244.1.0/24"])
    sm = manager(api, tmp_path)
    follower = None
    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config, check=False)
        yield sm, follower
    finally:
        if follower:
            await follower.stop()
        await sm.close()


async def test_other_nodes_added_changed_deleted_and_quiet_resyncs(api, tmp_path):
    async with following(api, tmp_path) as (_sm, follower):
        remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
        assert await follower.wait_for(1) == [(EventType.ADDED, "10.244.2.0-24")]
        remote(api, "node2", "10.244.2.0/24", "10.0.0.2", mac="0e:00:00:00:00:22")
        await follower.wait_for(2)
        # An update that leaves the published triple alone (heartbeat, other annotation),
        # then a deletion: an event for the first would come before the removal.
        api.put_node("node2", annotations={"unrelated": "x"})
        api.delete_node("node2")
        assert await follower.wait_for(3) == [(EventType.ADDED, "10.244.2.0-24"),
                                              (EventType.ADDED, "10.244.2.0-24"),
                                              (EventType.REMOVED, "10.244.2.0-24")]


async def test_cut_watch_resumes_and_410_relists(api, tmp_path):
    async with following(api, tmp_path) as (sm, follower):
        remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
        await follower.wait_for(1)
        # Cut mid-stream; the changes made meanwhile arrive after the resume, no relist.
        api.cut_watches()
        remote(api, "node3", "10.244.3.0/24", "10.0.0.3")
        api.delete_node("node2")
        await follower.wait_for(3)
        assert sm.status.relists == 1
        # Cut again and compact: the resume gets 410 Gone and relists; the diff is exact.
        api.cut_watches()
        remote(api, "node4", "10.244.4.0/24", "10.0.0.4")
        api.delete_node("node3")
        api.compact()
        events = await follower.wait_for(5)
        assert set(events[3:]) == {(EventType.ADDED, "10.244.4.0-24"),
                                   (EventType.REMOVED, "10.244.3.0-24")}
        assert sm.status.relists == 2
        assert any("resourceVersion" in r and "watch" in r for r in api.requests)


async def test_heartbeats_never_fill_the_lease_loops_queue(api, tmp_path):
    """Updates that change nothing a lease is decoded from (a heartbeat annotation, a
    condition's heartbeat) on more nodes than the queue holds, while the lease loop is busy,
    do not turn the next change into a whole snapshot: only that change comes."""
    api.put_node("node1", ["10.244.1.0/24"])
    for i in range(2, 22):
        remote(api, f"node{i}", f"10.244.{i}.0/24", f"10.0.0.{i}")
    sm = manager(api, tmp_path, queue_depth=10)
    try:
        config = await sm.get_network_config()
        await sm.acquire_lease(config, VXLAN)
        updates = sm.watch_leases(config)
        first = await anext(updates)
        assert isinstance(first, Snapshot) and len(first.leases) == 21
        for beat in range(3):
            stamp = f"2026-12-07T05:00:0{beat}Z"
            for i in range(2, 22):
                api.put_node(f"node{i}", annotations={"example.com/heartbeat": stamp},
                             conditions=[{"type": "Ready", "status": "True",
                                          "lastHeartbeatTime": stamp}])
        remote(api, "node7", "10.244.7.0/24", "10.0.0.77")

        async def caught_up():
            return sm.resource_version == str(api.rv)
        await async_wait_until(caught_up, 30, what="the watch to keep up")
        update = await asyncio.wait_for(anext(updates), 10)
        assert not isinstance(update, Snapshot)
        assert [(e.type, e.lease.key, str(e.lease.attrs.public_ip)) for e in update.events] \
            == [(EventType.ADDED, "10.244.7.0-24", "10.0.0.77")]
        await updates.aclose()
    finally:
        await sm.close()


async def test_six_thousand_quick_updates_never_block_the_watch(api, tmp_path):
    api.put_node("node1", ["10.244.1.0/24"])
    for i in range(2, 22):
        remote(api, f"node{i}", f"10.244.{i}.0/24", f"10.0.0.{i}")
    sm = manager(api, tmp_path, queue_depth=10)
    try:
        config = await sm.get_network_config()
        own = await sm.acquire_lease(config, VXLAN)
        updates = sm.watch_leases(config)
        first = await anext(updates)
        assert isinstance(first, Snapshot) and len(first.leases) == 21  # ours included
        # Nobody consumes while 6000 updates land: the watch must keep up regardless.
        for n in range(6000):
            i = 2 + n % 20
            remote(api, f"node{i}", f"10.244.{i}.0/24", f"10.0.0.{i}",
                   mac=f"0e:00:00:00:{n // 256 % 256:02x}:{n % 256:02x}")

        async def caught_up():
            return sm.resource_version == str(api.rv)
        await async_wait_until(caught_up, 60, what="the watch to keep up")
        watcher = LeaseWatcher(own)
        watcher.apply(first)
        update = await asyncio.wait_for(anext(updates), 10)
        watcher.apply(update)
        final = {lease.key: json.loads(lease.attrs.backend_data)["VtepMAC"]
                 for lease in watcher.leases}
        for n in range(5980, 6000):
            i = 2 + n % 20
            assert final[f"10.244.{i}.0-24"] == f"0e:00:00:00:{n // 256 % 256:02x}:{n % 256:02x}"
        await updates.aclose()
    finally:
        await sm.close()


def test_event_queue_depth_env():
    assert event_queue_depth({}) == 5000
    assert event_queue_depth({"EVENT_QUEUE_DEPTH": "100"}) == 100
    assert event_queue_depth({"EVENT_QUEUE_DEPTH": "-3"}) == 5000
    with pytest.raises(KubeError, match="env EVENT_QUEUE_DEPTH=abc format error"):
        event_queue_depth({"EVENT_QUEUE_DEPTH": "abc"})


async def test_first_sync_is_bounded_unless_told_to_continue(api, tmp_path):
    from flannel_lab.etcd import free_port

    dead = FakeKubeAPI()
    dead.port = free_port()  # nothing listens there
    sm = manager(dead, tmp_path, first_sync_timeout=0.5)
    try:
        config = await sm.get_network_config()
        with pytest.raises(KubeError, match="CONT_WHEN_CACHE_NOT_READY"):
            await anext(sm.watch_leases(config))
    finally:
        await sm.close()

    late = FakeKubeAPI()
    late.port = free_port()
    sm = manager(late, tmp_path, first_sync_timeout=0.3, continue_when_cache_not_ready=True)
    updates = sm.watch_leases(await sm.get_network_config())
    try:
        first = asyncio.create_task(anext(updates))
        await asyncio.sleep(0.6)  # past the sync timeout: still waiting, not failed
        assert not first.done()
        late.put_node("node9", ["10.244.9.0/24"])
        await late.start(port=late.port)
        snapshot = await asyncio.wait_for(first, 10)
        assert isinstance(snapshot, Snapshot)
    finally:
        await updates.aclose()
        await late.stop()
        await sm.close()


async def test_hostile_nodes_are_skipped_and_logged_once(api, tmp_path, caplog):
    api.put_node("node1", ["10.244.5.0/24"])
    api.put_node("deep", ["10.244.6.0/24"], {
        P + "kube-subnet-manager": "true", P + "backend-type": "vxlan",
        P + "backend-data": "[" * 1000 + "]" * 1000, P + "public-ip": "10.0.0.6"})
    remote(api, "outside", "192.168.111.0/25", "10.0.0.7")
    sm = manager(api, tmp_path)
    try:
        config = await sm.get_network_config()
        own = await sm.acquire_lease(config, VXLAN)
        follower = Follower(sm, own, config)
        try:
            remote(api, "good", "10.244.8.0/24", "10.0.0.8")
            await follower.wait_for(1)
            api.put_node("deep", ["10.244.6.0/24"], api.nodes["deep"]["metadata"]["annotations"])
            remote(api, "good2", "10.244.9.0/24", "10.0.0.9")
            await follower.wait_for(2)
            assert sorted(follower.events) == [(EventType.ADDED, "10.244.8.0-24"),
                                               (EventType.ADDED, "10.244.9.0-24")]
            assert follower.watcher.skipped.current == {
                "192.168.111.0-25": "subnet 192.168.111.0/25 lies outside the Network "
                                    "10.244.0.0/16"}
        finally:
            await follower.stop()
    finally:
        await sm.close()
    assert [r.getMessage() for r in caplog.records if "deep" in r.getMessage()] == [
        "ignoring node deep: annotation flannel.alpha.coreos.com/backend-data "
        "nests JSON deeper than the limit of 32 levels"]


async def test_net_conf_is_read_bounded(api, tmp_path):
    from flannel.config import ConfigError

    sm = manager(api, tmp_path)
    conf = tmp_path / "net-conf.json"
    try:
        conf.write_bytes(b'{"Network": "10.244.0.0/16", "Pad": "' + b"x" * (2 << 20) + b'"}')
        with pytest.raises(ConfigError) as caught:
            await sm.get_network_config()
        assert str(caught.value) == ("error parsing subnet config: network config is larger "
                                     "than the limit of 1048576 bytes")
        conf.write_bytes(b'{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}, '
                         b'"X": "\xff"}')
        assert (await sm.get_network_config()).backend_type == "vxlan"
        conf.unlink()
        conf.mkdir()
        with pytest.raises(ConfigError) as caught:
            await sm.get_network_config()
        assert str(caught.value) == f"failed to read net conf: [Errno 21] Is a directory: '{conf}'"
    finally:
        await sm.close()


async def test_a_missing_pod_is_fatal_with_the_api_message(api, tmp_path):
    """(The other statuses: tests/integration/test_kube_client.py.)"""
    sm = manager(api, tmp_path, node="", environ={"POD_NAME": "gone",
                                                   "POD_NAMESPACE": "kube-flannel"})
    try:
        with pytest.raises(KubeError, match="error retrieving pod spec for "
                                            "'kube-flannel/gone': pods \"gone\" not found"):
            await sm.own_node_name()
    finally:
        await sm.close()


def broken_decoder(monkeypatch, name: str) -> None:
    """A bug in the node decoder, hit by the node called ``name`` only."""
    real = kube.node_view

    def node_view(raw, prefix):
        if raw["metadata"]["name"] == name:
            raise TypeError("'NoneType' object is not subscriptable")
        return real(raw, prefix)
    monkeypatch.setattr(kube, "node_view", node_view)


async def test_a_decoding_bug_in_the_node_watch_ends_the_lease_watch(api, tmp_path,
                                                                      monkeypatch):
    api.put_node("node1", ["10.244.1.0/24"])
    remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
    sm = manager(api, tmp_path)
    updates = sm.watch_leases(await sm.get_network_config())
    try:
        assert isinstance(await asyncio.wait_for(anext(updates), 10), Snapshot)
        broken_decoder(monkeypatch, "node3")
        remote(api, "node3", "10.244.3.0/24", "10.0.0.3")
        # Raised to the consumer (the daemon's supervised lease watch), not relisted for ever.
        with pytest.raises(TypeError, match="not subscriptable"):
            await asyncio.wait_for(anext(updates), 10)
        assert sm.status.relists == 1
    finally:
        await updates.aclose()
        await sm.close()


async def test_a_decoding_bug_in_the_first_listing_ends_the_lease_watch_at_once(
        api, tmp_path, monkeypatch):
    api.put_node("node1", ["10.244.1.0/24"])
    api.put_node("node2", ["10.244.2.0/24"])
    broken_decoder(monkeypatch, "node2")
    sm = manager(api, tmp_path, first_sync_timeout=600)
    updates = sm.watch_leases(await sm.get_network_config())
    try:
        with pytest.raises(TypeError, match="not subscriptable"):
            await asyncio.wait_for(anext(updates), 10)  # not after the 600 s sync timeout
    finally:
        await updates.aclose()
        await sm.close()
