"""Tests run this checkout's code: none starts a console script by its path (the
virtualenv's ``flanneld`` runs whichever checkout the virtualenv was installed from), the
launchers of tests/support/checkout.py put this checkout first for themselves and their
children, and the lab starts the flanneld it imported itself."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support.checkout import FLANNELD, LAUNCHERS, command

ROOT = Path(__file__).resolve().parent.parent


def console_scripts() -> list[str]:
    names: list[str] = []
    for pyproject in (ROOT / "pyproject.toml", ROOT / "lab" / "pyproject.toml"):
        names += tomllib.loads(pyproject.read_text())["project"]["scripts"]
    return names


def by_path(source: str, names: list[str]) -> list[str]:
    """The lines of ``source`` that find one of ``names`` as a program file."""
    alternatives = "|".join(re.escape(name) for name in names)
    found = re.compile(
        rf"""(parent|BIN|bin_dir|prefix)\)?\s*/\s*["']({alternatives})["']"""
        rf"""|which\(\s*["']({alternatives})["']"""
        rf"""|\.venv/bin/({alternatives})\b"""
        rf"""|with_name\(\s*["']({alternatives})["']""")
    return [line.strip() for line in source.splitlines() if found.search(line)]


def test_the_pattern_finds_each_way_of_naming_a_console_script():
    names = console_scripts()
    assert {"flanneld", "flannelctl", "flannel-lab"} <= set(names)
    for line in ('X = str(Path(sys.executable).parent / "flanneld")',
                 'cmd = [str(BIN / "flannel-lab"), "up"]',
                 'shutil.which("flannelctl")',
                 'run([".venv/bin/flanneld", "--version"])',
                 'str(Path(FLANNELD).with_name("flannelctl"))'):
        assert by_path(line, names) == [line], line
    assert by_path('images.run(box, "/opt/bin/flanneld", "--version")', names) == []


def test_no_test_or_benchmark_starts_a_console_script_by_its_path():
    names = console_scripts()
    offenders = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        relative = path.relative_to(ROOT)
        if relative.parts[:2] == ("tests", "deploy") or path == Path(__file__).resolve():
            continue  # the image and host tests run the installed product on purpose
        lines = by_path(path.read_text(), names)
        if lines:
            offenders[str(relative)] = lines
    assert offenders == {}, ("start them with tests/support/checkout.py's commands "
                             f"(this checkout's code): {offenders}")


def test_a_launcher_runs_this_checkout_before_anything_else_on_the_path(tmp_path):
    """A decoy ``flannel`` first on PYTHONPATH stands for another checkout: the launcher,
    and the Python processes it starts, import this checkout's."""
    decoy = tmp_path / "elsewhere" / "flannel"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy ran')\n")
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import _checkout, flannel, os, "
             "subprocess; print(flannel.__file__); sys.stdout.flush(); subprocess.run("
             "[sys.executable, '-c', 'import flannel; print(flannel.__file__)'], check=True)")
    env = {**os.environ, "PYTHONPATH": str(decoy.parent)}
    result = subprocess.run([sys.executable, "-c", probe, str(LAUNCHERS)], capture_output=True,
                            text=True, timeout=60, check=False, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(ROOT / "flannel" / "__init__.py")] * 2
    version = subprocess.run([*FLANNELD, "--version"], capture_output=True, text=True,
                             timeout=60, check=False, env=env, cwd=tmp_path)
    assert (version.returncode, "decoy" in version.stderr) == (0, False), version.stderr


def test_each_console_script_has_a_launcher_whose_command_line_names_it():
    for name in ("flanneld", "flannelctl", "flannel-lab", "mk-docker-opts", "install-conf"):
        argv = command(name)
        assert argv[0] == sys.executable and Path(argv[1]).name == name
        # Not executable: tools that print a command to paste name the console script.
        assert not os.access(argv[1], os.X_OK)


def test_the_lab_starts_the_flanneld_of_the_code_it_runs():
    from flannel_lab import cluster

    assert cluster.FLANNELD[0] == sys.executable
    assert Path(cluster.FLANNELD[1]).name == "flanneld"
    assert cluster.SOURCES == (str(ROOT), str(ROOT / "lab"))
    env = cluster.same_code({"PYTHONPATH": f"/elsewhere{os.pathsep}{ROOT}"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), str(ROOT / "lab"), "/elsewhere"]
