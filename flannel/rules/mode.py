"""Which iptables backend (legacy x_tables or nf_tables) flanneld's rules go to.

Both backends can hold rules at the same time, and packets pass through both, so our rules
must sit beside kubelet's and kube-proxy's or their relative order means nothing. Owns the
choice made at start (``--iptables-mode``): ``auto`` reads both backends with their
``*-save`` tools and takes the one holding kubelet/kube-proxy chains (``KUBE-*``), else the
one holding more rules (ours not counted), else nft, which is what current distributions
use; ``legacy`` and ``nft`` force one. The same idea as kubernetes-sigs' iptables-wrapper,
done in-process so plain hosts get it too.
Must not touch: any rule (it only reads).
"""

from __future__ import annotations

from dataclasses import dataclass

from flannel.files.fileutil import which
from flannel.kernel.host import LOCAL, Host
from flannel.rules.iptables import (
    LEGACY,
    NFT,
    OWN_CHAINS,
    PLAIN,
    RulesError,
    Variant,
    save_listing,
)

MODES = ("auto", "legacy", "nft")
# kubelet creates these (mangle) from Kubernetes 1.17 on precisely to mark its backend.
KUBELET_HINTS = ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")


@dataclass(frozen=True)
class BackendScan:
    """What one backend holds, both families."""

    variant: Variant
    kube_chains: tuple[str, ...]
    rules: int  # rules other than flannel's

    @property
    def kubelet_hint(self) -> bool:
        return any(chain in KUBELET_HINTS for chain in self.kube_chains)


def installed(variant: Variant) -> bool:
    return all(which(variant.command(4, tool)) for tool in ("", "save", "restore"))


def scan(variant: Variant, host: Host = LOCAL) -> BackendScan:
    chains: set[str] = set()
    rules = 0
    for version in (4, 6):
        for line in save_listing(variant, version, host).splitlines():
            words = line.split()
            if line.startswith(":KUBE-") and words:
                chains.add(words[0][1:])
            elif line.startswith("-A ") and not any(own in words for own in OWN_CHAINS):
                rules += 1
    return BackendScan(variant, tuple(sorted(chains)), rules)


def _chains_text(found: BackendScan) -> str:
    shown = ", ".join(found.kube_chains[:4])
    more = len(found.kube_chains) - 4
    return shown + (f" and {more} more" if more > 0 else "")


def decide(legacy: BackendScan, nft: BackendScan) -> tuple[Variant, str]:
    """The backend to use and why, from what each holds."""
    if bool(legacy.kube_chains) != bool(nft.kube_chains):
        chosen = legacy if legacy.kube_chains else nft
        other = "nft" if chosen is legacy else "legacy"
        return chosen.variant, (f"kubelet/kube-proxy chains ({_chains_text(chosen)}) are in "
                                f"{chosen.variant.name} only, none in {other}")
    if legacy.kube_chains and legacy.kubelet_hint != nft.kubelet_hint:
        chosen = legacy if legacy.kubelet_hint else nft
        return chosen.variant, (f"both hold KUBE-* chains; kubelet's marker chain is in "
                                f"{chosen.variant.name}")
    where = "both hold KUBE-* chains; " if legacy.kube_chains else "no KUBE-* chains; "
    if legacy.rules != nft.rules:
        chosen = legacy if legacy.rules > nft.rules else nft
        return chosen.variant, (f"{where}{chosen.variant.name} holds more rules (legacy "
                                f"{legacy.rules}, nft {nft.rules})")
    return NFT, f"{where}legacy and nft hold {nft.rules} rule(s) each; nft is the default"


def choose_variant(mode: str, host: Host = LOCAL) -> tuple[Variant, str]:
    """The backend for ``--iptables-mode`` and a sentence saying why. RulesError when a
    forced backend is not installed."""
    if mode in ("legacy", "nft"):
        variant = LEGACY if mode == "legacy" else NFT
        if not installed(variant):
            raise RulesError(f"--iptables-mode={mode}: {variant.command(4)} (with -save and "
                             "-restore) not found in PATH; install it or use "
                             "--iptables-mode=auto")
        return variant, f"--iptables-mode={mode}"
    have = [variant for variant in (LEGACY, NFT) if installed(variant)]
    if not have:
        return PLAIN, ("neither iptables-legacy nor iptables-nft is installed; using "
                       "iptables as found in PATH")
    if len(have) == 1:
        return have[0], f"only {have[0].label} is installed"
    return decide(scan(LEGACY, host), scan(NFT, host))
