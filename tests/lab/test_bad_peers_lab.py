"""A bad peer is the bad peer's problem, in labs of three real flanneld nodes per backend with
a data path: leases the kernel would refuse (a multicast, zero or broadcast VTEP MAC; a
host-gw public IP that is off the segment; a public IP inside the pod network), leases that
point at a node itself (a udp lease whose public IP is node 1's own: a forwarding loop) and
data a backend cannot use are written to the store. Every node stays ready (no pass fails),
programs every good peer, lists each bad lease with its reason, and pods keep pinging; once
the leases go, nothing of them is left."""

from __future__ import annotations

import json
import shutil

import pytest

from flannel.ipsec import charon
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, Lab, in_ns
from flannel_lab.mesh import start_pings
from tests.lab.test_identity_hijack_lab import free_key
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = "10.244.0.0/16"
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=10282")
NODES = [1, 2, 3]


def status(lab: Lab, index: int) -> dict:
    code, body = http_get(lab.node_ns(index), "http://127.0.0.1:10282/status")
    assert code == 200, body
    return json.loads(body)


def metric(lab: Lab, index: int, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    code, body = http_get(lab.node_ns(index), "http://127.0.0.1:10282/metrics")
    assert code == 200, body
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def value(public_ip: str, backend: str, data: dict | None = None) -> str:
    fields = {"PublicIP": public_ip, "PublicIPv6": None}
    if backend:
        fields["BackendType"] = backend
    if data is not None:
        fields["BackendData"] = data
    return json.dumps(fields, separators=(",", ":"))


def vxlan_data(mac: str) -> dict:
    return {"VNI": 1, "VtepMAC": mac}


def refused_or_skipped(doc: dict) -> dict[str, str]:
    peers = doc["peers"]
    return {**peers["skipped_reasons"], **peers["refused_reasons"]}


def hold_out(lab: Lab, backend: str, bad: list[tuple[str, str]],
             on_node1_only: tuple[int, ...] = ()) -> None:
    """Write the ``bad`` (public IP, BackendData-or-"") leases, then: every node lists each
    one as refused or skipped (those of ``on_node1_only``: only node 1, whose own address
    they name), stays ready with no pass failing, programs its good peers, and its pods
    ping without loss; once deleted, none is listed any more."""
    keys = []
    for public_ip, data in bad:
        key = free_key(lab)
        keys.append(key)
        lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/{key}",
                    value(public_ip, "" if backend == "udp" else backend,
                          json.loads(data) if data else None))
    logs = {i: len(lab.log(i)) for i in NODES}
    runs = start_pings(lab, [(2, 1), (3, 1), (1, 2)], seconds=6, interval=0.1)
    try:
        for index in NODES:
            expected = {k for n, k in enumerate(keys) if index == 1 or n not in on_node1_only}
            wait_until(lambda i=index, e=expected: e <= set(refused_or_skipped(status(lab, i))),
                       20, what=f"node {index} to list the bad leases")
    finally:
        results = [run.result(30) for run in runs]
    assert all(sent == received for sent, received in results), results
    for index in NODES:
        doc = status(lab, index)
        assert doc["ready"], doc["reason"]
        # A lease naming node 1 is a peer for the others (at node 1's address).
        good = 2 + (len(on_node1_only) if index != 1 else 0)
        assert doc["peers"]["programmed"] == good, doc["peers"]
        assert doc["dataplane"]["failed_passes"] == 0, doc["dataplane"]
        # Any lease change is "not programmed yet" for the milliseconds of its pass; a
        # failed pass, or any other reason, would be the bad lease making the node unready.
        since = lab.log(index)[logs[index]:]
        unready = [line for line in since.splitlines() if "Not ready:" in line
                   and not line.endswith("latest lease changes not programmed yet")]
        assert "reconcile failed" not in since and not unready, since[-3000:]
    wait_for_mesh(lab, NODES, ipv6=False, timeout=20)
    for key in keys:
        lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{key}")
    wait_until(lambda: all(not set(keys) & set(refused_or_skipped(status(lab, i)))
                           for i in NODES), 20, what="the bad leases forgotten")


def lab3(make_lab, backend: dict, timeout: float = 30, *args: str) -> Lab:
    lab = make_lab()
    build(lab, 3, {"Network": NETWORK, "Backend": backend}, flanneld_args=(*HEALTH, *args))
    wait_for_mesh(lab, NODES, ipv6=False, timeout=timeout)
    return lab


def test_vxlan_leases_with_macs_the_kernel_refuses_leave_every_node_ready(make_lab):
    lab = lab3(make_lab, {"Type": "vxlan"})
    good = json.dumps(vxlan_data("0e:aa:00:00:00:01"))
    hold_out(lab, "vxlan", [
        ("192.168.111.91", json.dumps(vxlan_data("01:00:5e:00:00:01"))),  # multicast
        ("192.168.111.92", json.dumps(vxlan_data("00:00:00:00:00:00"))),  # zero
        ("192.168.111.93", json.dumps(vxlan_data("ff:ff:ff:ff:ff:ff"))),  # broadcast
        ("10.244.250.7", good),  # a pod address
        (lab.node(1).address, good),  # node 1 itself
    ], on_node1_only=(4,))
    for reason in ("VtepMAC 01:00:5e:00:00:01 is a multicast or broadcast MAC",
                   "VtepMAC 00:00:00:00:00:00 is zero",
                   "VtepMAC ff:ff:ff:ff:ff:ff is a multicast or broadcast MAC",
                   "PublicIP 10.244.250.7: it lies inside the Network",
                   f"PublicIP {lab.node(1).address}: it is this node's own"):
        assert lab.log(1).count(reason) == 1, reason  # logged once


def test_host_gw_leases_off_the_segment_or_in_the_pod_network_leave_every_node_ready(make_lab):
    lab = lab3(make_lab, {"Type": "host-gw"})
    hold_out(lab, "host-gw", [("192.168.200.5", ""), ("10.244.250.7", "")])
    refused = status(lab, 2)["peers"]
    assert refused["refused"] == 0  # forgotten with their leases
    assert metric(lab, 2, "flannel_peer_refusals_total", reason="kernel_refused") >= 1


def test_udp_a_lease_naming_a_node_itself_makes_no_loop(make_lab):
    # Passes every second read the forwarder's counters.
    lab = lab3(make_lab, {"Type": "udp"}, 30, "--reconcile-interval=1")
    key = free_key(lab)
    lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/{key}", value(lab.node(1).address, ""))
    wait_until(lambda: key in status(lab, 1)["peers"]["skipped_reasons"], 20,
               what="node 1 to refuse the lease naming itself")
    target = key.replace("-24", "").rsplit(".", 1)[0] + ".9"
    tx = metric(lab, 1, "flannel_engine_udp_tx_packets_total", engine="udp forwarder")
    # Node 2's pod sends into the subnet: node 2 forwards to node 1, which has no peer for it
    # and answers ICMP net unreachable instead of sending it to itself until the TTL ends.
    in_ns(lab.node_ns(2), "ping", "-c", "20", "-i", "0.05", "-W", "1", "-I",
          lab.pod_address(2), target, check=False, timeout=30)
    wait_until(lambda: metric(lab, 1, "flannel_engine_udp_tx_packets_total",
                              engine="udp forwarder") > tx, 10, what="node 1's counters read")
    assert metric(lab, 1, "flannel_engine_udp_drop_ttl_total", engine="udp forwarder") == 0
    assert metric(lab, 1, "flannel_engine_udp_tx_packets_total",
                  engine="udp forwarder") - tx <= 3 * 20
    lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{key}")
    hold_out(lab, "udp", [("10.244.250.7", ""), (lab.node(1).address, "")], on_node1_only=(1,))


@pytest.mark.skipif(shutil.which("wireguard-go") is None, reason="needs wireguard-go")
def test_wireguard_bad_leases_leave_every_node_ready(make_lab):
    lab = lab3(make_lab, {"Type": "wireguard"}, 60)
    good = json.dumps({"PublicKey": "B" * 43 + "=", "Port": 51820})
    hold_out(lab, "wireguard", [
        ("192.168.111.91", json.dumps({"PublicKey": "not a key", "Port": 51820})),
        ("10.244.250.7", good),
        (lab.node(1).address, json.dumps({"PublicKey": "C" * 43 + "=", "Port": 51820})),
    ], on_node1_only=(2,))


@pytest.mark.skipif(not any(shutil.which(p) for p in charon.SEARCH),
                    reason="needs strongSwan's charon")
def test_ipsec_bad_leases_leave_every_node_ready(make_lab):
    pytest.importorskip("vici", reason="needs the vici package (the ipsec extra)")
    psk = "a" * 48 + "0123456789abcdef" * 3
    lab = lab3(make_lab, {"Type": "ipsec", "PSK": psk}, 90)
    hold_out(lab, "ipsec", [("10.244.250.7", ""), (lab.node(1).address, "")],
             on_node1_only=(1,))
