"""A small rtnetlink client: the socket, routes, neighbours and FDB entries.

Owns a raw NETLINK_ROUTE socket (optionally opened inside a named network namespace), the
binary encoding of routes, neighbours and FDB entries, pipelined batches (many requests in
flight, every ACK checked), single checked requests, dumps, and an event socket. Batches
make a 5000-peer snapshot as cheap as ``ip -batch``. Links and addresses are encoded in
``kernel/links.py`` and sent through the same socket.
Must not touch: the store; it decides nothing about what the kernel should hold.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import TypeVar

from flannel.kernel.host import LOCAL, Host

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
NETLINK_GET_STRICT_CHK = 12

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200  # in an error message: payload cut, TLVs follow
NLMSGERR_ATTR_MSG = 1
NLM_F_DUMP, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x300, 0x100, 0x200, \
    0x400, 0x800

RTM_NEWLINK, RTM_DELLINK = 16, 17
RTM_NEWADDR, RTM_DELADDR = 20, 21
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWNEIGH, RTM_DELNEIGH, RTM_GETNEIGH = 28, 29, 30

RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 6, 7, 15
NDA_DST, NDA_LLADDR, NDA_PORT, NDA_VNI, NDA_IFINDEX, NDA_PROTOCOL = 1, 2, 6, 7, 8, 12
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU = 1, 3, 4
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFF_UP = 0x1
IFF_LOWER_UP = 0x10000

RT_TABLE_COMPAT, RT_TABLE_MAIN = 252, 254
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255
RTN_UNICAST, RTN_BLACKHOLE = 1, 6
RTNH_F_ONLINK = 4
NUD_PERMANENT = 0x80
NTF_SELF = 0x02
AF_BRIDGE = 7

RTMGRP_LINK, RTMGRP_NEIGH, RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE = 0x1, 0x4, 0x10, 0x40
RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE = 0x100, 0x400

#: The route (and neighbour) protocol that marks what flannel installed (see rt_protos).
RTPROT_FLANNEL = 151
#: Protocols of routes added by hand or by Go flannel (netlink's default): unspec, boot, static.
RTPROT_UNSPEC, RTPROT_KERNEL, RTPROT_BOOT, RTPROT_STATIC = 0, 2, 3, 4

_NLMSGHDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_NDMSG = struct.Struct("=BBHiHBB")
IFINFOMSG = struct.Struct("=BBHiII")
IFADDRMSG = struct.Struct("=BBBBi")
_RTATTR = struct.Struct("=HH")
_NLMSGERR = struct.Struct("=i")

IPAddress = IPv4Address | IPv6Address
T = TypeVar("T")


class NetlinkError(OSError):
    """A request the kernel refused; ``request`` says which, ``detail`` is the kernel's own
    explanation when it gave one (extended ACK), e.g. "Unknown device type". A refused
    request of a batch also carries its ``verb`` and the ``entry`` it was for, so that the
    peer it belongs to can be told."""

    errno: int  # always the kernel's error code, never None

    def __init__(self, code: int, request: str, detail: str = "", *, verb: str = "",
                 entry: object = None) -> None:
        suffix = f": {detail}" if detail else ""
        super().__init__(code, f"{os.strerror(code)} ({request}{suffix})")
        self.request = request
        self.detail = detail
        self.verb = verb
        self.entry = entry


def frame(msg_type: int, flags: int, seq: int, payload: bytes) -> bytes:
    """A netlink message: header (port id 0, the kernel fills it in) and payload."""
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0) + payload


def ack_detail(flags: int, body: bytes) -> str:
    """The extended ACK's message text of an error message, "" when there is none."""
    if not flags & NLM_F_ACK_TLVS or len(body) < 4 + _NLMSGHDR.size:
        return ""
    offset = 4 + (_NLMSGHDR.size if flags & NLM_F_CAPPED
                  else _NLMSGHDR.unpack_from(body, 4)[0])
    text = parse_attrs(body, offset).get(NLMSGERR_ATTR_MSG, b"")
    return text.rstrip(b"\0").decode(errors="replace")


def attr(kind: int, data: bytes) -> bytes:
    length = _RTATTR.size + len(data)
    return _RTATTR.pack(length, kind) + data + b"\0" * (-length % 4)


def _family(addr: IPAddress) -> int:
    return socket.AF_INET if addr.version == 4 else socket.AF_INET6


def _packed(text: str) -> tuple[int, bytes]:
    """(family, packed address) of an IP in text form, without ipaddress' overhead."""
    family = socket.AF_INET6 if ":" in text else socket.AF_INET
    return family, socket.inet_pton(family, text)


def mac_bytes(mac: str) -> bytes:
    # The usual "0e:4c:1a:7b:22:01" in C (a snapshot encodes 10,000); anything else by parts.
    if len(mac) == 17 and mac[2::3] == ":::::":
        with contextlib.suppress(ValueError):
            raw = bytes.fromhex(mac.replace(":", ""))
            if len(raw) == 6:
                return raw
    return bytes(int(part, 16) for part in mac.split(":"))


def mac_text(raw: bytes) -> str:
    return raw.hex(":")


def ip_text(raw: bytes) -> str:
    """The text of a packed address. IPv4 goes through the C library: the same text as
    ``ipaddress`` at a fraction of the cost (every dump decodes one per entry); IPv6 stays
    with ``ipaddress``, whose text for mapped and compatible addresses differs from libc's."""
    return socket.inet_ntoa(raw) if len(raw) == 4 else str(IPv6Address(raw))


@dataclass(frozen=True, order=True, slots=True)
class Route:
    """A unicast route in the main table: ``dst via gateway dev oif [onlink]``."""

    dst: str  # CIDR text, e.g. "10.5.1.0/24"
    gateway: str | None
    oif: int
    onlink: bool = False
    kind: int = RTN_UNICAST
    metric: int = 0

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.dst else socket.AF_INET


@dataclass(frozen=True, order=True, slots=True)
class Neighbour:
    """A permanent neighbour (ARP/NDP) entry."""

    ifindex: int
    ip: str
    mac: str


@dataclass(frozen=True, order=True, slots=True)
class FdbEntry:
    """A permanent ``self`` FDB entry of a vxlan device: frames for ``mac`` go to ``dst``.

    ``port``, ``vni`` and ``via`` (an underlay ifindex) are 0 when the entry uses the
    device's own settings, which is how flannel installs them (the kernel then omits them).
    """

    ifindex: int
    mac: str
    dst: str
    port: int = 0
    vni: int = 0
    via: int = 0


# Attributes every request of their kind carries, encoded once.
_TABLE_MAIN = attr(RTA_TABLE, struct.pack("=I", RT_TABLE_MAIN))
_PROTOCOL_FLANNEL = attr(NDA_PROTOCOL, bytes([RTPROT_FLANNEL]))


def encode_route(route: Route, msg_type: int, flags: int, seq: int, *,
                 protocol: int = RTPROT_FLANNEL, scope: int | None = None) -> bytes:
    """A route request; ``scope`` None means link scope for a route without a gateway and
    universe otherwise (``protocol`` and ``scope`` are ignored by a delete)."""
    dst_text, _, plen = route.dst.partition("/")
    family, dst = _packed(dst_text)
    if msg_type == RTM_DELROUTE:
        # The kernel matches a delete's protocol and scope exactly unless they are wildcards.
        # What we delete was chosen as ours from a dump, adopted routes of other protocols
        # and link-scope routes included.
        protocol, scope = RTPROT_UNSPEC, RT_SCOPE_NOWHERE
    elif scope is None:
        scope = (RT_SCOPE_UNIVERSE if route.kind == RTN_BLACKHOLE or route.gateway is not None
                 else RT_SCOPE_LINK)
    body = _RTMSG.pack(family, int(plen), 0, 0, RT_TABLE_MAIN, protocol, scope,
                       route.kind, RTNH_F_ONLINK if route.onlink else 0)
    attrs = _TABLE_MAIN + attr(RTA_DST, dst)
    if route.gateway is not None:
        attrs += attr(RTA_GATEWAY, _packed(route.gateway)[1])
    if route.oif:
        attrs += attr(RTA_OIF, struct.pack("=i", route.oif))
    if route.metric:
        attrs += attr(RTA_PRIORITY, struct.pack("=I", route.metric))
    payload = body + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0) + payload


def encode_neighbour(neigh: Neighbour, msg_type: int, flags: int, seq: int) -> bytes:
    family, addr = _packed(neigh.ip)
    body = _NDMSG.pack(family, 0, 0, neigh.ifindex, NUD_PERMANENT, 0, RTN_UNICAST)
    attrs = attr(NDA_DST, addr)
    if msg_type == RTM_NEWNEIGH:
        attrs += attr(NDA_LLADDR, mac_bytes(neigh.mac)) + _PROTOCOL_FLANNEL
    payload = body + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0) + payload


def encode_fdb(entry: FdbEntry, msg_type: int, flags: int, seq: int) -> bytes:
    body = _NDMSG.pack(AF_BRIDGE, 0, 0, entry.ifindex, NUD_PERMANENT, NTF_SELF, 0)
    attrs = attr(NDA_LLADDR, mac_bytes(entry.mac)) + attr(NDA_DST, _packed(entry.dst)[1])
    # Only a delete names them: it must hit exactly that remote, not the one a replace fixed.
    if entry.port:
        attrs += attr(NDA_PORT, struct.pack("!H", entry.port))
    if entry.vni:
        attrs += attr(NDA_VNI, struct.pack("=I", entry.vni))
    if entry.via:
        attrs += attr(NDA_IFINDEX, struct.pack("=I", entry.via))
    payload = body + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(payload), msg_type, flags, seq, 0) + payload


def parse_attrs(data: bytes, offset: int) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            break
        attrs[kind & 0x3FFF] = data[offset + _RTATTR.size: offset + length]
        offset += (length + 3) & ~3
    return attrs


def iter_messages(data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
    """(type, flags, seq, body) of each message in a netlink datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        yield msg_type, flags, seq, data[offset + _NLMSGHDR.size: offset + length]
        offset += (length + 3) & ~3


def iter_notifications(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(type, port id, body) of each message in a datagram of the event socket; the port id
    is that of the socket whose request caused the change (0 for the kernel's own)."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, msg_type, _flags, _seq, port = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        yield msg_type, port, data[offset + _NLMSGHDR.size: offset + length]
        offset += (length + 3) & ~3


def decode_route(body: bytes) -> tuple[Route, int, int] | None:
    """A route message as (Route, protocol, table); None for multipath and other shapes."""
    family, dst_len, _src_len, _tos, table, protocol, _scope, kind, flags = \
        _RTMSG.unpack_from(body)
    attrs = parse_attrs(body, _RTMSG.size)
    table = struct.unpack("=I", attrs[RTA_TABLE])[0] if RTA_TABLE in attrs else table
    if family == socket.AF_INET:
        zero = "0.0.0.0"
    elif family == socket.AF_INET6:
        zero = "::"
    else:
        return None
    dst = ip_text(attrs[RTA_DST]) if RTA_DST in attrs else zero
    gateway = ip_text(attrs[RTA_GATEWAY]) if RTA_GATEWAY in attrs else None
    oif = struct.unpack("=i", attrs[RTA_OIF])[0] if RTA_OIF in attrs else 0
    if kind != RTN_UNICAST:
        oif = 0  # the kernel puts IPv6 blackholes on lo; they belong to no device
    metric = struct.unpack("=I", attrs[RTA_PRIORITY])[0] if RTA_PRIORITY in attrs else 0
    if family == socket.AF_INET6 and metric == 1024:
        metric = 0  # the kernel's default IPv6 metric: what a route added without one gets
    route = Route(f"{dst}/{dst_len}", gateway, oif, bool(flags & RTNH_F_ONLINK), kind, metric)
    return route, protocol, table


def decode_neighbour(body: bytes) -> tuple[Neighbour | FdbEntry, int, int] | None:
    """A neighbour message as (entry, state, flags); FdbEntry for AF_BRIDGE."""
    family, _p1, _p2, ifindex, state, ntf_flags, _kind = _NDMSG.unpack_from(body)
    attrs = parse_attrs(body, _NDMSG.size)
    lladdr = attrs.get(NDA_LLADDR)
    dst = attrs.get(NDA_DST)
    if family == AF_BRIDGE:
        if lladdr is None or dst is None or len(lladdr) != 6:
            return None
        port = struct.unpack("!H", attrs[NDA_PORT][:2])[0] if NDA_PORT in attrs else 0
        vni = struct.unpack("=I", attrs[NDA_VNI][:4])[0] if NDA_VNI in attrs else 0
        via = struct.unpack("=I", attrs[NDA_IFINDEX][:4])[0] if NDA_IFINDEX in attrs else 0
        return (FdbEntry(ifindex, mac_text(lladdr), ip_text(dst), port, vni, via),
                state, ntf_flags)
    if family not in (socket.AF_INET, socket.AF_INET6) or dst is None:
        return None
    mac = mac_text(lladdr) if lladdr and len(lladdr) == 6 else ""
    return Neighbour(ifindex, ip_text(dst), mac), state, ntf_flags


# The whole messages the kernel writes for the IPv4 entries flanneld installs, read in one
# call: a dump of 5000 peers' tables is then 15,000 struct reads rather than attribute
# walks, texts and entry objects. A message whose size or any attribute header differs
# (another layout, kernel or family) is decoded attribute by attribute.
_NDA_PROBES, _NDA_CACHEINFO = 4, 3
_PLAIN_NEIGHBOUR = struct.Struct("=BxxxiHBBHH4sHH6sxxHHIHH16sHHBxxx")
_NEIGHBOUR_HEADERS = (8, NDA_DST, 10, NDA_LLADDR, 8, _NDA_PROBES, 20, _NDA_CACHEINFO, 5,
                      NDA_PROTOCOL)
_PLAIN_FDB = struct.Struct("=BxxxiHBBHH6sxxHH4sHH16s")
_FDB_HEADERS = (10, NDA_LLADDR, 8, NDA_DST, 20, _NDA_CACHEINFO)
_PLAIN_ROUTE = struct.Struct("=BBBBBBBBIHHIHH4sHH4sHHi")
_ROUTE_HEADERS = (8, RTA_TABLE, 8, RTA_DST, 8, RTA_GATEWAY, 8, RTA_OIF)

#: (ifindex, state, flags, IPv4 address, MAC) of a neighbour or FDB message, packed.
PlainNeighbour = tuple[int, int, int, bytes, bytes]
#: (protocol, table, type, flags, oif, IPv4 destination, its length, gateway), packed.
PlainRoute = tuple[int, int, int, int, int, bytes, int, bytes]


def plain_neighbour(body: bytes) -> PlainNeighbour | None:
    """A permanent IPv4 neighbour as flanneld installs it (its address, MAC, probes, cache
    information and protocol), or an IPv4 FDB entry with no port, VNI or device of its own;
    None for any other message. ``decode_neighbour`` reads the same entry from it."""
    size = len(body)
    if size == _PLAIN_NEIGHBOUR.size and body[0] == socket.AF_INET:
        (_f, ifindex, state, flags, _t, l1, t1, ip, l2, t2, mac, l3, t3, _probes, l4, t4, _ci,
         l5, t5, _proto) = _PLAIN_NEIGHBOUR.unpack(body)
        if (l1, t1, l2, t2, l3, t3, l4, t4, l5, t5) == _NEIGHBOUR_HEADERS:
            return ifindex, state, flags, ip, mac
    elif size == _PLAIN_FDB.size and body[0] == AF_BRIDGE:
        _f, ifindex, state, flags, _t, l1, t1, mac, l2, t2, ip, l3, t3, _ci = \
            _PLAIN_FDB.unpack(body)
        if (l1, t1, l2, t2, l3, t3) == _FDB_HEADERS:
            return ifindex, state, flags, ip, mac
    return None


def plain_route(body: bytes) -> PlainRoute | None:
    """An IPv4 route with a gateway, a device and no metric (how flanneld installs a peer's
    route: table, destination, gateway, device), or None. ``decode_route`` reads the same
    route from it."""
    if len(body) != _PLAIN_ROUTE.size or body[0] != socket.AF_INET:
        return None
    (_f, dst_len, _src_len, _tos, _t, protocol, _scope, kind, flags, l1, t1, table, l2, t2,
     dst, l3, t3, gateway, l4, t4, oif) = _PLAIN_ROUTE.unpack(body)
    if (l1, t1, l2, t2, l3, t3, l4, t4) != _ROUTE_HEADERS:
        return None
    return protocol, table, kind, flags, oif, dst, dst_len, gateway


@dataclass(frozen=True)
class Link:
    """What a link message says about a device; ``mtu`` 0 and ``mac`` "" when absent;
    ``carrier``: the lower layer is up (for a TUN: a program has it open)."""

    index: int
    name: str | None
    up: bool
    mtu: int = 0
    mac: str = ""
    carrier: bool = True


def decode_link(body: bytes) -> Link:
    _family, _pad, _kind, index, flags, _change = IFINFOMSG.unpack_from(body)
    attrs = parse_attrs(body, IFINFOMSG.size)
    name = attrs.get(IFLA_IFNAME)
    mtu = attrs.get(IFLA_MTU)
    mac = attrs.get(IFLA_ADDRESS)
    return Link(index, name.rstrip(b"\0").decode(errors="replace") if name else None,
                bool(flags & IFF_UP), struct.unpack("=I", mtu[:4])[0] if mtu else 0,
                mac_text(mac) if mac and len(mac) == 6 else "", bool(flags & IFF_LOWER_UP))


@dataclass(frozen=True)
class Address:
    """An interface address: ``cidr`` is ``address/prefixlen`` text."""

    index: int
    cidr: str


def decode_address(body: bytes) -> Address | None:
    family, prefixlen, _flags, _scope, index = IFADDRMSG.unpack_from(body)
    attrs = parse_attrs(body, IFADDRMSG.size)
    # IPv4: IFA_LOCAL is our address (IFA_ADDRESS is the peer's on point-to-point links).
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if family not in (socket.AF_INET, socket.AF_INET6) or raw is None:
        return None
    return Address(index, f"{ip_address(raw)}/{prefixlen}")


def open_socket(host: Host = LOCAL, groups: int = 0, rcvbuf: int = 8 << 20,
                protocol: int = NETLINK_ROUTE) -> socket.socket:
    """A netlink socket (NETLINK_ROUTE unless ``protocol`` says otherwise) bound to
    ``host``'s namespace, subscribed to ``groups``."""
    with host.entered():
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
    try:
        for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK, NETLINK_GET_STRICT_CHK):
            with contextlib.suppress(OSError):
                sock.setsockopt(SOL_NETLINK, option, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.bind((0, groups))
    except BaseException:
        sock.close()
        raise
    return sock


_GONE = (errno.ESRCH, errno.ENOENT)
_VERB_FLAGS = {"replace": NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE,
               "add": NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL,
               "append": NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND,
               "delete": NLM_F_REQUEST}


def describe(verb: str, obj: object) -> str:
    """How a failed request of a batch is named in its error, e.g. "replace route 10.5.1.0/24
    via 10.5.1.0" (built only on failure: a snapshot sends 15,000 requests)."""
    if isinstance(obj, Route):
        via = f" via {obj.gateway}" if obj.gateway else ""
        return f"{verb} route {obj.dst}{via}"
    if isinstance(obj, Neighbour):
        return f"{verb} neighbour {obj.ip}"
    if isinstance(obj, FdbEntry):
        return f"{verb} fdb {obj.mac}"
    return f"{verb} {obj!r}"


class _Interrupted(Exception):
    """A dump the kernel interrupted because the table changed under it."""


def _strict(sock: socket.socket) -> bool:
    try:
        return bool(sock.getsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK))
    except OSError:
        return False


class Rtnl:
    """Synchronous request socket for batches, single requests, dumps and lookups."""

    def __init__(self, host: Host = LOCAL) -> None:
        self.sock = open_socket(host)
        #: The port id the kernel gave the socket; notifications of its changes carry it.
        self.port: int = self.sock.getsockname()[0]
        #: Whether the kernel checks dump requests strictly, and so applies their filters.
        self.strict = _strict(self.sock)
        #: Messages of dumps read since the socket was opened.
        self.dumped = 0
        self._seq = 0

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, data: bytes, seq: int, what: str, ignore: tuple[int, ...] = ()
             ) -> list[tuple[int, bytes]]:
        """Send one request (which asks for an ACK) and return the (type, body) of its
        replies; raise NetlinkError when the kernel refuses it (unless its errno is in
        ``ignore``)."""
        self.sock.sendall(data)
        replies: list[tuple[int, bytes]] = []
        while True:
            received = self.sock.recv(1 << 20)
            for kind, flags, msg_seq, body in iter_messages(received):
                if msg_seq != seq:
                    continue
                if kind != NLMSG_ERROR:
                    replies.append((kind, body))
                    continue
                code = -_NLMSGERR.unpack_from(body)[0]
                if code and code not in ignore:
                    raise NetlinkError(code, what, ack_detail(flags, body))
                return replies

    def replace_route(self, route: Route, *, protocol: int = RTPROT_FLANNEL,
                      scope: int | None = None) -> None:
        """One checked ``route replace`` (raises NetlinkError); ``protocol`` and ``scope``
        let a route look as another program makes it (see ``encode_route``)."""
        seq = self.next_seq()
        flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        self.call(encode_route(route, RTM_NEWROUTE, flags, seq, protocol=protocol, scope=scope),
                  seq, f"replace route {route.dst} dev {route.oif}")

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0x7FFFFFFF or 1
        return self._seq

    def run(self, ops: Iterable[tuple[str, object]], chunk: int = 256) -> list[NetlinkError]:
        """Apply (verb, object) pairs: verb is ``replace``, ``add``, ``append`` or ``delete``.

        Every request is attempted; the failures are returned (ESRCH/ENOENT on delete are not
        failures: already gone). Only the last request of each chunk asks for an ACK: the
        kernel handles rtnetlink requests synchronously in ``send``, so once that ACK is read
        every error of the chunk has been read too.
        """
        failures: list[NetlinkError] = []
        batch: list[tuple[str, object]] = []
        for item in ops:
            batch.append(item)
            if len(batch) == chunk:
                self._run_chunk(batch, failures)
                batch.clear()
        if batch:
            self._run_chunk(batch, failures)
        return failures

    def _run_chunk(self, batch: list[tuple[str, object]], failures: list[NetlinkError]) -> None:
        pending: dict[int, tuple[str, object]] = {}
        parts = []
        last = len(batch) - 1
        for i, (verb, obj) in enumerate(batch):
            seq = self.next_seq()
            parts.append(self._encode(verb, obj, seq, ack=i == last))
            pending[seq] = (verb, obj)
        self.sock.sendall(b"".join(parts))
        while seq in pending:
            data = self.sock.recv(1 << 20)
            for msg_type, _flags, msg_seq, body in iter_messages(data):
                if msg_type != NLMSG_ERROR:
                    continue
                request = pending.pop(msg_seq, None)
                code = -_NLMSGERR.unpack_from(body)[0]
                if request is None or not code:
                    continue
                # A delete of what is already gone is not a failure.
                if request[0] != "delete" or code not in _GONE:
                    failures.append(NetlinkError(code, describe(*request), verb=request[0],
                                                 entry=request[1]))

    def _encode(self, verb: str, obj: object, seq: int, ack: bool = True) -> bytes:
        flags = _VERB_FLAGS[verb] | (NLM_F_ACK if ack else 0)
        if isinstance(obj, Route):
            return encode_route(obj, RTM_DELROUTE if verb == "delete" else RTM_NEWROUTE, flags,
                                seq)
        msg = RTM_DELNEIGH if verb == "delete" else RTM_NEWNEIGH
        if isinstance(obj, Neighbour):
            return encode_neighbour(obj, msg, flags, seq)
        if isinstance(obj, FdbEntry):
            return encode_fdb(obj, msg, flags, seq)
        raise TypeError(f"cannot encode {obj!r}")

    def dump(self, msg_type: int, header: bytes,
             decode: Callable[[int, bytes], T | None]) -> list[T]:
        """What ``decode(type, body)`` keeps of the messages of a dump request (None: not
        kept). Each datagram is decoded as it is read, so only the kept entries are held,
        never the whole reply; ``dumped`` counts the messages handed to ``decode``."""
        while True:
            try:
                return self._dump_once(msg_type, header, decode)
            except _Interrupted:
                continue  # the dump was interrupted by a change: start over

    def _dump_once(self, msg_type: int, header: bytes,
                   decode: Callable[[int, bytes], T | None]) -> list[T]:
        seq = self.next_seq()
        length = _NLMSGHDR.size + len(header)
        self.sock.sendall(_NLMSGHDR.pack(length, msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
                          + header)
        kept: list[T] = []
        while True:
            data = self.sock.recv(1 << 20)
            for kind, flags, msg_seq, body in iter_messages(data):
                if msg_seq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return kept
                if kind == NLMSG_ERROR:
                    code = -_NLMSGERR.unpack_from(body)[0]
                    if code:
                        if code == errno.EINTR:
                            raise _Interrupted
                        raise NetlinkError(code, f"dump {msg_type}",
                                           ack_detail(flags, body))
                    continue
                self.dumped += 1
                item = decode(kind, body)
                if item is not None:
                    kept.append(item)

    def routes(self, family: int, *, table: int = 0, protocol: int = 0, kind: int = 0,
               oif: int = 0, not_protocol: int | None = None,
               unless: Callable[[tuple[Route, int, int]], bool] | None = None,
               unless_plain: Callable[[PlainRoute], bool] | None = None
               ) -> list[tuple[Route, int, int]]:
        """The routes of ``family``; ``table``, ``protocol``, ``kind`` (RTN_*) and ``oif``
        (0: any) select, ``not_protocol`` leaves out the routes of that protocol, and so
        does ``unless`` each (route, protocol, table) it is true for, as it is decoded (so
        that a caller can count entries instead of holding them). The kernel
        applies the first four with strict checking (Linux 4.20 and later:
        ``ip_valid_fib_dump_req``); all are applied here too, from the message header before
        decoding where they can be, so the answer is the same on older kernels, which send
        every route. ``unless_plain`` is asked first, for a route in ``plain_route``'s
        layout that the selectors keep: true leaves it out without decoding it."""
        header = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        if self.strict:
            # A table above 255 is RT_TABLE_COMPAT in the header; RTA_TABLE says which.
            header = _RTMSG.pack(family, 0, 0, 0, table if table < 256 else RT_TABLE_COMPAT,
                                 protocol, 0, kind, 0)
            if table:
                header += attr(RTA_TABLE, struct.pack("=I", table))
            if oif:
                header += attr(RTA_OIF, struct.pack("=I", oif))

        def keep(msg: int, body: bytes) -> tuple[Route, int, int] | None:
            # rtm_protocol and rtm_type: a route of no interest costs no decoding.
            if msg != RTM_NEWROUTE or (protocol and body[5] != protocol) \
                    or (kind and body[7] != kind) or body[5] == not_protocol:
                return None
            if unless_plain is not None and (plain := plain_route(body)) is not None \
                    and (not table or plain[1] == table) and (not oif or plain[4] == oif) \
                    and unless_plain(plain):
                return None
            decoded = decode_route(body)
            if decoded is None:
                return None
            route, proto, in_table = decoded
            if ((table and in_table != table) or (protocol and proto != protocol)
                    or (kind and route.kind != kind) or (oif and route.oif != oif)
                    or (unless is not None and unless(decoded))):
                return None
            return decoded

        try:
            return self.dump(RTM_GETROUTE, header, keep)
        except NetlinkError as err:
            if oif and err.errno == errno.ENODEV:
                return []  # the device is gone, and its routes with it
            raise

    def neighbours(self, family: int, ifindex: int = 0, *,
                   unless: Callable[[tuple[Neighbour | FdbEntry, int, int]], bool] | None = None,
                   unless_plain: Callable[[PlainNeighbour], bool] | None = None
                   ) -> list[tuple[Neighbour | FdbEntry, int, int]]:
        """The neighbours (FDB entries for AF_BRIDGE) of ``family`` on device ``ifindex``
        (0: every device), as (entry, state, flags), but those ``unless`` is true for. The
        kernel selects the device (with strict checking: the
        neighbour dump by NDA_IFINDEX, the FDB dump by the header's ifindex, which also
        leaves out every bridge's table unless the device is a port of it); older kernels
        send every entry, and the device is selected here too. ``unless_plain`` is asked
        first, for an entry in ``plain_neighbour``'s layout: true leaves it out without
        decoding it."""
        if ifindex and self.strict:
            if family == AF_BRIDGE:
                header = _NDMSG.pack(family, 0, 0, ifindex, 0, 0, 0)
            else:
                header = _NDMSG.pack(family, 0, 0, 0, 0, 0, 0) + attr(
                    NDA_IFINDEX, struct.pack("=I", ifindex))
        elif ifindex and family == AF_BRIDGE:
            # Before strict checking, the FDB dump read an ifinfomsg header and its index.
            header = IFINFOMSG.pack(family, 0, 0, ifindex, 0, 0)
        else:
            header = _NDMSG.pack(family, 0, 0, 0, 0, 0, 0)

        def keep(msg: int, body: bytes) -> tuple[Neighbour | FdbEntry, int, int] | None:
            if msg != RTM_NEWNEIGH or (ifindex and _NDMSG.unpack_from(body)[3] != ifindex):
                return None
            if unless_plain is not None and body[0] == family \
                    and (plain := plain_neighbour(body)) is not None and unless_plain(plain):
                return None
            decoded = decode_neighbour(body)
            return None if decoded is None or (unless is not None and unless(decoded)) \
                else decoded

        return self.dump(RTM_GETNEIGH, header, keep)

    def route_get(self, dst: IPAddress) -> Route | None:
        """The route the kernel would use for ``dst`` (like ``ip route get``)."""
        reply = self._route_get_reply(dst)
        decoded = decode_route(reply) if reply is not None else None
        return decoded[0] if decoded else None

    def route_source(self, dst: IPAddress) -> tuple[int, IPAddress | None] | None:
        """(output device, source address) the kernel would use for ``dst``; the device of
        a local address is ``lo``."""
        reply = self._route_get_reply(dst)
        attrs = parse_attrs(reply, _RTMSG.size) if reply is not None else {}
        if RTA_OIF not in attrs:
            return None
        src = attrs.get(RTA_PREFSRC)
        return struct.unpack("=i", attrs[RTA_OIF])[0], ip_address(src) if src else None

    def _route_get_reply(self, dst: IPAddress) -> bytes | None:
        seq = self.next_seq()
        body = _RTMSG.pack(_family(dst), dst.max_prefixlen, 0, 0, 0, 0, 0, 0, 0) + attr(
            RTA_DST, dst.packed)
        self.sock.sendall(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_GETROUTE,
                                         NLM_F_REQUEST, seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            for kind, _flags, msg_seq, reply in iter_messages(data):
                if msg_seq != seq:
                    continue
                return None if kind == NLMSG_ERROR else reply
