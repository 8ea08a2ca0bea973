"""Fuzz target for the HTTP/1.1 response reader the stores' API clients share
(flannel.clients.http): whatever an API server, or whatever answers in its place, sends after
one request.

Inputs are raw bytes of any kind, and responses built from parts (status lines of every
class, 1xx interim answers, Content-Length, chunked and close-delimited bodies, both
framings at once, Connection tokens, oversized heads) that may be cut, corrupted, or
followed by bytes nobody asked for. Each goes over a real loopback connection to a
``Connection`` that reads the head and then the body whole (``read_body``) or as lines
(``lines``) under a small bound. ``run`` checks what the clients rely on: only
``ProtocolError``, ``OSError`` or ``TimeoutError`` escape; no body or line is larger than
its bound; a well-formed response within its bounds is read exactly; and a connection is
left reusable exactly when the response was HTTP/1.1 keep-alive with a known length and
nothing followed it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import strategies as st

from flannel.clients.http import MAX_HEAD_BYTES, Connection, ProtocolError
from tests.support.fuzzing import FuzzTarget


@dataclass(frozen=True)
class Answer:
    raw: bytes
    body: bytes | None  # the body a correct reader returns, for a well-formed response
    reusable: bool | None  # whether a correct reader keeps the connection (None: unknown)
    lines: bool  # read as lines rather than whole
    bound: int  # max_bytes, or max_line


@st.composite
def _built(draw: st.DrawFn) -> tuple[bytes, bytes | None, bool]:
    """A response from parts; (bytes, expected body or None, reusable)."""
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 404, 410, 500]))
    interim = draw(st.lists(st.sampled_from([b"HTTP/1.1 100 Continue\r\n\r\n",
                                             b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n"]),
                            max_size=3))
    body = draw(st.binary(max_size=600) | st.sampled_from([b"a\nb\n", b"\n\n", b"x" * 500]))
    framing = draw(st.sampled_from(["length", "chunked", "close", "both"]))
    close = draw(st.booleans())
    headers = [b"Content-Type: application/json"]
    if close:
        headers.append(b"Connection: close")
    if draw(st.booleans()):
        headers.append(b"X-Pad: " + b"p" * draw(st.sampled_from([0, 1000, MAX_HEAD_BYTES])))
    if status in (204, 304):
        body = b""
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
        wire = body
    elif framing in ("chunked", "both"):
        headers.append(b"Transfer-Encoding: chunked")
        if framing == "both":
            headers.append(b"Content-Length: %d" % len(body))
        cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
        pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)
                  if b > a]
        wire = b"".join(b"%x%s\r\n%s\r\n" % (len(p), draw(st.sampled_from([b"", b";ext=1"])), p)
                        for p in pieces) + b"0\r\n\r\n"
    else:
        wire = body
    if status in (204, 304):
        wire = b""
    raw = b"".join(interim) + version + b" %d X\r\n" % status + b"\r\n".join(headers) \
        + b"\r\n\r\n" + wire
    # What follows a body delimited by the connection's end is that body's.
    delimited = framing == "close" and status not in (204, 304)
    extra = b"" if delimited else \
        draw(st.sampled_from([b"", b"", b"HTTP/1.1 200 OK\r\n\r\n", b"junk"]))
    # 204 and 304 never have a body, whatever their framing says (RFC 9112 6.3).
    known_length = framing in ("length", "chunked") or \
        (status in (204, 304) and framing != "both")
    keep = version == b"HTTP/1.1" and not close and known_length
    return raw + extra, body, keep and not extra


@st.composite
def _answers(draw: st.DrawFn) -> Answer:
    lines = draw(st.booleans())
    bound = draw(st.integers(0, 700))
    if draw(st.integers(0, 3)) == 0:
        return Answer(draw(st.binary(max_size=2048)), None, None, lines, bound)
    raw, body, reusable = draw(_built())
    if len(raw) > MAX_HEAD_BYTES or draw(st.integers(0, 2)) == 0:  # cut or corrupt it
        spot = draw(st.integers(0, len(raw)))
        raw = raw[:spot] + draw(st.binary(max_size=8)) + raw[spot + draw(st.integers(0, 8)):]
        return Answer(raw, None, None, lines, bound)
    return Answer(raw, body, reusable, lines, bound)


async def _read(answer: Answer) -> tuple[bytes | list[bytes], bool]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline() not in (b"\r\n", b""):
            pass
        writer.write(answer.raw)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    conn = await Connection.open("127.0.0.1", port, None, None, loop.time() + 10)
    conn.deadline = loop.time() + 10
    try:
        await conn.send("GET", "/api/v1/nodes", "127.0.0.1", {"Accept": "application/json"})
        head = await conn.read_head()
        if answer.lines:
            got: bytes | list[bytes] = [line async for line in conn.lines(head, answer.bound)]
        else:
            got = await conn.read_body(head, answer.bound)
        return got, conn.reusable
    finally:
        conn.close()
        server.close()


def _fits(answer: Answer) -> bool:
    """Whether a well-formed answer is within the reader's bound."""
    assert answer.body is not None
    if answer.lines:
        return all(len(line) <= answer.bound for line in answer.body.split(b"\n"))
    return len(answer.body) <= answer.bound


def _receive(answer: Answer) -> None:
    try:
        got, reusable = asyncio.run(_read(answer))
    except (ProtocolError, OSError, TimeoutError) as err:
        if answer.body is not None and _fits(answer):
            raise AssertionError(f"a well-formed answer within its bounds was refused: "
                                 f"{err}") from None
        return
    if isinstance(got, list):
        if any(len(line) > answer.bound for line in got):
            raise AssertionError(f"a line is longer than its bound of {answer.bound} bytes")
        if answer.body is not None:
            expected = answer.body.split(b"\n")
            if expected and not expected[-1].strip():
                expected.pop()
            if got != expected:
                raise AssertionError(f"lines {got!r} of a well-formed body {answer.body!r}")
    else:
        if len(got) > answer.bound:
            raise AssertionError(f"a body of {len(got)} bytes past its bound {answer.bound}")
        if answer.body is not None and got != answer.body:
            raise AssertionError(f"body {got!r} of a well-formed response {answer.body!r}")
    if answer.reusable is not None and reusable != answer.reusable:
        raise AssertionError("a connection is reusable after an answer that forbids it"
                             if reusable else
                             "a connection is not reusable after a keep-alive answer")


TARGETS = [FuzzTarget("http response reader", _answers(), _receive)]
