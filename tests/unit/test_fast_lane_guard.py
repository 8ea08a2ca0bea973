"""The fast lane's guard (tests/support/fastlane.py): a fast-lane run fails a test that tries
to create a namespace or start etcd without its marker, before anything is created, and
leaves marked tests and harmless processes alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MAX_WORKERS, auto_workers
from tests.support.fastlane import forbidden, is_fast_lane

ROOT = Path(__file__).resolve().parents[2]

INNER = '''
import subprocess
import pytest
from flannel_lab.etcd import EtcdServer
from tests.support import netns

def test_makes_a_namespace():
    netns.create()

def test_starts_etcd(tmp_path):
    with EtcdServer(tmp_path / "etcd"):
        pass

def test_unshares_the_network():
    subprocess.run(["unshare", "--net", "true"], check=True)

def test_runs_a_harmless_tool():
    subprocess.run(["ip", "netns", "list"], check=False, capture_output=True)

@pytest.mark.netns
def test_marked():
    raise AssertionError("deselected in the fast lane")
'''


@pytest.mark.parametrize(("expr", "fast"), [
    ("not netns and not etcd", True),
    ("not netns and not etcd and not slow", True),
    ("not (netns or etcd)", True),
    ("not netns", False),
    ("etcd", False),
    ("", False),
])
def test_the_fast_lane_is_told_by_the_marker_expression(expr, fast):
    assert is_fast_lane(expr) is fast


@pytest.mark.parametrize(("argv", "marker"), [
    (["ip", "netns", "add", "x"], "netns"),
    (["/usr/sbin/ip", "netns", "add", "x"], "netns"),
    (["unshare", "--net", "true"], "netns"),
    (["unshare", "-n", "true"], "netns"),
    (["/usr/bin/etcd", "--data-dir", "d"], "etcd"),
    (["ip", "netns", "list"], None),
    (["ip", "link", "add", "netns"], None),
    (["unshare", "--mount", "true"], None),
    (["etcdctl", "get", "k"], None),
])
def test_what_the_fast_lane_refuses(argv, marker):
    assert forbidden(argv) == marker


def test_a_fast_lane_run_fails_the_unmarked_test_that_creates_a_namespace_or_starts_etcd(
        tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    # No plugin but the guard (-p): the inner tests need none, and loading the installed
    # ones (hypothesis above all) would be most of this test's time.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.fastlane", "-p", "no:cacheprovider",
         "-q", "-rf", "-m", "not netns and not etcd", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "3 failed, 1 passed, 1 deselected" in out, out
    assert "test_makes_a_namespace - " in out and "mark it pytest.mark.netns" in out, out
    assert "test_starts_etcd" in out and "mark it pytest.mark.etcd" in out, out
    assert "test_unshares_the_network" in out, out


@pytest.mark.parametrize(("expr", "cores", "workers"), [
    ("", 2, 4),  # the whole run mostly waits: two workers per core
    ("not slow", 2, 4),
    ("not netns and not etcd and not slow", 2, 2),  # the fast lane computes: one per core
    ("not netns and not etcd", 1, 1),
    ("", 64, MAX_WORKERS),
    ("not netns and not etcd", 64, MAX_WORKERS),
])
def test_auto_starts_more_workers_for_the_waiting_tests(expr, cores, workers):
    assert auto_workers(expr, cores) == workers
