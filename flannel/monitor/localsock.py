"""flanneld's local socket: where it is, creating it safely, reaching it.

flanneld always serves its health endpoints (``/healthz``, ``/readyz``, ``/metrics``,
``/status``) on a unix socket ``flanneld.sock`` in the directory of its subnet.env
(``/run/flannel/flanneld.sock`` by default), so that ``flannelctl`` finds it without a
health port. The socket is mode 0600 (root, or flanneld's user, only: the status tells
more than the health port does), its directory is created 0755 when missing.

Creating it: an existing socket of our user that refuses connections is a stale one from a
flanneld that ended without removing it, and is unlinked; one that answers belongs to a
live flanneld, and anything else (a file, a symlink, someone else's socket) is left alone:
both are refused with a message. Symlinks at the socket's name are never followed. Paths
longer than a unix socket address allows are reached through the directory's descriptor.
Must not touch: anything in that directory but its own socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from flannel.files.fileutil import make_dirs

SOCKET_NAME = "flanneld.sock"
SOCKET_MODE = 0o600
#: How long probing an existing socket may take.
PROBE_TIMEOUT = 1.0


class SocketError(Exception):
    """The socket cannot be created or reached; the message says why and what to do."""


def socket_path(subnet_file: str | Path) -> Path:
    """Where the flanneld that writes ``subnet_file`` listens."""
    return Path(subnet_file).parent / SOCKET_NAME


def _open_dir(directory: Path) -> int:
    return os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _via(dir_fd: int, name: str) -> str:
    """A short address for ``name`` in the directory ``dir_fd`` (any length of path)."""
    return f"/proc/self/fd/{dir_fd}/{name}"


def connect(path: Path, timeout: float) -> socket.socket:
    """A connected socket to ``path``. OSError as connect(2) has it: ENOENT (no socket),
    ECONNREFUSED (a stale socket: nobody listens), EACCES (not ours to use); ENOTSOCK when
    something else is at ``path``; EPERM when its owner is neither root nor us."""
    dir_fd = _open_dir(path.parent)
    try:
        info = os.lstat(path.name, dir_fd=dir_fd)
        if not stat.S_ISSOCK(info.st_mode):
            raise OSError(errno.ENOTSOCK, "not a socket", str(path))
        if info.st_uid not in (0, os.geteuid()):
            raise OSError(errno.EPERM, f"owned by uid {info.st_uid}, not by root",
                          str(path))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(timeout)
            sock.connect(_via(dir_fd, path.name))
        except BaseException:
            sock.close()
            raise
        return sock
    finally:
        os.close(dir_fd)


@dataclass
class LocalSocket:
    """flanneld's listening socket, and what identifies the file as ours for removal."""

    path: Path
    sock: socket.socket
    _identity: tuple[int, int]

    def remove(self) -> None:
        """Unlink the socket file if it is still the one we made."""
        with contextlib.suppress(OSError):
            dir_fd = _open_dir(self.path.parent)
            try:
                info = os.lstat(self.path.name, dir_fd=dir_fd)
                if (info.st_dev, info.st_ino) == self._identity:
                    os.unlink(self.path.name, dir_fd=dir_fd)
            finally:
                os.close(dir_fd)


def _clear_stale(dir_fd: int, path: Path) -> None:
    """Unlink a stale socket of ours at ``path``; SocketError for anything else there."""
    try:
        info = os.lstat(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.geteuid():
        raise SocketError(f"{path} exists and is not a socket of flanneld's user; "
                          "remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(_via(dir_fd, path.name))
    except ConnectionRefusedError:
        os.unlink(path.name, dir_fd=dir_fd)  # nobody listens: left by a flanneld that ended
        return
    except OSError:
        pass  # it answers slowly or oddly: someone uses it
    finally:
        probe.close()
    raise SocketError(f"another flanneld listens on {path} (is it running with the same "
                      "--subnet-file?)")


def listen(path: Path) -> LocalSocket:
    """A listening socket at ``path``, mode 0600; SocketError or OSError says why not."""
    make_dirs(path.parent, 0o755)
    dir_fd = _open_dir(path.parent)
    try:
        _clear_stale(dir_fd, path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # bind(2) never follows a symlink at the name; it fails if anything is there.
            sock.bind(_via(dir_fd, path.name))
            made = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                info = os.fstat(made)
                if not stat.S_ISSOCK(info.st_mode):
                    raise SocketError(f"{path} was replaced while it was being created")
                # No client can connect before listen(): the mode is set in time.
                os.chmod(f"/proc/self/fd/{made}", SOCKET_MODE)
            finally:
                os.close(made)
            sock.listen(64)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return LocalSocket(path, sock, (info.st_dev, info.st_ino))
    finally:
        os.close(dir_fd)
