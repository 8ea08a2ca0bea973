"""deploy/grafana/pyflannel-dashboard.json: a dashboard Grafana can import, whose every
query names only series flanneld serves.

The served series are rendered by the real collector (``flannel.monitor.metrics``) from the daemon
run in-process as tests/unit/test_metrics.py runs it (memory store, here with a lease that
expires, so the lease's remaining time is served), plus the engine figures of the real udp
and WireGuard appliers. Sample names are compared, so a histogram's ``_bucket``/``_sum``/
``_count`` and a counter's ``_total`` are what Prometheus stores.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from flannel.backend.udp import UdpBackend
from flannel.backend.wireguard import WireguardBackend
from flannel.config import parse_config
from flannel.monitor.metrics import Exposition
from flannel.monitor.nodestate import NodeState
from flannel.reporting.readiness import Readiness
from flannel.subnet.watch import Snapshot
from flannel.udp.forwarder import ForwarderStatus
from flannel.udp.worker import COUNTERS
from tests.support.daemonnode import EXT, OWN_LEASE, PEER, CountingNode, MemoryStore, get

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "pyflannel-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"

#: PromQL words that are not series names when they stand alone.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME_MATCHER = re.compile(r'__name__\s*(=~|=)\s*"([^"]*)"')


def series_names(expr: str) -> tuple[set[str], set[str]]:
    """(the series names an expression selects by name, the ``__name__`` matchers it uses
    as regular expressions). Grafana variables are taken as opaque."""
    exact: set[str] = set()
    patterns: set[str] = set()
    for op, value in _NAME_MATCHER.findall(expr):
        (exact if op == "=" else patterns).add(value)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, regexes
    text = re.sub(r"\{[^}]*\}", " ", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\$\w+", " ", text)
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in KEYWORDS:
            continue
        exact.add(word)
    return exact, patterns


def test_series_names_are_found_in_promql():
    expr = ('histogram_quantile(0.99, sum by (instance, le) (rate(flannel_x_bucket'
            '{instance=~"$instance", kind="route"}[$__rate_interval]))) / ignoring (kind) '
            'flannel_y_total offset 5m > bool 1e3 and on (instance) '
            'count({__name__=~"flannel_engine_.+", job="a b"})')
    assert series_names(expr) == ({"flannel_x_bucket", "flannel_y_total"},
                                  {"flannel_engine_.+"})


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel, those nested in collapsed rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


class ExpiringStore(MemoryStore):
    """The memory store of test_daemon, granting a lease that expires in an hour."""

    async def acquire_lease(self, config, attrs):  # type: ignore[no-untyped-def]
        lease = await super().acquire_lease(config, attrs)
        self.lease = lease.replace(expiration=time.time() + 3600)
        return self.lease


class StubForwarder:
    """The udp forwarder process as the applier sees it: alive, every counter of the real
    worker (``flannel.udp.worker.COUNTERS``) at zero."""

    def status(self) -> ForwarderStatus:
        return ForwarderStatus(alive=True, pid=1, tun_attached=True,
                               counters=dict.fromkeys(COUNTERS, 0))

    def set_peers(self, _table: object) -> None:
        pass


def engine_samples() -> set[str]:
    """Sample names of the real udp and WireGuard appliers' figures, as /metrics shows them."""
    udp = UdpBackend(EXT, parse_config('{"Network": "10.5.0.0/16", "Backend": {"Type": "udp"}}'))
    udp.forwarder = StubForwarder()  # type: ignore[assignment]
    for applier in udp.appliers():
        assert not applier.apply([]).error
    wireguard = WireguardBackend(EXT, parse_config(
        '{"Network": "10.5.0.0/16", "Backend": {"Type": "wireguard"}}'))
    names: set[str] = set()
    for backend in (udp, wireguard):
        state = NodeState(Readiness(["startup"]), backend=backend)
        names |= {name for name in sample_names(Exposition(state).render().decode())
                  if name.startswith("flannel_engine_")}
    return names


async def served(tmp_path) -> set[str]:
    node = CountingNode(tmp_path, "--peer-probe-metrics-per-peer",  # its families too
                        store=ExpiringStore()).start()
    try:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        assert node.rules is not None
        node.rules.status.filtered = (4,)  # as with --encap-peers-only: its families too
        node.rules.status.pod_encap = (4,)  # as with --drop-pod-encap (the default)
        _, body = await get(node.port, "/metrics")
    finally:
        await node.stop()
    return sample_names(body) | engine_samples()


def sample_names(exposition: str) -> set[str]:
    """The names Prometheus stores for an exposition's samples; a family without samples
    right now (a labelled one, e.g. kube's record writes, on an etcd node) by its type."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count")}
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
    return names


async def test_every_query_names_a_series_flanneld_serves(tmp_path):
    names = await served(tmp_path)
    assert "flannel_lease_remaining_seconds" in names  # the expiring lease is shown
    assert {"flannel_engine_udp_tx_packets_total", "flannel_engine_wireguard_peers"} <= names
    dashboard = load()
    queries = [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":  # Grafana's label_values(<series>, <label>)
            found = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"]["query"])
            assert found, variable
            queries.append((f"variable {variable['name']}", found.group(1)))
    assert len(queries) > 30
    used: set[str] = set()
    for title, expr in queries:
        exact, patterns = series_names(expr)
        assert exact or patterns, f"{title}: {expr} selects no series by name"
        assert exact <= names, f"{title}: {sorted(exact - names)} not served"
        for pattern in patterns:
            matched = {n for n in names if re.fullmatch(pattern, n)}
            assert matched, f"{title}: {pattern} matches no series served"
            used |= matched
        used |= exact
    # Every family of docs/operations.md appears in some panel.
    documented = set(re.findall(r"^\| `(flannel_[a-z_]+)` \|", OPERATIONS.read_text(), re.M))
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert documented <= shown, sorted(documented - shown)


def test_the_dashboard_is_a_valid_grafana_model():
    dashboard = load()
    for key in ("title", "uid", "panels", "templating", "schemaVersion", "time"):
        assert key in dashboard, key
    assert re.fullmatch(r"[\w-]{1,40}", dashboard["uid"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    every = panels(dashboard)
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    occupied: set[tuple[int, int]] = set()
    for panel in every:
        grid = panel["gridPos"]
        assert set(grid) == {"h", "w", "x", "y"}, panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        cells = {(grid["x"] + dx, grid["y"] + dy)
                 for dx in range(grid["w"]) for dy in range(grid["h"])}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel["title"] and panel["targets"], panel
        # Every query goes to the datasource the variable picks, never a fixed one.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert '$instance' in target["expr"], (panel["title"], target["expr"])
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_operations_links_the_dashboard():
    assert "(../deploy/grafana/pyflannel-dashboard.json)" in OPERATIONS.read_text()
