"""iptables mode: the ``FLANNEL-POSTRTG`` (nat) and ``FLANNEL-FWD`` (filter) chains.

Owns the exact rule texts of Go flannel (compat reference 7.1, 7.2), applying them
atomically per table with ``iptables-restore --noflush`` (the chain declaration flushes and
refills our chain in one commit; the jump rule is appended only when missing, so nothing is
ever duplicated), checking them, and removing them when nftables mode takes over.
Runs the iptables binaries as subprocesses with argument lists, never through a shell.
Must not touch: chains other than ours, except the one jump rule in POSTROUTING / FORWARD.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from flannel.rules.spec import KUBE_PROXY_MARK, FamilyRules

MASQ_COMMENT = "flanneld masq"
FORWARD_COMMENT = "flanneld forward"
MASQ_CHAIN = "FLANNEL-POSTRTG"
FORWARD_CHAIN = "FLANNEL-FWD"


class RulesError(Exception):
    """Rules could not be installed or read; the message says what failed."""


@dataclass(frozen=True)
class ChainRules:
    table: str
    chain: str
    parent: str
    jump: tuple[str, ...]
    rules: tuple[tuple[str, ...], ...]


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


def render(args: tuple[str, ...]) -> str:
    """Arguments as ``iptables -S`` prints them (and ``iptables-restore`` reads them)."""
    out = []
    for i, arg in enumerate(args):
        quoted = i > 0 and args[i - 1] == "--comment"
        out.append(f'"{arg}"' if quoted else arg)
    return " ".join(out)


def _binary(version: int, restore: bool = False) -> str:
    name = ("ip6tables" if version == 6 else "iptables") + ("-restore" if restore else "")
    path = shutil.which(name)
    if path is None:
        raise RulesError(f"{name} not found in PATH; install iptables (Debian package "
                         "'iptables') or set EnableNFTables in the network config")
    return path


def _run(cmd: list[str], data: str | None = None, netns: str | None = None
         ) -> subprocess.CompletedProcess:
    prefix = ["ip", "netns", "exec", netns] if netns else []
    try:
        return subprocess.run([*prefix, *cmd], input=data, capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RulesError(f"{cmd[0]}: {err}") from None


_VERSION = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


def iptables_version(version: int = 4) -> tuple[int, int, int]:
    match = _VERSION.search(_run([_binary(version), "--version"]).stdout)
    if match is None:
        raise RulesError("cannot tell the iptables version from 'iptables --version'")
    return (int(match.group(1)), int(match.group(2)), int(match.group(3)))


def supports_random_fully(version: int = 4) -> bool:
    """``--random-fully`` exists from iptables 1.6.2 (upstream's check)."""
    return iptables_version(version) >= (1, 6, 2)


class IptablesRules:
    def __init__(self, families: list[FamilyRules], netns: str | None = None) -> None:
        self.families = families
        self.netns = netns

    def chains(self, spec: FamilyRules) -> list[ChainRules]:
        return ([masq_chain(spec)] if spec.masquerade else []) + (
            [forward_chain(spec)] if spec.forward else [])

    def _has_jump(self, version: int, chain: ChainRules) -> bool:
        return _run([_binary(version), "-w", "-t", chain.table, "-C", chain.parent,
                     *chain.jump], netns=self.netns).returncode == 0

    def apply(self) -> None:
        for spec in self.families:
            by_table: dict[str, list[ChainRules]] = {}
            for chain in self.chains(spec):
                by_table.setdefault(chain.table, []).append(chain)
            for table, chains in by_table.items():
                lines = [f"*{table}"]
                lines += [f":{chain.chain} - [0:0]" for chain in chains]
                for chain in chains:
                    lines += [f"-A {chain.chain} {render(rule)}" for rule in chain.rules]
                    if not self._has_jump(spec.version, chain):
                        lines.append(f"-A {chain.parent} {render(chain.jump)}")
                lines.append("COMMIT")
                result = _run([_binary(spec.version, restore=True), "--noflush", "--wait"],
                              "\n".join(lines) + "\n", self.netns)
                if result.returncode != 0:
                    raise RulesError(f"{'ip6tables' if spec.version == 6 else 'iptables'}"
                                     f"-restore ({table}) failed: {result.stderr.strip()}")

    def missing(self) -> str:
        """What is missing or different ("" when every rule is in place)."""
        for spec in self.families:
            for chain in self.chains(spec):
                listed = _run([_binary(spec.version), "-w", "-t", chain.table, "-S",
                               chain.chain], netns=self.netns)
                want = [f"-A {chain.chain} {render(rule)}" for rule in chain.rules]
                have = [line for line in listed.stdout.splitlines() if line.startswith("-A ")]
                if listed.returncode != 0 or have != want:
                    return f"IPv{spec.version} {chain.table} chain {chain.chain} differs"
                if not self._has_jump(spec.version, chain):
                    return f"IPv{spec.version} jump from {chain.parent} to {chain.chain} missing"
        return ""


def remove_all(netns: str | None = None) -> None:
    """Remove every flannel chain and jump, both families (used when nftables takes over)."""
    for version in (4, 6):
        try:
            binary = _binary(version)
        except RulesError:
            continue
        for table, parent, chain, comment in (("nat", "POSTROUTING", MASQ_CHAIN, MASQ_COMMENT),
                                              ("filter", "FORWARD", FORWARD_CHAIN,
                                               FORWARD_COMMENT)):
            jump = [*_comment(comment), "-j", chain]
            for _ in range(16):  # bounded: one jump normally, a few after old bugs
                if _run([binary, "-w", "-t", table, "-D", parent, *jump],
                        netns=netns).returncode != 0:
                    break
            _run([binary, "-w", "-t", table, "-F", chain], netns=netns)
            _run([binary, "-w", "-t", table, "-X", chain], netns=netns)
