"""The digests flanneld derives stable values with: SHA-256 (a vxlan device's VTEP MAC) and
BLAKE2b (where a node starts looking for a free subnet).

Owns taking them from CPython's own built-in implementations rather than through
``hashlib``, whose import initialises OpenSSL's digests (~0.5 MiB that every flanneld would
hold for two hashes of a few bytes at start); a build without them falls back to hashlib.
The digests are the same bytes either way.
Must not touch: anything but the bytes it is given.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

try:
    from _blake2 import blake2b as _blake2b
except ImportError:  # a build without CPython's own BLAKE2
    from hashlib import blake2b as _blake2b

#: Where CPython keeps its own SHA-256: ``_sha2`` from 3.12, ``_sha256`` before.
_SHA256_MODULES = ("_sha2", "_sha256", "hashlib")


@functools.cache  # found once: a failed import searches the path every time
def _sha256_module() -> Any:
    for name in _SHA256_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("no SHA-256 implementation (hashlib cannot be imported)")


def sha256(data: bytes) -> bytes:
    """The SHA-256 digest of ``data``."""
    digest: bytes = _sha256_module().sha256(data).digest()
    return digest


def blake2b(data: bytes, digest_size: int) -> bytes:
    """The BLAKE2b digest of ``data``, ``digest_size`` bytes long."""
    return _blake2b(data, digest_size=digest_size).digest()
