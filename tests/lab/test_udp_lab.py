"""The udp backend in the lab: three nodes, pods through the CNI plugin, every pod reaching
every other, 100 MB arriving intact, a node joining and leaving, the TUN tampered with by
hand and repaired, the forwarder killed and restarted, flanneld restarted (the outage in
pings lost at 100 ms), and a vxlan node in a udp network named as unreachable."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flannel_lab.cli import build, ping_table, wait_for_mesh
from flannel_lab.cluster import Lab, in_ns, ip
from flannel_lab.mesh import start_pings
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = "10.244.0.0/16"
CONFIG = {"Network": NETWORK, "Backend": {"Type": "udp"}}
HEALTH = ("--healthz-ip=127.0.0.1", "--healthz-port=10280")
TRANSFER = 100 * 1024 * 1024
PORT = 5201

# Sends TRANSFER bytes of random data; prints their SHA-256.
CLIENT = """
import hashlib, os, socket, sys
digest, left = hashlib.sha256(), int(sys.argv[3])
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as conn:
    while left:
        chunk = os.urandom(min(left, 1 << 16))
        digest.update(chunk)
        conn.sendall(chunk)
        left -= len(chunk)
print(digest.hexdigest())
"""
# Accepts one connection; prints the byte count and SHA-256 of what arrived.
SERVER = """
import hashlib, socket, sys
digest, total = hashlib.sha256(), 0
with socket.create_server((sys.argv[1], int(sys.argv[2]))) as server:
    server.settimeout(60)
    print("listening", flush=True)
    conn, _ = server.accept()
    conn.settimeout(60)
    while chunk := conn.recv(1 << 16):
        digest.update(chunk)
        total += len(chunk)
print(total, digest.hexdigest())
"""
# One UDP datagram; prints the error the kernel reports for it (IP_RECVERR), if any.
UDP_PROBE = """
import os, socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.IPPROTO_IP, 11, 1)  # IP_RECVERR
sock.bind((sys.argv[1], 0))
sock.connect((sys.argv[2], 9))
sock.settimeout(1.0)
sock.send(b"probe")
try:
    sock.recv(100)
except OSError as err:
    print(os.strerror(err.errno) if err.errno else "no answer")
"""


def tun(lab: Lab, index: int) -> dict:
    shown = json.loads(ip(lab.node_ns(index), "-j", "-d", "link", "show", "flannel0",
                          check=False).stdout or "[]")
    return shown[0] if shown else {}


def network_route(lab: Lab, index: int) -> str:
    return ip(lab.node_ns(index), "route", "show", NETWORK).stdout.strip()


def tun_address(lab: Lab, index: int) -> str:
    """The address flanneld gives node ``index``'s TUN: its subnet's first, as a /32."""
    base = lab.wait_subnet_env(index)["FLANNEL_SUBNET"].split("/")[0].rsplit(".", 1)[0] + ".0"
    return f"{base}/32"


def tun_healthy(lab: Lab, index: int) -> bool:
    link = tun(lab, index)
    addresses = ip(lab.node_ns(index), "-4", "addr", "show", "dev", "flannel0",
                   check=False).stdout
    return (link.get("mtu") == 1472 and "UP" in link.get("flags", [])
            and "LOWER_UP" in link.get("flags", [])
            and f"inet {tun_address(lab, index)}" in addresses
            and "dev flannel0" in network_route(lab, index))


def forwarders(lab: Lab, index: int) -> list[int]:
    """The forwarder processes of node ``index``'s flanneld (children of any of its
    threads)."""
    pid = lab.node(index).pid
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"flannel.udp.worker" in cmdline:
                found.append(int(child))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def udp_lab(make_lab):
    lab = make_lab()
    nodes = build(lab, 3, CONFIG, flanneld_args=HEALTH)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=30)
    return lab


def forwarder_metrics(lab: Lab, index: int) -> dict[str, float]:
    """The udp forwarder's figures on the node's /metrics, by sample name."""
    result = in_ns(lab.node_ns(index), sys.executable, "-c",
                   "import urllib.request; print(urllib.request.urlopen("
                   "'http://127.0.0.1:10280/metrics', timeout=5).read().decode())")
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^flannel_engine_(udp_\w+)\{engine="udp forwarder"\} (\S+)$', result.stdout, re.M)}


def transfer(lab: Lab, server_pod, client_pod) -> tuple[str, str]:
    """100 MB from ``client_pod`` to ``server_pod``: (what the client sent, what the server
    received), each as "<bytes> <sha256>"."""
    server = subprocess.Popen(["ip", "netns", "exec", server_pod.netns, sys.executable, "-c",
                               SERVER, server_pod.address, str(PORT)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        client = in_ns(client_pod.netns, sys.executable, "-c", CLIENT, server_pod.address,
                       str(PORT), str(TRANSFER), timeout=180)
        received, err = server.communicate(timeout=60)
        assert server.returncode == 0, err
    finally:
        server.kill()
        server.communicate()
    return f"{TRANSFER} {client.stdout.strip()}", received.strip()


def test_three_udp_nodes_carry_pod_traffic_intact_and_repair_their_tun(udp_lab):
    lab = udp_lab
    for index in (1, 2, 3):
        env = lab.wait_subnet_env(index)
        assert env["FLANNEL_MTU"] == "1472"
        assert tun_healthy(lab, index), (tun(lab, index), network_route(lab, index))
    for key, value in lab.leases().items():  # as Go's udp publishes: PublicIP only
        assert set(json.loads(value)) == {"PublicIP", "PublicIPv6"}, (key, value)
        assert json.loads(value)["PublicIPv6"] is None

    pods = [lab.add_pod(index) for index in (1, 2, 3)]
    table, all_ok = ping_table(lab)
    assert all_ok, table

    sent, received = transfer(lab, pods[2], pods[0])
    assert received == sent

    ns2 = lab.node_ns(2)
    repairs = {}
    for what, command in (("TUN deleted", ["link", "del", "flannel0"]),
                          ("MTU changed", ["link", "set", "flannel0", "mtu", "1400"]),
                          ("route removed", ["route", "del", NETWORK, "dev", "flannel0"]),
                          # One address deleted, not a flush: flanneld puts it back
                          # between the rounds of a flush, which then reports itself
                          # incomplete.
                          ("address removed", ["addr", "del", tun_address(lab, 2), "dev",
                                               "flannel0"])):
        ip(ns2, *command)
        started = time.monotonic()
        wait_until(lambda: tun_healthy(lab, 2), 10, interval=0.02, what=f"{what}: repaired")
        repairs[what] = time.monotonic() - started
        wait_until(lambda: lab.ping(1, 2) and lab.ping(2, 3), 10, what=f"{what}: pings")
        # Each tamper is its own repair, logged once, only after the last one is done.
        wait_until(lambda: http_get(ns2, "http://127.0.0.1:10280/readyz")[0] == 200, 10,
                   what=f"{what}: node 2 ready again")
    print("\nudp TUN repair times: " + ", ".join(f"{k} {v * 1000:.0f} ms"
                                                 for k, v in repairs.items()))
    # The repairs ran passes on node 2, which read the forwarder's counters for /metrics.
    figures = forwarder_metrics(lab, 2)
    assert figures["udp_peers"] == 2, figures
    assert figures["udp_rx_packets_total"] > 0 and figures["udp_tx_packets_total"] > 0, figures
    log = lab.log(2)
    # A deleted device is first reported down, then gone.
    assert "kernel drifted from desired state (device flannel0 down); repairing" in log
    assert "udp device: flannel0 was missing: created" in log
    assert "kernel drifted from desired state (device flannel0 MTU changed to 1400 (want " \
           "1472)); repairing" in log
    assert f"kernel drifted from desired state (route {NETWORK} deleted); repairing" in log
    assert "udp device: flannel0 MTU was 1400: set to 1472" in log

    # The forwarder dies: flanneld notices (the TUN loses its carrier) and restarts it.
    [worker] = forwarders(lab, 3)
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: [p for p in forwarders(lab, 3) if p != worker], 10,
               what="a new forwarder")
    wait_until(lambda: lab.ping(1, 3) and lab.ping(3, 2), 10, what="pings after restart")
    assert "udp forwarder killed by SIGKILL; restarting it" in lab.log(3)


def test_nodes_join_and_leave_and_a_restart_costs_a_measured_outage(udp_lab):
    lab = udp_lab
    lab.add_node(4)
    lab.start_flanneld(4)
    lab.attach_pod_bridge(4)
    wait_for_mesh(lab, [1, 2, 3, 4], ipv6=False, timeout=30)
    gone = lab.pod_address(4)
    lab.remove_node(4)

    def unreachable() -> bool:
        # ICMP is never answered with ICMP: a UDP datagram shows the forwarder's reply.
        out = in_ns(lab.node_ns(1), sys.executable, "-c", UDP_PROBE, lab.pod_address(1), gone,
                    check=False).stdout
        return out.strip() == "Network is unreachable"
    wait_until(unreachable, 10, what="the departed node's subnet answered as unreachable")
    assert lab.ping(1, 2) and lab.ping(3, 1)

    [old_worker] = forwarders(lab, 2)
    [run] = start_pings(lab, [(1, 2)], seconds=40, interval=0.1)
    try:
        wait_until(lambda: lab.ping(1, 2), 5, what="traffic before the restart")
        assert lab.stop_flanneld(2) == 0
        assert not alive(old_worker), "the forwarder outlived flanneld"
        lab.start_flanneld(2)
        wait_until(lambda: lab.ping(1, 2, timeout=0.5), 30, interval=0.01,
                   what="traffic after the restart")
        sent, received = run.stop()
    finally:
        run.proc.kill()
    lost = sent - received
    print(f"\nudp flanneld restart: {lost} of {sent} pings lost at 100 ms "
          f"(~{lost * 100} ms outage)")
    assert sent > 0 and lost < sent
    assert re.search(r"udp forwarder started \(pid \d+\)", lab.log(2))


def test_a_vxlan_node_in_a_udp_network_is_named_as_unreachable(make_lab):
    lab = make_lab()
    build(lab, 1, CONFIG)
    lab.put_config({"Network": NETWORK, "Backend": {"Type": "vxlan"}})
    lab.add_node(2)
    lab.start_flanneld(2)
    lab.attach_pod_bridge(2)
    udp_key, vxlan_key = lab.lease_key(1), lab.lease_key(2)
    wait_until(lambda: f"ignoring lease {vxlan_key} (public IP {lab.node(2).address}): its "
               "node runs the vxlan backend, which this node's udp backend cannot reach"
               in lab.log(1), 15, what="the udp node naming the vxlan lease")
    wait_until(lambda: f"ignoring lease {udp_key} (public IP {lab.node(1).address}): its "
               "node runs the udp or alloc (no BackendType) backend, which this node's vxlan "
               "backend cannot reach" in lab.log(2), 15, what="the vxlan node naming it")
    assert not lab.ping(1, 2) and not lab.ping(2, 1)
