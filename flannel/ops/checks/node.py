"""Checks of this node: flanneld running, subnet.env, sysctls, FORWARD policy, CNI files, who
may send encapsulation (the filter of peers, the drop of what pods send)."""

from __future__ import annotations

from pathlib import Path

from flannel.ops.checks import Context
from flannel.ops.commands import flannelctl
from flannel.ops.findings import Finding
from flannel.ops.kernelview import ToolError, read_sysctl, run_tool
from flannel.untrusted import boundedjson

CNI_PLUGINS = ("bridge", "host-local", "portmap", "flannel")


def check_flanneld(ctx: Context) -> list[Finding]:
    if ctx.flanneld_pids:
        return []
    return [Finding("flanneld", "error", "flanneld is not running in this network namespace",
                    "start it (systemctl start flanneld, or see why the kube-flannel pod "
                    "restarts: kubectl -n kube-flannel logs <pod> --previous)")]


def check_subnet_env(ctx: Context) -> list[Finding]:
    if ctx.env is None:
        return [Finding("subnet-env", "error", f"{ctx.subnet_file}: {ctx.env_error}",
                        "pods cannot start without it: flanneld writes it once it holds a "
                        "lease; fix the first finding above, or read flanneld's log for "
                        "why it has not got that far")]
    found = []
    own = ctx.own_subnet
    if own is None:
        found.append(Finding("subnet-env", "error",
                             f"{ctx.subnet_file} has no valid FLANNEL_SUBNET",
                             "restart flanneld so it rewrites the file"))
    network = ctx.env.get("FLANNEL_NETWORK", "")
    if ctx.config and ctx.config.network and network and network != str(ctx.config.network):
        found.append(Finding(
            "subnet-env", "error",
            f"{ctx.subnet_file} says FLANNEL_NETWORK={network} but the network config says "
            f"{ctx.config.network}", "restart flanneld so it rewrites subnet.env from the "
            "current config, then recreate the pods"))
    if own is not None and ctx.rows is not None and ctx.own_lease is None:
        found.append(Finding(
            "lease", "error", f"{ctx.subnet_file} says this node has {own}, but the store "
            "holds no lease for it (expired, released, or taken over)",
            "restart flanneld: it acquires a lease again and rewrites subnet.env"))
    if ctx.config and ctx.config.network and own is not None and \
            not own.subnet_of(ctx.config.network):
        found.append(Finding("subnet-env", "error",
                             f"this node's subnet {own} is outside the Network "
                             f"{ctx.config.network}", "restart flanneld"))
    return found


def _effective_rp_filter(ctx: Context, device: str) -> int | None:
    values = [read_sysctl(ctx.sysctl_root, f"net/ipv4/conf/{name}/rp_filter")
              for name in ("all", device)]
    numbers = [int(v) for v in values if v is not None and v.isdigit()]
    return max(numbers) if numbers else None


def check_sysctls(ctx: Context) -> list[Finding]:
    found = []
    forward = read_sysctl(ctx.sysctl_root, "net/ipv4/ip_forward")
    if forward != "1":
        found.append(Finding("sysctl", "error",
                             f"net.ipv4.ip_forward is {forward or 'unreadable'}: this node "
                             "does not route pod traffic",
                             "sysctl -w net.ipv4.ip_forward=1 and persist it in "
                             "/etc/sysctl.d/"))
    bridge_nf = read_sysctl(ctx.sysctl_root, "net/bridge/bridge-nf-call-iptables")
    if bridge_nf is None:
        found.append(Finding(
            "sysctl", "warning", "br_netfilter is not loaded "
            "(net.bridge.bridge-nf-call-iptables does not exist): iptables rules, such as "
            "kube-proxy's Services, do not see traffic between pods on the same bridge",
            "modprobe br_netfilter; echo br_netfilter > /etc/modules-load.d/br_netfilter.conf"))
    elif bridge_nf != "1":
        found.append(Finding("sysctl", "warning",
                             f"net.bridge.bridge-nf-call-iptables is {bridge_nf}",
                             "sysctl -w net.bridge.bridge-nf-call-iptables=1"))
    description = ctx.description
    devices = dict.fromkeys(device.name for device in description.node.devices
                            if ctx.kernel.link(device.name) is not None) \
        if description is not None else {}
    for device in devices:
        if _effective_rp_filter(ctx, device) == 1:
            found.append(Finding(
                "sysctl", "warning", f"strict reverse-path filtering (rp_filter=1) applies "
                f"to {device}: packets whose source is routed elsewhere are dropped",
                f"sysctl -w net.ipv4.conf.{device}.rp_filter=2 (and net.ipv4.conf.all."
                "rp_filter=2 if it is 1)"))
    return found


def _filter_tables() -> list[str]:
    """``iptables -S`` of the filter table from every iptables variant installed (flanneld
    may use legacy while ``iptables`` is nft, or the other way round)."""
    import shutil

    variants = [v for v in ("iptables-nft", "iptables-legacy") if shutil.which(v)]
    tables = []
    for variant in variants or ["iptables"]:
        try:
            tables.append(run_tool(variant, "-w", "5", "-t", "filter", "-S"))
        except ToolError:
            continue
    return tables


def check_forward(ctx: Context) -> list[Finding]:
    if ctx.config is None or ctx.config.network is None or ctx.config.enable_nftables:
        return []
    tables = _filter_tables()
    if not tables:
        return [Finding("forward", "info", "FORWARD policy not checked: iptables is not usable")]
    if not any("-P FORWARD DROP" in rules for rules in tables):
        return []
    network = str(ctx.config.network)
    accepts = [line for rules in tables for line in rules.splitlines()
               if line.endswith("-j ACCEPT") and network in line.split()]
    if accepts:
        return []
    return [Finding("forward", "error",
                    f"the FORWARD policy is DROP and no rule accepts the pod network {network}: "
                    "traffic between pods on different nodes is dropped",
                    "run flanneld with --iptables-forward-rules=true (the default), or add "
                    f"iptables -A FORWARD -s {network} -j ACCEPT and -d {network} -j ACCEPT")]


def _conflist_types(text: str) -> set[str]:
    try:
        doc = boundedjson.loads(text, what="conflist", max_bytes=boundedjson.MAX_CONFIG_BYTES)
    except boundedjson.JSONLimitError:
        return set()
    plugins = doc.get("plugins") if isinstance(doc, dict) else None
    if not isinstance(plugins, list):
        return set()
    return {p["type"] for p in plugins if isinstance(p, dict) and isinstance(p.get("type"), str)}


def _conflists(ctx: Context) -> list[tuple[Path, set[str]]]:
    """Every CNI network config in the conf dirs, in the runtime's order, with its plugin
    types."""
    conflists = []
    for directory in ctx.cni_conf_dirs:
        try:
            entries = sorted(directory.iterdir())[:1000]
        except OSError:
            continue
        for entry in entries:
            if entry.suffix in (".conflist", ".conf") and entry.is_file():
                try:
                    text = entry.read_bytes()[:1 << 20].decode(errors="replace")
                except OSError:
                    continue
                conflists.append((entry, _conflist_types(text)))
    return conflists


def check_cni(ctx: Context) -> list[Finding]:
    conflists = _conflists(ctx)
    uses_flannel = any("flannel" in types for _, types in conflists)
    conf_dirs = ", ".join(map(str, ctx.cni_conf_dirs)) or "no CNI config directory"
    if not uses_flannel and not ctx.kube_mode:
        # etcd mode: containers may get their network from subnet.env instead (Docker with
        # mk-docker-opts.sh), or the node runs none; only a CNI set up for flannel must work.
        return [Finding("cni", "info", f"no CNI network config in {conf_dirs} uses the "
                        "flannel plugin: containers on this node do not get their network "
                        "through CNI (as with Docker and mk-docker-opts.sh, which read "
                        "subnet.env)", "for CNI: install the containernetworking plugins and "
                        f"run {flannelctl('install-cni')}")]
    found = []
    missing = [plugin for plugin in CNI_PLUGINS
               if not any((directory / plugin).is_file() for directory in ctx.cni_bin_dirs)]
    dirs = ", ".join(map(str, ctx.cni_bin_dirs))
    standard = [plugin for plugin in missing if plugin != "flannel"]
    if standard:
        names = ", ".join(repr(plugin) for plugin in standard)
        found.append(Finding(
            "cni", "error", f"CNI plugin{'s' if len(standard) > 1 else ''} {names} missing from "
            f"{dirs}: pods fail with 'failed to find plugin \"{standard[0]}\"'",
            "install the containernetworking plugins (the containernetworking-plugins "
            "package, or the release tarball from github.com/containernetworking/plugins) "
            f"into {dirs}"))
    if "flannel" in missing:
        found.append(Finding("cni", "error", f"CNI plugin 'flannel' missing from {dirs}: pods "
                             "fail with 'failed to find plugin \"flannel\"'",
                             flannelctl("install-cni")))
    if not uses_flannel:
        found.append(Finding("cni", "error", f"no CNI network config in {conf_dirs} uses the "
                             "flannel plugin: in Kubernetes mode pods get their network "
                             "through it", flannelctl("install-cni")))
    elif "flannel" not in conflists[0][1]:
        found.append(Finding("cni", "warning", f"{conflists[0][0]} comes first and is not "
                             "flannel's: the runtime uses it instead",
                             "remove it or rename flannel's so it sorts first"))
    return found


def _encap_filter_installed() -> bool:
    """Whether flanneld's encapsulation filter is in this namespace (either rule mode)."""
    if any("-N FLANNEL-INPUT" in rules.splitlines() for rules in _filter_tables()):
        return True
    for family, table in (("ip", "flannel-ipv4"), ("ip6", "flannel-ipv6")):
        try:
            if "chain input {" in run_tool("nft", "list", "table", family, table):
                return True
        except ToolError:
            continue
    return False


def check_encap_filter(ctx: Context) -> list[Finding]:
    """Recommend ``--encap-peers-only`` where the backend takes encapsulated packets, which
    anyone could send, from anyone."""
    description = ctx.description
    if ctx.config is None or not ctx.flanneld_pids or description is None:
        return []
    backend = ctx.config.backend_type
    ports = description.node.injectable
    if not ports or _encap_filter_installed():
        return []
    port = ports[0]
    return [Finding(
        "encap-filter", "info",
        f"{backend} packets (UDP {port}) are accepted from any host: one that reaches this "
        "node's underlay address can put packets with any source address into the pods",
        "if every node sends from the public IP its lease publishes (no --public-ip or "
        "public-ip-overwrite annotation naming another address, no NAT between nodes), run "
        "flanneld with --encap-peers-only (FLANNELD_ENCAP_PEERS_ONLY=true); else filter "
        f"UDP {port} on the underlay (docs/operations.md, \"Who may send encapsulated "
        "traffic\")")]


def check_pod_encap(ctx: Context) -> list[Finding]:
    """Note that this node's pods may send encapsulation no receiver authenticates to other
    nodes (flanneld runs with ``--drop-pod-encap=false``, as its /status shows)."""
    description = ctx.description
    if description is None or not ctx.flanneld_pids or ctx.view.pod_encap_drop is not False:
        return []
    open_ = [c for c in description.node.carriers
             if not c.authenticated and (c.udp_ports or c.ip_protocols)]
    if not open_:
        return []
    what = " and ".join(f"{c.name} ({c.ports_text})" for c in open_)
    return [Finding(
        "pod-encap", "info",
        f"pods on this node may send {what} to other nodes, which take it for this node's "
        "(masqueraded, it leaves from a peer's address): a pod can put packets with any "
        "source into their pods, whatever --encap-peers-only filters there",
        "unless a pod here must send it, run flanneld with --drop-pod-encap=true (the "
        "default; FLANNELD_DROP_POD_ENCAP=true)")]


CHECKS = [("flanneld", check_flanneld), ("subnet-env", check_subnet_env),
          ("sysctl", check_sysctls), ("forward", check_forward), ("cni", check_cni),
          ("encap-filter", check_encap_filter), ("pod-encap", check_pod_encap)]
