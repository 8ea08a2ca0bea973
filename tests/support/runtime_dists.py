"""pyflannel's runtime distributions as installed in this interpreter, and their compiled parts.

Owns what "runtime" means here: pyflannel's ``Requires-Dist`` without extras, resolved
recursively through the installed distributions' metadata (markers evaluated for this
interpreter, a requirement's own extras followed), never the ``test`` or cloud extras. Also
owns where Debian's python3 packages live and the blocks of deploy/requirements.lock.
Must not touch: anything; it reads metadata and files only.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "requirements.lock"
# Compiled extension modules as CPython loads them (importlib.machinery.EXTENSION_SUFFIXES
# of every platform: a wheel for another one still counts).
COMPILED = (".so", ".pyd")
# Where Debian installs its python3-* packages (its interpreter's standard library is
# /usr/lib/python3.X, sysconfig's when Debian's python3 runs this).
DEBIAN_PYTHON = (Path("/usr/lib/python3/dist-packages"),)


@dataclass(frozen=True)
class Dist:
    name: str
    version: str
    # Who asked for it: "pyflannel" or the distribution that requires it.
    via: str
    # The directory its files are installed relative to (site-packages).
    site: Path
    files: tuple[Path, ...]


def _requirements(dist: metadata.Distribution, extras: frozenset[str]) -> Iterator[Requirement]:
    for text in dist.requires or ():
        req = Requirement(text)
        if req.marker is None:
            yield req
        elif any(req.marker.evaluate({"extra": extra}) for extra in (extras or {""})):
            yield req


def runtime(project: str = "pyflannel") -> list[Dist]:
    """Every distribution ``project`` needs to run, without its extras; a requirement that is
    not installed is a LookupError naming it (the runtime is then not what the lock says)."""
    top = metadata.distribution(project)
    found: dict[str, Dist] = {}
    pending: list[tuple[metadata.Distribution, frozenset[str]]] = [(top, frozenset())]
    while pending:
        dist, extras = pending.pop()
        for req in _requirements(dist, extras):
            name = canonicalize_name(req.name)
            if name in found:
                continue
            try:
                child = metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                raise LookupError(f"{req} (required by {dist.metadata['Name']}) is not "
                                  "installed: run ./install.sh") from None
            site = Path(str(child.locate_file("")))
            files = tuple(site / f for f in child.files or ())
            found[name] = Dist(child.metadata["Name"], child.version,
                               dist.metadata["Name"], site, files)
            pending.append((child, frozenset(req.extras)))
    return sorted(found.values(), key=lambda d: canonicalize_name(d.name))


def _inside(path: Path, tops: tuple[Path, ...]) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(top) for top in tops)


def standard_library() -> tuple[Path, ...]:
    """The base interpreter's standard library (a venv's own lib/ is no part of it)."""
    base = {"base": sys.base_prefix, "installed_base": sys.base_prefix,
            "platbase": sys.base_exec_prefix, "installed_platbase": sys.base_exec_prefix}
    return tuple(Path(sysconfig.get_path(key, vars=base)).resolve()
                 for key in ("stdlib", "platstdlib"))


def compiled_modules(dist: Dist) -> list[Path]:
    """The compiled extension modules a runtime distribution installed outside the standard
    library and Debian's python3 packages. Site-packages inside the standard library's
    directory (a non-Debian interpreter's) is not the standard library."""
    stdlib = standard_library()
    return [path for path in dist.files
            if path.name.endswith(COMPILED)
            and not _inside(path, DEBIAN_PYTHON)
            and not (_inside(path, stdlib) and not {"site-packages", "dist-packages"}
                     & set(path.parts))]


_BLOCK_START = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", re.MULTILINE)


def lock_blocks(lock: Path = LOCK) -> dict[str, str]:
    """Each pinned requirement of the lock with its hash lines, by canonical name, so that one
    can be handed to pip on its own (pip then checks its hashes as for the whole lock)."""
    text = lock.read_text()
    starts = [m.start() for m in _BLOCK_START.finditer(text)]
    blocks = {}
    for start, end in zip(starts, [*starts[1:], len(text)], strict=True):
        block = text[start:end]
        name = _BLOCK_START.match(block)
        assert name is not None
        blocks[canonicalize_name(name.group(1))] = block
    return blocks
