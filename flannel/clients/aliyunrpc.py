"""Alibaba Cloud's RPC-style API, spoken with the standard library and the cloud clients'
bounded exchange (``flannel.clients.fetch``) instead of the official SDK (whose core needs
the compiled ``cryptography``; docs/cloud.md has the measurement). Blocking, like every
cloud client: the engines call it from a worker thread.

A call is ``GET /?<query>`` carrying the action, the API version, the common parameters
(``Format=JSON``, ``AccessKeyId``, ``SignatureMethod=HMAC-SHA1``, ``SignatureVersion=1.0``, a
fresh ``SignatureNonce``, an ISO 8601 UTC ``Timestamp``) and ``Signature``: HMAC-SHA1, keyed
with the secret and ``&``, over ``GET&%2F&`` and the percent-encoded canonical query (the
parameters sorted by name, RFC 3986 encoded), in base64. ``call`` returns the answer's
status and body whatever they are (an error carries ``Code`` and ``Message``, HTTP 4xx/5xx):
reading them, throttling included, is the engine's (``flannel.cloud.alivpc``). Each call has
one deadline (``timeout``) for connecting, sending and reading, and reads at most
``MAX_ANSWER`` bytes; a call that gets no such answer raises ``AliyunUnreachable``. A
redirect is an answer like any other status (``fetch`` follows none). ``stopper`` (the
caller's ``Cutter``) cuts a call in flight when flanneld stops; what it raises then is
the caller's. The secret is held out of ``repr`` and never logged; no proxy from the
environment is used.
Must not touch: which actions are called and what the answers mean (the engine decides), the
stores, the engines, the kernel.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import quote

from flannel.clients.cut import Cutter
from flannel.clients.fetch import FetchFailed, fetch, opener

#: Bytes one answer may have: a route table holds at most a thousand custom entries (the
#: largest quota Alibaba Cloud grants), about 250 KiB; 8,000 fit.
MAX_ANSWER = 2 * 1024 * 1024


class AliyunUnreachable(Exception):
    """No answer within the call's deadline and bounds: the cause in words."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def percent(text: str) -> str:
    """RFC 3986 encoding, as the signature needs it (``~`` kept, space ``%20``, ``*`` ``%2A``)."""
    return quote(text, safe="-_.~")


def canonical_query(params: Mapping[str, str]) -> str:
    return "&".join(f"{percent(k)}={percent(v)}" for k, v in sorted(params.items()))


def signature(method: str, params: Mapping[str, str], secret: str) -> str:
    """The signature version 1.0 of a request with these parameters (``Signature`` excluded)."""
    to_sign = f"{method}&{percent('/')}&{percent(canonical_query(params))}"
    digest = hmac.new(f"{secret}&".encode(), to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


@dataclass(frozen=True)
class AliyunRpc:
    """One API (``endpoint``, ``version``) in one region, with one access key."""

    service: str
    endpoint: str  # scheme://host[:port]
    version: str
    region: str
    access_key_id: str
    access_key_secret: str = field(repr=False)
    timeout: float
    stopper: Cutter = field(repr=False, compare=False)

    def _query(self, action: str, params: Mapping[str, str]) -> str:
        signed = {"Action": action, "Version": self.version, "RegionId": self.region,
                  "Format": "JSON", "AccessKeyId": self.access_key_id,
                  "SignatureMethod": "HMAC-SHA1", "SignatureVersion": "1.0",
                  "SignatureNonce": uuid.uuid4().hex,
                  "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  **params}
        return (canonical_query(signed) + "&Signature="
                + percent(signature("GET", signed, self.access_key_secret)))

    def call(self, action: str, params: Mapping[str, str]) -> tuple[int, bytes]:
        """One call, blocking (for a worker thread): the answer's status and body (at most
        ``MAX_ANSWER`` bytes). Raises ``AliyunUnreachable`` when no such answer came, and
        what ``stopper`` raises when it cut the call."""
        request = urllib.request.Request(  # noqa: S310 - the opener speaks http(s) only
            f"{self.endpoint}/?{self._query(action, params)}",
            headers={"Accept": "application/json", "User-Agent": "pyflannel"})
        try:
            reply = fetch(self._director, request, timeout=self.timeout, max_bytes=MAX_ANSWER,
                          stopper=self.stopper, what=f"{self.service} {action}")
        except FetchFailed as error:
            if error.timed_out:
                raise AliyunUnreachable(f"no answer from {self.endpoint} within "
                                        f"{self.timeout:g} s", timed_out=True) from None
            raise AliyunUnreachable(f"could not talk to {self.endpoint}: {error}") from None
        return reply.status, reply.body

    @cached_property
    def _director(self) -> urllib.request.OpenerDirector:
        # Once per client, not per call: its TLS context loads the system's CA certificates
        # (~50 ms of CPU). Never through a proxy from the environment.
        return opener(proxies=False)
