"""What the lab observes about a running cluster, for ``flannel-lab up`` and the scale bench.

Owns: starting many flanneld processes at a bounded pace, reading from each node's kernel how
many peers flanneld programmed (routes of protocol 151 in the main table; WireGuard peers
with the wireguard backend), waiting for the full mesh, pings between chosen node pairs
(one-shot and long-running, with loss per pair), and the CPU and memory of the lab's
flanneld processes from /proc.
Must not touch: the kernel state of the nodes (it only reads it), processes the lab did not
start.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from flannel.kernel import nsexec, rtnl
from flannel.kernel.host import Host
from flannel_lab import slowness
from flannel_lab.cluster import IP, Lab, LabError

MAIN_TABLE = 254
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def peer_routes(lab: Lab, index: int) -> int:
    """IPv4 routes flanneld programmed on node ``index`` (one per peer subnet)."""
    conn = rtnl.Rtnl(Host(lab.node_ns(index)))
    try:
        return sum(1 for _route, proto, table in conn.routes(socket.AF_INET)
                   if proto == rtnl.RTPROT_FLANNEL and table == MAIN_TABLE)
    finally:
        conn.close()


def wg_show(lab: Lab, index: int, *args: str) -> str:
    """``wg show ARGS`` in node ``index``'s view (its namespace and /run); "" if it fails."""
    cmd = nsexec.command(["wg", "show", *args], Host(lab.node_ns(index)),
                         lab.node_run_dir(index))
    result = subprocess.run(cmd, capture_output=True, text=True,
                            timeout=slowness.scaled(30), check=False)
    return result.stdout if result.returncode == 0 else ""


def wireguard_peers(lab: Lab, index: int) -> int:
    """Peers on node ``index``'s ``flannel-wg``, as ``wg`` shows them."""
    return len(wg_show(lab, index, "flannel-wg", "peers").split())


def peers_programmed(lab: Lab, index: int) -> int:
    """Peers node ``index``'s flanneld programmed: WireGuard peers, or peer routes."""
    if lab.state.backend == "wireguard":
        return wireguard_peers(lab, index)
    return peer_routes(lab, index)


def start_nodes(lab: Lab, indexes: list[int], *args: str, starting_at_once: int = 8,
                timeout: float = 600.0) -> float:
    """Start flanneld on ``indexes``, at most ``starting_at_once`` of them without a
    subnet.env yet (a burst of interpreters starting would only slow each other down on a
    small machine); progress every tenth node. Seconds until every one wrote subnet.env;
    LabError after ``timeout`` (scaled by the lab's slowness factor)."""
    start = time.monotonic()
    deadline = start + slowness.scaled(timeout)
    waiting: list[int] = []
    pending = list(indexes)
    done = 0
    while pending or waiting:
        waiting = [i for i in waiting if not _has_subnet_env(lab, i)]
        done = len(indexes) - len(pending) - len(waiting)
        while pending and len(waiting) < starting_at_once:
            index = pending.pop(0)
            lab.start_flanneld(index, *args)
            waiting.append(index)
            started = len(indexes) - len(pending)
            if started % 10 == 0 or not pending:
                lab.progress(f"flanneld started on {started}/{len(indexes)} nodes "
                             f"({time.monotonic() - start:.1f}s); waiting until each has "
                             f"leased a subnet and written subnet.env ({done} so far)")
        if time.monotonic() > deadline:
            raise LabError(f"nodes {waiting} wrote no subnet.env within "
                           f"{slowness.within(timeout)}{_slow_hint()}")
        time.sleep(0.05)
    took = time.monotonic() - start
    lab.progress(f"every node has leased a subnet and written subnet.env ({took:.1f}s)")
    return took


def _has_subnet_env(lab: Lab, index: int) -> bool:
    node = lab.node(index)
    if Path(node.subnet_file).exists():
        return True
    if not lab.flanneld_running(index):
        raise lab.exited(index)
    return False


def wait_full_mesh(lab: Lab, indexes: list[int], timeout: float = 300.0,
                   since: float = 0.0) -> float:
    """Seconds from ``since`` (a time.monotonic; default now) until every node in
    ``indexes`` has a route to each of the others and no more (routes of peers that left
    are gone), read from each node's kernel. ``timeout`` (scaled by the lab's slowness
    factor) counts from now."""
    start = time.monotonic()
    bound = slowness.scaled(timeout)
    since = since or start
    want = len(indexes) - 1
    last_report = start
    while True:
        counts = {i: peers_programmed(lab, i) for i in indexes}
        complete = sum(1 for c in counts.values() if c == want)
        now = time.monotonic()
        if complete == len(indexes):
            return now - since
        if now - last_report >= 5:
            lab.progress(f"full mesh on {complete}/{len(indexes)} nodes ({now - start:.0f}s)")
            last_report = now
        dead = [i for i in indexes if not lab.flanneld_running(i)]
        if dead:
            raise lab.exited(dead[0])
        if now - start > bound:
            short = {i: c for i, c in counts.items() if c != want}
            raise LabError(f"no full mesh after {slowness.within(timeout)}: peer routes "
                           f"(want {want}) on the nodes short of it: {short}{_slow_hint()}")
        time.sleep(0.2)


def _slow_hint() -> str:
    """What to do when a bound ran out on a machine the lab does not know is slow."""
    if slowness.factor() > 1:
        return ""
    return (f" (on a loaded or emulated machine, {slowness.ENV}=N gives every wait of the "
            "lab N times longer)")


def ring(indexes: list[int]) -> list[tuple[int, int]]:
    """Each node and the next one: every node pings and is pinged once."""
    return [(a, indexes[(k + 1) % len(indexes)]) for k, a in enumerate(indexes)]


@dataclass
class PingRun:
    """A long-running ``ping`` from one node's pod address to another's."""

    src: int
    dst: int
    proc: subprocess.Popen[str]

    def stop(self, timeout: float = 10.0) -> tuple[int, int]:
        """End the run now (ping prints its summary on SIGINT): (sent, received)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        return self.result(timeout)

    def result(self, timeout: float) -> tuple[int, int]:
        """(sent, received) once the run ended; LabError if it did not end in time."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise LabError(f"ping {self.src} -> {self.dst} did not end within {timeout:g}s"
                           ) from None
        found = re.search(r"(\d+) packets transmitted, (\d+) received", out)
        if not found:
            raise LabError(f"ping {self.src} -> {self.dst}: no summary in {out[-300:]!r}")
        return int(found[1]), int(found[2])


def start_pings(lab: Lab, pairs: list[tuple[int, int]], seconds: float,
                interval: float = 0.1) -> list[PingRun]:
    """One ping per pair, ``1/interval`` per second for ``seconds``, running in the
    background; collect with ``PingRun.result``.

    A count, not a deadline, ends each run: a deadline would count the echo still in
    flight when it expires as lost. The deadline only bounds a run that does lose some.
    """
    runs = []
    count = max(1, round(seconds / interval))
    try:
        for src, dst in pairs:
            cmd = [IP, "netns", "exec", lab.node_ns(src), "ping", "-4", "-q", "-n",
                   "-i", f"{interval:g}", "-c", str(count), "-w", f"{seconds + 5:g}",
                   "-W", "1",
                   "-I", lab.pod_address(src), lab.pod_address(dst)]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True)
            runs.append(PingRun(src, dst, proc))
    except BaseException:
        for run_ in runs:
            run_.proc.kill()
            run_.proc.communicate()
        raise
    return runs


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU time of ``pid`` itself and of its reaped children (iptables and the like)."""
    fields = _stat_fields(pid)
    return ((int(fields[11]) + int(fields[12])) / CLOCK_TICKS,
            (int(fields[13]) + int(fields[14])) / CLOCK_TICKS)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def idle_cpu(pids: list[int], seconds: float) -> list[tuple[float, float]]:
    """Each process's CPU use over ``seconds`` as a percentage of one core: its own and its
    children's."""
    before = {pid: cpu_seconds(pid) for pid in pids}
    start = time.monotonic()
    time.sleep(seconds)
    after = {pid: cpu_seconds(pid) for pid in pids}
    took = time.monotonic() - start
    return [(100 * (after[pid][0] - before[pid][0]) / took,
             100 * (after[pid][1] - before[pid][1]) / took) for pid in pids]
