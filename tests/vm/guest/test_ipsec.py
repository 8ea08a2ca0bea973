"""ipsec on kernel ESP in one two-node lab: charon negotiates, the kernel carries ESP under Go
flannel's XFRM policies (per peer pair: out, in and fwd, ESP tunnel template between the
public addresses, reqid 11) with Go's proposals, and no kernel-libipsec TUN (``ipsec0``)
exists; pods ping while the underlay carries only IKE and ESP; a flanneld restart keeps the
very same SAs and loses no echo; doctor and check on a healthy node, and with ESP dropped on
the way to a peer; a third node with another PSK is reported by name.

Runs wherever the kernel carries ESP (the vm lane's Debian kernel); elsewhere every scenario
is skipped with the kernel's answer (tests/lab/test_ipsec_lab.py runs the same backend on
kernel-libipsec).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from ipaddress import ip_address

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, in_ns, ip
from tests.support.capture import Capture, ip_packet
from tests.support.ipseclab import (
    CONFIG,
    NETWORK,
    PATTERN,
    PSK_A,
    PSK_B,
    all_established,
    charon_pid,
    ike_sas,
)
from tests.support.kernelpaths import missing_kernel_esp
from tests.support.labcni import install_cni
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

pytest.importorskip("vici", reason="needs the vici package (the ipsec extra)")

IPPROTO_ESP = 50
IKE_PORTS = {500, 4500}
REQID = "11"
# One policy as `ip xfrm policy list` prints it, its template's addresses included.
POLICY = re.compile(
    r"^src (?P<src>\S+) dst (?P<dst>\S+)\s*\n\s+dir (?P<dir>in|out|fwd) .*\n"
    r"\s+tmpl src (?P<tsrc>\S+) dst (?P<tdst>\S+)\s*\n"
    r"\s+proto esp reqid (?P<reqid>\d+) mode (?P<mode>\S+)\s*$", re.MULTILINE)
# One state: its addresses, SPI, reqid and mode, then its lines up to the next state.
STATE = re.compile(r"^src (?P<src>\S+) dst (?P<dst>\S+)\s*\n\s+proto (?P<proto>\S+) spi "
                   r"(?P<spi>\S+) reqid (?P<reqid>\d+) mode (?P<mode>\S+)\s*\n"
                   r"(?P<rest>(?:[ \t]+.*\n?)*)", re.MULTILINE)


@pytest.fixture(scope="module", autouse=True)
def _kernel_with_esp() -> None:
    if reason := missing_kernel_esp():
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(module_labs) -> Iterator[Lab]:
    lab = module_labs()
    build(lab, 2, CONFIG, flanneld_args=MASQ)
    wait_until(lambda: all_established(lab, [1, 2]), 60, interval=0.5,
               what="the IKE SA established")
    wait_for_mesh(lab, [1, 2], ipv6=False, timeout=30)
    for index in (1, 2):
        lab.add_pod(index)
    yield lab
    lab.down()


def pod(lab: Lab, index: int):
    return next(p for p in lab.state.pods if p.node == index)


def subnet(lab: Lab, index: int) -> str:
    return lab.lease_key(index).replace("-", "/")


def policies(lab: Lab, index: int) -> set[tuple[str, ...]]:
    text = ip(lab.node_ns(index), "xfrm", "policy", "list").stdout
    return {(m["dir"], m["src"], m["dst"], m["tsrc"], m["tdst"], m["reqid"], m["mode"])
            for m in POLICY.finditer(text)}


def states(lab: Lab, index: int) -> list[dict[str, str]]:
    text = ip(lab.node_ns(index), "xfrm", "state", "list").stdout
    return [m.groupdict() for m in STATE.finditer(text)]


def test_kernel_esp_under_gos_policies_and_no_libipsec_tun(lab):
    a1, a2 = lab.node(1).address, lab.node(2).address
    s1, s2 = subnet(lab, 1), subnet(lab, 2)
    for index in (1, 2):
        assert "ipsec0" not in ip(lab.node_ns(index), "-br", "link").stdout
        assert "(ESP in the kernel)" in lab.log(index)
    # Go's three policies per pair, exactly, on both ends.
    assert policies(lab, 1) == {("out", s1, s2, a1, a2, REQID, "tunnel"),
                                ("in", s2, s1, a2, a1, REQID, "tunnel"),
                                ("fwd", s2, s1, a2, a1, REQID, "tunnel")}
    assert policies(lab, 2) == {("out", s2, s1, a2, a1, REQID, "tunnel"),
                                ("in", s1, s2, a1, a2, REQID, "tunnel"),
                                ("fwd", s1, s2, a1, a2, REQID, "tunnel")}
    # The kernel's ESP states: a CHILD_SA's two, one each way, Go's ESP proposal (AES-GCM-16,
    # 128-bit key), tunnel mode, reqid 11, no UDP encapsulation (no NAT between the nodes).
    # Both ends initiate (start_action start, as Go's): when they do at once, each
    # initiation leaves a CHILD_SA, so there are one or two pairs.
    found = states(lab, 1)
    pairs = [(s["src"], s["dst"]) for s in found]
    assert set(pairs) == {(a1, a2), (a2, a1)}, found
    assert pairs.count((a1, a2)) == pairs.count((a2, a1)) <= 2, found
    for state in found:
        assert (state["proto"], state["reqid"], state["mode"]) == ("esp", REQID, "tunnel")
        assert re.search(r"aead rfc4106\(gcm\(aes\)\) 0x[0-9a-f]+ 128", state["rest"]), state
        assert "encap" not in state["rest"], state
    # Pods get the external MTU less Go's ESP overhead (77 bytes).
    assert lab.wait_subnet_env(1)["FLANNEL_MTU"] == "1423"


def test_pods_ping_and_the_underlay_carries_only_ike_and_esp(lab):
    underlay = {lab.node(i).address for i in (1, 2)}
    capture = Capture(lab.underlay_ns)
    failed = []
    try:
        for src, dst in ((1, 2), (2, 1)):
            done = in_ns(pod(lab, src).netns, "ping", "-c", "2", "-i", "0.2", "-W", "2",
                         "-p", PATTERN, pod(lab, dst).address, check=False, timeout=30)
            if done.returncode != 0:
                failed.append((src, dst))
    finally:
        frames = capture.stop()
    assert not failed, f"pings failed: {failed}"
    packets = [p for p in map(ip_packet, frames) if p is not None]
    between = [p for p in packets if p[0] in underlay and p[1] in underlay]
    ipsec = [p for p in between if p[2] == IPPROTO_ESP
             or (p[2] == 17 and {p[3], p[4]} <= IKE_PORTS)]
    assert [p for p in ipsec if p[2] == IPPROTO_ESP], between[:5]
    assert between == ipsec, [p for p in between if p not in ipsec][:5]
    in_clear = [p for p in packets if any(ip_address(a) in NETWORK for a in p[:2])]
    assert not in_clear, in_clear[:5]
    assert not [f for f in frames if bytes.fromhex(PATTERN) in f]


def spis(lab: Lab, index: int) -> set[str]:
    return {s["spi"] for s in states(lab, index)}


def test_a_flanneld_restart_keeps_the_sas_and_loses_no_ping(lab):
    before, sa_spis, pid = ike_sas(lab, 1), spis(lab, 1), charon_pid(lab, 1)
    runs = [Pings(pod(lab, 2).netns, pod(lab, 1).address),
            Pings(pod(lab, 1).netns, pod(lab, 2).address)]
    try:
        wait_until(lambda: all(len(r.replied) >= 5 for r in runs), 30, interval=0.2,
                   what="echoes both ways before the restart")
        logged = restart(lab, 1, signal.SIGTERM)
        marks = {r.name: len(r.replied) for r in runs}
        wait_until(lambda: all(len(r.replied) >= marks[r.name] + 20 for r in runs), 30,
                   interval=0.2, what="echoes after the restart")
    finally:
        for run in runs:
            run.stop()
    assert [r.lost for r in runs] == [[], []], [(r.name, r.lost[:20]) for r in runs]
    assert "adopting the running charon" in logged
    assert charon_pid(lab, 1) == pid
    # The very same IKE and CHILD SAs, and the same ESP states in the kernel.
    assert ike_sas(lab, 1) == before
    assert spis(lab, 1) == sa_spis


def test_doctor_and_check_on_a_healthy_node_and_with_esp_dropped(lab, tmp_path,
                                                                 record_property):
    started = time.monotonic()
    cni = install_cni(tmp_path)
    code, findings = doctor(lab, 1, cni, own_run=True)
    assert (code, errors(findings)) == (0, []), findings
    assert not [f for f in findings if f["check"] == "ipsec"], findings
    peer = lab.node(2).address
    code, verdicts = check(lab, 1)
    assert (code, verdicts) == (0, {peer: "ok"})
    with Dropped(lab, 2, "meta", "l4proto", "esp"):
        code, verdicts = check(lab, 1)
        assert (code, verdicts) == (1, {peer: "timeout"})
        # Node 1 blames node 2's carrier (charon answers no stray datagram, so silence on
        # its ports from a host that answers ping is a drop)...
        first_cause(doctor(lab, 1, cni, own_run=True), "encap", f"node {peer} ",
                    "UDP 500, 4500 and IP protocol 50 gets no answer", "a firewall drops it")
        # ... and node 2 names its own rule.
        first_cause(doctor(lab, 2, cni, own_run=True), "firewall", "drops IP protocol 50",
                    f"nftables table inet {TABLE} chain input: meta l4proto esp drop")
    with Dropped(lab, 2, "udp", "dport", "{ 500, 4500 }"):
        # IKE cut while the SAs live: pods' traffic still flows, but no SA can be renewed:
        # node 2 names its rule; node 1's verdict (its data path works) is recorded.
        first_cause(doctor(lab, 2, cni, own_run=True), "firewall", "drops UDP 500",
                    f"nftables table inet {TABLE} chain input: udp dport {{ 500, 4500 }} "
                    "drop")
        record_property("doctor_on_the_peer_with_ike_dropped",
                        doctor(lab, 1, cni, own_run=True))
    lifted = time.monotonic()
    wait_until(lambda: check(lab, 1) == (0, {peer: "ok"}), 60, interval=1,
               what="check to find every peer reached again")
    record_property("seconds_to_the_drop_lifted", round(lifted - started, 1))
    record_property("seconds_to_every_peer_reached_again", round(time.monotonic() - lifted, 1))


def test_a_node_with_another_psk_is_reported_by_name(lab):
    lab.put_config(json.dumps({**CONFIG, "Backend": {"Type": "ipsec", "PSK": PSK_B}}))
    lab.add_node(3)
    lab.start_flanneld(3, *MASQ)
    lab.attach_pod_bridge(3)
    wait_until(lambda: status(lab, 1)["engines"].get("ipsec connections", {}).get(
        "ipsec_peers_failing_authentication") == 1, 90, interval=0.5,
        what="node 1 counting one peer failing authentication")
    subnet3 = subnet(lab, 3)
    assert (f"IKE authentication with peer {lab.node(3).address} (subnet {subnet3}) failed: "
            "its PSK differs from ours") in lab.log(1)
    assert status(lab, 1)["peers"]["refused_reasons"] == {
        lab.lease_key(3): "IKE authentication fails: another PSK"}
    for index in (1, 2, 3):
        assert PSK_A not in lab.log(index) and PSK_B not in lab.log(index)
    # Nodes 1 and 2 still reach each other.
    assert lab.ping(1, 2, within=5) and lab.ping(2, 1, within=5)
