"""The kube subnet manager against the Kubernetes API double (tests/support/kubeapi.py): the
``api`` fixture, managers and remote nodes made on it, a follower of its events, and kubeconfig
files that point at it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from flannel.kernel.host import Host
from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import (
    KubeSubnetManager,
    kube_client,
)
from flannel.subnet.watch import LeaseWatcher
from tests.support.kubeapi import FakeKubeAPI
from tests.support.waiting import async_wait_until

P = "flannel.alpha.coreos.com/"


NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")


VXLAN = LeaseAttrs(public_ip=IPv4Address("10.0.0.1"), backend_type="vxlan",
                   backend_data='{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}')


@pytest.fixture
async def api():
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


def manager(api: FakeKubeAPI, tmp_path, config: dict | None = None, node: str = "node1",
            **kwargs) -> KubeSubnetManager:
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps(config or {"Network": "10.244.0.0/16",
                                          "Backend": {"Type": "vxlan"}}))
    client = kube_client(api.url, "", {})
    return KubeSubnetManager(client, node, NAMES, str(conf), keep_backoff=(0.05, 0.5),
                             **kwargs)


def remote(api: FakeKubeAPI, name: str, cidr: str, ip: str, mac: str = "0e:00:00:00:00:02"):
    return api.put_node(name, [cidr], {
        P + "kube-subnet-manager": "true", P + "backend-type": "vxlan",
        P + "backend-data": json.dumps({"VNI": 1, "VtepMAC": mac}), P + "public-ip": ip})


class Follower:
    def __init__(self, sm: KubeSubnetManager, own, config, check=True) -> None:
        self.watcher = LeaseWatcher(own, config if check else None)
        self.config = config
        self.events: list[tuple[EventType, str]] = []
        self.updates: list = []
        self.task = asyncio.create_task(self._run(sm))

    async def _run(self, sm):
        async for update in sm.watch_leases(self.config):
            self.updates.append(update)
            self.events += [(e.type, e.lease.key) for e in self.watcher.apply(update).events]

    async def wait_for(self, count: int, timeout: float = 10.0):
        async def enough():
            return len(self.events) >= count
        await async_wait_until(enough, timeout, what=f"{count} events, got {self.events}")
        return self.events[:count]

    async def stop(self):
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def write_kubeconfig(path: Path, server: str, cluster: dict, user: dict) -> Path:
    path.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}]}))
    return path


HOST_GW = {"Network": "10.244.0.0/16", "Backend": {"Type": "host-gw"}}


@contextlib.asynccontextmanager
async def api_in(ns: str):
    """The API double on this event loop, listening on 127.0.0.1 inside ``ns``."""
    with Host(ns).entered():  # the socket stays in the namespace; this loop serves it
        sock = socket.create_server(("127.0.0.1", 0))
    server = FakeKubeAPI()
    await server.start(sock=sock)
    try:
        yield server
    finally:
        await server.stop()
