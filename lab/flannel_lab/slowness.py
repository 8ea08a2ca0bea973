"""One slowness factor for every wait of the lab (and of the tests that drive labs).

The lab waits on conditions (a subnet.env written, the full mesh, a process gone), each
bounded by a time measured on an ordinary machine. A loaded CI machine or a VM under qemu's
TCG runs the same steps many times slower: a flanneld that needs 40 s for its first lease
there is slow, not broken. ``FLANNEL_LAB_SLOWNESS`` (a number from 1 to 1000; unset: 1)
multiplies every such bound, so the conditions stay the same and only the patience grows.

Owns: reading and checking that variable, scaling a bound by it, and how a bound that ran
out is described (with the factor, so a report shows which patience was used).
Must not touch: anything else; it only reads the environment.
"""

from __future__ import annotations

import math
import os

ENV = "FLANNEL_LAB_SLOWNESS"
MAX_FACTOR = 1000.0


class SlownessError(ValueError):
    """``FLANNEL_LAB_SLOWNESS`` holds something that is not a usable factor."""


def factor() -> float:
    """The factor from the environment: 1 when unset or empty; SlownessError (naming the
    variable and what it takes) when it is not a number from 1 to 1000."""
    text = os.environ.get(ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 1.0 <= value <= MAX_FACTOR:  # NaN fails this too
        raise SlownessError(f"{ENV}={text[:40]!r}: give a number from 1 to {MAX_FACTOR:g} "
                            "(how many times slower than an ordinary machine this one runs)")
    return value


def scaled(seconds: float) -> float:
    """A bound of ``seconds`` on an ordinary machine, on this one."""
    return seconds * factor()


def within(seconds: float) -> str:
    """The scaled bound as an error message says it: ``69s``, or ``690s (69s x
    FLANNEL_LAB_SLOWNESS=10)``."""
    slowness = factor()
    if slowness == 1.0:
        return f"{seconds:g}s"
    return f"{round(seconds * slowness, 1):g}s ({seconds:g}s x {ENV}={slowness:g})"
