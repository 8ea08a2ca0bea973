"""``install-conf SRC DEST``: install a CNI network config file atomically.

The command upstream's manifest and chart run in their ``install-cni`` init container (as
``/opt/bin/install-conf``, Go flannel's cmd/install_conf): SRC's bytes, unchanged, replace
DEST by a rename, so the runtime reads the old conflist or the new one, never a part; DEST
gets SRC's permission bits. SRC (usually a ConfigMap key, a symlink) is followed; DEST's
directory must exist, as upstream's; a symlink at DEST is replaced, never followed.
Owns: the argument list, the bounded read of SRC, the messages and exit codes.
Must not touch: anything but DEST and its temporary sibling.
"""

from __future__ import annotations

import os
import stat
import sys

from flannel.files.fileutil import write_atomic

MAX_CONF = 1024 * 1024  # a conflist is a few hundred bytes


class InstallError(Exception):
    """SRC or DEST cannot be used; the message says why and what to give instead."""


def read_source(src: str) -> tuple[bytes, int]:
    """SRC's bytes and permission bits; a FIFO or device there is refused, never blocks."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InstallError(f"cannot open it: {err.strerror}; give the CNI config file, "
                           "such as the ConfigMap's cni-conf.json") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InstallError("not a regular file; give the CNI config file, such as the "
                           "ConfigMap's cni-conf.json")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(MAX_CONF + 1)
        except OSError as err:
            raise InstallError(f"cannot read it: {err.strerror}") from None
    if len(data) > MAX_CONF:
        raise InstallError(f"larger than {MAX_CONF} bytes: not a CNI config file")
    return data, stat.S_IMODE(st.st_mode) & 0o777


def install(src: str, dest: str) -> None:
    data, mode = read_source(src)
    directory = os.path.dirname(dest) or "."
    if not os.path.isdir(directory):
        raise InstallError(f"{directory} is not a directory; mount the host's CNI config "
                           "directory there")
    try:
        write_atomic(dest, data, mode=mode)
    except OSError as err:
        raise InstallError(f"cannot write {dest}: {err.strerror or err}") from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        # Named as invoked, as upstream's: /opt/bin/install-conf in the image.
        print(f"usage: {sys.argv[0] or 'install-conf'} <src> <dest>", file=sys.stderr)
        return 1
    try:
        install(args[0], args[1])
    except InstallError as err:
        print(f'error installing "{args[0]}": {err}', file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
