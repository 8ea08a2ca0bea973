"""The health endpoints: ``/healthz`` (alive), ``/readyz`` (network programmed),
``/metrics`` (Prometheus) and ``/status`` (JSON for ``flannelctl status``).

Owns a minimal HTTP/1.1 server on ``--healthz-ip:--healthz-port`` and on flanneld's local
socket (``flannel.localsock``: mode 0600, so every client there is local). ``/readyz``
answers 200 only when every readiness component has reported ready (``flannel.readiness``:
startup, subnet.env, store, rules, data plane); otherwise 503 with the reason in the body.
The default address 0.0.0.0 serves that text on every address of the host, so the body says
what is wrong but never where: paths (files, store keys) are cut to their last part; the
log has them whole. ``/metrics`` (``flannel.metrics``, imported at the first scrape) answers
anyone who can reach the port, as Prometheus scrapes from elsewhere. ``/status``
(``flannel.nodestate``) tells more (whole reasons, addresses, devices), so it answers only
a client on this host: one that connects from a loopback address or from the very address
it connected to; any other gets 403.
Must not touch: anything but its listening sockets (the local one is made and removed by
``flannel.localsock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import ipaddress
import json
import logging
import re
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flannel.nodestate import NodeState, status_document

if TYPE_CHECKING:
    from flannel.metrics import Exposition

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]

# An absolute, ~/ or ./ path: a "/" not right after a word character, dot, colon or dash
# (so 10.0.0.0/16, fd00::/56, and/or stay), up to whitespace, a quote or punctuation.
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?/[^\s'\",:;()\[\]]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
REASON_LIMIT = 600


def _last_part(path: re.Match[str]) -> str:
    """The file or key name without where it lives: subnet.env, 10.5.0.0-24, nft."""
    return path.group().rstrip("/").rsplit("/", 1)[-1] or "<path>"


def public_reason(reason: str) -> str:
    """``reason`` fit for anyone who can reach the port: one line, bounded, no paths."""
    text = _PATH.sub(_last_part, _CONTROL.sub(" ", reason)).strip()
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


def _response(code: int, reason: str, body: str | bytes,
              content_type: str = "text/plain; charset=utf-8") -> bytes:
    data = body.encode() if isinstance(body, str) else body
    head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n")
    return head.encode() + data


def same_host(peer: Any, local: Any) -> bool:
    """Whether a connection with these (peername, sockname) comes from this host: from a
    loopback address, or from the address it reached (only this host sends from it)."""
    try:
        source = ipaddress.ip_address(peer[0])
        target = ipaddress.ip_address(local[0])
    except (TypeError, IndexError, ValueError):
        return False  # not an IP socket: refuse rather than guess
    if isinstance(source, ipaddress.IPv6Address) and source.ipv4_mapped is not None:
        source = source.ipv4_mapped
    if isinstance(target, ipaddress.IPv6Address) and target.ipv4_mapped is not None:
        target = target.ipv4_mapped
    return source.is_loopback or source == target


class HealthServer:
    def __init__(self, readiness: Readiness, state: NodeState | None = None) -> None:
        self.readiness = readiness
        self.state = state
        self._exposition: Exposition | None = None
        self._server: asyncio.Server | None = None
        self._unix: asyncio.Server | None = None

    def answer(self, method: str, path: str, local: bool = False) -> bytes:
        """The reply to one request; ``local``: the client is on this host."""
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
        if path == "/metrics" and self.state is not None:
            return self._metrics(self.state)
        if path == "/status" and self.state is not None:
            if not local:
                return _response(403, "Forbidden", "/status answers clients on this host "
                                 "only: run flannelctl status on the node\n")
            body = json.dumps(status_document(self.state), indent=1) + "\n"
            return _response(200, "OK", body, "application/json")
        return _response(404, "Not Found", "try /healthz, /readyz, /metrics or /status\n"
                         if self.state is not None else "try /healthz or /readyz\n")

    async def _prepare(self, path: str) -> None:
        """Before the first /metrics: import the library in a thread (~0.1 s of CPU that
        would otherwise stall the event loop); ``_metrics`` reports a failure."""
        if (path.split("?", 1)[0] == "/metrics" and self.state is not None
                and self._exposition is None):
            with contextlib.suppress(ImportError):
                await asyncio.to_thread(importlib.import_module, "flannel.metrics")

    def _metrics(self, state: NodeState) -> bytes:
        from flannel.metrics import CONTENT_TYPE, Exposition

        try:
            if self._exposition is None:
                self._exposition = Exposition(state)
            return _response(200, "OK", self._exposition.render(), CONTENT_TYPE)
        except Exception:  # a scrape must not take the server down; the log has the cause
            log.exception("rendering /metrics failed")
            return _response(500, "Internal Server Error", "rendering the metrics failed; "
                             "see flanneld's log\n")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      unix: bool = False) -> None:
        try:
            try:
                async with asyncio.timeout(5):
                    request = await reader.readline()
                    for _ in range(100):  # headers, bounded
                        if (await reader.readline()) in (b"\r\n", b"\n", b""):
                            break
            except ValueError:  # a line beyond the stream's limit (64 KiB)
                writer.write(_response(431, "Request Header Fields Too Large",
                                       "request line or header too long\n"))
                await writer.drain()
                return
            parts = request.decode("latin-1").split()
            if len(parts) >= 2:
                await self._prepare(parts[1])
            local = unix or same_host(writer.get_extra_info("peername"),
                                      writer.get_extra_info("sockname"))
            reply = self.answer(parts[0], parts[1], local) if len(parts) >= 2 else _response(
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
        log.info("health server listening on %s port %d (/healthz, /readyz%s)%s", host, port,
                 ", /metrics, /status" if self.state is not None else "",
                 "; every address of this host answers, --healthz-ip limits that"
                 if host in ("0.0.0.0", "::") else "")

    async def start_unix(self, sock: socket.socket) -> None:
        """Serve on a listening unix socket (``flannel.localsock``)."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._handle(reader, writer, unix=True)

        self._unix = await asyncio.start_unix_server(handle, sock=sock)

    async def stop(self) -> None:
        servers = [s for s in (self._server, self._unix) if s is not None]
        for server in servers:
            server.close()
        for server in servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 3)
