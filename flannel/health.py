"""The health endpoints: ``/healthz`` (alive) and ``/readyz`` (network programmed).

Owns a minimal HTTP/1.1 server on ``--healthz-ip:--healthz-port``. ``/readyz`` answers 200
only when subnet.env is written, the traffic rules are installed and the backend has
programmed the current peers; otherwise 503 with the reason in the body.
Must not touch: anything but its listening socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]


def _response(code: int, reason: str, body: str) -> bytes:
    data = body.encode()
    head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


class HealthServer:
    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness
        self._server: asyncio.Server | None = None

    def answer(self, method: str, path: str) -> bytes:
        path = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return _response(405, "Method Not Allowed", "use GET\n")
        if path == "/healthz":
            return _response(200, "OK", "flanneld is running\n")
        if path == "/readyz":
            ready, why = self.readiness()
            if ready:
                return _response(200, "OK", "flanneld is ready\n")
            return _response(503, "Service Unavailable", f"flanneld is not ready yet: {why}\n")
        return _response(404, "Not Found", "try /healthz or /readyz\n")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                for _ in range(100):  # headers, bounded
                    if (await reader.readline()) in (b"\r\n", b"\n", b""):
                        break
            parts = request.decode("latin-1").split()
            reply = self.answer(parts[0], parts[1]) if len(parts) >= 2 else _response(
                400, "Bad Request", "bad request\n")
            writer.write(reply)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)
        log.info("health server listening on %s:%d (/healthz, /readyz)", host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 3)
