"""/metrics and /status of the daemon in-process (the memory store and recording backend of
test_daemon), read as Prometheus and ``flannelctl status`` read them; the health server's
rule that /status answers this host only; the lazy import of prometheus_client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flannel.kernel.iface import ExternalInterface
from flannel.lease import Event, EventType, Lease, LeaseAttrs
from flannel.monitor.health import HealthServer, same_host
from flannel.monitor.nodestate import NodeState, status_document
from flannel.monitor.statusdoc import read_status
from flannel.ops.status import render
from flannel.reporting.histogram import Durations
from flannel.reporting.readiness import Readiness
from flannel.subnet.watch import Changes, Snapshot
from tests.support.checkout import FLANNELCTL
from tests.support.daemonnode import OWN_LEASE, PEER, CountingNode, get
from tests.support.waiting import async_wait_until

PEER2 = Lease(IPv4Network("10.5.3.0/24"), None,
              LeaseAttrs(public_ip=IPv4Address("192.0.2.3"), backend_type="host-gw"))
OUTSIDE = Lease(IPv4Network("10.9.3.0/24"), None,
                LeaseAttrs(public_ip=IPv4Address("192.0.2.9"), backend_type="host-gw"))


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed by Prometheus' own text parser."""
    status, body = await get(port, "/metrics")
    assert status == 200, body
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@contextlib.asynccontextmanager
async def counting_node(tmp_path, *flags: str):
    node = CountingNode(tmp_path, *flags).start()
    try:
        yield node
    finally:
        await node.stop()


async def wait_metric(port: int, name: str, want: float, **labels: str) -> dict:
    last: list[dict] = [{}]

    async def reached() -> bool:
        last[0] = await scrape(port)
        return value(last[0], name, **labels) == want
    await async_wait_until(reached, 10, what=f"{name}{labels} == {want}; last scrape had "
                           f"{value(last[0], name, **labels)}")
    return last[0]


async def test_families_move_as_peers_come_and_passes_fail(tmp_path):
    async with counting_node(tmp_path, "--reconcile-interval=1") as node:
        await node.wait_readyz(503, "first lease snapshot")
        before = await scrape(node.port)
        assert value(before, "flannel_ready") == 0
        assert value(before, "flannel_component_ready", component="dataplane") == 0
        assert value(before, "flannel_component_ready", component="startup") == 1
        assert value(before, "flannel_peers_known") == 0
        assert value(before, "flannel_lease_info", subnet="10.5.1.0/24", ipv6_subnet="",
                     backend="host-gw", store="memory") == 1
        assert value(before, "flannel_build_info", version="0.1.0") == 1
        assert value(before, "process_resident_memory_bytes") > 0

        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE, OUTSIDE]))
        await node.wait_readyz(200)
        first = await scrape(node.port)
        assert value(first, "flannel_ready") == 1
        assert value(first, "flannel_peers_known") == 1
        assert value(first, "flannel_peers_wanted") == 1
        assert value(first, "flannel_peers_programmed") == 1
        assert value(first, "flannel_peers_skipped") == 1  # 10.9.3.0/24 lies outside
        assert value(first, "flannel_peer_records_skipped_total") == 1
        assert value(first, "flannel_reconcile_changes_total", kind="counting") == 1
        assert value(first, "flannel_engine_peers", engine="counting") == 1
        assert value(first, "flannel_engine_packets_total", engine="counting") == 42
        assert not any(name.startswith("flannel_engine_Bad") for name, _ in first)
        assert value(first, "flannel_dataplane_in_sync") == 1
        passes = value(first, "flannel_reconcile_passes_total", result="ok")
        assert passes >= 1
        assert value(first, "flannel_reconcile_pass_duration_seconds_count") == passes
        assert value(first, "flannel_reconcile_pass_duration_seconds_bucket", le="+Inf") == passes

        node.store.updates.put_nowait(Changes([Event(EventType.ADDED, PEER2)]))
        second = await wait_metric(node.port, "flannel_peers_programmed", 2)
        assert value(second, "flannel_peers_known") == 2
        assert value(second, "flannel_reconcile_changes_total", kind="counting") == 2

        assert node.backend is not None
        node.backend.counting.error = "engine refused 10.5.3.0/24"
        failing = await wait_metric(node.port, "flannel_dataplane_in_sync", 0)
        assert value(failing, "flannel_reconcile_passes_total", result="error") >= 1
        assert value(failing, "flannel_ready") == 0
        code, body = await get(node.port, "/status")
        doc = json.loads(body)
        assert code == 200 and doc["ready"] is False
        assert doc["last_errors"] == ["data plane: counting: engine refused 10.5.3.0/24"]
        assert doc["reason"] == "data plane not programmed: counting: engine refused 10.5.3.0/24"


async def test_status_document_says_what_the_daemon_holds(tmp_path):
    async with counting_node(tmp_path) as node:
        node.store.updates.put_nowait(Snapshot([PEER, PEER2, OWN_LEASE, OUTSIDE]))
        await node.wait_readyz(200)
        code, body = await get(node.port, "/status")
        doc = json.loads(body)
    assert code == 200
    assert doc["ready"] is True and doc["reason"] == ""
    assert [c["component"] for c in doc["readiness"]] == [
        "startup", "subnet.env", "store", "lease", "rules", "dataplane"]
    assert doc["lease"]["subnet"] == "10.5.1.0/24" and doc["lease"]["public_ip"] == "192.0.2.1"
    assert doc["network"] == {"network": "10.5.0.0/16", "ipv6_network": None,
                              "backend": "host-gw"}
    assert doc["peers"] == {"known": 2, "for_backend": 2, "programmed": 2, "skipped": 1,
                            "refused": 0, "refused_reasons": {}, "refused_kinds": {},
                            "skipped_reasons": {"10.9.3.0-24": "subnet 10.9.3.0/24 lies "
                                                "outside the Network 10.5.0.0/16"}}
    assert doc["engines"] == {"counting": {"peers": 2, "packets_total": 42, "Bad Name!": 1}}
    assert doc["rules"]["installed"] is True
    assert doc["last_errors"] == []
    assert "password" not in body.lower() and "key" not in json.dumps(doc["lease"]).lower()
    # What flanneld writes is what its readers expect, field for field.
    read = read_status(doc)
    assert (read.problems, read.missing, read.cut, read.newer) == ([], [], [], False)
    assert read.doc == doc


def run_status(port: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*FLANNELCTL, "status", f"--health-url=http://127.0.0.1:{port}",
                           "--timeout=5", *extra], capture_output=True, text=True, timeout=30,
                          check=False)


async def test_flannelctl_status_table_json_and_exit_codes(tmp_path):
    async with counting_node(tmp_path) as node:
        await node.wait_readyz(503, "first lease snapshot")
        waiting = await asyncio.to_thread(run_status, node.port)
        assert waiting.returncode == 1, waiting.stderr
        assert ("ready       NO: data plane not programmed: waiting for the first lease "
                "snapshot") in waiting.stdout
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        table = await asyncio.to_thread(run_status, node.port)
        as_json = await asyncio.to_thread(run_status, node.port, "--json")
        port = node.port
    assert table.returncode == 0 and table.stderr == ""
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"flanneld 0.1.0 at http://127.0.0.1:{port}, up ")
    assert "ready       yes" in lines
    assert "lease       10.5.1.0/24 (public IP 192.0.2.1), a reservation (never expires)" in lines
    assert ("peers       1 known, 1 for this backend, 1 programmed, 0 skipped as invalid"
            in lines)
    assert "dataplane    yes" in lines
    assert lines[-1] == "last errors: none"
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout)["peers"]["programmed"] == 1
    gone = run_status(port)
    assert gone.returncode == 3 and gone.stdout == ""
    assert gone.stderr == (
        f"flannelctl status: flanneld's health server at http://127.0.0.1:{port} did not "
        "answer (Connection refused); is flanneld running with --healthz-port, and is "
        "--health-url its --healthz-ip:--healthz-port?\n")


async def test_flannelctl_status_refuses_an_answer_that_is_not_a_status(tmp_path):
    async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\n[1, 2]\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(reply, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await asyncio.to_thread(run_status, port)
    finally:
        server.close()
        await server.wait_closed()
    assert result.returncode == 3
    assert result.stderr == (f"flannelctl status: the /status answer of http://127.0.0.1:{port}"
                             " is not flanneld's status\n")


def test_flannelctl_status_rejects_a_url_that_is_not_http():
    result = subprocess.run([*FLANNELCTL, "status", "--health-url=https://node:8081"],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 2
    assert result.stderr == ("flannelctl status: --health-url 'https://node:8081': give "
                             "http://<healthz-ip>:<healthz-port>, e.g. http://127.0.0.1:8081\n")


def test_status_answers_this_host_only():
    server = HealthServer(lambda: (True, ""), NodeState(Readiness(["startup"])))
    refused = server.answer("GET", "/status", local=False)
    assert (refused.status, refused.reason) == (403, "Forbidden")
    assert refused.body == (b"/status answers clients on this host only: run "
                            b"flannelctl status on the node\n")
    assert server.answer("GET", "/status", local=True).status == 200
    # Prometheus scrapes from elsewhere: /metrics answers everyone.
    assert server.answer("GET", "/metrics", local=False).status == 200


@pytest.mark.parametrize(("peer", "sock", "local"), [
    (("127.0.0.1", 5000), ("127.0.0.1", 8081), True),
    (("127.0.0.5", 5000), ("10.0.0.1", 8081), True),
    (("::1", 5000, 0, 0), ("::1", 8081, 0, 0), True),
    (("10.0.0.1", 5000), ("10.0.0.1", 8081), True),  # this host, to its own address
    (("::ffff:10.0.0.1", 5000, 0, 0), ("::ffff:10.0.0.1", 8081, 0, 0), True),
    (("10.0.0.2", 5000), ("10.0.0.1", 8081), False),  # another host
    (("fd00::2", 5000, 0, 0), ("fd00::1", 8081, 0, 0), False),
    (None, None, False),
    ("/run/sock", "/run/sock", False),
])
def test_same_host(peer, sock, local):
    assert same_host(peer, sock) is local


def test_without_a_node_state_only_health_paths_exist():
    server = HealthServer(lambda: (True, ""))
    missing = server.answer("GET", "/metrics")
    assert (missing.status, missing.reason) == (404, "Not Found")
    assert server.answer("GET", "/status", local=True).body == b"try /healthz or /readyz\n"


def test_durations_fall_in_their_buckets():
    durations = Durations((0.01, 0.1, 1.0))
    for seconds in (0.005, 0.01, 0.05, 2.0):
        durations.observe(seconds)
    assert durations.cumulative() == [(0.01, 2), (0.1, 3), (1.0, 3), (float("inf"), 4)]
    assert (durations.count, round(durations.sum, 3)) == (4, 2.065)
    with pytest.raises(ValueError, match="distinct and increasing"):
        Durations((1.0, 0.5))


PROBE = """
import sys
import flannel.daemon, flannel.monitor.health, flannel.cni.plugin, flannel.ctl
flannel.ctl.build_parser().parse_args(["status", "--json"])
print("prometheus_client" in sys.modules)
"""


def test_prometheus_client_is_loaded_only_when_scraped():
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                            timeout=60, check=True, cwd=Path(__file__).resolve().parents[2])
    assert result.stdout == "False\n"


def collected(state: NodeState) -> dict:
    from flannel.monitor.metrics import Exposition

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(Exposition(state).render().decode())
            for s in family.samples}


async def test_netlink_families_move_with_refusals_drift_and_lost_events():
    """The data plane's own families, against the dict-backed netlink of test_dataplane."""
    from flannel.kernel import rtnl
    from flannel.kernel.rtnl import Route
    from tests.support.clock import FakeClock
    from tests.support.dataplanes import (
        EXT,
        hostgw,
        peer,
        programmed,
        retried,
        route,
        running,
        until,
    )
    from tests.support.fakenetlink import FakeKernel

    kernel = FakeKernel()
    kernel.refusals["replace route"] = 101  # ENETUNREACH for every peer: this node's problem
    clock = FakeClock()
    async with running(hostgw(), kernel, clock=clock) as dataplane:
        state = NodeState(dataplane.readiness, dataplane=dataplane, backend=dataplane.backend)
        dataplane.set_peers([peer(2), peer(3)])
        await retried(clock)
        await until(lambda: dataplane.status.failed_passes == 2, "failed passes")
        failing = collected(state)
        assert value(failing, "flannel_netlink_errors_total") >= 2
        assert value(failing, "flannel_reconcile_passes_total", result="error") >= 2
        assert value(failing, "flannel_dataplane_in_sync") == 0
        assert value(failing, "flannel_peers_wanted") == 2
        assert value(failing, "flannel_peers_programmed") == 0
        assert value(failing, "flannel_peers_refused", reason="kernel_refused") == 0
        del kernel.refusals["replace route"]
        await retried(clock)
        await programmed(dataplane)
        healthy = collected(state)
        assert value(healthy, "flannel_peers_programmed") == 2
        # Counted by passes that succeed.
        assert value(healthy, "flannel_reconcile_changes_total", kind="route") == 2
        assert value(healthy, "flannel_drift_repairs_total", kind="route") is None

        await until(lambda: kernel.watching, "the event watch")
        kernel.put(Route("10.244.7.0/24", "192.168.1.7", EXT.index), rtnl.RTPROT_FLANNEL)
        await until(lambda: dataplane.status.repaired["route"] == 1, "stray route repaired")
        await programmed(dataplane)
        kernel.overrun()
        await until(lambda: dataplane.status.event_overruns == 1, "the overrun seen")
        await programmed(dataplane)
        assert kernel.ours() == {route(2), route(3)}
        moved = collected(state)
        assert value(moved, "flannel_drift_repairs_total", kind="route") == 1
        assert value(moved, "flannel_netlink_event_overruns_total") == 1
        assert value(moved, "flannel_netlink_event_watch_failures_total") == 0
        doc = status_document(state)
        assert doc["dataplane"]["routes_wanted"] == 2
        assert doc["dataplane"]["repaired"] == {"route": 1}


async def test_peers_refused_are_counted_by_reason_and_listed_in_status():
    from tests.support.clock import FakeClock
    from tests.support.dataplanes import hostgw, peer, programmed, running
    from tests.support.fakenetlink import FakeKernel

    kernel = FakeKernel()
    kernel.refusals["replace route 10.244.3.0/24"] = 101  # ENETUNREACH: that peer only
    async with running(hostgw(), kernel, clock=FakeClock()) as dataplane:
        state = NodeState(dataplane.readiness, dataplane=dataplane, backend=dataplane.backend)
        dataplane.set_peers([peer(2), peer(3), peer(4)])
        await programmed(dataplane)
        samples = collected(state)
        assert value(samples, "flannel_peers_programmed") == 2
        assert value(samples, "flannel_peers_refused", reason="kernel_refused") == 1
        assert value(samples, "flannel_peers_refused", reason="identity_taken") == 0
        assert value(samples, "flannel_peer_refusals_total", reason="kernel_refused") == 1
        peers = status_document(state)["peers"]
        assert peers["programmed"] == 2 and peers["refused"] == 1
        assert peers["refused_kinds"] == {"10.244.3.0-24": "kernel_refused"}
        assert peers["refused_reasons"]["10.244.3.0-24"].startswith(
            "Network is unreachable (replace route 10.244.3.0/24 via 192.168.1.3)")
        # flannelctl status says what each refusal is.
        table = render(read_status(json.loads(json.dumps(status_document(state)))),
                       "the socket")
        assert ("2 programmed, 0 skipped as invalid, 1 parked (the kernel refused their "
                "entries; retried)") in table, table
        assert re.search(r"^  parked +10\.244\.3\.0-24: Network is unreachable", table,
                         re.MULTILINE), table


def test_status_footprint_names_the_port_any_host_may_inject_on_from_the_config():
    from flannel.backend.udp import UdpBackend
    from flannel.backend.vxlan import VxlanBackend
    from flannel.backend.wireguard import WireguardBackend
    from flannel.config import parse_config
    from flannel.monitor.nodestate import footprint_document

    ext = ExternalInterface("eth0", 2, 1500, IPv4Address("192.0.2.1"), None,
                            IPv4Address("192.0.2.1"), None)

    def port(cls: type, backend: str) -> object:
        config = parse_config(f'{{"Network":"10.5.0.0/16","Backend":{backend}}}')
        return footprint_document(cls(ext, config))["encap_port"]

    assert port(VxlanBackend, '{"Type":"vxlan","Port":4789}') == 4789
    assert port(UdpBackend, '{"Type":"udp"}') == 8285
    assert port(WireguardBackend, '{"Type":"wireguard"}') is None  # authenticated


async def test_a_failing_event_watch_is_counted():
    from flannel.dataplane.loop import COMPONENT, Dataplane
    from tests.support.dataplanes import hostgw, peer, programmed, until
    from tests.support.fakenetlink import FakeKernel

    async def broken(_on_event: object, _on_overrun: object) -> None:
        raise OSError("netlink multicast groups unavailable")

    kernel = FakeKernel()
    dataplane = Dataplane(hostgw(), Readiness([COMPONENT]), netlink=kernel.open, watch=broken)
    task = asyncio.create_task(dataplane.run())
    try:
        dataplane.set_peers([peer(2)])
        await programmed(dataplane)
        await until(lambda: dataplane.status.event_watch_failures >= 1, "the watch failure")
        samples = collected(NodeState(dataplane.readiness, dataplane=dataplane))
        assert value(samples, "flannel_netlink_event_watch_failures_total") >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


async def test_every_family_is_documented(tmp_path):
    docs = OPERATIONS.read_text()
    documented = set(re.findall(r"^\| `(flannel_[a-z_<>]+)` \|", docs, re.M))
    async with counting_node(tmp_path) as node:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        assert node.rules is not None
        node.rules.status.filtered = (4,)  # as with --encap-peers-only over vxlan or udp
        node.rules.status.pod_encap = (4,)  # as with --drop-pod-encap (the default)
        _, body = await get(node.port, "/metrics")
    families = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(body) if f.name.startswith("flannel_")}
    families = {"flannel_engine_<name>" if name.startswith("flannel_engine_") else name
                for name in families}
    # What this node cannot show: a reservation has no expiry; the per-peer probe series
    # need --peer-probe-metrics-per-peer.
    assert families | {"flannel_lease_remaining_seconds", "flannel_peer_probe_reachable",
                       "flannel_peer_probe_last_rtt_seconds"} == documented
