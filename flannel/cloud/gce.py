"""The gce route engine: our subnet routed to this instance in the VPC network, through the
Compute Engine REST API (v1), as Go flannel's gce backend did before v0.20.

As Go: project, zone, instance and network from the metadata server; one route per subnet,
named ``flannel-<subnet with "." and "/" as "-">`` (``flannel-10-244-3-0-24``), destRange the
subnet, next hop this instance, priority 1000; a route of that name pointing elsewhere is
deleted and inserted again (routes are immutable); every insert and delete is an operation
polled through globalOperations.get until done (bounded). Beyond Go: ``reconcile()``
repairs our route and deletes routes of vanished leases, once two passes agree; throttled
calls (HTTP 429, ``rateLimitExceeded``, a rate quota) are retried with backoff; the route
quota is reported as a full route table. Ours are only routes named so, in our network,
whose next hop is an instance, for a subnet strictly inside the Network: anything else is
left alone. ``Project`` and ``Network`` override where the routes go (a Shared VPC's host
project and network); ``Endpoint`` the API's URL (a Private Service Connect endpoint).

Every method blocks (urllib, bounded in time and size) and is meant for a worker thread;
calls are serialised. Tokens are never logged. Must not touch: the store, the kernel.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network
from typing import Any

from flannel import boundedjson
from flannel.backenderrors import BackendConfigError
from flannel.boundedjson import JSONLimitError
from flannel.cloud.base import (
    NO_WAIT,
    ApiError,
    CloudError,
    RouteChange,
    RouteEngineBase,
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

log = logging.getLogger(__name__)

COMPUTE_API = "https://compute.googleapis.com"
ROUTE_PREFIX = "flannel-"
PRIORITY = 1000
#: Seconds one API request may take.
API_TIMEOUT = 10
#: How operations are waited on: polled every second, at most this many times at start (Go:
#: 100), and fewer in a data plane pass, whose worker thread every other pass waits behind.
OPERATION_POLLS = 60
PASS_OPERATION_POLLS = 10
#: Bounds on routes.list: entries per page (the API's maximum) and pages per pass.
_PAGE = 500
_MAX_PAGES = 40
_MAX_BODY = 8 * 1024 * 1024
_MAX_ERROR = 64 * 1024
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
                 sleep: Callable[[float], None] = time.sleep,
                 operation_polls: int = OPERATION_POLLS, poll_interval: float = 1.0) -> None:
        super().__init__(backoff, sleep)
        self.config = config
        self.metadata = metadata
        self.operation_polls = operation_polls
        self.poll_interval = poll_interval
        self.identity: GceIdentity | None = None
        self.project = ""
        self.network_link = ""
        self.instance_link = ""
        self._tokens: TokenSource | None = None
        self._opener = urllib.request.build_opener()

    # -- the REST calls -----------------------------------------------------------------

    def _request_once(self, action: str, method: str, path: str,
                      query: Mapping[str, str] | None = None,
                      body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One call; Throttled when Google says slow down, GceApiError when it refuses."""
        assert self._tokens is not None
        url = f"{self.config.endpoint}/compute/v1/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            headers = {"Authorization": f"Bearer {self._tokens.token()}",
                       "Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = "application/json"
            request = urllib.request.Request(url, data=data, method=method,  # noqa: S310
                                             headers=headers)
            try:
                with self._opener.open(request, timeout=API_TIMEOUT) as response:
                    raw = response.read(_MAX_BODY + 1)
            except urllib.error.HTTPError as error:
                status, reason, message = _error_of(error)
                if status == 401 and attempt == 1:
                    self._tokens.invalidate()  # expired or revoked: one fresh token
                    continue
                if status == 429 or reason in _THROTTLED or (
                        reason == "quotaExceeded" and "ROUTES" not in message):
                    raise Throttled(reason or str(status)) from None
                raise GceApiError(action, status, reason, message) from None
            except (OSError, ValueError) as error:
                raise CloudError(f"Compute Engine {action}: no answer from "
                                 f"{self.config.endpoint} within {API_TIMEOUT}s "
                                 f"({error})") from None
            if len(raw) > _MAX_BODY:
                raise CloudError(f"Compute Engine {action}: an answer over {_MAX_BODY} "
                                 "bytes; refusing it")
            try:
                answer = boundedjson.loads(raw or b"{}", what=f"Compute Engine {action}'s "
                                           "answer", max_bytes=_MAX_BODY)
            except JSONLimitError as error:
                raise CloudError(str(error)) from None
            if not isinstance(answer, dict):
                raise CloudError(f"Compute Engine {action}: the answer is not a JSON object")
            return answer
        raise AssertionError("unreachable")

    def _call(self, action: str, method: str, path: str,
              query: Mapping[str, str] | None = None,
              body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return self._retried(f"Compute Engine {action}",
                             lambda: self._request_once(action, method, path, query, body))

    def _wait(self, action: str, operation: Mapping[str, Any]) -> None:
        """Poll a global operation until DONE (bounded); its error is the call's error."""
        name = str(operation.get("name", ""))
        # A pass that must not wait out throttling must not wait long on an operation either.
        polls = self.operation_polls if self._retry is not NO_WAIT else \
            min(self.operation_polls, PASS_OPERATION_POLLS)
        for _ in range(polls):
            if operation.get("status") == "DONE":
                break
            if not _OPERATION.fullmatch(name):
                raise CloudError(f"Compute Engine {action}: an operation without a usable "
                                 f"name ({name[:60]!r})")
            self._sleep(self.poll_interval)
            # Not retried on its own: a throttled poll retries the whole change (``_changed``).
            operation = self._request_once(
                "globalOperations.get", "GET", f"projects/{self.project}/global/operations/{name}")
        else:
            if operation.get("status") != "DONE":
                raise CloudError(
                    f"Compute Engine {action}: operation {name} not done after "
                    f"{polls * self.poll_interval:.0f}s; the next "
                    "reconciliation looks at the route table again")
        errors = (operation.get("error") or {}).get("errors") or []
        if errors:
            first = errors[0] if isinstance(errors[0], dict) else {}
            code, message = str(first.get("code", "")), str(first.get("message", ""))
            if code == "QUOTA_EXCEEDED" and "ROUTES" in message:
                raise RouteLimit(message)
            if code in ("QUOTA_EXCEEDED", *_THROTTLED):
                raise Throttled(code)
            raise GceApiError(action, int(operation.get("httpErrorStatusCode") or 0), code,
                              message)

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
                self._tokens = key_file_tokens(self.config.key_file, API_TIMEOUT)
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
            self.network_link = str(found.get("selfLink", ""))
            self.instance_link = str(instance.get("selfLink", ""))
            if not self.network_link or not self.instance_link:
                raise CloudError("Compute Engine networks.get/instances.get answered without "
                                 "a selfLink")
            self._status.tables = [f"{self.project}/{network}"]
            self._status.target = identity.instance
            if not instance.get("canIpForward"):
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

    def _list_routes(self) -> list[dict[str, Any]]:
        routes: list[dict[str, Any]] = []
        # RE2 regular expressions, each matching a whole field; a network's link may carry
        # any host in front of its path.
        network = re.escape(_resource(self.network_link))
        query = {"filter": f'(name eq "{ROUTE_PREFIX}.*") (network eq ".*/{network}")',
                 "maxResults": str(_PAGE)}
        for _ in range(_MAX_PAGES):
            page = self._call("routes.list", "GET", f"projects/{self.project}/global/routes",
                              query)
            items = page.get("items") or []
            routes += [item for item in items if isinstance(item, dict)]
            token = page.get("nextPageToken")
            if not token:
                return routes
            query = {**query, "pageToken": str(token)[:1024]}
        raise CloudError(f"Compute Engine routes.list: more than {_MAX_PAGES * _PAGE} routes "
                         f"named {ROUTE_PREFIX}* in project {self.project}")

    def _ours(self, route: Mapping[str, Any]) -> IPv4Network | None:
        """The route's subnet when flannel owns the route, else None."""
        if not route.get("nextHopInstance") or \
                _resource(route.get("network")) != _resource(self.network_link):
            return None
        subnet = route_in_network(route.get("destRange"), self.config.network)
        if subnet is None or route.get("name") != route_name(subnet):
            return None
        return subnet

    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        table = self._status.tables[0]
        me = _resource(self.instance_link)
        doomed: list[tuple[str, IPv4Network, str]] = []
        ours = False
        if collect:
            self._orphans.begin()
        for route in self._list_routes():
            subnet = self._ours(route)
            if subnet is None:
                if route.get("name") == route_name(own):
                    raise CloudError(
                        f"a route named {route_name(own)} exists in project {self.project} "
                        "that is not flannel's (another network, or a next hop that is not "
                        "an instance); delete it so that flannel can route its subnet")
                continue
            target = _resource(route.get("nextHopInstance")).rsplit("/", 1)[-1]
            if subnet == own:
                if _resource(route.get("nextHopInstance")) == me:
                    ours = True
                else:  # pointed elsewhere: routes are immutable, so delete and insert
                    doomed.append((str(route["name"]), subnet, target))
            elif self._orphan(table, subnet, target, live, collect):
                doomed.append((str(route["name"]), subnet, target))
        if collect:
            self._orphans.end()
        changes: list[RouteChange] = []
        for name, subnet, target in doomed:
            self._changed("routes.delete", "DELETE",
                          f"projects/{self.project}/global/routes/{name}")
            changes.append(RouteChange("delete", table, str(subnet), target))
            log.info("gce: %s", changes[-1])
        if not ours:
            body = {"name": route_name(own), "destRange": str(own),
                    "network": self.network_link, "nextHopInstance": self.instance_link,
                    "priority": PRIORITY, "tags": []}
            try:
                self._changed("routes.insert", "POST",
                              f"projects/{self.project}/global/routes", body)
            except RouteLimit as full:
                raise _route_limit(self.project, table, own, str(full)) from None
            except GceApiError as error:
                if error.code == "quotaExceeded":
                    raise _route_limit(self.project, table, own, str(error)) from None
                raise
            changes.append(RouteChange("create", table, str(own),
                                       me.rsplit("/", 1)[-1]))
            log.info("gce: %s", changes[-1])
        return changes


def _error_of(error: urllib.error.HTTPError) -> tuple[int, str, str]:
    """(HTTP status, the first error's reason, its message) of a Compute API error answer
    (``{"error": {"code", "message", "errors": [{"reason", "message"}]}}``)."""
    try:
        answer = boundedjson.loads(error.read(_MAX_ERROR), what="an error answer",
                                   max_bytes=_MAX_ERROR)
        detail = answer["error"]
        first = (detail.get("errors") or [{}])[0]
        reason = str(first.get("reason", ""))[:80]
        message = str(detail.get("message") or first.get("message") or "")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, OSError):
        return error.code, "", str(error.reason)[:200]
    return error.code, reason, message[:300]
