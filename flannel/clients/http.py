"""HTTP/1.1 client connections over asyncio for the API clients (etcd, Kubernetes, Alibaba
Cloud): h11 frames the messages, every read is bounded.

Owns: opening a connection (TCP with keepalive, or a unix socket; a TLS context; a
deadline), writing a request with a whole body or a streamed (chunked) one, reading the
response head (at most ``MAX_HEAD_BYTES`` counting 1xx interim answers, ``MAX_HEADERS``
fields), reading a body framed by Content-Length, chunked transfer coding or the end of the
connection within a byte bound the caller gives, and splitting a streamed body into lines
within a line bound.
``Budget`` is what one answer, or one message of a stream, may cost: its bytes, the JSON
elements it decodes to, and its time; each API client keeps its budgets in one place and
reads and decodes through them (``read_body``, ``lines``, ``Budget.decode``).
Every read ends by the connection's ``deadline`` (a loop time) if one is set: one timer per
deadline aborts the connection; a stream may also be aborted after a time without body data
(``abort_when_idle``), and a message of a stream that takes longer than its budget's
seconds from its first byte to its end (a drip) is cut. Bytes are read through a protocol
of our own whose buffer is bounded and fed to h11 only as it asks for more, so a connection
with anything left after its response (an answer nobody asked for) is never reused
(``reusable``, ``fit_for_reuse``). Whatever the peer sends, the only exceptions are
``ProtocolError``, ``OSError`` (``ConnectionError``, ``ssl.SSLError``) and ``TimeoutError``.
Must not touch: any API's objects or paths, credentials, the stores, the kernel.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import h11

from flannel.untrusted import boundedjson

#: Status line plus headers, interim answers included. API servers send well under 1 KiB;
#: proxies add a little. Also the bound of one chunk-size line.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
_READ = 64 * 1024  # bytes handed to h11 at a time
#: TCP keepalive on every connection, as client-go's dialer sets (30 s): a peer gone
#: without a word (a load balancer failing over without RST) is found dead within
#: KEEPIDLE + KEEPINTVL * KEEPCNT = 60 s of silence, even on a quiet stream.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3))

T = TypeVar("T")
#: A chunk-size line without its CRLF, as h11 reads it: up to 20 hex digits, extensions
#: (unread), trailing whitespace.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*", re.DOTALL)


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 or one of our bounds; the connection is unusable."""


class BodyTooLarge(ProtocolError):
    """A body or a line of it is larger than the bound the caller gave."""


@dataclass(frozen=True)
class Budget:
    """What one answer, or one message of a stream, may cost.

    ``max_bytes``: its body (a message: its line); ``max_elements``: the JSON values and
    members it may decode to (``boundedjson.element_bound``: tiny elements cost some twenty
    times their bytes once decoded); ``seconds``: its time, from the request to the answer's
    end (the caller's deadline) or from a message's first byte to its end (``lines``)."""

    max_bytes: int
    max_elements: int
    seconds: float

    def decode(self, data: bytes, what: str) -> Any:
        """``data`` as JSON within this budget; ``boundedjson.JSONLimitError`` names the bound
        it broke. Nesting is bounded by the decoder's recursion guard (an element bound
        makes the depth pre-scan's cost not worth it)."""
        return boundedjson.loads(data, what=what, max_bytes=self.max_bytes,
                                 max_elements=self.max_elements, max_depth=None)

    def decode_each(self, data: bytes, what: str, member: str,
                    each: Callable[[Any], Any]) -> Any:
        """``decode``, the top-level object's array ``member`` decoded an element at a time
        through ``each`` (``boundedjson.loads_each``): a page of a listing never alive whole."""
        return boundedjson.loads_each(data, member, each, what=what, max_bytes=self.max_bytes,
                                      max_elements=self.max_elements)


@dataclass(frozen=True)
class Head:
    status: int
    reason: str
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    version: str = "HTTP/1.1"


class _Stream(asyncio.Protocol):
    """The connection's bytes as the loop delivers them, in a buffer of our own: what is
    left unread after a response is known. Reading pauses while more than ``limit`` bytes
    wait, so a peer that sends unasked cannot grow the buffer."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.ended = False  # the peer closed its side, or the connection is gone
        self.error: BaseException | None = None
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > self.limit and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # close the transport: we never write after the peer's end

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def read(self, most: int, through: bytes = b"") -> bytes:
        """At most ``most`` bytes, as soon as some are there; b"" at the end. ``through``:
        no further than the end of its first occurrence in what is there."""
        while not self.buffer:
            if self.ended:
                if self.error is not None:
                    raise self.error
                return b""
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if through and (at := self.buffer.find(through)) >= 0:
            most = min(most, at + len(through))
        if len(self.buffer) <= most:  # the usual case: one copy, not two
            data = bytes(self.buffer)
            self.buffer.clear()
        else:
            data = bytes(self.buffer[:most])
            del self.buffer[:most]
        if self._paused and len(self.buffer) <= self.limit and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable
        if self.error is not None:
            raise self.error


def _head_size(event: h11.InformationalResponse | h11.Response) -> int:
    """The bytes a head took on the wire, near enough: status line and fields."""
    return 15 + len(event.reason) + sum(len(name) + len(value) + 4
                                        for name, value in event.headers.raw_items())


class Connection:
    """One HTTP/1.1 client connection: one request, then its response, at a time.

    A request is ``send`` (a whole body) or ``start`` + ``send_data``... + ``end_body``
    (a chunked body written while the response may already be read); then ``read_head``,
    and ``read_body``, ``pieces`` or ``lines`` for its body. ``reusable`` once a response
    was read to its end on a connection that may carry the next one."""

    def __init__(self, transport: asyncio.Transport, stream: _Stream) -> None:
        self.transport = transport
        self._stream = stream
        self._h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._deadline: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.expired = False
        self._clean_end = False  # the response ended with nothing after it
        self._loop = asyncio.get_running_loop()
        self._idle = 0.0  # >0: abort once no body data arrived for this long
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self.idle_expired = False
        self._message: asyncio.TimerHandle | None = None  # a stream message's time budget
        self._why = "the deadline passed"  # what aborted the connection
        self._both_framings = False  # the response had chunks and a Content-Length
        self._method = ""  # of the request under way

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext | None,
                   server_hostname: str | None, deadline: float) -> Connection:
        """Connect (TLS when ``context`` is given) by ``deadline``, a loop time."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(deadline):
            transport, stream = await loop.create_connection(
                lambda: _Stream(MAX_HEAD_BYTES), host, port, ssl=context,
                server_hostname=server_hostname if context else None)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in KEEPALIVE:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        assert isinstance(transport, asyncio.Transport)
        return cls(transport, stream)

    @classmethod
    async def open_unix(cls, path: str, context: ssl.SSLContext | None,
                        server_hostname: str | None, deadline: float) -> Connection:
        """Connect to the unix socket ``path`` (TLS when ``context`` is given) by
        ``deadline``, a loop time."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout_at(deadline):
            transport, stream = await loop.create_unix_connection(
                lambda: _Stream(MAX_HEAD_BYTES), path, ssl=context,
                server_hostname=server_hostname if context else None)
        assert isinstance(transport, asyncio.Transport)
        return cls(transport, stream)

    # -- time ---------------------------------------------------------------------------

    @property
    def deadline(self) -> float | None:
        return self._deadline

    @deadline.setter
    def deadline(self, when: float | None) -> None:
        """Every read and write after ``when`` (a loop time) raises TimeoutError: the
        connection is aborted then. None: no deadline."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._deadline, self._watchdog = when, None
        if when is not None:
            self._watchdog = asyncio.get_running_loop().call_at(when, self._expire)

    def abort_when_idle(self, seconds: float) -> None:
        """Abort the connection once no body data arrived for ``seconds`` (reads then raise
        TimeoutError and ``idle_expired`` is set): one timer per idle period, not per read."""
        self._idle, self._last_data = seconds, self._loop.time()
        self._idle_timer = self._loop.call_at(self._last_data + seconds, self._check_idle)

    def _check_idle(self) -> None:
        if self._loop.time() - self._last_data >= self._idle:
            self.idle_expired = True
            self._expire()
        else:
            self._idle_timer = self._loop.call_at(self._last_data + self._idle,
                                                  self._check_idle)

    def _expire(self, why: str = "the deadline passed") -> None:
        if not self.expired:
            self._why = why
        self.expired = True
        self.transport.abort()

    def _time_message(self, seconds: float | None, started: bool) -> None:
        """A message of a stream began (``started``: the timer starts unless it runs) or
        ended (the timer stops): it must end within ``seconds`` of its first byte."""
        if seconds is None:
            return
        if not started:
            if self._message is not None:
                self._message.cancel()
                self._message = None
        elif self._message is None:
            self._message = self._loop.call_later(
                seconds, self._expire,
                f"a message took longer than its budget of {seconds:g}s to arrive")

    async def _bounded(self, io: Awaitable[T]) -> T:
        try:
            result = await io
        except OSError:
            if self.expired:
                raise TimeoutError(self._why) from None
            raise
        if self.expired:  # an aborted connection reads as its end
            raise TimeoutError(self._why)
        return result

    # -- reuse --------------------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        """The last request was sent and its response read to their ends, both sides may
        go on, and nothing came after the response."""
        return (self._clean_end and self._h11.our_state is h11.DONE
                and self._h11.their_state is h11.DONE)

    def fit_for_reuse(self) -> bool:
        """Whether an idle connection may carry the next request: it was left reusable,
        the server has not closed it, and sent nothing since (an answer nobody asked for
        would be read as the next request's). Bytes still in the kernel's buffer, not yet
        delivered to the stream, are seen with a non-blocking peek at the socket."""
        stream = self._stream
        if not self.reusable or stream.buffer or stream.ended or self.transport.is_closing():
            return False
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return True
        with sock.dup() as peek:
            try:
                return not peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False

    def close(self) -> None:
        self._clean_end = False
        self.deadline = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._time_message(0, started=False)
        self.transport.close()

    # -- the request --------------------------------------------------------------------

    def _next_cycle(self, method: str) -> None:
        """Ready h11 for a new request on a reused connection."""
        self._clean_end = False
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        self._both_framings = False
        self._method = method

    async def _write(self, *events: h11.Event) -> None:
        try:
            data = b"".join(self._h11.send(event) or b"" for event in events)
        except h11.LocalProtocolError as err:
            raise ProtocolError(f"cannot send this request: {err}") from None
        if self._stream.ended:  # the server closed the connection
            raise ConnectionResetError("the server closed the connection")
        self.transport.write(data)
        await self._bounded(self._stream.drain())

    @staticmethod
    def _request(method: str, target: str, host: str, headers: dict[str, str],
                 *framing: tuple[str, str]) -> h11.Request:
        try:
            return h11.Request(method=method, target=target,
                               headers=[("Host", host), *headers.items(), *framing])
        except h11.LocalProtocolError as err:
            raise ProtocolError(f"cannot send this request: {err}") from None

    async def send(self, method: str, target: str, host: str, headers: dict[str, str],
                   body: bytes = b"") -> None:
        """One request with its whole ``body`` (a Content-Length is always sent for PATCH,
        POST and PUT, and for any body)."""
        self._next_cycle(method)
        framing = [("Content-Length", str(len(body)))] \
            if body or method in ("PATCH", "POST", "PUT") else []
        request = self._request(method, target, host, headers, *framing)
        await self._write(request, *([h11.Data(data=body)] if body else []),
                          h11.EndOfMessage())

    async def start(self, method: str, target: str, host: str,
                    headers: dict[str, str]) -> None:
        """A request whose body follows in chunks (``send_data``, then ``end_body``); its
        response may be read meanwhile (a bidirectional stream)."""
        self._next_cycle(method)
        await self._write(self._request(method, target, host, headers,
                                        ("Transfer-Encoding", "chunked")))

    async def send_data(self, data: bytes) -> None:
        """One piece of a started request's body (empty data sends nothing)."""
        if data:
            await self._write(h11.Data(data=data))

    async def end_body(self) -> None:
        """The end of a started request's body."""
        await self._write(h11.EndOfMessage())

    # -- the response -------------------------------------------------------------------

    async def _event(self, through: bytes = b"") -> h11.Event:
        """h11's next event, fed from the stream only as it asks for more (``through``: as
        ``_Stream.read``'s)."""
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as err:
                if self._stream.ended and not self.expired and \
                        not self._h11.trailing_data[0]:
                    raise ConnectionResetError("the server closed the connection") from None
                if err.error_status_hint == 431:  # h11's bound on a head or chunk-size line
                    raise ProtocolError(f"a head or chunk-size line is longer than "
                                        f"{MAX_HEAD_BYTES} bytes") from None
                raise ProtocolError(f"not an HTTP/1.1 response we can read: {err}") from None
            if event is h11.NEED_DATA:
                self._h11.receive_data(await self._bounded(self._stream.read(_READ, through)))
                continue
            if event is h11.PAUSED:  # the response ended and more bytes followed
                raise ProtocolError("the server sent more than one response")
            assert isinstance(event, h11.Event)
            return event

    async def read_head(self) -> Head:
        """The response's status and headers; 1xx interim answers are skipped, and a 101
        (we never ask to switch protocols) is a ProtocolError."""
        size = 0
        while True:
            # h11 is fed no further than the head's end: a chunked body is left to ``lines``.
            event = await self._event(b"\r\n\r\n")
            if isinstance(event, h11.ConnectionClosed):
                raise ConnectionResetError("the server closed the connection")
            if not isinstance(event, h11.InformationalResponse | h11.Response):
                raise ProtocolError(f"not an HTTP/1.1 response: {type(event).__name__}")
            size += _head_size(event)
            if size > MAX_HEAD_BYTES:
                raise ProtocolError(f"response headers exceed {MAX_HEAD_BYTES} bytes")
            if len(event.headers) > MAX_HEADERS:
                raise ProtocolError(f"response headers exceed {MAX_HEADERS} fields")
            if isinstance(event, h11.Response):
                headers: dict[str, str] = {}
                for name, value in event.headers:
                    key, text = name.decode("latin-1"), value.decode("latin-1")
                    headers[key] = f"{headers[key]}, {text}" if key in headers else text
                # RFC 9112 6.3: a message framed both ways is a sign of request smuggling
                # between proxies; chunks win, and the connection is not reused.
                self._both_framings = "transfer-encoding" in headers and \
                    "content-length" in headers
                return Head(event.status_code, event.reason.decode("latin-1"), headers,
                            f"HTTP/{event.http_version.decode('latin-1')}")

    def _finished(self) -> None:
        """The response ended: note whether anything followed it."""
        trailing, closed = self._h11.trailing_data
        self._clean_end = not (self._both_framings or trailing or closed
                               or self._stream.buffer)

    async def pieces(self, head: Head, max_bytes: int, *,
                     whole: bool = True) -> AsyncIterator[bytes]:
        """The body's data as it arrives. ``whole``: the body may total at most
        ``max_bytes``; otherwise it is a stream the caller bounds."""
        # h11 checked the Content-Length (one number) and says when it frames the body.
        length = head.headers.get("content-length")
        if whole and length is not None and "transfer-encoding" not in head.headers \
                and head.status not in (204, 304) and self._method != "HEAD" \
                and int(length) > max_bytes:
            raise BodyTooLarge(f"the response body of {int(length)} bytes is larger than "
                               f"the limit of {max_bytes} bytes")
        total = 0
        while True:
            try:
                event = await self._event()
            except ConnectionResetError:
                raise ConnectionResetError("the server closed the connection mid-body") \
                    from None
            if isinstance(event, h11.Data):
                total += len(event.data)
                if whole and total > max_bytes:
                    raise BodyTooLarge(f"the response body is larger than the limit of "
                                       f"{max_bytes} bytes")
                self._last_data = self._loop.time()
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._finished()
                return
            else:
                raise ProtocolError(f"unexpected {type(event).__name__} in a response body")

    async def read_body(self, head: Head, limit: int | Budget) -> bytes:
        """The whole body, at most ``limit`` bytes (a budget's; BodyTooLarge past it)."""
        max_bytes = limit.max_bytes if isinstance(limit, Budget) else limit
        return b"".join([data async for data in self.pieces(head, max_bytes)])

    async def lines(self, head: Head, limit: int | Budget) -> AsyncIterator[bytes]:
        """The body's newline-terminated lines (without the newline), each at most
        ``limit`` bytes (a budget's; a longer one raises BodyTooLarge). With a budget, a
        line must also arrive within its seconds from its first byte: a slower one aborts
        the connection (TimeoutError, naming the budget). A chunked body (every watch
        stream) is unframed here rather than by h11, whose bookkeeping cost more than the
        rest of a line's reading (h11 still reads the last chunk, so the connection is
        reusable after a clean end)."""
        max_line, seconds = ((limit.max_bytes, limit.seconds) if isinstance(limit, Budget)
                             else (limit, None))
        pieces = self._chunks() if self._chunked(head) else \
            self.pieces(head, max_line, whole=False)
        pending = bytearray()
        try:
            async for data in pieces:
                start = 0
                while (end := data.find(b"\n", start)) >= 0:
                    if len(pending) + end - start > max_line:
                        raise BodyTooLarge(f"a line of the response is longer than the limit "
                                           f"of {max_line} bytes")
                    if pending:
                        pending += data[start:end]
                        line = bytes(pending)
                        pending.clear()
                    else:
                        line = data[start:end]
                    self._time_message(seconds, started=False)
                    yield line
                    start = end + 1
                if len(pending) + len(data) - start > max_line:
                    raise BodyTooLarge(f"a line of the response is longer than the limit of "
                                       f"{max_line} bytes")
                pending += data[start:]
                self._time_message(seconds, started=bool(pending))
        finally:
            self._time_message(seconds, started=False)
        if pending.strip():
            yield bytes(pending)

    def _chunked(self, head: Head) -> bool:
        """Whether h11 would read this response's body as chunks (it checked the field)
        and holds none of it yet (a head's end cut across reads may leave some there)."""
        return "transfer-encoding" in head.headers and head.status not in (204, 304) and \
            head.status >= 200 and self._method != "HEAD" and not self._h11.trailing_data[0]

    async def _chunks(self) -> AsyncIterator[bytes]:
        """A chunked body's data, a chunk's bytes (or as much of them as has arrived) at a
        time, as h11 would give them: the same checks of chunk-size lines (at most
        ``MAX_HEAD_BYTES``), of the line ending each chunk's data and of the trailer
        section's size. The last chunk and the trailer section are h11's again, so that the
        response ends as every other does (``reusable``)."""
        buf = b""
        pos = 0

        async def more() -> bytes:
            data = await self._bounded(self._stream.read(_READ))
            if not data:
                raise ConnectionResetError("the server closed the connection mid-body")
            self._last_data = self._loop.time()
            return data

        while True:
            while (eol := buf.find(b"\r\n", pos, pos + MAX_HEAD_BYTES)) < 0:
                if len(buf) - pos >= MAX_HEAD_BYTES:
                    raise ProtocolError(f"a head or chunk-size line is longer than "
                                        f"{MAX_HEAD_BYTES} bytes")
                buf = buf[pos:] + await more()
                pos = 0
            size_line = _CHUNK_SIZE.fullmatch(buf, pos, eol)
            if size_line is None:
                raise ProtocolError("not an HTTP/1.1 response we can read: illegal chunk "
                                    f"header: {buf[pos:eol + 2]!r}")
            left = int(size_line[1], 16)
            if not left:
                break
            pos = eol + 2
            while left:
                if pos == len(buf):
                    buf, pos = await more(), 0
                take = min(left, len(buf) - pos)
                yield buf[pos:pos + take] if take < len(buf) else buf
                pos += take
                left -= take
            while len(buf) - pos < 2:
                buf = buf[pos:] + await more()
                pos = 0
            if buf[pos:pos + 2] != b"\r\n":
                raise ProtocolError("not an HTTP/1.1 response we can read: malformed chunk "
                                    f"footer: {buf[pos:pos + 2]!r} (expected b'\\r\\n')")
            pos += 2
        self._h11.receive_data(buf[pos:])
        try:
            end = await self._event()  # h11 reads the last chunk and the trailer section
        except ConnectionResetError:
            raise ConnectionResetError("the server closed the connection mid-body") from None
        assert isinstance(end, h11.EndOfMessage)  # after a last chunk, nothing else
        self._finished()
