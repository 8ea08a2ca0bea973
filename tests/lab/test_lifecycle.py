"""Traffic rules and daemon lifecycle in the lab: S5 masquerade, rules repaired and kept
across restarts, iptables -> nftables switch, S18 health and readiness, systemd notify."""

from __future__ import annotations

import json
import signal
import socket

import pytest

from flannel_lab.cli import build
from flannel_lab.cluster import in_ns, ip
from tests.support.traffic import http_get, source_seen
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=8081")


def nat_rules(lab, index: int) -> str:
    return in_ns(lab.node_ns(index), "iptables", "-t", "nat", "-S").stdout


def readyz(lab, index: int) -> tuple[int, str]:
    return http_get(lab.node_ns(index), "http://127.0.0.1:8081/readyz")


def one_node(make_lab):
    """A lab with one node and the network config in etcd; flanneld not started yet."""
    lab = make_lab()
    lab.create_underlay()
    lab.add_node(1)
    lab.put_config(CONFIG)
    return lab


def test_pod_traffic_to_the_outside_is_masqueraded_pod_to_pod_is_not(make_lab):
    lab = make_lab()
    build(lab, 2, CONFIG, flanneld_args=("--ip-masq",))
    pod, remote = lab.add_pod(1), lab.add_pod(2)
    # The underlay namespace stands for a host outside the flannel network.
    assert source_seen(pod.netns, lab.underlay_ns, "192.168.111.1") == lab.node(1).address
    assert lab.pod_ping(pod, "192.168.111.1")
    assert source_seen(pod.netns, remote.netns, remote.address) == pod.address
    assert "--random-fully" in nat_rules(lab, 1)


def test_rules_come_back_and_survive_restarts_unchanged(make_lab):
    lab = make_lab()
    build(lab, 1, CONFIG, flanneld_args=("--ip-masq", "--iptables-resync=1"))
    wait_until(lambda: "FLANNEL-POSTRTG" in nat_rules(lab, 1), 10, what="rules")
    original = nat_rules(lab, 1)
    in_ns(lab.node_ns(1), "iptables", "-t", "nat", "-F", "FLANNEL-POSTRTG")
    wait_until(lambda: nat_rules(lab, 1) == original, 4, what="rules restored")
    assert "Some iptables rules are missing" in lab.log(1)
    lab.stop_flanneld(1, signal.SIGTERM)
    assert nat_rules(lab, 1) == original  # never removed on exit
    lab.start_flanneld(1)
    wait_until(lambda: lab.log(1).count("Ready:") == 2, 20, what="restarted flanneld ready")
    assert nat_rules(lab, 1) == original  # no duplicates


def test_switching_to_nftables_leaves_no_iptables_chain(make_lab):
    lab = make_lab()
    build(lab, 1, CONFIG, flanneld_args=("--ip-masq",))
    wait_until(lambda: "FLANNEL-POSTRTG" in nat_rules(lab, 1), 10, what="iptables rules")
    lab.stop_flanneld(1)
    lab.put_config({**CONFIG, "EnableNFTables": True})
    lab.start_flanneld(1)
    ns = lab.node_ns(1)
    wait_until(lambda: "flannel-ipv4" in in_ns(ns, "nft", "list", "tables").stdout, 20,
               what="nftables table")
    wait_until(lambda: "FLANNEL" not in nat_rules(lab, 1), 10, what="iptables chains removed")
    assert "FLANNEL" not in in_ns(ns, "iptables", "-S").stdout
    assert "masquerade fully-random" in in_ns(ns, "nft", "list", "table", "ip",
                                              "flannel-ipv4").stdout


def test_health_and_readiness(make_lab):
    lab = make_lab()
    lab.create_underlay()
    lab.add_node(1)
    lab.add_node(2)
    lab.start_flanneld(1, *HEALTH)
    wait_until(lambda: readyz(lab, 1)[0] == 503, 20, what="503 before the network config")
    assert "waiting for the network config" in readyz(lab, 1)[1]
    assert http_get(lab.node_ns(1), "http://127.0.0.1:8081/healthz") == (
        200, "flanneld is running\n")
    lab.put_config(CONFIG)
    lab.start_flanneld(2)
    wait_until(lambda: readyz(lab, 1) == (200, "flanneld is ready\n"), 20, what="ready")

    # A device the daemon cannot recreate (another one holds VNI 1): not ready, and why.
    ns = lab.node_ns(1)
    ip(ns, "link", "set", "flannel.1", "down")
    ip(ns, "link", "set", "flannel.1", "name", "imposter")
    wait_until(lambda: readyz(lab, 1)[0] == 503, 5, what="not ready while broken")
    assert "flannel.1" in readyz(lab, 1)[1]
    ip(ns, "link", "del", "imposter")
    wait_until(lambda: readyz(lab, 1)[0] == 200, 5, what="ready again once repaired")
    lab.attach_pod_bridge(1)
    lab.attach_pod_bridge(2)
    assert lab.ping(1, 2) and lab.ping(2, 1)


def test_missing_iptables_binary_keeps_the_node_unready(make_lab, tmp_path):
    lab = one_node(make_lab)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    lab.start_flanneld(1, "--ip-masq", *HEALTH, env={"PATH": str(empty)})
    wait_until(lambda: "iptables not found in PATH" in readyz(lab, 1)[1], 20,
               what="503 naming the missing binary")
    assert readyz(lab, 1)[0] == 503


def test_systemd_is_notified_when_ready(make_lab, tmp_path):
    lab = one_node(make_lab)
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(20)
        lab.start_flanneld(1, env={"NOTIFY_SOCKET": str(path)})
        assert sock.recv(100) == b"READY=1"
    # Logged just after the datagram is sent: the line may trail the datagram a little.
    wait_until(lambda: "Notified systemd: READY=1" in lab.log(1), 5, what="the notify log line")
    lease = json.loads(next(iter(lab.leases().values())))
    assert lease["PublicIP"] == lab.node(1).address
