"""Bounded HTTP exchanges for the cloud clients that speak through the standard library
(the Compute Engine API and its token endpoint, the instance metadata services), cut by the
caller's ``Cutter`` (``flannel.clients.cut``; the engines' ``Stopper``) when flanneld stops.

``fetch`` sends one request and returns its whole answer, whatever its status, within a
budget: the body at most ``max_bytes`` (a Content-Length over it is refused before a byte
of the body is read), and the whole exchange (connecting, the head, every byte of the body)
within ``timeout`` seconds: a server that drips its answer a byte at a time is cut at that
deadline, not waited for read after read. Redirects are never followed: a 3xx is an answer
like any other, so no credential a request carries ever reaches another host. Proxies from
the environment (``HTTPS_PROXY``, ``NO_PROXY``) are used only when asked (the Compute API,
as Google's libraries do); link-local metadata services are always reached directly.
urllib is kept (not ``flannel.clients.http``) for that proxy support: CONNECT tunnels are
urllib's. A deadline or a stop shuts the exchange's socket down from a timer thread (or
the stopping thread), which ends the read blocked on it at once.

Its errors are its own (``FetchFailed``, ``TooLarge``); the engines translate them.
Must not touch: what is asked or what the answers mean (the callers decode them), the
stores, the engines, the kernel.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from flannel.clients.cut import Cutter

_CHUNK = 64 * 1024


class FetchFailed(Exception):
    """No usable answer: the cause in words (the caller says what was asked of whom)."""


class TooLarge(FetchFailed):
    """The answer is larger than the bound."""


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class _Watch:
    """One exchange's socket (a duplicate of its descriptor, taken before TLS wraps it),
    shut down when the deadline passes or flanneld stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.cut_why = ""

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            copy = sock.dup()
            self._socks.append(copy)
            if self.cut_why:
                _shut(copy)

    def cut(self, why: str) -> None:
        with self._lock:
            if not self.cut_why:
                self.cut_why = why
            for sock in self._socks:
                _shut(sock)

    def close(self) -> None:
        with self._lock:
            for sock in self._socks:
                sock.close()
            self._socks.clear()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedMixin:
    """An ``http.client`` connection whose socket, once made, is handed to its watch."""

    _watch: _Watch | None = None

    def _connected(self, address: tuple[str, int], timeout: Any,
                   source: tuple[str, int] | None = None) -> socket.socket:
        sock = socket.create_connection(address, timeout, source)
        if self._watch is not None:
            self._watch.attach(sock)
        return sock


class _HTTPConnection(_WatchedMixin, http.client.HTTPConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch
        self._create_connection = self._connected


class _HTTPSConnection(_WatchedMixin, http.client.HTTPSConnection):
    def __init__(self, *args: Any, watch: _Watch, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._watch = watch
        self._create_connection = self._connected


def _watch_of(request: urllib.request.Request) -> _Watch:
    watch = getattr(request, "flannel_watch", None)
    assert isinstance(watch, _Watch), "a request not sent by fetch()"
    return watch


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        watch = _watch_of(req)
        return self.do_open(lambda host, **kw: _HTTPConnection(host, watch=watch, **kw), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        watch = _watch_of(req)
        return self.do_open(lambda host, **kw: _HTTPSConnection(host, watch=watch, **kw), req,
                            context=self.tls)


def opener(*, proxies: bool) -> urllib.request.OpenerDirector:
    """What ``fetch`` sends through: plain and TLS connections it can cut (TLS verified
    as the default context does), proxies from the environment only when ``proxies``, no
    redirect handler and no error processor (every status is an answer)."""
    director = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(None if proxies else {}), _HTTPHandler(),
                    _HTTPSHandler(ssl.create_default_context()),
                    urllib.request.UnknownHandler()):
        director.add_handler(handler)
    return director


def fetch(director: urllib.request.OpenerDirector, request: urllib.request.Request, *,
          timeout: float, max_bytes: int, stopper: Cutter, what: str) -> Reply:
    """Send ``request``; its answer read whole within ``timeout`` seconds and ``max_bytes``.
    Raises FetchFailed (TooLarge) with the cause, or what ``stopper`` raises when it cut
    the exchange."""
    watch = _Watch()
    request.flannel_watch = watch  # type: ignore[attr-defined]
    timer = threading.Timer(timeout, watch.cut, (f"no whole answer within {timeout:g}s",))
    timer.daemon = True
    try:
        with stopper.cutting(lambda: watch.cut("flanneld is stopping"), what):
            timer.start()
            try:
                reply = _exchange(director, request, timeout, max_bytes)
            except TooLarge:
                stopper.check(what)
                raise
            except (OSError, http.client.HTTPException, ValueError) as error:
                cause = watch.cut_why or _cause(error)
            else:
                # An answer the cut ended is not whole, however it looks (close-delimited).
                if not watch.cut_why:
                    return reply
                cause = watch.cut_why
    finally:
        timer.cancel()
        watch.close()
    stopper.check(what)
    raise FetchFailed(cause)


def _exchange(director: urllib.request.OpenerDirector, request: urllib.request.Request,
              timeout: float, max_bytes: int) -> Reply:
    with director.open(request, timeout=timeout) as response:
        headers = {name.lower(): value for name, value in response.headers.items()}
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > max_bytes:
            raise TooLarge(f"an answer of {int(length)} bytes, over the limit of {max_bytes}")
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read1(_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"an answer over the limit of {max_bytes} bytes")
            chunks.append(chunk)
        return Reply(response.status, headers, b"".join(chunks))


def _cause(error: BaseException) -> str:
    if isinstance(error, urllib.error.URLError) and isinstance(error.reason, BaseException):
        error = error.reason
    text = str(error) or type(error).__name__
    return text[:200]
