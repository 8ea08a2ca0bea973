"""The udp forwarder process: TUN <-> UDP in a loop of its own (own process, own GIL).

Run as ``python -m flannel.udp.worker <config JSON> <control fd>`` by
``flannel/udp/forwarder.py``. Owns the TUN fd, the UDP socket, the peer table and the
counters. Talks JSON over the SOCK_SEQPACKET control socket: ``ready``/``fatal`` once at
start, then answers ``peers`` (atomic table swap) and ``status``, each answer echoing the
request's ``seq``, and obeys ``stop``; it exits when
the control socket closes, so it never outlives its parent.
Sending: burst reads from the TUN, TTL fix, consecutive same-peer same-size packets sent
with one ``sendmsg`` and UDP_SEGMENT (still one IPv4 packet per datagram on the wire).
Receiving: UDP_GRO batches split back into datagrams, TTL fix, TCP runs merged into one
GSO write (``packet.merge_tcp``); with ``peers_only``, datagrams whose source is not a
peer's public address are dropped and counted first (``drop_not_peer``).
Must not touch: the device's address, MTU and routes (``flannel/udp/device.py``).
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import sys
import time
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.kernel.host import Host
from flannel.udp.packet import (
    IPV4_HEADER,
    VNET_HDR,
    VNET_HDR_NONE,
    IOVec,
    PeerTable,
    decrement_ttl,
    net_unreachable,
    received_writes,
)
from flannel.udp.tunfd import TunError, attach

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32
SOCKET_BUFFER = 8 << 20
BURST = 64  # packets read from the TUN before sending
MAX_SEGMENTS = 64  # the kernel's UDP_MAX_SEGMENTS
GSO_BYTES = 65000  # a UDP_SEGMENT super-datagram must fit in one IPv4 packet
RECV_BURST = 16
REATTACH_INTERVAL = 0.1
POLL_ERRORS = select.POLLERR | select.POLLHUP | select.POLLNVAL
COUNTERS = ("tx_packets", "tx_bytes", "rx_packets", "rx_bytes", "tun_writes", "udp_sends",
            "drop_no_route", "drop_ttl", "drop_runt", "drop_not_ipv4", "drop_send_error",
            "drop_tun_error", "drop_not_peer", "icmp_unreachable", "tun_reattached")


class Worker:
    def __init__(self, config: dict[str, Any], control: socket.socket) -> None:
        self.tun_name: str = config["tun"]
        self.source = IPv4Address(config["source"])
        self.port: int = config["port"]
        self.mtu: int = config["mtu"]
        self.segment_send: bool = config.get("segment_send", True)
        self.gro: bool = config.get("gro", True)
        self.peers_only: bool = config.get("peers_only", False)
        self.control = control
        self.table = PeerTable({}, self.port)
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_error = ""
        self.tun = -1
        self.tun_lost_at = 0.0
        self.poller = select.poll()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for option, fallback in ((SO_RCVBUFFORCE, socket.SO_RCVBUF),
                                 (SO_SNDBUFFORCE, socket.SO_SNDBUF)):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, fallback, SOCKET_BUFFER)
        if self.gro:
            self.sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        try:
            self.sock.bind((config["bind"], self.port))
        except OSError as err:
            raise TunError(f"cannot bind UDP {config['bind']}:{self.port}: {err.strerror}; "
                           "is another flanneld or program using the port?") from None
        self.sock.setblocking(False)
        self.read_buffers = [bytearray(VNET_HDR.size + 65536) for _ in range(BURST)]
        self.recv_buffer = bytearray(65536)
        self.cmsg_space = socket.CMSG_SPACE(4)
        self._attach()
        self.poller.register(self.sock, select.POLLIN)
        self.poller.register(self.control, select.POLLIN)

    def close(self) -> None:
        if self.tun >= 0:
            os.close(self.tun)
            self.tun = -1
        self.sock.close()

    def _attach(self) -> None:
        self.tun = attach(self.tun_name)
        self.poller.register(self.tun, select.POLLIN)

    def _tun_lost(self, why: str) -> None:
        self.last_error = f"{self.tun_name}: {why}; reattaching"
        self.poller.unregister(self.tun)
        os.close(self.tun)
        self.tun = -1
        self.tun_lost_at = time.monotonic()

    def run(self) -> None:
        self._send({"op": "ready"})
        while True:
            timeout = None if self.tun >= 0 else REATTACH_INTERVAL * 1000
            for fd, events in self.poller.poll(timeout):
                if fd == self.tun:
                    if events & POLL_ERRORS:
                        self._tun_lost("device gone")
                    else:
                        self.tun_to_udp()
                elif fd == self.sock.fileno():
                    self.udp_to_tun()
                elif fd == self.control.fileno() and not self.on_control():
                    return
            if self.tun < 0 and time.monotonic() - self.tun_lost_at >= REATTACH_INTERVAL:
                try:
                    self._attach()
                    self.counters["tun_reattached"] += 1
                except TunError as err:
                    self.last_error = str(err)
                    self.tun_lost_at = time.monotonic()

    # --- control channel -------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        self.control.send(json.dumps(message).encode())

    def on_control(self) -> bool:
        raw = self.control.recv(1 << 24)
        if not raw:
            return False
        message = json.loads(raw)
        op = message.get("op")
        if op == "peers":
            self.table = PeerTable({IPv4Network(subnet): IPv4Address(ip)
                                    for subnet, ip in message["peers"]}, self.port)
            self._send({"op": "peers", "seq": message.get("seq"), "count": self.table.size})
        elif op == "status":
            times = os.times()
            self._send({"op": "status", "seq": message.get("seq"), "counters": self.counters,
                        "last_error": self.last_error, "tun_attached": self.tun >= 0,
                        "peers": self.table.size, "cpu_seconds": times.user + times.system})
        elif op == "stop":
            return False
        return True

    # --- TUN -> UDP ------------------------------------------------------------------

    def tun_to_udp(self) -> None:
        counters, table, tun = self.counters, self.table, self.tun
        group: list[memoryview] = []
        group_dest: tuple[str, int] = ("", 0)  # set with the group's first packet
        group_size = 0
        for buffer in self.read_buffers:
            try:
                length = os.readv(tun, [buffer])
            except BlockingIOError:
                break
            except OSError as err:
                self._tun_lost(f"read failed: {err.strerror}")
                break
            packet = memoryview(buffer)[VNET_HDR.size:length]
            size = len(packet)
            if size < IPV4_HEADER:
                counters["drop_runt"] += 1
                continue
            if packet[0] >> 4 != 4:
                # e.g. IPv6 router solicitations the kernel sends on the link: Go's proxy
                # would read an IPv4 destination out of the IPv6 source address.
                counters["drop_not_ipv4"] += 1
                continue
            dest = table.lookup(int.from_bytes(packet[16:20], "big"))
            if dest is None:
                counters["drop_no_route"] += 1
                reply = net_unreachable(packet, self.source)
                if reply is not None:
                    self._write_tun([VNET_HDR_NONE, reply])
                    counters["icmp_unreachable"] += 1
                continue
            if not decrement_ttl(packet):
                counters["drop_ttl"] += 1
                continue
            if group and (dest != group_dest or size > group_size
                          or len(group) >= MAX_SEGMENTS
                          or (len(group) + 1) * group_size > GSO_BYTES):
                self._send_group(group, group_dest, group_size)
                group = []
            if not group:
                group_dest, group_size = dest, size
            group.append(packet)
            if size < group_size or not self.segment_send:
                # A shorter packet can only end a UDP_SEGMENT batch.
                self._send_group(group, group_dest, group_size)
                group = []
        if group:
            self._send_group(group, group_dest, group_size)

    def _send_group(self, group: list[memoryview], dest: tuple[str, int], size: int) -> None:
        counters = self.counters
        try:
            if len(group) == 1:
                self.sock.sendto(group[0], dest)
            else:
                self.sock.sendmsg(group, [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))], 0,
                                  dest)
        except OSError as err:
            if err.errno == errno.EINVAL and len(group) > 1:
                # e.g. a segment larger than the route MTU allows: one datagram each.
                for packet in group:
                    self._send_group([packet], dest, len(packet))
                return
            counters["drop_send_error"] += len(group)
            self.last_error = f"send to {dest[0]}:{dest[1]} failed: {err.strerror}"
            return
        counters["udp_sends"] += 1
        counters["tx_packets"] += len(group)
        counters["tx_bytes"] += sum(len(p) for p in group)

    # --- UDP -> TUN ------------------------------------------------------------------

    def udp_to_tun(self) -> None:
        counters, buffer = self.counters, self.recv_buffer
        view = memoryview(buffer)
        for _ in range(RECV_BURST):
            try:
                length, ancillary, _, source = self.sock.recvmsg_into([buffer],
                                                                       self.cmsg_space)
            except BlockingIOError:
                return
            except OSError as err:  # e.g. ICMP port unreachable reported on the socket
                self.last_error = f"UDP receive: {err.strerror}"
                continue
            gro_size = 0
            for level, kind, data in ancillary:
                if level == SOL_UDP and kind == UDP_GRO and len(data) >= 4:
                    gro_size = struct.unpack("=i", data[:4])[0]
            if self.peers_only and source[0] not in self.table.sources:
                # A GRO batch comes from one source: count its datagrams.
                counters["drop_not_peer"] += -(-length // gro_size) if gro_size > 0 else 1
                continue
            writes = received_writes(view[:length], gro_size, self.gro, counters)
            counters["rx_bytes"] += length
            if self.tun < 0:
                counters["drop_tun_error"] += len(writes)
                continue
            for iovec in writes:
                self._write_tun(iovec)

    def _write_tun(self, iovec: IOVec) -> None:
        try:
            os.writev(self.tun, iovec)
            self.counters["tun_writes"] += 1
        except OSError as err:
            self.counters["drop_tun_error"] += 1
            self.last_error = f"{self.tun_name} write failed: {err.strerror}"


def main() -> int:
    config = json.loads(sys.argv[1])
    control = socket.socket(fileno=int(sys.argv[2]))
    try:
        with Host(config.get("netns")).entered():
            try:
                worker = Worker(config, control)
            except (TunError, OSError) as err:
                control.send(json.dumps({"op": "fatal", "error": str(err)}).encode())
                return 1
            try:
                worker.run()
            finally:
                worker.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent is gone: nothing left to serve
    return 0


if __name__ == "__main__":
    sys.exit(main())
