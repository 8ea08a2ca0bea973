"""nftables mode (``EnableNFTables``): tables ``ip flannel-ipv4`` and ``ip6 flannel-ipv6``.

Owns the chains of compat reference 7.4 (``postrtg`` for masquerade, ``forward`` for
acceptance), written as one ``nft -f -`` transaction that (re)creates the table and
flushes and refills the chains, a check of what is installed, and the removal of the tables
when iptables mode takes over. Every address comes from parsed network objects, so nft
never sees a name it would try to resolve.
Must not touch: other tables.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

from flannel.kernel.host import LOCAL, Host
from flannel.log import V6
from flannel.rules.iptables import RulesError
from flannel.rules.spec import KUBE_PROXY_MARK, FamilyRules

log = logging.getLogger(__name__)

POSTRTG_COMMENT = "chain to manage traffic masquerading by flannel"
FORWARD_COMMENT = "chain to accept flannel traffic"


def table_of(version: int) -> tuple[str, str, str]:
    """(family keyword, table name, address keyword)."""
    return ("ip", "flannel-ipv4", "ip") if version == 4 else ("ip6", "flannel-ipv6", "ip6")


def masq_rules(spec: FamilyRules) -> list[str]:
    _, _, kw = table_of(spec.version)
    c, p = spec.network, spec.subnet
    masq = "masquerade fully-random" if spec.fully_random else "masquerade"
    return [
        f"meta mark {KUBE_PROXY_MARK:#010x} return",
        f"{kw} saddr {p} {kw} daddr {c} return",
        f"{kw} saddr {c} {kw} daddr {p} return",
        f"{kw} saddr != {p} {kw} daddr {c} return",
        *(f"{kw} saddr {c} {kw} daddr {dst} return" for dst in spec.non_masquerade),
        f"{kw} saddr {c} {kw} daddr != {spec.multicast} {masq}",
        f"{kw} saddr != {c} {kw} daddr {c} {masq}",
    ]


def forward_rules(spec: FamilyRules) -> list[str]:
    _, _, kw = table_of(spec.version)
    return [f"{kw} saddr {spec.network} accept", f"{kw} daddr {spec.network} accept"]


def _nft(args: list[str], data: str | None = None, host: Host = LOCAL
         ) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("nft")
    if binary is None:
        raise RulesError("nft not found in PATH; install nftables (Debian package 'nftables') "
                         "or set EnableNFTables to false")
    try:
        return subprocess.run(host.command([binary, *args]), input=data, capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RulesError(f"nft: {err}") from None


def supports_fully_random() -> bool:
    """A dry run of a masquerade rule with ``fully-random`` (upstream's check)."""
    probe = ("table ip flannel-probe {\n chain masqueradeTest {\n  type nat hook postrouting "
             "priority srcnat; policy accept;\n  masquerade fully-random\n }\n}\n")
    return _nft(["-c", "-f", "-"], probe).returncode == 0


class NftablesRules:
    def __init__(self, families: list[FamilyRules], host: Host = LOCAL) -> None:
        self.families = families
        self.host = host

    def _chains(self, spec: FamilyRules) -> list[tuple[str, str, str, list[str]]]:
        chains = []
        if spec.masquerade:
            chains.append(("postrtg", POSTRTG_COMMENT, "type nat hook postrouting priority "
                           "srcnat; policy accept;", masq_rules(spec)))
        if spec.forward:
            chains.append(("forward", FORWARD_COMMENT, "type filter hook forward priority "
                           "filter; policy accept;", forward_rules(spec)))
        return chains

    def script(self) -> str:
        lines = []
        for spec in self.families:
            family, table, _ = table_of(spec.version)
            lines.append(f'add table {family} {table} {{ comment "rules for {table}"; }}')
            for chain, comment, hook, rules in self._chains(spec):
                lines.append(f'add chain {family} {table} {chain} {{ comment "{comment}"; '
                             f"{hook} }}")
                lines.append(f"flush chain {family} {table} {chain}")
                lines += [f"add rule {family} {table} {chain} {rule}" for rule in rules]
        return "\n".join(lines) + "\n"

    def apply(self) -> None:
        script = self.script()
        log.log(V6, "nft -f - < %s", script)
        result = _nft(["-f", "-"], script, self.host)
        if result.returncode != 0:
            raise RulesError(f"nft rejected the flannel rules: {result.stderr.strip()}")

    def missing(self) -> str:
        for spec in self.families:
            family, table, _ = table_of(spec.version)
            for chain, _comment, _hook, rules in self._chains(spec):
                listed = _nft(["list", "chain", family, table, chain], host=self.host)
                if listed.returncode != 0:
                    return f"nft chain {family} {table} {chain} missing"
                have = [line.strip() for line in listed.stdout.splitlines()]
                body = [line for line in have if line and not line.startswith(
                    ("table ", "chain ", "comment ", "type ", "}"))]
                if body != rules:
                    return f"nft chain {family} {table} {chain} differs"
        return ""


def find_tables(host: Host = LOCAL) -> list[tuple[str, str]]:
    """Our tables present, as (family keyword, table name); none when nft is missing."""
    try:
        listed = _nft(["list", "tables"], host=host)
    except RulesError:
        return []
    ours = {table_of(version)[:2] for version in (4, 6)}
    present = {tuple(line.split()[1:3]) for line in listed.stdout.splitlines()
               if line.startswith("table ") and len(line.split()) == 3}
    return sorted(ours & present)


def remove_table(family: str, table: str, host: Host = LOCAL) -> None:
    result = _nft(["delete", "table", family, table], host=host)
    if result.returncode != 0:
        raise RulesError(f"nft delete table {family} {table}: {result.stderr.strip()}")


def remove_all(host: Host = LOCAL) -> None:
    """Delete both flannel tables (used when iptables mode takes over)."""
    for family, table in find_tables(host):
        remove_table(family, table, host)
