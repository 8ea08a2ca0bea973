"""flannel.clients.http's reading of responses against a tiny server that writes raw bytes:
when a connection may carry another request, which answers are refused, and a request body
streamed while the response is read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flannel.clients.http import MAX_HEAD_BYTES, BodyTooLarge, Connection, ProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

pytestmark = pytest.mark.virtual_time


@contextlib.asynccontextmanager
async def connected(answer: Handler) -> AsyncIterator[Connection]:
    """A connection to a loopback server whose every client ``answer`` serves; both closed
    afterwards. The exchange inside is bounded to 5 s."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = await Connection.open("127.0.0.1", port, None, None,
                                 asyncio.get_running_loop().time() + 5)
    try:
        async with asyncio.timeout(5):
            yield conn
    finally:
        conn.close()
        server.close()


async def exchange(raw: bytes, max_bytes: int = 1024) -> tuple[bytes, bool]:
    """Send one GET to a server that answers with ``raw``; the body, and whether the
    connection may carry another request."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(raw)
        await writer.drain()
        await reader.read()  # hold the connection open until the client closes it
        writer.close()

    async with connected(answer) as conn:
        await conn.send("GET", "/api/v1/nodes/a", "127.0.0.1", {})
        head = await conn.read_head()
        body = await conn.read_body(head, max_bytes)
        return body, conn.fit_for_reuse()


@pytest.mark.parametrize(("raw", "reusable"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
    # h11 never keeps an HTTP/1.0 connection, even one that asks (API servers speak 1.1).
    (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok", False),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"
     b"2\r\nok\r\n0\r\n\r\n", False),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", False),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
])
async def test_a_connection_is_reused_only_when_its_next_answer_is_ours(raw, reusable):
    assert await exchange(raw) == (b"ok", reusable)


async def test_a_body_ended_by_the_connection_is_read_and_not_reused():
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        writer.close()

    async with connected(answer) as conn:
        await conn.send("GET", "/", "h", {})
        body = await conn.read_body(await conn.read_head(), 1024)
        reusable = conn.reusable
    assert (body, reusable) == (b"until the end", False)


async def test_switching_protocols_is_refused():
    with pytest.raises(ProtocolError):
        await exchange(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")


async def test_interim_answers_count_toward_the_header_bound():
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_HEAD_BYTES // 20)
    with pytest.raises(ProtocolError, match=f"^response headers exceed {MAX_HEAD_BYTES} bytes"):
        await exchange(interim + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


async def test_a_head_past_its_bound_is_refused():
    field = b"X-Filler: " + b"a" * 1000 + b"\r\n"
    with pytest.raises(ProtocolError, match=f"exceed {MAX_HEAD_BYTES} bytes"):
        await exchange(b"HTTP/1.1 200 OK\r\n" + field * 70 + b"Content-Length: 2\r\n\r\nok")


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"100\r\n" + b"a" * 256
    + b"\r\n" * 5,
])
async def test_a_body_past_its_bound_is_refused(raw):
    with pytest.raises(BodyTooLarge, match="larger than the limit of 100 bytes"):
        await exchange(raw, max_bytes=100)


async def test_a_streamed_request_body_is_sent_while_the_response_is_read():
    """As etcd's watch over its JSON gateway: the server answers the first message, and
    the client sends another one on the same request."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b""
        while (line := await reader.readline()) not in (b"\r\n", b""):
            head += line
        assert b"transfer-encoding: chunked" in head.lower()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(2):  # each chunk of the request is echoed as one line
            size = int((await reader.readline()).strip(), 16)
            data = await reader.readexactly(size + 2)
            line = data[:size] + b"\n"
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))
        assert await reader.readline() == b"0\r\n"
        writer.write(b"0\r\n\r\n")
        await reader.read()
        writer.close()

    async with connected(answer) as conn:
        await conn.start("POST", "/v3/watch", "h", {"Content-Type": "application/json"})
        await conn.send_data(b'{"create": 1}')
        head = await conn.read_head()
        lines = conn.lines(head, 1024)
        first = await anext(lines)
        await conn.send_data(b'{"progress": 1}')
        second = await anext(lines)
        await conn.end_body()
        rest = [line async for line in lines]
        reusable = conn.reusable
    assert (head.status, first, second, rest, reusable) == \
        (200, b'{"create": 1}', b'{"progress": 1}', [], True)


async def test_a_connection_is_reusable_only_once_the_streamed_body_ended_too():
    """A server may answer before the request body ends: the connection carries no other
    request until both ended."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await reader.read()
        writer.close()

    async with connected(answer) as conn:
        await conn.start("POST", "/v3/watch", "h", {})
        body = await conn.read_body(await conn.read_head(), 16)
        before = conn.reusable
        await conn.end_body()
        after = conn.reusable
    assert (body, before, after) == (b"ok", False, True)


async def test_a_line_must_arrive_within_its_budget_from_its_first_byte():
    """A stream's message that drips (here a byte every 0.1 s) is cut once its budget's
    seconds have passed since its first byte, however often bytes come; messages that
    arrive in time are read, and the quiet between messages does not count."""
    from flannel.clients.http import Budget

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"6\r\nfirst\n\r\n")
        await writer.drain()
        await asyncio.sleep(1.5)  # quiet: no message under way
        writer.write(b"7\r\nsecond\n\r\n")
        while True:
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)

    got = []
    async with connected(answer) as conn:
        await conn.send("GET", "/watch", "h", {})
        head = await conn.read_head()
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError) as caught:
            async for line in conn.lines(head, Budget(1024, 100, 1.0)):
                got.append(line)
                started = loop.time()
        assert 0.9 < loop.time() - started < 2
    assert got == [b"first", b"second"]
    assert str(caught.value) == "a message took longer than its budget of 1s to arrive"


def test_a_budget_refuses_more_elements_than_it_allows_before_decoding():
    from flannel.clients.http import Budget
    from flannel.untrusted.boundedjson import JSONLimitError

    budget = Budget(max_bytes=1 << 20, max_elements=1000, seconds=5)
    assert budget.decode(b'{"kvs": [' + b"{}," * 400 + b"{}]}", "a page")["kvs"][0] == {}
    with pytest.raises(JSONLimitError, match="a page has more JSON elements than the limit of "
                                             "1000"):
        budget.decode(b"[" + b"[]," * 5000 + b"[]]", "a page")


async def stream_lines(raw: bytes, *, drip: bool = False) -> tuple[list[bytes], bool]:
    """GET from a server that answers with ``raw`` (``drip``: a byte at a time); the body's
    lines as ``lines`` reads them, and whether the connection may carry another request."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        for at in range(0, len(raw), 1 if drip else len(raw)):
            writer.write(raw[at:at + (1 if drip else len(raw))])
            await writer.drain()
            if drip:
                await asyncio.sleep(0.001)
        await reader.read()
        writer.close()

    async with connected(answer) as conn:
        await conn.send("GET", "/watch", "127.0.0.1", {})
        head = await conn.read_head()
        lines = [line async for line in conn.lines(head, 1024)]
        return lines, conn.fit_for_reuse()


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(("body", "lines", "reusable", "drip"), [
    (b"4\r\nab\nc\r\n3\r\nd\ne\r\n0\r\n\r\n", [b"ab", b"cd", b"e"], True, False),
    (b"4\r\nab\nc\r\n3\r\nd\ne\r\n0\r\n\r\n", [b"ab", b"cd", b"e"], True, True),
    # Extensions and trailing blanks on a chunk-size line, upper-case digits, trailers.
    (b"A;name=value \r\n0123456789\r\n2 \r\n\n\n\r\n0;x\r\nX-Trailer: 1\r\n\r\n",
     [b"0123456789", b""], True, True),
    (b"1\r\n\n\r\n0\r\n\r\nEXTRA", [b""], False, False),  # another response: not reused
], ids=["whole", "a byte at a time", "extensions and trailers", "bytes after the end"])
async def test_a_chunked_stream_is_read_as_lines_as_h11_would_frame_it(body, lines, reusable,
                                                                       drip):
    assert await stream_lines(CHUNKED + body, drip=drip) == (lines, reusable)


@pytest.mark.parametrize(("body", "refusal"), [
    (b"zz\r\n", "illegal chunk header: b'zz\\\\r\\\\n'"),
    (b"-1\r\nab\r\n", "illegal chunk header"),
    (b"2\r\nabXX0\r\n\r\n", "malformed chunk footer: b'XX'"),
    (b"1" + b" " * MAX_HEAD_BYTES + b"\r\n", f"chunk-size line is longer than {MAX_HEAD_BYTES}"),
    (b"1\r\na\r\n0\r\nX-Bad: " + b"a" * MAX_HEAD_BYTES, f"longer than {MAX_HEAD_BYTES}"),
], ids=["not hex", "negative", "no CRLF after the data", "long size line", "long trailers"])
async def test_a_chunked_stream_that_breaks_its_framing_is_refused(body, refusal):
    with pytest.raises(ProtocolError, match=refusal):
        await stream_lines(CHUNKED + body)


async def test_a_chunked_stream_cut_mid_chunk_is_a_closed_connection():
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(CHUNKED + b"10\r\nabc")
        writer.close()

    async with connected(answer) as conn:
        await conn.send("GET", "/watch", "127.0.0.1", {})
        head = await conn.read_head()
        with pytest.raises(ConnectionResetError, match="mid-body"):
            [line async for line in conn.lines(head, 1024)]
