"""The data plane the daemon runs: hands each peer set to the backend and reports readiness.

Owns the coalescing of peer sets (the latest one wins), the "dataplane" readiness component
(not ready until the latest peer set is programmed, nor while drift is being repaired) and
the backend's process resources, released when ``run`` ends. This version adapts the
backends' ``sync_peers``/``programmed``/``close`` API; it watches ``programmed()`` because
that API does not report changes.
Must not touch: the store; kernel objects beyond what the backend does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from flannel.backend.base import Backend
from flannel.lease import Lease
from flannel.readiness import Readiness


class Dataplane:
    COMPONENT = "dataplane"
    CHECK_INTERVAL = 0.05  # seconds between looks at the backend's programmed() state

    def __init__(self, backend: Backend, readiness: Readiness, interval: float = 30.0) -> None:
        self.backend = backend
        self.readiness = readiness
        self.interval = interval
        self._peers: tuple[Lease, ...] | None = None
        self._handed: tuple[Lease, ...] | None = None
        self._changed = asyncio.Event()

    def set_peers(self, peers: Sequence[Lease]) -> None:
        """The full set of remote leases to program (replaces any set not yet handed over)."""
        self._peers = tuple(peers)
        self._changed.set()

    def _report(self) -> None:
        if self._handed is None:
            self.readiness.report(self.COMPONENT, False, "data plane not programmed: waiting for "
                                  "the first lease snapshot")
            return
        programmed, why = self.backend.programmed()
        self.readiness.report(self.COMPONENT, programmed, f"data plane not programmed: {why}")

    async def run(self) -> None:
        """Program every peer set as it comes, until cancelled."""
        try:
            self._report()
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), self.CHECK_INTERVAL)
                peers = self._peers
                if self._changed.is_set() and peers is not None:
                    self._changed.clear()
                    await self.backend.sync_peers(peers)
                    self._handed = peers
                self._report()
        finally:
            await self.backend.close()
