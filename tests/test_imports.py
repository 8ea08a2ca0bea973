"""The modules keep to their layers: the import contracts in pyproject.toml
(``[tool.importlinter]``) hold, as checked by import-linter's ``lint-imports``."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) \
        or shutil.which("lint-imports")
    assert lint_imports is not None, "lint-imports is missing: run ./install.sh (test extra)"
    result = subprocess.run([lint_imports, "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout + result.stderr
