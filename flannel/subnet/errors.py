"""The two kinds of store failure every subnet manager reports, and how retries are logged.

``StoreUnavailable``: retrying the same request later may succeed (store down, paused,
without a leader, credentials not yet accepted). ``StoreError``: retrying will not help; the
message says which permission, flag or record to fix. Callers retry the first with backoff
and stop on the second. ``LeaseLost`` (a ``StoreError``) ends the keeping of the lease;
``OwnLeaseRevoked``, its deliberate form, is a clean stop rather than a fault. ``RetryLog``
keeps a retried phase's log readable: each distinct error once, then summaries that repeat
the latest one, further and further apart.
Must not touch: the store itself, the kernel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class StoreUnavailable(Exception):
    """The store cannot answer now; the same request may succeed later."""


class StoreError(Exception):
    """The store refused a request for a reason retrying will not fix; the message says
    what to fix."""


class LeaseLost(StoreError):
    """This node's lease is no longer its own; the node must stop using its subnet."""


class OwnLeaseRevoked(LeaseLost):
    """Someone removed this node's lease on purpose (a decommission): stop cleanly."""


class RetryLog:
    """Logs the failures of one retried phase: each distinct error once, then a summary while
    it keeps failing, first after ``first_summary`` seconds, the interval doubling up to
    ``longest_summary``."""

    MAX_DISTINCT = 32

    def __init__(self, logger: logging.Logger, what: str, *, first_summary: float = 5.0,
                 longest_summary: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.what = what
        self.first_summary = first_summary
        self.longest_summary = longest_summary
        self._interval = first_summary
        self.clock = clock
        self.failures = 0
        self._seen: set[str] = set()
        self._started = 0.0
        self._last_log = 0.0

    def failed(self, err: BaseException | str, retry_in: float) -> None:
        now = self.clock()
        if not self.failures:
            self._started = now
        self.failures += 1
        text = str(err)
        if text not in self._seen and len(self._seen) < self.MAX_DISTINCT:
            self._seen.add(text)
            self.logger.error("%s: %s (retrying in %.1fs)", self.what, text, retry_in,
                              stacklevel=2)
            self._last_log = now
        elif now - self._last_log >= self._interval:
            self.logger.error("%s: still failing after %d attempts in %.0fs, latest: %s",
                              self.what, self.failures, now - self._started, text,
                              stacklevel=2)
            self._last_log = now
            self._interval = min(self._interval * 2, self.longest_summary)

    def succeeded(self) -> None:
        if self.failures:
            self.logger.info("%s: succeeded after %d failed attempts", self.what,
                             self.failures, stacklevel=2)
        self.failures = 0
        self._seen.clear()
        self._interval = self.first_summary


#: Every failure a command reading the store reports as a message rather than a traceback:
#: the store's two kinds (``KubeError``, the etcd store's ``Refused`` and ``StoreOpenError`` are
#: ``StoreError``), a network config that does not decode (``ConfigError`` is a
#: ``ValueError``), a file or socket refused, no answer in time.
STORE_FAILURES: tuple[type[Exception], ...] = (StoreError, StoreUnavailable, OSError, ValueError,
                                               TimeoutError)
