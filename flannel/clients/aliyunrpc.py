"""Alibaba Cloud's RPC-style API, spoken with the standard library and the project's HTTP
layer (``flannel.clients.http``) instead of the official SDK (whose core needs the compiled
``cryptography``; docs/cloud.md has the measurement).

A call is ``GET /?<query>`` carrying the action, the API version, the common parameters
(``Format=JSON``, ``AccessKeyId``, ``SignatureMethod=HMAC-SHA1``, ``SignatureVersion=1.0``, a
fresh ``SignatureNonce``, an ISO 8601 UTC ``Timestamp``) and ``Signature``: HMAC-SHA1, keyed
with the secret and ``&``, over ``GET&%2F&`` and the percent-encoded canonical query (the
parameters sorted by name, RFC 3986 encoded), in base64. An answer is JSON; an error carries
``Code`` and ``Message`` (HTTP 4xx/5xx). Throttling codes raise ``Throttled`` for the
engine's retry policy. Each call has one deadline (``timeout``) for connecting, sending and
reading, and reads at most ``MAX_ANSWER`` bytes, decoded into at most ``MAX_ELEMENTS``
JSON elements. A redirect is an error like any other status (the HTTP layer follows none).
``stopper`` (the engine's) cancels a call in flight when flanneld stops. The secret is held
out of ``repr`` and never logged; no proxy from the environment is used.
Must not touch: which actions are called (the engine decides), the store, the kernel.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ssl
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import quote, urlsplit

from flannel import boundedjson
from flannel.clients.http import Connection, ProtocolError
from flannel.cloud.base import ApiError, CloudError, Stopper, Throttled
from flannel.cloud.typed import View

#: Bytes one answer may have: a route table holds at most a thousand custom entries (the
#: largest quota Alibaba Cloud grants), about 250 KiB; 8,000 fit.
MAX_ANSWER = 2 * 1024 * 1024
#: JSON elements one answer may decode into: 8,000 entries of about 12 each, and twice that.
MAX_ELEMENTS = 200_000
#: Codes that mean "slow down" (or "busy with another change to this router: try again"),
#: retried with backoff by the engine.
THROTTLING = frozenset({"Throttling", "Throttling.User", "Throttling.Api", "ServiceUnavailable",
                        "TaskConflict", "OperationConflict"})


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


class AliyunApiError(ApiError):
    def __init__(self, service: str, action: str, code: str, message: str) -> None:
        hint = ""
        if code in ("SignatureDoesNotMatch", "IncompleteSignature") or code.startswith(
                "InvalidAccessKeyId"):
            hint = " (check AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)"
        elif code == "NoPermission" or code.startswith("Forbidden"):
            hint = f" (the key's RAM policy needs the action vpc:{action})"
        elif code == "InvalidCIDRBlock.Duplicate":
            hint = (" (an entry for this destination is there, or still being deleted: the "
                    "next pass looks again)")
        super().__init__(service, action, code, message, hint)


def answer_of(service: str, action: str, status: int, body: bytes) -> View:
    """An answer's body, decoded: the object, for typed reads. Throttled, AliyunApiError
    (the API refused: ``Code`` and ``Message``, or the status) or CloudError (not a JSON
    object within the bounds)."""
    what = f"{service} {action}"
    try:
        answer = boundedjson.loads(body, what=f"the answer to {what}", max_bytes=MAX_ANSWER,
                                   max_elements=MAX_ELEMENTS)
    except ValueError as error:
        if status == 503:
            raise Throttled("ServiceUnavailable") from None
        raise CloudError(f"{what}: HTTP {status}, not a JSON answer ({error})") from None
    view = View(answer, f"the answer to {what}").obj(required=True)
    code = view.get("Code").text(100)
    if status != 200 or code:
        code = code or f"HTTP {status}"
        if code in THROTTLING:
            raise Throttled(code)
        raise AliyunApiError(service, action, code, view.get("Message").text(2048))
    return view


@dataclass(frozen=True)
class AliyunRpc:
    """One API (``endpoint``, ``version``) in one region, with one access key."""

    service: str
    endpoint: str  # scheme://host[:port]
    version: str
    region: str
    access_key_id: str
    access_key_secret: str = field(repr=False)
    timeout: float = 10.0
    stopper: Stopper = field(default_factory=Stopper, repr=False, compare=False)

    def _query(self, action: str, params: Mapping[str, str]) -> str:
        signed = {"Action": action, "Version": self.version, "RegionId": self.region,
                  "Format": "JSON", "AccessKeyId": self.access_key_id,
                  "SignatureMethod": "HMAC-SHA1", "SignatureVersion": "1.0",
                  "SignatureNonce": uuid.uuid4().hex,
                  "Timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  **params}
        return (canonical_query(signed) + "&Signature="
                + percent(signature("GET", signed, self.access_key_secret)))

    def call(self, action: str, params: Mapping[str, str]) -> View:
        """One call, blocking (for a worker thread): the decoded answer, an object, for
        typed reads. Raises ``Throttled``, ``AliyunApiError`` (the API refused) or
        ``CloudError`` (no usable answer; ``Stopped`` when flanneld stops)."""
        what = f"{self.service} {action}"
        try:
            status, body = asyncio.run(self._cut_when_stopped(self._query(action, params),
                                                              what))
        except asyncio.CancelledError:
            self.stopper.check(what)
            raise
        except TimeoutError:
            raise CloudError(f"{what}: no answer from {self.endpoint} within {self.timeout:g} "
                             "s; check the node's route to the API endpoint (Endpoint)") from None
        except (OSError, ProtocolError) as error:
            raise CloudError(f"{what}: could not talk to {self.endpoint}: {error}") from None
        return answer_of(self.service, action, status, body)

    @cached_property
    def _tls(self) -> ssl.SSLContext:
        # Once per client, not per call: building one loads the system's CA certificates
        # (~50 ms of CPU). Verification is the default's: certificate and host name.
        return ssl.create_default_context()

    async def _cut_when_stopped(self, query: str, what: str) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        def cut() -> None:
            loop.call_soon_threadsafe(task.cancel)

        with self.stopper.cutting(cut, what):
            return await self._exchange(query)

    async def _exchange(self, query: str) -> tuple[int, bytes]:
        parts = urlsplit(self.endpoint)
        secure = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if secure else 80)
        context = self._tls if secure else None
        deadline = asyncio.get_running_loop().time() + self.timeout
        connection = await Connection.open(host, port, context, host, deadline)
        try:
            connection.deadline = deadline
            await connection.send("GET", f"/?{query}", parts.netloc,
                                  {"Accept": "application/json", "User-Agent": "pyflannel"})
            head = await connection.read_head()
            return head.status, await connection.read_body(head, MAX_ANSWER)
        finally:
            connection.close()
