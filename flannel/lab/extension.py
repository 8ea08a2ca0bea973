"""The lab's extension backend: the ``deploy/examples/extension-vxlan`` scripts of the
source checkout, copied into the lab directory, and the network config that points at them.

Owns the copy (``<lab>/extension-vxlan/``, mode 0755) and the backend section naming it.
Must not touch: anything outside the lab directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from flannel.lab.cluster import Lab, LabError

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "extension-vxlan"
SCRIPTS = ("pre-startup", "post-startup", "subnet-add", "subnet-remove")


def scripts_dir(lab: Lab) -> Path:
    return lab.directory / "extension-vxlan"


def backend_section(lab: Lab, underlay_device: str = "eth0") -> dict[str, str]:
    """The ``Backend`` object of the lab's extension config."""
    where = scripts_dir(lab)
    return {"Type": "extension",
            "PreStartupCommand": f"{where}/pre-startup {underlay_device}",
            "PostStartupCommand": f"{where}/post-startup",
            "SubnetAddCommand": f"{where}/subnet-add",
            "SubnetRemoveCommand": f"{where}/subnet-remove"}


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
