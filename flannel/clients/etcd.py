"""A thin asyncio etcd v3 client: the few calls flannel needs, over etcd's JSON gateway.

Every etcd since 3.4 serves its v3 API as JSON on the client port (``POST /v3/kv/range``
and so on: keys and values in base64, 64-bit integers as strings, a watch as a stream of
JSON lines), so plain HTTP/1.1 (flannel/clients/http.py) reaches all of it without gRPC.
Owns the connections (TCP or unix socket; plain or TLS with client certificates, chosen per
endpoint as Go's etcd client chooses), failover across several endpoints, password
authentication (the token goes in the ``Authorization`` header) and re-authentication when
the token expires, the budget of every answer (bytes, JSON elements, time: one place, the
``Budget`` constants below; an answer over its budget is never decoded), listings read in
pages (``get_prefix``: ``limit`` and a continuation from the last key, at one revision; a
value too large for any page is skipped and reported), watch streams that report compaction
and whose revisions only go forward, the classification of every etcd status into retryable
(``EtcdUnavailable``) or fatal (``EtcdError``, saying what to fix), no redirect ever
followed (the credentials stay with their endpoint), and the cluster ID and highest
revision seen, so that a wiped or restored store is noticed. Its errors are its own: the
etcd store (``flannel/subnet/etcd/kv.py``) translates them into the store's.
Must not touch: flannel semantics (keys, lease JSON), the stores, the kernel.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import socket
import ssl
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flannel.clients.http import BodyTooLarge, Budget, Connection, ProtocolError
from flannel.files.fileutil import read_head, unsafe_path
from flannel.untrusted import boundedjson

log = logging.getLogger(__name__)
T = TypeVar("T")


class Code(IntEnum):
    """The status codes etcd answers with (gRPC's, which its JSON gateway passes on)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class EtcdError(Exception):
    """An etcd request failed for a reason retrying the same request will not fix."""

    def __init__(self, message: str, code: Code | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(Exception):
    """No endpoint answered (down, unreachable, paused, no leader), or etcd asked to retry."""


class EtcdAuthFailed(EtcdUnavailable):
    """etcd did not accept the user name and password (they may be fixed on the server)."""


class EtcdTooLarge(EtcdUnavailable):
    """An answer (or a watch message) was larger than its budget: it was not decoded."""


class EtcdCompacted(Exception):
    """A watch asked for a revision that etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted; oldest available is {compact_revision}")
        self.compact_revision = compact_revision


class _Unreachable(Exception):
    """An endpoint could not be reached, or did not answer as etcd's gateway answers."""


class _OverBudget(_Unreachable):
    """An endpoint's answer was larger than its budget (bytes or elements)."""


class _Refused(Exception):
    """etcd answered a request with an error status."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class EtcdOptionError(ValueError):
    """An etcd connection option is malformed."""


#: The longest path a unix socket address holds (sun_path, with its terminating NUL).
_MAX_SOCKET_PATH = 107


@dataclass(frozen=True)
class Endpoint:
    """One ``--etcd-endpoints`` item, read as Go's etcd client reads it: ``http://`` never
    uses TLS, ``https://`` and ``unixs://`` always do, and ``unix://`` or a bare
    ``host:port`` use it when a client certificate is given."""

    scheme: str  # http, https, unix or unixs
    host: str = ""
    port: int = 0
    path: str = ""  # the socket of a unix(s) endpoint
    bare: bool = False  # given as host:port, without a scheme

    @property
    def target(self) -> str:
        """The address as Go's client writes it: ``host:port`` or ``unix:path``."""
        if self.path:
            return f"unix://{self.path}" if self.path.startswith("/") else f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def server_name(self) -> str:
        """The name the server certificate must carry: the host, or for a socket (as Go's
        client, to allow testing TLS locally) its file name without any ``:port``."""
        if not self.path:
            return self.host
        return self.path.rsplit("/", 1)[-1].split(":", 1)[0]

    @property
    def host_header(self) -> str:
        if self.path:
            return self.server_name or "localhost"
        return self.target

    def uses_tls(self, client_certificate: bool) -> bool:
        if self.scheme in ("https", "unixs"):
            return True
        if self.scheme == "unix" or self.bare:
            return client_certificate
        return False

    def __str__(self) -> str:
        if self.path:
            return f"{self.scheme}://{self.path}"
        return f"{self.scheme}://{self.target}"


def _socket_endpoint(item: str) -> Endpoint:
    """``unix:///abs``, ``unix://rel`` or ``unix:rel`` (and ``unixs``), as Go's client."""
    scheme, _, rest = item.partition(":")
    path = rest[2:] if rest.startswith("//") else rest
    if not path or "\0" in path or len(path.encode()) > _MAX_SOCKET_PATH:
        raise EtcdOptionError(
            f"--etcd-endpoints: {item[:200]!r} does not name a socket; give "
            f"{scheme}:///path/to/etcd.sock (at most {_MAX_SOCKET_PATH} bytes)")
    return Endpoint(scheme, path=path)


def parse_endpoints(text: str) -> list[Endpoint]:
    """Split ``--etcd-endpoints`` on commas; each item is ``http(s)://host:port``,
    ``unix(s)://path`` or a bare ``host:port``."""
    endpoints = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith(("unix:", "unixs:")):
            endpoints.append(_socket_endpoint(item))
            continue
        parts = urlsplit(item if "://" in item else f"http://{item}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EtcdOptionError(
                f"--etcd-endpoints: {item!r} is not an endpoint such as http://127.0.0.1:2379 "
                "or unix:///run/etcd.sock")
        try:
            port = parts.port or 2379
        except ValueError:
            raise EtcdOptionError(f"--etcd-endpoints: {item!r} has a bad port") from None
        endpoints.append(Endpoint(parts.scheme, parts.hostname, port, bare="://" not in item))
    if not endpoints:
        raise EtcdOptionError("--etcd-endpoints: no endpoint given, e.g. http://127.0.0.1:2379")
    return endpoints


#: The time one call may take, its answer included (EtcdOptions.timeout).
CALL_SECONDS = 5.0


@dataclass(frozen=True)
class EtcdOptions:
    endpoints: Sequence[Endpoint]
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    username: str = ""
    password: str = ""
    timeout: float = CALL_SECONDS


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    lease: int
    create_revision: int
    mod_revision: int
    #: The value was too large for any page of a listing: it was not read (``value`` is
    #: empty); the key still names what it names.
    oversize: bool = False

    @classmethod
    def from_json(cls, kv: Any) -> KeyValue:
        """A KeyValue as the gateway writes it; ``_Malformed`` when it is not one."""
        if not isinstance(kv, dict):
            raise _Malformed("a key-value is not a JSON object")
        return cls(_bytes(kv, "key"), _bytes(kv, "value"), _int(kv, "lease"),
                   _int(kv, "create_revision"), _int(kv, "mod_revision"))


@dataclass(frozen=True)
class WatchEvent:
    deleted: bool
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    """Events of one watch response and the last revision the watcher has fully seen;
    ``created`` marks the confirmation that the watch stream is (re)established,
    ``progress`` a message without events (a progress notification: its revision is
    etcd's word that nothing else happened until then, unconfirmed)."""

    events: list[WatchEvent]
    revision: int
    created: bool = False
    progress: bool = False


def prefix_range_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix``."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"



#: A CA bundle, certificate or key file; the system CA bundle is about 200 KiB.
MAX_PEM_BYTES = 4 * 1024 * 1024

# -- answer budgets ---------------------------------------------------------------------
# Measured against etcd 3.4 holding 20,000 vxlan leases, each bound to an etcd lease
# (docs/architecture.md, "Answer budgets"): the whole listing is 6.6 MB (330 bytes and 7
# JSON elements a key), a page of 1000 keys 331 KB and 7009 elements, the largest watch
# message (1000 events, etcd's most per message) 340 KB. Each budget leaves ten times that
# or more; whatever is over one is refused before it is decoded.

#: Keys asked for in one page of a listing.
PAGE_KEYS = 1000
#: One page of a listing (a page over it is asked again with fewer keys).
PAGE = Budget(max_bytes=4 * 1024 * 1024, max_elements=50_000, seconds=CALL_SECONDS)
#: Any other answer: one key (etcd stores values of at most 1.5 MiB, 2 MiB in base64), a
#: transaction, a lease.
ANSWER = Budget(max_bytes=4 * 1024 * 1024, max_elements=10_000, seconds=CALL_SECONDS)
#: An error answer: a status code and a message.
ERROR = Budget(max_bytes=64 * 1024, max_elements=100, seconds=CALL_SECONDS)
#: One message of a watch stream, from its first byte to its end.
WATCH_MESSAGE = Budget(max_bytes=4 * 1024 * 1024, max_elements=50_000, seconds=10.0)
#: A whole listing: its keys (a page of names costs ~160 bytes a key) and its time.
LISTING_KEYS = 1_000_000
LISTING_SECONDS = 120.0
#: A listing whose revision was compacted before its last page is started again this many
#: times at most.
LISTING_RESTARTS = 3
#: Idle connections kept for the next requests (each request takes one of its own).
MAX_IDLE = 8
#: TCP keepalive on etcd connections: a peer gone without a word (powered off, partitioned)
#: is found dead after KEEPIDLE + KEEPINTVL * KEEPCNT = 20 s of silence, even under a quiet
#: watch. An etcd that stops answering but whose kernel still does (paused, wedged) is found
#: by the calls made meanwhile: one that fails leaves the endpoint and drops its watches.
KEEPALIVE = ((socket.TCP_KEEPIDLE, 10), (socket.TCP_KEEPINTVL, 5), (socket.TCP_KEEPCNT, 2))

_RETRY_ELSEWHERE = (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED)
# etcd's "too many requests", "leader changed" and server-side hiccups: retry later.
_RETRY_LATER = (Code.RESOURCE_EXHAUSTED, Code.ABORTED, Code.INTERNAL, Code.UNKNOWN,
                Code.CANCELLED, Code.UNAUTHENTICATED)


class _Malformed(ValueError):
    """An answer that is JSON but not what etcd's gateway writes."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _int(doc: dict[str, Any], name: str) -> int:
    """A 64-bit integer field (a string, as the gateway writes them; absent means 0)."""
    value = doc.get(name, 0)
    if isinstance(value, str) and 0 < len(value) <= 20:
        try:
            return int(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool):
        return value
    raise _Malformed(f"{name} is not an integer: {str(value)[:40]!r}")


def _bytes(doc: dict[str, Any], name: str) -> bytes:
    """A bytes field (base64; absent means empty)."""
    value = doc.get(name, "")
    if not isinstance(value, str):
        raise _Malformed(f"{name} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise _Malformed(f"{name} is not base64 text") from None


def _flag(doc: dict[str, Any], name: str) -> bool:
    """A boolean field (absent means false)."""
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise _Malformed(f"{name} is not a boolean")
    return value


def _object(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise _Malformed(f"{name} is not a JSON object")
    return value


def _list(doc: dict[str, Any], name: str) -> list[Any]:
    value = doc.get(name, [])
    if not isinstance(value, list):
        raise _Malformed(f"{name} is not a JSON array")
    return value


def _error_status(doc: Any) -> tuple[Code, str] | None:
    """The code and message of an error answer: ``{"code": 5, "message": ...}`` for a call,
    ``{"error": {"grpc_code": 14, "message": ...}}`` inside a stream; None when ``doc`` has
    no code. _Malformed, naming the field, when the code or the message has another type."""
    if not isinstance(doc, dict):
        return None
    inner = doc.get("error")
    if isinstance(inner, dict):
        doc = inner
    name = "grpc_code" if "grpc_code" in doc else "code"
    if name not in doc:
        return None
    code = doc[name]
    if not isinstance(code, int) or isinstance(code, bool):
        raise _Malformed(f"the error's {name} is not an integer: {str(code)[:40]!r}")
    message = doc.get("message") or doc.get("error") or ""
    if not isinstance(message, str):
        raise _Malformed("the error's message is not text")
    try:
        return Code(code), message[:1000]
    except ValueError:
        return Code.UNKNOWN, message[:1000]


def _redirect(endpoint: Endpoint, path: str, status: int, location: str | None) -> _Unreachable:
    """A redirect is never followed: the token or certificate sent to ``endpoint`` must not
    reach another host."""
    where = f" to {location[:200]!r}" if location else ""
    return _Unreachable(f"{endpoint}: {path} answered HTTP {status}, a redirect{where}; "
                        "flanneld does not follow redirects (its credentials stay with the "
                        "endpoint given): give the etcd endpoint itself in --etcd-endpoints")


def _refuse_common_name(status: int, body: bytes) -> None:
    """etcd with authentication enabled refuses, on its gateway, every client whose
    certificate has a Common Name (it would be taken for the gateway's own user)."""
    if status == 400 and body.startswith(b"CommonName of client"):
        raise EtcdError(
            "etcd has authentication enabled and refuses client certificates with a Common "
            "Name on its JSON gateway, the API flanneld speaks: give --etcd-certfile a "
            "certificate without a CN (subjectAltName only) and authenticate with "
            "--etcd-username and --etcd-password", Code.FAILED_PRECONDITION)


def _describe(err: BaseException) -> str:
    if isinstance(err, TimeoutError):
        return str(err) if str(err) and str(err) != "the deadline passed" \
            else "no answer in time"
    if isinstance(err, ssl.SSLError):
        return f"TLS: {err.reason or err}"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


def _decode(data: bytes, what: str, budget: Budget) -> Any:
    """An answer's JSON within ``budget``; _OverBudget when it is too large (never decoded),
    _Malformed when it is not JSON."""
    if len(data) > budget.max_bytes:
        raise _OverBudget(f"{what} is larger than its budget of {budget.max_bytes} bytes")
    if boundedjson.more_elements_than(data, budget.max_elements):
        raise _OverBudget(f"{what} has more JSON elements than its budget of "
                          f"{budget.max_elements}")
    try:
        return budget.decode(data, what)
    except boundedjson.JSONLimitError as err:
        raise _Malformed(str(err)) from None


class EtcdClient:
    """One logical connection to an etcd cluster, failing over between endpoints."""

    def __init__(self, options: EtcdOptions) -> None:
        self._options = options
        self._index = 0
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._idle: list[tuple[int, Connection]] = []
        self._watches: dict[Connection, int] = {}  # open watch streams and their endpoint
        self._context = self._load_tls()
        if bool(options.username) != bool(options.password):
            given, missing = (("--etcd-username", "--etcd-password") if options.username
                              else ("--etcd-password", "--etcd-username"))
            log.warning("%s is given without %s: no password authentication with etcd; "
                        "give both to authenticate as a user", given, missing)
        self.cluster_id = 0
        self.revision = 0
        self._reset: str | None = None

    def _load_tls(self) -> ssl.SSLContext | None:
        """The TLS context of the endpoints that use TLS (None when none does).

        As Go flannel, a client certificate is sent only when both --etcd-certfile and
        --etcd-keyfile are given; one without the other is ignored with a warning.
        """
        opts = self._options
        if bool(opts.certfile) != bool(opts.keyfile):
            given, missing = (("--etcd-certfile", "--etcd-keyfile") if opts.certfile
                              else ("--etcd-keyfile", "--etcd-certfile"))
            log.warning("%s is given without %s: no client certificate is sent to etcd; "
                        "give both to authenticate with one", given, missing)
        if self._client_certificate:
            for endpoint in opts.endpoints:
                if endpoint.scheme == "http" and not endpoint.bare:
                    log.warning("%s is plain http: the client certificate is not used there "
                                "(give https://%s for TLS)", endpoint, endpoint.target)
        if not any(e.uses_tls(self._client_certificate) for e in opts.endpoints):
            return None

        def read(path: str, flag: str) -> bytes:
            try:
                data, more = read_head(path, MAX_PEM_BYTES)
            except OSError as err:
                raise EtcdOptionError(f"{flag}: cannot read {path}: {err.strerror}; give "
                                      "the path of a PEM file") from None
            if more:
                raise EtcdOptionError(f"{flag}: {path} is larger than {MAX_PEM_BYTES} bytes; "
                                      "give the path of a PEM file")
            with contextlib.suppress(OSError):  # it was just read: a race at most
                why, _ = unsafe_path(Path(path))
                if why is not None:  # Go flannel does not look: warned, not refused
                    log.warning("%s %s can be replaced by other users: %s; whoever replaces "
                                "it decides which etcd flanneld trusts", flag, path, why)
            return data

        context = ssl.create_default_context()
        if opts.cafile:
            ca = read(opts.cafile, "--etcd-cafile")
            try:
                context.load_verify_locations(cadata=ca.decode("latin-1"))
            except (ssl.SSLError, ValueError) as err:
                raise EtcdOptionError(f"--etcd-cafile: {opts.cafile} holds no usable PEM "
                                      f"certificate ({err}); give the CA of etcd's "
                                      "certificates") from None
        if self._client_certificate:
            cert = read(opts.certfile, "--etcd-certfile")
            key = read(opts.keyfile, "--etcd-keyfile")
            try:
                _load_key_pair(context, cert, key)
            except (ssl.SSLError, OSError) as err:
                raise EtcdOptionError(
                    f"--etcd-certfile {opts.certfile} and --etcd-keyfile {opts.keyfile} are "
                    f"not a usable PEM certificate and key ({err}); give the pair etcd's "
                    "CA signed") from None
        return context

    @property
    def _password_auth(self) -> bool:
        """As Go's etcd client: a user name and a password, or no authentication."""
        return bool(self._options.username and self._options.password)

    @property
    def _client_certificate(self) -> bool:
        return bool(self._options.certfile and self._options.keyfile)

    @property
    def endpoint(self) -> Endpoint:
        return self._options.endpoints[self._index]

    # -- connections --------------------------------------------------------------------

    async def _connect(self, endpoint: Endpoint, deadline: float) -> Connection:
        context = self._context if endpoint.uses_tls(self._client_certificate) else None
        if endpoint.path:
            return await Connection.open_unix(endpoint.path, context, endpoint.server_name,
                                              deadline)
        conn = await Connection.open(endpoint.host, endpoint.port, context, endpoint.host,
                                     deadline)
        sock = conn.transport.get_extra_info("socket")
        if sock is not None:
            for option, value in KEEPALIVE:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
        return conn

    def _take_idle(self, index: int) -> Connection | None:
        while self._idle:
            owner, conn = self._idle.pop()
            if owner == index and conn.fit_for_reuse():
                return conn
            conn.close()
        return None

    def _keep_idle(self, index: int, conn: Connection) -> None:
        if conn.reusable and index == self._index and len(self._idle) < MAX_IDLE:
            self._idle.append((index, conn))
        else:
            conn.close()

    def _headers(self, token: str | None, require_leader: bool) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        if require_leader:
            # gRPC metadata through the gateway: etcd then refuses to serve from a member
            # cut off from its leader.
            headers["Grpc-Metadata-Hasleader"] = "true"
        return headers

    async def _exchange(self, index: int, path: str, request: dict[str, Any],
                        token: str | None, require_leader: bool = False,
                        budget: Budget = ANSWER) -> dict[str, Any]:
        """POST ``request`` to endpoint ``index``; the answer's JSON object, within
        ``budget`` (an error answer within ERROR) and the call's timeout.

        Raises _Unreachable when the endpoint did not answer as etcd (_OverBudget when its
        answer was too large), _Refused when etcd answered with an error status.
        """
        status, data = await self._post(index, path, request, token, require_leader, budget)
        return self._answer(self._options.endpoints[index], path, status, data, budget)

    async def _post(self, index: int, path: str, request: dict[str, Any], token: str | None,
                    require_leader: bool, budget: Budget) -> tuple[int, bytes]:
        """The status and body of etcd's answer to ``request``, within ``budget``'s bytes
        (an error answer's within ERROR) and the call's timeout; a redirect is refused."""
        endpoint = self._options.endpoints[index]
        deadline = asyncio.get_running_loop().time() + self._options.timeout
        body = json.dumps(request).encode()
        conn = self._take_idle(index)
        while True:
            reused = conn is not None
            try:
                if conn is None:
                    conn = await self._connect(endpoint, deadline)
                conn.deadline = deadline
                await conn.send("POST", path, endpoint.host_header,
                                self._headers(token, require_leader), body)
                head = await conn.read_head()
                if 300 <= head.status < 400:
                    raise _redirect(endpoint, path, head.status, head.headers.get("location"))
                data = await conn.read_body(head, budget if head.status == 200 else ERROR)
            except (OSError, TimeoutError, ProtocolError) as err:
                if conn is not None:
                    conn.close()
                if reused and isinstance(err, ConnectionError):
                    conn = None  # closed by the server while idle: once more on a new one
                    continue
                if isinstance(err, BodyTooLarge) and head.status == 200:
                    raise _OverBudget(f"{endpoint}: the answer to {path}: {err}") from None
                raise _Unreachable(f"{endpoint}: {_describe(err)}") from None
            except _Unreachable:
                if conn is not None:
                    conn.close()
                raise
            except BaseException:
                if conn is not None:
                    conn.close()
                raise
            break
        conn.deadline = None
        self._keep_idle(index, conn)
        return head.status, data

    def _answer(self, endpoint: Endpoint, path: str, status: int, data: bytes,
                budget: Budget) -> dict[str, Any]:
        """The JSON object of an answer read whole; _Refused for etcd's error status,
        _OverBudget or _Unreachable for anything else."""
        if status != 200:
            raise self._error_answer(endpoint, path, status, data)
        try:
            doc = _decode(data, f"{endpoint}: the answer to {path}", budget)
        except _Malformed as err:
            raise _Unreachable(f"{endpoint}: {path} answered HTTP 200 with {err}; is this "
                               "etcd 3.4 or later with its gRPC gateway enabled?") from None
        if not isinstance(doc, dict):
            raise _Unreachable(f"{endpoint}: the answer to {path} is not a JSON object")
        return doc

    @staticmethod
    def _error_answer(endpoint: Endpoint, path: str, status: int, data: bytes) -> Exception:
        """What an answer other than 200 means: _Refused with etcd's status, else
        _Unreachable naming what is wrong with it."""
        try:
            found = _error_status(_decode(data, "an error answer", ERROR))
        except _Unreachable:
            found = None
        except _Malformed as err:
            _refuse_common_name(status, data)
            shape = "no etcd JSON" if data[:1] not in (b"{", b"[") else \
                f"an error answer etcd does not write ({err})"
            return _Unreachable(f"{endpoint}: {path} answered HTTP {status} with {shape}; is "
                                "this etcd 3.4 or later with its gRPC gateway enabled?")
        if found is None:
            _refuse_common_name(status, data)
            return _Unreachable(f"{endpoint}: {path} answered HTTP {status} without an etcd "
                                "status")
        return _Refused(*found)

    def _failover(self, index: int) -> None:
        """Leave endpoint ``index`` for the next, if it is still the current one."""
        if self._index != index:
            return
        self._index = (index + 1) % len(self._options.endpoints)
        self._token = None
        while self._idle:
            self._idle.pop()[1].close()
        # As a closed gRPC channel ends its streams: each watch resumes on the next endpoint.
        for conn, watched in list(self._watches.items()):
            if watched == index:
                del self._watches[conn]
                conn.close()

    # -- authentication -----------------------------------------------------------------

    async def _session(self) -> tuple[int, str | None]:
        """The current endpoint and its token, authenticated first when needed; moves to
        the next endpoint (and raises _Unreachable) when this one cannot be reached."""
        async with self._lock:
            index = self._index
            if self._password_auth and self._token is None:
                try:
                    self._token = await self._authenticate(index)
                except _Unreachable:
                    self._failover(index)
                    raise
            return index, self._token

    async def _authenticate(self, index: int) -> str:
        request = {"name": self._options.username, "password": self._options.password}
        try:
            doc = await self._exchange(index, "/v3/auth/authenticate", request, None)
            token = doc.get("token")
            if not isinstance(token, str) or not token or len(token) > 4096 \
                    or not token.isprintable():
                raise _Unreachable(f"{self._options.endpoints[index]}: authentication "
                                   "answered without a usable token")
            return token
        except _Refused as err:
            if err.code in _RETRY_ELSEWHERE:
                raise _Unreachable(f"{self._options.endpoints[index]}: {err.message}") from None
            why = ("wrong user name or password"
                   if err.code == Code.INVALID_ARGUMENT else err.message)
            raise EtcdAuthFailed(
                f"etcd authentication as {self._options.username!r} failed: {why}; "
                "check --etcd-username and --etcd-password") from None

    async def _reauthenticate(self, index: int, stale_token: str | None) -> None:
        async with self._lock:
            # Several callers may see the same expired token; only the first renews it.
            if self._index == index and self._token == stale_token:
                log.info("etcd auth token expired or invalid; re-authenticating")
                self._token = None
                try:
                    self._token = await self._authenticate(index)
                except _Unreachable:
                    self._failover(index)
                    raise

    # -- what answers tell --------------------------------------------------------------

    def _observe(self, header: dict[str, Any], floor: int) -> None:
        """Note the cluster ID and revision of a response to a request sent when ``floor`` was
        the highest revision seen: a linearizable answer never goes below it, unless the
        store was wiped or restored from an older backup."""
        cluster_id, revision = _int(header, "cluster_id"), _int(header, "revision")
        if not cluster_id:
            return
        if self.cluster_id and cluster_id != self.cluster_id:
            self._reset = (f"the etcd cluster ID changed from {self.cluster_id:x} to "
                           f"{cluster_id:x}")
            self.revision = revision
        elif revision < floor:
            self._reset = f"the etcd revision went back from {floor} to {revision}"
            self.revision = revision
        else:
            self.revision = max(self.revision, revision)
        self.cluster_id = cluster_id

    def take_reset(self) -> str | None:
        """What showed that the store was wiped or restored since the last call, if anything."""
        reset, self._reset = self._reset, None
        return reset

    def _refusal(self, method: str, key: bytes | None, code: Code, message: str) -> EtcdError:
        """The fatal error for a refused request, saying what to fix."""
        if code == Code.PERMISSION_DENIED:
            verb = "read" if method == "Range" else "write"
            user = self._options.username if self._password_auth else ""
            who = f"etcd user {user!r}" if user else "the etcd client certificate's user"
            if not key:
                return EtcdError(f"{who} may not call {method}: grant it the permission "
                                 "(etcdctl role grant-permission)", code)
            name = key.decode(errors="replace")
            prefix = name[:name.rfind("/") + 1] or name
            return EtcdError(
                f"{who} may not {verb} {name}: grant it readwrite on the prefix (etcdctl "
                f"role grant-permission <role> readwrite {prefix} --prefix=true; etcdctl "
                f"user grant-role {user or '<user>'} <role>)", code)
        hint = ""
        if code == Code.INVALID_ARGUMENT and not self._password_auth:
            hint = ("; if etcd has authentication enabled, pass --etcd-username and "
                    "--etcd-password")
        return EtcdError(f"etcd {method} failed: {code.name}: {message}{hint}", code)

    # -- calls --------------------------------------------------------------------------

    async def call(self, method: str, path: str, request: dict[str, Any], *,
                   key: bytes | None = None, require_leader: bool = False,
                   budget: Budget = ANSWER) -> dict[str, Any]:
        """Run one call (``method`` names it in messages, ``key`` is the key it concerns):
        fail over on unavailability, re-authenticate on token expiry. Returns the answer,
        which ``budget`` bounds.

        Raises EtcdUnavailable when retrying later may help (EtcdTooLarge: the answer was
        over its budget; the same endpoint is kept), EtcdError when it will not.
        """
        attempts = len(self._options.endpoints)
        reauthed = False
        last_error = ""
        while attempts > 0:
            try:
                index, token = await self._session()
            except _Unreachable as err:
                last_error = str(err)
                attempts -= 1
                continue
            floor = self.revision
            try:
                doc = await self._exchange(index, path, request, token, require_leader,
                                           budget)
                self._observe(_object(doc, "header"), floor)
                return doc
            except _OverBudget as err:
                # Another endpoint of the same cluster would send the same answer.
                raise EtcdTooLarge(f"etcd {method}: {err}") from None
            except _Malformed as err:
                last_error = f"{self._options.endpoints[index]}: {method}: {err}"
                self._failover(index)
                attempts -= 1
            except _Unreachable as err:
                last_error = str(err)
                self._failover(index)
                attempts -= 1
            except _Refused as err:
                if err.code == Code.UNAUTHENTICATED and self._password_auth and not reauthed:
                    reauthed = True
                    try:
                        await self._reauthenticate(index, token)
                    except _Unreachable as auth_err:
                        last_error = str(auth_err)
                        attempts -= 1
                    continue
                if err.code in _RETRY_ELSEWHERE:
                    last_error = f"{self._options.endpoints[index]}: {err.message}"
                    self._failover(index)
                    attempts -= 1
                    continue
                if err.code in _RETRY_LATER:
                    raise EtcdUnavailable(
                        f"etcd {method} failed: {err.code.name}: {err.message}") from None
                raise self._refusal(method, key, err.code, err.message) from None
        raise EtcdUnavailable(f"no etcd endpoint answered (last error: {last_error})")

    async def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    async def _kvs(self, method: str, path: str, request: dict[str, Any],
                   key: bytes) -> tuple[list[KeyValue], int]:
        doc = await self.call(method, path, request, key=key)
        try:
            kvs = [KeyValue.from_json(kv) for kv in _list(doc, "kvs")]
            return kvs, _int(_object(doc, "header"), "revision")
        except _Malformed as err:
            raise EtcdUnavailable(f"etcd {method}: malformed answer: {err}") from None

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        kvs, revision = await self._kvs("Range", "/v3/kv/range", {"key": _b64(key)}, key)
        return (kvs[0] if kvs else None), revision

    async def get_prefix(self, prefix: bytes, *, keys_only: bool = False
                         ) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` (without values with ``keys_only``) and the revision
        of the listing. Read in pages of PAGE_KEYS keys at the first page's revision, each
        page within PAGE; a page over it is asked again with one key (pages grow back,
        doubling, while they stay small), and a key whose value alone is over it comes back
        ``oversize``, without its value. A
        listing whose revision is compacted before its end starts again (a few times)."""
        for restart in range(LISTING_RESTARTS + 1):
            try:
                return await self._listing(prefix, keys_only=keys_only)
            except EtcdError as err:
                if err.code != Code.OUT_OF_RANGE or restart == LISTING_RESTARTS:
                    raise
                log.info("the listing of %s was compacted before its last page; listing "
                         "again", prefix.decode(errors="replace"))
        raise AssertionError("unreachable")

    async def _listing(self, prefix: bytes, *, keys_only: bool, revision: int = 0,
                       start: bytes = b"") -> tuple[list[KeyValue], int]:
        """The keys under ``prefix`` from ``start`` on, page by page, at ``revision`` (the
        first page's when 0); within LISTING_KEYS and LISTING_SECONDS."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LISTING_SECONDS
        key, end, limit = start or prefix, prefix_range_end(prefix), PAGE_KEYS
        kvs: list[KeyValue] = []
        while True:
            if loop.time() > deadline:
                raise EtcdUnavailable(f"etcd: the listing of {prefix.decode(errors='replace')} "
                                      f"did not end within {LISTING_SECONDS:g}s")
            try:
                page, revision, more = await self._page(prefix, key, end, limit, revision,
                                                        keys_only)
            except EtcdTooLarge:
                if limit > 1:
                    # Large values: one key at a time, more again once pages are small.
                    # (Every page asked for costs etcd the whole page, read or not.)
                    limit = 1
                    continue
                # One value alone is over the budget: name its key, and go on after it.
                page, revision, more = await self._page(prefix, key, end, 1, revision, True)
                page = [replace(kv, oversize=True) for kv in page]
            kvs += page
            if len(kvs) > LISTING_KEYS:
                raise EtcdTooLarge(f"etcd: the listing of {prefix.decode(errors='replace')} "
                                   f"holds more than {LISTING_KEYS} keys")
            if not more:
                return kvs, revision
            key = page[-1].key + b"\0"
            if sum(len(kv.key) + len(kv.value) for kv in page) < PAGE.max_bytes // 8:
                limit = min(PAGE_KEYS, limit * 2)

    async def _page(self, prefix: bytes, key: bytes, end: bytes, limit: int, revision: int,
                    keys_only: bool) -> tuple[list[KeyValue], int, bool]:
        """One page: at most ``limit`` keys from ``key`` to ``end``, at ``revision`` (the
        store's current one when 0); its keys, its revision, whether more follow."""
        request: dict[str, Any] = {"key": _b64(key), "range_end": _b64(end),
                                   "limit": str(limit)}
        if revision:
            request["revision"] = str(revision)
        if keys_only:
            request["keys_only"] = True
        doc = await self.call("Range", "/v3/kv/range", request, key=prefix, budget=PAGE)

        def read(doc: dict[str, Any]) -> tuple[list[KeyValue], int, bool]:
            kvs = [KeyValue.from_json(kv) for kv in _list(doc, "kvs")]
            more = doc.get("more", False)
            if not isinstance(more, bool):
                raise _Malformed("more is not a boolean")
            if len(kvs) > limit or (more and not kvs):
                raise _Malformed(f"a page of {len(kvs)} keys (asked for {limit}, more: "
                                 f"{str(more).lower()})")
            previous = key
            for kv in kvs:  # in order, within the range asked for: a listing cannot cycle
                if kv.key < previous or kv.key >= end:
                    raise _Malformed("a key is out of order or outside the range asked for")
                previous = kv.key + b"\0"
            return kvs, revision or _int(_object(doc, "header"), "revision"), more

        return self._field("Range", doc, read)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            request["lease"] = str(lease)
        doc = await self.call("Put", "/v3/kv/put", request, key=key)
        return self._field("Put", doc, lambda d: _int(_object(d, "header"), "revision"))

    async def delete(self, key: bytes) -> int:
        doc = await self.call("DeleteRange", "/v3/kv/deleterange", {"key": _b64(key)},
                              key=key)
        return self._field("DeleteRange", doc, lambda d: _int(d, "deleted"))

    @staticmethod
    def _field(method: str, doc: dict[str, Any], read: Callable[[dict[str, Any]], T]) -> T:
        try:
            return read(doc)
        except _Malformed as err:
            raise EtcdUnavailable(f"etcd {method}: malformed answer: {err}") from None

    async def create(self, key: bytes, value: bytes, lease: int = 0, *,
                     else_list: bytes | None = None) -> tuple[bool, list[KeyValue], int]:
        """Put ``key`` only if it does not exist (a create-if-absent transaction).

        Returns whether it was created, the listing below, and the store's revision after
        the transaction (that of the put when it was created). With ``else_list``, a failed
        transaction also returns every key (names only) under that prefix, so a caller that
        lost a race sees what is taken without another round trip.
        """
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        request: dict[str, Any] = {
            "compare": [{"result": "EQUAL", "target": "VERSION", "key": _b64(key),
                         "version": "0"}],
            "success": [{"request_put": put}],
        }
        if else_list is not None:
            request["failure"] = [{"request_range": {
                "key": _b64(else_list), "range_end": _b64(prefix_range_end(else_list)),
                "keys_only": True, "limit": str(PAGE_KEYS)}}]
        doc = await self.call("Txn", "/v3/kv/txn", request, key=key, budget=PAGE)

        def read(doc: dict[str, Any]) -> tuple[bool, list[KeyValue], int, bool]:
            listed, more = [], False
            for op in _list(doc, "responses"):
                if not isinstance(op, dict):
                    raise _Malformed("a transaction response is not a JSON object")
                if "response_range" in op:
                    listed += [KeyValue.from_json(kv)
                               for kv in _list(_object(op, "response_range"), "kvs")]
                    more = _object(op, "response_range").get("more") is True and bool(listed)
            succeeded = doc.get("succeeded", False)
            if not isinstance(succeeded, bool):
                raise _Malformed("succeeded is not a boolean")
            return succeeded, listed, _int(_object(doc, "header"), "revision"), more

        created, listed, revision, more = self._field("Txn", doc, read)
        if more and else_list is not None and not created:
            # The rest of the listing, at the transaction's revision, page by page.
            try:
                rest, _ = await self._listing(else_list, keys_only=True, revision=revision,
                                              start=listed[-1].key + b"\0")
            except EtcdError as err:
                if err.code != Code.OUT_OF_RANGE:
                    raise
                raise EtcdUnavailable(f"etcd Txn: the listing after it was compacted: "
                                      f"{err}") from None
            listed += rest
        return created, listed, revision

    async def grant(self, ttl: int) -> tuple[int, int]:
        """Grant a lease; returns its ID and the TTL etcd actually granted."""
        doc = await self.call("LeaseGrant", "/v3/lease/grant", {"TTL": str(ttl)})
        if doc.get("error"):
            raise EtcdError(f"etcd refused a {ttl} s lease: {str(doc['error'])[:200]}")
        return self._field("LeaseGrant", doc, lambda d: (_int(d, "ID"), _int(d, "TTL")))

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease; one that no longer exists (expired, store reset) is fine."""
        try:
            await self.call("LeaseRevoke", "/v3/lease/revoke", {"ID": str(lease_id)})
        except EtcdError as err:
            if err.code != Code.NOT_FOUND:
                raise

    async def leases(self) -> set[int]:
        """The IDs of every etcd lease that exists now."""
        doc = await self.call("LeaseLeases", "/v3/lease/leases", {}, budget=PAGE)

        def read(doc: dict[str, Any]) -> set[int]:
            found = _list(doc, "leases")
            if not all(isinstance(x, dict) for x in found):
                raise _Malformed("a lease is not a JSON object")
            return {_int(status, "ID") for status in found}

        return self._field("LeaseLeases", doc, read)

    async def time_to_live(self, lease_id: int) -> int:
        """Seconds left on a lease; -1 when it does not exist."""
        doc = await self.call("LeaseTimeToLive", "/v3/lease/timetolive", {"ID": str(lease_id)})
        return self._field("LeaseTimeToLive", doc, lambda d: _int(d, "TTL"))

    async def compact(self, revision: int) -> None:
        await self.call("Compact", "/v3/kv/compaction",
                        {"revision": str(revision), "physical": True})

    async def watch(self, key: bytes, start_revision: int, *,
                    prefix: bool = True) -> AsyncGenerator[WatchBatch, None]:
        """Stream the changes of ``key`` (or every key under it) from ``start_revision``.

        The first batch (no events, ``created``) confirms the stream. Each message is
        within WATCH_MESSAGE (bytes, elements, and time from its first byte to its end).
        Raises EtcdCompacted when the revision is gone, EtcdTooLarge when a message is over
        its budget, EtcdUnavailable when the stream breaks, goes back in revisions, or etcd
        cancels it. Progress notifications (``progress``) say how far the stream has read;
        unlike events, they are not taken as the store's revision (see ``revision``).
        """
        try:
            index, token = await self._session()
        except _Unreachable as err:
            raise EtcdUnavailable(f"cannot watch: {err}") from None
        endpoint = self._options.endpoints[index]
        create: dict[str, Any] = {"key": _b64(key), "start_revision": str(start_revision),
                                  "progress_notify": True}
        if prefix:
            create["range_end"] = _b64(prefix_range_end(key))
        conn: Connection | None = None
        try:
            try:
                # A stream that never confirms creation would hang silently: bound it.
                conn = await self._connect(
                    endpoint, asyncio.get_running_loop().time() + self._options.timeout)
                conn.deadline = asyncio.get_running_loop().time() + self._options.timeout
                await conn.send("POST", "/v3/watch", endpoint.host_header,
                                self._headers(token, require_leader=True),
                                json.dumps({"create_request": create}).encode())
                head = await conn.read_head()
                if 300 <= head.status < 400:
                    raise _redirect(endpoint, "/v3/watch", head.status,
                                    head.headers.get("location"))
                if head.status != 200:
                    raise self._error_answer(endpoint, "/v3/watch", head.status,
                                             await conn.read_body(head, ERROR))
                lines = conn.lines(head, WATCH_MESSAGE)
                first = await anext(lines, None)
                if first is None:
                    raise EtcdUnavailable("etcd closed the watch stream")
                conn.deadline = None
            except BodyTooLarge as err:
                raise EtcdTooLarge(f"{endpoint}: a watch message: {err}") from None
            except TimeoutError as err:
                self._failover(index)
                why = _describe(err) if conn is not None and conn.expired and \
                    str(err) != "the deadline passed" else \
                    f"watch not confirmed within {self._options.timeout:g}s"
                raise EtcdUnavailable(f"{endpoint}: {why}") from None
            except (OSError, ProtocolError) as err:
                self._failover(index)
                raise EtcdUnavailable(f"cannot watch: {endpoint}: {_describe(err)}") from None
            except _Unreachable as err:
                self._failover(index)
                raise EtcdUnavailable(f"cannot watch: {err}") from None
            last = start_revision - 1  # how far the stream has read: it never goes back
            batch = self._watch_batch(first, endpoint, last)
            self._watches[conn] = index
            yield WatchBatch([], last, created=True)
            try:
                while True:
                    if batch is not None:
                        last = batch.revision
                        if batch.events:
                            # Watched events are committed: later linearizable reads see
                            # no less.
                            self.revision = max(self.revision, batch.revision)
                        yield batch
                    line = await anext(lines, None)
                    if line is None:
                        break
                    batch = self._watch_batch(line, endpoint, last)
            except BodyTooLarge as err:
                raise EtcdTooLarge(f"{endpoint}: a watch message: {err}") from None
            except (OSError, TimeoutError, ProtocolError) as err:
                if conn not in self._watches:
                    raise EtcdUnavailable(f"watch stream broken: {endpoint} stopped answering "
                                          "other calls") from None
                self._failover(index)
                raise EtcdUnavailable(f"watch stream broken: {_describe(err)}") from None
            raise EtcdUnavailable("etcd closed the watch stream")
        except _Refused as err:
            if err.code in _RETRY_ELSEWHERE:
                self._failover(index)
            elif err.code == Code.UNAUTHENTICATED and self._password_auth:
                with contextlib.suppress(_Unreachable):
                    await self._reauthenticate(index, token)
            if err.code in (*_RETRY_ELSEWHERE, *_RETRY_LATER):
                raise EtcdUnavailable(f"watch stream broken: {err.message}") from None
            raise self._refusal("Watch", key, err.code, err.message) from None
        finally:
            if conn is not None:
                self._watches.pop(conn, None)
                conn.close()

    def _watch_batch(self, line: bytes, endpoint: Endpoint, last: int) -> WatchBatch | None:
        """The events of one watch message, on a stream that has read up to revision
        ``last``; None for the creation confirmation. Raises _Refused for an error message,
        EtcdCompacted, EtcdTooLarge, EtcdUnavailable (a malformed message, or one whose
        revision is below ``last``)."""
        try:
            doc = _decode(line, "a watch message", WATCH_MESSAGE)
            status = _error_status(doc)
            if status is not None:
                raise _Refused(*status)
            if not isinstance(doc, dict):
                raise _Malformed("a watch message is not a JSON object")
            result = _object(doc, "result")
            compact_revision = _int(result, "compact_revision")
            if compact_revision:
                raise EtcdCompacted(compact_revision)
            if _flag(result, "canceled"):
                # etcd cancels a watch it cannot serve (e.g. permission): retrying later is
                # all we can do from here, and the message says why.
                reason = result.get("cancel_reason", "")
                raise EtcdUnavailable(
                    f"etcd cancelled the watch: {reason[:500] if isinstance(reason, str) else '?'}")
            if _flag(result, "created"):
                # Its header revision is the store's, not how far this watch has read.
                return None
            events = []
            for event in _list(result, "events"):
                if not isinstance(event, dict):
                    raise _Malformed("a watch event is not a JSON object")
                kind = event.get("type", "PUT")
                if kind not in ("PUT", "DELETE", 0, 1) or isinstance(kind, bool):
                    raise _Malformed(f"unknown watch event type {str(kind)[:20]!r}")
                events.append(WatchEvent(kind in ("DELETE", 1),
                                         KeyValue.from_json(event.get("kv"))))
            revision = (events[-1].kv.mod_revision if events
                        else _int(_object(result, "header"), "revision"))
            previous = last
            for event in events:
                if event.kv.mod_revision < previous:
                    break
                previous = event.kv.mod_revision
            else:
                if revision >= last:
                    return WatchBatch(events, revision, progress=not events)
            raise EtcdUnavailable(f"{endpoint}: the watch went back in revisions, from {last} "
                                  f"to {min(previous, revision)}: resuming")
        except _OverBudget as err:
            raise EtcdTooLarge(f"{endpoint}: {err}") from None
        except _Malformed as err:
            raise EtcdUnavailable(f"etcd sent a malformed watch message: {err}") from None


def _load_key_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Give ssl the client certificate and key read (ssl loads keys only from files): in
    anonymous memory files, so exactly the bytes checked are loaded and none is written."""
    fds = [os.memfd_create("etcd-client-cert", os.MFD_CLOEXEC),
           os.memfd_create("etcd-client-key", os.MFD_CLOEXEC)]
    try:
        for fd, data in zip(fds, (cert, key), strict=True):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    finally:
        for fd in fds:
            os.close(fd)
