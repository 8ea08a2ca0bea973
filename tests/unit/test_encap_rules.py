"""The encapsulation filter's rule texts in both modes, without a kernel: the nftables
script with and without a known peer set, the iptables chains, the peer difference, and
the listings read back (table listing, counters)."""

from __future__ import annotations

from ipaddress import ip_address, ip_network

from flannel.backend.base import BackendOptions
from flannel.kernel.host import LOCAL
from flannel.rules import iptables, nftables
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules, peer_addresses

V4 = FamilyRules(4, ip_network("10.42.0.0/16"), ip_network("10.42.1.0/24"), False, True,
                 encap_ports=(8472,))
V6 = FamilyRules(6, ip_network("fd00:42::/56"), ip_network("fd00:42::/64"), False, True,
                 encap_ports=(8472,))
PEERS = peer_addresses([ip_address("192.0.2.9"), ip_address("192.0.2.10"), None,
                        ip_address("2001:db8::2")])


def test_peer_addresses_group_by_family_and_skip_missing():
    assert PEERS == {4: {ip_address("192.0.2.9"), ip_address("192.0.2.10")},
                     6: {ip_address("2001:db8::2")}}
    assert peer_addresses([]) == {4: frozenset(), 6: frozenset()}


def test_nftables_filter_is_written_only_once_peers_are_known():
    rules = nftables.NftablesRules([V4, V6])
    without = rules.script(None)
    assert "input" not in without and "peers" not in without
    script = rules.script(PEERS).splitlines()
    assert "add counter ip flannel-ipv4 not-peer-drops" in script
    assert "flush set ip flannel-ipv4 peers" in script
    # Sorted by address bytes, not text: .9 before .10.
    assert "add element ip flannel-ipv4 peers { 192.0.2.9, 192.0.2.10 }" in script
    assert "add element ip6 flannel-ipv6 peers { 2001:db8::2 }" in script
    assert ('add rule ip6 flannel-ipv6 input udp dport 8472 ip6 saddr != @peers '
            'counter name "not-peer-drops" drop') in script
    # The set is filled before the rule that reads it; the counter exists before both.
    assert script.index("add element ip flannel-ipv4 peers { 192.0.2.9, 192.0.2.10 }") < \
        next(i for i, line in enumerate(script) if "saddr != @peers" in line)


def test_nftables_empty_peer_set_writes_no_empty_element_list():
    script = nftables.NftablesRules([V6]).script(peer_addresses([ip_address("192.0.2.1")]))
    assert "add element" not in script and "flush set ip6 flannel-ipv6 peers" in script


def test_nftables_listing_is_read_back():
    listing = nftables.parse_table("""table ip flannel-ipv4 {
	comment "rules for flannel-ipv4"
	counter not-peer-drops {
		packets 7 bytes 546
	}

	set peers {
		type ipv4_addr
		comment "public addresses of the leases"
		elements = { 192.0.2.9,
			192.0.2.10 }
	}

	chain input {
		comment "chain to drop encapsulated traffic from non-peers"
		type filter hook input priority filter; policy accept;
		udp dport 8472 ip saddr != @peers counter name "not-peer-drops" drop
	}
}""")
    assert listing.counters == {"not-peer-drops": (7, 546)}
    assert listing.sets == {"peers": {"192.0.2.9", "192.0.2.10"}}
    assert listing.chains["input"] == nftables.input_rules(V4)


def test_iptables_chains_callees_first_and_the_jump_inserted_first():
    rules = iptables.IptablesRules([V4])
    assert [c.chain for c in rules.chains(V4, None)] == ["FLANNEL-FWD"]
    chains = rules.chains(V4, PEERS)
    assert [c.chain for c in chains] == ["FLANNEL-FWD", "FLANNEL-NOT-PEER", "FLANNEL-PEERS",
                                         "FLANNEL-INPUT"]
    peers = [iptables.render(rule) for rule in chains[2].rules]
    assert peers == ["-s 192.0.2.9/32 -j RETURN", "-s 192.0.2.10/32 -j RETURN",
                     "-j FLANNEL-NOT-PEER"]
    assert [iptables.render(r) for r in chains[3].rules] == [
        '-p udp -m udp --dport 8472 -m comment --comment "flanneld encap filter" '
        "-j FLANNEL-PEERS"]
    assert chains[3].first and chains[3].parent == "INPUT"
    v6 = iptables.peers_chain(V6, PEERS)
    assert iptables.render(v6.rules[0]) == "-s 2001:db8::2/128 -j RETURN"


def test_iptables_listing_counters_are_read_and_stripped():
    rules = iptables.IptablesRules([V4])
    # As iptables-legacy and iptables-nft 1.8.9 print ``-S -v``.
    lines = rules._strip_counters(4, "-P INPUT ACCEPT -c 3 4\n-N FLANNEL-NOT-PEER\n"
                                  '-A FLANNEL-NOT-PEER -m comment --comment '
                                  '"flanneld not a peer" -c 5 390 -j DROP\n'
                                  "-A FLANNEL-PEERS -c 9 9 -j FLANNEL-NOT-PEER")
    assert rules.dropped == {4: (5, 390)}
    assert lines == ["-P INPUT ACCEPT", "-N FLANNEL-NOT-PEER",
                     '-A FLANNEL-NOT-PEER -m comment --comment "flanneld not a peer" -j DROP',
                     "-A FLANNEL-PEERS -j FLANNEL-NOT-PEER"]


def test_drop_counters_stay_monotonic_when_the_kernel_restarts_them():
    traffic = TrafficManager([V4], nftables_mode=True, host=LOCAL)
    for read in ((5, 500), (7, 700), (2, 200), (3, 300)):
        traffic.rules.dropped[4] = read
        traffic._count_drops()
    assert traffic.status.not_peer_dropped[4] == (10, 1000)
    assert traffic.status.filtered == (4,)


def test_without_encap_ports_nothing_is_filtered():
    spec = FamilyRules(4, ip_network("10.42.0.0/16"), ip_network("10.42.1.0/24"), False,
                       False)
    traffic = TrafficManager([spec], nftables_mode=True)
    assert traffic.families == [] and traffic.status.filtered == ()
    traffic.set_peers(PEERS)  # ignored
    assert traffic._peers is None
    assert BackendOptions().encap_peers_only is False
