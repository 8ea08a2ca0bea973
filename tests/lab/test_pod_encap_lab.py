"""No pod sends encapsulation out of its node (``--drop-pod-encap``, on by default), in labs of
real flanneld nodes with ``--ip-masq``: a pod on node 2 sends, with plain sockets, datagrams
to node 1's address on every port node 1's backend receives on (and bare ESP for ipsec).
Masquerade would make them come from node 2, a peer, which even ``--encap-peers-only``
accepts (the vxlan and udp nodes run with it): with the drop turned off they reach node 1
(vxlan and udp: they deliver a packet with any inner source into node 1's pod), so the test
can fail; with the default, none of
N arrives, the drops are counted on /metrics, and pods keep pinging each other during and
after, over the backend's own encapsulation."""

from __future__ import annotations

import shutil
import socket
import threading

import pytest

from flannel.ipsec import charon
from flannel.kernel.host import Host
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, Pod, in_ns
from tests.support.capture import Capture, ip_packet
from tests.support.encapframes import inner_udp, pod_socket, vxlan_frame
from tests.support.labnodes import metric, vtep_mac
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = "10.244.0.0/16"
ARGS = ("--ip-masq", "--healthz-port=8081", "--iptables-resync=1")
#: Only peers' encapsulation taken in (vxlan's and udp's): a pod's, masqueraded, is a peer's.
FILTERED = (*ARGS, "--encap-peers-only")
TRIES = 20
MARK = b"pod-sent encapsulation "


def restart_node2(lab: Lab, args: tuple[str, ...], *extra: str) -> None:
    """Node 2's flanneld again with ``args`` and ``extra`` flags, ready: its rules (the drop,
    or none while it is off: then its counter is absent) installed."""
    lab.stop_flanneld(2)
    lab.start_flanneld(2, *args, *extra)
    dropping = not extra
    wait_until(lambda: metric(lab, 2, "flannel_ready") == 1 and (metric(
        lab, 2, "flannel_pod_encap_dropped_packets_total", family="ipv4") is not None
    ) == dropping, 60, what="node 2 ready")


def send_from_pod(pod: Pod, target: str, ports: tuple[int, ...], esp: bool,
                  payload: bytes) -> None:
    """TRIES datagrams from the pod to each port of ``target`` (and bare ESP), plain
    sockets as any unprivileged process has (a raw one for ESP: pods get CAP_NET_RAW from
    the common container runtimes)."""
    with Host(pod.netns).entered():
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ESP) if esp \
            else None
    with udp:
        for _ in range(TRIES):
            for port in ports:
                udp.sendto(payload, (target, port))
            if raw is not None:
                raw.sendto(payload, (target, 0))
    if raw is not None:
        raw.close()


def arrivals(frames: list[bytes], target: str) -> dict[str, int]:
    """Datagrams carrying MARK that reached ``target``'s interfaces, by port (or "esp")."""
    seen: dict[str, int] = {}
    for frame in frames:
        parsed = ip_packet(frame)
        if parsed is None or parsed[1] != target or MARK not in frame:
            continue
        key = "esp" if parsed[2] == socket.IPPROTO_ESP else str(parsed[4])
        seen[key] = seen.get(key, 0) + 1
    return seen


def attack(lab: Lab, attacker: Pod, ports: tuple[int, ...], esp: bool, payload: bytes
           ) -> dict[str, int]:
    """What of the attacker pod's datagrams to node 1 reached node 1."""
    target = lab.node(1).address
    capture = Capture(lab.node_ns(1))
    try:
        send_from_pod(attacker, target, ports, esp, payload)
        # The last datagram is on node 1's interface well within this.
        threading.Event().wait(1.0)
    finally:
        frames = capture.stop()
    return arrivals(frames, target)


def pods_ping(lab: Lab, attacker: Pod, victim: Pod) -> None:
    assert lab.pod_ping(attacker, victim.address, count=5, timeout=2, within=10), \
        "pod-to-pod traffic over the backend stopped"


def run_probe(lab: Lab, ports: tuple[int, ...], esp: bool = False,
              inner: bool = False, args: tuple[str, ...] = ARGS) -> None:
    """The probe on a built lab: none of it arrives (the default), pods ping; with the drop
    turned off, all of it arrives (the probe itself works)."""
    victim, attacker = lab.add_pod(1), lab.add_pod(2)
    pods_ping(lab, attacker, victim)
    target = lab.node(1).address
    payload = MARK
    if inner:  # what the datagram carries in: a packet for node 1's pod from 8.8.8.8
        packet = inner_udp("8.8.8.8", victim.address, MARK + b"inner")
        payload = vxlan_frame(vtep_mac(lab, 1), packet) if ports == (8472,) else packet

    with pod_socket(victim.netns) as listener:
        seen = attack(lab, attacker, ports, esp, payload)
        assert seen == {}, f"pods' encapsulation reached node 1: {seen}"
        if inner:
            listener.settimeout(1)
            with pytest.raises(TimeoutError):
                listener.recvfrom(2048)
        wanted = TRIES * (len(ports) + esp)
        wait_until(lambda: (metric(lab, 2, "flannel_pod_encap_dropped_packets_total",
                                   family="ipv4") or 0) >= wanted, 10, what="the drops counted")
    pods_ping(lab, attacker, victim)
    # The pod's own traffic to another node is untouched.
    assert in_ns(attacker.netns, "ping", "-c1", "-W2", target, check=False).returncode == 0

    restart_node2(lab, args, "--drop-pod-encap=false")
    with pod_socket(victim.netns) as listener:
        seen = attack(lab, attacker, ports, esp, payload)
        assert seen == {**{str(p): TRIES for p in ports}, **({"esp": TRIES} if esp else {})}, \
            f"with the drop off the pod's datagrams reach node 1 (masqueraded): {seen}"
        if inner:
            listener.settimeout(2)
            assert MARK + b"inner" in listener.recvfrom(2048)[0], \
                "with the drop off the spoofed inner packet reaches node 1's pod"
    pods_ping(lab, attacker, victim)


def test_vxlan_pods_cannot_send_vxlan_to_another_node(make_lab):
    lab = make_lab()
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "vxlan"}},
                  flanneld_args=FILTERED)
    wait_for_mesh(lab, nodes, ipv6=False)
    run_probe(lab, (8472,), inner=True, args=FILTERED)


def test_udp_pods_cannot_send_udp_backend_datagrams_to_another_node(make_lab):
    lab = make_lab()
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "udp"}},
                  flanneld_args=FILTERED)
    wait_for_mesh(lab, nodes, ipv6=False)
    run_probe(lab, (8285,), inner=True, args=FILTERED)


@pytest.mark.skipif(shutil.which("wireguard-go") is None, reason="needs wireguard-go")
def test_wireguard_pods_cannot_send_to_another_nodes_wireguard_port(make_lab):
    lab = make_lab()
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "wireguard"}},
                  flanneld_args=ARGS)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=60)
    run_probe(lab, (51820,))


@pytest.mark.skipif(not any(shutil.which(p) for p in charon.SEARCH),
                    reason="needs strongSwan's charon")
def test_ipsec_pods_cannot_send_ike_or_esp_to_another_node(make_lab):
    pytest.importorskip("vici", reason="needs the vici package (the ipsec extra)")
    lab = make_lab()
    psk = "a" * 48 + "0123456789abcdef" * 3
    nodes = build(lab, 2, {"Network": NETWORK, "Backend": {"Type": "ipsec", "PSK": psk}},
                  flanneld_args=ARGS)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=90)
    run_probe(lab, (500, 4500), esp=True)

