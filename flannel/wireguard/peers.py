"""WireGuard peers: remote leases -> desired peers, desired vs actual -> changes, and status.

Owns: how Go flannel turns a remote lease into a peer (public key from the lease data,
endpoint ``PublicIP:Port`` / ``[PublicIPv6]:Port`` with our own listen port when the lease
advertises none, AllowedIPs = the peer's subnet(s), the config's PSK and keepalive, the
auto-mode endpoint family choice), the minimal change set between desired and actual peers,
and the reconciler that applies it and reports status.

API: ``LocalEndpoints`` (our external addresses, for auto mode), ``desired_peers(cfg, layout,
leases, local) -> list[Peer]``, ``diff_peers(desired, actual) -> tuple[PeerUpdate, ...]``,
``WireguardPeers(device).reconcile(desired) -> PeerStatus`` (synchronous, one ``get`` and at
most one ``set``; call it from a worker thread after every lease change and every ~0.5 s so
that a peer changed by hand is restored within a second). The reconciler owns no task.
The endpoint is restored too: a peer that roamed away from the address its lease
advertises is put back (``--public-ip`` names the address peers must use).
Must not touch: routes, addresses, the store. Logs public keys only, never a private key or
PSK.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Protocol

from flannel.lease import Lease
from flannel.wireguard.config import DeviceLayout, WireguardConfig, decode_lease_data
from flannel.wireguard.device import WireguardDeviceError
from flannel.wireguard.uapi import (
    Control,
    ControlError,
    ControlUnavailable,
    DeviceUpdate,
    Peer,
    PeerState,
    PeerUpdate,
)

log = logging.getLogger(__name__)

# Go's net.IP.IsPrivate: RFC 1918 and RFC 4193 only.
_PRIVATE_V4 = (IPv4Network("10.0.0.0/8"), IPv4Network("172.16.0.0/12"),
               IPv4Network("192.168.0.0/16"))
_ULA = IPv6Network("fc00::/7")
# A handshake older than this (REJECT_AFTER_TIME) no longer carries traffic.
HANDSHAKE_VALID = 180.0


def _is_private(addr: IPv4Address | IPv6Address) -> bool:
    if addr.version == 4:
        return any(addr in net for net in _PRIVATE_V4)
    return addr in _ULA


@dataclass(frozen=True)
class LocalEndpoints:
    """Our external addresses (``ExtAddr`` / ``ExtV6Addr``), for the auto-mode choice."""

    ext_addr: IPv4Address | None = None
    ext_v6_addr: IPv6Address | None = None


def _auto_endpoint_host(v4: IPv4Address | None, v6: IPv6Address | None,
                        local: LocalEndpoints) -> str | None:
    """Go's choice: v4 unless the peer has only v6, or both sides have non-ULA v6 and the
    peer's v4 is private or we have no v4."""
    if v4 is None and v6 is None:
        return None
    if v6 is None:
        return str(v4)
    if v4 is None:
        return f"[{v6}]"
    if not _is_private(v4) and local.ext_addr is not None:
        return str(v4)
    if not _is_private(v6) and local.ext_v6_addr is not None and not _is_private(
            local.ext_v6_addr):
        return f"[{v6}]"
    return str(v4)


def desired_peers(cfg: WireguardConfig, layout: DeviceLayout, leases: Iterable[Lease],
                  local: LocalEndpoints) -> list[Peer]:
    """The peers device ``layout`` must hold for the remote ``leases`` (wireguard ones).

    A lease whose data carries no usable public key is skipped (logged by the caller's
    status, never fatal). Two leases with one key (a node registered again: no other node's
    lease shares a key, the backend's admission refuses it) merge their subnets.
    """
    single = len(layout.families) > 1 or cfg.mode != "separate"
    by_key: dict[str, Peer] = {}
    for lease in leases:
        if lease.attrs.backend_type != "wireguard":
            continue
        v4_data = decode_lease_data(lease.attrs.backend_data)
        v6_data = decode_lease_data(lease.attrs.backend_v6_data)
        nets: list[IPv4Network | IPv6Network] = []
        if 4 in layout.families and lease.subnet is not None and lease.subnet.prefixlen:
            nets.append(lease.subnet)
        if 6 in layout.families and lease.ipv6_subnet is not None:
            nets.append(lease.ipv6_subnet)
        if not nets:
            continue
        if not single:
            version = layout.families[0]
            data = v4_data if version == 4 else v6_data
            addr = lease.attrs.public_ip if version == 4 else lease.attrs.public_ipv6
            host = None if addr is None else (str(addr) if version == 4 else f"[{addr}]")
        else:
            # Go takes the key of the last enabled family's data.
            data = v6_data if 6 in layout.families and v6_data else v4_data
            v4 = lease.attrs.public_ip if lease.attrs.public_ip != IPv4Address(0) else None
            if cfg.mode == "ipv6":
                v4 = None
            v6 = lease.attrs.public_ipv6 if cfg.mode != "ipv4" else None
            host = _auto_endpoint_host(v4, v6, local)
        if data is None:
            continue
        # In single-device modes only the device's one port is open; the v6 data advertises
        # ListenPortV6 regardless (a Go quirk), so the v4 data's port is the one to trust.
        port_data = v4_data if single and v4_data else data
        port = port_data.port or layout.listen_port
        endpoint = f"{host}:{port}" if host else None
        prior = by_key.get(data.public_key)
        allowed = frozenset(str(n) for n in nets) | (prior.allowed_ips if prior else frozenset())
        by_key[data.public_key] = Peer(data.public_key, endpoint, allowed, cfg.psk,
                                       cfg.keepalive).normalised()
    return list(by_key.values())


def diff_peers(desired: Iterable[Peer], actual: Mapping[str, PeerState]
               ) -> tuple[PeerUpdate, ...]:
    """The fewest changes that turn ``actual`` into ``desired``: new peers in full, changed
    fields of existing peers only, then removals (a subnet that moved to a new key is taken
    by the new peer before the old one goes)."""
    adds: list[PeerUpdate] = []
    wanted = {p.public_key: p.normalised() for p in desired}
    for key, want in sorted(wanted.items()):
        have = actual.get(key)
        if have is None:
            adds.append(PeerUpdate(key, endpoint=want.endpoint, psk=want.psk,
                                   set_psk=want.psk is not None, keepalive=want.keepalive,
                                   allowed_ips=want.allowed_ips))
            continue
        cur = have.peer
        set_psk = want.psk != cur.psk
        change = PeerUpdate(
            key, update_only=True,
            endpoint=want.endpoint if want.endpoint and want.endpoint != cur.endpoint else None,
            psk=want.psk if set_psk else None, set_psk=set_psk,
            keepalive=want.keepalive if want.keepalive != cur.keepalive else None,
            allowed_ips=want.allowed_ips if want.allowed_ips != cur.allowed_ips else None)
        if change != PeerUpdate(key, update_only=True):
            adds.append(change)
    removals = [PeerUpdate(key, remove=True) for key in sorted(actual) if key not in wanted]
    return (*adds, *removals)


def describe(update: PeerUpdate) -> str:
    """A log line for one change: public key and field names, never a PSK."""
    if update.remove:
        return f"remove peer {update.public_key}"
    fields = [name for name, changed in (
        ("endpoint", update.endpoint is not None), ("preshared key", update.set_psk),
        ("keepalive", update.keepalive is not None),
        ("allowed IPs", update.allowed_ips is not None)) if changed]
    verb = "update" if update.update_only else "add"
    return f"{verb} peer {update.public_key} ({', '.join(fields) or 'no fields'})"


@dataclass
class PeerStatus:
    """What the last pass found. ``handshake_age``: seconds since each peer's last handshake
    (None: never) — the metric source; ``without_handshake``: peers with none recently."""

    in_sync: bool = False
    last_error: str = ""
    changes: int = 0
    handshake_age: dict[str, float | None] = field(default_factory=dict)
    checked_at: float = 0.0
    states: dict[str, PeerState] = field(default_factory=dict)  # the wanted peers, as read

    def without_handshake(self, limit: float = HANDSHAKE_VALID) -> list[str]:
        return sorted(k for k, age in self.handshake_age.items() if age is None or age > limit)

    def summary(self) -> str:
        if not self.in_sync:
            return f"wireguard peers not in sync: {self.last_error}"
        missing = self.without_handshake()
        if missing:
            return (f"no recent handshake with {len(missing)} of {len(self.handshake_age)} "
                    "peers (keys or PSK differ, or the peer is unreachable): "
                    + ", ".join(missing[:5]))
        return "wireguard peers in sync"


class PeerDevice(Protocol):
    """What the reconciler needs of a device (``device.WireguardDevice`` provides it)."""

    name: str
    control: Control

    def ensure(self) -> None:
        """Re-create or restart the device when nothing answers on its control channel."""


class WireguardPeers:
    """Keeps one device's peers equal to the desired set."""

    def __init__(self, device: PeerDevice, clock: Callable[[], float] = time.time) -> None:
        self.device = device
        self.clock = clock
        self.status = PeerStatus()

    def reconcile(self, desired: Sequence[Peer]) -> PeerStatus:
        try:
            changes = self._pass(desired)
        except (ControlError, WireguardDeviceError) as err:
            if self.status.last_error != str(err):
                log.error("wireguard %s: %s", self.device.name, err)
            self.status = PeerStatus(False, str(err), 0, self.status.handshake_age,
                                     self.clock())
            return self.status
        if changes:
            log.info("wireguard %s: %s", self.device.name,
                     "; ".join(describe(c) for c in changes))
        return self.status

    def _pass(self, desired: Sequence[Peer]) -> tuple[PeerUpdate, ...]:
        try:
            state = self.device.control.get()
        except ControlUnavailable as err:
            log.warning("wireguard %s does not answer (%s); bringing it back",
                        self.device.name, err)
            self.device.ensure()
            state = self.device.control.get()
        changes = diff_peers(desired, state.peers)
        if changes:
            self.device.control.set(DeviceUpdate(peers=changes))
            state = self.device.control.get()
            left = diff_peers(desired, state.peers)
            if left:
                raise ControlError(f"{len(left)} peer changes did not take: "
                                   + "; ".join(describe(c) for c in left[:3]))
        now = self.clock()
        wanted = {p.public_key for p in desired}
        states = {key: st for key, st in state.peers.items() if key in wanted}
        ages = {key: (None if st.last_handshake is None else max(0.0, now - st.last_handshake))
                for key, st in states.items()}
        self.status = PeerStatus(True, "", len(changes), ages, now, states)
        return changes
