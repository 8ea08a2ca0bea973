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
``RECHECK`` seconds, because a peer changed with ``wg`` raises no kernel event. A lease
without a usable key and port is refused, and its public key is the identity it claims
(``backend/admission.py``): a lease with another node's key is never merged into that
node's peer. Handshakes
that keep failing with a peer that does reach us (another PSK or key) are logged naming the
peer and counted on /metrics and /status, never silent; they do not make this node not
ready (the other node is as likely to be the misconfigured one).
For ``flannelctl cleanup`` (``leftovers``): a wireguard-go serving one of our devices in
the node's network namespace (stopped, which removes its device and its socket
``/run/wireguard/<name>.sock``), or the device and a stale socket it left; the private key
flanneld created (``/run/flannel/wgkey``, only when it holds a key) and wireguard-go's logs
``/run/flannel/<name>.log``.
Must not touch: the store; routes and links other than the devices'; the key outside its
file (never logged, never in an error, readiness or status).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
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
from flannel.backend.footprint import COVERING, Footprint, Leftovers, Link, Place
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
from flannel.process import procstop
from flannel.process.procscan import processes_here, same_netns
from flannel.wireguard.config import (
    DEVICE,
    DEVICE_V6,
    ENCAP_OVERHEAD,
    OPTION_NAMES,
    DeviceLayout,
    WireguardConfig,
    decode_lease_data,
    encode_lease_data,
)
from flannel.wireguard.device import DeviceSpec, WireguardDevice, WireguardDeviceError
from flannel.wireguard.genl import GenlControl
from flannel.wireguard.handshakes import HandshakeWatch
from flannel.wireguard.keys import (
    KeyFileError,
    key_file_path,
    load_or_create_private_key,
    parse_key,
)
from flannel.wireguard.peers import LocalEndpoints, WireguardPeers, desired_peers
from flannel.wireguard.uapi import Control, ControlError, Peer, UapiControl, is_stale_socket

log = logging.getLogger(__name__)

#: Seconds between peer checks: a peer removed or changed by hand is back within a second.
RECHECK = 0.5
STOP_TIMEOUT = 5.0  # for a wireguard-go to exit on SIGTERM before it gets SIGKILL
PEER = "WireGuard peer"
NO_KEY = ("its wireguard backend data has no valid PublicKey and Port (a wireguard lease needs "
          "{\"PublicKey\":\"<base64 key>\",\"Port\":<port>}); the node that owns it rewrites "
          "it on restart, or delete the lease")


def peer_entry(device: str, peer: Peer) -> EngineEntry:
    """What the device holds for a peer, as the operator tools compare it (never a PSK)."""
    return EngineEntry(PEER, device, peer.public_key,
                       (("endpoint", peer.endpoint or "none"),
                        ("allowed ips", ", ".join(sorted(peer.allowed_ips)))))


def carrier(layout: DeviceLayout, config: NetworkConfig) -> Carrier:
    """What one device carries: WireGuard on its listen port, whose socket takes datagrams
    over either IP version of the underlay."""
    return Carrier("WireGuard", udp_ports=(layout.listen_port,), refuses=True,
                   versions=versions(config), authenticated=True)


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

    @classmethod
    def lease_problem(cls, lease: Lease, config: NetworkConfig) -> str | None:
        return None if cls._keys(lease) else NO_KEY

    @classmethod
    def identities(cls, lease: Lease, config: NetworkConfig) -> tuple[str, ...]:
        """Its public key: a peer of ours with it gets that node's subnets and endpoint."""
        return tuple(f"PublicKey {key}" for key in cls._keys(lease))

    @staticmethod
    def _keys(lease: Lease) -> list[str]:
        """The public keys of both families' data (one, for a node of ours or Go's)."""
        keys = {data.public_key for raw in (lease.attrs.backend_data,
                                            lease.attrs.backend_v6_data)
                if (data := decode_lease_data(raw)) is not None}
        return sorted(keys)

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        wg = WireguardConfig.from_backend(config.backend)
        return tuple(carrier(layout, config)
                     for layout in wg.devices(config.enable_ipv4, config.enable_ipv6))

    def ensure_local(self) -> None:
        self._ensure_devices()

    def appliers(self) -> Sequence[PeerApplier]:
        return (self._applier,)

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def leftovers(cls, place: Place) -> Leftovers:
        found = Leftovers()
        run_dir = place.run_dir
        for name in (DEVICE, DEVICE_V6):
            present = place.devices.get(name)
            _wireguard_go_items(found, name, present[0] if present and present[1] == "tun"
                                else 0, run_dir / "wireguard" if run_dir is not None else None)
        key = place.key_file or (run_dir / "flannel" / "wgkey" if run_dir is not None
                                 else None)
        if key is not None and (key.exists() or key.is_symlink()):
            if _holds_key(key):
                found.items.append((f"file {key}", key.unlink))
            else:
                found.kept.append(f"file {key}: does not hold a WireGuard key")
        logs = [run_dir / "flannel" / f"{name}.log" for name in (DEVICE, DEVICE_V6)] \
            if run_dir is not None else []
        for log_file in logs:  # wireguard-go's output
            try:
                regular = stat.S_ISREG(log_file.lstat().st_mode)
            except OSError:
                continue
            if regular:
                found.items.append((f"file {log_file}", log_file.unlink))
            else:
                found.kept.append(f"{log_file}: not a regular file")
        return found

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
            out = []
            for layout in layouts:
                # The applier's own computation, for this one lease.
                peers = desired_peers(wg, layout, [lease], local)
                entries = tuple(peer_entry(layout.name, peer) for peer in peers)
                # The port the peer's lease publishes, where it listens.
                port = next((_port(peer) for peer in peers), 0) or layout.listen_port
                carried = replace(carrier(layout, config), udp_ports=(port,))
                for version in layout.families:
                    subnet, public = family_subnet(lease, version)
                    if subnet is None:
                        continue
                    if not entries:
                        out.append(FamilyPlan(version, subnet, public, skipped=NO_KEY))
                        continue
                    out.append(FamilyPlan(version, subnet, public,
                                          routes=routes.get(version, frozenset()),
                                          engine=entries, carrier=carried,
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
        self._reported: set[str] = set()
        self._peers = 0
        self._failing = 0

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        backend = self.backend
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


# -- what cleanup removes ----------------------------------------------------------------------

def _holds_key(path: Path) -> bool:
    """A regular file (never a symlink) of bounded size holding a WireGuard key."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > 64 * 1024:
            return False
        parse_key(path.read_bytes().decode("utf-8"), "the file")
    except (OSError, UnicodeDecodeError, KeyFileError):
        return False
    return True


def _argv(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [arg for arg in handle.read(4096).split(b"\0") if arg]
    except OSError:
        return []


def _serves(name: str) -> Callable[[bytes], bool]:
    def matches(cmdline: bytes) -> bool:
        argv = [arg for arg in cmdline.split(b"\0") if arg]
        return bool(argv) and os.path.basename(argv[0]) == b"wireguard-go" \
            and name.encode() in argv
    return matches


def _delete_tun(name: str) -> None:
    """By name: when its wireguard-go stopped, the device went with it."""
    with Rtnl() as sock:
        found = links.get_link(sock, name)
        if found is not None and found.kind == "tun":
            links.delete_link(sock, found.link.index, "delete the device")


def _stop(pid: int, socket_path: Path | None, name: str) -> None:
    """SIGTERM (wireguard-go then removes its device and socket), SIGKILL after
    STOP_TIMEOUT; then whatever it left: its device and a stale socket."""
    stopped = procstop.stop(pid, STOP_TIMEOUT)
    _delete_tun(name)
    if socket_path is not None and is_stale_socket(socket_path):
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
    if not stopped:
        raise OSError(f"wireguard-go {pid} did not stop")


def _wireguard_go_items(found: Leftovers, name: str, tun: int, socket_dir: Path | None
                        ) -> None:
    """The wireguard-go serving ``name`` in this network namespace, its tun device (when
    ``tun``, its index) and its socket in ``socket_dir`` (None: its socket is out of sight,
    so the process is found by its command line)."""
    delete_device = functools.partial(_delete_tun, name)
    if socket_dir is None:
        pids = processes_here(_serves(name)) if tun else []
        if pids:
            found.items.append((f"wireguard-go process {pids[0]} serving {name} (its device "
                                "goes with it)", functools.partial(_stop, pids[0], None, name)))
        elif tun:
            found.items.append((f"device {name} (tun: its wireguard-go is gone)",
                                delete_device))
        return
    socket_path = socket_dir / f"{name}.sock"
    control = UapiControl(socket_path, timeout=1.0)
    pid = control.peer_pid() if control.answers() else None
    argv = _argv(pid) if pid else []
    serves_us = bool(argv) and os.path.basename(argv[0]) == b"wireguard-go" \
        and name.encode() in argv and same_netns(pid or 0)
    if pid and serves_us:
        found.items.append((f"wireguard-go process {pid} serving {name} (socket "
                            f"{socket_path}; its device goes with it)",
                            functools.partial(_stop, pid, socket_path, name)))
        return
    if pid:
        found.kept.append(f"socket {socket_path}: served by process {pid}, not a "
                          f"wireguard-go for {name} in this network namespace")
    if tun:
        found.items.append((f"device {name} (tun: its wireguard-go is gone)", delete_device))
    if is_stale_socket(socket_path):
        found.items.append((f"stale socket {socket_path} (its wireguard-go is gone)",
                            socket_path.unlink))
