"""The ipsec backend in a lab: pods on three nodes through charon's SAs, what the underlay
carries, restarts that keep the established SAs, a killed charon restarted, a node leaving,
a PSK mismatch reported by name.

This kernel has no ESP: every node's flanneld starts charon with kernel-libipsec (ESP in
userspace over the ``ipsec0`` TUN, in UDP 4500), in the node's own /run (the lab runs each
flanneld that way), so each node's VICI socket is ``<node run dir>/charon.vici``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from ipaddress import IPv4Network, ip_address
from pathlib import Path
from typing import Any

import pytest

from flannel.ipsec import charon
from flannel.lab.cli import build, wait_for_mesh
from flannel.lab.cluster import Lab, in_ns
from flannel.lab.mesh import start_pings
from tests.lab.test_wireguard_lab import Capture, ip_packet
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

vici = pytest.importorskip("vici", reason="needs the vici package (the ipsec extra)")

pytestmark = [
    pytest.mark.netns, pytest.mark.etcd, pytest.mark.slow,
    pytest.mark.skipif(not any(shutil.which(p) for p in charon.SEARCH),
                       reason="needs strongSwan's charon (install.sh installs it)"),
]

NETWORK = IPv4Network("10.244.0.0/16")
PSK_A = "a" * 48 + "0123456789abcdef" * 3
PSK_B = "b" * 48 + "0123456789abcdef" * 3
CONFIG = {"Network": str(NETWORK), "Backend": {"Type": "ipsec", "PSK": PSK_A}}
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=10280")
PATTERN = "f1a77e1ddeadc0de"
IKE_PORTS = {500, 4500}


def session(lab: Lab, index: int) -> Any:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(str(lab.node_run_dir(index) / "charon.vici"))
    return vici.Session(sock)


def ike_sas(lab: Lab, index: int) -> dict[str, tuple[bytes, bytes, tuple[str, ...]]]:
    """Connection name -> (IKE SA unique id, state, its CHILD_SAs' names)."""
    out = {}
    for sa in session(lab, index).list_sas():
        for name, ike in sa.items():
            out[name] = (ike["uniqueid"], ike["state"], tuple(sorted(ike["child-sas"])))
    return out


def connections(lab: Lab, index: int) -> dict[str, dict]:
    return {name: conn for entry in session(lab, index).list_conns()
            for name, conn in entry.items()}


def charon_pid(lab: Lab, index: int) -> int:
    text = (lab.node_run_dir(index) / "flannel" / "ipsec" / "charon.pid").read_text()
    return int(text)


def engine(lab: Lab, index: int) -> dict[str, float]:
    status, body = http_get(lab.node_ns(index), "http://127.0.0.1:10280/status")
    assert status == 200, body
    return json.loads(body)["engines"].get("ipsec connections", {})


def all_established(lab: Lab, indexes: list[int]) -> bool:
    for index in indexes:
        sas = ike_sas(lab, index)
        if len(sas) != len(indexes) - 1 or any(s[1] != b"ESTABLISHED" for s in sas.values()):
            return False
    return True


@pytest.fixture
def lab3(make_lab) -> Iterator[Lab]:
    lab = make_lab()
    build(lab, 3, CONFIG, flanneld_args=HEALTH)
    wait_until(lambda: all_established(lab, [1, 2, 3]), 60, what="every IKE SA established")
    wait_for_mesh(lab, [1, 2, 3], ipv6=False, timeout=60)
    yield lab


def test_pods_reach_each_other_and_the_underlay_carries_only_ike_and_esp(lab3):
    lab = lab3
    pods = [lab.add_pod(index) for index in (1, 2, 3)]
    nodes = [lab.node(i) for i in (1, 2, 3)]
    underlay = {n.address for n in nodes}
    capture = Capture(lab.underlay_ns)
    failed = []
    try:
        for src in pods:
            for dst in pods:
                if src is not dst:
                    result = in_ns(src.netns, "ping", "-c", "2", "-i", "0.2", "-W", "2",
                                   "-p", PATTERN, dst.address, check=False, timeout=30)
                    if result.returncode != 0:
                        failed.append((src.name, dst.address))
    finally:
        frames = capture.stop()
    assert not failed, f"pings failed: {failed}"
    packets = [p for p in map(ip_packet, frames) if p is not None]
    between_nodes = [p for p in packets if p[0] in underlay and p[1] in underlay]
    # kernel-libipsec sends ESP in UDP 4500 (RFC 3948); kernel ESP would be protocol 50.
    ipsec = [p for p in between_nodes if (p[2] == 17 and {p[3], p[4]} <= IKE_PORTS)
             or p[2] == 50]
    assert [p for p in ipsec if p[4] == 4500], between_nodes[:5]
    assert between_nodes == ipsec, [p for p in between_nodes if p not in ipsec][:5]
    in_clear = [p for p in packets if any(ip_address(a) in NETWORK for a in p[:2])]
    assert not in_clear, in_clear[:5]
    assert not [f for f in frames if bytes.fromhex(PATTERN) in f]
    # Leases as Go publishes them: BackendType ipsec, no data; the MTU less ESP in UDP.
    leases = lab.leases()
    for index in (1, 2, 3):
        value = json.loads(leases[lab.lease_key(index)])
        assert value["BackendType"] == "ipsec" and "BackendData" not in value, value
        assert lab.wait_subnet_env(index)["FLANNEL_MTU"] == str(1500 - 77 - 8)
    # One connection per peer, named as Go names it, with its child, both ends alike.
    for index, node in enumerate(nodes, 1):
        subnet = lab.lease_key(index).replace("-", "/")
        conns = connections(lab, index)
        want = {}
        for other in (i for i in (1, 2, 3) if i != index):
            remote = lab.lease_key(other).replace("-", "/")
            want[f"{node.address}-{subnet}-{remote}-{lab.node(other).address}"] = remote
        assert set(conns) == set(want)
        for name, remote in want.items():
            assert conns[name]["version"] == b"IKEv2"
            child = conns[name]["children"][f"{subnet}-{remote}"]
            assert child["mode"] == b"TUNNEL"
            assert child["local-ts"] == [subnet.encode()]
            assert child["remote-ts"] == [remote.encode()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_keeps_the_established_sas_and_loses_no_ping(lab3, sig):
    lab = lab3
    before = ike_sas(lab, 1)
    pid = charon_pid(lab, 1)
    log_before = len(lab.log(1))
    runs = start_pings(lab, [(2, 1), (1, 3)], seconds=6, interval=0.1)
    time.sleep(0.5)
    code = lab.stop_flanneld(1, sig)
    assert code == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    lab.start_flanneld(1, *HEALTH)
    wait_until(lambda: "Lease snapshot" in lab.log(1)[log_before:], 30,
               what="the restarted flanneld's lease snapshot")
    results = [r.result(timeout=30) for r in runs]
    assert all(sent >= 50 and received == sent for sent, received in results), results
    new_log = lab.log(1)[log_before:]
    assert "adopting the running charon" in new_log
    assert charon_pid(lab, 1) == pid
    wait_until(lambda: engine(lab, 1).get("ipsec_established_ike_sas") == 2, 20,
               what="the restarted flanneld counting its 2 established IKE SAs")
    # The very same IKE and CHILD SAs: nothing was re-negotiated.
    assert ike_sas(lab, 1) == before


def test_a_killed_charon_is_restarted_and_a_node_leaving_is_unloaded(lab3):
    lab = lab3
    old = charon_pid(lab, 1)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: charon_pid(lab, 1) != old and all_established(lab, [1, 2, 3]), 40,
               what="charon restarted with its connections")
    wait_for_mesh(lab, [1, 2, 3], ipv6=False, timeout=30)
    assert "charon was restarted: loading our PSK and 2 connections again" in lab.log(1)
    # Node 3 leaves: its connection is unloaded on nodes 1 and 2.
    gone = lab.node(3).address
    lab.remove_node(3)
    wait_until(lambda: all(not any(n.endswith(f"-{gone}") for n in connections(lab, i))
                           for i in (1, 2)), 20, what="node 3's connection unloaded")
    assert all("(its peer is gone)" in lab.log(i) for i in (1, 2))
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=10)


def test_a_psk_mismatch_is_reported_by_name(make_lab):
    lab = make_lab()
    build(lab, 2, CONFIG, flanneld_args=HEALTH)
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=60)
    lab.put_config(json.dumps({**CONFIG, "Backend": {"Type": "ipsec", "PSK": PSK_B}}))
    lab.add_node(3)
    lab.start_flanneld(3, *HEALTH)
    lab.attach_pod_bridge(3)
    wait_until(lambda: engine(lab, 1).get("ipsec_peers_failing_authentication") == 1, 60,
               interval=0.5, what="node 1 counting one peer failing authentication")
    subnet3 = lab.lease_key(3).replace("-", "/")
    logged = lab.log(1)
    assert (f"IKE authentication with peer {lab.node(3).address} (subnet {subnet3}) failed: "
            "its PSK differs from ours") in logged
    # Never the PSK: not in a log, not in readiness, status or metrics, not in charon's log.
    for index in (1, 2, 3):
        metrics = http_get(lab.node_ns(index), "http://127.0.0.1:10280/metrics")[1]
        text = (lab.log(index) + http_get(lab.node_ns(index),
                                          "http://127.0.0.1:10280/readyz")[1]
                + http_get(lab.node_ns(index), "http://127.0.0.1:10280/status")[1] + metrics
                + Path(lab.node_run_dir(index) / "flannel/ipsec/charon.log").read_text())
        assert PSK_A not in text and PSK_B not in text
    # Nodes 1 and 2 still reach each other and stay ready.
    assert lab.ping(1, 2) and lab.ping(2, 1)
    assert http_get(lab.node_ns(1), "http://127.0.0.1:10280/readyz")[0] == 200
