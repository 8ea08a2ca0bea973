"""Finding processes in this process's network namespace by their command line: flanneld's
(``flannelctl cleanup`` refuses while one runs; ``status``, ``doctor`` and ``bundle`` ask it)
and, for cleanup, wireguard-go's.

A module of its own so that the operator commands that only look for flanneld load nothing of
cleanup's inventory (its rule, kernel and WireGuard modules).
Must not touch: the processes (it only reads ``/proc``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def is_flanneld(cmdline: bytes) -> bool:
    argv = [arg for arg in cmdline.split(b"\0") if arg][:2]
    # Go flanneld is argv[0]; the Python console script runs as "python .../flanneld".
    return any(os.path.basename(arg) == b"flanneld" for arg in argv)


def running_flanneld(proc: Path = Path("/proc")) -> list[int]:
    """Process ids of flanneld processes in this process's network namespace."""
    return processes_here(is_flanneld, proc)


def processes_here(matches: Callable[[bytes], bool], proc: Path = Path("/proc")) -> list[int]:
    """Process ids, in this process's network namespace, whose command line matches."""
    own = os.stat(proc / "self" / "ns" / "net")
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with (entry / "cmdline").open("rb") as handle:
                cmdline = handle.read(4096)
            if not matches(cmdline):
                continue
            netns = os.stat(entry / "ns" / "net")
        except OSError:
            continue  # gone meanwhile, or not ours to inspect
        if (netns.st_dev, netns.st_ino) == (own.st_dev, own.st_ino):
            found.append(int(entry.name))
    return sorted(found)


def same_netns(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether process ``pid`` runs in this process's network namespace."""
    try:
        theirs = os.stat(proc / str(pid) / "ns" / "net")
        own = os.stat(proc / "self" / "ns" / "net")
    except OSError:
        return False
    return (theirs.st_dev, theirs.st_ino) == (own.st_dev, own.st_ino)
