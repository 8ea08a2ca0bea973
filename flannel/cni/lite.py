"""Light stand-ins for ``json`` and ``ipaddress`` for the CNI plugin's start-up path.

Importing ``json`` pulls in ``re``, ``enum`` and ``functools`` (~11 ms per pod ADD), and
``ipaddress`` ~4 ms more. This module uses the C parts directly (``_json``'s scanner,
``_socket``'s inet_pton/inet_ntop, whose IPv6 text is RFC 5952 like Go's) and a small
encoder producing what ``json.dumps(doc, sort_keys=True, separators=(",", ":"))`` produces.
Must not touch: anything outside parsing and formatting.
"""

from __future__ import annotations

import _json
import _socket
import math

AF_INET, AF_INET6 = _socket.AF_INET, _socket.AF_INET6


class _ScanContext:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo: dict = {}

    @staticmethod
    def parse_constant(name: str) -> float:
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]


_scan = _json.make_scanner(_ScanContext())
_WHITESPACE = " \t\n\r"


def loads(data: bytes | str) -> object:
    """Decode JSON text; ValueError (like json.JSONDecodeError) when it is not JSON."""
    text = data.decode() if isinstance(data, bytes) else data
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


def dumps(value: object) -> str:
    """Compact JSON with sorted keys (how Go marshals a map)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (math.inf, -math.inf):
            raise ValueError(f"{value} is not JSON")
        return float.__repr__(value)
    if isinstance(value, dict):
        items = sorted(value.items())
        return "{" + ",".join(f"{_json.encode_basestring_ascii(str(k))}:{dumps(v)}"
                              for k, v in items) + "}"
    if isinstance(value, list | tuple):
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


def parse_cidr(text: str) -> str:
    """``addr/len`` masked to its network, in canonical text (``10.1.17.1/24`` ->
    ``10.1.17.0/24``); ValueError when it is not a CIDR."""
    address, sep, length = text.partition("/")
    if not sep or not length.isdigit() or not length.isascii():
        raise ValueError(f"{text!r} is not a CIDR such as 10.1.0.0/16")
    family, packed = parse_ip(address)
    bits = len(packed) * 8
    prefix = int(length)
    if prefix > bits:
        raise ValueError(f"{text!r}: prefix length {prefix} exceeds {bits}")
    mask = ((1 << bits) - 1) ^ ((1 << (bits - prefix)) - 1)
    network = (int.from_bytes(packed, "big") & mask).to_bytes(len(packed), "big")
    return f"{format_ip(family, network)}/{prefix}"

