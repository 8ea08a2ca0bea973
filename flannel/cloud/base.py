"""What the cloud route engines share: their error, change and status records, the
retry-with-backoff policy for throttled API calls (at start; a data plane pass does not wait
for the cloud: it fails, and the data plane retries it with its own backoff), the
``Stopper`` that cuts every call and wait when flanneld stops, and the engine's frame
(``RouteEngineBase``: the lock, the status of every pass, the orphan grace).

Must not touch: any cloud API directly (the engines pass their calls in).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Network
from typing import TypeVar

from flannel.lease import Lease
from flannel.timing.backoff import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")


class CloudError(Exception):
    """A failure a user can act on; its message names the cause and the fix."""


class Stopped(CloudError):
    """flanneld is stopping: the call was cut, or not made."""


class Stopper:
    """Set once, when flanneld stops: every exchange registered with ``cutting`` is cut,
    every later one refused, every ``sleep`` ended. Thread-safe; ``stop`` never blocks."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._cuts: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()

    @property
    def stopped(self) -> bool:
        return self._event.is_set()

    def stop(self) -> None:
        with self._lock:  # a cut is never called once ``cutting`` has returned
            self._event.set()
            for cut in self._cuts.values():
                cut()
            self._cuts.clear()

    def check(self, what: str) -> None:
        if self._event.is_set():
            raise Stopped(f"{what}: not done, flanneld is stopping")

    def sleep(self, seconds: float, what: str = "a wait") -> None:
        """Wait ``seconds``; Stopped at once when flanneld stops meanwhile."""
        if self._event.wait(seconds):
            raise Stopped(f"{what}: cut short, flanneld is stopping")

    @contextlib.contextmanager
    def cutting(self, cut: Callable[[], None], what: str) -> Iterator[None]:
        """``cut()`` is called (from the stopping thread, quickly, never blocking) if
        flanneld stops while the block runs; Stopped at once if it already has."""
        key = next(self._ids)
        with self._lock:
            if self._event.is_set():
                raise Stopped(f"{what}: not done, flanneld is stopping")
            self._cuts[key] = cut
        try:
            yield
        finally:
            with self._lock:
                self._cuts.pop(key, None)


class Throttled(Exception):
    """Raised by an engine's call wrapper when the cloud answered "slow down"."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class RouteChange:
    """One change made to a cloud route table."""

    action: str  # "create", "replace" or "delete"
    table: str
    destination: str
    target: str

    def __str__(self) -> str:
        return f"{self.action} {self.destination} -> {self.target} in {self.table}"


@dataclass
class EngineStatus:
    """What an engine reports: where it routes, and how its last pass went."""

    backend: str
    tables: list[str] = field(default_factory=list)
    target: str = ""
    last_reconcile: float | None = None
    last_changes: list[RouteChange] = field(default_factory=list)
    last_error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.last_reconcile is not None and self.last_error is None


@dataclass(frozen=True)
class ThrottleRetry:
    """How throttled cloud API calls are retried: exponential backoff (the shared
    ``Backoff``, from ``2 * base`` doubling up to ``cap``) with full jitter (as AWS advises
    for many clients sharing a rate limit), bounded in attempts."""

    attempts: int = 6
    base: float = 0.5
    cap: float = 20.0

    def backoff(self) -> Backoff:
        return Backoff(min(2 * self.base, self.cap), self.cap)


#: One attempt: a throttled call fails at once, for the caller to retry later. A data plane
#: pass uses it: a wait in its worker thread would hold back every other pass, and shutdown.
NO_WAIT = ThrottleRetry(attempts=1)


def with_retry(what: str, call: Callable[[], T], backoff: ThrottleRetry,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Run ``call``; on ``Throttled`` wait and retry, at most ``backoff.attempts`` times.

    Every retry is logged with the wait, so an operator sees throttling as it happens.
    """
    delays = backoff.backoff()
    for attempt in range(1, backoff.attempts):
        try:
            return call()
        except Throttled as throttled:
            wait = random.uniform(0, delays.grow())  # full jitter
            log.warning("%s throttled (%s); retrying in %.2fs (attempt %d of %d)",
                        what, throttled.code, wait, attempt + 1, backoff.attempts)
            sleep(wait)
    try:
        return call()
    except Throttled as throttled:
        if backoff.attempts == 1:
            raise CloudError(f"{what}: the cloud API is throttling ({throttled.code}); the "
                             "pass is retried with backoff") from None
        raise CloudError(
            f"{what}: the cloud API kept throttling ({throttled.code}) after "
            f"{backoff.attempts} attempts; the next reconciliation tries again "
            "(other clients in this account may be using up the request rate)"
        ) from None


class OrphanGrace:
    """Which routes without a lease may go: only those a second pass in a row finds so.

    A node that has just joined routes its subnet right after acquiring its lease; a peer's
    pass working from a lease snapshot a moment older must not take that route for the route
    of a vanished lease. The next pass sees the new lease. Use: ``begin()``, then
    ``confirmed(table, destination)`` for each route without a lease, then ``end()`` once the
    pass has gone through every table.
    """

    def __init__(self) -> None:
        self._seen: set[tuple[str, IPv4Network]] = set()
        self._now: set[tuple[str, IPv4Network]] = set()

    def begin(self) -> None:
        self._now = set()

    def confirmed(self, table: str, destination: IPv4Network) -> bool:
        self._now.add((table, destination))
        return (table, destination) in self._seen

    def end(self) -> None:
        self._seen = self._now


def route_in_network(destination: object, network: IPv4Network) -> IPv4Network | None:
    """A route's destination when it lies strictly inside ``network`` (never the Network
    itself or anything wider): only such routes can be flannel's."""
    try:
        subnet = IPv4Network(str(destination or ""))
    except ValueError:
        return None
    if subnet.prefixlen > network.prefixlen and subnet.subnet_of(network):
        return subnet
    return None


def live_subnets(engine: str, own_lease: Lease, peer_leases: Iterable[Lease]
                 ) -> tuple[IPv4Network, set[IPv4Network]]:
    """Our IPv4 subnet and every subnet that has a lease (ours included)."""
    if own_lease.subnet is None:
        raise CloudError(f"{engine} routes IPv4 subnets only; our lease has none")
    own = own_lease.subnet
    return own, {own} | {lease.subnet for lease in peer_leases if lease.subnet is not None}


class ApiError(CloudError):
    """A cloud API refused a call: the service, the action, its code and message (cut), and
    a hint at the fix when the code names one."""

    def __init__(self, service: str, action: str, code: str, message: str,
                 hint: str = "") -> None:
        super().__init__(f"{service} {action} failed: {code}: {message[:300]}{hint}")
        self.code = code


class RouteEngineBase(ABC):
    """What both engines do around their own calls: one lock serialising them, the status
    record, the orphan grace, and ``reconcile()`` keeping the status of every pass."""

    #: The backend's name, as the log and the status say it.
    name = ""

    def __init__(self, backoff: ThrottleRetry | None, sleep: Callable[[float], None] | None,
                 stopper: Stopper | None = None) -> None:
        self.backoff = backoff or ThrottleRetry()
        #: Cuts every call in flight and every wait when flanneld stops (``interrupt``).
        self.stopper = stopper or Stopper()
        self._sleep = sleep or self.stopper.sleep
        self._retry = self.backoff  # NO_WAIT while a reconcile() that must not wait runs
        self._lock = threading.Lock()
        self._status = EngineStatus(backend=self.name)
        self._orphans = OrphanGrace()

    def _retried(self, what: str, once: Callable[[], T]) -> T:
        return with_retry(what, once, self._retry, self._sleep)

    def _orphan(self, table: str, destination: IPv4Network, target: str,
                live: set[IPv4Network], collect: bool) -> bool:
        """Whether another node's route to ``destination`` goes: only while collecting, when
        no lease holds it and the pass before found it so too (the first finding is logged).
        Called between ``self._orphans.begin()`` and ``end()``."""
        if not collect or destination in live:
            return False
        if self._orphans.confirmed(table, destination):
            return True
        log.info("%s: %s -> %s in %s has no lease; deleting it at the next pass if it still "
                 "has none", self.name, destination, target, table)
        return False

    def interrupt(self) -> None:
        """flanneld is stopping: the call or wait under way ends at once (Stopped, a
        CloudError), and so does every later one. Any thread; never blocks."""
        self.stopper.stop()

    @abstractmethod
    def _prepared(self) -> bool:
        """Whether ``prepare()`` has run."""

    @abstractmethod
    def _reconcile(self, own: IPv4Network, live: set[IPv4Network],
                   collect: bool) -> list[RouteChange]:
        """One pass over the route table(s), under the lock."""

    def reconcile(self, own_lease: Lease, peer_leases: Iterable[Lease], *,
                  collect: bool = True, wait_throttled: bool = True) -> list[RouteChange]:
        """Make the route tables match the leases; idempotent. Returns what was changed.

        ``collect=False`` only routes our subnet (at start, before the peers are known).
        ``wait_throttled=False``: a throttled call fails the reconcile at once (a data plane
        pass: it retries with its own backoff) instead of waiting and trying again."""
        own, live = live_subnets(self.name, own_lease, peer_leases)
        with self._lock:
            if not self._prepared():
                raise CloudError(f"{self.name}: reconcile() before prepare()")
            self._retry = self.backoff if wait_throttled else NO_WAIT
            try:
                changes = self._reconcile(own, live, collect)
            except CloudError as error:
                self._status.last_error = str(error)
                raise
            finally:
                self._retry = self.backoff
            self._status.last_reconcile = time.time()
            self._status.last_changes = changes
            self._status.last_error = None
            return changes

    def status(self) -> EngineStatus:
        with self._lock:
            return replace(self._status, tables=list(self._status.tables),
                           last_changes=list(self._status.last_changes),
                           warnings=list(self._status.warnings))
