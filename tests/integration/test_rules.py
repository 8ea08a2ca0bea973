"""Masquerade and forward rules in a network namespace: golden listings of the compat
reference (7.1, 7.2, 7.4), idempotence, repair, mode switching, br_netfilter, blackholes."""

from __future__ import annotations

import subprocess
from ipaddress import ip_network

import pytest

from flannel.kernel import rtnl
from flannel.kernel.blackhole import BLACKHOLE_METRIC, ensure_blackholes
from flannel.kernel.host import Host
from flannel.rules.iptables import RulesError
from flannel.rules.manager import TrafficManager, check_br_netfilter
from flannel.rules.spec import FamilyRules

C, P = "10.42.0.0/16", "10.42.0.0/24"
C6, P6 = "fd00:42::/56", "fd00:42::/64"
V4 = FamilyRules(4, ip_network(C), ip_network(P), True, True)
V6 = FamilyRules(6, ip_network(C6), ip_network(P6), True, True)

GOLDEN_NAT = f"""-N FLANNEL-POSTRTG
-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG
-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {P} -d {C} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {C} -d {P} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG ! -s {C} -d {P} -m comment --comment "flanneld masq" -j RETURN
-A FLANNEL-POSTRTG -s {C} ! -d 224.0.0.0/4 -m comment --comment "flanneld masq" -j MASQUERADE --random-fully
-A FLANNEL-POSTRTG ! -s {C} -d {C} -m comment --comment "flanneld masq" -j MASQUERADE --random-fully"""  # noqa: E501
GOLDEN_FWD = f"""-N FLANNEL-FWD
-A FORWARD -m comment --comment "flanneld forward" -j FLANNEL-FWD
-A FLANNEL-FWD -s {C} -m comment --comment "flanneld forward" -j ACCEPT
-A FLANNEL-FWD -d {C} -m comment --comment "flanneld forward" -j ACCEPT"""
GOLDEN_NFT = """table ip flannel-ipv4 {
	comment "rules for flannel-ipv4"
	chain postrtg {
		comment "chain to manage traffic masquerading by flannel"
		type nat hook postrouting priority srcnat; policy accept;
		meta mark 0x00004000 return
		ip saddr 10.42.0.0/24 ip daddr 10.42.0.0/16 return
		ip saddr 10.42.0.0/16 ip daddr 10.42.0.0/24 return
		ip saddr != 10.42.0.0/24 ip daddr 10.42.0.0/16 return
		ip saddr 10.42.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random
		ip saddr != 10.42.0.0/16 ip daddr 10.42.0.0/16 masquerade fully-random
	}

	chain forward {
		comment "chain to accept flannel traffic"
		type filter hook forward priority filter; policy accept;
		ip saddr 10.42.0.0/16 accept
		ip daddr 10.42.0.0/16 accept
	}
}"""


def run(ns: str, *cmd: str, check: bool = True) -> str:
    result = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                            timeout=30, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd}: {result.stderr}")
    return result.stdout


def listing(ns: str, binary: str, table: str) -> str:
    lines = run(ns, binary, "-t", table, "-S").splitlines()
    return "\n".join(line for line in lines if not line.startswith("-P "))


def manager(ns: str, nft: bool = False, families=(V4, V6)) -> TrafficManager:
    traffic = TrafficManager(list(families), nft, host=Host(ns))
    traffic.prepare()
    return traffic


def test_iptables_golden_listings_v4_and_v6(ns):
    traffic = manager(ns)
    assert traffic.ensure() is True
    assert listing(ns, "iptables", "nat") == GOLDEN_NAT
    assert listing(ns, "iptables", "filter") == GOLDEN_FWD
    v6 = (GOLDEN_NAT.replace(C, C6).replace(P, P6).replace("224.0.0.0/4", "ff00::/8"))
    assert listing(ns, "ip6tables", "nat") == v6
    assert listing(ns, "ip6tables", "filter") == GOLDEN_FWD.replace(C, C6)


def test_reapplying_never_duplicates_and_repairs_what_is_missing(ns):
    traffic = manager(ns)
    traffic.ensure()
    traffic.rules.apply()
    traffic.rules.apply()
    assert listing(ns, "iptables", "nat") == GOLDEN_NAT
    assert traffic.ensure() is False  # nothing missing: nothing done
    run(ns, "iptables", "-t", "nat", "-F", "FLANNEL-POSTRTG")
    run(ns, "iptables", "-D", "FORWARD", "-m", "comment", "--comment", "flanneld forward",
        "-j", "FLANNEL-FWD")
    assert traffic.rules.missing()
    assert traffic.ensure() is True
    assert listing(ns, "iptables", "nat") == GOLDEN_NAT
    assert listing(ns, "iptables", "filter") == GOLDEN_FWD


def test_non_masquerade_destinations_return_before_masquerade(ns):
    spec = FamilyRules(4, ip_network(C), ip_network(P), True, False,
                       non_masquerade=(ip_network("192.168.0.0/16"),))
    manager(ns, families=[spec]).ensure()
    lines = listing(ns, "iptables", "nat").splitlines()
    keep = f'-A FLANNEL-POSTRTG -s {C} -d 192.168.0.0/16 -m comment --comment "flanneld masq" ' \
           "-j RETURN"
    assert lines.index(keep) < next(i for i, line in enumerate(lines) if "MASQUERADE" in line)
    assert "FLANNEL-FWD" not in listing(ns, "iptables", "filter")


def test_nftables_golden_and_repair(ns):
    traffic = manager(ns, nft=True, families=[V4])
    assert traffic.ensure() is True
    assert run(ns, "nft", "list", "table", "ip", "flannel-ipv4").strip() == GOLDEN_NFT
    run(ns, "nft", "flush", "chain", "ip", "flannel-ipv4", "postrtg")
    assert traffic.ensure() is True
    assert run(ns, "nft", "list", "table", "ip", "flannel-ipv4").strip() == GOLDEN_NFT


def test_switching_modes_leaves_nothing_of_the_other(ns):
    manager(ns).ensure()
    manager(ns, nft=True).ensure()
    for binary in ("iptables", "ip6tables"):
        for table in ("nat", "filter"):
            assert "FLANNEL" not in listing(ns, binary, table)
    assert "flannel-ipv6" in run(ns, "nft", "list", "tables")
    manager(ns).ensure()
    assert "flannel" not in run(ns, "nft", "list", "tables")
    assert listing(ns, "iptables", "nat") == GOLDEN_NAT


def test_br_netfilter_check_says_what_to_do(tmp_path):
    (tmp_path / "sys/net/bridge").mkdir(parents=True)
    (tmp_path / "sys/net/bridge/bridge-nf-call-iptables").write_text("1")
    check_br_netfilter([4], proc=tmp_path)
    with pytest.raises(RulesError, match="modprobe br_netfilter"):
        check_br_netfilter([4, 6], proc=tmp_path)


def test_blackholes_follow_the_lease(ns):
    sock = rtnl.Rtnl(Host(ns))
    try:
        assert ensure_blackholes(sock, [ip_network("10.42.7.0/24"), ip_network(P6)]) == 2
        routes = run(ns, "ip", "route", "show", "type", "blackhole")
        assert f"blackhole 10.42.7.0/24 proto 151 metric {BLACKHOLE_METRIC}" in routes
        assert ensure_blackholes(sock, [ip_network("10.42.7.0/24"), ip_network(P6)]) == 0
        # The lease changed: the old blackhole goes, the new one comes.
        assert ensure_blackholes(sock, [ip_network("10.42.8.0/24")]) == 3
        routes = run(ns, "ip", "route", "show", "type", "blackhole")
        assert "10.42.8.0/24" in routes and "10.42.7.0/24" not in routes
        assert "blackhole" not in run(ns, "ip", "-6", "route")
    finally:
        sock.close()
