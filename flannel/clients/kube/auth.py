"""Credentials sent to the Kubernetes API server, and how each is obtained and renewed.

Owns: no credentials, a static bearer token, a user name and password, a token file (re-read
every minute and after a refusal, as bound service-account tokens rotate), client-go exec
credential plugins (run without a shell, their ExecCredential answer cached until its
expirationTimestamp or a refusal), and loading a client certificate held in memory into an
ssl context through a private file removed at once. Secrets are never logged.
Must not touch: kubeconfig parsing (kubeconfig.py), requests (kubeclient.py), the kernel.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import ssl
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime

from flannel.files.fileutil import read_head
from flannel.untrusted import boundedjson

#: A bound service-account token rotates hourly; client-go re-reads the file every minute.
TOKEN_REREAD_SECONDS = 60.0
MAX_TOKEN_BYTES = 64 * 1024
#: An exec plugin answers with a small JSON document, and within this time.
MAX_EXEC_OUTPUT_BYTES = 1024 * 1024
EXEC_TIMEOUT_SECONDS = 60.0
#: What is kept of a plugin's stderr for the message when it fails.
MAX_STDERR_TAIL = 4096


class CredentialError(Exception):
    """Credentials could not be obtained now (token file unreadable, exec plugin failed)."""


class Credentials:
    """No credentials: requests go out without an Authorization header."""

    source = "no credentials"
    #: Whether asking again can give a different answer (a rotated token, a new exec run).
    renewable = False

    async def headers(self) -> dict[str, str]:
        return {}

    def invalidate(self) -> None:
        """The server refused what we sent: read or fetch afresh next time."""


@dataclass
class StaticToken(Credentials):
    token: str
    source: str = "a bearer token"

    async def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class BasicAuth(Credentials):
    username: str
    password: str
    source: str = "a user name and password"

    async def headers(self) -> dict[str, str]:
        pair = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}


@dataclass
class TokenFile(Credentials):
    """A token read from a file, re-read every ``reread`` seconds and after a refusal."""

    path: str
    reread: float = TOKEN_REREAD_SECONDS
    renewable = True
    _token: str = ""
    _read_at: float = -1e18

    @property
    def source(self) -> str:  # type: ignore[override]
        return f"the token file {self.path}"

    async def headers(self) -> dict[str, str]:
        if time.monotonic() - self._read_at >= self.reread:
            try:
                raw, _ = await asyncio.to_thread(read_head, self.path, MAX_TOKEN_BYTES + 1)
            except OSError as err:
                raise CredentialError(f"cannot read the token file {self.path}: "
                                      f"{err.strerror or err}") from None
            token = raw.decode("utf-8", "replace").strip()
            if not token or len(raw) > MAX_TOKEN_BYTES or not token.isprintable():
                raise CredentialError(f"the token file {self.path} holds no usable token")
            self._token, self._read_at = token, time.monotonic()
        return {"Authorization": f"Bearer {self._token}"}

    def invalidate(self) -> None:
        self._read_at = -1e18


@dataclass
class ExecPlugin(Credentials):
    """A client-go credential plugin: run without a shell, answer cached until it expires."""

    command: str
    args: list[str]
    env: dict[str, str]
    api_version: str
    context: ssl.SSLContext | None
    where: str
    renewable = True
    _token: str = ""
    _expires: float = 0.0  # monotonic; 0: valid until refused
    _cached: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def source(self) -> str:  # type: ignore[override]
        return f"the exec plugin {self.command} ({self.where})"

    async def headers(self) -> dict[str, str]:
        async with self._lock:
            if not self._cached or (self._expires and time.monotonic() >= self._expires):
                await self._run()
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    def invalidate(self) -> None:
        self._cached = False

    async def _run(self) -> None:
        info = json.dumps({"apiVersion": self.api_version, "kind": "ExecCredential",
                           "spec": {"interactive": False}})
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": info}
        what = f"the exec plugin {self.command} ({self.where})"
        try:
            proc = await asyncio.create_subprocess_exec(
                self.command, *self.args, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                limit=MAX_EXEC_OUTPUT_BYTES)
        except OSError as err:
            raise CredentialError(f"cannot run {what}: {err.strerror or err}") from None
        try:
            async with asyncio.timeout(EXEC_TIMEOUT_SECONDS):
                assert proc.stdout is not None and proc.stderr is not None
                out, err_text = await asyncio.gather(_read_all(proc.stdout),
                                                     _read_tail(proc.stderr))
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise CredentialError(f"{what} did not answer within "
                                  f"{EXEC_TIMEOUT_SECONDS:g}s") from None
        if out is None:
            raise CredentialError(f"{what} printed more than {MAX_EXEC_OUTPUT_BYTES} bytes")
        if code != 0:
            tail = err_text.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise CredentialError(f"{what} exited with status {code}: {tail[0][:200]}")
        try:
            doc = boundedjson.loads(out, what=f"the output of {what}",
                                    max_bytes=MAX_EXEC_OUTPUT_BYTES)
        except boundedjson.JSONLimitError as err:
            raise CredentialError(str(err)) from None
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential" or \
                doc.get("apiVersion") != self.api_version:
            raise CredentialError(f"{what} did not print an ExecCredential of apiVersion "
                                  f"{self.api_version}")
        status = doc.get("status")
        if not isinstance(status, dict):
            raise CredentialError(f"{what}: its ExecCredential has no status")
        token, cert, key = (status.get(k) for k in ("token", "clientCertificateData",
                                                    "clientKeyData"))
        if not all(v is None or isinstance(v, str) for v in (token, cert, key)) or \
                not (token or (cert and key)):
            raise CredentialError(f"{what}: status needs a token string or both "
                                  "clientCertificateData and clientKeyData")
        if cert and key:
            if self.context is None:
                raise CredentialError(f"{what} gave a client certificate for a server "
                                      "without TLS")
            try:
                load_key_pair(self.context, cert.encode(), key.encode())
            except (ssl.SSLError, OSError):
                raise CredentialError(f"{what}: clientCertificateData/clientKeyData is not "
                                      "a PEM certificate and its key") from None
        self._expires = 0.0
        stamp = status.get("expirationTimestamp")
        if stamp is not None:
            try:
                expires = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
                self._expires = time.monotonic() + (expires.timestamp() - time.time())
            except ValueError:
                raise CredentialError(f"{what}: expirationTimestamp {str(stamp)[:40]!r} is "
                                      "not an RFC 3339 time") from None
        self._token, self._cached = token or "", True


async def _read_all(stream: asyncio.StreamReader) -> bytes | None:
    """The whole output, however many writes it came in; None past the bound (the rest is
    still read, so the plugin never blocks on a full pipe)."""
    parts: list[bytes] = []
    size = 0
    while data := await stream.read(64 * 1024):
        size += len(data)
        if size <= MAX_EXEC_OUTPUT_BYTES:
            parts.append(data)
    return b"".join(parts) if size <= MAX_EXEC_OUTPUT_BYTES else None


async def _read_tail(stream: asyncio.StreamReader) -> bytes:
    """Everything the plugin writes, drained so it never blocks; the last 4 KiB kept."""
    tail = b""
    while data := await stream.read(64 * 1024):
        tail = (tail + data)[-MAX_STDERR_TAIL:]
    return tail


def load_key_pair(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Give ssl a client certificate held in memory: written to a private 0600 file opened
    O_EXCL|O_NOFOLLOW, loaded, and removed at once (ssl only loads keys from files)."""
    directory = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = os.path.join(directory, f".flanneld-client-{secrets.token_hex(8)}.pem")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(key_pem.rstrip(b"\n") + b"\n" + cert_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
