"""How doctor reads this node's own input rules for what carries the overlay: a rule or a
policy that drops it is named, one that may let a peer's packets past is never claimed to
drop them (flanneld's own --encap-peers-only filter among them). The listings are as
``nft -j list ruleset``, ``nft -a list ruleset`` and ``iptables-save`` print them."""

from __future__ import annotations

import json

from flannel.ops.firewall import Target, iptables_drops, judge_nft, nft_texts

VXLAN, WIREGUARD, IKE, ESP = Target(17, 8472), Target(17, 51820), Target(17, 500), Target(50)

# A ruleset made with nft 1.0.6 and listed both ways.
RULESET = json.loads("""{"nftables": [
 {"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
 {"table": {"family": "inet", "name": "t", "handle": 1}},
 {"chain": {"family": "inet", "table": "t", "name": "input", "handle": 1, "type": "filter",
            "hook": "input", "prio": 0, "policy": "drop"}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 2, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
              "right": {"prefix": {"addr": "10.0.0.0", "len": 8}}}},
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}},
              "right": 8472}}, {"drop": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 4, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}},
              "right": {"set": [8285, 8472]}}},
   {"counter": {"packets": 0, "bytes": 0}}, {"drop": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 5, "expr": [
   {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "esp"}},
   {"reject": {"type": "icmpx", "expr": "port-unreachable"}}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "input", "handle": 6, "expr": [
   {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}},
              "right": 51820}}, {"accept": null}]}}]}""")
LISTING = """table inet t { # handle 1
\tchain input { # handle 1
\t\ttype filter hook input priority filter; policy drop;
\t\tip saddr 10.0.0.0/8 udp dport 8472 drop # handle 2
\t\tudp dport { 8285, 8472 } counter packets 0 bytes 0 drop # handle 4
\t\tmeta l4proto esp reject # handle 5
\t\tudp dport 51820 accept # handle 6
\t}
}
"""


def nft(target: Target, version: int = 4, doc: object = RULESET) -> list[str]:
    return [drop.text for drop in judge_nft(doc, version, target, frozenset(),
                                            lambda: nft_texts(LISTING))]


def test_nftables_rules_and_policy_are_named_past_rules_with_other_conditions():
    # The first rule drops only some sources: passed over; the set of ports decides.
    assert nft(VXLAN) == ["nftables table inet t chain input: udp dport { 8285, 8472 } "
                          "counter packets 0 bytes 0 drop (handle 4)"]
    assert nft(ESP) == ["nftables table inet t chain input: meta l4proto esp reject "
                        "(handle 5)"]
    assert nft(WIREGUARD) == []  # accepted
    assert nft(IKE) == ["nftables table inet t chain input: policy drop (no rule accepts it)"]
    assert nft(VXLAN, version=6)  # an inet table holds both families


def _ruleset(*rules: list[dict], policy: str = "accept", family: str = "ip") -> dict:
    items: list[dict] = [{"chain": {"family": family, "table": "x", "name": "input",
                                    "hook": "input", "prio": 0, "policy": policy}},
                         {"chain": {"family": family, "table": "x", "name": "peers"}}]
    for handle, (chain, expr) in enumerate(rules, 2):
        items.append({"rule": {"family": family, "table": "x", "chain": chain,
                               "handle": handle, "expr": expr}})
    return {"nftables": items}


DPORT = {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}},
                   "right": 8472}}
FROM_SET = {"match": {"op": "!=", "left": {"payload": {"protocol": "ip", "field": "saddr"}},
                      "right": "@peers"}}


def test_an_accept_with_other_conditions_makes_nothing_after_it_certain():
    accept_some = ("input", [{"match": {"op": "==", "left": {"payload": {
        "protocol": "ip", "field": "saddr"}}, "right": "192.168.111.0/24"}}, {"accept": None}])
    assert nft(VXLAN, doc=_ruleset(accept_some, ("input", [DPORT, {"drop": None}]))) == []
    assert nft(VXLAN, doc=_ruleset(accept_some, policy="drop")) == []
    # flanneld's own filter drops only what no lease's address sends.
    assert nft(VXLAN, doc=_ruleset(("input", [DPORT, FROM_SET, {"drop": None}]))) == []
    # Jumps are followed; a family the packet is not of is not looked at.
    jump = _ruleset(("input", [DPORT, {"jump": {"target": "peers"}}]),
                    ("peers", [{"drop": None}]))
    assert [d.chain for d in judge_nft(jump, 4, VXLAN, frozenset(), dict)] == ["peers"]
    assert nft(VXLAN, version=6, doc=jump) == []
    # iptables-nft's own tables are judged from its listing, not twice.
    assert judge_nft(jump, 4, VXLAN, frozenset({("ip", "x")}), dict) == []


def save(*rules: str, policy: str = "ACCEPT", chains: str = "") -> str:
    return "\n".join(["*filter", f":INPUT {policy} [0:0]", *(
        f":{chain} - [0:0]" for chain in chains.split()), *rules, "COMMIT", ""])


def ipt(listing: str, target: Target = VXLAN) -> list[str]:
    return [f"{d.chain}: {d.rule}" for d in iptables_drops("iptables-legacy", listing, target)]


def test_iptables_rules_jumps_and_policy():
    drop = "-A INPUT -p udp -m udp --dport 8472 -j DROP"
    assert ipt(save(drop)) == [f"INPUT: {drop}"]
    reject = "-A INPUT -p udp -m multiport --dports 8000:9000 -j REJECT --reject-with " \
             "icmp-port-unreachable"
    assert ipt(save(reject)) == [f"INPUT: {reject}"]
    assert ipt(save(drop), WIREGUARD) == []
    assert ipt(save(policy="DROP")) == ["INPUT: policy DROP (no rule accepts it)"]
    assert ipt(save("-A INPUT -p udp -m udp --dport 8472 -j ACCEPT", policy="DROP")) == []
    assert ipt(save("-A INPUT -i lo -j ACCEPT", policy="DROP")) == [
        "INPUT: policy DROP (no rule accepts it)"]  # a peer's packets are not on loopback
    assert ipt(save("-A INPUT -j FW", "-A FW -p udp --dport 8472 -j DROP", chains="FW")) == [
        "FW: -A FW -p udp --dport 8472 -j DROP"]
    assert ipt(save("-A INPUT -s 10.0.0.0/8 -j ACCEPT", drop)) == []
    assert ipt(save("-A INPUT -p esp -j DROP"), ESP) == ["INPUT: -A INPUT -p esp -j DROP"]


def test_flanneld_s_own_peer_filter_is_no_drop():
    listing = save(
        '-A INPUT -m comment --comment "flanneld encap filter" -j FLANNEL-INPUT',
        "-A FLANNEL-INPUT -p udp -m udp --dport 8472 -j FLANNEL-PEERS",
        "-A FLANNEL-PEERS -s 192.168.111.11/32 -j RETURN",
        "-A FLANNEL-PEERS -s 192.168.111.12/32 -j RETURN",
        "-A FLANNEL-PEERS -j FLANNEL-NOT-PEER",
        '-A FLANNEL-NOT-PEER -m comment --comment "not a peer" -j DROP',
        chains="FLANNEL-INPUT FLANNEL-PEERS FLANNEL-NOT-PEER")
    assert ipt(listing) == []
