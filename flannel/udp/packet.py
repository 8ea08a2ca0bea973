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
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
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
        #: The peers' public addresses as ``recvmsg`` gives a datagram's source.
        self.sources = frozenset(str(public_ip) for public_ip in peers.values())

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


def _flow_mask(header_end: int) -> int:
    """A mask over the headers (read as one big-endian integer) that zeroes the fields that
    may differ along a TCP run: IP id and checksum, TCP PSH and checksum. The IP total
    length and the TCP sequence stay: each segment's expected values are compared too."""
    mask = bytearray(b"\xff" * header_end)
    for start, end in ((4, 6), (10, 12), (36, 38)):
        mask[start:end] = bytes(end - start)
    mask[33] &= ~TCP_PSH & 0xFF
    return int.from_bytes(mask, "big")


#: By IP + TCP header length (TCP headers of 20 to 60 bytes): the mask, and the bit
#: positions of the IP total length and the TCP sequence in the headers read as an integer.
_FLOW_MASKS = {20 + tcp_len: (_flow_mask(20 + tcp_len), (20 + tcp_len - 4) * 8,
                              (20 + tcp_len - 28) * 8) for tcp_len in range(20, 64, 4)}


#: The counters ``received_writes`` adds to.
COUNTED = ("rx_packets", "drop_runt", "drop_not_ipv4", "drop_ttl")

#: One write into the TUN: buffers written with ``writev``.
IOVec = list[bytes | bytearray | memoryview]


def merge_tcp(segments: list[memoryview]) -> Iterable[IOVec | None]:
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
            seq = int.from_bytes(first[24:28], "big")
            mask, length_at, seq_at = _FLOW_MASKS[header_end]
            # The first segment's headers without its length and sequence: a segment
            # belongs to the run when its headers are these plus its own length and the
            # next sequence number, which is one integer compare per segment.
            flow = ((int.from_bytes(first[:header_end], "big") & mask)
                    ^ (len(first) << length_at) ^ (seq << seq_at))
            seq += mss
            psh = first[33] & TCP_PSH
            while i + run < count and run < 44:
                segment = segments[i + run]
                size = len(segment) - header_end
                # The flow covers version, header lengths, protocol, flags and TTL.
                if (size <= 0 or size > mss
                        or int.from_bytes(segment[:header_end], "big") & mask
                        != flow | (len(segment) << length_at)
                        | ((seq & 0xFFFFFFFF) << seq_at)):
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


def received_writes(datagram: memoryview, gro_size: int, gro: bool,
                    counters: dict[str, int]) -> list[IOVec]:
    """The TUN writes for one received UDP datagram (a UDP_GRO batch of ``gro_size``-byte
    datagrams when ``gro_size`` > 0), TTLs decremented. Counted in ``counters``: the IPv4
    packets taken (``rx_packets``) and the drops (``drop_runt``, ``drop_not_ipv4``,
    ``drop_ttl``).

    Any bytes at all are valid input here: the datagram comes from whoever can reach the
    port. Empty datagrams, a batch size the kernel never sends (0, negative, larger than the
    datagram) and segments shorter than an IPv4 header or of another IP version are dropped.
    """
    length = len(datagram)
    step = gro_size if 0 < gro_size < length else length
    segments = []
    for offset in range(0, length, step) if length else ():
        segment = datagram[offset:offset + step]
        if len(segment) < IPV4_HEADER:
            counters["drop_runt"] += 1
        elif segment[0] >> 4 != 4:
            counters["drop_not_ipv4"] += 1
        else:
            segments.append(segment)
    if not length:
        counters["drop_runt"] += 1
    counters["rx_packets"] += len(segments)
    writes: list[IOVec] = []
    if gro:
        for iovec in merge_tcp(segments):
            if iovec is None:
                counters["drop_ttl"] += 1
            else:
                writes.append(iovec)
    else:
        for packet in segments:
            if decrement_ttl(packet):
                writes.append([VNET_HDR_NONE, packet])
            else:
                counters["drop_ttl"] += 1
    return writes


def _merged(run: list[memoryview], header_end: int, mss: int, psh: int
            ) -> IOVec:
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
