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
import subprocess
from collections.abc import Iterator
from ipaddress import ip_address
from pathlib import Path

import pytest

from flannel.ipsec import charon
from flannel.kernel import nsexec
from flannel.kernel.host import Host
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, Lab, in_ns
from flannel_lab.mesh import start_pings
from tests.support.capture import Capture, ip_packet
from tests.support.checkout import FLANNELCTL
from tests.support.ipseclab import (
    CONFIG,
    NETWORK,
    PATTERN,
    PSK_A,
    PSK_B,
    all_established,
    charon_pid,
    ike_sas,
    session,
)
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

vici = pytest.importorskip("vici", reason="needs the vici package (the ipsec extra)")

pytestmark = [
    pytest.mark.netns, pytest.mark.etcd,
    pytest.mark.skipif(not any(shutil.which(p) for p in charon.SEARCH),
                       reason="needs strongSwan's charon (install.sh installs it)"),
]

HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=10280")
IKE_PORTS = {500, 4500}


def connections(lab: Lab, index: int) -> dict[str, dict]:
    return {name: conn for entry in session(lab, index).list_conns()
            for name, conn in entry.items()}


def engine(lab: Lab, index: int) -> dict[str, float]:
    status, body = http_get(lab.node_ns(index), "http://127.0.0.1:10280/status")
    assert status == 200, body
    return json.loads(body)["engines"].get("ipsec connections", {})


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
    # Leases as Go publishes them: BackendType ipsec, no data; the MTU what ipsec0 carries
    # (kernel-libipsec's 1400, less than 1500 less ESP in UDP).
    leases = lab.leases()
    for index in (1, 2, 3):
        value = json.loads(leases[lab.lease_key(index)])
        assert value["BackendType"] == "ipsec" and "BackendData" not in value, value
        assert lab.wait_subnet_env(index)["FLANNEL_MTU"] == "1400"
    # One connection per peer, named as Go names it, with its child, both ends alike.
    for index, node in enumerate(nodes, 1):
        subnet = lab.lease_key(index).replace("-", "/")
        conns = connections(lab, index)
        want = {}
        for other in (i for i in (1, 2, 3) if i != index):
            remote = lab.lease_key(other).replace("-", "/")
            want[f"{node.address}-{subnet}-{remote}-{lab.node(other).address}"] = remote
        assert set(conns) == set(want)
        negotiated = {name: ike for sa in session(lab, index).list_sas()
                      for name, ike in sa.items()}
        for name, remote in want.items():
            assert conns[name]["version"] == b"IKEv2"
            # Go's proposals: IKE aes256-sha256-modp4096, ESP aes128gcm16 (in UDP here).
            ike = negotiated[name]
            assert (ike["encr-alg"], ike["encr-keysize"], ike["integ-alg"],
                    ike["dh-group"]) == (b"AES_CBC", b"256", b"HMAC_SHA2_256_128", b"MODP_4096")
            child = next(iter(ike["child-sas"].values()))
            assert (child["encr-alg"], child["encr-keysize"], child["encap"]) == (
                b"AES_GCM_16", b"128", b"yes")
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
    # The restart comes once both paths carry echoes, while the runs still go on.
    wait_until(lambda: lab.ping(2, 1) and lab.ping(1, 3), 5, interval=0.05,
               what="echoes answered on both paths before the restart")
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
    # A connection unloaded by hand is loaded again at the next check (every 5 s).
    want = set(connections(lab, 1))
    session(lab, 1).unload_conn({"name": sorted(want)[0]})
    wait_until(lambda: set(connections(lab, 1)) == want, 15, interval=0.2,
               what="the connection loaded again")
    old = charon_pid(lab, 1)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: charon_pid(lab, 1) != old and all_established(lab, [1, 2, 3]), 40,
               what="charon restarted with its connections")
    wait_for_mesh(lab, [1, 2, 3], ipv6=False, timeout=30)
    assert "charon was restarted: loading our PSK and 2 connections again" in lab.log(1)
    # Node 3's lease goes while its charon still runs (its flanneld stopped, the lease
    # deleted as an operator removing the node does): nodes 1 and 2 unload the connection
    # and end its SAs, which would otherwise keep carrying traffic to it.
    gone = lab.node(3).address
    key = lab.lease_key(3)
    lab.stop_flanneld(3)
    lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{key}")
    wait_until(lambda: all(not any(n.endswith(f"-{gone}") for n in
                                   [*connections(lab, i), *ike_sas(lab, i)])
                           for i in (1, 2)), 20, what="node 3's connection and SAs gone")
    wait_until(lambda: all("(its peer is gone)" in lab.log(i) for i in (1, 2)), 5,
               what="the unloads logged")
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
    status = json.loads(http_get(lab.node_ns(1), "http://127.0.0.1:10280/status")[1])
    assert status["peers"]["refused_reasons"] == {
        lab.lease_key(3): "IKE authentication fails: another PSK"}
    # Nodes 1 and 2 still reach each other and stay ready.
    assert lab.ping(1, 2) and lab.ping(2, 1)
    assert http_get(lab.node_ns(1), "http://127.0.0.1:10280/readyz")[0] == 200
    # Node 3 restarted with the cluster's PSK: the failure is over, and said so.
    lab.put_config(json.dumps(CONFIG))
    lab.stop_flanneld(3)
    lab.start_flanneld(3, *HEALTH)
    wait_until(lambda: engine(lab, 1).get("ipsec_peers_failing_authentication") == 0, 60,
               interval=0.5, what="node 1 no longer counting a failing peer")
    assert "succeeds again" in lab.log(1)
    wait_for_mesh(lab, [1, 2, 3], ipv6=False, timeout=30)


def in_node(lab: Lab, index: int, *cmd: str) -> subprocess.CompletedProcess:
    """``cmd`` in node ``index``'s view: its network namespace and its /run."""
    return subprocess.run(nsexec.command(list(cmd), Host(lab.node_ns(index)),
                                         lab.node_run_dir(index)),
                          capture_output=True, text=True, timeout=60, check=False)


def doctor_ipsec(lab: Lab, index: int) -> list[dict]:
    node = lab.node(index)
    proc = in_node(lab, index, *FLANNELCTL, "doctor", "--json",
                   f"--etcd-endpoints={lab.state.etcd_endpoint}",
                   f"--subnet-file={node.subnet_file}")
    return [f for f in json.loads(proc.stdout)["findings"] if f["check"] in ("backend", "engine")]


def test_doctor_names_a_peer_without_an_sa_and_cleanup_stops_our_charon(make_lab):
    lab = make_lab()
    build(lab, 2, CONFIG, flanneld_args=HEALTH)
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=60)
    assert doctor_ipsec(lab, 1) == []
    # Node 2's flanneld stops; its charon stays, as across restarts.
    lab.stop_flanneld(2)
    pid = charon_pid(lab, 2)
    assert charon.process_conf(pid) is not None
    # A policy of Go's shape (left by a Go flanneld on a kernel with ESP) and a foreign one.
    go = ["xfrm", "policy", "add", "src", "10.244.1.0/24", "dst", "10.244.2.0/24", "dir",
          "out", "tmpl", "src", "192.0.2.1", "dst", "192.0.2.2", "proto", "esp", "reqid"]
    assert in_node(lab, 2, "ip", *go, "11", "mode", "tunnel").returncode == 0
    foreign = [*go[:4], "10.9.1.0/24", *go[5:]]
    assert in_node(lab, 2, "ip", *foreign, "12", "mode", "tunnel").returncode == 0
    options = ("--run-dir", "/run", "--cni-bin-dir", "/nonexistent", "--cni-conf-dir",
               "/nonexistent")
    dry = in_node(lab, 2, *FLANNELCTL, "cleanup", "--dry-run", *options)
    listed = [line.removeprefix("would remove: ") for line in dry.stdout.splitlines()
              if line.startswith("would remove: ")]
    assert (f"charon process {pid} (started by flanneld's ipsec backend; its SAs, TUN device "
            "and routes go with it)") in listed, dry.stdout
    assert "directory /run/flannel/ipsec" in listed
    assert ("XFRM policy src 10.244.1.0/24 dst 10.244.2.0/24 dir out (ESP tunnel, reqid 11)"
            in listed)
    assert not [line for line in listed if "10.9.1.0" in line]
    assert charon.process_conf(pid) is not None  # a dry run changes nothing
    done = in_node(lab, 2, *FLANNELCTL, "cleanup", *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert charon.process_conf(pid) is None
    assert "ipsec0" not in in_node(lab, 2, "ip", "-br", "link").stdout
    assert not (lab.node_run_dir(2) / "flannel" / "ipsec").exists()
    policies = in_node(lab, 2, "ip", "xfrm", "policy", "list").stdout
    assert "10.244.1.0/24" not in policies and "10.9.1.0/24" in policies
    # Node 2's charon deleted its SAs as it stopped: node 1 keeps the connection (node 2's
    # lease stays) with no SA, and doctor names the peer.
    wait_until(lambda: doctor_ipsec(lab, 1) != [], 20, what="doctor naming the peer")
    found = doctor_ipsec(lab, 1)
    assert found[0]["severity"] == "error"
    assert found[0]["what"].startswith("the IKE SA ")
    # Missing, or still trying (CONNECTING): named either way, with the peer.
    assert f"for node {lab.node(2).address} " in found[0]["what"]
