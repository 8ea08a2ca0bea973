"""Installs pyflannel's CNI plugin (as ``flannel``) and the CNI network config list.

Owns what goes into the CNI bin directory for the Python plugin:
- ``.flannel-cni/<version>-<content hash>/flannel/...``: the plugin's modules (standard library
  only), one directory per content, written completely under a temporary name, then renamed;
- ``flannel``: a small launcher naming one such directory, replaced by rename. At run time it
  finds the directory beside its own real location (so the bin dir may be mounted or copied
  anywhere), runs the plugin with the host's Python under ``-I -S`` (no site, no environment:
  a pod ADD pays for the plugin only and never depends on where pyflannel is installed), and
  answers CNI error JSON itself when the Python is too old or the library is missing or broken.
A ``flannel`` that is not such a launcher (upstream's static plugin) is never replaced
unless asked to (``force``). Before anything is written the interpreter is probed (version,
``json``, ``_socket``); the new launcher must answer a VERSION call under a temporary name
before it replaces the old one.
A library directory is removed once neither the launcher nor its predecessor names it, so a
call in flight during an upgrade finishes with the files it started with. Installs into one
bin dir take turns (a lock on the directory).
Also the atomic conflist write, like upstream's install step.
Must not touch: files other than those it installs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import flannel
from flannel.files.fileutil import write_atomic
from flannel.untrusted import boundedjson
from flannel.version import __version__

DEFAULT_CONFLIST = {
    "name": "cbr0",
    "cniVersion": "0.3.1",
    "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
CONFLIST_NAME = "10-flannel.conflist"
LAUNCHER_NAME = "flannel"
LIBRARY_DIR = ".flannel-cni"
PLUGIN_MODULES = ("__init__.py", "version.py", "cni/__init__.py", "cni/plugin.py",
                  "cni/lite.py")
MIN_PYTHON = (3, 9)
# json: _json's C scanner or, without it, json's own (flannel/cni/lite.py).
REQUIRED_MODULES = ("json", "_socket")
DIR_MODE, FILE_MODE, LAUNCHER_MODE = 0o755, 0o644, 0o755
CHECK_TIMEOUT = 10.0
LOCK_TIMEOUT = 30.0
# Linux before 5.1 reads only 128 bytes of a "#!" line; keep "#!PATH -IS" within them.
MAX_PYTHON_PATH = 120
# What kubelet typically passes; the probe must not depend on the installer's environment.
RUN_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
_LIBRARY_LINE = "LIBRARY = "
LAUNCHER_MARK = "# flannel CNI plugin launcher, written by pyflannel's flannelctl install-cni."
_FIX = ("the flannel CNI plugin runs with this interpreter on the host: pass --python with a "
        f"CPython >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]} that has {' and '.join(REQUIRED_MODULES)}, "
        "or use upstream's static flannel plugin and --plugin none")

_PROBE = f"""import sys
missing = []
for name in {REQUIRED_MODULES!r}:
    try:
        __import__(name)
    except ImportError:
        missing.append(name)
sys.stdout.write("%d.%d.%d " % tuple(sys.version_info[:3]) + ",".join(missing) + "\\n")
"""

# Plain syntax on purpose: a Python too old for the plugin still gets as far as saying so.
# Error JSON is written by hand (no json import; the plugin's own may be what is missing).
_LAUNCHER = r'''#!@PYTHON@ -IS
@MARK@
# It runs the plugin library named below from .flannel-cni/ beside this file's real
# location, and answers CNI error JSON itself when that cannot work.
import sys

LIBRARY = "@LIBRARY@"


def fail(msg):
    out = []
    for char in msg:
        code = ord(char)
        if 32 <= code < 127 and char not in "\"\\":
            out.append(char)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
        else:
            out.append("\\u%04x" % code)
    sys.stdout.write('{"cniVersion":"1.1.0","code":999,"msg":"%s"}\n' % "".join(out))
    sys.stdout.flush()
    sys.exit(1)


PYTHON = "%s (Python %s)" % (sys.executable, sys.version.split()[0])
if sys.version_info < (3, 9):
    fail("the flannel CNI plugin needs Python 3.9 or later, %s is too old: install a newer "
         "Python and re-run flannelctl install-cni --python PATH" % PYTHON)
library = LIBRARY
try:
    from os.path import dirname, isfile, join, realpath

    library = join(dirname(realpath(__file__)), ".flannel-cni", LIBRARY)
    if not isfile(join(library, "flannel", "cni", "plugin.py")):
        fail("flannel CNI plugin library missing at %s; re-run flannelctl install-cni"
             % library)
    sys.path.insert(0, library)
    from flannel.cni.plugin import main
except Exception as err:  # the CNI boundary: the runtime reads error JSON, not a traceback
    fail("flannel CNI plugin library at %s failed to load with %s: %s: %s; re-run "
         "flannelctl install-cni" % (library, PYTHON, type(err).__name__, err))
try:
    status = main()
except Exception as err:  # the CNI boundary, as above
    fail("flannel CNI plugin failed with %s: %s: %s" % (PYTHON, type(err).__name__, err))
sys.exit(status)
'''


class InstallError(Exception):
    """The installation cannot proceed; the message names the file or option to fix."""


def _gist(output: bytes) -> str:
    """The telling line of a program's complaint: a traceback's last, a usage error's first."""
    lines = output.decode(errors="replace").strip().splitlines()
    if not lines:
        return ""
    return (lines[-1] if lines[0].startswith("Traceback") else lines[0])[:200]


def probe_python(python: str, timeout: float = CHECK_TIMEOUT) -> str:
    """The interpreter's version ("3.11.2") once it is fit to run the plugin (it answers
    within ``timeout`` seconds); else InstallError naming the interpreter, its version and
    what is missing."""
    if not python.startswith("/") or len(python.encode()) > MAX_PYTHON_PATH \
            or any(char.isspace() or not char.isprintable() for char in python):
        raise InstallError(f"--python {python!r}: give an absolute path without spaces, at most "
                           f"{MAX_PYTHON_PATH} bytes (it becomes the launcher's #! line)")
    try:
        proc = subprocess.run([python, "-I", "-S", "-c", _PROBE], stdin=subprocess.DEVNULL,
                              capture_output=True, env=RUN_ENV, timeout=timeout,
                              check=False)
    except FileNotFoundError:
        raise InstallError(f"--python {python}: no such file; {_FIX}") from None
    except PermissionError:
        raise InstallError(f"--python {python}: not executable; {_FIX}") from None
    except OSError as err:
        raise InstallError(f"--python {python}: cannot run it: {err.strerror}; {_FIX}") from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"--python {python}: no answer within {timeout:.0f} s to "
                           "a version check; " + _FIX) from None
    version, _, missing = proc.stdout.decode(errors="replace").strip().partition(" ")
    numbers = version.split(".")
    if proc.returncode != 0 or len(numbers) != 3 or not all(n.isdigit() for n in numbers):
        said = _gist(proc.stderr or proc.stdout)
        raise InstallError(f"--python {python}: failed to report its version as "
                           f"'{python} -I -S' (exit status {proc.returncode}"
                           f"{': ' + said if said else ''}); {_FIX}")
    if tuple(int(n) for n in numbers) < MIN_PYTHON:
        raise InstallError(f"--python {python} is Python {version}, too old: {_FIX}")
    if missing:
        names = missing.replace(",", " and ")
        raise InstallError(f"--python {python} (Python {version}) lacks {names}: {_FIX} "
                           f"(Debian, Ubuntu: install libpython{'.'.join(numbers[:2])}-stdlib)")
    return version


def launcher_library(path: Path) -> str | None:
    """The library directory name the launcher at ``path`` runs; None when ``path`` is not
    a launcher written by install_plugin (absent, or another plugin such as upstream's)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096).decode(errors="replace")
    except OSError:
        return None
    if LAUNCHER_MARK not in head:
        return None
    for line in head.splitlines():
        if line.startswith(_LIBRARY_LINE):
            return line[len(_LIBRARY_LINE):].strip('"')
    return None


def launcher_text(python: str, library: str) -> str:
    return (_LAUNCHER.replace("@PYTHON@", python).replace("@MARK@", LAUNCHER_MARK)
            .replace("@LIBRARY@", library))


def _plugin_files() -> dict[str, bytes]:
    source = Path(flannel.__file__).resolve().parent
    return {module: (source / module).read_bytes() for module in PLUGIN_MODULES}


def library_name(files: dict[str, bytes]) -> str:
    """``<version>-<content hash>``: a new name for any change, the same for the same files."""
    digest = hashlib.sha256()
    for module in sorted(files):
        data = files[module]
        digest.update(module.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return f"{__version__}-{digest.hexdigest()[:12]}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mkdir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE)
    os.chmod(path, DIR_MODE)  # mkdir's mode is subject to the umask


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(fd, mode)
        handle.write(data)
        handle.flush()
        os.fsync(fd)


def _library_intact(directory: Path, files: dict[str, bytes]) -> bool:
    if directory.is_symlink() or not directory.is_dir():
        return False
    try:
        return all((directory / "flannel" / module).read_bytes() == data
                   for module, data in files.items())
    except OSError:
        return False


def _place_library(root: Path, name: str, files: dict[str, bytes]) -> bool:
    """Make ``root/name`` hold exactly ``files``; True when it had to be written."""
    target = root / name
    if _library_intact(target, files):
        return False
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    try:
        written = {staging}
        for module, data in sorted(files.items()):
            path = staging / "flannel" / module
            for directory in reversed(path.parents):
                if directory not in written and staging in directory.parents:
                    _mkdir(directory)
                    written.add(directory)
            _write_new(path, data, FILE_MODE)
        for directory in written:
            _fsync_dir(directory)
        os.chmod(staging, DIR_MODE)
        if target.is_symlink() or target.is_file():
            os.unlink(target)
        elif target.exists():
            # Damaged: move it aside (onto an empty directory); pruning removes it.
            os.rename(target, tempfile.mkdtemp(prefix=".damaged.", dir=root))
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(root)
    return True


def _check_launcher(launcher: Path, python: str, version: str, timeout: float) -> None:
    """Run ``launcher`` as a runtime would for VERSION; InstallError unless it answers."""
    try:
        proc = subprocess.run([str(launcher)], input=b'{"cniVersion":"1.0.0"}',
                              capture_output=True, env={**RUN_ENV, "CNI_COMMAND": "VERSION"},
                              timeout=timeout, check=False)
    except OSError as err:
        raise InstallError(f"{launcher.parent}: cannot run the plugin from it: {err.strerror} "
                           "(is it mounted noexec?)") from None
    except subprocess.TimeoutExpired:
        raise InstallError(f"--python {python} (Python {version}): the plugin did not answer "
                           f"a VERSION call within {timeout:.0f} s") from None
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        answer = None
    if proc.returncode == 0 and isinstance(answer, dict) and "supportedVersions" in answer:
        return
    if isinstance(answer, dict) and isinstance(answer.get("msg"), str):
        said = answer["msg"]
    else:
        said = _gist(proc.stderr or proc.stdout) or f"exit status {proc.returncode}, no output"
    raise InstallError(f"--python {python} (Python {version}): the plugin failed a VERSION "
                       f"call: {said[:300]}")


@contextlib.contextmanager
def _locked(bin_dir: Path) -> Iterator[None]:
    """One install at a time per bin dir (a bounded wait on a lock of the directory itself,
    so that no lock file is left behind)."""
    fd = os.open(bin_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InstallError(f"{bin_dir}: another install-cni has held its lock for "
                                       f"{LOCK_TIMEOUT:.0f} s; retry when it is done") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def _prune(root: Path, keep: set[str]) -> None:
    """Remove what no launcher names; a failure leaves it for the next install."""
    for entry in os.scandir(root):
        if entry.name in keep:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _mkdir_parents(path: Path) -> None:
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        # Another install-cni (a DaemonSet pod restarting beside its predecessor) may create
        # it first; what it made is checked below like any existing directory.
        with contextlib.suppress(FileExistsError):
            _mkdir(directory)


def install_plugin(bin_dir: Path, python: str = sys.executable, *, force: bool = False,
                   check_timeout: float = CHECK_TIMEOUT) -> Path:
    """Install the Python plugin as ``bin_dir/flannel``, run by ``python`` on the host
    (``check_timeout``: how long ``python`` and the installed plugin may take to answer the
    checks; the lab gives its slowness factor's patience).

    Refuses (InstallError) an interpreter that cannot run the plugin, and, unless ``force``,
    a ``flannel`` that is not a launcher of ours (upstream's static plugin), leaving the bin
    dir as it was.
    """
    version = probe_python(python, check_timeout)
    files = _plugin_files()
    name = library_name(files)
    _mkdir_parents(bin_dir)
    if not bin_dir.is_dir():
        raise InstallError(f"--bin-dir {bin_dir}: not a directory")
    root = bin_dir / LIBRARY_DIR
    target = bin_dir / LAUNCHER_NAME
    with _locked(bin_dir):
        previous = launcher_library(target)
        if previous is None and not force and os.path.lexists(target):
            raise InstallError(
                f"{target} is not pyflannel's plugin launcher (upstream's static flannel "
                "plugin?): it is left as it is; give --plugin none to install the conflist "
                "only, or --force to replace it with the Python plugin")
        with contextlib.suppress(FileExistsError):
            _mkdir(root)
        if root.is_symlink() or not root.is_dir():
            raise InstallError(f"{root} is not a directory: remove it and re-run install-cni")
        written = False
        fd, tmp_name = tempfile.mkstemp(prefix=f".{LAUNCHER_NAME}.", suffix=".tmp", dir=bin_dir)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(launcher_text(python, name).encode())
                handle.flush()
                os.fchmod(fd, LAUNCHER_MODE)
                os.fsync(fd)
            written = _place_library(root, name, files)
            _check_launcher(Path(tmp_name), python, version, check_timeout)
            os.replace(tmp_name, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            if written and name != previous:
                shutil.rmtree(root / name, ignore_errors=True)
            with contextlib.suppress(OSError):
                root.rmdir()  # only when empty: nothing was installed here before
            raise
        _fsync_dir(bin_dir)
        _prune(root, {name, previous} if previous else {name})
    return target


def install_conflist(conf_dir: Path, source: Path | None = None) -> Path:
    if source is None:
        document = DEFAULT_CONFLIST
    else:
        try:
            document = boundedjson.loads(source.read_bytes(), what=f"--conflist {source}",
                                         max_bytes=boundedjson.MAX_CONFIG_BYTES)
        except OSError as err:
            raise InstallError(f"--conflist {source}: {err}") from None
        except boundedjson.JSONLimitError as err:
            raise InstallError(str(err)) from None
        if not isinstance(document, dict) or not isinstance(document.get("plugins"), list):
            raise InstallError(f"--conflist {source}: not a CNI network config list (it needs "
                               "a \"plugins\" array)")
    target = conf_dir / CONFLIST_NAME
    write_atomic(target, (json.dumps(document, indent=2) + "\n").encode(), mode=0o644)
    return target
