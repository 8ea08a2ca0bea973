"""A dict-backed stand-in for the netlink layer the data plane uses, so that the data plane's
orchestration (when passes run, readiness, backoff, drift, the worker thread) is tested
without root.

What it models, from ``flannel.kernel.rtnl.Rtnl`` and ``flannel.kernel.events.watch``:
- the main table's routes, keyed like the kernel's replace ((dst, metric)), with their
  protocol; permanent neighbours keyed (ifindex, ip); ``self`` FDB entries keyed
  (ifindex, mac); dumps of each (``routes(family, ...)`` by table, protocol, kind and
  output device, ``neighbours(family, ifindex)``, AF_BRIDGE for FDB), counted, with the
  filters a kernel with strict dump checking applies and the caller's ``unless``;
- ``run(ops)``: replace/delete with the kernel's outcome per request: every request is
  attempted, refused ones are returned as ``NetlinkError`` with Rtnl's request text, a delete
  of what is gone is not a failure; routes we install get ``RTPROT_FLANNEL``;
- ``route_get(ip)``: answers set with ``FakeKernel.lookups`` (None otherwise);
- notifications: every change (ours, or one made with ``FakeKernel.tamper_*``) is delivered as
  a ``KernelEvent`` to the current watchers on their event loop, like the kernel's multicast
  groups; ``overrun()`` reports lost events.
It does not model links and addresses (beyond events about them), other tables, or ordering
rules between requests. Each handle records the threads that opened, used and closed it.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flannel.kernel import rtnl
from flannel.kernel.events import KernelEvent
from flannel.kernel.rtnl import FdbEntry, Neighbour, NetlinkError, Route

PERMANENT_SELF = (rtnl.NUD_PERMANENT, rtnl.NTF_SELF)


@dataclass
class Handle:
    """One request socket: the threads that opened it, used it and closed it."""

    kernel: FakeKernel
    port: int = 0
    strict: bool = True
    opened_in: int = field(default_factory=threading.get_ident)
    used_in: set[int] = field(default_factory=set)
    closed_in: int | None = None

    def _use(self) -> None:
        if self.closed_in is not None:
            raise OSError(errno.EBADF, "use of a closed netlink socket")
        self.used_in.add(threading.get_ident())
        self.kernel.gate.wait(timeout=10)

    def close(self) -> None:
        self.closed_in = threading.get_ident()

    def routes(self, family: int, *, table: int = 0, protocol: int = 0, kind: int = 0,
               oif: int = 0, not_protocol: int | None = None,
               unless: Callable[[tuple[Route, int, int]], bool] | None = None,
               unless_plain: Callable[[rtnl.PlainRoute], bool] | None = None
               ) -> list[tuple[Route, int, int]]:
        # unless_plain is not asked: these are entries, not messages (``unless`` stands).
        self._use()
        with self.kernel.lock:
            self.kernel.dumps += 1
            if table not in (0, rtnl.RT_TABLE_MAIN):
                return []
            found = [(r, proto, rtnl.RT_TABLE_MAIN) for r, proto in self.kernel.routes.values()
                     if r.family == family and (not protocol or proto == protocol)
                     and proto != not_protocol
                     and (not kind or r.kind == kind) and (not oif or r.oif == oif)]
        return [entry for entry in found if unless is None or not unless(entry)]

    def neighbours(self, family: int, ifindex: int = 0, *,
                   unless: Callable[[tuple[Neighbour | FdbEntry, int, int]], bool] | None = None,
                   unless_plain: Callable[[rtnl.PlainNeighbour], bool] | None = None
                   ) -> list[tuple[Neighbour | FdbEntry, int, int]]:
        self._use()
        found: list[tuple[Neighbour | FdbEntry, int, int]]
        with self.kernel.lock:
            self.kernel.dumps += 1
            if family == rtnl.AF_BRIDGE:
                found = [(f, *PERMANENT_SELF) for f in self.kernel.fdb.values()
                         if not ifindex or f.ifindex == ifindex]
            else:
                found = [(n, rtnl.NUD_PERMANENT, 0) for n in self.kernel.neighbours.values()
                         if (":" in n.ip) == (family == socket.AF_INET6)
                         and (not ifindex or n.ifindex == ifindex)]
        return [entry for entry in found if unless is None or not unless(entry)]

    def route_get(self, dst: rtnl.IPAddress) -> Route | None:
        self._use()
        return self.kernel.lookups.get(str(dst))

    def run(self, ops: Iterable[tuple[str, object]]) -> list[NetlinkError]:
        self._use()
        failures = []
        for verb, obj in ops:
            self.kernel.requests += 1
            what = describe(verb, obj)
            refused = next((code for prefix, code in self.kernel.refusals.items()
                            if what.startswith(prefix)), 0)
            if refused:
                failures.append(NetlinkError(refused, what, verb=verb, entry=obj))
            elif verb == "delete":
                self.kernel.remove(obj)
            else:
                self.kernel.put(obj, rtnl.RTPROT_FLANNEL)
        return failures


def describe(verb: str, obj: object) -> str:
    """The request text ``Rtnl`` puts in a ``NetlinkError``."""
    if isinstance(obj, Route):
        return f"{verb} route {obj.dst}{f' via {obj.gateway}' if obj.gateway else ''}"
    if isinstance(obj, Neighbour):
        return f"{verb} neighbour {obj.ip}"
    assert isinstance(obj, FdbEntry)
    return f"{verb} fdb {obj.mac}"


class FakeKernel:
    """The kernel's tables (see the module docstring); ``open`` is the socket factory and
    ``watch`` the event source the data plane takes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.routes: dict[tuple[str, int], tuple[Route, int]] = {}
        self.neighbours: dict[tuple[int, str], Neighbour] = {}
        self.fdb: dict[tuple[int, str], FdbEntry] = {}
        self.lookups: dict[str, Route] = {}
        #: Request-text prefix -> errno: requests the kernel refuses (e.g. "replace route").
        self.refusals: dict[str, int] = {}
        self.handles: list[Handle] = []
        self.requests = 0
        #: Table dumps asked for (what a full pass reads back).
        self.dumps = 0
        #: Cleared to hold every socket call (a slow pass) until set again.
        self.gate = threading.Event()
        self.gate.set()
        self._watchers: list[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = []

    def open(self) -> Handle:
        handle = Handle(self)
        self.handles.append(handle)
        return handle

    # -- state, as the kernel holds it --

    def put(self, obj: object, protocol: int = rtnl.RTPROT_BOOT) -> None:
        with self.lock:
            if isinstance(obj, Route):
                self.routes[(obj.dst, obj.metric)] = (obj, protocol)
            elif isinstance(obj, Neighbour):
                self.neighbours[(obj.ifindex, obj.ip)] = obj
            else:
                assert isinstance(obj, FdbEntry)
                self.fdb[(obj.ifindex, obj.mac)] = obj
        self._notify(self._event(obj, False, protocol))

    def remove(self, obj: object) -> None:
        with self.lock:
            if isinstance(obj, Route):
                held = self.routes.pop((obj.dst, obj.metric), None)
                gone = held[0] if held else None
                protocol = held[1] if held else 0
            elif isinstance(obj, Neighbour):
                gone, protocol = self.neighbours.pop((obj.ifindex, obj.ip), None), 0
            else:
                assert isinstance(obj, FdbEntry)
                gone, protocol = self.fdb.pop((obj.ifindex, obj.mac), None), 0
        if gone is not None:
            self._notify(self._event(gone, True, protocol))

    def ours(self) -> set[object]:
        """Every route of our protocol, neighbour and FDB entry."""
        with self.lock:
            return ({r for r, proto in self.routes.values() if proto == rtnl.RTPROT_FLANNEL}
                    | set(self.neighbours.values()) | set(self.fdb.values()))

    # -- notifications --

    @staticmethod
    def _event(obj: object, deleted: bool, protocol: int) -> KernelEvent:
        if isinstance(obj, Route):
            return KernelEvent(deleted, obj, protocol)
        if isinstance(obj, FdbEntry):
            return KernelEvent(deleted, obj, state=rtnl.NUD_PERMANENT, flags=rtnl.NTF_SELF)
        assert isinstance(obj, Neighbour)
        return KernelEvent(deleted, obj, state=rtnl.NUD_PERMANENT)

    def _notify(self, event: KernelEvent | None) -> None:
        for loop, queue in list(self._watchers):
            loop.call_soon_threadsafe(queue.put_nowait, event)

    def link_event(self, link: rtnl.Link, deleted: bool = False) -> None:
        """A link changed (this fake keeps no links: only the event is delivered)."""
        self._notify(KernelEvent(deleted, link))

    def overrun(self) -> None:
        """The event buffer overflowed: watchers are told events were lost."""
        self._notify(None)

    @property
    def watching(self) -> int:
        return len(self._watchers)

    async def watch(self, on_event: Callable[[KernelEvent], None],
                    on_overrun: Callable[[], None]) -> None:
        queue: asyncio.Queue[KernelEvent | None] = asyncio.Queue()
        entry = (asyncio.get_running_loop(), queue)
        self._watchers.append(entry)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    on_overrun()
                else:
                    on_event(event)
        finally:
            self._watchers.remove(entry)
