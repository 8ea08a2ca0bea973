"""The health endpoints: ``/healthz`` (alive), ``/readyz`` (network programmed),
``/metrics`` (Prometheus), ``/status`` (JSON for ``flannelctl status``) and ``/probes`` (every
peer's latest probe result, JSON for ``flannelctl doctor`` and ``check``).

Owns a minimal HTTP/1.1 server (h11 frames the requests and the replies) on
``--healthz-ip:--healthz-port`` and on flanneld's local socket (``flannel.monitor.localsock``:
mode 0600, so every client there is local). ``/readyz`` answers 200 only when every
readiness component has reported ready (``flannel.reporting.readiness``: startup,
subnet.env, store, rules, data plane); otherwise 503 with the reason in the body.
The default address 0.0.0.0 serves that text on every address of the host, so the body says
what is wrong but never where: paths (files, store keys) are cut to their last part; the
log has them whole. ``/metrics`` (``flannel.monitor.metrics``, imported at the first scrape)
answers anyone who can reach the port, as Prometheus scrapes from elsewhere. ``/status``
(``flannel.monitor.nodestate``) tells more (whole reasons, addresses, devices), so it answers
only a client on this host: one that connects from a loopback address or from the very
address it connected to; any other gets 403. So does ``/probes``.

Nothing a client does takes it down. A TCP connection reaches flanneld only once its client
sends something: the kernel holds the others (``TCP_DEFER_ACCEPT``) for ``HEAD_TIMEOUT``, and
one handed over still silent then is closed at once, unseen (a client that opens connections
and sends nothing costs nothing). At most ``max_connections`` are open at once (a quarter
of the process's file limit, at most 128), and a connection over that closes the oldest one
still waiting for its request (a flood of idle connections never locks out a probe, which
sends its request at once), or the new one if none waits; at most ``EVICTIONS_PER_SECOND``
are closed so (a client reopening each one at once would otherwise keep flanneld setting
connections up and closing them at whatever rate it likes: most of a core), the next
connections waiting in the kernel's queue meanwhile. A connection is a protocol object
driven by callbacks (no task, no stream objects), cheap to set up and to close. The request
head must arrive within ``HEAD_TIMEOUT`` and the reply be taken within ``WRITE_TIMEOUT``;
every reply closes its connection (no keep-alive). The head is bounded (``HEAD_LIMIT``
bytes, h11's ``max_incomplete_event_size``, and ``HEADER_FIELDS`` fields): a larger one
gets 431, one h11 cannot parse 400, a method but GET and HEAD 405; a request body is never
read, and HEAD gets the head alone.
An accept that fails for want of files is logged, at most once a minute, never with a
traceback. ``HealthStats`` counts all of it for /metrics. The same server also answers on
flanneld's local socket (a client there is on this host), within the same bounds.
Must not touch: anything but its listening sockets (the local one is made and removed by
``flannel.monitor.localsock``) and the connections it accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import ipaddress
import itertools
import json
import logging
import re
import resource
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import h11

from flannel.monitor.nodestate import probes_document, status_document

if TYPE_CHECKING:
    from flannel.monitor.metrics import Exposition
    from flannel.monitor.nodestate import NodeState

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]

# An absolute, ~/ or ./ path: a "/" not right after a word character, dot, colon or dash
# (so 10.0.0.0/16, fd00::/56, and/or stay), up to whitespace, a quote or punctuation.
_PATH = re.compile(r"(?<![\w.:/~-])(?:~|\.{1,2})?/[^\s'\",:;()\[\]]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
REASON_LIMIT = 600

#: Open connections at most (a quarter of the file limit if that is less): health probes,
#: scrapes and flannelctl need a handful.
MAX_CONNECTIONS = 128
#: Seconds for the request line and headers to arrive (probes send them at once).
HEAD_TIMEOUT = 5.0
#: Seconds for the client to take the whole reply.
WRITE_TIMEOUT = 10.0
#: Bytes of the request head (request line and header fields); what h11 buffers of a
#: connection is bounded by it. Probes and scrapes send well under 1 KiB.
HEAD_LIMIT = 16 * 1024
#: Header fields of a request at most.
HEADER_FIELDS = 100
#: Connections the kernel may hold for us, whether accepted or waiting for their first
#: bytes (the kernel caps it at net.core.somaxconn).
BACKLOG = 4096
#: Seconds between two log lines about refused connections or failed accepts.
LOG_EVERY = 60.0
#: Seconds to wait after an accept failed and no connection could be closed to make room.
ACCEPT_PAUSE = 0.1
#: Connections closed to make room, at most this many a second on average (bursts of up to
#: EVICTION_BURST): a client that reopens every connection closed at once would otherwise
#: keep flanneld accepting, setting up and closing connections as fast as it can, most of a
#: core, for nothing. Beyond it, new connections wait in the kernel's queue until a slot
#: frees or the next one may be closed.
EVICTIONS_PER_SECOND = 200.0
EVICTION_BURST = 50.0
_OUT_OF_FILES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
#: Failures of one incoming connection, not of the server: accept the next.
_ABORTED = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ETIMEDOUT, errno.ECONNRESET}


def _last_part(path: re.Match[str]) -> str:
    """The file or key name without where it lives: subnet.env, 10.5.0.0-24, nft."""
    return path.group().rstrip("/").rsplit("/", 1)[-1] or "<path>"


def public_reason(reason: str) -> str:
    """``reason`` fit for anyone who can reach the port: one line, bounded, no paths."""
    text = _PATH.sub(_last_part, _CONTROL.sub(" ", reason)).strip()
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


@dataclass(frozen=True)
class Reply:
    """One answer: its status, reason phrase, body and the body's type (the connection it
    goes to frames it)."""

    status: int
    reason: str
    body: bytes
    content_type: str = "text/plain; charset=utf-8"


def _response(code: int, reason: str, body: str | bytes,
              content_type: str = "text/plain; charset=utf-8") -> Reply:
    return Reply(code, reason, body.encode() if isinstance(body, str) else body, content_type)


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


def _has_bytes(conn: socket.socket) -> bool:
    """Whether the client sent anything yet (its end of the connection counts)."""
    try:
        return bool(conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False
    except OSError:  # reset already: nothing to answer
        return False


def connection_limit() -> int:
    """MAX_CONNECTIONS, or a quarter of the process's soft file limit when that is less."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(4, min(MAX_CONNECTIONS, soft // 4))


@dataclass
class HealthStats:
    """What the health server did with its connections since start (for /metrics)."""

    accepted: int = 0
    #: Closed at once because ``max_connections`` were open (the oldest idle one, or the new).
    dropped: int = 0
    #: Closed because the request head or the reply's taking overran its deadline.
    timed_out: int = 0
    #: accept() failures (out of files, and the like).
    accept_errors: int = 0
    open: int = 0


class _RateLimitedLog:
    """One warning now, then at most one every ``LOG_EVERY`` seconds with the count since."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._next = 0.0
        self._unlogged = 0

    def __call__(self, message: str, *args: object) -> None:
        now = self._clock()
        self._unlogged += 1
        if now < self._next:
            return
        if self._unlogged > 1:
            log.warning(message + " (%d times since the last such line)", *args,
                        self._unlogged)
        else:
            log.warning(message, *args)
        self._unlogged = 0
        self._next = now + LOG_EVERY


class _Connection(asyncio.Protocol):
    """One client, handled by callbacks (no task, no stream objects: a connection costs
    little to set up and to close): the request head fed to h11 (at most ``HEAD_LIMIT``
    bytes), the reply framed by h11 and written, the connection closed; a timer for the
    head, then one for the reply."""

    def __init__(self, server: HealthServer, unix: bool) -> None:
        self.server = server
        self.unix = unix
        self.transport: asyncio.Transport | None = None
        self._http: h11.Connection | None = None  # made at the first bytes
        self._fed = 0  # bytes handed to h11
        self._head_only = False  # a HEAD request: the reply has no body
        self._key: int | None = None  # while waiting for the request head
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._key = next(self.server._ids)
        self.server._waiting[self._key] = self
        self._timer = asyncio.get_running_loop().call_later(HEAD_TIMEOUT, self._expired)

    def data_received(self, data: bytes) -> None:
        if self._key is None:  # answered, or answering: the rest (a body...) is never read
            return
        if self._http is None:
            # h11 raises (431) once it holds more than this without a whole head, and it
            # is never given more than HEAD_LIMIT bytes: a head HEAD_LIMIT long at most
            # is read, a longer one refused.
            self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT - 1)
        room = HEAD_LIMIT - self._fed
        self._fed += min(room, len(data))
        self._http.receive_data(data[:room])
        self._read_head()

    def eof_received(self) -> bool:
        if self._key is not None:
            if self._http is None:
                return False  # nothing was sent: nothing to answer
            self._http.receive_data(b"")  # a head cut short is a bad request
            self._read_head()
        return True  # the reply, sent or on its way, closes the connection

    def _read_head(self) -> None:
        assert self._http is not None
        try:
            event = self._http.next_event()
        except h11.RemoteProtocolError as err:
            self._head_read()
            if err.error_status_hint == 431:
                return self.send(_response(431, "Request Header Fields Too Large",
                                           "request line or header too long\n"))
            return self.send(_response(400, "Bad Request",
                                       f"bad request: {public_reason(str(err))}\n"))
        if event is h11.NEED_DATA:
            return
        self._head_read()
        if not isinstance(event, h11.Request):  # the client closed without a request
            assert self.transport is not None
            return self.transport.close()
        self._answer(event)

    def _head_read(self) -> None:
        if self._key is not None:
            self.server._waiting.pop(self._key, None)
            self._key = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _answer(self, request: h11.Request) -> None:
        self._head_only = request.method == b"HEAD"
        if len(request.headers) > HEADER_FIELDS:
            return self.send(_response(431, "Request Header Fields Too Large",
                                       f"more than {HEADER_FIELDS} header fields\n"))
        # h11 checked both: a token and visible ASCII.
        method, target = request.method.decode("ascii"), request.target.decode("ascii")
        if self.server.needs_import(target):
            return self.server._reply_later(self, method, target)
        self.send(self.server.answer(method, target, self.local()))

    def local(self) -> bool:
        assert self.transport is not None
        return self.unix or same_host(self.transport.get_extra_info("peername"),
                                      self.transport.get_extra_info("sockname"))

    def send(self, reply: Reply) -> None:
        """The reply, framed by h11, then the connection's end once the client took it
        (within WRITE_TIMEOUT)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        assert self._http is not None  # a reply answers bytes the client sent
        head = self._http.send(h11.Response(
            status_code=reply.status, reason=reply.reason,
            headers=[("Content-Type", reply.content_type),
                     ("Content-Length", str(len(reply.body))), ("Connection", "close")]))
        body = b"" if self._head_only else self._http.send(h11.Data(data=reply.body))
        end = self._http.send(h11.EndOfMessage())
        transport.write(b"".join((head or b"", body or b"", end or b"")))
        transport.close()
        self._timer = asyncio.get_running_loop().call_later(WRITE_TIMEOUT, self._expired)

    def _expired(self) -> None:
        self.server.stats.timed_out += 1
        self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_read()
        self.server._ended(self)


class _Evictions:
    """A token bucket: whether a connection may be closed to make room now, else how long
    until one may."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._tokens = EVICTION_BURST
        self._at = clock()

    def wait(self) -> float:
        """0 when one may go now (and counts it), else the seconds to wait."""
        now = self._clock()
        self._tokens = min(EVICTION_BURST,
                           self._tokens + (now - self._at) * EVICTIONS_PER_SECOND)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / EVICTIONS_PER_SECOND


class HealthServer:
    def __init__(self, readiness: Readiness, state: NodeState | None = None,
                 max_connections: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.readiness = readiness
        self.state = state
        self.max_connections = max_connections or connection_limit()
        self.stats = HealthStats()
        self._exposition: Exposition | None = None
        self._listener: socket.socket | None = None  # the TCP one
        self._unix_listeners: list[socket.socket] = []
        self._acceptors: list[asyncio.Task[None]] = []
        self._handlers: set[asyncio.Task[None]] = set()  # replies waiting for an import
        self._connections: set[_Connection] = set()
        # Connections still waiting for their request head, oldest first.
        self._waiting: dict[int, _Connection] = {}
        self._ids = itertools.count()
        self._log_dropped = _RateLimitedLog(clock)
        self._log_accept = _RateLimitedLog(clock)
        self._evictions = _Evictions(clock)

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        assert self._listener is not None, "not started"
        host, port = self._listener.getsockname()[:2]
        return host, port

    def answer(self, method: str, path: str, local: bool = False) -> Reply:
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
        if path in ("/status", "/probes") and self.state is not None:
            if not local:
                tool = "status" if path == "/status" else "doctor or check"
                return _response(403, "Forbidden", f"{path} answers clients on this host "
                                 f"only: run flannelctl {tool} on the node\n")
            document = status_document if path == "/status" else probes_document
            body = json.dumps(document(self.state), indent=1) + "\n"
            return _response(200, "OK", body, "application/json")
        return _response(404, "Not Found", "try /healthz, /readyz, /metrics or /status\n"
                         if self.state is not None else "try /healthz or /readyz\n")

    def needs_import(self, path: str) -> bool:
        """Whether the reply to ``path`` must wait for the metrics library's import."""
        return (path.split("?", 1)[0] == "/metrics" and self.state is not None
                and self._exposition is None
                and "flannel.monitor.metrics" not in sys.modules)

    async def _prepare(self, path: str) -> None:
        """Before the first /metrics: import the library in a thread (~0.1 s of CPU that
        would otherwise stall the event loop); ``_metrics`` reports a failure."""
        if (path.split("?", 1)[0] == "/metrics" and self.state is not None
                and self._exposition is None):
            with contextlib.suppress(ImportError):
                await asyncio.to_thread(importlib.import_module, "flannel.monitor.metrics")

    def _metrics(self, state: NodeState) -> Reply:
        from flannel.monitor.metrics import CONTENT_TYPE, Exposition

        try:
            if self._exposition is None:
                self._exposition = Exposition(state)
            return _response(200, "OK", self._exposition.render(), CONTENT_TYPE)
        except Exception:  # a boundary: a bug in a scrape must not take networking down
            # (a 500 for the scraper; the log has the traceback)
            log.exception("rendering /metrics failed")
            return _response(500, "Internal Server Error", "rendering the metrics failed; "
                             "see flanneld's log\n")

    def _evict_oldest(self) -> bool:
        """Close the oldest connection still waiting for its request; False if none."""
        if not self._waiting:
            return False
        key = next(iter(self._waiting))
        self._waiting.pop(key).abort()
        self._dropped()
        return True

    def _reply_later(self, connection: _Connection, method: str, path: str) -> None:
        """A reply that needs the metrics library imported first (in a thread)."""
        async def reply() -> None:
            await self._prepare(path)
            connection.send(self.answer(method, path, connection.local()))

        task = asyncio.create_task(reply())
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    def _ended(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        self.stats.open -= 1

    def _dropped(self) -> None:
        self.stats.dropped += 1
        self._log_dropped("health server: closed a connection: %d were open, the most it "
                          "keeps (the oldest one still waiting for its request goes first); "
                          "%d closed so since start: a client opens connections and sends "
                          "no request", self.max_connections, self.stats.dropped)

    async def _admit(self, conn: socket.socket, unix: bool) -> None:
        self.stats.accepted += 1
        if not unix and not _has_bytes(conn):
            # The kernel hands over a TCP connection that sent nothing only once
            # TCP_DEFER_ACCEPT (HEAD_TIMEOUT) has passed: its time is up already.
            conn.close()
            self.stats.timed_out += 1
            return
        if self.stats.open >= self.max_connections and not self._evict_oldest():
            conn.close()
            self._dropped()
            return
        self.stats.open += 1
        connection = _Connection(self, unix)
        self._connections.add(connection)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: connection, conn)
        except OSError:
            conn.close()
            if connection.transport is None:
                self._ended(connection)

    async def _room(self) -> None:
        """Until a connection may be accepted: a slot is free, or one may be closed (a
        slot freed meanwhile is seen within a token's time, 1/EVICTIONS_PER_SECOND)."""
        while self.stats.open >= self.max_connections and self._waiting:
            wait = self._evictions.wait()
            if not wait:
                return
            await asyncio.sleep(wait)

    async def _accept(self, listener: socket.socket, unix: bool = False) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._room()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as err:
                if err.errno in _ABORTED:
                    continue
                self.stats.accept_errors += 1
                out_of_files = err.errno in _OUT_OF_FILES
                self._log_accept("health server: cannot accept a connection: %s%s",
                                 err.strerror or err,
                                 "; closing the oldest idle health connection to make room "
                                 "(raise LimitNOFILE if flanneld itself needs more files)"
                                 if out_of_files else "")
                if out_of_files and self._evict_oldest():
                    await asyncio.sleep(0)  # the aborted socket is closed on this loop turn
                else:
                    await asyncio.sleep(ACCEPT_PAUSE)
                continue
            # Awaited, not a task: the connections accepted so far read their requests
            # before more arrive (and may push them out).
            await self._admit(conn, unix)

    def _accept_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("health server stopped accepting connections",
                      exc_info=task.exception())

    async def start(self, host: str, port: int) -> None:
        # A numeric host only: the flag is checked to be an IP, and no name lookup happens.
        family, kind, proto, _, where = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE | socket.AI_NUMERICHOST)[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            listener.bind(where)
            # A connection reaches accept() once its first bytes do, or HEAD_TIMEOUT later:
            # one that sends nothing costs the kernel a request sock, and flanneld nothing.
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT,
                                max(1, int(HEAD_TIMEOUT)))
            listener.listen(BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._start_accepting(listener, unix=False)
        log.info("health server listening on %s port %d (/healthz, /readyz%s)%s", host, port,
                 ", /metrics, /status" if self.state is not None else "",
                 "; every address of this host answers, --healthz-ip limits that"
                 if host in ("0.0.0.0", "::") else "")

    def _start_accepting(self, listener: socket.socket, unix: bool) -> None:
        acceptor = asyncio.create_task(self._accept(listener, unix))
        acceptor.add_done_callback(self._accept_ended)
        self._acceptors.append(acceptor)

    async def start_unix(self, sock: socket.socket) -> None:
        """Serve on a listening unix socket made by ``flannel.monitor.localsock`` (which removes its
        file); ``stop`` closes it."""
        sock.setblocking(False)
        self._unix_listeners.append(sock)
        self._start_accepting(sock, unix=True)

    async def stop(self) -> None:
        tasks = [t for t in (*self._acceptors, *self._handlers) if t is not None]
        for task in tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 3)
        for connection in list(self._connections):
            connection.abort()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for sock in self._unix_listeners:
            sock.close()
        self._unix_listeners.clear()
