"""The health server as a client sees it: /readyz text says what is wrong, never where (it
is served on every address by default); what it answers to requests of every shape, and the
bounds no client can push it past."""

from __future__ import annotations

import asyncio
import re

import pytest

from flannel.monitor.health import (
    HEAD_LIMIT,
    HEADER_FIELDS,
    REASON_LIMIT,
    HealthServer,
    public_reason,
)

ANY_PATH = re.compile(r"(?<![\w.:])[~.]*/\w")


def readyz_body(reason: str) -> str:
    reply = HealthServer(lambda: (False, reason)).answer("GET", "/readyz")
    assert reply.status == 503
    return reply.body.decode()


@pytest.mark.parametrize(("reason", "body"), [
    ("could not write /run/flannel/subnet.env: Permission denied",
     "could not write subnet.env: Permission denied"),
    ("traffic rules not installed: /srv/bin/iptables: [Errno 8] Exec format error: "
     "'/srv/bin/iptables'",
     "traffic rules not installed: iptables: [Errno 8] Exec format error: 'iptables'"),
    ("lease /coreos.com/network/subnets/10.5.0.0-24 skipped",
     "lease 10.5.0.0-24 skipped"),
    ("cannot read ./keys/wg.key nor ~/wg.key nor ../wg/", "cannot read wg.key nor wg.key nor wg"),
])
def test_paths_are_cut_to_what_they_name(reason, body):
    assert readyz_body(reason) == f"flanneld is not ready yet: {body}\n"
    assert not ANY_PATH.search(body)


def test_networks_devices_and_addresses_stay():
    reason = ("data plane not programmed: route 10.244.1.0/24 via 10.244.1.0 dev flannel.1 "
              "and fd00:10:244:1::/64 missing")
    assert public_reason(reason) == reason


def test_one_bounded_line():
    text = public_reason("first\nsecond\r\x00third " + "x" * 1000)
    assert text.startswith("first second third x")
    assert len(text) == REASON_LIMIT and text.endswith("...")


@pytest.mark.parametrize("request_bytes", [
    b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",  # a request line beyond 64 KiB
    b"GET /readyz HTTP/1.1\r\nX-Long: " + b"b" * 70000 + b"\r\n\r\n",  # one header too
])
async def test_an_oversized_request_gets_431_and_logs_no_traceback(request_bytes, caplog):
    server = HealthServer(lambda: (True, ""))
    await server.start("127.0.0.1", 0)
    try:
        port = server.address[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        # The server still answers the next client.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        healthy = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        await server.stop()
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert reply.endswith(b"\r\n\r\nrequest line or header too long\n")
    assert healthy.startswith(b"HTTP/1.1 200 OK\r\n")
    assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text


async def _get(port: int, path: str = "/readyz") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_idle_connections_beyond_the_limit_make_room_for_a_probe(caplog):
    server = HealthServer(lambda: (True, ""), max_connections=4)
    await server.start("127.0.0.1", 0)
    idle = []
    try:
        for _ in range(10):
            # A start of a request and no more (a connection that sends nothing at all is
            # left to the kernel until it does: TCP_DEFER_ACCEPT).
            idle.append(await asyncio.open_connection(*server.address))
            idle[-1][1].write(b"GET /readyz HTTP/1.1\r\n")
            await asyncio.sleep(0.02)
        # The six oldest are closed to keep four open; the probe gets an answer.
        reply = await _get(server.address[1])
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        for reader, _ in idle[:6]:
            assert await asyncio.wait_for(reader.read(), 5) == b""
        assert server.stats.dropped >= 6 and server.stats.open <= 4
        assert "health server: closed a connection: 4 were open, the most it keeps" \
            in caplog.text
        assert caplog.text.count("health server: closed a connection") == 1  # rate-limited
    finally:
        for _, writer in idle:
            writer.close()
        await server.stop()


async def test_a_request_that_never_comes_is_timed_out(monkeypatch):
    monkeypatch.setattr("flannel.monitor.health.HEAD_TIMEOUT", 0.2)
    server = HealthServer(lambda: (True, ""))
    await server.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"GET /readyz HTTP/1.1\r\n")  # and no end of the headers
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert server.stats.timed_out == 1 and server.stats.open == 0
    finally:
        await server.stop()


async def test_connections_that_send_nothing_cost_nothing_until_they_do():
    """The kernel holds a connection until its first bytes (TCP_DEFER_ACCEPT): a client
    reopening each closed connection at once cannot keep flanneld accepting and closing."""
    server = HealthServer(lambda: (True, ""), max_connections=4)
    await server.start("127.0.0.1", 0)
    silent = []
    try:
        for _ in range(50):
            silent.append(await asyncio.open_connection(*server.address))
        await asyncio.sleep(0.5)
        assert server.stats.accepted == 0 and server.stats.dropped == 0
        reply = await _get(server.address[1])
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert server.stats.accepted == 1
    finally:
        for _, writer in silent:
            writer.close()
        await server.stop()


async def _exchange(server: HealthServer, *pieces: bytes, half_close: bool = False
                    ) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers, body) of what the server sends back to ``pieces`` (each
    written on its own, the client's side ended after them with ``half_close``), read to
    the end of the connection: the server closes it."""
    reader, writer = await asyncio.open_connection(*server.address)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        if half_close:
            writer.write_eof()
        reply = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = reply.partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    headers = dict(field.split(": ", 1) for field in fields)
    return status, headers, body


@pytest.fixture
async def server():
    server = HealthServer(lambda: (True, ""))
    await server.start("127.0.0.1", 0)
    yield server
    await server.stop()


def _head_of(size: int) -> bytes:
    """A GET of /healthz whose head is ``size`` bytes long."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"p" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize(("pieces", "status", "body"), [
    # The longest head answered, in pieces (h11 reads it across them).
    ([_head_of(HEAD_LIMIT)[:100], _head_of(HEAD_LIMIT)[100:]], "200 OK",
     b"flanneld is running\n"),
    # One byte more, in one piece (h11 alone would read a whole head, however long).
    ([_head_of(HEAD_LIMIT + 1)], "431 Request Header Fields Too Large",
     b"request line or header too long\n"),
    # Short fields that add up to more than the bound.
    ([b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 2000,
      b"X-A: b\r\n" * 1000 + b"\r\n"],
     "431 Request Header Fields Too Large", b"request line or header too long\n"),
    ([b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * HEADER_FIELDS + b"\r\n"],
     "431 Request Header Fields Too Large", f"more than {HEADER_FIELDS} header fields\n".encode()),
    ([b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * (HEADER_FIELDS - 1) + b"\r\n"],
     "200 OK", b"flanneld is running\n"),
], ids=["at-the-limit", "one-byte-over", "many-short-fields", "too-many-fields",
        "as-many-fields-as-allowed"])
async def test_the_request_head_is_bounded(server, pieces, status, body, caplog):
    got, headers, reply = await _exchange(server, *pieces)
    assert (got, reply) == (f"HTTP/1.1 {status}", body)
    assert headers["Connection"] == "close" and server.stats.open == 0
    assert "Traceback" not in caplog.text and "Fatal error" not in caplog.text


@pytest.mark.parametrize(("request_bytes", "body"), [
    (b"GET /healthz\r\n\r\n", b"bad request: illegal request line"),
    (b"GET /healthz HTTP/1.1 extra\r\nHost: x\r\n\r\n", b"bad request: illegal request line"),
    (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40, b"bad request: illegal"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n",
     b"bad request: illegal header line"),
    (b"GET /healthz HTTP/1.1\r\n\r\n", b"bad request: Missing mandatory Host: header\n"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
     b"bad request: Found multiple Host: headers\n"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
     b"bad request: conflicting Content-Length headers\n"),
    (b"GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
     b"bad request: Only Transfer-Encoding: chunked is supported\n"),
], ids=["no-version", "extra-word", "tls-hello", "bad-header-line", "http11-without-host",
        "two-hosts", "two-lengths", "unknown-coding"])
async def test_a_malformed_request_gets_400_and_the_connection_closes(
        server, request_bytes, body, caplog):
    status, headers, reply = await _exchange(server, request_bytes)
    assert status == "HTTP/1.1 400 Bad Request"
    assert reply.startswith(body) and reply.endswith(b"\n") and len(reply) < 700
    assert headers["Connection"] == "close" and server.stats.open == 0
    assert "Traceback" not in caplog.text and "Fatal error" not in caplog.text


async def test_a_head_the_client_cuts_short_gets_400(server):
    status, _, reply = await _exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
                                       half_close=True)
    assert (status, reply) == ("HTTP/1.1 400 Bad Request",
                               b"bad request: peer unexpectedly closed connection\n")


async def test_a_whole_request_then_the_clients_end_is_answered(server):
    status, _, reply = await _exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
                                       half_close=True)
    assert (status, reply) == ("HTTP/1.1 200 OK", b"flanneld is running\n")


@pytest.mark.parametrize("request_bytes", [
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\nhello world",
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"b" * 1000,
    b"GET /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    b"GET /readyz HTTP/1.0\r\n\r\n",  # no Host: HTTP/1.0 needs none
    b"GET /readyz?verbose HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n"
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",  # the second is never answered
], ids=["get-with-body", "get-with-body-never-sent", "get-with-chunks", "http10",
        "keep-alive-asked"])
async def test_one_reply_and_the_connection_closes(server, request_bytes):
    status, headers, reply = await _exchange(server, request_bytes)
    assert (status, reply) == ("HTTP/1.1 200 OK", b"flanneld is ready\n")
    assert headers == {"Content-Type": "text/plain; charset=utf-8", "Content-Length": "18",
                       "Connection": "close"}
    assert server.stats.open == 0


@pytest.mark.parametrize(("request_bytes", "status", "length"), [
    (b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n", "200 OK", 20),
    (b"HEAD /nowhere HTTP/1.0\r\n\r\n", "404 Not Found", 24),
])
async def test_head_gets_the_head_alone(server, request_bytes, status, length):
    got, headers, reply = await _exchange(server, request_bytes)
    assert (got, headers["Content-Length"], reply) == (f"HTTP/1.1 {status}", str(length), b"")


@pytest.mark.parametrize("method", [b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PRI"])
async def test_a_method_but_get_and_head_gets_405(server, method):
    status, headers, reply = await _exchange(
        server, method + b" /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
    assert (status, reply) == ("HTTP/1.1 405 Method Not Allowed", b"use GET\n")
    assert headers["Connection"] == "close" and server.stats.open == 0
