"""The few Kubernetes API calls flanneld makes, over flannel.clients.http, as plain JSON
documents.

Owns: GET of a node and of a pod, the paginated LIST of nodes (``limit``/``continue``,
relisted from the start when a continue token expires, pages halved a few times when one is
larger than its budget, a listing that failed part-way resumed from its last continue
token, the whole listing bounded in time and nodes, a continue token that comes back
refused), the node WATCH (its own connection, ``timeoutSeconds`` plus a read deadline, given
up after ``watch_idle`` seconds without data, each event within its budget of bytes,
elements and time), the strategic-merge PATCH of ``nodes/<n>/status``, keep-alive reuse of
idle connections, and the budget of every answer (the ``Budget`` constants below: bytes,
JSON elements, time; an answer over its budget is never decoded). A redirect is never
followed: the credentials stay with the server configured. Failures are two exceptions:
``ApiStatusError`` (the server answered with an error ``Status``: its code and message, and
the permission the request needed) and ``ApiUnreachable`` (no usable answer: connection,
TLS, timeout, protocol, credentials, an answer over its budget or of another shape); the
store maps them to its contract.
Must not touch: node semantics (kube.py), the kernel.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from json.scanner import make_scanner
from typing import Any, TypeVar
from urllib.parse import quote

from flannel.clients.http import BodyTooLarge, Budget, Connection, Head, ProtocolError
from flannel.clients.kube.auth import CredentialError
from flannel.clients.kube.config import ClusterConfig
from flannel.untrusted import boundedjson

log = logging.getLogger(__name__)

T = TypeVar("T")

# -- answer budgets ---------------------------------------------------------------------
# A Node as a kubelet reports it (tests/support/kubeapi.py: kubelet_node; 50 images,
# managedFields of its four writers) is 15 KB and 487 JSON elements; a page of 100 of them
# 1.5 MB and 48,705 elements, whose decoding peaks at 6 MB (500: 7.5 MB, 243,505 elements,
# 31 MB). Pages are of 100 nodes so that their budget, whatever fills it, costs flanneld
# less than it holds for a small cluster (a JSON element costs 35 to 65 bytes decoded):
# docs/architecture.md, "Answer budgets".

#: One GET or PATCH: a call stuck on a silent server gives way to a retry.
REQUEST_TIMEOUT = 10.0
#: One page of the node list, its body included.
LIST_TIMEOUT = 60.0
LIST_PAGE_SIZE = 100
#: A page (a page over it is asked again at half the size).
PAGE = Budget(max_bytes=4 * 1024 * 1024, max_elements=150_000, seconds=LIST_TIMEOUT)
#: One object (a GET, a watch event): etcd refuses requests over 1.5 MiB, so no stored Node
#: is larger; the watch envelope and JSON escaping stay within twice that. An event must
#: arrive within its seconds from its first byte.
OBJECT = Budget(max_bytes=3 * 1024 * 1024, max_elements=100_000, seconds=REQUEST_TIMEOUT)
#: An error answer (a Status).
ERROR = Budget(max_bytes=64 * 1024, max_elements=1000, seconds=REQUEST_TIMEOUT)
#: A whole listing: ten times the 20,000 nodes sized for.
MAX_LIST_NODES = 200_000
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
    """A node listing under way: what its pages kept so far, its resourceVersion, the
    continue token of the next page ("" before the first), the tokens it was given (one
    given twice would list for ever) and the nodes its pages held."""

    kept: list[Any]
    version: str = ""
    token: str = ""
    tokens: set[str] = field(default_factory=set)
    nodes: int = 0


def _printable(text: str, limit: int = 300) -> str:
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


class KubeClient:
    def __init__(self, config: ClusterConfig, *, request_timeout: float = REQUEST_TIMEOUT,
                 list_timeout: float = LIST_TIMEOUT, list_deadline: float = LIST_DEADLINE,
                 page_size: int = LIST_PAGE_SIZE,
                 max_page_bytes: int = PAGE.max_bytes,
                 max_event_bytes: int = OBJECT.max_bytes,
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
        self.page = Budget(max_page_bytes, PAGE.max_elements, list_timeout)
        self.object = Budget(OBJECT.max_bytes, OBJECT.max_elements, request_timeout)
        self.event = Budget(max_event_bytes, OBJECT.max_elements, OBJECT.seconds)
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
        """The error a non-2xx answer carries: its Status's reason and message when it has
        them as text, else the body's text (an error of any other shape is still an
        error, never a crash)."""
        reason, message = "", ""
        try:
            doc = ERROR.decode(body, "an error status")
        except boundedjson.JSONLimitError:
            doc = None
        if isinstance(doc, dict):
            reason, message = (text if isinstance(text := doc.get(key), str) else ""
                               for key in ("reason", "message"))
        if not message:
            message = body.decode("utf-8", "replace").strip() or f"HTTP {code}"
        return ApiStatusError(code, _printable(reason), _printable(message), permission,
                              self.config.credentials.source)

    def _redirect(self, head: Head) -> ApiUnreachable:
        location = head.headers.get("location", "")[:200]
        return ApiUnreachable(
            f"{self.config.server} answered HTTP {head.status}, a redirect"
            f"{f' to {location!r}' if location else ''}; flanneld does not follow redirects "
            f"(its credentials stay with the server given by {self.config.where}): give the "
            "API server's own address")

    def _decode(self, data: bytes, budget: Budget, what: str,
                items: Callable[[Any], Any] | None = None) -> Any:
        """An answer's JSON within ``budget``; ApiUnreachable (``too_large`` when over the
        budget: never decoded) naming the server and the bound. ``items``: a list's items
        are each passed through it as they are decoded (``Budget.decode_each``)."""
        if boundedjson.more_elements_than(data, budget.max_elements):
            raise ApiUnreachable(f"{self.config.server}: {what} has more JSON elements than "
                                 f"its budget of {budget.max_elements}", too_large=True)
        try:
            if items is not None:
                return budget.decode_each(data, what, "items", items)
            return budget.decode(data, what)
        except boundedjson.JSONLimitError as err:
            raise ApiUnreachable(f"{self.config.server}: {err}") from None

    async def _exchange(self, method: str, target: str, *, body: bytes, content_type: str,
                        budget: Budget, deadline: float) -> tuple[Head, bytes]:
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
                data = await conn.read_body(head, budget if head.status < 300 else ERROR)
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
            return head, data

    async def _json(self, method: str, target: str, permission: str, *,
                    body: bytes = b"", content_type: str = "",
                    budget: Budget | None = None,
                    items: Callable[[Any], Any] | None = None) -> Any:
        """One call's answer within ``budget`` (an object's by default): its time (the
        whole exchange), its bytes and its JSON elements; ``items`` as ``_decode``'s."""
        budget = budget or self.object
        deadline = asyncio.get_running_loop().time() + budget.seconds
        try:
            async with asyncio.timeout_at(deadline):
                head, data = await self._exchange(method, target, body=body,
                                                  content_type=content_type,
                                                  budget=budget, deadline=deadline)
        except (OSError, TimeoutError, ProtocolError, CredentialError) as err:
            raise self._unreachable(err, budget.seconds) from None
        if 300 <= head.status < 400:
            raise self._redirect(head)
        if head.status >= 300:
            raise self._status_error(head.status, data, permission)
        return self._decode(data, budget, f"the answer to {method} {target.split('?')[0]}",
                            items)

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
        """Every node, page by page, each passed through ``keep`` (None drops it) as soon as
        it is decoded, so a page's documents are never alive together (only what ``keep``
        returns is); and the list's resourceVersion. ``keep`` may see a node again when its
        page is asked again (a page that failed after it).

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
                # Each node passes through ``keep`` as it is decoded: a page's documents
                # are never alive at once (100 kubelet-shaped Nodes decode to 6 MB).
                page = await self._json("GET", target, "list nodes", budget=Budget(
                    self.page.max_bytes, self.page.max_elements, min(self.page.seconds, left)),
                    items=keep)
            except ApiUnreachable as err:
                if loop.time() >= deadline:
                    raise self._list_overdue() from None
                if not err.too_large or self._page_size <= self._smallest_page:
                    raise
                self._page_size //= 2
                log.warning("a page of the node list is larger than its budget (%d bytes, %d "
                            "JSON elements); asking for %d nodes per page", self.page.max_bytes,
                            self.page.max_elements, self._page_size)
                continue
            except ApiStatusError as err:
                if err.code != 410 or not listing.token or restarts >= MAX_LIST_RESTARTS:
                    raise
                restarts += 1
                log.info("node list: the continue token expired (%s); listing again",
                         err.message)
                listing = self._listing = _Listing([])
                continue
            kept, listing.version, listing.token = self._page(page)
            listing.kept += [k for k in kept if k is not None]
            listing.nodes += len(kept)
            del page, kept
            if not listing.token:
                self._listing = None
                return listing.kept, listing.version
            if listing.token in listing.tokens or listing.nodes > MAX_LIST_NODES:
                self._listing = None  # a list that never ends must not grow across calls
                raise ApiUnreachable(
                    f"{self.config.server}: the node list " + (
                        "gave a continue token it had given before (it would never end)"
                        if listing.token in listing.tokens else
                        f"holds more than {MAX_LIST_NODES} nodes"))
            listing.tokens.add(listing.token)
            await asyncio.sleep(0)  # a page's nodes took the loop a while: let others in

    def _list_overdue(self) -> ApiUnreachable:
        self._listing = None  # a list that never ends must not grow across calls
        return ApiUnreachable(f"{self.config.server}: the node list did not end within "
                              f"{self.list_deadline:g}s")

    def _page(self, page: Any) -> tuple[list[Any], str, str]:
        """A NodeList page's items (as ``keep`` returned them), resourceVersion and continue
        token; ApiUnreachable naming the field that is missing or of another type."""
        if not isinstance(page, dict):
            raise ApiUnreachable(f"{self.config.server}: the node list is not a NodeList "
                                 "(not a JSON object)")
        meta, items = page.get("metadata"), page.get("items")
        if not isinstance(meta, dict):
            raise ApiUnreachable(f"{self.config.server}: the node list's metadata is not a "
                                 "JSON object")
        if not isinstance(items, list):
            raise ApiUnreachable(f"{self.config.server}: the node list's items is not a JSON "
                                 "array")
        version, token = meta.get("resourceVersion"), meta.get("continue") or ""
        if not isinstance(version, str) or len(version) > 1024:
            raise ApiUnreachable(f"{self.config.server}: the node list's "
                                 "metadata.resourceVersion is not a resource version")
        if not isinstance(token, str) or len(token) > 4096:
            raise ApiUnreachable(f"{self.config.server}: the node list's metadata.continue is "
                                 "not a continue token")
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
                    if 300 <= head.status < 400:
                        raise self._redirect(head)
                    if head.status != 200:
                        body = await conn.read_body(head, ERROR)
                        if head.status == 401:
                            self._refused()
                        raise self._status_error(head.status, body, "watch nodes")
                limit = seconds + self.watch_grace
                conn.deadline = loop.time() + limit
                conn.abort_when_idle(self.watch_idle)
                async for line in conn.lines(head, self.event):
                    yield self._event(line)
            except BodyTooLarge as err:
                raise ApiUnreachable(f"node watch: {err}", relist=True) from None
            except TimeoutError as err:
                if conn is not None and conn.expired and "budget" in str(err):
                    raise ApiUnreachable(f"{self.config.server}: node watch: {err}") from None
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
        """One watch event's type and object; ApiUnreachable (``relist``) for an event over
        its budget or of another shape, naming what is wrong; ApiStatusError for an ERROR
        event (its code 500 when it is not an integer). A node's ``status`` and what
        follows it are not decoded when the event has the API server's shape
        (``node_event_head``)."""
        if not boundedjson.more_elements_than(line, self.event.max_elements):
            head = node_event_head(line.decode("utf-8", "replace"))
            if head is not None:
                return head
        try:
            event = self._decode(line, self.event, "a node watch event")
        except ApiUnreachable as err:
            raise ApiUnreachable(f"node watch: {err.message}", relist=True) from None
        if not isinstance(event, dict):
            raise ApiUnreachable("node watch: an event that is not a JSON object", relist=True)
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise ApiUnreachable("node watch: an event without a type (a string) and an "
                                 "object", relist=True)
        if kind == "ERROR":
            code = obj.get("code")
            raise ApiStatusError(code if isinstance(code, int) and not isinstance(code, bool)
                                 and 0 < code < 1000 else 500,
                                 _printable(str(obj.get("reason") or "")),
                                 _printable(str(obj.get("message") or "watch error")),
                                 "watch nodes", self.config.credentials.source)
        return kind, obj


# -- a node event without its status ------------------------------------------------------

_WS = r"[ \t\n\r]*"  # JSON's whitespace
_EVENT_OPEN = re.compile(
    rf'\{{{_WS}"type"{_WS}:{_WS}"(ADDED|MODIFIED|DELETED)"{_WS},{_WS}"object"{_WS}:{_WS}\{{{_WS}')
#: A member's key without escapes (nor control characters, which JSON refuses in a
#: string), its colon and the whitespace around it.
_KEY = re.compile(rf'"([^"\\\x00-\x1f]*)"{_WS}:{_WS}')
_COLON = re.compile(rf"{_WS}:{_WS}")
_COMMA = re.compile(rf"{_WS},{_WS}")
#: The JSON value at an index of a text, and the index after it: json.loads' own scanner.
_VALUE: Callable[[str, int], tuple[Any, int]] = make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner takes any decoder


def node_event_head(text: str) -> tuple[str, dict[str, Any]] | None:
    """(type, the node's members that come before its ``status``) of a watch event in the
    shape the API server writes (the type first, then the object, whose ``status`` comes
    after its ``metadata`` and ``spec``), decoded without the status and whatever follows it:
    most of a node (conditions, images) and all that a heartbeat changes, none of which
    flanneld reads. None when the event has another shape, or is not valid JSON up to its
    status: the caller decodes it whole. Values are decoded as ``json.loads`` does."""
    match = _EVENT_OPEN.match(text)
    if match is None:
        return None
    members: dict[str, Any] = {}
    pos = match.end()
    try:
        while True:
            # A plain key and its colon in one match; a key with escapes by the decoder.
            if (plain := _KEY.match(text, pos)) is not None:
                key, pos = plain[1], plain.end()
            else:
                if text[pos] != '"':
                    return None
                key, pos = _VALUE(text, pos)
                if (colon := _COLON.match(text, pos)) is None:
                    return None
                pos = colon.end()
            if key == "status":
                # What flanneld reads must all have come before: else it is read whole.
                return (match[1], members) if "metadata" in members and "spec" in members \
                    else None
            members[key], pos = _VALUE(text, pos)
            if (comma := _COMMA.match(text, pos)) is None:
                return None  # the object ends without a status: decoded whole
            pos = comma.end()
    except (IndexError, StopIteration, ValueError, RecursionError):
        return None  # the decoder that reads it whole says what is wrong
