"""Checks of the lease set: store reachable, a config enabling IPv6 for a backend that declares
none, duplicates, subnets outside the Network, clock."""

from __future__ import annotations

from collections import defaultdict

from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.findings import Finding
from flannel.ops.leases import vtep_mac

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
    elif ctx.config.enable_ipv6 and ctx.footprint is not None \
            and not ctx.footprint.dual_stack:
        found.append(Finding("config", "error", f"the network config enables IPv6, which the "
                             f"{ctx.backend} backend does not carry: flanneld refuses to start",
                             "remove EnableIPv6 and IPv6Network, or choose a backend with IPv6 "
                             "support (vxlan, wireguard, host-gw)"))
    for row in ctx.rows or []:
        if row.lease is None:
            found.append(Finding("lease", "warning", f"lease {row.node or row.key}: "
                                 f"{row.problem}; every flanneld ignores it",
                                 flannelctl("leases", "release", row.key, "--yes")
                                 if not row.node else "fix or remove the Node's annotations"))
    return found


def check_duplicates(ctx: Context) -> list[Finding]:
    by_ip, by_mac = defaultdict(list), defaultdict(list)
    for lease in ctx.leases:
        if lease.attrs.public_ip is not None:
            by_ip[lease.attrs.public_ip].append(lease)
        mac = vtep_mac(lease)
        if mac:
            by_mac[mac].append(lease)
    found = []
    for ip, leases in sorted(by_ip.items()):
        if len(leases) > 1:
            subnets = ", ".join(str(lease.subnet) for lease in leases)
            found.append(Finding(
                "duplicates", "error", f"public IP {ip} holds several leases ({subnets}): "
                "peers send traffic for all of them to one node",
                "give each node its own --public-ip; release the stale lease with "
                "flannelctl leases release <subnet>"))
    for mac, leases in sorted(by_mac.items()):
        if len(leases) > 1:
            owners = ", ".join(f"{lease.subnet} ({lease.attrs.public_ip})" for lease in leases)
            found.append(Finding(
                "duplicates", "error", f"VTEP MAC {mac} is published by several leases "
                f"({owners}): their traffic collides",
                "cloned machines? delete flannel.1 on one of them and restart its flanneld "
                "so it gets a new MAC"))
    return found


def check_outside(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    if cfg is None:
        return []
    found = []
    for lease in ctx.leases:
        outside4 = lease.subnet is not None and cfg.network is not None and \
            not lease.subnet.subnet_of(cfg.network)
        outside6 = lease.ipv6_subnet is not None and cfg.ipv6_network is not None and \
            not lease.ipv6_subnet.subnet_of(cfg.ipv6_network)
        if outside4 or outside6:
            found.append(Finding(
                "outside", "warning", f"lease {lease.key} of {lease.attrs.public_ip} is "
                f"outside the Network {cfg.network}: left from an older config",
                f"{flannelctl('leases', 'release', lease.key)} once that node runs the new config"))
    return found


def check_clock(ctx: Context) -> list[Finding]:
    if ctx.clock_skew is None or abs(ctx.clock_skew) <= MAX_SKEW:
        return []
    side = "ahead of" if ctx.clock_skew > 0 else "behind"
    return [Finding("clock", "warning", f"this node's clock is {abs(ctx.clock_skew):.0f}s "
                    f"{side} the store's", "run NTP (chronyd or systemd-timesyncd) on every "
                    "node and the store")]


CHECKS = [("store", check_store), ("duplicates", check_duplicates),
          ("outside", check_outside), ("clock", check_clock)]
