"""The checksum-offload check: tx checksum offload on a device whose packets the kernel wraps
in UDP itself (its backend's description says which: ``DevicePlan.udp_offload``) combined
with source-port randomising NAT (``--random-fully``) or IPVS corrupts the outer UDP checksum
on affected kernels and NICs (flannel issues #1279, #2152); the fix turns
``tx-checksum-ip-generic`` off on that device. Only a masquerade that can rewrite the
encapsulated packets themselves counts: flanneld's own (``--ip-masq``: the chain
``FLANNEL-POSTRTG``, the nft tables ``flannel-ipv4``/``flannel-ipv6``) matches pod addresses
only, never the outer packets between public IPs, so its ``--random-fully`` is no sign of
the bug.

Owns reading and, only when asked, clearing that feature through the ethtool ioctl (no
ethtool binary needed). Must not touch any other feature or device.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
from pathlib import Path

from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.findings import Finding
from flannel.ops.kernelview import ToolError, run_tool
from flannel.rules.iptables import MASQ_CHAIN

#: flanneld's own nftables tables (flannel/rules/nftables.py).
FLANNEL_TABLES = ("flannel-ipv4", "flannel-ipv6")

FEATURE = "tx-checksum-ip-generic"
SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSSET_INFO = 0x37
ETHTOOL_GFEATURES = 0x3A
ETHTOOL_SFEATURES = 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32


def _ethtool(device: str, request: bytearray) -> bytearray:
    buffer = ctypes.create_string_buffer(bytes(request), len(request))
    ifreq = struct.pack("16sP", device.encode()[:15], ctypes.addressof(buffer))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    return bytearray(buffer.raw)


def _feature_index(device: str, name: str) -> tuple[int | None, int]:
    """The index of feature ``name`` (None if unknown) and the number of 32-bit feature
    words the kernel expects in a features request."""
    info = _ethtool(device, bytearray(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0,
                                                  1 << ETH_SS_FEATURES, 0)))
    count = struct.unpack_from("=I", info, 16)[0]
    count = min(count, 4096)
    request = bytearray(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count))
    strings = _ethtool(device, request + bytearray(count * ETH_GSTRING_LEN))
    for index in range(count):
        start = 12 + index * ETH_GSTRING_LEN
        if strings[start:start + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode() == name:
            return index, (count + 31) // 32
    return None, (count + 31) // 32


def feature_active(device: str, name: str = FEATURE) -> bool | None:
    """Whether ``name`` is active on ``device``; None when the device lacks it."""
    index, blocks = _feature_index(device, name)
    if index is None:
        return None
    reply = _ethtool(device, bytearray(struct.pack("=II", ETHTOOL_GFEATURES, blocks))
                     + bytearray(16 * blocks))
    active = struct.unpack_from("=I", reply, 8 + 16 * (index // 32) + 8)[0]
    return bool(active & (1 << (index % 32)))


def turn_off(device: str, name: str = FEATURE) -> None:
    index, blocks = _feature_index(device, name)
    if index is None:
        raise OSError(f"{device} has no feature {name}")
    request = bytearray(struct.pack("=II", ETHTOOL_SFEATURES, blocks) + bytes(8 * blocks))
    struct.pack_into("=II", request, 8 + 8 * (index // 32), 1 << (index % 32), 0)
    _ethtool(device, request)


def foreign_random_rule(listing: str, marker: str) -> bool:
    """Whether an ``nft list ruleset`` or ``iptables-save`` listing holds a rule with
    ``marker`` outside flanneld's own masquerade chain and tables."""
    chain = table = ""
    for line in listing.splitlines():
        words = line.split()
        if words[:1] == ["table"] and len(words) >= 3:
            table, chain = words[2], ""
        elif words[:1] == ["chain"] and len(words) >= 2:
            chain = words[1]
        elif words[:1] == ["-A"] and len(words) >= 2:
            chain = words[1]
        if marker in words and chain != MASQ_CHAIN and table not in FLANNEL_TABLES:
            return True
    return False


def randomising_nat() -> str:
    """What on this node, other than flanneld's own masquerade, rewrites source ports at
    random ('' if nothing found)."""
    if Path("/proc/net/ip_vs").exists():
        return "IPVS (kube-proxy --proxy-mode=ipvs)"
    for cmd, marker in ((("nft", "list", "ruleset"), "fully-random"),
                        (("iptables-save", "-t", "nat"), "--random-fully")):
        try:
            if foreign_random_rule(run_tool(*cmd), marker):
                return f"masquerade rules with {marker}"
        except ToolError:
            continue
    return ""


def check_checksum(ctx: Context) -> list[Finding]:
    from flannel.ops.checks.kernel import devices

    return [finding for plan, _link in devices(ctx) if plan.udp_offload
            for finding in _check_device(ctx, plan.name)]


def _check_device(ctx: Context, device: str) -> list[Finding]:
    try:
        active = feature_active(device)
    except OSError as err:
        return [Finding("checksum", "info", f"checksum offload of {device} not checked: {err}")]
    if not active:
        return []
    nat = randomising_nat()
    if not nat:
        return []
    if ctx.fix_checksum:
        try:
            turn_off(device)
        except OSError as err:
            return [Finding("checksum", "error", f"could not turn {FEATURE} off on {device}: "
                            f"{err}", f"ethtool -K {device} {FEATURE} off")]
        return [Finding("checksum", "info", f"turned {FEATURE} off on {device} (it comes back "
                        "when the device is recreated: run with --fix-checksum-offload again "
                        "after flanneld recreates it)")]
    return [Finding(
        "checksum", "warning", f"{device} offloads the UDP checksum ({FEATURE} on) while "
        f"this node has {nat}: affected kernels and NICs send encapsulated packets with a bad "
        "checksum, so traffic to Services on other nodes times out",
        f"{flannelctl('doctor', '--fix-checksum-offload')} (ethtool -K {device} {FEATURE} "
        "off)")]
