"""Links and addresses flannel owns: the vxlan devices and the addresses on them.

Owns creating (or reusing when compatible) a vxlan device, its MTU, state, VTEP MAC and
``accept_ra`` sysctl, and the lease address on it. Requests go through ``kernel/links.py``
on a short-lived ``Rtnl`` socket; they block, so call these from a worker thread
(``asyncio.to_thread``), never from the event loop thread.
Must not touch: routes, neighbours, FDB entries (``kernel/reconcile.py``), other links.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from flannel.digests import sha256
from flannel.kernel import links, rtnl
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import NetlinkError, Rtnl

log = logging.getLogger(__name__)

DEFAULT_VXLAN_PORT = 8472


class DeviceError(Exception):
    """A device cannot be set up; the message says what to fix."""


def vtep_mac(vni: int, public_ip: IPv4Address | IPv6Address) -> str:
    """A stable VTEP MAC for (VNI, public IP): locally administered, unicast.

    Derived rather than random, so a node keeps its MAC across restarts, reboots and a
    lost state directory, and a MAC that drifted (e.g. systemd-networkd's random policy)
    can be put back.
    """
    digest = sha256(f"flannel-vtep|{vni}|{public_ip}".encode())
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


def incompatibility(found: links.LinkDetails, spec: VxlanSpec) -> str | None:
    """Why an existing link cannot serve as ``spec`` (None when it can be reused)."""
    info = found.info
    if not isinstance(info, links.VxlanInfo):
        return "not a vxlan device"
    checks = {
        "VNI": (info.vni, spec.vni),
        "underlay device": (info.underlay, spec.underlay_index),
        "local address": (info.local, spec.local),
        "GBP": (info.gbp, spec.gbp),
        "learning": (info.learning, spec.learning),
        "L2 miss": (info.l2miss, False),
        "port": (info.port, spec.port or DEFAULT_VXLAN_PORT),
    }
    for what, (have, want) in checks.items():
        if have != want:
            return f"{what} is {have}, want {want}"
    return None


#: What the kernel accepts as a link MTU (ETH_MIN_MTU, ETH_MAX_MTU).
MIN_MTU, MAX_MTU = 68, 65535


def _create_error(spec: VxlanSpec, err: NetlinkError) -> DeviceError:
    """Name the likely cause of a refused ``link add``; the kernel gives only an errno."""
    if err.errno == errno.EEXIST:
        cause = (f"another device already uses VNI {spec.vni} on port "
                 f"{spec.port or DEFAULT_VXLAN_PORT}; remove it or choose another VNI")
    elif err.errno == errno.EINVAL:
        cause = (f"the kernel refused the settings (device MTU {spec.mtu}, VNI {spec.vni}, "
                 f"local {spec.local}); check the backend's MTU, VNI and Port options")
    else:
        cause = "check the backend options and the external interface"
    return DeviceError(f"cannot create vxlan device {spec.name}: {os.strerror(err.errno)}; "
                       f"{cause}")


def ensure_vxlan(spec: VxlanSpec, host: Host = LOCAL, *, adopt_mac: bool = False
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
    with Rtnl(host) as sock:
        found = links.get_link(sock, spec.name)
        mac = spec.mac
        if found is not None:
            reason = incompatibility(found, spec)
            if reason is None:
                if adopt_mac:
                    mac = found.link.mac
            else:
                log.warning("%s exists but is incompatible (%s); recreating it", spec.name,
                            reason)
                links.delete_link(sock, found.link.index, f"delete device {spec.name}")
                found = None
        if found is None:
            info = links.VxlanInfo(spec.vni, spec.local, spec.underlay_index, spec.port,
                                   spec.learning, spec.gbp)
            try:
                links.add_link(sock, links.NewLink(spec.name, "vxlan", info, spec.mtu, mac))
            except NetlinkError as err:
                raise _create_error(spec, err) from None
            log.info("created %s (VNI %d, MAC %s, MTU %d)", spec.name, spec.vni, mac, spec.mtu)
            found = _reread(sock, spec.name)
        link = found.link
        ensure_mtu(sock, link, spec.name, spec.mtu,
                   "the underlay device's MTU minus the vxlan overhead is the most it can "
                   "carry: lower the vxlan MTU option or raise the underlay MTU")
        # Something (e.g. systemd-networkd) may have changed the MAC: peers only know ours.
        if link.mac != mac:
            log.warning("%s MAC is %s, expected %s: restoring it", spec.name, link.mac, mac)
            links.set_link(sock, link.index, f"set MAC of {spec.name}", mac=mac)
            current = _reread(sock, spec.name).link.mac
            if current != mac:
                raise DeviceError(f"{spec.name} MAC stays {current}, expected {mac}")
        if not link.up:
            try:
                links.set_link(sock, link.index, f"bring {spec.name} up", up=True)
            except NetlinkError as err:
                raise DeviceError(f"cannot bring {spec.name} up: {os.strerror(err.errno)}; is "
                                  f"another program using UDP port "
                                  f"{spec.port or DEFAULT_VXLAN_PORT}?") from None
    # Routes on our devices are ours alone (as Go flannel does on every vxlan device).
    _disable_accept_ra(spec.name, host)
    return Device(link.index, mac)


def ensure_mtu(sock: Rtnl, link: rtnl.Link, name: str, mtu: int, limit: str) -> None:
    """Give the device ``mtu`` if it has another; DeviceError says which ``limit`` it
    broke."""
    if link.mtu == mtu:
        return
    try:
        links.set_link(sock, link.index, f"set MTU of {name}", mtu=mtu)
    except NetlinkError as err:
        raise DeviceError(f"cannot set MTU {mtu} on {name}: {os.strerror(err.errno or 0)}; "
                          f"{limit}") from None


def _reread(sock: Rtnl, name: str) -> links.LinkDetails:
    found = links.get_link(sock, name)
    if found is None:
        raise DeviceError(f"{name} disappeared while being set up; is another program "
                          "managing it?")
    return found


_ra_warned: set[str] = set()


def _disable_accept_ra(name: str, host: Host) -> None:
    """Set net.ipv6.conf.<name>.accept_ra to 0 on ``host``, writing only on change.

    Missing when IPv6 is disabled; then there is nothing to refuse.
    """
    key = f"net/ipv6/conf/{name}/accept_ra"
    try:
        host.write_sysctl(key, "0")
    except FileNotFoundError:
        return
    except OSError as err:
        if name not in _ra_warned:
            _ra_warned.add(name)
            log.warning("could not set /proc/sys/%s to 0: %s", key, err.strerror)


def ensure_address(index: int, address: IPv4Address | IPv6Address,
                   network: IPv4Network | IPv6Network | None, host: Host = LOCAL
                   ) -> None:
    """Put ``address`` (as /32 or /128) on the link; drop its other addresses in ``network``."""
    prefixlen = address.max_prefixlen
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    with Rtnl(host) as sock:
        present = False
        for addr in links.dump_addresses(sock, family, index):
            if addr.address == address and addr.prefixlen == prefixlen:
                present = True
            elif network is not None and addr.address in network:
                links.delete_address(sock, index, addr.address, addr.prefixlen)
            elif addr.address == address:
                present = True  # with another prefix length, outside the network: kept
        if not present:
            # No duplicate address detection: the address is ours by lease, and DAD would
            # leave it tentative (unusable) for a second.
            links.add_address(sock, index, address, prefixlen,
                              links.IFA_F_NODAD if address.version == 6 else 0)
