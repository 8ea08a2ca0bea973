"""Builds and runs images with Debian's buildah (chroot isolation), storage in the test cache.

Owns the buildah storage under the test cache directory (see rootfs.py) and the local
stand-in for the image's base (debian:bookworm-slim), committed from the cached slim rootfs.
Layers stay cached there between runs so a rerun rebuilds only what changed; deleting the
cache directory at any time is safe.
Must not touch: the host's own container storage, images or containers it did not make.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.deploy.rootfs import base_key, cache_dir, ensure_base_tarball

BASE_NAME = "localhost/pyflannel-test-base"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def environment() -> dict[str, str]:
    """The environment for buildah: chroot isolation, storage under the test cache."""
    storage = cache_dir() / "buildah"
    storage.mkdir(exist_ok=True, mode=0o700)
    conf = storage / "storage.conf"
    text = ("[storage]\n"
            'driver = "overlay"\n'
            f'graphroot = "{storage / "storage"}"\n'
            f'runroot = "{storage / "run"}"\n')
    if not conf.exists() or conf.read_text() != text:
        partial = storage / "storage.conf.partial"
        partial.write_text(text)
        os.replace(partial, conf)
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf), "BUILDAH_ISOLATION": "chroot"}


def buildah(*args: str, timeout: float = 120) -> str:
    result = subprocess.run(["buildah", *args], env=environment(), capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def image_exists(name: str) -> bool:
    result = subprocess.run(["buildah", "inspect", "--type", "image", name], env=environment(),
                            capture_output=True, timeout=60)
    return result.returncode == 0


def ensure_base_image() -> str:
    """The local debian:bookworm-slim stand-in (rootfs.SLIM), made once."""
    name = f"{BASE_NAME}:{base_key()}"
    if not image_exists(name):
        tarball = ensure_base_tarball()
        container = buildah("from", "scratch").strip()
        try:
            buildah("add", "--quiet", container, str(tarball), "/", timeout=600)
            buildah("config", "--env", f"PATH={PATH}", "--cmd", "bash", container)
            buildah("commit", "--quiet", container, name, timeout=600)
        finally:
            buildah("rm", container)
        for stale in json.loads(buildah("images", "--json")):
            for stale_name in stale.get("names") or []:
                if stale_name.startswith(f"{BASE_NAME}:") and stale_name != name:
                    buildah("rmi", stale_name)
    return name


def inspect(name: str) -> dict:
    return json.loads(buildah("inspect", "--type", "image", name))


def layer_sizes(name: str, scratch: Path) -> list[tuple[str, int]]:
    """Uncompressed size of each layer of the image (written out as a plain tar file), with
    the instruction that made it, base layers first."""
    scratch.mkdir(parents=True, exist_ok=True)
    target = scratch / "image-dir"
    buildah("push", "--quiet", "--disable-compression", name, f"dir:{target}", timeout=600)
    manifest = json.loads((target / "manifest.json").read_text())
    config = json.loads((target / manifest["config"]["digest"].split(":", 1)[1]).read_text())
    steps = [h.get("created_by", "") for h in config.get("history", [])
             if not h.get("empty_layer")]
    sizes = [(target / layer["digest"].split(":", 1)[1]).stat().st_size
             for layer in manifest["layers"]]
    # A base committed without history has fewer steps than layers: those come first.
    steps = [""] * (len(sizes) - len(steps)) + steps[-len(sizes):]
    return list(zip(steps, sizes, strict=True))


@contextmanager
def container(image: str) -> Iterator[str]:
    """A working container of ``image``, removed afterwards."""
    name = buildah("from", "--pull-never", image).strip()
    try:
        yield name
    finally:
        buildah("rm", name)


def run_args(container_name: str, *command: str, volumes: tuple[tuple[Path, str], ...] = (),
             env: dict[str, str] | None = None, netns: str | None = None,
             cap_add: tuple[str, ...] = ()) -> list[str]:
    """The command line running ``command`` in the container (no shell), with host
    directories bind-mounted, ``env`` set, capabilities added to buildah's default set, and
    in network namespace ``netns`` if given (chroot isolation has no network namespace of
    its own)."""
    args = [*(["ip", "netns", "exec", netns] if netns else []), "buildah", "run"]
    for host, inside in volumes:
        args += ["--volume", f"{host}:{inside}"]
    for capability in cap_add:
        args += ["--cap-add", capability]
    for name, value in (env or {}).items():
        args += ["--env", f"{name}={value}"]
    return [*args, container_name, "--", *command]


def run(container_name: str, *command: str, volumes: tuple[tuple[Path, str], ...] = (),
        env: dict[str, str] | None = None, netns: str | None = None,
        cap_add: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``command`` in the container to its end (see run_args)."""
    return subprocess.run(run_args(container_name, *command, volumes=volumes, env=env,
                                   netns=netns, cap_add=cap_add),
                          env=environment(), capture_output=True, text=True, timeout=timeout)


def start(container_name: str, *command: str, log: Path,
          volumes: tuple[tuple[Path, str], ...] = (), env: dict[str, str] | None = None,
          netns: str | None = None, cap_add: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start ``command`` in the container (see run_args), its output going to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(run_args(container_name, *command, volumes=volumes, env=env,
                                         netns=netns, cap_add=cap_add),
                                env=environment(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
