"""A wiped or restored etcd under a running vxlan lab: every node puts its own lease back,
no subnet is handed out twice, readiness says what happened, and traffic never stops."""

from __future__ import annotations

import subprocess
import time

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=8081")
NODES = (1, 2, 3)


def readyz(lab, index: int) -> tuple[int, str]:
    return http_get(lab.node_ns(index), "http://127.0.0.1:8081/readyz")


@pytest.fixture
def lab3(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG, flanneld_args=("--reconcile-interval=300", *HEALTH))
    wait_for_mesh(lab, nodes, ipv6=False, timeout=20)
    wait_until(lambda: all(readyz(lab, i)[0] == 200 for i in NODES), 20, what="ready")
    return lab


def start_pinging(lab, src: int, dst: int, count: int) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.node_ns(src), "ping", "-i", "0.2", "-c", str(count),
         "-W", "1", "-I", lab.pod_address(src), lab.pod_address(dst)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def values_by_ip(leases: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Public IP -> (key, value) of every lease."""
    return {value.split('"PublicIP":"')[1].split('"')[0]: (key, value)
            for key, value in leases.items()}


def recovered_everywhere(lab, log_marks: dict[int, int]) -> None:
    for index in NODES:
        wait_until(lambda i=index: "Recovered from the etcd reset" in lab.log(i)[log_marks[i]:],
                   20, what=f"node {index} to recover:\n{lab.log(index)}")


@pytest.mark.parametrize("how", ["wipe", "restore"])
def test_reset_etcd_gets_every_lease_back_without_a_lost_ping(lab3, how, tmp_path):
    lab = lab3
    before = values_by_ip(lab.leases())
    assert len(before) == 3
    marks = {i: len(lab.log(i)) for i in NODES}
    if how == "restore":
        # A backup older than the nodes' view: nodes came and went since it was taken. (With
        # fewer changes since the backup than the nodes write while recovering, a node whose
        # own key is intact may see no sign of the restore; its lease is then intact too.)
        backup = tmp_path / "backup.db"
        lab.etcd.ctl("snapshot", "save", str(backup))
        for third in range(240, 250):
            lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/10.244.{third}.0-24",
                        '{"PublicIP":"192.168.111.99","PublicIPv6":null}')
            lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/10.244.{third}.0-24")
    pingers = [start_pinging(lab, 2, 1, 60), start_pinging(lab, 3, 2, 60)]
    try:
        time.sleep(1.0)  # some pings before the reset, the rest through and after it
        started = time.monotonic()
        if how == "wipe":
            lab.etcd.wipe()
            lab.put_config(CONFIG)
        else:
            lab.etcd.restore(backup)
        wait_until(lambda: values_by_ip(lab.leases()) == before, 10,
                   what=f"every node's own lease back:\n{lab.leases()}")
        took = time.monotonic() - started
        recovered_everywhere(lab, marks)
        for index in NODES:
            log = lab.log(index)[marks[index]:]
            assert "etcd was wiped or restored from an older backup: the etcd revision went " \
                   "back from" in log, log
            wait_until(lambda i=index: readyz(lab, i) == (200, "flanneld is ready\n"), 20,
                       what=f"node {index} ready again")
        outputs = [p.communicate(timeout=30)[0] for p in pingers]
    finally:
        for pinger in pingers:
            pinger.kill()
    for output in outputs:
        assert " 60 received, 0% packet loss" in output, output
    print(f"\netcd {how}: own leases back in {took:.2f}s")

    # A node that joins now gets a subnet nobody uses, and everyone reaches everyone.
    lab.add_node(4)
    lab.start_flanneld(4, "--reconcile-interval=300", *HEALTH)
    lab.attach_pod_bridge(4)
    leases = lab.leases()
    assert len(leases) == 4 and len({key.split("-")[0] for key in leases}) == 4
    wait_for_mesh(lab, [1, 2, 3, 4], ipv6=False, timeout=20)
