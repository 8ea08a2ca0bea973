"""The command lines of ``flannelctl leases``, ``doctor``, ``check``, ``bundle`` and ``status``.

Owns their subparsers and argument checks, and nothing else: each command's module (with
asyncio, the store clients, tar) is imported only when that command runs, so ``flannelctl
install-cni`` and ``--help`` stay cheap.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Any

from flannel.ops.storeflags import add_store_flags
from flannel.untrusted.netutil import unusable_address

#: What deleting a lease does to the flanneld holding it (etcd mode), as it does it: said
#: by ``leases release`` before it asks, and in its help.
RELEASE_EFFECT = (
    "a flanneld running with that lease sees it deleted, logs \"Lease has been revoked. "
    "Shutting down daemon.\" and exits with status 0 (as Go flannel does), and the other "
    "nodes remove their routes to its subnet. Started again (by hand, or by a supervisor: "
    "systemd's Restart=always, a DaemonSet), it takes the subnet its subnet.env names once "
    "more, as a new lease that expires unless renewed (a reservation is not restored), "
    "unless another node took that subnet meanwhile: then it gets another one, and the pods "
    "on that node must be recreated")


def _later(module: str, name: str) -> Callable[[Any], int]:
    """The command ``name`` of ``module``, which takes the command's typed options."""
    def run(options: Any) -> int:
        code: int = getattr(importlib.import_module(module), name)(options)
        return code
    return run


def _subnet_arg(text: str) -> IPv4Network:
    try:
        return IPv4Network(text.replace("-", "/", 1) if "/" not in text else text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an IPv4 subnet with its base address, e.g. 10.244.7.0/24"
        ) from None


def _node_ip_arg(text: str) -> IPv4Address:
    """A node's public IPv4 address: one that peers can send to."""
    try:
        addr = IPv4Address(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an IPv4 address") from None
    why = unusable_address(addr)
    if why:
        raise argparse.ArgumentTypeError(f"{text}: {why}, so no node can hold it; give the "
                                         "public IP of the node the subnet is for")
    return addr


def add_leases(sub: Any) -> None:
    leases = sub.add_parser("leases", help="list, show, reserve or release subnet leases")
    actions = leases.add_subparsers(dest="leases_command", required=True)
    listing = actions.add_parser("list", help="every lease: subnet, public IP, backend, "
                                              "expiry, whether it is a reservation")
    show = actions.add_parser("show", help="one lease in full")
    show.add_argument("subnet", help="subnet, lease key or public IP")
    reserve_p = actions.add_parser(
        "reserve", help="pin a subnet to a public IP (etcd key without TTL)",
        description="Write a lease key with no etcd lease for --public-ip: the node with "
                    "that public IP takes this subnet when its flanneld starts, and the "
                    "subnet never expires.")
    reserve_p.add_argument("subnet", type=_subnet_arg)
    reserve_p.add_argument("--public-ip", dest="reserve_for", type=_node_ip_arg, required=True,
                           help="the public IP of the node that gets the subnet")
    release = actions.add_parser(
        "release", help="delete a lease or reservation",
        description="Delete a lease or reservation (etcd mode) after asking. Deleted, "
                    f"{RELEASE_EFFECT}.")
    release.add_argument("subnet", help="subnet, lease key or public IP")
    release.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    for parser in (listing, show, reserve_p, release):
        add_store_flags(parser)
        if parser in (listing, show):
            parser.add_argument("--json", action="store_true", help="machine-readable output")
        parser.set_defaults(func=_later("flannel.ops.leases", "cmd_leases"))


def add_doctor(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="check this node and print a ranked diagnosis with fixes",
        description="Check this node (run it as root in flanneld's network namespace; "
                    "with no store flag it reads the store and subnet.env of the flanneld "
                    "running there, a flag given wins): flanneld, subnet.env, sysctls, "
                    "FORWARD policy, "
                    "CNI plugins and config, the backend's devices, MAC and MTU, each peer's "
                    "routes, neighbours, FDB entries and engine entries as the backend says "
                    "it makes them, the leases flanneld skips, duplicate leases, clock skew, "
                    "this node's own input rules, and probes to every peer in every IP family "
                    "(overlay, underlay, what carries the overlay, path MTU). Prints "
                    "the findings most likely cause first, each with its fix. Exit status 0 "
                    "only when nothing is wrong.")
    add_store_flags(doctor)
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.add_argument("--cni-bin-dir", type=Path, action="append",
                        help="CNI plugin directory; repeat for several (default /opt/cni/bin)")
    doctor.add_argument("--cni-conf-dir", type=Path, action="append",
                        help="CNI config directory; repeat for several (default /etc/cni/net.d)")
    doctor.add_argument("--probe-timeout", type=_bounded(float, 0.1, 30, "seconds"),
                        default=1.0, metavar="SECONDS",
                        help="how long each probe waits for an answer (default %(default)s)")
    doctor.add_argument("--fix-checksum-offload", action="store_true",
                        help="turn tx-checksum-ip-generic off on the device the kernel "
                             "encapsulates in UDP when the conditions of the checksum bug are "
                             "met")
    doctor.set_defaults(func=_later("flannel.ops.doctor", "cmd_doctor"))


def add_bundle(sub: Any) -> None:
    bundle = sub.add_parser("bundle", help="collect this node's state into a tar.gz for a "
                                           "bug report (secrets removed)")
    add_store_flags(bundle)
    bundle.add_argument("--output", "-o", type=Path, default=None,
                        help="archive to write (default flannel-bundle-<host>-<time>.tar.gz "
                             "here); never overwritten")
    bundle.add_argument("--health-url", default="",
                        help="flanneld's health endpoint, e.g. http://127.0.0.1:8080; its "
                             "healthz, readyz, status and metrics are included")
    bundle.add_argument("--log-file", type=Path, action="append",
                        help="a flanneld log file to include (its last 4 MiB); repeatable")
    bundle.add_argument("--journal", default="", metavar="UNIT",
                        help="include the last 5000 journal lines of this systemd unit")
    # The bundle includes doctor's findings, which read these.
    bundle.add_argument("--cni-bin-dir", type=Path, action="append",
                        help="CNI plugin directory, as for doctor (default /opt/cni/bin)")
    bundle.add_argument("--cni-conf-dir", type=Path, action="append",
                        help="CNI config directory, as for doctor (default /etc/cni/net.d)")
    bundle.set_defaults(func=_later("flannel.ops.bundle", "cmd_bundle"))


def _bounded(kind: type, low: float, high: float, unit: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r}: give {unit} from {low:g} to {high:g}")
        return value
    return parse


def add_check(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="connectivity matrix: ping every peer over the overlay",
        description="Send ICMP echoes from this node's flannel address to every peer's "
                    "(the base address on the peer's flannel device where its backend has "
                    "one, else its cni0 gateway), over the overlay, in every IP family, all "
                    "peers at once; print latency, loss and a verdict per peer "
                    "with what to run next when one fails. Run it in flanneld's network "
                    "namespace, as root (raw ICMP socket), with flanneld's store flags. "
                    "Exit status 0 only when every peer answers. --lab NAME runs it in every "
                    "node of a flannel-lab lab and prints the full matrix.")
    add_store_flags(check)
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.add_argument("--count", type=_bounded(int, 1, 100, "a number of echoes"), default=3,
                       help="echoes per peer (default %(default)s)")
    check.add_argument("--interval", type=_bounded(float, 0.01, 10, "seconds"), default=0.2,
                       help="seconds between a peer's echoes (default %(default)s)")
    check.add_argument("--timeout", type=_bounded(float, 0.1, 30, "seconds"), default=1.0,
                       help="seconds each echo waits for its answer (default %(default)s)")
    check.add_argument("--parallel", type=_bounded(int, 1, 256, "a number of peers"),
                       default=128, help="peers probed at once (default %(default)s)")
    check.add_argument("--deadline", type=_bounded(float, 1, 600, "seconds"), default=60.0,
                       help="seconds for all the probes; peers not probed by then are "
                            "reported as such (default %(default)s)")
    check.add_argument("--lab", default="", metavar="NAME",
                       help="check every node of this flannel-lab lab against every other")
    check.add_argument("--lab-root", type=Path, default=Path("/run/flannel-lab"),
                       help="where labs keep their state (default %(default)s)")
    check.set_defaults(func=_later("flannel.ops.check", "cmd_check"))


def add_status(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="this node's lease, peers, readiness and errors, as flanneld sees them",
        description="Ask this node's flanneld for its status: the lease and its expiry, "
                    "the store, backend and devices, peers known vs programmed, readiness "
                    "and why, the traffic rules and the last errors. With no flag it finds "
                    "the flanneld of this network namespace and asks it on its local socket "
                    "(flanneld.sock next to its subnet.env, root only): run it on the node, "
                    "or in the node's namespace (ip netns exec NODE flannelctl status). Exit "
                    "code 0 when ready, 1 when not ready, 3 when flanneld does not answer.")
    status.add_argument("--health-url", default="",
                        help="ask flanneld's health server instead, "
                             "http://<healthz-ip>:<healthz-port> (flanneld serves it only "
                             "with --healthz-port; /status answers clients on its host only)")
    status.add_argument("--socket", default="", metavar="PATH",
                        help="flanneld's local socket (default: that of the flanneld running "
                             "in this network namespace, else /run/flannel/flanneld.sock)")
    status.add_argument("--subnet-file", default="", metavar="PATH",
                        help="the subnet.env of the flanneld to ask: its socket is next to it "
                             "(env FLANNELD_SUBNET_FILE)")
    status.add_argument("--timeout", type=_bounded(float, 0.1, 60, "seconds"), default=3.0,
                        help="seconds to wait for the answer (default %(default)s)")
    status.add_argument("--json", action="store_true", help="the status document as JSON")
    status.set_defaults(func=_later("flannel.ops.status", "cmd_status"))
