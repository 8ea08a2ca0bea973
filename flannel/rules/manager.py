"""Chooses the rule mode, cleans the other mode's leftovers, and keeps the rules in place.

Owns the start-up clean-up (nftables tables in iptables mode, iptables chains in nftables
mode, our chains in the iptables backend not chosen by ``rules/mode.py``), the br_netfilter
check of iptables mode, and the ensure loop: every
``--iptables-resync`` seconds the rules are checked and re-applied when anything is missing
(both modes; Go flannel never re-checks nftables). Rules are never removed on exit.
Must not touch: the store; rules that are not flannel's.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from flannel.kernel.host import LOCAL, Host
from flannel.rules import iptables, nftables
from flannel.rules.iptables import LEGACY, NFT, PLAIN, RulesError
from flannel.rules.mode import choose_variant
from flannel.rules.spec import FamilyRules

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
        self.families = [f for f in families if f.masquerade or f.forward]
        self.nftables_mode = nftables_mode
        self.resync = resync
        self.host = host
        self.iptables_mode = iptables_mode
        self.status = RulesStatus(mode=self.mode)
        self.prepared = False
        self.rules: iptables.IptablesRules | nftables.NftablesRules = (
            nftables.NftablesRules(self.families, host) if nftables_mode
            else iptables.IptablesRules(self.families, host))

    @property
    def mode(self) -> str:
        return "nftables" if self.nftables_mode else "iptables"

    def prepare(self) -> None:
        """Choose the iptables backend, clean the other modes' leftovers (synchronous; run
        it in a worker thread)."""
        if self.nftables_mode:
            self._log_removed(iptables.remove_all(self.host))
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
        self.prepared = True

    @staticmethod
    def _log_removed(removed: list[iptables.FoundChain]) -> None:
        for found in removed:
            log.info("Removed %s left from another mode", found.describe())

    def ensure(self) -> bool:
        """Install the rules if anything is missing; True if it had to (synchronous)."""
        if not self.families:
            return False
        missing = self.rules.missing()
        if not missing:
            return False
        if self.status.installed:
            log.warning("Some %s rules are missing (%s); deleting and recreating rules",
                        self.mode, missing)
        self.rules.apply()
        still = self.rules.missing()
        if still:
            raise RulesError(f"{self.mode} rules still differ after applying them: {still}")
        return True

    def _prepare_and_ensure(self) -> bool:
        if not self.prepared:
            self.prepare()
        return self.ensure()

    async def _attempt(self) -> None:
        self.status.checks += 1
        try:
            changed = await asyncio.to_thread(self._prepare_and_ensure)
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

    async def start(self) -> None:
        """Clean the other mode, then one attempt at installing the rules."""
        await self._attempt()

    async def run(self) -> None:
        """Re-check (and repair) every ``resync`` seconds, forever."""
        while True:
            await asyncio.sleep(self.resync)
            await self._attempt()
