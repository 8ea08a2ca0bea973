"""What a lab node shows: its metrics scraped, one metric read, its VTEP MAC, its wg output, a
lease key free for it to claim."""

from __future__ import annotations

import json
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from flannel.kernel import nsexec
from flannel.kernel.host import Host
from flannel_lab.cluster import Lab, ip
from tests.support.traffic import http_get

HEALTH = "http://127.0.0.1:8081"


def scrape(lab, index: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = http_get(lab.node_ns(index), f"{HEALTH}/metrics")
    assert code == 200, body
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def metric(lab: Lab, index: int, name: str, **labels: str) -> float | None:
    """A sample of node ``index``'s /metrics; None while it does not answer (starting)."""
    if http_get(lab.node_ns(index), f"{HEALTH}/metrics")[0] != 200:
        return None
    return scrape(lab, index).get((name, tuple(sorted(labels.items()))))


def vtep_mac(lab: Lab, index: int) -> str:
    return json.loads(ip(lab.node_ns(index), "-j", "link", "show", "flannel.1").stdout)[0][
        "address"]


def free_key(lab: Lab) -> str:
    """A subnet key no lease holds (etcd mode picks the nodes' subnets by hashing)."""
    taken = set(lab.leases())
    return next(f"10.244.{n}.0-24" for n in range(200, 255) if f"10.244.{n}.0-24" not in taken)


def wg(lab: Lab, index: int, *args: str) -> str:
    """``wg`` in node ``index``'s view (its namespace and its /run)."""
    cmd = nsexec.command(["wg", *args], Host(lab.node_ns(index)), lab.node_run_dir(index))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30,
                          check=True).stdout
