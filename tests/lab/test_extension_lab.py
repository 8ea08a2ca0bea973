"""The extension backend in a lab: the deploy/examples/extension-vxlan scripts, run by
flanneld without a shell, build a vxlan overlay with plain ip and bridge commands. Three
nodes with pods reach each other in every direction; a node joining is reached; a node
leaving has its route, neighbour and FDB entry removed on the others by the remove script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flannel_lab import extension
from flannel_lab.cli import build
from flannel_lab.cluster import Lab, Pod, in_ns, ip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")


def config(lab: Lab) -> dict[str, object]:
    return {"Network": "10.244.0.0/16", "Backend": extension.backend_section(lab)}


def device_mac(lab: Lab, index: int) -> str:
    return in_ns(lab.node_ns(index), "cat", "/sys/class/net/flannel-ext/address").stdout.strip()


def subnet(lab: Lab, index: int) -> str:
    return lab.lease_key(index).replace("-", "/")


def wait_all_pods_reach_each_other(lab: Lab, pods: list[Pod]) -> None:
    """Every pod pings every pod on another node (each pair within its own deadline)."""
    for src in pods:
        for dst in pods:
            if src.node != dst.node:
                wait_until(lambda s=src, d=dst: lab.pod_ping(s, d.address), timeout=15,
                           interval=0.1, what=f"pod {src.name} to reach {dst.name}")


def test_scripts_build_an_overlay_that_follows_nodes_joining_and_leaving(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, config(lab), flanneld_args=("--ip-masq",))
    pods = [lab.add_pod(n) for n in nodes]
    wait_all_pods_reach_each_other(lab, pods)

    # What each node published: the pre-startup output (the device MAC) as a JSON string.
    leases = {json.loads(v)["PublicIP"]: json.loads(v) for v in lab.leases().values()}
    for index in nodes:
        lease = leases[lab.node(index).address]
        assert lease["BackendType"] == "extension"
        assert lease["BackendData"] == device_mac(lab, index)
        # The example's EncapOverhead: the MTU flannel-ext (eth0's less vxlan's 50) carries.
        assert lab.wait_subnet_env(index)["FLANNEL_MTU"] == "1450"
        assert json.loads(ip(lab.node_ns(index), "-j", "link", "show", "flannel-ext").stdout
                          )[0]["mtu"] == 1450
    # The post-startup script put the lease base on the device: host-to-pod works across.
    base = subnet(lab, 1).split("/")[0]
    assert f"inet {base}/32" in ip(lab.node_ns(1), "-4", "-o", "addr", "show", "dev",
                                   "flannel-ext").stdout
    assert in_ns(lab.node_ns(1), "ping", "-c", "1", "-W", "2", pods[2].address,
                 check=False).returncode == 0

    # A node joins: the others run the add script for it, and its pod is reached.
    lab.add_node(4)
    lab.start_flanneld(4, "--ip-masq")
    pods.append(lab.add_pod(4))
    wait_all_pods_reach_each_other(lab, pods)

    # A node leaves: the remove script deletes its route, neighbour and FDB entry elsewhere.
    gone_subnet, gone_mac, gone_key = subnet(lab, 2), device_mac(lab, 2), lab.lease_key(2)
    lab.remove_node(2)
    for index in (1, 3, 4):
        ns = lab.node_ns(index)
        wait_until(lambda i=index: f"extension subnet-remove command for {gone_key} ran"
                   in lab.log(i), timeout=20, what=f"node {index} to run the remove script")
        assert ip(ns, "route", "show", gone_subnet).stdout == ""
        assert gone_subnet.split("/")[0] not in ip(ns, "neigh", "show", "dev",
                                                   "flannel-ext").stdout
        assert gone_mac not in in_ns(ns, "bridge", "fdb", "show", "dev", "flannel-ext").stdout
    remaining = [p for p in pods if p.node != 2]
    wait_all_pods_reach_each_other(lab, remaining)


def test_flannel_lab_up_with_the_extension_backend(make_lab):
    lab = make_lab()
    result = subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), "up", "--name",
                             lab.name, "--nodes", "2", "--backend", "extension",
                             "--pods-per-node", "1"], capture_output=True, text=True,
                            timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    assert f"==> lab {lab.name} is up: 2 nodes, every pair connected " in result.stdout
    recorded = Lab(lab.name, root=lab.directory.parent)
    backend = json.loads(recorded.etcdctl("get", "--print-value-only",
                                          "/coreos.com/network/config"))["Backend"]
    assert backend == extension.backend_section(recorded)
    pinged = subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), "ping",
                             "--name", lab.name], capture_output=True, text=True, timeout=120,
                            check=False)
    assert pinged.returncode == 0 and "FAIL" not in pinged.stdout, pinged.stdout
