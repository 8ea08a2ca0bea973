"""The backend contract is closed: a backend defined here, outside the package, registers
through the registry and is run by the in-process daemon (its device and route programmed
by the real data plane in a namespace of this test), shows in /status (its engine's figures
and its declared footprint), is closed after the data plane has stopped, and is cleaned up
by ``flannelctl cleanup`` through its declared link alone. Nothing else names it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from flannel import backend as registry
from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendOptions,
    EngineSample,
    LocalNetwork,
    RouteLookup,
)
from flannel.backend.footprint import COVERING, Footprint, Link
from flannel.config import NetworkConfig, parse_config
from flannel.daemon import make_backend
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs
from flannel.subnet.watch import Snapshot
from tests.support import netns
from tests.support.daemonnode import OWN, MemoryStore, Node

pytestmark = pytest.mark.netns

TYPE = "test-dummy"
DEVICE = "flannel-test0"
CONFIG = f'{{"Network": "10.5.0.0/16", "Backend": {{"Type": "{TYPE}"}}}}'
REPO = Path(__file__).resolve().parents[2]


def peer(n: int) -> Lease:
    return Lease(IPv4Network(f"10.5.{n}.0/24"), None,
                 LeaseAttrs(public_ip=IPv4Address(f"192.0.2.{n}"), backend_type=TYPE))


class DummyEngine(Applier):
    """Counts its peers; records any pass run after it was closed."""

    name = "dummy engine"

    def __init__(self) -> None:
        self.peers = 0
        self.closed = False
        self.applied_after_close = False

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        self.applied_after_close |= self.closed
        self.peers = len(peers)
        return ApplyResult()

    def samples(self) -> list[EngineSample]:
        return [EngineSample("dummy_peers", "Peers the dummy engine holds.", self.peers)]

    def close(self) -> None:
        self.closed = True


class DummyBackend(Backend):
    """A device of its own (a bridge: this kernel may lack the dummy driver) carrying a route
    over the whole Network, in the namespace ``netns``."""

    backend_type = TYPE
    footprint = Footprint(COVERING, device=DEVICE, links=(Link(r"flannel-test\d+", "bridge"),))
    netns = ""  # where it programs, set by the test (flanneld passes its own Host)
    made: DummyBackend | None = None

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, replace(options or BackendOptions(),
                                              host=Host(self.netns)))
        self.engine = DummyEngine()
        self.index = 0
        DummyBackend.made = self

    async def prepare(self) -> LocalNetwork:
        return LocalNetwork(TYPE, 1400)

    def ensure_local(self) -> None:
        if netns.ip("link", "show", DEVICE, netns=self.netns, check=False).returncode:
            netns.ip("link", "add", DEVICE, "type", "bridge", netns=self.netns)
        netns.ip("link", "set", DEVICE, "up", netns=self.netns)
        shown = json.loads(netns.ip("-j", "link", "show", DEVICE, netns=self.netns).stdout)
        self.index = shown[0]["ifindex"]

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        network = self.config.network
        assert network is not None and self.lease is not None and self.lease.subnet
        return DesiredState(frozenset({Route(str(network), None, self.index)}),
                            devices=frozenset({self.index}), networks=(network,),
                            local_subnets=(self.lease.subnet,))

    def appliers(self) -> Sequence[Applier]:
        return (self.engine,)


def register() -> None:
    """What a package defining a backend does (also run by the cleanup process below)."""
    registry.register(TYPE, DummyBackend)


class DummyStore(MemoryStore):
    async def get_network_config(self) -> NetworkConfig:
        return parse_config(CONFIG)


class RegistryNode(Node):
    """The daemon choosing its backend from the network config, through the registry."""

    def _backend(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions) -> Backend:  # type: ignore[override]
        return make_backend(ext, config, options)


@pytest.fixture
def dummy(ns):
    register()
    DummyBackend.netns, DummyBackend.made = ns, None
    try:
        yield ns
    finally:
        registry.unregister(TYPE)


async def get_status(port: int) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    return json.loads(data.partition(b"\r\n\r\n")[2])


def routes(ns: str) -> str:
    return netns.ip("route", "show", "proto", "151", netns=ns).stdout


def cleanup(ns: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``flannelctl cleanup`` in the namespace, in a process that registered the backend."""
    program = ("import sys; from tests.unit.test_backend_contract import register; "
               "register(); from flannel.ctl import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", program, "cleanup",
         f"--run-dir={tmp_path}", f"--subnet-file={tmp_path / 'subnet.env'}",
         f"--cni-bin-dir={tmp_path}", f"--cni-conf-dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def test_registration_refuses_a_taken_type_and_a_backend_without_footprint():
    with pytest.raises(ValueError, match="already registered"):
        registry.register("vxlan", DummyBackend)

    class Undeclared(Backend):
        async def prepare(self) -> LocalNetwork:
            return LocalNetwork(TYPE, 1400)

    with pytest.raises(ValueError, match="declares no footprint"):
        registry.register("test-undeclared", Undeclared)
    assert "test-undeclared" not in registry.supported()


async def test_a_registered_backend_runs_shows_in_status_and_is_cleaned_up(dummy, tmp_path):
    ns = dummy
    node = RegistryNode(tmp_path, store=DummyStore()).start()
    try:
        node.store.updates.put_nowait(Snapshot([peer(2), peer(3), Lease(
            OWN, None, LeaseAttrs(public_ip=IPv4Address("192.0.2.1"), backend_type=TYPE))]))
        await node.wait_readyz(200)
        assert f"10.5.0.0/16 dev {DEVICE}" in routes(ns)
        status = await get_status(node.port)
        assert status["engines"] == {"dummy engine": {"dummy_peers": 2}}
        assert status["footprint"]["links"] == [{"pattern": r"flannel-test\d+",
                                                 "kind": "bridge"}]
        assert status["footprint"]["device"] == DEVICE
        assert status["network"]["backend"] == TYPE
        assert status["peers"]["programmed"] == 2
    finally:
        await node.stop()
    made = DummyBackend.made
    assert made is not None and made.engine.closed  # closed at exit ...
    assert not made.engine.applied_after_close  # ... once the data plane no longer runs it

    result = cleanup(ns, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"removed: device {DEVICE} (bridge)" in result.stdout
    assert f"removed: route 10.5.0.0/16 dev {DEVICE} proto 151" in result.stdout
    assert DEVICE not in netns.ip("link", "show", netns=ns).stdout
    assert routes(ns) == ""
