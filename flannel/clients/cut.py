"""What a blocking client asks of its caller to be cut short when flanneld stops.

``Cutter`` is the caller's side (the cloud engines' ``Stopper`` is one): ``cutting(cut,
what)`` calls ``cut()`` from another thread if the caller stops while the block runs, and
``check(what)`` raises once it has. What either raises is the caller's own: the clients let
it through, knowing nothing of it.
Must not touch: anything; declarations only.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol


class Cutter(Protocol):
    def check(self, what: str) -> None:
        """Raise (the caller's error) if the caller has stopped."""

    def cutting(self, cut: Callable[[], None], what: str) -> AbstractContextManager[None]:
        """``cut()`` is called if the caller stops while the block runs; raises (the
        caller's error) at once if it already has."""
