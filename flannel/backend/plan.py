"""What flanneld does with each peer lease, said by the backend, for the operator tools.

A backend's ``describe(node, leases)`` (``flannel/backend/base.py``) answers, for this
node's network config and lease (a ``NodeView``) and a set of remote leases, with one
``Description``: per lease a ``PeerPlan`` (whether flanneld uses it, and if not why, by the
same admission as flanneld's; per IP family the routes, neighbours and FDB entries the
kernel holds for it, computed by the same functions its ``desired_state`` calls, the
entries of its other engines, which of its ``Carrier``s carries it across the underlay and
the address that answers on the overlay), and a ``NodePlan`` (the devices that carry pods'
packets, what each adds on the underlay, what this node's kernel cannot show, the carriers
peers reach it by). A backend declares its carriers once (``Backend.carriers``), and the
traffic rules read the same declaration. ``flannelctl doctor`` and ``check`` judge a node
from it alone: they never name a backend.

A declaration only: nothing here touches the kernel, the store or an engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

from flannel.config import NetworkConfig
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route
from flannel.lease import Lease

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
#: ``route_get(ip)``: the route the kernel would use for ``ip`` (None when unreachable).
RouteLookup = Callable[[IPAddress], Route | None]

@dataclass(frozen=True)
class NodeView:
    """This node as a backend's description is computed from: the network config, our own
    lease (None when the node holds none), the devices present (name -> ifindex), the
    external interface's index (0: unknown), our public addresses and a route lookup. In
    flanneld the backend's live state; in the operator tools, read from the kernel."""

    config: NetworkConfig
    own: Lease | None = None
    devices: Mapping[str, int] = field(default_factory=dict)
    underlay: int = 0
    public_ip: IPv4Address | None = None
    public_ipv6: IPv6Address | None = None
    route_get: RouteLookup = lambda _ip: None

    def device(self, name: str) -> int:
        """The index of device ``name`` (0 when it does not exist)."""
        return self.devices.get(name, 0)


@dataclass(frozen=True)
class Carrier:
    """What carries a backend's traffic between nodes, as the backend declares it once from
    the network config (``Backend.carriers``). ``name``: what carries it ("VXLAN",
    "WireGuard", "plain routing"...). ``udp_ports``: the UDP ports a node receives it on;
    ``ip_protocols``: IP protocol numbers besides UDP (4 IP-in-IP, 50 ESP); ``versions``: the
    IP versions of the underlay it arrives over. ``authenticated``: the receiver checks every
    packet against the sending peer's key (WireGuard, IPsec), so a forged one is refused
    whoever sends it. The traffic rules read every port and protocol of every carrier
    (``Encapsulation``); the operator tools what carries each peer and how to probe it:
    ``refuses``, nothing else answers a stray datagram on ``udp_ports``, so an ICMP
    port-unreachable says nothing listens there and silence from a host that answers ping
    says something drops it (else doctor says why it cannot tell, in ``unprobed``)."""

    name: str
    udp_ports: tuple[int, ...] = ()
    ip_protocols: tuple[int, ...] = ()
    refuses: bool = False
    unprobed: str = ""
    versions: tuple[int, ...] = ()
    authenticated: bool = False

    @property
    def ports_text(self) -> str:
        """"UDP 8472", "UDP 500, 4500 and IP protocol 50", "" for plain routing."""
        parts = []
        if self.udp_ports:
            parts.append("UDP " + ", ".join(str(p) for p in self.udp_ports))
        parts += [f"IP protocol {proto}" for proto in self.ip_protocols]
        return " and ".join(parts)


def injectable(carriers: Sequence[Carrier]) -> tuple[int, ...]:
    """The UDP ports on which any host of the underlay can put packets into the pods'
    network: those of the carriers that do not authenticate (what ``--encap-peers-only``
    filters)."""
    return tuple(sorted({port for carrier in carriers if not carrier.authenticated
                         for port in carrier.udp_ports}))


#: The underlay carries pods' packets as they are (host-gw, DirectRouting, a VPC's router).
PLAIN = Carrier("plain routing")


@dataclass(frozen=True)
class EngineEntry:
    """What an engine other than netlink holds for a peer: ``kind`` ("WireGuard peer",
    "IKE SA"), where (``place``: a device, "charon"), its identity ``key`` (a public key, a
    connection name) and the ``fields`` it must hold, as (name, value) text."""

    kind: str
    place: str
    key: str
    fields: tuple[tuple[str, str], ...] = ()

    @property
    def identity(self) -> tuple[str, str, str]:
        return self.kind, self.place, self.key


@dataclass(frozen=True)
class FamilyPlan:
    """One IP family of a peer lease. ``skipped``: why flanneld programs nothing for it
    ("" when it does). ``routes``, ``neighbours``, ``fdb``: what the kernel holds for it;
    ``engine``: what the backend's other engines hold. ``carrier``: how its packets cross
    the underlay. ``answers_on``: the peer's address that answers echoes over the overlay
    (None: none is known), reached from ours of the same kind (``NodePlan.local``)."""

    version: int
    subnet: IPNetwork
    public: IPAddress | None
    skipped: str = ""
    routes: frozenset[Route] = frozenset()
    neighbours: frozenset[Neighbour] = frozenset()
    fdb: frozenset[FdbEntry] = frozenset()
    engine: tuple[EngineEntry, ...] = ()
    carrier: Carrier = PLAIN
    answers_on: IPAddress | None = None


@dataclass(frozen=True)
class PeerPlan:
    """What flanneld does with one remote lease. ``skipped``: why it does not use it at all
    ("" when it does); ``reserved``: the lease is a reservation no node has taken yet (no
    node, nothing wrong); ``refused``: the kind of the backend's refusal, as flanneld's
    admission names it (``invalid_data``, ``identity_taken``: ``backend/admission.py``; ""
    when the lease is used, or is not the backend's at all)."""

    lease: Lease
    families: tuple[FamilyPlan, ...] = ()
    skipped: str = ""
    reserved: bool = False
    refused: str = ""

    @property
    def used(self) -> bool:
        return not self.skipped

    def family(self, version: int) -> FamilyPlan | None:
        return next((f for f in self.families if f.version == version), None)


@dataclass(frozen=True)
class DevicePlan:
    """A device that carries pods' packets to peers: ``name``, the IP ``version`` of the
    packets it carries, the bytes the backend adds on the underlay (``overhead``: the
    device's MTU plus it must fit the underlay's), whether flanneld keeps permanent
    neighbour and FDB entries on it (``entries``: a VTEP, which sends from the public
    address our lease publishes), the MAC our lease publishes for it ("" for none),
    whether the kernel wraps its packets in UDP itself (``udp_offload``: the outer checksum
    may be offloaded), and ``optional``: it exists only in some setups (its absence is no
    fault)."""

    name: str
    version: int
    overhead: int
    entries: bool = False
    mac: str = ""
    udp_offload: bool = False
    optional: bool = False


@dataclass(frozen=True)
class NodePlan:
    """This node's side. ``data_path``: the backend carries traffic between nodes.
    ``devices``: what carries pods' packets (none: the underlay itself, ``overhead`` bytes
    added). ``unjudged``: what this node's kernel cannot show ("" when it can). ``local``:
    our address of the kind peers answer on, per IP version, as the echoes' source.
    ``carriers``: what carries peers' traffic to this node (``Backend.carriers``)."""

    data_path: bool = True
    devices: tuple[DevicePlan, ...] = ()
    overhead: int = 0
    unjudged: str = ""
    local: Mapping[int, IPAddress] = field(default_factory=dict)
    carriers: tuple[Carrier, ...] = ()

    @property
    def injectable(self) -> tuple[int, ...]:
        """The UDP ports any host of the underlay can inject into the pods' network on."""
        return injectable(self.carriers)


@dataclass(frozen=True)
class Description:
    """A backend's answer for one node and a set of remote leases."""

    node: NodePlan
    peers: tuple[PeerPlan, ...] = ()


@dataclass(frozen=True)
class EngineReading:
    """What an engine holds now, read from this node (``Backend.read_engine``): the entries
    by identity, with per entry what they tell of the peer (``notes``: e.g. the age of its
    latest handshake); ``unread``: why nothing could be read ("" when read); ``problems``:
    (severity, what, fix) of the engine itself (a program missing or not answering)."""

    entries: Mapping[tuple[str, str, str], EngineEntry] = field(default_factory=dict)
    notes: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    unread: str = ""
    problems: tuple[tuple[str, str, str], ...] = ()


def base_address(subnet: IPNetwork) -> IPAddress:
    """The subnet's base address: what flanneld puts on a backend's device."""
    return subnet.network_address


def gateway_address(subnet: IPNetwork) -> IPAddress:
    """The subnet's first address: the ``cni0`` bridge's, the pods' gateway."""
    return subnet.network_address + 1


def family_subnet(lease: Lease, version: int) -> tuple[IPNetwork | None, IPAddress | None]:
    """(subnet, public address) of one IP family of a lease."""
    if version == 6:
        return lease.ipv6_subnet, lease.attrs.public_ipv6
    return lease.subnet, lease.attrs.public_ip


def versions(config: NetworkConfig) -> tuple[int, ...]:
    """The IP versions the network carries."""
    return tuple(v for v, on in ((4, config.enable_ipv4), (6, config.enable_ipv6)) if on)


def local_addresses(node: NodeView, on_base: bool) -> dict[int, IPAddress]:
    """Our own address of the kind peers answer on, per IP version."""
    pick = base_address if on_base else gateway_address
    own = node.own
    if own is None:
        return {}
    out: dict[int, IPAddress] = {}
    for version in versions(node.config):
        subnet, _ = family_subnet(own, version)
        if subnet is not None:
            out[version] = pick(subnet)
    return out
