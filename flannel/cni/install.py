"""Installs the CNI plugin executable (as ``flannel``) and the CNI network config list.

Owns what goes into the CNI bin directory: a copy of the plugin's modules (standard library
only) under ``.flannel-cni/`` and the ``flannel`` launcher that runs them with the given
Python without site processing (a pod ADD pays for the plugin only, and the plugin does not
depend on where pyflannel itself is installed, e.g. inside a container image). Also the
atomic conflist write, like upstream's install step.
Must not touch: files other than those it installs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import flannel
from flannel.fileutil import write_atomic

DEFAULT_CONFLIST = {
    "name": "cbr0",
    "cniVersion": "0.3.1",
    "plugins": [
        {"type": "flannel", "delegate": {"hairpinMode": True, "isDefaultGateway": True}},
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
CONFLIST_NAME = "10-flannel.conflist"


class InstallError(Exception):
    """The installation cannot proceed; the message names the file or option to fix."""


PLUGIN_MODULES = ("__init__.py", "version.py", "cni/__init__.py", "cni/plugin.py",
                  "cni/lite.py")


def launcher_text(python: str, library: Path) -> str:
    return (f"#!{python} -IS\n"
            "import sys\n"
            f"sys.path.insert(0, {str(library)!r})\n"
            "from flannel.cni.plugin import main\n"
            "sys.exit(main())\n")


def install_plugin(bin_dir: Path, python: str = sys.executable) -> Path:
    """Copy the plugin modules and write the ``flannel`` launcher (Python >= 3.11)."""
    library = bin_dir.resolve() / ".flannel-cni"
    source = Path(flannel.__file__).resolve().parent
    for module in PLUGIN_MODULES:
        write_atomic(library / "flannel" / module, (source / module).read_bytes(), mode=0o644)
    target = bin_dir / "flannel"
    write_atomic(target, launcher_text(python, library).encode(), mode=0o755)
    return target


def install_conflist(conf_dir: Path, source: Path | None = None) -> Path:
    if source is None:
        document = DEFAULT_CONFLIST
    else:
        try:
            document = json.loads(source.read_text())
        except (OSError, ValueError) as err:
            raise InstallError(f"--conflist {source}: {err}") from None
        if not isinstance(document, dict) or not isinstance(document.get("plugins"), list):
            raise InstallError(f"--conflist {source}: not a CNI network config list (it needs "
                               "a \"plugins\" array)")
    target = conf_dir / CONFLIST_NAME
    write_atomic(target, (json.dumps(document, indent=2) + "\n").encode(), mode=0o644)
    return target
