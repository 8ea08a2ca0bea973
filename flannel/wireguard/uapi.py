"""WireGuard's cross-platform configuration protocol (UAPI): encoding, decoding, transport.

Owns: the text protocol of wireguard.com/xplatform (``get=1`` returns ``key=value`` lines
ending with ``errno=N`` and an empty line; ``set=1`` takes the same keys; keys in hex), its
transport ``UapiControl`` (the unix socket of a userspace implementation,
``<run dir>/wireguard/<ifname>.sock``; an answer bounded in bytes, in time as a whole, and
in peers and allowed IPs), and the records and ``Control`` interface that the kernel's
transport (``genl.GenlControl``, generic netlink) shares.

API: ``Peer`` (desired or actual peer config), ``DeviceState`` (``get``'s answer),
``DeviceUpdate`` / ``PeerUpdate`` (what ``set`` changes), ``encode_set(update)``,
``decode_get(text)``, ``Control.get()`` / ``Control.set(update)`` raising
``ControlUnavailable`` (nothing answers: restart the device) or ``ControlError``.
Must not touch: anything but the one device's control channel. Never logs a key.
"""

from __future__ import annotations

import base64
import errno
import os
import socket
import stat
import time
from dataclasses import dataclass, field, replace
from ipaddress import ip_address, ip_network
from pathlib import Path
from typing import Any

from flannel.wireguard.keys import KEY_LEN, Secret

_MAX_RESPONSE = 16 << 20
_ZERO_KEY = "0" * 64
#: Peers a device's answer may list (20,000 peers and a good margin; 16 MiB of UAPI text is
#: about as many), and allowed IPs in all (flannel gives each peer one or two).
MAX_PEERS = 50_000
MAX_ALLOWED_IPS = 4 * MAX_PEERS


class ControlError(Exception):
    """The device refused a request or answered something unreadable."""


class ControlUnavailable(ControlError):
    """Nothing answers on the device's control channel (device or process gone)."""


def normalise_endpoint(text: str | None) -> str | None:
    """``ip:port`` / ``[ip6]:port`` in canonical form, or None when unset or unparsable."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) <= 65535:
        return None
    try:
        addr = ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return None
    return f"[{addr}]:{int(port)}" if addr.version == 6 else f"{addr}:{int(port)}"


@dataclass(frozen=True)
class Peer:
    """A peer's configuration. ``public_key`` is base64 (public keys are not secret)."""

    public_key: str
    endpoint: str | None = None
    allowed_ips: frozenset[str] = frozenset()
    psk: Secret | None = None
    keepalive: int = 0

    def normalised(self) -> Peer:
        return replace(self, endpoint=normalise_endpoint(self.endpoint),
                       allowed_ips=frozenset(str(ip_network(n, strict=False))
                                             for n in self.allowed_ips))


@dataclass(frozen=True)
class PeerState:
    peer: Peer
    last_handshake: float | None  # unix time; None: never
    rx_bytes: int = 0
    tx_bytes: int = 0


@dataclass(frozen=True)
class DeviceState:
    private_key: Secret | None
    listen_port: int
    peers: dict[str, PeerState] = field(default_factory=dict)


@dataclass(frozen=True)
class PeerUpdate:
    """One peer's change. ``update_only``: fail rather than create (a field-level fix)."""

    public_key: str
    remove: bool = False
    update_only: bool = False
    endpoint: str | None = None
    psk: Secret | None = None
    set_psk: bool = False  # with psk None: clear the PSK
    keepalive: int | None = None
    allowed_ips: frozenset[str] | None = None  # replaces the peer's list


@dataclass(frozen=True)
class DeviceUpdate:
    private_key: Secret | None = None
    listen_port: int | None = None
    peers: tuple[PeerUpdate, ...] = ()


def _key_hex(b64: str) -> str:
    raw = base64.b64decode(b64, validate=True)
    if len(raw) != KEY_LEN:
        raise ValueError("a WireGuard key is 32 bytes")
    return raw.hex()


def encode_set(update: DeviceUpdate) -> bytes:
    lines = ["set=1"]
    if update.private_key is not None:
        lines.append(f"private_key={update.private_key.hex()}")
    if update.listen_port is not None:
        lines.append(f"listen_port={update.listen_port}")
    for peer in update.peers:
        lines.append(f"public_key={_key_hex(peer.public_key)}")
        if peer.remove:
            lines.append("remove=true")
            continue
        if peer.update_only:
            lines.append("update_only=true")
        if peer.set_psk or peer.psk is not None:
            lines.append(f"preshared_key={peer.psk.hex() if peer.psk else _ZERO_KEY}")
        if peer.endpoint is not None:
            lines.append(f"endpoint={peer.endpoint}")
        if peer.keepalive is not None:
            lines.append(f"persistent_keepalive_interval={peer.keepalive}")
        if peer.allowed_ips is not None:
            lines.append("replace_allowed_ips=true")
            lines.extend(f"allowed_ip={net}" for net in sorted(peer.allowed_ips))
    return ("\n".join(lines) + "\n\n").encode()


def _secret_from_hex(text: str) -> Secret | None:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise ControlError("the device answered a malformed key") from None
    if len(raw) != KEY_LEN:
        raise ControlError("the device answered a malformed key")
    return None if raw == bytes(KEY_LEN) else Secret(raw)


def decode_get(text: str) -> DeviceState:
    """Parse a ``get=1`` answer (without its trailing ``errno`` check, done by the caller)."""
    private: Secret | None = None
    port = 0
    peers: dict[str, PeerState] = {}
    current: dict[str, Any] | None = None  # one peer's fields of mixed types
    allowed = 0

    def flush() -> None:
        if current is None:
            return
        hs_sec, hs_nsec = current.pop("hs_sec"), current.pop("hs_nsec")
        rx, tx = current.pop("rx"), current.pop("tx")
        peer = Peer(current["public_key"], current["endpoint"],
                    frozenset(current["allowed_ips"]), current["psk"], current["keepalive"])
        try:
            normalised = peer.normalised()
        except ValueError:
            raise ControlError("the device answered an unreadable allowed_ip") from None
        peers[peer.public_key] = PeerState(normalised,
                                           hs_sec + hs_nsec / 1e9 if hs_sec else None, rx, tx)

    for line in text.split("\n"):
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ControlError(f"the device answered an unreadable line {line[:40]!r}")
        try:
            if key == "private_key":
                private = _secret_from_hex(value)
            elif key == "listen_port":
                port = int(value)
            elif key == "public_key":
                flush()
                if len(peers) >= MAX_PEERS:
                    raise ControlError(f"the device answered more than {MAX_PEERS} peers")
                raw = bytes.fromhex(value)
                if len(raw) != KEY_LEN:
                    raise ControlError("the device answered a malformed public key")
                current = {"public_key": base64.b64encode(raw).decode(), "endpoint": None,
                           "allowed_ips": [], "psk": None, "keepalive": 0, "hs_sec": 0,
                           "hs_nsec": 0, "rx": 0, "tx": 0}
            elif current is None:
                continue  # device-level keys we do not use (fwmark, errno)
            elif key == "preshared_key":
                current["psk"] = _secret_from_hex(value)
            elif key == "endpoint":
                current["endpoint"] = value
            elif key == "allowed_ip":
                allowed += 1
                if allowed > MAX_ALLOWED_IPS:
                    raise ControlError(f"the device answered more than {MAX_ALLOWED_IPS} "
                                       "allowed IPs")
                current["allowed_ips"].append(value)
            elif key == "persistent_keepalive_interval":
                current["keepalive"] = int(value)
            elif key == "last_handshake_time_sec":
                current["hs_sec"] = int(value)
            elif key == "last_handshake_time_nsec":
                current["hs_nsec"] = int(value)
            elif key == "rx_bytes":
                current["rx"] = int(value)
            elif key == "tx_bytes":
                current["tx"] = int(value)
        except ValueError:
            raise ControlError(f"the device answered an unreadable {key}") from None
    flush()
    return DeviceState(private, port, peers)


def _split_errno(text: str) -> tuple[str, int]:
    body, _, last = text.rstrip("\n").rpartition("\n")
    if not last.startswith("errno="):
        raise ControlError("the device's answer has no errno line")
    try:
        return body, int(last[len("errno="):])
    except ValueError:
        raise ControlError("the device's answer has an unreadable errno line") from None


class Control:
    """How a device is read and configured."""

    def get(self) -> DeviceState:
        raise NotImplementedError

    def set(self, update: DeviceUpdate) -> None:
        raise NotImplementedError


class UapiControl(Control):
    """The UAPI socket of a userspace implementation (wireguard-go)."""

    def __init__(self, socket_path: Path, timeout: float = 3.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _exchange(self, request: bytes) -> str:
        """One request and its whole answer within ``timeout`` seconds (each read gets
        what is left: an answer dripping a byte at a time is cut, not waited for)."""
        deadline = time.monotonic() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            try:
                sock.connect(str(self.socket_path))
            except (FileNotFoundError, ConnectionRefusedError) as err:
                raise ControlUnavailable(f"nothing answers on {self.socket_path}: "
                                         f"{err.strerror}") from None
            sock.sendall(request)
            chunks: list[bytes] = []
            size = 0
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > _MAX_RESPONSE:
                    raise ControlError(f"{self.socket_path} answered more than "
                                       f"{_MAX_RESPONSE} bytes")
                # An answer ends with an empty line.
                if b"".join(chunks[-2:]).endswith(b"\n\n"):
                    break
        except TimeoutError:
            raise ControlError(f"{self.socket_path} did not answer within "
                               f"{self.timeout:g}s") from None
        except OSError as err:
            raise ControlUnavailable(f"{self.socket_path}: {err.strerror or err}") from None
        finally:
            sock.close()
        return b"".join(chunks).decode("utf-8", "replace")

    def peer_pid(self) -> int | None:
        """The pid of the process serving the socket (SO_PEERCRED), None if none does."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.socket_path))
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        except OSError:
            return None
        finally:
            sock.close()
        return int.from_bytes(creds[:4], "little") or None

    def answers(self) -> bool:
        try:
            self.get()
        except ControlError:
            return False
        return True

    def get(self) -> DeviceState:
        body, code = _split_errno(self._exchange(b"get=1\n\n"))
        if code:
            raise ControlError(f"get on {self.socket_path} failed: {os.strerror(code)}")
        return decode_get(body)

    def set(self, update: DeviceUpdate) -> None:
        _body, code = _split_errno(self._exchange(encode_set(update)))
        if code:
            raise ControlError(f"set on {self.socket_path} failed: {os.strerror(code)}")


def is_stale_socket(path: Path) -> bool:
    """A socket file nobody listens on (its process was killed without clean-up)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(info.st_mode):
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(1.0)
        sock.connect(str(path))
    except ConnectionRefusedError:
        return True
    except OSError as err:
        return err.errno == errno.ECONNREFUSED
    finally:
        sock.close()
    return False
