"""A thin asyncio etcd v3 client: the few RPCs flannel needs, over aetcd's gRPC stubs.

Owns the gRPC channel (TCP or unix socket; plain or TLS with client certificates, chosen
per endpoint as Go's etcd client chooses), failover across several endpoints, password
authentication and re-authentication when the token expires, per-call deadlines, watch
streams that report compaction, the classification of every gRPC status into retryable
(``StoreUnavailable``) or fatal (``StoreError``, saying what to fix), and the cluster ID and
highest revision seen, so that a wiped or restored store is noticed. aetcd's own ``Client``
is not used because it hard-codes an insecure channel and never re-authenticates.
Must not touch: flannel semantics (keys, lease JSON) and the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from aetcd import rpc

from flannel.fileutil import read_head, unsafe_path
from flannel.subnet.errors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)


class EtcdError(StoreError):
    """An etcd request failed for a reason retrying the same request will not fix."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(StoreUnavailable):
    """No endpoint answered (down, unreachable, paused, no leader), or etcd asked to retry."""


class EtcdAuthFailed(EtcdUnavailable):
    """etcd did not accept the user name and password (they may be fixed on the server)."""


class EtcdCompacted(StoreUnavailable):
    """A watch asked for a revision that etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted; oldest available is {compact_revision}")
        self.compact_revision = compact_revision


class _Unreachable(Exception):
    """The current endpoint could not be reached while opening a channel."""


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
        """The gRPC target."""
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


@dataclass(frozen=True)
class EtcdOptions:
    endpoints: Sequence[Endpoint]
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""
    username: str = ""
    password: str = ""
    timeout: float = 5.0


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    lease: int
    create_revision: int
    mod_revision: int

    @classmethod
    def from_pb(cls, kv: rpc.KeyValue) -> KeyValue:
        return cls(kv.key, kv.value, kv.lease, kv.create_revision, kv.mod_revision)


@dataclass(frozen=True)
class WatchEvent:
    deleted: bool
    kv: KeyValue


@dataclass(frozen=True)
class WatchBatch:
    """Events of one watch response and the last revision the watcher has fully seen;
    ``created`` marks the confirmation that the watch stream is (re)established."""

    events: list[WatchEvent]
    revision: int
    created: bool = False


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

_RETRY_ELSEWHERE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# etcd's "too many requests", "leader changed" and server-side hiccups: retry later.
_RETRY_LATER = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
                grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAUTHENTICATED)
_CHANNEL_OPTIONS = (
    # Reconnect quickly after an etcd restart instead of gRPC's default 1 s..120 s backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # Detect a dead peer under a silent watch stream (etcd permits pings every 5 s).
    ("grpc.keepalive_time_ms", 10000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)


class EtcdClient:
    """One logical connection to an etcd cluster, failing over between endpoints."""

    def __init__(self, options: EtcdOptions) -> None:
        self._options = options
        self._index = 0
        self._channel: grpc.aio.Channel | None = None
        self._token: str | None = None
        self._lock = asyncio.Lock()
        self._credentials = self._load_credentials()
        if bool(options.username) != bool(options.password):
            given, missing = (("--etcd-username", "--etcd-password") if options.username
                              else ("--etcd-password", "--etcd-username"))
            log.warning("%s is given without %s: no password authentication with etcd; "
                        "give both to authenticate as a user", given, missing)
        self.cluster_id = 0
        self.revision = 0
        self._reset: str | None = None
        # Stubs of the current channel: building one registers every method of its service,
        # a cost worth paying once per channel rather than once per call.
        self._stubs_channel: grpc.aio.Channel | None = None
        self._stubs: dict[type, Any] = {}

    def _load_credentials(self) -> grpc.ChannelCredentials | None:
        """The TLS credentials of the endpoints that use TLS (None when none does).

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

        def read(path: str, flag: str) -> bytes | None:
            if not path:
                return None
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

        pair = self._client_certificate
        return grpc.ssl_channel_credentials(
            root_certificates=read(opts.cafile, "--etcd-cafile"),
            private_key=read(opts.keyfile, "--etcd-keyfile") if pair else None,
            certificate_chain=read(opts.certfile, "--etcd-certfile") if pair else None,
        )

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

    def _metadata(self, require_leader: bool = False) -> tuple[tuple[str, str], ...]:
        md: list[tuple[str, str]] = []
        if self._token:
            md.append(("token", self._token))
        if require_leader:
            md.append(("hasleader", "true"))
        return tuple(md)

    async def _channel_and_metadata(
            self, require_leader: bool) -> tuple[grpc.aio.Channel, tuple[tuple[str, str], ...]]:
        async with self._lock:
            if self._channel is None:
                endpoint = self.endpoint
                target = endpoint.target
                if self._credentials is not None \
                        and endpoint.uses_tls(self._client_certificate):
                    options: tuple[tuple[str, str | int], ...] = _CHANNEL_OPTIONS
                    if endpoint.path:
                        options += (("grpc.ssl_target_name_override", endpoint.server_name),)
                    channel = grpc.aio.secure_channel(target, self._credentials,
                                                      options=options)
                else:
                    channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
                self._channel = channel
                if self._password_auth:
                    try:
                        await self._authenticate(channel)
                    except grpc.aio.AioRpcError as err:
                        await self._discard(channel, failover=True)
                        raise _Unreachable(f"{self.endpoint}: {err.details()}") from None
                    except EtcdAuthFailed:
                        # A channel without a token would make etcd say "user name is
                        # empty" next time: authenticate again on a fresh one instead.
                        await self._discard(channel, failover=False)
                        raise
            return self._channel, self._metadata(require_leader)

    def _stub(self, stub: type, channel: grpc.aio.Channel) -> Any:
        if self._stubs_channel is not channel:
            self._stubs_channel, self._stubs = channel, {}
        made = self._stubs.get(stub)
        if made is None:
            made = self._stubs[stub] = stub(channel)
        return made

    async def _authenticate(self, channel: grpc.aio.Channel) -> None:
        request = rpc.AuthenticateRequest(
            name=self._options.username, password=self._options.password)
        try:
            response = await rpc.AuthStub(channel).Authenticate(
                request, timeout=self._options.timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() in _RETRY_ELSEWHERE:
                raise
            why = ("wrong user name or password"
                   if err.code() == grpc.StatusCode.INVALID_ARGUMENT else err.details())
            raise EtcdAuthFailed(
                f"etcd authentication as {self._options.username!r} failed: {why}; "
                "check --etcd-username and --etcd-password") from None
        self._token = response.token

    async def _reauthenticate(self, channel: grpc.aio.Channel, stale_token: str | None) -> None:
        async with self._lock:
            # Several callers may see the same expired token; only the first renews it.
            if self._channel is channel and self._token == stale_token:
                log.info("etcd auth token expired or invalid; re-authenticating")
                await self._authenticate(channel)

    async def _discard(self, channel: grpc.aio.Channel, failover: bool) -> None:
        """Forget ``channel`` if it is still the current one; move to the next endpoint."""
        if self._channel is not channel:
            return
        self._channel, self._token = None, None
        if failover:
            self._index = (self._index + 1) % len(self._options.endpoints)
        await channel.close()

    def _observe(self, header: rpc.ResponseHeader, floor: int) -> None:
        """Note the cluster ID and revision of a response to a request sent when ``floor`` was
        the highest revision seen: a linearizable answer never goes below it, unless the
        store was wiped or restored from an older backup."""
        if not header.cluster_id:
            return
        if self.cluster_id and header.cluster_id != self.cluster_id:
            self._reset = (f"the etcd cluster ID changed from {self.cluster_id:x} to "
                           f"{header.cluster_id:x}")
            self.revision = header.revision
        elif header.revision < floor:
            self._reset = f"the etcd revision went back from {floor} to {header.revision}"
            self.revision = header.revision
        else:
            self.revision = max(self.revision, header.revision)
        self.cluster_id = header.cluster_id

    def take_reset(self) -> str | None:
        """What showed that the store was wiped or restored since the last call, if anything."""
        reset, self._reset = self._reset, None
        return reset

    def _refusal(self, method: str, request: object, err: grpc.aio.AioRpcError) -> EtcdError:
        """The fatal error for a refused request, saying what to fix."""
        code = err.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            key = _request_key(request)
            verb = "read" if method == "Range" else "write"
            user = self._options.username if self._password_auth else ""
            who = f"etcd user {user!r}" if user else "the etcd client certificate's user"
            if key is None:
                return EtcdError(f"{who} may not call {method}: grant it the permission "
                                 "(etcdctl role grant-permission)", code)
            prefix = key[:key.rfind("/") + 1] or key
            return EtcdError(
                f"{who} may not {verb} {key}: grant it readwrite on the prefix (etcdctl "
                f"role grant-permission <role> readwrite {prefix} --prefix=true; etcdctl "
                f"user grant-role {user or '<user>'} <role>)", code)
        hint = ""
        if code == grpc.StatusCode.INVALID_ARGUMENT and not self._password_auth:
            hint = ("; if etcd has authentication enabled, pass --etcd-username and "
                    "--etcd-password")
        return EtcdError(f"etcd {method} failed: {code.name}: {err.details()}{hint}", code)

    async def call(self, stub: type, method: str, request: object, *,
                   require_leader: bool = False) -> Any:
        """Run one unary RPC: fail over on unavailability, re-authenticate on token expiry.

        Returns the response message (aetcd's protobuf classes carry no type information).

        Raises EtcdUnavailable when retrying later may help, EtcdError when it will not.
        """
        attempts = len(self._options.endpoints)
        reauthed = False
        last_error = ""
        while attempts > 0:
            try:
                channel, metadata = await self._channel_and_metadata(require_leader)
            except _Unreachable as err:
                last_error = str(err)
                attempts -= 1
                continue
            floor = self.revision
            try:
                response = await getattr(self._stub(stub, channel), method)(
                    request, timeout=self._options.timeout, metadata=metadata)
                self._observe(response.header, floor)
                return response
            except grpc.aio.AioRpcError as err:
                code = err.code()
                if code == grpc.StatusCode.UNAUTHENTICATED and self._password_auth \
                        and not reauthed:
                    reauthed = True
                    try:
                        await self._reauthenticate(channel, dict(metadata).get("token"))
                    except grpc.aio.AioRpcError as auth_err:
                        last_error = f"{self.endpoint}: {auth_err.details()}"
                    except EtcdAuthFailed:
                        async with self._lock:
                            await self._discard(channel, failover=False)
                        raise
                    continue
                if code in _RETRY_ELSEWHERE:
                    last_error = f"{self.endpoint}: {err.details()}"
                    async with self._lock:
                        await self._discard(channel, failover=True)
                    attempts -= 1
                    continue
                if code == grpc.StatusCode.CANCELLED and self._channel is not channel:
                    # Another task replaced the channel under this call: retry on the new one.
                    continue
                if code in _RETRY_LATER:
                    raise EtcdUnavailable(
                        f"etcd {method} failed: {code.name}: {err.details()}") from None
                raise self._refusal(method, request, err) from None
        raise EtcdUnavailable(f"no etcd endpoint answered (last error: {last_error})")

    async def close(self) -> None:
        async with self._lock:
            if self._channel is not None:
                await self._discard(self._channel, failover=False)

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        response = await self.call(rpc.KVStub, "Range", rpc.RangeRequest(key=key))
        kvs = [KeyValue.from_pb(kv) for kv in response.kvs]
        return (kvs[0] if kvs else None), int(response.header.revision)

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        response = await self.call(rpc.KVStub, "Range", rpc.RangeRequest(
            key=prefix, range_end=prefix_range_end(prefix)))
        return [KeyValue.from_pb(kv) for kv in response.kvs], int(response.header.revision)

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        response = await self.call(rpc.KVStub, "Put", rpc.PutRequest(
            key=key, value=value, lease=lease))
        return int(response.header.revision)

    async def delete(self, key: bytes) -> int:
        response = await self.call(rpc.KVStub, "DeleteRange", rpc.DeleteRangeRequest(key=key))
        return int(response.deleted)

    async def create(self, key: bytes, value: bytes, lease: int = 0, *,
                     else_list: bytes | None = None) -> tuple[bool, list[KeyValue]]:
        """Put ``key`` only if it does not exist (a create-if-absent transaction).

        With ``else_list``, a failed transaction also returns every key (names only) under
        that prefix, so a caller that lost a race sees what is taken without another round
        trip.
        """
        failure = []
        if else_list is not None:
            failure.append(rpc.RequestOp(request_range=rpc.RangeRequest(
                key=else_list, range_end=prefix_range_end(else_list), keys_only=True)))
        request = rpc.TxnRequest(
            compare=[rpc.Compare(result=rpc.Compare.EQUAL, target=rpc.Compare.VERSION,
                                 key=key, version=0)],
            success=[rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value,
                                                              lease=lease))],
            failure=failure,
        )
        response = await self.call(rpc.KVStub, "Txn", request)
        listed = [KeyValue.from_pb(kv) for op in response.responses
                  if op.WhichOneof("response") == "response_range"
                  for kv in op.response_range.kvs]
        return bool(response.succeeded), listed

    async def grant(self, ttl: int) -> tuple[int, int]:
        """Grant a lease; returns its ID and the TTL etcd actually granted."""
        response = await self.call(rpc.LeaseStub, "LeaseGrant", rpc.LeaseGrantRequest(TTL=ttl))
        if response.error:
            raise EtcdError(f"etcd refused a {ttl} s lease: {response.error}")
        return int(response.ID), int(response.TTL)

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease; one that no longer exists (expired, store reset) is fine."""
        try:
            await self.call(rpc.LeaseStub, "LeaseRevoke", rpc.LeaseRevokeRequest(ID=lease_id))
        except EtcdError as err:
            if err.code != grpc.StatusCode.NOT_FOUND:
                raise

    async def leases(self) -> set[int]:
        """The IDs of every etcd lease that exists now."""
        response = await self.call(rpc.LeaseStub, "LeaseLeases", rpc.LeaseLeasesRequest())
        return {int(status.ID) for status in response.leases}

    async def time_to_live(self, lease_id: int) -> int:
        """Seconds left on a lease; -1 when it does not exist."""
        response = await self.call(rpc.LeaseStub, "LeaseTimeToLive",
                                   rpc.LeaseTimeToLiveRequest(ID=lease_id))
        return int(response.TTL)

    async def compact(self, revision: int) -> None:
        await self.call(rpc.KVStub, "Compact", rpc.CompactionRequest(
            revision=revision, physical=True))

    async def watch(self, key: bytes, start_revision: int, *,
                    prefix: bool = True) -> AsyncIterator[WatchBatch]:
        """Stream the changes of ``key`` (or every key under it) from ``start_revision``.

        The first batch (no events, ``created``) confirms the stream. Raises EtcdCompacted when
        the revision is gone, EtcdUnavailable when the stream breaks or etcd cancels it.
        Progress notifications keep ``revision`` fresh.
        """
        try:
            channel, metadata = await self._channel_and_metadata(require_leader=True)
        except _Unreachable as err:
            raise EtcdUnavailable(f"cannot watch: {err}") from None
        create = rpc.WatchCreateRequest(key=key, start_revision=start_revision,
                                        progress_notify=True)
        if prefix:
            create.range_end = prefix_range_end(key)
        call = rpc.WatchStub(channel).Watch(metadata=metadata)
        try:
            try:
                # A stream that never confirms creation would hang silently: bound it.
                async with asyncio.timeout(self._options.timeout):
                    await call.write(rpc.WatchRequest(create_request=create))
                    response = await call.read()
            except TimeoutError:
                raise EtcdUnavailable(
                    f"{self.endpoint}: watch not confirmed within {self._options.timeout:g}s"
                ) from None
            first = _watch_batch(response)
            yield WatchBatch([], start_revision - 1, created=True)
            if first is not None:
                yield first
            while True:
                batch = _watch_batch(await call.read())
                if batch is not None:
                    # Watched revisions are committed: later linearizable reads see no less.
                    self.revision = max(self.revision, batch.revision)
                    yield batch
        except grpc.aio.AioRpcError as err:
            code = err.code()
            if code in _RETRY_ELSEWHERE:
                async with self._lock:
                    await self._discard(channel, failover=True)
            elif code == grpc.StatusCode.UNAUTHENTICATED and self._password_auth:
                await self._reauthenticate(channel, dict(metadata).get("token"))
            if code in (*_RETRY_ELSEWHERE, *_RETRY_LATER):
                raise EtcdUnavailable(f"watch stream broken: {err.details()}") from None
            raise self._refusal("Watch", create, err) from None
        finally:
            call.cancel()


def _request_key(request: object) -> str | None:
    """The key a request names (a transaction's first compared key), for messages."""
    key = getattr(request, "key", b"")
    if not key and isinstance(request, rpc.TxnRequest) and request.compare:
        key = request.compare[0].key
    return key.decode(errors="replace") if key else None


def _watch_batch(response: Any) -> WatchBatch | None:
    """The events of one watch response; None for the creation confirmation.

    ``response`` is an ``rpc.WatchResponse`` or ``grpc.aio.EOF`` (both untyped).
    """
    if response is grpc.aio.EOF:
        raise EtcdUnavailable("etcd closed the watch stream")
    if response.compact_revision:
        raise EtcdCompacted(response.compact_revision)
    if response.canceled:
        # etcd cancels a watch it cannot serve (e.g. permission): retrying later is all we can
        # do from here, and the message says why.
        raise EtcdUnavailable(f"etcd cancelled the watch: {response.cancel_reason}")
    if response.created:
        # Its header revision is the store's, not how far this watch has read.
        return None
    events = [WatchEvent(ev.type == rpc.Event.DELETE, KeyValue.from_pb(ev.kv))
              for ev in response.events]
    revision = events[-1].kv.mod_revision if events else response.header.revision
    return WatchBatch(events, revision)
