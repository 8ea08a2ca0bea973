"""``flannel-lab demo`` and ``flannel-lab tour``: flannel explained from a running lab.

Owns the walkthroughs and their words: the leases as etcd holds them (keys, values, TTLs,
decoded with flanneld's own decoder), a node's subnet.env line by line, and a packet's path
from pod to pod through each kernel entry it uses (route -> neighbour -> FDB -> underlay),
every entry read from the node's real kernel (``ip -j``, ``bridge -j`` in its namespace)
and checked against the peer's lease. The tour also shows a node joining (its lease
appears; each node adds the three entries for it) and flanneld repairing an entry deleted
by hand. Both build a two-node vxlan lab and remove it at the end unless asked to keep it.
Must not touch: anything but the lab it builds (it deletes kernel entries only inside that
lab's node namespaces, to show the repair).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flannel.lease import LeaseAttrs, LeaseDecodeError, parse_subnet_key
from flannel.ops import commands
from flannel_lab import slowness
from flannel_lab.cluster import ETCD_PREFIX, Lab, LabError, Pod, in_ns, ip

DEMO_CONFIG = {"Network": "10.0.0.0/8", "SubnetLen": 20, "SubnetMin": "10.10.0.0",
               "SubnetMax": "10.99.0.0", "Backend": {"Type": "vxlan", "VNI": 100, "Port": 8472}}
VNI = 100
PORT = 8472
DEVICE = f"flannel.{VNI}"
FLANNELD_ARGS = ("--ip-masq",)
WIDTH = 92

#: What each subnet.env line means, for the vxlan lab the walkthroughs build.
ENV_MEANING = {
    "FLANNEL_NETWORK": "the whole flannel network: every node's subnet lies in it",
    "FLANNEL_SUBNET": "this node's subnet; the address written (.1) goes on the pod bridge "
                      "cni0, the pods' gateway",
    "FLANNEL_IPV6_NETWORK": "the IPv6 flannel network",
    "FLANNEL_IPV6_SUBNET": "this node's IPv6 subnet",
    "FLANNEL_MTU": "the pods' MTU: the underlay's 1500 minus 50 bytes of vxlan headers "
                   "(outer IPv4, UDP, vxlan, inner Ethernet)",
    "FLANNEL_IPMASQ": "flanneld masquerades pod traffic leaving the flannel network "
                      "(--ip-masq), so the CNI bridge must not",
}


def heading(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def explain(text: str, indent: str = "    ") -> None:
    """Plain words, wrapped, prefixed so they stand apart from what the kernel said."""
    print(textwrap.fill(text, WIDTH, initial_indent=f"{indent}-> ",
                        subsequent_indent=f"{indent}   "), flush=True)


def say(message: str) -> None:
    print(f"==> {message}", flush=True)


def _jq(stdout: str) -> list[dict[str, Any]]:
    doc = json.loads(stdout or "[]")
    return doc if isinstance(doc, list) else [doc]


# -- the store ---------------------------------------------------------------------------


@dataclass
class StoredLease:
    """One lease as etcd holds it, and what flanneld makes of it."""

    key: str
    value: str
    subnet: ipaddress.IPv4Network
    attrs: LeaseAttrs
    granted_ttl: int  # 0: no etcd lease (a reservation)
    remaining_ttl: int

    @property
    def vtep_mac(self) -> str:
        data = self.attrs.backend_json()
        return str(data.get("VtepMAC", "")) if isinstance(data, dict) else ""

    @property
    def vni(self) -> int:
        data = self.attrs.backend_json()
        return int(data.get("VNI", 0)) if isinstance(data, dict) else 0


def stored_leases(lab: Lab) -> list[StoredLease]:
    """Every lease under the lab's prefix, with its etcd lease's TTL; LabError on a record
    flanneld could not use either."""
    doc = json.loads(lab.etcdctl("get", "--prefix", f"{ETCD_PREFIX}/subnets/", "-w", "json"))
    leases = []
    for kv in doc.get("kvs", []):
        key = base64.b64decode(kv["key"]).decode()
        value = base64.b64decode(kv["value"]).decode()
        subnets = parse_subnet_key(key.rsplit("/", 1)[-1])
        try:
            attrs = LeaseAttrs.from_json(value)
        except LeaseDecodeError as err:
            raise LabError(f"{key}: {err}") from None
        if subnets is None:
            raise LabError(f"{key}: not a subnet key")
        granted = remaining = 0
        if kv.get("lease"):
            ttl = json.loads(lab.etcdctl("lease", "timetolive", format(int(kv["lease"]), "x"),
                                         "-w", "json"))
            granted, remaining = int(ttl.get("granted-ttl", 0)), int(ttl.get("ttl", 0))
        leases.append(StoredLease(key, value, subnets[0], attrs, granted, remaining))
    return sorted(leases, key=lambda lease: lease.subnet)


def node_of(lab: Lab, lease: StoredLease) -> int:
    """The lab node whose underlay address the lease publishes (0 if none)."""
    for node in lab.state.nodes:
        if node.address == str(lease.attrs.public_ip):
            return node.index
    return 0


def show_leases(lab: Lab, leases: list[StoredLease]) -> None:
    heading(f"The leases in etcd ({lab.state.etcd_endpoint}, "
            f"etcdctl get --prefix {ETCD_PREFIX}/subnets/)")
    explain("A lease is one key per node: the key names the node's subnet, the value says "
            "how to reach it (its underlay address, PublicIP, and its backend's data). "
            "flanneld picked a free subnet of the Network and created the key with an etcd "
            "lease (a TTL); it renews it an hour before it runs out. Every flanneld watches "
            "these keys: that is how nodes learn about each other.", indent="")
    for lease in leases:
        print(f"\n  {lease.key}")
        print(f"    value: {lease.value}")
        ttl = (f"TTL {lease.granted_ttl}s, {lease.remaining_ttl}s left" if lease.granted_ttl
               else "no TTL: a reservation, kept until deleted")
        print(f"    etcd lease: {ttl}")
        print(f"    decoded: subnet {lease.subnet}, node {node_of(lab, lease)} "
              f"(PublicIP {lease.attrs.public_ip}), backend {lease.attrs.backend_type}: "
              f"VNI {lease.vni}, VtepMAC {lease.vtep_mac}")
    print()
    explain("VtepMAC is the MAC address of that node's vxlan device (its VTEP, the vxlan "
            "tunnel end point); every other node needs it, with the PublicIP, to send "
            "packets into that node's tunnel end.", indent="")


def show_subnet_env(lab: Lab, index: int) -> dict[str, str]:
    node = lab.node(index)
    env = lab.wait_subnet_env(index)
    heading(f"subnet.env of node {index} ({node.subnet_file})")
    explain("What flanneld wrote once it held its lease: the CNI plugin reads it to give "
            "pods addresses from this node's subnet, with the right MTU.", indent="")
    width = max(len(f"{k}={v}") for k, v in env.items()) + 2
    for line in Path(node.subnet_file).read_text().splitlines():
        name = line.split("=", 1)[0]
        print(f"  {line.ljust(width)}{ENV_MEANING.get(name, '')}")
    return env


# -- the kernel --------------------------------------------------------------------------


@dataclass
class PeerEntries:
    """The three kernel entries one node holds for one vxlan peer (None: missing)."""

    route: dict[str, Any] | None
    neighbour: dict[str, Any] | None
    fdb: dict[str, Any] | None

    @property
    def complete(self) -> bool:
        return None not in (self.route, self.neighbour, self.fdb)


def peer_entries(lab: Lab, index: int, peer: StoredLease) -> PeerEntries:
    """What node ``index``'s kernel holds for ``peer``, as ``ip -j``/``bridge -j`` say."""
    ns = lab.node_ns(index)
    gateway = str(peer.subnet.network_address)
    # Whole dumps, filtered here: ip leaves out of its answer what a filter names.
    route = next((r for r in _jq(ip(ns, "-j", "route", "show", "table", "main").stdout)
                  if r.get("dst") == str(peer.subnet)), None)
    neighbour = next((n for n in _jq(ip(ns, "-j", "neigh", "show").stdout)
                      if n.get("dst") == gateway and n.get("dev") == DEVICE
                      and n.get("lladdr")), None)
    fdb = next((f for f in _jq(in_ns(ns, "bridge", "-j", "fdb", "show").stdout)
                if f.get("ifname") == DEVICE and f.get("mac") == peer.vtep_mac
                and f.get("dst")), None)
    return PeerEntries(route, neighbour, fdb)


def route_text(route: dict[str, Any]) -> str:
    flags = " ".join(route.get("flags", []))
    return (f"{route.get('dst')} via {route.get('gateway')} dev {route.get('dev')} "
            f"{flags} proto {route.get('protocol')}").replace("  ", " ")


def neighbour_text(neighbour: dict[str, Any]) -> str:
    return (f"{neighbour.get('dst')} dev {neighbour.get('dev', DEVICE)} lladdr "
            f"{neighbour.get('lladdr')} {' '.join(neighbour.get('state', []))}")


def fdb_text(fdb: dict[str, Any]) -> str:
    return (f"{fdb.get('mac')} dev {fdb.get('ifname', DEVICE)} dst {fdb.get('dst')} "
            f"{' '.join(fdb.get('flags', []))} {fdb.get('state', '')}").strip()


def print_entries(entries: PeerEntries, indent: str = "    ") -> None:
    print(f"{indent}route      "
          f"{route_text(entries.route) if entries.route else '(missing)'}")
    print(f"{indent}neighbour  "
          f"{neighbour_text(entries.neighbour) if entries.neighbour else '(missing)'}")
    print(f"{indent}fdb        {fdb_text(entries.fdb) if entries.fdb else '(missing)'}")


def wait_entries(lab: Lab, index: int, peer: StoredLease, timeout: float = 30.0
                 ) -> PeerEntries:
    """The three entries, once node ``index`` holds them all."""
    start = time.monotonic()
    while True:
        entries = peer_entries(lab, index, peer)
        if entries.complete:
            return entries
        if time.monotonic() - start > slowness.scaled(timeout):
            raise LabError(f"node {index} has not programmed {peer.subnet} after "
                           f"{slowness.within(timeout)}:\n{lab.log(index)[-2000:]}")
        time.sleep(0.05)


def packet_path(lab: Lab, src: Pod, dst: Pod, leases: list[StoredLease]) -> list[str]:
    """Explain, from the source node's kernel, how a packet from ``src`` reaches ``dst``;
    the list of disagreements between the kernel and the destination's lease (empty: none)."""
    ns = lab.node_ns(src.node)
    peer = next(lease for lease in leases if ipaddress.ip_address(dst.address) in lease.subnet)
    heading(f"A packet from pod {src.name} ({src.address}) on node {src.node} to pod "
            f"{dst.name} ({dst.address}) on node {dst.node}, read from node {src.node}'s "
            f"kernel ({ns})")
    explain(f"The pod sends it to its gateway, cni0 on node {src.node}; node {src.node}'s "
            "kernel forwards it, using three entries flanneld wrote for node "
            f"{dst.node} (one of each per peer) and the underlay's own route.", indent="")
    wrong: list[str] = []

    got = _jq(ip(ns, "-j", "route", "get", dst.address).stdout)[0]
    entries = peer_entries(lab, src.node, peer)
    print(f"\n  1. route      (ip -j route get {dst.address}: via {got.get('gateway')} dev "
          f"{got.get('dev')})")
    if entries.route:
        print(f"     {route_text(entries.route)}")
    gateway = str(peer.subnet.network_address)
    explain(f"Which gateway and device: node {dst.node}'s subnet {peer.subnet} is reached "
            f"via {gateway}, the subnet's own address, which node {dst.node} puts "
            f"on its vxlan device {DEVICE} (its VTEP), out of this node's {DEVICE}. 'onlink': "
            "the gateway needs no route of its own; proto 151 marks the routes flanneld owns.",
            indent="     ")
    if got.get("gateway") != gateway or got.get("dev") != DEVICE:
        wrong.append(f"route: the kernel sends {dst.address} via {got.get('gateway')} dev "
                     f"{got.get('dev')}, not via {gateway} dev {DEVICE}")

    print(f"\n  2. neighbour  (ip -j neigh show {gateway} dev {DEVICE})")
    if entries.neighbour:
        print(f"     {neighbour_text(entries.neighbour)}")
    explain(f"The MAC of that gateway: {DEVICE} builds an Ethernet frame for {gateway}, and "
            f"this permanent entry gives node {dst.node}'s VTEP MAC, the VtepMAC of its lease "
            f"({peer.vtep_mac}). Written by flanneld, so no ARP ever crosses the overlay.",
            indent="     ")
    mac = entries.neighbour.get("lladdr") if entries.neighbour else None
    if mac != peer.vtep_mac:
        wrong.append(f"neighbour: {gateway} has MAC {mac}, the lease says {peer.vtep_mac}")

    print(f"\n  3. fdb        (bridge -j fdb show dev {DEVICE}, the entry for {mac})")
    if entries.fdb:
        print(f"     {fdb_text(entries.fdb)}")
    explain(f"Which underlay host carries that MAC: {peer.attrs.public_ip}, node "
            f"{dst.node}'s PublicIP from its lease. {DEVICE} wraps the frame in UDP to "
            f"{peer.attrs.public_ip}:{PORT} with VNI {peer.vni}.", indent="     ")
    underlay = entries.fdb.get("dst") if entries.fdb else None
    if underlay != str(peer.attrs.public_ip):
        wrong.append(f"fdb: {peer.vtep_mac} goes to {underlay}, the lease says "
                     f"{peer.attrs.public_ip}")

    out = _jq(ip(ns, "-j", "route", "get", str(peer.attrs.public_ip)).stdout)[0]
    print(f"\n  4. underlay   (ip -j route get {peer.attrs.public_ip})")
    print(f"     {out.get('dst')} dev {out.get('dev')} src {out.get('prefsrc')}")
    explain(f"The UDP packet leaves by {out.get('dev')} across the underlay. Node "
            f"{dst.node}'s {DEVICE} unwraps it and its kernel delivers {dst.address} to pod "
            f"{dst.name} through cni0.", indent="     ")
    print()
    if wrong:
        for line in wrong:
            print(f"  MISMATCH {line}")
    else:
        print(f"  checked: the route's gateway is node {dst.node}'s subnet address, the "
              f"neighbour's MAC its lease's VtepMAC, the FDB entry's dst its PublicIP")
    return wrong


def ping(lab: Lab, src: Pod, dst: Pod, timeout: float = 20.0) -> bool:
    """Three pings shown, once one got through (a pod's first packets may wait for its
    node to finish programming); False, said on stderr, if none does."""
    heading(f"ping from pod {src.name} ({src.address}) to pod {dst.name} ({dst.address}) "
            "across the vxlan overlay")
    deadline = time.monotonic() + slowness.scaled(timeout)
    while not lab.pod_ping(src, dst.address) and time.monotonic() < deadline:
        time.sleep(0.2)
    result = in_ns(src.netns, "ping", "-c", "3", "-i", "0.2", "-W", "2", dst.address,
                   check=False)
    print(result.stdout.strip(), flush=True)
    if result.returncode != 0:
        print(f"flannel-lab: the ping from pod {src.name} to pod {dst.name} failed; "
              f"'{commands.flannelctl('check', '--lab', lab.name)}' (with --keep) says where "
              "it stops",
              file=sys.stderr)
    return result.returncode == 0


def lease_of(leases: list[StoredLease], lab: Lab, index: int) -> StoredLease:
    for lease in leases:
        if node_of(lab, lease) == index:
            return lease
    raise LabError(f"node {index} has no lease in etcd")


# -- the walkthroughs --------------------------------------------------------------------


def add_pods(lab: Lab) -> list[Pod]:
    """A pod on node 1 and one on node 2, through the real CNI plugin."""
    pods = [lab.add_pod(1), lab.add_pod(2)]
    heading("Pods")
    for pod in pods:
        print(f"  pod {pod.name} on node {pod.node}: {pod.address}, attached by the flannel "
              "CNI plugin (bridge cni0, host-local addresses from subnet.env)")
    return pods


def _start_node(lab: Lab, index: int) -> None:
    lab.add_node(index)
    lab.start_flanneld(index, *FLANNELD_ARGS)
    lab.wait_subnet_env(index, timeout=60.0)
    lab.attach_pod_bridge(index)


def demo(lab: Lab, build: Callable[..., list[int]]) -> int:
    """Two nodes: the leases, subnet.env, the packet path and the ping."""
    say("etcd config: " + json.dumps(DEMO_CONFIG))
    build(lab, 2, DEMO_CONFIG, flanneld_args=FLANNELD_ARGS)
    leases = stored_leases(lab)
    show_leases(lab, leases)
    show_subnet_env(lab, 1)
    for index, peer in ((1, 2), (2, 1)):
        wait_entries(lab, index, lease_of(leases, lab, peer))
    pods = add_pods(lab)
    wrong = packet_path(lab, pods[0], pods[1], leases)
    ok = ping(lab, pods[0], pods[1])
    return 0 if ok and not wrong else 1


def tour(lab: Lab, build: Callable[..., list[int]]) -> int:
    """One node, then a second joins: the lease appearing, the entries each node adds, the
    packet path, the ping, and an entry deleted by hand put back."""
    say("etcd config: " + json.dumps(DEMO_CONFIG))
    build(lab, 1, DEMO_CONFIG, flanneld_args=FLANNELD_ARGS)
    first = stored_leases(lab)
    show_leases(lab, first)
    show_subnet_env(lab, 1)
    heading("Node 1 alone")
    routes = ip(lab.node_ns(1), "route", "show", "proto", "151").stdout.strip()
    print(f"  routes of flanneld (proto 151) on node 1: {routes or 'none'}")
    explain("No peer, nothing to route: flanneld only created its vxlan device "
            f"{DEVICE}, with the address {first[0].subnet.network_address}/32 and the MAC "
            "it published as VtepMAC.", indent="")

    heading("Node 2 joins")
    start = time.monotonic()
    _start_node(lab, 2)
    leases = stored_leases(lab)
    new = lease_of(leases, lab, 2)
    print(f"  node 2's flanneld leased {new.subnet} "
          f"{time.monotonic() - start:.2f}s after it started:")
    print(f"    {new.key}")
    print(f"    value: {new.value}")
    explain("Node 1's flanneld sees the new key through its etcd watch and writes the three "
            "entries for node 2; node 2 lists the leases at start and writes them for node 1.",
            indent="")
    for index, peer in ((1, new), (2, lease_of(leases, lab, 1))):
        entries = wait_entries(lab, index, peer)
        print(f"\n  node {index}, {time.monotonic() - start:.2f}s after node 2's flanneld "
              f"started, for node {node_of(lab, peer)}'s {peer.subnet}:")
        print_entries(entries)
    print()
    explain("route: which gateway and device; neighbour: the peer VTEP's MAC for that "
            "gateway; FDB: which underlay IP carries that MAC. Without any one of them the "
            "packet stops on this node.", indent="")

    pods = add_pods(lab)
    wrong = packet_path(lab, pods[0], pods[1], leases)
    ok = ping(lab, pods[0], pods[1])

    heading("Repair: an entry deleted by hand")
    ns = lab.node_ns(1)
    gateway = str(new.subnet.network_address)
    deletions = (("neighbour", ["ip", "neigh", "del", gateway, "dev", DEVICE]),
                 ("fdb", ["bridge", "fdb", "del", new.vtep_mac, "dev", DEVICE, "dst",
                          str(new.attrs.public_ip)]))
    for what, argv in deletions:
        in_ns(ns, *argv)
        deleted = time.monotonic()
        gone = getattr(peer_entries(lab, 1, new), what) is None
        entries = wait_entries(lab, 1, new, timeout=10.0)
        back = time.monotonic() - deleted
        print(f"\n  on node 1: {' '.join(argv)}")
        print(f"    the {what} entry was {'gone' if gone else 'back already'}; "
              f"flanneld put it back within {back:.2f}s:")
        print_entries(entries, indent="      ")
    print()
    explain("flanneld follows the kernel's netlink events: an entry it owns that is deleted "
            "or changed is written again within a second (and every --reconcile-interval "
            "seconds it compares everything anyway).", indent="")
    ok = ping(lab, pods[0], pods[1]) and ok
    return 0 if ok and not wrong else 1
