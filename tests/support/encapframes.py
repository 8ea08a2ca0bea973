"""Hand-made pod traffic for the encapsulation filter tests: inner UDP packets, VXLAN frames around
them, and a socket in a pod's namespace."""

from __future__ import annotations

import socket
from ipaddress import IPv4Address

from flannel.kernel.host import Host
from flannel.udp.packet import checksum

POD_PORT = 9999


VNI = 1


def inner_udp(src: str, dst: str, payload: bytes) -> bytes:
    """An IPv4 UDP packet (UDP checksum 0: none, as IPv4 allows)."""
    udp = (1234).to_bytes(2, "big") + POD_PORT.to_bytes(2, "big") + \
        (8 + len(payload)).to_bytes(2, "big") + b"\0\0" + payload
    header = bytearray(b"\x45\x00" + (20 + len(udp)).to_bytes(2, "big") + b"\0\0\0\0\x40\x11"
                       b"\0\0" + IPv4Address(src).packed + IPv4Address(dst).packed)
    header[10:12] = checksum(header).to_bytes(2, "big")
    return bytes(header) + udp


def vxlan_frame(dst_mac: str, packet: bytes) -> bytes:
    header = b"\x08\0\0\0" + VNI.to_bytes(3, "big") + b"\0"
    ethernet = bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex("020000000099") + \
        b"\x08\x00"
    return header + ethernet + packet


def pod_socket(pod_netns: str) -> socket.socket:
    with Host(pod_netns).entered():
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", POD_PORT))
    sock.settimeout(0.2)
    return sock
