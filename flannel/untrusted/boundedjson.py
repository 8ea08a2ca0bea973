"""Bounded JSON decoding for everything flanneld reads from the store or a file.

``json.loads`` recurses once per nesting level: about 1000 levels raise RecursionError and
deeper input can exhaust the C stack. Every decoder of untrusted JSON calls ``loads`` here,
which checks the size, pre-scans the nesting depth (strings and escapes respected) and only
then hands the text to ``json``. A caller may also bound the elements a document decodes to
(``max_elements``): an answer of many tiny elements (``[[],[],...]``) costs some twenty
times its size once decoded, so its bytes alone do not bound its memory. NaN, Infinity and
numbers beyond float range are refused, as Go's decoder refuses them. Owns: the limits and
their messages. Must not touch: files, the store, the kernel.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

#: Nesting depth allowed in any decoded document; real configs and leases use 3 or fewer.
MAX_DEPTH = 32
#: Size of one lease value or node annotation value.
MAX_LEASE_BYTES = 64 * 1024
#: Size of a network configuration (etcd key or net-conf.json).
MAX_CONFIG_BYTES = 1024 * 1024

# A whole string (closed, or running to the end when unterminated, so a scan never restarts
# inside it). The scan works on UTF-8 bytes: brackets and quotes are ASCII, and no byte of a
# multi-byte sequence can be mistaken for them.
_STRINGS = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))
# Openers as "(", closers as ")": an innermost pair, whatever its kinds, is then "()".
_PAIRS = bytes.maketrans(b"[{]}", b"(())")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JSONLimitError(ValueError):
    """The input is not JSON, or is JSON beyond the size or depth limits."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)


def _size(raw: bytes | str, max_bytes: int) -> int:
    if isinstance(raw, bytes):
        return len(raw)
    # A character is at most 4 bytes of UTF-8: encode only when that could matter.
    if len(raw) * 4 <= max_bytes:
        return len(raw)
    return len(raw.encode("utf-8", "surrogatepass"))


def _brackets(text: str) -> bytes:
    """The brackets of ``text`` outside its strings. Built a piece at a time: ``re.sub``
    would hold an object per string at once (tens of MiB for a megabyte of ``""``)."""
    raw = text.encode("utf-8", "surrogatepass")
    if b'"' not in raw:
        return raw.translate(None, _NOT_BRACKETS)
    brackets = bytearray()
    at = 0
    for match in _STRINGS.finditer(raw):
        start, end = match.span()
        brackets += raw[at:start].translate(None, _NOT_BRACKETS)
        at = end
    brackets += raw[at:].translate(None, _NOT_BRACKETS)
    return bytes(brackets)


def nesting_depth(text: str) -> int:
    """How deep arrays/objects nest, brackets inside strings ignored.

    Exact for valid JSON; for invalid JSON at least the depth ``json`` would recurse to before
    it finds the error (a stray closer only ever ends the parse).
    """
    return max(accumulate(map(_STEP.__getitem__, _brackets(text))), default=0)


def nests_deeper_than(text: str, max_depth: int) -> bool:
    """``nesting_depth(text) > max_depth``, fast for the usual shallow document: removing
    the innermost pairs ``max_depth`` times empties any balanced one that is within the
    limit; anything left over is measured exactly."""
    brackets = _brackets(text)
    reduced = brackets.translate(_PAIRS)
    for _ in range(max_depth):
        # One pass of bytes.replace, no object per pair (re.subn held one for each: 50 MiB
        # for a megabyte of {}); the pairs it leaves behind wait for the next round.
        inner = reduced.replace(b"()", b"")
        if not inner:
            return False
        if len(inner) == len(reduced):
            break
        reduced = inner
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > max_depth


def element_bound(raw: bytes | str) -> int:
    """At least the number of values and object members ``raw`` decodes to, counted without
    decoding: every one but the first of a container follows a comma, and every container
    opens with a bracket. Separators inside strings count too, so it never undercounts."""
    if isinstance(raw, str):
        return raw.count(",") + raw.count("[") + raw.count("{") + 1
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1


def more_elements_than(raw: bytes | str, limit: int) -> bool:
    """``element_bound(raw) > limit``, without counting when ``raw`` is too short to hold
    that many (the bound is at most its length plus one): a kubelet's Node is 15 KB against
    a bound of 100,000, and three counts over it cost more than decoding its metadata."""
    return len(raw) >= limit and element_bound(raw) > limit


def loads(raw: bytes | str, *, what: str, max_bytes: int,
          max_depth: int | None = MAX_DEPTH, max_elements: int | None = None) -> Any:
    """Decode JSON within limits; JSONLimitError names ``what`` and the limit it broke.

    Bytes are UTF-8; invalid sequences become U+FFFD as Go's decoder does inside strings.
    ``max_depth=None`` skips the pre-scan (it costs more than decoding a large document):
    nesting is then bounded only by the decoder's recursion guard, whose RecursionError is
    refused like any other limit. Only for callers that keep nothing nested of the result
    (the Kubernetes client's node views). ``max_elements`` bounds ``element_bound(raw)``.
    """
    text = _checked_text(raw, what, max_bytes, max_depth, max_elements)
    return _decoding(what, _DECODER.decode, text)


def loads_each(raw: bytes | str, member: str, each: Callable[[Any], Any], *, what: str,
               max_bytes: int, max_elements: int | None = None) -> Any:
    """``loads`` with ``max_depth=None`` for a JSON object holding one large array
    ``member`` (a page of a listing: its ``items``): that array's elements are decoded one at
    a time, each handed to ``each`` as soon as it is decoded, and the array becomes the list
    of what ``each`` returned. Only one element is ever alive in its decoded form (a page of
    100 Nodes decodes to 6 MB; what a caller keeps of them, a few KB). A document of another
    shape (not an object, ``member`` not an array) decodes whole, as ``loads`` would; the
    caller judges its shape. ``each`` may have seen some elements when a later one turns out
    not to be JSON."""
    text = _checked_text(raw, what, max_bytes, None, max_elements)
    try:
        return _decoding(what, lambda text: _object_each(text, member, each), text)
    except _Raised as carried:
        assert carried.__cause__ is not None
        raise carried.__cause__ from None  # ``each``'s own error, not the document's


class _Raised(Exception):
    """Carries an error ``each`` raised past the decoding's handling of its own errors."""


def _checked_text(raw: bytes | str, what: str, max_bytes: int, max_depth: int | None,
                  max_elements: int | None) -> str:
    """``raw`` as text, once its size, elements and (``max_depth``) nesting are within
    their limits; JSONLimitError otherwise."""
    size = _size(raw, max_bytes)
    if size > max_bytes:
        raise JSONLimitError(f"{what} is larger than the limit of {max_bytes} bytes")
    if max_elements is not None and more_elements_than(raw, max_elements):
        raise JSONLimitError(f"{what} has more JSON elements than the limit of "
                             f"{max_elements}")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    # Fewer openers than the limit cannot nest deeper: skip the scan (the common case).
    if max_depth is not None and text.count("[") + text.count("{") > max_depth and \
            nests_deeper_than(text, max_depth):
        raise JSONLimitError(f"{what} nests JSON deeper than the limit of {max_depth} levels")
    return text


def _decoding(what: str, decode: Callable[[str], Any], text: str) -> Any:
    try:
        return decode(text)
    except RecursionError:
        raise JSONLimitError(f"{what} nests JSON deeper than the decoder's recursion "
                             "limit") from None
    except ValueError as err:
        # Also int() refusing more than sys.get_int_max_str_digits() digits.
        raise JSONLimitError(f"{what} is not valid JSON: {err}") from None


_SPACE = re.compile(r"[ \t\n\r]*")


def skip_space(text: str, at: int) -> int:
    """The index of the first character at or after ``at`` that is not JSON whitespace."""
    end = _SPACE.match(text, at)
    assert end is not None  # the pattern matches the empty string
    return end.end()


def _object_each(text: str, member: str, each: Callable[[Any], Any]) -> Any:
    """The top-level object of ``text``, its ``member`` array decoded an element at a time
    through ``each`` (the C decoder does every value; this only walks the outer object)."""
    at = skip_space(text, 0)
    if not text.startswith("{", at):
        return _DECODER.decode(text)
    doc: dict[str, Any] = {}
    at = skip_space(text, at + 1)
    if text.startswith("}", at):
        at += 1
    else:
        while True:
            if not text.startswith('"', at):
                raise json.JSONDecodeError("Expecting property name enclosed in double "
                                           "quotes", text, at)
            key, at = _DECODER.raw_decode(text, at)  # a string: it starts with a quote
            at = skip_space(text, at)
            if not text.startswith(":", at):
                raise json.JSONDecodeError("Expecting ':' delimiter", text, at)
            at = skip_space(text, at + 1)
            if key == member and text.startswith("[", at):
                doc[key], at = _array_each(text, at + 1, each)
            else:
                doc[key], at = _DECODER.raw_decode(text, at)
            at = skip_space(text, at)
            if text.startswith("}", at):
                at += 1
                break
            if not text.startswith(",", at):
                raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
            at = skip_space(text, at + 1)
    if skip_space(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)
    return doc


def _array_each(text: str, at: int, each: Callable[[Any], Any]) -> tuple[list[Any], int]:
    """The array whose first element (or end) is at or after ``at``, each element passed
    through ``each`` as soon as it is decoded; and where the array ends."""
    kept: list[Any] = []
    at = skip_space(text, at)
    if text.startswith("]", at):
        return kept, at + 1
    while True:
        value, at = _DECODER.raw_decode(text, at)
        try:
            kept.append(each(value))
        except (ValueError, RecursionError) as err:
            raise _Raised from err
        del value  # before the next element is decoded
        at = skip_space(text, at)
        if text.startswith("]", at):
            return kept, at + 1
        if not text.startswith(",", at):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
        at = skip_space(text, at + 1)
