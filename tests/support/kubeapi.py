"""A test double of the Kubernetes API server, for the subset flannel uses.

There is no kube-apiserver on these machines, so the kube subnet manager is tested against
this server. It speaks real HTTP/1.1 (keep-alive, chunked watch streams) and models, as the
real API server does:

- nodes (cluster-scoped) and pods (namespaced) as JSON objects; every write bumps one global
  resourceVersion (as etcd revisions do) and stamps it on the object; a node made by
  ``put_node`` gets its ``creationTimestamp`` (whole seconds, UTC) when it is created;
- ``GET /api/v1/nodes``: a NodeList whose ``metadata.resourceVersion`` is the current one;
  with ``limit=N`` at most N nodes (by name) and a ``metadata.continue`` token for the rest;
  ``continue=T`` goes on after T's last name, answering with T's resourceVersion, or 410
  ``Expired`` once the history holding that version is compacted (the real server keeps
  the whole list at that version; here later pages show the current nodes, which the watch
  from that version then corrects, as it would);
- ``GET /api/v1/nodes?watch=true&resourceVersion=N``: newline-delimited watch events
  (``ADDED``/``MODIFIED``/``DELETED``) for every change after N, then live ones; N older than
  the retained history gives one ``ERROR`` event carrying a ``Status`` with code 410, reason
  ``Expired`` ("too old resource version"), and the stream ends; without N, synthetic
  ``ADDED`` events for every current node come first; ``timeoutSeconds`` ends the stream;
- ``GET /api/v1/nodes/<name>`` and ``GET /api/v1/namespaces/<ns>/pods/<name>``, with a 404
  ``Status`` (reason ``NotFound``) for unknown objects;
- ``GET /api/v1/nodes/<name>/status``: the whole node, as the status subresource answers;
- discovery: ``/api``, ``/apis`` and ``/api/v1`` (nodes, nodes/status, pods), the legacy
  documents a client asking for aggregated discovery falls back to (kubectl maps
  ``nodes`` to its path with them);
- ``PATCH /api/v1/nodes/<name>/status`` with ``application/strategic-merge-patch+json``:
  maps (``metadata.annotations``, ``metadata.labels``) merge key by key (null deletes),
  ``status.conditions`` merges by its patch merge key ``type``, other fields are replaced;
  other patch types get 415.

Served over TLS (``start(tls=...)``, an ``ssl.SSLContext`` that may require client
certificates) and with an ``Authorization`` header required when ``authorization`` is set, a
client certificate of that common name when ``client_common_name`` is set (as the server
maps a certificate to a user): anything else gets 401 ``Unauthorized`` as a ``Status``.
``fail_next`` queues error ``Status`` answers for the next requests (429, 5xx, 403...),
``refuse_patches`` answers every node status patch with one error ``Status`` while it is set
(the other requests go on: a webhook or an RBAC rule refusing writes only), ``hostile``
answers the requests it picks with whatever bytes it yields instead (a server or proxy gone
wrong: huge, dripping, redirecting, of the wrong shape), then closes the connection,
``truncate_next`` closes the connection halfway through the next response body,
``header_padding`` adds a header of that many bytes to every answer, ``chunk_size`` cuts
watch events across chunks (as a proxy may), ``stall_watches`` makes watch streams outlive
their ``timeoutSeconds`` silently (as a stuck proxy would), ``expire_watches`` answers every
watch with the 410 ``ERROR`` event (as a server whose history is always too short for the
client), and ``path_prefix`` serves the API under a path (as Rancher's proxy does at
``/k8s/clusters/<id>``: requests outside it get 404, and ``url`` includes it).

Each event is serialized once and shared by every watch stream; a stream writes with flow
control (a slow reader slows its own stream only) and ends when its client goes away.

Not modelled: RBAC, other resources and verbs over HTTP, label/field selectors, bookmarks,
a bounded watch cache, aggregated discovery, OpenAPI, server-side Table printing (kubectl
prints nodes from their JSON instead). tests/integration/test_kubectl_double.py drives the
double with kubectl, so it answers get, paginated list, watch and status patch as a real
API server does. Tests change nodes through the Python methods (``put_node`` with pod
CIDRs, annotations and status conditions, ``put_raw_node`` for any object,
``remove_annotations``, ``delete_node``;
synchronous, so a test can change several things with no watcher running in between),
compact the history (``compact``) and cut watch streams (``cut_watches``);
``python -m tests.support.kubeapi`` runs it standalone (nodes, pods, a bearer token, TLS),
for the lab and for a flanneld that runs in another network namespace or an image.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import contextlib
import copy
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


def _resource(name: str, kind: str, namespaced: bool, verbs: list[str]) -> dict[str, Any]:
    return {"name": name, "singularName": "" if "/" in name else kind.lower(),
            "namespaced": namespaced, "kind": kind, "verbs": verbs}


#: The legacy (unaggregated) discovery documents of the core group: what a client such as
#: kubectl reads to map "nodes" to a path; a request for aggregated discovery falls back
#: to them, as against a server that does not serve it.
_DISCOVERY: dict[str, dict[str, Any]] = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1:6443"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("nodes", "Node", False, ["get", "list", "patch", "watch"]),
        _resource("nodes/status", "Node", False, ["get", "patch"]),
        _resource("pods", "Pod", True, ["get"]),
    ]},
}


def _common_name(writer: asyncio.StreamWriter) -> str | None:
    subject = (writer.get_extra_info("peercert") or {}).get("subject", ())
    return next((value for rdn in subject for key, value in rdn if key == "commonName"), None)


def _event_line(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def strategic_merge(target: dict[str, Any], patch: dict[str, Any], path: str = "") -> None:
    for key, value in patch.items():
        here = f"{path}.{key}" if path else key
        if value is None:
            target.pop(key, None)
        elif here == "status.conditions" and isinstance(value, list):
            merged = {c.get("type"): c for c in target.get(key) or []}
            for condition in value:
                merged[condition.get("type")] = {**merged.get(condition.get("type"), {}),
                                                 **condition}
            target[key] = list(merged.values())
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            strategic_merge(target[key], value, here)
        else:
            target[key] = copy.deepcopy(value)


class FakeKubeAPI:
    def __init__(self) -> None:
        self.rv = 1
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        # (resourceVersion, the watch event line): serialized once, shared by every watch.
        self.history: list[tuple[int, bytes]] = []
        self.oldest = 1  # watches from before this resourceVersion get 410
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[str] = []
        self._changed = asyncio.Condition()
        self._notify_pending = False
        self._watch_writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.tls: ssl.SSLContext | None = None
        #: The Authorization header every request must carry (None: no authentication).
        self.authorization: str | None = None
        #: The CN the client certificate must carry (None: any the TLS context accepts).
        self.client_common_name: str | None = None
        #: (code, message) error answers for the next requests, in order.
        self.fail_next: list[tuple[int, str]] = []
        self.truncate_next = 0
        self.header_padding = 0  # bytes of an extra X-Padding header on every answer
        self.connections = 0  # connections accepted
        self.chunk_size = 0  # >0: watch events are cut into chunks of this many bytes
        self.stall_watches = False  # watch streams ignore timeoutSeconds (a stuck proxy)
        self.expire_watches = False  # every watch gets 410 Expired at once
        self.request_times: list[float] = []  # loop time of each entry of ``requests``
        self.host_headers: list[str] = []  # the Host header of each entry of ``requests``
        self.path_prefix = ""  # e.g. "/k8s/clusters/c-abc": the API is served under it
        #: (code, message) answered to every node status patch while set.
        self.refuse_patches: tuple[int, str] | None = None
        #: Given (method, path without the prefix, query), the raw bytes to answer instead
        #: (the connection is closed after them), or None to answer as the server would.
        self.hostile: Callable[[str, str, dict[str, str]], AsyncIterator[bytes] | None] | \
            None = None

    # -- test controls ------------------------------------------------------------------

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        if isinstance(obj.get("metadata"), dict):
            obj["metadata"]["resourceVersion"] = str(self.rv)
        self.history.append((self.rv, _event_line(kind, obj)))
        if not self._notify_pending:  # one wake-up for a burst of writes
            self._notify_pending = True
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        self._notify_pending = False
        async with self._changed:
            self._changed.notify_all()

    def put_node(self, name: str, pod_cidrs: list[str] | None = None,
                 annotations: dict[str, str] | None = None,
                 conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Create or change a node; ``annotations`` and ``conditions`` (by ``type``) merge
        into what the node has, as the API server's strategic merge does."""
        existing = name in self.nodes
        node = self.nodes.get(name) or {
            "kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": f"uid-{name}", "annotations": {},
                         "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())},
            "spec": {}, "status": {"conditions": []}}
        if pod_cidrs is not None:
            node["spec"]["podCIDR"] = pod_cidrs[0] if pod_cidrs else ""
            node["spec"]["podCIDRs"] = list(pod_cidrs)
        if annotations is not None:
            node["metadata"]["annotations"].update(annotations)
        if conditions is not None:
            strategic_merge(node, {"status": {"conditions": conditions}})
        self.nodes[name] = node
        self._record("MODIFIED" if existing else "ADDED", node)
        return node

    def put_raw_node(self, name: str, node: dict[str, Any]) -> None:
        """Store ``node`` as it is, whatever its fields hold (the API server's schema checks
        are what a hostile or buggy writer gets around; flanneld must cope regardless)."""
        existing = name in self.nodes
        self.nodes[name] = node
        self._record("MODIFIED" if existing else "ADDED", node)

    def remove_annotations(self, name: str, *keys: str) -> None:
        """Remove annotations from a node (as ``kubectl annotate node <name> <key>-``)."""
        node = self.nodes[name]
        for key in keys:
            node["metadata"]["annotations"].pop(key, None)
        self._record("MODIFIED", node)

    def delete_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        self._record("DELETED", node)

    def put_pod(self, namespace: str, name: str, node_name: str) -> None:
        self.pods[(namespace, name)] = {"kind": "Pod", "apiVersion": "v1",
                                        "metadata": {"name": name, "namespace": namespace},
                                        "spec": {"nodeName": node_name, "containers": [
                                            {"name": "kube-flannel", "image": "pyflannel"}]}}

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does (old watches get 410)."""
        self.history.clear()
        self.oldest = self.rv + 1

    def cut_watches(self) -> None:
        for writer in list(self._watch_writers):
            writer.transport.abort()

    # -- HTTP -------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0,
                    tls: ssl.SSLContext | None = None,
                    sock: socket.socket | None = None) -> None:
        """Listen on ``host``:``port``, or on ``sock`` (e.g. bound inside a test's network
        namespace, so that a flanneld process there reaches this double)."""
        self.tls = tls
        if sock is not None:
            self._server = await asyncio.start_server(self._connection, sock=sock, ssl=tls)
        else:
            self._server = await asyncio.start_server(self._connection, host, port, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{self.path_prefix}"

    async def stop(self) -> None:
        self.cut_watches()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, target, _ = line.decode().split(" ", 2)
                headers = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    key, _, value = header.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests.append(f"{method} {target}")
                self.request_times.append(asyncio.get_running_loop().time())
                self.host_headers.append(headers.get("host", ""))
                url = urlsplit(target)
                outside = not url.path.startswith(self.path_prefix + "/")
                url = url._replace(path=url.path[len(self.path_prefix):])
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                if outside:
                    code, doc = 404, _status(404, "NotFound", f"nothing at {target}")
                elif (self.authorization is not None and
                      headers.get("authorization") != self.authorization) or \
                        (self.client_common_name is not None and
                         _common_name(writer) != self.client_common_name):
                    code, doc = 401, _status(401, "Unauthorized", "Unauthorized")
                elif self.hostile is not None and \
                        (raw := self.hostile(method, url.path, query)) is not None:
                    async for data in raw:
                        if writer.is_closing():
                            break
                        writer.write(data)
                        await writer.drain()
                    return
                elif self.fail_next:
                    failure, message = self.fail_next.pop(0)
                    code, doc = failure, _status(failure, "Failure", message)
                elif method == "GET" and url.path == "/api/v1/nodes" and \
                        query.get("watch") in ("true", "1"):
                    await self._watch(writer, query)
                    return
                else:
                    code, doc = await self._handle(method, url.path, query, headers, body)
                data = json.dumps(doc).encode()
                padding = f"X-Padding: {'x' * self.header_padding}\r\n" \
                    if self.header_padding else ""
                writer.write(f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
                             f"Content-Type: application/json\r\n"
                             f"{padding}Content-Length: {len(data)}\r\n\r\n".encode())
                if self.truncate_next:
                    self.truncate_next -= 1
                    writer.write(data[:len(data) // 2])
                    await writer.drain()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, ssl.SSLError,
                asyncio.CancelledError):
            return  # a client went away, or the server is shutting down
        finally:
            writer.close()

    def _list(self, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        names = sorted(self.nodes)
        version = self.rv
        if query.get("continue"):
            token = json.loads(base64.urlsafe_b64decode(query["continue"]))
            version = token["rv"]
            if version < self.oldest - 1:
                return 410, _status(410, "Expired", "The provided continue parameter is too "
                                    "old to display a consistent list result. You can start a "
                                    "new list without the continue parameter.")
            names = [n for n in names if n > token["after"]]
        limit = int(query.get("limit") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if 0 < limit < len(names):
            names = names[:limit]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": version, "after": names[-1]}).encode()).decode()
        return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": meta,
                     "items": [copy.deepcopy(self.nodes[n]) for n in names]}

    async def _handle(self, method: str, path: str, query: dict[str, str],
                      headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if method == "GET" and path in _DISCOVERY:
            return 200, _DISCOVERY[path]
        if method == "GET" and path == "/api/v1/nodes":
            return self._list(query)
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) >= 4:
            name = parts[3]
            if name not in self.nodes:
                return 404, _status(404, "NotFound", f'nodes "{name}" not found')
            if method == "GET" and parts[4:] in ([], ["status"]):  # status: the whole node
                return 200, copy.deepcopy(self.nodes[name])
            if method == "PATCH" and parts[4:] == ["status"] and self.refuse_patches:
                code, message = self.refuse_patches
                return code, _status(code, "Failure", message)
            if method == "PATCH" and parts[4:] == ["status"]:
                if headers.get("content-type") != "application/strategic-merge-patch+json":
                    return 415, _status(415, "UnsupportedMediaType",
                                        "the body of the request was in an unknown format")
                patch = json.loads(body)
                self.patches.append((name, patch))
                strategic_merge(self.nodes[name], patch)
                self._record("MODIFIED", self.nodes[name])
                return 200, copy.deepcopy(self.nodes[name])
        if method == "GET" and parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 \
                and parts[4] == "pods":
            pod = self.pods.get((parts[3], parts[5]))
            if pod is None:
                return 404, _status(404, "NotFound", f'pods "{parts[5]}" not found')
            return 200, copy.deepcopy(pod)
        return 404, _status(404, "NotFound", f"the server could not find {method} {path}")

    async def _watch(self, writer: asyncio.StreamWriter, query: dict[str, str]) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        self._watch_writers.add(writer)

        def send(line: bytes) -> None:
            if writer.is_closing():  # the client went away: the loop below ends the stream
                return
            step = self.chunk_size or len(line)
            for start in range(0, len(line), step):
                piece = line[start:start + step]
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")

        try:
            since = int(query.get("resourceVersion") or 0)
            timeout = float(query.get("timeoutSeconds") or 3600)
            if self.stall_watches:
                timeout = 3600
            if since == 0:
                for node in self.nodes.values():
                    send(_event_line("ADDED", node))
                since = self.rv
            elif since < self.oldest - 1 or self.expire_watches:
                send(_event_line("ERROR", _status(
                    410, "Expired", f"too old resource version: {since} ({self.oldest})")))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                return
            deadline = asyncio.get_running_loop().time() + timeout
            while not writer.is_closing():  # the client went away: end this stream
                start = bisect.bisect_right(self.history, since, key=lambda entry: entry[0])
                for sent, (rv, line) in enumerate(self.history[start:], 1):
                    send(line)
                    since = rv
                    if sent % 256 == 0:  # flow control: a slow reader slows this stream only
                        await writer.drain()
                await writer.drain()
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                async with self._changed:
                    if self.history and self.history[-1][0] > since:
                        continue  # written while this stream was draining
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._changed.wait(), remaining)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._watch_writers.discard(writer)


async def _serve(args: argparse.Namespace) -> None:
    api = FakeKubeAPI()
    for spec in args.node:
        name, _, cidrs = spec.partition("=")
        api.put_node(name, cidrs.split(","))
    for spec in args.pod:
        pod, _, node = spec.partition("=")
        namespace, _, name = pod.partition("/")
        api.put_pod(namespace, name, node)
    if args.token:
        api.authorization = f"Bearer {args.token}"
    tls = None
    if args.tls_cert:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(args.tls_cert, args.tls_key)
    await api.start(args.host, args.port, tls=tls)
    print(f"listening on {args.host}:{api.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description="a test double of the Kubernetes API server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--node", action="append", default=[],
                        help="NAME=CIDR[,CIDR]: a node and its pod CIDRs")
    parser.add_argument("--pod", action="append", default=[],
                        help="NAMESPACE/NAME=NODE: a pod and the node it runs on")
    parser.add_argument("--token", help="the bearer token every request must carry")
    parser.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-key", help="the certificate's key (PEM)")
    args = parser.parse_args()
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()


def kubelet_node(name: str, pod_cidr: str, address: str, *, images: int = 50,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as a kubelet on a working node registers and reports it (v1.30, kubeadm,
    containerd): labels, annotations, the managedFields of its four writers, capacity,
    conditions, addresses, node info and ``images`` images (the kubelet reports at most 50,
    ``--node-status-max-images``), each with a digest and a tag. For sizing what the API
    server sends: no field of it matters to flanneld but the pod CIDRs and annotations."""
    stamp = "2026-12-07T05:00:00Z"
    fields = {"f:metadata": {"f:annotations": {".": {}, "f:node.alpha.kubernetes.io/ttl": {}},
                             "f:labels": {f"f:{k}": {} for k in (
                                 "beta.kubernetes.io/arch", "beta.kubernetes.io/os",
                                 "kubernetes.io/arch", "kubernetes.io/hostname",
                                 "kubernetes.io/os")}},
              "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, f'v:"{pod_cidr}"': {}}}}
    conditions = [{"type": kind, "status": status, "lastHeartbeatTime": stamp,
                   "lastTransitionTime": stamp, "reason": reason, "message": message}
                  for kind, status, reason, message in (
                      ("MemoryPressure", "False", "KubeletHasSufficientMemory",
                       "kubelet has sufficient memory available"),
                      ("DiskPressure", "False", "KubeletHasNoDiskPressure",
                       "kubelet has no disk pressure"),
                      ("PIDPressure", "False", "KubeletHasSufficientPID",
                       "kubelet has sufficient PID available"),
                      ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                      ("NetworkUnavailable", "False", "FlannelIsUp",
                       "Flannel is running on this node"))]
    return {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": f"4f7c1a2e-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
            "resourceVersion": "1", "creationTimestamp": stamp,
            "labels": {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
                       "kubernetes.io/os": "linux",
                       "node.kubernetes.io/instance-type": "n2-standard-8",
                       "topology.kubernetes.io/region": "europe-west1",
                       "topology.kubernetes.io/zone": "europe-west1-b"},
            "annotations": {"kubeadm.alpha.kubernetes.io/cri-socket":
                            "unix:///var/run/containerd/containerd.sock",
                            "node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                            **(annotations or {})},
            "managedFields": [{"manager": manager, "operation": "Update", "apiVersion": "v1",
                               "time": stamp, "fieldsType": "FieldsV1",
                               "fieldsV1": fields, **({"subresource": "status"}
                                                      if manager != "kubeadm" else {})}
                              for manager in ("kubeadm", "kube-controller-manager",
                                              "flanneld", "kubelet")]},
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
                 "providerID": f"gce://project/europe-west1-b/{name}"},
        "status": {
            "capacity": {"cpu": "8", "ephemeral-storage": "101203880Ki",
                         "hugepages-1Gi": "0", "hugepages-2Mi": "0", "memory": "32863840Ki",
                         "pods": "110"},
            "allocatable": {"cpu": "8", "ephemeral-storage": "93268125085",
                            "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                            "memory": "32761440Ki", "pods": "110"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": address},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "9f1c" * 8, "systemUUID": "4c4c4544-0042-3510-8052-b7c04f"
                         "563232", "bootID": "0b8e" * 8, "kernelVersion": "6.1.0-28-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.30.8", "kubeProxyVersion": "v1.30.8",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": [{"names": [f"registry.example.com/team-{i % 7}/service-{i}@sha256:"
                                  + f"{i:064x}", f"registry.example.com/team-{i % 7}/"
                                  f"service-{i}:v1.{i}.0"],
                        "sizeBytes": 10_000_000 + 7919 * i} for i in range(images)]}}
