"""What the gce engine learns from the instance: the GCE metadata server (identity and the
service account's access token) and, when ``GOOGLE_APPLICATION_CREDENTIALS`` names a
service-account key file, an access token signed for with that key.

The metadata server is ``http://169.254.169.254`` (or ``GCE_METADATA_HOST``, host[:port], the
variable Google's own libraries read); every request carries ``Metadata-Flavor: Google`` and
an answer without that header is refused (it is not the metadata server). Values read here are
untrusted: bounded in size and time (``flannel.clients.fetch``; redirects never followed), and
checked against the shapes Compute Engine documents.
A key file's token is fetched with a JWT (RS256, signed through google-auth, the ``gce``
extra, imported only then) posted to the key's ``token_uri``. Tokens and keys are held out
of ``repr`` and never logged. Every call blocks: meant for the engine's worker thread.
Must not touch: the Compute API, the store, the kernel.
"""

from __future__ import annotations

import importlib
import logging
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flannel.clients.fetch import FetchFailed, TooLarge, fetch, opener
from flannel.cloud.base import CloudError, Stopper
from flannel.cloud.metadata import checked
from flannel.cloud.typed import View
from flannel.files.fileutil import read_head
from flannel.untrusted import boundedjson
from flannel.untrusted.boundedjson import JSONLimitError

log = logging.getLogger(__name__)

GCE_METADATA = "http://169.254.169.254"
METADATA_HOST_VARIABLE = "GCE_METADATA_HOST"
KEY_FILE_VARIABLE = "GOOGLE_APPLICATION_CREDENTIALS"
#: The one scope the engine needs: routes, networks, instances, operations.
COMPUTE_SCOPE = "https://www.googleapis.com/auth/compute"
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"  # noqa: S105 (a URL)
_MAX_BODY = 64 * 1024
#: A token is renewed this long before Google says it expires.
_EARLY = 60.0

# RFC 1035 labels, as Compute Engine names resources; projects may be domain-scoped.
NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
PROJECT = re.compile(r"([a-z][-a-z0-9.]{0,62}:)?[a-z][-a-z0-9]{4,28}[a-z0-9]", re.ASCII)
_ZONE = re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}-[a-z]", re.ASCII)
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?", re.ASCII)


def metadata_base(environ: Mapping[str, str]) -> str:
    """The metadata server's URL: ``GCE_METADATA_HOST`` (host[:port]) or the link-local one."""
    host = environ.get(METADATA_HOST_VARIABLE, "")
    if not host:
        return GCE_METADATA
    if not _HOST.fullmatch(host):
        raise CloudError(f"{METADATA_HOST_VARIABLE}={host[:80]!r} is not host[:port]; unset "
                         "it to use the metadata server at 169.254.169.254")
    return f"http://{host}"


class GceMetadata:
    """GETs under ``<base>/computeMetadata/v1/``, each answer whole within ``timeout``
    seconds and ``_MAX_BODY`` bytes, never through a proxy, never redirected. Its
    ``stopper`` cuts them when flanneld stops (the engine shares it)."""

    def __init__(self, base_url: str = GCE_METADATA, timeout: float = 2.0,
                 stopper: Stopper | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.stopper = stopper or Stopper()
        # Link-local: never through an HTTP proxy from the environment.
        self._opener = opener(proxies=False)

    def get(self, path: str) -> str:
        url = f"{self.base_url}/computeMetadata/v1/{path}"
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310
        try:
            reply = fetch(self._opener, request, timeout=self.timeout, max_bytes=_MAX_BODY,
                          stopper=self.stopper, what=f"GCE metadata {path}")
        except TooLarge as error:
            raise CloudError(f"GCE metadata {path}: {error} from {self.base_url}; "
                             "refusing it") from None
        except FetchFailed as error:
            raise CloudError(f"the GCE metadata server at {self.base_url} did not answer "
                             f"({error}); is this node a Compute Engine instance?") from None
        if reply.status != 200:
            raise CloudError(f"GCE metadata {path}: HTTP {reply.status} from "
                             f"{self.base_url}")
        if reply.headers.get("metadata-flavor", "") != "Google":
            raise CloudError(f"{self.base_url} answered without the header Metadata-Flavor: "
                             "Google, so it is not the GCE metadata server")
        return reply.body.decode("utf-8", "replace").strip()


@dataclass(frozen=True)
class GceIdentity:
    project: str  # the instance's project
    zone: str
    instance: str
    network: str  # the name of the network of the first interface


def gce_identity(metadata: GceMetadata) -> GceIdentity:
    """Project, zone, instance name and the first interface's network, as Go read them
    (the zone and network are the last part of the path the server gives)."""
    def read(path: str, shape: re.Pattern[str], last: bool = False) -> str:
        value = metadata.get(path)
        return checked(path, value.rsplit("/", 1)[-1] if last else value, shape,
                       "GCE metadata")

    return GceIdentity(read("project/project-id", PROJECT), read("instance/zone", _ZONE, True),
                       read("instance/name", NAME),
                       read("instance/network-interfaces/0/network", NAME, True))


@dataclass
class _Token:
    value: str = field(repr=False)
    expires: float


def _token_from(source: str, body: bytes) -> tuple[str, float]:
    """(access token, seconds it lives) from an OAuth 2.0 token answer."""
    try:
        answer = boundedjson.loads(body, what=f"the answer of {source}", max_bytes=_MAX_BODY,
                                   max_elements=100)
    except JSONLimitError as error:
        raise CloudError(str(error)) from None
    view = View(answer, f"the answer of {source}").obj(required=True)
    token = view.get("access_token").text(4096, required=True)
    lifetime = view.get("expires_in").number(300, 1, 86400)
    if not token or not token.isprintable():
        raise CloudError(f"{source} sent a malformed access token")
    return token, lifetime


class TokenSource:
    """An access token for the Compute API, fetched when missing, near expiry or refused."""

    def __init__(self, fetch: Callable[[], tuple[str, float]], describe: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self.describe = describe
        self._clock = clock
        self._token: _Token | None = None

    def __repr__(self) -> str:
        return f"TokenSource({self.describe})"

    def token(self) -> str:
        now = self._clock()
        if self._token is None or now >= self._token.expires:
            value, lifetime = self._fetch()
            self._token = _Token(value, now + max(lifetime - _EARLY, lifetime / 2))
        return self._token.value

    def invalidate(self) -> None:
        """The API refused the token (revoked, or the clock was off): fetch a new one."""
        self._token = None


def metadata_tokens(metadata: GceMetadata) -> TokenSource:
    """The instance's default service account's token, from the metadata server."""
    def fetch() -> tuple[str, float]:
        path = "instance/service-accounts/default/token"
        return _token_from(f"the metadata server's {path}", metadata.get(path).encode())
    return TokenSource(fetch, "the instance's service account (metadata server)")


@dataclass(frozen=True)
class ServiceAccountKey:
    client_email: str
    token_uri: str
    key_id: str
    private_key: str = field(repr=False)


def read_key_file(path: str) -> ServiceAccountKey:
    """A service-account key file (JSON, as the console downloads it), checked."""
    try:
        raw, more = read_head(path, _MAX_BODY)
    except OSError as error:
        raise CloudError(f"{KEY_FILE_VARIABLE}: cannot read {path[:200]!r} "
                         f"({error.strerror}); point it at a service-account key file or "
                         "unset it to use the instance's service account") from None
    if more:
        raise CloudError(f"{KEY_FILE_VARIABLE}: {path[:200]!r} is over {_MAX_BODY} bytes; "
                         "not a service-account key file")
    try:
        info = boundedjson.loads(raw, what=f"{KEY_FILE_VARIABLE}: {path[:200]!r}",
                                 max_bytes=_MAX_BODY)
    except JSONLimitError as error:
        raise CloudError(str(error)) from None
    if not isinstance(info, dict):
        raise CloudError(f"{KEY_FILE_VARIABLE}: {path[:200]!r} is not a JSON object")
    if info.get("type") != "service_account":
        raise CloudError(f"{KEY_FILE_VARIABLE}: {path[:200]!r} holds credentials of type "
                         f"{str(info.get('type'))[:40]!r}; the gce backend takes a "
                         "service-account key (type service_account) or the instance's "
                         "service account")
    values = {name: info.get(name) for name in ("client_email", "private_key",
                                                "private_key_id")}
    token_uri = info.get("token_uri") or DEFAULT_TOKEN_URI
    if not all(isinstance(v, str) and v for v in values.values()) or \
            not isinstance(token_uri, str) or \
            urllib.parse.urlsplit(token_uri).scheme not in ("https", "http"):
        raise CloudError(f"{KEY_FILE_VARIABLE}: {path[:200]!r} lacks client_email, "
                         "private_key, private_key_id or a token_uri URL")
    return ServiceAccountKey(str(values["client_email"]), token_uri,
                             str(values["private_key_id"]), str(values["private_key"]))


def _signed_assertion(key: ServiceAccountKey, now: float) -> bytes:
    try:
        crypt: Any = importlib.import_module("google.auth.crypt")
        jwt: Any = importlib.import_module("google.auth.jwt")
    except ImportError:
        raise CloudError(f"a service-account key file ({KEY_FILE_VARIABLE}) needs the "
                         "Python module 'google.auth': pip install 'pyflannel[gce]' (or "
                         "unset it to use the instance's service account)") from None
    try:
        signer = crypt.RSASigner.from_string(key.private_key, key.key_id)
    except (ValueError, TypeError, IndexError):
        raise CloudError(f"{KEY_FILE_VARIABLE}: the private_key of {key.client_email} is not "
                         "an RSA key in PEM form") from None
    claims = {"iss": key.client_email, "scope": COMPUTE_SCOPE, "aud": key.token_uri,
              "iat": int(now), "exp": int(now) + 3600}
    assertion: bytes = jwt.encode(signer, claims)
    return assertion


def key_file_tokens(path: str, timeout: float, stopper: Stopper) -> TokenSource:
    """Tokens for a service-account key: a signed JWT exchanged at the key's token_uri
    (through HTTPS_PROXY when set; never redirected: the assertion is a credential)."""
    key = read_key_file(path)
    director = opener(proxies=True)

    def fetch_token() -> tuple[str, float]:
        body = urllib.parse.urlencode({
            "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": _signed_assertion(key, time.time()).decode()}).encode()
        request = urllib.request.Request(  # noqa: S310 (scheme checked in read_key_file)
            key.token_uri, data=body, method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            reply = fetch(director, request, timeout=timeout, max_bytes=_MAX_BODY,
                          stopper=stopper, what=f"the token endpoint {key.token_uri}")
        except FetchFailed as error:
            raise CloudError(f"the token endpoint {key.token_uri} did not answer "
                             f"({error})") from None
        if reply.status != 200:
            raise CloudError(f"the token endpoint {key.token_uri} refused the key of "
                             f"{key.client_email}: HTTP {reply.status} "
                             f"{_oauth_error(reply.body)}".rstrip())
        return _token_from(f"the token endpoint {key.token_uri}", reply.body)
    return TokenSource(fetch_token, f"the service-account key of {key.client_email}")


def _oauth_error(body: bytes) -> str:
    """The OAuth error code and description (never anything the request carried)."""
    try:
        answer = boundedjson.loads(body[:4096], what="an OAuth error answer", max_bytes=4096,
                                   max_elements=100)
    except JSONLimitError:
        return ""
    if not isinstance(answer, dict):
        return ""
    text = f"{answer.get('error', '')}: {answer.get('error_description', '')}"
    return text[:200] if text.isprintable() else ""
