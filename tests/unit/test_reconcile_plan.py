"""The reconciler's diff and drift rules, on synthetic states."""

from ipaddress import ip_address

from flannel.kernel import rtnl
from flannel.kernel.reconcile import ActualState, DesiredState, plan
from flannel.kernel.rtnl import FdbEntry, Neighbour, Route

R1 = Route("10.5.1.0/24", "10.5.1.0", 7, onlink=True)
R2 = Route("10.5.2.0/24", "10.5.2.0", 7, onlink=True)
N1 = Neighbour(7, "10.5.1.0", "0e:00:00:00:00:01")
N2 = Neighbour(7, "10.5.2.0", "0e:00:00:00:00:02")
F1 = FdbEntry(7, "0e:00:00:00:00:01", "192.168.1.1")
F2 = FdbEntry(7, "0e:00:00:00:00:02", "192.168.1.2")
DESIRED = DesiredState(frozenset({R1}), frozenset({N1}), frozenset({F1}), frozenset({7}))


def test_adds_in_traffic_order_then_deletes_stale():
    actual = ActualState(frozenset({R2}), frozenset({N2}), frozenset({F2}))
    assert list(plan(DESIRED, actual)) == [("replace", N1), ("replace", F1), ("replace", R1),
                                           ("delete", R2), ("delete", F2), ("delete", N2)]


def test_nothing_to_do_when_in_sync():
    assert list(plan(DESIRED, ActualState(frozenset({R1}), frozenset({N1}),
                                          frozenset({F1})))) == []


def test_a_replaced_entry_is_not_deleted_afterwards():
    old_route = Route("10.5.1.0/24", "192.168.9.9", 3)
    old_neigh = Neighbour(7, "10.5.1.0", "0e:00:00:00:00:99")
    ops = list(plan(DESIRED, ActualState(frozenset({old_route}), frozenset({old_neigh}),
                                         frozenset({F1}))))
    assert ("replace", R1) in ops and ("replace", N1) in ops
    assert not any(verb == "delete" for verb, _ in ops)


def test_adopted_routes_are_retagged_when_wanted_and_deleted_when_not():
    go_wanted = R1  # the same route, held under another protocol
    go_stale = Route("10.5.9.0/24", "10.5.9.0", 7, onlink=True)
    go_other_gateway = Route("10.5.1.0/24", "192.168.1.1", 2)  # same identity as R1
    actual = ActualState(frozenset(), frozenset({N1}), frozenset({F1}),
                         adopted=frozenset({go_wanted, go_stale}))
    assert list(plan(DESIRED, actual)) == [("replace", R1), ("delete", go_stale)]
    actual = ActualState(frozenset(), frozenset({N1}), frozenset({F1}),
                         adopted=frozenset({go_other_gateway}))
    assert list(plan(DESIRED, actual)) == [("replace", R1)]  # the replace overwrites it


def test_a_route_of_ours_with_another_metric_is_not_kept_by_its_destination():
    old_metric = Route("10.5.1.0/24", "10.5.1.0", 7, onlink=True, metric=100)
    actual = ActualState(frozenset({R1, old_metric}), frozenset({N1}), frozenset({F1}))
    assert list(plan(DESIRED, actual)) == [("delete", old_metric)]


def test_route_codec_round_trip():
    for route in (R1, Route("fd00:1::/64", "fd00:1::", 4, onlink=True),
                  Route("10.9.0.0/16", "192.168.0.1", 2)):
        data = rtnl.encode_route(route, rtnl.RTM_NEWROUTE, 0, 1)
        (_, _, _, body), = rtnl.iter_messages(data)
        decoded, protocol, table = rtnl.decode_route(body)
        assert (decoded, protocol, table) == (route, rtnl.RTPROT_FLANNEL, rtnl.RT_TABLE_MAIN)


def test_neighbour_and_fdb_codec_round_trip():
    with_options = FdbEntry(7, "0e:00:00:00:00:01", "192.168.1.1", port=9999, vni=5, via=3)
    for entry, encode in ((N1, rtnl.encode_neighbour), (F1, rtnl.encode_fdb),
                          (with_options, rtnl.encode_fdb)):
        (_, _, _, body), = rtnl.iter_messages(encode(entry, rtnl.RTM_NEWNEIGH, 0, 1))
        decoded, state, _flags = rtnl.decode_neighbour(body)
        assert decoded == entry and state == rtnl.NUD_PERMANENT


def test_decoded_addresses_read_as_ipaddress_writes_them():
    """Desired state holds ``ipaddress`` text: a decoded entry must compare equal to it, also
    for IPv6 forms where libc's text differs (mapped and compatible addresses)."""
    for address in ("10.244.3.0", "fd00:10:244:3::", str(ip_address("::ffff:192.168.1.1")),
                    str(ip_address("::192.168.1.1"))):
        for entry, encode in ((Neighbour(4, address, "0e:00:00:00:00:0a"),
                               rtnl.encode_neighbour),
                              (FdbEntry(4, "0e:00:00:00:00:0a", address), rtnl.encode_fdb)):
            (_, _, _, body), = rtnl.iter_messages(encode(entry, rtnl.RTM_NEWNEIGH, 0, 1))
            assert rtnl.decode_neighbour(body)[0] == entry
