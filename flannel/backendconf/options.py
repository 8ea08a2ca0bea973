"""Decoding a network config's ``Backend`` object into a backend's typed options, as Go's
JSON decoder fills a struct (``gojson.decode_fields``), its refusals raised as
``BackendConfigError``; a wrong-typed secret (a PSK) is refused without echoing its value.
Below the import layers, beside ``backenderrors``, so the backends and their engines' option
decoders (``flannel/wireguard``, ``flannel/ipsec``, ``flannel/extension``) share it.
Must not touch: anything but the object it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flannel.backendconf.errors import BackendConfigError
from flannel.untrusted import gojson


def decode_options(backend: Mapping[str, Any], spec: Mapping[str, tuple[type, Any]],
                   context: str, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fields of ``spec`` (name -> (type, default)) read from ``backend``. A wrong type
    in a field named in ``secrets`` is refused as ``<context>: <secrets[field]>``: the usual
    message quotes the value, and a secret must never be shown."""
    try:
        return gojson.decode_fields(backend, spec, context)
    except gojson.FieldTypeError as err:
        if secrets is not None and err.field in secrets:
            raise BackendConfigError(f"{context}: {secrets[err.field]}") from None
        raise BackendConfigError(str(err)) from None
    except ValueError as err:
        raise BackendConfigError(str(err)) from None
