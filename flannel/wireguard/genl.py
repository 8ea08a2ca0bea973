"""Kernel WireGuard over generic netlink: the "wireguard" family's GET_DEVICE and SET_DEVICE.

Owns: resolving a generic netlink family id by name (nlctrl's CTRL_CMD_GETFAMILY; the kernel
loads the wireguard module on that request when it has one), the binary layout of the
family's requests and replies as the kernel's include/uapi/linux/wireguard.h defines it,
and ``GenlControl``, the ``uapi.Control`` of a kernel device (what ``wg`` does, without the
tool). WG_CMD_SET_DEVICE is split into several messages when the peers do not fit one (a
peer whose allowed IPs do not fit is continued in the next message, without
``REPLACE_ALLOWEDIPS``); WG_CMD_GET_DEVICE is a dump whose peers, and one peer's allowed IPs,
may span several messages, merged here into the ``uapi.DeviceState`` the UAPI path reads.
Every nest carries NLA_F_NESTED (the kernel refuses nests without it); numbers are in host
order but the endpoint's port, which is a ``sockaddr``'s.

API: ``resolve_family(sock, name) -> int | None``, ``wireguard_family(host)``,
``encode_get_device`` / ``encode_set_device`` / ``decode_get_device`` (the bytes),
``GenlSocket`` (one request socket: checked requests and dumps),
``GenlControl(ifname, host)`` raising ``uapi.ControlUnavailable`` when the device is gone
and ``uapi.ControlError`` with the fix otherwise. Synchronous: call from a worker thread.
Must not touch: any device but the one named. Keys travel only in request bytes: never
logged, never in an error.
"""

from __future__ import annotations

import base64
import errno
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import IPv6Address, ip_address
from typing import Protocol

from flannel.kernel import rtnl
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import NetlinkError
from flannel.wireguard.keys import KEY_LEN, Secret
from flannel.wireguard.uapi import (
    MAX_ALLOWED_IPS,
    MAX_PEERS,
    Control,
    ControlError,
    ControlUnavailable,
    DeviceState,
    DeviceUpdate,
    Peer,
    PeerState,
    PeerUpdate,
    normalise_endpoint,
)

NETLINK_GENERIC = 16
NLM_F_DUMP_INTR = 0x10  # the object changed while it was dumped: read it again
NLA_F_NESTED = 0x8000

GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID, CTRL_ATTR_FAMILY_NAME = 1, 2
CTRL_VERSION = 1

WG_GENL_NAME = "wireguard"
WG_GENL_VERSION = 1
WG_CMD_GET_DEVICE, WG_CMD_SET_DEVICE = 0, 1

(WGDEVICE_A_UNSPEC, WGDEVICE_A_IFINDEX, WGDEVICE_A_IFNAME, WGDEVICE_A_PRIVATE_KEY,
 WGDEVICE_A_PUBLIC_KEY, WGDEVICE_A_FLAGS, WGDEVICE_A_LISTEN_PORT, WGDEVICE_A_FWMARK,
 WGDEVICE_A_PEERS) = range(9)
(WGPEER_A_UNSPEC, WGPEER_A_PUBLIC_KEY, WGPEER_A_PRESHARED_KEY, WGPEER_A_FLAGS,
 WGPEER_A_ENDPOINT, WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, WGPEER_A_LAST_HANDSHAKE_TIME,
 WGPEER_A_RX_BYTES, WGPEER_A_TX_BYTES, WGPEER_A_ALLOWEDIPS, WGPEER_A_PROTOCOL_VERSION) = range(11)
WGALLOWEDIP_A_UNSPEC, WGALLOWEDIP_A_FAMILY, WGALLOWEDIP_A_IPADDR, WGALLOWEDIP_A_CIDR_MASK = \
    range(4)
WGPEER_F_REMOVE_ME, WGPEER_F_REPLACE_ALLOWEDIPS, WGPEER_F_UPDATE_ONLY = 1, 2, 4

#: Bytes per SET_DEVICE message, as ``wg`` sends them (libmnl's buffer on 4 KiB pages).
MAX_MESSAGE = 4096
#: A dump larger than this is refused (about 100,000 peers).
MAX_DUMP = 16 << 20
#: Seconds a request's whole answer may take (a kernel answers in milliseconds).
REPLY_TIMEOUT = 10.0
#: Dumps read again when the device changed under them, before giving up.
DUMP_ATTEMPTS = 5

_NLMSGHDR = struct.Struct("=IHHII")
_GENLMSGHDR = struct.Struct("=BBH")
_ATTR = struct.Struct("=HH")
_U16, _U32, _U64 = struct.Struct("=H"), struct.Struct("=I"), struct.Struct("=Q")
_PORT = struct.Struct("!H")
_TIMESPEC = struct.Struct("=qq")  # struct __kernel_timespec
_SOCKADDR_IN_LEN, _SOCKADDR_IN6_LEN = 16, 28


# -- encoding -------------------------------------------------------------------------------


def _nest(kind: int, payload: bytes) -> bytes:
    return rtnl.attr(kind | NLA_F_NESTED, payload)


def _genl(family: int, flags: int, seq: int, cmd: int, version: int, attrs: bytes) -> bytes:
    return rtnl.frame(family, flags, seq, _GENLMSGHDR.pack(cmd, version, 0) + attrs)


def encode_getfamily(name: str, seq: int) -> bytes:
    """nlctrl's CTRL_CMD_GETFAMILY for ``name``, asking for an ACK."""
    return _genl(GENL_ID_CTRL, rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK, seq, CTRL_CMD_GETFAMILY,
                 CTRL_VERSION, rtnl.attr(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0"))


def _ifname(name: str) -> bytes:
    return rtnl.attr(WGDEVICE_A_IFNAME, name.encode() + b"\0")


def encode_get_device(family: int, ifname: str, seq: int) -> bytes:
    """The GET_DEVICE dump request for ``ifname`` (the kernel accepts GET only as a dump)."""
    return _genl(family, rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP, seq, WG_CMD_GET_DEVICE,
                 WG_GENL_VERSION, _ifname(ifname))


def _key(b64: str) -> bytes:
    raw = base64.b64decode(b64, validate=True)
    if len(raw) != KEY_LEN:
        raise ValueError("a WireGuard key is 32 bytes")
    return raw


def _sockaddr(endpoint: str) -> bytes:
    text = normalise_endpoint(endpoint)
    if text is None:
        raise ValueError(f"not an endpoint: {endpoint!r}")
    host, _, port = text.rpartition(":")
    addr = ip_address(host.strip("[]"))
    if addr.version == 4:
        return (_U16.pack(socket.AF_INET) + _PORT.pack(int(port)) + addr.packed
                + bytes(_SOCKADDR_IN_LEN - 8))
    return (_U16.pack(socket.AF_INET6) + _PORT.pack(int(port)) + _U32.pack(0) + addr.packed
            + _U32.pack(0))


def _allowed_ip(net: str) -> bytes:
    text, _, plen = net.partition("/")
    addr = ip_address(text)
    family = socket.AF_INET if addr.version == 4 else socket.AF_INET6
    return _nest(0, rtnl.attr(WGALLOWEDIP_A_FAMILY, _U16.pack(family))
                 + rtnl.attr(WGALLOWEDIP_A_IPADDR, addr.packed)
                 + rtnl.attr(WGALLOWEDIP_A_CIDR_MASK, bytes([int(plen)])))


def _peer_parts(peer: PeerUpdate, room: int) -> list[bytes]:
    """One peer's nests: all its fields in the first, then as many further nests as its
    allowed IPs need so that none exceeds ``room`` bytes. A continuation adds IPs to what
    the first nest set (no REPLACE_ALLOWEDIPS) and never creates the peer (UPDATE_ONLY)."""
    key = rtnl.attr(WGPEER_A_PUBLIC_KEY, _key(peer.public_key))
    if peer.remove:
        return [_nest(0, key + rtnl.attr(WGPEER_A_FLAGS, _U32.pack(WGPEER_F_REMOVE_ME)))]
    flags = ((WGPEER_F_UPDATE_ONLY if peer.update_only else 0)
             | (WGPEER_F_REPLACE_ALLOWEDIPS if peer.allowed_ips is not None else 0))
    head = key + (rtnl.attr(WGPEER_A_FLAGS, _U32.pack(flags)) if flags else b"")
    if peer.set_psk or peer.psk is not None:
        psk = peer.psk.raw if peer.psk is not None else bytes(KEY_LEN)
        head += rtnl.attr(WGPEER_A_PRESHARED_KEY, psk)
    if peer.endpoint is not None:
        head += rtnl.attr(WGPEER_A_ENDPOINT, _sockaddr(peer.endpoint))
    if peer.keepalive is not None:
        head += rtnl.attr(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, _U16.pack(peer.keepalive))
    more = key + rtnl.attr(WGPEER_A_FLAGS, _U32.pack(WGPEER_F_UPDATE_ONLY))
    parts: list[bytes] = []
    ips: list[bytes] = []
    size = _ATTR.size * 2 + len(head)  # the peer's nest, its ALLOWEDIPS nest, the IPs so far
    for net in sorted(peer.allowed_ips or ()):
        entry = _allowed_ip(net)
        if ips and size + len(entry) > room:
            parts.append(_nest(0, head + _nest(WGPEER_A_ALLOWEDIPS, b"".join(ips))))
            head, ips = more, []
            size = _ATTR.size * 2 + len(head)
        ips.append(entry)
        size += len(entry)
    parts.append(_nest(0, head + (_nest(WGPEER_A_ALLOWEDIPS, b"".join(ips)) if ips else b"")))
    return parts


def encode_set_device(family: int, ifname: str, update: DeviceUpdate, first_seq: int,
                      max_message: int = MAX_MESSAGE) -> list[bytes]:
    """SET_DEVICE requests for ``update`` (each asking for an ACK, sequence numbers from
    ``first_seq``): the device's own fields in the first, the peers packed in order into as
    many messages of at most ``max_message`` bytes as they need."""
    device = _ifname(ifname)
    first = device
    if update.private_key is not None:
        first += rtnl.attr(WGDEVICE_A_PRIVATE_KEY, update.private_key.raw)
    if update.listen_port is not None:
        first += rtnl.attr(WGDEVICE_A_LISTEN_PORT, _U16.pack(update.listen_port))
    overhead = _NLMSGHDR.size + _GENLMSGHDR.size + _ATTR.size  # and the PEERS nest
    room = max_message - overhead - len(first)
    messages: list[bytes] = []
    attrs, peers = first, b""

    def flush() -> None:
        body = attrs + (_nest(WGDEVICE_A_PEERS, peers) if peers else b"")
        messages.append(_genl(family, rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK,
                              first_seq + len(messages), WG_CMD_SET_DEVICE, WG_GENL_VERSION,
                              body))

    for peer in update.peers:
        for part in _peer_parts(peer, room):
            if peers and overhead + len(attrs) + len(peers) + len(part) > max_message:
                flush()
                attrs, peers = device, b""
            peers += part
    flush()
    return messages


# -- decoding -------------------------------------------------------------------------------


def iter_attrs(data: bytes, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type without flags, payload) of each attribute, in order, repeats included."""
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > len(data):
            raise ControlError("the kernel answered a malformed attribute")
        yield kind & 0x3FFF, data[offset + _ATTR.size: offset + length]
        offset += (length + 3) & ~3


def decode_family(body: bytes) -> int:
    """The family id of a CTRL_CMD_NEWFAMILY reply."""
    attrs = rtnl.parse_attrs(body, _GENLMSGHDR.size)
    raw = attrs.get(CTRL_ATTR_FAMILY_ID, b"")
    if len(raw) != _U16.size:
        raise ControlError("nlctrl answered a family without an id")
    return int(_U16.unpack(raw)[0])


def _fixed(raw: bytes, what: str, size: int) -> bytes:
    if len(raw) != size:
        raise ControlError(f"the kernel answered an unreadable {what}")
    return raw


def _secret(raw: bytes, what: str) -> Secret | None:
    raw = _fixed(raw, what, KEY_LEN)
    return None if raw == bytes(KEY_LEN) else Secret(raw)


def _endpoint(raw: bytes) -> str | None:
    if len(raw) < 4:
        raise ControlError("the kernel answered an unreadable endpoint")
    family, port = _U16.unpack_from(raw)[0], _PORT.unpack_from(raw, 2)[0]
    if family == socket.AF_INET and len(raw) >= _SOCKADDR_IN_LEN:
        return f"{socket.inet_ntoa(raw[4:8])}:{port}"
    if family == socket.AF_INET6 and len(raw) >= _SOCKADDR_IN6_LEN:
        return f"[{IPv6Address(raw[8:24])}]:{port}"
    raise ControlError("the kernel answered an unreadable endpoint")


_ADDR_BYTES = {socket.AF_INET: 4, socket.AF_INET6: 16}


def _network_text(raw: bytes, cidr: int) -> str:
    """``raw/cidr`` as ``uapi.Peer.normalised`` writes it (host bits cleared), without an
    ``ipaddress`` object for IPv4: a dump holds one or two per peer, thousands of peers."""
    width = len(raw) * 8
    if cidr > width:
        raise ControlError("the kernel answered an unreadable allowed IP")
    value = int.from_bytes(raw, "big") & ~((1 << (width - cidr)) - 1)
    if width == 32:
        return f"{socket.inet_ntoa(value.to_bytes(4, 'big'))}/{cidr}"
    return f"{IPv6Address(value)}/{cidr}"


def _allowed_ips(payload: bytes) -> Iterator[str]:
    for _index, nest in iter_attrs(payload):
        attrs = dict(iter_attrs(nest))
        family = _U16.unpack(_fixed(attrs.get(WGALLOWEDIP_A_FAMILY, b""), "allowed IP", 2))[0]
        size = _ADDR_BYTES.get(family)
        if size is None:
            raise ControlError("the kernel answered an allowed IP of an unknown family")
        raw = _fixed(attrs.get(WGALLOWEDIP_A_IPADDR, b""), "allowed IP", size)
        yield _network_text(raw, _fixed(attrs.get(WGALLOWEDIP_A_CIDR_MASK, b""),
                                        "allowed IP", 1)[0])


@dataclass
class _PeerFields:
    endpoint: str | None = None
    psk: Secret | None = None
    keepalive: int = 0
    handshake: tuple[int, int] = (0, 0)
    rx: int = 0
    tx: int = 0
    allowed: list[str] = field(default_factory=list)


def _read_peer(payload: bytes, peers: dict[str, _PeerFields]) -> int:
    """Read one peer's nest into ``peers``; the allowed IPs it added."""
    fields = dict(iter_attrs(payload))
    key = base64.b64encode(_fixed(fields.get(WGPEER_A_PUBLIC_KEY, b""), "public key",
                                  KEY_LEN)).decode()
    # The kernel continues a peer whose allowed IPs did not fit in the next message, naming
    # it by its key alone: the other fields came with its first part.
    peer = peers.setdefault(key, _PeerFields())
    added = 0
    for kind, raw in fields.items():
        if kind == WGPEER_A_PRESHARED_KEY:
            peer.psk = _secret(raw, "preshared key")
        elif kind == WGPEER_A_ENDPOINT:
            peer.endpoint = _endpoint(raw)
        elif kind == WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL:
            peer.keepalive = _U16.unpack(_fixed(raw, "keepalive", 2))[0]
        elif kind == WGPEER_A_LAST_HANDSHAKE_TIME:
            sec, nsec = _TIMESPEC.unpack(_fixed(raw, "handshake time", _TIMESPEC.size))
            peer.handshake = (sec, nsec)
        elif kind == WGPEER_A_RX_BYTES:
            peer.rx = _U64.unpack(_fixed(raw, "byte count", 8))[0]
        elif kind == WGPEER_A_TX_BYTES:
            peer.tx = _U64.unpack(_fixed(raw, "byte count", 8))[0]
        elif kind == WGPEER_A_ALLOWEDIPS:
            before = len(peer.allowed)
            peer.allowed.extend(_allowed_ips(raw))
            added += len(peer.allowed) - before
    return added


def decode_get_device(bodies: list[bytes]) -> DeviceState:
    """The device state from every message body (generic netlink header first) of a
    GET_DEVICE dump, in order."""
    private: Secret | None = None
    port = 0
    peers: dict[str, _PeerFields] = {}
    allowed = 0
    for body in bodies:
        if len(body) < _GENLMSGHDR.size:
            raise ControlError("the kernel answered a truncated message")
        for kind, raw in iter_attrs(body, _GENLMSGHDR.size):
            if kind == WGDEVICE_A_PRIVATE_KEY:
                private = _secret(raw, "private key")
            elif kind == WGDEVICE_A_LISTEN_PORT:
                port = _U16.unpack(_fixed(raw, "listen port", 2))[0]
            elif kind == WGDEVICE_A_PEERS:
                for _index, nest in iter_attrs(raw):
                    allowed += _read_peer(nest, peers)
                    if len(peers) > MAX_PEERS:
                        raise ControlError(f"the kernel answered more than {MAX_PEERS} peers")
                    if allowed > MAX_ALLOWED_IPS:
                        raise ControlError(f"the kernel answered more than {MAX_ALLOWED_IPS} "
                                           "allowed IPs")
    # Endpoints and allowed IPs are already in the canonical text ``Peer.normalised`` gives.
    states = {key: PeerState(Peer(key, f.endpoint, frozenset(f.allowed), f.psk, f.keepalive),
                             f.handshake[0] + f.handshake[1] / 1e9 if f.handshake[0] else None,
                             f.rx, f.tx)
              for key, f in peers.items()}
    return DeviceState(private, port, states)


# -- the socket -----------------------------------------------------------------------------


class NetlinkSocket(Protocol):
    """What ``GenlSocket`` needs of its socket (a NETLINK_GENERIC one in production)."""

    def sendall(self, data: bytes, /) -> None: ...

    def recv(self, size: int, /) -> bytes: ...

    def close(self) -> None: ...


class GenlSocket:
    """One generic netlink request socket: checked requests and dumps, sequence numbers
    from 1."""

    def __init__(self, sock: NetlinkSocket) -> None:
        self.sock = sock
        self._seq = 0

    @classmethod
    def open(cls, host: Host = LOCAL) -> GenlSocket:
        sock = rtnl.open_socket(host, rcvbuf=1 << 20, protocol=NETLINK_GENERIC)
        sock.settimeout(REPLY_TIMEOUT)
        return cls(sock)

    def __enter__(self) -> GenlSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.sock.close()

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _replies(self, seq: int) -> Iterator[tuple[int, int, bytes]]:
        """(type, flags, body) of the messages answering ``seq``, read as they come, all
        within REPLY_TIMEOUT (the socket's own timeout bounds each read)."""
        received = 0
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            if time.monotonic() > deadline:
                raise ControlError(f"the kernel's answer took more than {REPLY_TIMEOUT:g}s")
            data = self.sock.recv(1 << 20)
            if not data:
                raise ControlError("the kernel closed the netlink socket")
            received += len(data)
            if received > MAX_DUMP:
                raise ControlError(f"the kernel answered more than {MAX_DUMP} bytes")
            for kind, flags, msg_seq, body in rtnl.iter_messages(data):
                if msg_seq == seq:
                    yield kind, flags, body

    def request(self, data: bytes, seq: int, what: str) -> list[bytes]:
        """Send one request that asks for an ACK; the bodies of its replies. NetlinkError
        when the kernel refuses it."""
        self.sock.sendall(data)
        bodies: list[bytes] = []
        for kind, flags, body in self._replies(seq):
            if kind != rtnl.NLMSG_ERROR:
                bodies.append(body)
                continue
            code = -struct.unpack_from("=i", body)[0]
            if code:
                raise NetlinkError(code, what, rtnl.ack_detail(flags, body))
            return bodies
        raise AssertionError("unreachable: _replies only ends by raising")

    def dump(self, data: bytes, seq: int, what: str) -> tuple[list[bytes], bool]:
        """Send one dump request; (the bodies of its messages, whether the kernel flagged
        the dump as interrupted by a change). NetlinkError when it is refused."""
        self.sock.sendall(data)
        bodies: list[bytes] = []
        interrupted = False
        for kind, flags, body in self._replies(seq):
            interrupted |= bool(flags & NLM_F_DUMP_INTR)
            if kind in (rtnl.NLMSG_ERROR, rtnl.NLMSG_DONE):
                code = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
                if code:
                    raise NetlinkError(code, what, rtnl.ack_detail(flags, body))
                return bodies, interrupted
            bodies.append(body)
        raise AssertionError("unreachable: _replies only ends by raising")


def resolve_family(sock: GenlSocket, name: str) -> int | None:
    """The id of generic netlink family ``name``, None when the kernel has no such family."""
    seq = sock.next_seq()
    try:
        replies = sock.request(encode_getfamily(name, seq), seq, f"resolve family {name}")
    except NetlinkError as err:
        if err.errno == errno.ENOENT:
            return None
        raise
    if not replies:
        raise ControlError(f"nlctrl answered nothing for family {name}")
    return decode_family(replies[0])


def wireguard_family(host: Host = LOCAL) -> int | None:
    """The id of the kernel's "wireguard" family in ``host``'s namespace, None when the
    kernel has no WireGuard (asking loads the module when there is one)."""
    with GenlSocket.open(host) as sock:
        return resolve_family(sock, WG_GENL_NAME)


NO_FAMILY = 'this kernel has no WireGuard (generic netlink has no "wireguard" family)'
LOAD_MODULE = "load the wireguard module (`modprobe wireguard`)"


class GenlControl(Control):
    """A kernel WireGuard device, read and configured over generic netlink (a socket per
    call, entered into ``host``'s namespace; the family id is resolved once). ``connect``
    opens that socket (tests give one whose other end is a double of the kernel)."""

    def __init__(self, ifname: str, host: Host = LOCAL,
                 connect: Callable[[], GenlSocket] | None = None) -> None:
        self.ifname = ifname
        self.host = host
        self._connect = connect or (lambda: GenlSocket.open(host))
        self._family: int | None = None

    def _open(self) -> tuple[GenlSocket, int]:
        try:
            sock = self._connect()
        except OSError as err:
            raise ControlError(f"cannot open a generic netlink socket in {self.host}: "
                               f"{err.strerror or err}") from None
        try:
            if self._family is None:
                try:
                    self._family = resolve_family(sock, WG_GENL_NAME)
                except OSError as err:
                    raise self._error(err, None) from None
                if self._family is None:
                    raise ControlError(f"{NO_FAMILY}; {LOAD_MODULE}")
        except BaseException:
            sock.sock.close()
            raise
        return sock, self._family

    def _error(self, err: OSError, update: DeviceUpdate | None) -> ControlError:
        """The kernel's refusal (or the socket's failure) as the error the backend shows:
        what is wrong and the fix."""
        if not isinstance(err, NetlinkError):
            return ControlError(f"{self.ifname}: generic netlink socket: {err.strerror or err}")
        code = err.errno
        if code == errno.ENODEV:
            return ControlUnavailable(f"{self.ifname} does not exist in {self.host}")
        if code == errno.ENOENT:
            # A family id the kernel no longer knows (the module was reloaded).
            self._family = None
            return ControlUnavailable("the kernel's wireguard generic netlink family went "
                                      "away (module unloaded?)")
        if code == errno.EOPNOTSUPP:
            return ControlError(f"{self.ifname} is not a WireGuard device; remove it (`ip link "
                                f"del {self.ifname}`) so flannel can create its own")
        if code == errno.EPERM:
            return ControlError(f"the kernel refused flanneld access to {self.ifname} "
                                "(EPERM): reading or configuring WireGuard needs CAP_NET_ADMIN "
                                "in this network namespace; run flanneld as root or grant it "
                                "NET_ADMIN (the DaemonSet's securityContext)")
        if code == errno.EADDRINUSE and update is not None and update.listen_port:
            return ControlError(f"{self.ifname} cannot listen on UDP port "
                                f"{update.listen_port}: another socket holds it; stop that "
                                "program or set another ListenPort in the backend config")
        return ControlError(f"{self.ifname}: {err.strerror}")

    def get(self) -> DeviceState:
        sock, family = self._open()
        with sock:
            for _attempt in range(DUMP_ATTEMPTS):
                seq = sock.next_seq()
                try:
                    bodies, interrupted = sock.dump(encode_get_device(family, self.ifname, seq),
                                                    seq, f"get {self.ifname}")
                except OSError as err:
                    raise self._error(err, None) from None
                if not interrupted:
                    return decode_get_device(bodies)
        raise ControlError(f"{self.ifname} changed during each of {DUMP_ATTEMPTS} reads; "
                           "something else keeps reconfiguring it")

    def set(self, update: DeviceUpdate) -> None:
        sock, family = self._open()
        with sock:
            # The socket serves this one update: its messages take the numbers that follow.
            first = sock.next_seq()
            messages = encode_set_device(family, self.ifname, update, first)
            for seq, message in enumerate(messages, first):
                try:
                    sock.request(message, seq, f"set {self.ifname}")
                except OSError as err:
                    raise self._error(err, update) from None
