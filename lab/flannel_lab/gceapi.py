"""A test double of Google Compute Engine for the gce backend: the Compute Engine API (v1) calls
it makes, the metadata server of each instance, and the OAuth 2.0 token endpoint. There is no
emulator of Compute Engine to run here; the lab serves this double to its nodes and the tests
use it (``tests/support/gceapi.py``).

Modelled from the public Compute Engine API reference (cloud.google.com/compute/docs/reference
/rest/v1): ``routes.list`` (``GET /compute/v1/projects/{p}/global/routes`` with ``filter`` in
the ``field eq "RE2 regex"`` form, parenthesised terms ANDed, Python's ``re`` standing in for
RE2; ``maxResults`` and ``pageToken``), ``routes.insert`` (``POST``, the body's ``name``,
``network``, ``destRange``, ``nextHopInstance``, ``priority``, ``tags``, ``description``; 409
``alreadyExists``), ``routes.delete`` (404 ``notFound``), ``networks.get``, ``instances.get``
(``selfLink``, ``canIpForward``) and ``globalOperations.get``; writes answer a
``compute#operation`` that is ``RUNNING`` for ``pending_polls`` reads, then ``DONE``, with an
``error.errors[]`` of ``{code, message}`` when it failed. Errors are ``{"error": {"code",
"message", "errors": [{"message", "domain", "reason"}]}}``: 401 without a valid bearer token,
403 ``quotaExceeded`` ("Quota 'ROUTES' exceeded") past ``route_limit`` (in the operation
instead with ``limit_in_operation``), and whatever ``fail(action, status, reason, times)``
queues (429/403 ``rateLimitExceeded``); ``op_fail(code, message, times)`` makes the next
inserts' operations fail; ``garble(action, status, body, times)`` answers ``body`` verbatim
instead, and ``answer_with(action, behaviour, times)`` with any answer of
``flannel_lab.hostile`` (a broken or hostile server: huge, dripping, reset, redirected...; the
metadata server's paths too); ``delay`` holds every API answer back (a timeout). The metadata
server (from the metadata server documentation: ``/computeMetadata/v1/...`` only with
``Metadata-Flavor: Google``, answered with that header, 403 otherwise) serves
``project/project-id``, ``instance/zone`` (``projects/<number>/zones/<zone>``),
``instance/name``, ``instance/hostname``, ``instance/network-interfaces/0/network`` and
``instance/service-accounts/default/token`` (``{access_token, expires_in, token_type}``);
``paths`` overrides any of them. The token endpoint (``POST /token``, from Google's OAuth 2.0
for service accounts documentation) takes
``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`` and an RS256 ``assertion`` whose
signature it verifies with the registered key's public half (google-auth). Not modelled: IAM
permissions, route conflicts other than a name, routes appearing only when their operation
ends, zonal operations, the list's ``orderBy``, other filter operators.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flannel.kernel.host import LOCAL, Host
from flannel_lab import hostile
from flannel_lab.hostile import Behaviour, Queued
from flannel_lab.served import endpoint, serve, shut

PROJECT_NUMBER = "123456789012"
_LINK = "https://www.googleapis.com/compute/v1/"
_TERM = re.compile(r'\(?\s*([A-Za-z.]+)\s+(eq|ne)\s+(?:"([^"]*)"|\'([^\']*)\'|(\S+?))\s*\)?')


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def body(self) -> dict[str, Any]:
        domain = "usageLimits" if self.status in (403, 429) else "global"
        return {"error": {"code": self.status, "message": self.message, "errors": [
            {"message": self.message, "domain": domain, "reason": self.reason}]}}


class _Behave(Exception):
    """An answer queued by ``answer_with``: the behaviour writes it (outside the lock)."""

    def __init__(self, behaviour: Behaviour) -> None:
        super().__init__("behaviour")
        self.behaviour = behaviour


class _Json(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def answer(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class FakeCompute:
    """One project's Compute Engine: networks, instances, routes, operations, tokens."""

    def __init__(self, project: str = "flannel-lab") -> None:
        self.project = project
        self.networks: dict[str, dict[str, Any]] = {}
        self.instances: dict[str, dict[str, Any]] = {}
        self.routes: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.route_limit: int | None = None
        self.limit_in_operation = False
        self.pending_polls = 1
        self.delay = 0.0
        self.tokens: set[str] = set()
        self.keys: dict[str, tuple[str, str]] = {}  # key id -> (client email, public PEM)
        self.actions: list[str] = []
        self._faults: dict[str, list[tuple[int, str]]] = {}
        self._op_faults: list[tuple[str, str]] = []
        self._behaviours = Queued()
        self._ids = itertools.count(1000)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{endpoint(self._server)}"

    # --- state, for tests --------------------------------------------------------------

    def link(self, path: str) -> str:
        return f"{_LINK}projects/{self.project}/{path}"

    def add_network(self, name: str) -> str:
        self.networks[name] = {"kind": "compute#network", "id": str(next(self._ids)),
                               "name": name, "selfLink": self.link(f"global/networks/{name}"),
                               "autoCreateSubnetworks": True}
        return self.networks[name]["selfLink"]

    def add_instance(self, zone: str, name: str, can_ip_forward: bool = True,
                     address: str = "", network: str = "") -> str:
        self.instances[f"{zone}/{name}"] = {
            "kind": "compute#instance", "id": str(next(self._ids)), "name": name,
            "zone": self.link(f"zones/{zone}"), "status": "RUNNING",
            "canIpForward": can_ip_forward,
            "networkInterfaces": [{"name": "nic0", "network": network, "networkIP": address}],
            "selfLink": self.link(f"zones/{zone}/instances/{name}")}
        return self.instances[f"{zone}/{name}"]["selfLink"]

    def add_route(self, name: str, dest: str, network: str, **next_hop: str) -> None:
        """A route made outside flannel (``nextHopInstance=...``, ``nextHopGateway=...``)."""
        with self._lock:
            self._insert({"name": name, "destRange": dest, "network": network, **next_hop,
                          "priority": 1000})

    def table(self) -> tuple[list[dict[str, Any]], dict[str, str]]:
        """Every route, and each instance's selfLink -> its first interface's address."""
        with self._lock:
            return ([dict(r) for r in self.routes.values()],
                    {i["selfLink"]: i["networkInterfaces"][0]["networkIP"]
                     for i in self.instances.values()})

    def delete_route(self, name: str) -> None:
        """Delete a route, as an operator in the console does."""
        with self._lock:
            self.routes.pop(name, None)

    def issue_token(self) -> str:
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        self.tokens.add(token)
        return token

    def fail(self, action: str, status: int, reason: str, times: int = 1) -> None:
        with self._lock:
            self._faults.setdefault(action, []).extend([(status, reason)] * times)

    def op_fail(self, code: str, message: str, times: int = 1) -> None:
        with self._lock:
            self._op_faults.extend([(code, message)] * times)

    def garble(self, action: str, status: int, body: str, times: int = 1) -> None:
        self.answer_with(action, hostile.verbatim(status, body), times)

    def answer_with(self, action: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """Answer the next ``times`` calls of ``action`` (every one: None) with
        ``behaviour`` (``flannel_lab.hostile``) instead; ``calm()`` undoes it."""
        with self._lock:
            self._behaviours.add(action, behaviour, times)

    def calm(self) -> None:
        with self._lock:
            self._behaviours.clear()

    # --- the API -----------------------------------------------------------------------

    def _insert(self, body: dict[str, Any]) -> dict[str, Any]:
        route = {"kind": "compute#route", "id": str(next(self._ids)),
                 "creationTimestamp": "2026-01-01T00:00:00.000-07:00", "tags": [],
                 **body, "selfLink": self.link(f"global/routes/{body['name']}")}
        self.routes[body["name"]] = route
        return route

    def _operation(self, kind: str, target: str, error: tuple[str, str] | None = None
                   ) -> dict[str, Any]:
        number = next(self._ids)
        name = f"operation-{number}-{secrets.token_hex(4)}"
        operation = {"kind": "compute#operation", "id": str(number), "name": name,
                     "operationType": kind, "targetLink": target, "status": "RUNNING",
                     "progress": 0, "user": "flannel@example.iam.gserviceaccount.com",
                     "insertTime": "2026-01-01T00:00:00.000-07:00",
                     "selfLink": self.link(f"global/operations/{name}"), "_polls": 0}
        if error is not None:
            operation["error"] = {"errors": [{"code": error[0], "message": error[1]}]}
            operation["httpErrorStatusCode"] = 403 if error[0] == "QUOTA_EXCEEDED" else 400
        self.operations[name] = operation
        return self._shown(operation)

    def _shown(self, operation: dict[str, Any]) -> dict[str, Any]:
        if operation["_polls"] >= self.pending_polls:
            operation.update(status="DONE", progress=100)
        return {k: v for k, v in operation.items() if not k.startswith("_")}

    def _route_write(self, body: dict[str, Any]) -> dict[str, Any]:
        for name in ("name", "network", "destRange"):
            if not isinstance(body.get(name), str):
                raise ApiError(400, "required", f"Required field '{name}' not specified")
        if body["name"] in self.routes:
            raise ApiError(409, "alreadyExists", f"The resource '{self._path('routes', body)}"
                                                 "' already exists")
        full = self.route_limit is not None and len(self.routes) >= self.route_limit
        message = f"Quota 'ROUTES' exceeded.  Limit: {float(self.route_limit or 0)} globally."
        if full and not self.limit_in_operation:
            raise ApiError(403, "quotaExceeded", message)
        error = ("QUOTA_EXCEEDED", message) if full else \
            (self._op_faults.pop(0) if self._op_faults else None)
        target = self.link(f"global/routes/{body['name']}")
        if error is None:
            self._insert({k: body[k] for k in ("name", "network", "destRange", "priority",
                                               "tags", "nextHopInstance", "nextHopGateway",
                                               "nextHopIp", "description") if k in body})
        return self._operation("insert", target, error)

    def _path(self, kind: str, body: dict[str, Any]) -> str:
        return f"projects/{self.project}/global/{kind}/{body.get('name')}"

    def _list(self, query: dict[str, str]) -> dict[str, Any]:
        routes = sorted(self.routes.values(), key=lambda r: r["name"])
        for field, op, *values in _TERM.findall(query.get("filter", "")):
            pattern = re.compile(next((v for v in values if v), ""))
            routes = [r for r in routes
                      if bool(pattern.fullmatch(str(r.get(field, "")))) == (op == "eq")]
        size = min(int(query.get("maxResults", "500")), 500)
        start = int(query.get("pageToken", "0") or 0)
        answer: dict[str, Any] = {"kind": "compute#routeList", "id": f"projects/{self.project}"
                                  "/global/routes", "items": routes[start:start + size],
                                  "selfLink": self.link("global/routes")}
        if start + size < len(routes):
            answer["nextPageToken"] = str(start + size)
        return answer

    def _handle(self, method: str, path: str, query: dict[str, str], headers: Any,
                body: bytes) -> dict[str, Any]:
        token = headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.tokens:
            raise ApiError(401, "authError", "Request had invalid authentication credentials.")
        prefix = f"/compute/v1/projects/{self.project}/"
        if not path.startswith(prefix):
            raise ApiError(404, "notFound", f"The resource '{path}' was not found")
        rest = path[len(prefix):].split("/")
        action = {("GET", 2): "routes.list", ("POST", 2): "routes.insert",
                  ("DELETE", 3): "routes.delete"}.get((method, len(rest))) \
            if rest[:2] == ["global", "routes"] else \
            "networks.get" if rest[:2] == ["global", "networks"] and len(rest) == 3 else \
            "globalOperations.get" if rest[:2] == ["global", "operations"] else \
            "instances.get" if rest[0] == "zones" and len(rest) == 4 else None
        if action is None:
            raise ApiError(404, "notFound", f"The resource '{path}' was not found")
        self.actions.append(action)
        behaviour = self._behaviours.take(action)
        if behaviour is not None:
            raise _Behave(behaviour)
        queued = self._faults.get(action)
        if queued:
            status, reason = queued.pop(0)
            raise ApiError(status, reason, f"injected {reason}")
        if action == "routes.list":
            return self._list(query)
        if action == "routes.insert":
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                raise ApiError(400, "parseError", "Parse Error") from None
            return self._route_write(request)
        found = {"routes.delete": self.routes, "networks.get": self.networks,
                 "instances.get": self.instances,
                 "globalOperations.get": self.operations}[action]
        key = f"{rest[1]}/{rest[3]}" if action == "instances.get" else rest[2]
        if key not in found:
            raise ApiError(404, "notFound", f"The resource '{path[len('/compute/v1/'):]}' "
                                            "was not found")
        if action == "routes.delete":
            del self.routes[key]
            return self._operation("delete", self.link(f"global/routes/{key}"))
        if action == "globalOperations.get":
            found[key]["_polls"] += 1
            return self._shown(found[key])
        return dict(found[key])

    def _exchange(self, form: dict[str, str]) -> dict[str, Any]:
        """The token endpoint: a JWT bearer grant, verified with the registered key."""
        from google.auth import jwt  # the test extra has google-auth

        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            raise ApiError(400, "unsupported_grant_type", "Invalid grant_type")
        try:
            header = jwt.decode_header(form.get("assertion", ""))
            email, public = self.keys[header.get("kid", "")]
            claims = jwt.decode(form["assertion"], certs={header["kid"]: public},
                                audience=f"{self.url}/token")
        except (ValueError, KeyError):
            raise ApiError(400, "invalid_grant", "Invalid JWT Signature.") from None
        if claims.get("iss") != email or "compute" not in str(claims.get("scope")):
            raise ApiError(400, "invalid_scope", "Invalid OAuth scope or ID token audience "
                                                 "provided.")
        return {"access_token": self.issue_token(), "expires_in": 3599,
                "token_type": "Bearer"}

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> FakeCompute:
        """Serve on ``address`` (a free port) in ``host``'s network namespace."""
        double = self

        class Handler(_Json):
            def _serve(self, method: str) -> None:
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query))
                body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
                if double.delay:
                    time.sleep(double.delay)
                try:
                    if method == "POST" and parts.path == "/token":
                        form = dict(urllib.parse.parse_qsl(body.decode()))
                        with double._lock:
                            return self.answer(200, double._exchange(form))
                    with double._lock:
                        answer = double._handle(method, parts.path, query, self.headers, body)
                except _Behave as queued:
                    return queued.behaviour(self)
                except ApiError as error:
                    if parts.path == "/token":
                        return self.answer(error.status, {"error": error.reason,
                                                          "error_description": error.message})
                    return self.answer(error.status, error.body())
                self.answer(200, answer)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)


def metadata_paths(compute: FakeCompute, zone: str, instance: str, network: str
                   ) -> dict[str, str]:
    """What an instance's metadata server says, as Compute Engine writes it."""
    return {"project/project-id": compute.project,
            "project/numeric-project-id": PROJECT_NUMBER,
            "instance/zone": f"projects/{PROJECT_NUMBER}/zones/{zone}",
            "instance/name": instance,
            "instance/hostname": f"{instance}.{zone}.c.{compute.project}.internal",
            "instance/network-interfaces/0/network":
                f"projects/{PROJECT_NUMBER}/networks/{network}"}


class FakeGceMetadata:
    """One instance's metadata server; its tokens are ``compute``'s."""

    def __init__(self, compute: FakeCompute, paths: dict[str, str]) -> None:
        self.compute = compute
        self.paths = dict(paths)
        self.flavor = True  # False: answers lack Metadata-Flavor (not the metadata server)
        self.requests: list[str] = []
        self._behaviours = Queued()
        self._server: ThreadingHTTPServer | None = None

    @property
    def host(self) -> str:
        """What ``GCE_METADATA_HOST`` is set to: host:port."""
        return endpoint(self._server)

    def answer_with(self, path: str, behaviour: Behaviour, times: int | None = 1) -> None:
        """Answer the next ``times`` GETs of ``path`` (every one: None) with ``behaviour``."""
        self._behaviours.add(path, behaviour, times)

    def start(self, address: str = "127.0.0.1", host: Host = LOCAL) -> FakeGceMetadata:
        double = self

        class Handler(_Json):
            def do_GET(self) -> None:
                double.requests.append(self.path)
                headers = {"Metadata-Flavor": "Google"} if double.flavor else {}
                if self.headers.get("Metadata-Flavor") != "Google":
                    return self.answer(403, "Missing Metadata-Flavor:Google header.", headers)
                path = self.path.removeprefix("/computeMetadata/v1/")
                behaviour = double._behaviours.take(path)
                if behaviour is not None:
                    return behaviour(self)
                if self.path.startswith("/computeMetadata/v1/") and path in double.paths:
                    return self.answer(200, double.paths[path],
                                       {**headers, "Content-Type": "application/text"})
                if path == "instance/service-accounts/default/token":
                    return self.answer(200, {"access_token": double.compute.issue_token(),
                                             "expires_in": 3599, "token_type": "Bearer"},
                                       headers)
                self.answer(404, "Not Found", headers)

        self._server = serve(Handler, address, host)
        return self

    def stop(self) -> None:
        shut(self._server)
