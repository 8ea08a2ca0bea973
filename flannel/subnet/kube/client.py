"""The few Kubernetes API calls flanneld makes, over flannel.httpclient, as plain JSON
documents.

Owns: GET of a node and of a pod, the paginated LIST of nodes (``limit``/``continue``,
relisted from the start when a continue token expires, pages halved a few times when one is
larger than its bound, a listing that failed part-way resumed from its last continue token,
the whole listing bounded in time), the node WATCH (its own connection, ``timeoutSeconds``
plus a read deadline, given up after ``watch_idle`` seconds without data, one event line at
most ``max_event_bytes``), the strategic-merge PATCH of ``nodes/<n>/status``, keep-alive
reuse of idle connections, and every request bounded in time and size. Answers
are decoded with ``boundedjson``. Failures are two exceptions: ``ApiStatusError`` (the
server answered with an error ``Status``: its code and message, and the permission the
request needed) and ``ApiUnreachable`` (no usable answer: connection, TLS, timeout,
protocol, credentials); the store maps them to its contract.
Must not touch: node semantics (kube.py), the kernel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from flannel import boundedjson
from flannel.httpclient import BodyTooLarge, Connection, ProtocolError
from flannel.subnet.kube.auth import CredentialError
from flannel.subnet.kube.config import ClusterConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

#: One GET or PATCH: a call stuck on a silent server gives way to a retry.
REQUEST_TIMEOUT = 10.0
#: One page of the node list: up to LIST_PAGE_SIZE nodes of typically 5-30 KiB each.
LIST_TIMEOUT = 60.0
LIST_PAGE_SIZE = 500
#: 500 nodes at the 128 KiB average this allows is far above real nodes (status.images and
#: managedFields included); a page over it is asked again at half the size.
MAX_PAGE_BYTES = 64 * 1024 * 1024
#: One object: etcd refuses requests over 1.5 MiB, so no stored Node is larger; the watch
#: envelope and JSON escaping stay within twice that.
MAX_OBJECT_BYTES = 3 * 1024 * 1024
#: API documents are decoded without boundedjson's depth pre-scan (at 5000 nodes it cost
#: more than the decoding): the decoder's recursion guard bounds them, and the store keeps
#: only flat views of nodes (kube.node_view), never their nested parts.
MAX_API_DEPTH = None
#: The server ends a watch after timeoutSeconds, picked at random in this range (as
#: client-go does, so a fleet does not reconnect at once); a stream silent for longer than
#: that plus WATCH_GRACE is dead.
WATCH_TIMEOUT_RANGE = (300, 600)
WATCH_GRACE = 30.0
#: A watch stream silent for this long is given up and resumed from its resourceVersion.
#: It asks for bookmarks, which the API server's watch cache sends about every minute
#: (defaultBookmarkFrequency), so a healthy stream is not this quiet; a server that sends
#: one only before timeoutSeconds costs one resumed watch per period on a quiet cluster.
#: TCP keepalive finds a dead peer sooner; this finds a proxy alive without its upstream.
WATCH_IDLE = 150.0
#: A whole listing, every page and retry of one call: a server whose pages never end
#: (each page is bounded by LIST_TIMEOUT and MAX_PAGE_BYTES) is given up then.
LIST_DEADLINE = 600.0
#: A page over MAX_PAGE_BYTES is asked again at half the size at most this many times
#: (500 -> 62 nodes per page), and the smaller size kept: a body that never ends costs
#: this many downloads of the bound plus one, not nine.
MAX_PAGE_HALVINGS = 3
MAX_IDLE_CONNECTIONS = 2
MAX_LIST_RESTARTS = 5
_MAX_ERROR_BYTES = 1024 * 1024


class ApiStatusError(Exception):
    """The API server answered a request with an error status."""

    def __init__(self, code: int, reason: str, message: str, permission: str,
                 credentials: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.permission = permission  # e.g. "list nodes": what RBAC must allow
        self.credentials = credentials  # where the credentials we sent came from


class ApiUnreachable(Exception):
    """No usable answer. ``permanent``: retrying cannot help (the server's certificate is
    not trusted). ``relist``: a watch stream delivered an event we cannot read."""

    def __init__(self, message: str, *, permanent: bool = False, relist: bool = False,
                 too_large: bool = False) -> None:
        super().__init__(message)
        self.message, self.permanent, self.relist = message, permanent, relist
        self.too_large = too_large


@dataclass
class _Listing:
    """A node listing under way: what its pages kept so far, its resourceVersion, and the
    continue token of the next page ("" before the first)."""

    kept: list[Any]
    version: str = ""
    token: str = ""


def _printable(text: str, limit: int = 300) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


class KubeClient:
    def __init__(self, config: ClusterConfig, *, request_timeout: float = REQUEST_TIMEOUT,
                 list_timeout: float = LIST_TIMEOUT, list_deadline: float = LIST_DEADLINE,
                 page_size: int = LIST_PAGE_SIZE,
                 max_page_bytes: int = MAX_PAGE_BYTES,
                 max_event_bytes: int = MAX_OBJECT_BYTES,
                 watch_timeout: tuple[int, int] = WATCH_TIMEOUT_RANGE,
                 watch_grace: float = WATCH_GRACE, watch_idle: float = WATCH_IDLE) -> None:
        self.config = config
        self.request_timeout = request_timeout
        self.list_timeout = list_timeout
        self.list_deadline = list_deadline
        self.page_size = page_size
        self._page_size = page_size  # halved for good after a page over its bound
        self._smallest_page = max(1, page_size >> MAX_PAGE_HALVINGS)
        self._listing: _Listing | None = None
        self.max_page_bytes = max_page_bytes
        self.max_event_bytes = max_event_bytes
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        self.watch_idle = watch_idle
        self._idle: list[Connection] = []

    # -- transport ----------------------------------------------------------------------

    async def _connect(self, deadline: float) -> Connection:
        cfg = self.config
        return await Connection.open(cfg.host, cfg.port, cfg.context, cfg.server_hostname,
                                     deadline)

    def _unreachable(self, err: BaseException, timeout: float) -> ApiUnreachable:
        server = self.config.server
        if isinstance(err, ssl.SSLCertVerificationError):
            return ApiUnreachable(
                f"the certificate of {server} is not trusted ({err.verify_message}); check "
                f"the certificate authority given by {self.config.where}", permanent=True)
        if isinstance(err, TimeoutError):
            return ApiUnreachable(f"{server} did not answer within {timeout:g}s")
        if isinstance(err, CredentialError):
            return ApiUnreachable(str(err))
        if isinstance(err, ProtocolError):
            return ApiUnreachable(f"{server}: {err}", too_large=isinstance(err, BodyTooLarge))
        if isinstance(err, OSError):
            return ApiUnreachable(f"cannot reach {server}: {err.strerror or err}")
        return ApiUnreachable(f"{server}: {err}")

    def _status_error(self, code: int, body: bytes, permission: str) -> ApiStatusError:
        reason, message = "", ""
        try:
            doc = boundedjson.loads(body, what="an error status", max_bytes=_MAX_ERROR_BYTES)
        except boundedjson.JSONLimitError:
            doc = None
        if isinstance(doc, dict):
            reason, message = (text if isinstance(text := doc.get(key), str) else ""
                               for key in ("reason", "message"))
        if not message:
            message = body.decode("utf-8", "replace").strip() or f"HTTP {code}"
        return ApiStatusError(code, _printable(reason), _printable(message), permission,
                              self.config.credentials.source)

    async def _exchange(self, method: str, target: str, *, body: bytes, content_type: str,
                        max_bytes: int, deadline: float) -> tuple[int, bytes]:
        credentials = self.config.credentials
        refused_once = False
        stale_retries = 1
        while True:
            headers = {"Accept": "application/json", "User-Agent": "flanneld",
                       **await credentials.headers()}
            if content_type:
                headers["Content-Type"] = content_type
            conn = self._take_idle()
            reused = conn is not None
            # The caller's timeout bounds this exchange: no watchdog timer of its own.
            if conn is None:
                conn = await self._connect(deadline)
            answered = False
            try:
                await conn.send(method, self.config.path_prefix + target,
                                self.config.host_header, headers, body)
                head = await conn.read_head()
                answered = True
                data = await conn.read_body(head, max_bytes if head.status < 400
                                            else _MAX_ERROR_BYTES)
            except ConnectionError:
                conn.close()
                if reused and not answered and stale_retries:
                    stale_retries -= 1  # the server closed an idle keep-alive connection
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if conn.reusable and len(self._idle) < MAX_IDLE_CONNECTIONS and head.status != 401:
                self._idle.append(conn)
            else:
                conn.close()
            if head.status == 401:
                self._refused()
                if credentials.renewable and not refused_once:
                    refused_once = True  # a rotated token or an expired plugin answer
                    continue
            return head.status, data

    async def _json(self, method: str, target: str, permission: str, *,
                    body: bytes = b"", content_type: str = "", timeout: float | None = None,
                    max_bytes: int = MAX_OBJECT_BYTES) -> Any:
        timeout = timeout or self.request_timeout
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                code, data = await self._exchange(method, target, body=body,
                                                  content_type=content_type,
                                                  max_bytes=max_bytes, deadline=deadline)
        except (OSError, TimeoutError, ProtocolError, CredentialError) as err:
            raise self._unreachable(err, timeout) from None
        if code >= 300:
            raise self._status_error(code, data, permission)
        try:
            return boundedjson.loads(data, what=f"the answer to {method} {target.split('?')[0]}",
                                     max_bytes=max_bytes, max_depth=MAX_API_DEPTH)
        except boundedjson.JSONLimitError as err:
            raise ApiUnreachable(f"{self.config.server}: {err}") from None

    def _take_idle(self) -> Connection | None:
        """An idle connection fit to carry a request; the unfit ones are closed."""
        while self._idle:
            conn = self._idle.pop()
            if conn.fit_for_reuse():
                return conn
            conn.close()
        return None

    def _refused(self) -> None:
        """The server refused our credentials: fetch them afresh, and drop idle connections,
        whose TLS handshake carried the client certificate they had then (an exec plugin's
        renewed certificate only reaches new connections)."""
        self.config.credentials.invalidate()
        self._close_idle()

    def _close_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def close(self) -> None:
        self._close_idle()

    # -- the calls flanneld makes ---------------------------------------------------------

    async def get_node(self, name: str) -> Any:
        return await self._json("GET", f"/api/v1/nodes/{quote(name, safe='')}", "get nodes")

    async def get_pod(self, namespace: str, name: str) -> Any:
        return await self._json(
            "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}",
            "get pods")

    async def patch_node_status(self, name: str, patch: dict[str, Any]) -> Any:
        return await self._json(
            "PATCH", f"/api/v1/nodes/{quote(name, safe='')}/status", "patch nodes/status",
            body=json.dumps(patch).encode(),
            content_type="application/strategic-merge-patch+json")

    async def list_nodes(self, keep: Callable[[Any], T | None]) -> tuple[list[T], str]:
        """Every node, page by page, each passed through ``keep`` (None drops it) so no raw
        page outlives its decoding; and the list's resourceVersion.

        A call that fails part-way keeps what its pages gave: the next call goes on from
        the last page's continue token (from the start once that token expired), so a flaky
        server does not cost the whole list at every retry. A call that outlives
        ``list_deadline`` fails and the next one starts afresh. One listing at a time per
        client (the node store's)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.list_deadline
        listing = self._listing or _Listing([])
        self._listing = listing
        restarts = 0
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise self._list_overdue()
            target = f"/api/v1/nodes?limit={self._page_size}"
            if listing.token:
                target += f"&continue={quote(listing.token, safe='')}"
            try:
                page = await self._json("GET", target, "list nodes",
                                        timeout=min(self.list_timeout, left),
                                        max_bytes=self.max_page_bytes)
            except ApiUnreachable as err:
                if loop.time() >= deadline:
                    raise self._list_overdue() from None
                if not err.too_large or self._page_size <= self._smallest_page:
                    raise
                self._page_size //= 2
                log.warning("a page of the node list is larger than %d bytes; asking for %d "
                            "nodes per page", self.max_page_bytes, self._page_size)
                continue
            except ApiStatusError as err:
                if err.code != 410 or not listing.token or restarts >= MAX_LIST_RESTARTS:
                    raise
                restarts += 1
                log.info("node list: the continue token expired (%s); listing again",
                         err.message)
                listing = self._listing = _Listing([])
                continue
            items, listing.version, listing.token = self._page(page)
            listing.kept += [k for item in items if (k := keep(item)) is not None]
            del page, items
            if not listing.token:
                self._listing = None
                return listing.kept, listing.version

    def _list_overdue(self) -> ApiUnreachable:
        self._listing = None  # a list that never ends must not grow across calls
        return ApiUnreachable(f"{self.config.server}: the node list did not end within "
                              f"{self.list_deadline:g}s")

    def _page(self, page: Any) -> tuple[list[Any], str, str]:
        meta = page.get("metadata") if isinstance(page, dict) else None
        items = page.get("items") if isinstance(page, dict) else None
        if not isinstance(meta, dict) or not isinstance(items, list):
            raise ApiUnreachable(f"{self.config.server}: the node list is not a NodeList")
        version, token = meta.get("resourceVersion"), meta.get("continue") or ""
        if not isinstance(version, str) or not isinstance(token, str):
            raise ApiUnreachable(f"{self.config.server}: the node list's metadata is not "
                                 "strings")
        return items, version, token

    async def watch_nodes(self, resource_version: str) -> AsyncIterator[tuple[str, Any]]:
        """(event type, object) from ``resource_version`` on, until the server ends the
        stream; ``ApiStatusError`` 410 when that version is gone."""
        seconds = random.randrange(*self.watch_timeout)
        target = (f"/api/v1/nodes?watch=true&allowWatchBookmarks=true&timeoutSeconds={seconds}"
                  f"&resourceVersion={quote(resource_version, safe='')}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout
        conn = None
        limit = self.request_timeout
        try:
            try:
                async with asyncio.timeout_at(deadline):
                    headers = {"Accept": "application/json", "User-Agent": "flanneld",
                               **await self.config.credentials.headers()}
                    conn = await self._connect(deadline)
                    await conn.send("GET", self.config.path_prefix + target,
                                    self.config.host_header, headers)
                    head = await conn.read_head()
                    if head.status != 200:
                        body = await conn.read_body(head, _MAX_ERROR_BYTES)
                        if head.status == 401:
                            self._refused()
                        raise self._status_error(head.status, body, "watch nodes")
                limit = seconds + self.watch_grace
                conn.deadline = loop.time() + limit
                conn.abort_when_idle(self.watch_idle)
                async for line in conn.lines(head, self.max_event_bytes):
                    yield self._event(line)
            except BodyTooLarge as err:
                raise ApiUnreachable(f"node watch: {err}", relist=True) from None
            except TimeoutError:
                if conn is None or not conn.idle_expired:
                    raise self._unreachable(TimeoutError(), limit) from None
                raise ApiUnreachable(f"{self.config.server} sent nothing on the node watch "
                                     f"for {self.watch_idle:g}s") from None
            except (OSError, ProtocolError, CredentialError) as err:
                raise self._unreachable(err, limit) from None
        finally:
            if conn is not None:
                conn.close()

    def _event(self, line: bytes) -> tuple[str, Any]:
        try:
            event = boundedjson.loads(line, what="a node watch event",
                                      max_bytes=self.max_event_bytes, max_depth=MAX_API_DEPTH)
        except boundedjson.JSONLimitError as err:
            raise ApiUnreachable(f"node watch: {err}", relist=True) from None
        kind = event.get("type") if isinstance(event, dict) else None
        obj = event.get("object") if isinstance(event, dict) else None
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise ApiUnreachable("node watch: an event without a type and an object",
                                 relist=True)
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiStatusError(code if isinstance(code, int) else 500,
                                 _printable(str(obj.get("reason") or "")),
                                 _printable(str(obj.get("message") or "watch error")),
                                 "watch nodes", self.config.credentials.source)
        return kind, obj
