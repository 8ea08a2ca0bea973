"""``flannelctl install-cni``: which interpreters it refuses (and that it then writes nothing),
the installed layout, pruning of old library directories, and the conflist."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import flannel
from flannel.cni.install import LIBRARY_DIR, launcher_library, launcher_text
from flannel.ctl import main
from flannel.version import __version__
from tests.support.checkout import FLANNELCTL
from tests.support.pythons import HOST_PYTHON, python_or_skip, without_json

FIX = ("the flannel CNI plugin runs with this interpreter on the host: pass --python with a "
       "CPython >= 3.9 that has json and _socket, or use upstream's static flannel plugin and "
       "--plugin none")


def install(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Run flannelctl as an operator would (a process of its own)."""
    argv = ["install-cni", "--bin-dir", str(tmp_path / "bin"), "--conf-dir",
            str(tmp_path / "conf"), *extra]
    return subprocess.run([sys.executable, "-m", "flannel.ctl", *argv], capture_output=True,
                          text=True, timeout=60, check=False)


def refused(tmp_path: Path, python: str) -> str:
    proc = install(tmp_path, "--python", python)
    assert proc.returncode == 1, proc.stdout
    assert not (tmp_path / "bin").exists() and not (tmp_path / "conf").exists()
    return proc.stderr


def library_dirs(bin_dir: Path) -> list[str]:
    return sorted(p.name for p in (bin_dir / LIBRARY_DIR).iterdir())


def test_refuses_a_missing_interpreter(tmp_path):
    missing = str(tmp_path / "no" / "python3")
    assert refused(tmp_path, missing) == \
        f"flannelctl install-cni: --python {missing}: no such file; {FIX}\n"


@pytest.mark.parametrize("version", ["3.8.18", "3.6.15"])
def test_refuses_a_python_too_old(tmp_path, version):
    python = python_or_skip(version)
    assert refused(tmp_path, python) == \
        f"flannelctl install-cni: --python {python} is Python {version}, too old: {FIX}\n"


def test_installs_for_a_python_without_the_private_json_module(tmp_path):
    python = without_json(python_or_skip("host"), tmp_path / "python-no-_json")
    proc = install(tmp_path, "--python", python)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bin" / "flannel").read_text().startswith(f"#!{python} -IS\n")


def test_refuses_a_python_without_json(tmp_path):
    python = without_json(python_or_skip("host"), tmp_path / "python-minimal", package=True)
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=30,
                             check=True).stdout.strip()
    minor = ".".join(version.split(".")[:2])
    assert refused(tmp_path, python) == (
        f"flannelctl install-cni: --python {python} (Python {version}) lacks json: {FIX} "
        f"(Debian, Ubuntu: install libpython{minor}-stdlib)\n")


def test_refuses_python2(tmp_path):
    python = python_or_skip("2.7.18")
    message = refused(tmp_path, python)
    assert f"--python {python}: failed to report its version as '{python} -I -S' " \
           "(exit status 2: Unknown option: -I" in message


@pytest.mark.parametrize("python", ["python3", "/usr/bin/python3 -E", "/" + "p" * 130])
def test_refuses_what_cannot_be_a_shebang(tmp_path, python):
    assert "give an absolute path without spaces, at most 120 bytes" in refused(tmp_path, python)


def test_layout_modes_and_default_interpreter(tmp_path):
    python_or_skip("host")
    proc = install(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bin_dir = tmp_path / "bin"
    assert proc.stdout == (f"installed {bin_dir}/flannel (run by {HOST_PYTHON}) and "
                           f"{tmp_path}/conf/10-flannel.conflist\n")
    launcher = bin_dir / "flannel"
    assert launcher.read_text().splitlines()[0] == f"#!{HOST_PYTHON} -IS"
    assert stat.S_IMODE(launcher.stat().st_mode) == 0o755
    [name] = library_dirs(bin_dir)
    assert re.fullmatch(rf"{re.escape(__version__)}-[0-9a-f]{{12}}", name)
    assert f'LIBRARY = "{name}"' in launcher.read_text()
    library = bin_dir / LIBRARY_DIR / name
    modules = sorted(str(p.relative_to(library)) for p in library.rglob("*.py"))
    assert modules == ["flannel/__init__.py", "flannel/cni/__init__.py", "flannel/cni/lite.py",
                       "flannel/cni/plugin.py", "flannel/version.py"]
    for module in modules:
        assert stat.S_IMODE((library / module).stat().st_mode) == 0o644
    assert stat.S_IMODE((library / "flannel" / "cni").stat().st_mode) == 0o755
    assert sorted(p.name for p in bin_dir.iterdir()) == [LIBRARY_DIR, "flannel"]


def test_reinstall_keeps_the_previous_library_only(tmp_path):
    python_or_skip("host")
    bin_dir = tmp_path / "bin"
    root = bin_dir / LIBRARY_DIR
    assert install(tmp_path).returncode == 0
    [current] = library_dirs(bin_dir)
    # An older install: its launcher and library, an even older library, and the leftover
    # of an install that died while writing.
    (bin_dir / "flannel").write_text(launcher_text(HOST_PYTHON, "0.0.8-aaaaaaaaaaaa"))
    for leftover in ("0.0.8-aaaaaaaaaaaa", "0.0.7-bbbbbbbbbbbb", ".0.1.0-cccc.x1y2.tmp"):
        (root / leftover / "flannel").mkdir(parents=True)

    assert install(tmp_path).returncode == 0
    assert library_dirs(bin_dir) == sorted(["0.0.8-aaaaaaaaaaaa", current])
    assert install(tmp_path).returncode == 0
    assert library_dirs(bin_dir) == [current]


def test_a_damaged_library_is_rewritten(tmp_path):
    python_or_skip("host")
    assert install(tmp_path).returncode == 0
    [name] = library_dirs(tmp_path / "bin")
    plugin = tmp_path / "bin" / LIBRARY_DIR / name / "flannel" / "cni" / "plugin.py"
    original = plugin.read_bytes()
    plugin.write_bytes(original[:100])
    assert install(tmp_path).returncode == 0
    assert plugin.read_bytes() == original
    assert library_dirs(tmp_path / "bin") == [name]


def test_plugin_none_installs_the_conflist_only(tmp_path):
    source = tmp_path / "cni-conf.json"
    source.write_text(json.dumps({"name": "cbr0", "cniVersion": "1.0.0",
                                  "plugins": [{"type": "flannel"}]}))
    proc = install(tmp_path, "--plugin", "none", "--conflist", str(source))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"installed {tmp_path}/conf/10-flannel.conflist\n"
    assert not (tmp_path / "bin").exists()
    written = tmp_path / "conf" / "10-flannel.conflist"
    assert json.loads(written.read_text())["plugins"] == [{"type": "flannel"}]
    assert stat.S_IMODE(written.stat().st_mode) == 0o644


def test_plugin_none_rejects_python(tmp_path, capsys):
    assert main(["install-cni", "--bin-dir", str(tmp_path), "--conf-dir", str(tmp_path),
                 "--plugin", "none", "--python", HOST_PYTHON]) == 2
    assert capsys.readouterr().err == \
        "flannelctl install-cni: --python and --force apply to --plugin python only\n"


def test_the_default_never_replaces_a_plugin_it_did_not_install(tmp_path):
    """The plain-host line of docs/install.md on a host with upstream's static plugin."""
    static = b"\x7fELF\x02\x01\x01upstream static flannel plugin"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "flannel").write_bytes(static)
    command = [*FLANNELCTL, "install-cni", "--bin-dir",
               str(tmp_path / "bin"), "--conf-dir", str(tmp_path / "conf"),
               "--python", HOST_PYTHON]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == (
        f"flannelctl install-cni: {tmp_path}/bin/flannel is not pyflannel's plugin launcher "
        "(upstream's static flannel plugin?): it is left as it is; give --plugin none to "
        "install the conflist only, or --force to replace it with the Python plugin\n")
    assert (tmp_path / "bin" / "flannel").read_bytes() == static
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == ["flannel"]
    assert not (tmp_path / "conf").exists()
    # What the doc says to run there: the conflist only, the static plugin kept.
    proc = subprocess.run([*command[:-2], "--plugin", "none"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "bin" / "flannel").read_bytes() == static
    assert (tmp_path / "conf" / "10-flannel.conflist").exists()
    # Its own launcher is replaced as before; --force replaces a foreign one.
    proc = subprocess.run([*command, "--force"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert launcher_library(tmp_path / "bin" / "flannel")
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_a_bad_conflist_is_refused(tmp_path):
    source = tmp_path / "cni-conf.json"
    source.write_text('{"name": "cbr0"}')
    proc = install(tmp_path, "--plugin", "none", "--conflist", str(source))
    assert proc.returncode == 1
    assert proc.stderr == (f"flannelctl install-cni: --conflist {source}: not a CNI network "
                           "config list (it needs a \"plugins\" array)\n")
    assert not (tmp_path / "conf" / "10-flannel.conflist").exists()


def test_a_conflist_nested_too_deep_is_refused_without_a_traceback(tmp_path):
    source = tmp_path / "cni-conf.json"
    source.write_text('{"plugins":' + "[" * 3000 + "]" * 3000 + "}")
    proc = install(tmp_path, "--plugin", "none", "--conflist", str(source))
    assert proc.returncode == 1
    assert proc.stderr == (f"flannelctl install-cni: --conflist {source} nests JSON deeper "
                           "than the limit of 32 levels\n")
    assert not (tmp_path / "conf" / "10-flannel.conflist").exists()


def test_help_says_what_is_installed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["install-cni", "--help"])
    text = capsys.readouterr().out
    assert "installs pyflannel's own plugin: the launcher 'flannel' and its modules under " \
           ".flannel-cni/<version>-<hash>/" in text
    assert "--plugin none installs only the conflist" in text
    assert "(default /usr/bin/python3: the distribution's own, not pyflannel's virtualenv" \
        in text


def test_a_bin_dir_that_is_a_file_is_refused(tmp_path):
    python_or_skip("host")
    (tmp_path / "bin").write_text("")
    proc = install(tmp_path)
    assert proc.returncode == 1
    assert proc.stderr == f"flannelctl install-cni: --bin-dir {tmp_path}/bin: not a directory\n"


_NOEXEC_INSTALL = """import os, subprocess, sys
directory = sys.argv[1]
subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec", "tmpfs", directory], check=True)
sys.path.insert(0, sys.argv[2])
from flannel.ctl import main
status = main(["install-cni", "--bin-dir", directory + "/bin", "--conf-dir",
               directory + "/conf", "--python", sys.argv[3]])
print(sorted(os.listdir(directory + "/bin")), status)
"""


def test_refused_when_the_plugin_cannot_run_from_the_bin_dir(tmp_path):
    """A noexec bin dir (in a mount namespace of the test's own): the new launcher fails its
    VERSION call, so nothing stays behind and no conflist is written."""
    python = python_or_skip("host")
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux unshare")
    root = str(Path(flannel.__file__).resolve().parent.parent)
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                           "-c", _NOEXEC_INSTALL, str(tmp_path), root, python],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.stdout == "[] 1\n", proc.stderr
    assert proc.stderr == (f"flannelctl install-cni: {tmp_path}/bin: cannot run the plugin from "
                           "it: Permission denied (is it mounted noexec?)\n")


def test_a_bin_dir_another_install_creates_meanwhile_is_used(tmp_path, monkeypatch):
    """The race of concurrent installs, made certain: the other install creates the bin
    dir between this one's look and its mkdir."""
    from flannel.cni import install

    bin_dir = tmp_path / "opt" / "cni" / "bin"
    real_mkdir = install._mkdir

    def racing_mkdir(path: Path) -> None:
        if path == bin_dir:
            real_mkdir(path)  # the other install's
        real_mkdir(path)
    monkeypatch.setattr(install, "_mkdir", racing_mkdir)
    assert main(["install-cni", "--bin-dir", str(bin_dir), "--conf-dir",
                 str(tmp_path / "conf")]) == 0
    assert launcher_library(bin_dir / "flannel") is not None


def test_concurrent_installs_leave_one_consistent_install(tmp_path):
    python_or_skip("host")
    procs = [subprocess.Popen([sys.executable, "-m", "flannel.ctl", "install-cni", "--bin-dir",
                               str(tmp_path / "bin"), "--conf-dir", str(tmp_path / "conf")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    [name] = library_dirs(tmp_path / "bin")
    assert launcher_library(tmp_path / "bin" / "flannel") == name
    assert sorted(p.name for p in (tmp_path / "bin").iterdir()) == [LIBRARY_DIR, "flannel"]
