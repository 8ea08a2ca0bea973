"""What flanneld says when the kernel refuses it for want of privilege.

Owns the one message for a netlink request refused with EPERM (flanneld runs without root or
CAP_NET_ADMIN) and finding such a refusal behind the error a device helper raised instead.
Nothing retried fixes it: the daemon ends with this message at the first one, at start-up or
in a data plane pass.
Must not touch: anything; it only reads exceptions.
"""

from __future__ import annotations

import errno

from flannel.kernel.rtnl import NetlinkError

#: How many causes deep a refusal is looked for.
_DEPTH = 8


class PrivilegeError(Exception):
    """The kernel refused a request because flanneld lacks the privilege to make it."""


def needs_privilege(request: str) -> str:
    return (f"flanneld needs root or CAP_NET_ADMIN (and CAP_NET_RAW for the iptables rules): "
            f"the kernel refused to {request} (Operation not permitted); run it as root, or "
            "grant both capabilities (systemd: AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW; "
            "Kubernetes: the container's securityContext.capabilities.add)")


def privilege_refusal(err: BaseException) -> PrivilegeError | None:
    """A PrivilegeError naming the request when ``err``, or the error it was raised from or
    while handling, is a netlink request refused with EPERM; None otherwise."""
    seen: BaseException | None = err
    for _ in range(_DEPTH):
        if seen is None:
            return None
        if isinstance(seen, PrivilegeError):
            return seen
        if isinstance(seen, NetlinkError) and seen.errno == errno.EPERM:
            return PrivilegeError(needs_privilege(seen.request))
        seen = seen.__cause__ or seen.__context__
    return None
