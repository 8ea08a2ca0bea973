"""Answers a broken or compromised server sends, for the lab's and the tests' HTTP doubles
(the Compute Engine, Alibaba Cloud and metadata doubles take one in place of an answer:
``answer_with(..., behaviour)``, kept in a ``Queued``).

A behaviour writes straight to the request handler's socket, bypassing what
``BaseHTTPRequestHandler`` would check: ``verbatim`` (any status and body), ``huge`` (a
body of endless or enormous size, announced or chunked), ``amplifying`` (valid JSON of
millions of tiny elements), ``deep`` (nesting), ``drip`` (one byte every so often, never
done in time), ``reset`` (a connection reset mid-body), ``redirect`` (to another host).
Each gives up quietly when the client goes away, and ends within its own bounds, so a
double's threads never outlive a test by much. ``Witness`` is that other host: it records
every request that reaches it (a credential a client carried there is a leak).
Must not touch: anything but the connections it is given and the server it starts.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import cycle

from flannel.kernel.host import LOCAL, Host
from flannel_lab.served import endpoint, serve, shut

Behaviour = Callable[[BaseHTTPRequestHandler], None]

#: How long a behaviour goes on at most, so that a server's thread ends after its test.
LONGEST = 120.0


def _head(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    lines = [f"HTTP/1.1 {status} Whatever"] + [f"{k}: {v}" for k, v in headers.items()]
    handler.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def _send(handler: BaseHTTPRequestHandler, data: bytes) -> bool:
    """False once the client went away."""
    try:
        handler.wfile.write(data)
        handler.wfile.flush()
    except OSError:
        return False
    return True


def verbatim(status: int, body: bytes | str, headers: dict[str, str] | None = None,
             ) -> Behaviour:
    """``body`` as it is, with its length, under ``headers`` (JSON by default)."""
    data = body.encode() if isinstance(body, str) else body

    def behave(handler: BaseHTTPRequestHandler) -> None:
        _head(handler, status, {"Content-Type": "application/json", **(headers or {}),
                                "Content-Length": str(len(data))})
        _send(handler, data)
    return behave


def _stream(handler: BaseHTTPRequestHandler, pieces: Iterator[bytes], chunked: bool,
            headers: dict[str, str]) -> None:
    head = {"Content-Type": "application/json", **headers}
    if chunked:
        head["Transfer-Encoding"] = "chunked"
    try:
        _head(handler, 200, head)
    except OSError:
        return
    end = time.monotonic() + LONGEST
    for piece in pieces:
        if time.monotonic() > end:
            return
        data = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
        if not _send(handler, data):
            return
    if chunked:
        _send(handler, b"0\r\n\r\n")


def huge(total: int, *, announced: bool = True, chunk: bytes = b"{}" * 32768,
         headers: dict[str, str] | None = None) -> Behaviour:
    """``total`` bytes of ``chunk`` over and over: with a Content-Length saying so
    (``announced``), or chunked with no length at all."""
    def pieces() -> Iterator[bytes]:
        sent = 0
        for piece in cycle([chunk]):
            if sent >= total:
                return
            yield piece[:total - sent]
            sent += len(piece)

    def behave(handler: BaseHTTPRequestHandler) -> None:
        extra = {"Content-Length": str(total)} if announced else {}
        _stream(handler, pieces(), not announced, {**extra, **(headers or {})})
    return behave


def amplifying(items: int, member: str = "items", extra: dict[str, object] | None = None,
               ) -> Behaviour:
    """``{"<member>": [{}, {}, ...], **extra}``: valid JSON, three bytes an element."""
    tail = (", " + json.dumps(extra)[1:-1]) if extra else ""
    data = (f'{{"{member}": [' + "{}," * (items - 1) + "{}]" + tail + "}").encode()
    return verbatim(200, data)


def deep(depth: int) -> Behaviour:
    return verbatim(200, "[" * depth + "]" * depth)


def drip(data: bytes, interval: float, *, status: int = 200,
         headers: dict[str, str] | None = None) -> Behaviour:
    """A well-formed answer whose body comes one byte every ``interval`` seconds."""
    def behave(handler: BaseHTTPRequestHandler) -> None:
        try:
            _head(handler, status, {"Content-Type": "application/json", **(headers or {}),
                                    "Content-Length": str(len(data))})
            handler.wfile.flush()
        except OSError:
            return
        end = time.monotonic() + LONGEST
        for byte in data:
            time.sleep(interval)
            if time.monotonic() > end or not _send(handler, bytes([byte])):
                return
    return behave


def reset(declared: int, sent: bytes) -> Behaviour:
    """A Content-Length of ``declared``, ``sent`` of it, then a reset (RST, not FIN)."""
    def behave(handler: BaseHTTPRequestHandler) -> None:
        try:
            _head(handler, 200, {"Content-Type": "application/json",
                                 "Content-Length": str(declared)})
            handler.wfile.write(sent)
            handler.wfile.flush()
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                          struct.pack("ii", 1, 0))
            handler.connection.close()
        except OSError:
            pass
        handler.close_connection = True
    return behave


def redirect(status: int, location: str) -> Behaviour:
    """A redirect (302, 307...) to ``location``, another host's URL."""
    return verbatim(status, "", {"Location": location})


class Queued:
    """What a double answers with instead, per action (or path): each behaviour queued
    ``times``, or given every time (None) until ``clear()``. Not locked: a double calls it
    under its own lock, or from one thread."""

    def __init__(self) -> None:
        self._queued: dict[str, list[Behaviour]] = {}
        self._always: dict[str, Behaviour] = {}

    def add(self, key: str, behaviour: Behaviour, times: int | None) -> None:
        if times is None:
            self._always[key] = behaviour
        else:
            self._queued.setdefault(key, []).extend([behaviour] * times)

    def clear(self) -> None:
        self._queued.clear()
        self._always.clear()

    def take(self, key: str) -> Behaviour | None:
        queued = self._queued.get(key)
        if queued:
            return queued.pop(0)
        return self._always.get(key)


class Witness:
    """A server a redirect points to: every request it gets is recorded (method, path,
    headers with lower-case names) and answered 200 with an empty JSON object."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{endpoint(self._server)}"

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> Witness:
        witness = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _record(self) -> None:
                witness.requests.append((self.command, self.path, {
                    name.lower(): value for name, value in self.headers.items()}))
                verbatim(200, "{}")(self)

            do_GET = do_POST = do_PUT = do_DELETE = _record

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)
