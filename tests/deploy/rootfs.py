"""A minimal Debian bookworm root filesystem, made with debootstrap and cached outside the repo.

Owns the stand-in for the Python base image (no registry is reachable here) and for a plain
host: a minbase bookworm with python3 and python3-venv, trimmed like Debian's slim images.
The tarball is cached under ``$PYFLANNEL_TEST_CACHE`` (default /var/cache/pyflannel-test),
keyed by the month (so security updates arrive) and the package list, and published with an
atomic rename so an interrupted run never leaves a half-made base behind.
Must not touch: anything outside the cache directory and the temporary directories it makes.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Like Debian's slim images: documentation and translations are not needed to run anything.
TRIMMED = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
           "var/cache/apt", "var/lib/apt/lists")
DEBOOTSTRAP_TIMEOUT = 900


def cache_dir() -> Path:
    path = Path(os.environ.get("PYFLANNEL_TEST_CACHE", "/var/cache/pyflannel-test"))
    path.mkdir(parents=True, exist_ok=True, mode=0o755)
    return path


def base_key() -> str:
    month = datetime.datetime.now(datetime.UTC).strftime("%Y-%m")
    digest = hashlib.sha256(" ".join((SUITE, MIRROR, *PACKAGES, *TRIMMED)).encode())
    return f"{SUITE}-{month}-{digest.hexdigest()[:12]}"


def ensure_base_tarball() -> Path:
    """The cached rootfs tarball, made with debootstrap on first use."""
    tarball = cache_dir() / f"rootfs-{base_key()}.tar"
    if tarball.exists():
        return tarball
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="debootstrap-") as work:
        root = Path(work) / "root"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}",
                        SUITE, str(root), MIRROR],
                       check=True, capture_output=True, timeout=DEBOOTSTRAP_TIMEOUT)
        for relative in TRIMMED:
            target = root / relative
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir(mode=0o755)
        partial = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."],
                       check=True, timeout=300)
        os.replace(partial, tarball)
    for stale in cache_dir().glob("rootfs-*.tar"):
        if stale != tarball:
            stale.unlink()
    return tarball


def extract(tarball: Path, destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "--numeric-owner", "-C", str(destination), "-xf", str(tarball)],
                   check=True, timeout=300)
