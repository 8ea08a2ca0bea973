"""What flanneld does with each lease on this node, as its backend describes it, and what
this node's kernel and engines hold of it.

Owns building the backend's ``NodeView`` from this network namespace (devices, the external
interface, route lookups: read over netlink, never changed), the description of every lease
the store holds (the lease watcher's own checks first, then the backend's with its
admission, so a lease is judged as flanneld judges it: ``flannel/backend/plan.py``), reading
this namespace's routes, neighbours and FDB entries, and saying, per peer, which of the
entries its plan lists are missing or differ. ``doctor`` and ``check`` share it; neither
knows any backend.
Must not touch: anything (it reads).
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from flannel.backend.plan import (
    Description,
    EngineReading,
    FamilyPlan,
    IPAddress,
    NodeView,
    PeerPlan,
)
from flannel.kernel import links, rtnl
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease

if TYPE_CHECKING:
    from flannel.backend.base import Backend
    from flannel.config import NetworkConfig

MAIN_TABLE = 254
NOT_DONE = "flanneld here has not programmed that lease"


def read_node(config: NetworkConfig, own: Lease | None) -> NodeView:
    """This namespace as the backend's description needs it (read-only): its devices, the
    interface holding our public address, route lookups."""
    public, public6 = (own.attrs.public_ip, own.attrs.public_ipv6) if own else (None, None)
    devices: dict[str, int] = {}
    underlay = 0
    try:
        with rtnl.Rtnl() as sock:
            devices = {d.link.name: d.link.index for d in links.dump_links(sock) if d.link.name}
            for address in links.dump_addresses(sock):
                if address.address in (public, public6):
                    underlay = address.index
                    break
    except OSError:
        pass  # the kernel checks say the kernel is unreadable

    def route_get(ip: IPAddress) -> Route | None:
        try:
            with rtnl.Rtnl() as sock:
                return sock.route_get(ip)
        except OSError:
            return None

    return NodeView(config, own, devices, underlay, public, public6, route_get)


def describe(backend: type[Backend], node: NodeView, leases: Sequence[Lease]) -> Description:
    """Every lease but ours, judged as flanneld judges it: the lease watcher's checks
    (``peer_problem``), then the backend's (BackendConfigError when its options are
    unusable)."""
    from flannel.subnet.watch import peer_problem

    own = node.own
    remote = [lease for lease in leases if own is None or not own.same_subnet(lease)]
    refused = {}
    for lease in remote:
        problem = peer_problem(lease, node.config, own)
        if problem is not None:
            refused[lease.key] = PeerPlan(lease, skipped=problem)
    described = backend.describe(node, [lease for lease in remote if lease.key not in refused])
    by_key = {plan.lease.key: plan for plan in described.peers} | refused
    return Description(described.node, tuple(by_key[lease.key] for lease in remote))


@dataclass(frozen=True)
class KernelEntries:
    """Main-table routes (and their protocol), permanent neighbours and FDB entries of this
    namespace, both families; ``error``: why they could not be read ("" when read)."""

    routes: dict[str, tuple[Route, int]] = field(default_factory=dict)  # by destination
    neighbours: dict[tuple[int, str], Neighbour] = field(default_factory=dict)
    fdb: frozenset[FdbEntry] = frozenset()
    names: dict[int, str] = field(default_factory=dict)
    error: str = ""

    def name(self, index: int) -> str:
        return self.names.get(index, f"device {index}")


def read_entries() -> KernelEntries:
    try:
        with rtnl.Rtnl() as sock:
            names = {d.link.index: d.link.name or "" for d in links.dump_links(sock)}
            routes = {route.dst: (route, proto)
                      for family in (socket.AF_INET, socket.AF_INET6)
                      for route, proto, table in sock.routes(family)
                      if table == MAIN_TABLE and route.kind == rtnl.RTN_UNICAST}
            neighbours = {(entry.ifindex, entry.ip): entry
                          for family in (socket.AF_INET, socket.AF_INET6)
                          for entry, state, _flags in sock.neighbours(family)
                          if isinstance(entry, Neighbour) and state & rtnl.NUD_PERMANENT}
            fdb = frozenset(entry for entry, state, flags in sock.neighbours(rtnl.AF_BRIDGE)
                            if isinstance(entry, FdbEntry) and state & rtnl.NUD_PERMANENT
                            and flags & rtnl.NTF_SELF)
    except OSError as err:
        return KernelEntries(error=f"cannot read this node's routes: {err.strerror or err}")
    return KernelEntries(routes, neighbours, fdb, names)


@dataclass(frozen=True)
class Gap:
    """One entry a peer's plan lists that the node lacks or holds otherwise: which kind
    (``routes``, ``neighbours``, ``fdb``, ``engine``: doctor's check names) and what."""

    kind: str
    what: str


def node_label(plan: PeerPlan, family: FamilyPlan) -> str:
    return f"node {family.public or plan.lease.attrs.public_ip}"


def kernel_gaps(plan: PeerPlan, family: FamilyPlan, kernel: KernelEntries) -> list[Gap]:
    """The routes, neighbours and FDB entries of one peer family the kernel lacks. Entries
    on a device that does not exist are not listed: the device check says it is missing."""
    gaps = []
    node = node_label(plan, family)
    for route in sorted(family.routes):
        if not route.oif:
            continue  # its device does not exist: the device check says so
        held = kernel.routes.get(route.dst)
        if held is None and route.dst != str(family.subnet):
            # A route over the whole Network stands for every peer of the backend.
            gaps.append(Gap("routes", f"no route to the Network {route.dst} through "
                            f"{kernel.name(route.oif)}: no traffic to other nodes"))
        elif held is None:
            gaps.append(Gap("routes", f"no route to {family.subnet} ({node})"))
        elif (held[0].gateway, held[0].oif) != (route.gateway, route.oif):
            gaps.append(Gap("routes", f"the route to {route.dst} goes via "
                            f"{held[0].gateway or '-'} dev {kernel.name(held[0].oif)}; {node} "
                            f"needs via {route.gateway or '-'} dev {kernel.name(route.oif)}"))
    for neighbour in sorted(family.neighbours):
        have = kernel.neighbours.get((neighbour.ifindex, neighbour.ip))
        if neighbour.ifindex and (have is None or have.mac != neighbour.mac):
            seen = f"has {have.mac}" if have is not None else "is missing"
            gaps.append(Gap("neighbours", f"the neighbour entry {neighbour.ip} -> "
                            f"{neighbour.mac} for {node} {seen} on "
                            f"{kernel.name(neighbour.ifindex)}"))
    for entry in sorted(family.fdb):
        if entry.ifindex and entry not in kernel.fdb:
            gaps.append(Gap("fdb", f"no FDB entry {entry.mac} dst {entry.dst} on "
                            f"{kernel.name(entry.ifindex)}: traffic to {node} has nowhere "
                            "to go"))
    return gaps


def engine_gaps(plan: PeerPlan, family: FamilyPlan, reading: EngineReading,
                skip: Collection[str] = ()) -> list[Gap]:
    """The engine entries of one peer family the engine lacks or holds otherwise (but those
    in a place of ``skip``)."""
    gaps = []
    node = node_label(plan, family)
    for want in family.engine:
        if want.place in skip:
            continue
        have = reading.entries.get(want.identity)
        if have is None:
            gaps.append(Gap("engine", f"the {want.kind} {want.key} for {node} "
                            f"({family.subnet}) is missing in {want.place}"))
            continue
        differ = [f"{name} {dict(have.fields).get(name, 'none')} (wanted {value})"
                  for name, value in want.fields if dict(have.fields).get(name) != value]
        if differ:
            gaps.append(Gap("engine", f"the {want.kind} {want.key} for {node} in "
                            f"{want.place} has " + ", ".join(differ)))
    return gaps


def flanneld_root(pids: Sequence[int]) -> Path | None:
    """The file system flanneld sees (its /run may be its own, as in a lab node)."""
    return Path(f"/proc/{pids[0]}/root") if pids else None
