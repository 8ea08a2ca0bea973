"""Hostile records in the shared store (issue: nothing from the store can take a node down).

Three vxlan nodes run while leases that no node should act on are written under the subnets
prefix: a value nested a thousand levels deep, a key that names the underlay itself, a key
that names half of the address space, one with the wrong prefix length, one whose public
IP is loopback, and one whose vxlan data has no usable MAC. Every node keeps running,
programs none of them, keeps its pods connected, restarts cleanly with them present, and a
new node still joins.
"""

from __future__ import annotations

import json
import signal

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, ip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}


def lease_value(public_ip: str, backend_data: str | None = None) -> str:
    data = backend_data or json.dumps({"VNI": 1, "VtepMAC": "02:aa:bb:cc:dd:ee"})
    return (f'{{"PublicIP":"{public_ip}","PublicIPv6":null,"BackendType":"vxlan",'
            f'"BackendData":{data}}}')


HOSTILE = {
    # Deep nesting: once made every node exit with RecursionError, and again at each restart.
    "10.244.77.0-24": lease_value("192.168.111.77", "[" * 1000 + "]" * 1000),
    # The underlay itself: would steal the nodes' route to each other and to etcd.
    "192.168.111.0-25": lease_value("192.168.111.78"),
    # Half the address space: the kernel refused it, so no pass ever succeeded.
    "0.0.0.0-1": lease_value("192.168.111.79"),
    "10.244.78.0-25": lease_value("192.168.111.80"),  # not the configured SubnetLen
    "10.244.79.0-24": lease_value("127.0.0.1"),  # a public IP no peer can be reached at
    # Usable for the store, not for vxlan: no MAC to send the peer's packets to.
    "10.244.81.0-24": lease_value("192.168.111.81", '{"VNI":1,"VtepMAC":"zz"}'),
}
HOSTILE_ROUTES = ("10.244.77.0/24", "192.168.111.0/25", "0.0.0.0/1", "10.244.78.0/25",
                  "10.244.79.0/24", "10.244.81.0/24")
VTEP_SKIPPED = ("ignoring peer 10.244.81.0-24: its IPv4 backend data has no valid VtepMAC (a "
                'vxlan lease needs {"VtepMAC":"<6-byte MAC>"}); the node that owns it rewrites '
                "it on restart, or delete the lease")


def running(lab, index: int) -> bool:
    """The node's flanneld is alive (a zombie, exited but not reaped, is not)."""
    try:
        with open(f"/proc/{lab.node(index).pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def routes(lab, index: int) -> str:
    return ip(lab.node_ns(index), "route", "show").stdout


@pytest.fixture
def lab3(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    return lab


def test_hostile_leases_are_skipped_and_harm_no_node(lab3):
    lab = lab3
    for key, value in HOSTILE.items():
        lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/{key}", value)
    # Each node says, once per record, that it skipped it.
    for index in (1, 2, 3):
        wait_until(lambda i=index: all(key in lab.log(i) for key in HOSTILE), 10,
                   what=f"node {index} to report the hostile leases")
    for index in (1, 2, 3):
        assert running(lab, index), lab.log(index)[-3000:]
        table = routes(lab, index)
        assert not any(route in table for route in HOSTILE_ROUTES), table
        assert lab.log(index).count(VTEP_SKIPPED) == 1, lab.log(index)[-3000:]
    wait_for_mesh(lab, [1, 2, 3], ipv6=False, timeout=10)

    # A restart with the records present comes up and stays connected.
    lab.stop_flanneld(1, signal.SIGTERM)
    lab.start_flanneld(1)
    wait_until(lambda: lab.log(1).count("Lease snapshot") == 2, 20, what="restarted flanneld")
    assert running(lab, 1), lab.log(1)[-3000:]

    # A new node acquires a subnet of its own despite the records and joins the mesh.
    lab.add_node(4)
    lab.start_flanneld(4)
    lab.attach_pod_bridge(4)
    wait_for_mesh(lab, [1, 2, 3, 4], ipv6=False, timeout=20)
    subnet = lab.wait_subnet_env(4)["FLANNEL_SUBNET"]
    assert subnet.startswith("10.244.") and not subnet.startswith(("10.244.77.", "10.244.78.",
                                                                   "10.244.79."))
    for index in (1, 2, 3, 4):
        assert running(lab, index), lab.log(index)[-3000:]
        table = routes(lab, index)
        assert not any(route in table for route in HOSTILE_ROUTES), table
        # Logged once per record, not on every pass.
        assert lab.log(index).count("192.168.111.0-25") <= 2, lab.log(index)[-3000:]
