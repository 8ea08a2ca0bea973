"""Each identity one node's, in labs of real flanneld nodes: a lease (etcd mode) or a node's
own annotations (kube mode, as a compromised node may write them) claiming node 1's VTEP MAC
or WireGuard public key from another public IP. The claim is refused on every node (named
in /status), never merged: pings from every other node to node 1's pods lose nothing while
it stands and after it is deleted (an FDB keyed by MAC once lost node 1's own entry with
it), and node 1 stays ready."""

from __future__ import annotations

import http.client
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flannel.kernel.host import Host
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, Lab, ip
from flannel_lab.mesh import start_pings
from tests.lab.test_wireguard_lab import wg
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

ROOT = Path(__file__).resolve().parents[2]
NETWORK = "10.244.0.0/16"
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=10281")
THIEF_IP = "192.168.111.66"  # on the underlay, held by no node: what it draws is lost
SECONDS = 8.0
PREFIX = "flannel.alpha.coreos.com/"


def status(lab: Lab, index: int) -> dict:
    code, body = http_get(lab.node_ns(index), "http://127.0.0.1:10281/status")
    assert code == 200, body
    return json.loads(body)


def ready(lab: Lab, index: int) -> bool:
    return http_get(lab.node_ns(index), "http://127.0.0.1:10281/readyz")[0] == 200


def refused_everywhere(lab: Lab, nodes: list[int], key: str) -> bool:
    return all(status(lab, i)["peers"].get("refused_kinds", {}).get(key) == "identity_taken"
               for i in nodes)


def backend_data(lab: Lab, index: int) -> str:
    """What node ``index`` publishes as its BackendData (from its lease in etcd)."""
    value = json.loads(lab.leases()[lab.lease_key(index)])
    return json.dumps(value["BackendData"], separators=(",", ":"))


def free_key(lab: Lab) -> str:
    """A subnet key no lease holds (etcd mode picks the nodes' subnets by hashing)."""
    taken = set(lab.leases())
    return next(f"10.244.{n}.0-24" for n in range(200, 255) if f"10.244.{n}.0-24" not in taken)


def fdb_dst(lab: Lab, index: int, mac: str) -> set[str]:
    entries = json.loads(subprocess.run(
        ["ip", "netns", "exec", lab.node_ns(index), "bridge", "-j", "fdb", "show", "dev",
         "flannel.1"], capture_output=True, text=True, timeout=10, check=True).stdout)
    return {e.get("dst", "") for e in entries if e.get("mac") == mac}


def known(lab: Lab, index: int) -> int:
    return int(status(lab, index)["peers"]["known"])


def during_and_after(lab: Lab, observers: list[int], claim: Callable[[], None],
                     withdraw: Callable[[], None], check: Callable[[], None]) -> None:
    """Pings from ``observers`` to node 1 while the claim is made, stands and is withdrawn:
    none may be lost; node 1 ready throughout the checks. What ``check`` finds wrong while
    the claim stands is reported after the pings, which are what matters most."""
    before = {i: known(lab, i) for i in (1, *observers)}
    runs = start_pings(lab, [(i, 1) for i in observers], seconds=SECONDS, interval=0.1)
    found: list[AssertionError] = []
    try:
        claim()
        wait_until(lambda: all(known(lab, i) == n + 1 for i, n in before.items()), 20,
                   what="the claim to reach every node")
        try:
            check()
            assert ready(lab, 1), status(lab, 1)["reason"]
        except AssertionError as err:
            found.append(err)
        withdraw()
    finally:
        results = [run.result(SECONDS + 30) for run in runs]
    for (sent, received), observer in zip(results, observers, strict=True):
        assert received == sent, f"node {observer} lost {sent - received} of {sent} pings " \
                                 "to node 1"
    if found:
        raise found[0]
    assert ready(lab, 1)


def test_etcd_a_lease_with_node1s_vtep_mac_steals_nothing(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, {"Network": NETWORK, "Backend": {"Type": "vxlan"}},
                  flanneld_args=HEALTH)
    wait_for_mesh(lab, nodes, ipv6=False)
    data = backend_data(lab, 1)
    mac = json.loads(data)["VtepMAC"]
    key = free_key(lab)
    thief = f"{ETCD_PREFIX}/subnets/{key}"

    def check() -> None:
        wait_until(lambda: refused_everywhere(lab, [1, 2, 3], key), 20,
                   what="the claim refused on every node")
        for index in (2, 3):
            assert fdb_dst(lab, index, mac) == {lab.node(1).address}
        assert f"its IPv4 VtepMAC {mac} is this node's own" in \
            status(lab, 1)["peers"]["refused_reasons"][key]
        assert "belongs to the older lease" in status(lab, 2)["peers"]["refused_reasons"][key]

    during_and_after(
        lab, [2, 3],
        lambda: lab.etcdctl("put", thief, f'{{"PublicIP":"{THIEF_IP}","PublicIPv6":null,'
                                          f'"BackendType":"vxlan","BackendData":{data}}}'),
        lambda: lab.etcdctl("del", thief), check)
    wait_until(lambda: all(status(lab, i)["peers"]["refused"] == 0 for i in nodes), 20,
               what="the refusal gone with the lease")
    for index in (2, 3):  # node 1's entry stayed when the thief's lease went
        assert fdb_dst(lab, index, mac) == {lab.node(1).address}


@pytest.mark.skipif(shutil.which("wireguard-go") is None, reason="needs wireguard-go")
def test_etcd_a_lease_with_node1s_wireguard_key_steals_nothing(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, {"Network": NETWORK, "Backend": {"Type": "wireguard"}},
                  flanneld_args=HEALTH)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=60)
    data = backend_data(lab, 1)
    public_key = json.loads(data)["PublicKey"]
    key = free_key(lab)
    thief = f"{ETCD_PREFIX}/subnets/{key}"
    subnet = lab.lease_key(1).replace("-", "/")

    def check() -> None:
        wait_until(lambda: refused_everywhere(lab, [1, 2, 3], key), 20,
                   what="the claim refused on every node")
        for index in (2, 3):  # node 1's key: node 1's subnet alone, at node 1's address
            peer = [line.split("\t") for line in wg(lab, index, "show", "flannel-wg",
                                                    "dump").splitlines()[1:]
                    if line.startswith(public_key)]
            assert len(peer) == 1 and peer[0][2] == f"{lab.node(1).address}:51820"
            assert peer[0][3] == subnet

    during_and_after(
        lab, [2, 3],
        lambda: lab.etcdctl("put", thief, f'{{"PublicIP":"{THIEF_IP}","PublicIPv6":null,'
                                          f'"BackendType":"wireguard","BackendData":{data}}}'),
        lambda: lab.etcdctl("del", thief), check)


# -- kube mode: the thief is a node editing its own Node's annotations ----------------------

@pytest.fixture
def kube_api(make_lab, tmp_path) -> Iterator[tuple[Lab, Path]]:
    """A lab of three nodes and the API-server double holding node1..node3; node3 runs no
    flanneld: its annotations are the compromised node's to write."""
    lab = make_lab()
    lab.create_underlay()
    for index in (1, 2, 3):
        lab.add_node(index)
    api = subprocess.Popen(
        ["ip", "netns", "exec", lab.underlay_ns, sys.executable, "-m", "tests.support.kubeapi",
         "--host", "192.168.111.1", "--port", "6443",
         *(f"--node=node{i}=10.244.{i}.0/24" for i in (1, 2, 3))],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert api.stdout is not None and api.stdout.readline().startswith("listening")
        yield lab, tmp_path / "net-conf.json"
    finally:
        api.terminate()
        api.wait(timeout=10)


def start_kube_nodes(lab: Lab, conf: Path, backend: str) -> None:
    conf.write_text(json.dumps({"Network": NETWORK, "Backend": {"Type": backend}}))
    for index in (1, 2):
        lab.start_flanneld(index, "--kube-subnet-mgr", "--kube-api-url=http://192.168.111.1:6443",
                           f"--net-config-path={conf}", *HEALTH,
                           env={"NODE_NAME": f"node{index}"})
    for index in (1, 2):
        lab.wait_subnet_env(index)
        lab.attach_pod_bridge(index)
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=60)


def patch_node(lab: Lab, name: str, annotations: dict[str, str | None]) -> None:
    """A strategic-merge patch of ``name``'s status, as that node's own credentials may send
    it (None removes an annotation)."""
    body = json.dumps({"metadata": {"annotations": annotations}})
    with Host(lab.underlay_ns).entered():
        conn = http.client.HTTPConnection("192.168.111.1", 6443, timeout=10)
        conn.connect()
    try:
        conn.request("PATCH", f"/api/v1/nodes/{name}/status", body,
                     {"Content-Type": "application/strategic-merge-patch+json"})
        answer = conn.getresponse()
        assert answer.status == 200, answer.read()
    finally:
        conn.close()


def annotation(lab: Lab, index: int, name: str) -> str:
    """An annotation node ``index``'s flanneld published on its Node."""
    with Host(lab.underlay_ns).entered():
        conn = http.client.HTTPConnection("192.168.111.1", 6443, timeout=10)
        conn.connect()
    try:
        conn.request("GET", f"/api/v1/nodes/node{index}")
        node = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return str(node["metadata"]["annotations"][PREFIX + name])


@pytest.mark.parametrize("backend", ["vxlan", "wireguard"])
def test_kube_a_node_claiming_node1s_identity_steals_nothing(kube_api, backend):
    if backend == "wireguard" and shutil.which("wireguard-go") is None:
        pytest.skip("needs wireguard-go")
    lab, conf = kube_api
    start_kube_nodes(lab, conf, backend)
    data = annotation(lab, 1, "backend-data")
    claim = {PREFIX + "kube-subnet-manager": "true", PREFIX + "backend-type": backend,
             PREFIX + "backend-data": data, PREFIX + "public-ip": THIEF_IP}
    thief_key = "10.244.3.0-24"

    def check() -> None:
        wait_until(lambda: refused_everywhere(lab, [1, 2], thief_key), 20,
                   what="the claim refused on both nodes")
        if backend == "vxlan":
            assert fdb_dst(lab, 2, json.loads(data)["VtepMAC"]) == {lab.node(1).address}

    during_and_after(lab, [2], lambda: patch_node(lab, "node3", claim),
                     lambda: patch_node(lab, "node3", dict.fromkeys(claim)), check)
    assert ip(lab.node_ns(2), "route", "show").stdout.count("10.244.3.0/24") == 0
