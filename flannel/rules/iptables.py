"""iptables mode: the ``FLANNEL-POSTRTG`` (nat) and ``FLANNEL-FWD`` (filter) chains.

Owns the exact rule texts of Go flannel (compat reference 7.1, 7.2), applying them
atomically per table with ``iptables-restore --noflush`` (the chain declaration flushes and
refills our chain in one commit; the jump rule is appended only when missing, so nothing is
ever duplicated), checking them, and removing them when nftables mode takes over.

The encapsulation filter (pyflannel's; ``--encap-peers-only``), filter table: ``INPUT`` jumps
(inserted first) to ``FLANNEL-INPUT``, which sends UDP to the encapsulation ports to
``FLANNEL-PEERS``: one ``-s <peer> -j RETURN`` per peer, then ``FLANNEL-NOT-PEER``, whose one
rule drops and counts (a chain of its own so that its counters survive ``FLANNEL-PEERS``
being refilled). A lease change refills ``FLANNEL-PEERS`` alone, atomically, in one
``iptables-restore --noflush`` (the image carries no ipset). At 5000 peers a refill costs
about 0.1 s and a packet walks up to 5000 rules (50-100 us; docs/operations.md): nftables
mode's hashed set is the choice for large clusters. Until the first peer set is known, the
filter is left as it is.

The drop of encapsulation sent by pods (pyflannel's; ``--drop-pod-encap``, on by default),
filter table: ``INPUT`` jumps first to ``FLANNEL-POD-ENCAP-IN`` and ``FORWARD`` first to
``FLANNEL-POD-ENCAP-FWD``, which drop, and count, packets from the pod network to the
backend's encapsulation ports and protocols (to this node; forwarded, to outside the pod
network), before masquerade would give them the node's address.
Runs the iptables binaries as subprocesses with argument lists, never through a shell.
Must not touch: chains other than ours, except our jump rules in POSTROUTING / FORWARD /
INPUT.
"""

from __future__ import annotations

import logging
import re
import shlex
import subprocess
from dataclasses import dataclass

from flannel.files.fileutil import which
from flannel.kernel.host import LOCAL, Host
from flannel.log import V6
from flannel.rules.spec import KUBE_PROXY_MARK, FamilyRules, PeerAddresses, numeric_protocols

log = logging.getLogger(__name__)

MASQ_COMMENT = "flanneld masq"
FORWARD_COMMENT = "flanneld forward"
ENCAP_COMMENT = "flanneld encap filter"
NOT_PEER_COMMENT = "flanneld not a peer"
POD_ENCAP_COMMENT = "flanneld pod encap drop"
MASQ_CHAIN = "FLANNEL-POSTRTG"
FORWARD_CHAIN = "FLANNEL-FWD"
INPUT_CHAIN = "FLANNEL-INPUT"
PEERS_CHAIN = "FLANNEL-PEERS"
NOT_PEER_CHAIN = "FLANNEL-NOT-PEER"
POD_ENCAP_INPUT_CHAIN = "FLANNEL-POD-ENCAP-IN"
POD_ENCAP_FORWARD_CHAIN = "FLANNEL-POD-ENCAP-FWD"
POD_ENCAP_CHAINS = (POD_ENCAP_INPUT_CHAIN, POD_ENCAP_FORWARD_CHAIN)


class RulesError(Exception):
    """Rules could not be installed or read; the message says what failed."""


@dataclass(frozen=True)
class ChainRules:
    """One chain of ours; ``parent`` "" when only our own chains jump to it. ``first``: the
    jump is inserted at the top of ``parent`` (a filter that an earlier ACCEPT would skip)."""

    table: str
    chain: str
    parent: str
    jump: tuple[str, ...]
    rules: tuple[tuple[str, ...], ...]
    first: bool = False


def _comment(text: str) -> tuple[str, ...]:
    return ("-m", "comment", "--comment", text)


def masq_chain(spec: FamilyRules) -> ChainRules:
    c, p, tag = str(spec.network), str(spec.subnet), _comment(MASQ_COMMENT)
    masq = ("-j", "MASQUERADE", *(("--random-fully",) if spec.fully_random else ()))
    rules = [
        ("-m", "mark", "--mark", f"{KUBE_PROXY_MARK:#x}/{KUBE_PROXY_MARK:#x}", *tag,
         "-j", "RETURN"),
        ("-s", p, "-d", c, *tag, "-j", "RETURN"),
        ("-s", c, "-d", p, *tag, "-j", "RETURN"),
        ("!", "-s", c, "-d", p, *tag, "-j", "RETURN"),
        *(("-s", c, "-d", str(dst), *tag, "-j", "RETURN") for dst in spec.non_masquerade),
        ("-s", c, "!", "-d", str(spec.multicast), *tag, *masq),
        ("!", "-s", c, "-d", c, *tag, *masq),
    ]
    return ChainRules("nat", MASQ_CHAIN, "POSTROUTING", (*tag, "-j", MASQ_CHAIN), tuple(rules))


def forward_chain(spec: FamilyRules) -> ChainRules:
    c, tag = str(spec.network), _comment(FORWARD_COMMENT)
    rules = [("-s", c, *tag, "-j", "ACCEPT"), ("-d", c, *tag, "-j", "ACCEPT")]
    return ChainRules("filter", FORWARD_CHAIN, "FORWARD", (*tag, "-j", FORWARD_CHAIN),
                      tuple(rules))


def input_chain(spec: FamilyRules) -> ChainRules:
    tag = _comment(ENCAP_COMMENT)
    rules = tuple(("-p", "udp", "-m", "udp", "--dport", str(port), *tag, "-j", PEERS_CHAIN)
                  for port in spec.encap_ports)
    return ChainRules("filter", INPUT_CHAIN, "INPUT", (*tag, "-j", INPUT_CHAIN), rules,
                      first=True)


def peers_chain(spec: FamilyRules, peers: PeerAddresses) -> ChainRules:
    bits = 32 if spec.version == 4 else 128
    rules = [("-s", f"{address}/{bits}", "-j", "RETURN")
             for address in sorted(peers[spec.version], key=lambda a: a.packed)]
    return ChainRules("filter", PEERS_CHAIN, "", (), (*rules, ("-j", NOT_PEER_CHAIN)))


def not_peer_chain() -> ChainRules:
    return ChainRules("filter", NOT_PEER_CHAIN, "", (),
                      ((*_comment(NOT_PEER_COMMENT), "-j", "DROP"),))


def pod_encap_chains(spec: FamilyRules) -> list[ChainRules]:
    """The drops of packets from the pod network to the encapsulation ports and protocols:
    to this node (``INPUT``), and forwarded out of the pod network (``FORWARD``); both
    inserted first, before any rule that would accept them."""
    c, tag = str(spec.network), _comment(POD_ENCAP_COMMENT)
    matches: list[tuple[str, ...]] = [("-p", "udp", "-m", "udp", "--dport", str(port))
                                      for port in spec.pod_encap_ports]
    matches += [("-p", str(protocol)) for protocol in spec.pod_encap_protocols]
    chains = []
    for chain, parent, sources in ((POD_ENCAP_INPUT_CHAIN, "INPUT", ("-s", c)),
                                   (POD_ENCAP_FORWARD_CHAIN, "FORWARD",
                                    ("-s", c, "!", "-d", c))):
        rules = tuple((*sources, *match, *tag, "-j", "DROP") for match in matches)
        chains.append(ChainRules("filter", chain, parent, (*tag, "-j", chain), rules,
                                 first=True))
    return chains


def render(args: tuple[str, ...]) -> str:
    """Arguments as ``iptables -S`` prints them (and ``iptables-restore`` reads them)."""
    out = []
    for i, arg in enumerate(args):
        quoted = i > 0 and args[i - 1] == "--comment"
        out.append(f'"{arg}"' if quoted else arg)
    return " ".join(out)


@dataclass(frozen=True)
class Variant:
    """One iptables implementation. Since iptables 1.8 both exist side by side as
    ``iptables-legacy*`` (the kernel's x_tables) and ``iptables-nft*`` (nf_tables); ``""`` is
    the plain ``iptables*`` names, for builds without the suffixed ones."""

    name: str

    def command(self, version: int, tool: str = "") -> str:
        """The binary name: ``tool`` is "", "save" or "restore"."""
        base = "ip6tables" if version == 6 else "iptables"
        return "-".join(part for part in (base, self.name, tool) if part)

    @property
    def label(self) -> str:
        return self.command(4)


PLAIN = Variant("")
LEGACY = Variant("legacy")
NFT = Variant("nft")


def _binary(version: int, tool: str = "", variant: Variant = PLAIN) -> str:
    name = variant.command(version, tool)
    path = which(name)
    if path is None:
        raise RulesError(f"{name} not found in PATH; install iptables (Debian package "
                         "'iptables'), choose another --iptables-mode, or set EnableNFTables "
                         "in the network config")
    return path


def _run(cmd: list[str], data: str | None = None, host: Host = LOCAL
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(host.command(cmd), input=data, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RulesError(f"{cmd[0]}: {err}") from None


_VERSION = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


def iptables_version(version: int = 4, variant: Variant = PLAIN) -> tuple[int, int, int]:
    match = _VERSION.search(_run([_binary(version, variant=variant), "--version"]).stdout)
    if match is None:
        raise RulesError("cannot tell the iptables version from 'iptables --version'")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3)))


def supports_random_fully(version: int = 4, variant: Variant = PLAIN) -> bool:
    """``--random-fully`` exists from iptables 1.6.2 (upstream's check)."""
    return iptables_version(version, variant) >= (1, 6, 2)


#: ``-S -v`` shows counters as `` -c <packets> <bytes>``: after the chain name
#: (legacy) or before the target (nft), and after a policy.
_COUNTERS = re.compile(r" -c (\d+) (\d+)(?= -|$)")


class IptablesRules:
    def __init__(self, families: list[FamilyRules], host: Host = LOCAL,
                 variant: Variant = PLAIN) -> None:
        self.families = families
        self.host = host
        self.variant = variant
        #: The drop counter of each family's filter as the last check read it.
        self.dropped: dict[int, tuple[int, int]] = {}
        #: The drops of encapsulation sent by pods, by family, as the last check read them.
        self.pod_encap_dropped: dict[int, tuple[int, int]] = {}

    def _binary(self, version: int, tool: str = "") -> str:
        return _binary(version, tool, self.variant)

    def chains(self, spec: FamilyRules, peers: PeerAddresses | None = None
               ) -> list[ChainRules]:
        """Our chains of one family; the encapsulation filter only once ``peers`` is known
        (callees before callers, so a restore never jumps to an undeclared chain)."""
        chains = ([masq_chain(spec)] if spec.masquerade else []) + (
            [forward_chain(spec)] if spec.forward else [])
        if spec.encap_ports and peers is not None:
            chains += [not_peer_chain(), peers_chain(spec, peers), input_chain(spec)]
        if spec.drops_pod_encap:
            chains += pod_encap_chains(spec)
        return chains

    def _has_jump(self, version: int, chain: ChainRules) -> bool:
        return _run([self._binary(version), "-w", "-t", chain.table, "-C", chain.parent,
                     *chain.jump], host=self.host).returncode == 0

    def _restore(self, version: int, table: str, chains: list[ChainRules]) -> None:
        lines = [f"*{table}"]
        lines += [f":{chain.chain} - [0:0]" for chain in chains]
        for chain in chains:
            lines += [f"-A {chain.chain} {render(rule)}" for rule in chain.rules]
            if chain.parent and not self._has_jump(version, chain):
                verb = f"-I {chain.parent} 1" if chain.first else f"-A {chain.parent}"
                lines.append(f"{verb} {render(chain.jump)}")
        lines.append("COMMIT")
        payload = "\n".join(lines) + "\n"
        log.log(V6, "%s --noflush < %s", self.variant.command(version, "restore"), payload)
        result = _run([self._binary(version, "restore"), "--noflush", "--wait"], payload,
                      self.host)
        if result.returncode != 0:
            raise RulesError(f"{self.variant.command(version, 'restore')} ({table}) "
                             f"failed: {result.stderr.strip()}")

    def apply(self, peers: PeerAddresses | None = None) -> None:
        for spec in self.families:
            by_table: dict[str, list[ChainRules]] = {}
            for chain in self.chains(spec, peers):
                by_table.setdefault(chain.table, []).append(chain)
            for table, chains in by_table.items():
                self._restore(spec.version, table, chains)

    def update_peers(self, peers: PeerAddresses) -> None:
        """Refill ``FLANNEL-PEERS`` of every filtered family (one atomic commit each)."""
        for spec in self.families:
            if spec.encap_ports:
                self._restore(spec.version, "filter", [peers_chain(spec, peers)])

    def missing(self, peers: PeerAddresses | None = None) -> str:
        """What is missing or different ("" when every rule is in place).

        One listing per table (``-S -v``, the same text as ``iptables-save`` with counters)
        shows both our chains and the jumps to them, and the filter's drop counter: the
        check runs every ``--iptables-resync`` seconds, and each process it spawns is most
        of an idle node's CPU.
        """
        for spec in self.families:
            listings: dict[str, list[str] | None] = {}
            for chain in self.chains(spec, peers):
                if chain.table not in listings:
                    listed = _run([self._binary(spec.version), "-w", "-t", chain.table, "-S",
                                   "-v"], host=self.host)
                    listings[chain.table] = (self._strip_counters(spec.version, listed.stdout)
                                             if listed.returncode == 0 else None)
                lines = listings[chain.table]
                want = [numeric_protocols(f"-A {chain.chain} {render(rule)}")
                        for rule in chain.rules]
                if lines is None or f"-N {chain.chain}" not in lines or [
                        numeric_protocols(line) for line in lines
                        if line.startswith(f"-A {chain.chain} ")] != want:
                    return f"IPv{spec.version} {chain.table} chain {chain.chain} differs"
                if chain.parent and f"-A {chain.parent} {render(chain.jump)}" not in lines:
                    return f"IPv{spec.version} jump from {chain.parent} to {chain.chain} missing"
        return ""

    def _strip_counters(self, version: int, text: str) -> list[str]:
        """The listing without counters, keeping the drop counters: the filter's, and the
        sum of the pod encapsulation drops' (of a table that has them)."""
        lines = []
        pod_encap: list[tuple[int, int]] = []
        for line in text.splitlines():
            match = _COUNTERS.search(line)
            if match is not None:
                counted = (int(match.group(1)), int(match.group(2)))
                if line.startswith(f"-A {NOT_PEER_CHAIN} "):
                    self.dropped[version] = counted
                elif line.startswith(tuple(f"-A {chain} " for chain in POD_ENCAP_CHAINS)):
                    pod_encap.append(counted)
                line = line[:match.start()] + line[match.end():]
            lines.append(line)
        if pod_encap:
            self.pod_encap_dropped[version] = (sum(p for p, _ in pod_encap),
                                               sum(b for _, b in pod_encap))
        return lines


OWN_CHAINS = {MASQ_CHAIN: ("nat", "POSTROUTING"), FORWARD_CHAIN: ("filter", "FORWARD"),
              INPUT_CHAIN: ("filter", "INPUT"), PEERS_CHAIN: ("filter", INPUT_CHAIN),
              NOT_PEER_CHAIN: ("filter", PEERS_CHAIN),
              POD_ENCAP_INPUT_CHAIN: ("filter", "INPUT"),
              POD_ENCAP_FORWARD_CHAIN: ("filter", "FORWARD")}


@dataclass(frozen=True)
class FoundChain:
    """One of our chains as a ``*-save`` listing shows it, with every rule jumping to it."""

    variant: Variant
    version: int
    table: str
    chain: str
    jumps: tuple[tuple[str, tuple[str, ...]], ...]  # (parent chain, rule spec)

    def describe(self) -> str:
        return (f"{self.variant.command(self.version)} {self.table} chain {self.chain} "
                f"(and {len(self.jumps)} jump rule(s) to it)")


def save_listing(variant: Variant, version: int, host: Host = LOCAL) -> str:
    """Every table's rules (``*-save`` without ``-t``: listing a table would create it in
    the legacy backend). "" when the binary is missing or cannot read the kernel."""
    try:
        binary = _binary(version, "save", variant)
    except RulesError:
        return ""
    result = _run([binary], host=host)
    return result.stdout if result.returncode == 0 else ""


def find_own_chains(listing: str, variant: Variant, version: int) -> list[FoundChain]:
    found = []
    table = ""
    declared: set[tuple[str, str]] = set()
    jumps: dict[tuple[str, str], list[tuple[str, tuple[str, ...]]]] = {}
    for line in listing.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif line.startswith(":") and len(line) > 1:
            declared.add((table, line[1:].split()[0]))
        elif line.startswith("-A "):
            try:
                words = shlex.split(line)
            except ValueError:
                continue  # unbalanced quotes: not a rule we wrote
            target = words[words.index("-j") + 1] if "-j" in words[:-1] else ""
            if target in OWN_CHAINS and len(words) > 2:
                jumps.setdefault((table, target), []).append((words[1], tuple(words[2:])))
    for (table_name, chain) in sorted(declared):
        if chain in OWN_CHAINS and OWN_CHAINS[chain][0] == table_name:
            found.append(FoundChain(variant, version, table_name, chain,
                                    tuple(jumps.get((table_name, chain), ()))))
    return found


def remove_chain(found: FoundChain, host: Host = LOCAL) -> None:
    """Delete the jump rules, then flush and delete the chain."""
    binary = _binary(found.version, variant=found.variant)
    for parent, spec in found.jumps:
        _run([binary, "-w", "-t", found.table, "-D", parent, *spec], host=host)
    for verb in ("-F", "-X"):
        result = _run([binary, "-w", "-t", found.table, verb, found.chain], host=host)
        if result.returncode != 0:
            raise RulesError(f"{found.describe()}: {verb} failed: {result.stderr.strip()}")


FILTER_CHAINS = (INPUT_CHAIN, PEERS_CHAIN, NOT_PEER_CHAIN)


def remove_chains(variant: Variant, version: int, chains: tuple[str, ...], host: Host = LOCAL
                  ) -> list[FoundChain]:
    """Remove these chains of ours of one family, if there (an option turned off:
    ``FILTER_CHAINS``, ``POD_ENCAP_CHAINS``)."""
    removed = []
    for found in find_own_chains(save_listing(variant, version, host), variant, version):
        if found.chain in chains:
            remove_chain(found, host)
            removed.append(found)
    return removed


def remove_all(host: Host = LOCAL, variants: tuple[Variant, ...] = (LEGACY, NFT, PLAIN)
               ) -> list[FoundChain]:
    """Remove every flannel chain and its jumps, both families, in the given variants (used
    when nftables takes over, and for the variant not chosen). Returns what was removed."""
    removed = []
    for variant in variants:
        for version in (4, 6):
            for found in find_own_chains(save_listing(variant, version, host), variant,
                                         version):
                remove_chain(found, host)
                removed.append(found)
    return removed
