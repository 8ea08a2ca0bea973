"""Probes to every peer, in parallel and bounded in time, in every IP family the network
carries: the overlay, the underlay, what carries the overlay, the path MTU; and first, this
node's own input rules for what carries it.

What a peer's traffic is, where it answers and how its carrier can be probed come from the
backend's description (``flannel/ops/plans.py``). How a failing peer is told apart:
0. Before any probe: does this node's own input path drop the carrier (its nftables ruleset
   and iptables filter tables, ``flannel/ops/firewall.py``)? Then every peer fails for that
   reason, said once, naming the table, chain and rule (finding ``firewall``), and no peer
   is blamed for it.
1. Ping the peer's overlay address (its device's base address, or its ``cni0`` gateway)
   from ours. An answer means the data path works both ways; then step 4.
2. No answer: ping the peer's public address on the underlay. No answer there either: the
   node is down or unreachable (or drops ICMP), whatever else (finding ``underlay``).
3. The underlay answers: probe the carrier. Where nothing but the carrier receives on its
   UDP ports and it answers no stray datagram (``Carrier.refuses``), a datagram sent there
   comes back ICMP port-unreachable when nothing listens (the peer's device or program is
   gone: its flanneld is not running or not programmed), and silence from a host that
   answers ping means something drops it: a firewall on the peer, on the path, or a cloud
   security group (finding ``encap``; silence is also what a healthy port gives, which is
   why step 1 decides "works", not this one). Plain routing (the underlay, or a cloud's
   router, carries pods' packets as they are) has no carrier of its own: the overlay fails
   while the underlay answers (finding ``overlay``). A carrier that cannot be probed says
   why.
4. Path MTU: ping the peer's overlay address with don't-fragment packets of the pods' MTU;
   when small packets arrive and full-size ones do not, probe the underlay at its own MTU to
   say where the packets are lost (finding ``path-mtu``).
Where the running flanneld probed that peer family itself lately (its ``/probes``, fresh:
at most ``--max-age`` old, by default its probe period and the longest a probe takes;
``flannel/ops/flanneldview.py``),
its result stands instead of steps 1 to 4: reached, or its cause as the same finding, the
result's age said; a note counts the peers so judged.
What cannot be probed is said as a note ("not checked: ... because ..."), never passed
over in silence. Must not change anything.
"""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from ipaddress import ip_address

from flannel.backend.plan import Carrier, FamilyPlan, PeerPlan
from flannel.ops.checks import Context
from flannel.ops.checks.kernel import underlay_link
from flannel.ops.findings import Finding
from flannel.ops.firewall import Drop, Target, own_drops
from flannel.ops.plans import engine_gaps, kernel_gaps

MAX_PARALLEL = 16
#: IP + ICMP echo headers, not counted in ping -s.
ICMP_HEADERS = {4: 28, 6: 48}
UDP = 17


def ping(target: str, *, source: str = "", size: int = 56, timeout: float = 1.0,
         count: int = 2) -> bool:
    version = ip_address(target).version
    cmd = [shutil.which("ping") or "ping", f"-{version}", "-n", "-q", "-c", str(count), "-i",
           "0.2", "-W", f"{timeout:g}", "-s", str(size), "-M", "do"]
    if source:
        cmd += ["-I", source]
    try:
        proc = subprocess.run([*cmd, target], capture_output=True, check=False,
                              timeout=count * (timeout + 0.2) + 2, stdin=subprocess.DEVNULL)
    except (subprocess.TimeoutExpired, FileNotFoundError):
        return False
    return proc.returncode == 0


#: Seconds a UDP port is probed at least: Linux sends one address at most one ICMP error a
#: second once a burst of them is spent (net.ipv4.icmp_ratelimit, 1000 ms by default).
PORT_PROBE_WINDOW = 1.25


def udp_port_refused(host: str, port: int, timeout: float) -> bool | None:
    """True when the host answers port-unreachable, False on silence, None if unsendable.
    Datagrams leave every ``timeout / 3`` seconds for ``timeout``, and at least
    ``PORT_PROBE_WINDOW``: once a host has sent this one its burst of ICMP errors (the
    overlay's own traffic to a port nothing listens on spends it), it answers the next at
    most a second later."""
    family = socket.AF_INET6 if ip_address(host).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout / 3)
            sock.connect((host, port))
            deadline = time.monotonic() + max(timeout, PORT_PROBE_WINDOW)
            while time.monotonic() < deadline:
                try:
                    sock.send(b"flannelctl doctor probe")
                    sock.recv(64)
                except ConnectionRefusedError:
                    return True
                except TimeoutError:
                    continue
                except OSError as err:
                    if err.errno == errno.ECONNREFUSED:
                        return True
                    return None
    except OSError:
        return None
    return False


def holds(address: str) -> bool:
    """Whether this node holds ``address`` (so echoes can leave from it)."""
    family = socket.AF_INET6 if ip_address(address).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
    except OSError:
        return False
    return True


def targets(carrier: Carrier) -> list[Target]:
    return [*(Target(UDP, port) for port in carrier.udp_ports),
            *(Target(proto) for proto in carrier.ip_protocols)]


def _label(plan: PeerPlan, family: FamilyPlan) -> str:
    over = " over IPv6" if family.version == 6 else ""
    return f"node {family.public} ({family.subnet}){over}"


#: flanneld's causes (``flannel/probing/sequence.py``) as doctor's checks, with the fix.
FLANNELD_CAUSES = {
    "peer_down": ("underlay", "check that the node is up and that this node reaches {public}"),
    "encap_blocked": ("encap", "allow {ports} between all nodes (e.g. nft/iptables, firewalld, "
                      "the security group); if it is open, run flannelctl doctor on that node"),
    "encap_refused": ("encap", "is flanneld running there? run flannelctl doctor on that node"),
    "overlay_down": ("overlay", "run flannelctl doctor on that node: its routes, its "
                     "forwarding rules and, where the peer answers on its cni0 gateway, "
                     "whether it runs a pod yet"),
    "mtu_too_small": ("path-mtu", "give every node's underlay interface the same MTU, and pods "
                      "an MTU the overlay carries (Backend.MTU where the backend has that "
                      "option); restart flanneld on every node, then recreate the pods"),
}


def from_flanneld(ctx: Context, plan: PeerPlan, family: FamilyPlan, dropped_here: bool
                  ) -> list[Finding] | None:
    """What flanneld's own fresh probe of that peer family found, as findings; None when it
    has no fresh result (doctor probes then)."""
    fresh = ctx.probed.fresh(plan.lease.key, family.version, ctx.max_age)
    if fresh is None or (fresh.result != "reached" and fresh.result not in FLANNELD_CAUSES):
        return None
    if fresh.result == "reached":
        return []
    if dropped_here and fresh.result == "encap_blocked":
        return []  # this node's own rules drop it: the firewall finding says so, once
    check, fix = FLANNELD_CAUSES[fresh.result]
    return [Finding(check, "error", f"{fresh.detail or fresh.result} (flanneld's own probe, "
                    f"{fresh.age:.0f}s ago)",
                    fix.format(public=family.public, ports=family.carrier.ports_text))]


def probe_family(ctx: Context, plan: PeerPlan, family: FamilyPlan, source: str,
                 dropped_here: bool) -> list[Finding]:
    """Steps 1 to 4 for one peer family (see the module docstring), or what flanneld's own
    probe found when it is fresh."""
    told = from_flanneld(ctx, plan, family, dropped_here)
    if told is not None:
        return told
    timeout = ctx.probe_timeout
    node = _label(plan, family)
    target = str(family.answers_on)
    if ping(target, source=source, timeout=timeout):
        return probe_mtu(ctx, family, source, node)
    public = str(family.public)
    if not ping(public, timeout=timeout):
        reserved = (" (its lease is a reservation: the node it is reserved for may not run "
                    "yet)") if plan.lease.is_reservation else ""
        return [Finding("underlay", "error", f"{node} does not answer on the underlay: it is "
                        f"down, unreachable from here, or drops ICMP{reserved}",
                        f"check that the node is up and that this node reaches {public}")]
    carrier = family.carrier
    if dropped_here:
        return []  # this node's own rules drop it: the firewall finding says so, once
    if not carrier.udp_ports and not carrier.ip_protocols and not carrier.unprobed:
        return [Finding("overlay", "error", f"{node} answers on the underlay, but {target} "
                        f"does not answer over the overlay ({carrier.name})",
                        "run flannelctl doctor on that node: its routes, its forwarding rules "
                        "and, where the peer answers on its cni0 gateway, whether it runs a "
                        "pod yet")]
    if carrier.unprobed or not carrier.refuses or not carrier.udp_ports:
        why = carrier.unprobed or f"nothing tells a dropped {carrier.ports_text} from an open one"
        return [Finding("overlay", "error", f"{node} answers on the underlay, but {target} "
                        f"does not answer over the overlay; {carrier.name} is not checked: "
                        f"{why}", "run flannelctl doctor on that node")]
    refused = [port for port in carrier.udp_ports
               if udp_port_refused(public, port, timeout)]
    if refused:
        ports = ", ".join(str(p) for p in refused)
        return [Finding("encap", "error", f"{node} answers ping, but nothing listens on UDP "
                        f"{ports}, where {carrier.name} receives: its device or the program "
                        "serving it is gone there",
                        "is flanneld running there? run flannelctl doctor on that node")]
    note = _engine_note(ctx, family)
    return [Finding("encap", "error", f"{node} answers ping but {carrier.name} traffic to "
                    f"{carrier.ports_text} gets no answer: a firewall drops it (on that node, "
                    f"on the path or in a cloud security group){note}",
                    f"allow {carrier.ports_text} between all nodes (e.g. nft/iptables, "
                    "firewalld, the security group); if it is open, run flannelctl doctor on "
                    "that node")]


def _engine_note(ctx: Context, family: FamilyPlan) -> str:
    """What the engine says of the peer (e.g. its latest handshake), as a note."""
    reading = ctx.engine
    if reading is None:
        return ""
    notes = [reading.notes[entry.identity] for entry in family.engine
             if entry.identity in reading.notes]
    return f"; {family.carrier.name}: {', '.join(notes)}" if notes else ""


def probe_mtu(ctx: Context, family: FamilyPlan, source: str, node: str) -> list[Finding]:
    env_mtu = (ctx.env or {}).get("FLANNEL_MTU", "")
    headers = ICMP_HEADERS[family.version]
    if not env_mtu.isdigit() or int(env_mtu) <= headers:
        return []
    mtu = int(env_mtu)
    target = str(family.answers_on)
    if ping(target, source=source, size=mtu - headers, timeout=ctx.probe_timeout):
        return []
    underlay = underlay_link(ctx)
    under_mtu = underlay.get("mtu") if underlay else None
    if isinstance(under_mtu, int) and not ping(str(family.public), size=under_mtu - headers,
                                               timeout=ctx.probe_timeout):
        return [Finding(
            "path-mtu", "error", f"packets of {mtu} bytes (the pods' MTU) do not reach {node} "
            f"over the overlay while small ones do; the underlay path to {family.public} does "
            f"not carry {under_mtu}-byte packets either: that node, or a link between, has a "
            "smaller MTU",
            "give every node's underlay interface the same MTU (or set Backend.MTU in the "
            "network config to the smallest one), restart flanneld on every node, then "
            "recreate the pods")]
    carried = f"; the underlay carries {under_mtu}-byte packets to it" \
        if isinstance(under_mtu, int) else ""
    return [Finding(
        "path-mtu", "error", f"packets of {mtu} bytes (the pods' MTU) do not reach {node} over "
        f"the overlay while small ones do{carried}: {family.carrier.name} does not carry the "
        "pods' MTU",
        "give pods an MTU the overlay carries (at most its device's MTU; Backend.MTU where "
        "the backend has that option), then recreate the pods")]


def _firewall(drops: list[Drop], carrier: Carrier, version: int) -> list[Finding]:
    return [Finding("firewall", "error", f"this node's own firewall drops {drop.target.text} "
                    f"({carrier.name} from its peers{' over IPv6' if version == 6 else ''}): "
                    f"{drop.text}",
                    f"accept {drop.target.text} from the other nodes in that chain, or delete "
                    "the rule; every peer's traffic to this node is lost meanwhile")
            for drop in drops]


def check_peers(ctx: Context) -> list[Finding]:
    description = ctx.description
    if not ctx.probe or description is None or not description.node.data_path:
        return []
    if ctx.own_lease is None:
        return [Finding("probes", "info", "not checked: the peers over the overlay, because "
                        "the store holds no lease of this node: no peer routes traffic back "
                        "to it (the lease finding says why)")] if ctx.peers else []
    # A peer this node has not programmed fully is not probed: the kernel or engine check
    # names what is missing, and a probe could only fail for that reason.
    reading = ctx.engine
    work = [(plan, family) for plan in ctx.peers for family in plan.families
            if not family.skipped and family.answers_on is not None and family.public
            and not kernel_gaps(plan, family, ctx.entries)
            and not (reading is not None and not reading.unread
                     and engine_gaps(plan, family, reading))]
    if not work:
        return []
    found: list[Finding] = []
    local = description.node.local
    carriers = {(family.version, family.carrier) for _plan, family in work}
    dropped: set[tuple[int, Carrier]] = set()
    for version, carrier in sorted(carriers, key=lambda vc: (vc[0], vc[1].name)):
        drops = own_drops(version, targets(carrier))
        if drops:
            dropped.add((version, carrier))
            found += _firewall(drops, carrier, version)
    sources = {version: str(address) for version, address in local.items()
               if holds(str(address))}
    for version in sorted({family.version for _plan, family in work} - set(sources)):
        why = (f"this node does not hold {local[version]}, the address its echoes leave from "
               "(its cni0 bridge's, there once it runs a pod)" if version in local else
               "this node has no subnet of that family in subnet.env")
        found.append(Finding("probes", "info", f"not checked: the overlay to the peers over "
                             f"IPv{version}, because {why}"))
    work = [(plan, family) for plan, family in work if family.version in sources]
    if not work:
        return found
    probed = ctx.probed
    used = [pf for pf in work if probed.fresh(pf[0].lease.key, pf[1].version, ctx.max_age)]
    if used:
        limit = ctx.max_age if ctx.max_age is not None else probed.fresh_for or probed.period
        found.append(Finding("probes", "info", f"{len(used)} peer famil"
                             f"{'y' if len(used) == 1 else 'ies'} judged from flanneld's own "
                             f"probes, at most {limit or 0:g}s old (--max-age=0 probes from here)"))
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(work))) as pool:
        results = list(pool.map(lambda pf: probe_family(
            ctx, pf[0], pf[1], sources[pf[1].version],
            (pf[1].version, pf[1].carrier) in dropped), work))
    return found + [finding for result in results for finding in result]


CHECKS = [("encap", check_peers)]
