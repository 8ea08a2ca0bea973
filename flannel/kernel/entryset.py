"""Entry sets a backend keeps compact: a set of kernel entries (routes, neighbours, FDB
entries) that holds one small record per peer instead of the entry objects, and makes
each entry only when asked for it (iterated to encode a request, or to log one).

A ``DesiredState`` holds frozensets of entries or such sets; the reconciliation treats
both alike (membership, difference, length), and asks either whether it holds an entry of
a given identity (``wants``: a route's destination and metric, a neighbour's device and
IP, an FDB entry's device and MAC) without an index of every identity.
Must not touch: the kernel, the store.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator, Set
from typing import Any, TypeVar

T = TypeVar("T")


class CompactEntries(Set[T]):
    """A read-only set of entries made on demand from compact records. The result of a
    set operation on it is a frozenset (of the entries made)."""

    __slots__ = ()

    @abstractmethod
    def wants(self, identity: tuple[Any, ...]) -> bool:
        """Whether an entry of that identity is in the set (see the module docstring)."""

    def holds_plain(self, plain: tuple[Any, ...]) -> bool:
        """Whether the entry of a kernel message read in its plain layout (``rtnl.PlainRoute``,
        ``rtnl.PlainNeighbour``) is in the set, told without decoding it; False (the
        default) leaves the message to be decoded and asked about as an entry."""
        return False

    def added_in_order(self, other: Set[Any]) -> Iterator[T] | None:
        """The entries of this set that ``other`` lacks, made one at a time in a stable
        order of the set's own (its records' integers), or None when the set would rather
        give ``self - other`` to be sorted (the default). A first pass over an empty kernel
        then never holds every entry of a kind at once: 20,000 peers' neighbours, FDB
        entries or routes were 4 MB made, set and sorted together, whose heap the allocator
        kept in part once they were freed."""
        return None

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        return frozenset(it)

    def __sub__(self, other: Set[Any]) -> frozenset[T]:
        if other is self:  # what the kernel was found to hold is this very set
            return frozenset()
        return frozenset(entry for entry in self if entry not in other)
