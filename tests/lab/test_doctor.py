"""``flannelctl doctor`` on real flanneld nodes: each fault made on purpose is named first.

Every test breaks one thing in a healthy vxlan lab (a firewall rule, an MTU, a sysctl, the
VTEP MAC, an FDB entry, a CNI plugin) and runs doctor inside a node's namespace, as an
operator would, against the lab's etcd. The tests share one lab (tests/support/sharedlab.py),
on one worker: each undoes its fault (or lets node 1's flanneld, paused meanwhile, repair it),
and the lab is checked back to how it was built before the next test gets it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flannel.cni.install import install_conflist
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, in_ns, ip, sysctl
from tests.support.checkout import FLANNELCTL
from tests.support.labcni import install_cni
from tests.support.sharedlab import SharedLab

pytestmark = [pytest.mark.xdist_group("doctor-lab"), pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
#: flanneld's flags in the lab: no periodic resync during the module, so what flanneld repairs
#: is what its events tell it.
FLANNELD_ARGS = ("--reconcile-interval=3600",)


def build_lab2(lab: Lab) -> None:
    nodes = build(lab, 2, CONFIG, flanneld_args=FLANNELD_ARGS)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    (lab.directory / "cni").mkdir()
    lab.cni_dirs = install_cni(lab.directory / "cni")


def cni_files(lab: Lab) -> list[tuple[str, str]]:
    """The lab's CNI directories: each file's path and digest."""
    return [(str(path), hashlib.sha256(path.read_bytes()).hexdigest())
            for directory in lab.cni_dirs for path in sorted(directory.rglob("*"))
            if path.is_file()]


@pytest.fixture(scope="module")
def shared_lab2(module_labs) -> SharedLab:
    return SharedLab(module_labs, build_lab2, extra=cni_files)


@pytest.fixture
def lab2(shared_lab2) -> Iterator[Lab]:
    """A healthy two-node vxlan lab with a CNI setup, as built."""
    with shared_lab2.lend() as lab:
        yield lab


def doctor(lab, index: int, *extra: str) -> tuple[int, list[dict]]:
    node = lab.node(index)
    cni_bin, cni_conf = lab.cni_dirs
    proc = subprocess.run(
        ["ip", "netns", "exec", node.netns, *FLANNELCTL, "doctor", "--json",
         f"--etcd-endpoints={lab.state.etcd_endpoint}", f"--subnet-file={node.subnet_file}",
         f"--cni-bin-dir={cni_bin}", f"--cni-conf-dir={cni_conf}",
         "--max-age=0", *extra],  # its own probes: faults are made just before
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.stderr == "", proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["healthy"] == (proc.returncode == 0)
    return proc.returncode, doc["findings"]


def test_healthy_lab_has_no_findings_but_the_filter_recommendation(lab2):
    code, findings = doctor(lab2, 1)
    assert (code, recommendations_aside(findings)) == (0, [])
    assert [(f["check"], f["severity"]) for f in findings] == [("encap-filter", "info")]


@pytest.fixture
def frozen(lab2):
    """Pause node 1's flanneld, so a change made behind its back stays for doctor to see (it
    repairs it once it runs again)."""
    pid = lab2.node(1).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield lab2
    finally:
        os.kill(pid, signal.SIGCONT)


def recommendations_aside(findings: list[dict]) -> list[dict]:
    """The findings but the info one recommending --encap-peers-only (this flanneld, restarted
    by the test, runs without it)."""
    return [f for f in findings if f["check"] != "encap-filter"]


def first(findings: list[dict]) -> dict:
    assert findings, "doctor found nothing"
    return findings[0]


def peer_subnet(lab, index: int) -> str:
    addr, plen = lab.wait_subnet_env(index)["FLANNEL_SUBNET"].split("/")
    return f"{addr.rsplit('.', 1)[0]}.0/{plen}"


def test_blocked_vxlan_port_is_told_from_a_down_peer(lab2):
    ns2 = lab2.node_ns(2)
    try:
        blocked_then_down(lab2, ns2)
    finally:
        in_ns(ns2, "nft", "delete", "table", "inet", "doctortest", check=False)
        ip(ns2, "link", "set", "eth0", "up")
        # Taking the link down took its routes with it.
        ip(ns2, "route", "replace", "default", "via", "192.168.111.1")


def blocked_then_down(lab2, ns2: str) -> None:
    for rule in (("add", "table", "inet", "doctortest"),
                 ("add", "chain", "inet", "doctortest", "input",
                  "{ type filter hook input priority 0 ; }"),
                 ("add", "rule", "inet", "doctortest", "input", "udp", "dport", "8472", "drop")):
        in_ns(ns2, "nft", *rule)
    code, findings = doctor(lab2, 1)
    assert code == 1
    assert first(findings)["check"] == "encap"
    assert first(findings)["what"] == (
        f"node 192.168.111.12 ({peer_subnet(lab2, 2)}) answers ping but VXLAN traffic to UDP "
        "8472 gets no answer: a firewall drops it (on that node, on the path or in a cloud "
        "security group)")
    assert "allow UDP 8472 between all nodes" in first(findings)["fix"]
    # The same peer with its underlay link down is "down", not "blocked".
    ip(ns2, "link", "set", "eth0", "down")
    _, findings = doctor(lab2, 1)
    assert first(findings)["check"] == "underlay"
    assert first(findings)["what"].startswith("node 192.168.111.12")
    assert "does not answer on the underlay" in first(findings)["what"]


def test_peer_without_vxlan_device_is_named(lab2):
    peer = lab2.node(2)
    os.kill(peer.pid, signal.SIGSTOP)
    try:
        ip(peer.netns, "link", "del", "flannel.1")
        _, findings = doctor(lab2, 1)
    finally:
        os.kill(peer.pid, signal.SIGCONT)
    assert first(findings)["check"] == "encap"
    assert first(findings)["what"] == (f"node 192.168.111.12 ({peer_subnet(lab2, 2)}) answers "
                                       "ping, but nothing listens on UDP 8472, where VXLAN "
                                       "receives: its device or the program serving it is "
                                       "gone there")


def test_mtu_mismatch_between_nodes(lab2):
    """Node 2's underlay MTU is 1400, so its flanneld gives pods 1350 while node 1 uses 1450:
    full-size packets from node 1 never get an answer."""
    try:
        restart_with_underlay_mtu(lab2, 2, 1400)
        assert lab2.wait_subnet_env(2)["FLANNEL_MTU"] == "1350"
        mtus_mismatch(lab2)
    finally:
        restart_with_underlay_mtu(lab2, 2, 1500)


def restart_with_underlay_mtu(lab, index: int, mtu: int) -> None:
    ip(lab.node_ns(index), "link", "set", "eth0", "mtu", str(mtu))
    lab.stop_flanneld(index)
    Path(lab.node(index).subnet_file).unlink(missing_ok=True)
    lab.start_flanneld(index)
    lab.wait_subnet_env(index)


def mtus_mismatch(lab2) -> None:
    code, findings = doctor(lab2, 1)
    assert code == 1
    finding = first(findings)
    assert finding["check"] == "path-mtu"
    assert finding["what"].startswith("packets of 1450 bytes (the pods' MTU) do not reach node "
                                      "192.168.111.12")
    assert "does not carry 1500-byte packets either" in finding["what"]
    assert doctor(lab2, 2)[0] == 0  # node 2 sends within both MTUs: nothing wrong there


def test_ip_forward_off(lab2):
    # The node's own namespace: net.* sysctls are per network namespace.
    sysctl(lab2.node(1).netns, "net.ipv4.ip_forward", "0")
    try:
        code, findings = doctor(lab2, 1)
    finally:
        sysctl(lab2.node(1).netns, "net.ipv4.ip_forward", "1")
    assert code == 1
    assert first(findings)["check"] == "sysctl"
    assert first(findings)["what"].startswith("net.ipv4.ip_forward is 0")


def test_strict_rp_filter_on_vtep(lab2):
    key = "net.ipv4.conf.flannel/1.rp_filter"
    was = in_ns(lab2.node_ns(1), "sysctl", "-n", key).stdout.strip()
    in_ns(lab2.node_ns(1), "sysctl", "-q", "-w", f"{key}=1")
    try:
        _, findings = doctor(lab2, 1)
    finally:
        in_ns(lab2.node_ns(1), "sysctl", "-q", "-w", f"{key}={was}")
    assert first(findings)["check"] == "sysctl"
    assert "(rp_filter=1) applies to flannel.1" in first(findings)["what"]


def test_vtep_mac_changed_behind_flanneld(frozen):
    ip(frozen.node_ns(1), "link", "set", "flannel.1", "address", "02:11:22:33:44:55")
    _, findings = doctor(frozen, 1)
    assert first(findings)["check"] == "vtep-mac"
    assert first(findings)["what"].startswith("flannel.1 has MAC 02:11:22:33:44:55 but the "
                                              "lease publishes ")


def test_stale_fdb_entry(frozen):
    in_ns(frozen.node_ns(1), "bridge", "fdb", "append", "02:aa:bb:cc:dd:ee", "dev", "flannel.1",
          "dst", "192.168.111.99", "self", "permanent")
    code, findings = doctor(frozen, 1)
    assert code == 1
    assert first(findings) == {
        "check": "fdb", "severity": "warning",
        "what": "FDB entry 02:aa:bb:cc:dd:ee dst 192.168.111.99 on flannel.1 matches no lease",
        "fix": "flanneld repairs it at its next reconcile (--reconcile-interval); if it stays, "
               "restart flanneld and read its log; by hand: bridge fdb del 02:aa:bb:cc:dd:ee "
               "dev flannel.1 dst 192.168.111.99"}


def test_missing_route_and_neighbour(frozen):
    subnet = peer_subnet(frozen, 2)
    ip(frozen.node_ns(1), "route", "del", subnet)
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == f"no route to {subnet} (node 192.168.111.12)"
    ip(frozen.node_ns(1), "neigh", "flush", "dev", "flannel.1", "nud", "permanent")
    _, findings = doctor(frozen, 1)
    assert any(f["check"] == "neighbours" and "is missing on flannel.1" in f["what"]
               for f in findings)


def test_missing_vxlan_device(frozen):
    ip(frozen.node_ns(1), "link", "del", "flannel.1")
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == "the device flannel.1 does not exist: no traffic to " \
                                      "other nodes"


def test_vtep_mtu_smaller_than_pods_mtu(frozen):
    ip(frozen.node_ns(1), "link", "set", "flannel.1", "mtu", "1400")
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == ("pods get MTU 1450 (subnet.env) but flannel.1 carries "
                                       "1400: large packets between nodes are dropped")


def test_missing_bridge_plugin(lab2):
    (lab2.cni_dirs[0] / "bridge").unlink()
    try:
        code, findings = doctor(lab2, 1)
    finally:
        shutil.copy2("/usr/lib/cni/bridge", lab2.cni_dirs[0] / "bridge")
    assert code == 1
    assert first(findings)["check"] == "cni"
    assert first(findings)["what"].startswith("CNI plugin 'bridge' missing from ")
    assert "failed to find plugin \"bridge\"" in first(findings)["what"]


def test_missing_conflist(lab2):
    for entry in lab2.cni_dirs[1].iterdir():
        entry.unlink()
    try:
        _, findings = doctor(lab2, 1)
    finally:
        install_conflist(lab2.cni_dirs[1])
    assert first(findings)["what"].startswith("no CNI network config in ")


def test_flanneld_not_running_comes_first(lab2):
    lab2.stop_flanneld(1)
    Path(lab2.node(1).subnet_file).unlink()
    try:
        _, findings = doctor(lab2, 1)
    finally:
        lab2.start_flanneld(1)
        lab2.wait_subnet_env(1)
    assert [f["check"] for f in findings[:2]] == ["flanneld", "subnet-env"]
    assert findings[1]["what"] == f"{lab2.node(1).subnet_file}: missing"


def test_unreachable_store(lab2):
    node = lab2.node(1)
    cni_bin, cni_conf = lab2.cni_dirs
    proc = subprocess.run(
        ["ip", "netns", "exec", node.netns, *FLANNELCTL, "doctor",
         "--etcd-endpoints=http://127.0.0.1:9", f"--subnet-file={node.subnet_file}",
         f"--cni-bin-dir={cni_bin}", f"--cni-conf-dir={cni_conf}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("unhealthy: ")
    assert lines[1].startswith("1. [error] store: cannot read the leases: ")


def test_duplicate_public_ip_and_lease_outside_network(lab2):
    lab2.etcdctl("put", "/coreos.com/network/subnets/10.99.0.0-24",
                 '{"PublicIP":"192.168.111.12","BackendType":"vxlan"}')
    try:
        _, findings = doctor(lab2, 1)
    finally:
        lab2.etcdctl("del", "/coreos.com/network/subnets/10.99.0.0-24")
    assert first(findings)["check"] == "duplicates"
    assert first(findings)["what"].startswith("public IP 192.168.111.12 holds several leases")
    assert any(f["check"] == "skipped" and f["what"] == (
        "lease 10.99.0.0-24 of 192.168.111.12: skipped by flanneld: subnet 10.99.0.0/24 lies "
        "outside the Network 10.244.0.0/16") for f in findings)


def test_forward_policy_drop_without_flannel_rules(frozen):
    ns = frozen.node_ns(1)
    saved = in_ns(ns, "iptables-save", "-t", "filter").stdout.splitlines()
    policy = next(line.split()[1] for line in saved if line.startswith(":FORWARD "))
    rules = [shlex.split(line)[2:] for line in saved if line.startswith("-A FLANNEL-FWD ")]
    try:
        forward_policy_drop_without_flannel_rules(frozen, ns)
    finally:
        in_ns(ns, "iptables", "-w", "5", "-P", "FORWARD", policy)
        in_ns(ns, "iptables", "-w", "5", "-F", "FLANNEL-FWD")
        for rule in rules:
            in_ns(ns, "iptables", "-w", "5", "-A", "FLANNEL-FWD", *rule)


def forward_policy_drop_without_flannel_rules(frozen, ns: str) -> None:
    for variant in ("iptables-nft", "iptables-legacy"):
        in_ns(ns, variant, "-w", "5", "-F", "FLANNEL-FWD", check=False)
    in_ns(ns, "iptables", "-w", "5", "-P", "FORWARD", "DROP")
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == (
        "the FORWARD policy is DROP and no rule accepts the pod network 10.244.0.0/16: "
        "traffic between pods on different nodes is dropped")


def test_subnet_env_network_differs_from_config(frozen):
    path = Path(frozen.node(1).subnet_file)
    was = path.read_text()
    path.write_text(was.replace("FLANNEL_NETWORK=10.244.0.0/16", "FLANNEL_NETWORK=10.0.0.0/8"))
    try:
        _, findings = doctor(frozen, 1)
    finally:
        path.write_text(was)
    assert first(findings)["what"].endswith("says FLANNEL_NETWORK=10.0.0.0/8 but the network "
                                            "config says 10.244.0.0/16")


def test_vtep_down_and_wrong_neighbour_mac(frozen):
    ns = frozen.node_ns(1)
    addr = peer_subnet(frozen, 2).split("/")[0]
    ip(ns, "neigh", "replace", addr, "lladdr", "02:00:00:00:00:99", "dev", "flannel.1",
       "nud", "permanent")
    _, findings = doctor(frozen, 1)
    assert first(findings)["check"] == "neighbours"
    assert "has 02:00:00:00:00:99 on flannel.1" in first(findings)["what"]
    ip(ns, "link", "set", "flannel.1", "down")
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == "flannel.1 is down"


def test_fdb_pointing_a_peer_elsewhere(frozen):
    ns = frozen.node_ns(1)
    mac = json.loads(next(iter(v for k, v in frozen.leases().items()
                               if k == peer_subnet(frozen, 2).replace("/", "-"))))
    mac = mac["BackendData"]["VtepMAC"]
    in_ns(ns, "bridge", "fdb", "replace", mac, "dev", "flannel.1", "dst", "192.168.111.77",
          "self", "permanent")
    _, findings = doctor(frozen, 1)
    assert [f["check"] for f in findings[:2]] == ["fdb", "fdb"]
    assert findings[0]["what"] == (f"no FDB entry {mac} dst 192.168.111.12 on flannel.1: "
                                   "traffic to node 192.168.111.12 has nowhere to go")
    assert findings[1]["what"] == (f"FDB entry {mac} dst 192.168.111.77 on flannel.1 matches "
                                   "no lease (the lease of " + mac + " says 192.168.111.12)")


# The last three leave what costs a new lab: a lease or the config deleted under flanneld,
# flanneld run with --ip-masq (its masquerade chains stay).
def test_subnet_env_without_lease(frozen, shared_lab2):
    subnet = peer_subnet(frozen, 1)
    # flanneld ends once it runs again and finds its lease gone: the next test gets a new lab.
    shared_lab2.spoil("node 1's lease was deleted")
    frozen.etcdctl("del", "/coreos.com/network/subnets/" + subnet.replace("/", "-"))
    _, findings = doctor(frozen, 1)
    assert first(findings)["what"] == (
        f"{frozen.node(1).subnet_file} says this node has {subnet}, but the store holds no "
        "lease for it (expired, released, or taken over)")


def test_missing_network_config(lab2, shared_lab2):
    lab2.etcdctl("del", "/coreos.com/network/config")
    # flanneld may end, now or later, on a config gone: the next test gets a new lab.
    shared_lab2.spoil("the network config was deleted")
    _, findings = doctor(lab2, 1)
    assert first(findings)["check"] == "config"
    assert first(findings)["what"].startswith("no usable network config: flannel config not "
                                              "found in etcd store")


def test_checksum_offload_condition_and_fix(lab2):
    lab2.stop_flanneld(1)
    lab2.start_flanneld(1, "--ip-masq", *FLANNELD_ARGS)
    lab2.wait_subnet_env(1)
    try:
        checksum_offload_condition_and_fix(lab2)
    finally:
        in_ns(lab2.node_ns(1), "nft", "delete", "table", "ip", "doctortest", check=False)
        in_ns(lab2.node_ns(1), "ethtool", "-K", "flannel.1", "tx-checksum-ip-generic", "on",
              check=False)
        lab2.stop_flanneld(1)
        lab2.start_flanneld(1, *FLANNELD_ARGS)
        lab2.wait_subnet_env(1)


def checksum_offload_condition_and_fix(lab2) -> None:
    from tests.support.waiting import wait_until

    ns = lab2.node_ns(1)

    def masquerading() -> bool:
        rules = in_ns(ns, "nft", "list", "ruleset", check=False).stdout
        return "fully-random" in rules or "random-fully" in rules

    wait_until(masquerading, 20, what="flanneld's masquerade rules")
    # flanneld's own masquerade matches pod addresses, never the VXLAN packets: no sign.
    code, findings = doctor(lab2, 1)
    assert (code, recommendations_aside(findings)) == (0, [])
    # Another's with fully-random (kube-proxy's kind) may rewrite them: the bug's condition.
    in_ns(ns, "nft", "add", "table", "ip", "doctortest")
    in_ns(ns, "nft", "add", "chain", "ip", "doctortest", "post",
          "{ type nat hook postrouting priority 100 ; }")
    in_ns(ns, "nft", "add", "rule", "ip", "doctortest", "post", "oifname", "eth0",
          "masquerade", "fully-random")
    _, findings = doctor(lab2, 1)
    assert first(findings)["check"] == "checksum"
    assert "offloads the UDP checksum (tx-checksum-ip-generic on)" in first(findings)["what"]
    _, findings = doctor(lab2, 1, "--fix-checksum-offload")
    assert first(findings)["what"].startswith("turned tx-checksum-ip-generic off on flannel.1")
    code, findings = doctor(lab2, 1)
    assert (code, recommendations_aside(findings)) == (0, [])
