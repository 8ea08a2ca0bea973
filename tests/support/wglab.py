"""What the wireguard labs share, on this kernel and in the vm lane: the networks, the
dual-stack config, the ping payload that must never be seen on the underlay, the ports."""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network

NETWORK = IPv4Network("10.244.0.0/16")
NETWORK6 = IPv6Network("fd00:10:244::/56")
DUAL = {"Network": str(NETWORK), "EnableIPv6": True, "IPv6Network": str(NETWORK6),
        "Backend": {"Type": "wireguard"}}
#: The payload of every ping: it must never be seen on the underlay.
PATTERN = "f1a77e1ddeadc0de"
PORTS = {51820, 51821}
