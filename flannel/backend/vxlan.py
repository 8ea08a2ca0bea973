"""The vxlan backend (the default): an overlay over UDP, wire-compatible with Go flannel.

Owns the backend config (VNI, Port, MTU, GBP, Learning, DirectRouting), the devices
``flannel.<VNI>`` / ``flannel-v6.<VNI>``, the lease data ``{"VNI":n,"VtepMAC":"..."}``, and
per peer: a permanent neighbour (peer subnet base -> peer VTEP MAC), a permanent FDB entry
(peer VTEP MAC -> peer public IP) and an onlink route via the peer's subnet base; with
DirectRouting, a plain route via the peer's public IP when it is on-link. A lease whose
VtepMAC the kernel would refuse (not 6 bytes, zero, multicast or broadcast) is refused, and
its VtepMAC per family is the identity it claims (``backend/admission.py``).
Must not touch: the store; routes of other protocols; other devices.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from ipaddress import IPv4Address, IPv6Address
from typing import Any

from flannel.backend.base import (
    BackendConfigError,
    BackendError,
    BackendOptions,
    LocalNetwork,
    PeerPlanner,
    RouteLookup,
)
from flannel.backend.footprint import PER_PEER, Footprint, Link
from flannel.backend.plan import (
    PLAIN,
    Carrier,
    DevicePlan,
    FamilyPlan,
    IPAddress,
    IPNetwork,
    NodePlan,
    NodeView,
    base_address,
    family_subnet,
    local_addresses,
    versions,
)
from flannel.backend.routed import RoutedBackend
from flannel.backend.vtep import (
    VtepFdb,
    VtepNeighbours,
    VtepRoutes,
    VtepTable,
    mac_number,
)
from flannel.backendconf.options import decode_options
from flannel.config import NetworkConfig
from flannel.kernel import device
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState, LinkState
from flannel.kernel.rtnl import Route, mac_bytes
from flannel.lease import Lease

log = logging.getLogger(__name__)

# Outer Ethernet is not counted: IPv4 (20) + UDP (8) + vxlan (8) + inner Ethernet (14).
# Over an IPv6 underlay the outer IP header is 40 bytes, so 70. Go flannel uses 50 for both,
# which leaves IPv6-underlay pods with an MTU the kernel will not carry.
ENCAP_OVERHEAD = {4: 50, 6: 70}
# The backend data every vxlan node writes, read without the JSON decoder (a snapshot holds
# thousands); any other text is decoded.
_GO_BACKEND_DATA = re.compile(
    r'\{"VNI":(?:0|-?[1-9][0-9]{0,18}),"VtepMAC":"([0-9a-fA-F:]{17})"\}\Z')


#: The backend options: (type, default) by name.
OPTIONS: dict[str, tuple[type, Any]] = {
    "VNI": (int, 1), "Port": (int, 0), "MTU": (int, 0), "GBP": (bool, False),
    "Learning": (bool, False), "DirectRouting": (bool, False),
}


@dataclass(frozen=True)
class VxlanConfig:
    vni: int = 1
    port: int = 0
    mtu: int = 0
    gbp: bool = False
    learning: bool = False
    direct_routing: bool = False

    @classmethod
    def from_backend(cls, backend: dict[str, Any]) -> VxlanConfig:
        fields = decode_options(backend, OPTIONS, "error decoding VXLAN backend config")
        cfg = cls(fields["VNI"], fields["Port"], fields["MTU"], fields["GBP"],
                  fields["Learning"], fields["DirectRouting"])
        if not 0 <= cfg.vni < 1 << 24:
            raise BackendConfigError(
                f"error decoding VXLAN backend config: VNI {cfg.vni} is out of "
                "range; use 0 to 16777215")
        if not 0 <= cfg.port <= 65535:
            raise BackendConfigError(f"error decoding VXLAN backend config: Port {cfg.port} is not "
                                     "a UDP port; use 0 for the kernel default (8472)")
        if cfg.mtu and cfg.mtu < ENCAP_OVERHEAD[4] + device.MIN_MTU:
            raise BackendConfigError(f"error decoding VXLAN backend config: MTU {cfg.mtu} is too "
                                     "small for vxlan; give the underlay MTU (e.g. 1500)")
        if cfg.mtu > device.MAX_MTU:
            raise BackendConfigError(
                f"error decoding VXLAN backend config: MTU {cfg.mtu} is too large: it is the "
                f"underlay MTU, at most {device.MAX_MTU}, and the vxlan device gets it minus "
                f"{ENCAP_OVERHEAD[4]} bytes of encapsulation (at most "
                f"{device.MAX_MTU - ENCAP_OVERHEAD[4]}); give the underlay MTU (e.g. 1500 or "
                "9000)")
        return cfg


def device_name(vni: int, version: int) -> str:
    """``flannel.<VNI>`` (IPv4) or ``flannel-v6.<VNI>``."""
    return f"flannel{'' if version == 4 else '-v6'}.{vni}"


def peer_mac(peer: Lease, version: int) -> tuple[str | None, str]:
    """(the VtepMAC a peer's lease publishes for one IP family, lower-case; "") or (None, what
    is wrong with it: none, or one the kernel refuses an FDB entry for, zero or multicast)."""
    try:
        raw = peer.attrs.backend_v6_data if version == 6 else peer.attrs.backend_data
        if raw is not None and (found := _GO_BACKEND_DATA.match(raw)) is not None:
            mac = found[1]
        else:
            data = peer.attrs.backend_json(v6=version == 6)
            mac = data["VtepMAC"] if isinstance(data, dict) else None
        octets = mac_bytes(mac) if isinstance(mac, str) else b""
    except (ValueError, KeyError):
        octets = b""
    fix = "the node that owns it rewrites it on restart, or delete the lease"
    if len(octets) != 6:
        return None, (f"its IPv{version} backend data has no valid VtepMAC (a vxlan lease "
                      f'needs {{"VtepMAC":"<6-byte MAC>"}}); {fix}')
    assert isinstance(mac, str)
    if not any(octets):
        return None, f"its IPv{version} VtepMAC {mac} is zero, which no VTEP has; {fix}"
    if octets[0] & 1:
        return None, (f"its IPv{version} VtepMAC {mac} is a multicast or broadcast MAC, "
                      f"not one VTEP's; {fix}")
    return mac.lower(), ""


def _peer_families(lease: Lease, config: NetworkConfig) -> list[int]:
    """The families of our devices (one per IP version the network carries) the lease has a
    subnet and a public address of."""
    return [version for version in versions(config)
            if lease.family(version) is not None
            and lease.attrs.public_number(version) is not None]


def direct_route(subnet: IPNetwork, public: IPAddress, route_get: RouteLookup) -> Route | None:
    """DirectRouting's route to a peer on-link on the underlay (the kernel reaches its
    public address without a gateway): via that address; None when it is not on-link."""
    direct = route_get(public)
    if direct is not None and direct.gateway is None:
        return Route(str(subnet), str(public), direct.oif)
    return None


def vtep_mac(peer: Lease, version: int) -> int | None:
    """A peer's VTEP MAC on the device of one IP family, as an integer (None without a
    subnet, a public address or a usable VtepMAC there: not admitted, ``lease_problem``)."""
    if peer.family(version) is None or peer.attrs.public_number(version) is None:
        return None
    mac = peer_mac(peer, version)[0]
    return mac_number(mac) if mac is not None else None


@dataclass
class _Family:
    """One vxlan device (one per IP family) and what it was last found as."""

    spec: device.VxlanSpec
    index: int = 0
    mac: str = ""


class VxlanBackend(RoutedBackend):
    backend_type = "vxlan"
    footprint = Footprint(PER_PEER, device="flannel.{vni}",
                          links=(Link(r"flannel(-v6)?\.\d+", "vxlan", entries=True),),
                          vtep=True, dual_stack=True)
    pass_errors = (device.DeviceError,)
    option_names = tuple(OPTIONS)

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        VxlanConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.vxlan = VxlanConfig.from_backend(self.config.backend)
        self.families: dict[int, _Family] = {}
        # Device index -> its peers, from the previous desired_state: a lease change then
        # costs one peer's decoding, not every peer's. A peer's MAC is found by its subnet
        # base and reused only for the very lease object it was decoded from (the lease
        # watcher hands over the same objects). Rebuilt on every call, so it holds the
        # current peers only.
        self._tables: dict[int, VtepTable] = {}
        # The last desired state and what it was made from (the peer set, by identity, and
        # the devices, lease and adoption bounds): a periodic pass over the same peers gets
        # its sets back instead of new sets of every entry.
        self._state: tuple[Sequence[Lease], tuple[object, ...], DesiredState] | None = None

    def device_mtu(self, version: int) -> int:
        return (self.vxlan.mtu or self.ext.mtu) - ENCAP_OVERHEAD[version]

    def _spec(self, version: int, local: IPv4Address | IPv6Address, mac: str
              ) -> device.VxlanSpec:
        return device.VxlanSpec(
            name=device_name(self.vxlan.vni, version), vni=self.vxlan.vni, port=self.vxlan.port,
            local=local, underlay_index=self.ext.index, learning=self.vxlan.learning,
            gbp=self.vxlan.gbp, mtu=self.device_mtu(version), mac=mac)

    async def prepare(self) -> LocalNetwork:
        if self.vxlan.mtu > self.ext.mtu:
            log.warning("the vxlan MTU option (%d) exceeds %s's MTU (%d): encapsulated packets "
                        "larger than %d bytes will not fit the underlay", self.vxlan.mtu,
                        self.ext.name, self.ext.mtu, self.ext.mtu)
        wanted: list[tuple[int, IPv4Address | IPv6Address | None,
                           IPv4Address | IPv6Address | None]] = []
        if self.config.enable_ipv4:
            wanted.append((4, self.ext.iface_addr, self.ext.ext_addr))
        if self.config.enable_ipv6:
            wanted.append((6, self.ext.iface_v6_addr, self.ext.ext_v6_addr))
        for version, local, public in wanted:
            if local is None or public is None:
                raise BackendError(f"vxlan needs an IPv{version} address on {self.ext.name}")
            spec = self._spec(version, local, device.vtep_mac(self.vxlan.vni, public))
            family = _Family(spec)
            try:
                dev = await asyncio.to_thread(device.ensure_vxlan, spec, self.options.host,
                                              adopt_mac=True)
            except device.DeviceError as err:
                raise BackendError(str(err)) from None
            family.index, family.mac = dev.index, dev.mac
            # Keep the MAC we publish (a reused device keeps its own) across re-creations.
            family.spec = self._spec(version, local, dev.mac)
            self.families[version] = family
        data = {v: json.dumps({"VNI": self.vxlan.vni, "VtepMAC": f.mac}, separators=(",", ":"))
                for v, f in self.families.items()}
        # Pods get one MTU, so it must fit the tightest family.
        mtu = min(self.device_mtu(version) for version in self.families)
        return LocalNetwork("vxlan", mtu, data.get(4), data.get(6))

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        # Each device's socket takes the datagrams of its own family.
        port = VxlanConfig.from_backend(config.backend).port or device.DEFAULT_VXLAN_PORT
        return (Carrier("VXLAN", udp_ports=(port,), refuses=True, versions=versions(config)),)

    def ensure_local(self) -> None:
        assert self.lease is not None
        for version, family in self.families.items():
            dev = device.ensure_vxlan(family.spec, self.options.host)
            family.index = dev.index
            subnet = self.lease.subnet if version == 4 else self.lease.ipv6_subnet
            network = self.config.network if version == 4 else self.config.ipv6_network
            if subnet is not None:
                device.ensure_address(dev.index, subnet.network_address, network,
                                      self.options.host)

    @classmethod
    def lease_problem(cls, lease: Lease, config: NetworkConfig) -> str | None:
        for version in _peer_families(lease, config):
            mac, why = peer_mac(lease, version)
            if mac is None:
                return why
        return None

    @classmethod
    def identities(cls, lease: Lease, config: NetworkConfig) -> tuple[str, ...]:
        """Its VTEP MAC on each of our devices: another node's FDB entry for it would send
        that node's traffic elsewhere."""
        return tuple(f"IPv{version} VtepMAC {mac}" for version in _peer_families(lease, config)
                     if (mac := peer_mac(lease, version)[0]) is not None)

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        frame = (tuple((v, f.index, f.spec) for v, f in self.families.items()), self.lease,
                 tuple(self.ownership().items()))
        last = self._state
        # DirectRouting asks the kernel's routes each time: nothing to reuse.
        if last is not None and last[0] is peers and last[1] == frame \
                and not self.vxlan.direct_routing:
            # A new state over the same sets: the indexes a drift check may have built on
            # the last one (``DesiredState.wants_fdb_at``...) are not kept from pass to pass.
            return replace(last[2])
        state = self._build_state(peers, route_get)
        self._state = (peers, frame, state)
        return state

    def _build_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        direct: set[Route] = set()
        previous, self._tables = self._tables, {}
        for version, family in self.families.items():
            before = previous.get(family.index)
            table = self._tables[family.index] = VtepTable(family.index, version)
            for peer in peers:
                numbers = peer.family(version)
                if numbers is None or peer.attrs.public_number(version) is None:
                    continue
                if self.vxlan.direct_routing:
                    subnet, public = family_subnet(peer, version)
                    assert subnet is not None and public is not None
                    route = direct_route(subnet, public, route_get)
                    if route is not None:
                        direct.add(route)
                        continue
                base = numbers[0]  # the lease's own integer
                mac = before.mac_of(base, peer) if before is not None else None
                if mac is None:
                    mac = vtep_mac(peer, version)
                if mac is not None:
                    table.add(base, mac, peer)
        tables = tuple(self._tables.values())
        return DesiredState(VtepRoutes(tables, frozenset(direct)), VtepNeighbours(tables),
                            VtepFdb(tables), frozenset(f.index for f in self.families.values()),
                            families=tuple(socket.AF_INET if v == 4 else socket.AF_INET6
                                           for v in sorted(self.families)),
                            links=frozenset(LinkState(f.index, f.spec.name, f.spec.mtu,
                                                      f.spec.mac)
                                            for f in self.families.values()),
                            addresses=self._addresses(), **self.ownership())

    def _addresses(self) -> frozenset[tuple[int, str]]:
        """The lease address on each device, as ``ensure_local`` puts it."""
        if self.lease is None:
            return frozenset()
        out = set()
        for version, family in self.families.items():
            subnet = self.lease.subnet if version == 4 else self.lease.ipv6_subnet
            if subnet is not None:
                base = subnet.network_address
                out.add((family.index, f"{base}/{base.max_prefixlen}"))
        return frozenset(out)

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        cfg = VxlanConfig.from_backend(node.config.backend)
        own = node.own
        devices = tuple(DevicePlan(device_name(cfg.vni, v), v, ENCAP_OVERHEAD[v], entries=True,
                                   mac=(peer_mac(own, v)[0] or "") if own else "",
                                   udp_offload=True)
                        for v in versions(node.config))
        return NodePlan(devices=devices, local=local_addresses(node, on_base=True))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        cfg = VxlanConfig.from_backend(node.config.backend)
        vxlan, = cls.carriers(node.config)

        def plan(peer: Lease) -> tuple[FamilyPlan, ...]:
            out = []
            for version in versions(node.config):
                subnet, public = family_subnet(peer, version)
                if subnet is None or public is None:
                    continue
                base = base_address(subnet)
                direct = direct_route(subnet, public, node.route_get) \
                    if cfg.direct_routing else None
                if direct is not None:
                    out.append(FamilyPlan(version, subnet, public, routes=frozenset({direct}),
                                          carrier=PLAIN, answers_on=base))
                    continue
                mac = vtep_mac(peer, version)
                if mac is None:
                    continue  # as desired_state: no usable VtepMAC (admission refuses it)
                table = VtepTable(node.device(device_name(cfg.vni, version)), version)
                number = int(base)
                out.append(FamilyPlan(version, subnet, public,
                                      routes=frozenset({table.route(number, peer)}),
                                      neighbours=frozenset({table.neighbour(number, mac)}),
                                      fdb=frozenset({table.fdb(mac, peer)}), carrier=vxlan,
                                      answers_on=base))
            return tuple(out)

        return plan
