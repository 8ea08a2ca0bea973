"""``flannelctl check --lab NAME``: the connectivity matrix of a whole ``flannel-lab`` lab.

Owns reading the lab's node list from the state file the lab records
(``<root>/<name>/state.json``, written by ``lab/flannel_lab/cluster.py``; read here as untrusted
input, without importing the lab), running ``flannelctl check --json`` inside every node's
namespace at once (bounded in number and time), and the node-by-node matrix with every
failing pair named and what to run next.
Must not touch: anything (it runs the read-only check in each node).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.ops.commands import flannelctl

if TYPE_CHECKING:
    from flannel.ops.options import CheckOptions

MAX_STATE = 1 << 20
MAX_OUTPUT = 16 << 20
NODES_AT_ONCE = 8
#: Verdicts that are no failure (as in ``flannelctl check``).
PASSING = ("ok", "lossy", "no-data-path")


class LabCheckError(Exception):
    """The lab cannot be checked; the message says why."""


@dataclass(frozen=True)
class LabNode:
    index: int
    netns: str
    address: str  # the node's public IP
    subnet_file: str

    @property
    def label(self) -> str:
        return f"n{self.index}"


@dataclass
class NodeOutcome:
    """What ``flannelctl check --json`` said in one node (or why it said nothing usable)."""

    node: LabNode
    doc: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def subnet(self) -> str:
        node = self.doc.get("node")
        return str(node.get("subnet") or "?") if isinstance(node, dict) else "?"

    @property
    def note(self) -> str:
        """What the node's check could not judge for its backend ("" if nothing)."""
        node = self.doc.get("node")
        note = node.get("note") if isinstance(node, dict) else None
        return " ".join(note[:500].split()) if isinstance(note, str) else ""

    def peers(self) -> list[dict[str, Any]]:
        peers = self.doc.get("peers")
        return [p for p in peers if isinstance(p, dict)] if isinstance(peers, list) else []


@dataclass
class Pair:
    source: LabNode
    dest: LabNode | None  # None: a lease no lab node holds
    verdict: str
    peer: dict[str, Any]
    detail: str = ""

    @property
    def fails(self) -> bool:
        return self.verdict not in PASSING


def read_lab(name: str, root: Path) -> tuple[str, list[LabNode]]:
    """(etcd endpoint, nodes) of lab ``name``; LabCheckError says what is wrong."""
    path = root / name / "state.json"
    try:
        with path.open("rb") as handle:
            state = json.loads(handle.read(MAX_STATE))
    except FileNotFoundError:
        raise LabCheckError(f"no lab named {name} under {root} ('flannel-lab up --name "
                            f"{name}' builds one; --lab-root if it lives elsewhere)") from None
    except (OSError, ValueError) as err:
        raise LabCheckError(f"cannot read {path}: {err}") from None
    endpoint = state.get("etcd_endpoint") if isinstance(state, dict) else None
    raw_nodes = state.get("nodes") if isinstance(state, dict) else None
    if not isinstance(endpoint, str) or not endpoint or not isinstance(raw_nodes, list):
        raise LabCheckError(f"{path} describes no running lab (no etcd endpoint or nodes)")
    nodes = []
    for raw in raw_nodes:
        try:
            node = LabNode(int(raw["index"]), str(raw["netns"]),
                           str(IPv4Address(raw["address"])), str(raw["subnet_file"]))
        except (KeyError, TypeError, ValueError) as err:
            raise LabCheckError(f"{path}: a node entry is unusable ({err})") from None
        # The lab names every namespace after itself: anything else is not the lab's.
        if not node.netns.startswith(f"{name}-") or len(node.netns) > 64 \
                or not Path(node.subnet_file).is_absolute():
            raise LabCheckError(f"{path}: node {node.index} does not belong to lab {name}")
        nodes.append(node)
    if not nodes:
        raise LabCheckError(f"lab {name} has no nodes")
    return endpoint, sorted(nodes, key=lambda n: n.index)


def node_command(node: LabNode, endpoint: str, args: CheckOptions) -> list[str]:
    return [shutil.which("ip") or "ip", "netns", "exec", node.netns, sys.executable, "-m",
            "flannel.ctl", "check", "--json", f"--etcd-endpoints={endpoint}",
            f"--subnet-file={node.subnet_file}", f"--count={args.count}",
            f"--interval={args.interval:g}", f"--timeout={args.timeout:g}",
            f"--parallel={args.parallel}", f"--deadline={args.deadline:g}",
            *([] if args.max_age is None else [f"--max-age={args.max_age:g}"])]


def check_node(node: LabNode, endpoint: str, args: CheckOptions,
               running: set[subprocess.Popen[bytes]]) -> NodeOutcome:
    """Run the check in ``node``; its process is in ``running`` while it runs (so that a
    stop ends it at once)."""
    # The node's own store round trips (10 s) and probes (--deadline) bound its run.
    limit = args.deadline + 30
    try:
        proc = subprocess.Popen(node_command(node, endpoint, args), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    except OSError as err:
        return NodeOutcome(node, error=f"cannot run the check in {node.netns}: {err}")
    running.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return NodeOutcome(node, error=f"the check in {node.netns} did not end within "
                                       f"{limit:g}s")
    finally:
        running.discard(proc)
    out = stdout[:MAX_OUTPUT].decode(errors="replace")
    try:
        doc = json.loads(out)
    except ValueError:
        said = stderr[:2000].decode(errors="replace").strip()
        return NodeOutcome(node, error=f"the check in {node.netns} failed (exit "
                                       f"{proc.returncode}): {said or out[:2000]}")
    if not isinstance(doc, dict):
        return NodeOutcome(node, error=f"the check in {node.netns} gave no report")
    return NodeOutcome(node, doc, str(doc.get("error") or ""))


def pairs_of(outcomes: list[NodeOutcome]) -> list[Pair]:
    """Every (from, to) pair of nodes, one per IP family checked, plus leases of no lab node
    that a node saw."""
    by_address = {o.node.address: o.node for o in outcomes}
    pairs = []
    for outcome in outcomes:
        seen = set()
        for peer in outcome.peers():
            dest = by_address.get(str(peer.get("node_ip") or peer.get("public_ip")))
            if dest is not None:
                seen.add(dest.index)
            pairs.append(Pair(outcome.node, dest, str(peer.get("verdict")), peer,
                              str(peer.get("detail") or "")))
        if outcome.error:
            continue
        for other in outcomes:
            if other.node.index != outcome.node.index and other.node.index not in seen:
                pairs.append(Pair(outcome.node, other.node, "no-lease", {},
                                  f"{other.node.label} holds no lease in the store (is its "
                                  "flanneld running?)"))
    return pairs


def doctor_command(node: LabNode, endpoint: str) -> str:
    return (f"ip netns exec {node.netns} " + flannelctl(
        "doctor", f"--etcd-endpoints={endpoint}", f"--subnet-file={node.subnet_file}"))


def next_step(pair: Pair) -> tuple[str, LabNode | None]:
    """What to do about a failing pair, and the node to run doctor on first."""
    here = pair.source.label
    there = pair.dest.label if pair.dest else f"the node {pair.peer.get('public_ip')}"
    if pair.verdict in ("timeout", "lossy"):
        # The node's own advice: what doctor probes for that peer, from its backend.
        advice = pair.peer.get("next")
        return (f"on {here}: {advice}" if isinstance(advice, str) and advice else
                f"run flannelctl doctor on {here}, then on {there}"), pair.source
    if pair.verdict == "no-lease":
        return f"run flannelctl doctor on {there}", pair.dest
    if pair.verdict == "skipped":
        return str(pair.peer.get("next") or flannelctl("leases", "show",
                                                        str(pair.peer.get("subnet")))), None
    return f"run flannelctl doctor on {here}", pair.source


def _cell(pair: Pair | None) -> str:
    if pair is None:
        return "?"
    if pair.fails:
        return pair.verdict.upper()
    p50 = (pair.peer.get("rtt_ms") or {}).get("p50")
    return f"{pair.verdict} {p50:.2f}ms" if isinstance(p50, (int, float)) else pair.verdict


def render(name: str, endpoint: str, outcomes: list[NodeOutcome], pairs: list[Pair]) -> str:
    failing = [p for p in pairs if p.fails]
    broken = [o for o in outcomes if o.error]
    lines = [f"lab {name}: {len(outcomes)} nodes, {len(pairs)} pairs checked, "
             f"{len(failing)} failing" + (f", {len(broken)} nodes not checked" if broken
                                          else "")]
    lines += [f"note: {note}" for note in dict.fromkeys(o.note for o in outcomes if o.note)]
    cells: dict[tuple[int, int], Pair] = {}
    for pair in pairs:  # a failing family shows over an answering one
        key = (pair.source.index, pair.dest.index) if pair.dest is not None else None
        if key is not None and (key not in cells or pair.fails):
            cells[key] = pair
    header = ["from \\ to"] + [f"{o.node.label} {o.subnet}" for o in outcomes]
    rows = [header]
    for outcome in outcomes:
        row = [f"{outcome.node.label} {outcome.node.address}"]
        for other in outcomes:
            if other is outcome:
                row.append("-")
            elif outcome.error:
                row.append("NOT CHECKED")
            else:
                row.append(_cell(cells.get((outcome.node.index, other.node.index))))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in rows]
    for outcome in broken:
        lines.append(f"{outcome.node.label} not checked: {outcome.error}")
        lines.append(f"  next: {doctor_command(outcome.node, endpoint)}")
    if failing:
        lines.append("failing pairs:")
    for pair in failing:
        dest = pair.dest.label if pair.dest else f"{pair.peer.get('subnet')} (no lab node)"
        over = " over IPv6" if pair.peer.get("family") == 6 else ""
        lines.append(f"  {pair.source.label} -> {dest}{over}: {pair.verdict}: {pair.detail}")
        step, node = next_step(pair)
        lines.append(f"    next: {step}")
        if node is not None:
            lines.append(f"    {node.label}: {doctor_command(node, endpoint)}")
    return "\n".join(lines)


def as_json(name: str, outcomes: list[NodeOutcome], pairs: list[Pair], ok: bool
            ) -> dict[str, Any]:
    return {"lab": name, "ok": ok,
            "nodes": [{"node": o.node.label, "netns": o.node.netns,
                       "public_ip": o.node.address, "subnet": o.subnet,
                       "note": o.note or None, "error": o.error or None}
                      for o in outcomes],
            "pairs": [{"from": p.source.label, "to": p.dest.label if p.dest else None,
                       "family": p.peer.get("family", 4) if p.peer else 4,
                       "verdict": p.verdict, "detail": p.detail,
                       "next": next_step(p)[0] if p.fails else "",
                       "peer": p.peer or None} for p in pairs]}


def cmd_check_lab(args: CheckOptions) -> int:
    try:
        endpoint, nodes = read_lab(args.lab, args.lab_root)
    except LabCheckError as err:
        print(f"flannelctl check: {err}", file=sys.stderr)
        return 1
    running: set[subprocess.Popen[bytes]] = set()
    with ThreadPoolExecutor(max_workers=min(NODES_AT_ONCE, len(nodes))) as pool:
        try:
            outcomes = list(pool.map(lambda node: check_node(node, endpoint, args, running),
                                     nodes))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the checks in the nodes end too
            pool.shutdown(cancel_futures=True, wait=False)
            for proc in list(running):
                proc.kill()
            raise
    pairs = pairs_of(outcomes)
    ok = not any(o.error for o in outcomes) and not any(p.fails for p in pairs)
    print(json.dumps(as_json(args.lab, outcomes, pairs, ok), indent=2) if args.json
          else render(args.lab, endpoint, outcomes, pairs))
    return 0 if ok else 1
