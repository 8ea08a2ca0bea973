"""What the traffic rules must say, independent of iptables or nftables.

Owns the inputs of the masquerade and forward rule sets (cluster network, own subnet,
multicast range, fully-random, destinations never masqueraded) per IP family, and of the
encapsulation filter: the UDP ports (vxlan, udp backend) that only peers may send to. The
peers themselves (public addresses of the leases) change with the lease set and are handed
to the rules apart (``PeerAddresses``).
Must not touch: the kernel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

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
    #: UDP ports whose packets are dropped unless their source is a peer's public address
    #: (empty: no filter).
    encap_ports: tuple[int, ...] = ()

    @property
    def any_rules(self) -> bool:
        return self.masquerade or self.forward or bool(self.encap_ports)

    @property
    def multicast(self) -> IPv4Network | IPv6Network:
        return MULTICAST[self.version]


#: The addresses encapsulated traffic is accepted from, by IP version (4, 6).
PeerAddresses = dict[int, frozenset[IPv4Address | IPv6Address]]


def peer_addresses(addresses: Iterable[IPv4Address | IPv6Address | None]) -> PeerAddresses:
    """Addresses (None skipped) grouped by IP version, both versions always present."""
    out: dict[int, set[IPv4Address | IPv6Address]] = {4: set(), 6: set()}
    for address in addresses:
        if address is not None:
            out[address.version].add(address)
    return {version: frozenset(found) for version, found in out.items()}
