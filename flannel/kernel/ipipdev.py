"""The ipip device flannel owns (``flannel.ipip``): created or reused, its MTU, its state.

Owns: creating the device as Go flannel creates it (type ipip, local = the external
interface's address, remote any), refusing a device of that name that is not ipip (it is not
ours to delete), recreating one whose local or remote address is wrong, its MTU and bringing
it up; and saying clearly when the kernel has no ipip support. Requests go through
``kernel/links.py`` on a short-lived ``Rtnl`` socket; they block, so call from a worker
thread. The lease address on it is ``kernel/device.py``'s ``ensure_address``.
Must not touch: routes (``kernel/reconcile.py``), other links, ``tunl0`` (the kernel's
fallback ipip device, which may be someone else's).
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from ipaddress import IPv4Address

from flannel.kernel import links
from flannel.kernel.device import MAX_MTU, MIN_MTU, DeviceError, ensure_mtu
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import NetlinkError, Rtnl

log = logging.getLogger(__name__)

#: The outer IPv4 header every tunnelled packet carries.
IPIP_OVERHEAD = 20


@dataclass(frozen=True)
class IpipSpec:
    name: str
    local: IPv4Address
    mtu: int


def no_ipip_support(name: str, reason: str) -> DeviceError:
    """The error when the kernel cannot create ipip devices (no module, or not loadable)."""
    return DeviceError(
        f"cannot create ipip device {name}: this kernel has no ipip support ({reason}); load "
        "the ipip module on the host ('modprobe ipip', or add 'ipip' to "
        "/etc/modules-load.d/), use a kernel built with CONFIG_NET_IPIP, or choose another "
        "backend (vxlan needs no extra module on most kernels)")


def _create_error(spec: IpipSpec, err: NetlinkError) -> DeviceError:
    if err.errno == errno.EOPNOTSUPP:
        return no_ipip_support(spec.name, os.strerror(err.errno or 0))
    if err.errno == errno.EEXIST:
        cause = (f"another ipip device already has local {spec.local} and remote any; "
                 "remove it (see 'ip -d link show type ipip')")
    else:
        cause = "check the external interface and its address"
    return DeviceError(f"cannot create ipip device {spec.name}: {os.strerror(err.errno or 0)}; "
                       f"{cause}")


def incompatibility(found: links.LinkDetails, spec: IpipSpec) -> str | None:
    """Why an existing ipip device cannot serve as ``spec`` (None when it can be reused)."""
    info = found.info
    assert isinstance(info, links.IptunInfo)
    if info.local != spec.local:
        return f"local address is {info.local or 'any'}, want {spec.local}"
    if info.remote is not None:
        return f"remote address is {info.remote}, want any"
    return None


def ensure_ipip(spec: IpipSpec, host: Host = LOCAL) -> int:
    """Reuse a compatible ``flannel.ipip`` or create it; set its MTU, bring it up. Its index.

    DeviceError (with what to do) when the name is taken by a device of another kind, the
    kernel has no ipip support, or the MTU cannot be set.
    """
    if not MIN_MTU <= spec.mtu <= MAX_MTU:
        raise DeviceError(f"cannot create ipip device {spec.name}: its MTU would be "
                          f"{spec.mtu}, and a link MTU must be {MIN_MTU} to {MAX_MTU}; the "
                          f"external interface's MTU minus {IPIP_OVERHEAD} must fit")
    with Rtnl(host) as sock:
        found = links.get_link(sock, spec.name)
        if found is not None and found.kind != "ipip":
            # Go refuses too: a device we did not create is not ours to delete.
            raise DeviceError(f"{spec.name} exists but is not an ipip device (it is a "
                              f"{found.kind or 'plain'} device); remove it ('ip link delete "
                              f"{spec.name}') and start flanneld again")
        if found is not None:
            reason = incompatibility(found, spec)
            if reason is not None:
                log.warning("%s exists but is incompatible (%s); recreating it", spec.name,
                            reason)
                links.delete_link(sock, found.link.index, f"delete device {spec.name}")
                found = None
        if found is None:
            try:
                links.add_link(sock, links.NewLink(spec.name, "ipip",
                                                   links.IptunInfo(spec.local)))
            except NetlinkError as err:
                raise _create_error(spec, err) from None
            log.info("created %s (local %s)", spec.name, spec.local)
            found = links.get_link(sock, spec.name)
            if found is None:
                raise DeviceError(f"{spec.name} disappeared while being set up; is another "
                                  "program managing it?")
        link = found.link
        ensure_mtu(sock, link, spec.name, spec.mtu,
                   f"it is the external interface's MTU minus {IPIP_OVERHEAD}")
        if not link.up:
            links.set_link(sock, link.index, f"bring {spec.name} up", up=True)
        return link.index
