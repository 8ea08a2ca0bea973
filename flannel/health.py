"""The health endpoints: ``/healthz`` (alive) and ``/readyz`` (network programmed).

Owns a minimal HTTP/1.1 server on ``--healthz-ip:--healthz-port``. ``/readyz`` answers 200
only when every readiness component has reported ready (``flannel.readiness``: startup,
subnet.env, store, rules, data plane); otherwise 503 with the reason in the body. The default
address 0.0.0.0 serves that text on every address of the host, so the body says what is
wrong but never where: paths (files, store keys) are cut to their last part; the log
has them whole.
Must not touch: anything but its listening socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]

# An absolute, ~/ or ./ path: a "/" not right after a word character, dot, colon or dash
# (so 10.0.0.0/16, fd00::/56, and/or stay), up to whitespace, a quote or punctuation.
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?/[^\s'\",:;()\[\]]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
REASON_LIMIT = 600


def _last_part(path: re.Match) -> str:
    """The file or key name without where it lives: subnet.env, 10.5.0.0-24, nft."""
    return path.group().rstrip("/").rsplit("/", 1)[-1] or "<path>"


def public_reason(reason: str) -> str:
    """``reason`` fit for anyone who can reach the port: one line, bounded, no paths."""
    text = _PATH.sub(_last_part, _CONTROL.sub(" ", reason)).strip()
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


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
            return _response(503, "Service Unavailable",
                             f"flanneld is not ready yet: {public_reason(why)}\n")
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
        # A numeric host only: the flag is checked to be an IP, and no name lookup happens.
        self._server = await asyncio.start_server(
            self._handle, host, port, flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)
        log.info("health server listening on %s port %d (/healthz, /readyz)%s", host, port,
                 "; every address of this host answers, --healthz-ip limits that"
                 if host in ("0.0.0.0", "::") else "")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 3)
