"""Finding this node's flanneld: which process, its options, its local socket.

Owns how ``flannelctl status`` and ``doctor`` learn, without flags, what the node's flanneld
uses. The flanneld of a node is the one in the tool's network namespace (``ip netns exec
<node> flannelctl ...`` picks a lab node's); its options are read as flanneld parsed them,
from its command line and its ``FLANNELD_*`` environment (``/proc/<pid>/environ``, which
only root, or flanneld's own user, can read: credentials stay out of other users' reach).
Its files, the local socket (``flannel.monitor.localsock``) included, are reached through
``/proc/<pid>/root`` when it runs in another mount namespace (a lab node's private
``/run``, a pod), so the paths it was given mean what they mean to it.
Must not touch: the kernel, the store, the process (reads ``/proc`` only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from flannel.flags import UsageError, parse_namespace
from flannel.monitor.localsock import socket_path
from flannel.process.procscan import running_flanneld

MAX_CMDLINE = 1 << 16
MAX_ENVIRON = 1 << 20


class NotFound(Exception):
    """No single flanneld could be told apart; the message says why and what to give."""


@dataclass(frozen=True)
class Flanneld:
    """A running flanneld as this tool sees it."""

    pid: int
    #: Its options as it parsed them, by flag dest; None when they could not be read.
    flags: Mapping[str, object] | None
    #: Why ``flags`` is missing or partial (its environment unreadable); empty when whole.
    why: str
    #: Where its paths start from here: ``/`` in our mount namespace, else its root.
    root: Path
    cwd: Path

    def path(self, text: str) -> Path:
        """A path flanneld was given, as this tool reaches the same file: as it is written
        when that is the same file here (a lab directory both see), else through
        flanneld's root (its private ``/run``)."""
        path = Path(text)
        if not path.is_absolute():
            return self.cwd / path
        if self.root == Path("/"):
            return path
        theirs = self.root / path.relative_to("/")
        try:
            return path if os.path.samefile(path, theirs) else theirs
        except OSError:  # missing here, or there: only its root is sure to be flanneld's
            return theirs

    @property
    def subnet_file(self) -> str:
        return str(self.flags["subnet_file"]) if self.flags is not None else \
            "/run/flannel/subnet.env"

    @property
    def socket(self) -> Path:
        return self.path(str(socket_path(self.subnet_file)))


def _read(path: Path, limit: int) -> bytes:
    with path.open("rb") as handle:
        return handle.read(limit)


def flanneld_argv(cmdline: bytes) -> list[str]:
    """flanneld's own arguments: what follows ``flanneld`` (itself, or the script a Python
    runs) on its command line."""
    argv = [arg.decode(errors="surrogateescape") for arg in cmdline.split(b"\0")]
    if argv and argv[-1] == "":
        argv.pop()
    for index, arg in enumerate(argv[:2]):
        if os.path.basename(arg) == "flanneld":
            return argv[index + 1:]
    return argv[1:]


def _same_mount_namespace(proc: Path) -> bool:
    try:
        mine = os.stat("/proc/self/ns/mnt")
        theirs = os.stat(proc / "ns" / "mnt")
    except OSError:
        return False  # not ours to inspect: its root then refuses us as it should
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


def describe(pid: int) -> Flanneld:
    """What can be learnt of flanneld ``pid``; its options only with the right to read them."""
    proc = Path(f"/proc/{pid}")
    root, cwd = Path("/") if _same_mount_namespace(proc) else proc / "root", proc / "cwd"
    try:
        argv = flanneld_argv(_read(proc / "cmdline", MAX_CMDLINE))
    except OSError as err:
        return Flanneld(pid, None, f"flanneld (pid {pid}) could not be read: "
                        f"{err.strerror or err}", root, cwd)
    why, environ = "", {}
    try:
        raw = _read(proc / "environ", MAX_ENVIRON)
    except OSError:
        raw = b""
        why = (f"the environment of flanneld (pid {pid}) is readable by root only (its "
               "FLANNELD_* settings, credentials among them): run flannelctl as root")
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name.startswith(b"FLANNELD_"):
            environ[name.decode(errors="replace")] = value.decode(errors="surrogateescape")
    try:
        flags = vars(parse_namespace(argv, environ))
    except UsageError as err:
        return Flanneld(pid, None, f"the options of flanneld (pid {pid}) are not this "
                        f"flannelctl's: {err}", root, cwd)
    return Flanneld(pid, flags, why, root, cwd)


def find(subnet_file: str = "") -> Flanneld | None:
    """The flanneld of this network namespace (of several, the one writing ``subnet_file``,
    as it names the file or as reached from here); None if none runs; NotFound if several
    (and ``subnet_file`` picks none), or if this user may not tell."""
    pids = running_flanneld()
    if not pids and os.geteuid() != 0:
        raise NotFound("only root may see which flanneld runs in this network namespace "
                       "(and use its socket): run flannelctl as root")
    if len(pids) > 1 and subnet_file:
        named = [one for one in map(describe, pids) if one.flags is not None
                 and subnet_file in (one.subnet_file, str(one.path(one.subnet_file)))]
        if len(named) == 1:
            return named[0]
    if len(pids) > 1:
        raise NotFound(f"several flanneld processes run in this network namespace (pids "
                       f"{', '.join(map(str, pids))}): say which with --subnet-file (the "
                       "subnet.env it writes)")
    return describe(pids[0]) if pids else None
