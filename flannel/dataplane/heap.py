"""Giving the C allocator's freed memory back to the operating system after a burst, and
keeping it in one heap.

A snapshot of thousands of leases is decoded from one large answer and then programmed in one
pass: both leave megabytes of freed blocks in glibc's heap, which glibc keeps (it returns only
what lies at the very top of the heap) and which then count in the process's RSS for the rest
of its life. ``malloc_trim(0)`` hands every wholly free page back. glibc also gives each
thread that allocates an arena of its own (the data plane's pass runs in a worker thread):
its free blocks serve no other thread, so the pass's peak is kept twice; one arena
(``mallopt(M_ARENA_MAX, 1)``) costs no contention under the GIL. Owns: when either is
possible (glibc only; musl and other C libraries return memory on their own terms and have
no such calls, so elsewhere this does nothing). Must not touch: anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable

#: glibc's mallopt parameter for the most arenas (malloc.h).
M_ARENA_MAX = -8

_trim: Callable[[int], int] | None = None
_mallopt: Callable[[int, int], int] | None = None
_checked = False


def _glibc() -> None:
    global _trim, _mallopt, _checked
    if not _checked:
        _checked = True
        try:
            glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
        except (ValueError, OSError):  # not a name this C library knows: not glibc
            glibc = False
        if glibc:
            # Loaded only here: ctypes costs ~0.3 MiB, a trim after 5000 peers gives ~2 MiB.
            import ctypes

            libc = ctypes.CDLL(None)
            _trim, _mallopt = libc.malloc_trim, libc.mallopt


def _malloc_trim() -> Callable[[int], int] | None:
    _glibc()
    return _trim


def one_arena() -> bool:
    """Keep every thread's blocks in one glibc arena; whether the C library took it (False
    where it offers no way). Before any thread allocates: an arena made is kept."""
    _glibc()
    return bool(_mallopt(M_ARENA_MAX, 1)) if _mallopt is not None else False


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system; whether anything could be returned
    (False where the C library offers no way). Safe from any thread: glibc locks its
    arenas."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
