"""Which remote leases a backend programs, and why it refuses the others.

Owns, for one backend, the three ways a peer lease is refused while every other peer is
programmed and readiness is not held back:

- **its data**: the backend cannot use what the lease publishes (``Backend.lease_problem``:
  a VtepMAC the kernel refuses, a WireGuard key that is none), logged once per reason;
- **its identity**: it claims an identity another lease holds (``Backend.identities``: a
  VTEP MAC per family, a WireGuard public key). An identity of our own lease is ours; any
  other belongs to the oldest lease claiming it (``Lease.age``: the store's creation order,
  then the key, which every node reads alike without coordination); a newer lease claiming
  it from another public address is refused, never merged, so that no lease can draw
  another node's traffic. Leases from one public address (a node registered again under a
  new subnet) share their identities;
- **the kernel** (or an engine) refused what was programmed for it: the peer is parked with
  the refusal as its reason (``flannel.reporting.skips.ParkedPeers``), left out of desired
  state, and tried again with its own backoff, at once when its lease changes.

Desired state is built from the admitted leases only, so a refused lease adds nothing to
the kernel and its removal takes nothing away from the lease it tried to take over.
``admit`` runs in the data plane's worker thread; what it refused is published as one
dictionary (``refused``) that readers on the event loop take whole.
Must not touch: the store, the kernel.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flannel.lease import Lease
from flannel.reporting.skips import ParkedPeers, SkippedRecords

log = logging.getLogger(__name__)

#: The kinds of refusal, as /status and /metrics name them.
INVALID_DATA, IDENTITY_TAKEN, KERNEL_REFUSED = "invalid_data", "identity_taken", "kernel_refused"
KINDS = (INVALID_DATA, IDENTITY_TAKEN, KERNEL_REFUSED)
#: What parks a peer whose entries the kernel refused.
KERNEL = "kernel"


def fingerprint(lease: Lease) -> tuple[object, ...]:
    """The version of a lease a refusal holds for: what its entries are made of."""
    return lease.subnet, lease.ipv6_subnet, lease.attrs


def _same_node(one: Lease, other: Lease) -> bool:
    return (one.attrs.public_ip, one.attrs.public_ipv6) == (
        other.attrs.public_ip, other.attrs.public_ipv6)


def _address(lease: Lease) -> object:
    return lease.attrs.public_ip or lease.attrs.public_ipv6


@dataclass(slots=True)
class _Examined:
    """One lease as last examined: the object itself, what is wrong with its data, and the
    identities it claims."""

    lease: Lease
    problem: str | None
    identities: tuple[str, ...] = field(default=())


class PeerAdmission:
    """The refusals of one backend (see the module docstring)."""

    def __init__(self, problem: Callable[[Lease], str | None],
                 identities: Callable[[Lease], tuple[str, ...]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._problem = problem
        self._identities = identities
        self._clock = clock
        self.invalid = SkippedRecords("peer")
        self.taken = SkippedRecords("peer")
        self.parked = ParkedPeers(clock=clock)
        #: Refusals since start, by kind: a lease refused anew or for another reason (data,
        #: identity), or each time the kernel refused a peer.
        self.refusals: dict[str, int] = dict.fromkeys(KINDS, 0)
        #: Lease key -> (kind, why) for every peer refused now; replaced whole, never
        #: changed, so another thread may read it.
        self.refused: dict[str, tuple[str, str]] = {}
        self._own: frozenset[str] = frozenset()
        self._examined: dict[str, _Examined] = {}
        # The last answer: the peers it was for (by identity), the parked version it saw,
        # when it must be worked out again (a parked peer due), and the admitted peers.
        self._last: tuple[Sequence[Lease], int, float, tuple[Lease, ...]] | None = None
        self._parked_version = 0

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Read time (when parked peers are due) from ``clock``: the data plane's."""
        self._clock = clock
        self.parked.clock = clock

    def own(self, lease: Lease) -> None:
        """Our own lease: its identities are ours, whatever lease claims them."""
        self._own = frozenset(self._identities(lease))
        self._last = None

    def admit(self, peers: Sequence[Lease]) -> tuple[Lease, ...]:
        """The peers to program, in their order: the same tuple as last time when nothing
        changed (a backend may reuse what it built from it)."""
        last = self._last
        if last is not None and last[0] is peers and last[1] == self._parked_version \
                and self._clock() < last[2]:
            return last[3]
        candidates = self._examine(peers)
        refused_identity = self._resolve(candidates)
        admitted: list[Lease] = []
        due = float("inf")
        parked = self.parked
        for examined in candidates:
            lease = examined.lease
            if lease.key in refused_identity:
                if lease.key in parked:  # refused for what it claims now, not by the kernel
                    parked.release(lease.key)
                    self._parked_version += 1
                continue
            if parked and parked.waiting(lease.key, KERNEL, fingerprint(lease)):
                due = min(due, parked[lease.key].due)
                continue
            admitted.append(lease)
        if self.parked:
            self.parked.keep_only(self._examined)
        out = tuple(admitted)
        if last is not None and len(last[3]) == len(out) and all(
                a is b for a, b in zip(last[3], out, strict=True)):
            out = last[3]
        self._last = (peers, self._parked_version, due, out)
        self._publish()
        return out

    def _examine(self, peers: Sequence[Lease]) -> list[_Examined]:
        """Every peer whose data the backend can use (each lease object examined once)."""
        before, self._examined = self._examined, {}
        candidates = []
        invalid = self.invalid.current
        for lease in peers:
            examined = before.get(lease.key)
            if examined is None or examined.lease is not lease:
                problem = self._problem(lease)
                examined = _Examined(lease, problem,
                                     () if problem else self._identities(lease))
            self._examined[lease.key] = examined
            if examined.problem:
                self._skip(self.invalid, INVALID_DATA, lease.key, examined.problem)
                if lease.key in self.parked:  # refused for its data now, not by the kernel
                    self.parked.release(lease.key)
                    self._parked_version += 1
                continue
            if lease.key in invalid:
                self.invalid.forget(lease.key)
            candidates.append(examined)
        if invalid:
            self.invalid.keep_only(self._examined)
        return candidates

    def _resolve(self, candidates: list[_Examined]) -> set[str]:
        """The keys refused for an identity ours or an older lease's (logged once each)."""
        claims: dict[str, Lease] = {}
        contested = False
        own = self._own
        for examined in candidates:
            lease = examined.lease
            for identity in examined.identities:
                holder = claims.setdefault(identity, lease)
                if identity in own or (holder is not lease and not _same_node(holder, lease)):
                    contested = True
        refused: dict[str, str] = {}
        if contested:  # rare: the oldest claim wins, leases taken from the oldest first
            claims = {}
            for examined in sorted(candidates, key=lambda e: e.lease.age):
                lease = examined.lease
                why = self._claim_problem(examined, claims)
                if why:
                    refused[lease.key] = why
                    continue
                for identity in examined.identities:
                    claims.setdefault(identity, lease)
        for key, why in refused.items():
            self._skip(self.taken, IDENTITY_TAKEN, key, why)
        for key in [k for k in self.taken.current if k not in refused]:
            self.taken.forget(key)
        return set(refused)

    def _claim_problem(self, examined: _Examined, claims: dict[str, Lease]) -> str:
        for identity in examined.identities:
            if identity in self._own:
                return (f"its {identity} is this node's own: a lease may not take another "
                        "node's identity; delete it, or restart the node that wrote it")
            holder = claims.get(identity)
            if holder is not None and not _same_node(holder, examined.lease):
                return (f"its {identity} belongs to the older lease {holder.key} (public IP "
                        f"{_address(holder)}): a lease may not take another node's identity; "
                        "delete it, or restart the node that wrote it")
        return ""

    def _skip(self, records: SkippedRecords, kind: str, key: str, why: str) -> None:
        if records.current.get(key) != why:
            records.skip(key, why)
            self.refusals[kind] += 1

    def park(self, lease: Lease, why: str) -> None:
        """The kernel refused what was programmed for ``lease``: leave it out, retry later."""
        parked, new = self.parked.park(lease.key, KERNEL, fingerprint(lease), why)
        self.refusals[KERNEL_REFUSED] += 1
        self._parked_version += 1
        if new:
            log.error("skipping peer %s (public IP %s): the kernel refused it: %s; the other "
                      "peers are programmed. Retried in %.0f s, then less and less often "
                      "(every %.0f s at most), at once when its lease changes", lease.key,
                      _address(lease), why, parked.due - self._clock(), parked.backoff.longest)
        else:
            log.debug("the kernel still refuses peer %s (%d time(s)): %s", lease.key,
                      parked.failures, why)
        self._publish()

    def programmed(self, peers: Sequence[Lease]) -> None:
        """``peers`` were programmed: those that were parked are not any more."""
        for lease in peers:
            if lease.key in self.parked and self.parked.release(lease.key):
                self._parked_version += 1
                log.info("peer %s is programmed now: the kernel took it", lease.key)
        self._publish()

    def retry_in(self) -> float:
        """Seconds until a parked peer is due again (0: none parked)."""
        return self.parked.retry_in()

    def _publish(self) -> None:
        refused: dict[str, tuple[str, str]] = {}
        for kind, reasons in ((INVALID_DATA, self.invalid.current),
                              (IDENTITY_TAKEN, self.taken.current),
                              (KERNEL_REFUSED, self.parked.reasons())):
            refused.update((key, (kind, why)) for key, why in reasons.items())
        if refused != self.refused:
            self.refused = refused
