"""Two lab nodes running flanneld --kube-subnet-mgr against the API-server test double reach
each other over vxlan, with their podCIDRs as subnets and annotations as the wire format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flannel_lab.cli import wait_for_mesh

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]


def test_two_kube_nodes_reach_each_other_over_vxlan(make_lab, tmp_path):
    lab = make_lab()
    lab.create_underlay()
    lab.add_node(1)
    lab.add_node(2)
    api = subprocess.Popen(
        ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "tests.support.kubeapi",
         "--host", "192.168.111.1", "--port", "6443", "--node", "node1=10.244.1.0/24",
         "--node", "node2=10.244.2.0/24"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert api.stdout.readline().startswith("listening")
        conf = tmp_path / "net-conf.json"
        conf.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}))
        for index in (1, 2):
            lab.start_flanneld(index, "--kube-subnet-mgr",
                               "--kube-api-url=http://192.168.111.1:6443",
                               f"--net-config-path={conf}",
                               env={"NODE_NAME": f"node{index}"})
        assert lab.wait_subnet_env(1)["FLANNEL_SUBNET"] == "10.244.1.1/24"
        assert lab.wait_subnet_env(2)["FLANNEL_SUBNET"] == "10.244.2.1/24"
        lab.attach_pod_bridge(1)
        lab.attach_pod_bridge(2)
        wait_for_mesh(lab, [1, 2], ipv6=False, timeout=20)
        assert "NetworkUnavailable=False" in lab.log(1)
    finally:
        api.terminate()
        api.wait(timeout=10)
