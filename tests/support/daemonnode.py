"""A whole daemon node without a kernel or a store server, for the daemon's unit tests: an
in-memory subnet store, a backend and rules that record what they are asked, the node that wires
them as flanneld does (and one that counts its passes), and an HTTP GET of its endpoints."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from ipaddress import IPv4Address, IPv4Network
from typing import NoReturn

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendOptions,
    Encapsulation,
    EngineSample,
    LocalNetwork,
)
from flannel.backend.footprint import PER_PEER, Footprint
from flannel.config import NetworkConfig, parse_config
from flannel.daemon import Daemon
from flannel.flags import parse_args
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.skips import SkippedRecords
from flannel.rules.manager import RulesStatus
from flannel.rules.spec import PeerAddresses
from flannel.settings import InterfaceSettings, RulesSettings, Settings
from flannel.subnet.errors import StoreUnavailable
from flannel.subnet.manager import StoreStatus
from flannel.subnet.watch import LeaseUpdate
from flannel_lab.etcd import free_port
from tests.support.waiting import async_wait_until

CONFIG = '{"Network": "10.5.0.0/16", "Backend": {"Type": "host-gw"}}'


OWN = IPv4Network("10.5.1.0/24")


PEER = Lease(IPv4Network("10.5.2.0/24"), None,
             LeaseAttrs(public_ip=IPv4Address("192.0.2.2"), backend_type="host-gw"))


#: This node's lease as a snapshot lists it (a snapshot without it means it was removed).
OWN_LEASE = Lease(OWN, None, LeaseAttrs(public_ip=IPv4Address("192.0.2.1"),
                                        backend_type="host-gw"))


EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.0.2.1"), None,
                        IPv4Address("192.0.2.1"), None)


class MemoryStore:
    """A subnet manager holding its leases in memory, for the daemon's tests.

    Models the store contract (``flannel.subnet.manager.SubnetManager``): the network config,
    one lease for this node (``OWN``), a lease watch that yields what the test puts on
    ``updates`` (a ``Snapshot`` or ``Changes``; ``None`` ends the watch, which a real store
    never does), and the keeping of the lease, which holds until the test sets
    ``keep_error``. ``unavailable`` failures (``StoreUnavailable``) are served first by
    ``acquire_lease``, as a store that is down would.
    """

    name = "memory"
    revocable = True

    def __init__(self, unavailable: int = 0) -> None:
        self.status = StoreStatus()
        self.undecodable = SkippedRecords("lease")
        self.lease: Lease | None = None
        self.updates: asyncio.Queue[LeaseUpdate | None] = asyncio.Queue()
        self.unavailable = unavailable
        self.acquire_attempts = 0
        self.keep_error: asyncio.Future[BaseException] = asyncio.Future()
        self.watch_closed = False
        self.closed = False

    async def get_network_config(self) -> NetworkConfig:
        return parse_config(CONFIG)

    async def public_ip_overrides(self) -> tuple[None, None]:
        return None, None

    async def acquire_lease(self, config: NetworkConfig, attrs: LeaseAttrs) -> Lease:
        self.acquire_attempts += 1
        if self.acquire_attempts <= self.unavailable:
            raise StoreUnavailable(f"memory store down (attempt {self.acquire_attempts})")
        self.lease = Lease(OWN, None, attrs)
        return self.lease

    async def watch_leases(self, config: NetworkConfig) -> AsyncIterator[LeaseUpdate]:
        try:
            while (update := await self.updates.get()) is not None:
                yield update
        finally:
            self.watch_closed = True

    async def keep_lease(self, lease: Lease) -> NoReturn:
        raise await self.keep_error

    async def close(self) -> None:
        self.closed = True


class RecordingApplier(Applier):
    """Records every peer set the data plane applies; fails while ``state`` says so."""

    name = "recorder"

    def __init__(self) -> None:
        self.peer_sets: list[tuple[Lease, ...]] = []
        self.state = (True, "")

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        self.peer_sets.append(tuple(peers))
        ok, why = self.state
        return ApplyResult(error="" if ok else why)


class RecordingBackend(Backend):
    """A backend without netlink state whose one applier records what it is given."""

    backend_type = "host-gw"
    footprint = Footprint(PER_PEER, dual_stack=True)  # host-gw's

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.recorder = RecordingApplier()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    async def prepare(self) -> LocalNetwork:
        return LocalNetwork("host-gw", 1500)

    def appliers(self) -> Sequence[RecordingApplier]:
        return (self.recorder,)

    @property
    def peer_sets(self) -> list[tuple[Lease, ...]]:
        return self.recorder.peer_sets


class InstalledRules:
    """Traffic rules that are installed at once (the real ones need root and a namespace)."""

    def __init__(self, resync: float) -> None:
        self.status = RulesStatus(installed=True, reason="")
        self.attempts = 0
        self.resync = resync
        self.peer_sets: list[PeerAddresses] = []

    async def start(self) -> None:
        self.attempts += 1

    async def next(self) -> None:
        await asyncio.sleep(self.resync)
        await self.start()

    def set_peers(self, peers: PeerAddresses) -> None:
        self.peer_sets.append(peers)


async def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` from the health server on 127.0.0.1:``port``: (status, body); (0, "")
    while nothing listens."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, ""
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


class Node:
    """One daemon run in this event loop, with its fakes."""

    def __init__(self, tmp_path, *flags: str, store: MemoryStore | None = None) -> None:
        self.port = free_port()
        self.env_path = tmp_path / "subnet.env"
        self.settings: Settings = parse_args(
            ["--iptables-forward-rules=false", "--healthz-ip=127.0.0.1",
             f"--healthz-port={self.port}", f"--subnet-file={self.env_path}", *flags], {})
        self.store = store or MemoryStore()
        self.backend: RecordingBackend | None = None
        self.daemon = Daemon(self.settings, store=lambda _s: self.store,
                             interface=self._interface, backend=self._backend,
                             rules=self._rules)
        self.task: asyncio.Task[int] | None = None
        self.rules: InstalledRules | None = None

    def _rules(self, rules: RulesSettings, _config: NetworkConfig, _lease: Lease,
               _encapsulation: Encapsulation) -> InstalledRules:
        self.rules = InstalledRules(rules.resync)
        return self.rules

    async def _interface(self, _settings: InterfaceSettings, _config: NetworkConfig,
                         _sm: object) -> ExternalInterface:
        return EXT

    def _backend(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions) -> RecordingBackend:
        self.backend = RecordingBackend(ext, config, options)
        return self.backend

    def start(self) -> Node:
        self.task = asyncio.create_task(self.daemon.run())
        return self

    async def readyz(self) -> tuple[int, str]:
        return await get(self.port, "/readyz")

    async def wait_readyz(self, status: int, needle: str = "", timeout: float = 10) -> str:
        async def answered():
            code, body = await self.readyz()
            return body if code == status and needle in body else ""
        return await async_wait_until(answered, timeout, what=f"/readyz {status} {needle!r}")

    async def exit_code(self, timeout: float = 10) -> int:
        assert self.task is not None
        return await asyncio.wait_for(self.task, timeout)

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.daemon.stop.set()
            await asyncio.wait_for(self.task, 10)


class CountingApplier(Applier):
    """An engine that counts the peers it gains as changes, reports its own figures through
    the ``samples`` hook, and fails while ``error`` is set."""

    name = "counting"

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.error = ""

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        keys = {p.key for p in peers}
        added = len(keys - self.known)
        self.known = keys
        return ApplyResult(changes=added, error=self.error)

    def samples(self) -> list[EngineSample]:
        return [EngineSample("peers", "Peers the engine holds.", len(self.known)),
                EngineSample("packets_total", "Packets forwarded.", 42, counter=True),
                EngineSample("Bad Name!", "never exposed", 1)]


class CountingBackend(RecordingBackend):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.counting = CountingApplier()

    def appliers(self) -> Sequence[Applier]:
        return (self.counting,)


class CountingNode(Node):
    def _backend(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions) -> CountingBackend:
        self.backend = CountingBackend(ext, config, options)
        return self.backend
