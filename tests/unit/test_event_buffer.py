"""The kernel event socket's receive buffer: room for the largest notification, resident
only where notifications were written."""

import socket

from flannel.kernel import events


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_the_receive_buffer_is_resident_only_where_datagrams_were_written():
    """A zero-filled 1 MiB bytearray kept 1 MiB resident for the daemon's life; the mapping
    holds the pages of the datagrams received (here one of 3000 bytes: one page)."""
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with sender, receiver:
        before = _rss_kib()
        buffer = events.receive_buffer()
        try:
            assert len(buffer) == events.RECEIVE_BYTES == 1 << 20
            for fill in (b"a", b"b"):
                sender.send(fill * 3000)
                size = receiver.recv_into(buffer)
                assert size == 3000 and buffer[:size] == fill * 3000
            assert _rss_kib() - before < 256
        finally:
            buffer.close()
