"""The Kubernetes subnet manager (``--kube-subnet-mgr``), compatible with kube-flannel.

Owns: the node name (``NODE_NAME`` or the pod's ``spec.nodeName``), the network config file, this
node's lease (its podCIDR(s), published as annotations with a strategic-merge patch of
``nodes/<name>/status``), the ``NetworkUnavailable=False`` condition, and the node
list+watch: resumed from the last resourceVersion after a cut, relisted after 410 Gone,
with a bounded wait for the first sync. Node changes are coalesced per node in a buffer of
at most ``EVENT_QUEUE_DEPTH`` nodes (beyond that the consumer gets one snapshot instead),
so the watch never blocks and the latest state of every node is never lost. Nodes are kept as
small views (name, version, pod CIDRs, flannel's annotations); a node whose fields have the
wrong types is skipped, logged once and counted, like one with bad annotations, and never
stops the list or the watch. API errors are classified by HTTP status: retryable
(``KubeUnavailable``, a ``StoreUnavailable``) or fatal (``KubeError``, a ``StoreError`` saying
what to fix). The HTTP client and its config are the client's and config's.
Also owns the keeping of this node's record while flanneld runs: its annotations published
again when they go missing, both written again when the Node is registered anew, every
write retried with backoff without end (never fatal) and shown in ``status.writes``.
Must not touch: the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, Callable
from datetime import UTC, date, datetime
from ipaddress import IPv4Address, IPv6Address
from typing import Any, NoReturn

from flannel.clients.kube.client import ApiStatusError, ApiUnreachable, KubeClient
from flannel.clients.kube.config import KubeConfigError, client_config, ignored_proxy
from flannel.config import ConfigError, NetworkConfig, parse_config
from flannel.files.fileutil import read_head
from flannel.lease import Event, EventType, Lease, LeaseAttrs, SharedStrings
from flannel.reporting.skips import SkippedRecords
from flannel.settings import KubeSettings
from flannel.subnet.errors import RetryLog, StoreError, StoreUnavailable
from flannel.subnet.kube.annotations import (
    AnnotationError,
    Annotations,
    NotManaged,
    lease_of,
    pod_cidrs,
    published,
)
from flannel.subnet.manager import StoreStatus
from flannel.subnet.watch import Changes, LeaseUpdate, Snapshot
from flannel.timing.backoff import Backoff
from flannel.timing.clock import SYSTEM, Clock
from flannel.untrusted import boundedjson
from flannel.untrusted.netutil import within

log = logging.getLogger(__name__)

DEFAULT_EVENT_QUEUE_DEPTH = 5000
FIRST_SYNC_TIMEOUT = 600.0
#: First and longest wait between attempts to write this node's record after start.
KEEP_BACKOFF = (1.0, 60.0)
#: How often this node's record is looked at without a node watch (alloc), in seconds; Go
#: flannel's informer resync period.
RECHECK = 300.0
#: How long the start waits for kube-controller-manager to assign our Node's podCIDR.
POD_CIDR_WAIT = 30.0
#: Between node watches (and listings that failed): the first delay, the longest.
WATCH_BACKOFF = (0.1, 30.0)
#: A watch that lived this long was healthy: the next one opens after the first delay.
#: A real API server ends a watch after its timeoutSeconds (5-10 min) and sends a bookmark
#: about every minute; shorter watches (a server or proxy that ends every watch at once, or
#: after one event) back off. Bookmarks alone do not count: a server that sends one and
#: closes is as short-lived as any other.
WATCH_HEALTHY = 30.0


#: HTTP statuses after which the same request may succeed later.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class KubeError(StoreError):
    """The API server cannot give what flannel needs; the message says what to fix."""


class KubeUnavailable(StoreUnavailable):
    """The API server cannot answer now (overloaded, restarting); retry later."""


class NodeMissing(KubeUnavailable):
    """This node's Node object is not in the API server (not registered yet, or deleted)."""


def api_failure(err: ApiStatusError | ApiUnreachable, what: str) -> KubeError | KubeUnavailable:
    """A failed API call classified by its HTTP status (never by its text) or, without an
    answer, as retryable unless retrying cannot help (an untrusted server certificate)."""
    if isinstance(err, ApiUnreachable):
        failure = KubeError if err.permanent else KubeUnavailable
        return failure(f"{what}: {err.message}")
    code, message = err.code, err.message
    if code in RETRYABLE_STATUS:
        return KubeUnavailable(f"{what}: {message} (HTTP {code})")
    if code == 401:
        return KubeError(f"{what}: {message} (HTTP 401): the API server did not accept "
                         f"{err.credentials}; renew or correct these credentials")
    if code == 403:
        return KubeError(f"{what}: {message} (HTTP 403): allow flanneld's service account "
                         f"to {err.permission} (the ClusterRole flannel in "
                         "deploy/kube-flannel.yml)")
    return KubeError(f"{what}: {message}")


class UnusableNode(ValueError):
    """A node object whose fields flanneld cannot read."""


#: The creation time of a node whose creationTimestamp cannot be read: after every other.
NOT_CREATED = 1 << 62


#: Annotation names under flannel's prefix, and the values every node repeats (its backend
#: type, "true"): one string each, not one per node (a watch event decodes each afresh).
_SHARED = SharedStrings()


class NodeView:
    """What flanneld keeps of a node: name, creationTimestamp, pod CIDRs and the annotations
    under flannel's prefix. One small record per node rather than the API's nested maps (four
    dicts a node: ~3 MiB more at 5000 nodes); ``as_node`` gives that shape back to this
    node's keeping. Replaced, never changed; a newer copy of the node that ``reads_same``
    leaves it in place (its resourceVersion is not kept: nothing reads it)."""

    __slots__ = ("annotations", "name", "pod_cidr", "pod_cidrs", "stamp")

    def __init__(self, name: str, annotations: dict[str, str], pod_cidr: str | None,
                 pod_cidrs: list[str] | None, stamp: Any = None) -> None:
        self.name = name
        self.annotations = annotations
        self.pod_cidr = pod_cidr
        self.pod_cidrs = pod_cidrs
        self.stamp = stamp if isinstance(stamp, str) else None

    @property
    def created(self) -> int:
        """The node's creation time in Unix seconds (``NOT_CREATED`` when unreadable)."""
        return _created(self.stamp)

    def inputs(self) -> tuple[object, ...]:
        """What ``node_lease`` reads: equal inputs decode to the same lease, so heartbeats
        and status churn skip the decoding."""
        return self.pod_cidr, self.pod_cidrs, self.annotations

    def reads_same(self, raw: dict[str, Any], meta: dict[str, Any], prefix: str) -> bool:
        """Whether ``node_view`` of ``raw`` (a newer copy of this node, its ``metadata``
        ``meta``) would give this view again, found without making anything: a heartbeat
        costs the watch no new record. False also for a copy ``node_view`` refuses (a value
        of a wrong type equals nothing kept here): that one goes the whole way."""
        if meta.get("name") != self.name or meta.get("creationTimestamp") != self.stamp or \
                not isinstance(meta.get("resourceVersion", ""), str):
            return False
        spec = raw.get("spec") or {}
        if not isinstance(spec, dict) or spec.get("podCIDR") != self.pod_cidr or \
                spec.get("podCIDRs") != self.pod_cidrs:
            return False
        annotations = meta.get("annotations") or {}
        if not isinstance(annotations, dict):
            return False
        mine = self.annotations
        found = 0
        for key, value in annotations.items():
            if isinstance(key, str) and key.startswith(prefix):
                if mine.get(key) != value:
                    return False
                found += 1
        return found == len(mine)

    def as_node(self) -> dict[str, Any]:
        """The node in the API's shape (new maps: the caller may keep or change them)."""
        spec = {k: v for k, v in (("podCIDR", self.pod_cidr),
                                  ("podCIDRs", None if self.pod_cidrs is None
                                   else list(self.pod_cidrs))) if v is not None}
        return {"metadata": {"name": self.name, "annotations": dict(self.annotations)},
                "spec": spec}


def node_view(raw: Any, prefix: str) -> NodeView:
    """What flanneld keeps of a node (``NodeView``): nothing else is read, and a cluster of
    big nodes stays small."""
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    version = meta.get("resourceVersion", "") if isinstance(meta, dict) else ""
    if not isinstance(name, str) or not name or len(name) > 253 or not name.isprintable():
        raise UnusableNode("metadata.name is not a node name")
    if not isinstance(version, str):
        raise UnusableNode(f"node {name}: metadata.resourceVersion is not a string")
    assert isinstance(meta, dict)  # a name was found in it
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise UnusableNode(f"node {name}: metadata.annotations is not a map")
    spec = raw.get("spec") or {}
    if not isinstance(spec, dict):
        raise UnusableNode(f"node {name}: spec is not a map")
    mine: dict[str, str] = {}
    repeated = (prefix + "kube-subnet-manager", prefix + "backend-type")
    for key, value in annotations.items():
        if not isinstance(key, str) or not key.startswith(prefix):
            continue
        if not isinstance(value, str):
            raise UnusableNode(f"node {name}: annotation {key} must be a string")
        mine[_SHARED(key)] = _SHARED(value) if key in repeated else value
    # Only strings are kept: nothing nested from the API outlives decoding.
    cidr, cidrs = spec.get("podCIDR"), spec.get("podCIDRs")
    cidr_ok = cidr is None or isinstance(cidr, str)
    cidrs_ok = cidrs is None or (isinstance(cidrs, list) and
                                 all(isinstance(c, str) for c in cidrs))
    if not cidr_ok or not cidrs_ok:
        raise UnusableNode(f'node "{name}": pod CIDRs must be a list of CIDR strings')
    if cidr is not None and cidrs:
        # podCIDRs[0] repeats podCIDR: one string for both.
        cidrs = [cidr if c == cidr else c for c in cidrs]
    return NodeView(name, mine, cidr, cidrs, meta.get("creationTimestamp"))


#: Day 0 of Unix time, as ``date.toordinal`` counts days.
_EPOCH_DAY = date(1970, 1, 1).toordinal()


def _created(stamp: Any) -> int:
    """A node's ``metadata.creationTimestamp`` (RFC 3339, whole seconds, as the API server
    sets it) in Unix seconds; ``NOT_CREATED`` (the youngest) when it is not one."""
    if not isinstance(stamp, str) or len(stamp) != 20 or stamp[4::3] != "--T::Z":
        return NOT_CREATED
    try:  # by hand: strptime costs five times as much, and a relist reads every node's
        day = date(int(stamp[:4]), int(stamp[5:7]), int(stamp[8:10])).toordinal()
        hour, minute, second = int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19])
    except ValueError:
        return NOT_CREATED
    if not (0 <= hour < 24 and 0 <= minute < 60 and 0 <= second < 60):
        return NOT_CREATED
    return (day - _EPOCH_DAY) * 86400 + hour * 3600 + minute * 60 + second


def _name_of(raw: Any) -> str:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name[:253] if isinstance(name, str) and name.isprintable() else "(unnamed)"


def _lacks_pod_cidr(node: dict[str, Any]) -> str:
    """Why our Node cannot give a lease yet: kube-controller-manager assigns the podCIDR
    shortly after the kubelet registers the Node."""
    spec = node.get("spec") or {}
    if spec.get("podCIDR") or spec.get("podCIDRs"):
        return ""
    return "its podCIDR is not assigned yet (kube-controller-manager --allocate-node-cidrs)"


def _triple(lease: Lease) -> tuple[object, ...]:
    attrs = lease.attrs
    return (lease.subnet, lease.ipv6_subnet, attrs.backend_type, attrs.backend_data,
            attrs.backend_v6_data, attrs.public_ip, attrs.public_ipv6)


def event_queue_depth(environ: dict[str, str]) -> int:
    text = environ.get("EVENT_QUEUE_DEPTH", "")
    if not text:
        return DEFAULT_EVENT_QUEUE_DEPTH
    try:
        depth = int(text)
    except ValueError as err:
        raise KubeError(f"env EVENT_QUEUE_DEPTH={text} format error: {err}") from None
    return depth if depth > 0 else DEFAULT_EVENT_QUEUE_DEPTH


class KubeSubnetManager:
    name = "kube"
    #: This node's annotations gone from the watch are put back by keep_lease (Go flannel
    #: ignores its own node's events and keeps running).
    revocable = False

    def __init__(self, client: KubeClient, node_name: str, names: Annotations,
                 net_config_path: str, *, environ: dict[str, str] | None = None,
                 set_node_network_unavailable: bool = True,
                 queue_depth: int = DEFAULT_EVENT_QUEUE_DEPTH,
                 first_sync_timeout: float = FIRST_SYNC_TIMEOUT,
                 continue_when_cache_not_ready: bool = False,
                 keep_backoff: tuple[float, float] = KEEP_BACKOFF,
                 recheck: float = RECHECK, pod_cidr_wait: float = POD_CIDR_WAIT,
                 retry_interval: float = 3.0, watch_healthy: float = WATCH_HEALTHY,
                 clock: Clock = SYSTEM) -> None:
        self.client = client
        self.clock = clock
        # Not ready only while the start waits for our Node (a relist needs no recovery).
        self.status = StoreStatus()
        self.node_name = node_name
        self.environ = environ or {}
        self.names = names
        self.net_config_path = net_config_path
        self.set_node_network_unavailable = set_node_network_unavailable
        self.queue_depth = queue_depth
        self.first_sync_timeout = first_sync_timeout
        self.continue_when_cache_not_ready = continue_when_cache_not_ready
        self.keep_backoff = keep_backoff
        self.recheck = recheck
        self.pod_cidr_wait = pod_cidr_wait
        self.retry_interval = retry_interval
        self.watch_healthy = watch_healthy
        self.lease: Lease | None = None
        # What acquire_lease published, for keep_lease to publish again.
        self._published: tuple[NetworkConfig, LeaseAttrs] | None = None
        self._own_changed = asyncio.Event()  # the watch saw this node change (or relisted)
        self._cidrs_reported: tuple[object, object] | None = None
        self.status.writes.track("annotations", blocking=True)
        if set_node_network_unavailable:
            # Not a readiness matter: see docs/architecture.md, "The Kubernetes subnet manager".
            self.status.writes.track("condition", blocking=False)
        # The watch cache: node name -> node dict, and what changed since the consumer looked.
        self.nodes: dict[str, NodeView] = {}
        self._dirty: dict[str, None] = {}
        self._resync = False
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._watch_task: asyncio.Task[NoReturn] | None = None
        self.resource_version = ""
        self.undecodable = SkippedRecords("node")

    # -- config and own node ----------------------------------------------------------

    async def own_node_name(self) -> str:
        """This node's name: given, else ``NODE_NAME``, else the pod's ``spec.nodeName``."""
        if not self.node_name:
            self.node_name = await node_name_from_env(self.client, self.environ)
        return self.node_name

    async def get_network_config(self) -> NetworkConfig:
        try:
            # One byte over the limit is enough for parse_config to refuse a huge file.
            text, _ = await asyncio.to_thread(read_head, self.net_config_path,
                                              boundedjson.MAX_CONFIG_BYTES + 1)
        except OSError as err:
            raise ConfigError(f"failed to read net conf: {err}",
                              f"mount the flannel ConfigMap at {self.net_config_path} or set "
                              "--net-config-path") from None
        try:
            config = parse_config(text)
        except ConfigError as err:
            raise ConfigError(f"error parsing subnet config: {err}", err.hint) from None
        if not config.enable_ipv4 and not config.enable_ipv6:
            raise ConfigError("none defined stack", "set EnableIPv4 or EnableIPv6 to true")
        return config

    async def get_node(self, *, wait_if_missing: bool = False) -> dict[str, Any]:
        """This node's object, with ``metadata`` and ``spec`` maps (checked, else KubeError).
        A node that does not exist is fatal, or ``NodeMissing`` with ``wait_if_missing``."""
        name = await self.own_node_name()
        try:
            node = await self.client.get_node(name)
        except (ApiStatusError, ApiUnreachable) as err:
            if wait_if_missing and isinstance(err, ApiStatusError) and err.code == 404:
                raise self._missing() from None
            raise api_failure(err, f"cannot get node {name!r}") from None
        meta = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(meta, dict) or not isinstance(node.get("spec") or {}, dict) or \
                not isinstance(meta.get("annotations") or {}, dict):
            raise KubeError(f"node {name!r}: the API server sent a node whose metadata, "
                            "annotations or spec is not a map")
        if meta.get("name") != name:  # never take another node's podCIDR as ours
            raise KubeError(f"asked the API server for node {name!r}, it answered with node "
                            f"{_name_of(node)!r}; check the API server URL and any proxy "
                            "in front of it")
        checked: dict[str, Any] = node
        return checked

    def _missing(self) -> NodeMissing:
        return NodeMissing(f'node "{self.node_name}" not found in the API server: waiting for '
                           "it to be registered (by its kubelet; check NODE_NAME if it never "
                           "is)")

    async def public_ip_overrides(self) -> tuple[IPv4Address | None, IPv6Address | None]:
        """The node-public-ip(v6) annotations; while the node cannot be read (not registered
        yet, API server down) ``KubeUnavailable``, which the daemon retries, saying why."""
        annotations = (await self.get_node(wait_if_missing=True))["metadata"].get(
            "annotations") or {}
        try:
            v4 = annotations.get(self.names.node_public_ip)
            v6 = annotations.get(self.names.node_public_ipv6)
            if not isinstance(v4 or "", str) or not isinstance(v6 or "", str):
                raise ValueError("not a string")
            return (IPv4Address(v4) if v4 else None, IPv6Address(v6) if v6 else None)
        except ValueError as err:
            raise KubeError(f"node {self.node_name}: annotation {self.names.node_public_ip} "
                            f"is not an IP address: {err}") from None

    async def _wait_for_own_node(self, lacks: Callable[[dict[str, Any]], str]
                                 ) -> dict[str, Any]:
        """Our Node, waited for without end while the API server cannot give it (down, the
        Node not registered yet) and up to ``pod_cidr_wait`` while ``lacks(node)`` names what
        it still lacks (then it is returned as it is: the caller's check says what is
        wrong). Each cause is logged once and is the store's status (so /readyz names it)
        while we wait. A refusal that waiting cannot cure (KubeError) is raised at once."""
        await self.own_node_name()  # a missing name is not worth waiting for
        deadline: float | None = None
        retries = RetryLog(log, f"waiting for node {self.node_name}")
        try:
            while True:
                try:
                    node = await self.get_node(wait_if_missing=True)
                except KubeUnavailable as err:
                    cause = str(err)
                else:
                    cause = lacks(node)
                    if not cause:
                        retries.succeeded()
                        return node
                    if deadline is None:
                        deadline = self.clock.monotonic() + self.pod_cidr_wait
                    elif self.clock.monotonic() > deadline:
                        return node
                self.status.set(False, f"waiting for node {self.node_name}: {cause}")
                retries.failed(cause, self.retry_interval)
                await self.clock.sleep(self.retry_interval)
        finally:
            self.status.set(True)

    async def _patch_status(self, body: dict[str, Any]) -> None:
        """One strategic-merge patch of this node's status, failures classified (a node
        that is gone is ``NodeMissing``)."""
        name = await self.own_node_name()
        try:
            await self.client.patch_node_status(name, body)
        except (ApiStatusError, ApiUnreachable) as failed:
            if isinstance(failed, ApiStatusError) and failed.code == 404:
                raise self._missing() from None
            raise api_failure(failed, f"patch node {name} status") from None

    async def acquire_lease(self, config: NetworkConfig, attrs: LeaseAttrs) -> Lease:
        """This node's lease from its pod CIDRs, its annotations published. Failures the
        daemon retries (``KubeUnavailable``: API server down, node not registered yet) or
        that stop the start (``KubeError``: what to fix)."""
        cfg = config
        node = await self._wait_for_own_node(_lacks_pod_cidr)
        try:
            v4, v6 = pod_cidrs(self.node_name, node.get("spec") or {})
        except AnnotationError as err:
            raise KubeError(f"{err}; assign pod CIDRs to nodes (kube-controller-manager "
                            "--allocate-node-cidrs=true --cluster-cidr=<Network>) or set the "
                            "node's spec.podCIDR") from None
        for enabled, subnet, network, family, pod_cidr in (
                (cfg.enable_ipv4, v4, cfg.network, "IPv4", "PodCIDR"),
                (cfg.enable_ipv6, v6, cfg.ipv6_network, "IPv6", "IPv6 PodCIDR")):
            if not enabled:
                continue
            if subnet is None:
                raise KubeError(f'node "{self.node_name}" has no {family} pod CIDR but the '
                                f"flannel config enables {family}")
            if network is None or not within(subnet, network):
                raise KubeError(f'subnet "{network}" specified in the flannel net config '
                                f'doesn\'t contain "{subnet}" {pod_cidr} of the '
                                f'"{self.node_name}" node; make the config\'s {family} network '
                                "match the cluster CIDR")
        written = await self._publish_annotations(node, cfg, attrs)
        if written:
            log.info("published %d annotation(s) on node %s", written, self.node_name)
        self.status.writes.succeeded("annotations")
        self._published = (cfg, attrs)
        # The families the config enables: the daemon asks for a lease only with a backend
        # whose footprint carries them (Footprint.dual_stack).
        self.lease = Lease(v4 if cfg.enable_ipv4 else None,
                           v6 if cfg.enable_ipv6 else None, attrs,
                           expiration=self.clock.time() + 24 * 3600)
        return self.lease

    # -- keeping this node's record -----------------------------------------------------

    def _unpublished(self, err: Exception | str) -> str:
        return f"lease annotations not published on node {self.node_name}: {err} (retrying)"

    async def keep_lease(self, lease: Lease) -> NoReturn:
        """Keep this node's record as long as flanneld runs (kube leases are not renewed):
        its annotations, published again whenever they are missing or differ, and
        NetworkUnavailable=False, set once and again when the Node is registered anew. The
        node is read from the watch cache (woken by its changes) or, without a node watch
        (alloc) or before the first sync, fetched every ``recheck`` seconds. A Node that is
        gone is waited for. Failed writes and reads are logged and retried with backoff,
        without end: a write that fails is in ``status.writes`` (the annotations' failure
        makes the node not ready), never fatal."""
        assert self._published is not None, "keep_lease before acquire_lease"
        backoff = Backoff(*self.keep_backoff, clock=self.clock)
        reads = RetryLog(log, f"could not read node {self.node_name}")
        logs = {"annotations": RetryLog(log, "could not publish the lease annotations on "
                                             f"node {self.node_name}"),
                "condition": RetryLog(log, "could not set NetworkUnavailable=False on node "
                                           f"{self.node_name}")}
        condition_due = self.set_node_network_unavailable
        gone = False
        while True:
            self._own_changed.clear()
            try:
                node = await self._own_node()
            except (KubeError, KubeUnavailable) as err:
                # Nothing is known about the node: what was written stays as it was.
                reads.failed(err, backoff.delay)
                await self.clock.sleep(backoff.grow())
                continue
            reads.succeeded()
            if node is None:
                if not gone:
                    log.warning("node %s is no longer in the API server; flanneld keeps "
                                "running and publishes its lease again once the node is "
                                "registered again", self.node_name)
                    gone = True
                    condition_due = self.set_node_network_unavailable
                self.status.writes.failed("annotations", self._unpublished(
                    "the node is not in the API server"), counted=False)
                await self._own_change(backoff.grow())
                continue
            if gone:
                log.info("node %s is registered again: publishing its lease", self.node_name)
                gone = False
            self._check_pod_cidrs(node, lease)
            ok = await self._keep_annotations(node, logs["annotations"], backoff.delay)
            if condition_due:
                condition_due = not await self._set_condition(logs["condition"],
                                                              backoff.delay)
            if ok and not condition_due:
                backoff.reset()
                await self._own_change(self.recheck)
            else:
                await self.clock.sleep(backoff.grow())

    async def _own_node(self) -> dict[str, Any] | None:
        """This node as the watch cache holds it (once synced), else as the API server
        answers; None when it does not exist."""
        if self._watch_task is not None and self._synced.is_set():
            view = self.nodes.get(self.node_name)
            return view.as_node() if view is not None else None
        try:
            return await self.get_node(wait_if_missing=True)
        except NodeMissing:
            return None

    async def _own_change(self, timeout: float) -> None:
        await self.clock.wait(self._own_changed, timeout)

    def _check_pod_cidrs(self, node: dict[str, Any], lease: Lease) -> None:
        """A Node registered anew may get other pod CIDRs: say so (the subnet flanneld took
        at start stays in use until it is restarted)."""
        try:
            v4, v6 = pod_cidrs(self.node_name, node.get("spec") or {})
        except AnnotationError:
            v4 = v6 = None
        now = (v4 if lease.subnet else None, v6 if lease.ipv6_subnet else None)
        if now != (lease.subnet, lease.ipv6_subnet) and now != self._cidrs_reported:
            self._cidrs_reported = now
            log.error("node %s now has the pod CIDR(s) %s but this flanneld uses %s; restart "
                      "flanneld to take the node's", self.node_name,
                      ", ".join(str(c) for c in now if c) or "(none)", lease.key)

    async def _publish_annotations(self, node: dict[str, Any], config: NetworkConfig,
                                   attrs: LeaseAttrs) -> int:
        """Write the annotations ``node`` lacks or holds otherwise; how many were written.
        A refusal is recorded as the annotations write's failure and raised."""
        existing = node["metadata"].get("annotations") or {}
        wanted = published(self.names, attrs, existing, config.enable_ipv4, config.enable_ipv6)
        changes = {k: v for k, v in wanted.items() if existing.get(k) != v}
        if changes:
            try:
                await self._patch_status({"metadata": {"annotations": changes}})
            except (KubeError, KubeUnavailable) as err:
                self.status.writes.failed("annotations", self._unpublished(err))
                raise
        return len(changes)

    async def _keep_annotations(self, node: dict[str, Any], retries: RetryLog,
                                retry_in: float) -> bool:
        assert self._published is not None
        config, attrs = self._published
        try:
            written = await self._publish_annotations(node, config, attrs)
        except (KubeError, KubeUnavailable) as err:
            retries.failed(err, retry_in)
            return False
        if written:
            log.info("published %d missing or changed annotation(s) on node %s again",
                     written, self.node_name)
        retries.succeeded()
        self.status.writes.succeeded("annotations")
        return True

    async def _set_condition(self, retries: RetryLog, retry_in: float) -> bool:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            await self._patch_status({"status": {"conditions": [{
                "type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp",
                "message": "Flannel is running on this node", "lastHeartbeatTime": now,
                "lastTransitionTime": now}]}})
        except (KubeError, KubeUnavailable) as err:
            self.status.writes.failed("condition", f"NetworkUnavailable=False not set on node "
                                                   f"{self.node_name}: {err} (retrying)")
            retries.failed(err, retry_in)
            return False
        retries.succeeded()
        self.status.writes.succeeded("condition")
        log.info("node %s: NetworkUnavailable=False (FlannelIsUp)", self.node_name)
        return True

    # -- the node watch ---------------------------------------------------------------

    def _view(self, raw: Any) -> NodeView | None:
        """The node's view, or None when it is unusable (skipped: logged once, counted)."""
        try:
            return node_view(raw, self.names.prefix)
        except UnusableNode as err:
            name = _name_of(raw)
            self.undecodable.skip(name, str(err).removeprefix(f"node {name}: "))
            return None

    def _store(self, raw: Any) -> None:
        node = self._view(raw)
        name = _name_of(raw)
        if node is None:
            if self.nodes.pop(name, None) is not None:  # what it published is void now
                self._mark(name)
            return
        cached = self.nodes.get(name)
        self.nodes[name] = node
        # An update that changes nothing a lease is decoded from (a heartbeat, a status)
        # wakes neither the lease loop nor keep_lease (which read only the view), and never
        # fills the loop's queue.
        if cached is None or cached.inputs() != node.inputs():
            self._mark(name)

    def _mark(self, name: str) -> None:
        if name == self.node_name:
            self._own_changed.set()
        if not self._resync:
            self._dirty[name] = None
            if len(self._dirty) > self.queue_depth:
                # Too many distinct pending nodes: hand over one snapshot instead.
                self._dirty.clear()
                self._resync = True
        self._changed.set()

    async def _relist(self) -> None:
        nodes, self.resource_version = await self.client.list_nodes(self._view)
        self.nodes = {n.name: n for n in nodes}
        self._dirty.clear()
        self._resync = True
        self._changed.set()
        self._own_changed.set()
        self.status.relists += 1
        self._synced.set()

    async def _watch(self) -> NoReturn:
        """List, then watch from the listed version; resume after cuts, relist after 410.
        Every reopening backs off, unless the watch before it lived ``watch_healthy``
        seconds: a server that ends every watch at once is not asked again and again.
        Any other error is a bug: it ends the task, and ``watch_leases`` raises it."""
        backoff = Backoff(*WATCH_BACKOFF, clock=self.clock)
        need_list = True
        relisted = False  # relisted after a 410 with no event since
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                self.status.watching = True
                opened = self.clock.monotonic()
                try:  # no generator around the events: a heartbeat costs little else
                    async for kind, raw in self.client.watch_nodes(self.resource_version):
                        self._apply(kind, raw)
                        relisted = False
                finally:
                    if self.clock.monotonic() - opened >= self.watch_healthy:
                        backoff.reset()  # a healthy watch: the next opens after the first delay
            except ApiUnreachable as err:
                self.status.watching = False
                self.status.reconnects += 1
                if err.relist:
                    log.warning("%s; relisting the nodes", err.message)
                    need_list = True
                else:
                    log.warning("node watch interrupted (%s); resuming from resourceVersion "
                                "%s in %.1fs", err.message, self.resource_version or "(list)",
                                backoff.delay)
            except ApiStatusError as err:
                self.status.watching = False
                if err.code == 410:
                    self.status.compactions += 1
                    log.info("node watch: resourceVersion %s is gone; relisting",
                             self.resource_version)
                    need_list = True
                    if not relisted:  # once at once; a server that keeps answering 410
                        relisted = True  # would otherwise be listed in a tight loop
                        continue
                self.status.reconnects += 1
                log.warning("node watch failed (%s); retrying in %.1fs",
                            api_failure(err, "watch nodes"), backoff.delay)
            await backoff.wait()

    def _apply(self, kind: str, raw: dict[str, Any]) -> None:
        """One watch event (its object a JSON object, as the client checked) into the cache:
        the resourceVersion to resume from, the node stored, replaced or removed."""
        meta = raw.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(version, str) and 0 < len(version) <= 1024:  # it goes in a URL
            self.resource_version = version
        if kind == "DELETED":
            name = _name_of(raw)
            self.nodes.pop(name, None)
            self.undecodable.forget(name)
            self._mark(name)
        elif kind == "MODIFIED" and isinstance(meta, dict) and \
                (cached := self.nodes.get(_name_of(raw))) is not None and \
                cached.reads_same(raw, meta, self.names.prefix):
            return  # a heartbeat, a status: the view stays as it is
        elif kind in ("ADDED", "MODIFIED"):
            self._store(raw)

    def _lease_of(self, node: NodeView, config: NetworkConfig) -> Lease | None:
        name = node.name
        try:
            lease = lease_of(name, node.annotations, node.pod_cidr, node.pod_cidrs, self.names,
                             config.enable_ipv4, config.enable_ipv6, node.created)
        except NotManaged:
            return None
        except AnnotationError as err:
            self.undecodable.skip(name, str(err).removeprefix(f"node {name}: "))
            return None
        if name != self.node_name and self.lease is not None and lease.same_subnet(self.lease):
            # Our lease is our Node's only: another node's claim on it is neither ours
            # (its removal would read as our lease revoked) nor a peer's.
            self.undecodable.skip(name, f"it claims this node's subnet {self.lease.key} "
                                        f"(node {self.node_name})")
            return None
        return lease

    async def watch_leases(self, config: NetworkConfig) -> AsyncGenerator[LeaseUpdate, None]:
        """The leases of the nodes annotated for ``config``'s families."""
        if config.backend_type == "alloc":
            # Someone else routes: upstream disables the informer entirely.
            yield Snapshot([])
            await asyncio.Event().wait()
        watch = self._watch_task = asyncio.create_task(self._watch(), name="node watch")
        try:
            async with asyncio.timeout(self.first_sync_timeout):
                await _until(self._synced, watch)
        except TimeoutError:
            if not self.continue_when_cache_not_ready:
                raise KubeError(f"the node cache did not sync within "
                                f"{self.first_sync_timeout:g}s; is the API server reachable "
                                "and may this service account list nodes? (set "
                                "CONT_WHEN_CACHE_NOT_READY=true to go on regardless)") from None
            log.warning("node cache not synced; continuing (CONT_WHEN_CACHE_NOT_READY=true)")
        emitted: dict[str, Lease] = {}
        decoded: dict[str, NodeView] = {}  # node name -> the view its lease came from
        try:
            while True:
                await _until(self._changed, watch)
                self._changed.clear()
                if self._resync:
                    self._resync = False
                    decoded = dict(self.nodes)
                    emitted = {name: lease for name, node in self.nodes.items()
                               if (lease := self._lease_of(node, config)) is not None}
                    yield Snapshot(list(emitted.values()))
                    continue
                names, self._dirty = list(self._dirty), {}
                events = []
                for name in names:
                    node = self.nodes.get(name)
                    if node is not None:
                        seen = decoded.get(name)
                        if seen is not None and seen.inputs() == node.inputs():
                            continue
                        decoded[name] = node
                    else:
                        decoded.pop(name, None)
                    lease = self._lease_of(node, config) if node is not None else None
                    before = emitted.get(name)
                    if lease is None:
                        if before is not None:
                            events.append(Event(EventType.REMOVED, emitted.pop(name)))
                    elif before is None or _triple(before) != _triple(lease):
                        if before is not None and not before.same_subnet(lease):
                            events.append(Event(EventType.REMOVED, before))
                        emitted[name] = lease
                        events.append(Event(EventType.ADDED, lease))
                if events:
                    yield Changes(events)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def close(self) -> None:
        with contextlib.suppress(OSError):  # closing: a connection already broken is fine
            await self.client.close()


async def _until(event: asyncio.Event, watch: asyncio.Task[NoReturn]) -> None:
    """Wait for ``event``; if the node watch ends first (a bug: it handles every API failure
    itself), raise its error here, in the task the daemon supervises, rather than wait for
    ever on a watch that is gone."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiter, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not event.is_set():
        watch.result()


async def node_name_from_env(client: KubeClient, environ: dict[str, str]) -> str:
    name = environ.get("NODE_NAME", "")
    if name:
        return name
    pod, namespace = environ.get("POD_NAME", ""), environ.get("POD_NAMESPACE", "")
    if not pod or not namespace:
        raise KubeError("env variables POD_NAME and POD_NAMESPACE must be set (or NODE_NAME)")
    try:
        found = await client.get_pod(namespace, pod)
    except (ApiStatusError, ApiUnreachable) as err:
        raise api_failure(err, f"error retrieving pod spec for '{namespace}/{pod}'") from None
    spec = found.get("spec") if isinstance(found, dict) else None
    node_name = spec.get("nodeName") if isinstance(spec, dict) else None
    if not node_name or not isinstance(node_name, str):
        raise KubeError(f"node name not present in pod spec '{namespace}/{pod}'")
    return node_name


def kube_client(api_url: str, kubeconfig_file: str, environ: dict[str, str] | None = None,
                **options: Any) -> KubeClient:
    """The API client for the kubeconfig file; else the in-cluster service account (with
    ``api_url`` as the server if given); else ``api_url`` without credentials."""
    environ = dict(os.environ) if environ is None else environ
    try:
        config = client_config(api_url, kubeconfig_file, environ)
    except KubeConfigError as err:
        raise KubeError(f"cannot build the Kubernetes client config: {err}") from None
    variable = ignored_proxy(config, environ)
    if variable is not None:
        log.warning("%s is set and NO_PROXY does not cover %s, but flanneld does not use "
                    "proxies: it connects to the API server directly", variable, config.host)
    return KubeClient(config, **options)


def make_kube_manager(settings: KubeSettings) -> KubeSubnetManager:
    environ = dict(os.environ)
    client = kube_client(settings.api_url, settings.kubeconfig_file, environ)
    try:
        names = Annotations.for_prefix(settings.annotation_prefix)
    except AnnotationError as err:
        raise KubeError(f"--kube-annotation-prefix: {err}") from None
    return KubeSubnetManager(
        client, environ.get("NODE_NAME", ""), names, settings.net_config_path,
        environ=environ, set_node_network_unavailable=settings.set_node_network_unavailable,
        queue_depth=event_queue_depth(environ),
        continue_when_cache_not_ready=environ.get("CONT_WHEN_CACHE_NOT_READY") == "true")
