"""Lease event normalisation (upstream LeaseWatcher, with snapshot diffing of changed attrs)."""

from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.lease import Event, EventType, Lease, LeaseAttrs
from flannel.subnet.watch import Changes, LeaseWatcher, Snapshot


def lease(third: int, ip: str = "", mac: str = "") -> Lease:
    return Lease(IPv4Network(f"10.1.{third}.0/24"),
                 attrs=LeaseAttrs(public_ip=IPv4Address(ip or f"192.168.0.{third}"),
                                  backend_type="vxlan",
                                  backend_data=f'{{"VtepMAC":"{mac}"}}' if mac else None))


OWN = lease(1, "192.168.0.1")


def test_own_lease_is_never_reported():
    watcher = LeaseWatcher(OWN)
    result = watcher.apply(Snapshot([OWN, lease(2)]))
    assert [e.lease.key for e in result.events] == ["10.1.2.0-24"]
    result = watcher.apply(Changes([Event(EventType.ADDED, OWN)]))
    assert result.events == [] and not result.own_lease_removed


def test_removal_carries_cached_attributes():
    watcher = LeaseWatcher(OWN)
    peer = lease(2, "192.168.0.2", mac="aa:bb:cc:dd:ee:ff")
    watcher.apply(Changes([Event(EventType.ADDED, peer)]))
    bare = Lease(IPv4Network("10.1.2.0/24"))
    result = watcher.apply(Changes([Event(EventType.REMOVED, bare)]))
    assert result.events == [Event(EventType.REMOVED, peer)]
    assert watcher.leases == []


def test_removal_of_unknown_lease_is_dropped():
    watcher = LeaseWatcher(OWN)
    result = watcher.apply(Changes([Event(EventType.REMOVED, lease(9))]))
    assert result.events == []


def test_snapshot_is_diffed_against_cache():
    watcher = LeaseWatcher(OWN)
    watcher.apply(Snapshot([OWN, lease(2), lease(3, mac="00:00:00:00:00:01")]))
    changed = lease(3, mac="00:00:00:00:00:02")
    result = watcher.apply(Snapshot([OWN, changed, lease(4)]))
    kinds = sorted((e.type.value, e.lease.key) for e in result.events)
    assert kinds == [("added", "10.1.3.0-24"), ("added", "10.1.4.0-24"),
                     ("removed", "10.1.2.0-24")]
    assert {x.key for x in watcher.leases} == {"10.1.3.0-24", "10.1.4.0-24"}


def test_unchanged_snapshot_yields_nothing():
    watcher = LeaseWatcher(OWN)
    watcher.apply(Snapshot([OWN, lease(2)]))
    assert watcher.apply(Snapshot([OWN, lease(2)])).events == []


def test_own_lease_removed_is_flagged():
    watcher = LeaseWatcher(OWN)
    watcher.apply(Snapshot([OWN]))
    result = watcher.apply(Changes([Event(EventType.REMOVED, Lease(OWN.subnet))]))
    assert result.own_lease_removed


def test_own_lease_missing_from_relist_is_flagged():
    watcher = LeaseWatcher(OWN)
    watcher.apply(Snapshot([OWN, lease(2)]))
    assert watcher.apply(Snapshot([lease(2)])).own_lease_removed


def test_a_node_gaining_an_ipv6_subnet_replaces_its_lease():
    from ipaddress import IPv6Address, IPv6Network

    watcher = LeaseWatcher(OWN)
    watcher.apply(Changes([Event(EventType.ADDED, lease(2))]))
    dual = Lease(IPv4Network("10.1.2.0/24"), IPv6Network("fd00:2::/64"),
                 attrs=LeaseAttrs(public_ip=IPv4Address("192.168.0.2"),
                                  public_ipv6=IPv6Address("fd00:ff::1")))
    watcher.apply(Changes([Event(EventType.ADDED, dual)]))
    assert watcher.leases == [dual]
    removed = watcher.apply(Changes([Event(EventType.REMOVED, Lease(IPv4Network("10.1.2.0/24"),
                                                                      IPv6Network(
                                                                          "fd00:2::/64")))]))
    assert removed.events == [Event(EventType.REMOVED, dual)] and watcher.leases == []



# -- the peer filter: only leases that fit the network reach a backend -------------------

def checked_config(text: str):
    from flannel.config import check_network_config, parse_config

    cfg = parse_config(text)
    check_network_config(cfg)
    return cfg


CONFIG = checked_config('{"Network": "10.1.0.0/16", "Backend": {"Type": "vxlan"}}')


def peer(key: str, ip: str | None = "192.168.0.9"):
    from flannel.lease import parse_subnet_key

    v4, v6 = parse_subnet_key(key)
    return Lease(v4, v6, LeaseAttrs(public_ip=IPv4Address(ip) if ip else None))


@pytest.mark.parametrize(("bad", "reason"), [
    (peer("192.168.111.0-25"), "subnet 192.168.111.0/25 lies outside the Network 10.1.0.0/16"),
    (peer("0.0.0.0-1"), "subnet 0.0.0.0/1 covers the whole Network 10.1.0.0/16"),
    (peer("10.1.0.0-16"), "subnet 10.1.0.0/16 covers the whole Network 10.1.0.0/16"),
    (peer("10.1.8.0-25"), "subnet 10.1.8.0/25 is not a /24 (SubnetLen)"),
    (peer("10.1.0.0-23"), "subnet 10.1.0.0/23 is not a /24 (SubnetLen)"),
    (peer("10.1.9.0-24", None), "PublicIP is missing or 0.0.0.0"),
    (peer("10.1.9.0-24", "127.0.0.1"), "PublicIP 127.0.0.1: it is a loopback address"),
    (peer("10.1.9.0-24", "224.0.0.1"), "PublicIP 224.0.0.1: it is a multicast address"),
    (peer("10.1.9.0-24", "169.254.3.3"), "PublicIP 169.254.3.3: it is a link-local address"),
    (peer("10.1.9.0-24", "255.255.255.255"),
     "PublicIP 255.255.255.255: it is the broadcast address"),
    # Routes to a pod address through the overlay itself: the kernel refuses them, or loops.
    (peer("10.1.9.0-24", "10.1.7.3"), "PublicIP 10.1.7.3: it lies inside the Network "
                                      "10.1.0.0/16: a node's address is no pod's"),
    # A udp lease naming this node: the forwarder sends the peer's traffic to itself.
    (peer("10.1.9.0-24", "192.168.0.1"), "PublicIP 192.168.0.1: it is this node's own: "
                                         "packets to that node would loop back here"),
])
def test_unusable_peer_never_reaches_the_backend_and_is_counted(bad, reason, caplog):
    watcher = LeaseWatcher(OWN, CONFIG)
    good = lease(2)
    result = watcher.apply(Snapshot([OWN, good, bad]))
    assert result.events == [Event(EventType.ADDED, good)]
    result = watcher.apply(Changes([Event(EventType.ADDED, bad)]))
    assert result.events == [] and watcher.leases == [good]
    assert watcher.skipped.total == 2
    assert watcher.skipped.current == {bad.key: reason}
    assert [r.getMessage() for r in caplog.records] == [f"ignoring peer lease {bad.key}: {reason}"]


def test_overlapping_our_subnet_is_skipped():
    own = Lease(IPv4Network("10.1.1.0/24"), attrs=LeaseAttrs(public_ip=IPv4Address("192.168.0.1")))
    cfg = checked_config('{"Network": "10.1.0.0/16", "SubnetLen": 24}')
    inside = Lease(IPv4Network("10.1.1.128/25"), attrs=LeaseAttrs(IPv4Address("192.168.0.5")))
    watcher = LeaseWatcher(own, None)
    assert watcher.apply(Snapshot([own, inside])).events == []
    assert watcher.skipped.current == {
        "10.1.1.128-25": "subnet 10.1.1.128/25 overlaps this node's subnet 10.1.1.0/24"}
    # With the config the length check comes first; the lease is refused either way.
    assert LeaseWatcher(own, cfg).apply(Snapshot([own, inside])).events == []


def test_reason_is_logged_again_only_when_it_changes(caplog):
    watcher = LeaseWatcher(OWN, CONFIG)
    for ip in ("127.0.0.1", "127.0.0.1", "224.0.0.1", "224.0.0.1"):
        watcher.apply(Changes([Event(EventType.ADDED, peer("10.1.9.0-24", ip))]))
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring peer lease 10.1.9.0-24: PublicIP 127.0.0.1: it is a loopback address",
        "ignoring peer lease 10.1.9.0-24: PublicIP 224.0.0.1: it is a multicast address"]
    assert watcher.skipped.total == 4


def test_a_peer_that_turns_bad_is_withdrawn_and_a_fixed_one_comes_back():
    watcher = LeaseWatcher(OWN, CONFIG)
    good = peer("10.1.9.0-24")
    watcher.apply(Changes([Event(EventType.ADDED, good)]))
    result = watcher.apply(Changes([Event(EventType.ADDED, peer("10.1.9.0-24", "0.0.0.0"))]))
    assert result.events == [Event(EventType.REMOVED, good)] and watcher.leases == []
    result = watcher.apply(Changes([Event(EventType.ADDED, good)]))
    assert result.events == [Event(EventType.ADDED, good)]
    assert watcher.skipped.current == {}


def test_removal_of_a_skipped_lease_forgets_it():
    watcher = LeaseWatcher(OWN, CONFIG)
    watcher.apply(Changes([Event(EventType.ADDED, peer("0.0.0.0-1"))]))
    result = watcher.apply(Changes([Event(EventType.REMOVED, peer("0.0.0.0-1", None))]))
    assert result.events == [] and watcher.skipped.current == {}


def test_kube_mode_without_subnet_len_checks_containment_only():
    from flannel.config import parse_config

    cfg = parse_config('{"Network": "10.1.0.0/16", "Backend": {"Type": "vxlan"}}')
    watcher = LeaseWatcher(OWN, cfg)
    odd_length = peer("10.1.8.0-25")
    result = watcher.apply(Snapshot([OWN, odd_length, peer("10.2.0.0-24")]))
    assert result.events == [Event(EventType.ADDED, odd_length)]
    assert watcher.skipped.current == {
        "10.2.0.0-24": "subnet 10.2.0.0/24 lies outside the Network 10.1.0.0/16"}


def test_ipv6_family_is_checked_against_the_ipv6_network():
    from ipaddress import IPv6Address, IPv6Network

    cfg = checked_config('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/56"}')
    own = Lease(None, IPv6Network("fd00:0:0:1::/64"),
                LeaseAttrs(public_ipv6=IPv6Address("fd99::1")))
    good = Lease(None, IPv6Network("fd00:0:0:2::/64"),
                 LeaseAttrs(public_ipv6=IPv6Address("fd99::2")))
    outside = Lease(None, IPv6Network("fd01::/64"), LeaseAttrs(public_ipv6=IPv6Address("fd99::3")))
    link_local = Lease(None, IPv6Network("fd00:0:0:3::/64"),
                       LeaseAttrs(public_ipv6=IPv6Address("fe80::3")))
    watcher = LeaseWatcher(own, cfg)
    result = watcher.apply(Snapshot([own, good, outside, link_local]))
    assert result.events == [Event(EventType.ADDED, good)]
    assert watcher.skipped.current == {
        "0.0.0.0-0&fd01::-64": "subnet fd01::/64 lies outside the IPv6Network fd00::/56",
        "0.0.0.0-0&fd00:0:0:3::-64": "PublicIPv6 fe80::3: it is a link-local address"}


def test_a_lease_of_a_family_the_cluster_does_not_use_is_skipped():
    from ipaddress import IPv6Address, IPv6Network

    v6_only = Lease(None, IPv6Network("fd00:0:0:2::/64"),
                    LeaseAttrs(public_ipv6=IPv6Address("fd99::2")))
    watcher = LeaseWatcher(OWN, CONFIG)
    assert watcher.apply(Snapshot([OWN, v6_only])).events == []
    assert watcher.skipped.current == {
        "0.0.0.0-0&fd00:0:0:2::-64": "it carries no subnet of a family this cluster uses"}


def test_an_ipv6_public_address_inside_the_ipv6_network_or_ours_is_refused():
    from ipaddress import IPv6Address, IPv6Network

    cfg = checked_config('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00::/56"}')
    own = Lease(None, IPv6Network("fd00:0:0:1::/64"),
                LeaseAttrs(public_ipv6=IPv6Address("fd99::1")))
    inside = Lease(None, IPv6Network("fd00:0:0:2::/64"),
                   LeaseAttrs(public_ipv6=IPv6Address("fd00:0:0:7::3")))
    ours = Lease(None, IPv6Network("fd00:0:0:3::/64"), LeaseAttrs(public_ipv6=IPv6Address(
        "fd99::1")))
    watcher = LeaseWatcher(own, cfg)
    assert watcher.apply(Snapshot([own, inside, ours])).events == []
    assert watcher.skipped.current == {
        inside.key: "PublicIPv6 fd00:0:0:7::3: it lies inside the IPv6Network fd00::/56: a "
                    "node's address is no pod's",
        ours.key: "PublicIPv6 fd99::1: it is this node's own: packets to that node would "
                  "loop back here"}


def test_a_lease_created_again_is_handed_over_with_its_new_age():
    # A key deleted and written again holds the same value but is younger: which of two
    # leases claiming one identity wins may change.
    peer = Lease(IPv4Network("10.5.2.0/24"), attrs=LeaseAttrs(IPv4Address("192.168.1.2")),
                 created=7)
    watcher = LeaseWatcher(None)
    watcher.apply(Snapshot([peer]))
    again = peer.replace(created=40)
    assert watcher.apply(Changes([Event(EventType.ADDED, again)])).events == [
        Event(EventType.ADDED, again)]


def test_a_renewal_that_republishes_the_same_value_is_not_an_event():
    peer = Lease(IPv4Network("10.5.2.0/24"), attrs=LeaseAttrs(IPv4Address("192.168.1.2")),
                 expiration=100.0, etcd_lease_id=1)
    watcher = LeaseWatcher(None)
    watcher.apply(Snapshot([peer]))
    renewed = peer.replace(expiration=200.0, etcd_lease_id=2)
    assert watcher.apply(Changes([Event(EventType.ADDED, renewed)])).events == []
    assert watcher.leases == [renewed]
    moved = renewed.replace(attrs=LeaseAttrs(IPv4Address("192.168.1.9")))
    assert watcher.apply(Changes([Event(EventType.ADDED, moved)])).events == [
        Event(EventType.ADDED, moved)]
