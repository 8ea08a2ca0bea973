"""Debian hosts whose own ``/usr/bin/python3`` runs the CNI plugin: Debian 11 (Python 3.9,
the oldest the plugin supports) and Debian 13 (Python 3.13), as minbase root filesystems made
with debootstrap from Debian's mirror, so that a fresh CI machine tests both interpreters
without pyenv.

Owns which suites and packages; the caching is tests/support/debootstrap.py's (keyed by suite,
month and package list).
Must not touch: anything outside the cache directory and the temporary directories it makes.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import debootstrap

# suite -> the Python its python3 package brings (what the tests expect to see).
SUITES = {"bullseye": "3.9", "trixie": "3.13"}
# python3 brings libpython3.x-stdlib, which holds _json; the host's own CNI plugins (Debian's
# are linked against its glibc, so this machine's would not run on an older suite).
PACKAGES = ("python3", "containernetworking-plugins")


def tarball(suite: str) -> Path:
    """The cached rootfs of ``suite``, made with debootstrap on first use."""
    return debootstrap.cached_tarball("host", suite, PACKAGES)


def extract(suite: str, destination: Path) -> Path:
    return debootstrap.extract(tarball(suite), destination)
