"""Whether this kernel can make a kind of device a backend needs (ipip: ``flannel.ipip``),
asked before a lab builds anything, without changing the host.

Owns the answer for one link kind. A TUN device (``tun``) is made through ``/dev/net/tun``,
which must be there. For a kind made through rtnetlink: its module loaded (``/proc/modules``,
``/sys/module``) means yes; a module the kernel could load on request (``modules.dep`` of the
running kernel) means yes too, as flanneld's first device of that kind loads it (it is not
loaded here: a loaded ipip module adds its ``tunl0`` to every namespace, the host's
included); otherwise nothing can be loaded, so trying is harmless and is the only sure way:
a device of that kind is created in a throw-away network namespace, removed at once, and
"Unknown device type" means the kernel has no such driver, built in or not, and flanneld
would exit.
Must not touch: the root namespace; any namespace but the throw-away one it creates.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from flannel_lab.cluster import LabError

MAX_MODULES_DEP = 8 << 20


def _loaded(kind: str) -> bool:
    if Path("/sys/module", kind).is_dir():
        return True
    try:
        with open("/proc/modules", "rb") as handle:
            return any(line.split(b" ", 1)[0] == kind.encode() for line in handle)
    except OSError:
        return False


def _loadable(kind: str) -> bool:
    """A module file for ``kind`` that the running kernel could load on request."""
    if not Path("/proc/modules").exists():  # a kernel without loadable modules
        return False
    try:
        with open(f"/lib/modules/{os.uname().release}/modules.dep", "rb") as handle:
            listing = handle.read(MAX_MODULES_DEP).decode(errors="replace")
    except OSError:
        return False
    return re.search(rf"/{re.escape(kind)}\.ko(\.\w+)?:", listing) is not None


def missing_link_kind(kind: str, probe_netns: str) -> str:
    """"" when flanneld can create devices of link ``kind``; otherwise why not. The probe,
    when one is needed, runs in ``probe_netns``, created and removed here (LabError if
    that name is taken)."""

    if kind == "tun":
        return "" if Path("/dev/net/tun").exists() else \
            "this kernel offers no /dev/net/tun to make TUN devices with"
    if _loaded(kind) or _loadable(kind):
        return ""
    add = subprocess.run(["ip", "netns", "add", probe_netns], capture_output=True, text=True,
                         timeout=30, check=False)
    if add.returncode != 0:
        raise LabError(f"cannot probe the kernel for {kind} devices: ip netns add "
                          f"{probe_netns}: {add.stderr.strip()}")
    try:
        made = subprocess.run(["ip", "-n", probe_netns, "link", "add", "name", "probe",
                               "type", kind], capture_output=True, text=True, timeout=30,
                              check=False)
    finally:
        subprocess.run(["ip", "netns", "del", probe_netns], capture_output=True, timeout=30,
                       check=False)
    if made.returncode != 0 and "Unknown device type" in made.stderr:
        return (f"this kernel cannot make {kind} devices (no {kind} driver built in, none "
                "loaded, no module to load)")
    return ""
