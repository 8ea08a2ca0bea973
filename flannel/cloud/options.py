"""The backend options the cloud engines read alike: string members (named the way Go's JSON
decoder matches them), an access key pair from the config or the environment (as Go flannel's
ali-vpc and tencent-vpc took it, with Go's message when neither has it), and a service's URL.

Must not touch: anything but the options and the environment it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from flannel.backendconf.errors import BackendConfigError
from flannel.untrusted import gojson

#: The longest access key ID or secret taken.
MAX_SECRET = 256
#: The options of the engines signing with an access key (ali-vpc, tencent-vpc).
KEY_OPTIONS = {"accesskeyid": "AccessKeyID", "accesskeysecret": "AccessKeySecret",
               "endpoint": "Endpoint", "metadataurl": "MetadataURL"}


def string_members(backend: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, str]:
    """``backend``'s members named in ``fields`` (folded name -> Go's name), each a string."""
    members = gojson.fold_keys(backend, fields)
    for name, value in members.items():
        if not isinstance(value, str):
            raise BackendConfigError(f"Backend.{name} must be a string, not a "
                                     f"{gojson.type_name(value)}")
    return members


def access_key(members: Mapping[str, str], environ: Mapping[str, str],
               cloud: str) -> tuple[str, str]:
    """The key ID and secret: ``AccessKeyID``/``AccessKeySecret`` when both are set, else
    (as Go) both from ``ACCESS_KEY_ID``/``ACCESS_KEY_SECRET``; bounded and printable."""
    key_id, secret = members.get("AccessKeyID", ""), members.get("AccessKeySecret", "")
    if not key_id or not secret:
        key_id = environ.get("ACCESS_KEY_ID", "")
        secret = environ.get("ACCESS_KEY_SECRET", "")
    if not key_id or not secret:
        raise BackendConfigError("ACCESS_KEY_ID and ACCESS_KEY_SECRET must be provided! (set "
                                 "Backend.AccessKeyID and Backend.AccessKeySecret, or the "
                                 "ACCESS_KEY_ID and ACCESS_KEY_SECRET environment variables)")
    if (len(key_id) > MAX_SECRET or len(secret) > MAX_SECRET or not key_id.isprintable()
            or not secret.isprintable()):
        raise BackendConfigError(f"the {cloud} access key is malformed (too long or not "
                                 "printable); check AccessKeyID/AccessKeySecret")
    return key_id, secret


def endpoint_url(name: str, value: str, schemes: tuple[str, ...],
                 named: tuple[str, ...] | None = None) -> str:
    """``value`` checked as a bare ``scheme://host[:port]`` URL ("" stays ""). A refusal
    names the forms of ``named`` (default: every scheme taken)."""
    if not value:
        return ""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError when the port is not a number
    except ValueError:
        parts = None
    if (parts is None or len(value) > 256 or parts.scheme not in schemes or not parts.hostname
            or parts.username is not None or parts.path not in ("", "/") or parts.query
            or parts.fragment):
        raise BackendConfigError(f"Backend.{name}: {value[:80]!r} is not a URL of the form "
                                 f"{' or '.join(s + '://host[:port]' for s in named or schemes)}")
    return f"{parts.scheme}://{parts.netloc}"
