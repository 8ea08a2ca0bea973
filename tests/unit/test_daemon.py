"""The daemon in-process, without root: a store in memory, a backend that programs nothing,
the real data plane adapter, readiness, health server, subnet.env writer and supervision.

What a user sees is asserted: /readyz answers, the log lines, the exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Network
from typing import NoReturn

import pytest

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendOptions,
    Encapsulation,
    LocalNetwork,
)
from flannel.backend.footprint import PER_PEER, Footprint
from flannel.cni.plugin import parse_subnet_env
from flannel.config import NetworkConfig, parse_config
from flannel.daemon import Daemon
from flannel.flags import parse_args
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Event, EventType, Lease, LeaseAttrs
from flannel.reporting.skips import SkippedRecords
from flannel.rules.manager import RulesStatus
from flannel.rules.spec import PeerAddresses
from flannel.settings import InterfaceSettings, RulesSettings, Settings
from flannel.subnet.envfile import SubnetEnv, write_subnet_env
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.manager import StoreStatus
from flannel.subnet.watch import Changes, LeaseUpdate, Snapshot
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
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return 0, ""
        try:
            writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            data = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        head, _, body = data.decode().partition("\r\n\r\n")
        return int(head.split()[1]), body

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


@pytest.fixture
def log(caplog):
    caplog.set_level(logging.INFO)
    return caplog


def lines(caplog, logger: str = "flanneld") -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


@contextlib.asynccontextmanager
async def running(tmp_path, *flags: str, store: MemoryStore | None = None):
    node = Node(tmp_path, *flags, store=store).start()
    try:
        yield node
    finally:
        await node.stop()


async def test_ready_only_once_the_first_snapshot_is_programmed(tmp_path, log):
    async with running(tmp_path) as node:
        body = await node.wait_readyz(503, "first lease snapshot")
        assert body == ("flanneld is not ready yet: data plane not programmed: waiting for "
                        "the first lease snapshot\n")
        # Written, yet not ready: the peers are not programmed. The CNI plugin reads our lease.
        assert str(parse_subnet_env(str(node.env_path))["subnet"]) == str(OWN)
        assert "Ready: subnet.env written, rules installed, peers programmed" not in lines(log)
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        assert await node.wait_readyz(200) == "flanneld is ready\n"
        assert node.backend is not None and node.backend.peer_sets[-1] == (PEER,)
        assert "Ready: subnet.env written, rules installed, peers programmed" in lines(log)
    assert await node.exit_code() == 0
    assert lines(log)[-1] == "Exiting: stopped by signal"
    assert node.store.watch_closed and node.store.closed


async def peer_sets(node: Node, count: int) -> bool:
    return node.rules is not None and len(node.rules.peer_sets) == count


async def test_encap_peers_only_hands_every_lease_public_ip_to_the_rules(tmp_path):
    joined = Lease(IPv4Network("10.5.3.0/24"), None,
                   LeaseAttrs(public_ip=IPv4Address("192.0.2.3"), backend_type="vxlan"))
    async with running(tmp_path, "--encap-peers-only") as node:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        assert node.rules is not None and node.backend is not None
        assert node.backend.options.encap_peers_only
        ours, peer = IPv4Address("192.0.2.1"), IPv4Address("192.0.2.2")
        assert node.rules.peer_sets[-1] == {4: frozenset({ours, peer}), 6: frozenset()}
        node.store.updates.put_nowait(Changes([Event(EventType.ADDED, joined)]))
        await async_wait_until(lambda: peer_sets(node, 2), 5, what="a join")
        assert node.rules.peer_sets[-1][4] == {ours, peer, IPv4Address("192.0.2.3")}
        node.store.updates.put_nowait(Changes([Event(EventType.REMOVED, PEER)]))
        await async_wait_until(lambda: peer_sets(node, 3), 5, what="a leave")
        assert node.rules.peer_sets[-1][4] == {ours, IPv4Address("192.0.2.3")}


async def test_without_encap_peers_only_the_rules_get_no_peers(tmp_path):
    async with running(tmp_path) as node:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        assert node.rules is not None and node.rules.peer_sets == []
        assert node.backend is not None and not node.backend.options.encap_peers_only


async def test_readiness_transitions_reach_readyz_and_the_log(tmp_path, log):
    # A pass every second picks up the recorder's new state (nothing else triggers one).
    async with running(tmp_path, "--reconcile-interval=1") as node:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
        assert node.backend is not None
        node.backend.recorder.state = (False, "repairing: route 10.5.2.0/24 deleted")
        body = await node.wait_readyz(503)
        assert body == ("flanneld is not ready yet: data plane not programmed: recorder: "
                        "repairing: route 10.5.2.0/24 deleted\n")
        node.backend.recorder.state = (True, "")
        await node.wait_readyz(200)
        node.store.status.set(False, "recovering from an etcd reset: the revision went back")
        await node.wait_readyz(503, "recovering from an etcd reset")
        node.store.status.set(True)
        await node.wait_readyz(200)
    assert [line for line in lines(log) if line.startswith(("Ready", "Not ready"))] == [
        "Ready: subnet.env written, rules installed, peers programmed",
        "Not ready: data plane not programmed: recorder: repairing: route 10.5.2.0/24 deleted",
        "Ready: subnet.env written, rules installed, peers programmed",
        "Not ready: recovering from an etcd reset: the revision went back",
        "Ready: subnet.env written, rules installed, peers programmed"]


async def test_peer_changes_reach_the_data_plane_as_full_sets(tmp_path, log):
    other = Lease(IPv4Network("10.5.3.0/24"), None,
                  LeaseAttrs(public_ip=IPv4Address("192.0.2.3"), backend_type="host-gw"))
    async with running(tmp_path) as node:
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        node.store.updates.put_nowait(Changes([Event(EventType.ADDED, other)]))
        node.store.updates.put_nowait(Changes([Event(EventType.REMOVED, PEER)]))

        async def last_set():
            return node.backend is not None and node.backend.peer_sets and \
                node.backend.peer_sets[-1] == (other,)
        await async_wait_until(last_set, what="the data plane handed the latest full set")
    assert "Subnet removed: 10.5.2.0-24 (public IP 192.0.2.2)" in lines(log)


async def test_own_lease_removed_exits_zero(tmp_path, log):
    node = Node(tmp_path).start()
    node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
    await node.wait_readyz(200)
    node.store.updates.put_nowait(Changes([Event(EventType.REMOVED, OWN_LEASE)]))
    assert await node.exit_code() == 0
    assert "Lease has been revoked. Shutting down daemon." in lines(log)
    assert lines(log)[-1] == "Exiting: own lease revoked"
    assert node.store.watch_closed  # the lease watch was closed, not left to the collector


async def test_a_failing_task_exits_one_naming_it(tmp_path, log):
    node = Node(tmp_path).start()
    node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
    await node.wait_readyz(200)
    node.store.keep_error.set_result(StoreError("the lease record is not a lease; delete it"))
    assert await node.exit_code() == 1
    assert lines(log)[-1] == ("Exiting: lease failed: the lease record is not a lease; "
                              "delete it")
    assert not [r for r in log.records if r.exc_info]  # a declared failure: its message only
    assert node.store.watch_closed
    assert node.backend.closed == 1


async def test_a_bug_in_a_task_exits_one_with_its_traceback(tmp_path, log, monkeypatch):
    def desired_state(self, peers, route_get):
        return {}["missing"]
    monkeypatch.setattr(RecordingBackend, "desired_state", desired_state)
    node = Node(tmp_path).start()
    node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
    assert await node.exit_code() == 1
    bug = [r for r in log.records if r.exc_info]
    assert [r.getMessage() for r in bug] == [
        "dataplane failed on a bug in flanneld; please report it with this traceback"]
    assert bug[0].exc_info[0] is KeyError
    assert lines(log)[-1] == "Exiting: dataplane failed: KeyError: 'missing'"
    assert not [m for m in log.messages if "reconcile failed" in m]
    assert node.backend is not None and node.backend.closed == 1


async def test_a_forever_task_that_returns_exits_one_naming_it(tmp_path, log):
    node = Node(tmp_path).start()
    node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
    await node.wait_readyz(200)
    node.store.updates.put_nowait(None)  # the watch ends, which it must never do
    assert await node.exit_code() == 1
    assert lines(log)[-1] == ("Exiting: leases stopped: it returned, but it must run until "
                              "flanneld stops")


async def test_an_unavailable_store_is_retried_with_backoff_then_recovers(tmp_path, log):
    store = MemoryStore(unavailable=2)
    async with running(tmp_path, store=store) as node:
        body = await node.wait_readyz(503, "acquiring a lease")
        assert body == "flanneld is not ready yet: acquiring a lease\n"

        async def leased() -> bool:
            return store.lease is not None
        await async_wait_until(leased, what="the lease")
        node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
        await node.wait_readyz(200)
    assert store.acquire_attempts == 3
    retried = [line for line in lines(log) if line.startswith("Couldn't acquire a lease")]
    assert retried == [
        "Couldn't acquire a lease: memory store down (attempt 1) (retrying in 0.5s)",
        "Couldn't acquire a lease: memory store down (attempt 2) (retrying in 1.0s)",
        "Couldn't acquire a lease: succeeded after 2 failed attempts"]


async def test_a_signal_stops_cleanly_leaving_state_in_place(tmp_path, log):
    node = Node(tmp_path).start()
    node.store.updates.put_nowait(Snapshot([PEER, OWN_LEASE]))
    await node.wait_readyz(200)
    os.kill(os.getpid(), signal.SIGTERM)
    assert await node.exit_code() == 0
    assert ("Received SIGTERM, shutting down (the lease and data plane stay in place); send it "
            "again to exit immediately") in lines(log)
    assert lines(log)[-1] == "Exiting: stopped by signal"
    assert node.env_path.exists()
    assert node.backend.closed == 1  # what the backend runs (a forwarder) is stopped


def test_what_subnet_env_says_is_what_the_cni_plugin_reads(tmp_path):
    """The contract between flanneld's writer and the CNI plugin's reader: the plugin reads
    back the Network(s), this node's lease subnet (host-local hands out its addresses), the
    MTU and the masquerade flag flanneld wrote."""
    path = tmp_path / "subnet.env"
    for env, expected in (
        (SubnetEnv(IPv4Network("10.5.0.0/16"), IPv4Network("10.5.1.0/24"), None, None, 1450,
                   True),
         {"networks": ["10.5.0.0/16"], "ipv6_networks": [], "subnet": "10.5.1.0/24",
          "ipv6_subnet": None, "mtu": 1450, "ipmasq": True}),
        (SubnetEnv(None, None, IPv6Network("fd00:10::/56"), IPv6Network("fd00:10:0:5::/64"),
                   1280, False),
         {"networks": [], "ipv6_networks": ["fd00:10::/56"], "subnet": None,
          "ipv6_subnet": "fd00:10:0:5::/64", "mtu": 1280, "ipmasq": False}),
    ):
        path.unlink(missing_ok=True)
        write_subnet_env(path, env)
        assert {k: _text(v) for k, v in parse_subnet_env(str(path)).items()} == expected


def _text(value: object) -> object:
    if isinstance(value, list):
        return [str(item) for item in value]
    return str(value) if value is not None and not isinstance(value, bool | int) else value

