"""The controls: kernel vxlan and host-gw, which every kernel carries, in a two-node lab each.
When these fail in the VM too, the VM (or the lab in it) is broken, not the backend a
scenario of its own was about."""

from __future__ import annotations

import json

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ip

pytestmark = [pytest.mark.netns, pytest.mark.etcd]


@pytest.mark.parametrize("backend", ["vxlan", "host-gw"])
def test_two_nodes_reach_each_other(module_labs, backend):
    lab = module_labs()
    nodes = build(lab, 2, {"Network": "10.244.0.0/16", "Backend": {"Type": backend}})
    wait_for_mesh(lab, nodes, ipv6=False, timeout=30)
    routes = json.loads(ip(lab.node_ns(1), "-j", "-4", "route", "show", "proto", "151").stdout)
    peer = lab.node(2)
    if backend == "vxlan":
        assert [(r["gateway"], r["dev"]) for r in routes] == [(
            lab.lease_key(2).split("-")[0], "flannel.1")]
    else:
        assert [(r["gateway"], r["dev"]) for r in routes] == [(peer.address, "eth0")]
    lab.down()
