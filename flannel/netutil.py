"""IP address parsing shared by the config, lease and interface code.

Must not touch: anything outside parsing.
"""

from __future__ import annotations

import ipaddress
from ipaddress import IPv4Address, IPv6Address


def parse_ip(text: str, version: int) -> IPv4Address | IPv6Address:
    """``text`` as an address of the given family; ValueError saying what is wrong."""
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an IP address") from None
    if addr.version != version:
        raise ValueError(f"{text!r} is not an IPv{version} address")
    return addr
