"""Pods attached through the flannel CNI plugin (real bridge + host-local) in a 3-node lab:
S1 same node, S2 across nodes, S3 host to pod, S12 delete and re-create without leaks."""

from __future__ import annotations

import subprocess

import pytest

from flannel_lab.cli import build
from tests.support.traffic import source_seen

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
def test_pods_reach_each_other_and_keep_their_addresses(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG, flanneld_args=("--ip-masq",))
    pods = {n: [lab.add_pod(n), lab.add_pod(n)] if n == 1 else [lab.add_pod(n)] for n in nodes}
    a, b = pods[1]
    for pod in (a, b, pods[2][0], pods[3][0]):
        env = lab.wait_subnet_env(pod.node)
        subnet_prefix = env["FLANNEL_SUBNET"].rsplit(".", 1)[0] + "."
        assert pod.address.startswith(subnet_prefix)

    # S1: same node, both ways, source address preserved.
    assert lab.pod_ping(a, b.address) and lab.pod_ping(b, a.address)
    assert source_seen(a.netns, b.netns, b.address) == a.address
    # S2: across nodes, every pair of nodes, both ways, no SNAT.
    every = [p for n in nodes for p in pods[n]]
    for src in every:
        for dst in every:
            if src.node != dst.node:
                assert lab.pod_ping(src, dst.address), f"{src.name} -> {dst.name}"
    c = pods[2][0]
    assert source_seen(a.netns, c.netns, c.address) == a.address
    assert source_seen(c.netns, a.netns, a.address) == c.address
    # S3: host to pod, on its own node and from another node.
    for node in nodes:
        for pod in every:
            result = subprocess.run(["ip", "netns", "exec", lab.node_ns(node), "ping", "-c",
                                     "1", "-W", "1", pod.address], capture_output=True,
                                    timeout=20, check=False)
            assert result.returncode == 0, f"node {node} -> {pod.name}"


def test_pod_delete_and_recreate_leaks_nothing(make_lab):
    lab = make_lab()
    build(lab, 2, CONFIG, flanneld_args=("--ip-masq",))
    remote = lab.add_pod(2)
    for _ in range(5):
        pod = lab.add_pod(1)
        assert lab.pod_ping(pod, remote.address) and lab.pod_ping(remote, pod.address)
        assert lab.ipam_reservations(1) == [pod.address]
        lab.delete_pod(pod)
        assert lab.ipam_reservations(1) == []
    assert list((lab.directory / "n1" / "cni").iterdir()) == []
