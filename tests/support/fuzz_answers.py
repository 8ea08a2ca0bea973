"""Fuzz targets for the decoding of every answer of etcd and of the Kubernetes API server:
what each client call makes of the bytes it was answered, and what the stores make of it.

Inputs are answers built from the fields the clients read, each of any JSON type, missing,
huge, nested deep, or spelled as a neighbour (an integer code as text, an error as a string
where an object is due), plus raw bytes; with any HTTP status. Each goes through the real
decoding: the etcd client (``EtcdClient``, its network exchange replaced by the fuzzed
answer: everything after the bytes arrive is the client's own) for every call flanneld
makes, a watch message, and the Kubernetes client and node store for a node list page, a
watch event applied to the node cache, an error Status, and this node's GET. ``run`` returns
when the answer was taken or refused the designed way (``EtcdUnavailable``, ``EtcdError``,
``ApiUnreachable``, ``ApiStatusError``, ``KubeError``...); anything else is a crash.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from hypothesis import strategies as st

from flannel.clients import etcd as etcdclient
from flannel.clients.etcd import (
    EtcdClient,
    EtcdCompacted,
    EtcdError,
    EtcdOptions,
    EtcdUnavailable,
    parse_endpoints,
)
from flannel.clients.http import Budget, Head
from flannel.clients.kube.client import ApiStatusError, ApiUnreachable, KubeClient
from flannel.clients.kube.config import client_config
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import KubeSubnetManager, node_name_from_env
from tests.support.fuzz_store import json_values, odd_strings
from tests.support.fuzzing import FuzzTarget

# -- building blocks ----------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


_keys = st.sampled_from(["/net/subnets/10.5.1.0-24", "/net/subnets/10.5.2.0-24",
                         "/net/subnets/", "/net/config", "/net/subnets-old/x", ""]).map(_b64)
_ints = st.one_of(st.integers(-(2 ** 70), 2 ** 70).map(str), st.integers(-5, 10 ** 6),
                  st.sampled_from(["", "abc", "1e3", "0x10", " 7", "9" * 30, "-1"]), st.booleans())
_values = st.one_of(
    st.sampled_from(['{"PublicIP":"10.0.0.2","PublicIPv6":null}', "{}", "", "null"]).map(_b64),
    st.sampled_from(["%%", "not base64!", "=" * 5]))


def _anything(*good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: one it should be, or any JSON value at all."""
    return st.one_of(*good, json_values)


def _members(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects holding any of ``fields`` (each missing, right, or of any type)."""
    return st.fixed_dictionaries({}, optional=fields)


_header = _members({"revision": _anything(_ints), "cluster_id": _anything(_ints),
                    "member_id": _anything(_ints)})
_kv = _members({"key": _anything(_keys), "value": _anything(_values),
                "lease": _anything(_ints), "create_revision": _anything(_ints),
                "mod_revision": _anything(_ints), "version": _anything(_ints)})
_kvs = st.lists(_anything(_kv), max_size=4)
_error = _members({"code": _anything(st.integers(0, 20)), "grpc_code": _anything(
    st.integers(0, 20)), "message": _anything(odd_strings), "error": _anything(odd_strings)})
_etcd_docs = st.one_of(
    _members({"header": _anything(_header), "kvs": _anything(_kvs), "more": _anything(
        st.booleans()), "count": _anything(_ints)}),
    _members({"header": _anything(_header), "succeeded": _anything(st.booleans()),
              "responses": _anything(st.lists(_anything(_members({
                  "response_range": _anything(_members({"kvs": _anything(_kvs),
                                                        "more": _anything(st.booleans())})),
                  "response_put": json_values})), max_size=3))}),
    _members({"header": _anything(_header), "ID": _anything(_ints), "TTL": _anything(_ints),
              "error": _anything(odd_strings), "deleted": _anything(_ints),
              "token": _anything(odd_strings), "leases": _anything(st.lists(
                  _anything(_members({"ID": _anything(_ints)})), max_size=3))}),
    _error, json_values)


def _render(doc: Any, how: int) -> bytes:
    text = json.dumps(doc).encode()
    if how == 1:
        return text[: len(text) // 2]
    if how == 2:
        return b"[" * 3000 + text + b"]" * 3000
    if how == 3:
        return b'{"kvs":[' + b"[]," * 20000 + b"[]]}"
    return text


_raw = st.one_of(
    st.builds(_render, _etcd_docs, st.sampled_from([0, 0, 0, 0, 1, 2, 3])),
    st.binary(max_size=300))
_status = st.sampled_from([200, 200, 200, 400, 401, 404, 429, 500, 503])

# -- etcd: every call flanneld makes, over the fuzzed answer ------------------------------


class _Canned(EtcdClient):
    """An etcd client whose every request is answered with ``status`` and ``body``:
    everything after the bytes arrive (budgets, decoding, checks, failover, re-auth) is the
    client's own."""

    def __init__(self, status: int, body: bytes, *, password: bool) -> None:
        super().__init__(EtcdOptions(parse_endpoints("http://127.0.0.1:1"),
                                     username="u" if password else "",
                                     password="p" if password else "", timeout=1))
        self.status, self.body = status, body

    async def _post(self, index: int, path: str, request: dict[str, Any], token: str | None,
                    require_leader: bool, budget: Budget) -> tuple[int, bytes]:
        if self.status == 200 and len(self.body) > budget.max_bytes:
            raise etcdclient._OverBudget(f"the answer to {path} is over its budget")
        return self.status, self.body


_CALLS = {
    "get": lambda c: c.get(b"/net/config"),
    "get_prefix": lambda c: c.get_prefix(b"/net/subnets/"),
    "get_prefix keys": lambda c: c.get_prefix(b"/net/subnets/", keys_only=True),
    "put": lambda c: c.put(b"/net/subnets/10.5.1.0-24", b"{}", 7),
    "delete": lambda c: c.delete(b"/net/subnets/10.5.1.0-24"),
    "create": lambda c: c.create(b"/net/subnets/10.5.1.0-24", b"{}", 7,
                                 else_list=b"/net/subnets/"),
    "grant": lambda c: c.grant(60),
    "revoke": lambda c: c.revoke(7),
    "leases": lambda c: c.leases(),
    "time_to_live": lambda c: c.time_to_live(7),
}


def _etcd_call(value: tuple[str, int, bytes, bool]) -> None:
    name, status, body, password = value

    async def call() -> None:
        client = _Canned(status, body, password=password)
        try:
            await _CALLS[name](client)
        finally:
            await client.close()

    try:
        asyncio.run(call())
    except (EtcdUnavailable, EtcdError, EtcdCompacted):
        return


_watch_messages = st.one_of(
    st.builds(_render, st.one_of(
        _members({"result": _anything(_members({
            "header": _anything(_header), "created": _anything(st.booleans()),
            "canceled": _anything(st.booleans()), "cancel_reason": json_values,
            "compact_revision": _anything(_ints),
            "events": _anything(st.lists(_anything(_members({
                "type": _anything(st.sampled_from(["PUT", "DELETE", 0, 1, 2, "put"])),
                "kv": _anything(_kv)})), max_size=3))}))}),
        _members({"error": _anything(_error)}), json_values), st.sampled_from([0, 0, 1, 2])),
    st.binary(max_size=300))


def _etcd_watch(value: tuple[bytes, int]) -> None:
    line, last = value
    client = EtcdClient(EtcdOptions(parse_endpoints("http://127.0.0.1:1")))
    try:
        batch = client._watch_batch(line, client.endpoint, last)
    except (EtcdUnavailable, EtcdCompacted, etcdclient._Refused):
        return
    if batch is not None:
        if batch.revision < last:
            raise AssertionError(f"a batch at {batch.revision} was taken after {last}")
        if any(e.kv.mod_revision < last for e in batch.events):
            raise AssertionError("an event older than what the stream had read was taken")


# -- Kubernetes: pages, events, errors, this node --------------------------------------------

_NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")
_P = "flannel.alpha.coreos.com/"
_annotations = _members({_P + "public-ip": _anything(st.just("10.0.0.3")),
                         _P + "backend-type": _anything(st.just("vxlan")),
                         _P + "backend-data": _anything(st.just('{"VNI":1,"VtepMAC":'
                                                                '"ce:e2:20:8d:30:f8"}')),
                         _P + "kube-subnet-manager": _anything(st.just("true"))})
_node = _members({
    "metadata": _anything(_members({"name": _anything(st.sampled_from(["node1", "node2", ""])),
                                    "resourceVersion": _anything(_ints),
                                    "annotations": _anything(_annotations)})),
    "spec": _anything(_members({"podCIDR": _anything(st.just("10.5.2.0/24")),
                                "podCIDRs": _anything(st.lists(
                                    _anything(st.just("10.5.2.0/24")), max_size=2))}))})
_page = _members({"kind": json_values, "metadata": _anything(_members({
    "resourceVersion": _anything(_ints), "continue": _anything(odd_strings)})),
    "items": _anything(st.lists(_anything(_node), max_size=4))})
_status_doc = _members({"kind": json_values, "code": _anything(st.integers(100, 600)),
                        "reason": _anything(odd_strings), "message": _anything(odd_strings)})
_event = _members({"type": _anything(st.sampled_from(["ADDED", "MODIFIED", "DELETED", "ERROR",
                                                      "BOOKMARK"])),
                   "object": _anything(_node, _status_doc)})


def _kube_render(doc: Any, how: int) -> bytes:
    text = json.dumps(doc).encode()
    return {1: text[: len(text) // 2], 2: b"[" * 3000 + text + b"]" * 3000,
            3: b'{"items":[' + b"{}," * 60000 + b"{}]}"}.get(how, text)


def _kube_raw(docs: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.builds(_kube_render, docs, st.sampled_from([0, 0, 0, 0, 1, 2, 3])),
                     st.binary(max_size=300))


class _CannedKube(KubeClient):
    """A Kubernetes client answered with ``status`` and ``body`` whatever it asks."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(client_config("http://127.0.0.1:1", "", {}))
        self.status, self.body = status, body

    async def _exchange(self, method: str, target: str, *, body: bytes, content_type: str,
                        budget: Budget, deadline: float) -> tuple[Head, bytes]:
        return Head(self.status, "X", {"location": "http://elsewhere/"}), self.body


def _manager(client: KubeClient) -> KubeSubnetManager:
    return KubeSubnetManager(client, "node1", _NAMES, "/nonexistent/net-conf.json")


def _kube_page(body: bytes) -> None:
    client = _CannedKube(200, body)
    sm = _manager(client)
    try:
        nodes, version = asyncio.run(client.list_nodes(sm._view))
    except ApiUnreachable:
        return
    if not isinstance(version, str) or any(not isinstance(n.name, str) for n in nodes):
        raise AssertionError("a page was taken with fields of the wrong type")


def _kube_event(line: bytes) -> None:
    client = KubeClient(client_config("http://127.0.0.1:1", "", {}))
    sm = _manager(client)
    try:
        kind, raw = client._event(line)
    except (ApiUnreachable, ApiStatusError):
        return
    sm._apply(kind, raw)
    if any(not isinstance(view.pod_cidr or "", str) for view in sm.nodes.values()):
        raise AssertionError("a node was kept with a pod CIDR that is not text")


def _kube_error(value: tuple[int, bytes]) -> None:
    code, body = value
    client = KubeClient(client_config("http://127.0.0.1:1", "", {}))
    error = client._status_error(code, body, "get nodes")
    if not isinstance(error.message, str) or not isinstance(error.reason, str):
        raise AssertionError("an error status of another shape was taken as text")


def _kube_own(value: tuple[str, int, bytes]) -> None:
    call, status, body = value
    client = _CannedKube(status, body)
    sm = _manager(client)

    async def run() -> None:
        if call == "node":
            await sm.get_node(wait_if_missing=True)
        elif call == "public ip":
            await sm.public_ip_overrides()
        else:
            await node_name_from_env(client, {"POD_NAME": "p", "POD_NAMESPACE": "n"})

    try:
        asyncio.run(run())
    except (StoreError, StoreUnavailable):
        return


TARGETS: list[FuzzTarget] = [
    FuzzTarget("etcd answers (every call)", st.tuples(
        st.sampled_from(sorted(_CALLS)), _status, _raw, st.booleans()), _etcd_call),
    FuzzTarget("etcd watch message", st.tuples(
        _watch_messages, st.integers(0, 10 ** 6)), _etcd_watch),
    FuzzTarget("kube node list page", _kube_raw(_page), _kube_page),
    FuzzTarget("kube watch event into the node cache", _kube_raw(_event), _kube_event),
    FuzzTarget("kube error status", st.tuples(st.integers(300, 599), _kube_raw(_status_doc)),
               _kube_error),
    FuzzTarget("kube own node and pod", st.tuples(
        st.sampled_from(["node", "public ip", "pod"]), _status,
        _kube_raw(st.one_of(_node, _status_doc, _members({"spec": _anything(_members(
            {"nodeName": _anything(st.just("node1"))}))})))), _kube_own),
]
