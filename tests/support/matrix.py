"""The truth matrix of ``flannelctl doctor`` and ``check``: its labs, the situations made in
them and undone, and the cells that say what each tool must answer.

A lab per backend and IP family (``LABS``). A situation (``SITUATIONS``) is made on purpose
in a lab and undone after (a firewall rule, a cut link, an entry deleted behind a frozen
flanneld, a stopped flanneld, a lease flanneld refuses or parks...). A cell (``CELLS``) is
one situation in one lab: doctor's exit status and first finding on the node it runs on (the
check, and words the finding must hold: the port, chain, rule or node that is the cause),
``flannelctl check``'s verdict for the pair n1 -> peer and, for a situation that writes a
lease, for that lease's row. ``table()`` makes the table docs/operations.md shows, from the
cells; a fast-lane test keeps the two equal.
Test code: it never runs outside the test suite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.checkout import FLANNELCTL

ETCD_PREFIX = "/coreos.com/network"
#: Seconds each doctor probe and each check echo waits: the lab answers in a millisecond.
PROBE_TIMEOUT = 0.5


@dataclass(frozen=True)
class LabSpec:
    """One lab: its backend, whether it is dual-stack, DirectRouting, how many nodes, from
    which node on they sit on a second, routed underlay (0: one underlay), and the peer of
    n1 its cells look at by default."""

    backend: str
    ipv6: bool = False
    direct_routing: bool = False
    nodes: int = 2
    second_underlay: int = 0
    title: str = ""

    @property
    def name(self) -> str:
        return self.title or self.backend + (" dual-stack" if self.ipv6 else "")


LABS: dict[str, LabSpec] = {
    "vxlan": LabSpec("vxlan"),
    "vxlan-dual": LabSpec("vxlan", ipv6=True),
    "vxlan-dr": LabSpec("vxlan", direct_routing=True, nodes=3, second_underlay=3,
                        title="vxlan DirectRouting (n2 on n1's segment, n3 routed)"),
    "vxlan-dr-dual": LabSpec("vxlan", ipv6=True, direct_routing=True, nodes=3,
                             second_underlay=3,
                             title="vxlan DirectRouting dual-stack (n2 on n1's segment, n3 "
                                   "routed)"),
    "host-gw": LabSpec("host-gw"),
    "host-gw-dual": LabSpec("host-gw", ipv6=True),
    "udp": LabSpec("udp"),
    "wireguard": LabSpec("wireguard"),
    "wireguard-dual": LabSpec("wireguard", ipv6=True),
    "ipsec": LabSpec("ipsec"),
    "extension": LabSpec("extension"),
    "aws-vpc": LabSpec("aws-vpc"),
    "gce": LabSpec("gce"),
    "ali-vpc": LabSpec("ali-vpc"),
    "alloc": LabSpec("alloc"),
    "ipip": LabSpec("ipip"),
}


def skip_reason(key: str) -> str:
    """Why a lab cannot run on this machine ("" when it can)."""
    backend = LABS[key].backend
    if backend == "wireguard" and shutil.which("wireguard-go") is None:
        return "needs wireguard-go"
    if backend == "ipsec":
        from flannel.ipsec import charon

        if not any(shutil.which(p) for p in charon.SEARCH) or not _importable("vici"):
            return "needs strongSwan's charon and the vici package"
    if backend == "aws-vpc" and not (_importable("moto") and _importable("boto3")):
        return "needs moto[server] and boto3"
    if backend == "ipip" and not Path("/sys/module/ipip").exists():
        return ("this kernel has no ipip module (none can be loaded here): the ipip lab runs "
                "in a VM lane")
    return ""


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# -- the lab as the situations and the tools see it ---------------------------------------------

@dataclass
class Matrix:
    """A running lab of ``spec``: its nodes' pids, endpoint and helpers."""

    lab: object  # flannel_lab.cluster.Lab (the lab is imported only by the lab tests)
    spec: LabSpec

    @property
    def endpoint(self) -> str:
        return str(self.lab.state.etcd_endpoint)  # type: ignore[attr-defined]

    def ns(self, index: int) -> str:
        return str(self.lab.node_ns(index))  # type: ignore[attr-defined]

    def node(self, index: int) -> object:
        return self.lab.node(index)  # type: ignore[attr-defined]

    def address(self, index: int, v6: bool = False) -> str:
        node = self.node(index)
        return str(node.address6 if v6 else node.address)  # type: ignore[attr-defined]

    def run_in(self, index: int, *argv: str, check: bool = True,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["ip", "netns", "exec", self.ns(index), *argv],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in n{index}: {proc.stderr.strip()}")
        return proc

    def ul(self, *argv: str) -> None:
        subprocess.run(["ip", "-n", str(self.lab.underlay_ns), *argv],  # type: ignore[attr-defined]
                       check=True, capture_output=True, timeout=20)

    def freeze(self, index: int) -> None:
        os.kill(self.node(index).pid, signal.SIGSTOP)  # type: ignore[attr-defined]

    def thaw(self, index: int) -> None:
        os.kill(self.node(index).pid, signal.SIGCONT)  # type: ignore[attr-defined]

    def doctor(self, index: int) -> tuple[int, list[dict[str, str]]]:
        node = self.node(index)
        proc = self.run_in(index, *FLANNELCTL, "doctor", "--json",
                           f"--etcd-endpoints={self.endpoint}",
                           f"--subnet-file={node.subnet_file}",  # type: ignore[attr-defined]
                           f"--probe-timeout={PROBE_TIMEOUT}",
                           # The matrix holds the tools' own probes, not flanneld's results.
                           "--max-age=0", check=False)
        assert proc.stderr == "", proc.stderr
        doc = json.loads(proc.stdout)
        assert doc["healthy"] == (proc.returncode == 0)
        return proc.returncode, doc["findings"]

    def check(self, index: int = 1) -> dict[str, object]:
        node = self.node(index)
        proc = self.run_in(index, *FLANNELCTL, "check", "--json",
                           f"--etcd-endpoints={self.endpoint}",
                           f"--subnet-file={node.subnet_file}",  # type: ignore[attr-defined]
                           "--count=2", "--interval=0.1", f"--timeout={PROBE_TIMEOUT}",
                           "--max-age=0", check=False)
        assert proc.stderr == "", proc.stderr
        doc: dict[str, object] = json.loads(proc.stdout)
        return doc

    def row(self, doc: dict[str, object], peer: int, family: int) -> dict[str, object]:
        """check's row for the pair n1 -> ``peer`` in ``family`` ({} if none)."""
        return row_of(doc, self.address(peer), family)

    def verdict(self, doc: dict[str, object], peer: int, family: int) -> str:
        """check's verdict for the pair ("no row" if none, "error" if check refused)."""
        return verdict_of(doc, self.address(peer), family)

    def refused(self, index: int) -> dict[str, str]:
        """Lease key -> kind of what node ``index``'s flanneld refuses now (its /status)."""
        proc = self.run_in(index, *FLANNELCTL, "status", "--json", check=False)
        peers = json.loads(proc.stdout).get("peers") or {} if proc.stdout else {}
        return dict(peers.get("refused_kinds") or {})

    def healthy(self, peer: int, v6: bool, timeout: float = 30.0) -> None:
        """Wait until n1 and ``peer`` reach each other over the overlay again (after undo)."""
        from tests.support.waiting import wait_until

        if self.spec.backend == "alloc":
            return
        lab = self.lab
        for a, b in ((1, peer), (peer, 1)):
            wait_until(lambda a=a, b=b: lab.ping(a, b, within=1.0)  # type: ignore[attr-defined]
                       and (not v6 or lab.ping(a, b, v6=True, within=1.0)),  # type: ignore
                       timeout, interval=0.2, what=f"n{a} reaching n{b} again")


def row_of(doc: dict[str, object], address: str, family: int = 4) -> dict[str, object]:
    """check's row for the lease of ``address`` in ``family`` ({} if none)."""
    rows = doc.get("peers")
    for row in rows if isinstance(rows, list) else []:
        if (row.get("node_ip") or row.get("public_ip")) == address \
                and row.get("family", 4) == family:
            return dict(row)
    return {}


def verdict_of(doc: dict[str, object], address: str, family: int = 4) -> str:
    """check's verdict for the lease of ``address`` ("no row" if none, "error" if check
    refused)."""
    row = row_of(doc, address, family)
    return str(row["verdict"]) if row else "no row" if "error" not in doc else "error"


# -- situations -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Situation:
    """Something made wrong (or right) on purpose; ``apply`` and ``undo`` take the lab and
    the cell. ``frozen``: n1's flanneld is paused (SIGSTOP) meanwhile, so what is deleted
    behind its back stays for doctor to see. ``lease``: the public IP of the lease it
    writes ("" for none)."""

    title: str
    apply: Callable[[Matrix, Cell], None]
    undo: Callable[[Matrix, Cell], None]
    frozen: bool = False
    #: The public IP of the lease the situation writes ("" for none): check's row for it is
    #: asserted too (``Cell.lease``).
    lease: str = ""


def _nothing(_m: Matrix, _c: Cell) -> None:
    """Nothing to make or undo."""


RESERVED = "10.244.250.0/24"
RESERVED_FOR = "192.168.111.99"


def _reserve(m: Matrix, _c: Cell) -> None:
    m.run_in(1, *FLANNELCTL, "leases", "reserve", RESERVED, f"--public-ip={RESERVED_FOR}",
             f"--etcd-endpoints={m.endpoint}")


def _release(m: Matrix, _c: Cell) -> None:
    m.run_in(1, *FLANNELCTL, "leases", "release", RESERVED, "--yes",
             f"--etcd-endpoints={m.endpoint}")


#: The UDP ports (and IP protocols) each backend's traffic crosses the underlay on.
#: (wireguard's IPv6 device listens on 51821 of its own.)
PORTS = {("vxlan", 4): [8472], ("vxlan", 6): [8472], ("udp", 4): [8285],
         ("wireguard", 4): [51820], ("wireguard", 6): [51821], ("ipsec", 4): [500, 4500]}
TABLE = "mtx"


def _nft_drop(where: str, family: str) -> Callable[[Matrix, Cell], None]:
    def apply(m: Matrix, c: Cell) -> None:
        index = 1 if where == "own" else c.peer
        m.run_in(index, "nft", "add", "table", family, TABLE)
        m.run_in(index, "nft", "add", "chain", family, TABLE, "input",
                 "{ type filter hook input priority 0 ; }")
        for port in PORTS[(m.spec.backend, c.family)]:
            m.run_in(index, "nft", "add", "rule", family, TABLE, "input", "udp", "dport",
                     str(port), "drop")
    return apply


def _nft_undo(where: str, family: str) -> Callable[[Matrix, Cell], None]:
    def undo(m: Matrix, c: Cell) -> None:
        m.run_in(1 if where == "own" else c.peer, "nft", "delete", "table", family, TABLE)
    return undo


def _iptables(where: str, verb: str, version: int) -> Callable[[Matrix, Cell], None]:
    tool = "ip6tables-legacy" if version == 6 else "iptables-legacy"

    def run(m: Matrix, c: Cell) -> None:
        for port in PORTS[(m.spec.backend, c.family)]:
            m.run_in(1 if where == "own" else c.peer, tool, "-w", "5", verb, "INPUT", "-p",
                     "udp", "--dport", str(port), "-j", "DROP")
    return run


def _link(state: str) -> Callable[[Matrix, Cell], None]:
    def run(m: Matrix, c: Cell) -> None:
        m.ul("link", "set", f"n{c.peer}", state)
    return run


def _v6_cut(m: Matrix, c: Cell) -> None:
    m.run_in(c.peer, "nft", "add", "table", "ip6", TABLE)
    m.run_in(c.peer, "nft", "add", "chain", "ip6", TABLE, "input",
             "{ type filter hook input priority 0 ; policy drop ; }")


def _mtu(value: str) -> Callable[[Matrix, Cell], None]:
    def run(m: Matrix, c: Cell) -> None:
        m.ul("link", "set", f"n{c.peer}", "mtu", value)
    return run


#: The device that carries pods' packets, per backend, and the MTU the cell gives it.
DEVICE = {"udp": "flannel0", "wireguard": "flannel-wg", "ipsec": "ipsec0", "vxlan": "flannel.1"}
NARROW = 1300
_saved_mtu: dict[str, str] = {}


def _narrow_device(m: Matrix, _c: Cell) -> None:
    device = DEVICE[m.spec.backend]
    link = json.loads(m.run_in(1, "ip", "-j", "link", "show", device).stdout)[0]
    _saved_mtu[m.ns(1)] = str(link["mtu"])
    m.run_in(1, "ip", "link", "set", device, "mtu", str(NARROW))


def _widen_device(m: Matrix, _c: Cell) -> None:
    # flanneld puts its own devices' MTU back; charon's ipsec0 is put back here.
    m.run_in(1, "ip", "link", "set", DEVICE[m.spec.backend], "mtu", _saved_mtu.pop(m.ns(1)))


def _peer_subnet(m: Matrix, peer: int, v6: bool = False) -> str:
    env = m.lab.wait_subnet_env(peer)  # type: ignore[attr-defined]
    import ipaddress

    return str(ipaddress.ip_network(env["FLANNEL_IPV6_SUBNET" if v6 else "FLANNEL_SUBNET"],
                                    strict=False))


def _route_del(m: Matrix, c: Cell) -> None:
    backend = m.spec.backend
    if backend in ("udp", "wireguard"):  # one route over the Network carries every peer
        m.run_in(1, "ip", *(["-6"] if c.family == 6 else []), "route", "del",
                 "fd00:10:244::/56" if c.family == 6 else "10.244.0.0/16")
        return
    m.run_in(1, "ip", "route", "del", _peer_subnet(m, c.peer, c.family == 6))


def _neigh_del(m: Matrix, c: Cell) -> None:
    m.run_in(1, "ip", "neigh", "del", _peer_subnet(m, c.peer).split("/")[0], "dev",
             "flannel.1")


def _fdb_del(m: Matrix, c: Cell) -> None:
    lines = m.run_in(1, "bridge", "fdb", "show", "dev", "flannel.1").stdout.splitlines()
    peer = m.address(c.peer)
    mac = next(line.split()[0] for line in lines if f"dst {peer} " in line)
    m.run_in(1, "bridge", "fdb", "del", mac, "dev", "flannel.1", "dst", peer, "self")


def _flanneld_root(m: Matrix, index: int) -> Path:
    return Path(f"/proc/{m.node(index).pid}/root")  # type: ignore[attr-defined]


def _wg_peer_del(m: Matrix, c: Cell) -> None:
    from flannel.wireguard.uapi import DeviceUpdate, PeerUpdate, UapiControl

    control = UapiControl(_flanneld_root(m, 1) / "run" / "wireguard" / "flannel-wg.sock")
    peer_ip = m.address(c.peer)
    key = next(key for key, state in control.get().peers.items()
               if (state.peer.endpoint or "").startswith(f"{peer_ip}:"))
    control.set(DeviceUpdate(peers=(PeerUpdate(key, remove=True),)))


def _ike_sa_del(m: Matrix, c: Cell) -> None:
    from flannel.ipsec.charon import VICI_SOCKET, Charon, CharonSpec

    charon = Charon(CharonSpec(libipsec=False,
                               socket_path=_flanneld_root(m, 1) / "run" / VICI_SOCKET.name))
    peer_ip = m.address(c.peer)
    with charon.session() as vici:
        names = [name for sa in vici.list_sas() for name in sa
                 if str(name).endswith(f"-{peer_ip}")]
        for name in names:
            for _ in vici.terminate({"ike": name, "timeout": -1}):
                pass


def _vpc_route_del(m: Matrix, c: Cell) -> None:
    """Delete the peer's route from the VPC's route table (the lab's EC2, moto), the peer's
    flanneld frozen so it does not put it back at once."""
    import boto3

    from flannel.kernel.host import Host
    from flannel_lab.awscloud import LAB_KEY_ID, LAB_SECRET, REGION
    from flannel_lab.cluster import sysctl

    cloud = json.loads((Path(m.lab.directory) / "cloud.json").read_text())  # type: ignore
    ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=cloud["ec2_url"],
                       aws_access_key_id=LAB_KEY_ID, aws_secret_access_key=LAB_SECRET)
    m.freeze(c.peer)
    # The router answers every echo for the deleted route with "network unreachable": not
    # rate-limited, so flanneld's own probes of the peer do not use up the errors the
    # tools' echoes get.
    underlay = str(m.lab.underlay_ns)  # type: ignore[attr-defined]
    sysctl(underlay, "net.ipv4.icmp_ratelimit", "0")
    with Host(underlay).entered():
        # The lab's cloud serves in the underlay namespace only.
        ec2.delete_route(RouteTableId=cloud["route_table"],
                         DestinationCidrBlock=_peer_subnet(m, c.peer))
    from flannel_lab import vpcrouter
    from tests.support.waiting import wait_until

    wait_until(lambda: _peer_subnet(m, c.peer) not in vpcrouter.installed(
        str(m.lab.underlay_ns)), 10, interval=0.1,  # type: ignore[attr-defined]
        what="the VPC router following the deletion")


#: A lease the situations write, from an address of the underlay no node holds.
LEASE_SUBNET, LEASE_KEY = "10.244.251.0/24", "10.244.251.0-24"
THIEF = "192.168.111.66"
OFF_SEGMENT = "192.168.200.5"


def _put_lease(m: Matrix, public_ip: str, data: object) -> None:
    value = {"PublicIP": public_ip, "PublicIPv6": None, "BackendType": m.spec.backend}
    if data is not None:
        value["BackendData"] = data
    m.lab.etcdctl("put", f"{ETCD_PREFIX}/subnets/{LEASE_KEY}",  # type: ignore[attr-defined]
                  json.dumps(value, separators=(",", ":")))


def _delete_lease(m: Matrix, _c: Cell) -> None:
    m.lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{LEASE_KEY}")  # type: ignore[attr-defined]


def _refused_on(m: Matrix, nodes: tuple[int, ...], kind: str) -> None:
    """Wait until flanneld on each of ``nodes`` refuses the lease, as ``kind``."""
    from tests.support.waiting import wait_until

    for index in nodes:
        wait_until(lambda i=index: m.refused(i).get(LEASE_KEY) == kind, 20, interval=0.2,
                   what=f"n{index}'s flanneld refusing {LEASE_KEY} ({kind})")


def _hijack(m: Matrix, _c: Cell) -> None:
    """A lease with n1's backend data (its VTEP MAC, its WireGuard key) from another
    address."""
    own = json.loads(m.lab.leases()[m.lab.lease_key(1)])  # type: ignore[attr-defined]
    _put_lease(m, THIEF, own["BackendData"])
    _refused_on(m, (1, 2), "identity_taken")


def _zero_mac(m: Matrix, _c: Cell) -> None:
    _put_lease(m, THIEF, {"VNI": 1, "VtepMAC": "00:00:00:00:00:00"})
    _refused_on(m, (1,), "invalid_data")


def _off_segment(m: Matrix, _c: Cell) -> None:
    _put_lease(m, OFF_SEGMENT, None)
    _refused_on(m, (1,), "kernel_refused")


def _restart_n1(*extra: str) -> Callable[[Matrix, Cell], None]:
    """n1's flanneld started again with its lab flags and ``extra`` ones."""
    def run(m: Matrix, _c: Cell) -> None:
        m.lab.stop_flanneld(1)  # type: ignore[attr-defined]
        m.lab.start_flanneld(1, "--ip-masq", *extra)  # type: ignore[attr-defined]
        m.lab.wait_subnet_env(1)  # type: ignore[attr-defined]
        from tests.support.waiting import wait_until

        wait_until(lambda: m.run_in(1, *FLANNELCTL, "status", check=False).returncode == 0,
                   30, interval=0.2, what="n1's flanneld ready again")
    return run


def _thaw_peer(m: Matrix, c: Cell) -> None:
    m.thaw(c.peer)


def _vpc_route_back(m: Matrix, c: Cell) -> None:
    """The peer's flanneld puts its route back; the router's ICMP rate limit is the
    kernel's default again (1000 ms)."""
    from flannel_lab.cluster import sysctl

    sysctl(str(m.lab.underlay_ns), "net.ipv4.icmp_ratelimit", "1000")  # type: ignore[attr-defined]
    _thaw_peer(m, c)


def _stop_peer(m: Matrix, c: Cell) -> None:
    m.lab.stop_flanneld(c.peer)  # type: ignore[attr-defined]


def _start_peer(m: Matrix, c: Cell) -> None:
    m.lab.start_flanneld(c.peer)  # type: ignore[attr-defined]
    m.lab.wait_subnet_env(c.peer)  # type: ignore[attr-defined]


def _revoke(m: Matrix, _c: Cell) -> None:
    from tests.support.waiting import wait_until

    key = m.lab.lease_key(1)  # type: ignore[attr-defined]
    for stored in m.lab.leases():  # type: ignore[attr-defined]
        if stored == key or stored.startswith(f"{key}&"):
            m.lab.etcdctl("del", f"{ETCD_PREFIX}/subnets/{stored}")  # type: ignore
    # flanneld says "Lease has been revoked. Shutting down daemon." and exits, as Go's.
    wait_until(lambda: not m.lab.flanneld_running(1), 20, interval=0.1,  # type: ignore
               what="n1's flanneld leaving after its lease was revoked")


def _restart_own(m: Matrix, _c: Cell) -> None:
    m.lab.stop_flanneld(1)  # type: ignore[attr-defined]
    Path(m.node(1).subnet_file).unlink(missing_ok=True)  # type: ignore[attr-defined]
    m.lab.start_flanneld(1)  # type: ignore[attr-defined]
    m.lab.wait_subnet_env(1)  # type: ignore[attr-defined]
    m.lab.attach_pod_bridge(1)  # type: ignore[attr-defined]


SITUATIONS: dict[str, Situation] = {
    "healthy": Situation("healthy", _nothing, _nothing),
    "reservation": Situation(f"a reservation in the store (`leases reserve {RESERVED} "
                             f"--public-ip={RESERVED_FOR}`)", _reserve, _release),
    "peer-port-nft": Situation("the peer drops the carrier's ports (nftables)",
                               _nft_drop("peer", "inet"), _nft_undo("peer", "inet")),
    "peer-port-iptables": Situation("the peer drops the carrier's ports (iptables-legacy)",
                                    _iptables("peer", "-A", 4), _iptables("peer", "-D", 4)),
    "own-port-nft": Situation("n1 drops the carrier's ports (nftables)",
                              _nft_drop("own", "inet"), _nft_undo("own", "inet")),
    "own-port-iptables": Situation("n1 drops the carrier's ports (iptables-legacy)",
                                   _iptables("own", "-A", 4), _iptables("own", "-D", 4)),
    "peer-port-v6": Situation("the peer drops the carrier's ports over IPv6 only (nftables "
                              "ip6)", _nft_drop("peer", "ip6"), _nft_undo("peer", "ip6")),
    "own-port-v6": Situation("n1 drops the carrier's ports over IPv6 only (ip6tables-legacy)",
                             _iptables("own", "-A", 6), _iptables("own", "-D", 6)),
    "underlay-cut": Situation("the underlay to the peer is cut (its bridge port down)",
                              _link("down"), _link("up")),
    "underlay-v6-cut": Situation("the peer drops all IPv6 (the IPv4 half works)", _v6_cut,
                                 _nft_undo("peer", "ip6")),
    "underlay-mtu": Situation("the underlay to the peer carries 1400 bytes, not 1500",
                              _mtu("1400"), _mtu("1500")),
    "device-mtu": Situation(f"n1's device carrying pods' packets set to MTU {NARROW} "
                            "(flanneld frozen)", _narrow_device, _widen_device, frozen=True),
    "route-deleted": Situation("n1's route to the peer deleted (flanneld frozen)", _route_del,
                               _nothing, frozen=True),
    "neighbour-deleted": Situation("n1's neighbour entry of the peer's VTEP deleted",
                                   _neigh_del, _nothing, frozen=True),
    "fdb-deleted": Situation("n1's FDB entry of the peer's VTEP deleted", _fdb_del, _nothing,
                             frozen=True),
    "wg-peer-deleted": Situation("n1's WireGuard peer for the peer deleted", _wg_peer_del,
                                 _nothing, frozen=True),
    "ike-sa-deleted": Situation("n1's IKE SA (and its CHILD_SA) with the peer terminated",
                                _ike_sa_del, _nothing, frozen=True),
    "vpc-route-deleted": Situation("the peer's route deleted from the VPC's route table (its "
                                   "flanneld frozen)", _vpc_route_del, _vpc_route_back),
    "peer-stopped": Situation("the peer's flanneld stopped (SIGTERM: it leaves its state)",
                              _stop_peer, _start_peer),
    "lease-revoked": Situation("n1's lease deleted from the store (flanneld exits)", _revoke,
                               _restart_own),
    "identity-hijack": Situation(f"a lease claiming n1's identity (VTEP MAC, WireGuard key) "
                                 f"from {THIEF}", _hijack, _delete_lease, lease=THIEF),
    "zero-mac": Situation(f"a lease with a zero VtepMAC (from {THIEF})", _zero_mac,
                          _delete_lease, lease=THIEF),
    "off-segment": Situation(f"a lease whose PublicIP {OFF_SEGMENT} is off the segment "
                             "(the kernel refuses its route: parked)", _off_segment,
                             _delete_lease, lease=OFF_SEGMENT),
    "pod-encap-off": Situation("n1's flanneld run with --drop-pod-encap=false",
                               _restart_n1("--drop-pod-encap=false"), _restart_n1()),
}


@dataclass(frozen=True)
class Cell:
    """One situation in one lab and what the tools must answer: doctor on ``node`` exits
    ``rc`` and its first finding is of check ``first`` ("" when nothing is wrong: no error,
    no warning) holding every text of ``says`` ({peer}, {peer6}, {subnet} are filled in);
    ``check`` on n1 gives the pair n1 -> ``peer`` the verdict ``verdict`` in ``family``, and
    the row of the lease the situation writes the verdict ``lease``."""

    lab: str
    situation: str
    rc: int = 0
    first: str = ""
    says: tuple[str, ...] = ()
    verdict: str = "ok"
    node: int = 1
    peer: int = 2
    family: int = 4
    lease: str = ""

    @property
    def id(self) -> str:
        return (f"{self.lab}:{self.situation}" + (f":n{self.peer}" if self.peer != 2 else "")
                + (f":on-n{self.node}" if self.node != 1 else ""))


def _cells() -> list[Cell]:
    cells = []

    def add(lab: str, situation: str, rc: int = 0, first: str = "",
            says: tuple[str, ...] = (), verdict: str = "ok", **kw: Any) -> None:
        cells.append(Cell(lab, situation, rc, first, says, verdict, **kw))

    firewall_own = ("this node's own firewall drops UDP",)
    for lab in ("vxlan", "udp", "wireguard"):
        port = {"vxlan": "8472", "udp": "8285", "wireguard": "51820"}[lab]
        add(lab, "healthy")
        reserved = ("reservation",) if lab == "udp" else ()
        if lab == "udp":  # Go's udp routes a reservation to its node: which is not up
            add(lab, "reservation", 1, "underlay", (RESERVED_FOR, "does not answer on the "
                                                    "underlay", "a reservation"), "ok")
        else:
            add(lab, "reservation", 0, "", reserved)
        add(lab, "peer-port-nft", 1, "encap", ("{peer}", f"UDP {port}", "a firewall drops it"),
            "timeout")
        add(lab, "peer-port-iptables", 1, "encap", ("{peer}", f"UDP {port}"), "timeout")
        add(lab, "own-port-nft", 1, "firewall",
            (*firewall_own, f"nftables table inet {TABLE} chain input",
             f"udp dport {port} drop"), "timeout")
        add(lab, "own-port-iptables", 1, "firewall",
            (*firewall_own, "iptables-legacy table filter chain INPUT",
             f"--dport {port} -j DROP"), "timeout")
        add(lab, "underlay-cut", 1, "underlay", ("{peer}", "does not answer on the underlay"),
            "timeout")
        add(lab, "underlay-mtu", 1, "path-mtu", ("{peer}", "does not carry 1500-byte"), "ok")
        add(lab, "route-deleted", 1, "routes", ("no route to",), "not-programmed")
        add(lab, "device-mtu", 1, "mtu", ("pods get MTU", f"carries {NARROW}"), "ok")
        if lab == "vxlan":
            add(lab, "neighbour-deleted", 1, "neighbours", ("{subnet0}", "is missing"),
                "not-programmed")
            add(lab, "fdb-deleted", 1, "fdb", ("no FDB entry", "{peer}"), "not-programmed")
            # The peer's data path outlives its flanneld: n1 is healthy, doctor on the peer
            # names the cause.
            add(lab, "peer-stopped", 1, "flanneld", ("is not running",), "ok", node=2)
        if lab == "wireguard":
            add(lab, "wg-peer-deleted", 1, "engine", ("WireGuard peer", "{peer}", "missing"),
                "not-programmed")
            # wireguard-go outlives flanneld, with its peers.
            add(lab, "peer-stopped", 1, "flanneld", ("is not running",), "ok", node=2)
        if lab == "udp":
            add(lab, "peer-stopped", 1, "encap", ("{peer}", "nothing listens on UDP 8285"),
                "timeout")
        add(lab, "lease-revoked", 1, "flanneld", ("is not running",), "error")
        if lab != "udp":  # udp leases publish no identity
            # Refused on every node with flanneld's words; the victim's pair is unharmed.
            identity = "VtepMAC" if lab == "vxlan" else "PublicKey"
            add(lab, "identity-hijack", 1, "identity", (THIEF, identity, "is this node's own"),
                "ok", lease="skipped")
            add(lab, "identity-hijack", 1, "identity",
                (THIEF, identity, "belongs to the older lease", "(public IP {n1})"), "ok",
                node=2, lease="skipped")
        if lab == "vxlan":
            add(lab, "zero-mac", 1, "skipped", (THIEF, "VtepMAC 00:00:00:00:00:00 is zero"),
                "ok", lease="skipped")
            # Off by choice: a note, not a fault; on (every other cell), flanneld's own drop
            # is no firewall dropping the carrier.
            add(lab, "pod-encap-off", 0, "", ("pods on this node may send VXLAN (UDP 8472)",))
    # ipsec: charon keeps its SAs and runs on when flanneld stops.
    add("ipsec", "healthy")
    add("ipsec", "reservation", 0, "", ("reservation",))
    add("ipsec", "peer-port-nft", 1, "encap", ("{peer}", "UDP 500, 4500"), "timeout")
    add("ipsec", "peer-port-iptables", 1, "encap", ("{peer}", "UDP 500, 4500"), "timeout")
    add("ipsec", "own-port-nft", 1, "firewall",
        (*firewall_own, f"nftables table inet {TABLE} chain input", "udp dport 500 drop"),
        "timeout")
    add("ipsec", "own-port-iptables", 1, "firewall",
        (*firewall_own, "iptables-legacy table filter chain INPUT", "--dport 500 -j DROP"),
        "timeout")
    add("ipsec", "underlay-cut", 1, "underlay", ("{peer}",), "timeout")
    add("ipsec", "underlay-mtu", 1, "path-mtu", ("{peer}", "does not carry 1500-byte"), "ok")
    add("ipsec", "ike-sa-deleted", 1, "engine", ("IKE SA", "{peer}"), "not-programmed")
    add("ipsec", "device-mtu", 1, "mtu", ("pods get MTU", f"ipsec0 carries {NARROW}"), "ok")
    add("ipsec", "peer-stopped", 1, "flanneld", ("is not running",), "ok", node=2)
    add("ipsec", "lease-revoked", 1, "flanneld", ("is not running",), "error")
    # host-gw: plain routing, no carrier of its own.
    add("host-gw", "healthy")
    add("host-gw", "reservation", 0, "", ("reservation",))
    add("host-gw", "underlay-cut", 1, "underlay", ("{peer}",), "timeout")
    add("host-gw", "underlay-mtu", 1, "path-mtu", ("{peer}", "does not carry 1500-byte"), "ok")
    add("host-gw", "route-deleted", 1, "routes", ("no route to {subnet}",), "not-programmed")
    add("host-gw", "peer-stopped", 1, "flanneld", ("is not running",), "ok", node=2)
    add("host-gw", "lease-revoked", 1, "flanneld", ("is not running",), "error")
    # flanneld parks it (its /status says why): named so, not as a missing route.
    add("host-gw", "off-segment", 1, "parked", (OFF_SEGMENT, "parked by flanneld",
                                                "Network is unreachable"), "ok", lease="parked")
    # DirectRouting: n2 shares n1's segment (a direct route only), n3 is reached by VXLAN.
    add("vxlan-dr", "healthy")
    add("vxlan-dr", "healthy", peer=3)
    add("vxlan-dr", "route-deleted", 1, "routes", ("no route to {subnet}",), "not-programmed")
    add("vxlan-dr", "fdb-deleted", 1, "fdb", ("no FDB entry", "{peer}"), "not-programmed",
        peer=3)
    add("vxlan-dr", "peer-port-nft", 1, "encap", ("{peer}", "UDP 8472"), "timeout", peer=3)
    add("vxlan-dr", "underlay-cut", 1, "underlay", ("{peer}",), "timeout")
    # DirectRouting over IPv6: n2 has a direct IPv6 route only, n3 the vxlan triple.
    add("vxlan-dr-dual", "healthy", family=6)
    add("vxlan-dr-dual", "healthy", peer=3, family=6)
    add("vxlan-dr-dual", "route-deleted", 1, "routes", ("no route to {subnet}",),
        "not-programmed", family=6)
    # Dual-stack: the IPv6 half cut alone is named over IPv6.
    for lab in ("vxlan-dual", "host-gw-dual", "wireguard-dual"):
        add(lab, "healthy", family=6)
        add(lab, "underlay-v6-cut", 1, "underlay", ("{peer6}", "over IPv6"), "timeout",
            family=6)
        add(lab, "route-deleted", 1, "routes", ("no route to",), "not-programmed", family=6)
        if lab != "host-gw-dual":
            port = "51821" if lab == "wireguard-dual" else "8472"
            add(lab, "peer-port-v6", 1, "encap", ("{peer6}", "over IPv6", f"UDP {port}"),
                "timeout", family=6)
            add(lab, "own-port-v6", 1, "firewall", (f"drops UDP {port}", "over IPv6",
                                                     "ip6tables-legacy"), "timeout", family=6)
    # extension: its own scripts (a vxlan) carry the pods, doctor cannot probe what.
    add("extension", "healthy", 0, "", ("not checked",))
    add("extension", "underlay-cut", 1, "underlay", ("{peer}",), "timeout")
    add("extension", "underlay-mtu", 1, "path-mtu", ("{peer}", "does not carry 1500-byte"),
        "ok")
    add("extension", "peer-stopped", 1, "flanneld", ("is not running",), "ok", node=2)
    # cloud routes: the VPC's router carries the pods.
    for lab in ("aws-vpc", "gce", "ali-vpc"):
        add(lab, "healthy", 0, "", ("not checked",))
        add(lab, "reservation", 1, "underlay", (RESERVED_FOR, "a reservation"), "ok")
        add(lab, "underlay-cut", 1, "underlay", ("{peer}",), "timeout")
        add(lab, "underlay-mtu", 1, "path-mtu", ("{peer}",), "ok")
    # Nothing of it is on the node: the overlay fails while the underlay answers.
    add("aws-vpc", "vpc-route-deleted", 1, "overlay", ("{peer}", "the VPC's route table"),
        "unreachable")
    add("alloc", "healthy", 0, "", ("not checked",), "no-data-path")
    # alloc takes every lease as its peers, and does nothing with them.
    add("alloc", "reservation", 0, "", (), "no-data-path")
    add("ipip", "healthy")
    return cells


CELLS = _cells()


def table() -> str:
    """The matrix as docs/operations.md shows it: a row per situation and outcome, the labs
    that give it in one cell."""
    groups: dict[tuple[str, str, int, str, str, int], list[str]] = {}
    for cell in CELLS:
        situation = SITUATIONS[cell.situation].title
        peer = f" (n1 -> n{cell.peer})" if cell.peer != 2 else ""
        verdict = cell.verdict.upper() if cell.verdict not in ("ok", "no-data-path") \
            else cell.verdict
        if cell.lease:
            verdict += f"; the lease: {cell.lease.upper()}"
        key = (situation + peer, "n1" if cell.node == 1 else f"n{cell.node}", cell.rc,
               cell.first or "-", verdict, cell.family)
        groups.setdefault(key, []).append(LABS[cell.lab].name)
    lines = ["| situation | labs | doctor on | exit | first finding | check n1 -> peer |",
             "|---|---|---|---|---|---|"]
    for (situation, node, rc, first, verdict, family), labs in groups.items():
        over = " (IPv6 row)" if family == 6 else ""
        lines.append(f"| {situation} | {', '.join(labs)} | {node} | {rc} | {first} | "
                     f"{verdict}{over} |")
    return "\n".join(lines)


def fill(text: str, m: Matrix, cell: Cell) -> str:
    """A ``says`` text with the cell's peer filled in."""
    return (text.replace("{peer6}", m.address(cell.peer, v6=True))
            .replace("{peer}", m.address(cell.peer)).replace("{n1}", m.address(1))
            .replace("{subnet0}", _peer_subnet(m, cell.peer).split("/")[0])
            .replace("{subnet}", _peer_subnet(m, cell.peer, cell.family == 6)))


def network_config(spec: LabSpec, lab: object) -> str:
    """The config ``flannel-lab up`` would write for the lab's options."""
    from flannel_lab.cli import network_config as lab_config

    options = types.SimpleNamespace(config=None, backend=spec.backend,
                                    direct_routing=spec.direct_routing, ipv6=spec.ipv6)
    return lab_config(options, lab)  # type: ignore[arg-type]
