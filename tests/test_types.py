"""The code base type-checks: mypy, strict for every module of flannel and flannel_lab (the
configuration lives in pyproject.toml). The first run on a clean clone is cold (~10 s of CPU);
later runs reuse .mypy_cache."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What an override may relax: the libraries without annotations, nothing of ours.
RELAXING = {"ignore_missing_imports"}


def test_strict_applies_to_every_module():
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy["strict"] is True
    assert set(mypy["packages"]) == {"flannel", "flannel_lab"}
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) \
            else [override["module"]]
        assert not [m for m in modules if m.split(".")[0] in {"flannel", "flannel_lab"}], \
            f"an override for our own modules: {override}"
        assert set(override) - {"module"} <= RELAXING, override


@pytest.mark.slow
def test_mypy_finds_no_error():
    # Not skipped when mypy is missing: the test extra installs it (./install.sh).
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                            text=True, timeout=170, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # Nothing before the verdict either: a note (e.g. an unused config section) is a finding.
    assert result.stdout.startswith("Success: no issues found"), result.stdout + result.stderr
