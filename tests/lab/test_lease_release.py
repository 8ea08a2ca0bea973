"""``flannelctl leases release`` says what flanneld does with its deleted lease, and flanneld
does that: it logs "Lease has been revoked. Shutting down daemon." and exits with status 0;
the other node drops its route to that subnet; started again (as a supervisor would), it
takes the same subnet from its subnet.env, as a lease with a TTL (a released reservation
is not restored)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flannel.ops.parsers import RELEASE_EFFECT
from flannel_lab.cli import build, wait_for_mesh
from flannel_lab.mesh import peer_routes
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

FLANNELCTL = str(Path(sys.executable).parent / "flannelctl")
FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")
REVOKED = "Lease has been revoked. Shutting down daemon."


def exit_status(pid: int, timeout: float) -> int:
    """The exit status of our child ``pid`` once it ends."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still runs after {timeout:g}s")


def in_node(lab, index: int, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", lab.node_ns(index), FLANNELCTL, *argv],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("reserved", [False, True])
def test_release_says_what_flanneld_then_does(make_lab, reserved):
    lab = make_lab()
    build(lab, 2, {"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}})
    wait_for_mesh(lab, [1, 2], ipv6=False)
    node = lab.node(1)
    key = lab.lease_key(1)
    subnet = key.replace("-", "/")
    if reserved:
        pinned = in_node(lab, 1, "leases", "reserve", subnet, "--public-ip", node.address)
        assert pinned.returncode == 0, pinned
        assert "never (reservation)" in in_node(lab, 1, "leases", "list").stdout
    assert os.waitpid(node.pid, os.WNOHANG) == (0, 0) and REVOKED not in lab.log(1)

    released = in_node(lab, 1, "leases", "release", subnet, "--yes")
    what = "reservation" if reserved else "lease"
    assert released.returncode == 0, released
    assert released.stdout.splitlines()[1:] == [
        f"{key} ({what} of {node.address}): {RELEASE_EFFECT}",
        f"released {key} ({what} of {node.address})"]
    assert f'logs "{REVOKED}" and exits with status 0' in RELEASE_EFFECT

    # What it said: the log line, exit status 0, the peer's route gone.
    assert exit_status(node.pid, 30) == 0
    assert REVOKED in lab.log(1)
    wait_until(lambda: peer_routes(lab, 2) == 0, 30, what="node 2 drops its route")
    assert "takes the subnet its subnet.env names once more, as a new lease that expires " \
           "unless renewed (a reservation is not restored)" in RELEASE_EFFECT

    restarted = subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), "restart",
                                "--name", lab.name, "--node", "1"], capture_output=True,
                               text=True, timeout=120, check=False)
    assert restarted.returncode == 0, restarted
    assert f"Found previously leased subnet ({subnet}), reusing" in lab.log(1)
    assert lab.lease_key(1) == key
    row = in_node(lab, 2, "leases", "show", subnet, "--json")
    assert '"reservation": false' in row.stdout and '"ttl_seconds": 86' in row.stdout, row
    wait_for_mesh(lab, [1, 2], ipv6=False)
