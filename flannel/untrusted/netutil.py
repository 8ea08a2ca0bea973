"""IP address parsing and containment shared by the config, lease and interface code.

Must not touch: anything outside parsing.
"""

from __future__ import annotations

import ipaddress
import socket
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

#: How much of a bad value a message quotes.
QUOTE_LIMIT = 60


def quoted(text: str) -> str:
    """``repr(text)``, cut at ``QUOTE_LIMIT`` characters so that a message stays readable."""
    return repr(text) if len(text) <= QUOTE_LIMIT else repr(text[:QUOTE_LIMIT]) + "..."


def parse_ip(text: str, version: int) -> IPv4Address | IPv6Address:
    """``text`` as an address of the given family; ValueError saying what is wrong."""
    if version == 4:
        # The C parser accepts exactly what ipaddress does for IPv4 (four decimal octets, no
        # leading zeros) at a fifth of the cost: every lease value holds one. Anything it
        # refuses goes the slow way, for the message.
        try:
            return IPv4Address(socket.inet_pton(socket.AF_INET, text))
        except (OSError, ValueError, UnicodeError):
            pass
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"{quoted(text)} is not an IP address") from None
    if addr.version != version:
        raise ValueError(f"{quoted(text)} is not an IPv{version} address")
    return addr


def unusable_address(addr: IPv4Address | IPv6Address | None) -> str | None:
    """Why ``addr`` cannot be a node's public address (None when it can): peers would send
    their traffic nowhere, to themselves, or to a group."""
    if isinstance(addr, IPv4Address):
        return _unusable_v4(int(addr))
    if addr is None or addr.is_unspecified:
        return "it is unspecified (0.0.0.0 or ::)"
    if addr.is_loopback:
        return "it is a loopback address"
    if addr.is_multicast:
        return "it is a multicast address"
    if addr.is_link_local:
        return "it is a link-local address"
    return None


def _unusable_v4(value: int) -> str | None:
    """``unusable_address`` for IPv4 in integer arithmetic (the ``is_*`` properties cost
    ~10 us per address, and a snapshot checks every peer's): 0.0.0.0, 127.0.0.0/8,
    224.0.0.0/4, 169.254.0.0/16 and 255.255.255.255."""
    if value == 0:
        return "it is unspecified (0.0.0.0 or ::)"
    if value >> 24 == 127:
        return "it is a loopback address"
    if value >> 28 == 0xE:
        return "it is a multicast address"
    if value >> 16 == 0xA9FE:
        return "it is a link-local address"
    if value == 0xFFFFFFFF:
        return "it is the broadcast address"
    return None


def within(subnet: IPv4Network | IPv6Network, network: IPv4Network | IPv6Network) -> bool:
    """Whether ``subnet`` lies inside ``network``; False across families (where
    ``subnet_of`` would raise TypeError)."""
    if isinstance(subnet, IPv4Network) and isinstance(network, IPv4Network):
        return subnet.subnet_of(network)
    if isinstance(subnet, IPv6Network) and isinstance(network, IPv6Network):
        return subnet.subnet_of(network)
    return False
