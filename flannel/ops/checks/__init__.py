"""Doctor checks: each a small function from the gathered ``Context`` to findings.

Owns the list of checks and the context they share (subnet.env, network config, leases,
this node's lease, the kernel view, what this node's backend does with each lease: its
description, ``flannel/ops/plans.py``, and what only the running flanneld knows: the peers
it parked, ``flannel/ops/flanneldview.py``). Checks only read; a fix runs only when a flag
asks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Network
from pathlib import Path
from typing import TYPE_CHECKING

from flannel.config import NetworkConfig
from flannel.lease import Lease
from flannel.ops.findings import Finding
from flannel.ops.kernelview import KernelView
from flannel.ops.leases import LeaseRow

if TYPE_CHECKING:
    from flannel.backend.base import Backend
    from flannel.backend.plan import Description, EngineReading, NodeView, PeerPlan
    from flannel.ops.discover import Flanneld
    from flannel.ops.flanneldview import FlanneldView
    from flannel.ops.plans import KernelEntries


@dataclass
class Context:
    subnet_file: Path
    sysctl_root: Path
    cni_bin_dirs: list[Path]
    cni_conf_dirs: list[Path]
    probe_timeout: float
    fix_checksum: bool
    probe: bool = True
    kube_mode: bool = False  # --kube-subnet-mgr: pods get their network through CNI
    env: dict[str, str] | None = None
    env_error: str = ""
    config: NetworkConfig | None = None
    rows: list[LeaseRow] | None = None  # None: the store could not be read
    store_error: str = ""
    description_error: str = ""  # why the backend cannot describe this node
    clock_skew: float | None = None
    kernel: KernelView = field(default_factory=KernelView)
    flanneld_pids: list[int] = field(default_factory=list)
    #: The flanneld of this network namespace, as found (None: none, or not told apart).
    flanneld: Flanneld | None = None

    @property
    def leases(self) -> list[Lease]:
        return [row.lease for row in self.rows or [] if row.lease is not None]

    @property
    def own_subnet(self) -> IPv4Network | None:
        text = (self.env or {}).get("FLANNEL_SUBNET", "")
        try:
            return IPv4Network(text, strict=False) if text else None
        except ValueError:
            return None

    @property
    def own_subnet6(self) -> IPv6Network | None:
        text = (self.env or {}).get("FLANNEL_IPV6_SUBNET", "")
        try:
            return IPv6Network(text, strict=False) if text else None
        except ValueError:
            return None

    @property
    def own_lease(self) -> Lease | None:
        subnet, subnet6 = self.own_subnet, self.own_subnet6
        return next((lease for lease in self.leases
                     if (subnet is not None and lease.subnet == subnet)
                     or (subnet is None and subnet6 is not None
                         and lease.ipv6_subnet == subnet6)), None)

    @property
    def backend(self) -> str:
        return self.config.backend_type if self.config else ""

    @functools.cached_property
    def backend_class(self) -> type[Backend] | None:
        """This node's backend (None when the config names none this build knows)."""
        from flannel.backend import BackendError, backend_class

        if self.config is None:
            return None
        try:
            return backend_class(self.backend)
        except BackendError:
            return None

    @functools.cached_property
    def node(self) -> NodeView | None:
        """This namespace as the backend sees it (read from the kernel once)."""
        from flannel.ops.plans import read_node

        return read_node(self.config, self.own_lease) if self.config is not None else None

    @functools.cached_property
    def description(self) -> Description | None:
        """What flanneld does with every lease on this node; None when it cannot be said
        (no config, an unknown backend, unusable options: ``description_error``)."""
        from flannel.backend import BackendError
        from flannel.ops.plans import describe

        backend, node = self.backend_class, self.node
        if backend is None or node is None:
            return None
        try:
            return describe(backend, node, self.leases)
        except BackendError as err:
            self.description_error = str(err)
            return None

    @property
    def plans(self) -> list[PeerPlan]:
        """Every other lease, with what flanneld does with it."""
        return list(self.description.peers) if self.description is not None else []

    @property
    def peers(self) -> list[PeerPlan]:
        """The leases flanneld uses as peers and programs: not those it parked (the kernel
        refused their entries: it left them out, and the ``parked`` check says why)."""
        parked = self.parked
        return [plan for plan in self.plans if plan.used and plan.lease.key not in parked]

    @functools.cached_property
    def view(self) -> FlanneldView:
        """What the running flanneld says of itself (its /status), read once."""
        from flannel.ops.flanneldview import read_view

        return read_view(self.flanneld)

    @property
    def parked(self) -> dict[str, str]:
        """Lease key -> why, of the peers flanneld parked (none when it cannot be asked)."""
        from flannel.backend.admission import KERNEL_REFUSED

        return self.view.of_kind(KERNEL_REFUSED) if self.flanneld is not None else {}

    @functools.cached_property
    def entries(self) -> KernelEntries:
        from flannel.ops.plans import read_entries

        return read_entries()

    @functools.cached_property
    def engine(self) -> EngineReading | None:
        """What the backend's engines hold (its own peers, security associations...);
        None without a backend."""
        from flannel.backend import BackendError
        from flannel.backend.plan import EngineReading
        from flannel.ops.plans import flanneld_root

        backend, node = self.backend_class, self.node
        if backend is None or node is None:
            return None
        try:
            return backend.read_engine(node, flanneld_root(self.flanneld_pids))
        except (OSError, BackendError) as err:
            return EngineReading(unread=f"cannot read the {self.backend} backend's engine: "
                                 f"{err}")

    def public_ip(self) -> IPv4Address | None:
        own = self.own_lease
        return own.attrs.public_ip if own else None


Check = Callable[[Context], list[Finding]]


def all_checks() -> list[tuple[str, Check]]:
    from flannel.ops.checks import cluster, kernel, node, probes

    return [*node.CHECKS, *cluster.CHECKS, *kernel.CHECKS, *probes.CHECKS]
