"""Every runtime dependency is pure Python or Debian's own python3 package, so pyflannel runs
on every architecture Go flannel ships.

The runtime set is pyflannel's ``Requires-Dist`` without extras, resolved recursively through
the installed metadata (tests/support/runtime_dists.py): what deploy/requirements.lock
installs in the image besides the ``ipsec`` extra's vici, never the ``test`` extra. Two checks:

- the installed files of each runtime distribution hold no compiled extension module
  (``.so``, ``.pyd``) outside the standard library and Debian's python3 packages;
- each pinned requirement of the lock resolves to a wheel for s390x, ppc64le, armv7l and
  aarch64 on CPython 3.11 and Debian bookworm's glibc, as the image build would ask pip
  (``--only-binary :all:``, hashes checked). This one downloads from the package index
  (``$PYFLANNEL_TEST_INDEX``, default PyPI): it is marked ``pypi`` and skipped when the index
  does not answer within ten seconds; ``-m "not pypi"`` leaves it out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from packaging.utils import canonicalize_name

from tests.support import runtime_dists

INDEX = os.environ.get("PYFLANNEL_TEST_INDEX", "https://pypi.org/simple")
# Debian bookworm's glibc (the image's base): manylinux wheels up to 2.36 run there.
GLIBC_MINOR = 36
# Go flannel's image architectures but amd64, by their wheel tag names (Debian's armhf is
# armv7l, arm64 is aarch64, ppc64el is ppc64le).
ARCHES = ("aarch64", "armv7l", "ppc64le", "s390x")


def test_runtime_is_what_the_lock_pins():
    """The walk below covers the distributions the image installs, no more."""
    dists = runtime_dists.runtime()
    assert dists, "pyflannel declares no runtime dependency: is it installed (./install.sh)?"
    unpinned = {canonicalize_name(d.name) for d in dists} - set(runtime_dists.lock_blocks())
    assert not unpinned, f"runtime dependencies missing from deploy/requirements.lock: {unpinned}"


def test_no_runtime_dependency_ships_compiled_code():
    compiled = {f"{d.name} {d.version} (via {d.via})": runtime_dists.compiled_modules(d)
                for d in runtime_dists.runtime()}
    found = {name: [str(p) for p in paths] for name, paths in compiled.items() if paths}
    assert not found, (
        "runtime dependencies with compiled extension modules (no wheel for every "
        f"architecture, or a different build on each): {found}")


def platform_tags(arch: str) -> list[str]:
    """What pip must be told to accept every wheel that installs on bookworm for ``arch``:
    pip does not widen ``--platform`` itself."""
    return [*(f"manylinux_2_{minor}_{arch}" for minor in range(GLIBC_MINOR, 16, -1)),
            f"manylinux2014_{arch}", f"linux_{arch}"]


@pytest.fixture(scope="module")
def index() -> str:
    if not INDEX.startswith(("https://", "http://")):
        pytest.fail(f"PYFLANNEL_TEST_INDEX={INDEX!r}: give the index's http(s) URL")
    try:
        # The scheme is checked above.
        with urllib.request.urlopen(f"{INDEX.rstrip('/')}/pip/", timeout=10):  # noqa: S310
            pass
    except (urllib.error.URLError, OSError) as err:
        pytest.skip(f"the package index {INDEX} does not answer ({err}); "
                    "set PYFLANNEL_TEST_INDEX to a reachable one")
    return INDEX


@pytest.mark.pypi
@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ARCHES)
def test_lock_resolves_to_wheels_for(arch, index, tmp_path):
    # Only the index named: this machine's pip configuration (extra indexes, local wheel
    # directories) must not stand in for it. PIP_CERT still applies (a TLS-inspecting proxy).
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    platforms = [arg for tag in platform_tags(arch) for arg in ("--platform", tag)]

    def download(name: str, blocks: list[str]) -> subprocess.CompletedProcess[str]:
        requirement = tmp_path / f"{name}.txt"
        requirement.write_text("".join(blocks))
        return subprocess.run(
            [sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
             "--index-url", index, "--only-binary", ":all:", *platforms,
             "--python-version", "3.11", "--implementation", "cp", "--no-deps",
             "-r", str(requirement), "-d", str(tmp_path / "wheels")],
            env=env, capture_output=True, text=True, timeout=300, check=False)

    blocks = sorted(runtime_dists.lock_blocks().items())
    missing = {}
    # One pip for the whole lock; only when it fails, one a requirement, to name each missing.
    if download("lock", [block for _, block in blocks]).returncode != 0:
        for name, block in blocks:
            result = download(name, [block])
            if result.returncode != 0:
                missing[name] = result.stderr.strip().splitlines()[-1:]
    assert not missing, f"no {arch} wheel for: {missing}"
    assert len(list((tmp_path / "wheels").glob("*.whl"))) == len(runtime_dists.lock_blocks())
