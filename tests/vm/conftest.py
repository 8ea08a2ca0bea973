"""The vm lane's one VM session: Debian's kernel booted once per test run, the scenarios of
tests/vm/guest run inside it by tests/vm/driver.py, their outcomes read back as JSON.

The host side measures the calibration (tests/vm/driver.py) the guest measures again, so
the guest knows how much slower it runs (or ``FLANNEL_LAB_SLOWNESS``, when given, is used
as it is). A machine that cannot boot the VM skips the lane with one line saying why and what
to install.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from flannel_lab import slowness
from tests.support import vm

GUEST = Path(__file__).parent / "guest"
#: The bound of the VM session: the lane takes far less (README.md says how long), but a
#: loaded machine slows an emulated one most of all.
LANE_SECONDS = 45 * 60
#: Where the guest's pytest keeps its temporary files: the guest's own /run (its memory),
#: never the host's /tmp, which the guest sees beneath its own.
GUEST_BASETEMP = "/run/flannel-vm-lane"


def scenarios() -> list[str]:
    """The node id of every test function in tests/vm/guest (parametrized ones stand for
    all their cases), read from the source: what the guest must run, known before it runs."""
    found = []
    for path in sorted(GUEST.glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        relative = path.relative_to(vm.REPO).as_posix()
        found += [f"{relative}::{node.name}" for node in tree.body
                  if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.name.startswith("test")]
    return found


@dataclass
class Lane:
    """What one VM session left: how it ended, what the guest said about itself, each
    test's outcome."""

    shared: Path
    boot: vm.Boot
    guest: dict[str, Any] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def of(self, scenario: str) -> dict[str, dict[str, Any]]:
        """The outcomes of ``scenario``'s cases (one, or one per parameter)."""
        return {nodeid: entry for nodeid, entry in self.results.items()
                if nodeid == scenario or nodeid.startswith(f"{scenario}[")}

    def describe(self) -> str:
        ended = (f"exit {self.boot.returncode}" if self.boot.returncode is not None
                 else f"killed at its bound ({LANE_SECONDS}s)")
        tail = "\n".join(self.boot.console.splitlines()[-40:])
        return (f"VM ({self.boot.accel}, {ended} after {self.boot.seconds:.0f}s, kernel "
                f"{self.guest.get('kernel', '?')}, slowness {self.guest.get('slowness')}); "
                f"{len(self.results)} tests reported; files in {self.shared}; console "
                f"tail:\n{tail}")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def selected(session: pytest.Session) -> list[str]:
    """The scenarios this run asserts (``-k`` may select a few): the guest runs those only,
    or the whole of tests/vm/guest when every one (or none) is selected."""
    chosen = {item.callspec.params["scenario"] for item in session.items
              if hasattr(item, "callspec") and "scenario" in item.callspec.params}
    if not chosen or chosen >= set(scenarios()):
        return [GUEST.relative_to(vm.REPO).as_posix()]
    # In their modules' order: a module's scenarios share its lab, and a later one may
    # change it for good (a node with another PSK joins).
    return [scenario for scenario in scenarios() if scenario in chosen]


#: Set to 0 to leave the lane out of a run (``-m "not vm"`` deselects its tests instead).
ASK = "FLANNEL_VM_LANE"


def asked() -> bool:
    """Whether this run includes the lane: every run does, unless ``ASK`` is 0."""
    return os.environ.get(ASK, "").strip() != "0"


@pytest.fixture(scope="session")
def vm_lane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Lane:
    if not asked():
        pytest.skip(f"the vm lane is left out of this run by {ASK}=0")
    if reason := vm.missing_vm():
        pytest.skip(reason)
    given = os.environ.get(slowness.ENV, "").strip()
    factor = slowness.factor() if given else None  # refused here, by name, if unusable
    shared = tmp_path_factory.mktemp("vm-lane")
    job = {"modules": list(vm.MODULES), "slowness": factor,
           "host_calibration_seconds": vm.calibration_seconds(),
           "cached_trees": [str(tree) for tree in vm.cached_trees()],
           # One worker per scenario module at most (a module's lab lives on its worker):
           # labs built side by side keep every vCPU busy.
           "pytest": ["-p", "no:cacheprovider", "-o", "addopts=", "-v", "-n", str(vm.CPUS),
                      "--dist", "loadfile",
                      f"--basetemp={GUEST_BASETEMP}", *selected(request.session)]}
    (shared / "job.json").write_text(json.dumps(job))
    boot = vm.boot([sys.executable, "-m", "tests.vm.driver", str(shared)], shared,
                   LANE_SECONDS)
    return Lane(shared, boot, _read(shared / "guest.json"), _read(shared / "results.json"))
