"""Links and addresses over rtnetlink, through the same socket as routes (``kernel/rtnl.py``).

Owns the binary encoding of link requests (create a ``vxlan``, ``ipip`` or ``wireguard``
device; set MTU, MAC, up; delete) and address requests (add, delete), and the decoding of
link and address dumps, kind and vxlan/ipip settings included, so that reuse decisions can be
made. Every request is what iproute2's ``ip`` sends for the same object, attribute for
attribute and in the same order (the tests compare them byte for byte).
Must not touch: routes, neighbours, FDB entries; it decides nothing (``kernel/device.py``
and the backends do).
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address, ip_address

from flannel.kernel import rtnl
from flannel.kernel.rtnl import IFADDRMSG, IFINFOMSG, attr, parse_attrs

IPAddress = IPv4Address | IPv6Address

RTM_GETLINK, RTM_GETADDR = 18, 22
IFLA_LINKINFO, IFLA_EXT_MASK = 18, 29
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
RTEXT_FILTER_SKIP_STATS = 1 << 3  # dumps without the (large) statistics blocks
IFA_FLAGS = 8
IFA_F_NODAD = 0x02

IFLA_VXLAN_ID, IFLA_VXLAN_LINK, IFLA_VXLAN_LOCAL = 1, 3, 4
IFLA_VXLAN_LEARNING, IFLA_VXLAN_L2MISS, IFLA_VXLAN_PORT = 7, 13, 15
IFLA_VXLAN_LOCAL6, IFLA_VXLAN_GBP = 17, 23

IFLA_IPTUN_LINK, IFLA_IPTUN_LOCAL, IFLA_IPTUN_REMOTE, IFLA_IPTUN_TTL = 1, 2, 3, 4
IFLA_IPTUN_TOS, IFLA_IPTUN_PROTO, IFLA_IPTUN_PMTUDISC = 5, 9, 10
IFLA_IPTUN_ENCAP_TYPE, IFLA_IPTUN_ENCAP_FLAGS = 15, 16
IFLA_IPTUN_ENCAP_SPORT, IFLA_IPTUN_ENCAP_DPORT, IFLA_IPTUN_FWMARK = 17, 18, 20

_CREATE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK | rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL
_CHANGE = rtnl.NLM_F_REQUEST | rtnl.NLM_F_ACK


@dataclass(frozen=True)
class VxlanInfo:
    """A vxlan device's settings. ``underlay`` is the ifindex tunnel packets leave by (0:
    none); ``port`` 0 in a request means the kernel's default (8472), a dump always names it.
    ``l2miss`` is only ever read: flannel programs its FDB and neighbours itself."""

    vni: int
    local: IPAddress | None = None
    underlay: int = 0
    port: int = 0
    learning: bool = True
    gbp: bool = False
    l2miss: bool = False


@dataclass(frozen=True)
class IptunInfo:
    """An ipip device's settings. ``ttl`` 0 inherits the inner packet's; ``pmtudisc`` off
    is what Go flannel's device gets (netlink.Iptun sends its zero value)."""

    local: IPv4Address | None = None
    remote: IPv4Address | None = None
    underlay: int = 0
    ttl: int = 0
    pmtudisc: bool = False


@dataclass(frozen=True)
class NewLink:
    """A device to create: ``kind`` is ``vxlan``, ``ipip`` or ``wireguard`` (no settings)."""

    name: str
    kind: str
    info: VxlanInfo | IptunInfo | None = None
    mtu: int = 0
    mac: str = ""


@dataclass(frozen=True)
class LinkDetails:
    """A link as a dump shows it: the common part, its kind ("" for a plain device) and, for
    vxlan and ipip, its settings."""

    link: rtnl.Link
    kind: str = ""
    info: VxlanInfo | IptunInfo | None = None


@dataclass(frozen=True)
class IfAddress:
    """An interface address with its IFA_F_* flags (tentative, dadfailed, permanent...)."""

    index: int
    address: IPAddress
    prefixlen: int
    flags: int


def _u8(value: int) -> bytes:
    return struct.pack("=B", value)


def _u16(value: int) -> bytes:
    return struct.pack("=H", value)


def _u32(value: int) -> bytes:
    return struct.pack("=I", value)


def _vxlan_data(info: VxlanInfo) -> bytes:
    # iproute2's order: options it records while parsing (dev, gbp, l2miss), then the rest.
    data = attr(IFLA_VXLAN_LINK, _u32(info.underlay)) if info.underlay else b""
    if info.gbp:
        data += attr(IFLA_VXLAN_GBP, b"")
    if info.l2miss:
        data += attr(IFLA_VXLAN_L2MISS, _u8(1))
    data += attr(IFLA_VXLAN_ID, _u32(info.vni))
    if info.local is not None:
        data += attr(IFLA_VXLAN_LOCAL6 if info.local.version == 6 else IFLA_VXLAN_LOCAL,
                      info.local.packed)
    data += attr(IFLA_VXLAN_LEARNING, _u8(int(info.learning)))
    if info.port:
        data += attr(IFLA_VXLAN_PORT, struct.pack("!H", info.port))
    return data


def _iptun_data(info: IptunInfo) -> bytes:
    # Every setting is explicit (zero: none), so the kernel's defaults never decide.
    data = attr(IFLA_IPTUN_PROTO, _u8(0))
    if info.local is not None:
        data += attr(IFLA_IPTUN_LOCAL, info.local.packed)
    if info.remote is not None:
        data += attr(IFLA_IPTUN_REMOTE, info.remote.packed)
    data += (attr(IFLA_IPTUN_PMTUDISC, _u8(int(info.pmtudisc))) + attr(IFLA_IPTUN_TOS, _u8(0))
             + attr(IFLA_IPTUN_TTL, _u8(info.ttl))
             + attr(IFLA_IPTUN_LINK, _u32(info.underlay)) + attr(IFLA_IPTUN_FWMARK, _u32(0))
             + attr(IFLA_IPTUN_ENCAP_TYPE, _u16(0)) + attr(IFLA_IPTUN_ENCAP_FLAGS, _u16(0))
             + attr(IFLA_IPTUN_ENCAP_SPORT, _u16(0)) + attr(IFLA_IPTUN_ENCAP_DPORT, _u16(0)))
    return data


def _ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    return IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, index, flags, change)


def encode_new_link(link: NewLink, seq: int) -> bytes:
    """RTM_NEWLINK creating ``link`` (fails with EEXIST when the name is taken)."""
    attrs = b""
    if link.mac:
        attrs += attr(rtnl.IFLA_ADDRESS, rtnl.mac_bytes(link.mac))
    if link.mtu:
        attrs += attr(rtnl.IFLA_MTU, _u32(link.mtu))
    attrs += attr(rtnl.IFLA_IFNAME, link.name.encode() + b"\0")
    # The kind goes without a terminating NUL, as iproute2 sends it; the name with one.
    info = attr(IFLA_INFO_KIND, link.kind.encode())
    if isinstance(link.info, VxlanInfo):
        info += attr(IFLA_INFO_DATA, _vxlan_data(link.info))
    elif isinstance(link.info, IptunInfo):
        info += attr(IFLA_INFO_DATA, _iptun_data(link.info))
    attrs += attr(IFLA_LINKINFO, info)
    return rtnl.frame(rtnl.RTM_NEWLINK, _CREATE, seq, _ifinfo() + attrs)


def encode_set_link(index: int, seq: int, *, mtu: int = 0, mac: str = "",
                    up: bool | None = None) -> bytes:
    """RTM_NEWLINK changing an existing link: MTU, MAC and/or state (``up`` None: unchanged)."""
    attrs = attr(rtnl.IFLA_MTU, _u32(mtu)) if mtu else b""
    if mac:
        attrs += attr(rtnl.IFLA_ADDRESS, rtnl.mac_bytes(mac))
    state = rtnl.IFF_UP if up else 0
    header = _ifinfo(index, state, rtnl.IFF_UP if up is not None else 0)
    return rtnl.frame(rtnl.RTM_NEWLINK, _CHANGE, seq, header + attrs)


def encode_del_link(index: int, seq: int) -> bytes:
    return rtnl.frame(rtnl.RTM_DELLINK, _CHANGE, seq, _ifinfo(index))


def encode_address(msg_type: int, index: int, address: IPAddress, prefixlen: int, seq: int,
                   flags: int = 0) -> bytes:
    """RTM_NEWADDR (add, EEXIST when present) or RTM_DELADDR of ``address/prefixlen``;
    ``flags`` are IFA_F_* (e.g. IFA_F_NODAD), which fit the header's 8 bits."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    body = IFADDRMSG.pack(family, prefixlen, flags, 0, index)
    body += attr(rtnl.IFA_LOCAL, address.packed) + attr(rtnl.IFA_ADDRESS, address.packed)
    nl_flags = _CREATE if msg_type == rtnl.RTM_NEWADDR else _CHANGE
    return rtnl.frame(msg_type, nl_flags, seq, body)


def _flag(attrs: dict[int, bytes], kind: int) -> bool:
    value = attrs.get(kind)
    return bool(value and value[0])


def _u32_attr(attrs: dict[int, bytes], kind: int) -> int:
    value = attrs.get(kind)
    return struct.unpack("=I", value[:4])[0] if value and len(value) >= 4 else 0


def _ip(raw: bytes | None) -> IPAddress | None:
    return ip_address(raw) if raw is not None and len(raw) in (4, 16) else None


def _decode_vxlan(attrs: dict[int, bytes]) -> VxlanInfo:
    port = attrs.get(IFLA_VXLAN_PORT)
    return VxlanInfo(
        vni=_u32_attr(attrs, IFLA_VXLAN_ID),
        local=_ip(attrs.get(IFLA_VXLAN_LOCAL6) or attrs.get(IFLA_VXLAN_LOCAL)),
        underlay=_u32_attr(attrs, IFLA_VXLAN_LINK),
        port=struct.unpack("!H", port[:2])[0] if port and len(port) >= 2 else 0,
        learning=_flag(attrs, IFLA_VXLAN_LEARNING),
        gbp=IFLA_VXLAN_GBP in attrs,
        l2miss=_flag(attrs, IFLA_VXLAN_L2MISS))


def _decode_iptun(attrs: dict[int, bytes]) -> IptunInfo:
    local, remote = _ip(attrs.get(IFLA_IPTUN_LOCAL)), _ip(attrs.get(IFLA_IPTUN_REMOTE))
    return IptunInfo(
        local=local if isinstance(local, IPv4Address) and int(local) else None,
        remote=remote if isinstance(remote, IPv4Address) and int(remote) else None,
        underlay=_u32_attr(attrs, IFLA_IPTUN_LINK),
        ttl=attrs.get(IFLA_IPTUN_TTL, b"\0")[0],
        pmtudisc=_flag(attrs, IFLA_IPTUN_PMTUDISC))


def decode_link_details(body: bytes) -> LinkDetails:
    link = rtnl.decode_link(body)
    info = parse_attrs(parse_attrs(body, IFINFOMSG.size).get(IFLA_LINKINFO, b""), 0)
    kind = info.get(IFLA_INFO_KIND, b"").rstrip(b"\0").decode(errors="replace")
    data = parse_attrs(info.get(IFLA_INFO_DATA, b""), 0)
    if kind == "vxlan":
        return LinkDetails(link, kind, _decode_vxlan(data))
    if kind == "ipip":
        return LinkDetails(link, kind, _decode_iptun(data))
    return LinkDetails(link, kind)


def decode_if_address(body: bytes) -> IfAddress | None:
    family, prefixlen, flags, _scope, index = IFADDRMSG.unpack_from(body)
    attrs = parse_attrs(body, IFADDRMSG.size)
    # IFA_LOCAL is our own address; IFA_ADDRESS is the peer's on point-to-point links.
    address = _ip(attrs.get(rtnl.IFA_LOCAL) or attrs.get(rtnl.IFA_ADDRESS))
    if family not in (socket.AF_INET, socket.AF_INET6) or address is None:
        return None
    # IFA_FLAGS carries all 32 bits; the header's 8 are a truncated copy.
    full = attrs.get(IFA_FLAGS)
    return IfAddress(index, address, prefixlen,
                     struct.unpack("=I", full[:4])[0] if full and len(full) >= 4 else flags)


# -- requests ------------------------------------------------------------------------------

def get_link(sock: rtnl.Rtnl, name: str) -> LinkDetails | None:
    """The link called ``name``, None when there is none."""
    seq = sock.next_seq()
    body = _ifinfo() + attr(rtnl.IFLA_IFNAME, name.encode() + b"\0") + attr(
        IFLA_EXT_MASK, _u32(RTEXT_FILTER_SKIP_STATS))
    replies = sock.call(rtnl.frame(RTM_GETLINK, _CHANGE, seq, body), seq,
                        f"look up device {name}", ignore=(errno.ENODEV,))
    return next((decode_link_details(reply) for kind, reply in replies
                 if kind == rtnl.RTM_NEWLINK), None)


def dump_links(sock: rtnl.Rtnl) -> list[LinkDetails]:
    header = _ifinfo() + attr(IFLA_EXT_MASK, _u32(RTEXT_FILTER_SKIP_STATS))
    return sock.dump(RTM_GETLINK, header, lambda kind, body: decode_link_details(body)
                     if kind == rtnl.RTM_NEWLINK else None)


def dump_addresses(sock: rtnl.Rtnl, family: int = socket.AF_UNSPEC, index: int = 0
                   ) -> list[IfAddress]:
    """Addresses of ``family`` (all when AF_UNSPEC) on link ``index`` (all links when 0)."""
    header = IFADDRMSG.pack(family, 0, 0, 0, index)
    found = sock.dump(RTM_GETADDR, header, lambda kind, body: decode_if_address(body)
                      if kind == rtnl.RTM_NEWADDR else None)
    # Kernels without strict dump checking ignore the filter: apply it here as well.
    return [a for a in found if not index or a.index == index]


def add_link(sock: rtnl.Rtnl, link: NewLink) -> None:
    seq = sock.next_seq()
    sock.call(encode_new_link(link, seq), seq, f"create {link.kind} device {link.name}")


def set_link(sock: rtnl.Rtnl, index: int, what: str, *, mtu: int = 0, mac: str = "",
             up: bool | None = None) -> None:
    seq = sock.next_seq()
    sock.call(encode_set_link(index, seq, mtu=mtu, mac=mac, up=up), seq, what)


def delete_link(sock: rtnl.Rtnl, index: int, what: str) -> None:
    seq = sock.next_seq()
    sock.call(encode_del_link(index, seq), seq, what)


def add_address(sock: rtnl.Rtnl, index: int, address: IPAddress, prefixlen: int,
                flags: int = 0) -> None:
    seq = sock.next_seq()
    sock.call(encode_address(rtnl.RTM_NEWADDR, index, address, prefixlen, seq, flags), seq,
              f"add address {address}/{prefixlen}")


def delete_address(sock: rtnl.Rtnl, index: int, address: IPAddress, prefixlen: int) -> None:
    seq = sock.next_seq()
    sock.call(encode_address(rtnl.RTM_DELADDR, index, address, prefixlen, seq), seq,
              f"delete address {address}/{prefixlen}", ignore=(errno.EADDRNOTAVAIL,))
