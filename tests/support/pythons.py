"""Interpreters a host may offer the CNI plugin: pyenv's builds of given versions, the
distribution's ``/usr/bin/python3``, and a copy of an interpreter without ``_json``, with or
without the ``json`` package too (what a Debian host with python3-minimal but not
libpython3.x-stdlib has).

The copy is a real interpreter: its executable copied, its standard library symlinked to the
original's, every extension module but ``_json`` present (and every package but ``json``,
when asked).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HOST_PYTHON = "/usr/bin/python3"
#: pyenv's builds of every Python the CNI plugin supports (3.9 and later).
CNI_PYTHONS = ("3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0")


def pyenv_python(version: str) -> str | None:
    """``bin/python3`` (``bin/python`` for 2.x) of pyenv's build of ``version``, or None."""
    prefixes = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        proc = subprocess.run([pyenv, "prefix", version], capture_output=True, text=True,
                              timeout=30, check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            prefixes.append(Path(proc.stdout.strip()))
    prefixes.append(Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
                    / version)
    name = "python" if version.startswith("2.") else "python3"
    for prefix in prefixes:
        if os.access(prefix / "bin" / name, os.X_OK):
            return str(prefix / "bin" / name)
    return None


def python_or_skip(name: str) -> str:
    """``"host"`` for /usr/bin/python3, else a pyenv version such as ``"3.9.18"``."""
    if name == "host":
        if not os.access(HOST_PYTHON, os.X_OK):
            pytest.skip(f"no {HOST_PYTHON} on this machine")
        return HOST_PYTHON
    path = pyenv_python(name)
    if path is None:
        pytest.skip(f"needs pyenv's CPython {name} (pyenv install {name}; `pyenv prefix "
                    f"{name}` finds it)")
    return path


_DESCRIBE = """import json, os, sys
try:
    import _json
    where = getattr(_json, "__file__", None)
except ImportError:
    where = None
print(json.dumps({"prefix": sys.prefix, "stdlib": os.path.dirname(os.__file__),
                  "json_ext": where, "executable": os.path.realpath(sys.executable)}))
"""


def without_json(base: str, directory: Path, *, package: bool = False) -> str:
    """An interpreter like ``base`` that lacks ``_json`` (and the ``json`` package when
    ``package``), built under ``directory``."""
    proc = subprocess.run([base, "-I", "-S", "-c", _DESCRIBE], capture_output=True, text=True,
                          timeout=30, check=True)
    facts = json.loads(proc.stdout)
    if not facts["json_ext"]:
        pytest.skip(f"{base} has _json built in; cannot make a copy without it")
    dynload = Path(facts["json_ext"]).parent
    stdlib = Path(facts["stdlib"])
    new_stdlib = directory / stdlib.relative_to(facts["prefix"])
    new_dynload = directory / dynload.relative_to(facts["prefix"])
    new_stdlib.mkdir(parents=True)
    new_dynload.mkdir(parents=True, exist_ok=True)
    for entry in stdlib.iterdir():
        if (new_stdlib / entry.name).exists() or entry == dynload \
                or (package and entry.name == "json"):
            continue
        (new_stdlib / entry.name).symlink_to(entry)
    for entry in dynload.iterdir():
        if not entry.name.startswith("_json."):
            (new_dynload / entry.name).symlink_to(entry)
    executable = directory / "bin" / Path(facts["executable"]).name
    executable.parent.mkdir()
    shutil.copy2(facts["executable"], executable)
    return str(executable)
