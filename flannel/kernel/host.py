"""Where flanneld acts: the one handle for "which network namespace".

flanneld programs the namespace it runs in; the lab, the tests and the benchmarks run many
nodes in one process tree and point each at a named namespace (``/run/netns/<name>``). A
``Host`` is how every module that touches the kernel or runs a tool says where: it enters the
namespace for the calling thread (sockets and ``/proc/sys/net`` opened inside stay bound to
it), writes sysctls there, and prefixes tool argv. Production code never branches on
whether it runs in a named namespace; it asks its ``Host``.

Must not touch: anything but the calling thread's namespace, and only for the duration of a
``with host.entered()`` block.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLONE_NEWNET = 0x40000000


@functools.cache
def _libc() -> Any:
    """libc for setns; ctypes is loaded on first use only, since flanneld itself runs in
    its own namespace and never enters a named one."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _get_errno() -> int:
    import ctypes

    return ctypes.get_errno()


# What `ip netns add` accepts and a path component can safely hold.
_NETNS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True)
class Host:
    """The network namespace flanneld acts in: ``netns`` None is the one it runs in."""

    netns: str | None = None

    def __post_init__(self) -> None:
        if self.netns is not None and not _NETNS_NAME.fullmatch(self.netns):
            raise ValueError(f"invalid network namespace name {self.netns!r}: use letters, "
                             "digits, '_', '.' and '-' (at most 64)")

    def __str__(self) -> str:
        return f"network namespace {self.netns}" if self.netns else "this host"

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run the block with the calling thread inside this namespace."""
        if not self.netns:
            yield
            return
        libc = _libc()
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            target = os.open(f"/run/netns/{self.netns}", os.O_RDONLY)
        except BaseException:
            os.close(own)
            raise
        try:
            if libc.setns(target, CLONE_NEWNET) != 0:
                code = _get_errno()
                raise OSError(code, f"setns into {self.netns}: {os.strerror(code)}")
            try:
                yield
            finally:
                if libc.setns(own, CLONE_NEWNET) != 0:
                    code = _get_errno()
                    raise OSError(code, f"setns back: {os.strerror(code)}")
        finally:
            os.close(own)
            os.close(target)

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` made to run inside this namespace (an argv list, never a shell line)."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def read_sysctl(self, key: str) -> str:
        """The value of ``key`` (e.g. "net/ipv6/conf/flannel.1/accept_ra") in this namespace.

        OSError (FileNotFoundError when the key does not exist) is left to the caller.
        """
        with self.entered():
            # /proc/sys/net shows the namespace of the thread that opens it.
            return _sysctl_path(key).read_text().strip()

    def write_sysctl(self, key: str, value: str) -> bool:
        """Set ``key`` to ``value`` in this namespace, writing only on change; True if written."""
        path = _sysctl_path(key)
        with self.entered():
            if path.read_text().strip() == value:
                return False
            path.write_text(value)
            return True


def _sysctl_path(key: str) -> Path:
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"invalid sysctl key {key!r}")
    return Path("/proc/sys", *parts)


#: The namespace flanneld runs in.
LOCAL = Host()
