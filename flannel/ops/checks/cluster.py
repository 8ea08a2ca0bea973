"""Checks of the lease set: store reachable, a config enabling IPv6 for a backend that declares
none, public IPs several leases share, clock. (Leases flanneld skips, outside the Network
among them, and those claiming an identity another lease holds are the ``skipped`` check's:
``kernel.py``.)"""

from __future__ import annotations

from collections import defaultdict

from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.findings import Finding

#: Clock skew beyond which lease expiry times are misleading.
MAX_SKEW = 5.0


def check_store(ctx: Context) -> list[Finding]:
    found = []
    if ctx.rows is None:
        found.append(Finding("store", "error", f"cannot read the leases: {ctx.store_error}",
                             "check --etcd-endpoints (and TLS/auth flags) or the kube API "
                             "flags, and that this node reaches the store"))
    elif ctx.config is None:
        found.append(Finding("config", "error", f"no usable network config: {ctx.store_error}",
                             "write the config (etcdctl put <prefix>/config '{\"Network\": "
                             "...}') or fix net-conf.json"))
    elif ctx.config.enable_ipv6 and ctx.backend_class is not None \
            and not ctx.backend_class.footprint.dual_stack:
        from flannel.backend import footprints

        carry = ", ".join(name for name, footprint in footprints().items()
                          if footprint.dual_stack and footprint.has_data_path)
        found.append(Finding("config", "error", f"the network config enables IPv6, which the "
                             f"{ctx.backend} backend does not carry: flanneld refuses to start",
                             "remove EnableIPv6 and IPv6Network, or choose a backend with IPv6 "
                             f"support ({carry})"))
    elif ctx.description is None and ctx.description_error:
        found.append(Finding("config", "error", f"the network config's Backend is unusable: "
                             f"{ctx.description_error}: flanneld refuses to start",
                             "fix the Backend options in the network config"))
    for row in ctx.rows or []:
        if row.lease is None:
            found.append(Finding("lease", "warning", f"lease {row.node or row.key}: "
                                 f"{row.problem}; every flanneld ignores it",
                                 flannelctl("leases", "release", row.key, "--yes")
                                 if not row.node else "fix or remove the Node's annotations"))
    return found


def check_duplicates(ctx: Context) -> list[Finding]:
    """Public IPs several leases share. (An identity several leases claim is refused by
    flanneld's admission, and said by the ``skipped`` check with flanneld's words.)"""
    by_ip = defaultdict(list)
    for lease in ctx.leases:
        if lease.attrs.public_ip is not None:
            by_ip[lease.attrs.public_ip].append(lease)
    found = []
    for ip, leases in sorted(by_ip.items()):
        if len(leases) > 1:
            subnets = ", ".join(str(lease.subnet) for lease in leases)
            found.append(Finding(
                "duplicates", "error", f"public IP {ip} holds several leases ({subnets}): "
                "peers send traffic for all of them to one node",
                "give each node its own --public-ip; release the stale lease with "
                "flannelctl leases release <subnet>"))
    return found


def check_clock(ctx: Context) -> list[Finding]:
    if ctx.clock_skew is None or abs(ctx.clock_skew) <= MAX_SKEW:
        return []
    side = "ahead of" if ctx.clock_skew > 0 else "behind"
    return [Finding("clock", "warning", f"this node's clock is {abs(ctx.clock_skew):.0f}s "
                    f"{side} the store's", "run NTP (chronyd or systemd-timesyncd) on every "
                    "node and the store")]


CHECKS = [("store", check_store), ("duplicates", check_duplicates), ("clock", check_clock)]
