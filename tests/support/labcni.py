"""A lab node's CNI setup as doctor expects it: the plugins upstream's conflist uses, ours as
``flannel``, and that conflist, in directories of the test's own."""

from __future__ import annotations

import shutil
from pathlib import Path

from flannel.cni.install import CHECK_TIMEOUT, install_conflist, install_plugin
from flannel_lab import slowness


def install_cni(directory: Path) -> tuple[Path, Path]:
    """A node's CNI setup as doctor expects it, under ``directory``: the plugins upstream's
    conflist uses (ours as ``flannel``) and that conflist. (bin dir, conf dir)."""
    cni_bin = directory / "cni-bin"
    cni_bin.mkdir()
    for plugin in ("bridge", "host-local", "portmap"):
        shutil.copy2(f"/usr/lib/cni/{plugin}", cni_bin / plugin)
    install_plugin(cni_bin, check_timeout=slowness.scaled(CHECK_TIMEOUT))
    install_conflist(directory / "cni-conf")
    return cni_bin, directory / "cni-conf"
