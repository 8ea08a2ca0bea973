"""Checks of this node's kernel and engines against what its backend says it does with each
lease (``flannel/ops/plans.py``): the devices that carry pods' packets (there, up, their MAC
and MTU), each peer's routes, neighbours and FDB entries, its entries in the backend's
engines, the entries no lease explains, and the peers flanneld skips or parks."""

from __future__ import annotations

from typing import Any

from flannel.backend.admission import IDENTITY_TAKEN, KERNEL_REFUSED
from flannel.backend.plan import DevicePlan
from flannel.monitor.nodestate import ENGINE
from flannel.ops.checks import Context
from flannel.ops.checks.offload import check_checksum
from flannel.ops.commands import flannelctl
from flannel.ops.findings import Finding
from flannel.ops.plans import engine_gaps, kernel_gaps

RECONCILE_FIX = ("flanneld repairs it at its next reconcile (--reconcile-interval); if it "
                 "stays, restart flanneld and read its log")


def devices(ctx: Context, present: bool = True) -> list[tuple[DevicePlan, dict[str, Any]]]:
    """The backend's devices of the IP versions the network carries, with their links
    (only those that exist, unless ``present`` is False: then the link may be {})."""
    description = ctx.description
    if description is None:
        return []
    out = []
    for device in description.node.devices:
        link = ctx.kernel.link(device.name)
        if link is not None or not present:
            out.append((device, link or {}))
    return out


def check_device(ctx: Context) -> list[Finding]:
    """Every device the backend carries pods' packets on: there and up; a VTEP sending from
    the public address our lease publishes."""
    found = [Finding("device", "warning", f"cannot read the kernel: {error}")
             for error in ctx.kernel.errors]
    if ctx.kernel.errors:
        return found
    seen: set[str] = set()
    own = ctx.own_lease
    for device, link in devices(ctx, present=False):
        if device.name in seen:
            continue
        seen.add(device.name)
        if not link:
            if not device.optional:
                found.append(Finding("device", "error", f"the device {device.name} does not "
                                     "exist: no traffic to other nodes", RECONCILE_FIX))
            continue
        if "UP" not in link.get("flags", []):
            found.append(Finding("device", "error", f"{device.name} is down",
                                 f"ip link set {device.name} up; {RECONCILE_FIX}"))
        local = (link.get("linkinfo", {}).get("info_data") or {}).get("local")
        public = (own.attrs.public_ip if device.version == 4 else own.attrs.public_ipv6) \
            if own is not None else None
        if device.entries and public is not None and local and local != str(public):
            found.append(Finding("device", "error", f"{device.name} sends from {local} but "
                                 f"this node's lease publishes {public}",
                                 "restart flanneld with the right --iface/--public-ip"))
    return found


def check_device_mac(ctx: Context) -> list[Finding]:
    found = []
    for device, link in devices(ctx):
        actual = str(link.get("address", "")).lower()
        if device.mac and actual and device.mac != actual:
            found.append(Finding(
                "vtep-mac", "error", f"{device.name} has MAC {actual} but the lease publishes "
                f"{device.mac}: peers send this node's traffic to a MAC it no longer has",
                "something changed the MAC behind flanneld (systemd-networkd MACAddressPolicy, "
                "NetworkManager): exclude flannel.* from them "
                "(MACAddressPolicy=none in a .link file, unmanaged-devices=interface-name:"
                "flannel*), then restart flanneld"))
    return found


def underlay_link(ctx: Context) -> dict[str, Any] | None:
    node = ctx.node
    if node is None or not node.underlay:
        return None
    return next((link for link in ctx.kernel.links if link.get("ifindex") == node.underlay),
                None)


def check_mtu(ctx: Context) -> list[Finding]:
    """The pods' MTU (subnet.env) fits every device that carries their packets, and each
    device plus what the backend adds fits the underlay; without a device of ours, the pods'
    MTU plus that fits the underlay."""
    description = ctx.description
    env_mtu = (ctx.env or {}).get("FLANNEL_MTU", "")
    if description is None or not description.node.data_path or not env_mtu.isdigit():
        return []
    pods = int(env_mtu)
    underlay = underlay_link(ctx)
    under_mtu = underlay.get("mtu") if underlay else None
    under_name = underlay.get("ifname") if underlay else ""
    found = []
    present = devices(ctx)
    seen: set[str] = set()
    for device, link in present:
        mtu = link.get("mtu")
        if device.name in seen or not isinstance(mtu, int):
            continue
        seen.add(device.name)
        if pods > mtu:
            found.append(Finding(
                "mtu", "error", f"pods get MTU {pods} (subnet.env) but {device.name} "
                f"carries {mtu}: large packets between nodes are dropped",
                f"restart flanneld so the device and subnet.env agree; if they still differ "
                f"(a device flanneld does not make), give pods an MTU of at most {mtu}; then "
                "recreate the pods"))
        if isinstance(under_mtu, int) and mtu + device.overhead > under_mtu:
            found.append(Finding(
                "mtu", "error", f"{device.name} MTU {mtu} plus {device.overhead} bytes of "
                f"encapsulation does not fit {under_name}'s MTU {under_mtu}",
                "restart flanneld so it derives the MTU from the underlay (or lower "
                "Backend.MTU)"))
    if not present and isinstance(under_mtu, int) \
            and pods + description.node.overhead > under_mtu:
        added = f" plus {description.node.overhead} bytes of encapsulation" \
            if description.node.overhead else ""
        found.append(Finding(
            "mtu", "error", f"pods get MTU {pods} (subnet.env){added}, but {under_name} "
            f"carries {under_mtu}: large packets between nodes are dropped",
            "restart flanneld so it derives the MTU from the underlay, then recreate the "
            "pods"))
    return found


def _dedupe(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))


def check_entries(ctx: Context) -> list[Finding]:
    """Each peer's routes, neighbours and FDB entries as its plan lists them, then ours
    that no lease explains."""
    description = ctx.description
    kernel = ctx.entries
    if description is None or ctx.rows is None:
        return []
    if kernel.error:
        return [Finding("routes", "warning", kernel.error)]
    found = []
    judged = any(f.routes or f.neighbours or f.fdb or f.engine
                 for plan in ctx.peers for f in plan.families)
    if description.node.unjudged and not judged:
        found.append(Finding("routes", "info", f"not checked: what carries each peer, "
                             f"because {description.node.unjudged}"))
    found += [Finding(gap.kind, "error", gap.what, RECONCILE_FIX)
             for plan in ctx.peers for family in plan.families if not family.skipped
             for gap in kernel_gaps(plan, family, kernel)]
    return _dedupe(found) + _unexplained(ctx)


def _unexplained(ctx: Context) -> list[Finding]:
    """flanneld's routes (protocol 151), and the permanent neighbours and FDB entries on its
    VTEPs, that no lease's plan lists."""
    from flannel.kernel.rtnl import RTPROT_FLANNEL

    kernel = ctx.entries
    families = [f for plan in ctx.peers for f in plan.families if not f.skipped]
    routes = {route.dst for f in families for route in f.routes}
    own = {str(subnet) for subnet in (ctx.own_subnet, ctx.own_subnet6) if subnet is not None}
    found = []
    for dst, (route, proto) in sorted(kernel.routes.items()):
        if proto == RTPROT_FLANNEL and dst not in routes and dst not in own:
            found.append(Finding("routes", "warning", f"route {dst} dev "
                                 f"{kernel.name(route.oif)} matches no lease (a node that "
                                 "left?)", f"{RECONCILE_FIX}; by hand: ip route del {dst}"))
    vteps = {ctx.node.device(device.name) for device, _link in devices(ctx)
             if device.entries} if ctx.node is not None else set()
    neighbours = {(n.ifindex, n.ip) for f in families for n in f.neighbours}
    for (index, ip), entry in sorted(kernel.neighbours.items()):
        if index in vteps and (index, ip) not in neighbours:
            dev = kernel.name(index)
            found.append(Finding("neighbours", "warning", f"neighbour {ip} lladdr {entry.mac} "
                                 f"on {dev} matches no lease",
                                 f"{RECONCILE_FIX}; by hand: ip neigh del {ip} dev {dev}"))
    wanted = {(e.ifindex, e.mac): e.dst for f in families for e in f.fdb}
    for fdb in sorted(kernel.fdb):
        if fdb.ifindex not in vteps or wanted.get((fdb.ifindex, fdb.mac)) == fdb.dst:
            continue
        dev = kernel.name(fdb.ifindex)
        other = wanted.get((fdb.ifindex, fdb.mac))
        found.append(Finding(
            "fdb", "warning" if other is None else "error",
            f"FDB entry {fdb.mac} dst {fdb.dst} on {dev} matches no lease"
            + (f" (the lease of {fdb.mac} says {other})" if other else ""),
            f"{RECONCILE_FIX}; by hand: bridge fdb del {fdb.mac} dev {dev} dst {fdb.dst}"))
    return found


def check_engine(ctx: Context) -> list[Finding]:
    """The backend's engines: their own problems (a program missing or not answering), then
    each peer's entries in them as its plan lists them."""
    reading = ctx.engine
    if reading is None:
        return []
    found = [Finding("backend", severity, what, fix) for severity, what, fix in reading.problems]
    if reading.problems or not ctx.flanneld_pids:
        return found
    if reading.unread:
        return [*found, Finding("engine", "warning", f"not checked: the peers in the "
                                f"{ctx.backend} backend's engine, because {reading.unread}")]
    # A device that is missing holds nothing: the device check says so.
    gone = {device.name for device, link in devices(ctx, present=False) if not link}
    found += [Finding("engine", "error", gap.what, RECONCILE_FIX)
              for plan in ctx.peers for family in plan.families if not family.skipped
              for gap in engine_gaps(plan, family, reading, skip=gone)]
    return _dedupe(found)


def check_skipped(ctx: Context) -> list[Finding]:
    """Leases flanneld does not use, with its reason: a reservation no node has taken is
    a note; a lease claiming an identity this node's or an older lease's is an error (a
    node, or whoever wrote it, tries to draw another node's traffic; said once, as the
    cause, rather than as the other lease's entries it would spoil); anything else a node
    the others cannot reach."""
    found = []
    for plan in ctx.plans:
        lease = plan.lease
        where = f"lease {lease.key} of {lease.attrs.public_ip or 'no public IP'}"
        fix = (f"{flannelctl('leases', 'show', lease.key)} shows it; "
               f"{flannelctl('leases', 'release', lease.key)} if no node needs it")
        if plan.refused == IDENTITY_TAKEN:
            found.append(Finding(
                "identity", "error", f"{where}: skipped by flanneld: {plan.skipped}",
                f"if no node of yours runs at {lease.attrs.public_ip or 'that address'}, "
                f"{flannelctl('leases', 'release', lease.key, '--yes')} and find who can "
                "write leases (only flanneld should); if one does (a copy of another "
                "machine), give it an identity of its own and restart its flanneld"))
        elif plan.skipped:
            found.append(Finding("skipped", "info" if plan.reserved else "warning",
                                 f"{where}: skipped by flanneld: {plan.skipped}",
                                 "" if plan.reserved else fix))
        found += [Finding("skipped", "warning", f"{where}: its IPv{family.version} half is "
                          f"skipped by flanneld: {family.skipped}", fix)
                  for family in plan.families if family.skipped]
    return found


def check_parked(ctx: Context) -> list[Finding]:
    """What only the running flanneld knows of its peers (its /status): those it parked,
    because the kernel refused their entries (left out, retried with backoff: their entries
    are not judged, nor are they probed), and those an engine of the backend refuses. When
    it cannot be asked, a note says so."""
    if not ctx.flanneld_pids or ctx.description is None:
        return []
    view = ctx.view
    if view.unread:
        return [Finding("parked", "info", "not checked: which peers flanneld parked (the "
                        f"kernel refused their entries), because {view.unread}")]
    found = []
    for plan in ctx.plans:
        lease = plan.lease
        kind, why = view.refused.get(lease.key, ("", ""))
        where = f"lease {lease.key} of {lease.attrs.public_ip or 'no public IP'}"
        fix = ("flanneld tries it again with backoff, at once when its lease changes: fix "
               "the node that wrote it, or "
               f"{flannelctl('leases', 'release', lease.key)} if no node needs it")
        if kind == KERNEL_REFUSED and plan.used:
            found.append(Finding("parked", "warning", f"{where}: parked by flanneld, the "
                                 f"kernel refused its entries: {why}", fix))
        elif kind == ENGINE and plan.used:
            found.append(Finding("parked", "warning", f"{where}: refused by the backend's "
                                 f"engine: {why}", "fix what the reason names (flanneld's log "
                                 "says more); flanneld tries it again"))
    if view.unlisted:
        found.append(Finding("parked", "info", f"not checked: {view.unlisted} more peer(s) "
                             "flanneld refuses, because its /status lists only the first"))
    return found


CHECKS = [("device", check_device), ("vtep-mac", check_device_mac), ("mtu", check_mtu),
          ("routes", check_entries), ("engine", check_engine), ("skipped", check_skipped),
          ("parked", check_parked), ("checksum", check_checksum)]
