"""Frames captured on a lab link (a raw packet socket in its namespace) and the IP packets read out
of them."""

from __future__ import annotations

import socket
import threading
from ipaddress import ip_address

from flannel.kernel.host import Host

ETH_P_ALL = 0x0003


class Capture:
    """Every frame crossing the underlay namespace's interfaces (a raw AF_PACKET socket:
    tcpdump is not installed here), read by a thread until ``stop``."""

    def __init__(self, netns: str) -> None:
        with Host(netns).entered():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW,
                                      socket.htons(ETH_P_ALL))
        self.sock.settimeout(0.2)
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.frames.append(self.sock.recv(65535))
            except TimeoutError:
                continue

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        return self.frames


def ip_packet(frame: bytes) -> tuple[str, str, int, int, int] | None:
    """(source, destination, protocol, source port, destination port) of an IP frame."""
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == 0x0800:
        header = frame[14:]
        length = (header[0] & 0x0F) * 4
        proto, src, dst = header[9], header[12:16], header[16:20]
        l4 = header[length:]
    elif ethertype == 0x86DD:
        header = frame[14:]
        proto, src, dst = header[6], header[8:24], header[24:40]
        l4 = header[40:]
    else:
        return None
    sport = dport = 0
    if proto == 17 and len(l4) >= 4:
        sport, dport = int.from_bytes(l4[0:2], "big"), int.from_bytes(l4[2:4], "big")
    elif proto == 58 and l4:
        sport = l4[0]  # the ICMPv6 type
    return str(ip_address(src)), str(ip_address(dst)), proto, sport, dport
