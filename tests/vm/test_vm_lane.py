"""The vm lane, host side: Debian's kernel booted once (tests/vm/conftest.py), every scenario
of tests/vm/guest run inside it on the kernel's own ipip, wireguard and ESP modules, and each
scenario's outcome asserted here, with what failed in the guest.

Skipped, with one line saying why and what to install, on a machine that cannot boot the VM.
"""

from __future__ import annotations

import pytest

from tests.support import vm
from tests.vm.conftest import LANE_SECONDS, Lane, scenarios

pytestmark = [pytest.mark.vm, pytest.mark.timeout(LANE_SECONDS + 600)]


def test_the_guest_runs_debian_kernel_with_every_module_loaded(vm_lane: Lane):
    image = vm.guest_kernel()
    assert image is not None
    assert vm_lane.guest.get("kernel") == image[1], vm_lane.describe()
    assert vm_lane.guest["modules"] == dict.fromkeys(vm.MODULES, ""), vm_lane.describe()
    assert vm_lane.guest["esp_warmup"] == "", vm_lane.describe()


def test_the_guest_runs_its_python_and_tools_from_the_cached_root(vm_lane: Lane):
    mounts = vm_lane.guest.get("mounts", {})
    served = {tree: tuple(mounts.get(str(tree), "").split()[:2]) for tree in vm.cached_trees()}
    assert served == dict.fromkeys(vm.cached_trees(), (vm.CACHED_ROOT_TAG, "9p")), (
        mounts, vm_lane.describe())


def test_the_guest_ran_every_scenario_within_its_bound(vm_lane: Lane):
    assert vm_lane.boot.returncode is not None, vm_lane.describe()
    assert vm_lane.guest.get("pytest_exit") is not None, vm_lane.describe()
    # Nothing ran that this side does not assert (a scenario the source scan missed).
    known = scenarios()
    extra = [nodeid for nodeid in vm_lane.results
             if not any(nodeid == s or nodeid.startswith(f"{s}[") for s in known)]
    assert not extra, extra


@pytest.mark.parametrize("scenario", scenarios())
def test_scenario_passes_in_the_vm(vm_lane: Lane, scenario: str):
    cases = vm_lane.of(scenario)
    assert cases, f"{scenario} did not run in the VM: {vm_lane.describe()}"
    failed = {nodeid: entry for nodeid, entry in cases.items() if entry["outcome"] != "passed"}
    assert not failed, "\n\n".join(f"{nodeid}: {entry['outcome']} after {entry['seconds']:.0f}s"
                                   f"\n{entry['details']}" for nodeid, entry in failed.items())
