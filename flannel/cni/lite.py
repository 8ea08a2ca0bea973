"""Light stand-ins for ``json`` and ``ipaddress`` for the CNI plugin's start-up path.

Importing ``json`` pulls in ``re``, ``enum`` and ``functools`` (~11 ms per pod ADD), and
``ipaddress`` ~4 ms more. This module uses the C parts directly (``_json``'s scanner,
``_socket``'s inet_pton/inet_ntop, whose IPv6 text is RFC 5952 like Go's) and a small
encoder producing what Go's ``json.Marshal`` of a decoded map produces: sorted keys, compact,
numbers as Go prints a float64 (``1400.0`` -> ``1400``), integers kept exact.
``_json`` is CPython's private module: where it is absent (a minimal Python), lacks
``make_scanner`` or ``encode_basestring_ascii``, or its scanner does not decode as this module
expects, the pure-Python scanner and encoder of ``json`` stand in (``NATIVE_SCANNER`` says
which runs), with the same bounds and refusals.
Decoding is bounded (nesting depth, digits of a number) and refuses what Go's decoder refuses
(NaN, Infinity, numbers beyond float64), always with ValueError.
Runs on Python 3.9 and later (the plugin may be launched by an older system Python).
Must not touch: anything outside parsing and formatting.
"""

from __future__ import annotations

import _socket
import sys
from collections.abc import Callable

AF_INET, AF_INET6 = _socket.AF_INET, _socket.AF_INET6
MAX_DEPTH = 64  # CNI configs nest about 5 deep; _json's scanner recurses per level
_MAX_NUMBER_CHARS = 400  # float64 tops out at 309 digits; int() of huge text is quadratic
_FLOAT_MAX = sys.float_info.max
_INF = float("inf")


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (_INF, -_INF):
        raise ValueError(f"number {text[:40]} is out of range (Go's float64)")
    return value


def _parse_int(text: str) -> int:
    if len(text) > _MAX_NUMBER_CHARS or abs(int(text)) > _FLOAT_MAX:
        raise ValueError(f"number {text[:40]}... is out of range (Go's float64)")
    return int(text)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")



class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = staticmethod(_parse_float)
    parse_int = staticmethod(_parse_int)
    parse_constant = staticmethod(_refuse_constant)
    memo: dict[str, str] = {}


_Scanner = Callable[[str, int], "tuple[object, int]"]
#: A document the scanner must decode exactly so before it is trusted.
_PROBE_TEXT = '{"a":[1,-2.5,"\\u00e9",true,null]}'
_PROBE_VALUE = {"a": [1, -2.5, "\u00e9", True, None]}


def _native_scanner() -> _Scanner | None:
    """``_json``'s C scanner, or None when it is missing or not the one this module knows."""
    try:
        from _json import make_scanner

        # typeshed types the context as a JSONDecoder; the C scanner reads only the
        # attributes _ScanContext has.
        scan: _Scanner = make_scanner(_ScanContext())  # type: ignore[arg-type]
        value, end = scan(_PROBE_TEXT, 0)
    except (ImportError, AttributeError, TypeError, ValueError, StopIteration):
        return None
    finally:
        _ScanContext.memo.clear()
    return scan if (value, end) == (_PROBE_VALUE, len(_PROBE_TEXT)) else None


def _python_scanner() -> _Scanner:
    """``json``'s pure-Python scanner, with this module's number and constant rules."""
    from json import scanner
    from json.decoder import JSONDecoder

    decoder = JSONDecoder(parse_float=_parse_float, parse_int=_parse_int,
                          parse_constant=_refuse_constant, strict=True)
    # Public in json.scanner, missing from typeshed; it clears the decoder's memo after
    # every call.
    scan: _Scanner = scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return scan


def _native_encoder() -> Callable[[str], str] | None:
    try:
        from _json import encode_basestring_ascii
    except ImportError:
        return None
    return encode_basestring_ascii if encode_basestring_ascii('\u00e9"\n') == \
        '"\\u00e9\\"\\n"' else None


def _python_encoder() -> Callable[[str], str]:
    from json.encoder import py_encode_basestring_ascii

    return py_encode_basestring_ascii


_native = _native_scanner()
NATIVE_SCANNER = _native is not None
_scan: _Scanner = _native if _native is not None else _python_scanner()
_encode_string: Callable[[str], str] = _native_encoder() or _python_encoder()
_WHITESPACE = " \t\n\r"


def check_depth(text: str, limit: int = MAX_DEPTH) -> None:
    """ValueError when arrays/objects nest deeper than ``limit`` (outside strings)."""
    if text.count("[") + text.count("{") <= limit:
        return  # cannot nest deeper: the common case costs two C-level counts
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise ValueError(f"JSON nested deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def _decode(text: str) -> object:
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as err:
        raise ValueError(f"Expecting value: char {err.value}") from None
    finally:
        _ScanContext.memo.clear()
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def loads(data: bytes | str) -> object:
    """Decode JSON text; ValueError (like json.JSONDecodeError) when it is not JSON.

    Bytes that are not UTF-8 are replaced by U+FFFD, as Go's decoder does inside strings
    (outside strings they are a syntax error either way).
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    check_depth(text)
    try:
        return _decode(text)
    except ValueError:
        raise
    except (SystemError, ImportError):
        # The scanner builds its error from json.decoder, and on some Python versions fails
        # (SystemError) when that module is not loaded yet: load it on this error path only.
        import json.decoder  # noqa: F401

        return _decode(text)


def format_float(value: float) -> str:
    """A float64 as Go's encoding/json prints it (shortest digits, ``1e+21``, ``1e-7``)."""
    if value != value or value in (_INF, -_INF):
        raise ValueError(f"{value} is not JSON")
    text = float.__repr__(value)
    sign = "-" if text.startswith("-") else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    fraction = "" if fraction == "0" and not exponent else fraction
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return f"{sign}0"
    # value == 0.<digits> * 10**point
    point = len(whole) + (int(exponent) if exponent else 0) - (len(whole + fraction)
                                                               - len(digits))
    digits = digits.rstrip("0")
    magnitude = abs(value)
    if magnitude < 1e-6 or magnitude >= 1e21:
        exp = point - 1
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}".replace("e-0", "e-")
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def dumps(value: object) -> str:
    """Compact JSON with sorted keys (how Go marshals a decoded map)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _encode_string(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{_encode_string(str(k))}:{dumps(v)}"
                              for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def parse_ip(text: str) -> tuple[int, bytes]:
    """(family, packed address); ValueError when ``text`` is not an IP address."""
    for family in (AF_INET, AF_INET6):
        try:
            return family, _socket.inet_pton(family, text)
        except (OSError, ValueError):
            continue
    raise ValueError(f"{text!r} is not an IP address")


def format_ip(family: int, packed: bytes) -> str:
    return _socket.inet_ntop(family, packed)


def canonical_ip(text: str) -> str:
    return format_ip(*parse_ip(text))


def _split_cidr(text: str) -> tuple[int, bytes, int]:
    address, sep, length = text.partition("/")
    if not sep or not length.isdigit() or not length.isascii() or len(length) > 3:
        raise ValueError(f"{text!r} is not a CIDR such as 10.1.0.0/16")
    family, packed = parse_ip(address)
    prefix = int(length)
    if prefix > len(packed) * 8:
        raise ValueError(f"{text!r}: prefix length {prefix} exceeds {len(packed) * 8}")
    return family, packed, prefix


def parse_cidr(text: str) -> str:
    """``addr/len`` masked to its network, in canonical text (``10.1.17.1/24`` ->
    ``10.1.17.0/24``); ValueError when it is not a CIDR."""
    family, packed, prefix = _split_cidr(text)
    bits = len(packed) * 8
    mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
    network = (int.from_bytes(packed, "big") & mask).to_bytes(len(packed), "big")
    return f"{format_ip(family, network)}/{prefix}"


def canonical_cidr(text: str) -> str:
    """``addr/len`` in canonical text, host bits kept (how CNI's route ``dst`` round-trips:
    ``10.96.0.5/12`` stays ``10.96.0.5/12``); ValueError when it is not a CIDR."""
    family, packed, prefix = _split_cidr(text)
    return f"{format_ip(family, packed)}/{prefix}"
