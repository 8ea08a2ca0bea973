"""Stopping a helper process flanneld started (wireguard-go, charon) for ``flannelctl
cleanup``: SIGTERM, a bounded wait, then SIGKILL and a short bounded wait for it to go.

API: ``alive(pid)``, ``stop(pid, timeout, running=alive) -> bool`` (True when it is gone).
Must not touch: any process but the one named.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

#: Seconds a process has to go after SIGKILL (the kernel may first finish a system call).
KILL_WAIT = 2.0
_POLL = 0.02


def alive(pid: int) -> bool:
    """Running (a zombie, waiting for its parent to collect it, has stopped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            state = handle.read().rpartition(b")")[2].split()[:1]
    except OSError:
        return False
    return state != [b"Z"]


def _gone_by(pid: int, deadline: float, running: Callable[[int], bool]) -> bool:
    while running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL)
    return True


def stop(pid: int, timeout: float, running: Callable[[int], bool] = alive) -> bool:
    """SIGTERM ``pid``, SIGKILL it when it still runs after ``timeout`` seconds; True once
    ``running(pid)`` says it is gone (``running`` also tells it from a process that took a
    reused pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _gone_by(pid, time.monotonic() + timeout, running):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return _gone_by(pid, time.monotonic() + KILL_WAIT, running)
