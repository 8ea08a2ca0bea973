"""nftables mode (``EnableNFTables``): tables ``ip flannel-ipv4`` and ``ip6 flannel-ipv6``.

Owns the chains of compat reference 7.4 (``postrtg`` for masquerade, ``forward`` for
acceptance), written as one ``nft -f -`` transaction that (re)creates the table and
flushes and refills the chains, a check of what is installed (one listing of each table),
and the removal of the tables when iptables mode takes over. Every address comes from
parsed network objects, so nft never sees a name it would try to resolve.

The encapsulation filter (pyflannel's; ``--encap-peers-only``): chain ``input`` (hook
input) drops UDP to the encapsulation ports whose source is not in the named set ``peers``,
counted by the named counter ``not-peer-drops`` (it survives the chain being refilled).
A lease change adds and deletes set elements in one transaction, never rewriting the set;
until the first peer set is known the filter is left as it is (a restart keeps the previous
run's filter rather than dropping every peer).

The drop of encapsulation sent by pods (pyflannel's; ``--drop-pod-encap``, on by default):
chains ``pod-encap-input`` (hook input) and ``pod-encap-forward`` (hook forward, destinations
out of the pod network) drop packets from the pod network to the backend's encapsulation
ports and protocols, counted by the named counter ``pod-encap-drops``; a drop in any base
chain is final, whatever other tables accept.
Must not touch: other tables.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address

from flannel.files.fileutil import which
from flannel.kernel.host import LOCAL, Host
from flannel.log import V6
from flannel.rules.iptables import RulesError
from flannel.rules.spec import KUBE_PROXY_MARK, FamilyRules, PeerAddresses, numeric_protocols

log = logging.getLogger(__name__)

POSTRTG_COMMENT = "chain to manage traffic masquerading by flannel"
FORWARD_COMMENT = "chain to accept flannel traffic"
INPUT_COMMENT = "chain to drop encapsulated traffic from non-peers"
PEER_SET = "peers"
PEER_SET_COMMENT = "public addresses of the leases"
DROP_COUNTER = "not-peer-drops"
POD_ENCAP_COMMENT = "chain to drop encapsulated traffic sent by pods"
POD_ENCAP_COUNTER = "pod-encap-drops"
POD_ENCAP_CHAINS = {"pod-encap-input": "input", "pod-encap-forward": "forward"}


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


def input_rules(spec: FamilyRules) -> list[str]:
    _, _, kw = table_of(spec.version)
    return [f'udp dport {port} {kw} saddr != @{PEER_SET} counter name "{DROP_COUNTER}" drop'
            for port in spec.encap_ports]


def pod_encap_rules(spec: FamilyRules, forwarded: bool) -> list[str]:
    """Drops of packets from the pod network to the encapsulation ports and protocols: to
    this node, or (``forwarded``) out of the pod network."""
    _, _, kw = table_of(spec.version)
    c = spec.network
    sources = f"{kw} saddr {c} {kw} daddr != {c}" if forwarded else f"{kw} saddr {c}"
    matches = [f"udp dport {port}" for port in spec.pod_encap_ports]
    matches += [f"meta l4proto {protocol}" for protocol in spec.pod_encap_protocols]
    return [f'{sources} {match} counter name "{POD_ENCAP_COUNTER}" drop' for match in matches]


def _elements(addresses: Iterable[IPv4Address | IPv6Address]) -> str:
    return ", ".join(str(a) for a in sorted(addresses, key=lambda a: a.packed))


@dataclass
class TableListing:
    """One table as ``nft list table`` prints it: chain bodies, set elements (as nft prints
    them: the C library's text, which is Python's too), counters."""

    chains: dict[str, list[str]] = field(default_factory=dict)
    sets: dict[str, set[str]] = field(default_factory=dict)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)


def parse_table(text: str) -> TableListing:
    listing = TableListing()
    kind, name, in_elements = "", "", False
    for raw in text.splitlines():
        line = raw.strip()
        if in_elements or line.startswith("elements = {"):
            words = line.removeprefix("elements = {").replace("}", "").split(",")
            listing.sets[name].update(w.strip() for w in words if w.strip())
            in_elements = "}" not in line
        elif line.endswith("{") and line.split()[0] in ("chain", "set", "counter"):
            kind, name = line.split()[0], line.split()[1]
            if kind == "chain":
                listing.chains[name] = []
            elif kind == "set":
                listing.sets[name] = set()
        elif line == "}":
            kind = ""
        elif kind == "chain" and line and not line.startswith(("comment ", "type ")):
            listing.chains[name].append(line)
        elif kind == "counter" and line.startswith("packets "):
            words = line.split()
            listing.counters[name] = (int(words[1]), int(words[3]))
    return listing


def _nft(args: list[str], data: str | None = None, host: Host = LOCAL
         ) -> subprocess.CompletedProcess[str]:
    binary = which("nft")
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
        #: The drop counter of each family's filter as the last check read it.
        self.dropped: dict[int, tuple[int, int]] = {}
        #: The drops of encapsulation sent by pods, by family, as the last check read them.
        self.pod_encap_dropped: dict[int, tuple[int, int]] = {}

    def _chains(self, spec: FamilyRules) -> list[tuple[str, str, str, list[str]]]:
        chains = []
        if spec.masquerade:
            chains.append(("postrtg", POSTRTG_COMMENT, "type nat hook postrouting priority "
                           "srcnat; policy accept;", masq_rules(spec)))
        if spec.forward:
            chains.append(("forward", FORWARD_COMMENT, "type filter hook forward priority "
                           "filter; policy accept;", forward_rules(spec)))
        if spec.drops_pod_encap:
            for chain, hook in POD_ENCAP_CHAINS.items():
                chains.append((chain, POD_ENCAP_COMMENT, f"type filter hook {hook} priority "
                               "filter; policy accept;",
                               pod_encap_rules(spec, forwarded=hook == "forward")))
        return chains

    def script(self, peers: PeerAddresses | None = None) -> str:
        """The whole rule set; the encapsulation filter only once ``peers`` is known."""
        lines = []
        for spec in self.families:
            family, table, _ = table_of(spec.version)
            lines.append(f'add table {family} {table} {{ comment "rules for {table}"; }}')
            if spec.drops_pod_encap:
                lines.append(f"add counter {family} {table} {POD_ENCAP_COUNTER}")
            chains = self._chains(spec)
            if spec.encap_ports and peers is not None:
                kind = "ipv4_addr" if spec.version == 4 else "ipv6_addr"
                lines.append(f"add counter {family} {table} {DROP_COUNTER}")
                lines.append(f'add set {family} {table} {PEER_SET} {{ type {kind}; '
                             f'comment "{PEER_SET_COMMENT}"; }}')
                lines.append(f"flush set {family} {table} {PEER_SET}")
                if peers[spec.version]:
                    lines.append(f"add element {family} {table} {PEER_SET} "
                                 f"{{ {_elements(peers[spec.version])} }}")
                chains.append(("input", INPUT_COMMENT, "type filter hook input priority "
                               "filter; policy accept;", input_rules(spec)))
            for chain, comment, hook, rules in chains:
                lines.append(f'add chain {family} {table} {chain} {{ comment "{comment}"; '
                             f"{hook} }}")
                lines.append(f"flush chain {family} {table} {chain}")
                lines += [f"add rule {family} {table} {chain} {rule}" for rule in rules]
        return "\n".join(lines) + "\n"

    def apply(self, peers: PeerAddresses | None = None) -> None:
        script = self.script(peers)
        log.log(V6, "nft -f - < %s", script)
        result = _nft(["-f", "-"], script, self.host)
        if result.returncode != 0:
            raise RulesError(f"nft rejected the flannel rules: {result.stderr.strip()}")

    def update_peers(self, added: PeerAddresses, removed: PeerAddresses) -> None:
        """Add and delete set elements, both families in one transaction. RulesError when
        nft refuses (e.g. an element to delete is already gone): apply the whole set then."""
        lines = []
        for spec in self.families:
            family, table, _ = table_of(spec.version)
            if not spec.encap_ports:
                continue
            if removed.get(spec.version):
                lines.append(f"delete element {family} {table} {PEER_SET} "
                             f"{{ {_elements(removed[spec.version])} }}")
            if added.get(spec.version):
                lines.append(f"add element {family} {table} {PEER_SET} "
                             f"{{ {_elements(added[spec.version])} }}")
        if not lines:
            return
        result = _nft(["-f", "-"], "\n".join(lines) + "\n", self.host)
        if result.returncode != 0:
            raise RulesError(f"nft refused the peer set update: {result.stderr.strip()}")

    def missing(self, peers: PeerAddresses | None = None) -> str:
        """What differs from ``script(peers)`` ("" when nothing): one listing per table;
        reads the drop counters on the way."""
        for spec in self.families:
            family, table, _ = table_of(spec.version)
            listed = _nft(["list", "table", family, table], host=self.host)
            if listed.returncode != 0:
                return f"nft table {family} {table} missing"
            try:
                have = parse_table(listed.stdout)
            except (ValueError, KeyError, IndexError):  # not nft's usual text
                return f"nft table {family} {table} unreadable"
            chains = self._chains(spec)
            if spec.drops_pod_encap:
                if POD_ENCAP_COUNTER not in have.counters:
                    return f"nft counter {family} {table} {POD_ENCAP_COUNTER} missing"
                self.pod_encap_dropped[spec.version] = have.counters[POD_ENCAP_COUNTER]
            if spec.encap_ports and peers is not None:
                chains.append(("input", INPUT_COMMENT, "", input_rules(spec)))
                if DROP_COUNTER in have.counters:
                    self.dropped[spec.version] = have.counters[DROP_COUNTER]
                else:
                    return f"nft counter {family} {table} {DROP_COUNTER} missing"
                # Text, not parsed addresses: parsing 5000 costs more than the listing.
                if have.sets.get(PEER_SET) != {str(a) for a in peers[spec.version]}:
                    return f"nft set {family} {table} {PEER_SET} differs"
            for chain, _comment, _hook, rules in chains:
                if chain not in have.chains:
                    return f"nft chain {family} {table} {chain} missing"
                if [numeric_protocols(rule) for rule in have.chains[chain]] != rules:
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


#: What each option adds to a family's table: (chains, sets, counters).
FILTER_OBJECTS = (("input",), (PEER_SET,), (DROP_COUNTER,))
POD_ENCAP_OBJECTS = (tuple(POD_ENCAP_CHAINS), (), (POD_ENCAP_COUNTER,))


def remove_objects(version: int, objects: tuple[tuple[str, ...], tuple[str, ...],
                                                tuple[str, ...]], host: Host = LOCAL) -> bool:
    """Remove what one option adds to a family's table (``FILTER_OBJECTS``,
    ``POD_ENCAP_OBJECTS``), if there (the option turned off); True when something was."""
    family, table, _ = table_of(version)
    if (family, table) not in find_tables(host):
        return False
    listed = _nft(["list", "table", family, table], host=host)
    have = parse_table(listed.stdout) if listed.returncode == 0 else TableListing()
    chains, sets, counters = objects
    lines = [f"delete chain {family} {table} {c}" for c in chains if c in have.chains]
    lines += [f"delete set {family} {table} {s}" for s in sets if s in have.sets]
    lines += [f"delete counter {family} {table} {c}" for c in counters if c in have.counters]
    if not lines:
        return False
    result = _nft(["-f", "-"], "\n".join(lines) + "\n", host)
    if result.returncode != 0:
        raise RulesError(f"nft could not remove {', '.join(chains + sets + counters)} from "
                         f"{table}: {result.stderr.strip()}")
    return True


def remove_all(host: Host = LOCAL) -> None:
    """Delete both flannel tables (used when iptables mode takes over)."""
    for family, table in find_tables(host):
        remove_table(family, table, host)
