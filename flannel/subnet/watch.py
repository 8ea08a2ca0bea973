"""Lease event normalisation shared by every subnet manager (upstream ``LeaseWatcher``).

Owns the cache of remote leases: our own lease is never reported, a removal carries the
cached attributes, and a snapshot (after a relist) is diffed against the cache so that only
real changes come out. Owns also the peer filter: a lease whose subnet lies outside the
Network, has the wrong length, overlaps ours, or whose public address is unusable (not
unicast, inside the Network, or this node's own) never reaches a backend; it is counted
and logged once per key and reason (see ``flannel.reporting.skips``).
Must not touch: the store, the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from flannel.config import NetworkConfig
from flannel.lease import Event, EventType, Lease
from flannel.reporting.skips import SkippedRecords
from flannel.untrusted.netutil import unusable_address


@dataclass(frozen=True)
class Snapshot:
    """The complete set of leases at one point (first list, or relist after compaction)."""

    leases: list[Lease]


@dataclass(frozen=True)
class Changes:
    """Incremental lease events, in store order."""

    events: list[Event]


LeaseUpdate = Snapshot | Changes


@dataclass
class WatchResult:
    events: list[Event]
    own_lease_removed: bool = False


def _span(network: IPv4Network | IPv6Network) -> tuple[int, int]:
    """The first and last address of ``network`` as integers: containment and overlap in
    integer arithmetic (``ipaddress``'s tests cost ~15 us per peer of a snapshot)."""
    return _last((int(network.network_address), network.prefixlen), network.max_prefixlen)


def _last(family: tuple[int, int], bits: int) -> tuple[int, int]:
    """(first, last) address of a lease's subnet given as (first, prefix length)."""
    first, prefixlen = family
    return first, first | ((1 << (bits - prefixlen)) - 1)


def _subnet(lease: Lease, v6: bool) -> IPv4Network | IPv6Network | None:
    """A subnet of the lease as an object, made only to be named in a message."""
    return lease.ipv6_subnet if v6 else lease.subnet


def _family_problem(lease: Lease, config: NetworkConfig | None, own: Lease | None,
                    v6: bool) -> str | None:
    """What is wrong with one family of a remote lease, or None."""
    public: IPv4Address | IPv6Address | None
    network: IPv4Network | IPv6Network | None
    our_public: IPv4Address | IPv6Address | None
    version, bits = (6, 128) if v6 else (4, 32)
    if v6:
        public, names = lease.attrs.public_ipv6, ("IPv6Network", "IPv6SubnetLen", "PublicIPv6")
        network, subnet_len = (config.ipv6_network, config.ipv6_subnet_len) if config else (
            None, 0)
        our_public = own.attrs.public_ipv6 if own else None
    else:
        public, names = lease.attrs.public_ip, ("Network", "SubnetLen", "PublicIP")
        network, subnet_len = (config.network, config.subnet_len) if config else (None, 0)
        our_public = own.attrs.public_ip if own else None
    family = lease.family(version)
    assert family is not None
    first, last = _last(family, bits)
    net_first = net_last = -1
    if network is not None:
        net_first, net_last = _span(network)
        if first <= net_first and net_last <= last:
            return f"subnet {_subnet(lease, v6)} covers the whole {names[0]} {network}"
        if not (net_first <= first and last <= net_last):
            return f"subnet {_subnet(lease, v6)} lies outside the {names[0]} {network}"
    if subnet_len and family[1] != subnet_len:
        return f"subnet {_subnet(lease, v6)} is not a /{subnet_len} ({names[1]})"
    ours = own.family(version) if own else None
    if ours is not None:
        ours_first, ours_last = _last(ours, bits)
        if first <= ours_last and ours_first <= last:
            return (f"subnet {_subnet(lease, v6)} overlaps this node's subnet "
                    f"{_subnet(own, v6) if own else ''}")
    if public is None:
        return f"{names[2]} is missing or {'::' if v6 else '0.0.0.0'}"
    why = unusable_address(public)
    if why is None and net_first <= int(public) <= net_last:
        why = f"it lies inside the {names[0]} {network}: a node's address is no pod's"
    if why is None and public == our_public:
        why = "it is this node's own: packets to that node would loop back here"
    return f"{names[2]} {public}: {why}" if why is not None else None


def peer_problem(lease: Lease, config: NetworkConfig | None, own: Lease | None) -> str | None:
    """Why a remote lease must not be programmed, or None when it is usable.

    Every family the cluster uses and the lease carries is checked against the config (when
    known; in kube mode SubnetLen may be 0 and then only containment is checked).
    """
    used = 0
    for v6 in (False, True):
        subnet = lease.ipv6_subnet if v6 else lease.v4_base
        enabled = config is None or (config.enable_ipv6 if v6 else config.enable_ipv4)
        if subnet is None or not enabled:
            continue
        used += 1
        problem = _family_problem(lease, config, own, v6)
        if problem is not None:
            return problem
    return None if used else "it carries no subnet of a family this cluster uses"


class LeaseWatcher:
    """Turns raw store updates into events about remote, usable leases.

    ``config`` is the network config the peers are checked against; without one only the
    checks that need no config apply (overlap with ours, usable public address).
    """

    def __init__(self, own: Lease | None, config: NetworkConfig | None = None) -> None:
        self.own = own
        self.config = config
        self.skipped = SkippedRecords("peer lease")
        self._leases: dict[str, Lease] = {}
        # By the IPv4 subnet's first address (the lease's own integer) or the IPv6 subnet.
        self._by_subnet: dict[int | IPv6Network, str] = {}

    @property
    def leases(self) -> list[Lease]:
        """The current remote leases (the desired peer set)."""
        return list(self._leases.values())

    @property
    def count(self) -> int:
        """How many remote leases there are, without copying them (read at every scrape)."""
        return len(self._leases)

    def _is_own(self, lease: Lease) -> bool:
        return self.own is not None and self.own.same_subnet(lease)

    def _find(self, lease: Lease) -> str | None:
        """The cached lease with the same subnet(s), in O(1): by key, else by either subnet
        (a dual-stack lease and a single-stack one can be the same node's)."""
        if lease.key in self._leases:
            return lease.key
        for subnet in (lease.v4_base, lease.ipv6_subnet):
            candidate = self._by_subnet.get(subnet) if subnet is not None else None
            if candidate in self._leases and self._leases[candidate].same_subnet(lease):
                return candidate
        return None

    def _index(self) -> None:
        self._by_subnet = {}
        for key, lease in self._leases.items():
            self._index_one(key, lease)

    def _index_one(self, key: str, lease: Lease) -> None:
        if lease.v4_base is not None:
            self._by_subnet[lease.v4_base] = key
        if lease.ipv6_subnet is not None:
            self._by_subnet[lease.ipv6_subnet] = key

    def apply(self, update: LeaseUpdate) -> WatchResult:
        if isinstance(update, Snapshot):
            return WatchResult(self._reset(update.leases),
                               self.own is not None and not any(
                                   self._is_own(lease) for lease in update.leases))
        return self._changes(update.events)

    def _usable(self, lease: Lease) -> bool:
        problem = peer_problem(lease, self.config, self.own)
        if problem is None:
            self.skipped.forget(lease.key)
            return True
        self.skipped.skip(lease.key, problem)
        return False

    def _reset(self, leases: Iterable[Lease]) -> list[Event]:
        remote = [lease for lease in leases if not self._is_own(lease)]
        self.skipped.keep_only({lease.key for lease in remote})
        fresh = {lease.key: lease for lease in remote if self._usable(lease)}
        batch = [Event(EventType.ADDED, lease) for key, lease in fresh.items()
                 if self._leases.get(key) != lease]
        batch += [Event(EventType.REMOVED, lease) for key, lease in self._leases.items()
                  if key not in fresh]
        self._leases = fresh
        self._index()
        return batch

    def _changes(self, events: Iterable[Event]) -> WatchResult:
        result = WatchResult([])
        for event in events:
            lease = event.lease
            if self._is_own(lease):
                if event.type is EventType.REMOVED:
                    result.own_lease_removed = True
                continue
            found = self._find(lease)
            if event.type is EventType.ADDED and not self._usable(lease):
                # A usable lease that turned bad is withdrawn from the backend.
                if found is not None:
                    result.events.append(Event(EventType.REMOVED, self._leases.pop(found)))
            elif event.type is EventType.ADDED:
                previous = self._leases.pop(found) if found is not None else None
                self._leases[lease.key] = lease
                self._index_one(lease.key, lease)
                # A renewal re-puts the same value under a new etcd lease: nothing to program.
                if previous is None or _published(previous) != _published(lease):
                    result.events.append(event)
            else:
                self.skipped.forget(lease.key)
                if found is not None:
                    result.events.append(Event(EventType.REMOVED, self._leases.pop(found)))
        return result


def _published(lease: Lease) -> tuple[object, ...]:
    """What a peer's data plane depends on: its subnets, attributes and age (which of two
    leases claiming one identity wins), not its expiry."""
    return lease.v4_base, lease.v4_prefixlen, lease.ipv6_subnet, lease.attrs, lease.created
