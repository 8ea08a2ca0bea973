"""Chooses the rule mode, cleans the other mode's leftovers, and keeps the rules in place.

Owns the start-up clean-up (nftables tables in iptables mode, iptables chains in nftables
mode, our chains in the iptables backend not chosen by ``rules/mode.py``, the encapsulation
filter of a family no longer filtered, the drop of pods' encapsulation where it is off), the
br_netfilter
check of iptables mode, and the ensure loop: every
``--iptables-resync`` seconds the rules are checked and re-applied when anything is missing
(both modes; Go flannel never re-checks nftables). Rules are never removed on exit.

The encapsulation filter's peer set comes from the daemon (``set_peers``: the public
addresses of the current leases, ours included) and is applied at once, as a difference
from what was last written (nftables: set elements added and deleted; iptables: the peers
chain refilled); the periodic check compares the whole set. The drop counters (the
filter's, and those of encapsulation sent by pods) are read by each check and kept
monotonic here (a refilled chain or ``iptables -Z`` restarts them in the kernel).
Must not touch: the store; rules that are not flannel's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from flannel.kernel.host import LOCAL, Host
from flannel.rules import iptables, nftables
from flannel.rules.iptables import LEGACY, NFT, PLAIN, RulesError
from flannel.rules.mode import choose_variant
from flannel.rules.spec import FamilyRules, PeerAddresses

log = logging.getLogger(__name__)

BR_NETFILTER = {4: "bridge-nf-call-iptables", 6: "bridge-nf-call-ip6tables"}


@dataclass
class RulesStatus:
    """Whether the rules are in place (``reason`` says why not), in which mode, and since
    start: the checks made, the repairs they needed after the rules had been installed,
    and the checks that failed."""

    installed: bool = False
    reason: str = "traffic rules not installed yet"
    mode: str = ""
    checks: int = 0
    repairs: int = 0
    failures: int = 0
    #: The IP versions whose encapsulated traffic is filtered (empty: no filter).
    filtered: tuple[int, ...] = ()
    #: Addresses in the filter's peer set, by IP version, as last written.
    peers: dict[int, int] = field(default_factory=dict)
    #: Peer set changes written (differences, not checks).
    peer_updates: int = 0
    #: Packets and bytes the filter dropped since start, by IP version.
    not_peer_dropped: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: The IP versions whose pods may not send encapsulation (empty: no drop).
    pod_encap: tuple[int, ...] = ()
    #: Packets and bytes of encapsulation from pods dropped since start, by IP version.
    pod_encap_dropped: dict[int, tuple[int, int]] = field(default_factory=dict)


class _Monotonic:
    """Drop counters (packets, bytes) by IP version as the kernel restarts them (a refilled
    chain, ``iptables -Z``), folded into totals since start kept in ``totals``."""

    def __init__(self, totals: dict[int, tuple[int, int]]) -> None:
        self.totals = totals
        self._read: dict[int, tuple[int, int]] = {}  # as last read
        self._before_reset: dict[int, tuple[int, int]] = {}  # what reset counters reached

    def fold(self, read: dict[int, tuple[int, int]]) -> None:
        for version, now in read.items():
            last = self._read.get(version, (0, 0))
            if now < last:  # restarted in the kernel
                base = self._before_reset.get(version, (0, 0))
                self._before_reset[version] = (base[0] + last[0], base[1] + last[1])
            self._read[version] = now
            base = self._before_reset.get(version, (0, 0))
            self.totals[version] = (base[0] + now[0], base[1] + now[1])


def check_br_netfilter(versions: list[int], proc: Path = Path("/proc")) -> None:
    for version in versions:
        path = proc / "sys" / "net" / "bridge" / BR_NETFILTER[version]
        if not path.exists():
            raise RulesError(
                f"Failed to check br_netfilter: {path} does not exist; load the module with "
                "'modprobe br_netfilter' and make it permanent in /etc/modules-load.d/, or "
                "set EnableNFTables in the network config")


class TrafficManager:
    def __init__(self, families: list[FamilyRules], nftables_mode: bool,
                 resync: float = 5.0, host: Host = LOCAL,
                 iptables_mode: str = "auto") -> None:
        self.families = [f for f in families if f.any_rules]
        self.nftables_mode = nftables_mode
        self.resync = resync
        self.host = host
        self.iptables_mode = iptables_mode
        self.status = RulesStatus(mode=self.mode, filtered=tuple(
            f.version for f in self.families if f.encap_ports), pod_encap=tuple(
            f.version for f in self.families if f.drops_pod_encap))
        self.prepared = False
        self._peers: PeerAddresses | None = None  # wanted (None: not known yet)
        self._written: PeerAddresses | None = None  # in the kernel, as last written
        self._peers_changed = asyncio.Event()
        self._next_check = 0.0  # loop time of the next full check
        # The drop counters, kept monotonic across their restarts in the kernel.
        self._not_peer = _Monotonic(self.status.not_peer_dropped)
        self._pod_encap = _Monotonic(self.status.pod_encap_dropped)
        self.rules: iptables.IptablesRules | nftables.NftablesRules = (
            nftables.NftablesRules(self.families, host) if nftables_mode
            else iptables.IptablesRules(self.families, host))

    @property
    def mode(self) -> str:
        return "nftables" if self.nftables_mode else "iptables"

    def prepare(self) -> None:
        """Choose the iptables backend, clean the other modes' leftovers (synchronous; run
        it in a worker thread)."""
        unfiltered = [v for v in (4, 6) if v not in self.status.filtered]
        undropped = [v for v in (4, 6) if v not in self.status.pod_encap]
        if self.nftables_mode:
            self._log_removed(iptables.remove_all(self.host))
            for version in unfiltered:
                if nftables.remove_objects(version, nftables.FILTER_OBJECTS, self.host):
                    log.info("Removed the IPv%d encapsulation filter (--encap-peers-only is "
                             "off)", version)
            for version in undropped:
                if nftables.remove_objects(version, nftables.POD_ENCAP_OBJECTS, self.host):
                    log.info("Removed the IPv%d drop of encapsulation sent by pods "
                             "(--drop-pod-encap is off)", version)
        else:
            variant, why = choose_variant(self.iptables_mode, self.host)
            if self.families:
                log.info("Using %s for the traffic rules: %s", variant.label, why)
            self.status.mode = variant.label  # iptables-nft, iptables-legacy or iptables
            # Same package, but ask the binary that will run the rules.
            families = [replace(f, fully_random=f.fully_random and
                                iptables.supports_random_fully(f.version, variant))
                        for f in self.families]
            self.rules = iptables.IptablesRules(families, self.host, variant)
            others = tuple(v for v in (LEGACY, NFT) if v != variant) if variant != PLAIN else ()
            self._log_removed(iptables.remove_all(self.host, others))
            nftables.remove_all(self.host)
            for versions, chains, flag in ((unfiltered, iptables.FILTER_CHAINS,
                                            "--encap-peers-only"),
                                           (undropped, iptables.POD_ENCAP_CHAINS,
                                            "--drop-pod-encap")):
                for version in versions:
                    for found in iptables.remove_chains(variant, version, chains, self.host):
                        log.info("Removed %s: %s is off", found.describe(), flag)
        self.prepared = True

    @staticmethod
    def _log_removed(removed: list[iptables.FoundChain]) -> None:
        for found in removed:
            log.info("Removed %s left from another mode", found.describe())

    def set_peers(self, peers: PeerAddresses) -> None:
        """The addresses encapsulated traffic is accepted from (every lease's public
        address, ours included); written by the next attempt, which ``next`` starts at
        once. Ignored when nothing is filtered."""
        if not self.status.filtered or peers == self._peers:
            return
        self._peers = peers
        self._peers_changed.set()

    def ensure(self) -> bool:
        """Install the rules if anything is missing; True if it had to (synchronous)."""
        if not self.families:
            return False
        peers = self._peers
        missing = self.rules.missing(peers)
        self._count_drops()
        if not missing:
            self._wrote(peers)
            return False
        if self.status.installed:
            log.warning("Some %s rules are missing (%s); deleting and recreating rules",
                        self.mode, missing)
        self.rules.apply(peers)
        self._wrote(peers)
        still = self.rules.missing(peers)
        if still:
            raise RulesError(f"{self.mode} rules still differ after applying them: {still}")
        return True

    def update_peers(self) -> bool:
        """Write the difference between the wanted peer set and the one last written, or
        everything when that is unknown or the difference is refused; True when the rules
        had to be installed in full (synchronous)."""
        peers, written = self._peers, self._written
        if peers is None or peers == written:
            return False
        if written is None:
            return self.ensure()
        added = {v: peers[v] - written.get(v, frozenset()) for v in peers}
        removed = {v: written.get(v, frozenset()) - peers[v] for v in peers}
        try:
            if isinstance(self.rules, nftables.NftablesRules):
                self.rules.update_peers(added, removed)
            else:
                self.rules.update_peers(peers)
        except RulesError as err:
            log.warning("%s; checking and installing the rules in full", err)
            self._written = None
            return self.ensure()
        self._wrote(peers)
        self.status.peer_updates += 1
        log.debug("encapsulation filter: %d peer address(es) added, %d removed",
                  sum(map(len, added.values())), sum(map(len, removed.values())))
        return False

    def _wrote(self, peers: PeerAddresses | None) -> None:
        if peers is not None and peers != self._written:
            self._written = peers
            self.status.peers = {v: len(peers[v]) for v in self.status.filtered}

    def _count_drops(self) -> None:
        """Fold the counters the check read into monotonic totals."""
        self._not_peer.fold(self.rules.dropped)
        self._pod_encap.fold(self.rules.pod_encap_dropped)

    def _prepare_and_ensure(self, full: bool) -> bool:
        if not self.prepared:
            self.prepare()
        if full:
            return self.ensure()
        return self.update_peers()

    async def _attempt(self, full: bool = True) -> None:
        if full:
            self.status.checks += 1
        try:
            changed = await asyncio.to_thread(self._prepare_and_ensure, full)
        except RulesError as err:
            self.status.failures += 1
            if self.status.installed or self.status.reason != f"traffic rules not installed: {err}":
                log.error("%s", err)
            self.status.installed = False
            self.status.reason = f"traffic rules not installed: {err}"
            return
        if changed:
            log.info("%s rules installed", self.mode)
            if self.status.installed:  # they were in place: something removed them
                self.status.repairs += 1
        self.status.installed = True
        self.status.reason = ""

    def _waiting_for_peers(self) -> bool:
        return bool(self.status.filtered) and self._peers is None

    async def start(self) -> None:
        """Clean the other mode, then one attempt at installing the rules."""
        self._next_check = asyncio.get_running_loop().time() + self.resync
        await self._attempt()
        if self._waiting_for_peers() and self.status.installed:
            self.status.installed = False
            self.status.reason = ("traffic rules not installed: the encapsulation filter waits "
                                  "for the first lease snapshot")

    async def next(self) -> None:
        """Wait for a new peer set (written at once, as a difference) or for the next
        periodic check (every ``resync`` seconds), and run it."""
        try:
            async with asyncio.timeout_at(self._next_check):
                await self._peers_changed.wait()
        except TimeoutError:
            await self.start()
            return
        self._peers_changed.clear()
        await self._attempt(full=False)

    async def run(self) -> None:
        """Keep the rules and the peer set in place, forever."""
        while True:
            await self.next()
