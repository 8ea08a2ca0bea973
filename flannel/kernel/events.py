"""Netlink notifications: the kernel telling us a route, neighbour, address or link changed.

Owns an event socket (separate from the request socket, as rtnetlink requires) subscribed to
link, address, neighbour and route groups, decoding of those events, skipping undecoded the
notifications of changes made through the caller's own request socket (the kernel stamps a
route or neighbour notification with the port id of the socket whose request caused it; a
socket filter drops them in the kernel, a check here catches those queued before it), the
same filter dropping neighbour and FDB notifications of devices that are not the caller's
and routes of other tables than main, and overrun detection (ENOBUFS means events were
lost, so the caller must resync in full).
Must not touch: kernel state (it only listens).
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import mmap
import socket
import struct
import sys
import threading
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


SO_ATTACH_FILTER = 26
_BPF_LD_W_ABS, _BPF_LD_H_ABS, _BPF_LD_B_ABS = 0x20, 0x28, 0x30
_BPF_JEQ_K, _BPF_RET_K = 0x15, 0x06
_KEEP, _DROP = 0xFFFFFFFF, 0
_TYPE_OFFSET, _PID_OFFSET = 4, 12
#: Where a neighbour message's ndm_ifindex and a route message's rtm_table sit.
_IFINDEX_OFFSET, _TABLE_OFFSET = 20, 20
#: Beyond this many devices every neighbour notification is kept (jumps are 8-bit).
MAX_FILTERED_DEVICES = 64


def _net_order(value: int, size: int) -> int:
    """``value`` as a classic BPF load (network byte order) reads it from a host-order
    field of ``size`` bytes."""
    return int.from_bytes(value.to_bytes(size, sys.byteorder, signed=value < 0), "big")


def filter_program(port: int, devices: frozenset[int] | None) -> bytes:
    """A classic BPF program on the first message of each datagram (a notification is a
    datagram of its own) that drops, before they are queued: notifications whose sender port
    is ``port`` (0: none; the kernel's own, vxlan's FDB ones included, carry port 0),
    neighbour and FDB notifications of devices not in ``devices`` (None: keep them all),
    and route notifications of tables other than main."""
    code: list[tuple[int, str, str, int]] = []  # (opcode, jump if true, if false, k)
    if port:
        code += [(_BPF_LD_W_ABS, "", "", _PID_OFFSET),
                 (_BPF_JEQ_K, "drop", "", _net_order(port, 4))]
    code += [(_BPF_LD_H_ABS, "", "", _TYPE_OFFSET)]
    code += [(_BPF_JEQ_K, "neigh", "", _net_order(t, 2))
             for t in (rtnl.RTM_NEWNEIGH, rtnl.RTM_DELNEIGH)]
    code += [(_BPF_JEQ_K, "route", "", _net_order(t, 2))
             for t in (rtnl.RTM_NEWROUTE, rtnl.RTM_DELROUTE)]
    code += [(_BPF_RET_K, "", "", _KEEP),
             (_BPF_LD_B_ABS, "route", "", _TABLE_OFFSET),
             (_BPF_JEQ_K, "keep", "drop", rtnl.RT_TABLE_MAIN)]
    if devices is None or len(devices) > MAX_FILTERED_DEVICES:
        code += [(_BPF_RET_K, "neigh", "", _KEEP)]
    else:
        code += [(_BPF_LD_W_ABS, "neigh", "", _IFINDEX_OFFSET)]
        code += [(_BPF_JEQ_K, "keep", "", _net_order(index, 4)) for index in sorted(devices)]
        code += [(_BPF_RET_K, "", "", _DROP)]
    code += [(_BPF_RET_K, "keep", "", _KEEP), (_BPF_RET_K, "drop", "", _DROP)]
    # A label names the instruction that carries it in its first jump slot when that
    # instruction is a load or a return (which have no jumps).
    labels = {jt: i for i, (op, jt, _jf, _k) in enumerate(code)
              if jt and op in (_BPF_LD_W_ABS, _BPF_LD_H_ABS, _BPF_LD_B_ABS, _BPF_RET_K)}
    program = b""
    for i, (op, jt, jf, k) in enumerate(code):
        if op == _BPF_JEQ_K:
            program += struct.pack("=HBBI", op, labels[jt] - i - 1 if jt else 0,
                                   labels[jf] - i - 1 if jf else 0, k)
        else:
            program += struct.pack("=HBBI", op, 0, 0, k)
    return program


class EventFilter:
    """What the kernel keeps out of event sockets (see ``filter_program``): the port id of
    the caller's request socket, and the devices whose neighbours and FDB entries matter
    (None: all). Thread-safe: a data plane's worker thread updates it while a watch on the
    event loop has it on its socket; an update reaches attached sockets at once."""

    def __init__(self, port: int = 0, devices: frozenset[int] | None = None) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.port = port
        self.devices = devices

    def set_port(self, port: int) -> None:
        with self._lock:
            self.port = port
            self._reattach()

    def set_devices(self, devices: frozenset[int] | None) -> None:
        with self._lock:
            self.devices = devices
            self._reattach()

    def _reattach(self) -> None:
        for sock in self._sockets:
            self._attach(sock)

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            self._attach(sock)

    def detach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.remove(sock)

    def _attach(self, sock: socket.socket) -> None:
        program = filter_program(self.port, self.devices)
        # The kernel copies the program during setsockopt; ``code`` only has to outlive it.
        code = array.array("B", program)
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                        struct.pack("HP", len(program) // 8, code.buffer_info()[0]))


#: Room for the largest notification a datagram may carry.
RECEIVE_BYTES = 1 << 20


def receive_buffer() -> mmap.mmap:
    """The event socket's receive buffer: an anonymous mapping, so only the pages the
    largest notification so far has written are resident (a notification is a few hundred
    bytes; a zero-filled ``bytearray`` of the same room kept 1 MiB resident for life)."""
    return mmap.mmap(-1, RECEIVE_BYTES)


async def watch(on_event: Callable[[KernelEvent], None], on_overrun: Callable[[], None],
                host: Host = LOCAL, interest: EventFilter | None = None) -> None:
    """Deliver kernel events until cancelled; call ``on_overrun`` when some were lost.

    ``interest`` keeps out, in the kernel, what the caller never needs: the notifications
    of its own request socket's changes (a snapshot of 5000 peers makes 15,000) and those of
    other devices' neighbours and FDB entries (a bridge learning from a MAC flood, an
    ARP-flooded underlay), which would otherwise cost a decode each and overrun the buffer.
    """
    interest = interest or EventFilter()
    sock = rtnl.open_socket(host, groups=GROUPS, rcvbuf=16 << 20)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    # Every notification is a datagram of its own (a snapshot of 5000 peers queues 15,000):
    # once the socket is readable, up to DRAIN of them are read without going back through
    # the loop, into one buffer allocated once.
    buffer = receive_buffer()
    view = memoryview(buffer)

    def deliver(size: int) -> None:
        own = interest.port
        for msg_type, port, body in rtnl.iter_notifications(bytes(view[:size])):
            if own and port == own:
                continue
            event = decode(msg_type, body)
            if event is not None:
                on_event(event)

    try:
        interest.attach(sock)
    except BaseException:
        sock.close()
        raise
    try:
        while True:
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
        interest.detach(sock)
        view.release()
        buffer.close()
        sock.close()
