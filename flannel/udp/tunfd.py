"""Opening the TUN device: ``/dev/net/tun``, TUNSETIFF, TUNSETPERSIST. Standard library only,
so the forwarder process starts fast.

Must not touch: the device's addresses, MTU, routes (``flannel/udp/device.py``).
"""

from __future__ import annotations

import fcntl
import os
import struct

TUNSETIFF = 0x400454CA
TUNSETPERSIST = 0x400454CB
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
IFNAMSIZ = 16


class TunError(Exception):
    """The TUN device cannot be set up; the message says what to fix."""


def _ifreq(name: str, flags: int) -> bytes:
    raw = name.encode()
    if not raw or len(raw) >= IFNAMSIZ:
        raise TunError(f"TUN name {name!r} must have 1 to {IFNAMSIZ - 1} bytes")
    return struct.pack("16sH22x", raw, flags)


def attach(name: str, vnet_hdr: bool = True) -> int:
    """A non-blocking fd on TUN ``name``, created (persistent) if missing.

    IFF_NO_PI as Go flannel; IFF_VNET_HDR lets the forwarder write merged TCP runs as one
    GSO packet (``packet.merge_tcp``). No TUNSETOFFLOAD: the kernel keeps computing the
    checksums of what we read, so every packet we send carries a verified-correct checksum.
    """
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        raise TunError(f"cannot open /dev/net/tun for {name}: {err.strerror}; the udp backend "
                       "needs the TUN device: load the tun module (modprobe tun), and in a "
                       "container give it /dev/net/tun (privileged: true, as Go flannel's udp "
                       "backend needs, or a hostPath volume of type CharDevice)") from None
    try:
        flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if vnet_hdr else 0)
        fcntl.ioctl(fd, TUNSETIFF, _ifreq(name, flags))
        fcntl.ioctl(fd, TUNSETPERSIST, 1)
    except OSError as err:
        os.close(fd)
        raise TunError(f"cannot open TUN device {name}: {err.strerror}; is {name} another "
                       "kind of device, or is /dev/net/tun missing?") from None
    return fd
