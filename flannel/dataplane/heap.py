"""Giving the C allocator's freed memory back to the operating system after a burst.

A snapshot of thousands of leases is decoded from one large answer and then programmed in one
pass: both leave megabytes of freed blocks in glibc's heap, which glibc keeps (it returns only
what lies at the very top of the heap) and which then count in the process's RSS for the rest
of its life. ``malloc_trim(0)`` hands every wholly free page back. Owns: when that is
possible (glibc only; musl and other C libraries return memory on their own terms and have no
such call, so elsewhere this does nothing). Must not touch: anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_trim: Callable[[int], int] | None = None
_checked = False


def _malloc_trim() -> Callable[[int], int] | None:
    global _trim, _checked
    if not _checked:
        _checked = True
        try:
            glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
        except (ValueError, OSError):  # not a name this C library knows: not glibc
            glibc = False
        if glibc:
            # Loaded only here: ctypes costs ~0.3 MiB, a trim after 5000 peers gives ~2 MiB.
            import ctypes

            _trim = ctypes.CDLL(None).malloc_trim
    return _trim


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system; whether anything could be returned
    (False where the C library offers no way). Safe from any thread: glibc locks its
    arenas."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
