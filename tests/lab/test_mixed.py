"""S20: two underlay subnets with vxlan DirectRouting: same-subnet peers are reached by
direct routes on the underlay, the others through the vxlan device."""

from __future__ import annotations

import json

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ip

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


def test_direct_routing_within_a_subnet_vxlan_across(make_lab):
    lab = make_lab()
    config = {"Network": "10.244.0.0/16",
              "Backend": {"Type": "vxlan", "DirectRouting": True}}
    nodes = build(lab, 4, config, second_underlay_from=3)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    leases = {json.loads(v)["PublicIP"]: k.replace("-", "/") for k, v in lab.leases().items()}
    for index in nodes:
        node = lab.node(index)
        routes = {r["dst"]: r for r in json.loads(
            ip(lab.node_ns(index), "-j", "route", "show", "proto", "151").stdout)}
        assert len(routes) == 3
        for peer in nodes:
            if peer == index:
                continue
            other = lab.node(peer)
            route = routes[leases[other.address]]
            if other.underlay == node.underlay:
                assert (route["gateway"], route["dev"]) == (other.address, "eth0")
            else:
                assert route["dev"] == "flannel.1" and "onlink" in route["flags"]
