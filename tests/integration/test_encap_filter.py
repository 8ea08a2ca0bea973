"""The encapsulation filter (``--encap-peers-only``) in network namespaces, both rule modes:
what the kernel holds (golden listings), a peer set change written as a difference, real
UDP packets to the vxlan port dropped from a non-peer and passed from a peer, the drop
counter, repair of a set changed by hand, and nothing filtered before the first peer set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator
from ipaddress import ip_address, ip_network

import pytest

from flannel.kernel.host import Host
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules, peer_addresses
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns

C, P = "10.42.0.0/16", "10.42.0.0/24"
NODE, PEER, ROGUE = "10.50.0.1", "10.50.0.2", "10.50.0.3"
PORT = 8472
FILTERED = FamilyRules(4, ip_network(C), ip_network(P), False, False, encap_ports=(PORT,))
V6 = FamilyRules(6, ip_network("fd00:42::/56"), ip_network("fd00:42::/64"), False, False,
                 encap_ports=(PORT,))

GOLDEN_INPUT = f"""-N FLANNEL-INPUT
-N FLANNEL-NOT-PEER
-N FLANNEL-PEERS
-A INPUT -m comment --comment "flanneld encap filter" -j FLANNEL-INPUT
-A FLANNEL-INPUT -p udp -m udp --dport {PORT} -m comment --comment "flanneld encap filter" -j FLANNEL-PEERS
-A FLANNEL-NOT-PEER -m comment --comment "flanneld not a peer" -j DROP
-A FLANNEL-PEERS -s {NODE}/32 -j RETURN
-A FLANNEL-PEERS -s {PEER}/32 -j RETURN
-A FLANNEL-PEERS -j FLANNEL-NOT-PEER"""  # noqa: E501
GOLDEN_NFT = f"""table ip flannel-ipv4 {{
	comment "rules for flannel-ipv4"
	counter not-peer-drops {{
		packets 0 bytes 0
	}}

	set peers {{
		type ipv4_addr
		comment "public addresses of the leases"
		elements = {{ {NODE}, {PEER} }}
	}}

	chain input {{
		comment "chain to drop encapsulated traffic from non-peers"
		type filter hook input priority filter; policy accept;
		udp dport {PORT} ip saddr != @peers counter name "not-peer-drops" drop
	}}
}}"""


def run(ns: str, *cmd: str) -> str:
    result = subprocess.run(["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True,
                            timeout=30, check=False)
    assert result.returncode == 0, f"{cmd}: {result.stderr}"
    return result.stdout


def filter_listing(ns: str) -> str:
    return "\n".join(line for line in run(ns, "iptables", "-S").splitlines()
                     if not line.startswith("-P "))


@pytest.fixture
def wire(ns) -> Iterator[tuple[str, str]]:
    """``ns`` (the node, NODE) and a sender namespace holding PEER and ROGUE on one link."""
    sender = netns.create("s")
    try:
        netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
                 sender, netns=ns)
        netns.ip("addr", "add", f"{NODE}/24", "dev", "eth0", netns=ns)
        for address in (PEER, ROGUE):
            netns.ip("addr", "add", f"{address}/24", "dev", "eth0", netns=sender)
        for name in (ns, sender):
            netns.ip("link", "set", "eth0", "up", netns=name)
        for name in (ns, sender):  # packets sent before the carrier is seen are lost
            wait_until(lambda n=name: json.loads(netns.ip("-j", "link", "show", "eth0",
                                                          netns=n).stdout)[0]["operstate"]
                       == "UP", 10, what=f"eth0 up in {name}")
        # Resolve the node's MAC first: datagrams waiting for ARP may outlast a receive.
        pings: list[str] = []

        def ping() -> bool:
            result = subprocess.run(["ip", "netns", "exec", sender, "ping", "-c1", "-W1",
                                     NODE], capture_output=True, text=True, timeout=10,
                                    check=False)
            pings.append(result.stdout + result.stderr)
            return result.returncode == 0
        try:
            wait_until(ping, 30, what="a ping")
        except AssertionError:
            raise AssertionError(f"no ping: {pings[-1]} {netns.ip('-d', 'link', netns=ns).stdout}"
                                 f" {netns.ip('-d', 'link', netns=sender).stdout}") from None
        yield ns, sender
    finally:
        netns.delete(sender)


def udp_socket(where: str, address: str, port: int) -> socket.socket:
    with Host(where).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, port))
    return sock


def sources_received(node: str, sender: str) -> set[str]:
    """Send one datagram to NODE:PORT from PEER and from ROGUE; the sources that arrive."""
    receiver = udp_socket(node, NODE, PORT)
    receiver.settimeout(0.5)
    try:
        for source in (PEER, ROGUE):
            with udp_socket(sender, source, 0) as out:
                out.sendto(b"x" * 50, (NODE, PORT))
        seen = set()
        try:
            while True:
                seen.add(receiver.recvfrom(100)[1][0])
        except TimeoutError:
            return seen
    finally:
        receiver.close()


def manager(ns: str, nft: bool, families=(FILTERED,)) -> TrafficManager:
    traffic = TrafficManager(list(families), nft, host=Host(ns))
    traffic.prepare()
    return traffic


PEERS = peer_addresses([ip_address(NODE), ip_address(PEER)])


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_only_peers_reach_the_encapsulation_port_and_drops_are_counted(wire, nft):
    node, sender = wire
    assert sources_received(node, sender) == {PEER, ROGUE}  # no filter yet
    traffic = manager(node, nft)
    traffic.set_peers(PEERS)
    assert traffic.ensure() is True
    if nft:
        assert run(node, "nft", "list", "table", "ip", "flannel-ipv4").strip() == GOLDEN_NFT
    else:
        assert filter_listing(node) == GOLDEN_INPUT
    assert sources_received(node, sender) == {PEER}
    assert traffic.ensure() is False  # in place; the check reads the counter
    packets, size = traffic.status.not_peer_dropped[4]
    assert packets == 1 and size == 20 + 8 + 50
    assert sources_received(node, sender) == {PEER}
    traffic.ensure()
    assert traffic.status.not_peer_dropped[4][0] == 2


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_a_lease_change_is_written_as_a_difference(wire, nft):
    node, sender = wire
    traffic = manager(node, nft)
    traffic.set_peers(PEERS)
    traffic.ensure()
    # ROGUE's node joins, PEER's leaves.
    traffic.set_peers(peer_addresses([ip_address(NODE), ip_address(ROGUE)]))
    assert traffic.update_peers() is False  # a difference, not a reinstall
    assert traffic.status.peer_updates == 1
    assert traffic.status.peers == {4: 2}
    assert sources_received(node, sender) == {ROGUE}
    assert traffic.rules.missing(traffic._peers) == ""


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_a_peer_removed_by_hand_is_put_back_by_the_check(wire, nft):
    node, sender = wire
    traffic = manager(node, nft)
    traffic.set_peers(PEERS)
    traffic.ensure()
    traffic.status.installed = True
    if nft:
        run(node, "nft", "delete", "element", "ip", "flannel-ipv4", "peers", f"{{ {PEER} }}")
    else:
        run(node, "iptables", "-D", "FLANNEL-PEERS", "-s", f"{PEER}/32", "-j", "RETURN")
    assert sources_received(node, sender) == set()
    assert "differs" in traffic.rules.missing(PEERS)
    assert traffic.ensure() is True
    assert sources_received(node, sender) == {PEER}


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_a_difference_the_kernel_refuses_falls_back_to_the_whole_set(wire, nft):
    node, sender = wire
    traffic = manager(node, nft)
    traffic.set_peers(PEERS)
    traffic.ensure()
    if nft:  # PEER already gone: deleting it again fails the transaction
        run(node, "nft", "delete", "element", "ip", "flannel-ipv4", "peers", f"{{ {PEER} }}")
    else:
        run(node, "iptables", "-F", "FLANNEL-INPUT")
    traffic.set_peers(peer_addresses([ip_address(NODE), ip_address(ROGUE)]))
    traffic.update_peers()
    if not nft:  # an iptables refill succeeds; the next check repairs the rest
        traffic.ensure()
    assert sources_received(node, sender) == {ROGUE}
    assert traffic.rules.missing(traffic._peers) == ""


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_nothing_is_filtered_until_the_first_peer_set(wire, nft):
    node, sender = wire
    traffic = TrafficManager([FILTERED], nft, resync=30, host=Host(node))

    async def scenario() -> None:
        await traffic.start()
        assert not traffic.status.installed
        assert "first lease snapshot" in traffic.status.reason
        assert sources_received(node, sender) == {PEER, ROGUE}
        traffic.set_peers(PEERS)
        await asyncio.wait_for(traffic.next(), 10)  # at once, not after the resync period
        assert traffic.status.installed, traffic.status.reason

    asyncio.run(scenario())
    assert sources_received(node, sender) == {PEER}


def test_both_families_nftables(ns):
    traffic = manager(ns, True, (FILTERED, V6))
    traffic.set_peers(peer_addresses([ip_address(NODE), ip_address("fd00:50::2")]))
    assert traffic.ensure() is True
    listed = run(ns, "nft", "list", "table", "ip6", "flannel-ipv6")
    assert "elements = { fd00:50::2 }" in listed
    assert f"udp dport {PORT} ip6 saddr != @peers" in listed
    assert traffic.ensure() is False


def test_both_families_iptables(ns):
    traffic = manager(ns, False, (FILTERED, V6))
    traffic.set_peers(peer_addresses([ip_address(NODE), ip_address("fd00:50::2")]))
    assert traffic.ensure() is True
    listed = run(ns, "ip6tables", "-S", "FLANNEL-PEERS")
    assert "-A FLANNEL-PEERS -s fd00:50::2/128 -j RETURN" in listed
    assert traffic.ensure() is False


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_doctor_recommends_the_filter_until_it_is_installed(ns, nft):
    from pathlib import Path

    from flannel.config import parse_config
    from flannel.ops.checks import Context
    from flannel.ops.checks.node import check_encap_filter

    ctx = Context(subnet_file=Path("/nonexistent"), sysctl_root=Path("/proc/sys"),
                  cni_bin_dirs=[], cni_conf_dirs=[], probe_timeout=1.0, fix_checksum=False,
                  config=parse_config('{"Network": "10.42.0.0/16", "Backend": '
                                      '{"Type": "vxlan", "Port": 4789}}'),
                  flanneld_pids=[1])
    with Host(ns).entered():  # the tools doctor runs inherit this namespace
        found = check_encap_filter(ctx)
    assert [f.severity for f in found] == ["info"]
    assert "UDP 4789" in found[0].what and "--encap-peers-only" in found[0].fix
    traffic = manager(ns, nft)
    traffic.set_peers(PEERS)
    traffic.ensure()
    with Host(ns).entered():
        assert check_encap_filter(ctx) == []


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_turning_the_option_off_removes_the_filter(wire, nft):
    node, sender = wire
    traffic = manager(node, nft)
    traffic.set_peers(PEERS)
    traffic.ensure()
    assert sources_received(node, sender) == {PEER}
    unfiltered = FamilyRules(4, ip_network(C), ip_network(P), False, True)
    manager(node, nft, (unfiltered,)).ensure()  # the next start, without the option
    assert sources_received(node, sender) == {PEER, ROGUE}
    if nft:
        listed = run(node, "nft", "list", "table", "ip", "flannel-ipv4")
        assert "chain forward" in listed and "input" not in listed and "peers" not in listed
    else:
        assert "FLANNEL-INPUT" not in filter_listing(node)
        assert "FLANNEL-PEERS" not in filter_listing(node)
        assert "-N FLANNEL-FWD" in filter_listing(node)


NODE6, PEER6, ROGUE6 = "fd00:50::1", "fd00:50::2", "fd00:50::3"


def sources_received6(node: str, sender: str) -> set[str]:
    """As ``sources_received``, over IPv6 (PEER6 and ROGUE6 to NODE6)."""
    def socket6(where: str, address: str, port: int) -> socket.socket:
        with Host(where).entered():
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.bind((address, port))
        return sock

    with socket6(node, NODE6, PORT) as receiver:
        receiver.settimeout(0.5)
        for source in (PEER6, ROGUE6):
            with socket6(sender, source, 0) as out:
                out.sendto(b"x" * 50, (NODE6, PORT))
        seen = set()
        with contextlib.suppress(TimeoutError):
            while True:
                seen.add(receiver.recvfrom(100)[1][0])
        return seen


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_ipv6_only_peers_reach_the_encapsulation_port(wire, nft):
    node, sender = wire
    netns.ip("-6", "addr", "add", f"{NODE6}/64", "dev", "eth0", "nodad", netns=node)
    for address in (PEER6, ROGUE6):
        netns.ip("-6", "addr", "add", f"{address}/64", "dev", "eth0", "nodad", netns=sender)
    wait_until(lambda: subprocess.run(["ip", "netns", "exec", sender, "ping", "-6", "-c1",
                                       "-W1", NODE6], capture_output=True, timeout=10,
                                      check=False).returncode == 0, 30, what="an IPv6 ping")
    assert sources_received6(node, sender) == {PEER6, ROGUE6}
    traffic = manager(node, nft, (FILTERED, V6))
    traffic.set_peers(peer_addresses([ip_address(a) for a in (NODE, PEER, NODE6, PEER6)]))
    traffic.ensure()
    assert sources_received6(node, sender) == {PEER6}
    assert sources_received(node, sender) == {PEER}
    traffic.ensure()
    assert traffic.status.not_peer_dropped[6][0] == 1
    assert traffic.status.not_peer_dropped[4][0] == 1
