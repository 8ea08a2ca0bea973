"""Puts this checkout first on the path of the launcher that imports it and of every Python
process that launcher starts in turn (PYTHONPATH): a daemon's udp worker, ``nsexec`` and a
lab's flanneld run this checkout's code too, whatever the virtualenv was installed from."""

import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[3]
SOURCES = [str(CHECKOUT), str(CHECKOUT / "lab")]

sys.path[:0] = SOURCES
os.environ["PYTHONPATH"] = os.pathsep.join(
    [*SOURCES, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
