"""Debian bookworm roots of other architectures, with Debian's python3, for qemu-user-static.

A root is the first stage of ``debootstrap --foreign --arch=<arch>`` (its second stage runs
the foreign maintainer scripts, which needs binfmt handlers: a machine-wide setting this
project never registers). What the second stage would install (python3 and its libraries,
listed in ``debootstrap/base``) is unpacked from the downloaded .debs, as ``dpkg -x`` does but
keeping the merged-/usr directory symlinks, and no maintainer script runs but the one that
matters to every start of the interpreter: python3.11's, which compiles the standard library's
bytecode (py3compile); here the root's own interpreter does it once under qemu-user-static, so
the tests do not compile it again under emulation at each start. What no test reads (apt's
lists and caches, documentation, translations) is left out. Cached by
tests/support/debootstrap.py (keyed by architecture, suite, month, packages and these steps).

``install_runtime`` copies pyflannel and the pure Python files of its runtime dependencies
from this interpreter into a root; ``run`` calls the root's interpreter under qemu-user-static
explicitly (``qemu-<arch>-static -L ROOT ROOT/usr/bin/python3.11 ...``).
Must not touch: binfmt_misc, anything outside the cache directory and the temporary
directories it makes.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tests.support import debootstrap, runtime_dists

SUITE = "bookworm"
PYTHON = "/usr/bin/python3.11"
PACKAGES = ("python3",)
# Where the runtime goes in a root: on the interpreter's path through PYTHONPATH.
SITE = "/opt/pyflannel/lib"


@dataclass(frozen=True)
class Arch:
    debian: str  # debootstrap's --arch
    qemu: str  # qemu-<name>-static
    machine: str  # platform.machine() inside
    byteorder: str


ARCHES = {arch.debian: arch for arch in (
    Arch("arm64", "aarch64", "aarch64", "little"),
    Arch("s390x", "s390x", "s390x", "big"),
)}


def _second_stage_unpacked(arch: Arch, root: Path) -> None:
    """Unpack what the second stage would install, then drop the .debs and debootstrap's
    own files and what no test reads, and compile the standard library's bytecode as
    python3.11's maintainer script would: the root is what a host would have, minus the other
    maintainer scripts' work."""
    debs = dict(line.split(" ", 1) for line in
                (root / "debootstrap" / "debpaths").read_text().splitlines() if " " in line)
    for package in (root / "debootstrap" / "base").read_text().split():
        deb = root / debs[package].lstrip("/")
        # dpkg -x would replace the /bin, /lib and /sbin symlinks by directories.
        tree = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                              check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "--keep-directory-symlink", "--numeric-owner", "-C",
                        str(root)], input=tree, check=True, timeout=120)
    for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        deb.unlink()
    shutil.rmtree(root / "debootstrap")
    debootstrap.empty(root, debootstrap.UNREAD)
    # The host's path to the root's library, so that compileall writes its __pycache__ there
    # (qemu's -L finds existing files in the root, but creates new ones on the host's path).
    stdlib = f"{root}/usr/lib/python3.11"
    compiled = run(arch, root, "-m", "compileall", "-q", "-d", "/usr/lib/python3.11", stdlib,
                   timeout=1200)
    if compiled.returncode != 0:
        raise RuntimeError(f"compiling {arch.debian}'s standard library failed: "
                           f"{compiled.stdout[-1500:]}{compiled.stderr[-1500:]}")


def tarball(arch: Arch) -> Path:
    return debootstrap.cached_tarball(
        f"foreign-{arch.debian}", SUITE, PACKAGES,
        ("second-stage-unpacked", *debootstrap.UNREAD, "stdlib-compiled"),
        partial(_second_stage_unpacked, arch), options=(f"--arch={arch.debian}", "--foreign"))


def extract(arch: Arch, destination: Path) -> Path:
    return debootstrap.extract(tarball(arch), destination)


def install_runtime(root: Path, source: Path = runtime_dists.ROOT) -> list[str]:
    """pyflannel's package from ``source`` and every runtime distribution's files but its
    compiled modules and bytecode, into ``SITE`` in the root. Returns what was left out."""
    site = root / SITE.lstrip("/")
    shutil.copytree(source / "flannel", site / "flannel",
                    ignore=shutil.ignore_patterns("__pycache__"))
    left_out = []
    for dist in runtime_dists.runtime():
        for path in dist.files:
            relative = path.relative_to(dist.site)
            # Scripts and data outside site-packages (../../bin) belong to the host's venv.
            if ".." in relative.parts or "__pycache__" in relative.parts:
                continue
            if path.name.endswith(runtime_dists.COMPILED):
                left_out.append(str(relative))
                continue
            target = site / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    return left_out


def run(arch: Arch, root: Path, *args: str, timeout: float = 300
        ) -> subprocess.CompletedProcess[str]:
    """The root's Python under qemu-user-static, called explicitly: ``-S`` so that no
    site-packages (the host's, where the root has none) joins the path."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": SITE, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([f"qemu-{arch.qemu}-static", "-L", str(root), f"{root}{PYTHON}",
                           "-S", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
