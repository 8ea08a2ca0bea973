"""Kernel WireGuard in one dual-stack two-node lab: flanneld makes kernel ``wireguard``
devices and runs no wireguard-go; pods ping over IPv4 and IPv6 while the underlay carries
nothing but WireGuard; a flanneld restart loses no echo; a node's key changed (its key file
gone, flanneld restarted) reaches the peer, which replaces it, and loses no echo either;
doctor and check on a healthy node, and with WireGuard's port dropped on the way to a peer.

Runs wherever the kernel has WireGuard (the vm lane's Debian kernel); elsewhere every
scenario is skipped with the kernel's answer (tests/lab/test_wireguard_lab.py runs the same
backend on wireguard-go).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import Lab, in_ns, ip
from tests.support.capture import Capture
from tests.support.kernelpaths import missing_kernel_wireguard
from tests.support.labcni import install_cni
from tests.support.waiting import wait_until
from tests.support.wglab import (
    DUAL,
    PATTERN,
    assert_only_wireguard_between,
)
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


@pytest.fixture(scope="module", autouse=True)
def _kernel_with_wireguard() -> None:
    if reason := missing_kernel_wireguard():
        pytest.skip(reason)


@pytest.fixture(scope="module")
def lab(module_labs) -> Iterator[Lab]:
    lab = module_labs()
    nodes = build(lab, 2, DUAL, flanneld_args=MASQ)
    wait_for_mesh(lab, nodes, ipv6=True, timeout=30)
    for index in nodes:
        lab.add_pod(index)
    yield lab
    lab.down()


def wg_dump(lab: Lab, index: int, device: str = "flannel-wg") -> dict[str, dict[str, str]]:
    """A kernel device's peers as ``wg show dump`` lists them: public key -> endpoint,
    allowed IPs, preshared key (a kernel device needs no /run of the node's)."""
    out = in_ns(lab.node_ns(index), "wg", "show", device, "dump").stdout
    peers = {}
    for line in out.splitlines()[1:]:
        key, psk, endpoint, allowed, *_ = line.split("\t")
        peers[key] = {"endpoint": endpoint, "allowed": allowed, "psk": psk}
    return peers


def public_key(lab: Lab, index: int) -> str:
    return in_ns(lab.node_ns(index), "wg", "show", "flannel-wg", "public-key").stdout.strip()


def processes_named(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/comm") as file:
                if entry.isdigit() and file.read().strip() == name:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def pod(lab: Lab, index: int):
    return next(p for p in lab.state.pods if p.node == index)


def test_flanneld_makes_kernel_devices_and_runs_no_wireguard_go(lab):
    for index in (1, 2):
        for device in ("flannel-wg", "flannel-wg-v6"):
            shown = json.loads(ip(lab.node_ns(index), "-d", "-j", "link", "show", device)
                               .stdout)[0]
            assert shown["linkinfo"]["info_kind"] == "wireguard", shown
        assert "using kernel WireGuard" in lab.log(index)
    assert processes_named("wireguard-go") == []


def test_dual_stack_pods_ping_and_the_underlay_carries_only_wireguard(lab):
    nodes = [lab.node(i) for i in (1, 2)]
    underlay = {n.address for n in nodes} | {n.address6 for n in nodes}
    capture = Capture(lab.underlay_ns)
    failed = []
    try:
        for src, dst in ((1, 2), (2, 1)):
            for target in (pod(lab, dst).address, pod(lab, dst).address6):
                done = in_ns(pod(lab, src).netns, "ping", "-c", "2", "-i", "0.2", "-W", "2",
                             "-p", PATTERN, target, check=False, timeout=30)
                if done.returncode != 0:
                    failed.append((src, target))
    finally:
        frames = capture.stop()
    assert not failed, f"pings failed: {failed}"
    assert_only_wireguard_between(frames, underlay)
    # Peers as Go sets them: endpoint, allowed IPs, no PSK; keys as the leases publish.
    leases = lab.leases()
    for index, other in ((1, 2), (2, 1)):
        value = leases[next(k for k in leases if k.startswith(lab.lease_key(other) + "&"))]
        key = public_key(lab, other)
        assert f'"BackendData":{{"PublicKey":"{key}","Port":51820}}' in value, value
        v4, v6 = wg_dump(lab, index), wg_dump(lab, index, "flannel-wg-v6")
        assert {k: (p["endpoint"], p["psk"]) for k, p in v4.items()} == {
            key: (f"{lab.node(other).address}:51820", "(none)")}
        assert {k: p["endpoint"] for k, p in v6.items()} == {
            key: f"[{lab.node(other).address6}]:51821"}


def pings_both_ways(lab: Lab, interval: float = 0.1) -> list[Pings]:
    return [Pings(pod(lab, 2).netns, pod(lab, 1).address, interval=interval),
            Pings(pod(lab, 1).netns, pod(lab, 2).address6, interval=interval)]


def test_a_flanneld_restart_adopts_the_devices_and_loses_no_ping(lab):
    runs = pings_both_ways(lab)
    try:
        wait_until(lambda: all(len(r.replied) >= 5 for r in runs), 30, interval=0.2,
                   what="echoes both ways before the restart")
        logged = restart(lab, 1, signal.SIGTERM)
        before = {r.name: len(r.replied) for r in runs}
        wait_until(lambda: all(len(r.replied) >= before[r.name] + 20 for r in runs), 30,
                   interval=0.2, what="echoes after the restart")
    finally:
        for run in runs:
            run.stop()
    assert [r.lost for r in runs] == [[], []], [(r.name, r.lost[:20]) for r in runs]
    assert "adopting the existing kernel WireGuard device" in logged
    assert "add peer" not in logged and "using WireGuard private key" in logged
    assert processes_named("wireguard-go") == []


def test_a_changed_key_reaches_the_peer_and_loses_no_ping(lab, record_property):
    old = public_key(lab, 1)
    lab.stop_flanneld(1)
    (lab.node_run_dir(1) / "flannel" / "wgkey").unlink()
    # Echoes every 0.2 s: while a handshake is pending, WireGuard holds up to 128 packets
    # per peer, 25 s of them, and sends them once it completes.
    runs = pings_both_ways(lab, interval=0.2)
    try:
        started = time.monotonic()
        lab.start_flanneld(1)
        wait_until(lambda: public_key(lab, 1) != old, 60, interval=0.5,
                   what="node 1's device to take its new key")
        new = public_key(lab, 1)
        # Node 2 replaces the peer: the new key, none of the old one, the same endpoint.
        wait_until(lambda: set(wg_dump(lab, 2)) == {new}, 60, interval=0.5,
                   what="node 2 to replace node 1's key")
        before = {r.name: len(r.replied) for r in runs}
        wait_until(lambda: all(len(r.replied) >= before[r.name] + 20 for r in runs), 60,
                   interval=0.2, what="echoes both ways with the new key")
        resumed = time.monotonic() - started
    finally:
        for run in runs:
            run.stop()
    assert wg_dump(lab, 2)[new]["endpoint"] == f"{lab.node(1).address}:51820"
    assert set(wg_dump(lab, 2, "flannel-wg-v6")) == {new}
    assert "created WireGuard private key" in lab.log(1)
    # Until the peer has the new key no session can be made: the echoes wait, none is lost.
    assert [r.lost for r in runs] == [[], []], [(r.name, r.lost[:20]) for r in runs]
    record_property("key_change_seconds_to_resume", round(resumed, 1))


def test_doctor_and_check_on_a_healthy_node_and_with_wireguards_port_dropped(lab, tmp_path):
    wait_until(lambda: status(lab, 1)["ready"], 30, what="node 1 ready")
    cni = install_cni(tmp_path)
    code, findings = doctor(lab, 1, cni)
    assert (code, errors(findings)) == (0, []), findings
    code, verdicts = check(lab, 1)
    # The lab is dual-stack: check probes the peer on each family's address.
    peer, peer6 = lab.node(2).address, lab.node(2).address6
    assert (code, verdicts) == (0, {peer: "ok", peer6: "ok"})
    with Dropped(lab, 2, "udp", "dport", "{ 51820, 51821 }"):
        code, verdicts = check(lab, 1)
        assert (code, verdicts) == (1, {peer: "timeout", peer6: "timeout"})
        # Node 1 blames node 2's port (the kernel device answers no stray datagram, so
        # silence from a host that answers ping is a drop)...
        first_cause(doctor(lab, 1, cni), "encap", f"node {peer} ", "UDP 51820",
                    "a firewall drops it")
        # ... and node 2 names its own rule.
        first_cause(doctor(lab, 2, cni), "firewall", "drops UDP 51820",
                    f"nftables table inet {TABLE} chain input: udp dport {{ 51820, 51821 }} "
                    "drop")
    wait_until(lambda: check(lab, 1) == (0, {peer: "ok", peer6: "ok"}), 60, interval=1,
               what="check to find every peer reached again")
