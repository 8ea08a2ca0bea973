"""Lease event normalisation shared by every subnet manager (upstream ``LeaseWatcher``).

Owns the cache of remote leases: our own lease is never reported, a removal carries the
cached attributes, and a snapshot (after a relist) is diffed against the cache so that only
real changes come out. Must not touch: the store, the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flannel.lease import Event, EventType, Lease


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


class LeaseWatcher:
    """Turns raw store updates into events about remote leases."""

    def __init__(self, own: Lease | None) -> None:
        self.own = own
        self._leases: dict[str, Lease] = {}
        self._by_subnet: dict[str, str] = {}

    @property
    def leases(self) -> list[Lease]:
        """The current remote leases (the desired peer set)."""
        return list(self._leases.values())

    def _is_own(self, lease: Lease) -> bool:
        return self.own is not None and self.own.same_subnet(lease)

    def _find(self, lease: Lease) -> str | None:
        """The cached lease with the same subnet(s), in O(1): by key, else by either subnet
        (a dual-stack lease and a single-stack one can be the same node's)."""
        if lease.key in self._leases:
            return lease.key
        for key in (Lease(lease.subnet).key if lease.subnet else None,
                    Lease(None, lease.ipv6_subnet).key if lease.ipv6_subnet else None):
            candidate = self._by_subnet.get(key) if key else None
            if candidate in self._leases and self._leases[candidate].same_subnet(lease):
                return candidate
        return None

    def _index(self) -> None:
        self._by_subnet = {}
        for key, lease in self._leases.items():
            self._index_one(key, lease)

    def _index_one(self, key: str, lease: Lease) -> None:
        if lease.subnet is not None:
            self._by_subnet[Lease(lease.subnet).key] = key
        if lease.ipv6_subnet is not None:
            self._by_subnet[Lease(None, lease.ipv6_subnet).key] = key

    def apply(self, update: LeaseUpdate) -> WatchResult:
        if isinstance(update, Snapshot):
            return WatchResult(self._reset(update.leases),
                               self.own is not None and not any(
                                   self._is_own(lease) for lease in update.leases))
        return self._changes(update.events)

    def _reset(self, leases: Iterable[Lease]) -> list[Event]:
        fresh = {lease.key: lease for lease in leases if not self._is_own(lease)}
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
            if event.type is EventType.ADDED:
                if found is not None:
                    del self._leases[found]
                self._leases[lease.key] = lease
                self._index_one(lease.key, lease)
                result.events.append(event)
            elif found is not None:
                result.events.append(Event(EventType.REMOVED, self._leases.pop(found)))
        return result
