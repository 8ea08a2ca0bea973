"""The wireguard backend's config and lease data, as Go flannel reads and writes them.

Owns: decoding the ``Backend`` object (``ListenPort`` 51820, ``ListenPortV6`` 51821, ``MTU``,
``PSK``, ``PersistentKeepaliveInterval`` in seconds, ``Mode`` separate | auto | ipv4 | ipv6;
member names case-insensitive), the device layout per mode, the MTU (minus 80), and the lease
data ``{"PublicKey":"<base64>","Port":<port>}`` byte for byte as Go marshals it.

API: ``WireguardConfig.from_backend(backend_obj)`` (raises ``BackendConfigError`` with Go's prefix
``error decoding backend config``), ``cfg.devices(enable_ipv4, enable_ipv6)`` ->
``[DeviceLayout]``, ``cfg.mtu(ext_mtu)``, ``encode_lease_data(public_key, port)``,
``decode_lease_data(raw) -> LeaseData | None``.
Must not touch: files, the kernel, the store.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from flannel.backendconf.errors import BackendConfigError
from flannel.backendconf.options import decode_options
from flannel.untrusted import boundedjson, gojson
from flannel.wireguard.keys import KeyFileError, Secret, parse_key

MODES = ("separate", "auto", "ipv4", "ipv6")
DEVICE = "flannel-wg"
DEVICE_V6 = "flannel-wg-v6"
# Outer IPv6 (40) + UDP (8) + WireGuard data header (16) + auth tag (16): fits both families.
ENCAP_OVERHEAD = 80
_CONTEXT = "error decoding backend config"
#: The backend options: (type, default) by name.
_OPTIONS: dict[str, tuple[type, Any]] = {
    "ListenPort": (int, 51820), "ListenPortV6": (int, 51821), "MTU": (int, 0),
    "PSK": (str, ""), "PersistentKeepaliveInterval": (int, 0), "Mode": (str, "separate"),
}
OPTION_NAMES = tuple(_OPTIONS)
# The kernel keeps the keepalive interval in 16 bits.
_MAX_KEEPALIVE = 65535


@dataclass(frozen=True)
class DeviceLayout:
    """One WireGuard device: its name, listen port and the IP families it carries."""

    name: str
    listen_port: int
    families: tuple[int, ...]


@dataclass(frozen=True)
class WireguardConfig:
    listen_port: int = 51820
    listen_port_v6: int = 51821
    mtu: int = 0
    psk: Secret | None = None
    keepalive: int = 0
    mode: str = "separate"

    @classmethod
    def from_backend(cls, backend: dict[str, Any]) -> WireguardConfig:
        fields = decode_options(backend, _OPTIONS, _CONTEXT, secrets={
            "PSK": "PSK must be a string (a base64 key from `wg genpsk`)"})
        for name in ("ListenPort", "ListenPortV6"):
            if not 1 <= fields[name] <= 65535:
                raise BackendConfigError(
                    f"{_CONTEXT}: {name} {fields[name]} is not a UDP port; use "
                    "1 to 65535")
        if fields["MTU"] and not 1280 <= fields["MTU"] <= 65535:
            raise BackendConfigError(f"{_CONTEXT}: MTU {fields['MTU']} is out of range; give the "
                                     "underlay MTU (1280 to 65535), or leave it out to use the "
                                     "external interface's")
        keepalive = fields["PersistentKeepaliveInterval"]
        if not 0 <= keepalive <= _MAX_KEEPALIVE:
            raise BackendConfigError(
                f"{_CONTEXT}: PersistentKeepaliveInterval {keepalive} is out of "
                f"range; give seconds from 0 (off) to {_MAX_KEEPALIVE}")
        if fields["Mode"] not in MODES:
            raise BackendConfigError(f"no valid Mode configured: {json.dumps(fields['Mode'])}; use "
                                     "one of separate, auto, ipv4, ipv6")
        psk = None
        if fields["PSK"]:
            try:
                psk = parse_key(fields["PSK"], "the wireguard backend's PSK")
            except KeyFileError as err:
                raise BackendConfigError(f"{_CONTEXT}: {err}") from None
        return cls(fields["ListenPort"], fields["ListenPortV6"], fields["MTU"], psk,
                   keepalive, fields["Mode"])

    def devices(self, enable_ipv4: bool, enable_ipv6: bool) -> list[DeviceLayout]:
        """The devices Go flannel creates for the enabled families in this mode."""
        families = tuple(v for v, on in ((4, enable_ipv4), (6, enable_ipv6)) if on)
        if self.mode != "separate":
            return [DeviceLayout(DEVICE, self.listen_port, families)] if families else []
        out = []
        if enable_ipv4:
            out.append(DeviceLayout(DEVICE, self.listen_port, (4,)))
        if enable_ipv6:
            out.append(DeviceLayout(DEVICE_V6, self.listen_port_v6, (6,)))
        return out

    def device_mtu(self, ext_mtu: int) -> int:
        """Link MTU of every device, and the MTU written to subnet.env."""
        return (self.mtu or ext_mtu) - ENCAP_OVERHEAD


@dataclass(frozen=True)
class LeaseData:
    public_key: str
    port: int  # 0: not advertised (older Go flannel); use our own listen port


def encode_lease_data(public_key: str, port: int) -> str:
    """``BackendData`` / ``BackendV6Data`` exactly as Go's ``json.Marshal`` emits them."""
    return f'{{"PublicKey":{json.dumps(public_key)},"Port":{port}}}'


def decode_lease_data(raw: str | None) -> LeaseData | None:
    """A peer's published key, in the one base64 spelling the device reports it in (a key
    spelled otherwise, e.g. with non-zero padding bits, is the same key: compared as
    written, the peer would never read back as set, and two spellings would let a lease
    claim another node's key unnoticed), and port; None when the data cannot describe a
    peer."""
    if not raw:
        return None
    try:
        obj = boundedjson.loads(raw, what="BackendData", max_bytes=boundedjson.MAX_LEASE_BYTES)
    except boundedjson.JSONLimitError:
        return None
    if not isinstance(obj, dict):
        return None
    try:
        fields = gojson.decode_fields(obj, {"PublicKey": (str, ""), "Port": (int, 0)},
                                      "wireguard lease data")
        key = parse_key(fields["PublicKey"], "PublicKey")
    except (ValueError, KeyFileError):
        return None
    if not 0 <= fields["Port"] <= 65535:
        return None
    return LeaseData(base64.b64encode(key.raw).decode(), fields["Port"])
