"""A test double of etcd's JSON gateway gone wrong: an HTTP/1.1 relay in front of a real
etcd that forwards every request, and etcd's answer, as they are, unless the test gave a
hostile answer for that path.

What it models: whatever may answer in etcd's place on its client port (a proxy, a load
balancer, a compromised or buggy gateway) and can send anything at all: huge or endless
bodies, many tiny JSON elements, deep nesting, fields of the wrong type, pages that never
end, redirects, bytes dripping slowly, connections reset mid-body, error storms, watch
streams that break, compact or go back and forth in revisions. It answers one request per
connection (each answer ends with its connection, which the client then does not reuse),
and it relays etcd's own answers byte for byte (``Connection: close`` is the only header it
adds to a request), so everything the test does not make hostile is real etcd.

``rules`` maps a request path (``/v3/kv/range``, ``/v3/watch``..., ``*`` for any other) to a
``Rule``: given the request and a handle on etcd (``Upstream``: etcd's answer to the same
request, whole or as a watch stream), it yields the bytes to send in its place. The helpers
below build answers: ``answer`` (a whole JSON answer), ``stream_head`` and ``chunk`` (a
chunked body), ``endless`` (a chunked body of a unit repeated up to a size), ``redirect``.
``requests`` records every request (path, parsed body, time), ``sent`` the bytes sent for
hostile answers, and ``connections`` how many connections came in; ``cut`` resets every open
connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from flannel.clients.http import Connection

Rule = Callable[["Request", "Upstream"], AsyncIterator[bytes]]
_RELAYED = ("authorization", "content-type", "grpc-metadata-hasleader")


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    @property
    def doc(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            return None


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def answer(doc: Any, status: int = 200, reason: str = "OK") -> bytes:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def stream_head(status: int = 200) -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def endless(opening: bytes, unit: bytes, size: int, closing: bytes = b"") -> \
        AsyncIterator[bytes]:
    """A 200 whose chunked body is ``opening``, ``unit`` repeated to about ``size`` bytes,
    then ``closing``: 60 MiB of ``{},`` as one range answer, for instance."""
    yield stream_head() + chunk(opening)
    piece = unit * max(1, 65536 // len(unit))
    for _ in range(size // len(piece)):
        yield chunk(piece)
    yield chunk(closing) + b"0\r\n\r\n"


def redirect(status: int, location: str) -> bytes:
    return (f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
            ).encode()


class Upstream:
    """etcd's answer to the request a rule is answering."""

    def __init__(self, port: int, request: Request) -> None:
        self.port, self.request = port, request

    async def _open(self) -> tuple[Connection, Any]:
        loop = asyncio.get_running_loop()
        conn = await Connection.open("127.0.0.1", self.port, None, None, loop.time() + 10)
        headers = {k: v for k, v in self.request.headers.items() if k in _RELAYED}
        await conn.send(self.request.method, self.request.path, f"127.0.0.1:{self.port}",
                        headers, self.request.body)
        return conn, await conn.read_head()

    async def json(self) -> tuple[int, Any]:
        """etcd's whole answer: its status and its JSON."""
        conn, head = await self._open()
        try:
            return head.status, json.loads(await conn.read_body(head, 1 << 30))
        finally:
            conn.close()

    async def messages(self) -> AsyncIterator[Any]:
        """etcd's watch stream, message by message (decoded), until it ends."""
        conn, head = await self._open()
        try:
            async for line in conn.lines(head, 1 << 30):
                yield json.loads(line)
        finally:
            conn.close()


class EtcdGateway:
    def __init__(self, etcd_port: int) -> None:
        self.etcd_port = etcd_port
        self.rules: dict[str, Rule] = {}
        self.requests: list[Request] = []
        self.sent = 0
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, sock: socket.socket | None = None) -> EtcdGateway:
        """Listen on loopback, or on ``sock`` (e.g. bound in a flanneld's namespace)."""
        if sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=sock)
        else:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def paths(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    def cut(self) -> None:
        """Reset every open connection (the watch streams under way among them), so that
        the rules set since apply to what the client asks next."""
        for writer in list(self._writers):
            writer.transport.abort()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> EtcdGateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        self.connections += 1
        try:
            line = await reader.readline()
            if not line:
                return
            method, path, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while (header := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length") or 0))
            request = Request(method, path, headers, body)
            self.requests.append(request)
            rule = self.rules.get(path) or self.rules.get("*")
            if rule is None:
                await self._relay(request, reader, writer)
                return
            async for data in rule(request, Upstream(self.etcd_port, request)):
                if writer.is_closing():  # the client hung up (asyncio no longer says so)
                    break
                writer.write(data)
                await writer.drain()
                self.sent += len(data)
        except (OSError, asyncio.IncompleteReadError, ValueError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        finally:
            writer.close()
            self._tasks.discard(task)
            self._writers.discard(writer)

    async def _relay(self, request: Request, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.etcd_port)
        try:
            headers = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items()
                              if k != "connection")
            up_writer.write(f"{request.method} {request.path} HTTP/1.1\r\n{headers}"
                            "Connection: close\r\n\r\n".encode("latin-1") + request.body)
            await up_writer.drain()

            async def client_gone() -> None:
                await reader.read()  # the client hangs up: stop relaying (a watch)

            gone = asyncio.ensure_future(client_gone())
            try:
                while data := await up_reader.read(65536):
                    writer.write(data)
                    await writer.drain()
                    if gone.done():
                        break
            finally:
                gone.cancel()
        finally:
            up_writer.close()
            with contextlib.suppress(OSError):
                await up_writer.wait_closed()
