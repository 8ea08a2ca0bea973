"""kubehttp's reading of responses against a tiny server that writes raw bytes: when a
connection may carry another request, and which answers are refused."""

from __future__ import annotations

import asyncio

import pytest

from flannel.subnet.kubehttp import MAX_HEAD_BYTES, Connection, ProtocolError


async def exchange(raw: bytes) -> tuple[Connection, bytes]:
    """Send one GET to a server that answers with ``raw``; the connection and the body."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(raw)
        await writer.drain()
        await reader.read()  # hold the connection open until the client closes it
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    conn = await Connection.open("127.0.0.1", port, None, None, loop.time() + 5)
    try:
        async with asyncio.timeout(5):
            await conn.send("GET", "/api/v1/nodes/a", f"127.0.0.1:{port}", {})
            head = await conn.read_head()
            return conn, await conn.read_body(head, 1024)
    finally:
        conn.transport.close()
        server.close()


@pytest.mark.parametrize(("raw", "reusable"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
    (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"
     b"2\r\nok\r\n0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", False),
])
async def test_a_connection_is_reused_only_when_its_next_answer_is_ours(raw, reusable):
    conn, body = await exchange(raw)
    assert (body, conn.reusable) == (b"ok", reusable)


async def test_switching_protocols_is_refused():
    with pytest.raises(ProtocolError, match=r"^the server switched protocols \(101\) unasked$"):
        await exchange(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")


async def test_interim_answers_count_toward_the_header_bound():
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_HEAD_BYTES // 20)
    with pytest.raises(ProtocolError, match=f"^response headers exceed {MAX_HEAD_BYTES} bytes$"):
        await exchange(interim + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
