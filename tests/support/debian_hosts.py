"""Debian hosts whose own ``/usr/bin/python3`` runs the CNI plugin: Debian 11 (Python 3.9,
the oldest the plugin supports) and Debian 13 (Python 3.13), as minbase root filesystems made
with debootstrap from Debian's mirror, so that a fresh CI machine tests both interpreters
without pyenv.

Owns the cached tarballs (``$PYFLANNEL_TEST_CACHE``, default /var/cache/pyflannel-test,
keyed by suite, month and package list, published by an atomic rename) and ``extract``.
Must not touch: anything outside the cache directory and the temporary directories it makes.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

MIRROR = "http://deb.debian.org/debian"
# suite -> the Python its python3 package brings (what the tests expect to see).
SUITES = {"bullseye": "3.9", "trixie": "3.13"}
# python3 brings libpython3.x-stdlib, which holds _json; the host's own CNI plugins (Debian's
# are linked against its glibc, so this machine's would not run on an older suite).
PACKAGES = ("python3", "containernetworking-plugins")
DEBOOTSTRAP_TIMEOUT = 900


def cache_dir() -> Path:
    path = Path(os.environ.get("PYFLANNEL_TEST_CACHE", "/var/cache/pyflannel-test"))
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def tarball(suite: str) -> Path:
    """The cached rootfs of ``suite``, made with debootstrap on first use."""
    month = datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
    digest = hashlib.sha256(" ".join((suite, MIRROR, *PACKAGES)).encode()).hexdigest()[:12]
    path = cache_dir() / f"host-{suite}-{month}-{digest}.tar"
    if path.exists():
        return path
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=f"debootstrap-{suite}-") as work:
        root = Path(work) / "root"
        made = subprocess.run(["debootstrap", "--variant=minbase",
                               f"--include={','.join(PACKAGES)}", suite, str(root), MIRROR],
                              capture_output=True, text=True, timeout=DEBOOTSTRAP_TIMEOUT,
                              check=False)
        if made.returncode != 0:
            raise RuntimeError(f"debootstrap {suite} failed: {made.stdout[-2000:]}"
                               f"{made.stderr[-2000:]}")
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
                       check=True, timeout=300)
        os.replace(partial, path)
    for stale in cache_dir().glob(f"host-{suite}-*.tar"):
        if stale != path:
            stale.unlink()
    return path


def extract(suite: str, destination: Path) -> Path:
    destination.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "--numeric-owner", "-C", str(destination), "-xf",
                    str(tarball(suite))], check=True, timeout=300)
    return destination
