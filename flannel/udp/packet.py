"""IPv4 packet handling of the udp forwarder: pure functions on bytes, no I/O.

Owns the TTL decrement with its incremental checksum fix, the ICMP "destination net
unreachable" reply Go flannel's C proxy writes back into the TUN, the peer lookup table and
the merge of consecutive TCP segments into one GSO write (receive side).
Must not touch: sockets, the TUN device, the control channel (``flannel/udp/worker.py``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from ipaddress import IPv4Address, IPv4Network

IPV4_HEADER = 20
MAX_HEADER = 60  # Go's proxy refuses ihl*4 >= 20 + MAX_IPOPTLEN (40): "malformed"
PROTO_ICMP, PROTO_TCP = 1, 6
ICMP_TTL = 8
FRAGMENT_OFFSET_MASK = 0x1FFF
TCP_PSH = 0x08
#: TCP flags that never merge: FIN, SYN, RST, URG, ECE, CWR (only ACK and PSH do).
TCP_UNMERGEABLE = 0x01 | 0x02 | 0x04 | 0x20 | 0x40 | 0x80

#: virtio_net_hdr (host byte order on x86/arm64): flags, gso_type, hdr_len, gso_size,
#: csum_start, csum_offset. The TUN is opened with IFF_VNET_HDR so merged writes can carry it.
VNET_HDR = struct.Struct("<BBHHHH")
VNET_HDR_NONE = bytes(VNET_HDR.size)
VNET_F_NEEDS_CSUM = 1
VNET_GSO_TCPV4 = 1


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def decrement_ttl(packet: bytearray | memoryview, offset: int = 0) -> bool:
    """Decrement the TTL in place and fix the header checksum (RFC 1624).

    False when the TTL reaches 0: the caller drops the packet, as Go's proxy does.
    """
    ttl = packet[offset + 8] - 1
    if ttl <= 0:
        return False
    packet[offset + 8] = ttl
    # The TTL is the high byte of header word 4: it fell by 0x0100, so the one's-complement
    # checksum rises by 0x0100 with the end-around carry.
    check = (packet[offset + 10] << 8 | packet[offset + 11]) + 0x0100
    check = (check & 0xFFFF) + (check >> 16)
    packet[offset + 10] = check >> 8
    packet[offset + 11] = check & 0xFF
    return True


def net_unreachable(offender: bytes | bytearray | memoryview, source: IPv4Address
                    ) -> bytes | None:
    """The ICMP type 3 code 0 reply to ``offender``, or None when none is due.

    None for ICMP (RFC 792: no ICMP about ICMP), non-first fragments, malformed or short
    packets. As Go's proxy: TTL 8, id 0, no flags, source = our lease base address, payload =
    the offender's IP header and the first 8 bytes after it.
    """
    if len(offender) < IPV4_HEADER or offender[0] >> 4 != 4:
        return None
    header_len = (offender[0] & 0x0F) * 4
    if header_len < IPV4_HEADER or header_len >= MAX_HEADER:
        return None
    if offender[9] == PROTO_ICMP:
        return None
    if (offender[6] << 8 | offender[7]) & FRAGMENT_OFFSET_MASK:
        return None
    if len(offender) < header_len + 8:
        return None  # Go copies stale buffer bytes here; we send nothing instead
    quoted = bytes(offender[:header_len + 8])
    icmp = bytearray(b"\x03\x00\x00\x00\x00\x00\x00\x00" + quoted)
    icmp[2:4] = checksum(icmp).to_bytes(2, "big")
    total = IPV4_HEADER + len(icmp)
    ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0, ICMP_TTL, PROTO_ICMP, 0,
                               source.packed, bytes(offender[12:16])))
    ip[10:12] = checksum(ip).to_bytes(2, "big")
    return bytes(ip + icmp)


class PeerTable:
    """Inner destination -> (peer public IP, port), longest prefix first.

    Immutable once built: the worker swaps in a new table atomically on every update.
    """

    def __init__(self, peers: Mapping[IPv4Network, IPv4Address], port: int) -> None:
        by_length: dict[int, dict[int, tuple[str, int]]] = {}
        for subnet, public_ip in peers.items():
            shift = 32 - subnet.prefixlen
            by_length.setdefault(shift, {})[int(subnet.network_address) >> shift] = \
                (str(public_ip), port)
        self.levels = sorted(by_length.items())
        self.size = len(peers)

    def lookup(self, destination: int) -> tuple[str, int] | None:
        for shift, table in self.levels:
            hit = table.get(destination >> shift)
            if hit is not None:
                return hit
        return None


def _mergeable(packet: memoryview) -> int:
    """The TCP header length if ``packet`` is a plain TCP segment GRO-style merging accepts."""
    if len(packet) < 40 or packet[0] != 0x45 or packet[9] != PROTO_TCP:
        return 0
    if (packet[6] << 8 | packet[7]) & 0x3FFF:  # MF or a fragment offset
        return 0
    tcp_len = (packet[32] >> 4) * 4
    if tcp_len < 20 or len(packet) <= 20 + tcp_len or packet[33] & TCP_UNMERGEABLE:
        return 0
    if (packet[2] << 8 | packet[3]) != len(packet):
        return 0
    return tcp_len


def _flow_key(packet: memoryview, header_end: int) -> bytes:
    """The headers with the fields that differ along a TCP run zeroed: IP length, id and
    checksum, TCP sequence, PSH and checksum."""
    key = bytearray(packet[:header_end])
    key[33] &= ~TCP_PSH & 0xFF
    del key[36:38], key[24:28], key[10:12], key[2:6]  # highest first: offsets stay valid
    return bytes(key)


def merge_tcp(segments: list[memoryview]
              ) -> Iterable[list[bytes | bytearray | memoryview] | None]:
    """Group consecutive segments of one TCP flow into GSO writes (iovecs for ``writev``),
    decrementing the TTL as it goes (None for each packet whose TTL reaches 0).

    A run merges when every segment has the same IP and TCP headers except IP length, id
    and checksum, TCP sequence, checksum and PSH, sequences are contiguous, and every
    payload but the last has the size of the first. The merged packet carries a virtio
    header "checksum needed" with the pseudo-header sum in the TCP checksum field.

    Integrity: the kernel then does not verify the TCP checksums of the merged segments.
    Every byte of them was covered by the outer UDP checksum, which the kernel verified
    before handing us the datagram (flannel senders, Go's and ours, always fill it in), so
    the only bytes left unchecked are those this function writes, which the end-to-end data
    integrity test covers. Anything else goes out unchanged with a zero virtio header, and
    the kernel verifies it as usual.
    """
    i, count = 0, len(segments)
    while i < count:
        first = segments[i]
        tcp_len = _mergeable(first)
        run = 1
        if tcp_len:
            header_end = 20 + tcp_len
            mss = len(first) - header_end
            seq = int.from_bytes(first[24:28], "big") + mss
            key = _flow_key(first, header_end)
            psh = first[33] & TCP_PSH
            while i + run < count and run < 44:
                segment = segments[i + run]
                size = len(segment) - header_end
                # The key covers version, header lengths, protocol, flags and TTL.
                if (size <= 0 or size > mss
                        or (segment[2] << 8 | segment[3]) != len(segment)
                        or int.from_bytes(segment[24:28], "big") != seq & 0xFFFFFFFF
                        or _flow_key(segment, header_end) != key):
                    break
                psh |= segment[33] & TCP_PSH
                seq += size
                run += 1
                if size < mss:
                    break
        if run == 1:
            yield [VNET_HDR_NONE, first] if decrement_ttl(first) else None
        elif first[8] <= 1:  # one TTL for the whole run: the key covers it
            yield from [None] * run
        else:
            yield _merged(segments[i:i + run], header_end, mss, psh)
        i += run


def _merged(run: list[memoryview], header_end: int, mss: int, psh: int
            ) -> list[bytes | bytearray | memoryview]:
    first = run[0]
    payload_len = sum(len(s) for s in run) - header_end * len(run)
    total = header_end + payload_len
    if total > 0xFFFF:
        raise ValueError("merged TCP run exceeds 64 KiB")
    header = bytearray(first[:header_end])
    header[8] -= 1  # TTL (caller checked it stays above 0)
    header[2:4] = total.to_bytes(2, "big")
    header[10:12] = b"\0\0"
    header[10:12] = checksum(header[:20]).to_bytes(2, "big")
    header[33] |= psh
    tcp_total = total - 20
    pseudo = (int.from_bytes(header[12:14], "big") + int.from_bytes(header[14:16], "big")
              + int.from_bytes(header[16:18], "big") + int.from_bytes(header[18:20], "big")
              + PROTO_TCP + tcp_total)
    while pseudo >> 16:
        pseudo = (pseudo & 0xFFFF) + (pseudo >> 16)
    header[36:38] = pseudo.to_bytes(2, "big")
    vnet = VNET_HDR.pack(VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4, header_end, mss, 20, 16)
    return [vnet, header, *(s[header_end:] for s in run)]
