"""The commands the operator tools print for a user to paste: pyflannel's console scripts
by their full path, since the virtualenv's bin directory is seldom on PATH (and never under
``sudo`` or ``ip netns exec``).

Owns finding a console script next to the one running (``sys.argv[0]``, resolved) or in
the running interpreter's bin directory. Must not run anything.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def script(name: str) -> str:
    """The full path of pyflannel's console script ``name`` (``flannelctl``,
    ``flannel-lab``); the bare name only when it is installed nowhere we can see."""
    places = [Path(sys.argv[0]).resolve().parent] if sys.argv and sys.argv[0] else []
    places.append(Path(sys.executable).parent)
    for place in places:
        path = place / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return shutil.which(name) or name


def flannelctl(*args: str) -> str:
    """A ``flannelctl`` command line, quoted for a POSIX shell."""
    return shlex.join([script("flannelctl"), *args])
