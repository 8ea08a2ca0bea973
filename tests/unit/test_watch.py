"""Lease event normalisation (upstream LeaseWatcher, with snapshot diffing of changed attrs)."""

from ipaddress import IPv4Address, IPv4Network

from flannel.lease import Event, EventType, Lease, LeaseAttrs
from flannel.subnet.watch import Changes, LeaseWatcher, Snapshot


def lease(third: int, ip: str = "192.168.0.1", mac: str = "") -> Lease:
    return Lease(IPv4Network(f"10.1.{third}.0/24"),
                 attrs=LeaseAttrs(public_ip=IPv4Address(ip), backend_type="vxlan",
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
                 attrs=LeaseAttrs(public_ip=IPv4Address("192.168.0.1"),
                                  public_ipv6=IPv6Address("fd00:ff::1")))
    watcher.apply(Changes([Event(EventType.ADDED, dual)]))
    assert watcher.leases == [dual]
    removed = watcher.apply(Changes([Event(EventType.REMOVED, Lease(IPv4Network("10.1.2.0/24"),
                                                                      IPv6Network(
                                                                          "fd00:2::/64")))]))
    assert removed.events == [Event(EventType.REMOVED, dual)] and watcher.leases == []

