"""What the wireguard labs share, on this kernel and in the vm lane: the networks, the
dual-stack config, the ping payload that must never be seen on the underlay, the ports."""

from __future__ import annotations

from collections.abc import Collection
from ipaddress import IPv4Network, IPv6Network, ip_address

from tests.support.capture import ip_packet

NETWORK = IPv4Network("10.244.0.0/16")
NETWORK6 = IPv6Network("fd00:10:244::/56")
DUAL = {"Network": str(NETWORK), "EnableIPv6": True, "IPv6Network": str(NETWORK6),
        "Backend": {"Type": "wireguard"}}
#: The payload of every ping: it must never be seen on the underlay.
PATTERN = "f1a77e1ddeadc0de"
PORTS = {51820, 51821}


def assert_only_wireguard_between(frames: list[bytes], underlay: Collection[str]) -> None:
    """What a capture of the underlay shows while pods ping: between the nodes only
    WireGuard's UDP (on both ports: both families went through it; ICMPv6 neighbour
    discovery aside), no pod address and no byte of the pings' payload in clear."""
    packets = [p for p in map(ip_packet, frames) if p is not None]
    between = [p for p in packets if p[0] in underlay and p[1] in underlay
               and not (p[2] == 58 and 133 <= p[3] <= 137)]  # ICMPv6 ND is not ours
    wireguard = [p for p in between if p[2] == 17 and {p[3], p[4]} & PORTS]
    assert {p[4] for p in wireguard} >= PORTS, wireguard[:5]
    assert between == wireguard, [p for p in between if p not in wireguard][:5]
    in_clear = [p for p in packets if any(
        ip_address(a) in (NETWORK6 if ":" in a else NETWORK) for a in p[:2])]
    assert not in_clear, in_clear[:5]
    assert not [f for f in frames if bytes.fromhex(PATTERN) in f]
