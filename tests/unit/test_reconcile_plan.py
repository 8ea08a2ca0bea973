"""The reconciler's diff and drift rules, on synthetic states."""

from flannel.kernel import events, rtnl
from flannel.kernel.reconcile import ActualState, DesiredState, drift, plan
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
    assert plan(DESIRED, actual) == [("replace", N1), ("replace", F1), ("replace", R1),
                                     ("delete", R2), ("delete", F2), ("delete", N2)]


def test_nothing_to_do_when_in_sync():
    assert plan(DESIRED, ActualState(frozenset({R1}), frozenset({N1}), frozenset({F1}))) == []


def test_a_replaced_entry_is_not_deleted_afterwards():
    old_route = Route("10.5.1.0/24", "192.168.9.9", 3)
    old_neigh = Neighbour(7, "10.5.1.0", "0e:00:00:00:00:99")
    ops = plan(DESIRED, ActualState(frozenset({old_route}), frozenset({old_neigh}),
                                    frozenset({F1})))
    assert ("replace", R1) in ops and ("replace", N1) in ops
    assert not any(verb == "delete" for verb, _ in ops)


def event(obj, deleted=False, protocol=0):
    return events.KernelEvent(deleted, obj, protocol)


def test_drift_rules():
    assert drift(DESIRED, event(R1, deleted=True))
    assert not drift(DESIRED, event(R2, deleted=True))  # our own clean-up
    assert drift(DESIRED, event(Route("10.5.1.0/24", "1.1.1.1", 3)))  # replaced by someone
    assert drift(DESIRED, event(R2, protocol=rtnl.RTPROT_FLANNEL))  # stray route of ours
    assert not drift(DESIRED, event(Route("172.16.0.0/24", "1.1.1.1", 3)))  # foreign
    assert not drift(DESIRED, event(R1, protocol=rtnl.RTPROT_FLANNEL))  # our own add
    assert drift(DESIRED, event(N1, deleted=True))
    assert drift(DESIRED, event(Neighbour(7, "10.5.1.0", "0e:00:00:00:00:99")))
    assert not drift(DESIRED, event(Neighbour(9, "10.5.1.0", "0e:00:00:00:00:99")))
    assert drift(DESIRED, event(F1, deleted=True))
    assert drift(DESIRED, event(events.LinkEvent(7, "flannel.1", True), deleted=True))
    assert not drift(DESIRED, event(events.LinkEvent(2, "eth0", False)))


def test_route_codec_round_trip():
    for route in (R1, Route("fd00:1::/64", "fd00:1::", 4, onlink=True),
                  Route("10.9.0.0/16", "192.168.0.1", 2)):
        data = rtnl.encode_route(route, rtnl.RTM_NEWROUTE, 0, 1)
        (_, _, _, body), = rtnl.iter_messages(data)
        decoded, protocol, table = rtnl.decode_route(body)
        assert (decoded, protocol, table) == (route, rtnl.RTPROT_FLANNEL, rtnl.RT_TABLE_MAIN)


def test_neighbour_and_fdb_codec_round_trip():
    for entry, encode in ((N1, rtnl.encode_neighbour), (F1, rtnl.encode_fdb)):
        (_, _, _, body), = rtnl.iter_messages(encode(entry, rtnl.RTM_NEWNEIGH, 0, 1))
        decoded, state, _flags = rtnl.decode_neighbour(body)
        assert decoded == entry and state == rtnl.NUD_PERMANENT
