"""The drop of encapsulation sent by pods (``--drop-pod-encap``) in network namespaces, both
rule modes and both families, with masquerade on as kube-flannel runs it: a pod behind a
node sends UDP to the encapsulation port and bare ESP to another host, to the node itself
and to another pod. Without the drop everything arrives (masqueraded: from the node, a
peer); with it, what goes to the node or out of the pod network is dropped and counted,
pod-to-pod traffic and the pods' other traffic still flow, and turning it off removes it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import ip_network

import pytest

from flannel.kernel.host import Host
from flannel.rules.manager import TrafficManager
from flannel.rules.spec import FamilyRules
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns

PORT, OTHER = 8472, 9999
NETWORK, SUBNET = "10.42.0.0/16", "10.42.1.0/24"
NETWORK6, SUBNET6 = "fd00:42::/56", "fd00:42:0:1::/64"
POD, GATEWAY, OTHER_POD = "10.42.1.5", "10.42.1.1", "10.42.2.5"
NODE, REMOTE = "10.50.0.1", "10.50.0.2"
POD6, NODE6, REMOTE6 = "fd00:42:0:1::5", "fd00:50::1", "fd00:50::2"


def rules(drop: bool) -> list[FamilyRules]:
    ports, protocols = ((PORT,), (socket.IPPROTO_ESP,)) if drop else ((), ())
    return [FamilyRules(4, ip_network(NETWORK), ip_network(SUBNET), True, True,
                        fully_random=False, pod_encap_ports=ports,
                        pod_encap_protocols=protocols),
            FamilyRules(6, ip_network(NETWORK6), ip_network(SUBNET6), True, True,
                        fully_random=False, pod_encap_ports=ports,
                        pod_encap_protocols=protocols)]


@dataclass
class Net:
    node: str
    pod: str
    remote: str  # another host on the node's underlay (a peer node)
    other_pod: str  # a pod of another node, reached through the node


def veth(left: str, left_name: str, right: str, right_name: str) -> None:
    netns.ip("link", "add", left_name, "type", "veth", "peer", "name", right_name, "netns",
             right, netns=left)
    netns.ip("link", "set", left_name, "up", netns=left)
    netns.ip("link", "set", right_name, "up", netns=right)


@pytest.fixture
def net() -> Iterator[Net]:
    made = [netns.create(tag) for tag in ("n", "p", "r", "o")]
    node, pod, remote, other = made
    try:
        veth(pod, "eth0", node, "pod0")
        veth(node, "eth0", remote, "eth0")
        veth(node, "peer0", other, "eth0")
        for args in (("addr", "add", f"{GATEWAY}/24", "dev", "pod0"),
                     ("-6", "addr", "add", "fd00:42:0:1::1/64", "dev", "pod0", "nodad"),
                     ("addr", "add", f"{NODE}/24", "dev", "eth0"),
                     ("-6", "addr", "add", f"{NODE6}/64", "dev", "eth0", "nodad"),
                     ("addr", "add", "10.60.0.1/24", "dev", "peer0"),
                     ("route", "add", "10.42.2.0/24", "via", "10.60.0.2")):
            netns.ip(*args, netns=node)
        for args in (("addr", "add", f"{POD}/24", "dev", "eth0"),
                     ("-6", "addr", "add", f"{POD6}/64", "dev", "eth0", "nodad"),
                     ("route", "add", "default", "via", GATEWAY),
                     ("-6", "route", "add", "default", "via", "fd00:42:0:1::1")):
            netns.ip(*args, netns=pod)
        netns.ip("addr", "add", f"{REMOTE}/24", "dev", "eth0", netns=remote)
        netns.ip("-6", "addr", "add", f"{REMOTE6}/64", "dev", "eth0", "nodad", netns=remote)
        # The way back before masquerade is installed (the fixture's pings).
        netns.ip("route", "add", NETWORK, "via", NODE, netns=remote)
        netns.ip("-6", "route", "add", NETWORK6, "via", NODE6, netns=remote)
        netns.ip("addr", "add", f"{OTHER_POD}/24", "dev", "eth0", netns=other)
        netns.ip("addr", "add", "10.60.0.2/24", "dev", "eth0", netns=other)
        netns.ip("route", "add", "default", "via", "10.60.0.1", netns=other)
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
            subprocess.run(["ip", "netns", "exec", node, "sysctl", "-qw", key], check=True,
                           timeout=10)
        for target in (REMOTE, OTHER_POD, GATEWAY, REMOTE6):
            wait_until(lambda t=target: subprocess.run(
                ["ip", "netns", "exec", pod, "ping", "-c1", "-W1", t], capture_output=True,
                timeout=10, check=False).returncode == 0, 30, what=f"the pod's ping to {target}")
        yield Net(node, pod, remote, other)
    finally:
        for name in made:
            netns.delete(name)


def bound(where: str, family: int, kind: int, address: str, port_or_protocol: int
          ) -> socket.socket:
    with Host(where).entered():
        sock = socket.socket(family, kind, port_or_protocol if kind == socket.SOCK_RAW else 0)
    if kind == socket.SOCK_DGRAM:
        sock.bind((address, port_or_protocol))
    sock.settimeout(0.3)
    return sock


def arrived(receiver: socket.socket, payload: bytes) -> bool:
    with contextlib.suppress(TimeoutError):
        while True:
            if payload in receiver.recv(2048):
                return True
    return False


def delivered(net: Net, where: str, address: str, *, port: int = PORT, esp: bool = False,
              tries: int = 3) -> bool:
    """Whether a datagram the pod sends to ``address`` (UDP ``port``, or bare ESP) reaches
    namespace ``where``; a first one may wait for neighbour resolution."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    kind = socket.SOCK_RAW if esp else socket.SOCK_DGRAM
    target = socket.IPPROTO_ESP if esp else port
    payload = f"from the pod to {address} {target}".encode()
    with bound(where, family, kind, address, target) as receiver:
        with Host(net.pod).entered():
            sender = socket.socket(family, kind, target if esp else 0)
        with sender:
            for _ in range(tries):
                sender.sendto(payload, (address, 0 if esp else port))
                if arrived(receiver, payload):
                    return True
    return False


def manager(net: Net, nft: bool, drop: bool) -> TrafficManager:
    traffic = TrafficManager(rules(drop), nft, host=Host(net.node))
    traffic.prepare()
    traffic.ensure()
    return traffic


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_pods_cannot_send_encapsulation_to_nodes_but_still_to_pods(net, nft):
    to_nodes = [(net.remote, REMOTE, False), (net.remote, REMOTE, True),
                (net.node, NODE, False), (net.node, GATEWAY, False), (net.node, NODE, True),
                (net.remote, REMOTE6, False), (net.node, NODE6, False)]
    manager(net, nft, drop=False)
    for where, address, esp in to_nodes:  # the test can fail: all of it arrives
        assert delivered(net, where, address, esp=esp), (address, esp)
    traffic = manager(net, nft, drop=True)
    assert traffic.rules.missing() == ""
    for where, address, esp in to_nodes:
        assert not delivered(net, where, address, esp=esp), (address, esp)
    # The pods' other traffic, and encapsulation ports between pods, are theirs.
    assert delivered(net, net.remote, REMOTE, port=OTHER)
    assert delivered(net, net.other_pod, OTHER_POD)
    assert delivered(net, net.other_pod, OTHER_POD, esp=True)
    assert traffic.ensure() is False  # in place; the check reads the counters
    assert traffic.status.pod_encap == (4, 6)
    assert traffic.status.pod_encap_dropped[4][0] == 3 * 5
    assert traffic.status.pod_encap_dropped[6][0] == 3 * 2


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_turning_the_drop_off_removes_it(net, nft):
    manager(net, nft, drop=True)
    assert not delivered(net, net.remote, REMOTE)
    traffic = manager(net, nft, drop=False)  # the next start, with --drop-pod-encap=false
    assert delivered(net, net.remote, REMOTE)
    assert traffic.status.pod_encap == ()
    if nft:
        listed = subprocess.run(["ip", "netns", "exec", net.node, "nft", "list", "ruleset"],
                                capture_output=True, text=True, timeout=10).stdout
        assert "pod-encap" not in listed and "chain postrtg" in listed
    else:
        listed = subprocess.run(["ip", "netns", "exec", net.node, "iptables-save"],
                                capture_output=True, text=True, timeout=10).stdout
        assert "FLANNEL-POD-ENCAP" not in listed and "FLANNEL-POSTRTG" in listed


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_a_drop_removed_by_hand_is_put_back_by_the_check(net, nft):
    traffic = manager(net, nft, drop=True)
    traffic.status.installed = True
    cmd = (["nft", "flush", "chain", "ip", "flannel-ipv4", "pod-encap-forward"] if nft
           else ["iptables", "-F", "FLANNEL-POD-ENCAP-FWD"])
    subprocess.run(["ip", "netns", "exec", net.node, *cmd], check=True, timeout=10)
    assert delivered(net, net.remote, REMOTE)
    assert traffic.ensure() is True
    assert not delivered(net, net.remote, REMOTE)


@pytest.mark.parametrize("nft", [False, True], ids=["iptables", "nftables"])
def test_doctor_never_takes_the_drop_for_a_firewall_dropping_the_carrier(net, nft):
    """doctor's reading of this node's own input rules (``flannel/ops/firewall.py``) sees
    flanneld's drop for what it is, a drop of what pods send, never of a peer's carrier; a
    drop of the carrier made by hand beside it is named."""
    from flannel.ops.firewall import Target, own_drops

    manager(net, nft, drop=True)
    carrier = [Target(socket.IPPROTO_UDP, PORT), Target(socket.IPPROTO_ESP)]
    with Host(net.node).entered():
        assert own_drops(4, carrier) == [] and own_drops(6, carrier) == []
    by_hand = (["nft", "add table inet t; add chain inet t input { type filter hook input "
                "priority 0; }; add rule inet t input udp dport 8472 drop"] if nft else
               ["iptables-legacy", "-A", "INPUT", "-p", "udp", "--dport", str(PORT), "-j",
                "DROP"])
    subprocess.run(["ip", "netns", "exec", net.node, *by_hand], check=True, timeout=10)
    with Host(net.node).entered():
        assert [(d.tool, d.chain, d.target) for d in own_drops(4, carrier)] == [
            ("nftables" if nft else "iptables-legacy", "input" if nft else "INPUT",
             carrier[0])]
