"""Minimal Debian bookworm root filesystems, made with debootstrap and cached outside the repo.

Owns two stand-ins, since no registry is reachable here:
- ``SLIM``: the image's base, ``debian:bookworm-slim``. A minbase bookworm made the way
  Debian's official images are (debuerreotype): the slim excludes removed and kept out of
  later installs by ``/etc/dpkg/dpkg.cfg.d/docker``, the minimizing apt/dpkg configuration,
  the release, updates and security suites, no apt lists, caches or bootstrap logs.
- ``HOST``: a plain host for the install-host test: a minbase bookworm with python3 and
  python3-venv, trimmed of documentation.
Each tarball is cached by tests/support/debootstrap.py, keyed by the variant, the month (so
security updates arrive) and everything that shapes it.
Must not touch: anything outside the cache directory and the temporary directories it makes.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path

from tests.support.debootstrap import (
    MIRROR,
    UNREAD,
    cache_dir,
    cached_tarball,
    empty,
    extract,
    key,
)

SUITE = "bookworm"

# debuerreotype's slim variant: these trees go, but for the kept files below, and dpkg is told
# to leave them out of every later install too.
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/groff/*", "/usr/share/info/*",
                 "/usr/share/linda/*", "/usr/share/lintian/overrides/*", "/usr/share/locale/*",
                 "/usr/share/man/*")
SLIM_INCLUDES = ("/usr/share/doc/*/copyright", "/usr/share/doc/kde/HTML/C/*",
                 "/usr/share/gnome/help/*/C/*", "/usr/share/locale/all_languages",
                 "/usr/share/locale/currency/*", "/usr/share/locale/l10n/*",
                 "/usr/share/locale/languages", "/usr/share/locale/locale.alias",
                 "/usr/share/omf/*/*-C.emf")
# debuerreotype's minimizing configuration, present in every official Debian image.
APT_CLEAN = ('"rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
             '/var/cache/apt/*.bin || true";')
MINIMIZING_CONFIG = {
    "usr/sbin/policy-rc.d": ("#!/bin/sh\nexit 101\n", 0o755),
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": ("force-unsafe-io\n", 0o644),
    "etc/apt/apt.conf.d/docker-autoremove-suggests": (
        'Apt::AutoRemove::SuggestsImportant "false";\n', 0o644),
    "etc/apt/apt.conf.d/docker-clean": (
        f"DPkg::Post-Invoke {{ {APT_CLEAN} }};\nAPT::Update::Post-Invoke {{ {APT_CLEAN} }};\n"
        'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\n', 0o644),
    "etc/apt/apt.conf.d/docker-gzip-indexes": ('Acquire::GzipIndexes "true";\n', 0o644),
    "etc/apt/apt.conf.d/docker-no-languages": ('Acquire::Languages "none";\n', 0o644),
    "etc/apt/sources.list.d/debian.sources": (
        f"Types: deb\nURIs: {MIRROR}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://deb.debian.org/debian-security\n"
        f"Suites: {SUITE}-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n", 0o644),
}
# What the official images never ship: apt lists and caches, logs of the bootstrap.
SLIM_REMOVED = ("etc/apt/sources.list", "var/log/dpkg.log", "var/log/bootstrap.log",
                "var/log/alternatives.log", "var/log/apt/history.log", "var/log/apt/term.log",
                "var/cache/ldconfig/aux-cache")
SLIM_EMPTIED = ("var/cache/apt", "var/lib/apt/lists")


@dataclass(frozen=True)
class Variant:
    name: str
    packages: tuple[str, ...]
    slim: bool
    # Only for the plain host: trees emptied outright.
    trimmed: tuple[str, ...] = ()


SLIM = Variant("slim", (), slim=True)
HOST = Variant("host", ("python3", "python3-venv", "ca-certificates"), slim=False,
               trimmed=UNREAD)


def _shape_key(variant: Variant) -> list[str]:
    shape = list(variant.trimmed)
    if variant.slim:
        shape += [*SLIM_EXCLUDES, *SLIM_INCLUDES, *SLIM_REMOVED, *SLIM_EMPTIED,
                  *(f"{path}={text}" for path, (text, _) in sorted(MINIMIZING_CONFIG.items()))]
    return shape


def base_key(variant: Variant = SLIM) -> str:
    return f"{variant.name}-{key(SUITE, (*variant.packages, *_shape_key(variant)))}"


def _matches(path: str, patterns: tuple[str, ...]) -> bool:
    # dpkg's path-exclude globs: "*" crosses "/", as fnmatch's does.
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)


def _slimify(root: Path) -> None:
    """What debuerreotype-slimify does: drop the excluded trees but for the included files,
    then empty directories and dangling symlinks; record both lists for dpkg."""
    lines = ['# This is the "slim" variant of the Debian base image.',
             "# Many files which are normally unnecessary in containers are excluded,",
             "# and this configuration file keeps them that way."]
    for exclude in SLIM_EXCLUDES:
        lines.append(f"path-exclude {exclude}")
        top = root / exclude.strip("/").removesuffix("/*")
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in filenames + dirnames:
                path = Path(dirpath) / name
                inside = "/" + str(path.relative_to(root))
                if path.is_symlink() or not path.is_dir():
                    if not _matches(inside, SLIM_INCLUDES):
                        path.unlink()
        _prune_empty(top)
    lines += [f"path-include {include}" for include in SLIM_INCLUDES]
    _write(root / "etc/dpkg/dpkg.cfg.d/docker", "\n".join(lines) + "\n", 0o644)


def _prune_empty(top: Path) -> None:
    """Remove dangling symlinks and empty directories under ``top`` until none is left."""
    removed = True
    while removed:
        removed = False
        for dirpath, dirnames, filenames in os.walk(top, topdown=False):
            for name in filenames + dirnames:
                path = Path(dirpath) / name
                if path.is_symlink() and not path.exists():
                    path.unlink()
                    removed = True
                elif path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
                    path.rmdir()
                    removed = True


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _shape(root: Path, variant: Variant) -> None:
    empty(root, variant.trimmed)
    if not variant.slim:
        return
    _slimify(root)
    for relative, (text, mode) in MINIMIZING_CONFIG.items():
        _write(root / relative, text, mode)
    for relative in SLIM_REMOVED:
        (root / relative).unlink(missing_ok=True)
    empty(root, SLIM_EMPTIED)
    # apt recreates these on its first run; the official image ships them empty.
    (root / "var/lib/apt/lists/partial").mkdir(mode=0o700)
    (root / "var/cache/apt/archives/partial").mkdir(parents=True, mode=0o700)


def ensure_base_tarball(variant: Variant = SLIM) -> Path:
    """The cached rootfs tarball of ``variant``, made with debootstrap on first use."""
    return cached_tarball(f"rootfs-{variant.name}", SUITE, variant.packages,
                          _shape_key(variant), lambda root: _shape(root, variant))


__all__ = ["HOST", "SLIM", "base_key", "cache_dir", "ensure_base_tarball", "extract"]
