"""The lab's extension backend: the ``deploy/examples/extension-vxlan`` scripts of the
source checkout, copied into the lab directory, and the example's network config pointed at
them.

Owns the copy (``<lab>/extension-vxlan/``, mode 0755) and the backend section naming it.
Must not touch: anything outside the lab directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flannel_lab.cluster import Lab, LabError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "extension-vxlan"
SCRIPTS = ("pre-startup", "post-startup", "subnet-add", "subnet-remove")


def scripts_dir(lab: Lab) -> Path:
    return lab.directory / "extension-vxlan"


#: Where the example's net-conf.json expects the scripts (the lab points at its copy).
INSTALLED = "/usr/local/lib/flannel/extension-vxlan/"


def backend_section(lab: Lab) -> dict[str, object]:
    """The ``Backend`` object of the example's ``net-conf.json``, its commands pointed at the
    lab's copy of the scripts (every other member as the example gives it)."""
    try:
        document = json.loads((EXAMPLE / "net-conf.json").read_text())
    except (OSError, ValueError) as err:
        raise LabError(f"the extension lab uses {EXAMPLE / 'net-conf.json'}, which cannot be "
                       f"read as JSON ({err}): run flannel-lab from a source checkout") from None
    where = f"{scripts_dir(lab)}/"
    return {key: value.replace(INSTALLED, where) if isinstance(value, str) else value
            for key, value in document["Backend"].items()}


def install_scripts(lab: Lab) -> None:
    """Copy the example's scripts into the (claimed) lab directory."""
    missing = [name for name in SCRIPTS if not (EXAMPLE / name).is_file()]
    if missing:
        raise LabError(f"the extension lab runs the scripts of {EXAMPLE}, which lacks "
                       f"{', '.join(missing)}: run flannel-lab from a source checkout")
    target = scripts_dir(lab)
    target.mkdir(mode=0o755, exist_ok=True)
    for name in SCRIPTS:
        shutil.copyfile(EXAMPLE / name, target / name)
        (target / name).chmod(0o755)
