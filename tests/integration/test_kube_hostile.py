"""The Kubernetes client and the kube subnet manager against a hostile API server: raw
asyncio servers on loopback that answer with bytes no real API server sends (an answer
nobody asked for, another node's object, a list body that never ends, a watch closed
after every event), and the API double (tests/support/kubeapi.py) where a real answer is
needed. Each test says what a user would see go wrong without the defence."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flannel.clients.kube.client import ApiStatusError, ApiUnreachable, KubeClient
from flannel.clients.kube.config import client_config
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import KubeError, KubeSubnetManager, KubeUnavailable, kube_client
from flannel.subnet.watch import LeaseWatcher
from tests.integration.test_kube_manager import VXLAN, manager, remote
from tests.support.kubeapi import FakeKubeAPI
from tests.support.waiting import async_wait_until
from tests.unit.test_daemon import CONFIG
from tests.unit.test_daemon import Node as DaemonNode

NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[str]:
    """A loopback server running ``handler`` for every connection; its URL."""
    tasks: set[asyncio.Task[None]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.add(asyncio.current_task())
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_request(reader: asyncio.StreamReader) -> str:
    """The request line of the next request (its headers skipped); "" at the end."""
    line = await reader.readline()
    while await reader.readline() not in (b"\r\n", b""):
        pass
    return line.decode().strip()


def response(doc: object) -> bytes:
    body = json.dumps(doc).encode()
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def node(name: str, cidr: str) -> dict[str, object]:
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "resourceVersion": "7"},
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}}


def client_for(url: str, **options: object) -> KubeClient:
    return KubeClient(client_config(url, "", {}), **options)


# -- 1. an answer nobody asked for ------------------------------------------------------

@pytest.mark.parametrize("delivered", [True, False], ids=["in-the-stream", "in-the-kernel"])
async def test_an_answer_sent_unasked_is_never_read_as_the_next_one(delivered):
    """A server (or a proxy) sends a second answer after the first, unasked. Reusing the
    kept-alive connection would read it as the answer to the next request: a forged podCIDR
    for our node. The connection is dropped instead, and the next request gets its own
    answer on a new one, whether the extra bytes already reached the client's buffer or
    still wait in the kernel's."""
    forge, forged = asyncio.Event(), asyncio.Event()
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        while await read_request(reader):
            writer.write(response(node("node1", "10.244.1.0/24")))
            await writer.drain()
            if first:
                first = False
                await forge.wait()
                writer.write(response(node("node1", "10.244.99.0/24")))
                await writer.drain()
                forged.set()

    async with raw_server(handler) as url:
        client = client_for(url)
        try:
            assert (await client.get_node("node1"))["spec"]["podCIDR"] == "10.244.1.0/24"
            forge.set()
            await forged.wait()
            if delivered:  # let the loop hand the bytes to the client's connection
                await asyncio.sleep(0.1)
            assert (await client.get_node("node1"))["spec"]["podCIDR"] == "10.244.1.0/24"
            assert connections == 2
        finally:
            await client.close()


# -- 2. another node's object -------------------------------------------------------------

@pytest.fixture
async def api():
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


async def test_another_nodes_object_is_never_taken_as_ours(api, tmp_path):
    """Asked for node1, the server answers with node2 (a misrouting proxy, a hostile
    server): taking it would lease node2's podCIDR, a duplicate subnet in the cluster.
    The answer is refused, naming both nodes, and nothing is published."""
    peer = remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
    api.put_raw_node("node1", copy.deepcopy(peer))
    sm = manager(api, tmp_path)
    try:
        config = await sm.get_network_config()
        with pytest.raises(KubeError) as caught:
            await sm.acquire_lease(config, VXLAN)
    finally:
        await sm.close()
    assert str(caught.value).endswith(
        "asked the API server for node 'node1', it answered with node 'node2'; check the API "
        "server URL and any proxy in front of it")
    assert api.patches == []


async def test_another_node_claiming_our_subnet_does_not_revoke_our_lease(api, tmp_path,
                                                                          caplog):
    """A peer Node annotated with our podCIDR, then deleted: were its lease taken for ours,
    its deletion would read as our lease revoked and flanneld would exit. It is ignored
    (logged once, naming both) and our lease stays; real peers keep arriving."""
    api.put_node("node1", ["10.244.1.0/24"])
    sm = manager(api, tmp_path)
    revoked: list[bool] = []
    seen: list[str] = []
    try:
        config = await sm.get_network_config()
        watcher = LeaseWatcher(await sm.acquire_lease(config, VXLAN), config)

        async def follow() -> None:
            async for update in sm.watch_leases(config):
                result = watcher.apply(update)
                revoked.append(result.own_lease_removed)
                seen.extend(e.lease.key for e in result.events)

        task = asyncio.create_task(follow())
        try:
            remote(api, "impostor", "10.244.1.0/24", "10.0.0.9")

            async def cached() -> bool:
                return "impostor" in sm.nodes
            await async_wait_until(cached, 10, what="the impostor in the node cache")
            api.delete_node("impostor")
            remote(api, "node3", "10.244.3.0/24", "10.0.0.3")

            async def peer_seen() -> bool:
                return "10.244.3.0-24" in seen
            await async_wait_until(peer_seen, 10, what="node3's lease")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await sm.close()
    assert not any(revoked)
    assert seen == ["10.244.3.0-24"]
    assert "ignoring node impostor: it claims this node's subnet 10.244.1.0-24 (node node1)" \
        in caplog.text


# -- 3. a list that never ends ------------------------------------------------------------

def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def test_a_list_body_that_never_ends_costs_a_few_bounds_not_nine():
    """A node list whose body never ends is cut at the page bound; each smaller page asked
    for costs that bound again, so the halving stops after a few pages, the smaller size is
    kept for the next listing, and the error names the bound."""
    limits: list[str] = []
    item = json.dumps(node("n", "10.244.1.0/24")).encode() + b","

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await read_request(reader):
            limits.append(line.split("limit=")[1].split(" ")[0].split("&")[0])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            writer.write(chunk(b'{"kind":"NodeList","metadata":{"resourceVersion":"5"},'
                               b'"items":['))
            while True:  # until the client gives up on this connection
                writer.write(chunk(item * 64))
                await writer.drain()

    async with raw_server(handler) as url:
        client = client_for(url, max_page_bytes=256 * 1024)
        try:
            with pytest.raises(ApiUnreachable) as caught:
                await client.list_nodes(lambda n: n)
            assert caught.value.too_large
            assert str(caught.value).endswith("larger than the limit of 262144 bytes")
            assert limits == ["100", "50", "25", "12"]
            with pytest.raises(ApiUnreachable):
                await client.list_nodes(lambda n: n)
            assert limits[4:] == ["12"]
        finally:
            await client.close()


async def test_a_list_is_bounded_in_time_per_page_and_as_a_whole():
    """A page body trickling a byte at a time ends at the page's deadline; pages that keep
    coming with a continue token forever end at the listing's deadline (and what they gave
    is not kept for the next listing)."""
    endless_pages = False
    pages = itertools.count()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            if endless_pages:
                writer.write(response({"kind": "NodeList", "metadata": {
                    "resourceVersion": "5", "continue": f"more{next(pages)}"},
                    "items": [node("n", "10.244.1.0/24")]}))
                await writer.drain()
                continue
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n")
            while True:
                writer.write(b" ")
                await writer.drain()
                await asyncio.sleep(0.01)

    async with raw_server(handler) as url:
        client = client_for(url, list_timeout=0.5, list_deadline=1.5)
        try:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(ApiUnreachable, match=r"did not answer within 0\.5s$"):
                await client.list_nodes(lambda n: n)
            assert loop.time() - started < 1.5
            endless_pages = True
            started = loop.time()
            with pytest.raises(ApiUnreachable, match=r"the node list did not end within 1\.5s$"):
                await client.list_nodes(lambda n: n)
            assert loop.time() - started < 3
        finally:
            await client.close()


async def test_a_continue_token_that_comes_back_is_refused():
    """A server whose continue tokens cycle (a, b, a, ...) would be listed for ever, its
    nodes kept again and again until the listing's deadline: the second time a token is
    given, the listing ends with an error that says so."""
    asked: list[str] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await read_request(reader):
            asked.append(line)
            token = "b" if "continue=a" in line else "a"
            writer.write(response({"kind": "NodeList", "metadata": {
                "resourceVersion": "5", "continue": token},
                "items": [node("n", "10.244.1.0/24")]}))
            await writer.drain()

    async with raw_server(handler) as url:
        client = client_for(url)
        try:
            with pytest.raises(ApiUnreachable) as caught:
                await client.list_nodes(lambda n: n)
        finally:
            await client.close()
    assert str(caught.value).endswith(
        "the node list gave a continue token it had given before (it would never end)")
    assert len(asked) == 3


async def test_a_listing_cut_part_way_goes_on_from_its_continue_token(api):
    """The server fails the third page of a listing: the retry asks for the third page
    again (its continue token), not for the whole list from the start."""
    for i in range(2, 1201):
        api.put_node(f"node{i}", [f"10.{i // 256}.{i % 256}.0/24"])
    client = client_for(api.url, page_size=500)
    seen = 0

    def keep(item: dict) -> str:
        nonlocal seen
        seen += 1
        if seen == 501:  # the second page is being read: the third one will fail
            api.fail_next.append((503, "the server is shutting down"))
        return item["metadata"]["name"]

    try:
        with pytest.raises(ApiStatusError):
            await client.list_nodes(keep)
        api.requests.clear()
        names, version = await client.list_nodes(keep)
        assert sorted(names) == sorted(api.nodes) and version == str(api.rv)
        assert len(api.requests) == 1 and "continue=" in api.requests[0]
    finally:
        await client.close()


# -- 4. a watch closed after every event --------------------------------------------------

def sm_for(url: str, tmp_path, **options: object) -> KubeSubnetManager:
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}))
    return KubeSubnetManager(kube_client(url, "", {}), "node1", NAMES, str(conf),
                             **{"pod_cidr_wait": 2, "retry_interval": 0.1, **options})


def short_watches(hold: float, times: list[float]) -> Handler:
    """A server whose every watch delivers one event, stays open ``hold`` seconds, then
    ends; the loop time of each watch request goes to ``times``."""
    version = 5

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal version
        while line := await read_request(reader):
            if "watch=true" not in line:
                writer.write(response({"kind": "NodeList", "metadata": {"resourceVersion": "5"},
                                       "items": [node("node1", "10.244.1.0/24")]}))
                await writer.drain()
                continue
            times.append(asyncio.get_running_loop().time())
            version += 1
            event = node("node2", "10.244.2.0/24")
            event["metadata"]["resourceVersion"] = str(version)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(json.dumps(
                             {"type": "MODIFIED", "object": event}).encode() + b"\n"))
            await writer.drain()
            await asyncio.sleep(hold)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return

    return handler


async def watches_of(url: str, tmp_path, count: int, times: list[float],
                     **options: object) -> list[float]:
    """The gaps between the first ``count`` watch requests of a node store."""
    sm = sm_for(url, tmp_path, **options)
    updates = sm.watch_leases(await sm.get_network_config())
    try:
        await asyncio.wait_for(anext(updates), 10)

        async def enough() -> bool:
            return len(times) >= count
        await async_wait_until(enough, 20, what=f"{count} watch requests, got {len(times)}")
    finally:
        await updates.aclose()
        await sm.close()
    return [later - earlier for earlier, later in itertools.pairwise(times[:count])]


async def test_a_watch_ended_after_every_event_is_reopened_with_backoff(tmp_path):
    """A server that ends every watch right after one event would be asked again ten times
    a second: each reopening waits twice as long as the one before."""
    times: list[float] = []
    async with raw_server(short_watches(0, times)) as url:
        gaps = await watches_of(url, tmp_path, 5, times)
    assert [gap >= 0.9 * want for gap, want in zip(gaps, (0.1, 0.2, 0.4, 0.8), strict=True)] \
        == [True] * 4, gaps


async def test_watches_that_lived_long_enough_are_reopened_at_once(tmp_path):
    """A watch that lived its course (a real server's timeoutSeconds, here shortened with
    ``watch_healthy``) is not penalised: every reopening waits the first delay only."""
    times: list[float] = []
    async with raw_server(short_watches(0.4, times)) as url:
        gaps = await watches_of(url, tmp_path, 6, times, watch_healthy=0.3)
    # 0.4 s of watch and 0.1 s of backoff each; growing, the last two would be 1.2 s and 2 s.
    assert [gap < 1.0 for gap in gaps] == [True] * 5, gaps


# -- 5. what the start waits for ---------------------------------------------------------

async def test_the_start_says_what_it_waits_for_once_per_cause(api, tmp_path, caplog):
    """While our Node is missing, then has no podCIDR yet, the lease acquisition waits:
    the store's status (what /readyz shows) names the cause, each cause is logged once,
    and the lease comes as soon as the podCIDR is assigned."""
    sm = sm_for(api.url, tmp_path, pod_cidr_wait=20)
    causes: list[str] = []
    sm.status.follow(lambda ready, why: causes.append("ready" if ready else why))
    try:
        config = await sm.get_network_config()
        acquiring = asyncio.create_task(sm.acquire_lease(config, VXLAN))

        def waiting_for(text: str) -> Callable[[], Awaitable[bool]]:
            async def named() -> bool:
                return text in sm.status.reason
            return named
        await async_wait_until(waiting_for('node "node1" not found'), 10)
        api.put_node("node1", [])
        await async_wait_until(waiting_for("podCIDR is not assigned yet"), 10)
        api.put_node("node1", ["10.244.7.0/24"])
        lease = await asyncio.wait_for(acquiring, 10)
    finally:
        await sm.close()
    assert str(lease.subnet) == "10.244.7.0/24"
    missing = ('waiting for node node1: node "node1" not found in the API server: waiting '
               "for it to be registered (by its kubelet; check NODE_NAME if it never is)")
    assert causes == [
        "ready",
        missing,
        "waiting for node node1: its podCIDR is not assigned yet "
        "(kube-controller-manager --allocate-node-cidrs)",
        "ready"]
    logged = [r.getMessage() for r in caplog.records if "waiting for node" in r.getMessage()]
    assert [line.split(" (retrying")[0] for line in logged] == [
        missing,
        "waiting for node node1: its podCIDR is not assigned yet "
        "(kube-controller-manager --allocate-node-cidrs)"]


async def test_readyz_names_what_the_start_waits_for(api, tmp_path):
    """flanneld in kube mode on a node whose podCIDR is not assigned yet: /readyz says the
    lease acquisition waits for it (not just "acquiring a lease"), then goes ready."""
    api.put_node("node1", [])
    conf = tmp_path / "net-conf.json"
    conf.write_text(CONFIG)
    sm = KubeSubnetManager(kube_client(api.url, "", {}), "node1", NAMES, str(conf),
                           pod_cidr_wait=20, retry_interval=0.1)
    node = DaemonNode(tmp_path, store=sm).start()  # the real store, a recording backend
    try:
        await node.wait_readyz(503, "acquiring a lease: waiting for node node1: its podCIDR "
                                    "is not assigned yet")
        api.put_node("node1", ["10.5.1.0/24"])
        assert await node.wait_readyz(200) == "flanneld is ready\n"
    finally:
        await node.stop()


# -- 6. a relist while the data plane is programmed -----------------------------------

async def test_a_relist_keeps_a_programmed_node_ready(api, tmp_path, caplog, monkeypatch):
    """After a 410 Gone the store relists every node; when nothing changed, the data plane
    still has every peer, and the node must not go not ready meanwhile (a rollout gated on
    readiness, or a load balancer health check, would see it flap at every relist)."""
    caplog.set_level(logging.INFO)
    api.put_node("node1", ["10.5.1.0/24"])
    prefix = "flannel.alpha.coreos.com/"
    api.put_node("node2", ["10.5.2.0/24"], {
        prefix + "kube-subnet-manager": "true", prefix + "backend-type": "host-gw",
        prefix + "backend-data": "null", prefix + "public-ip": "192.0.2.2"})
    conf = tmp_path / "net-conf.json"
    conf.write_text(CONFIG)
    sm = KubeSubnetManager(kube_client(api.url, "", {}), "node1", NAMES, str(conf),
                           pod_cidr_wait=20, retry_interval=0.1)
    node = DaemonNode(tmp_path, store=sm).start()
    try:
        await node.wait_readyz(200)
        assert node.backend is not None and len(node.backend.peer_sets[-1]) == 1
        readiness = node.daemon.readiness
        flips: list[str] = []
        report = readiness.report

        def recording(component: str, ready: bool, reason: str = "") -> None:
            report(component, ready, reason)
            if not readiness.current()[0]:
                flips.append(readiness.current()[1])
        monkeypatch.setattr(readiness, "report", recording)

        def snapshots() -> int:
            return sum(r.getMessage().startswith("Lease snapshot:") for r in caplog.records)
        before = snapshots()
        api.cut_watches()
        api.put_node("node2", conditions=[{"type": "Ready", "status": "True"}])
        api.compact()  # the resumed watch missed a change: 410 Gone, a full relist

        async def relisted() -> bool:
            return snapshots() > before
        await async_wait_until(relisted, 10, what="the relist's snapshot")
        assert sm.status.relists == 2
        assert flips == []
        assert await node.readyz() == (200, "flanneld is ready\n")
    finally:
        await node.stop()


# -- 7. answers over their budget, of another shape, redirected, dripping -----------------

async def test_a_page_of_tiny_elements_within_its_bytes_is_asked_again_smaller():
    """3.9 MiB of ``[]`` fits a page's bytes but decodes to 1.3 million lists (100 MB):
    it is refused by the page's element budget before decoding, and smaller pages are asked
    for, as for a page over its bytes."""
    limits: list[str] = []
    body = (b'{"kind":"NodeList","metadata":{"resourceVersion":"5"},"items":['
            + b"[]," * 1_300_000 + b"[]]}")

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await read_request(reader):
            limits.append(line.split("limit=")[1].split(" ")[0].split("&")[0])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()

    async with raw_server(handler) as url:
        client = client_for(url)
        try:
            with pytest.raises(ApiUnreachable) as caught:
                await client.list_nodes(lambda n: n)
        finally:
            await client.close()
    assert caught.value.too_large
    assert str(caught.value) == (f"{url}: the answer to GET /api/v1/nodes has more JSON "
                                 "elements than its budget of 150000")
    assert limits == ["100", "50", "25", "12"]


@pytest.mark.parametrize(("page", "message"), [
    ("boom", "the node list is not a NodeList (not a JSON object)"),
    ({"metadata": {"resourceVersion": "5"}, "items": 5},
     "the node list's items is not a JSON array"),
    ({"metadata": [], "items": []}, "the node list's metadata is not a JSON object"),
    ({"metadata": {"resourceVersion": 7}, "items": []},
     "the node list's metadata.resourceVersion is not a resource version"),
    ({"metadata": {"resourceVersion": "5", "continue": 5}, "items": []},
     "the node list's metadata.continue is not a continue token"),
])
async def test_a_node_list_of_another_shape_names_the_field(page, message):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            writer.write(response(page))
            await writer.drain()

    async with raw_server(handler) as url:
        client = client_for(url)
        try:
            with pytest.raises(ApiUnreachable) as caught:
                await client.list_nodes(lambda n: n)
        finally:
            await client.close()
    assert str(caught.value) == f"{url}: {message}"


@pytest.mark.parametrize(("event", "outcome"), [
    (b'{"type": 5, "object": {}}', "an event without a type (a string) and an object"),
    (b'{"type": "ADDED", "object": "node1"}', "an event without a type (a string) and an object"),
    (b"[]", "an event that is not a JSON object"),
    (b'{"type": "ERROR", "object": {"code": "410", "message": {"x": 1}}}', 500),
    (b'{"type": "ERROR", "object": {"code": true}}', 500),
    (b'{"type": "ERROR", "object": {"code": 410, "reason": "Expired"}}', 410),
])
async def test_a_watch_event_of_another_shape_is_an_error_naming_it(event, outcome):
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(event + b"\n"))
            await writer.drain()

    async with raw_server(handler) as url:
        client = client_for(url)
        try:
            with pytest.raises((ApiUnreachable, ApiStatusError)) as caught:
                async for _event in client.watch_nodes("5"):
                    pass
        finally:
            await client.close()
    if isinstance(outcome, int):
        assert isinstance(caught.value, ApiStatusError) and caught.value.code == outcome
    else:
        assert isinstance(caught.value, ApiUnreachable) and caught.value.relist
        assert str(caught.value) == f"node watch: {outcome}"


async def test_a_dripping_watch_event_is_cut_at_its_budget():
    """An event that never ends (a byte a second) held the watch until its 10-minute
    deadline, every byte resetting the idle timer: it must arrive within its budget."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n" + chunk(b'{"type": "ADD'))
            while True:
                writer.write(chunk(b" "))
                await writer.drain()
                await asyncio.sleep(0.2)

    async with raw_server(handler) as url:
        client = client_for(url)
        client.event = dataclasses.replace(client.event, seconds=1.0)
        loop = asyncio.get_running_loop()
        try:
            started = loop.time()
            with pytest.raises(ApiUnreachable) as caught:
                async for _event in client.watch_nodes("5"):
                    pass
            assert loop.time() - started < 3
        finally:
            await client.close()
    assert str(caught.value) == (f"{url}: node watch: a message took longer than its "
                                 "budget of 1s to arrive")


@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_never_takes_the_bearer_token_elsewhere(tmp_path, status):
    """A server (or a proxy in front of it) answering with a redirect to another host:
    following it would send the node's token there. Not followed: the other host never
    sees a connection, and the error names the redirect (retried, like an outage)."""
    from tests.integration.test_kube_client import write_kubeconfig

    elsewhere: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        elsewhere.append(await reader.read(65536))

    async with raw_server(record) as other:
        location = f"{other}/api/v1/nodes/node1"

        async def redirecting(reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter) -> None:
            while await read_request(reader):
                writer.write(f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\n"
                             "Content-Length: 0\r\n\r\n".encode())
                await writer.drain()

        async with raw_server(redirecting) as url:
            config = write_kubeconfig(tmp_path / "kubeconfig", url, {}, {"token": "s3cret"})
            sm = KubeSubnetManager(kube_client("", str(config), {}), "node1", NAMES,
                                   str(tmp_path / "net-conf.json"))
            try:
                with pytest.raises(KubeUnavailable) as caught:
                    await sm.get_node()
                with pytest.raises(ApiUnreachable):
                    async for _event in sm.client.watch_nodes("5"):
                        pass
            finally:
                await sm.close()
    assert elsewhere == []
    assert str(caught.value) == (
        f"cannot get node 'node1': {url} answered HTTP {status}, a redirect to "
        f"{location!r}; flanneld does not follow redirects (its credentials stay with the "
        f"server given by the kubeconfig {config}): give the API server's own address")


@pytest.mark.parametrize("status", [401, 429, 503])
async def test_an_error_storm_on_the_node_watch_backs_off(api, tmp_path, status):
    """Every watch and list answered with an error: each retry waits longer than the one
    before, and the node store keeps what it has."""
    api.put_node("node1", ["10.244.1.0/24"])
    sm = sm_for(api.url, tmp_path)
    updates = sm.watch_leases(await sm.get_network_config())
    try:
        await asyncio.wait_for(anext(updates), 10)
        api.fail_next = [(status, "storm")] * 1000
        asked = len(api.requests)
        api.cut_watches()
        await asyncio.sleep(3.5)
        retries = len(api.requests) - asked
    finally:
        await updates.aclose()
        await sm.close()
    # 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of backoff fit in 3.5 s.
    assert 2 <= retries <= 7, retries
    assert "node1" in sm.nodes
