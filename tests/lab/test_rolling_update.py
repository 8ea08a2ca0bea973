"""A rolling update of a 3-node cluster while pods on every node talk to each other.

As an operator's rolling update does (a DaemonSet's, or ``systemctl restart`` host by host),
each node's flanneld in turn gets SIGTERM and a new process is started with the same
arguments; the next node waits until this one answers ready (``flannelctl status``) and
``flannelctl doctor`` finds no error and nothing it did not find before. Meanwhile a UDP
stream with sequence numbers runs between the pods of every ordered pair of nodes, 100
datagrams a second each (tests/support/udpstream.py). Checked: no datagram lost across the
whole rollout; each node keeps its subnet, subnet.env, lease (etcd key and value, or Node
annotations and NetworkUnavailable=False), VTEP MAC and kernel entries; the new process
finds the kernel in sync and changes nothing. Once in etcd mode, once in kube mode against
the API-server test double (tests/support/kubeapi.py).

test_resilience.py restarts one node with one ping running; this is the whole rollout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from flannel.cni.install import install_conflist
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, in_ns, ip
from tests.support.checkout import FLANNELCTL
from tests.support.traffic import http_get
from tests.support.udpstream import Flow, UdpMesh
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=8081")
NODES = (1, 2, 3)
API = "http://192.168.111.1:6443"


def kernel_state(lab: Lab, index: int) -> dict[str, list[str]]:
    """flannel's device (index, MAC, MTU, state), its addresses, the routes of protocol 151,
    the permanent neighbours (every one on the device is flanneld's, whatever its protocol)
    and the permanent FDB entries on a node, as text."""
    ns = lab.node_ns(index)
    link = json.loads(ip(ns, "-j", "-d", "link", "show", "flannel.1").stdout)[0]
    addresses = json.loads(ip(ns, "-j", "addr", "show", "dev", "flannel.1").stdout)[0]
    neighbours = json.loads(ip(ns, "-j", "neigh", "show", "dev", "flannel.1", "nud",
                               "permanent").stdout)
    fdb = in_ns(ns, "bridge", "fdb", "show", "dev", "flannel.1").stdout
    return {
        "device": [str(link["ifindex"]), link["address"], str(link["mtu"]), link["operstate"]],
        "addresses": sorted(f"{a['local']}/{a['prefixlen']}" for a in addresses["addr_info"]),
        "routes": sorted(ip(ns, "route", "show", "proto", "151").stdout.splitlines()),
        "neighbours": sorted(f"{n['dst']} {n['lladdr']}" for n in neighbours),
        "fdb": sorted(line for line in fdb.splitlines() if "self permanent" in line),
    }


def ctl(lab: Lab, index: int, *args: str, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", lab.node_ns(index), *FLANNELCTL, *args],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=env)


def ready(lab: Lab, index: int, timeout: float = 2) -> bool:
    """What the migration guide checks after each node: ``flannelctl status`` exits 0."""
    return ctl(lab, index, "status", "--timeout", f"{timeout:g}").returncode == 0


class Rollout:
    """Pods on every node, the streams between them, and the node-by-node handover."""

    def __init__(self, lab: Lab, tmp_path: Path, start: Callable[[int], None],
                 lease: Callable[[int], object], store_flags: list[str]) -> None:
        self.lab, self.start, self.lease = lab, start, lease
        cni_conf = tmp_path / "cni-conf"
        install_conflist(cni_conf)
        pods = {i: lab.add_pod(i) for i in NODES}
        for src in NODES:
            for dst in NODES:
                if src != dst:
                    wait_until(lambda s=src, d=dst: lab.pod_ping(pods[s], pods[d].address), 20,
                               what=f"pod on node {src} to reach the pod on node {dst}")
        self.endpoints = {f"n{i}": (pods[i].netns, pods[i].address) for i in NODES}
        self.doctor_args = [*store_flags, f"--cni-bin-dir={lab.cni_bin}",
                            "--cni-bin-dir=/usr/lib/cni", f"--cni-conf-dir={cni_conf}",
                            # Its own probes, the same on both sides of a handover (a Go
                            # flanneld serves no probe results).
                            "--max-age=0"]
        self.handover_seconds: dict[int, float] = {}
        self.findings: set[str] | None = None  # what doctor said on both sides of a handover

    def doctor(self, index: int) -> list[dict]:
        """doctor's findings on node ``index``, taken again (three tries in all) while it
        says flanneld's /status did not answer within its bound: a loaded machine's stall,
        which would make the diagnoses before and after a handover differ by that note."""
        node = self.lab.node(index)
        env = {**os.environ, "NODE_NAME": f"node{index}"}
        for _ in range(3):
            proc = ctl(self.lab, index, "doctor", "--json",
                       f"--subnet-file={node.subnet_file}", *self.doctor_args, env=env)
            assert proc.stderr == "", proc.stderr
            findings: list[dict] = json.loads(proc.stdout)["findings"]
            if not any("/status could not be read" in f["what"] for f in findings):
                break
        return findings

    def roll(self, index: int) -> None:
        lab = self.lab
        others = [i for i in NODES if i != index]
        subnet_env = Path(lab.node(index).subnet_file).read_text()
        lease = self.lease(index)
        state = {i: kernel_state(lab, i) for i in NODES}
        diagnosis = self.doctor(index)
        assert [f for f in diagnosis if f["severity"] == "error"] == [], diagnosis
        log_start = len(lab.log(index))
        started = time.monotonic()
        assert lab.stop_flanneld(index, signal.SIGTERM) == 0
        self.start(index)
        wait_until(lambda: ready(lab, index), 30, interval=0.1,
                   what=f"the new flanneld on node {index} to be ready")
        self.handover_seconds[index] = time.monotonic() - started
        assert Path(lab.node(index).subnet_file).read_text() == subnet_env
        assert self.lease(index) == lease
        assert {i: kernel_state(lab, i) for i in NODES} == state
        log = lab.log(index)[log_start:]
        assert "reconciled:" not in log, log  # found in sync: nothing was changed
        assert "created flannel.1" not in log, log
        assert self.doctor(index) == diagnosis  # nothing new
        self.findings = (self.findings or set()) | {f"{f['severity']} {f['check']}"
                                                    for f in diagnosis}
        for other in others:  # still ready: asked with time for a loaded machine to answer
            assert ready(lab, other, timeout=15)

    def run(self, handover: Callable[[int], None] | None = None) -> list[Flow]:
        with UdpMesh(self.endpoints) as mesh:
            wait_until(mesh.received_from_all, 10, what="the streams to reach every pod")
            started = time.monotonic()
            for index in NODES:
                (handover or self.roll)(index)
            rollout = time.monotonic() - started
            flows = mesh.stop()
        report(flows, rollout, self.handover_seconds)
        if self.findings is not None:
            print(f"  doctor before and after each handover: {sorted(self.findings) or 'nothing'}")
        for flow in flows:
            # The streams ran through the whole rollout (at least half the nominal rate).
            assert flow.sent >= rollout / mesh.interval / 2, flow
            assert flow.send_errors == 0, flow
            assert flow.duplicates == 0, flow
        assert [f for f in flows if f.lost] == [], flows
        return flows


def report(flows: list[Flow], rollout: float, handovers: dict[int, float]) -> None:
    sent = sum(f.sent for f in flows)
    lost = sum(f.lost for f in flows)
    print(f"\nhandover of {len(handovers)} nodes in {rollout:.2f}s (each, to ready: "
          + ", ".join(f"n{i} {s:.2f}s" for i, s in handovers.items())
          + f"); {sent} datagrams sent on {len(flows)} flows, {lost} lost; longest silence "
          f"{max(f.max_gap for f in flows) * 1000:.0f} ms")
    for flow in flows:
        print(f"  {flow.src} -> {flow.dst}: sent {flow.sent}, received {flow.received}, "
              f"lost {flow.lost}, longest silence {flow.max_gap * 1000:.0f} ms")


def test_rolling_update_in_etcd_mode_loses_no_packet(make_lab, tmp_path):
    lab = make_lab()
    build(lab, len(NODES), CONFIG, flanneld_args=("--ip-masq", *HEALTH))
    wait_for_mesh(lab, list(NODES), ipv6=False, timeout=20)
    keys = {i: lab.lease_key(i) for i in NODES}

    def lease(index: int) -> tuple[str, dict]:
        value = lab.leases().get(keys[index])
        assert value is not None, f"node {index}'s lease {keys[index]} is gone"
        return keys[index], json.loads(value)

    Rollout(lab, tmp_path, lambda i: lab.start_flanneld(i), lease,
            [f"--etcd-endpoints={lab.state.etcd_endpoint}"]).run()
    assert sorted(lab.leases()) == sorted(keys.values())  # no new lease anywhere


def test_rolling_update_in_kube_mode_loses_no_packet(make_lab, tmp_path):
    lab = make_lab()
    lab.create_underlay()
    for index in NODES:
        lab.add_node(index)
    api = subprocess.Popen(
        ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "tests.support.kubeapi",
         "--host", "192.168.111.1", "--port", "6443",
         *(f"--node=node{i}=10.244.{i}.0/24" for i in NODES)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert api.stdout is not None and api.stdout.readline().startswith("listening")
        conf = tmp_path / "net-conf.json"
        conf.write_text(json.dumps(CONFIG))
        kube = ["--kube-subnet-mgr", f"--kube-api-url={API}", f"--net-config-path={conf}"]

        def start(index: int) -> None:
            lab.start_flanneld(index, "--ip-masq", *kube, *HEALTH,
                               env={"NODE_NAME": f"node{index}"})

        def node_object(index: int) -> dict:
            status, body = http_get(lab.underlay_ns, f"{API}/api/v1/nodes/node{index}")
            assert status == 200, body
            return json.loads(body)

        def lease(index: int) -> dict:
            node = node_object(index)
            conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
            return {"podCIDR": node["spec"]["podCIDR"],
                    "NetworkUnavailable": conditions.get("NetworkUnavailable"),
                    **{k: v for k, v in node["metadata"]["annotations"].items()
                       if k.startswith("flannel.alpha.coreos.com/")}}

        for index in NODES:
            start(index)
        for index in NODES:
            assert lab.wait_subnet_env(index)["FLANNEL_SUBNET"] == f"10.244.{index}.1/24"
            lab.attach_pod_bridge(index)
        wait_for_mesh(lab, list(NODES), ipv6=False, timeout=20)
        wait_until(lambda: all(lease(i)["NetworkUnavailable"] == "False" for i in NODES), 10,
                   what="every node's NetworkUnavailable=False")
        assert all(lease(i)["flannel.alpha.coreos.com/backend-type"] == "vxlan" for i in NODES)
        Rollout(lab, tmp_path, start, lease, kube).run()
    finally:
        api.terminate()
        api.wait(timeout=10)


def leave_as_go_flannel(lab: Lab, index: int) -> None:
    """Make node ``index``'s kernel state what Go flanneld (vxlan) leaves when it stops: the
    device made as Go makes it (same MAC, VNI 1, the kernel's default port, no learning),
    and per peer a permanent neighbour and FDB entry without a protocol and an onlink
    route of the default protocol (boot), in Go's order."""
    ns = lab.node_ns(index)
    mac = json.loads(ip(ns, "-j", "link", "show", "flannel.1").stdout)[0]["address"]
    base = lab.lease_key(index).split("-")[0]
    ip(ns, "link", "del", "flannel.1")
    ip(ns, "link", "add", "flannel.1", "address", mac, "mtu", "1450", "type", "vxlan", "id",
       "1", "local", lab.node(index).address, "dev", "eth0", "nolearning")
    ip(ns, "addr", "add", f"{base}/32", "dev", "flannel.1")
    ip(ns, "link", "set", "flannel.1", "up")
    own = lab.node(index).address
    for key, value in lab.leases().items():
        lease = json.loads(value)
        if lease["PublicIP"] == own:
            continue
        peer_base, peer_mac = key.split("-")[0], lease["BackendData"]["VtepMAC"]
        ip(ns, "neigh", "replace", peer_base, "lladdr", peer_mac, "dev", "flannel.1", "nud",
           "permanent")
        in_ns(ns, "bridge", "fdb", "replace", peer_mac, "dev", "flannel.1", "dst",
              lease["PublicIP"], "self", "permanent")
        ip(ns, "route", "replace", key.replace("-", "/"), "via", peer_base, "dev", "flannel.1",
           "onlink")


def test_taking_over_what_go_flannel_leaves_loses_no_packet(make_lab, tmp_path):
    """The Go-to-pyflannel handover, as far as it runs here (no Go flanneld on this
    machine): every node's daemon stopped, its kernel state remade as Go flannel leaves it,
    then pyflannel started node by node while the streams run. The device is reused with its
    MAC, Go's entries are taken over in place, and each node ends exactly as pyflannel
    programs it."""
    lab = make_lab()
    build(lab, len(NODES), CONFIG, flanneld_args=("--ip-masq", *HEALTH))
    wait_for_mesh(lab, list(NODES), ipv6=False, timeout=20)
    rollout = Rollout(lab, tmp_path, lambda i: lab.start_flanneld(i), lambda i: None,
                      [f"--etcd-endpoints={lab.state.etcd_endpoint}"])
    programmed = {i: kernel_state(lab, i) for i in NODES}
    leases = lab.leases()
    subnet_envs = {i: Path(lab.node(i).subnet_file).read_text() for i in NODES}
    for index in NODES:
        assert lab.stop_flanneld(index, signal.SIGTERM) == 0
    for index in NODES:
        leave_as_go_flannel(lab, index)
        assert "proto 151" not in ip(lab.node_ns(index), "route").stdout

    def take_over(index: int) -> None:
        go_device = kernel_state(lab, index)["device"]
        log_start = len(lab.log(index))
        started = time.monotonic()
        lab.start_flanneld(index)
        wait_until(lambda: ready(lab, index), 30, interval=0.1,
                   what=f"pyflannel on node {index} to be ready")
        rollout.handover_seconds[index] = time.monotonic() - started
        wait_until(lambda: kernel_state(lab, index)["routes"] == programmed[index]["routes"],
                   5, what=f"node {index}'s routes taken over")
        state = kernel_state(lab, index)
        assert state["device"] == go_device  # the same device: index, MAC, MTU, up
        assert {k: v for k, v in state.items() if k != "device"} == {
            k: v for k, v in programmed[index].items() if k != "device"}
        assert Path(lab.node(index).subnet_file).read_text() == subnet_envs[index]
        log = lab.log(index)[log_start:]
        assert "created flannel.1" not in log and "incompatible" not in log, log
        assert "taking over" in log, log
        assert [f for f in rollout.doctor(index) if f["severity"] == "error"] == []

    rollout.run(take_over)
    assert lab.leases().keys() == leases.keys()
    for key, value in lab.leases().items():
        assert json.loads(value) == json.loads(leases[key])


def test_a_lost_packet_is_counted(make_lab):
    """The stream measures: a node whose route to a peer is gone loses what it sends there."""
    lab = make_lab()
    build(lab, 2, CONFIG, flanneld_args=("--ip-masq",))
    pods = {i: lab.add_pod(i) for i in (1, 2)}
    wait_until(lambda: lab.pod_ping(pods[1], pods[2].address), 20, what="pods to meet")
    with UdpMesh({f"n{i}": (p.netns, p.address) for i, p in pods.items()}) as mesh:
        wait_until(mesh.received_from_all, 10, what="the streams to start")
        pid = lab.node(1).pid
        subnet = lab.lease_key(2).replace("-", "/")
        os.kill(pid, signal.SIGSTOP)  # no repair while the route is away
        try:
            ip(lab.node_ns(1), "route", "del", subnet)
            time.sleep(0.3)  # the fault's duration: some 30 datagrams to node 2
            ip(lab.node_ns(1), "route", "add", subnet, "via", subnet.split("/")[0], "dev",
               "flannel.1", "onlink", "proto", "151")
        finally:
            os.kill(pid, signal.SIGCONT)
        flows = {(f.src, f.dst): f for f in mesh.stop()}
    assert flows[("n1", "n2")].lost > 0
    assert flows[("n2", "n1")].lost == 0
