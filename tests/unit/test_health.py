"""/readyz text: says what is wrong, never where (it is served on every address by default)."""

from __future__ import annotations

import re

import pytest

from flannel.monitor.health import REASON_LIMIT, HealthServer, public_reason

ANY_PATH = re.compile(r"(?<![\w.:])[~.]*/\w")


def readyz_body(reason: str) -> str:
    reply = HealthServer(lambda: (False, reason)).answer("GET", "/readyz")
    head, _, body = reply.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 503 ")
    return body


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
    import asyncio

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
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        healthy = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    finally:
        await server.stop()
    assert reply.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert reply.endswith(b"\r\n\r\nrequest line or header too long\n")
    assert healthy.startswith(b"HTTP/1.1 200 OK\r\n")
    assert "Traceback" not in caplog.text and "Unhandled exception" not in caplog.text


async def _get(port: int, path: str = "/readyz") -> bytes:
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\n\r\n".encode())
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_idle_connections_beyond_the_limit_make_room_for_a_probe(caplog):
    import asyncio

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
    import asyncio

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
    import asyncio

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
