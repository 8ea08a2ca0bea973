"""Fuzz targets for the decoders of what servers answer flanneld, besides the stores: the
Compute Engine API (a routes.list page, an operation, a self link, an error answer), the
OAuth token answers (GCE metadata server, a key file's token endpoint), the instance
metadata services' values (GCE, AWS, Tencent Cloud, Alibaba Cloud), Alibaba Cloud's VPC
API (an answer and the three documents read from it), charon's VICI events (list-sas,
list-conns), and WireGuard's device dumps (UAPI text, generic netlink messages).

Inputs are the documents each API sends, their fields of every type (a string where an
object is due, a number as text, nesting far beyond any limit, megabytes of elements),
truncated or mangled, and raw bytes. ``run`` returns when the decoder accepted the input or
refused it the way it is designed to (``CloudError`` naming the field, ``CharonError``,
``ControlError``); it checks what an accepted input promises (types, bounds). Anything
else that escapes is a crash.
"""

from __future__ import annotations

import json
import struct
from ipaddress import IPv4Address
from typing import Any

from hypothesis import strategies as st

from flannel.cloud import alivpc, gce, gceauth, metadata
from flannel.cloud.alivpc import answer_of
from flannel.cloud.base import CloudError, Throttled
from flannel.ipsec.charon import CharonError, connection_names, sa_states
from flannel.untrusted import boundedjson
from flannel.untrusted.boundedjson import JSONLimitError
from flannel.wireguard import genl, uapi
from flannel.wireguard.uapi import ControlError
from tests.support.fuzz_store import deep, deep_unclosed, huge_numbers, json_values, odd_strings
from tests.support.fuzzing import FuzzTarget

# -- building blocks ----------------------------------------------------------------------

links = st.sampled_from([
    "https://www.googleapis.com/compute/v1/projects/p/global/networks/net",
    "projects/p/zones/europe-west1-b/instances/node-1", "", "x" * 600,
    "https://evil.example/projects/p/global/networks/net", "projects/"])
cidrs = st.sampled_from(["10.244.1.0/24", "10.244.0.0/16", "0.0.0.0/0", "10.244.1.7/24",
                         "fd00::/64", "10.0.0.0/33", "not a cidr", ""])


def loosely(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's documented values, or any JSON value at all."""
    return st.one_of(values, json_values)


def obj(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """An object with some of ``fields`` (each of its type or any other), or anything."""
    return st.one_of(
        st.fixed_dictionaries({}, optional={k: loosely(v) for k, v in fields.items()}),
        json_values)


def wire(documents: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """Documents as the server sends them, and mangled: cut, invalid UTF-8, nested beyond
    any limit, amplified into many elements, huge numbers, raw bytes."""
    text = documents.map(lambda doc: json.dumps(doc, allow_nan=True).encode())
    return st.one_of(
        text, text, text,
        text.map(lambda raw: raw[: len(raw) // 2]),
        text.map(lambda raw: raw.replace(b'"', b'"\xff', 1)),
        deep.map(str.encode), deep_unclosed.map(str.encode),
        st.integers(min_value=1, max_value=200_000).map(
            lambda n: b'{"items": [' + b"{}," * n + b'{}]}'),
        huge_numbers.map(str.encode),
        st.binary(max_size=300),
    )


def _decoded(raw: bytes, max_bytes: int, max_elements: int) -> Any:
    """What the client decodes, or None when it refuses the answer as it is designed to."""
    try:
        return boundedjson.loads(raw, what="an answer", max_bytes=max_bytes,
                                 max_elements=max_elements)
    except JSONLimitError:
        return None


# -- Compute Engine -------------------------------------------------------------------------

routes = obj(name=st.sampled_from(["flannel-10-244-1-0-24", "flannel-x", "admin-route", "",
                                   "flannel-" + "9" * 70]),
             destRange=cidrs, network=links, nextHopInstance=links,
             description=st.sampled_from([gce.DESCRIPTION, "", "x" * 3000]),
             nextHopGateway=links, priority=st.integers())
pages = obj(items=st.lists(routes, max_size=6), nextPageToken=odd_strings, kind=odd_strings)
operations = obj(name=st.sampled_from(["operation-1-abc", "", "../x", "o" * 200]),
                 status=st.sampled_from(["DONE", "RUNNING", "PENDING", "done"]),
                 httpErrorStatusCode=st.one_of(st.integers(), st.just("abc"), st.just("403")),
                 error=obj(errors=st.lists(obj(code=odd_strings, message=odd_strings),
                                           max_size=3)))
resources = obj(selfLink=links, canIpForward=st.booleans(), name=odd_strings)
errors = obj(error=obj(code=st.integers(), message=odd_strings,
                       errors=st.lists(obj(reason=odd_strings, message=odd_strings),
                                       max_size=2)))


def run_gce_page(raw: bytes) -> None:
    answer = _decoded(raw, gce.MAX_ANSWER, gce.MAX_ELEMENTS)
    if answer is None:
        return
    try:
        found, token = gce.routes_page(answer, "a routes.list page")
    except CloudError as error:
        assert "a routes.list page: " in str(error) and len(str(error)) < 400
        return
    assert isinstance(token, str) and len(token) <= 1024
    for route in found:
        assert route.name.startswith(gce.ROUTE_PREFIX) and len(route.name) <= 63
        assert all(isinstance(f, str) for f in route[:4]) and isinstance(route.marked, bool)


def run_gce_operation(raw: bytes) -> None:
    answer = _decoded(raw, gce.MAX_ANSWER, gce.MAX_ELEMENTS)
    if answer is None:
        return
    try:
        done = gce.operation(answer, "an operation")
    except CloudError as error:
        assert str(error).startswith("an operation: ")
        return
    assert isinstance(done.done, bool) and isinstance(done.name, str)
    assert 0 <= done.http_status <= 999
    assert all(isinstance(c, str) and isinstance(m, str) for c, m in done.errors)


def run_gce_resource(raw: bytes) -> None:
    answer = _decoded(raw, gce.MAX_ANSWER, gce.MAX_ELEMENTS)
    reason, message = gce.error_detail(answer)  # never refuses: the status says enough
    assert isinstance(reason, str) and isinstance(message, str) and len(message) <= 300
    if answer is None:
        return
    try:
        link = gce.self_link(answer, "an instance")
    except CloudError:
        return
    assert isinstance(link, str) and link


def run_token(raw: bytes) -> None:
    try:
        token, lifetime = gceauth._token_from("a token endpoint", raw)
    except CloudError as error:
        assert "token" in str(error) and len(str(error)) < 400
        return
    assert token.isprintable() and 0 < len(token) <= 4096 and 1 <= lifetime <= 86400


# -- instance metadata -------------------------------------------------------------------------

_values = st.one_of(odd_strings, st.sampled_from([
    "flannel-test", "projects/123/zones/europe-west1-b", "node-1",
    "projects/123/networks/net", "i-0123456789abcdef0", "eu-west-1",
    "02:42:ac:11:00:02/\n02:42:ac:11:00:03/", "eni-0123456789abcdef0",
    "subnet-0123456789abcdef0", "vpc-0123456789abcdef0", "10.0.1.5 10.0.1.6",
    "cn-hangzhou", "i-bp1flannelnode00001", "vpc-bp1flannel0000000001", "ap-guangzhou",
    "vpc-abcd1234"]))


class _Answers:
    """A metadata service answering each path with the next of ``values`` (bytes of any
    kind, decoded as the clients decode them)."""

    def __init__(self, values: list[str]) -> None:
        self.values = values
        self.asked = 0

    def get(self, path: str) -> str:
        value = self.values[self.asked % len(self.values)] if self.values else ""
        self.asked += 1
        return value.strip()


def run_metadata(values: list[str]) -> None:
    source = _Answers(values)
    for read in (lambda: gceauth.gce_identity(source),  # type: ignore[arg-type]
                 lambda: metadata.aws_identity(source,  # type: ignore[arg-type]
                                               IPv4Address("10.0.1.5")),
                 lambda: metadata.tencent_identity(source),  # type: ignore[arg-type]
                 lambda: metadata.aliyun_identity(source)):  # type: ignore[arg-type]
        try:
            identity = read()
        except CloudError as error:
            assert len(str(error)) < 400
            continue
        assert all(isinstance(v, str) and v.isprintable() and len(v) <= 200
                   for v in vars(identity).values())


# -- Alibaba Cloud ----------------------------------------------------------------------------

entries = obj(DestinationCidrBlock=cidrs, Type=st.sampled_from(["Custom", "System"]),
              Status=st.sampled_from(["Available", "Pending", "Deleting"]),
              NextHopType=st.sampled_from(["Instance", "VpnGateway"]),
              InstanceId=odd_strings, RouteEntryName=odd_strings, RouteEntryId=odd_strings)
aliyun_answers = st.one_of(
    obj(Vpcs=obj(Vpc=st.lists(obj(VRouterId=odd_strings), max_size=2))),
    obj(VRouters=obj(VRouter=st.lists(obj(RouteTableIds=obj(
        RouteTableId=st.lists(odd_strings, max_size=2))), max_size=2))),
    obj(RouteTables=obj(RouteTable=st.lists(obj(RouteEntrys=obj(
        RouteEntry=st.lists(entries, max_size=4))), max_size=2))),
    obj(Code=st.sampled_from(["Throttling", "Forbidden.RAM", "", "QuotaExceeded"]),
        Message=odd_strings))


def run_aliyun(given: tuple[int, bytes]) -> None:
    status, raw = given
    try:
        view = answer_of("Alibaba Cloud VPC", "Describe", status, raw)
    except Throttled:
        return
    except CloudError as error:
        assert len(str(error)) < 600
        return
    for read in (alivpc.vrouter_of, alivpc.route_tables_of, alivpc.entries_of):
        try:
            found = read(view)
        except CloudError as error:
            assert str(error).startswith("the answer to Alibaba Cloud VPC Describe: ")
            continue
        if isinstance(found, list):
            assert len(found) <= alivpc.MAX_ENTRIES


# -- charon's VICI ------------------------------------------------------------------------------

vici_values = st.recursive(
    st.one_of(st.binary(max_size=20), st.sampled_from([b"ESTABLISHED", b"INSTALLED"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["state", "child-sas", "flannel-a", "c-1", "x"]) | st.text(max_size=5),
        inner, max_size=3),
    max_leaves=10)
vici_events = st.lists(st.dictionaries(st.text(max_size=12), vici_values, max_size=3),
                       max_size=4)


class _Session:
    """What the vici package yields for a stream: one decoded message per event."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def list_sas(self) -> Any:
        return iter(self.events)

    list_conns = list_sas


def run_vici(events: list[Any]) -> None:
    for read in (lambda: sa_states(_Session(events)),
                 lambda: connection_names(_Session(events), "")):
        try:
            found = read()
        except CharonError as error:
            assert str(error).startswith("charon sent ")
            continue
        assert isinstance(found, list | set)


# -- WireGuard ----------------------------------------------------------------------------------

uapi_lines = st.lists(st.one_of(
    st.sampled_from(["public_key=" + "ab" * 32, "allowed_ip=10.5.1.0/24", "endpoint=1.2.3.4:5",
                     "listen_port=51820", "private_key=" + "00" * 32, "rx_bytes=-1",
                     "last_handshake_time_sec=99999999999999999999", "allowed_ip=::/200",
                     "persistent_keepalive_interval=x", "errno=0", "="]),
    st.text(max_size=40)), max_size=30)


def run_uapi(lines: list[str]) -> None:
    try:
        state = uapi.decode_get("\n".join(lines))
    except ControlError as error:
        assert str(error).startswith("the device answered")
        return
    assert len(state.peers) <= uapi.MAX_PEERS


def _nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + bytes(-len(payload) % 4)


attributes = st.recursive(
    st.builds(_nla, st.integers(0, 12) | st.integers(0, 0xFFFF), st.binary(max_size=40)),
    lambda inner: st.builds(lambda kind, parts: _nla(kind | 0x8000, b"".join(parts)),
                            st.integers(0, 12), st.lists(inner, max_size=4)),
    max_leaves=12)
genl_bodies = st.lists(st.builds(lambda parts: b"\x00\x01\x00\x00" + b"".join(parts),
                                 st.lists(attributes, max_size=4)) | st.binary(max_size=60),
                       max_size=3)


def run_genl(bodies: list[bytes]) -> None:
    try:
        state = genl.decode_get_device(bodies)
    except ControlError as error:
        assert str(error).startswith("the kernel answered")
        return
    assert len(state.peers) <= uapi.MAX_PEERS


TARGETS = [
    FuzzTarget("gce routes.list page", wire(pages), run_gce_page),
    FuzzTarget("gce operation", wire(operations), run_gce_operation),
    FuzzTarget("gce network/instance and error answers", wire(st.one_of(resources, errors)),
               run_gce_resource),
    FuzzTarget("oauth token answer (gce metadata, key file)",
               wire(obj(access_token=odd_strings, expires_in=st.integers(),
                        token_type=odd_strings)), run_token),
    FuzzTarget("instance metadata identity (gce, aws, tencent, aliyun)",
               st.lists(_values, max_size=12), run_metadata),
    FuzzTarget("alibaba cloud vpc answers",
               st.tuples(st.sampled_from([200, 400, 403, 404, 503]), wire(aliyun_answers)),
               run_aliyun),
    FuzzTarget("charon vici events (list-sas, list-conns)", vici_events, run_vici),
    FuzzTarget("wireguard uapi get answer", uapi_lines, run_uapi),
    FuzzTarget("wireguard generic netlink dump", genl_bodies, run_genl),
]
