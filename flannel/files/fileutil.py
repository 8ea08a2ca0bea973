"""Atomic file writes with explicit modes, shared by everything that writes files we own.

Owns: the temp-file (O_EXCL|O_NOFOLLOW, explicit mode) + fsync + rename sequence, bounded
reads of files we only consume (O_NONBLOCK, regular files only), the helper processes' log
files (appended to, their tail read back), the check that no one
but root or this process's user can change what a path leads to, and the lookup of a
command on PATH (``which``: the daemon's own, so it never loads ``shutil``, which brings
bz2 and lzma along, ~1 MiB of an idle flanneld's memory).
Must not touch: anything but the target path and a temporary sibling of it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

_MAX_LINKS = 40  # the kernel's own limit on symbolic links in one lookup


def which(name: str) -> str | None:
    """The path of the executable ``name`` as the shell finds it on ``$PATH`` (``name``
    itself when it holds a slash), or None; what ``shutil.which`` answers on POSIX."""
    if os.sep in name:
        return name if _executable(name) else None
    for directory in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, name)
        if _executable(candidate):
            return candidate
    return None


def _executable(path: str) -> bool:
    return os.access(path, os.X_OK) and os.path.isfile(path)


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


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is: "a FIFO", "a directory", ..."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


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
                          f"Not a regular file but {file_kind(mode)}", str(path))
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


def open_log(path: str | Path) -> int:
    """A log file of a helper process we start, opened to append (created 0600, never
    through a symbolic link); the caller closes the descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                   0o600)


def log_tail(path: str | Path, limit: int) -> str:
    """The last ``limit`` bytes of a log file as text, stripped; "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def trusted_owner(uid: int) -> bool:
    """Root, or this process's user."""
    return uid in (0, os.geteuid())


def read_only(path: str | int) -> bool:
    """Whether the file system of this path (or open file) is mounted read-only."""
    try:
        flags = os.fstatvfs(path).f_flag if isinstance(path, int) else os.statvfs(path).f_flag
    except OSError:
        return False
    return bool(flags & os.ST_RDONLY)


def others_can_write(info: os.stat_result) -> bool:
    """Whether users other than root and the owner may write it (group root is root's)."""
    return bool(info.st_mode & 0o002 or (info.st_mode & 0o020 and info.st_gid != 0))


def unsafe_directory(directory: str, entry: str) -> str | None:
    """Why someone else could replace ``entry`` in ``directory``; None if no one can."""
    info = os.stat(directory)
    if not trusted_owner(info.st_uid):
        return f"directory {directory} is owned by uid {info.st_uid}"
    if not others_can_write(info) or read_only(directory):
        return None
    entry_owner = os.lstat(os.path.join(directory, entry)).st_uid
    if info.st_mode & stat.S_ISVTX and trusted_owner(entry_owner):
        return None  # sticky: only its owner (root or us) may replace the entry
    return (f"directory {directory} is writable by other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}): run `chmod go-w {directory}`")


def unsafe_path(path: Path) -> tuple[str | None, str]:
    """(Why someone other than root or us could change what ``path`` leads to, or None; the
    file it leads to), following the path as the kernel does: every directory passed
    through, and every symbolic link (its owner and its directory)."""
    todo = list(reversed((Path.cwd() / path).parts[1:]))
    current, links = "/", 0
    while todo:
        name = todo.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        why = unsafe_directory(current, name)
        if why is not None:
            return why, current
        candidate = os.path.join(current, name)
        info = os.lstat(candidate)
        if not stat.S_ISLNK(info.st_mode):
            current = candidate
            continue
        links += 1
        if links > _MAX_LINKS:
            return "it goes through too many symbolic links", candidate
        if not trusted_owner(info.st_uid) and not read_only(current):
            return f"symbolic link {candidate} is owned by uid {info.st_uid}", candidate
        target = os.readlink(candidate)
        if os.path.isabs(target):
            current = "/"
        todo.extend(reversed(Path(target).parts[1 if os.path.isabs(target) else 0:]))
    return None, current
