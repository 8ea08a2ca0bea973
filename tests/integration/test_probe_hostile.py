"""Hostile answers to flanneld's probes change nothing and cost bounded CPU: a spoofed echo
reply (the pinger's identifier and sequence number right, the probe's secret wrong), an echo
reply with the secret from another address, an ICMP error from a host that never saw the
probe, and a flood of replies. The packets arrive from the wire: written as Ethernet frames
on the far end of a veth whose near end holds the probing address, in a namespace the test
creates; the real target is silent (a neighbour entry for an address nobody holds)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from ipaddress import IPv4Address

import pytest

from flannel.kernel.host import Host
from flannel.probing import icmp
from flannel.probing.icmp import Echo, Pinger
from tests.support import netns

pytestmark = pytest.mark.netns

OURS, TARGET, ELSEWHERE = "10.7.0.1", "10.7.0.2", "10.7.0.9"
OUR_MAC, FAR_MAC = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")


def wire(ns: str) -> None:
    """``va`` (ours, 10.7.0.1) <-> ``vb`` (the wire: nothing answers there)."""
    netns.ip("link", "add", "va", "address", "02:00:00:00:00:01", "type", "veth", "peer",
             "name", "vb", "address", "02:00:00:00:00:02", netns=ns)
    netns.ip("addr", "add", f"{OURS}/24", "dev", "va", netns=ns)
    netns.ip("neigh", "add", TARGET, "lladdr", "02:00:00:00:00:02", "dev", "va", "nud",
             "permanent", netns=ns)
    for device in ("va", "vb"):
        netns.ip("link", "set", device, "up", netns=ns)


def ipv4(src: str, dst: str, payload: bytes) -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 7, 0, 64,
                         socket.IPPROTO_ICMP, 0, IPv4Address(src).packed,
                         IPv4Address(dst).packed)
    summed = header[:10] + struct.pack("!H", icmp.checksum(header)) + header[12:]
    return summed + payload


def reply(src: str, ident: int, seq: int, data: bytes) -> bytes:
    body = struct.pack("!BBHHH", icmp.ECHO_REPLY, 0, 0, ident, seq) + data
    body = body[:2] + struct.pack("!H", icmp.checksum(body)) + body[4:]
    return ipv4(src, OURS, body)


def unreachable(src: str, ident: int, seq: int, data: bytes) -> bytes:
    quoted = ipv4(OURS, TARGET, icmp.echo_request(ident, seq, data))[:20 + 8 + len(data)]
    body = struct.pack("!BBHI", icmp.DEST_UNREACHABLE, 1, 0, 0) + quoted
    body = body[:2] + struct.pack("!H", icmp.checksum(body)) + body[4:]
    return ipv4(src, OURS, body)


class Wire:
    """Frames written on ``vb``: the kernel receives them on ``va`` as from the network."""

    def __init__(self, ns: str) -> None:
        with Host(ns).entered():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            self.sock.bind(("vb", 0))

    def send(self, packet: bytes) -> None:
        self.sock.send(OUR_MAC + FAR_MAC + b"\x08\x00" + packet)

    def close(self) -> None:
        self.sock.close()


def pinger_in(ns: str) -> Pinger:
    with Host(ns).entered():
        return Pinger([IPv4Address(OURS)])


async def in_flight(pinger: Pinger, timeout: float) -> tuple[asyncio.Task[Echo], int, bytes]:
    """An echo to the silent target, and its sequence number and secret once sent."""
    task = asyncio.create_task(pinger.echo(IPv4Address(TARGET), timeout=timeout))
    for _ in range(100):
        await asyncio.sleep(0.01)
        if pinger._waiting:
            break
    seq, waiting = next(iter(pinger._waiting.items()))
    return task, seq, waiting.secret


def test_forged_answers_change_nothing(ns):
    wire(ns)
    link = Wire(ns)
    pinger = pinger_in(ns)

    async def run() -> Echo:
        task, seq, secret = await in_flight(pinger, 1.0)
        forged = os.urandom(icmp.SECRET)
        # Who knows the identifier and sequence number but not the secret...
        link.send(reply(TARGET, pinger.ident, seq, icmp.payload(forged, icmp.SMALL)))
        # ... or has the secret but answers from another address ...
        link.send(reply(ELSEWHERE, pinger.ident, seq, icmp.payload(secret, icmp.SMALL)))
        # ... or says "host unreachable" quoting the echo without its secret.
        link.send(unreachable(ELSEWHERE, pinger.ident, seq, forged))
        return await task

    try:
        echo = asyncio.run(run())
    finally:
        pinger.close()
        link.close()
    assert (echo.sent, echo.rtt, echo.error, echo.flooded) == (1, None, "", False)
    assert pinger.strays == 3  # each was read, and matched nothing


def test_a_true_answer_among_forged_ones_is_taken(ns):
    """The control: the same path carries an answer that is right in every respect."""
    wire(ns)
    link = Wire(ns)
    pinger = pinger_in(ns)

    async def run() -> Echo:
        task, seq, secret = await in_flight(pinger, 1.0)
        link.send(reply(TARGET, pinger.ident, seq, icmp.payload(os.urandom(8), icmp.SMALL)))
        link.send(reply(TARGET, pinger.ident, seq, icmp.payload(secret, icmp.SMALL)))
        return await task

    try:
        echo = asyncio.run(run())
    finally:
        pinger.close()
        link.close()
    assert echo.rtt is not None and pinger.strays == 1


def test_a_flood_of_replies_costs_bounded_cpu_and_concludes_nothing(ns):
    wire(ns)
    link = Wire(ns)
    pinger = pinger_in(ns)
    stop = threading.Event()

    def flood(seq: int) -> None:
        # Replies with the pinger's identifier (the kernel's filter lets them through) and
        # every sequence number but the echo's, as fast as this thread can write them.
        packets = [reply(TARGET, pinger.ident, n, b"\0" * 16) for n in range(0, 0x10000, 97)
                   if n != seq]
        while not stop.is_set():
            for packet in packets:
                try:
                    link.send(packet)
                except OSError:  # the device's queue is full: the kernel drops, we go on
                    pass

    async def run() -> tuple[Echo, float]:
        task, seq, _secret = await in_flight(pinger, 2.0)
        sender = threading.Thread(target=flood, args=(seq,), daemon=True)
        started = time.thread_time()  # this thread runs the event loop, and every read
        sender.start()
        try:
            echo = await task
        finally:
            stop.set()
            sender.join(timeout=10)
        return echo, time.thread_time() - started

    try:
        echo, cpu = asyncio.run(run())
    finally:
        pinger.close()
        link.close()
    assert echo.rtt is None and echo.flooded  # its caller concludes nothing from it
    assert pinger.floods >= 1
    # At most READS_PER_SECOND (2000) reads a second for the 2 s the echo waits: a few
    # tens of milliseconds of this thread's time, far from the core the flood would take.
    assert pinger.strays <= 2 * icmp.READS_PER_SECOND + 256, pinger.strays
    assert cpu < 0.5, cpu
