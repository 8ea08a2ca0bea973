"""Node-update storms through the kube subnet manager and the LeaseWatcher, against the
API-server test double over HTTP (200 peer nodes, 2000 updates): churn in fields flannel does
not publish reprograms no peer, a changed public IP reprograms exactly the changed peers with
their last value, and a stalled lease loop never holds the node watch back.
(``bench/kube_scale.py`` measures the same at 5000 nodes.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from ipaddress import IPv4Network

import pytest

from flannel.lease import EventType, Lease
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import KubeSubnetManager, kube_client
from flannel.subnet.watch import Changes, LeaseWatcher, Snapshot
from tests.support.kubeapi import FakeKubeAPI
from tests.support.waiting import async_wait_until

P = "flannel.alpha.coreos.com/"
PEERS = 200
UPDATES = 2000


def subnet(i: int) -> str:
    return f"10.244.{i + 1}.0/24"


def public_ip(i: int, generation: int = 0) -> str:
    return f"10.{10 + generation}.{i // 250}.{1 + i % 250}"


def heartbeat(update: int) -> dict:
    stamp = f"2026-11-22T00:{update // 60 % 60:02d}:{update % 60:02d}Z"
    return {"annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "example.com/heartbeat": str(update)},
            "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": stamp}]}


@pytest.fixture
async def cluster(tmp_path):
    api = FakeKubeAPI()
    api.put_node("node0", ["10.244.0.0/24"])
    for i in range(PEERS):
        api.put_node(f"peer{i}", [subnet(i)], {
            P + "kube-subnet-manager": "true", P + "backend-type": "vxlan",
            P + "backend-data": json.dumps({"VNI": 1, "VtepMAC": f"0e:00:00:00:00:{i % 256:02x}"}),
            P + "public-ip": public_ip(i)})
    await api.start()
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}))
    sm = KubeSubnetManager(kube_client(api.url, "", {}), "node0",
                           Annotations.for_prefix("flannel.alpha.coreos.com"), str(conf))
    await sm.get_network_config()
    loop = LeaseLoop(sm)
    try:
        await loop.wait_synced()
        yield api, sm, loop
    finally:
        await loop.stop()
        await sm.close()
        await api.stop()


class LeaseLoop:
    """The daemon's lease loop minus the kernel: counts backend syncs and events per peer.
    ``gate`` cleared stalls it after the update it is holding (a slow backend)."""

    def __init__(self, sm: KubeSubnetManager) -> None:
        self.watcher = LeaseWatcher(Lease(IPv4Network("10.244.0.0/24")))
        self.syncs = 0
        self.added: Counter[str] = Counter()
        self.removed: Counter[str] = Counter()
        self.gate = asyncio.Event()
        self.gate.set()
        self.task = asyncio.create_task(self._run(sm))

    async def _run(self, sm: KubeSubnetManager) -> None:
        config = await sm.get_network_config()
        async for update in sm.watch_leases(config):
            for event in self.watcher.apply(update).events:
                counts = self.added if event.type is EventType.ADDED else self.removed
                counts[str(event.lease.subnet)] += 1
            assert isinstance(update, Snapshot | Changes)
            self.syncs += 1
            await self.gate.wait()

    async def wait_synced(self) -> None:
        async def synced():
            return len(self.watcher.leases) == PEERS
        await async_wait_until(synced, 30, what=f"{PEERS} peers in the first snapshot")
        self.syncs = 0
        self.added.clear()

    def public_ips(self) -> dict[str, str]:
        return {str(lease.subnet): str(lease.attrs.public_ip) for lease in self.watcher.leases}

    async def wait_for_ip(self, i: int, ip: str) -> None:
        async def seen():
            return self.public_ips().get(subnet(i)) == ip
        await async_wait_until(seen, 30, what=f"peer{i} at {ip}")

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def storm(api: FakeKubeAPI, updates: int, change) -> None:
    for update in range(updates):
        change(update)
        if update % 50 == 49:
            await asyncio.sleep(0)  # writes interleave with the watch streams


async def test_churn_in_unpublished_fields_reprograms_no_peer(cluster):
    api, _sm, loop = cluster
    before = loop.public_ips()
    await storm(api, UPDATES, lambda u: api.put_node(f"peer{u % PEERS}", **heartbeat(u)))
    # A last, real change: once it is through, every heartbeat before it has been seen.
    api.put_node("peer7", annotations={P + "public-ip": public_ip(7, 1)})
    await loop.wait_for_ip(7, public_ip(7, 1))
    assert loop.added == {subnet(7): 1} and not loop.removed
    assert loop.syncs == 1
    assert {k: v for k, v in loop.public_ips().items() if k != subnet(7)} == \
        {k: v for k, v in before.items() if k != subnet(7)}


async def test_public_ip_storm_reprograms_only_changed_peers_with_their_last_value(cluster):
    api, _sm, loop = cluster
    changed = range(0, PEERS, 4)  # 50 peers, 40 new public IPs each, amid heartbeats of all

    def change(update: int) -> None:
        if update % 2:
            api.put_node(f"peer{update % PEERS}", **heartbeat(update))
        else:
            i = changed[update // 2 % len(changed)]
            api.put_node(f"peer{i}", annotations={
                P + "public-ip": public_ip(i, 1 + update // 2 // len(changed))})

    await storm(api, UPDATES, change)
    last = 1 + (UPDATES // 2 - 1) // len(changed)
    for i in changed:
        await loop.wait_for_ip(i, public_ip(i, last))
    assert set(loop.added) == {subnet(i) for i in changed} and not loop.removed
    assert max(loop.added.values()) <= UPDATES // 2 // len(changed)
    ips = loop.public_ips()
    assert all(ips[subnet(i)] == public_ip(i) for i in range(PEERS) if i % 4)


async def test_a_stalled_lease_loop_never_holds_the_node_watch_back(cluster):
    api, sm, loop = cluster
    api.put_node("peer1", annotations={P + "public-ip": public_ip(1, 1)})
    await loop.wait_for_ip(1, public_ip(1, 1))
    loop.gate.clear()  # the loop now holds that update: it is stalled, not pulling
    await storm(api, UPDATES, lambda u: api.put_node(f"peer{u % PEERS}", **heartbeat(u)))
    for i in range(PEERS):
        api.put_node(f"peer{i}", annotations={P + "public-ip": public_ip(i, 2)})

    async def watch_caught_up():
        return sm.resource_version == str(api.rv)
    await async_wait_until(watch_caught_up, 30, what="the node watch at the server's version")
    syncs = loop.syncs
    loop.gate.set()
    for i in range(PEERS):
        await loop.wait_for_ip(i, public_ip(i, 2))
    # Coalesced: one event per changed peer, in very few syncs, however long the stall.
    assert loop.added[subnet(0)] == 1 and loop.added[subnet(1)] == 2
    assert set(loop.added.values()) <= {1, 2} and len(loop.added) == PEERS
    assert loop.syncs - syncs <= 3
