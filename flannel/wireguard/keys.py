"""WireGuard keys: the private key file, key parsing, and a type that never prints a key.

Owns: ``/run/flannel/wgkey`` (or ``WIREGUARD_KEY_FILE``): created with O_CREAT|O_EXCL|
O_NOFOLLOW, mode 0400, in a 0700 directory when missing; read and checked otherwise. Read
with O_NONBLOCK, following symbolic links as Go does, so a key mounted from a Kubernetes
Secret (``key -> ..data/key``, ``..data -> ..<timestamp>``, root-owned, mode 0644) is used.
Refused, with a message naming the file and the fix: anything but a regular file (a FIFO,
device, socket or directory), a file owned by another user than root or this process's, and
a key that someone else could change: the file, a symbolic link on the way, or a directory
on the way writable by group or others (a sticky directory such as /tmp, or the 1777 root of
a Secret volume, only protects entries owned by root or us; nothing on a read-only mount can
be changed); content that is not one base64 32-byte key. A key readable by others on a
writable file system is used with one warning. Key generation (X25519, RFC 7748) and public
key derivation.

API: ``Secret`` (a 32-byte key; ``repr``/``str`` show only ``Secret(<hidden>)``; ``.base64()``
and ``.hex()`` give the key for the one place it must go), ``parse_key(text, what)``,
``load_or_create_private_key(path)``, ``read_key_file(path)`` (e.g. a PSK file),
``public_key(secret) -> str`` (base64), ``generate_private_key()``, ``key_file_path(environ)``.
Must not touch: anything but the key file and its directory. Never logs a key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from flannel.files.fileutil import (
    file_kind,
    others_can_write,
    read_only,
    trusted_owner,
    unsafe_path,
)

log = logging.getLogger(__name__)

DEFAULT_KEY_FILE = "/run/flannel/wgkey"
KEY_FILE_ENV = "WIREGUARD_KEY_FILE"
KEY_LEN = 32
_MAX_KEY_FILE = 4096
_warned_readable: set[str] = set()


class KeyFileError(Exception):
    """A key or key file cannot be used; the message says which and how to fix it."""


class Secret:
    """A 32-byte WireGuard key that never shows itself in logs, errors or reprs."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes) -> None:
        if len(raw) != KEY_LEN:
            raise ValueError("a WireGuard key is 32 bytes")
        self._raw = bytes(raw)

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._raw == self._raw

    def __hash__(self) -> int:
        return hash(self._raw)

    def __reduce__(self) -> NoReturn:
        raise TypeError("a Secret is not picklable")

    @property
    def raw(self) -> bytes:
        return self._raw

    def base64(self) -> str:
        return base64.b64encode(self._raw).decode()

    def hex(self) -> str:
        return self._raw.hex()


def parse_key(text: str, what: str) -> Secret:
    """A base64 32-byte key (as ``wg genkey`` prints it); ``what`` names it in the error."""
    stripped = text.strip()
    try:
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != KEY_LEN or len(stripped) != 44:
        # Never echo the content: it may be a key with a typo.
        raise KeyFileError(f"{what} is not a WireGuard key: expected 32 bytes in base64 "
                        "(44 characters, as `wg genkey` prints)")
    return Secret(raw)


# X25519 (RFC 7748, section 5): the Montgomery ladder over Curve25519. Runs once per key.
_P = 2**255 - 19
_A24 = 121665


def _clamp(scalar: bytes) -> int:
    k = bytearray(scalar)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    return int.from_bytes(k, "little")


def x25519(scalar: bytes, u_bytes: bytes) -> bytes:
    k = _clamp(scalar)
    x1 = int.from_bytes(u_bytes, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (k >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % _P, (x2 - z2) % _P
        aa, bb = a * a % _P, b * b % _P
        e = (aa - bb) % _P
        c, d = (x3 + z3) % _P, (x3 - z3) % _P
        da, cb = d * a % _P, c * b % _P
        x3 = (da + cb) ** 2 % _P
        z3 = x1 * (da - cb) ** 2 % _P
        x2 = aa * bb % _P
        z2 = e * (aa + _A24 * e) % _P
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, _P - 2, _P) % _P).to_bytes(32, "little")


def generate_private_key() -> Secret:
    k = bytearray(os.urandom(KEY_LEN))
    # Stored clamped, as `wg genkey` does, so other tools show the same key.
    k[0] &= 248
    k[31] = (k[31] & 127) | 64
    return Secret(bytes(k))


def public_key(private: Secret) -> str:
    return base64.b64encode(x25519(private.raw, (9).to_bytes(32, "little"))).decode()


def key_file_path(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env.get(KEY_FILE_ENV) or DEFAULT_KEY_FILE)


def _ensure_private_dir(directory: Path) -> None:
    """Create the key directory 0700 if missing; an existing one is used as it is."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
        os.chmod(directory, 0o700)
    if not directory.is_dir():
        raise KeyFileError(f"WireGuard key directory {directory} is not a directory; remove it "
                        f"or set {KEY_FILE_ENV} to a file in another directory")


def read_key_file(path: Path) -> Secret:
    """A key from a file only root or this process's user can change: the private key, or a
    PSK file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise KeyFileError(f"cannot read WireGuard key file {path}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"WireGuard key file {path} is {file_kind(info.st_mode)}, not a "
                               "regular file: remove it (flanneld then creates a key there) "
                               f"or set {KEY_FILE_ENV} to the key file")
        if not trusted_owner(info.st_uid):
            raise KeyFileError(f"WireGuard key file {path} is owned by uid {info.st_uid}, not "
                               f"by root or this process (uid {os.geteuid()}); run `chown "
                               f"{os.geteuid()} {path}` if it is really the key to use")
        on_read_only = read_only(fd)
        if others_can_write(info) and not on_read_only:
            raise KeyFileError(f"WireGuard key file {path} has mode "
                               f"{stat.S_IMODE(info.st_mode):04o}, writable by other users; "
                               f"run `chmod 0400 {path}` (and consider the key leaked)")
        try:
            why, real = unsafe_path(path)
        except OSError as err:
            raise KeyFileError(f"cannot check WireGuard key file {path}: {err.strerror}") \
                from None
        if why is not None:
            raise KeyFileError(f"WireGuard key file {path} could be replaced by another user: "
                               f"{why}; keep the key where only root can change it")
        if (os.stat(real).st_dev, os.stat(real).st_ino) != (info.st_dev, info.st_ino):
            raise KeyFileError(f"WireGuard key file {path} changed while it was read; "
                               "start flanneld again")
        if info.st_mode & 0o044 and not on_read_only and str(path) not in _warned_readable:
            _warned_readable.add(str(path))
            log.warning("WireGuard key file %s has mode %04o, readable by other users; run "
                        "`chmod 0400 %s`", path, stat.S_IMODE(info.st_mode), path)
        data = os.read(fd, _MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_KEY_FILE:
        raise KeyFileError(f"WireGuard key file {path} is not a WireGuard key: it is larger "
                        f"than {_MAX_KEY_FILE} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    return parse_key(text, f"the content of WireGuard key file {path}")


def load_or_create_private_key(path: Path) -> tuple[Secret, bool]:
    """The node's private key and whether it was created just now.

    A missing file is created exclusively (a concurrent creator wins and its key is read).
    """
    _ensure_private_dir(path.parent)
    key = generate_private_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o400)
    except FileExistsError:
        return read_key_file(path), False
    except OSError as err:
        raise KeyFileError(f"cannot create WireGuard key file {path}: {err.strerror}") from None
    try:
        os.fchmod(fd, 0o400)
        os.write(fd, key.base64().encode())
        os.fsync(fd)
    except OSError as err:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise KeyFileError(f"cannot write WireGuard key file {path}: {err.strerror}") from None
    os.close(fd)
    return key, True
