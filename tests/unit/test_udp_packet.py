"""Packet handling of the udp forwarder, against Go flannel's proxy (compat reference 6.7):
TTL decrement with the incremental checksum fix, the ICMP net-unreachable reply byte for
byte, the cases that get no reply, the peer lookup, and TCP run merging for GSO writes."""

from __future__ import annotations

import struct
from ipaddress import IPv4Address, IPv4Network

from hypothesis import given
from hypothesis import strategies as st

from flannel.udp.packet import (
    COUNTED,
    VNET_F_NEEDS_CSUM,
    VNET_GSO_TCPV4,
    VNET_HDR,
    VNET_HDR_NONE,
    PeerTable,
    decrement_ttl,
    merge_tcp,
    net_unreachable,
    received_writes,
)


def ones_sum(data: bytes) -> int:
    """Independent RFC 1071 sum (byte pairs, folded): 0xFFFF for a correct header."""
    total = 0
    for i in range(0, len(data), 2):
        total += data[i] << 8 | (data[i + 1] if i + 1 < len(data) else 0)
        total = (total & 0xFFFF) + (total >> 16)
    return total


def with_checksum(header: bytearray) -> bytearray:
    header[10:12] = b"\0\0"
    header[10:12] = (~ones_sum(bytes(header)) & 0xFFFF).to_bytes(2, "big")
    return header


def ipv4(src: str, dst: str, proto: int, payload: bytes, ttl: int = 64, ident: int = 0x1234,
         frag: int = 0x4000, options: bytes = b"") -> bytearray:
    ihl = (20 + len(options)) // 4
    header = bytearray(struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, ihl * 4 + len(payload),
                                   ident, frag, ttl, proto, 0, IPv4Address(src).packed,
                                   IPv4Address(dst).packed) + options)
    return with_checksum(header) + payload


UDP_PAYLOAD = bytes.fromhex("30390035000c0000") + b"abcd"


def test_ttl_decrement_fixes_the_checksum() -> None:
    packet = ipv4("10.5.1.5", "10.5.2.7", 17, UDP_PAYLOAD)
    assert decrement_ttl(packet)
    assert packet[8] == 63
    assert ones_sum(bytes(packet[:20])) == 0xFFFF
    assert packet[:20] == with_checksum(bytearray(packet[:20]))


@given(st.binary(min_size=20, max_size=20), st.integers(2, 255))
def test_ttl_decrement_keeps_any_header_valid(raw: bytes, ttl: int) -> None:
    header = bytearray(raw)
    header[0], header[8] = 0x45, ttl
    with_checksum(header)
    assert decrement_ttl(header)
    assert header[8] == ttl - 1
    assert ones_sum(bytes(header)) == 0xFFFF


def test_ttl_decrement_at_an_offset() -> None:
    buffer = bytearray(b"\xaa" * 10) + ipv4("10.5.1.5", "10.5.2.7", 17, UDP_PAYLOAD, ttl=9)
    assert decrement_ttl(memoryview(buffer)[10:])
    assert buffer[18] == 8 and buffer[:10] == b"\xaa" * 10
    assert ones_sum(bytes(buffer[10:30])) == 0xFFFF


def test_ttl_one_is_dropped_and_left_unchanged() -> None:
    packet = ipv4("10.5.1.5", "10.5.2.7", 17, UDP_PAYLOAD, ttl=1)
    before = bytes(packet)
    assert not decrement_ttl(packet)
    assert bytes(packet) == before


def test_net_unreachable_bytes() -> None:
    offender = ipv4("10.5.1.5", "10.5.9.1", 17, UDP_PAYLOAD)
    reply = net_unreachable(offender, IPv4Address("10.5.1.0"))
    quoted = bytes(offender[:28])  # IP header + first 8 bytes after it
    assert reply[:10] == bytes.fromhex("45000038" "00000000" "0801") and reply[12:20] == \
        bytes.fromhex("0a050100" "0a050105")  # TTL 8, ICMP, from our lease base to the sender
    assert ones_sum(reply[:20]) == 0xFFFF
    assert reply[20:22] == b"\x03\x00"  # destination unreachable, net unreachable
    assert reply[24:28] == b"\0\0\0\0" and reply[28:] == quoted and len(reply) == 56
    assert ones_sum(reply[20:]) == 0xFFFF
    assert reply.hex() == ("450000380000000008019cb70a0501000a050105"
                           "0300cc8500000000" + quoted.hex())


def test_net_unreachable_quotes_ip_options() -> None:
    offender = ipv4("10.5.1.5", "10.5.9.1", 6, bytes(20), options=b"\x01\x01\x01\x00")
    reply = net_unreachable(offender, IPv4Address("10.5.1.0"))
    assert len(reply) == 20 + 8 + 24 + 8 and reply[28:] == bytes(offender[:32])


def test_no_reply_for_icmp_fragments_and_malformed() -> None:
    source = IPv4Address("10.5.1.0")
    assert net_unreachable(ipv4("10.5.1.5", "10.5.9.1", 1, bytes(16)), source) is None
    later_fragment = ipv4("10.5.1.5", "10.5.9.1", 17, bytes(16), frag=0x2000 | 185)
    assert net_unreachable(later_fragment, source) is None
    first_fragment = ipv4("10.5.1.5", "10.5.9.1", 17, bytes(16), frag=0x2000)
    assert net_unreachable(first_fragment, source) is not None
    full_options = ipv4("10.5.1.5", "10.5.9.1", 17, bytes(16), options=b"\x01" * 40)
    assert net_unreachable(full_options, source) is None  # ihl 15: Go calls it malformed
    assert net_unreachable(ipv4("10.5.1.5", "10.5.9.1", 17, b"")[:24], source) is None
    assert net_unreachable(b"\x60" + bytes(39), source) is None  # not IPv4


def test_peer_lookup_longest_prefix() -> None:
    table = PeerTable({IPv4Network("10.5.0.0/16"): IPv4Address("172.31.0.9"),
                       IPv4Network("10.5.2.0/24"): IPv4Address("172.31.0.2")}, 8285)
    assert table.lookup(int(IPv4Address("10.5.2.200"))) == ("172.31.0.2", 8285)
    assert table.lookup(int(IPv4Address("10.5.3.1"))) == ("172.31.0.9", 8285)
    assert table.lookup(int(IPv4Address("10.6.0.1"))) is None
    assert PeerTable({}, 8285).lookup(0) is None


def test_peer_sources_are_the_public_ips_as_recvmsg_gives_them() -> None:
    table = PeerTable({IPv4Network("10.5.1.0/24"): IPv4Address("172.31.0.1"),
                       IPv4Network("10.5.2.0/24"): IPv4Address("172.31.0.2"),
                       IPv4Network("10.5.3.0/24"): IPv4Address("172.31.0.2")}, 8285)
    assert table.sources == {"172.31.0.1", "172.31.0.2"}
    assert PeerTable({}, 8285).sources == frozenset()


def tcp(seq: int, payload: bytes, flags: int = 0x10, sport: int = 40000, ttl: int = 63
        ) -> memoryview:
    header = struct.pack("!HHIIBBHHH", sport, 5201, seq, 777, 5 << 4, flags, 512, 0, 0)
    return memoryview(ipv4("10.5.1.5", "10.5.2.7", 6, header + payload, ttl=ttl))


def test_contiguous_tcp_segments_merge_into_one_gso_write() -> None:
    data = bytes(range(256)) * 11
    segments = [tcp(1000, data[:1000]), tcp(2000, data[1000:2000], flags=0x18),
                tcp(3000, data[2000:2816])]
    writes = list(merge_tcp(segments))
    assert len(writes) == 1
    vnet, header, *payloads = writes[0]
    assert VNET_HDR.unpack(vnet) == (VNET_F_NEEDS_CSUM, VNET_GSO_TCPV4, 40, 1000, 20, 16)
    assert b"".join(bytes(p) for p in payloads) == data[:2816]
    assert int.from_bytes(header[2:4], "big") == 40 + 2816
    assert ones_sum(bytes(header[:20])) == 0xFFFF
    assert header[8] == 62  # the receiver's TTL decrement, once for the run
    assert header[33] == 0x18  # PSH carried over
    pseudo = ones_sum(header[12:20] + struct.pack("!HH", 6, 20 + 2816))
    assert int.from_bytes(header[36:38], "big") == pseudo


def test_segments_that_must_not_merge_go_out_unchanged() -> None:
    gap = [tcp(1000, bytes(100)), tcp(1200, bytes(100))]
    syn = [tcp(1000, bytes(100), flags=0x12), tcp(1100, bytes(100))]
    flows = [tcp(1000, bytes(100)), tcp(1100, bytes(100), sport=40001)]
    larger = [tcp(1000, bytes(100)), tcp(1100, bytes(200))]
    for case in (gap, syn, flows, larger):
        before = [bytes(s) for s in case]
        writes = list(merge_tcp(case))
        assert [w[0] for w in writes] == [VNET_HDR_NONE, VNET_HDR_NONE]
        assert [w[1] for w in writes] == case
        for packet, original in zip(case, before, strict=True):
            assert packet[8] == original[8] - 1 and ones_sum(bytes(packet[:20])) == 0xFFFF


def test_runs_and_singles_at_ttl_one_are_dropped() -> None:
    run = [tcp(1000, bytes(100), ttl=1), tcp(1100, bytes(100), ttl=1)]
    single = [tcp(1000, bytes(100), flags=0x11, ttl=1)]
    assert list(merge_tcp(run)) == [None, None]
    assert list(merge_tcp(single)) == [None]


def test_a_segment_whose_length_field_lies_or_sequence_jumps_ends_the_run() -> None:
    lying = tcp(1100, bytes(100))
    lying[2:4] = (len(lying) + 4).to_bytes(2, "big")
    for second in (lying, tcp(1101, bytes(100)), tcp(1099, bytes(100))):
        writes = list(merge_tcp([tcp(1000, bytes(100)), second]))
        assert len(writes) == 2 and all(w is not None and w[0] == VNET_HDR_NONE
                                        for w in writes), bytes(second[:40]).hex()


def counters() -> dict[str, int]:
    return dict.fromkeys(COUNTED, 0)


def test_datagrams_of_any_length_are_taken_or_counted_never_raised() -> None:
    # An empty datagram once killed the forwarder (a zero batch step): any host can send it.
    for length in (0, 1, 19):
        seen = counters()
        assert received_writes(memoryview(bytearray(length)), 0, True, seen) == []
        assert seen["drop_runt"] == 1 and seen["rx_packets"] == 0
    seen = counters()
    header = ipv4("10.5.1.2", "10.5.2.2", 17, b"", ttl=2)
    [write] = received_writes(memoryview(header), 0, True, seen)
    assert bytes(write[1])[8] == 1 and seen["rx_packets"] == 1
    seen = counters()
    assert received_writes(memoryview(bytearray(65535)), 0, True, seen) == []
    assert seen["drop_not_ipv4"] == 1


def test_a_batch_is_split_at_the_reported_size_whatever_that_size_claims() -> None:
    packet = ipv4("10.5.1.2", "10.5.2.2", 17, UDP_PAYLOAD)
    batch = memoryview(bytearray(packet * 3 + packet[:10]))
    seen = counters()
    assert len(received_writes(batch, len(packet), False, seen)) == 3
    assert seen == {"rx_packets": 3, "drop_runt": 1, "drop_not_ipv4": 0, "drop_ttl": 0}
    # Sizes the kernel never reports (0, negative, past the end) read the whole datagram.
    for size in (0, -1, len(batch) + 1):
        seen = counters()
        received_writes(memoryview(bytearray(packet)), size, False, seen)
        assert seen["rx_packets"] == 1
    seen = counters()
    received_writes(memoryview(bytearray(packet * 2)), 1, False, seen)
    assert seen["drop_runt"] == 2 * len(packet)
