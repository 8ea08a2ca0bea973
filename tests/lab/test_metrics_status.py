"""/metrics and ``flannelctl status`` of real flanneld nodes (vxlan, real etcd, namespaces).

The metrics are scraped from inside a node's namespace and parsed by Prometheus' own text
parser; each family is made to move by what moves it in production: a node joining, a route
deleted by hand, lease renewals, traffic rules flushed, etcd restarted. ``status --json`` is
compared with the kernel (routes on flannel.1, the device's MAC) and subnet.env; another
node is refused /status but may scrape /metrics.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.cluster import in_ns
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
CONFIG = {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}
HEALTH = "http://127.0.0.1:8081"
# A 62 s lease with the shortest margin (1 min) is renewed every ~2 s; rules every second.
# The health server listens on every address (the default --healthz-ip), as deployed.
ARGS = ("--reconcile-interval=300", "--healthz-port=8081", "--subnet-lease-ttl=62s",
        "--subnet-lease-renew-margin=1", "--iptables-resync=1")


def scrape(lab, index: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = http_get(lab.node_ns(index), f"{HEALTH}/metrics")
    assert code == 200, body
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def metric(lab, index: int, name: str, **labels: str) -> float | None:
    return scrape(lab, index).get((name, tuple(sorted(labels.items()))))


def wait_metric(lab, index: int, name: str, at_least: float, **labels: str) -> None:
    wait_until(lambda: (metric(lab, index, name, **labels) or 0) >= at_least, 20,
               what=f"{name}{labels} >= {at_least} on node {index}")


def status(lab, index: int) -> dict:
    result = subprocess.run(["ip", "netns", "exec", lab.node_ns(index), FLANNELCTL, "status",
                             "--json", f"--health-url={HEALTH}"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.stderr == "", result.stderr
    assert result.returncode in (0, 1), result
    return json.loads(result.stdout)


def peer_routes(lab, index: int) -> list[str]:
    shown = json.loads(in_ns(lab.node_ns(index), "ip", "-j", "route", "show", "dev",
                             "flannel.1").stdout)
    network = ipaddress.ip_network(CONFIG["Network"])
    return sorted(r["dst"] for r in shown
                  if "/" in r["dst"] and ipaddress.ip_network(r["dst"]).subnet_of(network))


def test_metrics_and_status_follow_the_node(make_lab):
    lab = make_lab()
    nodes = build(lab, 2, CONFIG, flanneld_args=ARGS)
    wait_for_mesh(lab, nodes, ipv6=False, timeout=30)
    ns = lab.node_ns(1)

    first = scrape(lab, 1)
    subnet = lab.wait_subnet_env(1)["FLANNEL_SUBNET"]
    own = str(ipaddress.ip_network(subnet, strict=False))
    assert first[("flannel_lease_info", (("backend", "vxlan"), ("ipv6_subnet", ""),
                                         ("store", "etcd"), ("subnet", own)))] == 1
    assert 0 < first[("flannel_lease_remaining_seconds", ())] <= 62
    assert first[("flannel_peers_known", ())] == first[("flannel_peers_programmed", ())] == 1
    assert first[("flannel_ready", ())] == 1
    assert first[("flannel_store_watch_connected", ())] == 1
    assert first[("flannel_store_relists_total", ())] >= 1
    for kind in ("route", "neighbour", "fdb"):
        assert first[("flannel_reconcile_changes_total", (("kind", kind),))] >= 1, kind

    # status --json says what the kernel and subnet.env hold.
    doc = status(lab, 1)
    link = json.loads(in_ns(ns, "ip", "-j", "link", "show", "flannel.1").stdout)[0]
    assert doc["ready"] is True and doc["last_errors"] == []
    assert doc["lease"]["subnet"] == own
    assert doc["lease"]["public_ip"] == lab.node(1).address
    assert 0 < doc["lease"]["expires_in_seconds"] <= 62
    assert doc["devices"] == [{"name": "flannel.1", "mtu": link["mtu"],
                               "mac": link["address"]}]
    assert doc["peers"]["programmed"] == len(peer_routes(lab, 1)) == 1
    assert doc["network"]["backend"] == "vxlan" and doc["store"]["kind"] == "etcd"

    # /status is for this host only (also through its own address); /metrics for anyone.
    node1 = f"http://{lab.node(1).address}:8081"
    assert http_get(ns, f"{node1}/status")[0] == 200
    assert http_get(lab.node_ns(2), f"{node1}/status") == (
        403, "/status answers clients on this host only: run flannelctl status on the node\n")
    assert http_get(lab.node_ns(2), f"{node1}/metrics")[0] == 200

    # A node joins: peers and changes move, and status still matches the kernel.
    routes_before = first[("flannel_reconcile_changes_total", (("kind", "route"),))]
    lab.add_node(3)
    lab.start_flanneld(3, *ARGS)
    wait_metric(lab, 1, "flannel_peers_programmed", 2)
    joined = scrape(lab, 1)
    assert joined[("flannel_peers_known", ())] == 2
    assert joined[("flannel_reconcile_changes_total", (("kind", "route"),))] > routes_before
    assert status(lab, 1)["peers"]["programmed"] == len(peer_routes(lab, 1)) == 2

    # Drift made by hand is repaired and counted.
    victim = peer_routes(lab, 1)[0]
    in_ns(ns, "ip", "route", "del", victim, "dev", "flannel.1")
    wait_metric(lab, 1, "flannel_drift_repairs_total", 1, kind="route")
    wait_until(lambda: victim in peer_routes(lab, 1), 10, what="the deleted route back")

    # The lease is renewed every ~2 s.
    wait_metric(lab, 1, "flannel_lease_renewals_total", 2)
    assert metric(lab, 1, "flannel_lease_renewal_failures_total") == 0

    # Rules flushed behind flanneld's back are repaired at the next resync.
    mode = status(lab, 1)["rules"]["mode"]
    assert mode.startswith("iptables"), mode
    assert metric(lab, 1, "flannel_rules_installed", mode=mode) == 1
    wait_metric(lab, 1, "flannel_rules_resyncs_total", 2)
    in_ns(ns, mode, "-w", "5", "-F", "FLANNEL-FWD")
    wait_metric(lab, 1, "flannel_rules_repairs_total", 1)

    # etcd restarts: the watch is cut, reconnects, and is connected again.
    assert lab.etcd is not None
    lab.etcd.restart()
    wait_metric(lab, 1, "flannel_store_watch_reconnects_total", 1)
    wait_until(lambda: metric(lab, 1, "flannel_store_watch_connected") == 1, 30,
               what="the watch connected again")
    wait_until(lambda: status(lab, 1)["ready"], 30, what="node 1 ready after the restart")
