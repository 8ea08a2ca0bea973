"""Freed C heap handed back to the system after a burst (glibc's malloc_trim)."""

import os

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
