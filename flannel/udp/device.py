"""The udp backend's TUN device as the control plane keeps it: ``ensure_tun`` and drift.

Owns the device's existence, MTU, up state, its one address (lease base /32) and the route
``<Network> dev <name>``. The device is persistent, so it outlives a forwarder restart
(routes stay; packets routed into it meanwhile are dropped); whoever
comes first creates it: ``ensure_tun`` (control plane) or the forwarder (``tunfd.attach``).
Requests go through ``kernel/links.py`` and ``kernel/rtnl.py`` and block: call ``ensure_tun``
from a worker thread, never from the event loop thread.
Must not touch: other links, other routes, the packets (``flannel/udp/worker.py``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from flannel.kernel import links, rtnl
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import NetlinkError, Rtnl
from flannel.udp.tunfd import TunError, attach


@dataclass(frozen=True)
class TunSpec:
    name: str
    address: IPv4Address  # the lease base address, put on the device as /32
    mtu: int
    route: IPv4Network | None = None  # the cluster network, routed into the device


def delete(name: str, host: Host = LOCAL) -> None:
    """Remove the persistent device (nothing if it is absent)."""
    with Rtnl(host) as sock:
        found = links.get_link(sock, name)
        if found is not None:
            links.delete_link(sock, found.link.index, f"delete device {name}")


def tun_index(name: str, host: Host = LOCAL) -> int:
    """The interface index of device ``name`` (TunError when it is absent)."""
    with Rtnl(host) as sock:
        found = links.get_link(sock, name)
    if found is None:
        raise TunError(f"{name} disappeared; is another program deleting it?")
    return found.link.index


def ensure_tun(spec: TunSpec, host: Host = LOCAL) -> list[str]:
    """Create or repair the device; returns what had drifted (empty when nothing had).

    Repairs: device missing, MTU, down, address missing, other IPv4 addresses on it,
    route missing or pointing elsewhere.
    """
    drift: list[str] = []
    # The TUN is created by ioctl in the calling thread's namespace: stay inside throughout.
    with host.entered(), Rtnl() as sock:
        found = links.get_link(sock, spec.name)
        if found is None:
            os.close(attach(spec.name, vnet_hdr=False))
            drift.append(f"{spec.name} was missing: created")
            found = links.get_link(sock, spec.name)
            if found is None:
                raise TunError(f"{spec.name} disappeared right after it was created; is "
                               "another program managing it?")
        if found.kind != "tun":
            raise TunError(f"{spec.name} exists and is a {found.kind or 'non-TUN'} device; "
                           "delete it or choose another name")
        link = found.link
        if link.mtu != spec.mtu:
            drift.append(f"{spec.name} MTU was {link.mtu}: set to {spec.mtu}")
            try:
                links.set_link(sock, link.index, f"set MTU of {spec.name}", mtu=spec.mtu)
            except NetlinkError as err:
                raise TunError(f"cannot set MTU {spec.mtu} on {spec.name}: "
                               f"{os.strerror(err.errno or 0)}") from None
        if not link.up:
            drift.append(f"{spec.name} was down: set up")
            links.set_link(sock, link.index, f"bring {spec.name} up", up=True)
        drift += _ensure_address(sock, link.index, spec)
        if spec.route is not None:
            drift += _ensure_route(sock, link.index, spec)
    return drift


def _ensure_address(sock: Rtnl, index: int, spec: TunSpec) -> list[str]:
    drift = []
    have = False
    for addr in links.dump_addresses(sock, socket.AF_INET, index):
        if addr.address == spec.address and addr.prefixlen == 32:
            have = True
            continue
        drift.append(f"{spec.name} had address {addr.address}/{addr.prefixlen}: removed")
        links.delete_address(sock, index, addr.address, addr.prefixlen)
    if not have:
        drift.append(f"{spec.name} address {spec.address}/32 was missing: added")
        links.add_address(sock, index, spec.address, 32)
    return drift


def _ensure_route(sock: Rtnl, index: int, spec: TunSpec) -> list[str]:
    dst = str(spec.route)
    exact = [route for route, _protocol, table in sock.routes(socket.AF_INET)
             if table == rtnl.RT_TABLE_MAIN and route.dst == dst]
    if any(r.oif == index and r.gateway is None for r in exact):
        return []
    try:
        # Scope universe, as Go flannel's udp backend installs it; protocol static, as before.
        sock.replace_route(rtnl.Route(dst, None, index), protocol=rtnl.RTPROT_STATIC,
                           scope=rtnl.RT_SCOPE_UNIVERSE)
    except NetlinkError as err:
        raise TunError(f"cannot route {spec.route} into {spec.name}: "
                       f"{os.strerror(err.errno or 0)}") from None
    what = "pointed elsewhere" if exact else "was missing"
    return [f"route {spec.route} dev {spec.name} {what}: set"]
