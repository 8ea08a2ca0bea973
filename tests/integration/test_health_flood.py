"""A flood of idle connections to the health port does not take flanneld down: flanneld run
as a process with systemd's default soft file limit (1024), a real etcd, iptables rules in
its own netns, and 2,000 connections that never send a byte."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flannel.monitor.health import EVICTION_BURST, EVICTIONS_PER_SECOND
from tests.support.flanneld import CONFIG, PREFIX, flanneld
from tests.support.healthflood import HealthFlood
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

PORT = 8081
FLOOD = 2000


def nat_chain(ns: str) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, "iptables-nft", "-t", "nat", "-S",
                           "FLANNEL-POSTRTG"], capture_output=True, text=True, timeout=30,
                          check=False).stdout


def metric(ns: str, name: str) -> float:
    status, body = http_get(ns, f"http://127.0.0.1:{PORT}/metrics")
    assert status == 200, body
    line = next(line for line in body.splitlines() if line.startswith(name + " "))
    return float(line.split()[1])


def calm_readyz(ns: str) -> float:
    """The median time of ten GETs of /readyz with no flood, in ms."""
    with HealthFlood(ns, PORT, 0) as quiet:
        return statistics.median(p["ms"] for p in quiet.ask("probe 10 /readyz 0.05")["probes"])


def test_idle_connections_leave_readyz_and_the_rules_resync_working(node, tmp_path):
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    proc = flanneld(tmp_path, ns, server, "--ip-masq", "--iptables-mode=nft",
                    "--iptables-resync=1", "--healthz-ip=127.0.0.1", f"--healthz-port={PORT}")
    proc.open_files = (1024, 20000)  # systemd's default soft limit, a higher hard one
    proc.start()
    flood = None
    try:
        proc.wait_log("Ready:", timeout=60)
        wait_until(lambda: "MASQUERADE" in nat_chain(ns), 15, what="rules installed")
        rules = nat_chain(ns)
        # As a Go program does, flanneld took its hard limit as its soft one.
        limits = Path(f"/proc/{proc.proc.pid}/limits").read_text()
        assert re.search(r"Max open files\s+20000\s+20000", limits), limits
        assert http_get(ns, f"http://127.0.0.1:{PORT}/metrics")[0] == 200  # code loaded
        rss_before = proc.rss_kib()
        calm = [calm_readyz(ns)]

        flood = HealthFlood(ns, PORT, FLOOD)
        opened = flood.ask(f"wait {FLOOD} 10")
        probes = flood.ask("probe 25 /readyz 0.2")["probes"]  # over 5 s of flood
        latencies = [p["ms"] for p in probes]
        print(f"\nflood: {opened}; /readyz under it: median {statistics.median(latencies)} ms, "
              f"max {max(latencies)} ms")
        assert all(p["status"] == 200 for p in probes), probes

        # The rules resync still runs commands (it needs files: pipes, the command's own).
        subprocess.run(["ip", "netns", "exec", ns, "iptables-nft", "-t", "nat", "-F",
                        "FLANNEL-POSTRTG"], check=True, timeout=30)
        wait_until(lambda: nat_chain(ns) == rules, 10, what=f"rules restored:\n{proc.log}")
        rss_flood = proc.rss_kib()
        stats = flood.ask("stats")
        flood.close()
        flood = None

        wait_until(lambda: metric(ns, "flannel_health_connections_open") == 1, 30,
                   what="every flood connection closed")  # 1: the scrape itself
        calm.append(calm_readyz(ns))
        print(f"/readyz without the flood, before and after: median {calm} ms")
        # 100 ms on an idle machine, where /readyz takes a few ms without the flood; the bound
        # grows with what the machine's other work (other tests, workers) costs /readyz.
        assert statistics.median(latencies) < max(100, 20 * max(calm)), (calm, latencies)
        rss_after = proc.rss_kib()
        dropped = metric(ns, "flannel_health_connections_dropped_total")
        print(f"flood stats {stats}; dropped {dropped}; RSS before {rss_before} KiB, "
              f"during {rss_flood} KiB, after {rss_after} KiB")
        # Connections that send nothing never reach flanneld (TCP_DEFER_ACCEPT): none had
        # to be pushed out to make room.
        assert dropped == 0
        assert "health server: closed a connection" not in proc.log
        assert rss_after - rss_before < 8 * 1024
        assert "Traceback" not in proc.log, proc.log
        assert len(proc.log) < 200_000  # a few lines, not one per connection
    finally:
        if flood is not None:
            flood.close()
        proc.stop()


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(("count", "first_bytes"), [(200, b""), (2000, b""),
                                                    (2000, b"GET /readyz HTTP/1.1\r\n")],
                         ids=["200-silent", "2000-silent", "2000-unfinished-requests"])
def test_a_client_reopening_every_closed_connection_at_once_costs_little_cpu(
        node, tmp_path, count, first_bytes):
    """Each connection the server closes is opened again at once, as fast as the client
    can: flanneld closes them at a bounded rate and its CPU over a window stays a small part
    of a core (it once spent 80 % accepting and closing), and /readyz is answered at once
    while the client's connections send nothing (the kernel holds them). While they each
    send the start of a request, they are closed to make room at a bounded rate; a probe
    then waits its turn behind them, longer than its 2 s timeout, so none is made."""
    ns, server = node
    server.ctl("put", f"{PREFIX}/config", json.dumps(CONFIG))
    proc = flanneld(tmp_path, ns, server, "--healthz-ip=127.0.0.1", f"--healthz-port={PORT}")
    proc.start()
    try:
        proc.wait_log("Ready:", timeout=60)
        assert proc.proc is not None
        with HealthFlood(ns, PORT, count, reopen_per_second=None,
                         first_bytes=first_bytes) as flood:
            flood.ask(f"wait {count} 10")
            time.sleep(1)  # past the first burst
            before, started = cpu_seconds(proc.proc.pid), time.monotonic()
            first = flood.ask("stats")
            # Ticks of 10 ms: 4 s tell 5 % of a core from 80 % many times over.
            time.sleep(4)
            window = time.monotonic() - started
            used = (cpu_seconds(proc.proc.pid) - before) / window
            stats = flood.ask("stats")
            probes = [] if first_bytes else flood.ask("probe 10 /readyz 0.2")["probes"]
        closed = stats["closed_by_server"] - first["closed_by_server"]
        print(f"\n{count} connections reopened at once: flanneld used {used:.1%} of a core; "
              f"{closed} closed in the window; /readyz {[p['ms'] for p in probes]} ms")
        # About 5 % of a core alone on a quiet machine; the bound leaves room for a loaded
        # one (the suite runs a worker per core) and still fails for what this guards
        # against: a server accepting and closing as fast as the client reopens, 80 %.
        assert used < 0.25, (used, stats)
        if first_bytes:  # each one is handed over and closed to make room, at a bounded rate
            assert closed <= EVICTIONS_PER_SECOND * window + EVICTION_BURST, (closed, window)
        else:
            assert [p["status"] for p in probes] == [200] * 10, probes
        assert "Traceback" not in proc.log
    finally:
        proc.stop()


SERVER = """
import asyncio, os, resource, sys
from flannel import log
from flannel.monitor.health import HealthServer

async def main():
    server = HealthServer(lambda: (True, ""))
    await server.start("127.0.0.1", int(sys.argv[1]))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
    print("listening", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop()

log.setup(0)
asyncio.run(main())
"""


def test_running_out_of_files_is_one_log_line_and_readyz_still_answers(ns, tmp_path):
    """Eight files left to the process: the health server itself runs out of them."""
    err = tmp_path / "server.log"
    with err.open("wb") as out:
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVER,
                                   str(PORT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=out)
    try:
        assert server.stdout.readline() == b"listening\n", err.read_text()
        with HealthFlood(ns, PORT, 300, first_bytes=b"GET /") as flood:
            flood.ask("wait 300 5")
            probes = flood.ask("probe 5 /readyz")["probes"]
        assert [p["status"] for p in probes] == [200] * 5, probes
    finally:
        server.stdin.close()
        server.wait(timeout=10)
        server.stdout.close()
    text = err.read_text()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "cannot accept a connection" in line]
    assert len(lines) == 1, text
    assert "Too many open files; closing the oldest idle health connection" in lines[0]
