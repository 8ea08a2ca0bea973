"""The backend interface: what the daemon asks of every backend.

A backend prepares the local side (devices, keys) and says what to publish in our lease,
then makes the kernel match the set of remote leases it is handed. It never talks to the
lease store. Must not touch: the store, subnet.env.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from flannel.config import NetworkConfig
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease


@dataclass(frozen=True)
class BackendOptions:
    """Daemon settings backends need. ``netns``: program a named namespace (tests, bench)."""

    reconcile_interval: float = 30.0
    netns: str | None = None


@dataclass(frozen=True)
class LocalNetwork:
    """What a prepared backend publishes in our lease and the MTU pods must use."""

    backend_type: str
    mtu: int
    backend_data: str | None = None
    backend_v6_data: str | None = None


class BackendError(Exception):
    """A backend cannot be created or started; the message says what to fix."""


class Backend(ABC):
    """One data plane. Created once per daemon run with the network config."""

    #: The BackendType this backend publishes and acts on ("" for alloc and udp).
    backend_type: str = ""

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        self.ext = ext
        self.config = config
        self.options = options or BackendOptions()

    @abstractmethod
    async def prepare(self) -> LocalNetwork:
        """Set up what must exist before the lease is acquired (devices, keys)."""

    async def activate(self, lease: Lease) -> None:
        """Program the local side of our own lease (addresses on devices)."""

    async def sync_peers(self, peers: Sequence[Lease]) -> None:
        """Make the kernel match the given remote leases (the full desired set)."""

    async def close(self) -> None:
        """Release resources held by the process; kernel state stays for a hitless restart."""

    def programmed(self) -> tuple[bool, str]:
        """Whether the kernel holds what the latest peer set needs, and if not, why."""
        return True, ""

    def wants(self, lease: Lease) -> bool:
        """Whether a remote lease belongs to this backend (upstream filters on BackendType)."""
        return lease.attrs.backend_type == self.backend_type
