"""Debian hosts whose own ``/usr/bin/python3`` runs the CNI plugin: Debian 11 (Python 3.9,
the oldest the plugin supports) and Debian 13 (Python 3.13), as minbase root filesystems made
with debootstrap from Debian's mirror, so that a fresh CI machine tests both interpreters
without pyenv.

Owns which suites and packages, and what of them a root keeps: nothing the tests never read
(apt's lists and caches, documentation, translations) and, of Debian's CNI plugins, only those
the flannel plugin calls (bridge, and host-local for its addresses), so that each test writes
a third of the root debootstrap made. The caching is tests/support/debootstrap.py's (keyed by
suite, month, package list and this trimming).
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
PLUGINS_DIR = "usr/lib/cni"
PLUGINS_KEPT = ("bridge", "host-local")


def _trim(root: Path) -> None:
    debootstrap.empty(root, debootstrap.UNREAD)
    for plugin in (root / PLUGINS_DIR).iterdir():
        if plugin.name not in PLUGINS_KEPT:
            plugin.unlink()


def tarball(suite: str) -> Path:
    """The cached rootfs of ``suite``, made with debootstrap on first use."""
    return debootstrap.cached_tarball(
        "host", suite, PACKAGES, (*debootstrap.UNREAD, f"{PLUGINS_DIR}={','.join(PLUGINS_KEPT)}"),
        _trim)


def extract(suite: str, destination: Path) -> Path:
    return debootstrap.extract(tarball(suite), destination)
