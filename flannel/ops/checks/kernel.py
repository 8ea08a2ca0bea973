"""Checks of this node's kernel against the leases: the VTEP device, its MAC and MTU, and
the routes, neighbours and FDB entries each peer needs (and those no lease explains)."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.backend.footprint import COVERING, PER_PEER
from flannel.ops.checks import Context
from flannel.ops.checks.offload import check_checksum
from flannel.ops.findings import Finding
from flannel.ops.leases import vtep_mac

VXLAN_OVERHEAD = 50
RECONCILE_FIX = ("flanneld repairs it at its next reconcile (--reconcile-interval); if it "
                 "stays, restart flanneld and read its log")


def _vtep(ctx: Context) -> dict[str, Any] | None:
    """The VTEP device, when this node's backend reaches peers through one (vxlan)."""
    return ctx.kernel.link(ctx.device) if ctx.vtep else None


def check_device(ctx: Context) -> list[Finding]:
    """The IPv4 device the backend declares: there and up; for vxlan, sending from the
    lease's public IP."""
    found = [Finding("device", "warning", f"cannot read the kernel: {error}")
             for error in ctx.kernel.errors]
    device = ctx.device
    if not device or ctx.kernel.errors or ctx.config is None or not ctx.config.enable_ipv4:
        return found
    link = ctx.kernel.link(device)
    if link is None:
        kind = "VXLAN" if ctx.vtep else ctx.backend
        return [*found, Finding("device", "error", f"the {kind} device {device} does not "
                                "exist: no traffic to other nodes", RECONCILE_FIX)]
    if "UP" not in link.get("flags", []):
        found.append(Finding("device", "error", f"{device} is down",
                             f"ip link set {device} up; {RECONCILE_FIX}"))
    if not ctx.vtep:
        return found
    local = (link.get("linkinfo", {}).get("info_data") or {}).get("local")
    public = ctx.public_ip()
    if public is not None and local and local != str(public):
        found.append(Finding("device", "error", f"{ctx.device} sends from {local} but "
                             f"this node's lease publishes {public}",
                             "restart flanneld with the right --iface/--public-ip"))
    return found


def check_vtep_mac(ctx: Context) -> list[Finding]:
    link, own = _vtep(ctx), ctx.own_lease
    if link is None or own is None:
        return []
    published, actual = vtep_mac(own), str(link.get("address", "")).lower()
    if published and actual and published != actual:
        return [Finding(
            "vtep-mac", "error", f"{ctx.device} has MAC {actual} but the lease publishes "
            f"{published}: peers send this node's traffic to a MAC it no longer has",
            "something changed the MAC behind flanneld (systemd-networkd MACAddressPolicy, "
            "NetworkManager): exclude flannel.* from them "
            "(MACAddressPolicy=none in a .link file, unmanaged-devices=interface-name:flannel*), "
            "then restart flanneld")]
    return []


def check_mtu(ctx: Context) -> list[Finding]:
    link = _vtep(ctx)
    if link is None:
        return []
    found = []
    mtu = link.get("mtu")
    env_mtu = (ctx.env or {}).get("FLANNEL_MTU", "")
    if env_mtu.isdigit() and isinstance(mtu, int) and int(env_mtu) > mtu:
        found.append(Finding(
            "mtu", "error", f"pods get MTU {env_mtu} (subnet.env) but {ctx.device} "
            f"carries {mtu}: large packets between nodes are dropped",
            "restart flanneld so subnet.env matches, then recreate the pods"))
    underlay_name = (link.get("linkinfo", {}).get("info_data") or {}).get("link")
    underlay = ctx.kernel.link(underlay_name) if isinstance(underlay_name, str) else None
    if underlay and isinstance(mtu, int) and isinstance(underlay.get("mtu"), int) and \
            mtu + VXLAN_OVERHEAD > underlay["mtu"]:
        found.append(Finding(
            "mtu", "error", f"{ctx.device} MTU {mtu} plus {VXLAN_OVERHEAD} bytes of "
            f"VXLAN does not fit {underlay_name}'s MTU {underlay['mtu']}",
            "restart flanneld so it derives the MTU from the underlay (or lower Backend.MTU)"))
    return found


def _peer_needs(ctx: Context) -> list[tuple[IPv4Network, str, IPv4Address]]:
    """(subnet, VTEP MAC, public IP) of every peer of this node's VTEP backend."""
    needs: list[tuple[IPv4Network, str, IPv4Address]] = []
    described_type = ctx.described[0] if ctx.described is not None else None
    for lease in ctx.peers:
        mac = vtep_mac(lease)
        if lease.attrs.backend_type == described_type and mac and lease.subnet is not None \
                and lease.attrs.public_ip is not None:
            needs.append((lease.subnet, mac, lease.attrs.public_ip))
    return needs


def check_routes(ctx: Context) -> list[Finding]:
    """A route per peer, or the one over the Network through the device, as the backend's
    declared footprint says."""
    described = ctx.described
    if ctx.kernel.errors or not ctx.leases or described is None:
        return []
    if described[1].routes == COVERING:
        return _covering_route(ctx)
    if described[1].routes != PER_PEER:
        return []
    found = []
    routes = {r.get("dst"): r for r in ctx.kernel.routes}
    for lease in ctx.peers:
        subnet = lease.subnet
        assert subnet is not None  # ctx.peers holds only leases with a subnet
        route = routes.get(str(subnet))
        if route is None:
            found.append(Finding("routes", "error", f"no route to {subnet} "
                                 f"(node {lease.attrs.public_ip})", RECONCILE_FIX))
            continue
        via_overlay = ctx.vtep and route.get("dev") == ctx.device
        want = str(subnet.network_address) if via_overlay else str(lease.attrs.public_ip)
        if route.get("gateway") != want:
            found.append(Finding("routes", "error", f"the route to {subnet} goes via "
                                 f"{route.get('gateway')} dev {route.get('dev')}; node "
                                 f"{lease.attrs.public_ip} needs via {want}", RECONCILE_FIX))
    peer_subnets = {str(lease.subnet) for lease in ctx.peers}
    device = ctx.device
    for route in ctx.kernel.routes:
        if device and route.get("dev") == device and route.get("dst") not in peer_subnets:
            found.append(Finding("routes", "warning", f"route {route.get('dst')} dev "
                                 f"{device} matches no lease (a node that left?)",
                                 f"{RECONCILE_FIX}; by hand: ip route del {route.get('dst')}"))
    return found


def _covering_route(ctx: Context) -> list[Finding]:
    network, device = ctx.config.network if ctx.config else None, ctx.device
    if network is None or not ctx.peers:
        return []
    if any(r.get("dst") == str(network) and r.get("dev") == device for r in ctx.kernel.routes):
        return []
    return [Finding("routes", "error", f"no route to the Network {network} through {device}: "
                    "no traffic to other nodes", RECONCILE_FIX)]


def check_neighbours(ctx: Context) -> list[Finding]:
    if _vtep(ctx) is None or ctx.rows is None:
        return []
    dev = ctx.device
    have = {n.get("dst"): str(n.get("lladdr", "")).lower()
            for n in ctx.kernel.neighbours.get(dev, [])}
    found = []
    wanted = {}
    for subnet, mac, ip in _peer_needs(ctx):
        addr = str(subnet.network_address)
        wanted[addr] = mac
        if have.get(addr) != mac:
            seen = f"has {have[addr]}" if have.get(addr) else "is missing"
            found.append(Finding("neighbours", "error", f"the neighbour entry {addr} -> {mac} "
                                 f"for node {ip} {seen} on {dev}", RECONCILE_FIX))
    for entry in ctx.kernel.neighbours.get(dev, []):
        dst = entry.get("dst")
        if "PERMANENT" in entry.get("state", []) and dst not in wanted:
            found.append(Finding("neighbours", "warning", f"neighbour {dst} lladdr "
                                 f"{entry.get('lladdr')} on {dev} matches no lease",
                                 f"{RECONCILE_FIX}; by hand: ip neigh del {dst} dev {dev}"))
    return found


def check_fdb(ctx: Context) -> list[Finding]:
    if _vtep(ctx) is None or ctx.rows is None:
        return []
    dev = ctx.device
    entries = [e for e in ctx.kernel.fdb.get(dev, []) if e.get("state") == "permanent"
               or "permanent" in str(e.get("state", ""))]
    have: dict[str, set[object]] = {}
    for entry in entries:
        have.setdefault(str(entry.get("mac", "")).lower(), set()).add(entry.get("dst"))
    found = []
    wanted = {}
    for _subnet, mac, ip in _peer_needs(ctx):
        wanted[mac] = str(ip)
        if str(ip) not in have.get(mac, set()):
            found.append(Finding("fdb", "error", f"no FDB entry {mac} dst {ip} on {dev}: "
                                 f"traffic to node {ip} has nowhere to go", RECONCILE_FIX))
    for entry in entries:
        mac, dst = str(entry.get("mac", "")).lower(), entry.get("dst")
        if wanted.get(mac) != dst:
            found.append(Finding(
                "fdb", "warning" if mac not in wanted else "error",
                f"FDB entry {mac} dst {dst} on {dev} matches no lease"
                + (f" (the lease of {mac} says {wanted[mac]})" if mac in wanted else ""),
                f"{RECONCILE_FIX}; by hand: bridge fdb del {mac} dev {dev} dst {dst}"))
    return found


CHECKS = [("device", check_device), ("vtep-mac", check_vtep_mac), ("mtu", check_mtu),
          ("routes", check_routes), ("neighbours", check_neighbours), ("fdb", check_fdb),
          ("checksum", check_checksum)]
