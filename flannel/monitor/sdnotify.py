"""systemd readiness notification: one datagram to ``$NOTIFY_SOCKET`` (path or abstract).

Must not touch: anything but that socket.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (e.g. ``READY=1``); False when not run by systemd or it failed."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as err:
        log.warning("could not notify systemd (%s): %s", state, err)
        return False
    return True
