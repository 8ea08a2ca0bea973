"""The ipip backend in a lab, wherever the kernel can create ipip devices (the probe tries in
a throwaway namespace; elsewhere every test is skipped with the kernel's answer): three
nodes and their pods reach each other through flannel.ipip with Go's routes, MTU and lease;
a route deleted by hand comes back; DirectRouting keeps same-segment peers on eth0 and
tunnels to a routed one; a leaving node's route goes; ``flannel-lab up --backend ipip``."""

from __future__ import annotations

import json
import subprocess

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, ip
from tests.support.checkout import FLANNEL_LAB
from tests.support.kernelpaths import missing_ipip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]



@pytest.fixture(autouse=True)
def _kernel_with_ipip() -> None:
    if reason := missing_ipip():
        pytest.skip(reason)


def config(direct_routing: bool = False) -> dict[str, object]:
    backend: dict[str, object] = {"Type": "ipip"}
    if direct_routing:
        backend["DirectRouting"] = True
    return {"Network": "10.244.0.0/16", "Backend": backend}


def routes(lab: Lab, index: int) -> dict[str, dict[str, object]]:
    """Our routes on node ``index`` by destination."""
    shown = json.loads(ip(lab.node_ns(index), "-j", "-4", "route", "show", "proto", "151")
                       .stdout or "[]")
    return {route["dst"]: route for route in shown}


def subnet(lab: Lab, index: int) -> str:
    return lab.lease_key(index).replace("-", "/")


def test_nodes_and_pods_reach_each_other_through_flannel_ipip(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, config())
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    pods = [lab.add_pod(n) for n in nodes]
    for src in pods:
        for dst in pods:
            if src is not dst:
                wait_until(lambda s=src, d=dst: lab.pod_ping(s, d.address), timeout=15,
                           what=f"pod {src.name} to reach {dst.name}")
    leases = {json.loads(v)["PublicIP"]: json.loads(v) for v in lab.leases().values()}
    for index in nodes:
        node = lab.node(index)
        assert lab.wait_subnet_env(index)["FLANNEL_MTU"] == "1480"
        lease = leases[node.address]
        assert lease["BackendType"] == "ipip" and lease.get("BackendData") is None
        shown = json.loads(ip(node.netns, "-d", "-j", "link", "show", "flannel.ipip").stdout)[0]
        assert (shown["mtu"], shown["linkinfo"]["info_kind"]) == (1480, "ipip")
        assert (shown["linkinfo"]["info_data"]["local"],
                shown["linkinfo"]["info_data"]["remote"]) == (node.address, "any")
        got = routes(lab, index)
        assert sorted(got) == sorted(subnet(lab, peer) for peer in nodes if peer != index)
        for peer in nodes:
            if peer != index:
                route = got[subnet(lab, peer)]
                assert (route["gateway"], route["dev"]) == (lab.node(peer).address,
                                                            "flannel.ipip")
                assert "onlink" in route["flags"]

    # A route deleted by hand is put back (the same ownership rules as vxlan).
    ns, peer_subnet = lab.node_ns(1), subnet(lab, 2)
    ip(ns, "route", "del", peer_subnet)
    wait_until(lambda: peer_subnet in routes(lab, 1), timeout=15,
               what="the deleted route to come back")


def test_direct_routing_keeps_same_segment_peers_off_the_tunnel(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, config(direct_routing=True), second_underlay_from=3)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    got = routes(lab, 1)
    same, routed = got[subnet(lab, 2)], got[subnet(lab, 3)]
    assert (same["gateway"], same["dev"]) == (lab.node(2).address, "eth0")
    assert (routed["gateway"], routed["dev"]) == (lab.node(3).address, "flannel.ipip")
    assert "onlink" in same["flags"] and "onlink" in routed["flags"]

    # Node 3 leaves: its route goes from the others.
    gone = subnet(lab, 3)
    lab.remove_node(3)
    for index in (1, 2):
        wait_until(lambda i=index: gone not in routes(lab, i), timeout=20,
                   what=f"node {index} to drop the route to {gone}")
    assert lab.ping(1, 2) and lab.ping(2, 1)


def test_flannel_lab_up_with_the_ipip_backend(make_lab):
    lab = make_lab()
    result = subprocess.run([*FLANNEL_LAB, "--root", str(lab.directory.parent), "up", "--name",
                             lab.name, "--nodes", "3", "--backend", "ipip"],
                            capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    assert f"==> lab {lab.name} is up: 3 nodes, full mesh " in result.stdout
