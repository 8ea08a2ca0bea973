"""``flannelctl check`` on real flanneld nodes: the lab matrix when every path works, then
with one path broken on purpose (a firewall drop, a route gone), naming exactly the pairs
that fail and why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import in_ns, ip

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
ALL_PAIRS = {(f"n{a}", f"n{b}") for a in (1, 2, 3) for b in (1, 2, 3) if a != b}


@pytest.fixture
def lab3(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=30)
    return lab


def check_lab(lab, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([FLANNELCTL, "check", "--lab", lab.name, "--lab-root",
                           str(lab.directory.parent), "--count=2", "--timeout=1", *extra],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.stderr == "", proc.stderr
    return proc


def verdicts(lab) -> tuple[int, dict[tuple[str, str], str]]:
    proc = check_lab(lab, "--json")
    doc = json.loads(proc.stdout)
    assert doc["ok"] == (proc.returncode == 0)
    assert [node["error"] for node in doc["nodes"]] == [None, None, None]
    return proc.returncode, {(p["from"], p["to"]): p["verdict"] for p in doc["pairs"]}


def subnet(lab, index: int) -> str:
    address, plen = lab.wait_subnet_env(index)["FLANNEL_SUBNET"].split("/")
    return f"{address.rsplit('.', 1)[0]}.0/{plen}"


def test_every_pair_answers_then_a_dropped_vxlan_port_names_the_pairs_it_cuts(lab3):
    code, found = verdicts(lab3)
    assert (code, found) == (0, dict.fromkeys(ALL_PAIRS, "ok"))
    proc = check_lab(lab3)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0] == f"lab {lab3.name}: 3 nodes, 6 pairs checked, 0 failing"
    assert lines[1].split() == ["from", "\\", "to", "n1", subnet(lab3, 1), "n2",
                                subnet(lab3, 2), "n3", subnet(lab3, 3)]
    assert [line.split()[:2] for line in lines[2:]] == [
        ["n1", "192.168.111.11"], ["n2", "192.168.111.12"], ["n3", "192.168.111.13"]]
    assert all(line.count("ok ") == 2 for line in lines[2:])

    ns3 = lab3.node_ns(3)
    in_ns(ns3, "nft", "add", "table", "inet", "checktest")
    try:
        in_ns(ns3, "nft", "add", "chain", "inet", "checktest", "input",
              "{ type filter hook input priority 0 ; }")
        in_ns(ns3, "nft", "add", "rule", "inet", "checktest", "input", "udp", "dport", "8472",
              "drop")
        code, found = verdicts(lab3)
        cut = {("n1", "n3"), ("n2", "n3"), ("n3", "n1"), ("n3", "n2")}
        assert code == 1
        assert found == {pair: "timeout" if pair in cut else "ok" for pair in ALL_PAIRS}
        proc = check_lab(lab3)
        assert proc.returncode == 1
        lines = proc.stdout.splitlines()
        assert lines[0] == f"lab {lab3.name}: 3 nodes, 6 pairs checked, 4 failing"
        cells = lines[2].split()[2:]  # n1's row: itself, n2 ("ok 0.41ms"), n3
        assert (cells[0], cells[1], cells[3]) == ("-", "ok", "TIMEOUT")
        assert cells[2].endswith("ms")
        assert lines[4].split()[2:] == ["TIMEOUT", "TIMEOUT", "-"]
        failing = lines[lines.index("failing pairs:") + 1:]
        assert [line.split(":")[0] for line in failing[::3]] == [
            "  n1 -> n3", "  n2 -> n3", "  n3 -> n1", "  n3 -> n2"]
        assert failing[0] == (f"  n1 -> n3: timeout: no answer from {subnet(lab3, 3)[:-3]} "
                              "to 2 echoes within 1s")
        assert failing[1] == (
            "    next: on n1: run flannelctl doctor on this node: it probes this node's own "
            "firewall, 192.168.111.13 on the underlay and VXLAN on UDP 8472, telling a node "
            "that is down from a blocked port; then on the node 192.168.111.13")
        assert failing[2] == (
            f"    n1: ip netns exec {lab3.node_ns(1)} {FLANNELCTL} doctor "
            f"--etcd-endpoints={lab3.state.etcd_endpoint} "
            f"--subnet-file={lab3.node(1).subnet_file}")
    finally:
        in_ns(ns3, "nft", "delete", "table", "inet", "checktest")
    assert verdicts(lab3) == (0, dict.fromkeys(ALL_PAIRS, "ok"))


def test_an_entry_flanneld_has_not_programmed_is_not_a_timeout(lab3):
    node1 = lab3.node(1)
    os.kill(node1.pid, signal.SIGSTOP)  # so the entries stay gone while the check runs
    try:
        ip(node1.netns, "route", "del", subnet(lab3, 2))
        vtep3 = subnet(lab3, 3)[:-3]
        ip(node1.netns, "neigh", "del", vtep3, "dev", "flannel.1")
        code, found = verdicts(lab3)
        # n1 sends nothing to n2 and n3; their echoes reach n1, whose answers have no way back.
        assert code == 1
        assert found == {**dict.fromkeys(ALL_PAIRS, "ok"), ("n1", "n2"): "not-programmed",
                         ("n1", "n3"): "not-programmed", ("n2", "n1"): "timeout",
                         ("n3", "n1"): "timeout"}
        proc = subprocess.run(
            ["ip", "netns", "exec", node1.netns, FLANNELCTL, "check",
             f"--etcd-endpoints={lab3.state.etcd_endpoint}",
             f"--subnet-file={node1.subnet_file}", "--count=2"],
            capture_output=True, text=True, timeout=60, check=False)
        assert (proc.returncode, proc.stderr) == (1, "")
        lines = proc.stdout.splitlines()
        assert lines[0] == f"this node: {subnet(lab3, 1)} (192.168.111.11, vxlan), no echoes sent"
        # A frozen flanneld cannot say whether it parked them: said, once.
        assert lines[1] == (f"note: a peer flanneld parked shows as not-programmed: flanneld's "
                            f"/status could not be read: flanneld did not answer on "
                            f"{Path(node1.subnet_file).parent / 'flanneld.sock'} (timed out)")
        assert sorted(line.split()[0] for line in lines[3:5]) == sorted(
            [subnet(lab3, 2), subnet(lab3, 3)])
        assert all(line.split()[2:] == ["vxlan", "-", "-", "-", "-", "NOT-PROGRAMMED"]
                   for line in lines[3:5])
        assert lines[5] == "2 of 2 peers do not answer:"
        lacks = "not-programmed: this node lacks what flanneld makes for it"
        assert f"  {subnet(lab3, 2)} (192.168.111.12): {lacks}: no route to " \
               f"{subnet(lab3, 2)} (node 192.168.111.12)" in lines
        mac = next(line.split()[0] for line in in_ns(node1.netns, "bridge", "fdb", "show",
                                                       "dev", "flannel.1").stdout.splitlines()
                   if "dst 192.168.111.13 " in line)
        assert f"  {subnet(lab3, 3)} (192.168.111.13): {lacks}: the neighbour entry " \
               f"{vtep3} -> {mac} for node 192.168.111.13 is missing on flannel.1" in lines
        assert lines.count("    next: run flannelctl doctor on this node (is flanneld running, "
                           "and what does its log say about that peer?)") == 2
    finally:
        os.kill(node1.pid, signal.SIGCONT)
