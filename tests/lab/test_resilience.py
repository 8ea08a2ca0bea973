"""Restarts (S11), joins and removals (S13, S14), tampering (S15) and clean-up of state left
by peers that went away while flanneld was down, in a vxlan lab."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, in_ns, ip
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}


def state(lab, index: int) -> dict[str, list[str]]:
    """Our routes, neighbours and FDB entries on a node, as sorted text lines."""
    ns = lab.node_ns(index)
    fdb = in_ns(ns, "bridge", "fdb", "show", "dev", "flannel.1", check=False).stdout
    return {
        "routes": sorted(ip(ns, "route", "show", "proto", "151").stdout.splitlines()),
        "neighbours": sorted(ip(ns, "neigh", "show", "proto", "151").stdout.splitlines()),
        "fdb": sorted(line for line in fdb.splitlines() if "self permanent" in line),
    }


def subnet_of(lab, index: int) -> str:
    addr, plen = lab.wait_subnet_env(index)["FLANNEL_SUBNET"].split("/")
    return f"{addr.rsplit('.', 1)[0]}.0/{plen}"


def lease_key(lab, index: int) -> str:
    return subnet_of(lab, index).replace("/", "-")


def snapshots(lab, index: int) -> int:
    return lab.log(index).count("Lease snapshot")


@pytest.fixture
def lab3(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG, flanneld_args=("--reconcile-interval=300",))
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    return lab


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_is_hitless(lab3, sig):
    lab = lab3
    subnet_before, state_before = subnet_of(lab, 1), state(lab, 1)
    log_before = len(lab.log(1))
    pinger = subprocess.Popen(
        ["ip", "netns", "exec", lab.node_ns(2), "ping", "-i", "0.1", "-c", "40", "-W", "1",
         "-I", lab.pod_address(2), lab.pod_address(1)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.5)  # let some pings through before the restart
        code = lab.stop_flanneld(1, sig)
        if sig == signal.SIGTERM:
            assert code == 0
        lab.start_flanneld(1)
        wait_until(lambda: snapshots(lab, 1) == 2, 20, what="the restarted flanneld")
        output, _ = pinger.communicate(timeout=30)
    finally:
        pinger.kill()
    assert " 40 received, 0% packet loss" in output, output
    assert subnet_of(lab, 1) == subnet_before
    assert state(lab, 1) == state_before  # same entries, none duplicated
    # Reusing the device and finding the kernel in sync, the new process changed nothing.
    assert "reconciled:" not in lab.log(1)[log_before:]
    assert "created flannel.1" not in lab.log(1)[log_before:]


def test_join_and_removal_converge(lab3):
    lab = lab3
    lab.add_node(4)
    started = time.monotonic()
    lab.start_flanneld(4)
    new_subnet = subnet_of(lab, 4)
    wait_until(lambda: all(new_subnet in " ".join(state(lab, i)["routes"]) for i in (1, 2, 3)),
               10, what="routes to the new node")
    join_time = time.monotonic() - started
    lab.attach_pod_bridge(4)
    wait_for_mesh(lab, [1, 2, 3, 4], ipv6=False, timeout=10)

    gone = subnet_of(lab, 3)
    gone_ip = lab.node(3).address
    lab.stop_flanneld(3, signal.SIGKILL)
    started = time.monotonic()
    lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{lease_key(lab, 3)}")

    def forgotten() -> bool:
        for i in (1, 2, 4):
            text = json.dumps(state(lab, i))
            if gone in text or gone.split("/")[0] in text or gone_ip in text:
                return False
        return True

    wait_until(forgotten, 10, what="peers to drop the removed node")
    removal_time = time.monotonic() - started
    print(f"\nS13 join converged in {join_time:.3f}s (process start to routes on 3 peers), "
          f"S14 removal in {removal_time:.3f}s")
    assert all(len(state(lab, i)["routes"]) == 2 for i in (1, 2, 4))


def test_tampering_is_repaired_within_a_second(lab3):
    lab = lab3
    ns = lab.node_ns(1)
    peer_subnet = subnet_of(lab, 2)
    peer_base = peer_subnet.split("/")[0]
    healthy = state(lab, 1)

    def repaired_within(seconds: float, what: str) -> None:
        started = time.monotonic()
        wait_until(lambda: state(lab, 1) == healthy, seconds + 1, interval=0.02, what=what)
        took = time.monotonic() - started
        assert took <= seconds, f"{what} took {took:.2f}s"

    ip(ns, "route", "del", peer_subnet)
    repaired_within(1.0, "route restored")
    ip(ns, "neigh", "del", peer_base, "dev", "flannel.1")
    repaired_within(1.0, "neighbour restored")
    peer_mac = next(line.split()[0] for line in healthy["fdb"]
                    if lab.node(2).address in line)
    in_ns(ns, "bridge", "fdb", "del", peer_mac, "dev", "flannel.1", "dst",
          lab.node(2).address, "self")
    repaired_within(1.0, "fdb entry restored")
    ip(ns, "route", "add", "10.244.250.0/24", "via", "10.244.250.0", "dev", "flannel.1",
       "onlink", "proto", "151")
    repaired_within(1.0, "stray route of ours removed")
    lease_mac = json.loads(next(v for v in lab.leases().values()
                                if lab.node(1).address in v))["BackendData"]["VtepMAC"]
    ip(ns, "link", "set", "flannel.1", "address", "02:11:22:33:44:55")
    wait_until(lambda: f"link/ether {lease_mac}" in ip(ns, "link", "show", "flannel.1").stdout,
               2, interval=0.02, what="VTEP MAC restored to the published one")
    ip(ns, "route", "add", "172.31.5.0/24", "via", "192.168.111.1")
    ip(ns, "link", "del", "flannel.1")
    repaired_within(1.0, "vxlan device and its entries restored")
    assert lab.ping(1, 2) and lab.ping(2, 1)
    assert "172.31.5.0/24 via 192.168.111.1" in ip(ns, "route").stdout  # foreign: untouched


def test_state_of_peers_that_left_while_down_is_removed_at_start(lab3):
    lab = lab3
    gone = subnet_of(lab, 3)
    lab.stop_flanneld(1, signal.SIGKILL)
    lab.stop_flanneld(3, signal.SIGKILL)
    lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{lease_key(lab, 3)}")
    assert gone in " ".join(state(lab, 1)["routes"])  # still there while flanneld is down
    lab.start_flanneld(1)
    wait_until(lambda: gone not in json.dumps(state(lab, 1)), 10, what="stale entries removed")
    assert {k: len(v) for k, v in state(lab, 1).items()} == {"routes": 1, "neighbours": 1,
                                                             "fdb": 1}
    assert lab.ping(1, 2)
