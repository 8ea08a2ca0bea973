"""Typed reads of a decoded cloud API answer: every field checked for the type the API
documents, and a field of another type (a string where an object is due, a number as
text, a list where a string is) refused by its path in the answer (``items[3].destRange``),
never a TypeError or AttributeError further on.

``View(answer, source)`` wraps what ``boundedjson.loads`` gave; ``view.get("items")`` a
member (absent reads as null), ``.obj()``, ``.array(limit)``, ``.text(limit)``,
``.integer()`` and ``.boolean()`` the typed value or ``AnswerError``.
Must not touch: what the values mean (the engines decide), the network.
"""

from __future__ import annotations

from typing import Any

from flannel.cloud.base import CloudError

#: Characters of a string field by default: names, links and messages are well under it.
TEXT_LIMIT = 4096


class AnswerError(CloudError):
    """An answer a field of which has the wrong type or shape; the message names it."""


def _kind(value: object) -> str:
    if value is None:
        return "missing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


class View:
    """One value of an answer and where it is."""

    __slots__ = ("path", "source", "value")

    def __init__(self, value: Any, source: str, path: str = "") -> None:
        self.value = value
        self.source = source
        self.path = path

    def _refused(self, expected: str, detail: str = "") -> AnswerError:
        where = self.path or "the answer"
        return AnswerError(f"{self.source}: {where} is {detail or _kind(self.value)}, not "
                           f"{expected}")

    @property
    def present(self) -> bool:
        return self.value is not None

    def get(self, name: str) -> View:
        """The member ``name`` (null when absent or when this is null)."""
        value = self.obj().value
        child = value.get(name) if value is not None else None
        return View(child, self.source, f"{self.path}.{name}" if self.path else name)

    def obj(self, required: bool = False) -> View:
        """This value as an object (null allowed unless ``required``)."""
        if isinstance(self.value, dict) or (self.value is None and not required):
            return self
        raise self._refused("an object")

    def array(self, limit: int, required: bool = False) -> list[View]:
        """This value's items (null reads as none unless ``required``), at most ``limit``."""
        if self.value is None and not required:
            return []
        if not isinstance(self.value, list):
            raise self._refused("an array")
        if len(self.value) > limit:
            raise self._refused(f"an array of at most {limit} items",
                                f"an array of {len(self.value)} items")
        return [View(item, self.source, f"{self.path}[{i}]") for i, item in
                enumerate(self.value)]

    def text(self, limit: int = TEXT_LIMIT, required: bool = False) -> str:
        """This value as a string ("" when null unless ``required``), at most ``limit``
        characters."""
        if self.value is None and not required:
            return ""
        if not isinstance(self.value, str):
            raise self._refused("a string")
        if len(self.value) > limit:
            raise self._refused(f"a string of at most {limit} characters",
                                f"a string of {len(self.value)} characters")
        return self.value

    def integer(self, default: int = 0, lowest: int = 0, highest: int = 2 ** 63 - 1) -> int:
        """This value as an integer in [lowest, highest] (``default`` when null). APIs that
        send 64-bit numbers as strings of digits (Compute Engine) are read too."""
        value = self.value
        if value is None:
            return default
        if isinstance(value, str) and value.isascii() and value.lstrip("-").isdigit() \
                and len(value) <= 20:
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._refused("an integer")
        if not lowest <= value <= highest:
            raise self._refused(f"an integer from {lowest} to {highest}", f"{value}")
        return value

    def number(self, default: float, lowest: float, highest: float) -> float:
        """This value as a number in [lowest, highest] (``default`` when null)."""
        value = self.value
        if value is None:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._refused("a number")
        if not lowest <= value <= highest:
            raise self._refused(f"a number from {lowest:g} to {highest:g}", f"{value:g}")
        return float(value)

    def boolean(self, default: bool = False) -> bool:
        if self.value is None:
            return default
        if not isinstance(self.value, bool):
            raise self._refused("a boolean")
        return self.value
