"""Whether this kernel can create ipip devices, asked the only reliable way: by creating one
in a throwaway network namespace (removed at once). Tests and labs that need ipip skip with
the reason when it cannot."""

from __future__ import annotations

import errno
import functools
import os
from ipaddress import IPv4Address

from flannel.kernel import links
from flannel.kernel.host import Host
from flannel.kernel.rtnl import NetlinkError, Rtnl
from tests.support import netns


@functools.cache
def missing_ipip() -> str:
    """"" when the kernel creates ipip devices; otherwise why not, as a skip reason."""
    if os.geteuid() != 0:
        return "needs root to create an ipip device in a network namespace"
    probe = netns.create("ipipprobe")
    try:
        with Rtnl(Host(probe)) as sock:
            links.add_link(sock, links.NewLink("probe.ipip", "ipip",
                                               links.IptunInfo(IPv4Address("192.0.2.1"))))
    except NetlinkError as err:
        if err.errno != errno.EOPNOTSUPP:
            raise
        return (f"this kernel cannot create ipip devices ({os.strerror(err.errno)}: no ipip "
                "module built in or loaded; 'modprobe ipip' on the host enables these tests)")
    finally:
        netns.delete(probe)
    return ""
