"""What the traffic rules must say, independent of iptables or nftables.

Owns the inputs of the masquerade and forward rule sets (cluster network, own subnet,
multicast range, fully-random, destinations never masqueraded) per IP family, of the
encapsulation filter (the UDP ports of vxlan and the udp backend that only peers may send
to), and of the drop of encapsulation sent by pods (every port and IP protocol the backend
receives on); and how the rule tools print an IP protocol. The peers themselves (public
addresses of the leases) change with the lease set and are handed to the rules apart
(``PeerAddresses``).
Must not touch: the kernel.
"""

from __future__ import annotations

import re
import socket
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
    #: UDP ports and IP protocols of the backend's encapsulation: packets to them from the
    #: pod network are dropped, to this node and out of the pod network (empty: no drop).
    pod_encap_ports: tuple[int, ...] = ()
    pod_encap_protocols: tuple[int, ...] = ()

    @property
    def drops_pod_encap(self) -> bool:
        return bool(self.pod_encap_ports or self.pod_encap_protocols)

    @property
    def any_rules(self) -> bool:
        return self.masquerade or self.forward or bool(self.encap_ports) \
            or self.drops_pod_encap

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


_PROTOCOL_NAME = re.compile(r"(-p |l4proto )([a-z][a-z0-9-]*)\b")


def numeric_protocols(rule: str) -> str:
    """``rule`` as iptables or nft lists it, with each IP protocol named after ``-p`` or
    ``l4proto`` as its number: both tools print the name the C library finds for the number
    (``/etc/protocols``: ``esp``, ``ipencap``) and the number where there is none, so a
    listing is compared with what we wrote (numbers) whatever that file holds."""
    if "-p " not in rule and "l4proto " not in rule:
        return rule

    def number(found: re.Match[str]) -> str:
        try:
            return found[1] + str(socket.getprotobyname(found[2]))
        except OSError:
            return found[0]

    return _PROTOCOL_NAME.sub(number, rule)
