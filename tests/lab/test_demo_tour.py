"""``flannel-lab demo`` and ``flannel-lab tour`` run as a user runs them (the installed
console script): what they explain is what etcd and the nodes' kernels hold."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flannel.lease import LeaseAttrs
from flannel_lab.cluster import Lab, in_ns, ip
from tests.lab.test_lab_cli import netns_names

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")
DEVICE = "flannel.100"
MAC = r"[0-9a-f]{2}(?::[0-9a-f]{2}){5}"


def run(lab: Lab, command: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), command,
                           "--name", lab.name, *argv], capture_output=True, text=True,
                          timeout=300, check=False)


def section(out: str, title: str) -> str:
    """The text of the ``=== title...`` section, up to the next one."""
    start = out.index(f"\n=== {title}")
    end = out.find("\n=== ", start + 1)
    return out[start:end if end >= 0 else len(out)]


def test_demo_explains_what_etcd_and_the_kernel_hold(make_lab):
    lab = make_lab()
    result = run(lab, "demo", "--keep")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    kept = Lab(lab.name, root=lab.directory.parent)
    node1, node2 = kept.node(1), kept.node(2)
    env1 = kept.wait_subnet_env(1)

    # The leases: every key and raw value etcd holds, decoded.
    leases = kept.leases()
    assert len(leases) == 2
    shown = section(out, "The leases in etcd")
    by_node = {}
    for key, value in leases.items():
        assert f"  /coreos.com/network/subnets/{key}\n    value: {value}\n" in shown
        attrs = LeaseAttrs.from_json(value)
        by_node[str(attrs.public_ip)] = (key, attrs)
        vtep = json.loads(value)["BackendData"]["VtepMAC"]
        assert (f"node {1 if str(attrs.public_ip) == node1.address else 2} "
                f"(PublicIP {attrs.public_ip}), backend vxlan: VNI 100, VtepMAC {vtep}") in shown
    assert re.search(r"etcd lease: TTL 86400s, \d+s left", shown)

    # subnet.env, each line as the file has it.
    env_text = section(out, "subnet.env of node 1")
    for line in Path(node1.subnet_file).read_text().splitlines():
        assert re.search(rf"^  {re.escape(line)}\s+\S", env_text, re.M), line

    # The packet path, entry by entry, against node 1's kernel and node 2's lease.
    path = section(out, "A packet from pod")
    key2, attrs2 = by_node[node2.address]
    subnet2 = ipaddress.ip_network(key2.replace("-", "/"))
    gateway = str(subnet2.network_address)
    vtep2 = json.loads(attrs2.backend_data or "{}")["VtepMAC"]
    pod2 = next(p for p in kept.state.pods if p.node == 2)

    route = re.search(r"^     (\S+) via (\S+) dev (\S+) onlink proto", path, re.M)
    assert route and route.groups() == (str(subnet2), gateway, DEVICE)
    kernel_route = json.loads(ip(node1.netns, "-j", "route", "get", pod2.address).stdout)[0]
    assert (kernel_route["gateway"], kernel_route["dev"]) == (gateway, DEVICE)

    neighbour = re.search(rf"^     (\S+) dev {re.escape(DEVICE)} lladdr ({MAC}) PERMANENT$",
                          path, re.M)
    assert neighbour, path
    kernel_neigh = json.loads(ip(node1.netns, "-j", "neigh", "show", gateway, "dev",
                                 DEVICE).stdout)
    assert neighbour.groups() == (gateway, vtep2)
    assert [n["lladdr"] for n in kernel_neigh] == [vtep2]
    # ... and that MAC is really node 2's VTEP.
    device2 = json.loads(ip(node2.netns, "-j", "link", "show", DEVICE).stdout)[0]
    assert device2["address"] == vtep2

    fdb = re.search(rf"^     ({MAC}) dev {re.escape(DEVICE)} dst (\S+) self permanent$",
                    path, re.M)
    assert fdb and fdb.groups() == (vtep2, node2.address) == (vtep2, str(attrs2.public_ip))
    kernel_fdb = json.loads(in_ns(node1.netns, "bridge", "-j", "fdb", "show", "dev",
                                  DEVICE).stdout)
    assert {"mac": vtep2, "dst": node2.address} in [
        {"mac": f["mac"], "dst": f.get("dst")} for f in kernel_fdb]

    underlay = re.search(r"^     (\S+) dev (\S+) src (\S+)$", path, re.M)
    assert underlay and underlay.groups() == (node2.address, "eth0", node1.address)
    assert "MISMATCH" not in out and "checked: the route's gateway" in path
    assert env1["FLANNEL_MTU"] == "1450"

    ping = section(out, "ping from pod")
    assert re.search(r"3 packets transmitted, 3 received, 0% packet loss", ping)
    assert f"lab {lab.name} kept" in out


def test_tour_shows_a_join_and_a_repair_then_removes_its_lab(make_lab):
    lab = make_lab()
    result = run(lab, "tour")
    out = result.stdout
    assert result.returncode == 0, out + result.stderr

    alone = section(out, "Node 1 alone")
    assert "routes of flanneld (proto 151) on node 1: none" in alone

    joined = section(out, "Node 2 joins")
    lease = re.search(r"node 2's flanneld leased (\S+) [\d.]+s after it started:\n"
                      r"    (\S+)\n    value: (.+)\n", joined)
    assert lease, joined
    subnet2, key, value = lease.groups()
    assert key == f"/coreos.com/network/subnets/{subnet2.replace('/', '-')}"
    attrs2 = LeaseAttrs.from_json(value)
    vtep2 = json.loads(attrs2.backend_data or "{}")["VtepMAC"]
    gateway = str(ipaddress.ip_network(subnet2).network_address)
    # Node 1 added the three entries for node 2, as its lease says.
    node1_part = joined[joined.index("  node 1, "):joined.index("  node 2, ")]
    assert f"route      {subnet2} via {gateway} dev {DEVICE} onlink" in node1_part
    assert f"neighbour  {gateway} dev {DEVICE} lladdr {vtep2} PERMANENT" in node1_part
    assert f"fdb        {vtep2} dev {DEVICE} dst {attrs2.public_ip} self permanent" in node1_part
    # Node 2 added the three for node 1.
    node2_part = joined[joined.index("  node 2, "):]
    assert re.search(rf"neighbour  \S+ dev {re.escape(DEVICE)} lladdr {MAC} PERMANENT",
                     node2_part)

    repair = section(out, "Repair: an entry deleted by hand")
    for what in ("neighbour", "fdb"):
        said = re.search(rf"the {what} entry was (gone|back already); flanneld put it back "
                         r"within ([\d.]+)s", repair)
        assert said, repair
        assert float(said.group(2)) < 10
    assert "(missing)" not in repair
    assert f"neighbour  {gateway} dev {DEVICE} lladdr {vtep2} PERMANENT" in repair
    assert out.count("3 packets transmitted, 3 received, 0% packet loss") == 2
    assert "MISMATCH" not in out

    assert "==> removing the tour lab" in out
    assert not lab.directory.exists()
    assert not {ns for ns in netns_names() if ns.startswith(f"{lab.name}-")}
