"""``flannel-lab``: build, inspect and tear down throw-away flannel clusters on one machine.

Owns the command line of the lab and what it prints. Every lab lives in namespaces named
after it, so several labs and the test suite coexist. ``up`` never builds over a lab that
exists; ``down`` removes what the lab recorded creating and says when there is no such lab.
The network config (``--config``) is read with flanneld's own decoder, so it means what it
means to flanneld (case-insensitive member names); with the ``alloc`` backend, which
reserves subnets but programs no data path, the lab stops at the leases.
Must not touch: the root namespace's links, routes or firewall.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from flannel.config import ConfigError, NetworkConfig, check_network_config, parse_config
from flannel.files.fileutil import write_atomic
from flannel.flags import UsageError, parse_namespace
from flannel.process import stopping
from flannel.untrusted.boundedjson import MAX_CONFIG_BYTES
from flannel_lab import extension, slowness, tour
from flannel_lab.cluster import (
    DEFAULT_ROOT,
    FlanneldExited,
    Lab,
    LabError,
    LabExists,
    in_ns,
    ip,
)
from flannel_lab.mesh import ring, start_nodes, wait_full_mesh, wg_show

MAX_NODES = 200  # node addresses are <underlay>.(10 + index)
MAX_PODS_PER_NODE = 100
MAX_KEPT_LOG = 4 << 20  # bytes of a failed node's log kept when its lab is removed
ALL_PAIRS_UP_TO = 10  # up pings every pair up to this many nodes, a ring above
PING_WITHIN = 3.0  # seconds a pair of the ping matrix may take to answer one echo


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def read_config_option(given: str) -> str:
    """``--config``'s JSON text: the text itself when it starts with ``{``, else the
    contents of the file it names (``@`` before the path is allowed, as curl takes it)."""
    if given.lstrip().startswith("{"):
        return given
    path = given.removeprefix("@")
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}",
                          "give the JSON text, or a path to a readable file holding it") \
            from None
    return data.decode(errors="replace")


def network_config(args: argparse.Namespace, lab: Lab) -> str:
    """The config JSON to put in etcd: ``--config``'s, or built from the options."""
    if args.config:
        return read_config_option(args.config)
    backend: dict[str, Any] = {"Type": args.backend}
    if args.backend == "extension":
        backend = extension.backend_section(lab)
    if args.backend == "ipsec":
        backend["PSK"] = secrets.token_hex(48)  # 96 characters, Go's minimum
    if args.direct_routing:
        backend["DirectRouting"] = True
    config: dict[str, Any] = {"Network": "10.244.0.0/16", "Backend": backend}
    if args.ipv6:
        config.update(EnableIPv6=True, IPv6Network="fd00:10:244::/56")
    return json.dumps(config)


#: flanneld flags the lab sets itself: where the store and subnet.env are, the interface.
LAB_FLAGS = ("etcd-endpoints", "subnet-file", "iface", "iface-regex", "iface-can-reach")


def flanneld_args(args: argparse.Namespace) -> list[str]:
    """The extra flanneld flags of ``--flanneld-arg`` and ``--flanneld-args`` (split as a
    shell would, never run by one), checked as flanneld checks them; UsageError says what
    is wrong."""
    extra = list(args.flanneld_arg or [])
    for text in args.flanneld_args or []:
        try:
            extra += shlex.split(text)
        except ValueError as err:
            raise UsageError(f"--flanneld-args {text!r}: {err}") from None
    try:
        parsed = parse_namespace(extra, {})
    except UsageError as err:
        raise UsageError(f"--flanneld-arg: {err}") from None
    taken = [f"--{name}" for name in LAB_FLAGS if parsed.sources.get(name) == "flag"]
    if taken or parsed.version is True:
        raise UsageError(f"--flanneld-arg: {', '.join(taken) or '--version'} cannot be "
                         "given: the lab sets it for every node")
    return extra


def decode_config(config: dict[str, Any] | str) -> tuple[str, NetworkConfig]:
    """The JSON text and what flanneld will make of it (ConfigError as flanneld says it)."""
    text = config if isinstance(config, str) else json.dumps(config)
    decoded = parse_config(text)
    check_network_config(decoded)
    return text, decoded


def check_backend(decoded: NetworkConfig, probe_netns: str) -> str:
    """What flanneld would exit with at start for this config on this machine, "" when it
    would not: the backend's options (decoded by its own parser, warnings for unknown keys
    included), a family the backend does not carry (its declared footprint), a device its
    footprint declares that this kernel cannot make (asked in ``probe_netns``, created and
    removed here: ``flannel_lab.kernelprobe``). Imported here: the backends cost 'down',
    'ping' and 'status' nothing."""
    from flannel.backend import BackendError, backend_class, supported
    from flannel_lab.kernelprobe import missing_link_kind

    try:
        backend = backend_class(decoded.backend_type)
        backend.check_options(decoded)
    except BackendError as err:
        return str(err)
    if (decoded.enable_ipv6 or not decoded.enable_ipv4) and not backend.footprint.dual_stack:
        carriers = ", ".join(name for name in supported()
                             if backend_class(name).footprint.dual_stack
                             and backend_class(name).footprint.has_data_path)
        return (f"the {decoded.backend_type} backend carries IPv4 only, and this network "
                f"{'enables IPv6' if decoded.enable_ipv6 else 'disables IPv4'}: flanneld "
                "refuses to start; drop --ipv6 (EnableIPv6), or choose a backend that carries "
                f"IPv6 ({carriers})")
    for link in backend.footprint.links:
        why = missing_link_kind(link.kind, probe_netns)
        if why and link.userspace:  # served by a userspace program instead (wireguard-go)
            why = missing_link_kind(link.userspace, probe_netns)
        if why:
            return (f"the {decoded.backend_type} backend makes {link.kind} devices, and "
                    f"{why}: flanneld would exit at start; load the {link.kind} module on "
                    f"the host ('modprobe {link.kind}'), or choose another backend")
    return ""


def has_data_path(lab: Lab) -> bool:
    """Whether the lab's backend connects nodes (alloc only reserves subnets)."""
    return lab.state.backend != "alloc"


def wait_for_mesh(lab: Lab, nodes: list[int], ipv6: bool, timeout: float = 30.0) -> float:
    """Seconds until every node pings every other node's pod address; LabError after
    ``timeout`` (scaled by the lab's slowness factor)."""
    start = time.monotonic()
    pending = {(a, b) for a in nodes for b in nodes if a != b}
    while pending:
        pending = {(a, b) for a, b in pending
                   if not (lab.ping(a, b) and (not ipv6 or lab.ping(a, b, v6=True)))}
        if pending and time.monotonic() - start > slowness.scaled(timeout):
            raise LabError(f"no connectivity after {slowness.within(timeout)} between "
                           f"{sorted(pending)}")
    return time.monotonic() - start


def build(lab: Lab, nodes: int, config: dict[str, Any] | str, *, second_underlay_from: int = 0,
          flanneld_args: tuple[str, ...] = ()) -> list[int]:
    text = config if isinstance(config, str) else json.dumps(config)
    try:
        _, decoded = decode_config(text)
    except ConfigError:  # put as given: flanneld says what is wrong (tests rely on that)
        decoded = NetworkConfig()
    lab.create_underlay(2 if second_underlay_from else 1, ipv6=decoded.enable_ipv6)
    if decoded.backend_type == "extension":
        extension.install_scripts(lab)
    lab.state.backend = decoded.backend_type
    lab.state.save()
    indexes = list(range(1, nodes + 1))
    for index in indexes:
        lab.add_node(index, 1 if second_underlay_from and index >= second_underlay_from else 0)
    # The cloud backends' labs start their cloud doubles, which say where the config points.
    start_cloud: dict[str, Callable[[str], dict[str, str]]] = {
        "aws-vpc": lambda network: {"RouteTableID": lab.start_aws_cloud(network)},
        "ali-vpc": lab.start_ali_cloud,
        "gce": lambda network: {"Endpoint": lab.start_gce_cloud(network)}}
    if decoded.backend_type in start_cloud:
        document = json.loads(text)
        backend = next(v for k, v in document.items() if k.lower() == "backend")
        given = {k.lower() for k in backend}
        backend.update({k: v for k, v in start_cloud[decoded.backend_type](
            str(decoded.network)).items() if k.lower() not in given})
        text = json.dumps(document)
    lab.put_config(text)
    start_nodes(lab, indexes, *flanneld_args, timeout=60.0 + 3 * nodes)
    for index in indexes:
        lab.attach_pod_bridge(index)
    return indexes


def check_mesh(lab: Lab, indexes: list[int], ipv6: bool) -> str:
    """Wait for the full mesh in every node's kernel, then ping: every pair in a small lab,
    a ring (each node to the next) in a big one. What ``up`` reports. udp peers live in
    the forwarder, the extension's routes are not flanneld's (protocol 151), aws-vpc's,
    ali-vpc's and gce's are in the VPC router and ipsec's in charon: there, the pings are the
    mesh."""
    if lab.state.backend in ("udp", "extension", "aws-vpc", "ali-vpc", "gce", "ipsec"):
        say("waiting for every node to reach every other")
        took = wait_for_mesh(lab, indexes, ipv6, timeout=60.0 + 3 * len(indexes))
        return f"every pair connected {took:.2f}s after every node had its subnet"
    say(f"waiting until every node has routes to its {len(indexes) - 1} peers")
    took = wait_full_mesh(lab, indexes, timeout=60.0 + 3 * len(indexes),
                          since=lab.first_flanneld_start)
    if len(indexes) <= ALL_PAIRS_UP_TO:
        say("waiting for every node to reach every other")
        wait_for_mesh(lab, indexes, ipv6)
        return (f"full mesh {took:.2f}s after the first flanneld started, every pair "
                "connected")
    say(f"full mesh {took:.2f}s after the first flanneld started; pinging a ring of "
        f"{len(indexes)} pairs")
    failed = [(a, b) for a, b in ring(indexes)
              if not (lab.ping(a, b) and (not ipv6 or lab.ping(a, b, v6=True)))]
    if failed:
        raise LabError(f"full mesh in the kernel, but no ping between {failed}")
    return (f"full mesh {took:.2f}s after the first flanneld started, ring of "
            f"{len(indexes)} pings ok")


def remove(lab: Lab) -> str:
    """Remove what the lab built so far, Ctrl-C and SIGTERM ignored meanwhile (the removal
    is bounded); what came of it, in words."""
    with stopping.ignored():
        try:
            lab.down()
        except (LabError, OSError) as err:
            return str(err)
    return f"lab {lab.name} removed: nothing it built is left"


def keep_log(lab: Lab, exited: FlanneldExited) -> str:
    """Copy the log of a node whose flanneld exited out of the lab (removed next) to the
    lab root; its path, or the reason it could not be kept."""
    kept = lab.directory.parent / f"{lab.name}-n{exited.index}-flanneld.log"
    try:
        with open(exited.log_file, "rb") as log:
            write_atomic(kept, log.read(MAX_KEPT_LOG), mode=0o644)
    except OSError as err:
        return f"its log could not be kept: {err.strerror or err}"
    return f"full log: {kept}"


def cmd_up(args: argparse.Namespace) -> int:
    lab = Lab(args.name, args.root, progress=say)
    if args.second_underlay > args.nodes:
        print(f"flannel-lab: --second-underlay={args.second_underlay}: no node would sit on "
              f"the second underlay; give 1 to --nodes ({args.nodes}), or 0 for one underlay",
              file=sys.stderr)
        return 2
    try:
        text = network_config(args, lab)
        _, decoded = decode_config(text)
        refused = check_backend(decoded, f"{lab.name}-probe")
    except ConfigError as err:
        refused = err.describe()
    if refused:
        print(f"flannel-lab: {'--config: ' if args.config else ''}{refused}", file=sys.stderr)
        return 2
    try:
        extra = flanneld_args(args)
    except UsageError as err:
        print(f"flannel-lab: {err}", file=sys.stderr)
        return 2
    if lab.exists:
        print(f"flannel-lab: {lab.exists_error()}", file=sys.stderr)
        return 1
    try:
        indexes = build(lab, args.nodes, text, second_underlay_from=args.second_underlay,
                        flanneld_args=("--ip-masq", *extra))
        if has_data_path(lab):
            done = check_mesh(lab, indexes, decoded.enable_ipv6)
        else:
            done = "leases only: the alloc backend programs no data path"
        for index in indexes:
            for _ in range(args.pods_per_node):
                pod = lab.add_pod(index)
                say(f"pod {pod.name} on node {index}: {pod.address} {pod.address6}".rstrip())
        say(f"lab {lab.name} is up: {len(indexes)} nodes, {done}; "
            f"'{lab.command('status')}' shows it, '{lab.command('down')}' removes it")
    except LabExists as err:  # another 'up' claimed the name first: not ours to remove
        print(f"flannel-lab: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or a closed output: undo, then end
        err.add_note(remove(lab))
        raise
    except (LabError, OSError) as err:
        if stopping.output_closed(err):
            err.add_note(remove(lab))
            raise
        if isinstance(err, FlanneldExited):
            err = LabError(f"flanneld on node {err.index} exited: {err.reason} "
                           f"({keep_log(lab, err)})")
        print(f"flannel-lab: {err}; {remove(lab)}", file=sys.stderr)
        return 1
    return 0


def print_node_state(lab: Lab, index: int, gone: str) -> None:
    node = lab.node(index)
    ns = node.netns
    env = lab.wait_subnet_env(index, timeout=0.1) if Path(node.subnet_file).exists() else {}
    print(f"\n--- node {index} ({ns}, {node.address}) subnet {env.get('FLANNEL_SUBNET', '?')} "
          f"MTU {env.get('FLANNEL_MTU', '?')}, flanneld "
          f"{'GONE' if gone else f'pid {node.pid}'}")
    for link in json.loads(ip(ns, "-j", "-d", "link", "show").stdout or "[]"):
        info = link.get("linkinfo", {})
        if info.get("info_kind") == "vxlan":
            data = info.get("info_data", {})
            print(f"device {link['ifname']}: vxlan id {data.get('id')} port {data.get('port')} "
                  f"{'learning' if data.get('learning') else 'nolearning'} mtu {link['mtu']} "
                  f"mac {link.get('address')}")
        elif info.get("info_kind") == "tun":
            print(f"device {link['ifname']}: tun mtu {link['mtu']} "
                  f"{'carrier' if 'LOWER_UP' in link.get('flags', []) else 'no carrier'}")
    if lab.state.backend == "wireguard":
        for line in wg_show(lab, index).splitlines():
            print(f"  {line}" if line else "")
    for family in ("-4", "-6") if lab.state.ipv6 else ("-4",):
        print(f"routes ({family}):")
        for line in ip(ns, family, "route", "show", "proto", "151").stdout.splitlines():
            print(f"  {line}")
        print(f"neighbours ({family}):")
        for line in ip(ns, family, "neigh", "show", "proto", "151").stdout.splitlines():
            print(f"  {line}")
    print("fdb:")
    for line in in_ns(ns, "bridge", "fdb", "show").stdout.splitlines():
        if "self permanent" in line and "dst" in line:
            print(f"  {line}")


def cmd_status(args: argparse.Namespace) -> int:
    """The lab as it is; exit 1 naming every node whose flanneld is gone."""
    lab = Lab(args.name, args.root)
    if not lab.state.nodes:
        print(f"flannel-lab: no lab named {args.name}", file=sys.stderr)
        return 1
    gone = {node.index: lab.flanneld_gone(node.index) for node in lab.state.nodes}
    print(f"lab {lab.name}: etcd {lab.state.etcd_endpoint}")
    print("leases:")
    for key, value in sorted(lab.leases().items()):
        print(f"  {key} {value}")
    for node in lab.state.nodes:
        print_node_state(lab, node.index, gone[node.index])
    if lab.state.backend in ("aws-vpc", "ali-vpc", "gce"):
        from flannel_lab import vpcrouter

        print(f"\n--- VPC router ({lab.underlay_ns}), following the route table:")
        for destination, via in sorted(vpcrouter.installed(lab.underlay_ns).items()):
            print(f"  {destination} via {via}")
    sys.stdout.flush()
    for index, why in gone.items():
        if why:
            print(f"flannel-lab: node {index}: {why}; "
                  f"'{lab.command('restart', '--node', str(index))}' starts it again",
                  file=sys.stderr)
    return 1 if any(gone.values()) else 0


def wait_ready(lab: Lab, index: int, timeout: float) -> float:
    """Seconds until node ``index``'s flanneld says it is ready (its /readyz, asked on its
    socket); FlanneldExited if it ends first, LabError if ``timeout`` passes."""
    from flannel.monitor.localsock import socket_path
    from flannel.ops.status import StatusUnavailable, Where, fetch

    node = lab.node(index)
    where = Where(socket=socket_path(node.subnet_file))
    start = time.monotonic()
    why = "it did not answer on its socket"
    while time.monotonic() - start < timeout:
        if not lab.flanneld_running(index):
            raise lab.exited(index)
        try:
            reply, body = fetch(where, "/readyz", 1.0, 4096, accept="*/*")
        except StatusUnavailable as err:
            why = str(err)
        else:
            if reply.status == 200:
                return time.monotonic() - start
            why = " ".join(body[:4096].decode(errors="replace").split()) or f"HTTP {reply.status}"
        time.sleep(0.1)
    raise LabError(f"node {index}: flanneld (pid {node.pid}) not ready after {timeout:g}s: "
                   f"{why} (its log: {node.log_file})")


def cmd_restart(args: argparse.Namespace) -> int:
    """Start one node's flanneld again (stopping it first if it runs) with the flags and
    environment recorded when the lab started it; wait until it is ready."""
    lab = Lab(args.name, args.root, progress=say)
    if not lab.state.nodes:
        print(f"flannel-lab: no lab named {args.name}", file=sys.stderr)
        return 1
    node = lab.node(args.node)
    was = lab.flanneld_gone(args.node) or f"flanneld (pid {node.pid}) running"
    flags = shlex.join(node.extra_args) or "none beyond the lab's"
    say(f"node {args.node}: {was}; restarting it with the flags it was started with: {flags}")
    lab.restart_flanneld(args.node)
    took = wait_ready(lab, args.node, args.timeout)
    say(f"node {args.node}: flanneld (pid {node.pid}) ready {took:.1f}s after it started")
    return 0


def ping_table(lab: Lab, v6: bool = False) -> tuple[str, bool]:
    """A matrix of pings: between pods if the lab has pods, else between node pod bridges."""
    if lab.state.pods:
        names = [p.name for p in lab.state.pods]
        targets = {p.name: (p.address6 if v6 else p.address) for p in lab.state.pods}

        def probe(i: str, j: str) -> bool:
            return lab.pod_ping(next(p for p in lab.state.pods if p.name == i), targets[j],
                                within=PING_WITHIN)
    else:
        names = [f"n{n.index}" for n in lab.state.nodes]

        def probe(i: str, j: str) -> bool:
            return lab.ping(int(i[1:]), int(j[1:]), v6=v6, within=PING_WITHIN)
    corner = "from\\to"
    first = max(len(corner), *(len(name) for name in names)) + 2
    width = max(len("FAIL"), *(len(name) for name in names)) + 2
    rows = [corner.ljust(first) + "".join(name.ljust(width) for name in names)]
    all_ok = True
    for i in names:
        cells = []
        for j in names:
            if i == j:
                cells.append("-".ljust(width))
                continue
            ok = probe(i, j)
            all_ok &= ok
            cells.append(("ok" if ok else "FAIL").ljust(width))
        rows.append(i.ljust(first) + "".join(cells))
    return "\n".join(row.rstrip() for row in rows), all_ok


def cmd_ping(args: argparse.Namespace) -> int:
    lab = Lab(args.name, args.root)
    if not lab.state.nodes:
        print(f"flannel-lab: no lab named {args.name}", file=sys.stderr)
        return 1
    if not has_data_path(lab):
        say(f"lab {lab.name} uses the alloc backend, which programs no data path: nothing to "
            f"ping; '{lab.command('status')}' shows the leases")
        return 0
    ok = True
    for v6 in (False, True) if lab.state.ipv6 else (False,):
        table, family_ok = ping_table(lab, v6)
        print(f"IPv{6 if v6 else 4} {'pod' if lab.state.pods else 'node'} ping matrix:\n{table}")
        ok &= family_ok
    return 0 if ok else 1


def cmd_down(args: argparse.Namespace) -> int:
    lab = Lab(args.name, args.root)
    if not lab.exists:
        say(f"no lab named {args.name} under {args.root}: nothing to remove")
        return 0
    if not lab.owns_directory:
        print(f"flannel-lab: {lab.directory} holds no lab state; it is left as it is "
              "(remove it by hand if it is a leftover)", file=sys.stderr)
        return 1
    try:
        lab.down()
    except KeyboardInterrupt as err:  # the state still lists what is left
        err.add_note(f"lab {lab.name} only partly removed: '{lab.command('down')}' removes "
                     "the rest")
        raise
    say(f"lab {args.name} removed")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """``demo`` and ``tour`` (lab/flannel_lab/tour.py): the lab is removed at the end unless
    ``--keep``."""
    lab = Lab(args.name, args.root, progress=say)
    if lab.exists:
        print(f"flannel-lab: {lab.exists_error()}", file=sys.stderr)
        return 1
    walk = tour.tour if args.command == "tour" else tour.demo

    def finish() -> str:
        if args.keep:
            return (f"lab {lab.name} kept: '{lab.command('status')}' shows it, "
                    f"'{lab.command('down')}' removes it")
        return remove(lab)

    try:
        code = walk(lab, build)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM or a closed output
        if lab.owns_directory:
            err.add_note(finish())
        raise
    except (LabError, OSError) as err:
        if stopping.output_closed(err):
            if lab.owns_directory:
                err.add_note(finish())
            raise
        print(f"flannel-lab: {err}", file=sys.stderr)
        code = 1
    if lab.owns_directory:
        if not args.keep:
            say(f"removing the {args.command} lab")
        say(finish())
    return code


def _number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from {low} to "
                                             f"{high}")
        return value
    return parse


class _Parser(argparse.ArgumentParser):
    """A bad option is refused in one line (the usage is what --help is for)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="flannel-lab",
        description="Build, inspect and tear down throw-away flannel clusters on one machine.")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT,
                        help="where labs keep their state (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_name(p: argparse.ArgumentParser, default: str = "fl-lab") -> None:
        p.add_argument("--name", default=default, help="lab name (default %(default)s)")

    up = sub.add_parser("up", help="build a lab and start flanneld on every node")
    with_name(up)
    up.add_argument("--nodes", type=_number(1, MAX_NODES), default=3,
                    help=f"how many nodes, 1 to {MAX_NODES} (default %(default)s)")
    up.add_argument("--backend", default="vxlan",
                    choices=["vxlan", "host-gw", "udp", "wireguard", "ipip", "extension",
                             "aws-vpc", "ali-vpc", "gce", "alloc", "ipsec"],
                    help="alloc reserves subnets only: the lab shows leases, pings nothing; "
                    "ipsec runs charon (strongSwan) on every node with a random PSK; "
                    "extension runs deploy/examples/extension-vxlan (a vxlan built by "
                    "scripts); ipip needs the kernel's ipip module; aws-vpc runs moto's EC2 "
                    "and a metadata service per node, the underlay namespace routing as the "
                    "VPC router (needs moto[server] and boto3); ali-vpc and gce do the same "
                    "with the Alibaba Cloud VPC API double and the Compute Engine double")
    up.add_argument("--ipv6", action="store_true", help="dual-stack network")
    up.add_argument("--direct-routing", action="store_true", help="vxlan or ipip DirectRouting")
    up.add_argument("--second-underlay", type=_number(0, MAX_NODES), default=0, metavar="K",
                    help="nodes K and above (K from 1 to --nodes) sit on a second, routed "
                    "underlay subnet; 0 (the default): one underlay")
    up.add_argument("--config", metavar="JSON|FILE",
                    help="network config: the JSON text, or a file holding it (a path, or "
                    "@path); read as flanneld reads it, backend options included, and refused "
                    "before anything is built when flanneld would refuse it (overrides the "
                    "options above)")
    up.add_argument("--pods-per-node", type=_number(0, MAX_PODS_PER_NODE), default=0,
                    metavar="K", help="attach K pods per node through the flannel CNI plugin "
                    f"(0 to {MAX_PODS_PER_NODE})")
    up.add_argument("--flanneld-arg", action="append", metavar="FLAG",
                    help="one more flag for every node's flanneld (after the lab's "
                    "--ip-masq), given with '=': --flanneld-arg=--healthz-port=8081; "
                    "repeatable")
    up.add_argument("--flanneld-args", action="append", metavar="FLAGS",
                    help="more flanneld flags in one string, split as a shell would (no "
                    "shell runs them), given with '=': --flanneld-args='-v=2 "
                    "--iptables-resync=10'")
    up.set_defaults(func=cmd_up)
    for name, func, text in (("status", cmd_status, "leases, routes, neighbours, FDB; exit 1 "
                              "naming every node whose flanneld is gone"),
                             ("ping", cmd_ping, "pod-to-pod ping matrix"),
                             ("down", cmd_down, "remove what the lab created (idempotent)")):
        p = sub.add_parser(name, help=text)
        with_name(p)
        p.set_defaults(func=func)
    restart = sub.add_parser(
        "restart", help="restart one node's flanneld with the flags it was started with",
        description="Stop node K's flanneld if it runs, start it again with the flags and "
                    "environment the lab started it with (recorded in the lab's state), and "
                    "wait until it is ready (its /readyz), at most --timeout seconds.")
    with_name(restart)
    restart.add_argument("--node", type=_number(1, MAX_NODES), required=True, metavar="K",
                         help="the node whose flanneld to restart")
    restart.add_argument("--timeout", type=_number(1, 600), default=60, metavar="SECONDS",
                         help="how long to wait for it to be ready (default %(default)s)")
    restart.set_defaults(func=cmd_restart)
    for name, text in (("demo", "two vxlan nodes explained: the leases in etcd, "
                        "subnet.env, a packet's path through route, neighbour and FDB, a ping"),
                       ("tour", "the demo, and more: a node joining (its lease, the entries "
                        "each node adds for it), an entry deleted by hand and repaired")):
        p = sub.add_parser(name, help=text, description=text)
        with_name(p, f"fl-{name}")
        p.add_argument("--keep", action="store_true",
                       help="leave the lab running at the end (remove it with down)")
        p.set_defaults(func=cmd_demo)
    return parser


def run(args: argparse.Namespace) -> int:
    """The command ``args`` names, as root; a lab step that fails ends it with one line."""
    if os.geteuid() != 0:
        print(f"flannel-lab: {args.command} needs root: a lab is network namespaces with "
              "etcd, flanneld and ping running inside them, which only root may create and "
              "enter; run it as root (sudo)", file=sys.stderr)
        return 1
    try:
        code: int = args.func(args)
    except (LabError, OSError) as err:
        if stopping.output_closed(err):
            raise
        print(f"flannel-lab: {err}", file=sys.stderr)
        return 1
    return code


def main(argv: list[str] | None = None) -> int:
    # What flanneld would warn about in the config (unknown keys), said here too.
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setFormatter(logging.Formatter("flannel-lab: warning: %(message)s"))
    logging.getLogger("flannel.config").addHandler(warnings)
    parsed: list[argparse.Namespace] = []

    def command() -> int:
        parsed.append(build_parser().parse_args(argv))
        return run(parsed[0])

    return stopping.run(lambda: " ".join(["flannel-lab", *(a.command for a in parsed)]),
                        command)


if __name__ == "__main__":
    sys.exit(main())
