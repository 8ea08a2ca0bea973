"""Which kernel events are drift (every kind of owned state, ours vs foreign), and which
routes of other protocols are adopted as ours, on synthetic states."""

from ipaddress import ip_network

import pytest

from flannel.kernel import rtnl
from flannel.kernel.events import KernelEvent
from flannel.kernel.reconcile import DesiredState, LinkState, adoptable, drift
from flannel.kernel.rtnl import Address, FdbEntry, Link, Neighbour, Route

VXLAN, ETH0, OTHER, CNI0 = 7, 2, 3, 5
BOOT, STATIC, KERNEL, BIRD = rtnl.RTPROT_BOOT, rtnl.RTPROT_STATIC, rtnl.RTPROT_KERNEL, 12
OURS = rtnl.RTPROT_FLANNEL
PERMANENT, REACHABLE, INCOMPLETE = rtnl.NUD_PERMANENT, 0x02, 0x01
SELF = rtnl.NTF_SELF
MAC = "0e:00:00:00:00:aa"

R1 = Route("10.5.1.0/24", "10.5.1.0", VXLAN, onlink=True)
R3 = Route("10.5.3.0/24", "192.168.1.3", ETH0)  # DirectRouting
N1 = Neighbour(VXLAN, "10.5.1.0", "0e:00:00:00:00:01")
F1 = FdbEntry(VXLAN, "0e:00:00:00:00:01", "192.168.1.1")
DESIRED = DesiredState(
    frozenset({R1, R3}), frozenset({N1}), frozenset({F1}), frozenset({VXLAN}),
    links=frozenset({LinkState(VXLAN, "flannel.1", 1450, MAC)}),
    addresses=frozenset({(VXLAN, "10.5.0.0/32")}),
    networks=(ip_network("10.5.0.0/16"), ip_network("fd00:5::/48")),
    local_subnets=(ip_network("10.5.0.0/24"), ip_network("fd00:5::/64")), underlay=ETH0)


def new(obj, protocol=0, state=0, flags=0):
    return KernelEvent(False, obj, protocol, state, flags)


def gone(obj, protocol=0, state=0, flags=0):
    return KernelEvent(True, obj, protocol, state, flags)


def route(dst, gateway=None, oif=VXLAN, **kwargs):
    return Route(dst, gateway, oif, **kwargs)


DRIFT_TABLE = [
    # routes: ours
    ("our route deleted", gone(R1, OURS), "route 10.5.1.0/24 deleted"),
    ("our own clean-up", gone(route("10.5.2.0/24", "10.5.2.0", onlink=True), OURS), ""),
    ("our own add", new(R1, OURS), ""),
    ("ours replaced with the same route by hand", new(R1, BOOT),
     "route 10.5.1.0/24 replaced by one of protocol 3"),
    ("ours replaced by a different route", new(route("10.5.1.0/24", "1.1.1.1", OTHER), BOOT),
     "route 10.5.1.0/24 changed (via 1.1.1.1 dev 3)"),
    ("direct route replaced", new(route("10.5.3.0/24", "192.168.1.99", ETH0), STATIC),
     "route 10.5.3.0/24 changed"),
    ("stray route of our protocol", new(route("172.31.0.0/24", "1.1.1.1", OTHER), OURS),
     "stray route 172.31.0.0/24 with our protocol"),
    # routes: adoptable (left by Go flannel or added by hand where a peer's would be)
    ("Go-style vxlan route on our device", new(route("10.5.9.0/24", "10.5.9.0", onlink=True),
                                                BOOT),
     "stray route 10.5.9.0/24 (protocol 3) for a subnet of the network"),
    ("netlink default protocol", new(route("10.5.9.0/24", "10.5.9.0", onlink=True), 0),
     "stray route 10.5.9.0/24 (protocol 0)"),
    ("link-scope route on our device", new(route("10.5.9.0/24"), STATIC),
     "stray route 10.5.9.0/24 (protocol 4)"),
    ("host-gw route on the external interface",
     new(route("10.5.9.0/24", "192.168.1.9", ETH0), BOOT), "stray route 10.5.9.0/24"),
    ("IPv6 route on our device", new(route("fd00:5:0:9::/64", "fd00:5:0:9::", onlink=True),
                                     BOOT), "stray route fd00:5:0:9::/64"),
    # routes: foreign, never touched
    ("competing route with another metric", new(route("10.5.1.0/24", "1.1.1.1", OTHER,
                                                      metric=100), BOOT), ""),
    ("outside the network on our device", new(route("172.16.0.0/24", "10.5.1.0", onlink=True),
                                              BOOT), ""),
    ("outside the network via the underlay", new(route("172.16.0.0/24", "192.168.1.1", ETH0),
                                                 BOOT), ""),
    ("the whole network", new(route("10.5.0.0/16"), BOOT), ""),
    ("wider than the network", new(route("10.0.0.0/8", "192.168.1.1", ETH0), BOOT), ""),
    ("our own subnet on our device", new(route("10.5.0.0/24"), BOOT), ""),
    ("a part of our own subnet", new(route("10.5.0.128/25", "192.168.1.1", ETH0), BOOT), ""),
    ("the pod bridge's connected route", new(route("10.5.0.0/24", oif=CNI0), KERNEL), ""),
    ("connected route on our device", new(route("10.5.9.0/24"), KERNEL), ""),
    ("a routing daemon's route on our device", new(route("10.5.9.0/24", "10.5.9.0",
                                                         onlink=True), BIRD), ""),
    ("network route on another device", new(route("10.5.9.0/24", "10.9.9.9", OTHER), BOOT),
     ""),
    ("network route on the underlay without a gateway", new(route("10.5.9.0/24", oif=ETH0),
                                                            BOOT), ""),
    ("IPv6 route outside the IPv6 network", new(route("fd00:6::/64", "fd00:6::", onlink=True),
                                                BOOT), ""),
    ("our blackhole", new(route("10.5.0.0/24", oif=0, kind=rtnl.RTN_BLACKHOLE, metric=4242),
                          OURS), ""),
    ("a blackhole in the network", new(route("10.5.9.0/24", oif=0, kind=rtnl.RTN_BLACKHOLE),
                                       BOOT), ""),
    ("a blackhole deleted", gone(route("10.5.0.0/24", oif=0, kind=rtnl.RTN_BLACKHOLE), OURS),
     ""),
    # neighbours
    ("our neighbour deleted", gone(N1, state=PERMANENT), "neighbour 10.5.1.0 deleted"),
    ("our own neighbour add", new(N1, state=PERMANENT), ""),
    ("neighbour MAC changed", new(Neighbour(VXLAN, "10.5.1.0", "0e:00:00:00:00:99"),
                                  state=PERMANENT),
     "neighbour 10.5.1.0 changed (0e:00:00:00:00:99)"),
    ("neighbour no longer permanent", new(N1, state=REACHABLE),
     "neighbour 10.5.1.0 changed (0e:00:00:00:00:01, not permanent)"),
    ("stray permanent neighbour", new(Neighbour(VXLAN, "10.5.9.0", "0e:00:00:00:00:09"),
                                      state=PERMANENT),
     "stray neighbour 10.5.9.0 on flannel.1"),
    ("kernel's resolution attempt", new(Neighbour(VXLAN, "10.5.9.0", ""), state=INCOMPLETE),
     ""),
    ("stale neighbour removed", gone(Neighbour(VXLAN, "10.5.9.0", "0e:00:00:00:00:09"),
                                     state=PERMANENT), ""),
    ("neighbour on another device", new(Neighbour(OTHER, "10.5.1.0", "0e:00:00:00:00:99"),
                                        state=PERMANENT), ""),
    # FDB entries
    ("our fdb entry deleted", gone(F1, state=PERMANENT, flags=SELF),
     "fdb entry 0e:00:00:00:00:01 deleted"),
    ("our own fdb add", new(F1, state=PERMANENT, flags=SELF), ""),
    ("fdb entry replaced with a wrong dst",
     new(FdbEntry(VXLAN, F1.mac, "192.168.1.99"), state=PERMANENT, flags=SELF),
     "fdb entry 0e:00:00:00:00:01 changed (dst 192.168.1.99)"),
    ("fdb entry given another port", new(FdbEntry(VXLAN, F1.mac, F1.dst, port=9999),
                                         state=PERMANENT, flags=SELF),
     "fdb entry 0e:00:00:00:00:01 changed"),
    ("fdb entry given another VNI", new(FdbEntry(VXLAN, F1.mac, F1.dst, vni=5),
                                        state=PERMANENT, flags=SELF),
     "fdb entry 0e:00:00:00:00:01 changed"),
    ("fdb entry no longer permanent", new(F1, state=REACHABLE, flags=SELF),
     "fdb entry 0e:00:00:00:00:01 changed (dst 192.168.1.1, not permanent)"),
    ("stray permanent fdb entry", new(FdbEntry(VXLAN, "0e:00:00:00:00:09", "192.168.1.9"),
                                      state=PERMANENT, flags=SELF),
     "stray fdb entry 0e:00:00:00:00:09 dst 192.168.1.9"),
    ("stray flood entry", new(FdbEntry(VXLAN, "00:00:00:00:00:00", "192.168.1.9"),
                              state=PERMANENT, flags=SELF), "stray fdb entry 00:00:00:00:00:00"),
    ("learned entry", new(FdbEntry(VXLAN, "0e:00:00:00:00:09", "192.168.1.9"),
                          state=REACHABLE, flags=SELF), ""),
    ("stale fdb entry removed", gone(FdbEntry(VXLAN, "0e:00:00:00:00:09", "192.168.1.9"),
                                     state=PERMANENT, flags=SELF), ""),
    ("fdb entry on another device", new(FdbEntry(OTHER, F1.mac, "192.168.1.99"),
                                        state=PERMANENT, flags=SELF), ""),
    # device attributes
    ("device deleted", gone(Link(VXLAN, "flannel.1", False)), "device flannel.1 deleted"),
    ("device down", new(Link(VXLAN, "flannel.1", False, 1450, MAC)), "device flannel.1 down"),
    ("device MTU changed", new(Link(VXLAN, "flannel.1", True, 1400, MAC)),
     "device flannel.1 MTU changed to 1400 (want 1450)"),
    ("device MAC changed", new(Link(VXLAN, "flannel.1", True, 1450, "02:11:22:33:44:55")),
     "device flannel.1 MAC changed to 02:11:22:33:44:55 (want 0e:00:00:00:00:aa)"),
    ("device renamed", new(Link(VXLAN, "vx0", True, 1450, MAC)),
     "device flannel.1 renamed to vx0"),
    ("device as we set it", new(Link(VXLAN, "flannel.1", True, 1450, MAC)), ""),
    ("another device down", new(Link(ETH0, "eth0", False, 1500, "02:00:00:00:00:01")), ""),
    ("our address removed", gone(Address(VXLAN, "10.5.0.0/32")),
     "address 10.5.0.0/32 removed from flannel.1"),
    ("our own address add", new(Address(VXLAN, "10.5.0.0/32")), ""),
    ("stray address in the network", new(Address(VXLAN, "10.5.7.1/24")),
     "stray address 10.5.7.1/24 on flannel.1"),
    ("the kernel's IPv6 link-local address", new(Address(VXLAN, "fe80::1/64")), ""),
    ("an address outside the network", new(Address(VXLAN, "172.16.0.1/32")), ""),
    ("an address on another device", new(Address(ETH0, "10.5.7.1/24")), ""),
    ("someone else's address removed", gone(Address(VXLAN, "10.5.7.1/24")), ""),
]


@pytest.mark.parametrize(("event", "expected"), [(e, x) for _, e, x in DRIFT_TABLE],
                         ids=[name for name, _, _ in DRIFT_TABLE])
def test_drift(event, expected):
    why = drift(DESIRED, event)
    if expected:
        assert why.startswith(expected), why
    else:
        assert why == ""


def test_a_device_whose_attributes_are_not_known_changes_on_any_event():
    coarse = DesiredState(devices=frozenset({VXLAN}))
    assert drift(coarse, new(Link(VXLAN, "flannel.1", True, 1450, MAC))) == \
        "device flannel.1 changed"


def test_before_the_first_pass_only_a_route_of_our_protocol_is_drift():
    drifting = [name for name, event, _ in DRIFT_TABLE if drift(DesiredState(), event)]
    assert drifting == ["our own add", "stray route of our protocol"]


ADOPTION_TABLE = [
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), BOOT, True),
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), rtnl.RTPROT_UNSPEC, True),
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), STATIC, True),
    (route("10.5.9.0/24", "192.168.1.9", ETH0), BOOT, True),
    (route("fd00:5:0:9::/64", "fd00::9", ETH0), BOOT, True),
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), OURS, False),  # ours anyway, not adopted
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), KERNEL, False),
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), rtnl.RTPROT_BOOT + 6, False),  # ra
    (route("10.5.9.0/24", "10.5.9.0", onlink=True), BIRD, False),
    (route("10.5.9.0/24", oif=ETH0), BOOT, False),
    (route("10.5.9.0/24", "10.9.9.9", OTHER), BOOT, False),
    (route("10.5.0.0/24", oif=CNI0), KERNEL, False),
    (route("10.5.0.0/24"), BOOT, False),
    (route("10.5.0.0/23", "192.168.1.9", ETH0), BOOT, False),  # covers our own subnet
    (route("10.5.0.0/16"), BOOT, False),
    (route("0.0.0.0/0", "192.168.1.1", ETH0), BOOT, False),
    (route("172.16.9.0/24", "10.5.9.0", onlink=True), BOOT, False),
    (route("10.5.9.0/24", oif=0, kind=rtnl.RTN_BLACKHOLE), BOOT, False),
    (route("fd00:5::/64", "fd00::9", ETH0), BOOT, False),  # our own IPv6 subnet
]


@pytest.mark.parametrize(("candidate", "protocol", "adopted"), ADOPTION_TABLE,
                         ids=[f"{r.dst}-dev{r.oif}-proto{p}" for r, p, _ in ADOPTION_TABLE])
def test_adoption_rule(candidate, protocol, adopted):
    assert adoptable(candidate, protocol, DESIRED) is adopted


def test_nothing_is_adopted_without_a_network():
    unbounded = DesiredState(devices=frozenset({VXLAN}), underlay=ETH0)
    assert not adoptable(route("10.5.9.0/24", "10.5.9.0", onlink=True), BOOT, unbounded)


def test_gateway_routes_are_not_adopted_without_an_external_interface():
    no_underlay = DesiredState(devices=frozenset({VXLAN}), networks=DESIRED.networks)
    assert not adoptable(route("10.5.9.0/24", "192.168.1.9", 0), BOOT, no_underlay)


def test_the_echo_of_our_own_entries_builds_no_index():
    # vxlan's FDB notifications carry no port id, so the kernel's echo of every entry a pass
    # adds (5000 at start) is checked here: it must not build and keep a second index of
    # the entries (0.8 MiB at 5000 peers) until the next pass.
    desired = DesiredState(frozenset({R1}), frozenset({N1}), frozenset({F1}),
                           frozenset({VXLAN}))
    assert drift(desired, new(F1, state=PERMANENT, flags=SELF)) == ""
    assert drift(desired, new(N1, state=PERMANENT)) == ""
    assert "_fdb_keys" not in desired.__dict__ and "_neighbour_keys" not in desired.__dict__
    # A foreign change does build it, and is still drift.
    moved = FdbEntry(VXLAN, F1.mac, "192.168.1.9")
    assert drift(desired, new(moved, state=PERMANENT, flags=SELF)).startswith(
        "fdb entry 0e:00:00:00:00:01 changed")
