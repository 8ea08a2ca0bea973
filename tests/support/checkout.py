"""The commands tests start, as this checkout's code: ``python tests/support/launchers/<name>``
under the running interpreter, never the virtualenv's console scripts (its ``flanneld`` runs
whichever checkout the virtualenv was installed from, not necessarily this one).

Each constant is an argv prefix: ``[*FLANNELCTL, "status"]``. What the tools print for a
user to paste still names the console scripts (``flannel.ops.commands.script``).
tests/test_checkout_commands.py fails when a test starts a console script by its path.
"""

from __future__ import annotations

import sys
from pathlib import Path

LAUNCHERS = Path(__file__).resolve().parent / "launchers"


def command(name: str) -> list[str]:
    """The argv that runs pyflannel's command ``name`` from this checkout."""
    launcher = LAUNCHERS / name
    if not launcher.is_file():
        raise ValueError(f"no launcher for {name!r} in {LAUNCHERS}")
    return [sys.executable, str(launcher)]


FLANNELD = command("flanneld")
FLANNELCTL = command("flannelctl")
FLANNEL_LAB = command("flannel-lab")
MK_DOCKER_OPTS = command("mk-docker-opts")
INSTALL_CONF = command("install-conf")
