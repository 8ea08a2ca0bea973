"""Leases: a node's subnet(s) and the attributes it publishes, as they appear on the wire.

Owns the subnet key format (``10.5.34.0-24``, dual-stack ``10.5.34.0-24&fd00:1::-64``), the
lease value JSON (byte-compatible with Go flannel's ``LeaseAttrs``), and the lease events.
Must not touch: the store, files, the kernel.
"""

from __future__ import annotations

import enum
import json
import re
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Any

from flannel.untrusted import boundedjson, gojson
from flannel.untrusted.netutil import parse_ip


class LeaseDecodeError(ValueError):
    """A lease value that is not a valid flannel lease."""


_SUBNET_KEY = re.compile(r"(\d+\.\d+.\d+.\d+)-(\d+)(?:&([a-f\d:]+)-(\d+))?$", re.ASCII)


NO_IPV4 = IPv4Network("0.0.0.0/0")


def make_subnet_key(subnet: IPv4Network | None, ipv6_subnet: IPv6Network | None = None) -> str:
    """The etcd key suffix of a lease: ``<v4 base>-<len>`` with ``&<v6 base>-<len>`` appended.

    An IPv6-only lease has the IPv4 part ``0.0.0.0-0``, as Go flannel writes its zero value.
    """
    if subnet is None:
        return _subnet_key(None, 0, ipv6_subnet)
    return _subnet_key(int(subnet.network_address), subnet.prefixlen, ipv6_subnet)


def _subnet_key(v4_base: int | None, v4_prefixlen: int, ipv6_subnet: IPv6Network | None) -> str:
    # inet_ntoa: the same dotted quad as ipaddress', from the C library.
    key = f"{socket.inet_ntoa((v4_base or 0).to_bytes(4, 'big'))}-{v4_prefixlen}"
    if ipv6_subnet is not None:
        key += f"&{ipv6_subnet.network_address.compressed}-{ipv6_subnet.prefixlen}"
    return key


def parse_subnet_key(key: str) -> tuple[IPv4Network, IPv6Network | None] | None:
    """Parse a subnet key as upstream does (regex anchored at the end only); None if invalid.

    The IPv4 part of an IPv6-only key comes back as ``NO_IPV4`` (0.0.0.0/0).
    """
    match = _SUBNET_KEY.search(key)
    if match is None:
        return None
    v4_text, v4_len, v6_text, v6_len = match.groups()
    try:
        # inet_pton accepts exactly the dotted quads IPv4Address does, at a third of the cost
        # (acquisition parses every key of the listing).
        v4_addr = int.from_bytes(socket.inet_pton(socket.AF_INET, v4_text), "big")
        v4_prefix = int(v4_len)
        if v4_prefix > 31:
            return None
        subnet = IPv4Network((v4_addr, v4_prefix), strict=False)
        if v6_text is None:
            return subnet, None
        v6_prefix = int(v6_len)
        if v6_prefix > 127:
            return None
        v6_addr = IPv6Address(v6_text)
        return subnet, IPv6Network((v6_addr, v6_prefix), strict=False)
    except (OSError, ValueError):
        return None


def go_string(text: str) -> str:
    """A JSON string literal as Go's encoder writes it (HTML-safe, UTF-8 kept)."""
    return gojson.compact(json.dumps(text, ensure_ascii=False))


class LeaseAttrs:
    """What a node publishes with its subnet. Backend data are raw JSON text (or None).

    Immutable. The IPv4 public address is kept as an integer (``public_ip_number``; every
    lease of thousands has one): ``public_ip`` makes the address object when asked."""

    __slots__ = ("backend_data", "backend_type", "backend_v6_data", "public_ip_number",
                 "public_ipv6")

    public_ip_number: int | None
    public_ipv6: IPv6Address | None
    backend_type: str
    backend_data: str | None
    backend_v6_data: str | None

    def __init__(self, public_ip: IPv4Address | None = None,
                 public_ipv6: IPv6Address | None = None, backend_type: str = "",
                 backend_data: str | None = None, backend_v6_data: str | None = None) -> None:
        setter = object.__setattr__
        # The address's own integer: nothing new is allocated for it.
        setter(self, "public_ip_number", None if public_ip is None else int(public_ip))
        setter(self, "public_ipv6", public_ipv6)
        setter(self, "backend_type", backend_type)
        setter(self, "backend_data", backend_data)
        setter(self, "backend_v6_data", backend_v6_data)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"LeaseAttrs are immutable: {name}")

    __delattr__ = __setattr__  # type: ignore[assignment]

    @property
    def public_ip(self) -> IPv4Address | None:
        """The IPv4 public address (None when missing or 0.0.0.0), made on each call."""
        number = self.public_ip_number
        return None if number is None else IPv4Address(number)

    def public_number(self, version: int) -> int | None:
        """The public address of one IP family as an integer (None when missing)."""
        if version == 4:
            return self.public_ip_number
        return None if self.public_ipv6 is None else int(self.public_ipv6)

    def _fields(self) -> tuple[object, ...]:
        return (self.public_ip_number, self.public_ipv6, self.backend_type, self.backend_data,
                self.backend_v6_data)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not LeaseAttrs:
            return NotImplemented
        assert isinstance(other, LeaseAttrs)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"LeaseAttrs(public_ip={self.public_ip!r}, public_ipv6={self.public_ipv6!r}, "
                f"backend_type={self.backend_type!r}, backend_data={self.backend_data!r}, "
                f"backend_v6_data={self.backend_v6_data!r})")

    def to_json(self) -> str:
        """Encode exactly as Go flannel does (field order, omitted empty fields, compaction)."""
        public_ip = str(self.public_ip) if self.public_ip is not None else "0.0.0.0"
        fields = [f'"PublicIP":{go_string(public_ip)}']
        v6 = go_string(self.public_ipv6.compressed) if self.public_ipv6 is not None else "null"
        fields.append(f'"PublicIPv6":{v6}')
        if self.backend_type:
            fields.append(f'"BackendType":{go_string(self.backend_type)}')
        if self.backend_data:
            fields.append(f'"BackendData":{gojson.compact(self.backend_data)}')
        if self.backend_v6_data:
            fields.append(f'"BackendV6Data":{gojson.compact(self.backend_v6_data)}')
        return "{" + ",".join(fields) + "}"

    def backend_json(self, v6: bool = False) -> Any:
        """The decoded backend data of one family, or None; LeaseDecodeError if unusable."""
        raw = self.backend_v6_data if v6 else self.backend_data
        if not raw:
            return None
        try:
            return boundedjson.loads(raw, what="BackendV6Data" if v6 else "BackendData",
                                     max_bytes=boundedjson.MAX_LEASE_BYTES)
        except boundedjson.JSONLimitError as err:
            raise LeaseDecodeError(str(err)) from None

    @classmethod
    def from_json(cls, raw: bytes | str) -> LeaseAttrs:
        """Decode a lease value; field names match case-insensitively as in Go."""
        if isinstance(raw, bytes) and (found := _GO_SHAPE.match(raw)) is not None:
            attrs = cls._from_go_shape(found)
            if attrs is not None:
                return attrs
        try:
            doc = boundedjson.loads(raw, what="lease value", max_bytes=boundedjson.MAX_LEASE_BYTES)
        except boundedjson.JSONLimitError as err:
            raise LeaseDecodeError(str(err)) from None
        if not isinstance(doc, dict):
            raise LeaseDecodeError(
                f"lease value must be a JSON object, got {gojson.type_name(doc)}")
        members = gojson.fold_keys(doc, _LEASE_FIELDS)
        return cls(
            public_ip=_decode_ip(members.get("PublicIP"), "PublicIP", 4),
            public_ipv6=_decode_ip(members.get("PublicIPv6"), "PublicIPv6", 6),
            backend_type=_shared(_decode_str(members.get("BackendType"), "BackendType")),
            backend_data=_raw(members, "BackendData"),
            backend_v6_data=_raw(members, "BackendV6Data"),
        )

    @classmethod
    def _from_go_shape(cls, found: re.Match[bytes]) -> LeaseAttrs | None:
        """The attrs of a value in Go's shape (``_GO_SHAPE``), exactly as the JSON decoder
        would give them; None if a backend data object repeats a member (the decoder keeps
        the last one), which the general path handles."""
        public_ip, public_ipv6, backend_type, data, v6_data = found.groups()
        for raw_data in (data, v6_data):
            if raw_data is not None and _repeats_a_member(raw_data):
                return None
        return cls(
            public_ip=_decode_ip(public_ip.decode(), "PublicIP", 4),
            public_ipv6=None if public_ipv6 is None else _decode_ip(public_ipv6.decode(),
                                                                    "PublicIPv6", 6),
            backend_type=_shared(backend_type.decode()) if backend_type else "",
            backend_data=None if data is None else data.decode(),
            backend_v6_data=None if v6_data is None else v6_data.decode())


def _repeats_a_member(flat_object: bytes) -> bool:
    names = _MEMBER_NAME.findall(flat_object)
    return len(set(names)) != len(names)


_LEASE_FIELDS = {name.lower(): name for name in (
    "PublicIP", "PublicIPv6", "BackendType", "BackendData", "BackendV6Data")}

# Go's encoder writes a lease value in one shape: these members in this order, no spaces,
# empty ones omitted. Such a value whose backend data are flat objects of plain strings and
# integers (every built-in backend's) is what a snapshot of thousands holds: it is decoded
# with one match instead of the JSON decoder and an encoder (under half the cost), into the
# same attrs. Strings hold no quote, backslash or character the encoders would escape, and
# integers have the one spelling they are encoded back to, so each object's text is already
# the compact text the general path makes; anything else takes the general path.
_MEMBER = rb'"[A-Za-z][A-Za-z0-9]{0,31}":(?:"[A-Za-z0-9:.+/=_-]{0,88}"|0|-?[1-9][0-9]{0,14})'
_FLAT_OBJECT = rb"\{(?:" + _MEMBER + rb"(?:," + _MEMBER + rb"){0,15})?\}"
_GO_SHAPE = re.compile(
    rb'\{"PublicIP":"([0-9.]{7,15})","PublicIPv6":(?:null|"([0-9a-f:.]{2,45})")'
    rb'(?:,"BackendType":"([A-Za-z0-9_-]{1,32})")?'
    rb'(?:,"BackendData":(' + _FLAT_OBJECT + rb'))?'
    rb'(?:,"BackendV6Data":(' + _FLAT_OBJECT + rb'))?\}\Z')
_MEMBER_NAME = re.compile(rb'[{,]"([A-Za-z0-9]+)":')


def _decode_ip(value: Any, name: str, version: int) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise LeaseDecodeError(f"lease field {name}: expected a string, got "
                               f"{gojson.type_name(value)}")
    try:
        addr = parse_ip(value, version)
    except ValueError as err:
        raise LeaseDecodeError(f"lease field {name}: {err}") from None
    if version == 4 and int(addr) == 0:
        return None
    return addr


def _decode_str(value: Any, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise LeaseDecodeError(f"lease field {name}: expected a string, got "
                               f"{gojson.type_name(value)}")
    return value


class SharedStrings:
    """One string object per distinct value, for a field whose few values repeat across
    thousands of records (a lease's BackendType, a node's annotation names), instead of one
    copy per record. Bounded, as the values come from the store: past ``limit`` distinct
    values, new ones are returned as they are (and not through ``sys.intern``: store values
    must not grow the interpreter's own table)."""

    def __init__(self, limit: int = 64) -> None:
        self._table: dict[str, str] = {}
        self._limit = limit

    def __call__(self, text: str) -> str:
        shared = self._table.get(text)
        if shared is not None:
            return shared
        if len(self._table) < self._limit:
            self._table[text] = text
        return text


#: A cluster uses a few BackendTypes at most.
_shared = SharedStrings()


def _raw(members: dict[str, Any], name: str) -> str | None:
    if name not in members:
        return None
    return _COMPACT.encode(members[name])


# json.dumps with these options builds an encoder per call; a snapshot decodes 5000 values.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


_NO_ATTRS = LeaseAttrs()


class _Same:
    """``Lease.replace``'s marker for a field left as it is."""


_SAME = _Same()


class Lease:
    """A subnet lease. ``expiration`` is a Unix time, None for a reservation (no TTL).
    ``created``: when the store created the record, as an order every node reads alike
    from the store (etcd: the key's create revision; kube: the Node's creationTimestamp in
    Unix seconds); the lower, the older, ties broken by the key (``age``); 0 when not known.

    Immutable. The IPv4 subnet is kept as two integers (``v4_base``, ``v4_prefixlen``):
    thousands of leases are held at once (the store's view, the lease watcher's, the data
    plane's records share them), and an ``IPv4Network`` with its dictionary and address is
    three objects more per lease; ``subnet`` makes one when asked. ``replace`` gives a copy
    with some fields changed."""

    __slots__ = ("attrs", "created", "etcd_lease_id", "expiration", "ipv6_subnet", "key",
                 "v4_base", "v4_prefixlen")

    v4_base: int | None
    v4_prefixlen: int
    ipv6_subnet: IPv6Network | None
    attrs: LeaseAttrs
    expiration: float | None
    etcd_lease_id: int
    created: int
    # Computed once: a snapshot of 5000 leases asks each for its key several times.
    key: str

    def __init__(self, subnet: IPv4Network | None, ipv6_subnet: IPv6Network | None = None,
                 attrs: LeaseAttrs = _NO_ATTRS, expiration: float | None = None,
                 etcd_lease_id: int = 0, created: int = 0) -> None:
        # The network's own integer: nothing new is allocated for it.
        self._set(None if subnet is None else (int(subnet.network_address), subnet.prefixlen),
                  ipv6_subnet, attrs, expiration, etcd_lease_id, created)

    @classmethod
    def of_family(cls, v4: tuple[int, int] | None, ipv6_subnet: IPv6Network | None,
                  attrs: LeaseAttrs, created: int = 0) -> Lease:
        """A reservation whose IPv4 subnet is given as ``family(4)`` gives it back (its first
        address as an integer, masked, and its prefix length): no network object is made
        for a lease decoded from text (a kube snapshot decodes thousands)."""
        lease = cls.__new__(cls)
        lease._set(v4, ipv6_subnet, attrs, None, 0, created)
        return lease

    def _set(self, v4: tuple[int, int] | None, ipv6_subnet: IPv6Network | None,
             attrs: LeaseAttrs, expiration: float | None, etcd_lease_id: int,
             created: int) -> None:
        setter = object.__setattr__
        base, prefixlen = (None, 0) if v4 is None else v4
        setter(self, "v4_base", base)
        setter(self, "v4_prefixlen", prefixlen)
        setter(self, "ipv6_subnet", ipv6_subnet)
        setter(self, "attrs", attrs)
        setter(self, "expiration", expiration)
        setter(self, "etcd_lease_id", etcd_lease_id)
        setter(self, "created", created)
        setter(self, "key", _subnet_key(base, prefixlen, ipv6_subnet))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Lease is immutable (use replace() for a changed copy): {name}")

    __delattr__ = __setattr__  # type: ignore[assignment]

    @property
    def subnet(self) -> IPv4Network | None:
        """The IPv4 subnet (None for an IPv6-only lease), made on each call."""
        if self.v4_base is None:
            return None
        return IPv4Network((self.v4_base, self.v4_prefixlen))

    def replace(self, *, expiration: float | _Same | None = _SAME,
                etcd_lease_id: int | _Same = _SAME, created: int | _Same = _SAME,
                attrs: LeaseAttrs | _Same = _SAME) -> Lease:
        """A copy of this lease with the given fields changed (the subnets stay)."""
        return Lease(self.subnet, self.ipv6_subnet,
                     self.attrs if isinstance(attrs, _Same) else attrs,
                     self.expiration if isinstance(expiration, _Same) else expiration,
                     self.etcd_lease_id if isinstance(etcd_lease_id, _Same) else etcd_lease_id,
                     self.created if isinstance(created, _Same) else created)

    def _fields(self) -> tuple[object, ...]:
        return (self.v4_base, self.v4_prefixlen, self.ipv6_subnet, self.attrs,
                self.expiration, self.etcd_lease_id, self.created)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Lease:
            return NotImplemented
        assert isinstance(other, Lease)
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (f"Lease(subnet={self.subnet!r}, ipv6_subnet={self.ipv6_subnet!r}, "
                f"attrs={self.attrs!r}, expiration={self.expiration!r}, "
                f"etcd_lease_id={self.etcd_lease_id!r}, created={self.created!r})")

    def family(self, version: int) -> tuple[int, int] | None:
        """(the first address as an integer, the prefix length) of the subnet of one IP
        family, without making a network object; None when the lease has none."""
        if version == 4:
            return None if self.v4_base is None else (self.v4_base, self.v4_prefixlen)
        v6 = self.ipv6_subnet
        return None if v6 is None else (int(v6.network_address), v6.prefixlen)

    @property
    def age(self) -> tuple[int, str]:
        """What orders leases from the oldest: ``created``, then the key."""
        return self.created, self.key

    @property
    def is_reservation(self) -> bool:
        return self.etcd_lease_id == 0

    def same_subnet(self, other: Lease) -> bool:
        """Upstream's identity rule: compare the families both leases carry."""
        if self.v4_base is not None and other.v4_base is not None:
            same_v4 = (self.v4_base, self.v4_prefixlen) == (other.v4_base, other.v4_prefixlen)
            if self.ipv6_subnet is not None and other.ipv6_subnet is not None:
                return same_v4 and self.ipv6_subnet == other.ipv6_subnet
            return same_v4
        return self.ipv6_subnet is not None and self.ipv6_subnet == other.ipv6_subnet


class EventType(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    lease: Lease
