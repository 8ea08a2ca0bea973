"""Whether this kernel has the data paths that need their own modules (ipip, WireGuard, ESP),
asked without changing the host: ipip as ``flannel-lab up`` asks, WireGuard and ESP by using
each in a throw-away network namespace (removed at once). Tests and labs that need one skip
with the kernel's answer when it is missing; the vm lane (tests/vm) runs them on a kernel that
has them all."""

from __future__ import annotations

import functools
import os

from flannel.ipsec import xfrm
from flannel.kernel.host import Host
from flannel.wireguard.genl import wireguard_family
from flannel_lab.kernelprobe import missing_link_kind
from tests.support import netns

VM_LANE = "the vm lane (tests/vm) runs this on Debian's kernel"


@functools.cache
def missing_ipip() -> str:
    """"" when the kernel creates ipip devices, asked as ``flannel-lab up`` asks before it
    builds an ipip lab (lab/flannel_lab/kernelprobe.py); otherwise why not, as a skip reason."""
    if os.geteuid() != 0:
        return "needs root to create an ipip device in a network namespace"
    why = missing_link_kind("ipip", f"{netns.RUN_PREFIX}ipipprobe")
    return f"{why}; 'modprobe ipip' on the host enables these tests; {VM_LANE}" if why else ""


@functools.cache
def missing_kernel_wireguard() -> str:
    """"" when the kernel has WireGuard (its generic netlink family answers); otherwise
    why not, as a skip reason."""
    if os.geteuid() != 0:
        return "needs root to ask a network namespace's generic netlink for WireGuard"
    probe = netns.create("wgprobe")
    try:
        family = wireguard_family(Host(probe))
    finally:
        netns.delete(probe)
    if family is None:
        return (f"this kernel has no WireGuard module ('modprobe wireguard' where there is "
                f"one; {VM_LANE})")
    return ""


@functools.cache
def missing_kernel_esp() -> str:
    """"" when the kernel takes ESP states (as flanneld's own probe asks); otherwise why not,
    as a skip reason."""
    if os.geteuid() != 0:
        return "needs root to add an XFRM state in a network namespace"
    probe = netns.create("espprobe")
    try:
        has_esp = xfrm.kernel_has_esp(probe)
    finally:
        netns.delete(probe)
    if not has_esp:
        return (f"this kernel carries no ESP (no esp4 module or AES-GCM; 'modprobe esp4' "
                f"where there is one; {VM_LANE})")
    return ""
