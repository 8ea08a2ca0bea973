"""The udp forwarder between real network namespaces: three nodes on a bridged veth underlay
(MTU 1500), each with its TUN set up by ``ensure_tun`` and its own forwarder process. Ping
matrix, a 100 MB transfer checked at both ends with every offload path in use, peer changes,
hand-made drift, a killed forwarder, runt datagrams, bind failures, full-size packets."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.kernel.host import Host
from flannel.udp.device import TunSpec, ensure_tun
from flannel.udp.forwarder import ForwarderConfig, ForwarderError, UdpForwarder
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]

NETWORK = IPv4Network("10.5.0.0/16")
PORT = 8285
TUN_MTU = 1472  # underlay MTU 1500 - 28
IP_RECVERR = 11


@dataclass
class Node:
    ns: str
    underlay: IPv4Address
    subnet: IPv4Network
    forwarder: UdpForwarder

    @property
    def base(self) -> IPv4Address:
        return self.subnet.network_address

    def spec(self) -> TunSpec:
        return TunSpec("flannel0", self.base, TUN_MTU, NETWORK)


def peers_of(node: Node, nodes: list[Node]) -> dict[IPv4Network, IPv4Address]:
    return {other.subnet: other.underlay for other in nodes if other is not node}


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    hub = netns.create("hub")
    made: list[Node] = []
    try:
        netns.ip("link", "add", "br0", "type", "bridge", netns=hub)
        netns.ip("link", "set", "br0", "up", netns=hub)
        for i in (1, 2, 3):
            ns = netns.create(f"n{i}")
            netns.ip("link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns",
                     ns, netns=hub)
            netns.ip("link", "set", f"p{i}", "master", "br0", "up", netns=hub)
            underlay = IPv4Address(f"172.31.0.{i}")
            netns.ip("addr", "add", f"{underlay}/24", "dev", "eth0", netns=ns)
            netns.ip("link", "set", "eth0", "up", netns=ns)
            subnet = IPv4Network(f"10.5.{i}.0/24")
            forwarder = UdpForwarder(ForwarderConfig("flannel0", underlay, PORT,
                                                     subnet.network_address, TUN_MTU, Host(ns)))
            made.append(Node(ns, underlay, subnet, forwarder))
        for node in made:
            ensure_tun(node.spec(), Host(node.ns))
            node.forwarder.start()
            node.forwarder.set_peers(peers_of(node, made))
        yield made
    finally:
        for node in made:
            node.forwarder.stop()
            netns.delete(node.ns)
        netns.delete(hub)


def ping(src: Node, dst: IPv4Address, size: int = 56, dont_fragment: bool = False,
         answered: bool = True) -> subprocess.CompletedProcess:
    """One echo. ``answered``: the test expects a reply, so echoes go out one a second until
    one is answered or 30 s pass (a loaded machine can delay a forwarder that was just
    started or given new peers; the wait ends with the reply). Otherwise the one echo gets
    2 s, plenty for forwarders that answer in milliseconds."""
    wait = ["-w", "30"] if answered else ["-W", "2"]
    cmd = ["ip", "netns", "exec", src.ns, "ping", "-n", "-c", "1", *wait, "-s", str(size),
           "-I", str(src.base), str(dst)]
    if dont_fragment:
        cmd[6:6] = ["-M", "do"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def udp_probe(src: Node, dst: IPv4Address) -> int:
    """errno of a connected UDP exchange from ``src`` to ``dst`` port 9 (0 = no error within
    20 s: the error comes as soon as the forwarder's ICMP does)."""
    with Host(src.ns).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)  # report net unreachable
        sock.bind((str(src.base), 0))
        sock.connect((str(dst), 9))
        sock.settimeout(20.0)
        sock.send(b"probe")
        try:
            sock.recv(100)
        except TimeoutError:
            return 0
        except OSError as err:
            return err.errno
    return 0


def test_ping_matrix_and_ttl(nodes: list[Node]) -> None:
    for src in nodes:
        for dst in nodes:
            if src is not dst:
                result = ping(src, dst.base)
                assert result.returncode == 0, result.stdout + result.stderr
                # TTL 64, decremented once by each forwarder (as Go flannel).
                assert "ttl=62" in result.stdout


def test_full_size_packets_pass_and_larger_ones_are_refused(nodes: list[Node]) -> None:
    src, dst = nodes[0], nodes[1]
    assert ping(src, dst.base, size=TUN_MTU - 28, dont_fragment=True).returncode == 0
    too_big = ping(src, dst.base, size=TUN_MTU - 27, dont_fragment=True, answered=False)
    assert too_big.returncode != 0 and "1472" in too_big.stdout + too_big.stderr


RECEIVER = """
import hashlib, socket, sys
server = socket.create_server((sys.argv[1], 5001))
print("ready", flush=True)
conn, _ = server.accept()
digest, total = hashlib.sha256(), 0
while chunk := conn.recv(1 << 20):
    digest.update(chunk)
    total += len(chunk)
print(total, digest.hexdigest(), flush=True)
"""

SENDER = """
import hashlib, socket, sys
data = hashlib.shake_256(b"pyflannel udp integrity").digest(100 * 1024 * 1024)
sock = socket.create_connection((sys.argv[1], 5001), source_address=(sys.argv[2], 0))
sock.sendall(data)
sock.close()
print(len(data), hashlib.sha256(data).hexdigest(), flush=True)
"""


def test_100_mb_arrive_intact_with_offloads(nodes: list[Node]) -> None:
    src, dst = nodes[0], nodes[1]
    receiver = subprocess.Popen(["ip", "netns", "exec", dst.ns, sys.executable, "-c", RECEIVER,
                                 str(dst.base)], stdout=subprocess.PIPE, text=True)
    try:
        assert receiver.stdout.readline().strip() == "ready"
        sent = subprocess.run(["ip", "netns", "exec", src.ns, sys.executable, "-c", SENDER,
                               str(dst.base), str(src.base)], capture_output=True, text=True,
                              timeout=300, check=True).stdout.split()
        received, _ = receiver.communicate(timeout=60)
    finally:
        receiver.kill()
    assert received.split() == sent
    assert sent[0] == str(100 * 1024 * 1024)
    tx, rx = src.forwarder.status().counters, dst.forwarder.status().counters
    # The paths whose checksums the kernel does not re-verify were all exercised:
    # UDP_SEGMENT batches on send, UDP_GRO and merged TCP writes on receive.
    assert tx["udp_sends"] < tx["tx_packets"] / 4
    assert rx["tun_writes"] < rx["rx_packets"] / 4
    assert rx["drop_ttl"] == rx["drop_runt"] == 0


def test_peer_add_and_remove_take_effect_when_set_peers_returns(nodes: list[Node]) -> None:
    """``set_peers`` returns once the worker acknowledged the new table: what it removed is
    gone and what it added is in use from then on. How fast is bench/'s to say."""
    a, b = nodes[0], nodes[1]
    # The reply comes from our own lease base address, which the kernel drops as a martian
    # source unless accept_local is on (so does Go flannel's, from the same address).
    subprocess.run(["ip", "netns", "exec", a.ns, "sysctl", "-qw",
                    "net.ipv4.conf.flannel0.accept_local=1"], check=True, timeout=20)
    a.forwarder.set_peers({})
    assert a.forwarder.status().peers == 0
    # No peer: ICMP net unreachable comes back, which the kernel reports as ENETUNREACH.
    assert udp_probe(a, b.base) == errno.ENETUNREACH
    assert a.forwarder.status().counters["icmp_unreachable"] == 1
    assert ping(a, b.base, answered=False).returncode != 0
    wait_until(lambda: a.forwarder.status().counters["drop_no_route"] == 2, timeout=20,
               what="the echo to be dropped")
    assert a.forwarder.status().counters["icmp_unreachable"] == 1  # no ICMP about ICMP
    a.forwarder.set_peers(peers_of(a, nodes))
    assert a.forwarder.status().peers == 2
    assert ping(a, b.base).returncode == 0
    many = {IPv4Network((0x0A800000 + (i << 8), 24)): IPv4Address("172.31.0.9")
            for i in range(20000)}
    a.forwarder.set_peers({**many, **peers_of(a, nodes)})
    assert a.forwarder.status().peers == 20002
    assert ping(a, b.base).returncode == 0


def test_an_answer_that_comes_too_late_is_not_taken_for_the_next_one(nodes: list[Node]
                                                                      ) -> None:
    a = nodes[0]
    pid = a.forwarder.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # a worker starved of CPU, as on an overloaded node
    try:
        with pytest.raises(ForwarderError, match="did not answer within"):
            a.forwarder.set_peers({})
    finally:
        os.kill(pid, signal.SIGCONT)
    # The late "peers" answer arrives first; status gets its own answer, not that one.
    status = a.forwarder.status()
    assert status.alive and status.pid == pid and status.peers == 0 and status.tun_attached
    a.forwarder.set_peers(peers_of(a, nodes))
    assert a.forwarder.status().peers == 2
    assert ping(a, nodes[1].base).returncode == 0


def test_deleted_and_changed_tun_is_reported_and_repaired(nodes: list[Node]) -> None:
    a, b = nodes[0], nodes[1]
    netns.ip("link", "del", "flannel0", netns=a.ns)
    wait_until(lambda: a.forwarder.status().counters["tun_reattached"] >= 1, timeout=5,
               what="the forwarder to reattach")
    status = a.forwarder.status()
    assert status.alive and status.tun_attached
    assert status.last_error == "flannel0: device gone; reattaching"
    drift = ensure_tun(a.spec(), Host(a.ns))
    assert drift == ["flannel0 MTU was 1500: set to 1472", "flannel0 was down: set up",
                     "flannel0 address 10.5.1.0/32 was missing: added",
                     "route 10.5.0.0/16 dev flannel0 was missing: set"]
    assert ping(a, b.base).returncode == 0
    netns.ip("link", "set", "flannel0", "mtu", "1400", netns=a.ns)
    netns.ip("addr", "add", "10.5.1.9/24", "dev", "flannel0", netns=a.ns)
    assert ensure_tun(a.spec(), Host(a.ns)) == ["flannel0 MTU was 1400: set to 1472",
                                                "flannel0 had address 10.5.1.9/24: removed"]
    assert ensure_tun(a.spec(), Host(a.ns)) == []


def test_killed_forwarder_is_reported_and_restarts_with_its_peers(nodes: list[Node]) -> None:
    a, b = nodes[0], nodes[1]
    os.kill(a.forwarder.pid, signal.SIGKILL)
    wait_until(lambda: not a.forwarder.status().alive, timeout=5, what="the death to show")
    status = a.forwarder.status()
    assert status.last_error == "udp forwarder killed by SIGKILL"
    assert ping(a, b.base, answered=False).returncode != 0
    a.forwarder.start()
    status = a.forwarder.status()
    assert status.alive and status.peers == 2 and status.tun_attached
    assert ping(a, b.base).returncode == 0


def test_empty_and_runt_datagrams_are_dropped_and_the_forwarder_lives_on(nodes: list[Node]
                                                                          ) -> None:
    a, b = nodes[0], nodes[1]
    pid = b.forwarder.pid
    with Host(a.ns).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        # Any host that reaches the port can send these: an empty one once killed it.
        for length in (0, 0, 1, 19):
            sock.sendto(bytes(length), (str(b.underlay), PORT))
        wait_until(lambda: b.forwarder.status().counters["drop_runt"] == 4, timeout=5,
                   what="the empty and short datagrams to be counted")
        # 20 bytes is enough to be written (a header with TTL 2 survives the decrement).
        header = bytes.fromhex("45000014000000000211") + bytes(10)
        sock.sendto(header, (str(b.underlay), PORT))
        wait_until(lambda: b.forwarder.status().counters["tun_writes"] >= 1, timeout=5,
                   what="the 20-byte datagram to be written")
    status = b.forwarder.status()
    assert status.alive and status.pid == pid and status.counters["drop_runt"] == 4
    assert ping(a, b.base).returncode == 0


def test_ipv6_routed_into_the_tun_is_dropped_not_sent(nodes: list[Node]) -> None:
    a, b = nodes[0], nodes[1]
    netns.ip("-6", "route", "add", "fd00:5::/64", "dev", "flannel0", netns=a.ns)
    # The kernel's own IPv6 router solicitations on flannel0 are dropped the same way.
    before = a.forwarder.status().counters["drop_not_ipv4"]
    with Host(a.ns).entered():
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    with sock:
        sock.sendto(b"x" * 20, ("fd00:5::1", 9))
    wait_until(lambda: a.forwarder.status().counters["drop_not_ipv4"] > before, timeout=5,
               what="the IPv6 packet to be dropped")
    assert a.forwarder.status().counters["tx_packets"] == 0
    assert b.forwarder.status().counters["rx_packets"] == 0


def test_bind_conflict_is_a_clear_error(nodes: list[Node]) -> None:
    a = nodes[0]
    second = UdpForwarder(ForwarderConfig("flannel1", a.underlay, PORT, a.base, TUN_MTU,
                                          Host(a.ns)))
    with pytest.raises(ForwarderError) as caught:
        second.start()
    assert str(caught.value) == ("udp forwarder did not start: cannot bind UDP "
                                 "172.31.0.1:8285: Address already in use; is another "
                                 "flanneld or program using the port?")
    assert not second.status().alive


def inner_packet(src: IPv4Address, dst: IPv4Address) -> bytes:
    """An ICMP echo request as an IPv4 packet, checksums right."""
    from flannel.udp.packet import checksum

    icmp = bytearray(b"\x08\x00\x00\x00\x12\x34\x00\x01" + b"spoofed!")
    icmp[2:4] = checksum(icmp).to_bytes(2, "big")
    header = bytearray(b"\x45\x00" + (20 + len(icmp)).to_bytes(2, "big") + b"\x00\x00\x00\x00"
                       + b"\x40\x01\x00\x00" + src.packed + dst.packed)
    header[10:12] = checksum(header).to_bytes(2, "big")
    return bytes(header + icmp)


def send_datagram(src: Node, dst: Node, payload: bytes) -> None:
    with Host(src.ns).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.bind((str(src.underlay), 0))
        sock.sendto(payload, (str(dst.underlay), PORT))


def counter(node: Node, name: str) -> int:
    return node.forwarder.status().counters[name]


def test_peers_only_drops_datagrams_from_non_peers_and_counts_them(nodes: list[Node]) -> None:
    one, two, three = nodes
    spoofed = inner_packet(IPv4Address("8.8.8.8"), three.base)
    # Without the option, any sender's datagram goes into the TUN.
    received = counter(three, "rx_packets")
    send_datagram(two, three, spoofed)
    wait_until(lambda: counter(three, "rx_packets") > received, 5, what="the datagram")
    # Node 3 with the option, node 2 not in its table: node 2 is no peer.
    three.forwarder.stop()
    three.forwarder = UdpForwarder(ForwarderConfig("flannel0", three.underlay, PORT,
                                                   three.base, TUN_MTU, Host(three.ns),
                                                   peers_only=True))
    three.forwarder.start()
    three.forwarder.set_peers({one.subnet: one.underlay})
    send_datagram(two, three, spoofed)
    wait_until(lambda: counter(three, "drop_not_peer") == 1, 5, what="the drop")
    assert counter(three, "rx_packets") == 0
    # A peer still gets through, both ways.
    result = ping(one, three.base)
    assert result.returncode == 0, result.stdout + result.stderr
    assert counter(three, "drop_not_peer") == 1
    assert counter(three, "rx_packets") >= 1
