"""The udp backend: Go flannel's first data plane, bare IPv4 packets in UDP (port 8285).

Owns the backend config (``Port``; IPv4 only), the lease (no BackendType, no BackendData,
as Go's), the TUN ``flannel0`` described for the data plane (device, MTU, lease base /32,
the route ``<Network> dev flannel0``, so that a change by hand is drift repaired within a
second), and the forwarder process (``flannel/udp``): started at activation, handed the
peer table (subnet -> PublicIP:Port) on every pass, restarted when it died, stopped by
``close``; with ``--encap-peers-only`` it drops datagrams from other sources than the
table's public IPs. Go's udp backend does not filter leases on BackendType: every other lease of the
network is a peer, except the leases of another backend (a vxlan node runs no forwarder),
which are ignored and named once in the log.
Must not touch: the store; packets (``flannel/udp/worker.py``); other devices and routes.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from flannel.backend.base import (
    Applier,
    ApplyResult,
    BackendConfigError,
    BackendError,
    BackendOptions,
    EngineSample,
    LocalNetwork,
    PeerPlanner,
    RouteLookup,
)
from flannel.backend.footprint import COVERING, Footprint, Link
from flannel.backend.plan import (
    Carrier,
    DevicePlan,
    FamilyPlan,
    NodePlan,
    NodeView,
    base_address,
    local_addresses,
)
from flannel.backend.routed import RoutedBackend
from flannel.backendconf.options import decode_options
from flannel.config import NetworkConfig
from flannel.kernel import device as kernel_device
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState, LinkState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease
from flannel.timing.backoff import Backoff
from flannel.udp.device import TunSpec, ensure_tun, tun_index
from flannel.udp.forwarder import ForwarderConfig, ForwarderError, UdpForwarder
from flannel.udp.tunfd import TunError

log = logging.getLogger(__name__)

TUN_NAME = "flannel0"
DEFAULT_PORT = 8285
#: IPv4 (20) + UDP (8): the packet read from the TUN is the whole datagram payload.
ENCAP_OVERHEAD = 28
CONFIG_ERROR = "error decoding UDP backend config"
#: Restarts of a dying forwarder wait 0.1 s, doubling up to 10 s; a forwarder that ran
#: RESTART_QUIET seconds counts as healthy again. Whatever kills it (a bug a datagram
#: triggers, a broken device) then costs a bounded share of the time, not a restart loop.
RESTART_FIRST, RESTART_LONGEST, RESTART_QUIET = 0.1, 10.0, 30.0


@dataclass(frozen=True)
class UdpConfig:
    """The backend options: ``Port``, the UDP port of every node's forwarder."""

    port: int = DEFAULT_PORT

    @classmethod
    def from_backend(cls, backend: dict[str, object]) -> UdpConfig:
        fields = decode_options(backend, {"Port": (int, DEFAULT_PORT)}, CONFIG_ERROR)
        port: int = fields["Port"]
        if not 1 <= port <= 65535:
            raise BackendConfigError(
                f"{CONFIG_ERROR}: Port {port} is not a UDP port; give 1 to 65535 (every node "
                f"of the network must use the same one; default {DEFAULT_PORT})")
        return cls(port)


def network_route(network: IPv4Network | None, index: int) -> frozenset[Route]:
    """The one route every peer's traffic takes: the whole Network into the TUN (the
    forwarder, not the kernel, knows the peers)."""
    return frozenset({Route(str(network), None, index)}) if network else frozenset()


class UdpBackend(RoutedBackend):
    backend_type = ""  # Go's udp lease carries no BackendType
    # The forwarder, not the kernel, knows the peers: the Network route into the TUN is all.
    footprint = Footprint(COVERING, device=TUN_NAME, links=(Link(r"flannel\d+", "tun"),))
    pass_errors = (TunError,)
    option_names = ("Port",)

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        UdpConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.port = UdpConfig.from_backend(self.config.backend).port
        self.mtu = self.ext.mtu - ENCAP_OVERHEAD
        self.tun_index = 0
        self.forwarder: UdpForwarder | None = None
        self._applier = _ForwarderApplier(self)
        self._sysctl_warned = False

    async def prepare(self) -> LocalNetwork:
        config = self.config
        if config.enable_ipv6 or not config.enable_ipv4:
            raise BackendError(
                "the udp backend carries IPv4 only, but the network config "
                + ("sets EnableIPv6" if config.enable_ipv6 else "disables IPv4")
                + ": remove EnableIPv6 and IPv6Network (and keep EnableIPv4) to use udp, or "
                "choose a backend with IPv6 support (vxlan, wireguard, host-gw)")
        if self.ext.iface_addr is None or self.ext.ext_addr is None:
            raise BackendError(f"the udp backend needs an IPv4 address on {self.ext.name}")
        if self.mtu < kernel_device.MIN_MTU:
            raise BackendError(f"{self.ext.name}'s MTU ({self.ext.mtu}) leaves {self.mtu} "
                               f"bytes inside {ENCAP_OVERHEAD} bytes of IPv4 and UDP headers; "
                               f"the TUN needs at least {kernel_device.MIN_MTU}")
        return LocalNetwork("", self.mtu)

    def _spec(self) -> TunSpec:
        assert self.lease is not None and self.lease.subnet is not None
        # No route here: the data plane owns the Network route like every other route
        # (protocol flannel, drift watched), see desired_state.
        return TunSpec(TUN_NAME, self.lease.subnet.network_address, self.mtu)

    async def activate(self, lease: Lease) -> None:
        if lease.subnet is None:
            raise BackendError("the udp backend needs an IPv4 lease")
        try:
            await super().activate(lease)  # creates the TUN through ensure_local
        except (TunError, OSError) as err:  # NetlinkError is an OSError
            raise BackendError(f"cannot set up {TUN_NAME}: {err}") from None
        assert self.ext.iface_addr is not None
        self.forwarder = UdpForwarder(ForwarderConfig(
            TUN_NAME, IPv4Address(self.ext.iface_addr), self.port,
            lease.subnet.network_address, self.mtu, self.options.host,
            peers_only=self.options.encap_peers_only))
        try:
            await asyncio.to_thread(self.forwarder.start)
        except ForwarderError as err:
            raise BackendError(str(err)) from None
        log.info("udp forwarder started (pid %s): %s:%d <-> %s", self.forwarder.pid,
                 self.ext.iface_addr, self.port, TUN_NAME)

    def ensure_local(self) -> None:
        for what in ensure_tun(self._spec(), self.options.host):
            log.info("udp device: %s", what)
        # The forwarder's ICMP "net unreachable" comes from our own lease base address; the
        # kernel drops such a packet as a martian unless the TUN accepts local sources
        # (Go leaves it unset, so its replies never arrive).
        try:
            self.options.host.write_sysctl(f"net/ipv4/conf/{TUN_NAME}/accept_local", "1")
        except OSError as err:
            if not self._sysctl_warned:
                self._sysctl_warned = True
                log.warning("cannot set net.ipv4.conf.%s.accept_local=1 (%s): the forwarder's "
                            "ICMP net unreachable replies will be dropped by the kernel",
                            TUN_NAME, err.strerror or err)
        self.tun_index = tun_index(TUN_NAME, self.options.host)

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        assert self.lease is not None and self.lease.subnet is not None
        index, subnet = self.tun_index, self.lease.subnet
        network = self.config.network
        return DesiredState(
            network_route(network, index),
            devices=frozenset({index}),
            # Carrier: the TUN loses it when the forwarder exits, which starts a pass that
            # restarts the forwarder (the applier).
            links=frozenset({LinkState(index, TUN_NAME, self.mtu, "", carrier=True)}),
            addresses=frozenset({(index, f"{subnet.network_address}/32")}),
            networks=(network,) if network else (), local_subnets=(subnet,),
            underlay=self.ext.index)

    def appliers(self) -> Sequence[Applier]:
        return (self._applier,)

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        # The forwarder answers no stray datagram: silence is an open port or a dropped one.
        port = UdpConfig.from_backend(config.backend).port
        return (Carrier("the udp forwarder", udp_ports=(port,), refuses=True, versions=(4,)),)

    @classmethod
    def refuses(cls, lease: Lease, config: NetworkConfig) -> str:
        # Go's udp takes every lease, reservations included (a node that takes one keeps
        # it as it is); a lease with a BackendType is a node that runs no udp forwarder, so
        # packets sent there would be lost.
        if not lease.attrs.backend_type:
            return ""
        return super().refuses(lease, config)

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        return NodePlan(devices=(DevicePlan(TUN_NAME, 4, ENCAP_OVERHEAD),),
                        local=local_addresses(node, on_base=True))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        forwarder, = cls.carriers(node.config)
        routes = network_route(node.config.network, node.device(TUN_NAME))

        def plan(peer: Lease) -> tuple[FamilyPlan, ...]:
            if peer.subnet is None:
                return ()
            return (FamilyPlan(4, peer.subnet, peer.attrs.public_ip, routes=routes,
                               carrier=forwarder, answers_on=base_address(peer.subnet)),)

        return plan


_COUNTER_HELP = {
    "tx_packets": "Packets read from flannel0 and sent to a peer.",
    "rx_packets": "Datagrams received from peers and written into flannel0.",
    "tx_bytes": "Bytes of the packets sent to peers.",
    "rx_bytes": "Bytes of the datagrams received from peers.",
    "drop_no_route": "Packets dropped: no peer holds their destination.",
    "drop_ttl": "Packets dropped: TTL reached 0.",
    "drop_runt": "Datagrams dropped: shorter than an IPv4 header.",
    "drop_send_error": "Packets dropped: the UDP send failed.",
    "drop_tun_error": "Datagrams dropped: the write into flannel0 failed.",
    "drop_not_ipv4": "Packets dropped: not IPv4.",
    "drop_not_peer": "Datagrams dropped: their source is no peer's public address "
                     "(--encap-peers-only).",
    "icmp_unreachable": "ICMP net-unreachable replies written back into flannel0.",
}


class _ForwarderApplier(Applier):
    """Hands the peer table to the forwarder; restarts a dead forwarder (the pass reports
    the death, so the node is not ready until the restart worked)."""

    name = "udp forwarder"

    def __init__(self, backend: UdpBackend,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self._clock = clock
        self._restart_delay = 0.0  # 0 until a death; then the wait before the next start
        self._restarts = Backoff(RESTART_FIRST, RESTART_LONGEST)
        self._started_at = clock()
        self.table: dict[IPv4Network, IPv4Address] = {}
        self._lock = threading.Lock()  # close() against a pass still running at shutdown
        self._closed = False
        self._logged = ""
        self._counters: dict[str, int] = {}  # the forwarder's, as the last pass read them

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        table = {p.subnet: p.attrs.public_ip for p in peers
                 if p.subnet is not None and p.attrs.public_ip is not None}
        with self._lock:
            forwarder = self.backend.forwarder
            if self._closed or forwarder is None:
                return ApplyResult(error="stopped (flanneld is shutting down)")
            status = forwarder.status()
            if status.alive:
                self._counters = dict(status.counters)
            if not status.alive and status.pid is not None:  # running, but not answering
                return ApplyResult(error=status.last_error)
            if not status.alive:
                now = self._clock()
                if now - self._started_at >= RESTART_QUIET:
                    self._restart_delay = 0.0
                    self._restarts.reset()
                if status.last_error != self._logged:  # once per cause, not per retry
                    log.error("%s; restarting it", status.last_error)
                    self._logged = status.last_error
                wait = self._started_at + self._restart_delay - now
                if wait > 0:
                    return ApplyResult(error=f"{status.last_error}; restarting it in "
                                             f"{wait:.1f} s", recheck=wait)
                self._restart_delay = self._restarts.grow()
                self._started_at = now
                try:
                    forwarder.start()
                except ForwarderError as err:
                    return ApplyResult(error=str(err))
                log.info("udp forwarder restarted (pid %s)", forwarder.pid)
                self._logged = ""
                self.table = {}  # start() re-sent the previous table: count it as new
            changes = len(table.keys() ^ self.table.keys()) + sum(
                1 for s in table.keys() & self.table.keys() if table[s] != self.table[s])
            if changes or not status.alive:
                try:
                    forwarder.set_peers(table)
                except ForwarderError as err:
                    return ApplyResult(error=str(err))
                self.table = table
            if status.alive and not status.tun_attached:
                return ApplyResult(changes, f"the forwarder is not attached to {TUN_NAME} "
                                            f"yet ({status.last_error or 'reattaching'})")
            return ApplyResult(changes)

    def samples(self) -> list[EngineSample]:
        """The forwarder's packet and drop counters as the last pass read them (a pass runs
        at least every data plane interval); they restart from 0 with a new forwarder."""
        counters = self._counters
        return [EngineSample("udp_peers", "Peers in the udp forwarder's table.",
                             len(self.table)),
                *(EngineSample(f"udp_{name}_total", _COUNTER_HELP.get(name, name), value,
                               counter=True)
                  for name, value in sorted(counters.items()) if name.isidentifier())]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.backend.forwarder is not None:
                self.backend.forwarder.stop()

