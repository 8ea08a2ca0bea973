"""The backend contract: what the data plane asks of every backend.

A backend describes; the data plane (``flannel.dataplane``) acts. A backend prepares the
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

The first three fail with OSError (netlink errors included), ``BackendError`` or one of the
backend's ``pass_errors``; the data plane retries those, and anything else ends flanneld.

All four run in the data plane's worker thread; a backend owns no task, thread, socket
lifetime or readiness code. ``close()`` (the daemon, at shutdown, after the data plane has
stopped) closes every applier, which stops any process an engine runs. A backend also
declares its ``footprint`` (``flannel/backend/footprint.py``) for the operator tools, and
decodes its options with ``<X>Config.from_backend(backend)``, which raises
``BackendConfigError``. Must not touch: the store, subnet.env, readiness.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import ClassVar

from flannel.backend.footprint import Footprint
from flannel.backenderrors import BackendConfigError as BackendConfigError
from flannel.backenderrors import BackendError as BackendError
from flannel.config import NetworkConfig, warn_unknown_keys
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import NetlinkError, Route
from flannel.lease import Lease

log = logging.getLogger(__name__)

#: ``route_get(ip)``: the route the kernel would use for ``ip`` (None when unreachable).
RouteLookup = Callable[[IPv4Address | IPv6Address], Route | None]


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

    @abstractmethod
    async def prepare(self) -> LocalNetwork:
        """Set up what must exist before the lease is acquired (devices, keys)."""

    async def activate(self, lease: Lease) -> None:
        """Program the local side of our own lease (addresses on devices)."""
        self.lease = lease

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

    def encap_ports(self) -> dict[int, tuple[int, ...]]:
        """The UDP ports peers send our encapsulated traffic to, by IP version of the
        underlay (after ``prepare``); what ``--encap-peers-only`` filters. Empty when the
        backend carries nothing over UDP, or authenticates it (wireguard)."""
        return {}

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
        if lease.attrs.backend_type == self.backend_type:
            return True
        self.ignore(lease)
        return False

    def ignore(self, lease: Lease) -> None:
        """Log, once per lease, that a lease of another backend cannot be a peer."""
        if lease.key in self._ignored:
            return
        self._ignored.add(lease.key)
        theirs = lease.attrs.backend_type or "udp or alloc (no BackendType)"
        log.warning("ignoring lease %s (public IP %s): its node runs the %s backend, which "
                    "this node's %s backend cannot reach; every node of a network must run "
                    "the same backend", lease.key, lease.attrs.public_ip, theirs,
                    self.config.backend_type)
