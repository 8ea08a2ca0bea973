"""Which free subnet a node tries to lease: a pure function of the taken subnets and the node.

The starting point is a hash of the node's public IP and the attempt number, spread over the
whole range from SubnetMin to SubnetMax; the node takes the first free subnet at or after it,
wrapping at SubnetMax. Simultaneous nodes thus rarely race for the same key, a loser retries
from an unrelated point, and a node that lost its lease tends to get the same subnet back.
The work is linear in the number of taken ranges, never in the size of the range (a /8 of
/24s or an IPv6 network is searched by arithmetic, not by listing candidates).
Must not touch: the store (the create-if-absent transaction decides who wins), the kernel.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import TypeVar

from flannel.digests import blake2b

Subnet = IPv4Network | IPv6Network
SubnetT = TypeVar("SubnetT", IPv4Network, IPv6Network)


#: An address range as (first, last) integers: how the taken subnets are compared (a listing
#: of 20,000 keys is 20,000 ranges, not 20,000 network objects).
Range = tuple[int, int]


def address_range(net: Subnet) -> Range:
    """The addresses ``net`` covers."""
    return int(net.network_address), int(net.broadcast_address)


def merged_ranges(ranges: Iterable[Range]) -> list[Range]:
    """``ranges`` sorted and merged into disjoint (first, last) pairs."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def start_index(seed: bytes, attempt: int, count: int) -> int:
    """A stable index below ``count`` for this seed and attempt (uniform for any count)."""
    digest = blake2b(seed + attempt.to_bytes(4, "big"), digest_size=32)
    return int.from_bytes(digest, "big") % count


def node_seed(public_ip: IPv4Address | None, public_ipv6: IPv6Address | None) -> bytes:
    """What identifies the node for the hash: its public IPv4, else its IPv6, else nothing
    stable (a node without a public IP picks at random, like upstream)."""
    ip = public_ip or public_ipv6
    return ip.packed if ip is not None else os.urandom(16)


def _first_free_from(base: int, last_base: int, first: int, size: int,
                     ranges: list[tuple[int, int]]) -> int | None:
    """The first free subnet base in [base, last_base], or None."""
    i = bisect.bisect_left(ranges, (base, -1))
    if i and ranges[i - 1][1] >= base:
        i -= 1  # the range before may still cover base
    while base <= last_base:
        if i < len(ranges) and ranges[i][0] < base + size:
            # Jump past the taken range to the next subnet boundary.
            base = first + -(-(ranges[i][1] + 1 - first) // size) * size
            i += 1
            continue
        return base
    return None


def free_subnet(network_type: type[SubnetT], subnet_len: int, bits: int,
                subnet_min: IPv4Address | IPv6Address, subnet_max: IPv4Address | IPv6Address,
                taken: Iterable[Range], seed: bytes, attempt: int = 0) -> SubnetT | None:
    """The first free subnet at or after the hashed point of ``seed`` and ``attempt``,
    wrapping from SubnetMax to SubnetMin; None when every subnet overlaps a ``taken``
    address range."""
    size = 1 << (bits - subnet_len)
    first, last = int(subnet_min), int(subnet_max)
    count = (last - first) // size + 1
    point = first + start_index(seed, attempt, count) * size
    ranges = merged_ranges(taken)
    base = _first_free_from(point, last, first, size, ranges)
    if base is None and point > first:
        base = _first_free_from(first, point - size, first, size, ranges)
    return None if base is None else network_type((base, subnet_len))
