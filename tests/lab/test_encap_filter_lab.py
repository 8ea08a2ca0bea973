"""Only peers get into the pod network (``--encap-peers-only``), in labs of real flanneld
nodes: a rogue host on the underlay, holding no lease, sends a spoofed vxlan packet (and, in
a udp lab, a udp-backend datagram) whose inner packet claims to come from a peer's pod and
targets a pod. Without the option it reaches the pod (so the test can fail); with it, it
does not, the drop counter on /metrics rises, every pod still reaches every other, a node
that joins is accepted once its lease appears and one that leaves is removed from the set.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from ipaddress import IPv4Address

import pytest

from flannel.kernel.host import Host
from flannel.udp.packet import checksum
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import UNDERLAYS, Lab, in_ns, ip
from tests.lab.test_metrics_status import HEALTH, scrape
from tests.support import netns
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = "10.244.0.0/16"
ARGS = ("--healthz-port=8081", "--iptables-resync=1")
ROGUE = f"{UNDERLAYS[0][0]}.200"
POD_PORT = 9999
VNI = 1


@pytest.fixture
def rogue_host() -> Iterator[Callable[[Lab], str]]:
    """A namespace joined to a lab's underlay bridge with ROGUE: a host holding no lease."""
    made: list[str] = []

    def attach(lab: Lab) -> str:
        rogue = netns.create("rg")
        made.append(rogue)
        netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "rogue0", "netns",
                 lab.underlay_ns, netns=rogue)
        ip(lab.underlay_ns, "link", "set", "rogue0", "master", "br0", "up")
        netns.ip("addr", "add", f"{ROGUE}/24", "dev", "eth0", netns=rogue)
        netns.ip("link", "set", "eth0", "up", netns=rogue)
        # Packets sent before the link has carrier, or while ARP resolves, may be lost.
        wait_until(lambda: in_ns(rogue, "ping", "-c1", "-W1", f"{UNDERLAYS[0][0]}.1",
                                 check=False).returncode == 0, 30, what="the rogue's link")
        return rogue

    try:
        yield attach
    finally:
        for rogue in made:
            netns.delete(rogue)


def inner_udp(src: str, dst: str, payload: bytes) -> bytes:
    """An IPv4 UDP packet (UDP checksum 0: none, as IPv4 allows)."""
    udp = (1234).to_bytes(2, "big") + POD_PORT.to_bytes(2, "big") + \
        (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload
    header = bytearray(b"\x45\x00" + (20 + len(udp)).to_bytes(2, "big") + b"\0\0\0\0\x40\x11"
                       b"\0\0" + IPv4Address(src).packed + IPv4Address(dst).packed)
    header[10:12] = checksum(header).to_bytes(2, "big")
    return bytes(header) + udp


def vxlan_frame(dst_mac: str, packet: bytes) -> bytes:
    header = b"\x08\0\0\0" + VNI.to_bytes(3, "big") + b"\0"
    ethernet = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex("020000000099") + \
        b"\x08\x00"
    return header + ethernet + packet


def send_from(rogue: str, target: str, port: int, data: bytes) -> None:
    with Host(rogue).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        sock.bind((ROGUE, 0))
        sock.sendto(data, (target, port))


def pod_socket(pod_netns: str) -> socket.socket:
    with Host(pod_netns).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", POD_PORT))
    sock.settimeout(0.2)
    return sock


def arrives(listener: socket.socket, send: Callable[[], None], payload: bytes,
            tries: int = 10) -> bool:
    """Send up to ``tries`` times (a first packet may wait for ARP); whether one reached the
    pod."""
    for _ in range(tries):
        send()
        try:
            while True:
                data, _ = listener.recvfrom(2048)
                if data == payload:
                    return True
        except TimeoutError:
            continue
    return False


def metric(lab: Lab, index: int, name: str, **labels: str) -> float | None:
    """A sample of node ``index``'s /metrics; None while it does not answer (starting)."""
    if http_get(lab.node_ns(index), f"{HEALTH}/metrics")[0] != 200:
        return None
    return scrape(lab, index).get((name, tuple(sorted(labels.items()))))


def vtep_mac(lab: Lab, index: int) -> str:
    return json.loads(ip(lab.node_ns(index), "-j", "link", "show", "flannel.1").stdout)[0][
        "address"]


def peers_in_filter(lab: Lab, index: int) -> set[str]:
    listed = in_ns(lab.node_ns(index), "iptables", "-S", "FLANNEL-PEERS").stdout
    return {line.split()[3].removesuffix("/32") for line in listed.splitlines()
            if line.endswith("-j RETURN")}


def dropped(lab: Lab, index: int) -> float:
    return metric(lab, index, "flannel_encap_not_peer_dropped_packets_total",
                  family="ipv4") or 0


def enable_filter(lab: Lab, index: int, peers: int) -> None:
    lab.stop_flanneld(index)
    lab.start_flanneld(index, *ARGS, "--encap-peers-only")
    try:
        wait_until(lambda: metric(lab, index, "flannel_encap_filter_peers",
                                  family="ipv4") == peers, 30)
    except AssertionError:
        raise AssertionError(f"node {index}'s filter does not hold {peers} peers:\n"
                             f"{lab.log(index)[-3000:]}") from None


def test_vxlan_only_peers_reach_the_pods(make_lab, rogue_host):
    lab = make_lab()
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "vxlan"}},
                  flanneld_args=ARGS)
    wait_for_mesh(lab, nodes, ipv6=False)
    pod = lab.add_pod(2)
    rogue = rogue_host(lab)
    target = lab.node(2).address
    payload = b"spoofed from a peer's pod"
    frame = vxlan_frame(vtep_mac(lab, 2), inner_udp(lab.pod_address(1), pod.address, payload))
    with pod_socket(pod.netns) as listener:
        def send() -> None:
            send_from(rogue, target, 8472, frame)

        assert arrives(listener, send, payload), "without the filter the spoof reaches the pod"
        enable_filter(lab, 2, peers=2)
        assert peers_in_filter(lab, 2) == {lab.node(1).address, target}
        assert not arrives(listener, send, payload)
        wait_until(lambda: dropped(lab, 2) >= 5, 10, what="the drops counted")
        code, body = http_get(lab.node_ns(2), f"{HEALTH}/status")
        assert code == 200
        encap = json.loads(body)["rules"]["encap_filter"]["ipv4"]
        assert encap["peers"] == 2 and encap["dropped_packets"] >= 5
    wait_for_mesh(lab, nodes, ipv6=False)  # peers unaffected

    # A node joining is accepted once its lease appears; one leaving is removed.
    lab.add_node(3)
    lab.start_flanneld(3, *ARGS)
    lab.attach_pod_bridge(3)
    wait_until(lambda: lab.node(3).address in peers_in_filter(lab, 2), 30,
               what="node 3 in node 2's filter")
    wait_for_mesh(lab, [1, 2, 3], ipv6=False)
    lab.remove_node(3)
    wait_until(lambda: peers_in_filter(lab, 2) == {lab.node(1).address, target}, 30,
               what="node 3 gone from node 2's filter")
    wait_for_mesh(lab, nodes, ipv6=False)


def test_udp_backend_only_peers_reach_the_pods(make_lab, rogue_host):
    lab = make_lab()
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "udp"}}, flanneld_args=ARGS)
    wait_for_mesh(lab, nodes, ipv6=False)
    pod = lab.add_pod(2)
    rogue = rogue_host(lab)
    target = lab.node(2).address
    payload = b"spoofed from a peer's pod"
    datagram = inner_udp(lab.pod_address(1), pod.address, payload)
    with pod_socket(pod.netns) as listener:
        def send() -> None:
            send_from(rogue, target, 8285, datagram)

        assert arrives(listener, send, payload), "without the filter the spoof reaches the pod"
        enable_filter(lab, 2, peers=2)
        assert not arrives(listener, send, payload)
        wait_until(lambda: dropped(lab, 2) >= 5, 10, what="the drops counted")
        # The forwarder drops them too, without the rule: empty the filter's port chain
        # and send at once (the next check, within a second, puts it back), until the
        # forwarder's counter (read by the data plane's passes) shows a drop.
        def sent_without_rule() -> bool:
            in_ns(lab.node_ns(2), "iptables", "-F", "FLANNEL-INPUT")
            send()
            return (metric(lab, 2, "flannel_engine_udp_drop_not_peer_total",
                           engine="udp forwarder") or 0) >= 1

        wait_until(sent_without_rule, 60, interval=0.5, what="the forwarder's drop counted")
        with pytest.raises(TimeoutError):  # and none of them reached the pod
            listener.recvfrom(2048)
    wait_for_mesh(lab, nodes, ipv6=False)
