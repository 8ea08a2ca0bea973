"""Readiness: one object every component reports into, read by /readyz, systemd and the logs.

Owns the list of components whose readiness makes the node ready (in a fixed order: the
reason shown is that of the first component that is not ready) and a change notification.
Components report when their state changes; nobody polls. Must not touch: what the components
do; it only holds what they said.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


class Readiness:
    """The node is ready when every component has reported ready."""

    def __init__(self, components: Sequence[str]) -> None:
        if len(set(components)) != len(components) or not components:
            raise ValueError(f"components must be distinct and non-empty: {components!r}")
        self._order = tuple(components)
        self._state: dict[str, tuple[bool, str]] = {
            name: (False, f"{name}: starting") for name in components}
        self._changed = asyncio.Event()

    def report(self, component: str, ready: bool, reason: str = "") -> None:
        """Record a component's state; ``reason`` says why it is not ready (ignored when it is).

        Called from the event loop's thread only.
        """
        if component not in self._state:
            raise KeyError(f"unknown readiness component {component!r}")
        state = (ready, "" if ready else (reason or f"{component}: not ready"))
        if self._state[component] != state:
            self._state[component] = state
            self._changed.set()

    def components(self) -> list[tuple[str, bool, str]]:
        """(name, ready, reason) of every component, in order."""
        return [(name, *self._state[name]) for name in self._order]

    def current(self) -> tuple[bool, str]:
        """(ready, reason of the first component that is not ready)."""
        for name in self._order:
            ready, reason = self._state[name]
            if not ready:
                return False, reason
        return True, ""

    async def wait_changed(self) -> tuple[bool, str]:
        """Wait for the next change of any component's state; the state after it."""
        await self._changed.wait()
        self._changed.clear()
        return self.current()
