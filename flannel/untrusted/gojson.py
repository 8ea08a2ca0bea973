"""Go ``encoding/json`` compatibility helpers shared by every wire-visible decoder and encoder.

Owns: case-insensitive field lookup as Go's decoder does it, JSON type names used in
error messages, and compaction of raw JSON the way Go re-emits a ``json.RawMessage``.
Must not touch: files, network, kernel.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def fold_keys(obj: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """Map JSON object members onto canonical field names, case-insensitively.

    ``fields`` maps lower-cased member names to canonical names. Unknown members are dropped,
    and when several spellings of one field appear, the last one wins, as in Go.
    """
    out: dict[str, Any] = {}
    for key, value in obj.items():
        canonical = fields.get(key.lower())
        if canonical is not None:
            out[canonical] = value
    return out


def type_name(value: Any) -> str:
    """The JSON type of a decoded value, as Go names it in unmarshal errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def shown(value: Any, limit: int = 60) -> str:
    """A JSON rendering of a decoded value for a message, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "..."


_HTML_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                 "\u2029": "\\u2029"}


def compact(raw: bytes | str) -> str:
    """Compact raw JSON exactly as Go does when it marshals a ``json.RawMessage``.

    Insignificant whitespace is removed and ``<``, ``>``, ``&``, U+2028 and U+2029 inside
    strings are escaped; numbers and member order are kept byte for byte. Raises ValueError
    when the input is not valid JSON.
    """
    text = raw.decode() if isinstance(raw, bytes) else raw
    json.loads(text)
    out: list[str] = []
    in_string = False
    escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            out.append(_HTML_ESCAPES.get(ch, ch))
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif ch not in " \t\r\n":
            out.append(ch)
    return "".join(out)


class FieldTypeError(ValueError):
    """A member of the wrong type; ``field`` is its canonical name."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def decode_fields(obj: Mapping[str, Any], spec: Mapping[str, tuple[type, Any]],
                  context: str) -> dict[str, Any]:
    """Decode a JSON object into typed fields the way Go decodes into a struct.

    ``spec`` maps canonical field names to (type, default); member names match
    case-insensitively, unknown members are ignored, null leaves the default, a wrong type
    raises FieldTypeError naming ``context`` and the field.
    """
    members = fold_keys(obj, {name.lower(): name for name in spec})
    out = {name: default for name, (_kind, default) in spec.items()}
    for name, value in members.items():
        if value is None:
            continue
        kind = spec[name][0]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise FieldTypeError(f"{context}: {name} must be an integer, got "
                                 f"{type_name(value)} {shown(value)}", name)
        if kind is not int and not isinstance(value, kind):
            raise FieldTypeError(f"{context}: {name} must be a {kind.__name__}, got "
                                 f"{type_name(value)} {shown(value)}", name)
        out[name] = value
    return out
