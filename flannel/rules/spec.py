"""What the traffic rules must say, independent of iptables or nftables.

Owns the inputs of the masquerade and forward rule sets (cluster network, own subnet,
multicast range, fully-random, destinations never masqueraded) per IP family.
Must not touch: the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

KUBE_PROXY_MARK = 0x4000
MULTICAST: dict[int, IPv4Network | IPv6Network] = {
    4: IPv4Network("224.0.0.0/4"), 6: IPv6Network("ff00::/8")}


@dataclass(frozen=True)
class FamilyRules:
    """The rules of one IP family. ``subnet`` is this node's lease subnet (network form)."""

    version: int
    network: IPv4Network | IPv6Network
    subnet: IPv4Network | IPv6Network
    masquerade: bool
    forward: bool
    fully_random: bool = True
    non_masquerade: tuple[IPv4Network | IPv6Network, ...] = ()

    @property
    def multicast(self) -> IPv4Network | IPv6Network:
        return MULTICAST[self.version]
