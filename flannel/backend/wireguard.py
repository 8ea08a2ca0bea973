"""The wireguard backend: pod traffic between nodes encrypted by WireGuard, wire-compatible
with Go flannel.

Owns the backend's life on the data plane contract: the config (``flannel.wireguard.config``)
checked when the backend is created; ``prepare`` loads or creates the private key
(``/run/flannel/wgkey``, ``WIREGUARD_KEY_FILE``), brings up ``flannel-wg`` (and
``flannel-wg-v6`` in ``separate`` mode) with kernel WireGuard or wireguard-go, and publishes
``{"PublicKey":..,"Port":..}`` per family; ``activate`` puts the lease address and the route
to the cluster network on the devices; ``ensure_local`` re-creates what is missing (a
wireguard-go that died is restarted); the ``wireguard peers`` applier keeps every device's
peers equal to the remote leases and asks the data plane to re-check them every
``RECHECK`` seconds, because a peer changed with ``wg`` raises no kernel event. Handshakes
that keep failing with a peer that does reach us (another PSK or key) are logged naming the
peer and counted on /metrics and /status, never silent; they do not make this node not
ready (the other node is as likely to be the misconfigured one).
Must not touch: the store; routes and links other than the devices'; the key outside its
file (never logged, never in an error, readiness or status).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pathlib import Path

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendError,
    BackendOptions,
    EngineSample,
    LocalNetwork,
    PeerPlanner,
)
from flannel.backend.footprint import COVERING, Footprint, Link
from flannel.backend.plan import (
    Carrier,
    DevicePlan,
    EngineEntry,
    EngineReading,
    FamilyPlan,
    NodePlan,
    NodeView,
    base_address,
    family_subnet,
    local_addresses,
    versions,
)
from flannel.config import NetworkConfig
from flannel.kernel import links
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.rtnl import Route, Rtnl
from flannel.lease import Lease
from flannel.wireguard.config import (
    DEVICE,
    DEVICE_V6,
    ENCAP_OVERHEAD,
    OPTION_NAMES,
    DeviceLayout,
    WireguardConfig,
    encode_lease_data,
)
from flannel.wireguard.device import DeviceSpec, WireguardDevice, WireguardDeviceError
from flannel.wireguard.genl import GenlControl
from flannel.wireguard.handshakes import HandshakeWatch
from flannel.wireguard.keys import KeyFileError, key_file_path, load_or_create_private_key
from flannel.wireguard.peers import LocalEndpoints, WireguardPeers, desired_peers, skipped_leases
from flannel.wireguard.uapi import Control, ControlError, Peer, UapiControl

log = logging.getLogger(__name__)

#: Seconds between peer checks: a peer removed or changed by hand is back within a second.
RECHECK = 0.5
PEER = "WireGuard peer"
NO_KEY = ("its wireguard backend data has no valid PublicKey and Port (a wireguard lease needs "
          "{\"PublicKey\":\"<base64 key>\",\"Port\":<port>}); the node that owns it rewrites "
          "it on restart, or delete the lease")


def peer_entry(device: str, peer: Peer) -> EngineEntry:
    """What the device holds for a peer, as the operator tools compare it (never a PSK)."""
    return EngineEntry(PEER, device, peer.public_key,
                       (("endpoint", peer.endpoint or "none"),
                        ("allowed ips", ", ".join(sorted(peer.allowed_ips)))))


def _port(peer: Peer) -> int:
    return int(peer.endpoint.rsplit(":", 1)[1]) if peer.endpoint else 0


class _Device:
    """One WireGuard device of the backend: its layout, the device and its peer reconciler."""

    def __init__(self, layout: DeviceLayout, device: WireguardDevice) -> None:
        self.layout = layout
        self.device = device
        self.peers = WireguardPeers(device)
        self.handshakes = HandshakeWatch()


class WireguardBackend(Backend):
    backend_type = "wireguard"
    # The device's peers (their AllowedIPs) pick the node; the route covers the Network.
    # wireguard-go serves the devices as tun devices where the kernel has no WireGuard.
    footprint = Footprint(COVERING, device=DEVICE, dual_stack=True,
                          links=(Link(r"flannel-wg(-v6)?", "wireguard", userspace="tun",
                                      names=(DEVICE, DEVICE_V6)),))
    option_names = OPTION_NAMES

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        WireguardConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.wg = WireguardConfig.from_backend(self.config.backend)
        self.devices: list[_Device] = []
        self._applier = PeerApplier(self)

    def _mtu(self) -> int:
        return self.wg.device_mtu(self.ext.mtu)

    async def prepare(self) -> LocalNetwork:
        if self.wg.mtu > self.ext.mtu:
            log.warning("the wireguard MTU option (%d) exceeds %s's MTU (%d): encrypted "
                        "packets larger than %d bytes will not fit the underlay", self.wg.mtu,
                        self.ext.name, self.ext.mtu, self.ext.mtu)
        for version, enabled, addr in ((4, self.config.enable_ipv4, self.ext.ext_addr),
                                       (6, self.config.enable_ipv6, self.ext.ext_v6_addr)):
            if enabled and addr is None:
                flag = "--public-ipv6" if version == 6 else "--public-ip"
                raise BackendError(f"wireguard needs an IPv{version} address on "
                                   f"{self.ext.name} (or {flag})")
        path = key_file_path()
        try:
            key, created = await asyncio.to_thread(load_or_create_private_key, path)
        except KeyFileError as err:
            raise BackendError(str(err)) from None
        log.info("%s WireGuard private key %s", "created" if created else "using", path)
        for layout in self.wg.devices(self.config.enable_ipv4, self.config.enable_ipv6):
            spec = DeviceSpec(layout.name, layout.listen_port, self._mtu(), key,
                              host=self.options.host)
            self.devices.append(_Device(layout, WireguardDevice(spec)))
        await asyncio.to_thread(self._ensure_devices)
        public = self.devices[0].device.public_key
        return LocalNetwork(
            "wireguard", self._mtu(),
            encode_lease_data(public, self.wg.listen_port) if self.config.enable_ipv4 else None,
            encode_lease_data(public, self.wg.listen_port_v6) if self.config.enable_ipv6
            else None)

    def _ensure_devices(self) -> None:
        for dev in self.devices:
            dev.device.reap()
            try:
                dev.device.ensure()
            except WireguardDeviceError as err:
                raise BackendError(str(err)) from None

    async def activate(self, lease: Lease) -> None:
        await super().activate(lease)
        for dev in self.devices:
            addresses: list[tuple[IPv4Address | IPv6Address, IPv4Network | IPv6Network]] = []
            routes: list[IPv4Network | IPv6Network] = []
            for version in dev.layout.families:
                subnet = lease.subnet if version == 4 else lease.ipv6_subnet
                network = self.config.network if version == 4 else self.config.ipv6_network
                if subnet is not None and network is not None:
                    addresses.append((subnet.network_address, network))
                    routes.append(network)
            dev.device.spec = replace(dev.device.spec, addresses=tuple(addresses),
                                      routes=tuple(routes))
        await asyncio.to_thread(self._ensure_devices)

    def ensure_local(self) -> None:
        self._ensure_devices()

    def appliers(self) -> Sequence[PeerApplier]:
        return (self._applier,)

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        wg = WireguardConfig.from_backend(node.config.backend)
        return NodePlan(devices=tuple(DevicePlan(layout.name, version, ENCAP_OVERHEAD)
                                      for layout in wg.devices(node.config.enable_ipv4,
                                                               node.config.enable_ipv6)
                                      for version in layout.families),
                        local=local_addresses(node, on_base=True))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        wg = WireguardConfig.from_backend(node.config.backend)
        config = node.config
        layouts = wg.devices(config.enable_ipv4, config.enable_ipv6)
        local = LocalEndpoints(node.public_ip, node.public_ipv6)
        # The device's route to the Network, as its ``ensure`` makes it.
        routes = {version: frozenset({Route(str(network), None, node.device(layout.name))})
                  for layout in layouts for version in layout.families
                  if (network := config.network if version == 4 else config.ipv6_network)}

        def plan(lease: Lease) -> tuple[FamilyPlan, ...]:
            if skipped_leases([lease]):
                return tuple(FamilyPlan(v, subnet, public, skipped=NO_KEY)
                             for v in versions(config)
                             for subnet, public in [family_subnet(lease, v)] if subnet)
            out = []
            for layout in layouts:
                # The applier's own computation, for this one lease.
                peers = desired_peers(wg, layout, [lease], local)
                entries = tuple(peer_entry(layout.name, peer) for peer in peers)
                port = next((_port(peer) for peer in peers), 0) or layout.listen_port
                carrier = Carrier("WireGuard", udp_ports=(port,), refuses=True)
                for version in layout.families:
                    subnet, public = family_subnet(lease, version)
                    if subnet is None:
                        continue
                    if not entries:
                        out.append(FamilyPlan(version, subnet, public, skipped=NO_KEY))
                        continue
                    out.append(FamilyPlan(version, subnet, public,
                                          routes=routes.get(version, frozenset()),
                                          engine=entries, carrier=carrier,
                                          answers_on=base_address(subnet)))
            return tuple(sorted(out, key=lambda family: family.version))

        return plan

    @classmethod
    def read_engine(cls, node: NodeView, root: Path | None) -> EngineReading:
        """Every device's peers, with the age of each one's latest handshake: from the
        kernel (generic netlink) or the wireguard-go serving it (its UAPI socket under
        ``root``/run/wireguard)."""
        wg = WireguardConfig.from_backend(node.config.backend)
        entries: dict[tuple[str, str, str], EngineEntry] = {}
        notes: dict[tuple[str, str, str], str] = {}
        unread = []
        now = time.time()
        for layout in wg.devices(node.config.enable_ipv4, node.config.enable_ipv6):
            with Rtnl() as sock:
                found = links.get_link(sock, layout.name)
            if found is None:
                continue  # no device: the device check says so
            if found.kind == "wireguard":
                control: Control = GenlControl(layout.name)
            elif root is not None:
                control = UapiControl(root / "run" / "wireguard" / f"{layout.name}.sock",
                                      timeout=2.0)
            else:
                continue  # wireguard-go's socket is where flanneld's /run is
            try:
                state = control.get()
            except ControlError as err:
                unread.append(str(err))
                continue
            for peer_state in state.peers.values():
                entry = peer_entry(layout.name, peer_state.peer.normalised())
                entries[entry.identity] = entry
                seen = peer_state.last_handshake
                notes[entry.identity] = ("no handshake yet" if seen is None else
                                         f"latest handshake {max(0.0, now - seen):.0f}s ago")
        return EngineReading(entries, notes, "; ".join(unread))


class PeerApplier(Applier):
    """The ``wireguard peers`` engine: every device's peers from the remote leases."""

    name = "wireguard peers"

    def __init__(self, backend: WireguardBackend) -> None:
        self.backend = backend
        self._warned: set[str] = set()
        self._reported: set[str] = set()
        self._peers = 0
        self._failing = 0

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        backend = self.backend
        for key in skipped_leases(peers):
            if key not in self._warned:
                self._warned.add(key)
                log.warning("ignoring peer %s: %s", key, NO_KEY)
        local = LocalEndpoints(backend.ext.ext_addr, backend.ext.ext_v6_addr)
        changes = configured = 0
        errors: list[str] = []
        failing: dict[str, float] = {}  # "peer <subnets> (public key ...) on <device>"
        for dev in backend.devices:
            desired = desired_peers(backend.wg, dev.layout, peers, local)
            configured += len(desired)
            status = dev.peers.reconcile(desired)
            changes += status.changes
            if not status.in_sync:
                errors.append(f"{dev.layout.name}: {status.last_error}")
                continue
            subnets = {p.public_key: ", ".join(sorted(p.allowed_ips)) for p in desired}
            for key, seconds in dev.handshakes.observe(status.states,
                                                       status.checked_at).items():
                failing[f"peer {subnets.get(key, '?')} (public key {key}) on "
                        f"{dev.layout.name}"] = seconds
        self._log_failing(failing)
        # Not an error of this node's data plane: a peer with another PSK fails with every
        # node, and making them all not ready would let one misconfigured node take the
        # whole cluster out of service (and stall any rollout gated on readiness).
        self._peers, self._failing = configured, len(failing)
        return ApplyResult(changes, "; ".join(errors), recheck=RECHECK)

    def samples(self) -> list[EngineSample]:
        """Peers configured and peers whose handshakes keep failing, as the last pass saw."""
        return [EngineSample("wireguard_peers", "Peers configured on the WireGuard devices.",
                             self._peers),
                EngineSample("wireguard_peers_failing_handshakes",
                             "Peers that send to us but complete no handshake (another PSK "
                             "or key); each is named in the log.", self._failing)]

    def _log_failing(self, failing: dict[str, float]) -> None:
        """Once per peer while it keeps failing, and once when it recovers."""
        for peer, seconds in sorted(failing.items()):
            if peer not in self._reported:
                log.error("wireguard handshakes keep failing with %s for %.0fs: the peer "
                          "sends, but no session is established, so its PSK or keys differ "
                          "from ours; give every node the same PSK in the network config "
                          "and restart the nodes whose flanneld runs with another",
                          peer, seconds)
        for peer in sorted(self._reported - set(failing)):
            log.info("wireguard handshakes no longer failing with %s", peer)
        self._reported = set(failing)
