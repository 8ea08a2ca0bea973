"""ipip on a kernel with the ipip module, in one three-node lab with DirectRouting: nodes 1
and 2 share an underlay subnet, node 3 sits on a second, routed one. Pods ping each other:
node 1 reaches node 2's pods directly on eth0 and node 3's through flannel.ipip (IP in IP on
the wire); a flanneld restart loses no echo; a route deleted by hand comes back; doctor and
check on a healthy node, and with IP-in-IP dropped on the way to a peer, which flanneld's own
probes report too; leases flanneld must refuse leave every node ready and every pod pinging.

Runs wherever the kernel creates ipip devices (the vm lane's Debian kernel); elsewhere every
scenario is skipped with the kernel's answer.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from ipaddress import IPv4Network

import pytest

from flannel.probing.sequence import LONGEST
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import ETCD_PREFIX, Lab, in_ns, ip
from tests.support.capture import Capture, ip_packet
from tests.support.kernelpaths import missing_ipip
from tests.support.labcni import install_cni
from tests.support.labnodes import free_key
from tests.support.waiting import wait_until
from tests.vm.guest.helpers import (
    MASQ,
    TABLE,
    Dropped,
    Pings,
    check,
    doctor,
    errors,
    first_cause,
    restart,
    status,
)

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = IPv4Network("10.244.0.0/16")
CONFIG = {"Network": str(NETWORK), "Backend": {"Type": "ipip", "DirectRouting": True}}
PATTERN = "f1a77e1ddeadc0de"
IPPROTO_IPIP = 4
#: Seconds between two probes of a peer: flanneld's default --peer-probe-interval.
PROBE_PERIOD = 30


@pytest.fixture(scope="module", autouse=True)
def _kernel_with_ipip() -> None:
    if reason := missing_ipip():
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(module_labs) -> Iterator[Lab]:
    lab = module_labs()
    nodes = build(lab, 3, CONFIG, second_underlay_from=3, flanneld_args=MASQ)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=30)
    for index in nodes:
        lab.add_pod(index)
    yield lab
    lab.down()


def routes(lab: Lab, index: int) -> dict[str, dict]:
    shown = json.loads(ip(lab.node_ns(index), "-j", "-4", "route", "show", "proto", "151")
                       .stdout or "[]")
    return {route["dst"]: route for route in shown}


def subnet(lab: Lab, index: int) -> str:
    return lab.lease_key(index).replace("-", "/")


def unreachable(lab: Lab, index: int) -> dict[str, str]:
    """Subnet -> cause, of the peers node ``index``'s flanneld lists unreachable."""
    return {item["lease"].replace("-", "/"): item["cause"]
            for item in (status(lab, index).get("probes") or {}).get("listed", [])
            if item["family"] == 4}


def pod(lab: Lab, index: int):
    return next(p for p in lab.state.pods if p.node == index)


def test_pods_ping_directly_on_the_same_subnet_and_through_ipip_to_a_routed_peer(lab):
    capture = Capture(lab.underlay_ns)
    failed = []
    try:
        for src in (1, 2, 3):
            for dst in (1, 2, 3):
                if src != dst:
                    done = in_ns(pod(lab, src).netns, "ping", "-c", "2", "-i", "0.2", "-W",
                                 "2", "-p", PATTERN, pod(lab, dst).address, check=False,
                                 timeout=30)
                    if done.returncode != 0:
                        failed.append((src, dst))
    finally:
        frames = capture.stop()
    assert not failed, f"pods that did not answer: {failed}"
    # Go's routes: a peer on our subnet via its address on eth0, a routed one through the
    # tunnel (onlink: its address is not on flannel.ipip's subnet).
    got = routes(lab, 1)
    assert sorted(got) == sorted([subnet(lab, 2), subnet(lab, 3)])
    same, routed = got[subnet(lab, 2)], got[subnet(lab, 3)]
    assert (same["gateway"], same["dev"]) == (lab.node(2).address, "eth0")
    assert (routed["gateway"], routed["dev"]) == (lab.node(3).address, "flannel.ipip")
    assert "onlink" in routed["flags"]
    shown = json.loads(ip(lab.node_ns(1), "-d", "-j", "link", "show", "flannel.ipip").stdout)[0]
    assert (shown["mtu"], shown["linkinfo"]["info_kind"]) == (1480, "ipip")
    assert lab.wait_subnet_env(1)["FLANNEL_MTU"] == "1480"
    # On the wire: IP in IP between nodes 1 and 3 carrying the pods' addresses inside; the
    # pods' own packets between nodes 1 and 2.
    packets = [p for p in map(ip_packet, frames) if p is not None]
    n1, n2, n3 = (lab.node(i).address for i in (1, 2, 3))
    tunnel = [p for p in packets if {p[0], p[1]} == {n1, n3}]
    assert tunnel and {p[2] for p in tunnel} == {IPPROTO_IPIP}, tunnel[:5]
    # (outer source, outer destination, inner source, inner destination) of IP in IP.
    inner = {(outer[0], outer[1], *carried[:2]) for frame in frames
             if (outer := ip_packet(frame)) is not None and outer[2] == IPPROTO_IPIP
             and (carried := ip_packet(frame[:14] + frame[34:])) is not None}
    p1, p2, p3 = (pod(lab, i).address for i in (1, 2, 3))
    assert {(n1, n3, p1, p3), (n3, n1, p3, p1)} <= inner, sorted(inner)
    direct = [p for p in packets if p[2] == 1 and {p[0], p[1]} == {p1, p2}]
    assert direct, "no pod-to-pod ICMP between nodes 1 and 2 on the underlay"
    assert not [p for p in packets if {p[0], p[1]} == {n1, n2} and p[2] == IPPROTO_IPIP]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_flanneld_restart_loses_no_ping(lab, sig):
    runs = [Pings(pod(lab, 1).netns, pod(lab, 3).address),  # through the tunnel
            Pings(pod(lab, 2).netns, pod(lab, 1).address)]  # directly
    try:
        wait_until(lambda: all(len(r.replied) >= 5 for r in runs), 30, interval=0.2,
                   what="echoes on both paths before the restart")
        logged = restart(lab, 1, sig)
        before = {r.name: len(r.replied) for r in runs}
        wait_until(lambda: all(len(r.replied) >= before[r.name] + 20 for r in runs), 30,
                   interval=0.2, what="echoes after the restart")
    finally:
        for run in runs:
            run.stop()
    assert [r.lost for r in runs] == [[], []], [(r.name, r.lost[:20]) for r in runs]
    # The restarted flanneld found its routes in place: it changed nothing.
    assert status(lab, 1)["dataplane"]["applied"] == {}, logged[-2000:]


def test_a_deleted_route_comes_back(lab):
    peer = subnet(lab, 3)
    ip(lab.node_ns(1), "route", "del", peer)
    wait_until(lambda: peer in routes(lab, 1), 15, what="the deleted route to come back")
    assert routes(lab, 1)[peer]["dev"] == "flannel.ipip"
    assert lab.pod_ping(pod(lab, 1), pod(lab, 3).address, within=5)


def test_doctor_and_check_on_a_healthy_node_and_with_ip_in_ip_dropped(lab, tmp_path,
                                                                      record_property):
    started = time.monotonic()
    cni = install_cni(tmp_path)
    code, findings = doctor(lab, 1, cni)
    assert (code, errors(findings)) == (0, []), findings
    code, verdicts = check(lab, 1)
    n2, n3 = lab.node(2).address, lab.node(3).address
    assert (code, verdicts) == (0, {n2: "ok", n3: "ok"})
    # Node 3 drops IP in IP: node 1 reaches node 2 (direct) and not node 3 (tunnelled).
    with Dropped(lab, 3, "meta", "l4proto", str(IPPROTO_IPIP)):
        code, verdicts = check(lab, 1)
        assert (code, verdicts) == (1, {n2: "ok", n3: "timeout"})
        # Node 1 blames node 3, and says why it cannot tell more: IP-in-IP has no port.
        first_cause(doctor(lab, 1, cni), "overlay", f"node {n3} ", "does not answer over "
                    "the overlay", "IP-in-IP is not checked")
        # Node 3 names its own rule.
        first_cause(doctor(lab, 3, cni), "firewall", "drops IP protocol 4 (IP-in-IP",
                    f"nftables table inet {TABLE} chain input: meta l4proto ipencap drop")
        # Node 1's flanneld found it too, by its own probes: node 3 answers on the underlay,
        # not through the tunnel, and IP-in-IP has no port to tell more. Within 2 probe
        # periods (the default interval; 2 peers) and one probe's longest run.
        wait_until(lambda: unreachable(lab, 1) == {subnet(lab, 3): "overlay_down"},
                   2 * PROBE_PERIOD + LONGEST + 5, interval=1,
                   what="node 1's flanneld listing node 3 unreachable (overlay_down)")
    lifted = time.monotonic()
    wait_until(lambda: check(lab, 1) == (0, {n2: "ok", n3: "ok"}), 60, interval=1,
               what="check to find every peer reached again")
    wait_until(lambda: unreachable(lab, 1) == {}, PROBE_PERIOD + LONGEST + 5, interval=1,
               what="node 1's flanneld reaching node 3 again")
    record_property("seconds_to_the_drop_lifted", round(lifted - started, 1))
    record_property("seconds_to_every_peer_reached_again", round(time.monotonic() - lifted, 1))


def test_bad_leases_leave_every_node_ready_and_every_pod_pinging(lab):
    """A bad peer is the bad peer's problem on ipip too: leases whose public IP lies inside the
    Network, is node 1's own address, or is a loopback or multicast address are listed with
    their reason by every node they concern (the one naming node 1's address only by node 1;
    the others take it as a peer at that address), no node turns unready or fails a pass, and
    pods keep pinging through the tunnel and directly; deleted, they are forgotten."""
    bad = {}
    for public_ip in ("10.244.250.7", lab.node(1).address, "127.0.0.5", "224.0.0.9"):
        key = free_key(lab)
        bad[key] = public_ip
        lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/{key}",
                    json.dumps({"PublicIP": public_ip, "BackendType": "ipip"}))
    own = {key for key, public_ip in bad.items() if public_ip == lab.node(1).address}

    def listed(index: int) -> set[str]:
        peers = status(lab, index)["peers"]
        return set(peers["skipped_reasons"]) | set(peers["refused_reasons"])

    runs = [Pings(pod(lab, 1).netns, pod(lab, 3).address),  # through the tunnel
            Pings(pod(lab, 2).netns, pod(lab, 1).address)]  # directly
    try:
        for index in (1, 2, 3):
            expected = set(bad) if index == 1 else set(bad) - own
            wait_until(lambda i=index, e=expected: e <= listed(i), 30, interval=0.5,
                       what=f"node {index} to list the bad leases")
        before = {r.name: len(r.replied) for r in runs}
        wait_until(lambda: all(len(r.replied) >= before[r.name] + 10 for r in runs), 30,
                   interval=0.2, what="echoes with the bad leases in the store")
    finally:
        for run in runs:
            run.stop()
    assert [r.lost for r in runs] == [[], []], [(r.name, r.lost[:20]) for r in runs]
    for index in (1, 2, 3):
        doc = status(lab, index)
        assert doc["ready"], doc["reason"]
        assert doc["dataplane"]["failed_passes"] == 0, doc["dataplane"]
        # Node 1's good peers are nodes 2 and 3; the others also take the lease at node 1's
        # address as a peer.
        assert doc["peers"]["programmed"] == (2 if index == 1 else 3), doc["peers"]
    for key in bad:
        lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{key}")
    wait_until(lambda: all(not set(bad) & listed(i) for i in (1, 2, 3)), 30, interval=0.5,
               what="the bad leases forgotten")
