"""A backend defined outside the package, that runs a process and declares what doctor
checks of it, needs only its own module and one ``register()`` line
(``tests/support/sleeperbackend.py``): flanneld (the in-process daemon, its data plane on a
fake kernel) starts its helper and programs its peers' routes; doctor's engine check judges
it from its declarations (every peer held; a peer it lacks; the helper not running); what
``flannelctl cleanup`` looks for finds the helper while it runs; and it is gone, reaped,
once flanneld stops.
"""

from __future__ import annotations

import functools
import os
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from flannel import backend as registry
from flannel.backend.footprint import Place
from flannel.backend.plan import NodeView
from flannel.config import NetworkConfig, parse_config
from flannel.daemon import Daemon, make_backend
from flannel.dataplane.loop import Dataplane
from flannel.lease import Lease, LeaseAttrs
from flannel.ops.checks import Context
from flannel.ops.checks.kernel import check_engine
from flannel.ops.cleanup import Inventory, backend_items
from flannel.ops.leases import LeaseRow
from flannel.process.procstop import alive
from flannel.subnet.watch import Snapshot
from tests.support import sleeperbackend
from tests.support.daemonnode import EXT, OWN, MemoryStore, Node
from tests.support.dataplanes import until
from tests.support.fakenetlink import FakeKernel
from tests.support.sleeperbackend import HELPER_NAME, TYPE, SleeperBackend, files

CONFIG = f'{{"Network": "10.5.0.0/16", "Backend": {{"Type": "{TYPE}"}}}}'


def lease(n: int) -> Lease:
    return Lease(IPv4Network(f"10.5.{n}.0/24"), None,
                 LeaseAttrs(public_ip=IPv4Address(f"192.0.2.{n}"), backend_type=TYPE))


class SleeperStore(MemoryStore):
    async def get_network_config(self) -> NetworkConfig:
        return parse_config(CONFIG)


class RegistryNode(Node):
    """The daemon choosing its backend through the registry, its data plane on ``kernel``."""

    def __init__(self, tmp_path: Path, kernel: FakeKernel) -> None:
        super().__init__(tmp_path, store=SleeperStore())
        dataplane = functools.partial(Dataplane, netlink=kernel.open, watch=kernel.watch)
        self.daemon = Daemon(self.settings, store=lambda _s: self.store,
                             interface=self._interface, backend=make_backend,
                             dataplane=dataplane,  # type: ignore[arg-type]
                             rules=self._rules)


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    sleeperbackend.register(run)
    try:
        yield run
    finally:
        registry.unregister(TYPE)


def doctor(leases: list[Lease]) -> list[tuple[str, str, str]]:
    """Doctor's engine check on this node, with this process as flanneld (it is: the daemon
    runs in it), its store holding ``leases``."""
    config = parse_config(CONFIG)
    ctx = Context(subnet_file=Path("/nonexistent/subnet.env"), sysctl_root=Path("/proc/sys"),
                  cni_bin_dirs=[], cni_conf_dirs=[], probe_timeout=1.0, fix_checksum=False,
                  config=config, env={"FLANNEL_SUBNET": "10.5.1.1/24"},
                  rows=[LeaseRow(item.key, item, 3600) for item in leases],
                  flanneld_pids=[os.getpid()])
    ctx.__dict__["node"] = NodeView(config, ctx.own_lease, {}, EXT.index, EXT.ext_addr)
    return [(f.check, f.severity, f.what) for f in check_engine(ctx)]


def leftovers(run_dir: Path) -> list[str]:
    found = Inventory()
    backend_items(found, Place(run_dir))
    return [item.what for item in found.items]


async def test_its_process_runs_is_judged_by_doctor_and_is_gone_after_stop(run_dir, tmp_path):
    kernel = FakeKernel()
    node = RegistryNode(tmp_path, kernel).start()
    own = Lease(OWN, None, LeaseAttrs(public_ip=IPv4Address("192.0.2.1"), backend_type=TYPE))
    try:
        node.store.updates.put_nowait(Snapshot([own, lease(2), lease(3)]))
        await node.wait_readyz(200)
        backend = node.daemon.state.backend
        assert isinstance(backend, SleeperBackend) and backend.helper is not None
        helper = backend.helper
        assert {r.dst for r in kernel.ours()} == {"10.5.2.0/24", "10.5.3.0/24"}
        await until(lambda: files(run_dir)[1].exists(), "the helper holds the peers")

        assert doctor([own, lease(2), lease(3)]) == []
        assert doctor([own, lease(2), lease(3), lease(4)]) == [
            ("engine", "error", f"the sleeper peer {lease(4).key} for node 192.0.2.4 (10.5.4.0/24) "
             f"is missing in {HELPER_NAME}")]
        assert leftovers(run_dir) == [
            f"process {HELPER_NAME} (pid {helper.pid})", f"file {files(run_dir)[0]}",
            f"file {files(run_dir)[1]}"]
    finally:
        await node.stop()

    assert helper.returncode is not None and not alive(helper.pid)  # stopped and reaped
    assert doctor([own, lease(2), lease(3)]) == [
        ("backend", "error", f"the {HELPER_NAME} helper is not running")]
    assert leftovers(run_dir) == [f"file {files(run_dir)[1]}"]


async def test_cleanup_stops_a_helper_flanneld_left(run_dir, tmp_path):
    """A helper whose flanneld died without stopping it is found and stopped by cleanup."""
    kernel = FakeKernel()
    node = RegistryNode(tmp_path, kernel).start()
    try:
        node.store.updates.put_nowait(Snapshot([Lease(OWN, None, LeaseAttrs(
            public_ip=IPv4Address("192.0.2.1"), backend_type=TYPE)), lease(2)]))
        await node.wait_readyz(200)
        backend = node.daemon.state.backend
        assert isinstance(backend, SleeperBackend) and backend.helper is not None
        helper = backend.helper
        found = Inventory()
        backend_items(found, Place(run_dir))
        for item in found.items:
            item.remove()
        assert not alive(helper.pid)
        assert leftovers(run_dir) == []
    finally:
        await node.stop()
    assert helper.returncode is not None
