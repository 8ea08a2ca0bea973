"""The entries a VTEP device (vxlan's ``flannel.<VNI>``) holds for its peers, kept as two
indexes of integers per device: a peer's subnet base -> its VTEP MAC -> its lease (the
base is the lease's own integer, the MAC decoded once per lease object). From these come,
on demand, the peer's permanent neighbour (subnet base -> VTEP MAC), its permanent FDB
entry (VTEP MAC -> public address) and its onlink route via the subnet base.

The desired state holds these tables through entry sets (``VtepRoutes``,
``VtepNeighbours``, ``VtepFdb``): the data plane's programmed state is the same object, and
the next desired state shares every unchanged peer's lease and MAC, so that a peer costs
its MAC's integer and two index slots rather than three entries, their texts and three set
slots. Entries are compared with the kernel's as numbers (addresses, MAC), and so are the
kernel's messages read in their plain layout (``holds_plain``), never decoded.
Must not touch: the kernel, the store.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Set
from typing import Any

from flannel.kernel.entryset import CompactEntries
from flannel.kernel.rtnl import (
    RTN_UNICAST,
    RTNH_F_ONLINK,
    FdbEntry,
    Neighbour,
    PlainNeighbour,
    PlainRoute,
    Route,
    ip_text,
    mac_text,
)
from flannel.lease import Lease

_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_SIZE = {4: 4, 6: 16}


def mac_number(mac: str) -> int | None:
    """``0e:00:00:00:00:01`` as an integer (None for any other shape)."""
    if len(mac) != 17 or mac[2::3] != ":::::":
        return None
    try:
        return int.from_bytes(bytes.fromhex(mac.replace(":", "")), "big")
    except ValueError:
        return None


class VtepTable:
    """The peers of device ``index`` (IP ``version``): subnet base -> VTEP MAC -> lease, both
    as the integers the lease and its decoded MAC already are. The first peer of a base or
    MAC keeps it (admission lets no two peers claim one MAC)."""

    __slots__ = ("by_base", "by_mac", "index", "version")

    def __init__(self, index: int, version: int) -> None:
        self.index = index
        self.version = version
        self.by_base: dict[int, int] = {}
        self.by_mac: dict[int, Lease] = {}

    def add(self, base: int, mac: int, lease: Lease) -> None:
        if base not in self.by_base and mac not in self.by_mac:
            self.by_base[base] = mac
            self.by_mac[mac] = lease

    def mac_of(self, base: int, lease: Lease) -> int | None:
        """The MAC recorded for ``lease`` (this very object) at ``base``, if any."""
        mac = self.by_base.get(base)
        return mac if mac is not None and self.by_mac.get(mac) is lease else None

    def number(self, text: str) -> int | None:
        """An address of this table's family as an integer (None if it is none)."""
        try:
            return int.from_bytes(socket.inet_pton(_FAMILY[self.version], text), "big")
        except (OSError, ValueError):
            return None

    def _prefixlen(self, lease: Lease) -> int:
        family = lease.family(self.version)
        assert family is not None  # a peer is added for a family it has a subnet of
        return family[1]

    def _public(self, lease: Lease) -> int:
        public = lease.attrs.public_number(self.version)
        assert public is not None  # likewise
        return public

    def _text(self, number: int) -> str:
        # Through the C library for IPv4 (rtnl.ip_text): the same text as ipaddress'.
        return ip_text(number.to_bytes(_SIZE[self.version], "big"))

    def neighbour(self, base: int, mac: int) -> Neighbour:
        return Neighbour(self.index, self._text(base), _mac_text(mac))

    def fdb(self, mac: int, lease: Lease) -> FdbEntry:
        return FdbEntry(self.index, _mac_text(mac), self._text(self._public(lease)))

    def route(self, base: int, lease: Lease) -> Route:
        text = self._text(base)
        return Route(f"{text}/{self._prefixlen(lease)}", text, self.index, onlink=True)

    def route_at(self, dst: str) -> int | None:
        """The base of the peer whose route goes to ``dst`` (CIDR text), if any."""
        address, _, length = dst.partition("/")
        base = self.number(address)
        mac = self.by_base.get(base) if base is not None else None
        if base is None or mac is None or str(self._prefixlen(self.by_mac[mac])) != length:
            return None
        return base


def _mac_text(mac: int) -> str:
    return mac_text(mac.to_bytes(6, "big"))


class _Tables(CompactEntries[Any]):
    """Entries of every VTEP device's peers, one per peer and device."""

    __slots__ = ("by_index", "tables")

    def __init__(self, tables: tuple[VtepTable, ...]) -> None:
        self.tables = tables
        # A pass that reads the kernel back asks for a table once per entry.
        self.by_index = {t.index: t for t in reversed(tables)}  # the first of an index wins

    def table(self, index: int) -> VtepTable | None:
        return self.by_index.get(index)

    def __len__(self) -> int:
        return sum(len(t.by_base) for t in self.tables)

    def added_in_order(self, other: Set[Any]) -> Iterator[Any] | None:
        # Against a set of the same kind (an incremental pass) the difference compares
        # integers and makes the changed peers' entries only: sorted as a set.
        if other is self or isinstance(other, _Tables):
            return None
        return (entry for table in self.tables for entry in self._ordered(table)
                if entry not in other)

    def _ordered(self, table: VtepTable) -> Iterator[Any]:
        """Every entry of one device's table, in the order of the integers keeping them."""
        raise NotImplementedError

    def _pairs(self, other: Set[Any]) -> Iterator[tuple[VtepTable, VtepTable | None]]:
        assert isinstance(other, _Tables)
        for table in self.tables:
            theirs = other.table(table.index)
            yield table, theirs if theirs is not None and theirs.version == table.version \
                else None


class VtepNeighbours(_Tables):
    """The permanent neighbours: a peer's subnet base -> its VTEP MAC."""

    __slots__ = ()

    def __iter__(self) -> Iterator[Neighbour]:
        for table in self.tables:
            for base, mac in table.by_base.items():
                yield table.neighbour(base, mac)

    def _ordered(self, table: VtepTable) -> Iterator[Neighbour]:
        by_base = table.by_base
        return (table.neighbour(base, by_base[base]) for base in sorted(by_base))

    def __contains__(self, entry: object) -> bool:
        if not isinstance(entry, Neighbour) or (table := self.table(entry.ifindex)) is None:
            return False
        base = table.number(entry.ip)
        mac = table.by_base.get(base) if base is not None else None
        return mac is not None and mac == mac_number(entry.mac)

    def holds_plain(self, plain: PlainNeighbour) -> bool:
        ifindex, _state, _flags, ip, mac = plain
        table = self.by_index.get(ifindex)
        return table is not None and table.version == 4 \
            and table.by_base.get(int.from_bytes(ip, "big")) == int.from_bytes(mac, "big")

    def wants(self, identity: tuple[Any, ...]) -> bool:
        ifindex, ip = identity
        table = self.table(ifindex)
        return table is not None and table.number(ip) in table.by_base

    def __sub__(self, other: Set[Any]) -> frozenset[Any]:
        if other is self or not isinstance(other, VtepNeighbours):
            return super().__sub__(other)
        out = []
        for table, theirs in self._pairs(other):
            for base, mac in table.by_base.items():
                if theirs is None or theirs.by_base.get(base) != mac:
                    out.append(table.neighbour(base, mac))
        return frozenset(out)


class VtepFdb(_Tables):
    """The permanent FDB entries: a peer's VTEP MAC -> its public address."""

    __slots__ = ()

    def __iter__(self) -> Iterator[FdbEntry]:
        for table in self.tables:
            for mac, lease in table.by_mac.items():
                yield table.fdb(mac, lease)

    def _ordered(self, table: VtepTable) -> Iterator[FdbEntry]:
        by_mac = table.by_mac
        return (table.fdb(mac, by_mac[mac]) for mac in sorted(by_mac))

    def __contains__(self, entry: object) -> bool:
        if not isinstance(entry, FdbEntry) or entry.port or entry.vni or entry.via \
                or (table := self.table(entry.ifindex)) is None:
            return False
        mac = mac_number(entry.mac)
        lease = table.by_mac.get(mac) if mac is not None else None
        return lease is not None and table._public(lease) == table.number(entry.dst)

    def holds_plain(self, plain: PlainNeighbour) -> bool:
        ifindex, _state, _flags, ip, mac = plain
        table = self.by_index.get(ifindex)
        lease = table.by_mac.get(int.from_bytes(mac, "big")) if table is not None else None
        return lease is not None and table is not None and table.version == 4 \
            and table._public(lease) == int.from_bytes(ip, "big")

    def wants(self, identity: tuple[Any, ...]) -> bool:
        ifindex, mac = identity
        table = self.table(ifindex)
        return table is not None and mac_number(mac) in table.by_mac

    def __sub__(self, other: Set[Any]) -> frozenset[Any]:
        if other is self or not isinstance(other, VtepFdb):
            return super().__sub__(other)
        out = []
        for table, theirs in self._pairs(other):
            for mac, lease in table.by_mac.items():
                held = theirs.by_mac.get(mac) if theirs is not None else None
                if held is not lease and (held is None
                                          or table._public(held) != table._public(lease)):
                    out.append(table.fdb(mac, lease))
        return frozenset(out)


class VtepRoutes(_Tables):
    """The onlink routes via each peer's subnet base, and ``direct``: DirectRouting's
    routes via the public address of the peers on-link on the underlay."""

    __slots__ = ("_direct_keys", "direct")

    def __init__(self, tables: tuple[VtepTable, ...], direct: frozenset[Route]) -> None:
        super().__init__(tables)
        self.direct = direct
        self._direct_keys: frozenset[tuple[str, int]] | None = None

    def __len__(self) -> int:
        return super().__len__() + len(self.direct)

    def __iter__(self) -> Iterator[Route]:
        yield from self.direct
        for table in self.tables:
            for base, mac in table.by_base.items():
                yield table.route(base, table.by_mac[mac])

    def added_in_order(self, other: Set[Any]) -> Iterator[Any] | None:
        # DirectRouting's routes are entries already: the whole set is sorted.
        return None if self.direct else super().added_in_order(other)

    def _ordered(self, table: VtepTable) -> Iterator[Route]:
        by_base, by_mac = table.by_base, table.by_mac
        return (table.route(base, by_mac[by_base[base]]) for base in sorted(by_base))

    def __contains__(self, entry: object) -> bool:
        if not isinstance(entry, Route):
            return False
        if self.direct and entry in self.direct:  # hashing a route costs more than the rest
            return True
        if not entry.onlink or entry.kind != RTN_UNICAST or entry.metric \
                or (table := self.table(entry.oif)) is None:
            return False
        base = table.route_at(entry.dst)
        return base is not None and entry.gateway is not None \
            and table.number(entry.gateway) == base

    def holds_plain(self, plain: PlainRoute) -> bool:
        _protocol, _table, kind, flags, oif, dst, dst_len, gateway = plain
        table = self.by_index.get(oif)
        if table is None or table.version != 4 or kind != RTN_UNICAST \
                or not flags & RTNH_F_ONLINK or dst != gateway:
            return False  # a DirectRouting route, or none of ours: decoded and asked
        mac = table.by_base.get(int.from_bytes(dst, "big"))
        return mac is not None and table._prefixlen(table.by_mac[mac]) == dst_len

    def wants(self, identity: tuple[Any, ...]) -> bool:
        dst, metric = identity
        if self._direct_keys is None:
            self._direct_keys = frozenset((r.dst, r.metric) for r in self.direct)
        if identity in self._direct_keys:
            return True
        return metric == 0 and any(t.route_at(dst) is not None for t in self.tables)

    def __sub__(self, other: Set[Any]) -> frozenset[Any]:
        if other is self or not isinstance(other, VtepRoutes):
            return super().__sub__(other)
        out = list(self.direct - other.direct)
        for table, theirs in self._pairs(other):
            for base, mac in table.by_base.items():
                lease = table.by_mac[mac]
                held_mac = theirs.by_base.get(base) if theirs is not None else None
                held = theirs.by_mac.get(held_mac) if theirs is not None \
                    and held_mac is not None else None
                if held is not lease and (held is None
                                          or table._prefixlen(held) != table._prefixlen(lease)):
                    out.append(table.route(base, lease))
        return frozenset(out)
