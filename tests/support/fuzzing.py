"""The shape of a fuzz target, shared by the property tests and ``bench/fuzz.py``.

A target pairs a decoder with a hypothesis strategy of hostile inputs. ``run`` feeds one
input to the decoder and returns when the decoder accepted it or refused it the way it is
designed to (its own error type, a CNI error object, ...); any other exception escaping
``run`` is a crash. The property tests run a few hundred examples per target; the bench
command runs thousands and counts crashes per class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis.strategies import SearchStrategy


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
