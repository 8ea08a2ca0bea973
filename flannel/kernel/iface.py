"""External interface and public IP selection (upstream ``LookupExtIface`` and ``ipmatch``).

Owns the choice of the interface other nodes reach us through and of its address:
``--iface`` (name or IP, in order), ``--iface-regex``, ``--iface-can-reach``, ``--public-ip``,
else the default route. The selection itself is pure (``select_external_interface`` over a
``NetSnapshot``); ``read_snapshot`` is the only part that reads netlink, and it only reads.
Must not touch: links, addresses or routes (no writes), the store.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv6Address
from typing import TYPE_CHECKING, TypeVar

from flannel.kernel import links, rtnl
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import Rtnl
from flannel.untrusted.netutil import parse_ip

if TYPE_CHECKING:
    from flannel.config import NetworkConfig
    from flannel.settings import InterfaceSettings

IFA_F_TEMPORARY = 0x01
IFA_F_DADFAILED = 0x08
IFA_F_DEPRECATED = 0x20
IFA_F_TENTATIVE = 0x40
IFA_F_PERMANENT = 0x80

IPAddress = IPv4Address | IPv6Address
#: Public IPs the store imposes on this node (kube's node-public-ip annotations), if any.
PublicIPs = tuple[IPv4Address | None, IPv6Address | None]
AddressT = TypeVar("AddressT", IPv4Address, IPv6Address)


class InterfaceError(Exception):
    """No usable external interface; the message names the flag to fix."""


@dataclass(frozen=True)
class IfaceAddr:
    address: IPAddress
    prefixlen: int
    flags: int = IFA_F_PERMANENT

    @property
    def unusable_because(self) -> str:
        """Why other nodes cannot reach us at this address ("" when they can).

        Link-local addresses are refused although Go flannel falls back to them: peers on
        another link cannot use one, and they refuse a lease that publishes it.
        """
        addr = self.address
        if addr.is_unspecified or addr.is_loopback or addr.is_multicast:
            return "not a unicast address"
        if addr.is_link_local:
            return "link-local"
        if self.flags & IFA_F_DADFAILED:
            return "a duplicate: duplicate address detection failed"
        if self.flags & IFA_F_TENTATIVE:
            return "tentative: duplicate address detection has not finished"
        if self.flags & IFA_F_DEPRECATED:
            return "deprecated"
        return ""

    @property
    def usable(self) -> bool:
        return not self.unusable_because

    def rank(self) -> tuple[int, int]:
        """Sort key: permanent before dynamic, stable before temporary."""
        return (
            0 if self.flags & IFA_F_PERMANENT else 1,
            1 if self.flags & IFA_F_TEMPORARY else 0,
        )


@dataclass(frozen=True)
class Interface:
    index: int
    name: str
    mtu: int
    addrs: tuple[IfaceAddr, ...] = ()

    def best_addr(self, version: int) -> IPAddress | None:
        usable = [a for a in self.addrs if a.address.version == version and a.usable]
        return min(usable, key=IfaceAddr.rank).address if usable else None

    def has_addr(self, addr: IPAddress) -> bool:
        return any(a.address == addr for a in self.addrs)

    def no_address_error(self, version: int) -> InterfaceError:
        """Why this interface has no address to publish in ``version``, and what to do."""
        refused = [a for a in self.addrs if a.address.version == version and not a.usable]
        found = "none" if not refused else "only unusable ones (" + "; ".join(
            f"{a.address} is {a.unusable_because}" for a in refused) + ")"
        wait = " (or wait for duplicate address detection to finish)" if any(
            a.unusable_because.startswith("tentative") for a in refused) else ""
        kind = "a global" if version == 6 else "an"
        return InterfaceError(
            f"failed to find IPv{version} address for interface {self.name}: it has {found}; "
            f"other nodes must reach this node at {kind} IPv{version} address: give "
            f"{self.name} one{wait} or choose another interface with --iface")


@dataclass
class NetSnapshot:
    """What selection needs to know of the host's network (read once)."""

    interfaces: list[Interface]
    default_v4_ifindex: int | None = None
    default_v6_ifindex: int | None = None
    route_get: Callable[[IPAddress], tuple[int, IPAddress | None] | None] = field(
        default=lambda _dst: None)

    def by_index(self, index: int | None) -> Interface | None:
        return next((i for i in self.interfaces if i.index == index), None)

    def by_name(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def by_ip(self, addr: IPAddress) -> Interface | None:
        return next((i for i in self.interfaces if i.has_addr(addr)), None)


@dataclass(frozen=True)
class IfaceOptions:
    ifaces: Sequence[str] = ()
    iface_regexes: Sequence[str] = ()
    iface_can_reach: str = ""
    public_ip: str = ""
    public_ipv6: str = ""


@dataclass(frozen=True)
class ExternalInterface:
    """The selected interface, its own addresses and the public (published) addresses."""

    name: str
    index: int
    mtu: int
    iface_addr: IPv4Address | None
    iface_v6_addr: IPv6Address | None
    ext_addr: IPv4Address | None
    ext_v6_addr: IPv6Address | None


def _parse_ip(text: str, version: int, flag: str) -> IPAddress | None:
    if not text:
        return None
    try:
        return parse_ip(text, version)
    except ValueError as err:
        raise InterfaceError(f"{flag}: {err}") from None


def _match_regexes(snapshot: NetSnapshot, patterns: Sequence[str], ipv4: bool, ipv6: bool
                   ) -> tuple[Interface, IPAddress | None, IPAddress | None] | None:
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as err:
            raise InterfaceError(f"--iface-regex: {pattern!r} is not a valid regex: {err}"
                                 ) from None
    for regex in compiled:
        # Addresses first (a dual-stack node needs both families on one interface)...
        for iface in snapshot.interfaces:
            v4 = next((a.address for a in iface.addrs if a.address.version == 4 and a.usable
                       and regex.search(str(a.address))), None) if ipv4 else None
            v6 = next((a.address for a in iface.addrs if a.address.version == 6 and a.usable
                       and regex.search(str(a.address))), None) if ipv6 else None
            if (not ipv4 or v4) and (not ipv6 or v6):
                return iface, v4, v6
        # ...then names.
        for iface in snapshot.interfaces:
            if regex.search(iface.name):
                return iface, None, None
    return None


def _pick(snapshot: NetSnapshot, opts: IfaceOptions, ipv4: bool, ipv6: bool,
          public_ip: IPAddress | None, public_ipv6: IPAddress | None
          ) -> tuple[Interface, IPAddress | None, IPAddress | None]:
    if not (opts.ifaces or opts.iface_regexes or opts.iface_can_reach):
        wanted = public_ip if public_ip is not None else public_ipv6
        if wanted is not None:
            iface = snapshot.by_ip(wanted)
            if iface is None:
                raise InterfaceError(
                    f"Failed to find any valid interface to use: no interface holds the "
                    f"public IP {wanted}; give --iface as well when the public IP is not local "
                    "(NAT)")
            return iface, (public_ip if ipv4 else None), (public_ipv6 if ipv6 else None)
        v4_iface = snapshot.by_index(snapshot.default_v4_ifindex) if ipv4 else None
        v6_iface = snapshot.by_index(snapshot.default_v6_ifindex) if ipv6 else None
        if ipv4 and v4_iface is None:
            raise InterfaceError("Failed to find any valid interface to use: no IPv4 default "
                                 "route; add one or choose the interface with --iface")
        if ipv6 and v6_iface is None:
            raise InterfaceError("Failed to find any valid interface to use: no IPv6 default "
                                 "route; add one or choose the interface with --iface")
        if v4_iface is not None and v6_iface is not None and v4_iface.index != v6_iface.index:
            raise InterfaceError(
                f"v6 default route interface {v6_iface.name} must be the same with v4 default "
                f"route interface {v4_iface.name}; choose one with --iface")
        iface = v4_iface or v6_iface
        assert iface is not None
        return iface, None, None

    for item in opts.ifaces:
        try:
            addr = ipaddress.ip_address(item)
        except ValueError:
            named = snapshot.by_name(item)
            if named is not None:
                return named, None, None
            continue
        holder = snapshot.by_ip(addr)
        if holder is not None:
            why = next(a.unusable_because for a in holder.addrs if a.address == addr)
            if why:
                raise InterfaceError(f"--iface {item}: that address of {holder.name} is {why}; "
                                     "other nodes cannot reach this node there: give a usable "
                                     "address or the interface name")
            return holder, (addr if addr.version == 4 else None), (
                addr if addr.version == 6 else None)
    if opts.iface_regexes:
        matched = _match_regexes(snapshot, opts.iface_regexes, ipv4, ipv6)
        if matched is not None:
            return matched
    if opts.iface_can_reach:
        if not _looks_ip(opts.iface_can_reach):
            raise InterfaceError(
                f"--iface-can-reach: {opts.iface_can_reach!r} is not an IP address")
        target = ipaddress.ip_address(opts.iface_can_reach)
        found = snapshot.route_get(target)
        if found is not None:
            iface = snapshot.by_index(found[0])
            if iface is not None:
                src = found[1]
                return iface, (src if src is not None and src.version == 4 else None), (
                    src if src is not None and src.version == 6 else None)
    raise InterfaceError(
        "Failed to find interface to use that matches the interfaces and/or regexes provided "
        f"(--iface {list(opts.ifaces)}, --iface-regex {list(opts.iface_regexes)}, "
        f"--iface-can-reach {opts.iface_can_reach!r})")


def _looks_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def select_external_interface(snapshot: NetSnapshot, opts: IfaceOptions, *, ipv4: bool = True,
                              ipv6: bool = False) -> ExternalInterface:
    """Choose the external interface and the addresses to publish."""
    public_ip = _parse_ip(opts.public_ip, 4, "--public-ip")
    public_ipv6 = _parse_ip(opts.public_ipv6, 6, "--public-ipv6")
    iface, v4, v6 = _pick(snapshot, opts, ipv4, ipv6, public_ip, public_ipv6)
    if ipv4 and v4 is None:
        v4 = iface.best_addr(4)
        if v4 is None:
            raise iface.no_address_error(4)
    if ipv6 and v6 is None:
        v6 = iface.best_addr(6)
        if v6 is None:
            raise iface.no_address_error(6)
    if iface.mtu == 0:
        raise InterfaceError(f"failed to determine MTU for {iface.name} interface")
    return ExternalInterface(
        name=iface.name,
        index=iface.index,
        mtu=iface.mtu,
        iface_addr=_of_family(v4, IPv4Address) if ipv4 else None,
        iface_v6_addr=_of_family(v6, IPv6Address) if ipv6 else None,
        ext_addr=_of_family(public_ip or v4, IPv4Address) if ipv4 else None,
        ext_v6_addr=_of_family(public_ipv6 or v6, IPv6Address) if ipv6 else None,
    )


def _of_family(addr: IPAddress | None, family: type[AddressT]) -> AddressT | None:
    """``addr`` as the family it was picked for (every pick above filters by version)."""
    return addr if isinstance(addr, family) else None


def read_snapshot(host: Host = LOCAL) -> NetSnapshot:
    """Read links, addresses and default routes over netlink (read-only)."""
    with Rtnl(host) as sock:
        addrs: dict[int, list[IfaceAddr]] = {}
        for found in links.dump_addresses(sock):
            addrs.setdefault(found.index, []).append(
                IfaceAddr(found.address, found.prefixlen, found.flags))
        interfaces = [
            Interface(details.link.index, details.link.name or "", details.link.mtu,
                      tuple(addrs.get(details.link.index, ())))
            for details in links.dump_links(sock)
        ]
        defaults: dict[int, int | None] = {}
        for family in (socket.AF_INET, socket.AF_INET6):
            defaults[family] = next(
                (route.oif for route, _proto, table in sock.routes(family)
                 if table == rtnl.RT_TABLE_MAIN and route.dst.endswith("/0") and route.oif),
                None)

    def route_get(dst: IPAddress) -> tuple[int, IPAddress | None] | None:
        with Rtnl(host) as lookup:
            return lookup.route_source(dst)

    return NetSnapshot(interfaces, defaults[socket.AF_INET], defaults[socket.AF_INET6],
                       route_get)


async def select_interface(settings: InterfaceSettings, config: NetworkConfig,
                           imposed: PublicIPs) -> ExternalInterface:
    """The external interface of the flags, with the public IPs the store imposes;
    InterfaceError names the flag to fix."""
    public_v4, public_v6 = imposed
    options = IfaceOptions(settings.ifaces, settings.iface_regexes, settings.can_reach,
                           str(public_v4) if public_v4 else settings.public_ip,
                           str(public_v6) if public_v6 else settings.public_ipv6)
    # Netlink reads block: keep them off the event loop.
    return await asyncio.to_thread(
        lambda: select_external_interface(read_snapshot(), options,
                                          ipv4=config.enable_ipv4, ipv6=config.enable_ipv6))
