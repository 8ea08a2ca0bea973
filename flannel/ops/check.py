"""``flannelctl check``: does this node reach every peer over the overlay, how fast, how lossy.

Owns choosing what to probe on each peer and from where, probing every peer at once (at most
``--parallel`` in flight, all within ``--deadline``), the verdict per peer and its next step,
and the table or JSON. What answers on a peer (checked in the lab): with vxlan, the VTEP
address, the base address of the peer's subnet, which flanneld itself puts on
``flannel.<VNI>`` (so it answers whether or not the node runs pods), as on the devices of
udp, wireguard and ipip; with host-gw and the others, the first address of the subnet, the
``cni0`` gateway, which exists once the node runs a pod (the base address answers nowhere
there). Echoes leave from this node's own address of the same kind, so the answer comes back
over the overlay too. What "programmed" means comes from the backend's declared
``Footprint`` (``flannel/backend/footprint.py``): a route per peer, one route covering the
Network through the backend's device, or nothing this node's kernel can show (the
extension's own commands, a VPC's route table), which is said and left to the echoes.
Verdicts: ``ok`` (every echo answered), ``lossy`` (some), ``timeout`` (none, and nothing said
why), ``unreachable`` (an ICMP error came back, or the echo could not be sent),
``not-programmed`` (this node's kernel lacks the route, or for vxlan the neighbour or FDB
entry, that flanneld makes for the lease: no echo is sent, it could only time out, or come
back unreachable after the kernel's 3 s of ARP), ``bad-lease`` (a lease no flanneld
programs), ``not-probed`` (the deadline came first), ``no-data-path`` (the alloc backend
carries no traffic: nothing to probe). Exit status 0 only when every peer answers (``ok`` or
``lossy``) or no data path is expected.
Must not change anything.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import sys
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.backend.footprint import COVERING, PER_PEER, Footprint
from flannel.lease import Lease
from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.icmp import IcmpError, Pinger, Probe
from flannel.ops.leases import vtep_mac

if TYPE_CHECKING:
    from flannel.ops.options import CheckOptions
    from flannel.ops.storeflags import StoreOptions

MAIN_TABLE = 254
ANSWERING = ("ok", "lossy")
#: Verdicts that are no failure: answers, and peers of a backend that carries no traffic.
PASSING = (*ANSWERING, "no-data-path")


class CheckError(Exception):
    """The check cannot run on this node; the message says why and what to do."""


@dataclass
class PeerResult:
    """One peer's row: its lease, what was probed and what came of it."""

    subnet: IPv4Network
    public_ip: str
    backend: str
    target: str = ""
    sent: int = 0
    rtts: tuple[float, ...] = ()  # seconds
    verdict: str = "not-probed"
    detail: str = ""
    next_step: str = ""

    @property
    def answers(self) -> bool:
        return self.verdict in PASSING

    @property
    def loss(self) -> float | None:
        return None if not self.sent else 1 - len(self.rtts) / self.sent

    def as_json(self) -> dict[str, Any]:
        return {"subnet": str(self.subnet), "public_ip": self.public_ip or None,
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
    source: str  # the address the echoes left from; "" if the kernel chose
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


def probe_target(subnet: IPv4Network, footprint: Footprint) -> IPv4Address:
    """The peer address that answers: the base address on the backend's device, else the
    cni0 gateway."""
    return subnet.network_address + (0 if footprint.answers_on_base else 1)


@dataclass(frozen=True)
class Programmed:
    """What this namespace's kernel holds for peers: main-table IPv4 routes (destination ->
    device name), neighbours (address -> MAC) and FDB entries (MAC, destination)."""

    routes: dict[IPv4Network, str]
    neighbours: dict[str, str]
    fdb: frozenset[tuple[str, str]]

    def route_for(self, subnet: IPv4Network) -> IPv4Network | None:
        """The most specific main-table route covering all of ``subnet``."""
        covering = [dst for dst in self.routes if subnet.subnet_of(dst)]
        return max(covering, key=lambda dst: dst.prefixlen, default=None)

    def missing(self, lease: Lease, target: str, footprint: Footprint, device: str) -> str:
        """What flanneld would have programmed for ``lease`` and the kernel lacks; "" (also
        when this backend's programming does not show in the kernel)."""
        subnet, public = lease.subnet, str(lease.attrs.public_ip)
        assert subnet is not None  # only leases with a subnet are planned
        not_done = "flanneld here has not programmed that lease"
        if footprint.routes == COVERING:
            route = self.route_for(subnet)
            if route is None or route.prefixlen == 0:  # a default route is no overlay
                return (f"this node has no route to {subnet} (flanneld routes the whole "
                        f"Network through {device}): {not_done}")
            if self.routes[route] != device:
                return (f"this node routes {subnet} through {self.routes[route] or '?'} "
                        f"(route {route}), not through {device}: something else took it")
            return ""
        if footprint.routes != PER_PEER:
            return ""
        if subnet not in self.routes:
            return f"this node has no route to {subnet}: {not_done}"
        mac = vtep_mac(lease)
        if mac is None:
            return ""
        have = self.neighbours.get(target)
        if have is None:
            return f"this node has no neighbour entry for the VTEP {target}: {not_done}"
        if have != mac:
            return (f"this node's neighbour entry for the VTEP {target} has MAC {have}, the "
                    f"lease publishes {mac}: something changed it behind flanneld's back")
        if (mac, public) not in self.fdb:
            return f"this node has no FDB entry sending {mac} to {public}: {not_done}"
        return ""


def read_programmed() -> Programmed | None:
    """The kernel's routes, neighbours and FDB of this namespace; None if unreadable."""
    from flannel.kernel import rtnl

    try:
        with rtnl.Rtnl() as conn:
            routes = {_network(route.dst): _ifname(route.oif) for route, _proto, table in
                      conn.routes(socket.AF_INET) if table == MAIN_TABLE}
            neighbours = {entry.ip: entry.mac for entry, _state, _flags in
                          conn.neighbours(socket.AF_INET)
                          if isinstance(entry, rtnl.Neighbour) and entry.mac}
            fdb = frozenset((entry.mac, entry.dst) for entry, _state, _flags in
                            conn.neighbours(rtnl.AF_BRIDGE)
                            if isinstance(entry, rtnl.FdbEntry))
    except OSError:
        return None
    return Programmed(routes, neighbours, fdb)


def _network(dst: str) -> IPv4Network:
    return IPv4Network("0.0.0.0/0" if dst == "default" else dst, strict=False)


def _ifname(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:  # a route without a device (blackhole, unreachable)
        return ""


def _carries(lease_type: str, verb: str = "carries") -> str:
    return f"{verb} BackendType {lease_type}" if lease_type else f"{verb} no BackendType"


def plan(ctx: Context, kernel: Programmed | None
         ) -> tuple[list[PeerResult], list[PeerResult]]:
    """(peers to probe, peers decided without probing) from the store's leases. A
    reservation no node has taken yet (no backend) is no peer."""
    described = ctx.described
    assert described is not None  # run_check refuses a backend it does not know
    lease_type, footprint = described
    own = ctx.own_subnet
    usable = {id(lease) for lease in ctx.peers}
    probe: list[PeerResult] = []
    decided: list[PeerResult] = []
    leases: list[Lease] = sorted((lease for lease in ctx.leases
                                  if lease.subnet is not None and lease.subnet != own
                                  and (lease.attrs.backend_type or not lease.is_reservation)),
                                 key=lambda lease: lease.subnet or IPv4Network("0.0.0.0/0"))
    for lease in leases:
        subnet = lease.subnet
        assert subnet is not None
        attrs = lease.attrs
        row = PeerResult(subnet, str(attrs.public_ip or ""), attrs.backend_type)
        target = str(probe_target(subnet, footprint))
        if id(lease) not in usable:
            row.verdict = "bad-lease"
            row.detail = ("no flanneld programs this lease (no public IP, outside the "
                          "Network, or a vxlan lease without a VTEP MAC)")
            row.next_step = flannelctl("leases", "show", str(subnet))
            decided.append(row)
        elif attrs.backend_type != lease_type:
            row.verdict = "not-programmed"
            row.detail = (f"its lease {_carries(attrs.backend_type)} but this node runs "
                          f"{ctx.backend}, whose leases {_carries(lease_type, 'carry')}: flanneld "
                          "ignores it")
            row.next_step = "give every node the same Backend in the network config"
            decided.append(row)
        elif not footprint.has_data_path:
            row.verdict = "no-data-path"
            decided.append(row)
        elif kernel is not None and (missing := kernel.missing(lease, target, footprint,
                                                               ctx.device)):
            row.verdict = "not-programmed"
            row.detail = missing
            row.next_step = ("run flannelctl doctor on this node (is flanneld running, and "
                             "what does its log say about that peer?)")
            decided.append(row)
        else:
            row.target = target
            probe.append(row)
    return probe, decided


def judge(row: PeerResult, probe: Probe, timeout: float, encap: str) -> None:
    """Set the row's verdict, detail and next step from what its echoes gave."""
    row.sent, row.rtts = probe.sent, tuple(probe.rtts)
    doctor_here = "run flannelctl doctor on this node"
    if probe.rtts:
        row.verdict = "ok" if not probe.lost else "lossy"
        if probe.lost:
            row.detail = f"{probe.lost} of {probe.sent} echoes to {row.target} got no answer"
            row.next_step = (f"{doctor_here} (its path-MTU and encapsulation probes), and "
                             "look for drops on the underlay")
    elif probe.send_error or probe.errors:
        row.verdict = "unreachable"
        row.detail = (f"echoes to {row.target} cannot be sent: {probe.send_error}"
                      if probe.send_error else f"{probe.errors[0]} ({len(probe.errors)} of "
                      f"{probe.sent} echoes)")
        row.next_step = (f"{doctor_here}: its route, neighbour and FDB checks say which "
                         f"entry for {row.subnet} is wrong")
    else:
        row.verdict = "timeout"
        row.detail = (f"no answer from {row.target} to {probe.sent} echoes within "
                      f"{timeout:g}s")
        row.next_step = (f"{doctor_here}: it probes {row.public_ip} on the underlay{encap}, "
                         "telling a node that is down from a blocked port; then on the node "
                         f"{row.public_ip}")


async def probe_all(rows: list[PeerResult], pinger: Pinger, args: CheckOptions,
                    encap: str) -> None:
    """Probe every row, at most ``args.parallel`` at once, all within ``args.deadline``."""
    limit = asyncio.Semaphore(args.parallel)

    async def one(row: PeerResult) -> None:
        async with limit:
            probe = await pinger.probe(IPv4Address(row.target), args.count, args.interval,
                                       args.timeout)
        judge(row, probe, args.timeout, encap)

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
    described = ctx.described
    if described is None:
        raise CheckError(f"the network config names the backend {ctx.backend!r}, which this "
                         "pyflannel does not know: no flanneld runs it")
    footprint = described[1]
    to_probe, decided = plan(ctx, read_programmed())
    own_lease = ctx.own_lease
    encap = f" and on the VXLAN port (UDP {ctx.encap_port})" if footprint.vtep else ""
    # Our own address of the kind the peers answer on: the device's base address, else cni0's.
    sources = [own.network_address, own.network_address + 1]
    if not footprint.answers_on_base:
        sources.reverse()
    note = ""
    if footprint.unjudged:
        note = footprint.unjudged + (": the echoes alone decide" if footprint.has_data_path
                                     else ": nothing is probed")

    async def probe_peers() -> str:
        pinger = Pinger(sources)
        try:
            await probe_all(to_probe, pinger, args, encap)
        finally:
            pinger.close()
        return str(pinger.source or "")

    source = asyncio.run(probe_peers()) if to_probe else ""
    peers = sorted(to_probe + decided, key=lambda row: row.subnet)
    public = str(own_lease.attrs.public_ip or "") if own_lease else ""
    return NodeCheck(own, public, ctx.backend, source, peers, note)


def _cell(value: object) -> str:
    return "-" if value in (None, "") else str(value)


def ms_text(rtts: tuple[float, ...], pick: Any) -> str:
    value = _ms(rtts, pick)
    return "-" if value is None else f"{value:.2f}ms"


def render(check: NodeCheck) -> str:
    """The table, one row per peer, failing verdicts in capitals, then what to do."""
    source = check.source or "the address the kernel picks"
    head = (f"this node: {check.subnet} ({_cell(check.public_ip)}, {_cell(check.backend)}), "
            + (f"echoes from {source}" if any(p.sent for p in check.peers)
               else "no echoes sent"))
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
    if failing:
        out.append(f"{len(failing)} of {len(check.peers)} peers do not answer:")
    elif any(peer.verdict in ANSWERING for peer in check.peers):
        out.append(f"every peer answers ({len(check.peers)})")
    else:
        out.append(f"{len(check.peers)} peers, no data path to probe")
    for peer in noted:
        out.append(f"  {peer.subnet} ({_cell(peer.public_ip)}): {peer.verdict}: "
                   f"{peer.detail}")
        if peer.next_step:
            out.append(f"    next: {peer.next_step}")
    return "\n".join(out)


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
