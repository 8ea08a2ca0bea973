"""One request a cloud SDK built and signed (boto3 for EC2, the Tencent Cloud SDK), sent
through the cloud clients' bounded fetch instead of the SDK's own sender.

The SDKs bound a request by a timeout per read: an answer dripping a byte every few seconds
held a data plane pass, and flanneld's exit, for ever, and their answers were read whole
whatever their size. ``exchange`` takes the whole answer within ``timeout`` seconds and
``max_bytes`` bytes, cut at once when flanneld stops (the engine's ``Stopper``), and never
follows a redirect (the request is signed, with the credentials' identity, for its own host
only). The SDK parses what comes back; the engines bound its elements first.
Must not touch: what is asked or what the answers mean, the stores, the kernel.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from collections.abc import Mapping

from flannel.clients.fetch import FetchFailed, Reply, fetch, opener
from flannel.cloud.base import CloudError, Stopper


class SdkSender:
    """Sends an SDK's requests for one API (``api``: its name in messages, e.g. "EC2"), as
    the SDK would reach it (through HTTPS_PROXY when set)."""

    def __init__(self, api: str, stopper: Stopper, *, timeout: float, max_bytes: int,
                 endpoint_hint: str) -> None:
        self.api = api
        self.stopper = stopper
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._endpoint_hint = endpoint_hint  # how a user points the SDK at the API
        self._opener = opener(proxies=True)

    def exchange(self, action: str, method: str, url: str, body: bytes | str | None,
                 headers: Mapping[str, str | bytes]) -> Reply:
        """The whole answer to one request (any status but a redirect), or CloudError
        naming the API, the action, the host and the cause; what the stopper raises when
        flanneld stops."""
        what = f"{self.api} {action}"
        data = body.encode() if isinstance(body, str) else body
        sent = {name: value.decode() if isinstance(value, bytes) else value
                for name, value in headers.items()}
        host = urllib.parse.urlsplit(url).netloc
        request = urllib.request.Request(url, data=data, headers=sent,  # noqa: S310
                                         method=method)
        try:
            reply = fetch(self._opener, request, timeout=self.timeout,
                          max_bytes=self.max_bytes, stopper=self.stopper, what=what)
        except FetchFailed as error:
            raise CloudError(f"{what}: no usable answer from {host} ({error})") from None
        if 300 <= reply.status < 400:
            where = urllib.parse.urlsplit(reply.headers.get("location", "")).netloc
            raise CloudError(f"{what}: {host} answered HTTP {reply.status}, a redirect to "
                             f"{where[:100] or 'nowhere'!r}; not followed (the request is "
                             f"signed for the API's host only): {self._endpoint_hint}")
        return reply
