"""Alibaba Cloud's RPC-style API, spoken with the standard library and the project's HTTP
layer (``flannel.clients.http``) instead of the official SDK (whose core needs the compiled
``cryptography``; docs/cloud.md has the measurement).

A call is ``GET /?<query>`` carrying the action, the API version, the common parameters
(``Format=JSON``, ``AccessKeyId``, ``SignatureMethod=HMAC-SHA1``, ``SignatureVersion=1.0``, a
fresh ``SignatureNonce``, an ISO 8601 UTC ``Timestamp``) and ``Signature``: HMAC-SHA1, keyed
with the secret and ``&``, over ``GET&%2F&`` and the percent-encoded canonical query (the
parameters sorted by name, RFC 3986 encoded), in base64. ``call`` returns the answer's
status and body whatever they are (an error carries ``Code`` and ``Message``, HTTP 4xx/5xx):
reading them, throttling included, is the engine's (``flannel.cloud.alivpc``). Each call has
one deadline (``timeout``) for connecting, sending and reading, and reads at most
``MAX_ANSWER`` bytes; a call that gets no such answer raises ``AliyunUnreachable``. A
redirect is an answer like any other status (the HTTP layer follows none). ``stopper`` (the
caller's ``Cutter``) cancels a call in flight when flanneld stops; what it raises then is
the caller's. The secret is held out of ``repr`` and never logged; no proxy from the
environment is used.
Must not touch: which actions are called and what the answers mean (the engine decides), the
stores, the engines, the kernel.
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

from flannel.clients.cut import Cutter
from flannel.clients.http import Connection, ProtocolError

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
        what = f"{self.service} {action}"
        try:
            return asyncio.run(self._cut_when_stopped(self._query(action, params), what))
        except asyncio.CancelledError:
            self.stopper.check(what)
            raise
        except TimeoutError:
            raise AliyunUnreachable(f"no answer from {self.endpoint} within {self.timeout:g} s",
                                    timed_out=True) from None
        except (OSError, ProtocolError) as error:
            raise AliyunUnreachable(f"could not talk to {self.endpoint}: {error}") from None

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
