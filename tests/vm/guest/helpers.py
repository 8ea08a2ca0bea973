"""What the guest scenarios share: echoes that run through a restart and say which were
lost, flanneld's status from its socket, a restart that waits for readiness, doctor and
check as an operator runs them on a node, and a firewall drop made and removed in a node.

Each helper spends as few new interpreters as it can: under qemu's TCG a Python process
costs seconds to start, C tools (ip, ping, nft, wg) a fraction of one.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from flannel.kernel import nsexec
from flannel.kernel.host import Host
from flannel.monitor.statusdoc import StatusDocument
from flannel.ops.status import StatusUnavailable, Where, fetch_status
from flannel_lab import slowness
from flannel_lab.cluster import IP, Lab, in_ns
from tests.support.checkout import FLANNELCTL
from tests.support.waiting import wait_until

#: flanneld's flags in the scenarios' labs: as deployed (kube-flannel's manifest, flannel-lab
#: up), flanneld masquerades what leaves the pod network, so the CNI plugin's bridge does not
#: masquerade pod-to-pod traffic, and the pods' own addresses are what crosses the nodes.
MASQ = ("--ip-masq",)
_REPLY = re.compile(rb"bytes from .*icmp_seq=(\d+)")


class Pings:
    """Echoes every ``interval`` seconds from ``netns`` to ``target`` (from ``source`` when
    given) until ``stop``; each reply's sequence number is recorded as it comes. ``lost`` are
    the echoes before the last answered one that got no answer: the one still in flight when
    the run is stopped is not counted."""

    def __init__(self, netns: str, target: str, source: str = "", interval: float = 0.1
                 ) -> None:
        self.name = f"{netns} -> {target}"
        self.replied: set[int] = set()
        self.proc = subprocess.Popen(
            [IP, "netns", "exec", netns, "ping", "-n", "-i", f"{interval:g}", "-W", "2",
             *(["-I", source] if source else []), target],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if found := _REPLY.search(line):
                self.replied.add(int(found[1]))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._reader.join(30)

    @property
    def lost(self) -> list[int]:
        last = max(self.replied, default=0)
        return sorted(set(range(1, last + 1)) - self.replied)


def wait_replies(runs: list[Pings], more: int, what: str) -> None:
    """Until every run has ``more`` replies beyond what it has now."""
    want = {id(run): len(run.replied) + more for run in runs}
    wait_until(lambda: all(len(run.replied) >= want[id(run)] for run in runs), 30,
               interval=0.2, what=what)


def status(lab: Lab, index: int) -> StatusDocument:
    """Node ``index``'s flanneld status document, from its socket (no interpreter started)."""
    socket = lab.directory / f"n{index}" / "flanneld.sock"
    return fetch_status(Where(socket=socket), timeout=30).doc


def ready(lab: Lab, index: int) -> bool:
    try:
        return bool(status(lab, index)["ready"])
    except StatusUnavailable:
        return False


def restart(lab: Lab, index: int, sig: int = signal.SIGTERM) -> str:
    """Stop node ``index``'s flanneld with ``sig``, start it again with the same flags, and
    wait until it is ready; what the new flanneld logged."""
    before = len(lab.log(index))
    code = lab.stop_flanneld(index, sig)
    assert code == (0 if sig == signal.SIGTERM else -sig), code
    lab.start_flanneld(index)
    wait_until(lambda: ready(lab, index), 60, interval=0.5,
               what=f"node {index}'s restarted flanneld to be ready")
    return lab.log(index)[before:]


def in_node(lab: Lab, index: int, *argv: str, own_run: bool = False,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``argv`` in node ``index``'s network namespace; ``own_run``: with the node's /run
    too (what charon's socket needs), at the cost of one more interpreter."""
    if own_run:
        return subprocess.run(nsexec.command(list(argv), Host(lab.node_ns(index)),
                                             lab.node_run_dir(index)),
                              capture_output=True, text=True, check=False,
                              timeout=slowness.scaled(timeout))
    return in_ns(lab.node_ns(index), *argv, check=False, timeout=timeout)


def doctor(lab: Lab, index: int, cni: tuple[Path, Path], own_run: bool = False
           ) -> tuple[int, list[dict[str, Any]]]:
    """``flannelctl doctor --json`` on node ``index``: (exit status, findings)."""
    node = lab.node(index)
    # --max-age=0: its own probes, not flanneld's latest, which may predate the fault.
    done = in_node(lab, index, *FLANNELCTL, "doctor", "--json", "--max-age=0",
                   f"--etcd-endpoints={lab.state.etcd_endpoint}",
                   f"--subnet-file={node.subnet_file}", f"--cni-bin-dir={cni[0]}",
                   f"--cni-conf-dir={cni[1]}", own_run=own_run)
    assert done.stdout.strip(), done.stderr
    findings: list[dict[str, Any]] = json.loads(done.stdout)["findings"]
    return done.returncode, findings


def check(lab: Lab, index: int) -> tuple[int, dict[str, str]]:
    """``flannelctl check --json`` on node ``index``: (exit status, peer public IP ->
    verdict)."""
    node = lab.node(index)
    done = in_node(lab, index, *FLANNELCTL, "check", "--json", "--count=3", "--timeout=2",
                   "--max-age=0",
                   f"--etcd-endpoints={lab.state.etcd_endpoint}",
                   f"--subnet-file={node.subnet_file}")
    assert done.stdout.strip(), done.stderr
    peers = json.loads(done.stdout)["peers"]
    return done.returncode, {peer["public_ip"]: peer["verdict"] for peer in peers}


def errors(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in findings if f["severity"] == "error"]


def first_cause(code_findings: tuple[int, list[dict[str, Any]]], check: str, *words: str
                ) -> None:
    """doctor failed (exit 1) and its first finding beyond information (the cause it ranks
    first) is of ``check`` and holds every one of ``words``."""
    code, findings = code_findings
    shown = "\n".join(f"[{f['severity']}] {f['check']}: {f['what']}" for f in findings)
    problems = [f for f in findings if f["severity"] != "info"]
    assert code == 1 and problems, shown
    assert problems[0]["check"] == check, shown
    missing = [word for word in words if word not in problems[0]["what"]]
    assert not missing, f"{missing} not in the first finding:\n{shown}"


#: The nftables table of a drop made by a scenario (doctor names it when it finds the rule).
TABLE = "vmlanedrop"


class Dropped:
    """While in effect, node ``index``'s input drops what ``match`` (nft words) selects, in
    a table of the test's own, removed on exit."""

    def __init__(self, lab: Lab, index: int, *match: str) -> None:
        self.netns = lab.node_ns(index)
        self.match = match

    def __enter__(self) -> Dropped:
        for rule in (("add", "table", "inet", TABLE),
                     ("add", "chain", "inet", TABLE, "input",
                      "{ type filter hook input priority -10 ; }"),
                     ("add", "rule", "inet", TABLE, "input", *self.match, "drop")):
            in_ns(self.netns, "nft", *rule)
        return self

    def __exit__(self, *exc: object) -> None:
        in_ns(self.netns, "nft", "delete", "table", "inet", TABLE)
