"""Records from the store that flanneld cannot use: logged once per key and reason, counted.

A bad record is skipped, never fatal; its warning appears when the key is first seen bad and
again only when the reason changes, so a watch that redelivers it does not flood the log.
Owns: that bookkeeping. Must not touch: the store, the kernel.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


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

    def keep_only(self, keys: set[str]) -> None:
        """After a full listing: drop what no longer exists."""
        self._reasons = {k: v for k, v in self._reasons.items() if k in keys}
