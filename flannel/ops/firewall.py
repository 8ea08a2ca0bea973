"""Does this node's own input path drop what carries the overlay? Read from its rules.

Owns reading this namespace's input rules (the nftables ruleset, and the filter table of
every installed iptables backend, legacy and nft, for the family asked) and following them,
as the kernel would, for a packet of one protocol and destination port arriving from a
peer: base chains of the input hook in priority order, rules in order, jumps, returns, the
chain's policy. Only conditions on the protocol and the destination port (and the loopback
interface) are judged; a rule with any other condition (a source address, a conntrack
state, a set) may or may not match a peer's packet, so it is passed over, and once such a
rule could have let the packet past (accept, return, jump), a later drop or DROP policy is
not reported either: a peer may be among those it lets past (flanneld's own
``--encap-peers-only`` filter drops only what no lease's address sends).
The answer names the table, chain and rule. Must not touch: the rules (it only lists them).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flannel.ops.kernelview import ToolError, run_tool

PROTOCOLS = {"udp": 17, "tcp": 6, "esp": 50, "ipencap": 4, "icmp": 1,
             "ipv6-icmp": 58, "icmpv6": 58, "sctp": 132, "gre": 47, "ah": 51}
MAX_DEPTH = 16  # jumps followed at most (a loop of jumps is the kernel's refusal anyway)
_NFT_FAMILIES = {4: ("ip", "inet"), 6: ("ip6", "inet")}
_IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")


@dataclass(frozen=True)
class Target:
    """What a peer's packet is, for the rules: its IP protocol number and, for UDP, its
    destination port."""

    proto: int
    port: int = 0

    @property
    def text(self) -> str:
        return f"UDP {self.port}" if self.port else f"IP protocol {self.proto}"


@dataclass(frozen=True)
class Drop:
    """Where this node's input path drops a target: the tool that shows it (``nft``,
    ``iptables-legacy``...), table, chain, and the rule (or ``policy drop``)."""

    tool: str
    table: str
    chain: str
    rule: str
    target: Target

    @property
    def text(self) -> str:
        return f"{self.tool} table {self.table} chain {self.chain}: {self.rule}"


# -- a small three-valued match ---------------------------------------------------------------

YES, NO, MAYBE = "yes", "no", "maybe"


def _both(a: str, b: str) -> str:
    if NO in (a, b):
        return NO
    return MAYBE if MAYBE in (a, b) else YES


def _proto_number(value: object) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return int(value) if value.isdigit() else PROTOCOLS.get(value.lower())
    return None


# -- nftables ---------------------------------------------------------------------------------

def _nft_values(right: object) -> list[object] | None:
    """The values a match's right side names (None: a named set, or anything unknown)."""
    if isinstance(right, (int, str)):
        return None if isinstance(right, str) and right.startswith("@") else [right]
    if isinstance(right, dict) and "set" in right and isinstance(right["set"], list):
        return right["set"]
    if isinstance(right, dict) and "range" in right:
        return [right]
    return None


def _nft_contains(values: list[object], wanted: int, numbers: bool) -> bool:
    for value in values:
        if isinstance(value, dict) and isinstance(value.get("range"), list) \
                and len(value["range"]) == 2:
            low, high = value["range"]
            if isinstance(low, int) and isinstance(high, int) and low <= wanted <= high:
                return True
        elif (value if numbers else _proto_number(value)) == wanted:
            return True
    return False


def _nft_match(match: dict[str, Any], target: Target) -> str:
    left, op = match.get("left"), match.get("op", "==")
    values = _nft_values(match.get("right"))
    if op not in ("==", "!=", "in") or not isinstance(left, dict):
        return MAYBE
    payload, meta = left.get("payload"), left.get("meta")
    if isinstance(payload, dict) and payload.get("field") == "dport":
        proto = payload.get("protocol")
        if proto != "th" and _proto_number(proto) != target.proto:
            return NO if op != "!=" else MAYBE
        if not target.port or values is None:
            return MAYBE
        hit = _nft_contains(values, target.port, numbers=True)
    elif (isinstance(payload, dict) and payload.get("field") in ("protocol", "nexthdr")) \
            or (isinstance(meta, dict) and meta.get("key") == "l4proto"):
        if values is None:
            return MAYBE
        hit = _nft_contains(values, target.proto, numbers=False)
    elif isinstance(meta, dict) and meta.get("key") in ("iifname", "iif") \
            and match.get("right") == "lo" and op == "==":
        return NO  # a peer's packets do not come in on loopback
    else:
        return MAYBE
    return YES if hit == (op != "!=") else NO


_NFT_VERDICTS = ("accept", "drop", "reject", "jump", "goto", "return")


def _nft_rule(exprs: list[Any], target: Target) -> tuple[str, str, str]:
    """(match, verdict, jump target) of one rule for ``target``."""
    found, verdict, chain = YES, "", ""
    for expr in exprs:
        if not isinstance(expr, dict) or not expr:
            continue
        key = next(iter(expr))
        if key == "match" and isinstance(expr[key], dict):
            found = _both(found, _nft_match(expr[key], target))
        elif key in _NFT_VERDICTS:
            verdict = key
            body = expr[key]
            chain = str(body.get("target", "")) if isinstance(body, dict) else ""
        elif key not in ("counter", "log", "comment", "notrack", "meta"):
            found = _both(found, MAYBE)  # limits, quotas, set lookups, marks...
    return found, verdict, chain


@dataclass
class _Walk:
    """One walk through a table's chains for a target: the rule that decided, if any, and
    whether an accept with other conditions was passed."""

    chains: Mapping[str, list[tuple[list[Any], int]]]
    target: Target
    maybe_accepted: bool = False

    def run(self, chain: str, depth: int = 0) -> tuple[str, str, int] | None:
        """("accept" | "drop", chain, handle) when a rule decides; None to go on."""
        if depth > MAX_DEPTH:
            return None
        for exprs, handle in self.chains.get(chain, []):
            found, verdict, jump = _nft_rule(exprs, self.target)
            if found == NO or not verdict:
                continue
            if found == MAYBE:
                self.maybe_accepted |= verdict in ("accept", "jump", "goto", "return")
                continue
            if verdict in ("drop", "reject"):
                return ("drop" if not self.maybe_accepted else "unsure"), chain, handle
            if verdict == "accept":
                return "accept", chain, handle
            if verdict == "return":
                return None
            decided = self.run(jump, depth + 1)
            if decided is not None or verdict == "goto":
                return decided
        return None


def nft_texts(listing: str) -> dict[tuple[str, str, str, int], str]:
    """(family, table, chain, handle) -> the rule as ``nft -a list ruleset`` prints it."""
    texts: dict[tuple[str, str, str, int], str] = {}
    family = table = chain = ""
    for line in listing.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "table":
            family, table = words[1], words[2]
        elif len(words) >= 2 and words[0] == "chain":
            chain = words[1]
        elif (found := re.search(r"\s# handle (\d+)$", line)) and chain:
            texts[(family, table, chain, int(found[1]))] = line[:found.start()].strip()
    return texts


def nft_drops(version: int, target: Target, skip_tables: frozenset[tuple[str, str]]
              ) -> list[Drop]:
    """Where the nftables ruleset drops ``target`` at the input hook (tables ``skip_tables``
    aside: iptables-nft's, judged from ``iptables-nft-save``)."""
    try:
        doc = json.loads(run_tool("nft", "-j", "list", "ruleset"))
    except (ToolError, ValueError):
        return []

    def texts() -> dict[tuple[str, str, str, int], str]:
        try:
            return nft_texts(run_tool("nft", "-a", "list", "ruleset"))
        except ToolError:
            return {}

    return judge_nft(doc, version, target, skip_tables, texts)


def judge_nft(doc: object, version: int, target: Target,
              skip_tables: frozenset[tuple[str, str]],
              texts: Callable[[], dict[tuple[str, str, str, int], str]]) -> list[Drop]:
    """``nft -j list ruleset``'s document judged for ``target``; ``texts`` gives the rules
    as ``nft -a list ruleset`` prints them (asked only when a rule is to be named)."""
    items = doc.get("nftables", []) if isinstance(doc, dict) else []
    chains: dict[tuple[str, str], dict[str, list[tuple[list[Any], int]]]] = {}
    bases = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        chain, rule = item.get("chain"), item.get("rule")
        if isinstance(chain, dict):
            key = (str(chain.get("family")), str(chain.get("table")))
            chains.setdefault(key, {}).setdefault(str(chain.get("name")), [])
            if chain.get("hook") == "input" and key[0] in _NFT_FAMILIES[version] \
                    and key not in skip_tables:
                prio = chain.get("prio")
                bases.append((prio if isinstance(prio, int) else 0, key,
                              str(chain.get("name")), str(chain.get("policy", "accept"))))
        elif isinstance(rule, dict):
            key = (str(rule.get("family")), str(rule.get("table")))
            exprs = rule.get("expr")
            handle = rule.get("handle")
            chains.setdefault(key, {}).setdefault(str(rule.get("chain")), []).append(
                (exprs if isinstance(exprs, list) else [],
                 handle if isinstance(handle, int) else 0))
    for _prio, key, name, policy in sorted(bases):
        walk = _Walk(chains.get(key, {}), target)
        decided = walk.run(name)
        if decided is not None and decided[0] == "unsure":
            break  # it may be let past: nothing to say for sure
        if decided is not None and decided[0] == "accept":
            continue  # accepted here: the next base chain of the hook judges it again
        if decided is None and (policy != "drop" or walk.maybe_accepted):
            continue
        if decided is None:
            return [Drop("nftables", f"{key[0]} {key[1]}", name,
                         "policy drop (no rule accepts it)", target)]
        rule = texts().get((*key, decided[1], decided[2]), "a rule")
        return [Drop("nftables", f"{key[0]} {key[1]}", decided[1],
                     f"{rule} (handle {decided[2]})", target)]
    return []


# -- iptables ---------------------------------------------------------------------------------

def _port_in(spec: str, port: int) -> bool:
    for part in spec.split(","):
        low, _, high = part.partition(":")
        if low.isdigit() and (high.isdigit() if high else True) \
                and int(low) <= port <= int(high or low):
            return True
    return False


def _iptables_rule(words: list[str], target: Target) -> tuple[str, str]:
    """(match, jump target) of one ``-A`` rule's words (the chain name removed)."""
    found = YES
    i = 0
    while i < len(words):
        word = words[i]
        value = words[i + 1] if i + 1 < len(words) else ""
        if word == "!":
            return MAYBE, ""  # negations: not judged
        if word in ("-j", "-g", "--jump", "--goto"):
            return found, value  # what follows are the target's own options
        if word in ("-p", "--protocol"):
            found = _both(found, YES if _proto_number(value) == target.proto else NO)
        elif word in ("--dport", "--destination-port", "--dports", "--destination-ports"):
            found = _both(found, YES if target.port and _port_in(value, target.port) else NO)
        elif word in ("-i", "--in-interface") and value == "lo":
            found = NO
        elif word == "-m" and value in ("udp", "tcp", "multiport", "comment"):
            pass
        elif word == "--comment":
            pass
        else:
            return MAYBE, _jump(words)
        i += 2
    return found, ""


def _jump(words: list[str]) -> str:
    for i, word in enumerate(words[:-1]):
        if word in ("-j", "-g", "--jump", "--goto"):
            return words[i + 1]
    return ""


def iptables_drops(tool: str, listing: str, target: Target) -> list[Drop]:
    """Where one ``*-save`` listing's filter table drops ``target`` in INPUT."""
    chains: dict[str, list[tuple[list[str], str]]] = {}
    policies: dict[str, str] = {}
    table = ""
    for line in listing.splitlines():
        if line.startswith("*"):
            table = line[1:].strip()
        elif table != "filter":
            continue
        elif line.startswith(":") and len(line.split()) >= 2:
            name, policy = line[1:].split()[:2]
            policies[name] = policy
            chains.setdefault(name, [])
        elif line.startswith("-A "):
            try:
                words = shlex.split(line)
            except ValueError:
                continue
            if len(words) >= 2:
                chains.setdefault(words[1], []).append((words[2:], line))
    if "INPUT" not in policies:
        return []
    maybe_accepted = False

    def run(chain: str, depth: int) -> tuple[str, str, str] | None:
        nonlocal maybe_accepted
        if depth > MAX_DEPTH:
            return None
        for words, line in chains.get(chain, []):
            found, jump = _iptables_rule(words, target)
            if found == NO or not jump:
                continue
            if found == MAYBE:
                maybe_accepted |= jump not in ("DROP", "REJECT")
                continue
            if jump in ("DROP", "REJECT"):
                return ("drop" if not maybe_accepted else "unsure"), chain, line
            if jump == "ACCEPT":
                return "accept", chain, line
            if jump == "RETURN":
                return None
            if jump in chains:
                decided = run(jump, depth + 1)
                if decided is not None:
                    return decided
        return None

    decided = run("INPUT", 0)
    if decided is not None and decided[0] == "drop":
        return [Drop(tool, "filter", decided[1], decided[2], target)]
    if decided is None and policies["INPUT"] == "DROP" and not maybe_accepted:
        return [Drop(tool, "filter", "INPUT", "policy DROP (no rule accepts it)", target)]
    return []


def _iptables_listings(version: int) -> Iterator[tuple[str, str]]:
    from flannel.rules import iptables
    from flannel.rules.mode import installed

    variants = [v for v in (iptables.LEGACY, iptables.NFT) if installed(v)] or [iptables.PLAIN]
    for variant in variants:
        listing = iptables.save_listing(variant, version)
        if listing.strip():
            yield variant.command(version, ""), listing


def own_drops(version: int, targets: list[Target]) -> list[Drop]:
    """Every place this node's input path drops one of ``targets`` (at most one per tool
    and target: the first rule that decides)."""
    listings = list(_iptables_listings(version))
    # iptables-nft's tables are in the nftables ruleset too: judged once, from its listing.
    skip = frozenset((family, name) for tool, listing in listings if "nft" in tool
                     for family in _NFT_FAMILIES[version] if family != "inet"
                     for name in _IPTABLES_TABLES if f"*{name}" in listing)
    drops = []
    for target in targets:
        drops += nft_drops(version, target, skip)
        for tool, listing in listings:
            drops += iptables_drops(tool, listing, target)
    return drops
