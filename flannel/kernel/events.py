"""Netlink notifications: the kernel telling us a route, neighbour, address or link changed.

Owns an event socket (separate from the request socket, as rtnetlink requires) subscribed to
link, address, neighbour and route groups, decoding of those events, skipping undecoded the
notifications of changes made through the caller's own request socket (the kernel stamps a
route or neighbour notification with the port id of the socket whose request caused it; a
socket filter drops them in the kernel, a check here catches those queued before it), and
overrun detection (ENOBUFS means events were lost, so the caller must resync in full).
Must not touch: kernel state (it only listens).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import logging
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

from flannel.kernel import rtnl
from flannel.kernel.host import LOCAL, Host

log = logging.getLogger(__name__)

#: Datagrams read per wake-up of the event loop, at most.
DRAIN = 256
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


SO_ATTACH_FILTER, SO_DETACH_FILTER = 26, 27
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_NLMSG_PID_OFFSET = 12


def _drop_port(sock: socket.socket, port: int) -> None:
    """Make the kernel drop notifications whose sender port is ``port`` (0: keep all, since
    the kernel's own notifications, vxlan's FDB ones included, carry port 0). A classic BPF
    program on the first message header of each datagram (a notification is a datagram of
    its own); it loads in network byte order, so the port is compared byte-swapped."""
    if not port:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
        return
    swapped = int.from_bytes(port.to_bytes(4, sys.byteorder, signed=port < 0), "big")
    program = struct.pack("=" + "HBBI" * 4,
                          _BPF_LD_W_ABS, 0, 0, _NLMSG_PID_OFFSET,
                          _BPF_JEQ_K, 0, 1, swapped,
                          _BPF_RET_K, 0, 0, 0,  # ours: drop
                          _BPF_RET_K, 0, 0, 0xFFFFFFFF)  # anything else: keep
    # The kernel copies the program during setsockopt; ``code`` only has to outlive the call.
    code = array.array("B", program)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                    struct.pack("HP", 4, code.buffer_info()[0]))


async def watch(on_event: Callable[[KernelEvent], None], on_overrun: Callable[[], None],
                host: Host = LOCAL, own_port: Callable[[], int] | None = None) -> None:
    """Deliver kernel events until cancelled; call ``on_overrun`` when some were lost.

    ``own_port()`` is the port id of the caller's request socket (0 when none is open):
    notifications of its own changes are not drift, and a snapshot of 5000 peers makes
    15,000 of them, so they are dropped before decoding.
    """
    sock = rtnl.open_socket(host, groups=GROUPS, rcvbuf=16 << 20)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    # Every notification is a datagram of its own (a snapshot of 5000 peers queues 15,000):
    # once the socket is readable, up to DRAIN of them are read without going back through
    # the loop, into one buffer allocated once.
    buffer = bytearray(1 << 20)
    view = memoryview(buffer)

    def deliver(size: int) -> None:
        own = own_port() if own_port is not None else 0
        for msg_type, port, body in rtnl.iter_notifications(bytes(view[:size])):
            if own and port == own:
                continue
            event = decode(msg_type, body)
            if event is not None:
                on_event(event)

    filtered = 0
    try:
        while True:
            # The kernel drops our own changes' notifications before they are queued; the
            # filter follows the request socket (a new one after a failed pass).
            own = own_port() if own_port is not None else 0
            if own != filtered:
                _drop_port(sock, own)
                filtered = own
            try:
                deliver(await loop.sock_recv_into(sock, buffer))
                for _ in range(DRAIN - 1):
                    try:
                        size = sock.recv_into(buffer)
                    except BlockingIOError:
                        break
                    deliver(size)
            except OSError as err:
                if err.errno != errno.ENOBUFS:
                    raise
                log.warning("netlink event buffer overrun: events were lost; resyncing")
                on_overrun()
    finally:
        view.release()
        sock.close()
