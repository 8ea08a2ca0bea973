"""The udp backend's TUN device as the control plane keeps it: ``ensure_tun`` and drift.

Owns the device's existence, MTU, up state, its one address (lease base /32) and the route
``<Network> dev <name>``. The device is persistent, so it outlives a forwarder restart
(routes stay; packets routed into it meanwhile are dropped); whoever
comes first creates it: ``ensure_tun`` (control plane) or the forwarder (``tunfd.attach``).
Uses pyroute2's synchronous API: call ``ensure_tun`` from a worker thread, never from the
event loop thread.
Must not touch: other links, other routes, the packets (``flannel/udp/worker.py``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, ip_address

from pyroute2 import IPRoute, NetlinkError

from flannel.kernel.rtnl import in_netns
from flannel.udp.tunfd import TunError, attach

IFF_UP = 0x1


@dataclass(frozen=True)
class TunSpec:
    name: str
    address: IPv4Address  # the lease base address, put on the device as /32
    mtu: int
    route: IPv4Network | None = None  # the cluster network, routed into the device


def delete(name: str, netns: str | None = None) -> None:
    """Remove the persistent device (nothing if it is absent)."""
    with in_netns(netns):
        ipr = IPRoute()
    with ipr:
        index = ipr.link_lookup(ifname=name)
        if index:
            ipr.link("del", index=index[0])


def ensure_tun(spec: TunSpec, netns: str | None = None) -> list[str]:
    """Create or repair the device; returns what had drifted (empty when nothing had).

    Repairs: device missing, MTU, down, address missing, other IPv4 addresses on it,
    route missing or pointing elsewhere.
    """
    drift: list[str] = []
    with in_netns(netns):
        ipr = IPRoute()
        with ipr:
            if not ipr.link_lookup(ifname=spec.name):
                os.close(attach(spec.name, vnet_hdr=False))
                drift.append(f"{spec.name} was missing: created")
            index = ipr.link_lookup(ifname=spec.name)[0]
            link = ipr.get_links(index)[0]
            info = link.get_attr("IFLA_LINKINFO")
            kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
            if kind != "tun":
                raise TunError(f"{spec.name} exists and is a {kind or 'non-TUN'} device; "
                               "delete it or choose another name")
            if link.get_attr("IFLA_MTU") != spec.mtu:
                drift.append(f"{spec.name} MTU was {link.get_attr('IFLA_MTU')}: set to "
                             f"{spec.mtu}")
                try:
                    ipr.link("set", index=index, mtu=spec.mtu)
                except NetlinkError as err:
                    raise TunError(f"cannot set MTU {spec.mtu} on {spec.name}: {err}") from None
            if not link["flags"] & IFF_UP:
                drift.append(f"{spec.name} was down: set up")
                ipr.link("set", index=index, state="up")
            drift += _ensure_address(ipr, index, spec)
            if spec.route is not None:
                drift += _ensure_route(ipr, index, spec)
    return drift


def _ensure_address(ipr: IPRoute, index: int, spec: TunSpec) -> list[str]:
    drift = []
    have = False
    for addr in ipr.get_addr(index=index, family=2):
        existing = ip_address(addr.get_attr("IFA_ADDRESS"))
        if existing == spec.address and addr["prefixlen"] == 32:
            have = True
            continue
        drift.append(f"{spec.name} had address {existing}/{addr['prefixlen']}: removed")
        ipr.addr("del", index=index, address=str(existing), prefixlen=addr["prefixlen"])
    if not have:
        drift.append(f"{spec.name} address {spec.address}/32 was missing: added")
        ipr.addr("add", index=index, address=str(spec.address), prefixlen=32)
    return drift


def _ensure_route(ipr: IPRoute, index: int, spec: TunSpec) -> list[str]:
    dst, plen = str(spec.route.network_address), spec.route.prefixlen
    routes = ipr.get_routes(family=2, table=254)
    exact = [r for r in routes if r["dst_len"] == plen and r.get_attr("RTA_DST") == dst]
    if any(r.get_attr("RTA_OIF") == index and r.get_attr("RTA_GATEWAY") is None
           for r in exact):
        return []
    try:
        ipr.route("replace", dst=dst, dst_len=plen, oif=index, table=254)
    except NetlinkError as err:
        raise TunError(f"cannot route {spec.route} into {spec.name}: {err}") from None
    what = "pointed elsewhere" if exact else "was missing"
    return [f"route {spec.route} dev {spec.name} {what}: set"]
