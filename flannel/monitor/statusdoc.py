"""The ``/status`` document's schema, shared by its writer (``flannel/monitor/nodestate.py``)
and its readers (``flannelctl status``, ``doctor`` and ``check`` through
``flannel/ops/flanneldview.py``, ``bundle``).

Owns the typed shape (``StatusDocument`` and its parts, TypedDicts: the document is plain
JSON), its version (``STATUS_FORMAT``, bumped when a field changes meaning or goes away;
fields may be added without a bump) and ``read_status``, which takes a decoded answer as
untrusted input: every field it knows checked against its declared type, each container cut
at ``MAX_ITEMS``, fields it does not know dropped. A field of the wrong type is named in
``problems`` and replaced by its neutral value (None, empty, zero), as is a field missing (an
older flanneld: named in ``missing``), so a reader sees the declared types only.
Must not touch: anything (standard library only; no I/O).
"""

import types
from dataclasses import dataclass, field
from typing import (
    Any,
    NotRequired,
    TypedDict,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

#: Bumped when a field of the status document changes meaning or goes away.
STATUS_FORMAT = 1
#: Items read at most from any list or mapping of the document (flanneld lists at most 50
#: of anything per node; its options and readiness components are a few dozen).
MAX_ITEMS = 1000
#: Characters read at most of any string.
MAX_TEXT = 4000


class Component(TypedDict):
    component: str
    ready: bool
    reason: str


class Option(TypedDict):
    name: str
    value: str
    source: str


class Flanneld(TypedDict):
    pid: int
    socket: str | None
    health: str | None
    options: list[Option]


class Write(TypedDict):
    ok: bool
    failures: int
    error: str | None


class Store(TypedDict):
    kind: str
    ready: bool
    reason: str
    watching: bool
    reconnects: int
    compactions: int
    relists: int
    renewals: int
    renewal_failures: int
    writes: dict[str, Write]


class LeaseInfo(TypedDict):
    subnet: str | None
    ipv6_subnet: str | None
    public_ip: str | None
    public_ipv6: str | None
    backend_type: str
    reservation: bool
    expires_at: str | None
    expires_in_seconds: float | None


class Network(TypedDict):
    network: str | None
    ipv6_network: str | None
    backend: str


class Device(TypedDict):
    name: str
    mtu: int
    mac: str


class Dataplane(TypedDict):
    in_sync: bool
    passes: int
    failed_passes: int
    last_error: str
    routes_wanted: int | None
    applied: dict[str, int]
    repaired: dict[str, int]
    netlink_errors: int
    event_overruns: int


class Peers(TypedDict):
    known: int
    for_backend: int
    programmed: int
    skipped: int
    skipped_reasons: dict[str, str]
    refused: int
    refused_reasons: dict[str, str]
    refused_kinds: dict[str, str]


class FilterFamily(TypedDict):
    peers: int
    dropped_packets: int


class DropFamily(TypedDict):
    dropped_packets: int


class Rules(TypedDict):
    mode: str
    installed: bool
    reason: str
    checks: int
    repairs: int
    failures: int
    #: With --encap-peers-only, by family ("ipv4", "ipv6").
    encap_filter: NotRequired[dict[str, FilterFamily]]
    #: With --drop-pod-encap, by family.
    pod_encap_drop: NotRequired[dict[str, DropFamily]]


class FootprintLink(TypedDict):
    pattern: str
    kind: str


class Footprint(TypedDict):
    routes: str
    device: str
    links: list[FootprintLink]
    encap_port: int | None
    vtep: bool
    dual_stack: bool


class ProbeFailing(TypedDict):
    lease: str
    family: int
    public_ip: str
    target: str
    cause: str
    label: str
    detail: str
    since: str
    for_seconds: float
    checked_seconds_ago: float


class Probes(TypedDict):
    interval_seconds: float
    rate_per_second: float
    period_seconds: float
    peers: int
    oldest_result_seconds: float | None
    unprobed: dict[str, str]
    unreachable: int
    by_cause: dict[str, int]
    listed: list[ProbeFailing]
    probes: dict[str, int]
    errors: dict[str, int]


class StatusDocument(TypedDict):
    format: int
    version: str
    uptime_seconds: float
    ready: bool
    reason: str
    readiness: list[Component]
    flanneld: Flanneld
    lease: LeaseInfo | None
    network: Network | None
    store: Store | None
    devices: list[Device]
    peers: Peers
    dataplane: Dataplane | None
    rules: Rules | None
    engines: dict[str, dict[str, float]]
    footprint: Footprint | None
    #: Absent from a flanneld that does not probe its peers at all; null with probes off.
    probes: NotRequired[Probes | None]
    last_errors: list[str]


class NotAStatus(ValueError):
    """The answer is not a flanneld status document at all."""


@dataclass
class Read:
    """A document read: ``doc`` holds the declared types only; ``problems`` names each field
    of the wrong type (left out), ``missing`` each field absent, ``cut`` each container cut
    at ``MAX_ITEMS``; ``newer``: the document's format is newer than this reader's."""

    doc: StatusDocument
    problems: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    newer: bool = False


def read_status(raw: object) -> Read:
    """``raw`` (decoded JSON) as a status document; NotAStatus when it is not one at all
    (not an object, or no boolean ``ready``)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("ready"), bool):
        raise NotAStatus("not flanneld's status")
    read = Read(cast(StatusDocument, {}))
    read.doc = cast(StatusDocument, _typed(raw, StatusDocument, "", read))
    fmt = read.doc["format"]
    read.newer = fmt > STATUS_FORMAT
    return read


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _neutral(hint: Any) -> Any:
    """The value a field of type ``hint`` takes when it is missing or of the wrong type."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType) and type(None) in get_args(hint):
        return None
    if origin is list:
        return []
    if origin is dict:
        return {}
    if is_typeddict(hint):
        hints = get_type_hints(hint)
        return {name: _neutral(sub) for name, sub in hints.items()
                if name in hint.__required_keys__}
    return {str: "", int: 0, float: 0.0, bool: False}[hint]


def _typed(value: object, hint: Any, where: str, read: Read) -> Any:
    """``value`` as of type ``hint``; raises _Wrong when it is not."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(hint):
            return None
        inner = [arg for arg in get_args(hint) if arg is not type(None)]
        return _typed(value, inner[0], where, read)
    if origin in (list, dict):
        return _container(value, hint, where, read)
    if is_typeddict(hint):
        return _record(value, hint, where, read)
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return value  # an int is a float to the type checker, and JSON shows it so
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint is str and isinstance(value, str):
        return value[:MAX_TEXT]
    if hint is bool and isinstance(value, bool):
        return value
    raise _Wrong({str: "a string", int: "an integer", float: "a number",
                  bool: "true or false"}[hint])


def _container(value: object, hint: Any, where: str, read: Read) -> Any:
    """A list or a mapping, cut at MAX_ITEMS, its items of the wrong type left out."""
    if get_origin(hint) is list:
        if not isinstance(value, list):
            raise _Wrong("a list")
        if len(value) > MAX_ITEMS:
            read.cut.append(where)
        return [item for i, raw in enumerate(value[:MAX_ITEMS])
                if (item := _field(raw, get_args(hint)[0], f"{where}[{i}]", read)) is not _LEFT]
    if not isinstance(value, dict):
        raise _Wrong("an object")
    if len(value) > MAX_ITEMS:
        read.cut.append(where)
    sub = get_args(hint)[1]
    return {key[:MAX_TEXT]: item for key, raw in list(value.items())[:MAX_ITEMS]
            if (item := _field(raw, sub, f"{where}.{key[:80]}", read)) is not _LEFT}


def _record(value: object, hint: Any, where: str, read: Read) -> dict[str, Any]:
    """An object of a TypedDict: its known fields checked, a required one missing or of the
    wrong type replaced by its neutral value, unknown ones dropped."""
    if not isinstance(value, dict):
        raise _Wrong("an object")
    out = {}
    for name, sub in get_type_hints(hint).items():
        path = f"{where}.{name}" if where else name
        required = name in hint.__required_keys__
        if name not in value:
            if required:
                read.missing.append(path)
                out[name] = _neutral(sub)
            continue
        item = _field(value[name], sub, path, read)
        if item is not _LEFT:
            out[name] = item
        elif required:
            out[name] = _neutral(sub)
    return out


class _Wrong(Exception):
    """A value not of its declared type: the message says what it must be."""


_LEFT = object()  # a field of the wrong type, left out


def _field(value: object, hint: Any, where: str, read: Read) -> Any:
    try:
        return _typed(value, hint, where, read)
    except _Wrong as err:
        read.problems.append(f"{where}: {_kind(value)}, not {err}")
        return _LEFT
