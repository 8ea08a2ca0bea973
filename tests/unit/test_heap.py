"""Freed C heap handed back to the system after a burst (glibc's malloc_trim)."""

import os
import subprocess
import sys

import pytest

from flannel.dataplane import heap


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
                    reason="malloc_trim is glibc's")
def test_a_burst_of_freed_blocks_goes_back_to_the_system():
    # Blocks above pymalloc's 512 bytes come from glibc's heap; one kept after them pins
    # the heap's top, so glibc alone would keep the 32 MiB below it.
    burst = [bytes(2048) for _ in range(16384)]
    pin = bytes(2048)
    del burst
    before = _rss_kib()
    assert heap.release_free_memory()
    assert before - _rss_kib() > 16 * 1024
    del pin


_ARENAS = """
import ctypes, sys, threading
from flannel.dataplane import heap
if sys.argv[1] == "one":
    assert heap.one_arena()
def allocate():
    kept.append([bytes(4096) for _ in range(100)])  # above pymalloc's 512 bytes: glibc's
kept = []
worker = threading.Thread(target=allocate)
worker.start()
worker.join()
ctypes.CDLL(None).malloc_stats()  # "Arena N:" per arena, on stderr
"""


@pytest.mark.skipif(not (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"),
                    reason="arenas are glibc's")
def test_one_arena_keeps_a_thread_s_blocks_in_the_main_heap():
    """A thread that allocates gets an arena of its own, whose free blocks no other thread
    reuses; after ``one_arena`` it allocates from the main heap."""
    counts = {}
    for mode in ("default", "one"):
        stderr = subprocess.run([sys.executable, "-c", _ARENAS, mode], capture_output=True,
                                text=True, check=True, timeout=60).stderr
        counts[mode] = sum(line.startswith("Arena ") for line in stderr.splitlines())
    assert counts == {"default": 2, "one": 1}
