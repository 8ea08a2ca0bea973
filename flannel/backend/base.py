"""The backend contract: what the data plane asks of every backend.

A backend describes; the data plane (``flannel.dataplane.loop``) acts. A backend prepares the
local side (devices, keys) and says what to publish in our lease (``prepare``, ``activate``,
run once by the daemon), then, for any set of remote leases, says what the kernel and any
other engine must hold:

- ``ensure_local()``: re-check and re-create local devices (idempotent, synchronous);
- ``desired_state(peers, route_get)``: the routes, neighbours and FDB entries to reconcile
  through netlink, or None when the backend programs nothing through netlink;
- ``appliers()``: engines that are not reconciled by netlink alone (a forwarder, wireguard
  peers, cloud routes), each an ``Applier`` (the base class below: ``name``, ``apply``,
  ``samples``, ``refused_peers``, ``close``) handed the full peer set on every pass;
- ``failure_hint(error)``: advice for an operator when the kernel refused a change.

Which peers those are is ``admit(peers)``'s (``flannel/backend/admission.py``), from what the
backend declares of a lease under the network config alone: ``lease_problem`` (data it
cannot use, refused as the kernel would refuse it), ``identities`` (what must be one node's
only: a VTEP MAC, a public key), and, when the kernel refused a change, ``entry_peers``
(whose entry it was: that peer is parked and retried, the others are programmed).

What carries its traffic between nodes a backend declares once, from the network config
(``carriers``: UDP ports, IP protocols, the underlay's IP versions, authenticated or not,
how to probe it): the traffic rules read it (``encapsulation()``: what pods may not send
to, what ``--encap-peers-only`` filters), and so do the operator tools.

The first three fail with OSError (netlink errors included), ``BackendError`` or one of the
backend's ``pass_errors``; the data plane retries those, and anything else ends flanneld.

All of these run in the data plane's worker thread; a backend owns no task, thread, socket
lifetime or readiness code. ``close()`` (the daemon, at shutdown, after the data plane has
stopped) closes every applier, which stops any process an engine runs. A backend decodes its
options with ``<X>Config.from_backend(backend)``, which raises ``BackendConfigError``.

For the operator tools a backend declares its ``footprint`` (``flannel/backend/footprint.py``:
the devices ``flannelctl cleanup`` may remove) and answers, without touching anything, what
it does with each peer on a node (``describe``, ``flannel/backend/plan.py``: whether it uses a
lease, judged by the same admission as flanneld's, the kernel entries each gets, from the
functions ``desired_state`` calls, its engines' entries, which of its carriers carries it),
and reads what its engines hold (``read_engine``). Must not touch: the store, subnet.env,
readiness.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import ClassVar

from flannel.backend.admission import PeerAdmission
from flannel.backend.footprint import Footprint, Leftovers, Place
from flannel.backend.plan import (
    PLAIN,
    Carrier,
    Description,
    EngineReading,
    FamilyPlan,
    NodePlan,
    NodeView,
    PeerPlan,
    family_subnet,
    gateway_address,
    local_addresses,
    versions,
)
from flannel.backend.plan import (
    RouteLookup as RouteLookup,
)
from flannel.backendconf.errors import BackendConfigError as BackendConfigError
from flannel.backendconf.errors import BackendError as BackendError
from flannel.config import NetworkConfig, warn_unknown_keys
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import NetlinkError
from flannel.lease import Lease

log = logging.getLogger(__name__)

#: Plans one remote lease's IP families (the lease is one the backend wants).
PeerPlanner = Callable[[Lease], tuple[FamilyPlan, ...]]


@dataclass(frozen=True)
class BackendOptions:
    """Daemon settings backends need. ``host``: where to program (a named network
    namespace in the lab, tests and benchmarks). ``encap_peers_only``: engines that receive
    encapsulated traffic themselves (the udp forwarder) drop what non-peers send."""

    host: Host = LOCAL
    encap_peers_only: bool = False


@dataclass(frozen=True)
class LocalNetwork:
    """What a prepared backend publishes in our lease and the MTU pods must use.
    ``public_ip``/``public_ipv6``: addresses to publish instead of the external interface's
    public ones (the extension backend publishes the interface's own, as Go does)."""

    backend_type: str
    mtu: int
    backend_data: str | None = None
    backend_v6_data: str | None = None
    public_ip: IPv4Address | None = None
    public_ipv6: IPv6Address | None = None


@dataclass(frozen=True)
class Encapsulation:
    """The traffic rules' view of a backend's carriers (``Backend.carriers``): by IP version
    of the underlay, every UDP port peers' encapsulated traffic arrives on and every IP
    protocol it travels in (ESP 50, IP-in-IP 4). ``authenticated``: every carrier checks
    each packet against the sending peer's key (WireGuard, IPsec), so a forged one is
    refused whoever sends it."""

    udp: dict[int, tuple[int, ...]] = field(default_factory=dict)
    protocols: dict[int, tuple[int, ...]] = field(default_factory=dict)
    authenticated: bool = False

    @classmethod
    def of(cls, carriers: Sequence[Carrier]) -> Encapsulation:
        """Every port and protocol of ``carriers``, by IP version of the underlay."""
        udp: dict[int, set[int]] = {}
        protocols: dict[int, set[int]] = {}
        carrying = [c for c in carriers if c.udp_ports or c.ip_protocols]
        for carrier in carrying:
            for version in carrier.versions:
                udp.setdefault(version, set()).update(carrier.udp_ports)
                protocols.setdefault(version, set()).update(carrier.ip_protocols)
        return cls({v: tuple(sorted(ports)) for v, ports in sorted(udp.items()) if ports},
                   {v: tuple(sorted(ps)) for v, ps in sorted(protocols.items()) if ps},
                   authenticated=bool(carrying) and all(c.authenticated for c in carrying))


@dataclass(frozen=True)
class ApplyResult:
    """What one applier pass did: ``changes`` made, and ``error`` ("" when in sync), which
    becomes the data plane's readiness reason until a later pass succeeds. ``recheck``:
    run a pass again within this many seconds (0: only at the usual times), for an engine
    whose drift raises no kernel event (WireGuard peers changed with ``wg``)."""

    changes: int = 0
    error: str = ""
    recheck: float = 0.0


@dataclass(frozen=True)
class EngineSample:
    """One figure an engine reports on /metrics as ``flannel_engine_<name>{engine=...}``.

    ``name`` is lower-case letters, digits and underscores (a counter's ends in ``_total``),
    in base units; ``help`` says what it counts. No per-peer figures: the label set must
    stay bounded (a count of peers without a handshake, not one sample per peer).
    """

    name: str
    help: str
    value: float
    counter: bool = False


class Applier:
    """An engine the data plane runs after the netlink pass, in the same worker thread.

    ``apply`` makes the engine match the full peer set and returns what it did; it is
    retried with backoff while it reports an error or raises. ``name`` labels its status
    and its changes (e.g. "wireguard peers").

    ``samples()``: the engine's own figures (a forwarder's packets and drops, the age of the
    oldest handshake), read on the event loop at every scrape, so it returns what ``apply``
    last saw and never blocks. ``refused_peers()``: peer leases the engine skips because
    they are bad (lease key -> why), for /status. ``interrupt()``: flanneld is stopping,
    end a blocking ``apply`` at once (any thread, never blocks). ``close()``: stop what the
    engine runs (a process) when flanneld stops; it blocks, and runs after the data plane
    stopped.
    """

    name: str = "engine"

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        return ApplyResult()

    def samples(self) -> Sequence[EngineSample]:
        return []

    def refused_peers(self) -> dict[str, str]:
        return {}

    def interrupt(self) -> None:
        """Nothing to cut short by default."""

    def close(self) -> None:
        """Nothing runs by default."""


class Backend(ABC):
    """One data plane description. Created once per daemon run with the network config."""

    #: The BackendType this backend publishes and acts on ("" for alloc and udp).
    backend_type: str = ""
    #: The errors its engines declare that a pass may raise besides OSError and
    #: BackendError (e.g. a device refused): the data plane retries these; any other error
    #: is a bug and ends flanneld.
    pass_errors: tuple[type[Exception], ...] = ()
    #: What it leaves in a node's kernel for its peers, for the operator tools.
    footprint: ClassVar[Footprint]
    #: The Backend members (besides Type) its options parser reads.
    option_names: tuple[str, ...] = ()

    @classmethod
    def check_options(cls, config: NetworkConfig) -> None:
        """Warn (once each) about Backend members no option of this backend matches, then
        decode the options as the backend will: BackendError when they are unusable.
        Touches neither the kernel nor the network."""
        warn_unknown_keys(config.backend, ("Type", *cls.option_names), "Backend")
        cls.parse_options(config)

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        """Decode this backend's options (BackendError when unusable); none by default."""

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        warn_unknown_keys(config.backend, ("Type", *self.option_names), "Backend")
        self.ext = ext
        self.config = config
        self.options = options or BackendOptions()
        self.lease: Lease | None = None
        self._ignored: set[str] = set()  # keys of leases of other backends, logged once
        #: Which peers are programmed, and why the others are not.
        self.admission = self.admission_for(config)

    @abstractmethod
    async def prepare(self) -> LocalNetwork:
        """Set up what must exist before the lease is acquired (devices, keys)."""

    async def activate(self, lease: Lease) -> None:
        """Program the local side of our own lease (addresses on devices)."""
        self.lease = lease
        self.admission.own(lease)

    @classmethod
    def lease_problem(cls, lease: Lease, config: NetworkConfig) -> str | None:
        """Why this backend cannot use a peer lease's data ("its IPv4 VtepMAC ... is a
        multicast MAC"; the message names what the lease needs), None when it can. Refused
        here rather than by the kernel, which would fail the whole pass. From the network
        config alone (no prepared backend needed). None by default."""
        return None

    @classmethod
    def identities(cls, lease: Lease, config: NetworkConfig) -> tuple[str, ...]:
        """What a lease claims that must be one node's only ("IPv4 VtepMAC 0e:..",
        "PublicKey ..."): a newer lease claiming one of them from another address is
        refused. From the network config alone. None by default."""
        return ()

    @classmethod
    def admission_for(cls, config: NetworkConfig) -> PeerAdmission:
        """A fresh ``PeerAdmission`` judging peer leases as this backend does under
        ``config`` (flanneld's, and the operator tools' in ``describe``)."""
        return PeerAdmission(functools.partial(cls.lease_problem, config=config),
                             functools.partial(cls.identities, config=config))

    def entry_peers(self, entry: object, peers: Sequence[Lease]) -> list[Lease]:
        """The peers among ``peers`` a kernel entry of desired state was made for (none:
        it is this node's own, e.g. a route over the whole Network)."""
        return []

    def admit(self, peers: Sequence[Lease]) -> tuple[Lease, ...]:
        """The peers to program now (``admission``): those whose data and identity are
        usable and that the kernel is not refusing. The same tuple while nothing changes."""
        return self.admission.admit(peers)

    def ensure_local(self) -> None:
        """Recreate whatever local device state is missing (worker thread; idempotent)."""

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup
                      ) -> DesiredState | None:
        """What netlink must hold for ``peers`` (None: this backend uses no netlink)."""
        return None

    def appliers(self) -> Sequence[Applier]:
        """Engines reconciled besides netlink, run after it on every pass."""
        return ()

    def failure_hint(self, failure: NetlinkError) -> str:
        """Advice for an operator when the kernel refused one of our changes ("" if none)."""
        return ""

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        """What carries this backend's traffic between nodes under ``config``, declared once:
        each carrier's UDP ports and IP protocols, the underlay's IP versions it arrives
        over, whether it authenticates, how a peer's can be probed (``Carrier``). The
        traffic rules read every port and protocol of them (``encapsulation``), the
        operator tools what carries each peer (``peer_planner`` picks among them) and what
        any host may inject (``NodePlan.injectable``). BackendConfigError when the options
        are unusable. None by default: the underlay carries pods' packets as they are."""
        return ()

    def encapsulation(self) -> Encapsulation:
        """Every port and protocol peers send our encapsulated traffic to: what pods may not
        send to (``--drop-pod-encap``), and, where it is not authenticated, what only peers
        may send to (``--encap-peers-only``). Read from ``carriers``."""
        return Encapsulation.of(type(self).carriers(self.config))

    def interrupt(self) -> None:
        """flanneld is stopping: blocking work under way in a pass or at start (a cloud
        call, an operation waited on) ends at once, and later work is refused. Called on
        the event loop as the first signal arrives, before anything waits for that work;
        never blocks. Interrupts every applier."""
        for applier in self.appliers():
            applier.interrupt()

    def close(self) -> None:
        """Stop what the backend runs besides kernel state (a forwarder process) when
        flanneld stops, after the data plane stopped; kernel objects stay. Closes every
        applier. Blocks: the daemon calls it from a thread."""
        for applier in self.appliers():
            applier.close()

    def wants(self, lease: Lease) -> bool:
        """Whether a remote lease belongs to this backend (upstream filters on BackendType,
        silently; here a lease of another backend is named in the log once)."""
        why = self.refuses(lease, self.config)
        if not why:
            return True
        if lease.key not in self._ignored:
            self._ignored.add(lease.key)
            log.warning("ignoring lease %s (public IP %s): %s", lease.key,
                        lease.attrs.public_ip, why)
        return False

    @classmethod
    def refuses(cls, lease: Lease, config: NetworkConfig) -> str:
        """Why this backend cannot use a remote lease ("" when it can): one of another
        backend, or a reservation no node has taken yet, whose node runs no backend."""
        if lease.attrs.backend_type == cls.backend_type:
            return ""
        if unclaimed(lease):
            return (f"a reservation for {lease.attrs.public_ip} that no node has taken yet: "
                    f"its node runs no {config.backend_type} backend yet")
        theirs = lease.attrs.backend_type or "udp or alloc (no BackendType)"
        return (f"its node runs the {theirs} backend, which this node's "
                f"{config.backend_type} backend cannot reach; every node of a network must "
                "run the same backend")

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def describe(cls, node: NodeView, leases: Sequence[Lease]) -> Description:
        """What flanneld does with each of ``leases`` (remote ones the lease watcher passed)
        on ``node``, and the node's side: ``flannel/backend/plan.py``. The leases it wants
        go through a fresh admission of its own, with our lease, as in flanneld: a lease
        refused for its data or an identity it may not claim is skipped with the same why.
        Touches nothing; BackendConfigError when the options are unusable."""
        config = node.config
        planner = cls.peer_planner(node)
        admission = cls.admission_for(config)
        if node.own is not None:
            admission.own(node.own)
        refuses = {lease.key: why for lease in leases if (why := cls.refuses(lease, config))}
        admission.admit([lease for lease in leases if lease.key not in refuses])
        refused = admission.refused
        plans = []
        for lease in leases:
            if lease.key in refuses:
                plans.append(PeerPlan(lease, skipped=refuses[lease.key],
                                      reserved=unclaimed(lease)))
            elif lease.key in refused:
                kind, why = refused[lease.key]
                plans.append(PeerPlan(lease, skipped=why, refused=kind))
            else:
                plans.append(PeerPlan(lease, planner(lease)))
        return Description(replace(cls.node_plan(node), carriers=cls.carriers(config)),
                           tuple(plans))

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        """The node's side: by default no device of ours (the underlay carries pods'
        packets) and peers answering on their ``cni0`` gateway."""
        return NodePlan(data_path=cls.footprint.has_data_path,
                        unjudged=cls.footprint.unjudged,
                        local=local_addresses(node, on_base=False))

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        """Plans a wanted lease's families (options decoded once, here). By default no
        kernel entry: the traffic is routed by the underlay, the peer answers on its
        ``cni0`` gateway."""

        def plan(lease: Lease) -> tuple[FamilyPlan, ...]:
            out = []
            for version in versions(node.config):
                subnet, public = family_subnet(lease, version)
                if subnet is not None:
                    out.append(FamilyPlan(version, subnet, public, carrier=PLAIN,
                                          answers_on=gateway_address(subnet)))
            return tuple(out)

        return plan

    @classmethod
    def read_engine(cls, node: NodeView, root: Path | None) -> EngineReading:
        """What this backend's engines hold on the node now (WireGuard peers, IKE SAs), read
        through the files flanneld sees under ``root`` (its ``/proc/<pid>/root``; None: no
        flanneld runs here, only what needs none is read), and problems of the engines
        themselves; nothing for a backend whose peers are all in netlink state. Read
        only."""
        return EngineReading()

    @classmethod
    def leftovers(cls, place: Place) -> Leftovers:
        """What ``flannelctl cleanup`` removes of this backend besides the devices its
        footprint declares (with their routes and entries) and the traffic rules: processes
        it started, their sockets and files. Looks only; the items remove when called."""
        return Leftovers()


def unclaimed(lease: Lease) -> bool:
    """A reservation (no TTL) whose node has not written its backend's data yet."""
    return lease.is_reservation and not lease.attrs.backend_type \
        and lease.attrs.backend_data is None and lease.attrs.backend_v6_data is None
