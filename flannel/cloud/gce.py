"""The gce route engine: our subnet routed to this instance in the VPC network, through the
Compute Engine REST API (v1), as Go flannel's gce backend did before v0.20.

As Go: project, zone, instance and network from the metadata server; one route per subnet,
named ``flannel-<subnet with "." and "/" as "-">`` (``flannel-10-244-3-0-24``), destRange the
subnet, next hop this instance, priority 1000; every insert and delete is an operation
polled through globalOperations.get until done (bounded). Beyond Go: routes flanneld makes
carry a mark, the description ``DESCRIPTION``, and only marked routes are flannel's: a route
without it (an admin's, another tool's, one Go flannel or an older pyflannel made) is never
deleted. ``reconcile()`` repairs our route and deletes marked routes of vanished leases,
once two passes agree; our own unmarked route (made before the mark) is adopted by
inserting a marked one beside it (under ``flannel-<subnet>-m`` while the old one holds the
name) and only then deleting the old one, so the subnet is never unrouted; throttled calls
(HTTP 429, ``rateLimitExceeded``, a rate quota) are retried with backoff; the route quota
is reported as a full route table. Ours are only marked routes named after their own
destination, in our network, whose next hop is an instance, for a subnet strictly inside
the Network. ``Project`` and ``Network`` override where the routes go (a Shared VPC's host
project and network); ``Endpoint`` the API's URL (a Private Service Connect endpoint).

Every answer is bounded (``flannel.clients.fetch``: bytes, and a deadline for the whole
answer; ``boundedjson``: elements) and decoded by type (``flannel.cloud.typed``); a listing
is bounded in pages, routes and time, and a page token seen before ends it. Redirects are
never followed: the token goes to the endpoint's host only. Every method blocks and is
meant for a worker thread; calls are serialised; ``interrupt()`` (any thread) cuts them when
flanneld stops. Tokens are never logged. Must not touch: the store, the kernel, routes
without the mark.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Any, NamedTuple

from flannel.backendconf.errors import BackendConfigError
from flannel.clients.fetch import FetchFailed, fetch, opener
from flannel.cloud.base import (
    NO_WAIT,
    ApiError,
    CloudError,
    RouteChange,
    RouteEngineBase,
    Stopper,
    Throttled,
    ThrottleRetry,
    route_in_network,
)
from flannel.cloud.gceauth import (
    KEY_FILE_VARIABLE,
    NAME,
    PROJECT,
    GceIdentity,
    GceMetadata,
    TokenSource,
    gce_identity,
    key_file_tokens,
    metadata_tokens,
)
from flannel.cloud.options import endpoint_url, string_members
from flannel.cloud.typed import View
from flannel.untrusted import boundedjson
from flannel.untrusted.boundedjson import JSONLimitError

log = logging.getLogger(__name__)

COMPUTE_API = "https://compute.googleapis.com"
ROUTE_PREFIX = "flannel-"
#: The second name of a subnet's route, taken while the first is held by an unmarked route.
SECOND_NAME = "-m"
#: The mark of the routes flanneld makes; a route without it is never deleted.
DESCRIPTION = "pod subnet of a flannel node; flanneld deletes it once the node's lease is gone"
PRIORITY = 1000
#: Seconds one API answer may take, whole (connecting, the head, every byte of the body).
API_TIMEOUT = 10
#: How operations are waited on: polled every second, at most this many times at start (Go:
#: 100), and fewer in a data plane pass, whose worker thread every other pass waits behind.
OPERATION_POLLS = 60
PASS_OPERATION_POLLS = 10
#: routes.list: entries per page (the API's maximum); at most MAX_PAGES pages, MAX_ROUTES
#: routes named flannel-* (20,000 nodes and a quarter more) and LIST_TIMEOUT seconds.
PAGE = 500
MAX_PAGES = 50
MAX_ROUTES = MAX_PAGES * PAGE
LIST_TIMEOUT = 120.0
#: One answer: a page of 500 routes is ~450 KiB and ~10,000 JSON elements; an instance
#: with the most metadata Compute Engine allows (512 KiB) stays under these too.
MAX_ANSWER = 2 * 1024 * 1024
MAX_ELEMENTS = 50_000
_MAX_ERROR = 64 * 1024
_MAX_TOKEN = 1024
_LINK = 512  # characters of a resource link (a real one has about 200)
_OPERATION = re.compile(r"[A-Za-z0-9_-]{1,128}", re.ASCII)
_THROTTLED = ("rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED")


def route_name(subnet: IPv4Network) -> str:
    """Go's name for the route of ``subnet``: ``flannel-10-244-3-0-24``."""
    return ROUTE_PREFIX + str(subnet).replace(".", "-").replace("/", "-")


def _resource(link: object) -> str:
    """A resource URL from ``projects/`` on: self links name one resource whatever host
    (www.googleapis.com, compute.googleapis.com, an endpoint) the API put in front."""
    text = str(link or "")
    at = text.find("projects/")
    return text[at:] if at >= 0 else text


class Route(NamedTuple):
    """What the engine reads of a route (the rest of the answer is dropped at once)."""

    name: str
    dest: str
    network: str  # the network's link from projects/ on
    next_hop: str  # the next hop instance's link from projects/ on, "" for another kind
    marked: bool  # it carries flannel's description


@dataclass(frozen=True)
class Operation:
    name: str
    done: bool
    #: (code, message) of each error the operation ended with.
    errors: tuple[tuple[str, str], ...]
    http_status: int


def routes_page(answer: object, source: str) -> tuple[list[Route], str]:
    """A routes.list page: its routes named flannel-* (others are not asked for, nor
    kept), and the next page's token ("" at the end)."""
    page = View(answer, source).obj(required=True)
    routes = []
    for item in page.get("items").array(PAGE * 2):
        item.obj(required=True)
        name = item.get("name").text(63, required=True)
        if not name.startswith(ROUTE_PREFIX):
            continue
        routes.append(Route(name, item.get("destRange").text(64),
                            _resource(item.get("network").text(_LINK)),
                            _resource(item.get("nextHopInstance").text(_LINK)),
                            item.get("description").text(2048) == DESCRIPTION))
    return routes, page.get("nextPageToken").text(_MAX_TOKEN)


def operation(answer: object, source: str) -> Operation:
    """A compute#operation: its name, whether it is DONE, and the errors it ended with."""
    view = View(answer, source).obj(required=True)
    errors = tuple((e.get("code").text(200), e.get("message").text(2048))
                   for e in (error.obj(required=True) for error in
                             view.get("error").get("errors").array(100)))
    return Operation(view.get("name").text(200), view.get("status").text(40) == "DONE",
                     errors, view.get("httpErrorStatusCode").integer(0, 0, 999))


def self_link(answer: object, source: str) -> str:
    """A networks.get or instances.get answer's selfLink."""
    link = View(answer, source).obj(required=True).get("selfLink").text(_LINK, required=True)
    if not link:
        raise CloudError(f"{source}: selfLink is empty")
    return link


def error_detail(answer: object) -> tuple[str, str]:
    """(the first error's reason, the message) of an error answer (``{"error": {"code",
    "message", "errors": [{"reason", "message"}]}}``); ("", "") when it has another shape."""
    detail = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(detail, dict):
        return "", ""
    errors = detail.get("errors")
    first = errors[0] if isinstance(errors, list) and errors else None
    first = first if isinstance(first, dict) else {}
    reason, message = first.get("reason"), detail.get("message") or first.get("message")
    return (reason[:80] if isinstance(reason, str) else "",
            message[:300] if isinstance(message, str) else "")


@dataclass(frozen=True)
class GceConfig:
    network: IPv4Network
    #: ``Project``: the project of the VPC network (default: the instance's).
    project: str = ""
    #: ``Network``: the VPC network's name (default: the first interface's).
    vpc_network: str = ""
    #: ``Endpoint``: the Compute API's URL (default https://compute.googleapis.com).
    endpoint: str = COMPUTE_API
    #: ``GOOGLE_APPLICATION_CREDENTIALS``: a service-account key file (else the instance's
    #: service account, through the metadata server).
    key_file: str = ""

    @classmethod
    def from_backend(cls, backend: dict[str, Any], network: IPv4Network,
                     environ: Mapping[str, str] = os.environ) -> GceConfig:
        members = string_members(backend, {"project": "Project", "network": "Network",
                                           "endpoint": "Endpoint"})
        project, vpc = members.get("Project", ""), members.get("Network", "")
        if project and not PROJECT.fullmatch(project):
            raise BackendConfigError(f"Backend.Project: {project[:80]!r} is not a project ID "
                                     "(6 to 30 lower-case letters, digits and dashes)")
        if vpc and not NAME.fullmatch(vpc):
            raise BackendConfigError(f"Backend.Network: {vpc[:80]!r} is not a network name "
                                     "(lower-case letters, digits and dashes, at most 63)")
        # http is taken too (the lab's double speaks it); the message names the real form.
        endpoint = endpoint_url("Endpoint", members.get("Endpoint", ""), ("http", "https"),
                                named=("https",)) or COMPUTE_API
        key_file = environ.get(KEY_FILE_VARIABLE, "")
        if len(key_file) > 4096 or "\0" in key_file:
            raise BackendConfigError(f"{KEY_FILE_VARIABLE} is not a file path")
        return cls(network, project, vpc, endpoint, key_file)


class GceApiError(ApiError):
    def __init__(self, action: str, status: int, reason: str, message: str) -> None:
        hint = ""
        if status == 403 and reason in ("forbidden", "insufficientPermissions",
                                        "accessNotConfigured"):
            hint = (" (the service account needs compute.routes.* and compute.networks."
                    "updatePolicy, e.g. the role roles/compute.networkAdmin, and the instance "
                    "the compute or cloud-platform scope)")
        super().__init__("Compute Engine", action, reason or f"HTTP {status}", message, hint)
        self.status = status


class RouteLimit(CloudError):
    """The project's route quota is used up."""


def _route_limit(project: str, network: str, subnet: IPv4Network, message: str) -> RouteLimit:
    return RouteLimit(
        f"route limit reached: project {project} refused the route for {subnet} in network "
        f"{network} ({message[:200]}). Raise the ROUTES quota of the project, or use a "
        "backend that needs no route per node (vxlan)")


class GceRoutes(RouteEngineBase):
    name = "gce"

    def __init__(self, config: GceConfig, metadata: GceMetadata,
                 backoff: ThrottleRetry | None = None,
                 sleep: Callable[[float], None] | None = None,
                 operation_polls: int = OPERATION_POLLS, poll_interval: float = 1.0,
                 stopper: Stopper | None = None) -> None:
        super().__init__(backoff, sleep, stopper or metadata.stopper)
        self.config = config
        self.metadata = metadata
        self.operation_polls = operation_polls
        self.poll_interval = poll_interval
        self.identity: GceIdentity | None = None
        self.project = ""
        self.network_link = ""
        self.instance_link = ""
        self._tokens: TokenSource | None = None
        # The Compute API through HTTPS_PROXY when set, as Google's libraries reach it.
        self._opener = opener(proxies=True)
        self._unmarked: set[str] = set()  # unmarked routes named flannel-*, logged once

    # -- the REST calls -----------------------------------------------------------------

    def _request_once(self, action: str, method: str, path: str,
                      query: Mapping[str, str] | None = None,
                      body: Mapping[str, Any] | None = None) -> Any:
        """One call: the decoded JSON answer. Throttled when Google says slow down,
        GceApiError when it refuses, CloudError when no usable answer came."""
        assert self._tokens is not None
        url = f"{self.config.endpoint}/compute/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        what = f"Compute Engine {action}"
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self._tokens.token()}",
                       "Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            request = urllib.request.Request(url, data=data, method=method,  # noqa: S310
                                             headers=headers)
            try:
                reply = fetch(self._opener, request, timeout=API_TIMEOUT,
                              max_bytes=MAX_ANSWER, stopper=self.stopper, what=what)
            except FetchFailed as error:
                raise CloudError(f"{what}: no usable answer from {self.config.endpoint} "
                                 f"({error})") from None
            status = reply.status
            if 300 <= status < 400:
                where = urllib.parse.urlsplit(reply.headers.get("location", "")).netloc
                raise CloudError(f"{what}: {self.config.endpoint} answered HTTP {status}, a "
                                 f"redirect to {where[:100] or 'nowhere'!r}; not followed "
                                 "(the access token goes to the API's host only): set "
                                 "Backend.Endpoint to the API's own URL")
            if status == 401 and attempt == 1:
                self._tokens.invalidate()  # expired or revoked: one fresh token
                continue
            if status != 200:
                reason, message = _error_of(reply.body)
                if status == 429 or reason in _THROTTLED or (
                        reason == "quotaExceeded" and "ROUTES" not in message):
                    raise Throttled(reason or str(status))
                raise GceApiError(action, status, reason, message)
            try:
                return boundedjson.loads(reply.body or b"{}", what=f"{what}'s answer",
                                         max_bytes=MAX_ANSWER, max_elements=MAX_ELEMENTS)
            except JSONLimitError as error:
                raise CloudError(str(error)) from None
        raise AssertionError("unreachable")

    def _call(self, action: str, method: str, path: str,
              query: Mapping[str, str] | None = None,
              body: Mapping[str, Any] | None = None) -> Any:
        return self._retried(f"Compute Engine {action}",
                             lambda: self._request_once(action, method, path, query, body))

    def _wait(self, action: str, answer: object) -> None:
        """Poll a global operation until DONE (bounded); its error is the call's error."""
        what = f"Compute Engine {action}'s operation"
        current = operation(answer, what)
        # A pass that must not wait out throttling must not wait long on an operation either.
        polls = self.operation_polls if self._retry is not NO_WAIT else \
            min(self.operation_polls, PASS_OPERATION_POLLS)
        for _ in range(polls):
            if current.done:
                break
            if not _OPERATION.fullmatch(current.name):
                raise CloudError(f"{what}: an operation without a usable name "
                                 f"({current.name[:60]!r})")
            self._sleep(self.poll_interval)
            # Not retried on its own: a throttled poll retries the whole change (``_changed``).
            current = operation(self._request_once(
                "globalOperations.get", "GET",
                f"projects/{self.project}/global/operations/{current.name}"), what)
        else:
            if not current.done:
                raise CloudError(
                    f"Compute Engine {action}: operation {current.name} not done after "
                    f"{polls * self.poll_interval:.0f}s; the next "
                    "reconciliation looks at the route table again")
        if current.errors:
            code, message = current.errors[0]
            if code == "QUOTA_EXCEEDED" and "ROUTES" in message:
                raise RouteLimit(message)
            if code in ("QUOTA_EXCEEDED", *_THROTTLED):
                raise Throttled(code)
            raise GceApiError(action, current.http_status, code, message)

    def _changed(self, action: str, method: str, path: str,
                 body: Mapping[str, Any] | None = None) -> None:
        """An insert or delete and the wait for its operation, retried together when
        throttled (a retried insert finding its route already made is done)."""
        def once() -> None:
            try:
                self._wait(action, self._request_once(action, method, path, body=body))
            except GceApiError as error:
                if not ((error.status == 409 and method == "POST")
                        or (error.status == 404 and method == "DELETE")):
                    raise
        self._retried(f"Compute Engine {action}", once)

    # -- the engine ---------------------------------------------------------------------

    def prepare(self) -> None:
        """Identity from the metadata server; the network's and this instance's links."""
        with self._lock:
            self.identity = identity = gce_identity(self.metadata)
            self.project = self.config.project or identity.project
            network = self.config.vpc_network or identity.network
            if self.config.key_file:
                self._tokens = key_file_tokens(self.config.key_file, API_TIMEOUT, self.stopper)
            else:
                self._tokens = metadata_tokens(self.metadata)
            try:
                found = self._call("networks.get", "GET",
                                   f"projects/{self.project}/global/networks/{network}")
            except GceApiError as error:
                if error.status == 404:
                    raise CloudError(f"network {network} not found in project {self.project}; "
                                     "set Backend.Network and Backend.Project to the VPC "
                                     "network this instance is attached to") from None
                raise
            instance = self._call("instances.get", "GET",
                                  f"projects/{identity.project}/zones/{identity.zone}/"
                                  f"instances/{identity.instance}")
            self.network_link = self_link(found, "Compute Engine networks.get's answer")
            self.instance_link = self_link(instance, "Compute Engine instances.get's answer")
            self._status.tables = [f"{self.project}/{network}"]
            self._status.target = identity.instance
            if not View(instance, "Compute Engine instances.get's answer").get(
                    "canIpForward").boolean():
                warning = (f"instance {identity.instance} has IP forwarding off "
                           "(canIpForward false): Compute Engine drops packets to its pods; "
                           "create the instance with --can-ip-forward")
                self._status.warnings = [warning]
                log.warning("gce: %s", warning)
            if self.config.endpoint.startswith("http://"):
                log.warning("gce: Backend.Endpoint %s is plain http: the access token crosses "
                            "the network unencrypted", self.config.endpoint)
            log.info("gce: project %s, network %s, instance %s in %s (routes authorised by "
                     "%s)", self.project, network, identity.instance, identity.zone,
                     self._tokens.describe)

    def _prepared(self) -> bool:
        return bool(self.instance_link)

    def _list_routes(self, names: set[str]) -> list[Route]:
        """The routes of our network with an instance as next hop, and any route named in
        ``names`` (our subnet's, whose names must be free for our insert)."""
        routes: list[Route] = []
        # RE2 regular expressions, each matching a whole field; a network's link may carry
        # any host in front of its path.
        network = re.escape(_resource(self.network_link))
        query = {"filter": f'(name eq "{ROUTE_PREFIX}.*") (network eq ".*/{network}")',
                 "maxResults": str(PAGE)}
        what = f"Compute Engine routes.list in project {self.project}"
        deadline = time.monotonic() + LIST_TIMEOUT
        seen: set[str] = set()
        ours = _resource(self.network_link)
        for _ in range(MAX_PAGES):
            page, token = routes_page(
                self._call("routes.list", "GET", f"projects/{self.project}/global/routes",
                           query), "Compute Engine routes.list's answer")
            # Only what may be flannel's is kept, sharing one network string: a server
            # answering page after page holds no more than a few bytes a route here.
            routes += [route._replace(network=ours) if route.network == ours else route
                       for route in page
                       if (route.network == ours and route.next_hop) or route.name in names]
            if len(routes) > MAX_ROUTES:
                raise CloudError(f"{what}: more than {MAX_ROUTES} routes named "
                                 f"{ROUTE_PREFIX}*; refusing the listing")
            if not token:
                return routes
            if token in seen:
                raise CloudError(f"{what}: the page token repeats (the listing goes round "
                                 f"in a circle after {len(seen) + 1} pages); refusing it")
            if time.monotonic() > deadline:
                raise CloudError(f"{what}: the listing took longer than {LIST_TIMEOUT:g}s; "
                                 "refusing it")
            seen.add(token)
            query = {**query, "pageToken": token}
        raise CloudError(f"{what}: more than {MAX_PAGES} pages; refusing the listing")

    def _flannel_shaped(self, route: Route) -> IPv4Network | None:
        """The route's subnet when it has the shape of flannel's routes (an instance as next
        hop, in our network, for a subnet inside the Network, named after it), else None."""
        if not route.next_hop or route.network != _resource(self.network_link):
            return None
        subnet = route_in_network(route.dest, self.config.network)
        if subnet is None or route.name not in (route_name(subnet),
                                                route_name(subnet) + SECOND_NAME):
            return None
        return subnet

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        table = self._status.tables[0]
        me = _resource(self.instance_link)
        doomed: list[tuple[str, IPv4Network, str]] = []
        ours = False
        adopted: Route | None = None  # our own route from before the mark
        taken: set[str] = set()
        if collect:
            self._orphans.begin()
        for route in self._list_routes({route_name(own), route_name(own) + SECOND_NAME}):
            taken.add(route.name)
            subnet = self._flannel_shaped(route)
            if subnet is None:
                if route.name == route_name(own):
                    raise CloudError(
                        f"a route named {route.name} exists in project {self.project} that "
                        "is not flannel's (another network, or a next hop that is not an "
                        "instance); delete it so that flannel can route its subnet")
                continue
            target = route.next_hop.rsplit("/", 1)[-1]
            if not route.marked:
                if subnet == own and route.next_hop == me:
                    adopted = route
                elif subnet == own and route.name == route_name(own):
                    raise CloudError(
                        f"the route {route.name} in project {self.project} sends our subnet "
                        f"{own} to instance {target}, and flannel did not make it (it lacks "
                        "flannel's description); delete it (gcloud compute routes delete "
                        f"{route.name}) so that flannel can route its subnet")
                elif route.name not in self._unmarked:
                    self._unmarked.add(route.name)
                    log.info("gce: route %s (%s -> %s) is not marked as flannel's: left "
                             "alone (docs/cloud.md: adopting routes)", route.name, subnet,
                             target)
                continue
            if subnet == own:
                if route.next_hop == me:
                    ours = True
                else:  # pointed elsewhere: routes are immutable, so delete and insert
                    doomed.append((route.name, subnet, target))
            elif self._orphan(table, subnet, target, live, collect):
                doomed.append((route.name, subnet, target))
        if collect:
            self._orphans.end()
        changes: list[RouteChange] = []
        for name, subnet, target in doomed:
            self._changed("routes.delete", "DELETE",
                          f"projects/{self.project}/global/routes/{name}")
            taken.discard(name)
            changes.append(RouteChange("delete", table, str(subnet), target))
            log.info("gce: %s", changes[-1])
        if not ours:
            changes.append(self._insert(own, table, me, taken))
            log.info("gce: %s", changes[-1])
        if adopted is not None:
            log.info("gce: adopting our route %s, made before flannel marked its routes: a "
                     "marked route for %s stands beside it now, so the old one goes",
                     adopted.name, own)
            self._changed("routes.delete", "DELETE",
                          f"projects/{self.project}/global/routes/{adopted.name}")
            changes.append(RouteChange("delete", table, str(own), me.rsplit("/", 1)[-1]))
            log.info("gce: %s", changes[-1])
        return changes

    def _insert(self, own: IPv4Network, table: str, me: str, taken: set[str]) -> RouteChange:
        name = route_name(own)
        if name in taken:  # held by a route we do not delete: the second name
            name += SECOND_NAME
        body = {"name": name, "destRange": str(own), "network": self.network_link,
                "nextHopInstance": self.instance_link, "priority": PRIORITY, "tags": [],
                "description": DESCRIPTION}
        try:
            self._changed("routes.insert", "POST", f"projects/{self.project}/global/routes",
                          body)
        except RouteLimit as full:
            raise _route_limit(self.project, table, own, str(full)) from None
        except GceApiError as error:
            if error.code == "quotaExceeded":
                raise _route_limit(self.project, table, own, str(error)) from None
            raise
        return RouteChange("create", table, str(own), me.rsplit("/", 1)[-1])


def _error_of(body: bytes) -> tuple[str, str]:
    """(the first error's reason, its message) of a Compute API error answer; empty when
    it cannot be read (the status then says it all)."""
    try:
        answer = boundedjson.loads(body[:_MAX_ERROR], what="an error answer",
                                   max_bytes=_MAX_ERROR, max_elements=1000)
    except JSONLimitError:
        return "", ""
    return error_detail(answer)
