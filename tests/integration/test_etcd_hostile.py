"""The etcd client and subnet manager against a hostile gateway in front of a real etcd
(tests/support/etcdgateway.py): answers of any size and shape, pages that never end, drips,
resets, redirects, watch streams that break, compact or lie about revisions. Each test says
what a user would see go wrong without the defence: a node that never leases, a flanneld
that eats the machine's memory, a lease re-created for nothing, a token sent elsewhere."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from ipaddress import IPv4Address

import pytest

from flannel.clients import etcd as etcdclient
from flannel.clients.etcd import (
    PAGE,
    WATCH_MESSAGE,
    EtcdClient,
    EtcdOptions,
    EtcdTooLarge,
    EtcdUnavailable,
    parse_endpoints,
)
from flannel.lease import EventType, LeaseAttrs
from flannel.subnet.etcd.manager import EtcdSubnetManager
from flannel.subnet.watch import Snapshot
from tests.integration.test_etcd_manager import CONFIG, Collector, acquire, attrs, put_lease
from tests.support.etcdgateway import (
    EtcdGateway,
    Request,
    Upstream,
    answer,
    b64,
    chunk,
    endless,
    redirect,
    stream_head,
)
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.etcd

MIB = 1024 * 1024


@pytest.fixture
async def gateway(etcd) -> AsyncIterator[EtcdGateway]:
    async with EtcdGateway(etcd.client_port) as gw:
        yield gw


def client_of(gw: EtcdGateway, **options: object) -> EtcdClient:
    return EtcdClient(EtcdOptions(parse_endpoints(gw.endpoint), **{"timeout": 3, **options}))


def always(*pieces: bytes):
    async def rule(_request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
    return rule


def from_gen(make):
    async def rule(_request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        async for piece in make():
            yield piece
    return rule


# -- 1. answers too large for their budget: never decoded ----------------------------------

@pytest.mark.parametrize(("unit", "what"), [(b"{},", "{}"), (b"[],", "[]"), (b"0,", "0")])
async def test_60_mib_of_tiny_elements_is_cut_at_the_page_budget(gateway, unit, what):
    """60 MiB of ``{}`` decode to 2.4 GB of dicts (flanneld was OOM-killed, its loop blocked
    for 50 s): the answer is cut at the page's 4 MiB and never decoded."""
    gateway.rules["/v3/kv/range"] = from_gen(
        lambda: endless(b'{"kvs":[', unit, 60 * MIB, b"{}]}"))
    client = client_of(gateway)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(EtcdTooLarge, match=f"larger than the limit of {PAGE.max_bytes} bytes"):
            await client.get_prefix(b"/net/subnets/")
        assert loop.time() - started < 3, what
    finally:
        await client.close()
    # A page of 1000 keys, one of one key, and a page of its name, each cut at the budget
    # (plus what the sockets' buffers took).
    assert [r.doc["limit"] for r in gateway.paths("/v3/kv/range")] == ["1000", "1", "1"]
    assert gateway.sent < 3 * (PAGE.max_bytes + 8 * MIB)


async def test_an_answer_of_many_tiny_elements_within_its_bytes_is_refused_undecoded(gateway):
    """3.9 MiB of ``[]`` is within the bytes of a page but decodes to 1.3 million lists:
    refused by the element budget before decoding, with the bound named."""
    body = b'{"kvs":[' + b"[]," * (1300 * 1000) + b"[]]}"
    gateway.rules["/v3/kv/range"] = always(answer(body))
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdTooLarge) as caught:
            await client.get(b"/net/config")
    finally:
        await client.close()
    assert str(caught.value) == (
        f"etcd Range: {gateway.endpoint}: the answer to /v3/kv/range has more JSON elements "
        f"than its budget of {etcdclient.ANSWER.max_elements}")


async def test_a_watch_line_of_60_mib_is_cut_at_the_message_budget(gateway):
    async def huge_line() -> AsyncIterator[bytes]:
        created = b'{"result":{"header":{"revision":"5"},"created":true}}\n'
        yield stream_head() + chunk(created)
        piece = b'{"result":{"events":[' + b"{}," * 20000
        for _ in range(60 * MIB // len(piece)):
            yield chunk(piece)

    gateway.rules["/v3/watch"] = from_gen(huge_line)
    client = client_of(gateway)
    batches = []
    try:
        with pytest.raises(EtcdTooLarge,
                           match=f"longer than the limit of {WATCH_MESSAGE.max_bytes} bytes"):
            async for batch in client.watch(b"/net/subnets/", 6):
                batches.append(batch)
    finally:
        await client.close()
    assert [b.created for b in batches] == [True]
    assert gateway.sent < WATCH_MESSAGE.max_bytes + 8 * MIB


async def test_deep_nesting_is_refused_as_malformed_not_a_crash(gateway):
    gateway.rules["/v3/kv/range"] = always(answer(b"[" * 200_000 + b"]" * 200_000))
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdTooLarge, match="more JSON elements than its budget"):
            await client.get(b"/net/config")
        gateway.rules["/v3/kv/range"] = always(answer(b"[" * 5000 + b"]" * 5000))
        with pytest.raises(EtcdUnavailable, match="recursion limit"):
            await client.get(b"/net/config")
    finally:
        await client.close()


# -- 2. typed decoding: a field of the wrong type names the field -------------------------

@pytest.mark.parametrize(("doc", "status", "message"), [
    ({"kvs": 5, "header": {"revision": "3"}}, 200, "kvs is not a JSON array"),
    ({"kvs": [], "header": {"revision": "abc"}}, 200, "revision is not an integer: 'abc'"),
    ({"kvs": [], "header": {"revision": "3", "cluster_id": []}}, 200,
     "cluster_id is not an integer: '[]'"),
    ({"kvs": [{"key": 7}], "header": {"revision": "3"}}, 200, "key is not base64 text"),
    ({"kvs": [{"key": "a2V5", "value": "%%"}], "header": {"revision": "3"}}, 200,
     "value is not base64 text"),
    ({"kvs": [], "more": "yes", "header": {"revision": "3"}}, 200, "more is not a boolean"),
    ({"code": "14", "message": "boom"}, 503, "the error's code is not an integer: '14'"),
    ({"code": 14, "message": {"text": "boom"}}, 503, "the error's message is not text"),
    ("boom", 500, "answered HTTP 500 without an etcd status"),
])
async def test_a_field_of_the_wrong_type_is_an_error_naming_it(gateway, doc, status, message):
    gateway.rules["/v3/kv/range"] = always(answer(doc, status))
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdUnavailable) as caught:
            await client.get_prefix(b"/net/subnets/")
    finally:
        await client.close()
    assert message in str(caught.value)


# -- 3. pages ------------------------------------------------------------------------------

async def test_a_listing_reads_pages_at_one_revision(client, gateway, prefix):
    """2500 leases: three pages of at most 1000 keys, all at the first page's revision, so
    a write meanwhile does not tear the listing."""
    pairs = [(f"{prefix}/subnets/10.3.{i // 250}.{i % 250}-32".encode(), b"{}")
             for i in range(2500)]
    for start in range(0, len(pairs), 100):
        puts = [{"request_put": {"key": b64(k), "value": b64(v)}}
                for k, v in pairs[start:start + 100]]
        await client.call("Txn", "/v3/kv/txn", {"success": puts})
    reader = client_of(gateway)
    written = False

    async def write_meanwhile(request: Request, etcd: Upstream) -> AsyncIterator[bytes]:
        nonlocal written
        status, doc = await etcd.json()
        if not written:
            written = True
            await client.put(f"{prefix}/subnets/10.3.99.0-32".encode(), b"{}")
        yield answer(doc, status)

    gateway.rules["/v3/kv/range"] = write_meanwhile
    try:
        kvs, revision = await reader.get_prefix(f"{prefix}/subnets/".encode())
    finally:
        await reader.close()
    assert sorted(kv.key for kv in kvs) == sorted(k for k, _ in pairs)
    pages = [r.doc for r in gateway.paths("/v3/kv/range")]
    assert [p["limit"] for p in pages] == ["1000"] * 3
    assert [p.get("revision") for p in pages] == [None, str(revision), str(revision)]


def endless_pages(start: int = 0, cycle: bool = False):
    """Pages of one key each, every one saying more follow: increasing keys for ever, or
    (``cycle``) the same key again and again."""
    count = start

    async def rule(request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        nonlocal count
        count += 1
        key = "/net/subnets/k00000001" if cycle else f"/net/subnets/k{count:08d}"
        yield answer({"header": {"revision": "7"}, "more": True, "count": "9",
                      "kvs": [{"key": b64(key.encode()), "value": b64(b"{}")}]})
    return rule


async def test_pages_that_never_end_stop_at_the_listing_budget(gateway, monkeypatch):
    monkeypatch.setattr(etcdclient, "LISTING_KEYS", 300)
    gateway.rules["/v3/kv/range"] = endless_pages()
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdTooLarge, match="holds more than 300 keys"):
            await client.get_prefix(b"/net/subnets/")
        monkeypatch.setattr(etcdclient, "LISTING_KEYS", 10 ** 6)
        monkeypatch.setattr(etcdclient, "LISTING_SECONDS", 1.0)
        with pytest.raises(EtcdUnavailable, match="did not end within 1s"):
            await client.get_prefix(b"/net/subnets/")
    finally:
        await client.close()


async def test_a_page_that_cycles_is_refused(gateway):
    """A continuation that gives the same key again would list for ever: the keys of a
    listing must move forward."""
    gateway.rules["/v3/kv/range"] = endless_pages(cycle=True)
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdUnavailable, match="a key is out of order or outside the range"):
            await client.get_prefix(b"/net/subnets/")
    finally:
        await client.close()
    assert len(gateway.paths("/v3/kv/range")) == 2


# -- 4. time and broken connections ---------------------------------------------------------

async def test_a_dripping_answer_is_cut_at_the_call_deadline(gateway):
    async def drip() -> AsyncIterator[bytes]:
        yield b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        while True:
            yield b" "
            await asyncio.sleep(0.2)

    gateway.rules["/v3/kv/range"] = from_gen(drip)
    client = client_of(gateway, timeout=1)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        with pytest.raises(EtcdUnavailable, match="no answer in time"):
            await client.get(b"/net/config")
        assert loop.time() - started < 2
    finally:
        await client.close()


async def test_a_dripping_watch_message_is_cut_at_the_message_budget(gateway, monkeypatch):
    """A watch message that never ends (a byte every 0.2 s) would stall the lease watch
    for ever: it must arrive within its budget's seconds."""
    monkeypatch.setattr(etcdclient, "WATCH_MESSAGE",
                        etcdclient.Budget(WATCH_MESSAGE.max_bytes, WATCH_MESSAGE.max_elements, 1.0))

    async def drip() -> AsyncIterator[bytes]:
        yield stream_head() + chunk(b'{"result":{"header":{"revision":"5"},"created":true}}\n')
        while True:
            yield chunk(b" ")
            await asyncio.sleep(0.2)

    gateway.rules["/v3/watch"] = from_gen(drip)
    client = client_of(gateway)
    loop = asyncio.get_running_loop()
    try:
        stream = client.watch(b"/net/subnets/", 6)
        assert (await anext(stream)).created
        started = loop.time()
        with pytest.raises(EtcdUnavailable, match="took longer than its budget of 1s"):
            await anext(stream)
        assert loop.time() - started < 2
    finally:
        await client.close()


async def test_a_connection_reset_mid_body_is_an_outage_not_a_crash(gateway):
    async def reset(_request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head() + chunk(b'{"kvs":[{"key":"')
        raise ConnectionResetError  # the gateway closes the connection mid-body

    gateway.rules["/v3/kv/range"] = reset
    client = client_of(gateway)
    try:
        with pytest.raises(EtcdUnavailable, match="closed the connection mid-body"):
            await client.get(b"/net/config")
    finally:
        await client.close()


# -- 5. redirects: credentials stay with their host ------------------------------------------

@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_a_redirect_is_never_followed_with_the_password_token(private_etcd, status):
    """etcd with password authentication: an answer redirecting elsewhere must not take
    flanneld's token (or its password) there."""
    private_etcd.ctl("user", "add", "root", "--new-user-password=s3cret")
    private_etcd.ctl("auth", "enable")
    elsewhere: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        elsewhere.append(await reader.read(65536))
        writer.close()

    other = await asyncio.start_server(record, "127.0.0.1", 0)
    location = f"http://127.0.0.1:{other.sockets[0].getsockname()[1]}/v3/kv/range"
    async with EtcdGateway(private_etcd.client_port) as gw:
        gw.rules["/v3/kv/range"] = always(redirect(status, location))
        client = client_of(gw, username="root", password="s3cret")
        try:
            with pytest.raises(EtcdUnavailable) as caught:
                await client.get(b"/net/config")
        finally:
            await client.close()
            other.close()
        # The authentication went through the gateway to etcd: a token was in hand.
        assert [r.headers.get("authorization", "")[:1] != "" for r in gw.paths("/v3/kv/range")]
    assert elsewhere == []
    assert (f"/v3/kv/range answered HTTP {status}, a redirect to {location!r}; flanneld does "
            "not follow redirects (its credentials stay with the endpoint given)") \
        in str(caught.value)


async def test_a_redirect_is_never_followed_with_the_client_certificate(tmp_path):
    """A TLS endpoint (client certificate) that redirects to another TLS server: no
    connection reaches that server, so it never sees the certificate."""
    import ssl

    from tests.support.tls import make_tls_files

    tls = make_tls_files(tmp_path / "tls")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls.server_cert, tls.server_key)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(tls.ca)
    certificates: list[object] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        certificates.append(writer.get_extra_info("peercert"))
        writer.close()

    other = await asyncio.start_server(record, "127.0.0.1", 0, ssl=context)
    location = f"https://127.0.0.1:{other.sockets[0].getsockname()[1]}/v3/kv/range"

    async def redirecting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(redirect(307, location))
        await writer.drain()
        writer.close()

    hostile = await asyncio.start_server(redirecting, "127.0.0.1", 0, ssl=context)
    port = hostile.sockets[0].getsockname()[1]
    client = EtcdClient(EtcdOptions(parse_endpoints(f"https://127.0.0.1:{port}"),
                                    cafile=str(tls.ca), certfile=str(tls.client_cert),
                                    keyfile=str(tls.client_key), timeout=3))
    try:
        with pytest.raises(EtcdUnavailable, match="answered HTTP 307, a redirect"):
            await client.get(b"/net/config")
    finally:
        await client.close()
        hostile.close()
        other.close()
    assert certificates == []


# -- 6. the lease watch: backoff, compaction, revisions ahead or behind ---------------------

class Follower(Collector):
    """A Collector on flanneld's own watch backoff (up to 5 s)."""

    async def _run(self, sm: EtcdSubnetManager) -> None:
        async for update in sm.watch_leases():
            self.updates.append(update)
            result = self.watcher.apply(update)
            self.events += [(e.type, e.lease.key) for e in result.events]


async def start_manager(gateway: EtcdGateway, client: EtcdClient, prefix: str,
                        **options: object) -> tuple[EtcdSubnetManager, Collector]:
    await client.put(f"{prefix}/config".encode(), CONFIG.encode())
    sm = EtcdSubnetManager(client_of(gateway), prefix, **options)
    collector = Follower(sm, await acquire(sm, attrs()))
    await async_wait_until(lambda: _true(collector.updates), 10, what="the first snapshot")
    return sm, collector


async def _true(value: object) -> bool:
    return bool(value)


async def test_a_watch_answered_compacted_every_time_backs_off(client, gateway, prefix):
    """A gateway that answers every watch with "compacted": each relist waits longer than
    the one before (Go's and pyflannel's first 20 s were 1,027 watches and 2,057 ranges)."""
    async def compacted(request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head() + chunk(json.dumps({"result": {
            "header": {"revision": "900"}, "compact_revision": "800"}}).encode() + b"\n")

    sm, collector = await start_manager(gateway, client, prefix)
    try:
        gateway.rules["/v3/watch"] = compacted
        gateway.cut()
        started = len(gateway.paths("/v3/watch"))
        await asyncio.sleep(3.5)
        watches = len(gateway.paths("/v3/watch")) - started
        # 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of backoff fit in 3.5 s: six at most.
        assert 2 <= watches <= 6, watches
        assert sm.status.compactions == watches
    finally:
        await collector.stop()
        await sm.close()


async def test_a_watch_that_breaks_right_after_its_confirmation_backs_off(client, gateway,
                                                                          prefix):
    """Confirmation is not health: a stream confirmed and then cut at once was reopened
    seven times a second."""
    async def confirm_then_break(request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head() + chunk(b'{"result":{"header":{"revision":"5"},"created":true}}\n')

    sm, collector = await start_manager(gateway, client, prefix)
    try:
        gateway.rules["/v3/watch"] = confirm_then_break
        gateway.cut()
        started = len(gateway.paths("/v3/watch"))
        await asyncio.sleep(3.5)
        watches = len(gateway.paths("/v3/watch")) - started
        assert 2 <= watches <= 6, watches
    finally:
        await collector.stop()
        await sm.close()


async def test_a_progress_revision_ahead_of_the_store_is_refused_not_taken_as_a_wipe(
        client, gateway, prefix, caplog):
    """A progress notification a million revisions ahead was taken as the floor of the next
    reads: the store looked wiped, and every node re-created its lease (44 times in 20 s,
    readiness flapping). It is checked against a read, refused, and the stream resumed."""
    async def ahead(request: Request, etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head()
        async for message in etcd.messages():
            yield chunk(json.dumps(message).encode() + b"\n")
            if message.get("result", {}).get("created"):
                current = int(message["result"]["header"]["revision"])
                yield chunk(json.dumps({"result": {"header": {
                    "revision": str(current + 10 ** 6)}}}).encode() + b"\n")

    sm, collector = await start_manager(gateway, client, prefix, check_interval=0.2)
    own = sm.lease
    readiness: list[bool] = []
    sm.status.follow(lambda ready, _why: readiness.append(ready))
    try:
        gateway.rules["/v3/watch"] = ahead
        gateway.cut()
        started = len(gateway.paths("/v3/watch"))
        await asyncio.sleep(3)
        assert len(gateway.paths("/v3/watch")) - started <= 6
        # The stream still delivers: a peer written meanwhile arrives.
        del gateway.rules["/v3/watch"]
        await put_lease(client, prefix, 230, "2.3.0.1")
        await collector.wait_for((EventType.ADDED, "10.3.230.0-24"))
    finally:
        await collector.stop()
        await sm.close()
    assert sm.lease is own, "our lease was re-created"
    assert all(readiness), readiness
    assert "wiped or restored" not in caplog.text
    assert "ahead of the store's" in caplog.text


async def test_a_watch_going_back_in_revisions_is_refused(client, gateway, prefix, caplog):
    async def backwards(request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head() + chunk(b'{"result":{"header":{"revision":"5"},"created":true}}\n')
        event = {"type": "PUT", "kv": {"key": b64(f"{prefix}/subnets/10.3.240.0-24".encode()),
                                        "value": b64(b'{"PublicIP":"9.9.9.9"}'),
                                        "mod_revision": "2", "create_revision": "2"}}
        yield chunk(json.dumps({"result": {"header": {"revision": "3"},
                                           "events": [event]}}).encode() + b"\n")
        await asyncio.sleep(30)

    caplog.set_level(logging.WARNING)
    sm, collector = await start_manager(gateway, client, prefix)
    try:
        gateway.rules["/v3/watch"] = backwards
        gateway.cut()
        await async_wait_until(lambda: _true("the watch went back in revisions" in caplog.text),
                               10, what="the refusal")
    finally:
        await collector.stop()
        await sm.close()
    assert all(e[1] != "10.3.240.0-24" for e in collector.events)


async def test_a_watch_message_over_its_budget_relists_in_pages(client, gateway, prefix):
    """A watch message too large to decode cannot be resumed past (the same message would
    come again): the manager relists, in pages, and resumes after the listing."""
    async def huge(request: Request, _etcd: Upstream) -> AsyncIterator[bytes]:
        yield stream_head() + chunk(b'{"result":{"header":{"revision":"5"},"created":true}}\n')
        yield chunk(b" " * (WATCH_MESSAGE.max_bytes + 1))

    sm, collector = await start_manager(gateway, client, prefix)
    try:
        await put_lease(client, prefix, 231, "2.3.1.1")
        gateway.rules["/v3/watch"] = huge
        gateway.cut()
        await async_wait_until(
            lambda: _true(sum(isinstance(u, Snapshot) for u in collector.updates) >= 2), 10,
            what="a relist")
        del gateway.rules["/v3/watch"]
    finally:
        await collector.stop()
        await sm.close()
    assert (EventType.ADDED, "10.3.231.0-24") in collector.events


# -- 7. a store too large for one answer still leases ---------------------------------------

async def test_oversize_values_are_skipped_and_counted_and_the_node_leases(client, prefix):
    """Ten values of 1.4 MB under subnets/ (etcd takes up to 1.5 MiB): the listing that
    held them all was refused whole, and no node ever leased. Each is skipped and counted
    like any bad lease; the node leases among the others."""
    junk = b"x" * 1_400_000
    for i in range(10):
        await client.put(f"{prefix}/subnets/10.3.{200 + i}.0-24".encode(), junk)
    await put_lease(client, prefix, 230, "2.3.0.1")
    await client.put(f"{prefix}/config".encode(), CONFIG.encode())
    sm = EtcdSubnetManager(client, prefix)
    lease = await acquire(sm, LeaseAttrs(public_ip=IPv4Address("1.2.3.4")))
    leases, _ = await sm.list_leases()
    assert sorted(x.key for x in leases) == sorted([lease.key, "10.3.230.0-24"])
    assert len(sm.undecodable.current) == 10
    assert set(sm.undecodable.current.values()) == {
        "lease value is larger than the limit of 65536 bytes"}


async def test_a_value_too_large_for_any_page_is_skipped_by_name(client, gateway, prefix):
    """A value larger than a page's budget (a gateway in front of an etcd that takes large
    requests) cannot be read at all: its key is named with a page of keys only, it is
    skipped and counted, and the listing goes on after it."""
    await put_lease(client, prefix, 230, "2.3.0.1")
    await client.put(f"{prefix}/config".encode(), CONFIG.encode())
    huge_key = f"{prefix}/subnets/10.3.200.0-24".encode()

    async def huge_value_first(request: Request, etcd: Upstream) -> AsyncIterator[bytes]:
        doc = request.doc
        status, found = await etcd.json()
        start = etcdclient.base64.b64decode(doc["key"])
        if "range_end" in doc and start <= huge_key:
            kv = {"key": b64(huge_key), "create_revision": "2", "mod_revision": "2"}
            if not doc.get("keys_only"):
                kv["value"] = b64(b"x" * (5 * MIB))
            before = [x for x in found.get("kvs", [])
                      if etcdclient.base64.b64decode(x["key"]) < huge_key]
            found.update(kvs=[*before, kv][:int(doc.get("limit") or 10 ** 6)], more=True)
        yield answer(found, status)

    gateway.rules["/v3/kv/range"] = huge_value_first
    sm = EtcdSubnetManager(client_of(gateway), prefix)
    try:
        lease = await acquire(sm, LeaseAttrs(public_ip=IPv4Address("1.2.3.4")))
        leases, _ = await sm.list_leases()
    finally:
        await sm.close()
    assert sorted(x.key for x in leases) == sorted([lease.key, "10.3.230.0-24"])
    assert lease.key != "10.3.200.0-24"  # named by the key: taken, even unread
    assert sm.undecodable.current == {"10.3.200.0-24": (
        f"its value is larger than a page of the listing may be ({PAGE.max_bytes} bytes)")}


@pytest.mark.parametrize(("status", "code"), [(401, 16), (429, 8), (503, 14)])
async def test_an_error_storm_on_the_watch_backs_off(client, gateway, prefix, status, code):
    """Every watch refused (401 unauthenticated, 429 too many requests, 503 unavailable):
    the watch is retried with backoff, the lease and the node stay as they are."""
    sm, collector = await start_manager(gateway, client, prefix)
    own = sm.lease
    try:
        gateway.rules["/v3/watch"] = always(answer({"code": code, "message": "storm"}, status))
        gateway.cut()
        started = len(gateway.paths("/v3/watch"))
        await asyncio.sleep(3.5)
        watches = len(gateway.paths("/v3/watch")) - started
        assert 2 <= watches <= 6, watches
        assert not collector.task.done()
    finally:
        await collector.stop()
        await sm.close()
    assert sm.lease is own
