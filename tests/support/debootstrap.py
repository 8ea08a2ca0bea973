"""Debian root filesystems made with debootstrap from Debian's mirror, cached outside the repo.

Owns the cache directory (``$PYFLANNEL_TEST_CACHE``, default /var/cache/pyflannel-test) and
the making of one cached tarball: a minbase debootstrap (from Debian's archive when the mirror
no longer serves the suite), the caller's shaping step, then a tar
published by an atomic rename (an interrupted run never leaves a half-made one) while older
tarballs of the same name are removed; and what of a root no test reads (``UNREAD``), which
the callers' shaping steps empty (``empty``). Callers (tests/deploy/rootfs.py,
tests/support/debian_hosts.py, tests/support/foreign_roots.py) own what goes in and the key
that names it.
Must not touch: anything outside the cache directory and the temporary directories it makes.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
# Where a suite goes once Debian stops serving it (Debian 11 when its LTS has ended).
ARCHIVE = "http://archive.debian.org/debian"
DEBOOTSTRAP_TIMEOUT = 900
# What no test of a root reads, a third of a minbase root with python3: the apt lists and
# caches debootstrap leaves, documentation and translations. Each test extracts its own root,
# so what the tarball holds is written to disk once per test.
UNREAD = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
          "var/cache/apt", "var/lib/apt/lists")


def cache_dir() -> Path:
    path = Path(os.environ.get("PYFLANNEL_TEST_CACHE", "/var/cache/pyflannel-test"))
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def key(suite: str, shape: Sequence[str]) -> str:
    """The suite, the month (so security updates arrive) and a digest of what shapes it."""
    month = datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
    digest = hashlib.sha256(" ".join((suite, MIRROR, *shape)).encode()).hexdigest()[:12]
    return f"{suite}-{month}-{digest}"


def cached_tarball(name: str, suite: str, packages: Sequence[str],
                   shape_key: Sequence[str] = (),
                   shape: Callable[[Path], None] | None = None,
                   options: Sequence[str] = ()) -> Path:
    """``<name>-<key>.tar`` in the cache, made on first use; ``shape_key`` names everything
    ``shape`` does to the tree, ``options`` are more debootstrap options (``--arch``,
    ``--foreign``). Older tarballs of the same name and suite go."""
    tarball = cache_dir() / f"{name}-{key(suite, (*options, *packages, *shape_key))}.tar"
    if tarball.exists():
        return tarball
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=f"debootstrap-{name}-") as work:
        root = Path(work) / "root"
        include = [f"--include={','.join(packages)}"] if packages else []
        failures = []
        for mirror in (MIRROR, ARCHIVE):
            made = subprocess.run(["debootstrap", "--variant=minbase", *options, *include, suite,
                                   str(root), mirror], capture_output=True, text=True,
                                  timeout=DEBOOTSTRAP_TIMEOUT, check=False)
            if made.returncode == 0:
                break
            failures.append(f"{mirror}: {made.stdout[-1500:]}{made.stderr[-1500:]}")
            shutil.rmtree(root, ignore_errors=True)
        else:
            raise RuntimeError(f"debootstrap {suite} failed from every mirror: "
                               + " | ".join(failures))
        if shape is not None:
            shape(root)
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
                       check=True, timeout=300)
        os.replace(partial, tarball)
    for stale in cache_dir().glob(f"{name}-{suite}-*.tar"):
        if stale != tarball:
            stale.unlink()
    return tarball


def empty(root: Path, trees: Sequence[str]) -> None:
    """Empty each of ``trees`` (relative to ``root``), keeping the directory itself."""
    for relative in trees:
        target = root / relative
        if target.is_dir():
            shutil.rmtree(target)
            target.mkdir(mode=0o755)


def extract(tarball: Path, destination: Path) -> Path:
    destination.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "--numeric-owner", "-C", str(destination), "-xf", str(tarball)],
                   check=True, timeout=300)
    return destination
