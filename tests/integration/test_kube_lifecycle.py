"""Kubernetes mode over a node's life: the daemon in-process with the real kube subnet manager
and API client against the API-server test double (tests/support/kubeapi.py), and flanneld as
a process in a network namespace (alloc; a node losing its annotations, then deleted). What a
user sees is asserted: flanneld keeps running, its node carries its annotations and
condition, /readyz, /status and /metrics say what is wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from flannel.backend import backend_class
from flannel.backend.base import BackendOptions
from flannel.config import NetworkConfig
from flannel.daemon import Daemon, PublicIPs
from flannel.kernel.iface import ExternalInterface
from flannel.settings import InterfaceSettings
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import KubeSubnetManager, kube_client
from flannel_lab.etcd import free_port
from tests.support import netns
from tests.support.daemonnode import EXT, InstalledRules, RecordingBackend, get
from tests.support.flanneld import Flanneld
from tests.support.kubeapi import FakeKubeAPI
from tests.support.kubestore import HOST_GW, api_in
from tests.support.traffic import http_get
from tests.support.waiting import async_wait_until, wait_until

ROOT = Path(__file__).resolve().parents[2]
P = "flannel.alpha.coreos.com/"
NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")
ALLOC = {"Network": "10.244.0.0/16", "Backend": {"Type": "alloc"}}
#: What node1's flanneld publishes with the host-gw backend and EXT as its interface.
PUBLISHED = {P + "backend-type": "host-gw", P + "kube-subnet-manager": "true",
             P + "backend-data": "null", P + "public-ip": "192.0.2.1"}

pytestmark = pytest.mark.virtual_time


@pytest.fixture
async def api():
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


class KubeNode:
    """node1's flanneld in this event loop: the real daemon, kube manager and client; the
    backend records instead of programming (alloc: the real one, which programs nothing)."""

    def __init__(self, api: FakeKubeAPI, tmp_path: Path, config: dict) -> None:
        from flannel.flags import parse_args

        self.port = free_port()
        conf = tmp_path / "net-conf.json"
        conf.write_text(json.dumps(config))
        self.settings = parse_args(
            ["--iptables-forward-rules=false", "--healthz-ip=127.0.0.1",
             f"--healthz-port={self.port}", f"--subnet-file={tmp_path / 'subnet.env'}",
             "--kube-subnet-mgr", f"--kube-api-url={api.url}",
             f"--net-config-path={conf}"], {})
        self.sm = KubeSubnetManager(kube_client(api.url, "", {}), "node1", NAMES, str(conf),
                                    keep_backoff=(0.05, 0.5), recheck=0.5)
        self.daemon = Daemon(self.settings, store=lambda _s: self.sm,
                             interface=self._interface, backend=self._backend,
                             rules=lambda r, _c, _l, _p: InstalledRules(r.resync))
        self.task: asyncio.Task[int] | None = None

    @staticmethod
    async def _interface(_settings: InterfaceSettings, _config: NetworkConfig,
                         imposed: PublicIPs) -> ExternalInterface:
        public_v4, _ = imposed  # the node-public-ip annotation, as the real selection takes it
        return replace(EXT, ext_addr=public_v4) if public_v4 else EXT

    @staticmethod
    def _backend(ext: ExternalInterface, config: NetworkConfig, options: BackendOptions):
        if config.backend_type == "alloc":
            return backend_class("alloc")(ext, config, options)
        return RecordingBackend(ext, config, options)

    def start(self) -> KubeNode:
        self.task = asyncio.create_task(self.daemon.run())
        return self

    async def get(self, path: str) -> tuple[int, str]:
        return await get(self.port, path)

    async def wait_readyz(self, status: int, needle: str = "", timeout: float = 10) -> str:
        async def answered():
            self.check_running()
            code, body = await self.get("/readyz")
            return body if code == status and needle in body else ""
        return await async_wait_until(answered, timeout, what=f"/readyz {status} {needle!r}")

    async def status(self) -> dict:
        code, body = await self.get("/status")
        assert code == 200, body
        return json.loads(body)

    async def metric(self, sample: str) -> float:
        self.check_running()
        _, body = await self.get("/metrics")
        found = re.search(rf"^{re.escape(sample)} (\S+)$", body, re.M)
        assert found, f"{sample} not in /metrics:\n{body}"
        return float(found.group(1))

    def check_running(self) -> None:
        """Fails at once, saying how, when flanneld has exited (instead of timing out)."""
        assert self.task is not None
        if self.task.done():
            raise AssertionError(f"flanneld exited with {self.task.result()}")

    def running(self) -> bool:
        assert self.task is not None
        return not self.task.done()

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.daemon.stop.set()
            await asyncio.wait_for(self.task, 10)


@contextlib.asynccontextmanager
async def running(api: FakeKubeAPI, tmp_path: Path, config: dict):
    node = KubeNode(api, tmp_path, config).start()
    try:
        yield node
    finally:
        await node.stop()


def annotations(api: FakeKubeAPI) -> dict[str, str]:
    return dict(api.nodes["node1"]["metadata"]["annotations"])


def condition(api: FakeKubeAPI) -> dict | None:
    conditions = api.nodes["node1"]["status"]["conditions"]
    return next((c for c in conditions if c["type"] == "NetworkUnavailable"), None)


async def until(check, what: str, timeout: float = 10) -> None:
    async def holds():
        return check()
    await async_wait_until(holds, timeout, what=what)


async def test_alloc_runs_and_stays_ready_without_watching_nodes(api, tmp_path):
    """Go's alloc in kube mode publishes the node's annotations and runs without a node
    informer; it used to read the empty lease set as its own lease removed and exit 0."""
    api.put_node("node1", ["10.244.1.0/24"])
    async with running(api, tmp_path, ALLOC) as node:
        await node.wait_readyz(200)
        assert annotations(api)[P + "kube-subnet-manager"] == "true"
        await until(lambda: condition(api) is not None, "the NetworkUnavailable condition")
        assert condition(api)["status"] == "False"
        # Its annotations removed: put back by the periodic look at its own node.
        api.remove_annotations("node1", P + "kube-subnet-manager", P + "public-ip")
        await until(lambda: annotations(api).get(P + "kube-subnet-manager") == "true",
                    "the annotations published again")
        assert node.running()
        assert not any("watch" in r or r.startswith("GET /api/v1/nodes?")
                       for r in api.requests)  # no node list nor watch, as Go


async def test_removed_annotations_are_published_again(api, tmp_path, caplog):
    api.put_node("node1", ["10.244.1.0/24"])
    async with running(api, tmp_path, HOST_GW) as node:
        await node.wait_readyz(200)
        assert annotations(api) == PUBLISHED
        api.remove_annotations("node1", *PUBLISHED)
        await until(lambda: annotations(api) == PUBLISHED, "the annotations published again")
        await node.wait_readyz(200)
        assert node.running()
    assert "Lease has been revoked" not in caplog.text


async def test_a_decoding_bug_in_the_node_watch_exits_one_with_its_traceback(
        api, tmp_path, caplog, monkeypatch):
    from flannel.subnet.kube import manager as kube

    api.put_node("node1", ["10.244.1.0/24"])
    async with running(api, tmp_path, HOST_GW) as node:
        await node.wait_readyz(200)
        real = kube.node_view

        def node_view(raw, prefix):  # a bug, hit by node2 only
            if raw["metadata"]["name"] == "node2":
                return raw["spec"]["podCIDRs"] + 1
            return real(raw, prefix)
        monkeypatch.setattr(kube, "node_view", node_view)
        api.put_node("node2", ["10.244.2.0/24"])
        assert node.task is not None
        assert await asyncio.wait_for(node.task, 10) == 1
    bug = [r for r in caplog.records if r.exc_info]
    assert [r.getMessage() for r in bug] == [
        "leases failed on a bug in flanneld; please report it with this traceback"]
    assert bug[0].exc_info[0] is TypeError
    assert caplog.records[-1].getMessage() == (
        'Exiting: leases failed: TypeError: can only concatenate list (not "int") to list')
    assert "node watch failed" not in caplog.text  # not relisted for ever


async def test_a_deleted_node_is_waited_for_and_published_again(api, tmp_path):
    api.put_node("node1", ["10.244.1.0/24"])
    async with running(api, tmp_path, HOST_GW) as node:
        await node.wait_readyz(200)
        await until(lambda: condition(api) is not None, "the NetworkUnavailable condition")
        api.delete_node("node1")
        reason = await node.wait_readyz(503, "node1")
        assert "not in the API server" in reason
        status = await node.status()
        assert status["store"]["writes"]["annotations"]["ok"] is False
        assert node.running()
        # Registered again (as a kubelet does): no annotations, no condition yet.
        api.put_node("node1", ["10.244.1.0/24"])
        await until(lambda: annotations(api) == PUBLISHED, "the annotations published again")
        await until(lambda: (condition(api) or {}).get("status") == "False",
                    "NetworkUnavailable=False set again on the new node")
        await node.wait_readyz(200)
        assert node.running()


async def test_refused_writes_after_start_are_retried_shown_and_never_fatal(api, tmp_path):
    api.put_node("node1", ["10.244.1.0/24"], PUBLISHED)  # nothing to publish at start
    api.refuse_patches = (403, 'nodes "node1" is forbidden: User cannot patch nodes/status')
    async with running(api, tmp_path, HOST_GW) as node:
        # The condition cannot be set: shown, counted, retried; the node is still ready.
        await node.wait_readyz(200)

        async def condition_failed_twice():
            return await node.metric(
                'flannel_store_write_failures_total{write="condition"}') >= 2
        await async_wait_until(condition_failed_twice, 10, what="two failed condition writes")
        assert await node.metric('flannel_store_write_failing{write="condition"}') == 1
        writes = (await node.status())["store"]["writes"]
        assert writes["condition"]["ok"] is False
        assert "forbidden" in writes["condition"]["error"]
        assert any("condition" in e for e in (await node.status())["last_errors"])
        # Its annotations removed while writes are refused: not ready, saying why.
        api.remove_annotations("node1", P + "public-ip")
        reason = await node.wait_readyz(503, "annotations")
        assert "forbidden" in reason
        assert await node.metric('flannel_store_write_failing{write="annotations"}') == 1
        assert await node.metric('flannel_component_ready{component="lease"}') == 0
        # Allowed again: everything is written, the node is ready again.
        api.refuse_patches = None
        await node.wait_readyz(200)
        await until(lambda: annotations(api) == PUBLISHED, "the annotations published again")
        await until(lambda: (condition(api) or {}).get("status") == "False",
                    "NetworkUnavailable=False")
        assert await node.metric('flannel_store_write_failing{write="condition"}') == 0
        assert await node.metric('flannel_store_write_failing{write="annotations"}') == 0
        assert node.running()


async def test_the_node_public_ip_read_waits_for_the_node(api, tmp_path, caplog):
    """The node-public-ip annotation is read before the interface is chosen: while the node
    is not there, flanneld waits and says for what, then uses the annotation."""
    async with running(api, tmp_path, HOST_GW) as node:
        await node.wait_readyz(503, "public IP")

        async def logged():
            return 'node "node1" not found' in caplog.text
        await async_wait_until(logged, 10, what="the wait logged")
        await until(lambda: sum(r.startswith("GET /api/v1/nodes/node1") for r in api.requests)
                    >= 3, "three reads of the node")
        assert node.running()
        api.put_node("node1", ["10.244.1.0/24"], {P + "node-public-ip": "192.0.2.77"})
        await node.wait_readyz(200, timeout=15)
        assert annotations(api)[P + "public-ip"] == "192.0.2.77"


def test_alloc_flanneld_process_stays_up(ns, tmp_path, monkeypatch):
    """The process a DaemonSet runs: alloc in kube mode stays up and ready."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    api = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, "-m", "tests.support.kubeapi",
         "--port", "16443", "--node", "node1=10.244.1.0/24"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps(ALLOC))
    monkeypatch.setenv("NODE_NAME", "node1")
    daemon = Flanneld(tmp_path, ["--kube-subnet-mgr", "--kube-api-url=http://127.0.0.1:16443",
                                 f"--net-config-path={conf}",
                                 f"--subnet-file={tmp_path / 'subnet.env'}",
                                 "--iptables-forward-rules=false", "--healthz-ip=127.0.0.1",
                                 "--healthz-port=10280"], netns=ns)
    try:
        assert api.stdout.readline().startswith("listening")
        daemon.start()
        wait_until(lambda: "Ready:" in daemon.log or daemon.proc.poll() is not None, 20,
                   what=f"flanneld ready or exited:\n{daemon.log}")
        assert daemon.proc.poll() is None, daemon.log
        assert http_get(ns, "http://127.0.0.1:10280/readyz")[0] == 200
        assert daemon.proc.poll() is None, daemon.log
    finally:
        daemon.stop()
        api.terminate()
        api.wait(timeout=10)


async def test_flanneld_process_survives_its_node_losing_annotations_and_being_deleted(
        ns, tmp_path, monkeypatch):
    """What a DaemonSet's flanneld goes through: its annotations removed by hand, then its
    Node deleted and registered again. It keeps running and puts its record back."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps(HOST_GW))
    monkeypatch.setenv("NODE_NAME", "node1")
    published = {**PUBLISHED, P + "public-ip": "10.99.0.2"}
    async with api_in(ns) as api:
        api.put_node("node1", ["10.244.1.0/24"])
        daemon = Flanneld(tmp_path, [
            "--kube-subnet-mgr", f"--kube-api-url={api.url}", f"--net-config-path={conf}",
            f"--subnet-file={tmp_path / 'subnet.env'}", "--iptables-forward-rules=false",
            "--healthz-ip=127.0.0.1", "--healthz-port=10280"], netns=ns).start()

        def alive() -> None:
            assert daemon.proc is not None
            assert daemon.proc.poll() is None, f"flanneld exited:\n{daemon.log}"

        async def readyz() -> int:
            return (await asyncio.to_thread(http_get, ns, "http://127.0.0.1:10280/readyz"))[0]

        async def until_ok(check, what: str, timeout: float = 20) -> None:
            async def holds():
                alive()
                return await check() if asyncio.iscoroutinefunction(check) else check()
            await async_wait_until(holds, timeout, what=f"{what}:\n{daemon.log}")

        try:
            await until_ok(lambda: "Ready:" in daemon.log, "flanneld ready")
            assert annotations(api) == published
            api.remove_annotations("node1", *published)
            await until_ok(lambda: annotations(api) == published, "annotations put back")
            api.delete_node("node1")
            await until_ok(lambda: "no longer in the API server" in daemon.log, "the loss logged")

            async def not_ready():
                return await readyz() == 503
            await until_ok(not_ready, "/readyz 503 while the node is gone")
            api.put_node("node1", ["10.244.1.0/24"])
            await until_ok(lambda: annotations(api) == published
                           and (condition(api) or {}).get("status") == "False",
                           "annotations and condition on the node registered again")

            async def ready():
                return await readyz() == 200
            await until_ok(ready, "/readyz 200 again")
            daemon.signal()
            assert await asyncio.to_thread(daemon.wait_exit) == 0
        finally:
            daemon.stop()


async def test_a_node_registered_anew_with_other_pod_cidrs_is_reported(api, tmp_path, caplog):
    """The subnet taken at start stays in use (pods hold its addresses); the log says the
    node now has another and that a restart takes it."""
    api.put_node("node1", ["10.244.1.0/24"])
    async with running(api, tmp_path, HOST_GW) as node:
        await node.wait_readyz(200)
        api.delete_node("node1")
        await node.wait_readyz(503, "node1")
        api.put_node("node1", ["10.244.9.0/24"])
        await until(lambda: annotations(api) == PUBLISHED, "the annotations published again")
        await node.wait_readyz(200)
        assert node.running()
    assert ("node node1 now has the pod CIDR(s) 10.244.9.0/24 but this flanneld uses "
            "10.244.1.0-24; restart flanneld to take the node's") in caplog.text
