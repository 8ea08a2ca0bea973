"""HTTP/1.1 over one asyncio connection, for the Kubernetes API client: every read bounded.

Owns: writing a request, reading the status line and headers (at most ``MAX_HEAD_BYTES``,
``MAX_HEADERS`` fields), reading a body framed by Content-Length, chunked transfer coding or
the end of the connection, within a byte bound the caller gives, and splitting a streamed
body into lines within a line bound (watch events). Every read ends by the connection's
``deadline`` (a loop time) if one is set: one timer per deadline aborts the connection
(a timer per read cost more than the parsing of a watch event); a stream may also be
aborted after a time without data (``abort_when_idle``). Every connection has TCP
keepalive on. Bytes are read through a protocol of our own whose buffer is bounded, so a
connection with anything left after its response (an answer nobody asked for) is never
reused (``reusable``, ``fit_for_reuse``). Whatever the peer sends,
the only exceptions are ``ProtocolError``, ``OSError`` (``ConnectionError``,
``ssl.SSLError``) and ``TimeoutError``.
Must not touch: the API's objects, credentials, the kernel.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

#: Status line plus headers. The API server sends well under 1 KiB; proxies add a little.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
_READ = 64 * 1024  # one read of body data
_HEX = frozenset(b"0123456789abcdefABCDEF")
#: TCP keepalive on every connection, as client-go's dialer sets (30 s): a peer gone
#: without a word (a load balancer failing over without RST) is found dead within
#: KEEPIDLE + KEEPINTVL * KEEPCNT = 60 s of silence, even on a quiet watch.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 30), (socket.TCP_KEEPINTVL, 10), (socket.TCP_KEEPCNT, 3))

T = TypeVar("T")


class ProtocolError(Exception):
    """The peer broke HTTP/1.1 or one of our bounds; the connection is unusable."""


class BodyTooLarge(ProtocolError):
    """A body or a line of it is larger than the bound the caller gave."""


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

    async def _more(self) -> None:
        """Wait for data or the end; raise the connection's failure, if any."""
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    async def readuntil(self, separator: bytes, limit: int) -> bytes:
        """Up to and including ``separator``; ProtocolError past ``limit`` bytes, and
        IncompleteReadError at the end of the connection."""
        start = 0
        while (found := self.buffer.find(separator, start)) < 0:
            if len(self.buffer) > limit:
                raise ProtocolError(f"a header or chunk-size line is longer than "
                                    f"{limit} bytes")
            if self.ended:
                if self.error is not None:
                    raise self.error
                partial = bytes(self.buffer)
                self.buffer.clear()
                raise asyncio.IncompleteReadError(partial, None)
            start = max(0, len(self.buffer) - len(separator) + 1)
            await self._more()
        end = found + len(separator)
        if end > limit:
            raise ProtocolError(f"a header or chunk-size line is longer than {limit} bytes")
        line = bytes(self.buffer[:end])
        del self.buffer[:end]
        return line

    async def read(self, most: int) -> bytes:
        """At most ``most`` bytes, as soon as some are there; b"" at the end."""
        while not self.buffer:
            if self.ended:
                if self.error is not None:
                    raise self.error
                return b""
            await self._more()
        data = bytes(self.buffer[:most])
        del self.buffer[:most]
        return data

    async def drain(self) -> None:
        if self._writable is not None:
            await self._writable
        if self.error is not None:
            raise self.error


class Connection:
    """One HTTP/1.1 connection; ``reusable`` once a response was read to its end."""

    def __init__(self, transport: asyncio.Transport, stream: _Stream) -> None:
        self.transport = transport
        self._stream = stream
        self._deadline: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.expired = False
        self.reusable = False
        self._loop = asyncio.get_running_loop()
        self._idle = 0.0  # >0: abort once no body data arrived for this long
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_data = 0.0
        self.idle_expired = False

    @classmethod
    async def open(cls, host: str, port: int, context: ssl.SSLContext | None,
                   server_hostname: str | None, deadline: float) -> Connection:
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

    @property
    def deadline(self) -> float | None:
        return self._deadline

    @deadline.setter
    def deadline(self, when: float | None) -> None:
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

    def _expire(self) -> None:
        self.expired = True
        self.transport.abort()

    async def _bounded(self, read: Awaitable[T]) -> T:
        try:
            result = await read
        except (OSError, asyncio.IncompleteReadError):
            if self.expired:
                raise TimeoutError("the deadline passed") from None
            raise
        if self.expired:  # an aborted connection reads as its end
            raise TimeoutError("the deadline passed")
        return result

    def close(self) -> None:
        self.reusable = False
        self.deadline = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.transport.close()

    async def send(self, method: str, target: str, host: str, headers: dict[str, str],
                   body: bytes = b"") -> None:
        self.reusable = False
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body or method in ("PATCH", "POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        for line in lines:
            if "\r" in line or "\n" in line:
                raise ProtocolError("a request header holds a line break")
        if self._stream.ended:  # the server closed an idle connection
            raise ConnectionResetError("the server closed the connection")
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await self._bounded(self._stream.drain())

    async def _line(self) -> bytes:
        try:
            return await self._bounded(self._stream.readuntil(b"\n", MAX_HEAD_BYTES))
        except asyncio.IncompleteReadError as err:
            raise ConnectionResetError("the server closed the connection mid-response"
                                       if err.partial else
                                       "the server closed the connection") from None

    async def read_head(self) -> Head:
        size = 0
        while True:  # 1xx interim answers are skipped
            line = await self._line()
            size += len(line)
            parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or \
                    not parts[1].isdigit() or len(parts[1]) != 3:
                raise ProtocolError(f"not an HTTP/1.1 status line: {line[:80]!r}")
            status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
            if size > MAX_HEAD_BYTES:  # interim answers count too
                raise ProtocolError(f"response headers exceed {MAX_HEAD_BYTES} bytes")
            if status == 101:  # we never ask to switch protocols
                raise ProtocolError("the server switched protocols (101) unasked")
            headers: dict[str, str] = {}
            while (field := await self._line()) not in (b"\r\n", b"\n"):
                size += len(field)
                if size > MAX_HEAD_BYTES or len(headers) >= MAX_HEADERS:
                    raise ProtocolError(f"response headers exceed {MAX_HEAD_BYTES} bytes or "
                                        f"{MAX_HEADERS} fields")
                name, colon, value = field.decode("latin-1").partition(":")
                if not colon or not name or name != name.strip():
                    raise ProtocolError(f"malformed header field: {field[:80]!r}")
                key, value = name.lower(), value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            if status >= 200:
                return Head(status, reason, headers, parts[0])

    def _framing(self, head: Head) -> tuple[bool, int | None]:
        """(chunked, content length); a length of None means "until the connection ends"."""
        coding = head.headers.get("transfer-encoding", "").lower()
        if coding:
            if coding.split(",")[-1].strip() != "chunked":
                raise ProtocolError(f"unsupported transfer-encoding {coding!r}")
            return True, None  # a Content-Length too: chunked wins, see _keep_alive
        text = head.headers.get("content-length")
        if text is None:
            return False, None
        if not text.isdigit() or len(text) > 18:
            raise ProtocolError(f"bad content-length {text[:40]!r}")
        return False, int(text)

    @staticmethod
    def _keep_alive(head: Head) -> bool:
        """Whether the connection may carry another request (RFC 9112 9.3): HTTP/1.0 only
        with ``Connection: keep-alive``; never after a message framed both by chunks and a
        Content-Length (a sign of request smuggling between proxies, RFC 9112 6.3)."""
        tokens = {t.strip() for t in head.headers.get("connection", "").lower().split(",")}
        if "transfer-encoding" in head.headers and "content-length" in head.headers:
            return False
        if head.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    def _unread(self) -> bool:
        """Bytes the server sent past the end of the response: the next answer on this
        connection would not be ours."""
        return bool(self._stream.buffer)

    async def pieces(self, head: Head, max_bytes: int, *,
                     whole: bool = True) -> AsyncIterator[bytes]:
        """The body's data as it arrives, in reads of at most 64 KiB. ``whole``: the body
        may total at most ``max_bytes``; otherwise it is a stream the caller bounds."""
        chunked, length = self._framing(head)
        if head.status in (204, 304):  # never a body (RFC 9112 6.3)
            chunked, length = False, 0
        keep_alive = self._keep_alive(head)
        if not chunked:
            if length is not None and whole and length > max_bytes:
                raise BodyTooLarge(f"the response body of {length} bytes is larger than "
                                   f"the limit of {max_bytes} bytes")
            left = length
            while left is None or left > 0:
                data = await self._bounded(self._stream.read(
                    _READ if left is None else min(left, _READ)))
                if not data:
                    if left is None:
                        return
                    raise ConnectionResetError("the server closed the connection mid-body")
                if left is not None:
                    left -= len(data)
                self._last_data = self._loop.time()
                yield data
            self.reusable = keep_alive and not self._unread()
            return
        total = 0
        while True:
            line = await self._line()
            size_text = line.split(b";", 1)[0].strip()
            if not size_text or len(size_text) > 16 or not set(size_text) <= _HEX:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}")
            size = int(size_text, 16)
            if size == 0:
                break
            total += size
            if whole and total > max_bytes:
                raise BodyTooLarge(f"the response body is larger than the limit of "
                                   f"{max_bytes} bytes")
            left = size
            while left:
                data = await self._bounded(self._stream.read(min(left, _READ)))
                if not data:
                    raise ConnectionResetError("the server closed the connection mid-body")
                left -= len(data)
                self._last_data = self._loop.time()
                yield data
            if await self._line() not in (b"\r\n", b"\n"):
                raise ProtocolError("a chunk is longer than its size line says")
        while await self._line() not in (b"\r\n", b"\n"):  # trailer fields: ignored
            pass
        self.reusable = keep_alive and not self._unread()

    async def read_body(self, head: Head, max_bytes: int) -> bytes:
        parts = []
        size = 0
        async for data in self.pieces(head, max_bytes):
            size += len(data)
            if size > max_bytes:  # a body delimited by the connection's end
                raise BodyTooLarge(f"the response body is larger than the limit of "
                                   f"{max_bytes} bytes")
            parts.append(data)
        return b"".join(parts)

    async def lines(self, head: Head, max_line: int) -> AsyncIterator[bytes]:
        """The body's newline-terminated lines (without the newline), each at most
        ``max_line`` bytes; a longer one raises BodyTooLarge."""
        pending = bytearray()
        async for data in self.pieces(head, max_line, whole=False):
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                if len(pending) + end - start > max_line:
                    raise BodyTooLarge(f"a line of the response is longer than the limit of "
                                       f"{max_line} bytes")
                pending += data[start:end]
                yield bytes(pending)
                pending.clear()
                start = end + 1
            if len(pending) + len(data) - start > max_line:
                raise BodyTooLarge(f"a line of the response is longer than the limit of "
                                   f"{max_line} bytes")
            pending += data[start:]
        if pending.strip():
            yield bytes(pending)
