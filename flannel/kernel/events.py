"""Netlink notifications: the kernel telling us a route, neighbour, address or link changed.

Owns an event socket (separate from the request socket, as rtnetlink requires) subscribed to
link, address, neighbour and route groups, decoding of those events, and overrun detection
(ENOBUFS means events were lost, so the caller must resync in full).
Must not touch: kernel state (it only listens).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from dataclasses import dataclass

from flannel.kernel import rtnl
from flannel.kernel.host import LOCAL, Host

log = logging.getLogger(__name__)

GROUPS = (rtnl.RTMGRP_LINK | rtnl.RTMGRP_NEIGH | rtnl.RTMGRP_IPV4_ROUTE
          | rtnl.RTMGRP_IPV6_ROUTE | rtnl.RTMGRP_IPV4_IFADDR | rtnl.RTMGRP_IPV6_IFADDR)


@dataclass(frozen=True)
class KernelEvent:
    """One decoded notification: ``deleted`` says DEL* rather than NEW*.

    ``protocol`` is a route's; ``state`` and ``flags`` a neighbour's or FDB entry's
    (NUD_* and NTF_*).
    """

    deleted: bool
    obj: rtnl.Route | rtnl.Neighbour | rtnl.FdbEntry | rtnl.Link | rtnl.Address
    protocol: int = 0
    state: int = 0
    flags: int = 0


def decode(msg_type: int, body: bytes) -> KernelEvent | None:
    if msg_type in (rtnl.RTM_NEWROUTE, rtnl.RTM_DELROUTE):
        decoded = rtnl.decode_route(body)
        if decoded is None or decoded[2] != rtnl.RT_TABLE_MAIN:
            return None
        return KernelEvent(msg_type == rtnl.RTM_DELROUTE, decoded[0], decoded[1])
    if msg_type in (rtnl.RTM_NEWNEIGH, rtnl.RTM_DELNEIGH):
        neigh = rtnl.decode_neighbour(body)
        if neigh is None:
            return None
        entry, state, flags = neigh
        return KernelEvent(msg_type == rtnl.RTM_DELNEIGH, entry, state=state, flags=flags)
    if msg_type in (rtnl.RTM_NEWLINK, rtnl.RTM_DELLINK):
        return KernelEvent(msg_type == rtnl.RTM_DELLINK, rtnl.decode_link(body))
    if msg_type in (rtnl.RTM_NEWADDR, rtnl.RTM_DELADDR):
        addr = rtnl.decode_address(body)
        return None if addr is None else KernelEvent(msg_type == rtnl.RTM_DELADDR, addr)
    return None


async def watch(on_event: Callable[[KernelEvent], None], on_overrun: Callable[[], None],
                host: Host = LOCAL) -> None:
    """Deliver kernel events until cancelled; call ``on_overrun`` when some were lost."""
    sock = rtnl.open_socket(host, groups=GROUPS, rcvbuf=16 << 20)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data = await loop.sock_recv(sock, 1 << 20)
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                log.warning("netlink event buffer overrun: events were lost; resyncing")
                on_overrun()
                continue
            for msg_type, _flags, _seq, body in rtnl.iter_messages(data):
                event = decode(msg_type, body)
                if event is not None:
                    on_event(event)
    finally:
        sock.close()
