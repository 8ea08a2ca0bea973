"""ICMP echoes and UDP datagrams to peers over one raw socket per IP family: the packets built
and parsed here, many probes in flight, every answer matched to the probe that asked for it.

Why a raw socket (``SOCK_RAW``/``IPPROTO_ICMP``) and not the alternatives:
- The unprivileged ICMP socket (``SOCK_DGRAM``) works only for groups in
  ``net.ipv4.ping_group_range``, which is ``1 0`` (nobody, root included) in every new network
  namespace and on many hosts; and it reports an ICMP error (host or network unreachable) only
  through the ``IP_RECVERR`` error queue. A raw socket needs CAP_NET_RAW, which flanneld's
  own place has (root on a host; NET_RAW in the DaemonSet), and it receives ICMP errors as
  ordinary packets that carry the original header, so "unreachable, said router X" is told
  apart from silence, and an ICMP port-unreachable about one of our UDP datagrams is seen
  too.
- Running ``ping`` costs a process per probe, its output is for humans, and its exit status
  says "no answer" whether the packet timed out or came back unreachable.
The socket is not bound: each echo names the address it leaves from (``IP_PKTINFO``), so the
same socket sends over the overlay (from this node's overlay address) and over the underlay
(from the address the kernel picks), and receives the answers to both. Echoes are sent with
don't-fragment (``IP_PMTUDISC_PROBE``: the device's MTU, not a cached path MTU anyone could
have lowered, decides what leaves), so an echo of the pods' MTU tests the whole path.

Matching (what makes hostile answers change nothing): an answer counts only when it carries
the pinger's identifier (a kernel socket filter drops every other echo reply and every error
quoting anything else before it costs a read), the sequence number of an echo still
waiting, and the probe's own secret: 8 random bytes at the start of its payload, which an
echo reply returns whole and an ICMP error quotes (Linux quotes up to 576 bytes; an error
quoting less is ignored). A reply must come from the address the echo went to; an error
must quote that address (a router on the path may send it: it saw the secret). A UDP
datagram's port-unreachable must come from the host it went to. A spoofed reply, or an
error from a host that never saw the probe, is dropped. Reads are bounded: at most
``reads_per_second`` packets a second; past that the socket is not read until the next
second (the kernel drops what its small buffer cannot hold) and every probe in flight
meanwhile is marked ``flooded``, so its caller concludes nothing from it.
Must not touch: anything but the sockets it opens.
"""

from __future__ import annotations

import array
import asyncio
import os
import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address, ip_address

from flannel.kernel.host import LOCAL, Host

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
SO_ATTACH_FILTER = 26
IP_PKTINFO = 8
IP_MTU_DISCOVER, IP_PMTUDISC_PROBE = 10, 3
IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE = 23, 3
UDP = 17
#: Port unreachable: ICMP type 3 code 3; ICMPv6 type 1 code 4.
PORT_UNREACHABLE = {4: 3, 6: 4}
UNREACHABLE_CODES = {0: "network unreachable", 1: "host unreachable",
                     2: "protocol unreachable", 3: "port unreachable",
                     4: "fragmentation needed", 9: "network administratively prohibited",
                     10: "host administratively prohibited",
                     13: "communication administratively prohibited"}
#: IP + ICMP echo headers, not counted in an echo's payload.
ICMP_HEADERS = {4: 28, 6: 48}
SECRET = 8  # bytes of a probe's secret
#: ping's default payload size.
SMALL = 56
#: What follows a UDP probe's secret, whose first byte is 0: no IP version (a forwarder
#: taking it for a packet drops it), no VXLAN, WireGuard or IKE header either.
DATAGRAM = b"flannel peer probe"
#: Packets read per second at most, by default (a flood beyond it waits in the kernel).
READS_PER_SECOND = 2000
RECEIVE_BUFFER = 256 * 1024


class IcmpError(Exception):
    """ICMP probes cannot be sent from here; the message says why and what to do."""


def _random16() -> int:
    """A random 16-bit number (the echo identifier, the first sequence number): os.urandom,
    since the ``random`` module costs an idle flanneld ~0.2 MiB for two numbers."""
    return int.from_bytes(os.urandom(2), "big")


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``."""
    if len(data) % 2:
        data += b"\0"
    # The ones' complement sum of the 16-bit words is the data, read as one number, modulo
    # 0xFFFF (2**16 is 1 modulo 0xFFFF), but 0xFFFF, not 0, for a non-zero multiple: one
    # division in C instead of a Python int per word (an echo of the pods' MTU has 700).
    value = int.from_bytes(data, "big")
    return ~(value % 0xFFFF or (0xFFFF if value else 0)) & 0xFFFF


def payload(secret: bytes, size: int) -> bytes:
    """An echo's payload of ``size`` bytes, starting with the probe's secret."""
    return secret + b"\0" * max(0, size - len(secret))


def echo_request(ident: int, seq: int, data: bytes) -> bytes:
    """An ICMP echo request (no IP header: the kernel adds it)."""
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident & 0xFFFF, seq & 0xFFFF)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + data), ident & 0xFFFF,
                       seq & 0xFFFF) + data


def echo6_request(ident: int, seq: int, data: bytes) -> bytes:
    """An ICMPv6 echo request; its checksum (over a pseudo-header) is the kernel's."""
    return struct.pack("!BBHHH", ECHO6_REQUEST, 0, 0, ident & 0xFFFF, seq & 0xFFFF) + data


@dataclass(frozen=True)
class Answer:
    """An ICMP packet about one of our probes, from ``sender``: an echo reply (``target`` is
    the sender), or an error about the packet we sent to ``target`` (``error`` says which;
    a router on the way, or the target itself, sent it). ``ident``/``seq``: the echo's
    (-1 for a UDP datagram's error); ``sport``/``dport``: the datagram's ports (-1 for an
    echo's); ``data``: the first bytes of the echo's payload, or of the quoted one (where
    the secret is); ``unreachable_port``: a port-unreachable; ``mtu``: the MTU a
    fragmentation-needed or packet-too-big names (0 otherwise)."""

    ident: int
    seq: int
    target: IPAddress
    sender: IPAddress
    error: str = ""  # empty for an echo reply
    data: bytes = b""
    sport: int = -1
    dport: int = -1
    unreachable_port: bool = False
    mtu: int = 0


def _ipv4_header(packet: bytes) -> tuple[int, int, IPv4Address, IPv4Address] | None:
    """(header length, protocol, source, destination) of an IPv4 packet; None if malformed."""
    if len(packet) < 20 or packet[0] >> 4 != 4:
        return None
    length = (packet[0] & 0x0F) * 4
    if length < 20 or len(packet) < length:
        return None
    return length, packet[9], IPv4Address(packet[12:16]), IPv4Address(packet[16:20])


def _quoted(proto: int, quoted: bytes, target: IPAddress, sender: IPAddress, error: str,
            request: int, port_unreachable: bool, mtu: int) -> Answer | None:
    """The answer an error quoting our echo or UDP datagram (``quoted``: from its ICMP or
    UDP header on) stands for; None when it quotes something else."""
    if len(quoted) < 8:
        return None
    if proto == UDP:
        sport, dport = struct.unpack_from("!HH", quoted)
        return Answer(-1, -1, target, sender, error, quoted[8:8 + SECRET], sport, dport,
                      port_unreachable, mtu)
    if quoted[0] != request:
        return None
    ident, seq = struct.unpack_from("!HH", quoted, 4)
    return Answer(ident, seq, target, sender, error, quoted[8:8 + SECRET], mtu=mtu)


def parse(packet: bytes) -> Answer | None:
    """What a packet read from a raw ICMP socket (IPv4 header included) says about a probe:
    an echo reply with a valid checksum, or a destination-unreachable / time-exceeded error
    quoting one of our echo requests or UDP datagrams. None for anything else."""
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
        return Answer(ident, seq, outer[2], outer[2], data=icmp[8:8 + SECRET])
    if kind not in (DEST_UNREACHABLE, TIME_EXCEEDED):
        return None
    inner = _ipv4_header(icmp[8:])  # the quoted header of the packet that failed
    if inner is None or inner[1] not in (socket.IPPROTO_ICMP, UDP):
        return None
    if kind == TIME_EXCEEDED:
        error = "time to live exceeded (a routing loop?)"
    else:
        error = UNREACHABLE_CODES.get(code, f"destination unreachable (code {code})")
    mtu = struct.unpack_from("!H", icmp, 6)[0] if (kind, code) == (DEST_UNREACHABLE, 4) else 0
    return _quoted(inner[1], icmp[8 + inner[0]:], inner[3], outer[2], error, ECHO_REQUEST,
                   (kind, code) == (DEST_UNREACHABLE, 3), mtu)


def parse6(packet: bytes, sender: IPv6Address) -> Answer | None:
    """What an ICMPv6 packet (no IP header) from ``sender`` says about a probe: a reply, or
    an error quoting one of our echo requests or UDP datagrams (its IPv6 header first). The
    kernel has checked the checksum. None for anything else."""
    if len(packet) < 8:
        return None
    kind, code = packet[0], packet[1]
    if kind == ECHO6_REPLY:
        ident, seq = struct.unpack_from("!HH", packet, 4)
        return Answer(ident, seq, sender, sender, data=packet[8:8 + SECRET])
    if kind not in (DEST6_UNREACHABLE, PACKET_TOO_BIG, TIME6_EXCEEDED):
        return None
    quoted = packet[8:]
    # The invoking packet: a 40-byte IPv6 header (no extension header: ours have none).
    if len(quoted) < 48 or quoted[0] >> 4 != 6 or quoted[6] not in (socket.IPPROTO_ICMPV6,
                                                                      UDP):
        return None
    target = IPv6Address(quoted[24:40])
    mtu = 0
    if kind == TIME6_EXCEEDED:
        error = "hop limit exceeded (a routing loop?)"
    elif kind == PACKET_TOO_BIG:
        mtu = struct.unpack_from("!I", packet, 4)[0]
        error = f"packet too big (MTU {mtu})"
    else:
        error = UNREACHABLE6_CODES.get(code, f"destination unreachable (code {code})")
    return _quoted(quoted[6], quoted[40:], target, sender, error, ECHO6_REQUEST,
                   (kind, code) == (DEST6_UNREACHABLE, 4), mtu)


# -- the kernel's filter -----------------------------------------------------------------

def _insn(code: int, jt: int, jf: int, k: int) -> tuple[int, int, int, int]:
    return code, jt, jf, k


_LDXB_MSH, _LDB_IND, _LDH_IND, _LDB_ABS, _LDH_ABS = 0xB1, 0x50, 0x48, 0x30, 0x28
_JEQ, _RET = 0x15, 0x06


def socket_filter(version: int, ident: int, udp_port: int) -> list[tuple[int, int, int, int]]:
    """A classic BPF program letting through only echo replies carrying ``ident`` and errors
    quoting an echo of ours (``ident``) or a datagram from our UDP port; the kernel runs it
    before a packet is queued, so a flood of anything else costs no read. An IPv4 raw socket
    sees the IP header (its length read from it; the quoted header of our own packets has
    no options); an IPv6 one sees the ICMPv6 message."""
    accept, drop = _insn(_RET, 0, 0, 0xFFFF), _insn(_RET, 0, 0, 0)
    if version == 4:
        return [
            _insn(_LDXB_MSH, 0, 0, 0),           # 0: X = IP header length
            _insn(_LDB_IND, 0, 0, 0),            # 1: A = ICMP type
            _insn(_JEQ, 0, 2, ECHO_REPLY),       # 2: a reply? else 5
            _insn(_LDH_IND, 0, 0, 4),            # 3: its identifier
            _insn(_JEQ, 7, 8, ident),            # 4: ours: accept (12), else drop (13)
            _insn(_JEQ, 1, 0, DEST_UNREACHABLE),  # 5: an error? to 7
            _insn(_JEQ, 0, 6, TIME_EXCEEDED),    # 6: else drop (13)
            _insn(_LDH_IND, 0, 0, 8 + 20 + 4),   # 7: the quoted echo's identifier
            _insn(_JEQ, 3, 0, ident),            # 8: ours: accept (12)
            _insn(_LDH_IND, 0, 0, 8 + 20),       # 9: the quoted datagram's source port
            _insn(_JEQ, 1, 2, udp_port),         # 10: ours: accept (12), else drop (13)
            drop,                                # 11
            accept,                              # 12
            drop,                                # 13
        ]
    return [
        _insn(_LDB_ABS, 0, 0, 0),                # 0: A = ICMPv6 type
        _insn(_JEQ, 0, 2, ECHO6_REPLY),          # 1: a reply? else 4
        _insn(_LDH_ABS, 0, 0, 4),                # 2: its identifier
        _insn(_JEQ, 8, 9, ident),                # 3: ours: accept (12), else drop (13)
        _insn(_JEQ, 2, 0, DEST6_UNREACHABLE),    # 4: an error? to 7
        _insn(_JEQ, 1, 0, PACKET_TOO_BIG),       # 5
        _insn(_JEQ, 0, 6, TIME6_EXCEEDED),       # 6: else drop (13)
        _insn(_LDH_ABS, 0, 0, 8 + 40 + 4),       # 7: the quoted echo's identifier
        _insn(_JEQ, 3, 0, ident),                # 8: ours: accept (12)
        _insn(_LDH_ABS, 0, 0, 8 + 40),           # 9: the quoted datagram's source port
        _insn(_JEQ, 1, 2, udp_port),             # 10: ours: accept (12), else drop (13)
        drop,                                    # 11
        accept,                                  # 12
        drop,                                    # 13
    ]


def _attach(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    code = array.array("B", b"".join(struct.pack("=HBBI", *insn) for insn in program))
    address, _ = code.buffer_info()
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                    struct.pack("=HxxxxxxQ" if struct.calcsize("P") == 8 else "=HxxI",
                                len(program), address))


# -- probes --------------------------------------------------------------------------------

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


@dataclass
class Echo:
    """What up to ``tries`` echoes of one probe gave: the first answer's round trip (None:
    none answered), the last ICMP error about them (with its sender) and the MTU it named,
    why one could not be sent (and its errno), and whether a flood made it
    inconclusive."""

    sent: int = 0
    rtt: float | None = None
    error: str = ""
    mtu: int = 0
    send_error: str = ""
    send_errno: int = 0
    flooded: bool = False


@dataclass
class Datagrams:
    """What up to ``tries`` UDP datagrams to one port gave: ``refused`` (the host said port
    unreachable), another ICMP error (e.g. administratively prohibited, and who said it),
    why one could not be sent, and whether a flood made it inconclusive."""

    sent: int = 0
    refused: bool = False
    error: str = ""
    send_error: str = ""
    flooded: bool = False


class _Waiting:
    """One probe in flight: where it went, its secret, when each try left, what came back."""

    __slots__ = ("done", "port", "result", "secret", "sent_at", "target")

    def __init__(self, target: IPAddress, secret: bytes, done: asyncio.Future[None],
                 port: int = -1) -> None:
        self.target = target
        self.secret = secret
        self.sent_at: dict[int, float] = {}  # seq -> when
        self.done = done
        self.result: Echo | Datagrams | Probe | None = None
        self.port = port


class Pinger:
    """One raw ICMP socket (and one UDP socket for datagram probes) shared by every probe
    of one IP family, in one event loop."""

    def __init__(self, sources: Sequence[IPAddress] = (), version: int = 4,
                 host: Host = LOCAL, *, reads_per_second: int = READS_PER_SECOND) -> None:
        """Open the sockets in ``host``'s namespace; ``source`` is the first of ``sources``
        this host holds (the overlay echoes leave from it; None when it holds none)."""
        self.version = version
        self.host = host
        family, proto = (socket.AF_INET6, socket.IPPROTO_ICMPV6) if version == 6 else (
            socket.AF_INET, socket.IPPROTO_ICMP)
        self._family = family
        try:
            with host.entered():
                self.sock = socket.socket(family, socket.SOCK_RAW, proto)
        except PermissionError:
            raise IcmpError("sending ICMP echoes needs CAP_NET_RAW: run it as root, or in "
                            "flanneld's pod (which has NET_RAW)") from None
        except OSError as err:
            raise IcmpError(f"cannot open an ICMP socket: {err.strerror}") from None
        self.ident = 1 + _random16() % 0xFFFF
        try:
            with host.entered():
                self.udp_sock = socket.socket(family, socket.SOCK_DGRAM)
                self.udp_sock.bind(("::" if version == 6 else "0.0.0.0", 0))
                self.source = next((s for s in sources if self._holds(s)), None)
            self.udp_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
            self.udp_sock.setblocking(False)
            self.udp_port = self.udp_sock.getsockname()[1]
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            if version == 6:
                blocked = [0xFFFFFFFF] * 8  # a bit per type: set blocks it
                for kind in (ECHO6_REPLY, DEST6_UNREACHABLE, PACKET_TOO_BIG, TIME6_EXCEEDED):
                    blocked[kind >> 5] &= ~(1 << (kind & 31))
                self.sock.setsockopt(socket.IPPROTO_ICMPV6, ICMP6_FILTER,
                                     struct.pack("8I", *blocked))
                self.sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER,
                                     IPV6_PMTUDISC_PROBE)
                self.sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_DONTFRAG, 1)
            else:
                wanted = (1 << ECHO_REPLY) | (1 << DEST_UNREACHABLE) | (1 << TIME_EXCEEDED)
                self.sock.setsockopt(SOL_RAW, ICMP_FILTER, struct.pack("I", ~wanted & 0xFFFFFFFF))
                self.sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
            _attach(self.sock, socket_filter(version, self.ident, self.udp_port))
        except OSError as err:
            self.close()
            raise IcmpError(f"cannot set up the ICMP socket: {err.strerror or err}") from None
        self._next_seq = _random16()
        #: seq -> the echo probe waiting for it; secret -> the datagram probe
        self._waiting: dict[int, _Waiting] = {}
        self._datagrams: dict[bytes, _Waiting] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._reads_per_second = reads_per_second
        self._window = 0.0  # the second the reads are counted in
        self._reads = 0
        #: Times the reads were paused for a flood, and answers read that matched nothing.
        self.floods = 0
        self.strays = 0

    def _holds(self, address: IPAddress) -> bool:
        """Whether this host holds ``address`` (so echoes can leave from it); in its
        namespace."""
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.bind((str(address), 0))
        except OSError:
            return False
        return True

    def holds(self, address: IPAddress) -> bool:
        """Whether ``address`` is this host's now (read in its namespace)."""
        with self.host.entered():
            return self._holds(address)

    def close(self) -> None:
        if self._loop is not None and self._reading:
            self._loop.remove_reader(self.sock.fileno())
        self._loop = None
        self._reading = False
        for sock in (getattr(self, "sock", None), getattr(self, "udp_sock", None)):
            if sock is not None:
                sock.close()

    # -- reading -------------------------------------------------------------------------

    def _start_reading(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        if not self._reading and self._loop is not None:
            self._loop.add_reader(self.sock.fileno(), self._readable)
            self._reading = True

    def _resume(self) -> None:
        if self._loop is not None and not self._reading and self.sock.fileno() >= 0:
            self._start_reading()

    def _flooded(self, now: float) -> None:
        """Too many packets this second: stop reading until the next one, and let no probe
        in flight conclude anything."""
        assert self._loop is not None
        self.floods += 1
        self._loop.remove_reader(self.sock.fileno())
        self._reading = False
        self._loop.call_later(max(0.0, self._window + 1.0 - now), self._resume)
        for waiting in (*self._waiting.values(), *self._datagrams.values()):
            if isinstance(waiting.result, Echo | Datagrams):
                waiting.result.flooded = True

    def _readable(self) -> None:
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._reads = now, 0
        for _ in range(256):  # bounded: a burst must not starve the loop
            if self._reads >= self._reads_per_second:
                self._flooded(now)
                return
            try:
                packet, sender = self.sock.recvfrom(2048)
            except OSError:  # nothing more to read (or nothing readable): wait for the next
                return
            self._reads += 1
            if self.version == 6:
                address = ip_address(sender[0].partition("%")[0])
                answer = parse6(packet, address) if isinstance(address, IPv6Address) else None
            else:
                answer = parse(packet)
            if answer is None or not self._take(answer, now):
                self.strays += 1

    def _take(self, answer: Answer, now: float) -> bool:
        """Hand ``answer`` to the probe it belongs to; False when it belongs to none."""
        if answer.sport >= 0:
            waiting = self._datagrams.get(answer.data)
            if waiting is None or answer.sport != self.udp_port or answer.dport != waiting.port \
                    or answer.target != waiting.target or waiting.done.done():
                return False
            result = waiting.result
            assert isinstance(result, Datagrams)
            if answer.unreachable_port:
                if answer.sender != waiting.target:
                    return False  # only the host itself says nothing listens there
                result.refused = True
            else:
                result.error = f"{answer.error} from {answer.sender}"
            waiting.done.set_result(None)
            return True
        if answer.ident != self.ident:
            return False
        waiting = self._waiting.get(answer.seq)
        if waiting is None or answer.target != waiting.target or answer.data != waiting.secret:
            return False
        sent_at = waiting.sent_at.get(answer.seq, now)
        result = waiting.result
        text = f"{answer.error} from {answer.sender}" if answer.error else ""
        if isinstance(result, Probe):  # every echo counts: each is answered once
            if text:
                result.errors.append(text)
            else:
                result.rtts.append(now - sent_at)
            del waiting.sent_at[answer.seq]
            self._waiting.pop(answer.seq, None)
            if not waiting.sent_at and not waiting.done.done():
                waiting.done.set_result(None)
        elif isinstance(result, Echo) and not waiting.done.done():
            if text:  # that echo failed; a later one may still be answered
                result.error, result.mtu = text, answer.mtu or result.mtu
            else:
                result.rtt = now - sent_at
                waiting.done.set_result(None)
        return True

    # -- sending -------------------------------------------------------------------------

    def _seq(self) -> int:
        for _ in range(0x10000):
            self._next_seq = (self._next_seq + 1) & 0xFFFF
            if self._next_seq not in self._waiting:
                return self._next_seq
        raise IcmpError("65536 echoes in flight: probe fewer peers at once")

    def _send(self, target: IPAddress, data: bytes, source: IPAddress | None) -> None:
        """Send one ICMP message to ``target``, from ``source`` (None: the kernel picks)."""
        ancillary = []
        if source is not None:
            if self.version == 6:
                ancillary.append((socket.IPPROTO_IPV6, socket.IPV6_PKTINFO,
                                  struct.pack("=16sI", source.packed, 0)))
            else:
                ancillary.append((socket.IPPROTO_IP, IP_PKTINFO,
                                  struct.pack("=I4s4s", 0, source.packed, b"\0" * 4)))
        self.sock.sendmsg([data], ancillary, 0, (str(target), 0))

    def _request(self, seq: int, data: bytes) -> bytes:
        request = echo6_request if self.version == 6 else echo_request
        return request(self.ident, seq, data)

    async def echo(self, target: IPAddress, *, size: int = SMALL, tries: int = 1,
                   spacing: float = 0.25, timeout: float = 1.0,
                   source: IPAddress | None = None, overlay: bool = True) -> Echo:
        """Up to ``tries`` echoes of ``size`` payload bytes to ``target``, ``spacing``
        seconds apart, until one is answered; each waits ``timeout`` seconds. They leave
        from ``source``, or from this pinger's overlay address when ``overlay`` (the kernel
        picks when neither)."""
        self._start_reading()
        loop = asyncio.get_running_loop()
        secret = os.urandom(SECRET)
        result = Echo(flooded=not self._reading)
        waiting = _Waiting(target, secret, loop.create_future())
        waiting.result = result
        data = payload(secret, size)
        origin = source if source is not None else self.source if overlay else None
        try:
            for number in range(tries):
                if number and await _within(waiting.done, spacing):
                    break
                seq = self._seq()
                self._waiting[seq] = waiting
                waiting.sent_at[seq] = time.monotonic()
                try:
                    self._send(target, self._request(seq, data), origin)
                except OSError as err:  # no route, a local firewall, larger than the MTU
                    del self._waiting[seq], waiting.sent_at[seq]
                    result.send_error = err.strerror or str(err)
                    result.send_errno = err.errno or 0
                    break
                result.sent += 1
            if result.sent and not waiting.done.done():
                await _within(waiting.done, timeout)
        finally:
            for seq in waiting.sent_at:
                self._waiting.pop(seq, None)
            waiting.done.cancel()
        return result

    async def probe(self, target: IPAddress, count: int, interval: float,
                    timeout: float) -> Probe:
        """Send ``count`` echoes to ``target`` every ``interval`` seconds from this pinger's
        overlay address; each waits up to ``timeout`` seconds for its answer, and each is
        counted (``flannelctl check``'s loss and round trips)."""
        self._start_reading()
        loop = asyncio.get_running_loop()
        result = Probe(target)
        waiting = _Waiting(target, os.urandom(SECRET), loop.create_future())
        waiting.result = result
        data = payload(waiting.secret, SMALL)
        deadline = 0.0
        try:
            for number in range(count):
                if number:
                    await asyncio.sleep(interval)
                seq = self._seq()
                self._waiting[seq] = waiting
                waiting.sent_at[seq] = time.monotonic()
                try:
                    self._send(target, self._request(seq, data), self.source)
                except OSError as err:
                    del self._waiting[seq], waiting.sent_at[seq]
                    result.send_error = err.strerror or str(err)
                    break
                result.sent += 1
                deadline = time.monotonic() + timeout
            # Done once every echo sent is answered (the replies so far may have set it).
            waiting.done = loop.create_future()
            if waiting.sent_at:
                await _within(waiting.done, max(0.0, deadline - time.monotonic()))
        finally:
            for seq in waiting.sent_at:
                self._waiting.pop(seq, None)
            waiting.done.cancel()
        return result

    async def datagrams(self, target: IPAddress, port: int, *, tries: int = 2,
                        spacing: float = 0.25, timeout: float = 1.0) -> Datagrams:
        """Up to ``tries`` UDP datagrams to ``target``:``port``, until the host answers
        port unreachable (or another ICMP error comes back); silence otherwise."""
        self._start_reading()
        loop = asyncio.get_running_loop()
        secret = b"\0" + os.urandom(SECRET - 1)
        result = Datagrams(flooded=not self._reading)
        waiting = _Waiting(target, secret, loop.create_future(), port)
        waiting.result = result
        self._datagrams[secret] = waiting
        try:
            for number in range(tries):
                if number and await _within(waiting.done, spacing):
                    break
                try:
                    self.udp_sock.sendto(secret + DATAGRAM, (str(target), port))
                except OSError as err:
                    result.send_error = err.strerror or str(err)
                    break
                result.sent += 1
            if result.sent and not waiting.done.done():
                await _within(waiting.done, timeout)
        finally:
            self._datagrams.pop(secret, None)
            waiting.done.cancel()
        return result


async def _within(future: asyncio.Future[None], seconds: float) -> bool:
    """Whether ``future`` is done within ``seconds`` (it is never cancelled by the wait)."""
    if future.done():
        return True
    try:
        async with asyncio.timeout(seconds):
            await asyncio.shield(future)
    except TimeoutError:
        return future.done()
    return True
