"""Fuzz target for the udp forwarder's receive path: whatever a host that can reach port
8285 sends, as one datagram or as a UDP_GRO batch, goes through ``received_writes``.

Inputs mix raw bytes of every length the socket can deliver (0 to 65535) with batches of
well-formed IPv4/TCP segments (the merge path) that hostile bytes may cut or corrupt, and
batch sizes the kernel never reports (0, negative, larger than the datagram). ``run``
checks what the worker relies on: every byte is accounted for as a packet taken or a drop,
and no write into the TUN is larger than an IPv4 packet plus the virtio header.
"""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from flannel.udp.packet import COUNTED, VNET_HDR, received_writes
from tests.support.fuzzing import FuzzTarget


def _tcp_segment(seq: int, payload: bytes, ttl: int) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", 1234, 80, seq & 0xFFFFFFFF, 1, 0x50, 0x10, 512, 0, 0)
    total = 20 + len(tcp) + len(payload)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, ttl, 6, 0,
                     bytes([10, 5, 1, 2]), bytes([10, 5, 2, 2]))
    return ip + tcp + payload


@st.composite
def _tcp_batch(draw: st.DrawFn) -> tuple[bytes, int]:
    size = draw(st.integers(1, 1400))
    count = draw(st.integers(1, 40))
    ttl = draw(st.integers(0, 3))
    batch = b"".join(_tcp_segment(1 + i * size, bytes(size), ttl) for i in range(count))
    cut = draw(st.integers(0, len(batch)))
    noise = draw(st.binary(max_size=8))
    spot = draw(st.integers(0, len(batch)))
    return batch[:cut] + noise + batch[cut + spot % 7:], 40 + size


datagrams = st.one_of(
    st.tuples(st.binary(max_size=64), st.integers(-2, 80)),
    st.tuples(st.binary(min_size=1, max_size=2048), st.integers(-(2**31), 2**31 - 1)),
    st.tuples(st.sampled_from([b"", b"\x45", bytes(19), bytes(20), b"\x45" + bytes(19),
                               b"\x60" + bytes(39), b"\x45" * 65535, bytes(65535)]),
              st.sampled_from([0, 1, 19, 20, 21, 1400, 65535, 65536, -1])),
    _tcp_batch(),
)


def _receive(value: tuple[bytes, int, bool]) -> None:
    data, gro_size, gro = value
    counters = dict.fromkeys(COUNTED, 0)
    writes = received_writes(memoryview(bytearray(data)), gro_size, gro, counters)
    taken = counters["rx_packets"]
    if data and taken + counters["drop_runt"] + counters["drop_not_ipv4"] == 0:
        raise AssertionError(f"{len(data)} bytes neither taken nor dropped")
    if not data and counters["drop_runt"] != 1:
        raise AssertionError("an empty datagram was not counted")
    if len(writes) + counters["drop_ttl"] > taken:
        raise AssertionError("more writes than packets taken")
    for iovec in writes:
        if sum(len(part) for part in iovec) > VNET_HDR.size + 0xFFFF:
            raise AssertionError("a TUN write exceeds an IPv4 packet")


TARGETS = [
    FuzzTarget("udp forwarder receive",
               st.tuples(datagrams, st.booleans()).map(lambda v: (v[0][0], v[0][1], v[1])),
               _receive),
]
