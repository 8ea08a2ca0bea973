"""Atomic file writes with explicit modes, shared by everything that writes files we own.

Owns: the temp-file (O_EXCL|O_NOFOLLOW, explicit mode) + fsync + rename sequence, and
bounded reads of files we only consume.
Must not touch: anything but the target path and a temporary sibling of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path


def make_dirs(path: Path, mode: int) -> None:
    """Create missing directories with exactly ``mode`` (mkdir alone is subject to umask)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=mode)
        except FileExistsError:
            continue
        os.chmod(directory, mode)


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _create_temp(dir_fd: int, name: str, mode: int) -> tuple[int, str]:
    """A fresh temp file next to ``name``, created by us (O_EXCL: never an existing file or
    a planted symlink), with exactly ``mode``."""
    for _ in range(100):
        tmp_name = f".{name}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp_name, _TEMP_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            continue
        return fd, tmp_name
    raise FileExistsError(f"no free temporary name for {name}")


def write_atomic(path: str | Path, data: bytes, mode: int, dir_mode: int = 0o755) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never a partial one.

    The file gets exactly ``mode`` whatever the umask; missing parent directories are created
    with ``dir_mode``. The temp file is created O_EXCL|O_NOFOLLOW in the target directory and
    renamed over ``path``: a symlink at ``path`` is replaced, never followed. The temp file is
    removed on every failure.
    """
    target = Path(path)
    parent = target.parent
    make_dirs(parent, dir_mode)
    dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd, tmp_name = _create_temp(dir_fd, target.name, mode)
        try:
            with os.fdopen(fd, "wb") as tmp:
                tmp.write(data)
                tmp.flush()
                os.fchmod(tmp.fileno(), mode)
                os.fsync(tmp.fileno())
            os.replace(tmp_name, target.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_head(path: str | Path, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of a regular file and whether it holds more; OSError otherwise.

    O_NONBLOCK keeps a FIFO planted at the path from blocking the caller.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
            raise OSError(code, "Is a directory" if code == errno.EISDIR else
                          "Not a regular file", str(path))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit
