"""Records flanneld does not use, and peers it does not program for now.

``SkippedRecords``: records that cannot be used (a store's undecodable values, leases no
peer may have, backend data a backend cannot use, an identity another lease holds): each
logged once per key and reason, counted. A bad record is skipped, never fatal; its warning
appears when the key is first seen bad and again only when the reason changes, so a watch
that redelivers it does not flood the log.

``ParkedPeers``: peers that what programs them refused (the kernel, an extension command):
each with the reason, the version of its lease it was refused for, and its own backoff, so
that it is tried again later and at once when its lease changes, while every other peer is
programmed. Shared by the stores, the data plane and the engines.
Owns: that bookkeeping. Must not touch: the store, the kernel, logging what is parked (the
caller knows what to say).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

from flannel.timing.backoff import Backoff

log = logging.getLogger(__name__)

#: Seconds before a refused peer is tried again: first, doubling up to longest.
PARKED_BACKOFF = (5.0, 300.0)


class SkippedRecords:
    """The keys currently skipped and why, and how many records were skipped in all."""

    def __init__(self, what: str) -> None:
        self.what = what
        #: Records skipped since start (each delivery of a bad record counts).
        self.total = 0
        self._reasons: dict[str, str] = {}

    @property
    def current(self) -> dict[str, str]:
        """Key -> reason for every key that is skipped now."""
        return dict(self._reasons)

    def skip(self, key: str, reason: str) -> None:
        self.total += 1
        if self._reasons.get(key) != reason:
            self._reasons[key] = reason
            log.warning("ignoring %s %s: %s", self.what, key, reason)

    def forget(self, key: str) -> None:
        """The key is gone or usable again: a later problem with it is logged afresh."""
        self._reasons.pop(key, None)

    def keep_only(self, keys: Container[str]) -> None:
        """After a full listing: drop what no longer exists."""
        self._reasons = {k: v for k, v in self._reasons.items() if k in keys}


@dataclass
class Parked:
    """One refused peer: what refused it (``what``: "kernel", "subnet-add"...), why, for
    which version of its lease (``fingerprint``), how often, and when it is due again."""

    what: str
    reason: str
    fingerprint: object
    backoff: Backoff
    due: float = 0.0
    failures: int = 0


class ParkedPeers:
    """Refused peers by lease key, each retried with its own backoff (``PARKED_BACKOFF``):
    a peer is ``waiting`` until it is due, unless its lease changed or something else is
    tried for it. Not thread-safe: one thread parks and releases; readers on another thread
    take ``reasons()``, a copy made by the owner's thread only when it changes."""

    def __init__(self, backoff: tuple[float, float] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._backoff = backoff or PARKED_BACKOFF
        self.clock = clock
        self._parked: dict[str, Parked] = {}
        self._reasons: dict[str, str] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._parked

    def __getitem__(self, key: str) -> Parked:
        return self._parked[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parked)

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, key: str, what: str, fingerprint: object, reason: str
             ) -> tuple[Parked, bool]:
        """Refused again, or for the first time; (its record, whether it is new: not parked
        before, or parked for another lease version or by something else). Due again after
        its next backoff delay."""
        parked = self._parked.get(key)
        new = parked is None or parked.fingerprint != fingerprint or parked.what != what
        if parked is None or new:
            parked = Parked(what, reason, fingerprint, Backoff(*self._backoff))
            self._parked[key] = parked
        parked.reason = reason
        parked.failures += 1
        parked.due = self.clock() + parked.backoff.grow()
        self._published()
        return parked, new

    def waiting(self, key: str, what: str, fingerprint: object) -> bool:
        """Whether ``key`` is parked by ``what`` for this very lease and not due yet."""
        parked = self._parked.get(key)
        return (parked is not None and parked.what == what and parked.fingerprint == fingerprint
                and self.clock() < parked.due)

    def release(self, key: str) -> bool:
        """The peer was programmed, or is gone: True if it was parked."""
        if self._parked.pop(key, None) is None:
            return False
        self._published()
        return True

    def keep_only(self, keys: Container[str]) -> None:
        """Forget the peers that are no longer there."""
        gone = [key for key in self._parked if key not in keys]
        for key in gone:
            del self._parked[key]
        if gone:
            self._published()

    def retry_in(self) -> float:
        """Seconds until the next parked peer is due (at least 0.05; 0: none parked)."""
        if not self._parked:
            return 0.0
        return max(0.05, min(p.due for p in self._parked.values()) - self.clock())

    def reasons(self) -> dict[str, str]:
        """Lease key -> why, for every parked peer (a copy: safe to read from any thread)."""
        return self._reasons

    def _published(self) -> None:
        self._reasons = {key: parked.reason for key, parked in sorted(self._parked.items())}
