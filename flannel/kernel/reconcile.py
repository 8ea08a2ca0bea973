"""Reconciliation: make the kernel's routes, neighbours and FDB entries match desired state.

Owns the diff between what a backend wants (derived from the current lease set) and what the
kernel has (read back in a full pass; in an incremental pass, what the previous pass made it
hold), the batched apply of that diff (one synchronous pass), and the ownership rules
that say which kernel entries are ours and which kernel events are drift. When passes run,
in which thread and with which socket is the data plane's (``flannel.dataplane.loop``).

Ours are: routes with ``RTPROT_FLANNEL``; every permanent neighbour and ``self`` FDB entry on
a device we own; and, adopted from a previous flannel (Go flannel installs its routes with
the default protocol), unicast routes of protocol unspec/boot/static in the main table whose
destination lies strictly inside a configured Network, outside our own subnet, and that
either sit on a device we own or go via a gateway on the external interface (host-gw and
DirectRouting routes). Adopted routes are replaced with ours when wanted and deleted when
not; nothing else is touched.
Must not touch: the store; links and addresses (the backend's ``ensure_local`` does those;
here they are only compared, to notice drift); tasks, threads and sockets' lifetimes.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import operator
import socket
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network
from typing import Any, Protocol

from flannel.kernel import events, rtnl
from flannel.kernel.entryset import CompactEntries
from flannel.kernel.rtnl import AF_BRIDGE, FdbEntry, Neighbour, Route
from flannel.log import V4
from flannel.untrusted.netutil import within

log = logging.getLogger(__name__)

IPNetwork = IPv4Network | IPv6Network

#: Protocols of routes a hand or Go flannel (netlink's default) installs; routes of any other
#: protocol (kernel, ra, dhcp, routing daemons) are never adopted.
ADOPTABLE_PROTOCOLS = frozenset({rtnl.RTPROT_UNSPEC, rtnl.RTPROT_BOOT, rtnl.RTPROT_STATIC})


@dataclass(frozen=True)
class LinkState:
    """A device we own and the attributes it must keep; ``carrier``: losing the carrier is
    drift (a TUN loses it when the program serving it exits)."""

    index: int
    name: str
    mtu: int
    mac: str
    carrier: bool = False


@dataclass(frozen=True)
class DesiredState:
    """What the kernel must hold. Neighbours/FDB are managed only on ``devices``. The
    entries are frozensets, or sets a backend keeps compact (``CompactEntries``).

    ``links`` and ``addresses`` (``(ifindex, "ip/len")``) describe our devices, so that a
    change to them is noticed; ``networks`` (the configured Network(s)), ``local_subnets``
    (our own lease) and ``underlay`` (the external interface's index) bound route adoption.
    """

    routes: AbstractSet[Route] = frozenset()
    neighbours: AbstractSet[Neighbour] = frozenset()
    fdb: AbstractSet[FdbEntry] = frozenset()
    devices: frozenset[int] = frozenset()
    families: tuple[int, ...] = (socket.AF_INET,)
    links: frozenset[LinkState] = frozenset()
    addresses: frozenset[tuple[int, str]] = frozenset()
    networks: tuple[IPNetwork, ...] = ()
    local_subnets: tuple[IPNetwork, ...] = ()
    underlay: int = 0

    def wants_route_at(self, dst: str, metric: int) -> bool:
        """Whether a route of this (dst, metric) is wanted: what the kernel's replace
        matches on, so a route's identity."""
        if isinstance(self.routes, CompactEntries):
            return self.routes.wants((dst, metric))
        return (dst, metric) in self._route_keys

    def wants_neighbour_at(self, ifindex: int, ip: str) -> bool:
        if isinstance(self.neighbours, CompactEntries):
            return self.neighbours.wants((ifindex, ip))
        return (ifindex, ip) in self._neighbour_keys

    def wants_fdb_at(self, ifindex: int, mac: str) -> bool:
        if isinstance(self.fdb, CompactEntries):
            return self.fdb.wants((ifindex, mac))
        return (ifindex, mac) in self._fdb_keys

    # Indexes of plain sets' identities, built when first asked for.
    @functools.cached_property
    def _route_keys(self) -> frozenset[tuple[str, int]]:
        return frozenset((r.dst, r.metric) for r in self.routes)

    @functools.cached_property
    def _neighbour_keys(self) -> frozenset[tuple[int, str]]:
        return frozenset((n.ifindex, n.ip) for n in self.neighbours)

    @functools.cached_property
    def _fdb_keys(self) -> frozenset[tuple[int, str]]:
        return frozenset((f.ifindex, f.mac) for f in self.fdb)

    @functools.cached_property
    def link_by_index(self) -> dict[int, LinkState]:
        return {link.index: link for link in self.links}

    def same_frame(self, other: DesiredState) -> bool:
        """Whether ``other`` has the same devices, families and adoption bounds, so that
        only their entries differ (an incremental pass can go from one to the other)."""
        return (self.devices, self.families, self.links, self.addresses, self.networks,
                self.local_subnets, self.underlay) == (
            other.devices, other.families, other.links, other.addresses, other.networks,
            other.local_subnets, other.underlay)

    def device_name(self, index: int) -> str:
        link = self.link_by_index.get(index)
        return link.name if link else f"device {index}"


@functools.lru_cache(maxsize=4096)
def _network(cidr: str) -> IPNetwork:
    return ip_network(cidr, strict=False)


def adoptable(route: Route, protocol: int, desired: DesiredState) -> bool:
    """Whether a route of another protocol is ours all the same (see the module docstring).

    Only strictly inside a Network: a route for a whole Network (or wider) is never a peer's.
    """
    if protocol not in ADOPTABLE_PROTOCOLS or route.kind != rtnl.RTN_UNICAST:
        return False
    if not (route.oif in desired.devices
            or (desired.underlay and route.oif == desired.underlay and route.gateway)):
        return False
    dst = _network(route.dst)
    if not any(dst.version == net.version and dst.prefixlen > net.prefixlen
               and within(dst, net) for net in desired.networks):
        return False
    return not any(dst.version == own.version and dst.overlaps(own)
                   for own in desired.local_subnets)


@dataclass(frozen=True)
class ActualState:
    """Our entries in the kernel; ``adopted``: routes of another protocol that are ours."""

    routes: AbstractSet[Route]
    neighbours: AbstractSet[Neighbour]
    fdb: AbstractSet[FdbEntry]
    adopted: frozenset[Route] = frozenset()


def read_actual(sock: Netlink, desired: DesiredState) -> ActualState:
    """Our entries in the kernel. Only what could be ours is asked for: our protocol's
    routes, routes on our devices and the underlay (adoption), and the neighbours and FDB
    entries of our devices, so that a host's other tables (a bridge learning a million
    MACs, an ARP-flooded underlay) cost a pass nothing. A kernel that cannot filter dumps
    (before strict checking) sends everything in one dump, filtered here."""
    return _read(sock, desired, _Nothing())


def read_unless_converged(sock: Netlink, desired: DesiredState) -> ActualState | None:
    """``read_actual``'s answer when the kernel holds every entry of ``desired`` (what a
    periodic pass almost always finds), None otherwise. Each entry of a dump that is one of
    desired's is counted and dropped as it is decoded, and the answer shares desired's sets
    with only the kernel's other entries added: reading back 5000 peers' tables is then
    15,000 short-lived objects, one at a time, rather than sets of them that outlive the
    dumps and leave pymalloc arenas pinned by whatever else was allocated meanwhile.
    The kernel holds one entry per identity (a route per destination, tos and metric in a
    table; a neighbour per device and IP; an FDB remote per device, MAC and destination),
    so no entry is counted twice. Desired sets that tell their entries from a message's
    plain reading (``CompactEntries.holds_plain``) count them before they are decoded."""
    counted = _Counted(desired)
    actual = _read(sock, desired, counted)
    if (counted.routes, counted.neighbours, counted.fdb_entries) != (
            len(desired.routes), len(desired.neighbours), len(desired.fdb)):
        return None
    return ActualState(desired.routes | actual.routes if actual.routes else desired.routes,
                       desired.neighbours | actual.neighbours if actual.neighbours
                       else desired.neighbours,
                       desired.fdb | actual.fdb if actual.fdb else desired.fdb,
                       actual.adopted)


class _Nothing:
    """Counts nothing: every entry is kept."""

    route_plain: Callable[[rtnl.PlainRoute], bool] | None = None
    neighbour_plain: Callable[[rtnl.PlainNeighbour], bool] | None = None
    fdb_plain: Callable[[rtnl.PlainNeighbour], bool] | None = None

    def route(self, _entry: tuple[Route, int, int]) -> bool:
        return False

    def neighbour(self, _entry: tuple[Neighbour | FdbEntry, int, int]) -> bool:
        return False

    fdb = neighbour


class _Counted(_Nothing):
    """Counts (and so drops) each of desired's entries the kernel holds as ours."""

    def __init__(self, desired: DesiredState) -> None:
        self.desired = desired
        self.routes = self.neighbours = self.fdb_entries = 0
        # Sets that can tell their entries from the kernel's messages count them undecoded.
        if isinstance(desired.routes, CompactEntries):
            self.route_plain = self._route_plain
        if isinstance(desired.neighbours, CompactEntries):
            self.neighbour_plain = self._neighbour_plain
        if isinstance(desired.fdb, CompactEntries):
            self.fdb_plain = self._fdb_plain

    def _route_plain(self, plain: rtnl.PlainRoute) -> bool:
        assert isinstance(self.desired.routes, CompactEntries)
        if plain[0] == rtnl.RTPROT_FLANNEL and self.desired.routes.holds_plain(plain):
            self.routes += 1
            return True
        return False

    def _neighbour_plain(self, plain: rtnl.PlainNeighbour) -> bool:
        assert isinstance(self.desired.neighbours, CompactEntries)
        if plain[1] & rtnl.NUD_PERMANENT and self.desired.neighbours.holds_plain(plain):
            self.neighbours += 1
            return True
        return False

    def _fdb_plain(self, plain: rtnl.PlainNeighbour) -> bool:
        assert isinstance(self.desired.fdb, CompactEntries)
        if plain[1] & rtnl.NUD_PERMANENT and plain[2] & rtnl.NTF_SELF \
                and self.desired.fdb.holds_plain(plain):
            self.fdb_entries += 1
            return True
        return False

    def route(self, entry: tuple[Route, int, int]) -> bool:
        if entry[1] == rtnl.RTPROT_FLANNEL and entry[0] in self.desired.routes:
            self.routes += 1
            return True
        return False

    def neighbour(self, entry: tuple[Neighbour | FdbEntry, int, int]) -> bool:
        if entry[1] & rtnl.NUD_PERMANENT and entry[0] in self.desired.neighbours:
            self.neighbours += 1
            return True
        return False

    def fdb(self, entry: tuple[Neighbour | FdbEntry, int, int]) -> bool:
        if entry[1] & rtnl.NUD_PERMANENT and entry[2] & rtnl.NTF_SELF \
                and entry[0] in self.desired.fdb:
            self.fdb_entries += 1
            return True
        return False


def _read(sock: Netlink, desired: DesiredState, counted: _Nothing) -> ActualState:
    """Our entries in the kernel (``read_actual``) but those ``counted`` drops."""
    routes: set[Route] = set()
    adopted: set[Route] = set()
    main, unicast = rtnl.RT_TABLE_MAIN, rtnl.RTN_UNICAST
    oifs = sorted(desired.devices | {desired.underlay} - {0}) if sock.strict else [0]
    for family in desired.families:
        if sock.strict:
            routes.update(route for route, _proto, _table in sock.routes(
                family, table=main, protocol=rtnl.RTPROT_FLANNEL, kind=unicast,
                unless=counted.route, unless_plain=counted.route_plain))
        for oif in oifs:
            # Ours were read by protocol, when the kernel can select it.
            for route, proto, _table in sock.routes(
                    family, table=main, kind=unicast, oif=oif,
                    not_protocol=rtnl.RTPROT_FLANNEL if sock.strict else None,
                    unless=counted.route, unless_plain=counted.route_plain):
                if proto == rtnl.RTPROT_FLANNEL:
                    routes.add(route)
                elif adoptable(route, proto, desired):
                    adopted.add(route)
    neighbours: set[Neighbour] = set()
    fdb: set[FdbEntry] = set()
    for device in sorted(desired.devices):
        for family in desired.families:
            for entry, state, _flags in sock.neighbours(
                    family, device, unless=counted.neighbour,
                    unless_plain=counted.neighbour_plain):
                if isinstance(entry, Neighbour) and state & rtnl.NUD_PERMANENT:
                    neighbours.add(entry)
        for entry, state, flags in sock.neighbours(AF_BRIDGE, device, unless=counted.fdb,
                                                   unless_plain=counted.fdb_plain):
            if isinstance(entry, FdbEntry) and state & rtnl.NUD_PERMANENT \
                    and flags & rtnl.NTF_SELF:
                fdb.add(entry)
    return ActualState(frozenset(routes), frozenset(neighbours), frozenset(fdb),
                       frozenset(adopted))


def plan(desired: DesiredState, actual: ActualState) -> Iterator[tuple[str, object]]:
    """The requests that turn ``actual`` into ``desired``: adds first, in the order traffic
    needs them (neighbour, FDB, route), then deletions of what is no longer wanted.

    A wanted route held under another protocol (adopted) is replaced, which makes it ours.
    An entry is deleted only if nothing desired shares its identity (a route's destination
    and metric, a neighbour's device and IP), so that a replaced route or neighbour is never
    deleted after its replacement went in.

    Made a kind at a time as the requests are taken: a pass holds one kind's entries at a
    time, never every request of the pass (a first pass over 20,000 peers made 60,000
    entries at once, whose heap the allocator kept after they were freed).
    """
    yield from (("replace", n) for n in _added(desired.neighbours, actual.neighbours))
    yield from (("replace", f) for f in _added(desired.fdb, actual.fdb))
    yield from (("replace", r) for r in _added(desired.routes, actual.routes))
    # Each difference apart: the union of the two would copy every route.
    yield from (("delete", r) for r in _sorted((actual.routes - desired.routes)
                                               | (actual.adopted - desired.routes))
                if not desired.wants_route_at(r.dst, r.metric))
    yield from (("delete", f) for f in _sorted(actual.fdb - desired.fdb))
    yield from (("delete", n) for n in _sorted(actual.neighbours - desired.neighbours)
                if not desired.wants_neighbour_at(n.ifindex, n.ip))


def _added(desired: AbstractSet[Any], actual: AbstractSet[Any]) -> Iterable[Any]:
    """The entries of ``desired`` that ``actual`` lacks, in a stable order: made as they are
    taken when the desired set can (``CompactEntries.added_in_order``), else sorted."""
    if isinstance(desired, CompactEntries):
        added = desired.added_in_order(actual)
        if added is not None:
            return added
    return _sorted(desired - actual)


_FIELDS = {cls: operator.attrgetter(*(f.name for f in dataclasses.fields(cls)))
           for cls in (Route, Neighbour, FdbEntry)}


def _sorted(entries: AbstractSet[Route] | AbstractSet[Neighbour] | AbstractSet[FdbEntry]
            ) -> list[Any]:
    """The entries (all of one class) in their dataclass order, compared in C: the
    generated ``__lt__`` would take ~0.1 s to sort a 5000-peer snapshot."""
    for first in entries:
        return sorted(entries, key=_FIELDS[type(first)])
    return []


def drift(desired: DesiredState, event: events.KernelEvent) -> str:
    """Why ``event`` means the kernel no longer matches ``desired`` ("" when it does not).

    The same ownership rules as ``read_actual``: whatever a pass would change, an event
    showing it is drift; our own changes (which match ``desired``) are not.
    """
    obj = event.obj
    if isinstance(obj, rtnl.Link):
        return _link_drift(desired, obj, event.deleted)
    if isinstance(obj, rtnl.Address):
        return _address_drift(desired, obj, event.deleted)
    if isinstance(obj, Route):
        return _route_drift(desired, obj, event.deleted, event.protocol)
    if isinstance(obj, Neighbour):
        return _neighbour_drift(desired, obj, event.deleted, event.state)
    return _fdb_drift(desired, obj, event.deleted, event.state, event.flags)


def _link_drift(desired: DesiredState, link: rtnl.Link, deleted: bool) -> str:
    if link.index not in desired.devices:
        return ""
    name = link.name or desired.device_name(link.index)
    if deleted:
        return f"device {name} deleted"
    want = desired.link_by_index.get(link.index)
    if want is None:
        return f"device {name} changed"
    if link.name and link.name != want.name:
        return f"device {want.name} renamed to {link.name}"
    if not link.up:
        return f"device {name} down"
    if link.mtu and link.mtu != want.mtu:
        return f"device {name} MTU changed to {link.mtu} (want {want.mtu})"
    if link.mac and link.mac != want.mac:
        return f"device {name} MAC changed to {link.mac} (want {want.mac})"
    if want.carrier and not link.carrier:
        return f"device {name} lost its carrier"
    return ""


def _address_drift(desired: DesiredState, addr: rtnl.Address, deleted: bool) -> str:
    if addr.index not in desired.devices:
        return ""
    where = desired.device_name(addr.index)
    wanted = (addr.index, addr.cidr) in desired.addresses
    if deleted:
        return f"address {addr.cidr} removed from {where}" if wanted else ""
    if wanted:
        return ""
    ip = ip_address(addr.cidr.partition("/")[0])
    if any(ip in net for net in desired.networks):
        return f"stray address {addr.cidr} on {where}"
    return ""


def _route_drift(desired: DesiredState, route: Route, deleted: bool, protocol: int) -> str:
    if route.kind != rtnl.RTN_UNICAST:
        return ""  # blackhole routes are kernel/blackhole.py's
    wanted = route in desired.routes
    if deleted:
        return f"route {route.dst} deleted" if wanted else ""
    if wanted:
        return "" if protocol == rtnl.RTPROT_FLANNEL else \
            f"route {route.dst} replaced by one of protocol {protocol}"
    if desired.wants_route_at(route.dst, route.metric):
        return f"route {route.dst} changed (via {route.gateway} dev {route.oif})"
    if protocol == rtnl.RTPROT_FLANNEL:
        return f"stray route {route.dst} with our protocol"
    if adoptable(route, protocol, desired):
        return f"stray route {route.dst} (protocol {protocol}) for a subnet of the network"
    return ""


def _neighbour_drift(desired: DesiredState, neigh: Neighbour, deleted: bool, state: int
                     ) -> str:
    if neigh.ifindex not in desired.devices:
        return ""
    if deleted:
        return f"neighbour {neigh.ip} deleted" if neigh in desired.neighbours else ""
    permanent = bool(state & rtnl.NUD_PERMANENT)
    if permanent and neigh in desired.neighbours:
        return ""  # tested first: the echo of our own change must not build the index
    if desired.wants_neighbour_at(neigh.ifindex, neigh.ip):
        return f"neighbour {neigh.ip} changed ({neigh.mac or 'no MAC'}" + (
            ")" if permanent else ", not permanent)")
    if permanent:
        return f"stray neighbour {neigh.ip} on {desired.device_name(neigh.ifindex)}"
    return ""  # resolution attempts of the kernel's own


def _fdb_drift(desired: DesiredState, entry: FdbEntry, deleted: bool, state: int, flags: int
               ) -> str:
    if entry.ifindex not in desired.devices:
        return ""
    if deleted:
        return f"fdb entry {entry.mac} deleted" if entry in desired.fdb else ""
    ours = bool(state & rtnl.NUD_PERMANENT and flags & rtnl.NTF_SELF)
    if ours and entry in desired.fdb:
        # Tested first: vxlan's FDB notifications carry no port id, so the echo of every
        # entry a pass adds comes here, and must not build (and keep) the index below.
        return ""
    if desired.wants_fdb_at(entry.ifindex, entry.mac):
        return f"fdb entry {entry.mac} changed (dst {entry.dst}" + (
            ")" if ours else ", not permanent)")
    if ours:
        return f"stray fdb entry {entry.mac} dst {entry.dst}"
    return ""  # learned entries (Learning on) come and go


class ReconcileError(Exception):
    """A pass that could not make every change; the message says which and, if known, why.

    ``cause`` is the message without the counts, which change from retry to retry;
    ``failures`` the kernel's refusals, each naming its request and entry.
    """

    def __init__(self, failed: int, attempted: int, cause: str,
                 failures: tuple[rtnl.NetlinkError, ...] = ()) -> None:
        super().__init__(f"{failed} of {attempted} changes failed, first: {cause}")
        self.cause = cause
        self.failures = failures


class Netlink(Protocol):
    """The request-socket surface a pass uses (``rtnl.Rtnl`` provides it). ``port``: the
    socket's netlink port id (0 when it has none); ``strict``: the kernel applies dump
    filters (the answers are filtered either way, this only says what a dump costs)."""

    port: int
    strict: bool

    def routes(self, family: int, *, table: int = 0, protocol: int = 0, kind: int = 0,
               oif: int = 0, not_protocol: int | None = None,
               unless: Callable[[tuple[Route, int, int]], bool] | None = None,
               unless_plain: Callable[[rtnl.PlainRoute], bool] | None = None
               ) -> list[tuple[Route, int, int]]: ...

    def neighbours(self, family: int, ifindex: int = 0, *,
                   unless: Callable[[tuple[Neighbour | FdbEntry, int, int]], bool] | None = None,
                   unless_plain: Callable[[rtnl.PlainNeighbour], bool] | None = None
                   ) -> list[tuple[Neighbour | FdbEntry, int, int]]: ...

    def run(self, ops: Iterable[tuple[str, object]]) -> list[rtnl.NetlinkError]: ...

    def route_get(self, dst: rtnl.IPAddress) -> Route | None: ...

    def close(self) -> None: ...


def reconcile(sock: Netlink, desired: DesiredState,
              hint: Callable[[rtnl.NetlinkError], str] | None = None) -> Counter[str]:
    """One synchronous pass: read our entries, apply the difference; the changes made, by
    kind (``kind``).

    Raises ``ReconcileError`` when the kernel refused any change (every change is still
    attempted); ``hint`` turns the first refusal into advice ("" when it has none).
    """
    actual = read_unless_converged(sock, desired) or read_actual(sock, desired)
    if actual.adopted:
        # Those the plan replaces with ours or deletes, as ``plan`` chooses them.
        taken = sorted(r for r in actual.adopted
                       if (r in desired.routes and r not in actual.routes)
                       or (r not in desired.routes
                           and not desired.wants_route_at(r.dst, r.metric)))
        if taken:
            log.info("taking over %d route(s) of another protocol that a previous flannel "
                     "left in the network, e.g. %s via %s", len(taken), taken[0].dst,
                     taken[0].gateway)
    return _apply(sock, plan(desired, actual), hint)


def reconcile_difference(sock: Netlink, programmed: DesiredState, desired: DesiredState,
                         hint: Callable[[rtnl.NetlinkError], str] | None = None
                         ) -> Counter[str]:
    """An incremental pass: go from ``programmed`` (what a previous pass made the kernel hold,
    with no drift seen since) to ``desired`` without reading the kernel back; the changes
    made. The same plan as ``reconcile`` with ``programmed`` standing for the kernel's
    entries, so the same adds-before-deletes order and identity rules; raises
    ``ReconcileError`` likewise. Both states must have the same frame (``same_frame``)."""
    actual = ActualState(programmed.routes, programmed.neighbours, programmed.fdb)
    return _apply(sock, plan(desired, actual), hint)


def _apply(sock: Netlink, ops: Iterable[tuple[str, object]],
           hint: Callable[[rtnl.NetlinkError], str] | None) -> Counter[str]:
    """Send ``ops`` as they come (the socket sends them in chunks; nothing to send, the
    socket is not used); the changes by kind."""
    changes: Counter[str] = Counter()
    pending = iter(ops)
    head = next(pending, None)
    if head is None:
        return changes
    pending = itertools.chain((head,), pending)
    del head  # each request lives only until it is sent
    verbose = log.isEnabledFor(V4)

    def counted() -> Iterator[tuple[str, object]]:
        for verb, obj in pending:
            changes[kind(obj)] += 1
            if verbose:
                log.log(V4, "netlink: %s %s %s", verb, kind(obj), obj)
            yield verb, obj
    failures = sock.run(counted())
    if failures:
        first = failures[0]
        advice = hint(first) if hint is not None else ""
        raise ReconcileError(len(failures), changes.total(),
                             f"{first.strerror}{'; ' + advice if advice else ''}",
                             tuple(failures)) from first
    return changes


def kind(obj: object) -> str:
    """The kind of an entry a pass changes or an event reports, for counters and logs."""
    return {Route: "route", Neighbour: "neighbour", FdbEntry: "fdb", rtnl.Link: "link",
            rtnl.Address: "address"}.get(type(obj), type(obj).__name__.lower())
