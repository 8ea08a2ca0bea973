"""The shape of a fuzz target, shared by the property tests and ``bench/fuzz.py``.

A target pairs a decoder with a hypothesis strategy of hostile inputs. ``run`` feeds one
input to the decoder and returns when the decoder accepted it or refused it the way it is
designed to (its own error type, a CNI error object, ...); any other exception escaping
``run`` is a crash. The property tests run a hundred to a few hundred examples per target (a
fifth of that in the fast lane, see ``examples``); the bench command runs thousands and counts
crashes per class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis.strategies import SearchStrategy

#: Divides every property test's examples: 1 in the whole run, FAST_LANE_SHARE in a run of
#: the fast lane (tests/conftest.py sets it before the test modules are collected).
FAST_LANE_SHARE = 5
_divisor = 1


def fast_lane() -> None:
    """Let each property test run a fifth of its examples: the fast lane is a quick check;
    the whole run (what CI runs) keeps them all."""
    global _divisor
    _divisor = FAST_LANE_SHARE


def examples(whole_run: int) -> int:
    """How many examples a property test that runs ``whole_run`` in the whole run runs now."""
    return max(20, whole_run // _divisor)


@dataclass(frozen=True)
class FuzzTarget:
    name: str
    inputs: SearchStrategy[Any]
    run: Callable[[Any], None]


def crash_class(err: BaseException) -> str:
    """A crash's class for counting: the exception type and where it was raised."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else "?"
    return f"{type(err).__name__} at {where}"
