"""Shared fixtures: a real etcd per session (and private ones on demand), unique key prefixes,
a sweep that removes any network namespace this run left behind, no proxy for the cloud
doubles, the ``netns``/``etcd`` markers of the tests that use them, ``slow`` on the image,
foreign-arch and download tests, the fast lane's guard (tests/support/fastlane.py) and its
fewer property-test examples, and how many workers ``-n auto`` starts."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from flannel.clients.etcd import EtcdClient, EtcdOptions, parse_endpoints
from flannel_lab.etcd import EtcdServer
from tests.support import fuzzing, netns

# Bytecode is written (into the __pycache__ directories git ignores) even where the environment
# says PYTHONDONTWRITEBYTECODE: every worker of every run imports every test module, and without
# a cache each one compiles them and rewrites their asserts again (~6 s of CPU a worker).
sys.dont_write_bytecode = False

pytest_plugins = ["tests.support.fastlane", "tests.support.looptime", "tests.support.etcdstores"]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
needs_etcd = pytest.mark.skipif(shutil.which("etcd") is None, reason="needs etcd-server")


#: Fixtures that need root and network namespaces, or an etcd server: a test using one
#: (directly or through another fixture) gets the marker, so that
#: ``-m "not netns and not etcd and not slow"`` selects the fast lane that runs without root.
NETNS_FIXTURES = frozenset({"ns", "make_lab", "module_labs"})
ETCD_FIXTURES = frozenset({"etcd", "private_etcd", "client"})
#: Tests that take minutes when cold or wait on the network (the vm lane boots a VM), and the
#: cloud engines' and the deployment renderers' tests (a third of the fast lane's time for a
#: fifth of its tests, and untouched by most changes): whole run only, not the fast lane.
SLOW_MARKERS = frozenset({"image", "foreign", "pypi", "cloud", "render", "vm"})


TESTS = Path(__file__).parent
#: Where the long tests are: a lab takes 10 to 40 s, an integration test seconds, most
#: others milliseconds.
LONG_PLACES = ("lab", "integration")


def longest_first(item: pytest.Item) -> int:
    """``item``'s rank in the run: the slow tests (mypy, the cloud engines' hostile
    servers, the image, the probes' labs...) first, then the other labs, then the other
    integration tests, then the rest."""
    if item.get_closest_marker("slow"):
        return 0
    parts = item.path.parts
    top = parts[len(TESTS.parts)] if parts[:len(TESTS.parts)] == TESTS.parts else ""
    return 1 + LONG_PLACES.index(top) if top in LONG_PLACES else 1 + len(LONG_PLACES)


#: Workers ``-n auto`` (pyproject's addopts) starts at most: more were never measured.
MAX_WORKERS = 8


def auto_workers(markexpr: str, cores: int) -> int:
    """How many workers ``-n auto`` starts: two per core for a run with the netns and etcd
    tests, which mostly wait on processes, the kernel and timers; one per core for the fast
    lane, whose tests mostly compute (and each worker imports and compiles every test module
    again)."""
    from tests.support.fastlane import is_fast_lane
    return max(1, min(MAX_WORKERS, cores if is_fast_lane(markexpr) else 2 * cores))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return auto_workers(config.getoption("markexpr", "") or "", len(os.sched_getaffinity(0)))


def pytest_configure(config: pytest.Config) -> None:
    # Imported here: the plugin is registered (and its asserts rewritten) by pytest_plugins.
    from tests.support.fastlane import is_fast_lane
    if is_fast_lane(config.getoption("markexpr", "") or ""):
        fuzzing.fast_lane()


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & NETNS_FIXTURES:
            item.add_marker(pytest.mark.netns)
        if used & ETCD_FIXTURES:
            item.add_marker(pytest.mark.etcd)
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
        # Under -n, one worker runs all the image tests: the image is built once per run
        # under one tag, and its buildah storage is not shared between builders.
        if item.get_closest_marker("image"):
            item.add_marker(pytest.mark.xdist_group("image"))
        # One VM boot per run: every vm test reads the same session's results.
        if item.get_closest_marker("vm"):
            item.add_marker(pytest.mark.xdist_group("vm"))
    # Under -n, the workers take tests in this order: the longest first, so that the short
    # ones fill the workers' ends instead of one worker running a lab alone at the end.
    items.sort(key=longest_first)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.geteuid() == 0 and shutil.which("ip"):
        netns.sweep()


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy variables: the cloud API doubles are reached directly."""
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    if shutil.which("etcd") is None:
        pytest.skip("needs etcd-server")
    with EtcdServer(tmp_path_factory.mktemp("etcd")) as server:
        yield server


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of the test's own, for tests that stop, restart or reconfigure it."""
    if shutil.which("etcd") is None:
        pytest.skip("needs etcd-server")
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses, so tests can share one etcd."""
    return f"/test-{uuid.uuid4().hex[:12]}/network"


@pytest.fixture
async def client(etcd: EtcdServer) -> AsyncIterator[EtcdClient]:
    etcd_client = EtcdClient(EtcdOptions(parse_endpoints(etcd.endpoint)))
    yield etcd_client
    await etcd_client.close()


@pytest.fixture
def ns() -> Iterator[str]:
    """A fresh network namespace with loopback up, removed afterwards even on failure."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    name = netns.create()
    try:
        yield name
    finally:
        netns.delete(name)
