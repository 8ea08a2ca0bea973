"""/readyz text: says what is wrong, never where (it is served on every address by default)."""

from __future__ import annotations

import re

import pytest

from flannel.health import REASON_LIMIT, HealthServer, public_reason

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
        port = server._server.sockets[0].getsockname()[1]
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
