"""The ``alloc`` backend: acquires a lease and programs nothing (someone else routes).

Its description is empty: no netlink state (the data plane opens no socket for it) and no
appliers.

Must not touch: the kernel.
"""

from __future__ import annotations

from flannel.backend.base import Backend, LocalNetwork


class AllocBackend(Backend):
    backend_type = ""

    async def prepare(self) -> LocalNetwork:
        return LocalNetwork(backend_type="", mtu=self.ext.mtu)
