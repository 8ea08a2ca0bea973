"""A 20-node lab (the CI-sized version of ``bench/scale_lab.py``'s 100): ``flannel-lab up``
paces the starts and reports the full mesh read from every node's kernel; then nodes leave
and join while pings between the nodes that stay lose nothing."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from pathlib import Path

from flannel.kernel import rtnl
from flannel.kernel.host import Host
from flannel_lab.cluster import Lab
from flannel_lab.mesh import MAIN_TABLE, peer_routes, start_nodes, start_pings, wait_full_mesh

FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")
NODES, CHURN = 20, 3


def route_destinations(lab: Lab, index: int) -> set[str]:
    conn = rtnl.Rtnl(Host(lab.node_ns(index)))
    try:
        return {route.dst for route, proto, table in conn.routes(socket.AF_INET)
                if proto == rtnl.RTPROT_FLANNEL and table == MAIN_TABLE}
    finally:
        conn.close()


def subnet(lab: Lab, index: int) -> str:
    return str(ipaddress.ip_network(lab.wait_subnet_env(index)["FLANNEL_SUBNET"],
                                    strict=False))


def test_twenty_nodes_mesh_then_churn_loses_no_ping_between_the_others(make_lab):
    named = make_lab()  # the fixture removes what the flannel-lab process records
    name, root = named.name, named.directory.parent
    up = subprocess.run([FLANNEL_LAB, "--root", str(root), "up", "--name", name, "--nodes",
                         str(NODES)], capture_output=True, text=True, timeout=150, check=False)
    assert up.returncode == 0, up.stdout[-2000:] + up.stderr
    assert f"==> flanneld started on {NODES}/{NODES} nodes" in up.stdout
    assert f"==> waiting until every node has routes to its {NODES - 1} peers" in up.stdout
    assert f"ring of {NODES} pings ok;" in up.stdout
    lab = Lab(name, root=root)
    everyone = list(range(1, NODES + 1))
    assert {i: peer_routes(lab, i) for i in everyone} == {i: NODES - 1 for i in everyone}

    leaving = everyone[-CHURN:]
    joining = list(range(NODES + 1, NODES + CHURN + 1))
    staying = everyone[:-CHURN]
    pairs = [(1, 9), (4, 13), (7, 16), (10, 2), (15, 6)]
    runs = start_pings(lab, pairs, seconds=120)
    try:
        for index in leaving:
            lab.remove_node(index)
        for index in joining:
            lab.add_node(index)
        start_nodes(lab, joining, "--ip-masq", timeout=60)
        for index in joining:
            lab.attach_pod_bridge(index)
        wait_full_mesh(lab, staying + joining, timeout=60)
    finally:
        counts = {(run.src, run.dst): run.stop() for run in runs}
    assert {pair: sent - got for pair, (sent, got) in counts.items()} == \
        {pair: 0 for pair in pairs}
    assert all(sent >= 10 for sent, _ in counts.values()), counts

    now = staying + joining
    for index in (1, joining[0]):
        expected = {subnet(lab, i) for i in now if i != index}
        assert route_destinations(lab, index) == expected
    assert lab.ping(joining[0], 1) and lab.ping(1, joining[-1])
    assert not any(Path(f"/run/netns/{lab.node_ns(i)}").exists() for i in leaving)
