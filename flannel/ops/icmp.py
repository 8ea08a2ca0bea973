"""ICMP echo over one raw socket: the packets built and parsed here, many probes in flight.

Why a raw socket (``SOCK_RAW``/``IPPROTO_ICMP``) and not the alternatives:
- The unprivileged ICMP socket (``SOCK_DGRAM``) works only for groups in
  ``net.ipv4.ping_group_range``, which is ``1 0`` (nobody, root included) in every new network
  namespace and on many hosts; and it reports an ICMP error (host or network unreachable) only
  through the ``IP_RECVERR`` error queue. A raw socket needs CAP_NET_RAW, which flanneld's
  own place has (root on a host; NET_RAW in the DaemonSet), and it receives ICMP errors as
  ordinary packets that carry the original header, so "unreachable, said router X" is told
  apart from silence.
- Running ``ping`` costs a process per probe, its output is for humans, and its exit status
  says "no answer" whether the packet timed out or came back unreachable.
One socket per IP family serves every probe of a run: each echo carries the run's identifier
and its own sequence number, and one reader hands each answer to the probe waiting for it, so
a check of many peers does not copy every incoming ICMP packet into many sockets. A kernel
filter (``ICMP_FILTER``, ``ICMP6_FILTER``) lets only echo replies and errors through. ICMPv6
is read without its IP header (the sender comes with each packet), and the kernel computes
its checksum.
Must not touch: anything but the socket it opens.
"""

from __future__ import annotations

import asyncio
import errno
import random
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

ECHO_REPLY, DEST_UNREACHABLE, ECHO_REQUEST, TIME_EXCEEDED = 0, 3, 8, 11
ECHO6_REQUEST, ECHO6_REPLY, DEST6_UNREACHABLE, PACKET_TOO_BIG, TIME6_EXCEEDED = 128, 129, 1, 2, 3
ICMP6_FILTER = 1  # IPPROTO_ICMPV6 option: a bit set per ICMPv6 type to block
UNREACHABLE6_CODES = {0: "no route to destination",
                      1: "communication administratively prohibited",
                      3: "address unreachable", 4: "port unreachable",
                      5: "source address failed policy", 6: "reject route to destination"}
IPAddress = IPv4Address | IPv6Address
ICMP_FILTER = 1  # SOL_RAW option: a bit set per ICMP type to drop
SOL_RAW = 255
PAYLOAD = b"flannelctl check".ljust(56, b".")  # ping's default size
UNREACHABLE_CODES = {0: "network unreachable", 1: "host unreachable",
                     2: "protocol unreachable", 3: "port unreachable",
                     4: "fragmentation needed", 9: "network administratively prohibited",
                     10: "host administratively prohibited",
                     13: "communication administratively prohibited"}


class IcmpError(Exception):
    """ICMP probes cannot be sent from here; the message says why and what to do."""


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    total: int = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes = PAYLOAD) -> bytes:
    """An ICMP echo request (no IP header: the kernel adds it)."""
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident & 0xFFFF, seq & 0xFFFF)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + payload), ident & 0xFFFF,
                       seq & 0xFFFF) + payload


def echo6_request(ident: int, seq: int, payload: bytes = PAYLOAD) -> bytes:
    """An ICMPv6 echo request; its checksum (over a pseudo-header) is the kernel's."""
    return struct.pack("!BBHHH", ECHO6_REQUEST, 0, 0, ident & 0xFFFF, seq & 0xFFFF) + payload


@dataclass(frozen=True)
class Answer:
    """An ICMP packet about one of our echoes: a reply from ``target``, or an error about the
    echo we sent to ``target``, sent by ``sender`` (a router on the way, or this host)."""

    ident: int
    seq: int
    target: IPAddress
    sender: IPAddress
    error: str = ""  # empty for an echo reply


def _ipv4_header(packet: bytes) -> tuple[int, int, IPv4Address, IPv4Address] | None:
    """(header length, protocol, source, destination) of an IPv4 packet; None if malformed."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    length = (packet[0] & 0x0F) * 4
    if length < 20 or len(packet) < length:
        return None
    return length, packet[9], IPv4Address(packet[12:16]), IPv4Address(packet[16:20])


def parse(packet: bytes) -> Answer | None:
    """What a packet read from a raw ICMP socket (IPv4 header included) says about an echo:
    an echo reply with a valid checksum, or a destination-unreachable / time-exceeded error
    quoting one of our echo requests. None for anything else."""
    outer = _ipv4_header(packet)
    if outer is None or outer[1] != socket.IPPROTO_ICMP:
        return None
    icmp = packet[outer[0]:]
    if len(icmp) < 8:
        return None
    kind, code = icmp[0], icmp[1]
    if kind == ECHO_REPLY:
        if checksum(icmp) != 0:
            return None
        ident, seq = struct.unpack_from("!HH", icmp, 4)
        return Answer(ident, seq, outer[2], outer[2])
    if kind not in (DEST_UNREACHABLE, TIME_EXCEEDED):
        return None
    inner = _ipv4_header(icmp[8:])  # the quoted header of the packet that failed
    if inner is None or inner[1] != socket.IPPROTO_ICMP:
        return None
    quoted = icmp[8 + inner[0]:]
    if len(quoted) < 8 or quoted[0] != ECHO_REQUEST:
        return None
    ident, seq = struct.unpack_from("!HH", quoted, 4)
    if kind == TIME_EXCEEDED:
        error = "time to live exceeded (a routing loop?)"
    else:
        error = UNREACHABLE_CODES.get(code, f"destination unreachable (code {code})")
    return Answer(ident, seq, inner[3], outer[2], error)


def parse6(packet: bytes, sender: IPv6Address) -> Answer | None:
    """What an ICMPv6 packet (no IP header) from ``sender`` says about an echo: a reply, or
    an error quoting one of our echo requests (its IPv6 header and the request). The kernel
    has checked the checksum. None for anything else."""
    if len(packet) < 8:
        return None
    kind, code = packet[0], packet[1]
    if kind == ECHO6_REPLY:
        ident, seq = struct.unpack_from("!HH", packet, 4)
        return Answer(ident, seq, sender, sender)
    if kind not in (DEST6_UNREACHABLE, PACKET_TOO_BIG, TIME6_EXCEEDED):
        return None
    quoted = packet[8:]
    # The invoking packet: a 40-byte IPv6 header whose next header is ICMPv6, then our echo.
    if len(quoted) < 48 or quoted[0] >> 4 != 6 or quoted[6] != socket.IPPROTO_ICMPV6 \
            or quoted[40] != ECHO6_REQUEST:
        return None
    ident, seq = struct.unpack_from("!HH", quoted, 44)
    target = IPv6Address(quoted[24:40])
    if kind == TIME6_EXCEEDED:
        error = "hop limit exceeded (a routing loop?)"
    elif kind == PACKET_TOO_BIG:
        error = f"packet too big (MTU {struct.unpack_from('!I', packet, 4)[0]})"
    else:
        error = UNREACHABLE6_CODES.get(code, f"destination unreachable (code {code})")
    return Answer(ident, seq, target, sender, error)


@dataclass
class Probe:
    """What ``count`` echoes to one target gave: round trips of the answered ones (seconds),
    errors that came back, and why an echo could not be sent."""

    target: IPAddress
    sent: int = 0
    rtts: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "host unreachable from 192.168.111.1"
    send_error: str = ""

    @property
    def lost(self) -> int:
        return self.sent - len(self.rtts)


Reply = asyncio.Future[tuple[Answer, float]]


class Pinger:
    """One raw ICMP socket shared by every probe of a run of one IP family (use inside one
    event loop)."""

    def __init__(self, sources: Sequence[IPAddress], version: int = 4
                 ) -> None:
        """Open the socket and bind it to the first of ``sources`` this host holds (the
        echoes leave from that address); unbound when it holds none of them."""
        self.version = version
        family, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if version == 6 else (
            socket.AF_INET, socket.IPPROTO_ICMP)
        try:
            self.sock = socket.socket(family, socket.SOCK_RAW, proto)
        except PermissionError:
            raise IcmpError("sending ICMP echoes needs CAP_NET_RAW: run it as root, or in "
                            "flanneld's pod (which has NET_RAW)") from None
        except OSError as err:
            raise IcmpError(f"cannot open an ICMP socket: {err.strerror}") from None
        self.source: IPAddress | None = None
        try:
            self.sock.setblocking(False)
            if version == 6:
                blocked = [0xFFFFFFFF] * 8  # a bit per type: set blocks it
                for kind in (ECHO6_REPLY, DEST6_UNREACHABLE, PACKET_TOO_BIG, TIME6_EXCEEDED):
                    blocked[kind >> 5] &= ~(1 << (kind & 31))
                self.sock.setsockopt(socket.IPPROTO_ICMPV6, ICMP6_FILTER,
                                     struct.pack("8I", *blocked))
            else:
                wanted = (1 << ECHO_REPLY) | (1 << DEST_UNREACHABLE) | (1 << TIME_EXCEEDED)
                self.sock.setsockopt(SOL_RAW, ICMP_FILTER,
                                     struct.pack("I", ~wanted & 0xFFFFFFFF))
            for source in sources:
                try:
                    self.sock.bind((str(source), 0))
                except OSError as err:
                    if err.errno != errno.EADDRNOTAVAIL:
                        raise
                    continue
                self.source = source
                break
        except OSError as err:
            self.sock.close()
            raise IcmpError(f"cannot set up the ICMP socket: {err.strerror}") from None
        self.ident = random.randrange(1, 0x10000)
        self._next_seq = random.randrange(0x10000)
        #: seq -> (target, when sent, the future of the answer and its round trip)
        self._waiting: dict[int, tuple[IPAddress, float, Reply]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def close(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
            self._loop = None
        self.sock.close()

    def _start_reading(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.sock.fileno(), self._readable)

    def _readable(self) -> None:
        now = time.monotonic()
        for _ in range(256):  # bounded: a flood of ICMP must not starve the loop
            try:
                packet, sender = self.sock.recvfrom(2048)
            except OSError:  # nothing more to read (or nothing readable): wait for the next
                return
            if self.version == 6:
                address = ip_address(sender[0].partition("%")[0])
                answer = parse6(packet, address) if isinstance(address, IPv6Address) else None
            else:
                answer = parse(packet)
            if answer is None or answer.ident != self.ident:
                continue
            waiting = self._waiting.get(answer.seq)
            if waiting is None or waiting[0] != answer.target or waiting[2].done():
                continue
            waiting[2].set_result((answer, now - waiting[1]))

    def _seq(self) -> int:
        for _ in range(0x10000):
            self._next_seq = (self._next_seq + 1) & 0xFFFF
            if self._next_seq not in self._waiting:
                return self._next_seq
        raise IcmpError("65536 echoes in flight: lower --parallel or --count")

    async def probe(self, target: IPAddress, count: int, interval: float,
                    timeout: float) -> Probe:
        """Send ``count`` echoes to ``target`` every ``interval`` seconds; each waits up to
        ``timeout`` seconds for its answer."""
        self._start_reading()
        loop = asyncio.get_running_loop()
        result = Probe(target)
        pending: list[tuple[int, Reply]] = []
        try:
            for number in range(count):
                if number:
                    await asyncio.sleep(interval)
                seq = self._seq()
                future: Reply = loop.create_future()
                self._waiting[seq] = (target, time.monotonic(), future)
                try:
                    request = echo6_request if self.version == 6 else echo_request
                    self.sock.sendto(request(self.ident, seq), (str(target), 0))
                except OSError as err:  # no route, no neighbour, a local firewall
                    del self._waiting[seq]
                    result.send_error = err.strerror or str(err)
                    break
                result.sent += 1
                pending.append((seq, future))
                loop.call_later(timeout, _expire, future)
            for _seq, future in pending:
                try:
                    answer, rtt = await future
                except TimeoutError:
                    continue
                if answer.error:
                    result.errors.append(f"{answer.error} from {answer.sender}")
                else:
                    result.rtts.append(rtt)
        finally:
            for seq, future in pending:
                future.cancel()
                self._waiting.pop(seq, None)
        return result


def _expire(future: Reply) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
