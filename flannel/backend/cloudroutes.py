"""What the cloud route backends (aws-vpc, tencent-vpc, ali-vpc, gce) share: the start
sequence and the applier that reconciles the cloud's route table on every data plane pass.

These backends program nothing through netlink: the VPC's router carries pod traffic between
nodes, by one route per node in its route table. ``prepare()`` checks the config and that the
cloud SDK is installed; ``activate()`` runs the engine's start (metadata, identity, clean-up)
and routes our subnet; the applier then makes the table match the live leases on every pass
(lease changes, the periodic ``--reconcile-interval`` resync, retries after a failure), so a
route deleted or redirected in the console is repaired and routes of vanished leases are
collected. Every engine call blocks on HTTP and runs in the data plane's worker thread; the
engines bound each request (``API_TIMEOUT``), and ``interrupt()`` cuts the call or wait under
way when flanneld stops. Throttling is waited out (bounded retries) only at start; in a pass
it fails the pass, which the data plane retries with its backoff.
Must not touch: the store, the kernel; which routes are ours (the engines decide).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import Protocol

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendConfigError,
    BackendError,
    LocalNetwork,
    PeerPlanner,
)
from flannel.backend.footprint import ELSEWHERE, Footprint
from flannel.backend.plan import Carrier, FamilyPlan, NodeView, gateway_address
from flannel.cloud.base import CloudError, RouteChange
from flannel.config import NetworkConfig
from flannel.lease import Lease

log = logging.getLogger(__name__)


class RouteEngine(Protocol):
    """A cloud route engine (``flannel.cloud.awsvpc``, ``tencentvpc``, ``alivpc``, ``gce``)."""

    def prepare(self) -> object: ...

    def reconcile(self, own_lease: Lease, peer_leases: Iterable[Lease], *,
                  collect: bool = True, wait_throttled: bool = True) -> list[RouteChange]: ...

    def interrupt(self) -> None: ...


class CloudRoutes(Applier):
    """The applier: our route present, routes of vanished leases gone, on every pass.

    A cloud failure (throttling, a full route table, a missing permission) is the pass's
    error, which the data plane logs once, reports as its readiness reason and retries with
    backoff.
    """

    def __init__(self, name: str, engine: RouteEngine, lease: Lease) -> None:
        self.name = name
        self.engine = engine
        self.lease = lease

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        try:
            # Never wait out throttling here: this is the data plane's worker thread.
            changes = self.engine.reconcile(self.lease, peers, wait_throttled=False)
        except CloudError as err:
            return ApplyResult(error=str(err))
        return ApplyResult(changes=len(changes))


class CloudRouteBackend(Backend):
    #: Go's cloud backends publish no BackendType (their leases carry the PublicIP only).
    backend_type = ""
    footprint = Footprint(ELSEWHERE, unjudged="the VPC's route table, not this node's kernel, "
                          "carries each peer's subnet, so this node's kernel is not judged")
    #: The name users configure, and the SDK module ("" for none) and extra it needs.
    type_name = ""
    sdk_module = ""
    extra = ""
    # Set by prepare() and activate().
    _engine: RouteEngine | None = None
    _applier: CloudRoutes | None = None

    @abstractmethod
    def make_engine(self, network: IPv4Network) -> RouteEngine:
        """The engine for this node: its config decoded by ``<X>Config.from_backend``
        (BackendConfigError when unusable; CloudError when the node's own state is)."""

    async def prepare(self) -> LocalNetwork:
        config = self.config
        if config.network is None or not config.enable_ipv4 or config.enable_ipv6:
            raise BackendError(f"the {self.type_name} backend routes IPv4 pod subnets only: "
                               "set Network, and leave EnableIPv6 unset (or false)")
        try:
            # Off the event loop: the SDKs take a noticeable time to import.
            if self.sdk_module:
                await asyncio.to_thread(importlib.import_module, self.sdk_module)
        except ImportError:
            raise BackendError(f"the {self.type_name} backend needs the Python module "
                               f"{self.sdk_module!r}, which is not installed: install it with "
                               f"pip install 'pyflannel[{self.extra}]'") from None
        try:
            self._engine = self.make_engine(config.network)
        except BackendConfigError as err:
            raise BackendConfigError(f"{self.type_name} backend: {err}") from None
        except CloudError as err:
            raise BackendError(f"{self.type_name} backend: {err}") from None
        return LocalNetwork("", self.ext.mtu)

    async def activate(self, lease: Lease) -> None:
        await super().activate(lease)
        engine = self._engine
        if engine is None:
            raise BackendError(f"{self.type_name} backend: activate() before prepare()")
        try:
            await asyncio.to_thread(engine.prepare)
        except CloudError as err:
            raise BackendError(f"{self.type_name} backend: {err}") from None
        try:
            # Our route only: the peers are not known yet, so nothing is collected.
            await asyncio.to_thread(lambda: engine.reconcile(lease, (), collect=False))
        except CloudError as err:
            log.error("%s: our subnet %s is not routed yet (retried with every reconcile "
                      "pass): %s", self.type_name, lease.subnet, err)
        self._applier = CloudRoutes(f"{self.type_name} routes", engine, lease)

    def appliers(self) -> Sequence[Applier]:
        return () if self._applier is None else (self._applier,)

    def interrupt(self) -> None:
        # The engine, not only the applier: its start (metadata, the first route) runs in
        # activate(), before the applier exists.
        if self._engine is not None:
            self._engine.interrupt()

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        # The VPC's router forwards pods' packets as they are: no encapsulation.
        return (Carrier("the VPC's route table", versions=(4,)),)

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        carrier, = cls.carriers(node.config)

        def plan(lease: Lease) -> tuple[FamilyPlan, ...]:
            if lease.subnet is None:
                return ()
            return (FamilyPlan(4, lease.subnet, lease.attrs.public_ip, carrier=carrier,
                               answers_on=gateway_address(lease.subnet)),)

        return plan

    @staticmethod
    def _address(address: IPv4Address | None, what: str) -> IPv4Address:
        if address is None:
            raise CloudError(f"the external interface has no IPv4 {what}; choose the "
                             "interface attached to the VPC with --iface or --iface-regex")
        return address
