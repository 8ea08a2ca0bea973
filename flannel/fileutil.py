"""Atomic file writes with explicit modes, shared by everything that writes files we own.

Owns: the temp-file + fsync + rename sequence. Must not touch: anything but the target path
and a temporary sibling of it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _make_dirs(path: Path, mode: int) -> None:
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


def write_atomic(path: str | Path, data: bytes, mode: int, dir_mode: int = 0o755) -> None:
    """Write ``data`` to ``path`` so readers see the old or the new file, never a partial one.

    The file gets exactly ``mode`` whatever the umask; missing parent directories are created
    with ``dir_mode``.
    """
    target = Path(path)
    parent = target.parent
    _make_dirs(parent, dir_mode)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(data)
            tmp.flush()
            os.fchmod(tmp.fileno(), mode)
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
