"""The drop of encapsulation sent by pods (``--drop-pod-encap``) without a kernel: what each
backend declares it receives on, the rule texts of both modes, the rules built from the
flags, listings read back with protocols by name, and the counters."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, ip_network

import pytest

from flannel.backend.base import Encapsulation
from flannel.backend.ipip import IpipBackend
from flannel.backend.ipsec import IpsecBackend
from flannel.backend.udp import UdpBackend
from flannel.backend.vxlan import VxlanBackend
from flannel.backend.wireguard import WireguardBackend
from flannel.config import parse_config
from flannel.flags import parse_args
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease
from flannel.rules import iptables, nftables
from flannel.rules.build import traffic_rules
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules, numeric_protocols
from flannel.wireguard.config import DeviceLayout

V4 = FamilyRules(4, ip_network("10.42.0.0/16"), ip_network("10.42.1.0/24"), False, False,
                 pod_encap_ports=(8472,), pod_encap_protocols=(socket.IPPROTO_ESP,))
V6 = FamilyRules(6, ip_network("fd00:42::/56"), ip_network("fd00:42::/64"), False, False,
                 pod_encap_ports=(51820,))
EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.0.2.1"), None,
                        IPv4Address("192.0.2.1"), None)
LEASE = Lease(ip_network("10.42.1.0/24"))


def backend(cls, config: str):
    return cls(EXT, parse_config(config))


def test_each_backend_declares_every_port_and_protocol_it_receives_on():
    vxlan = backend(VxlanBackend, '{"Network": "10.42.0.0/16", "Backend": {"Type": "vxlan", '
                                  '"Port": 4789}}')
    vxlan.families = {4: None}  # prepared, with an IPv4 device
    assert vxlan.encapsulation() == Encapsulation(udp={4: (4789,)})
    udp = backend(UdpBackend, '{"Network": "10.42.0.0/16", "Backend": {"Type": "udp"}}')
    assert udp.encapsulation() == Encapsulation(udp={4: (8285,)})
    ipip = backend(IpipBackend, '{"Network": "10.42.0.0/16", "Backend": {"Type": "ipip"}}')
    assert ipip.encapsulation() == Encapsulation(protocols={4: (socket.IPPROTO_IPIP,)})
    ipsec = backend(IpsecBackend, '{"Network": "10.42.0.0/16", "Backend": {"Type": "ipsec", '
                                  f'"PSK": "{"a" * 96}"}}}}')
    assert ipsec.encapsulation() == Encapsulation(
        udp={4: (500, 4500)}, protocols={4: (socket.IPPROTO_ESP,)}, authenticated=True)
    wireguard = backend(WireguardBackend, '{"Network": "10.42.0.0/16", "EnableIPv6": true, '
                        '"IPv6Network": "fd00:42::/56", "Backend": {"Type": "wireguard"}}')

    class Prepared:  # what prepare() makes: one device per family in "separate" mode
        def __init__(self, layout: DeviceLayout) -> None:
            self.layout = layout

    wireguard.devices = [Prepared(layout) for layout in wireguard.wg.devices(True, True)]
    assert wireguard.encapsulation() == Encapsulation(
        udp={4: (51820, 51821), 6: (51820, 51821)}, authenticated=True)


def test_iptables_drops_pod_packets_to_this_node_and_forwarded_out_of_the_pod_network():
    chains = iptables.IptablesRules([V4]).chains(V4)
    assert [(c.chain, c.parent, c.first) for c in chains] == [
        ("FLANNEL-POD-ENCAP-IN", "INPUT", True), ("FLANNEL-POD-ENCAP-FWD", "FORWARD", True)]
    tag = '-m comment --comment "flanneld pod encap drop"'
    assert [iptables.render(r) for r in chains[0].rules] == [
        f"-s 10.42.0.0/16 -p udp -m udp --dport 8472 {tag} -j DROP",
        f"-s 10.42.0.0/16 -p 50 {tag} -j DROP"]
    assert [iptables.render(r) for r in chains[1].rules] == [
        f"-s 10.42.0.0/16 ! -d 10.42.0.0/16 -p udp -m udp --dport 8472 {tag} -j DROP",
        f"-s 10.42.0.0/16 ! -d 10.42.0.0/16 -p 50 {tag} -j DROP"]
    assert iptables.render(chains[1].jump) == f"{tag} -j FLANNEL-POD-ENCAP-FWD"


def test_nftables_drops_pod_packets_counted_by_one_named_counter():
    script = nftables.NftablesRules([V4, V6]).script().splitlines()
    assert script.index("add counter ip flannel-ipv4 pod-encap-drops") < next(
        i for i, line in enumerate(script) if "pod-encap-input" in line)
    assert ('add rule ip flannel-ipv4 pod-encap-input ip saddr 10.42.0.0/16 udp dport 8472 '
            'counter name "pod-encap-drops" drop') in script
    assert ('add rule ip flannel-ipv4 pod-encap-forward ip saddr 10.42.0.0/16 ip daddr != '
            '10.42.0.0/16 meta l4proto 50 counter name "pod-encap-drops" drop') in script
    assert ('add rule ip6 flannel-ipv6 pod-encap-forward ip6 saddr fd00:42::/56 ip6 daddr != '
            'fd00:42::/56 udp dport 51820 counter name "pod-encap-drops" drop') in script
    assert any("type filter hook forward" in line and "pod-encap-forward" in line
               for line in script)


def test_protocols_listed_by_name_compare_equal_to_the_numbers_written():
    # As iptables -S and nft list print them where /etc/protocols names the number.
    assert socket.getprotobyname("esp") == 50, "this test needs /etc/protocols (netbase)"
    assert numeric_protocols('-A X -s 10.42.0.0/16 -p esp -m comment --comment "a" -j DROP') \
        == '-A X -s 10.42.0.0/16 -p 50 -m comment --comment "a" -j DROP'
    assert numeric_protocols("ip saddr 10.42.0.0/16 meta l4proto ipencap counter") \
        == "ip saddr 10.42.0.0/16 meta l4proto 4 counter"
    assert numeric_protocols("-p udp -m udp --dport 8472") == "-p 17 -m udp --dport 8472"
    assert numeric_protocols("-p no-such-protocol") == "-p no-such-protocol"
    listing = nftables.parse_table("""table ip flannel-ipv4 {
	counter pod-encap-drops {
		packets 3 bytes 252
	}

	chain pod-encap-input {
		comment "chain to drop encapsulated traffic sent by pods"
		type filter hook input priority filter; policy accept;
		ip saddr 10.42.0.0/16 udp dport 8472 counter name "pod-encap-drops" drop
		ip saddr 10.42.0.0/16 meta l4proto esp counter name "pod-encap-drops" drop
	}
}""")
    assert [numeric_protocols(rule) for rule in listing.chains["pod-encap-input"]] == \
        nftables.pod_encap_rules(V4, forwarded=False)
    assert listing.counters["pod-encap-drops"] == (3, 252)


def test_iptables_counters_of_both_chains_are_summed():
    rules = iptables.IptablesRules([V4])
    rules._strip_counters(4, '-A FLANNEL-POD-ENCAP-IN -s 10.42.0.0/16 -p esp -m comment '
                             '--comment "flanneld pod encap drop" -c 2 100 -j DROP\n'
                             "-A FLANNEL-POD-ENCAP-FWD -c 3 200 -s 10.42.0.0/16 -j DROP\n"
                             "-A FLANNEL-NOT-PEER -c 7 7 -j DROP")
    assert rules.pod_encap_dropped == {4: (5, 300)} and rules.dropped == {4: (7, 7)}


def test_pod_encap_counters_stay_monotonic_when_the_kernel_restarts_them():
    traffic = TrafficManager([V4], nftables_mode=True)
    for read in ((5, 500), (7, 700), (2, 200)):
        traffic.rules.pod_encap_dropped[4] = read
        traffic._count_drops()
    assert traffic.status.pod_encap_dropped[4] == (9, 900)
    assert traffic.status.pod_encap == (4,) and traffic.status.filtered == ()


@pytest.mark.parametrize("flags, ports, protocols", [
    ((), (500, 4500), (socket.IPPROTO_ESP,)),
    (("--drop-pod-encap=false",), (), ())])
def test_the_flag_turns_the_drop_on_by_default_and_off(flags, ports, protocols):
    settings = parse_args(list(flags), {})
    config = parse_config('{"Network": "10.42.0.0/16", "Backend": {"Type": "ipsec"}}')
    ipsec = Encapsulation(udp={4: (500, 4500)}, protocols={4: (socket.IPPROTO_ESP,)},
                          authenticated=True)
    traffic = traffic_rules(settings.rules, config, LEASE, ipsec)
    spec = traffic.rules.families[0]
    assert (spec.pod_encap_ports, spec.pod_encap_protocols) == (ports, protocols)
    assert spec.encap_ports == ()  # authenticated: --encap-peers-only has nothing to filter
    assert parse_args([], {"FLANNELD_DROP_POD_ENCAP": "false"}).rules.drop_pod_encap is False


def test_encap_peers_only_filters_only_unauthenticated_ports():
    settings = parse_args(["--encap-peers-only"], {})
    config = parse_config('{"Network": "10.42.0.0/16", "Backend": {"Type": "vxlan"}}')
    traffic = traffic_rules(settings.rules, config, LEASE, Encapsulation(udp={4: (8472,)}))
    spec = traffic.rules.families[0]
    assert spec.encap_ports == (8472,) and spec.pod_encap_ports == (8472,)
