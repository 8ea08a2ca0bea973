"""Links and addresses flannel owns: the vxlan devices and the addresses on them.

Owns creating (or reusing when compatible) a vxlan device, its MTU, state, VTEP MAC and
``accept_ra`` sysctl, and the lease address on it. Uses pyroute2's synchronous API, so call
it from a worker thread (``asyncio.to_thread``), never from the event loop thread.
Must not touch: routes, neighbours, FDB entries (``kernel/reconcile.py``), other links.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address
from pathlib import Path

from pyroute2 import IPRoute, NetlinkError

from flannel.kernel.rtnl import in_netns

log = logging.getLogger(__name__)

IFF_UP = 0x1
IFA_F_NODAD = 0x02
DEFAULT_VXLAN_PORT = 8472


class DeviceError(Exception):
    """A device cannot be set up; the message says what to fix."""


def vtep_mac(vni: int, public_ip: IPv4Address | IPv6Address) -> str:
    """A stable VTEP MAC for (VNI, public IP): locally administered, unicast.

    Derived rather than random, so a node keeps its MAC across restarts, reboots and a
    lost state directory, and a MAC that drifted (e.g. systemd-networkd's random policy)
    can be put back.
    """
    digest = hashlib.sha256(f"flannel-vtep|{vni}|{public_ip}".encode()).digest()
    first = (digest[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in (first, *digest[1:6]))


@dataclass(frozen=True)
class VxlanSpec:
    name: str
    vni: int
    port: int  # 0: the kernel's default (8472)
    local: IPv4Address | IPv6Address
    underlay_index: int
    learning: bool
    gbp: bool
    mtu: int
    mac: str


@dataclass(frozen=True)
class Device:
    index: int
    mac: str


def _open(netns: str | None) -> IPRoute:
    return IPRoute(netns=netns, flags=0) if netns else IPRoute()


def _vxlan_info(link: object) -> dict[str, object] | None:
    info = link.get_attr("IFLA_LINKINFO")
    if info is None or info.get_attr("IFLA_INFO_KIND") != "vxlan":
        return None
    data = info.get_attr("IFLA_INFO_DATA")
    return {name: value for name, value in data["attrs"]} if data else {}


def incompatibility(link: object, spec: VxlanSpec) -> str | None:
    """Why an existing link cannot serve as ``spec`` (None when it can be reused)."""
    info = _vxlan_info(link)
    if info is None:
        return "not a vxlan device"
    local = info.get("IFLA_VXLAN_LOCAL6" if spec.local.version == 6 else "IFLA_VXLAN_LOCAL")
    checks = {
        "VNI": (info.get("IFLA_VXLAN_ID"), spec.vni),
        "underlay device": (info.get("IFLA_VXLAN_LINK"), spec.underlay_index),
        "local address": (ip_address(local) if local else None, spec.local),
        "GBP": (bool(info.get("IFLA_VXLAN_GBP", False)), spec.gbp),
        "learning": (bool(info.get("IFLA_VXLAN_LEARNING")), spec.learning),
        "L2 miss": (bool(info.get("IFLA_VXLAN_L2MISS")), False),
        "port": (info.get("IFLA_VXLAN_PORT"), spec.port or DEFAULT_VXLAN_PORT),
    }
    for what, (have, want) in checks.items():
        if have != want:
            return f"{what} is {have}, want {want}"
    return None


#: What the kernel accepts as a link MTU (ETH_MIN_MTU, ETH_MAX_MTU).
MIN_MTU, MAX_MTU = 68, 65535


def _create_error(spec: VxlanSpec, err: NetlinkError) -> DeviceError:
    """Name the likely cause of a refused ``link add``; the kernel gives only an errno."""
    if err.code == errno.EEXIST:
        cause = (f"another device already uses VNI {spec.vni} on port "
                 f"{spec.port or DEFAULT_VXLAN_PORT}; remove it or choose another VNI")
    elif err.code == errno.EINVAL:
        cause = (f"the kernel refused the settings (device MTU {spec.mtu}, VNI {spec.vni}, "
                 f"local {spec.local}); check the backend's MTU, VNI and Port options")
    else:
        cause = "check the backend options and the external interface"
    return DeviceError(f"cannot create vxlan device {spec.name}: {os.strerror(err.code)}; "
                       f"{cause}")


def ensure_vxlan(spec: VxlanSpec, netns: str | None = None, *, adopt_mac: bool = False
                 ) -> Device:
    """Reuse a compatible device or create one; set MTU and MAC, bring it up.

    With ``adopt_mac`` (at start-up) a reused device keeps its MAC, which is what peers
    already know; otherwise the device is made to carry ``spec.mac``.
    """
    if not MIN_MTU <= spec.mtu <= MAX_MTU:
        raise DeviceError(f"cannot create vxlan device {spec.name}: its MTU would be "
                          f"{spec.mtu}, and a link MTU must be {MIN_MTU} to {MAX_MTU}; set "
                          "the vxlan MTU option (or the external interface's MTU) so that "
                          "MTU minus the vxlan overhead fits")
    with _open(netns) as ipr:
        links = ipr.get_links(ifname=spec.name) if ipr.link_lookup(ifname=spec.name) else []
        mac = spec.mac
        if links:
            reason = incompatibility(links[0], spec)
            if reason is None:
                if adopt_mac:
                    mac = links[0].get_attr("IFLA_ADDRESS")
            else:
                log.warning("%s exists but is incompatible (%s); recreating it", spec.name,
                            reason)
                ipr.link("del", index=links[0]["index"])
                links = []
        if not links:
            kwargs = {"vxlan_local6" if spec.local.version == 6 else "vxlan_local":
                      str(spec.local)}
            if spec.port:
                kwargs["vxlan_port"] = spec.port
            if spec.gbp:
                kwargs["vxlan_gbp"] = True
            try:
                ipr.link("add", ifname=spec.name, kind="vxlan", vxlan_id=spec.vni,
                         vxlan_link=spec.underlay_index, vxlan_learning=int(spec.learning),
                         address=mac, mtu=spec.mtu, **kwargs)
            except NetlinkError as err:
                raise _create_error(spec, err) from None
            log.info("created %s (VNI %d, MAC %s, MTU %d)", spec.name, spec.vni, mac, spec.mtu)
        index = ipr.link_lookup(ifname=spec.name)[0]
        link = ipr.get_links(index)[0]
        if link.get_attr("IFLA_MTU") != spec.mtu:
            try:
                ipr.link("set", index=index, mtu=spec.mtu)
            except NetlinkError as err:
                raise DeviceError(f"cannot set MTU {spec.mtu} on {spec.name}: "
                                  f"{os.strerror(err.code)}; the underlay device's MTU minus "
                                  "the vxlan overhead is the most it can carry: lower the vxlan "
                                  "MTU option or raise the underlay MTU") from None
        # Something (e.g. systemd-networkd) may have changed the MAC: peers only know ours.
        current = ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")
        if current != mac:
            log.warning("%s MAC is %s, expected %s: restoring it", spec.name, current, mac)
            ipr.link("set", index=index, address=mac)
            current = ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")
            if current != mac:
                raise DeviceError(f"{spec.name} MAC stays {current}, expected {mac}")
        if not link["flags"] & IFF_UP:
            try:
                ipr.link("set", index=index, state="up")
            except NetlinkError as err:
                raise DeviceError(f"cannot bring {spec.name} up: {os.strerror(err.code)}; is "
                                  f"another program using UDP port "
                                  f"{spec.port or DEFAULT_VXLAN_PORT}?") from None
    # Routes on our devices are ours alone (as Go flannel does on every vxlan device).
    _disable_accept_ra(spec.name, netns)
    return Device(index, mac)


_ra_warned: set[str] = set()


def _disable_accept_ra(name: str, netns: str | None) -> None:
    """Set net.ipv6.conf.<name>.accept_ra to 0 inside ``netns``, writing only on change.

    Missing when IPv6 is disabled; then there is nothing to refuse.
    """
    path = Path(f"/proc/sys/net/ipv6/conf/{name}/accept_ra")
    try:
        # /proc/sys/net shows the namespace of the thread that opens it.
        with in_netns(netns):
            if path.read_text().strip() != "0":
                path.write_text("0")
    except FileNotFoundError:
        return
    except OSError as err:
        if name not in _ra_warned:
            _ra_warned.add(name)
            log.warning("could not set %s to 0: %s", path, err.strerror)


def ensure_address(index: int, address: IPv4Address | IPv6Address,
                   network: IPv4Network | IPv6Network | None, netns: str | None = None
                   ) -> None:
    """Put ``address`` (as /32 or /128) on the link; drop its other addresses in ``network``."""
    prefixlen = address.max_prefixlen
    with _open(netns) as ipr:
        for addr in ipr.get_addr(index=index, family=10 if address.version == 6 else 2):
            existing = ip_address(addr.get_attr("IFA_ADDRESS"))
            if existing == address and addr["prefixlen"] == prefixlen:
                continue
            if network is not None and existing in network:
                ipr.addr("del", index=index, address=str(existing),
                         prefixlen=addr["prefixlen"])
        if not any(ip_address(a.get_attr("IFA_ADDRESS")) == address
                   for a in ipr.get_addr(index=index)):
            # No duplicate address detection: the address is ours by lease, and DAD would
            # leave it tentative (unusable) for a second.
            ipr.addr("add", index=index, address=str(address), prefixlen=prefixlen,
                     flags=IFA_F_NODAD if address.version == 6 else 0)
