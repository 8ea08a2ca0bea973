"""``flannelctl check``: does this node reach every peer over the overlay, how fast, how lossy.

Owns choosing what to probe on each peer and from where, probing every peer at once (at most
``--parallel`` in flight, all within ``--deadline``), the verdict per peer and IP family and
its next step, and the table or JSON. Which leases flanneld uses, what this node's kernel and
engines hold for each, what answers on a peer and how its traffic travels come from the
backend's description (``flannel/ops/plans.py``): the peer's device base address, which
flanneld itself puts on its device (so it answers whether or not the node runs pods), or its
``cni0`` gateway, the subnet's first address, which exists once the node runs a pod. Echoes
leave from this node's own address of the same kind, so the answer comes back over the
overlay too; a dual-stack network is probed in both families, one row each.
Verdicts: ``ok`` (every echo answered), ``lossy`` (some), ``timeout`` (none, and nothing said
why), ``unreachable`` (an ICMP error came back, or the echo could not be sent),
``not-programmed`` (this node's kernel or engine lacks an entry flanneld makes for the lease:
no echo is sent, it could only time out), ``parked`` (flanneld left the peer out because the
kernel refused its entries, as its /status says, and tries it again), ``skipped`` (flanneld
does not use the lease, and says why: another backend's, outside the Network, bad backend
data, an identity another lease holds), ``not-probed`` (the
deadline came first), ``no-data-path`` (the backend only reserves subnets and carries no
traffic: nothing to probe). A reservation no node has taken yet is no row. Exit status 0
only when every peer answers (``ok`` or ``lossy``) or no data path is expected.
Must not change anything.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.backend.plan import Carrier, Description
from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.plans import KernelEntries, engine_gaps, kernel_gaps
from flannel.probing.icmp import IcmpError, Pinger, Probe

if TYPE_CHECKING:
    from flannel.backend.plan import EngineReading
    from flannel.ops.options import CheckOptions
    from flannel.ops.storeflags import StoreOptions

ANSWERING = ("ok", "lossy")
#: Verdicts that are no failure: answers, and peers of a backend that carries no traffic.
PASSING = (*ANSWERING, "no-data-path")
DOCTOR_HERE = "run flannelctl doctor on this node"


class CheckError(Exception):
    """The check cannot run on this node; the message says why and what to do."""


@dataclass
class PeerResult:
    """One peer's row in one IP family: its lease, what was probed and what came of it.
    ``public_ip``: the peer's address of that family; ``node_ip``: its lease's IPv4 one
    (what names the node)."""

    subnet: IPv4Network | IPv6Network
    public_ip: str
    backend: str
    target: str = ""
    sent: int = 0
    rtts: tuple[float, ...] = ()  # seconds
    verdict: str = "not-probed"
    detail: str = ""
    next_step: str = ""
    family: int = 4
    node_ip: str = ""
    carrier: Carrier | None = None
    #: Judged from flanneld's own fresh probe, not from echoes this check sent.
    by_flanneld: bool = False

    @property
    def answers(self) -> bool:
        return self.verdict in PASSING

    @property
    def loss(self) -> float | None:
        return None if not self.sent else 1 - len(self.rtts) / self.sent

    def as_json(self) -> dict[str, Any]:
        return {"subnet": str(self.subnet), "family": self.family,
                "public_ip": self.public_ip or None, "node_ip": self.node_ip or None,
                "backend": self.backend or None, "target": self.target or None,
                "sent": self.sent, "received": len(self.rtts),
                "loss": None if self.loss is None else round(self.loss, 4),
                "rtt_ms": {"p50": _ms(self.rtts, statistics.median),
                           "max": _ms(self.rtts, max)},
                "verdict": self.verdict, "detail": self.detail, "next": self.next_step}


def _ms(rtts: tuple[float, ...], pick: Any) -> float | None:
    return round(pick(rtts) * 1000, 3) if rtts else None


@dataclass
class NodeCheck:
    """This node and every peer's result."""

    subnet: IPv4Network
    public_ip: str
    backend: str
    source: str  # the addresses the echoes left from; "" if none were sent
    peers: list[PeerResult]
    note: str = ""  # what this node's kernel cannot show for its backend ("" when judged)

    @property
    def ok(self) -> bool:
        return all(peer.answers for peer in self.peers)

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "node": {"subnet": str(self.subnet),
                                        "public_ip": self.public_ip or None,
                                        "backend": self.backend or None,
                                        "source": self.source or None,
                                        "note": self.note or None},
                "peers": [peer.as_json() for peer in self.peers]}


def plan(ctx: Context, description: Description, kernel: KernelEntries,
         engine: EngineReading | None) -> tuple[list[PeerResult], list[PeerResult]]:
    """(rows to probe, rows decided without probing), one per lease and IP family, from
    what flanneld does with each lease. A reservation no node has taken yet is no peer."""
    probe: list[PeerResult] = []
    decided: list[PeerResult] = []
    parked = ctx.parked
    for peer in description.peers:
        lease = peer.lease
        node_ip = str(lease.attrs.public_ip or "")
        if peer.reserved:
            continue
        if peer.used and lease.key in parked:
            decided += [PeerResult(
                family.subnet, str(family.public or ""), lease.attrs.backend_type,
                verdict="parked", family=family.version, node_ip=node_ip,
                detail=f"parked by flanneld, the kernel refused its entries: {parked[lease.key]}",
                next_step=flannelctl("leases", "show", lease.key))
                for family in peer.families]
            continue
        if peer.skipped:
            subnet = lease.subnet or lease.ipv6_subnet
            assert subnet is not None  # every lease has a subnet of some family
            decided.append(PeerResult(
                subnet, node_ip, lease.attrs.backend_type, verdict="skipped",
                detail=f"skipped by flanneld: {peer.skipped}",
                next_step=flannelctl("leases", "show", lease.key), node_ip=node_ip))
            continue
        for family in peer.families:
            row = PeerResult(family.subnet, str(family.public or ""), lease.attrs.backend_type,
                             family=family.version, node_ip=node_ip, carrier=family.carrier)
            gaps = [] if family.skipped else kernel_gaps(peer, family, kernel) + (
                engine_gaps(peer, family, engine) if engine is not None
                and not engine.unread else [])
            if family.skipped:
                row.verdict = "skipped"
                row.detail = f"skipped by flanneld: {family.skipped}"
                row.next_step = flannelctl("leases", "show", lease.key)
            elif not description.node.data_path:
                row.verdict = "no-data-path"
            elif gaps:
                row.verdict = "not-programmed"
                row.detail = f"this node lacks what flanneld makes for it: {gaps[0].what}"
                row.next_step = (f"{DOCTOR_HERE} (is flanneld running, and what does its log "
                                 "say about that peer?)")
            elif family.answers_on is None or family.version not in description.node.local:
                row.verdict = "not-probed"
                row.detail = "no address of this node to send echoes from in that family"
            else:
                row.target = str(family.answers_on)
                if not _from_flanneld(ctx, row, lease.key):
                    probe.append(row)
                    continue
            decided.append(row)
    return probe, decided


#: flanneld's causes of a peer that does not answer (``flannel/probing/sequence.py``); its
#: ``mtu_too_small`` is left to check's own echoes, which are small and cross.
UNANSWERED = ("peer_down", "encap_blocked", "encap_refused", "overlay_down")


def _from_flanneld(ctx: Context, row: PeerResult, key: str) -> bool:
    """Judge ``row`` from flanneld's own probe of it when that is fresh (see
    ``flannel/ops/flanneldview.py``); whether it did."""
    fresh = ctx.probed.fresh(key, row.family, ctx.max_age)
    if fresh is None:
        return False
    said = f"flanneld's own probe, {fresh.age:.0f}s ago"
    row.by_flanneld = True
    if fresh.result == "reached":
        row.verdict, row.sent = "ok", 1
        row.rtts = (fresh.rtt,) if fresh.rtt is not None else ()
        row.detail = said
        return True
    if fresh.result in UNANSWERED:
        # No answer over the overlay, as check's own echoes would find: the verdict is the
        # same whoever probed (``unreachable`` is an ICMP error to check's own echo).
        row.verdict, row.sent = "timeout", 1
        row.detail = f"{fresh.detail or fresh.result} ({said})"
        row.next_step = f"{DOCTOR_HERE} (--max-age=0 to probe from here)"
        return True
    return False


def doctor_probes(carrier: Carrier | None, public: str) -> str:
    """What doctor probes for a peer that does not answer, said as the description lets it:
    never a probe doctor does not make."""
    said = f"this node's own firewall, {public} on the underlay"
    if carrier is not None and carrier.refuses and carrier.udp_ports:
        said += (f" and {carrier.name} on {carrier.ports_text}, telling a node that is down "
                 "from a blocked port")
    elif carrier is not None and carrier.unprobed:
        said += f" (not {carrier.name}: {carrier.unprobed})"
    return said


def judge(row: PeerResult, probe: Probe, timeout: float) -> None:
    """Set the row's verdict, detail and next step from what its echoes gave."""
    row.sent, row.rtts = probe.sent, tuple(probe.rtts)
    if probe.rtts:
        row.verdict = "ok" if not probe.lost else "lossy"
        if probe.lost:
            row.detail = f"{probe.lost} of {probe.sent} echoes to {row.target} got no answer"
            row.next_step = (f"{DOCTOR_HERE} (its path-MTU and carrier probes), and look for "
                             "drops on the underlay")
    elif probe.send_error or probe.errors:
        row.verdict = "unreachable"
        row.detail = (f"echoes to {row.target} cannot be sent: {probe.send_error}"
                      if probe.send_error else f"{probe.errors[0]} ({len(probe.errors)} of "
                      f"{probe.sent} echoes)")
        row.next_step = (f"{DOCTOR_HERE}: its kernel checks say which entry for {row.subnet} "
                         "is wrong")
    else:
        row.verdict = "timeout"
        row.detail = (f"no answer from {row.target} to {probe.sent} echoes within "
                      f"{timeout:g}s")
        row.next_step = (f"{DOCTOR_HERE}: it probes {doctor_probes(row.carrier, row.public_ip)}"
                         f"; then on the node {row.node_ip or row.public_ip}")


async def probe_all(rows: list[PeerResult], pingers: dict[int, Pinger],
                    args: CheckOptions) -> None:
    """Probe every row, at most ``args.parallel`` at once, all within ``args.deadline``."""
    limit = asyncio.Semaphore(args.parallel)

    async def one(row: PeerResult) -> None:
        async with limit:
            probe = await pingers[row.family].probe(ip_address(row.target), args.count,
                                                    args.interval, args.timeout)
        judge(row, probe, args.timeout)

    tasks = [asyncio.ensure_future(one(row)) for row in rows]
    if not tasks:
        return
    _done, late = await asyncio.wait(tasks, timeout=args.deadline)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for row in rows:
        if row.verdict == "not-probed":
            row.detail = f"the --deadline of {args.deadline:g}s passed before its probe ended"
            row.next_step = "give a longer --deadline or a larger --parallel"


def run_check(args: CheckOptions, store: StoreOptions) -> NodeCheck:
    from flannel.ops.doctor import read_store, read_subnet_env
    from flannel.ops.plans import read_entries
    from flannel.process.procscan import running_flanneld

    ctx = Context(subnet_file=Path(store.subnet_file), sysctl_root=Path("/proc/sys"),
                  cni_bin_dirs=[], cni_conf_dirs=[], probe_timeout=args.timeout,
                  fix_checksum=False)
    read_subnet_env(ctx)
    if ctx.env is None:
        raise CheckError(f"{ctx.subnet_file}: {ctx.env_error}: is flanneld running on this "
                         "node? run flannelctl doctor")
    own = ctx.own_subnet
    if own is None:
        raise CheckError(f"{ctx.subnet_file} has no valid FLANNEL_SUBNET; restart flanneld "
                         "so it rewrites the file")
    asyncio.run(read_store(ctx, store))
    if ctx.rows is None or ctx.config is None:
        raise CheckError(f"cannot read the store: {ctx.store_error}")
    if ctx.backend_class is None:
        raise CheckError(f"the network config names the backend {ctx.backend!r}, which this "
                         "pyflannel does not know: no flanneld runs it")
    description = ctx.description
    if description is None:
        raise CheckError(f"the network config's backend options are unusable: "
                         f"{ctx.description_error}")
    own_lease = ctx.own_lease
    if own_lease is None:
        raise CheckError(f"the store holds no lease for this node's subnet {own} (expired, "
                         "released or revoked): no peer routes traffic back to it; restart "
                         "flanneld, and run flannelctl doctor")
    ctx.flanneld_pids = running_flanneld()
    ctx.flanneld = args.found
    ctx.max_age = args.max_age
    to_probe, decided = plan(ctx, description, read_entries(), ctx.engine)
    node = description.node
    notes = []
    if node.unjudged:
        notes.append(node.unjudged + (": the echoes alone decide" if node.data_path
                                      else ": nothing is probed"))
    if ctx.view.unread and any(row.verdict == "not-programmed" for row in decided):
        notes.append(f"a peer flanneld parked shows as not-programmed: {ctx.view.unread}")
    note = "; ".join(notes)

    async def probe_peers() -> str:
        pingers: dict[int, Pinger] = {}
        try:
            for version in sorted({row.family for row in to_probe}):
                source = node.local[version]
                pingers[version] = Pinger([source], version)
            await probe_all(to_probe, pingers, args)
        finally:
            for pinger in pingers.values():
                pinger.close()
        return ", ".join(str(p.source) for p in pingers.values() if p.source is not None)

    source = asyncio.run(probe_peers()) if to_probe else ""
    peers = sorted(to_probe + decided, key=lambda row: (row.family, row.subnet))
    public = str(own_lease.attrs.public_ip or "")
    return NodeCheck(own, public, ctx.backend, source, peers, note)


def _cell(value: object) -> str:
    return "-" if value in (None, "") else str(value)


def ms_text(rtts: tuple[float, ...], pick: Any) -> str:
    value = _ms(rtts, pick)
    return "-" if value is None else f"{value:.2f}ms"


def render(check: NodeCheck) -> str:
    """The table, one row per peer, failing verdicts in capitals, then what to do."""
    source = check.source or "the address the kernel picks"
    sent = any(p.sent and not p.by_flanneld for p in check.peers)
    head = (f"this node: {check.subnet} ({_cell(check.public_ip)}, {_cell(check.backend)}), "
            + (f"echoes from {source}" if sent else "no echoes sent")
            + (", rows judged from flanneld's own probes noted so"
               if any(p.by_flanneld for p in check.peers) else ""))
    if check.note:
        head += f"\nnote: {check.note}"
    if not check.peers:
        return f"{head}\nno peers: this node holds the only lease"
    lines = [["PEER SUBNET", "PUBLIC IP", "BACKEND", "TARGET", "P50", "MAX", "LOSS",
              "VERDICT"]]
    for peer in check.peers:
        loss = "-" if peer.loss is None else f"{peer.loss:.0%}"
        verdict = peer.verdict if peer.answers else peer.verdict.upper()
        lines.append([str(peer.subnet), _cell(peer.public_ip), _cell(peer.backend),
                      _cell(peer.target), ms_text(peer.rtts, statistics.median),
                      ms_text(peer.rtts, max), loss, verdict])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = [head]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]
    failing = [peer for peer in check.peers if not peer.answers]
    noted = [peer for peer in check.peers if peer.detail]
    # A dual-stack network has a row per peer and IP family.
    rows = "peers" if all(peer.family == 4 for peer in check.peers) else "peer rows"
    if failing:
        out.append(f"{len(failing)} of {len(check.peers)} {rows} do not answer:")
        out += _notes(peer for peer in noted if not peer.answers)
        # Rows that answer with a note (flanneld's own probe, some echoes lost) are not
        # listed under "do not answer".
        answering = [peer for peer in noted if peer.answers]
        if answering:
            out.append("of those that answer:")
            out += _notes(answering)
        return "\n".join(out)
    if any(peer.verdict in ANSWERING for peer in check.peers):
        out.append(f"every peer answers ({len(check.peers)})")
    else:
        out.append(f"{len(check.peers)} peers, no data path to probe")
    out += _notes(noted)
    return "\n".join(out)


def _notes(peers: Iterable[PeerResult]) -> list[str]:
    """A row's verdict and detail, and what to run next, for the lines below the table."""
    out = []
    for peer in peers:
        out.append(f"  {peer.subnet} ({_cell(peer.public_ip)}): {peer.verdict}: "
                   f"{peer.detail}")
        if peer.next_step:
            out.append(f"    next: {peer.next_step}")
    return out


def cmd_check(args: CheckOptions) -> int:
    if args.store is None:
        from flannel.ops.checklab import cmd_check_lab

        return cmd_check_lab(args)
    try:
        check = run_check(args, args.store)
    except (CheckError, IcmpError) as err:
        if args.json:
            print(json.dumps({"ok": False, "error": str(err), "peers": [],
                              "store": args.source}, indent=2))
        else:
            print(f"flannelctl check: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**check.as_json(), "store": args.source}, indent=2))
    else:
        print(f"{render(check)}\nstore read: {args.source}")
    return 0 if check.ok else 1
