"""The ``alloc`` backend: acquires a lease and programs nothing (someone else routes).

Its description is empty: no netlink state (the data plane opens no socket for it) and no
appliers.

Must not touch: the kernel.
"""

from __future__ import annotations

from flannel.backend.base import Backend, LocalNetwork
from flannel.backend.footprint import NO_DATA_PATH, Footprint


class AllocBackend(Backend):
    backend_type = ""
    footprint = Footprint(NO_DATA_PATH, dual_stack=True,
                          unjudged="the alloc backend only reserves subnets: no traffic is "
                          "carried between nodes")

    async def prepare(self) -> LocalNetwork:
        return LocalNetwork(backend_type="", mtu=self.ext.mtu)
