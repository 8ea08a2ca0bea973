"""Whether this kernel can create ipip devices, asked as ``flannel-lab up`` asks before it
builds an ipip lab (lab/flannel_lab/kernelprobe.py: the module loaded or loadable, else a device
tried in a throw-away network namespace). Tests and labs that need ipip skip with the reason
when it cannot."""

from __future__ import annotations

import functools
import os

from flannel_lab.kernelprobe import missing_link_kind
from tests.support import netns


@functools.cache
def missing_ipip() -> str:
    """"" when the kernel creates ipip devices; otherwise why not, as a skip reason."""
    if os.geteuid() != 0:
        return "needs root to create an ipip device in a network namespace"
    why = missing_link_kind("ipip", f"{netns.RUN_PREFIX}ipipprobe")
    return f"{why}; 'modprobe ipip' on the host enables these tests" if why else ""
