"""The data plane's orchestration without root: the real host-gw and alloc backends against
a dict-backed netlink layer (tests/support/fakenetlink.py), on a clock the tests advance
(tests/support/clock.py). When passes run, what readiness says meanwhile, backoff and
recovery, drift repair, appliers, the worker thread that owns the netlink socket, and a bug
in a backend ending the data plane rather than being retried."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
import time
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.alloc import AllocBackend
from flannel.backend.base import Applier, ApplyResult, RouteLookup
from flannel.backend.hostgw import HostGwBackend
from flannel.dataplane.loop import COMPONENT, NOT_PROGRAMMED, Dataplane
from flannel.kernel import device, rtnl
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.readiness import Readiness
from tests.support.clock import FakeClock
from tests.support.dataplanes import (
    EXT,
    OWN,
    AllocWithEngine,
    config,
    hostgw,
    parked,
    peer,
    programmed,
    readiness,
    retried,
    route,
    running,
    until,
)
from tests.support.fakenetlink import FakeKernel


async def test_nothing_is_touched_before_the_first_peer_set_and_ready_once_programmed():
    kernel = FakeKernel()
    kernel.put(route(9), rtnl.RTPROT_FLANNEL)  # a peer of the previous run, still there
    clock = FakeClock()
    async with running(hostgw(), kernel, interval=0.01, clock=clock) as dataplane:
        waiting = (False, NOT_PROGRAMMED + "waiting for the first lease snapshot")
        await until(lambda: readiness(dataplane) == waiting, "the waiting reason")
        await clock.advance(0.1)  # ten periodic intervals: none may run a pass
        assert clock.timers() == []  # only the first peer set can start one
        assert kernel.handles == [] and kernel.ours() == {route(9)}
        kernel.gate.clear()
        dataplane.set_peers([peer(9), peer(2)])
        assert readiness(dataplane) == (
            False, NOT_PROGRAMMED + "latest lease changes not programmed yet")
        kernel.gate.set()
        await programmed(dataplane)
        assert kernel.ours() == {route(9), route(2)}
        assert dataplane.status.in_sync
        assert dataplane.status.programmed_version == dataplane.status.wanted_version == 1
        assert dataplane.status.applied == {"route": 1}


async def test_an_empty_first_peer_set_is_programmed_as_empty():
    kernel = FakeKernel()
    kernel.put(route(9), rtnl.RTPROT_FLANNEL)
    async with running(hostgw(), kernel) as dataplane:
        dataplane.set_peers([])
        await programmed(dataplane)
        assert kernel.ours() == set()


async def test_peer_sets_handed_over_during_a_pass_coalesce_into_one_pass():
    kernel = FakeKernel()
    async with running(hostgw(), kernel) as dataplane:
        kernel.gate.clear()
        dataplane.set_peers([peer(2)])
        await until(lambda: kernel.handles and kernel.handles[0].used_in, "a pass started")
        for last in range(3, 53):
            dataplane.set_peers([peer(third) for third in range(2, last + 1)])
            await asyncio.sleep(0)  # a yield, not a wait: the loop runs between hand-overs
        assert not readiness(dataplane)[0]
        kernel.gate.set()
        await programmed(dataplane)
        status = dataplane.status
        assert status.passes == 2
        assert status.programmed_version == status.wanted_version == 51
        assert kernel.ours() == {route(third) for third in range(2, 53)}


async def test_a_refused_change_is_not_ready_with_advice_retried_with_backoff_and_recovers(
        caplog):
    caplog.set_level(logging.INFO, "flannel.dataplane.loop")
    kernel = FakeKernel()
    # Every peer's route: this node's problem (its underlay), not one peer's.
    kernel.refusals["replace route"] = errno.ENETUNREACH
    clock = FakeClock()
    async with running(hostgw(), kernel, clock=clock) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await parked(clock, 0.05)
        assert dataplane.status.passes == dataplane.status.failed_passes == 1
        # Retries wait 0.05, 0.1, then 0.2 s each, and not a moment less.
        for delay, then in ((0.05, 0.1), (0.1, 0.2), (0.2, 0.2)):
            passes = dataplane.status.passes
            await clock.advance(delay * 0.99)
            assert dataplane.status.passes == passes and clock.timers()
            await clock.advance(delay * 0.01)
            await parked(clock, then)
            assert dataplane.status.passes == passes + 1
        assert readiness(dataplane) == (False, NOT_PROGRAMMED + (
            "2 of 2 changes failed, first: Network is unreachable (replace route "
            "10.244.2.0/24 via 192.168.1.2); host-gw needs every node on one L2 segment: a "
            "peer's public IP must be directly reachable on eth0, with no router in between; "
            "across routed networks use the vxlan backend (DirectRouting keeps direct routes "
            "for the peers on the same segment)"))
        # The socket is replaced after a failure, closed where it was used.
        assert len(kernel.handles) == 4 and kernel.handles[0].closed_in is not None
        assert dataplane.backend.admission.refused == {}
        del kernel.refusals["replace route"]
        await clock.advance(0.2)
        await programmed(dataplane)
        assert kernel.ours() == {route(2), route(3)}
        assert dataplane.status.last_error == ""
    failed = [r.getMessage() for r in caplog.records if "reconcile failed" in r.getMessage()]
    assert len(failed) == 1, failed  # once, not once per retry
    assert "reconcile recovered" in caplog.messages


async def test_a_peer_the_kernel_refuses_is_parked_and_the_others_are_programmed_and_ready(
        caplog):
    caplog.set_level(logging.INFO)
    kernel = FakeKernel()
    kernel.refusals["replace route 10.244.3.0/24"] = errno.ENETUNREACH  # its public IP
    clock = FakeClock()
    backend = hostgw()
    async with running(backend, kernel, clock=clock) as dataplane:
        dataplane.set_peers([peer(2), peer(3), peer(4)])
        await programmed(dataplane)
        assert kernel.ours() == {route(2), route(4)}
        assert dataplane.status.programmed_peers == 2 and dataplane.status.failed_passes == 0
        why = ("Network is unreachable (replace route 10.244.3.0/24 via 192.168.1.3); host-gw "
               "needs every node on one L2 segment: a peer's public IP must be directly "
               "reachable on eth0, with no router in between; across routed networks use the "
               "vxlan backend (DirectRouting keeps direct routes for the peers on the same "
               "segment)")
        assert backend.admission.refused == {"10.244.3.0-24": ("kernel_refused", why)}
        assert backend.admission.refusals["kernel_refused"] == 1
        assert caplog.text.count("skipping peer 10.244.3.0-24 (public IP 192.168.1.3): the "
                                 "kernel refused it") == 1
        # Tried again after its own backoff (5 s, then 10 s), the others left alone.
        await parked(clock, 5.0)
        requests = kernel.requests
        await clock.advance(5.0)
        await parked(clock, 10.0)
        assert kernel.requests == requests + 1 and readiness(dataplane)[0]
        assert backend.admission.refusals["kernel_refused"] == 2
        assert caplog.text.count("skipping peer 10.244.3.0-24") == 1  # logged once
        # Once the kernel takes it, it is programmed and no longer refused.
        del kernel.refusals["replace route 10.244.3.0/24"]
        await clock.advance(10.0)
        await until(lambda: kernel.ours() == {route(2), route(3), route(4)}, "the retry")
        assert backend.admission.refused == {} and dataplane.status.programmed_peers == 3
        assert "peer 10.244.3.0-24 is programmed now" in caplog.text
        await parked(clock, 300.0)  # only the periodic pass is due (once the pass has ended)


async def test_a_lone_peer_the_kernel_refuses_is_its_own_problem():
    # At start the bad lease may be the only one known yet: refused alone, it is parked.
    kernel = FakeKernel()
    kernel.refusals["replace route 10.244.3.0/24"] = errno.ENETUNREACH
    backend = hostgw()
    async with running(backend, kernel, clock=FakeClock()) as dataplane:
        dataplane.set_peers([peer(3)])
        await programmed(dataplane)
        assert set(backend.admission.refused) == {"10.244.3.0-24"}
        assert dataplane.status.failed_passes == 0 and dataplane.status.programmed_peers == 0
        dataplane.set_peers([peer(3), peer(2)])
        await until(lambda: kernel.ours() == {route(2)}, "the good peer")


@pytest.mark.parametrize("code", [errno.ENODEV, errno.ENOBUFS])
async def test_a_refusal_about_the_device_or_the_socket_is_this_nodes(code):
    kernel = FakeKernel()
    kernel.refusals["replace route 10.244.3.0/24"] = code
    backend = hostgw()
    async with running(backend, kernel, clock=FakeClock()) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await until(lambda: dataplane.status.failed_passes >= 1, "a failed pass")
        assert not readiness(dataplane)[0] and backend.admission.refused == {}


async def test_a_parked_peer_whose_lease_changes_is_tried_at_once_and_forgotten_when_gone():
    kernel = FakeKernel()
    kernel.refusals["replace route 10.244.3.0/24 via 192.168.1.3"] = errno.ENETUNREACH
    clock = FakeClock()
    backend = hostgw()
    async with running(backend, kernel, clock=clock) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await programmed(dataplane)
        assert set(backend.admission.refused) == {"10.244.3.0-24"}
        moved = Lease(IPv4Network("10.244.3.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address("192.168.1.9"), backend_type="host-gw"))
        dataplane.set_peers([peer(2), moved])  # no clock moves: at once
        await until(lambda: route(3, "192.168.1.9") in kernel.ours(), "the moved peer")
        assert backend.admission.refused == {}
        dataplane.set_peers([peer(2), peer(3)])
        await until(lambda: set(backend.admission.refused) == {"10.244.3.0-24"}, "refused")
        dataplane.set_peers([peer(2)])
        await programmed(dataplane)
        await until(lambda: backend.admission.refused == {}, "forgotten")
        assert kernel.ours() == {route(2)} and clock.timers() == [300]


async def test_drift_is_not_ready_until_repaired_and_counted_by_kind(caplog):
    caplog.set_level(logging.INFO, "flannel.dataplane.loop")
    kernel = FakeKernel()
    async with running(hostgw(), kernel) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await programmed(dataplane)
        assert "kernel drifted" not in caplog.text  # our own changes are not drift
        kernel.gate.clear()  # hold the repair, to see what readiness says meanwhile
        kernel.put(route(2, gateway="192.168.1.99"))
        await until(lambda: not readiness(dataplane)[0], "drift noticed")
        assert readiness(dataplane) == (False, NOT_PROGRAMMED + (
            "repairing: route 10.244.2.0/24 changed (via 192.168.1.99 dev 2)"))
        kernel.remove(route(3))  # more drift while repairing: the first reason stays
        await asyncio.sleep(0)
        assert "repairing: route 10.244.2.0/24 changed" in readiness(dataplane)[1]
        kernel.gate.set()
        await programmed(dataplane)
        assert kernel.ours() == {route(2), route(3)}
        assert dataplane.status.repaired == {"route": 1}
        kernel.put(Route("10.244.7.0/24", "192.168.1.7", EXT.index), rtnl.RTPROT_FLANNEL)
        await until(lambda: dataplane.status.repaired["route"] == 2, "stray route repaired")
        await programmed(dataplane)
        assert kernel.ours() == {route(2), route(3)}
    drifted = [m for m in caplog.messages if m.startswith("kernel drifted")]
    assert drifted == [
        "kernel drifted from desired state (route 10.244.2.0/24 changed (via 192.168.1.99 "
        "dev 2)); repairing",
        "kernel drifted from desired state (stray route 10.244.7.0/24 with our protocol); "
        "repairing"]


async def test_a_peer_change_applies_the_difference_without_reading_the_kernel_back():
    kernel = FakeKernel()
    async with running(hostgw(), kernel) as dataplane:
        dataplane.set_peers([peer(2), peer(3)])
        await programmed(dataplane)
        dumps, requests = kernel.dumps, kernel.requests
        assert (requests, dataplane.status.full_passes) == (2, 1)
        assert dumps
        moved = Lease(peer(2).subnet, attrs=LeaseAttrs(
            public_ip=IPv4Address("192.168.1.20"), backend_type="host-gw"))
        dataplane.set_peers([moved, peer(4)])
        await programmed(dataplane)
        # peer 2 moved (one replace), 3 left (one delete), 4 joined (one replace)
        assert kernel.ours() == {route(2, gateway="192.168.1.20"), route(4)}
        assert (kernel.dumps, kernel.requests) == (dumps, requests + 3)
        assert dataplane.status.full_passes == 1
        # Drift makes the next pass a full one, which reads the kernel back.
        await until(lambda: kernel.watching, "the event watch")
        kernel.remove(route(4))
        await until(lambda: dataplane.status.full_passes == 2, "a full pass")
        await programmed(dataplane)
        assert kernel.ours() == {route(2, gateway="192.168.1.20"), route(4)}
        assert kernel.dumps == 2 * dumps


async def test_the_periodic_pass_reads_the_kernel_back_and_repairs_unseen_drift():
    kernel = FakeKernel()
    clock = FakeClock()
    async with running(hostgw(), kernel, interval=30, clock=clock) as dataplane:
        dataplane.set_peers([peer(2)])
        await programmed(dataplane)
        with kernel.lock:  # gone without an event: only reading the kernel shows it
            del kernel.routes[("10.244.2.0/24", 0)]
        dataplane.set_peers([peer(2), peer(3)])  # an incremental pass does not see it
        await until(lambda: route(3) in kernel.ours(), "peer 3 programmed")
        await programmed(dataplane)
        await parked(clock, 30)
        await clock.advance(29.9)  # no pass for an interval: then the periodic full one
        assert kernel.ours() == {route(3)} and dataplane.status.full_passes == 1
        await clock.advance(0.1)
        await until(lambda: kernel.ours() == {route(2), route(3)}, "the periodic repair")
        assert dataplane.status.full_passes == 2


async def test_lost_events_resync_in_full():
    kernel = FakeKernel()
    async with running(hostgw(), kernel) as dataplane:
        dataplane.set_peers([peer(2)])
        await programmed(dataplane)
        await until(lambda: kernel.watching, "the event watch")
        with kernel.lock:  # changed with no event, as when the event buffer overflowed
            del kernel.routes[("10.244.2.0/24", 0)]
        passes = dataplane.status.passes
        kernel.overrun()
        await until(lambda: dataplane.status.passes > passes and readiness(dataplane)[0],
                    "a resync")
        assert kernel.ours() == {route(2)}


async def test_cancelling_closes_the_socket_in_the_worker_thread_even_mid_pass():
    kernel = FakeKernel()
    async with running(hostgw(), kernel) as dataplane:
        dataplane.set_peers([peer(2)])
        await programmed(dataplane)
        kernel.gate.clear()
        dataplane.set_peers([peer(2), peer(3)])
        await until(lambda: len(kernel.handles[0].used_in) and kernel.requests == 1
                    and dataplane.status.wanted_version == 2, "the second pass")
        asyncio.get_running_loop().call_later(0.05, kernel.gate.set)
    assert len(kernel.handles) == 1
    handle = kernel.handles[0]
    assert handle.closed_in == handle.opened_in and handle.used_in == {handle.opened_in}
    assert handle.opened_in != threading.get_ident()
    assert kernel.watching == 0


class RecordingApplier(Applier):
    """An engine not reconciled by netlink: keeps the peer subnets it was handed."""

    name = "test engine"

    def __init__(self) -> None:
        self.subnets: set[str] = set()
        self.threads: set[int] = set()
        self.error = ""
        self.raises: Exception | None = None

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        self.threads.add(threading.get_ident())
        if self.raises is not None:
            raise self.raises
        if self.error:
            return ApplyResult(0, self.error)
        wanted = {str(p.subnet) for p in peers}
        changes = len(wanted ^ self.subnets)
        self.subnets = wanted
        return ApplyResult(changes)


async def test_an_applier_is_handed_every_peer_set_and_its_failures_are_readiness():
    kernel = FakeKernel()
    engine = RecordingApplier()
    clock = FakeClock()
    async with running(AllocWithEngine(engine), kernel, clock=clock) as dataplane:
        dataplane.set_peers([peer(2, ""), peer(3, ""), peer(4, "vxlan")])
        await programmed(dataplane)
        assert engine.subnets == {"10.244.2.0/24", "10.244.3.0/24"}
        engine.error = "peer 10.244.5.0/24 unreachable"
        dataplane.set_peers([peer(2, ""), peer(5, "")])
        await until(lambda: not readiness(dataplane)[0] and dataplane.status.last_error,
                    "the engine's error")
        assert readiness(dataplane) == (
            False, NOT_PROGRAMMED + "test engine: peer 10.244.5.0/24 unreachable")
        engine.error = ""
        engine.raises = OSError(errno.EPIPE, "control socket closed")
        await retried(clock)
        await until(lambda: "control socket" in readiness(dataplane)[1], "the exception")
        assert readiness(dataplane) == (
            False, NOT_PROGRAMMED + "test engine: [Errno 32] control socket closed")
        engine.raises = None
        await retried(clock)
        await programmed(dataplane)
        assert engine.subnets == {"10.244.2.0/24", "10.244.5.0/24"}
        assert dataplane.status.applied == {"test engine": 4}
    assert kernel.handles == [] and kernel.watching == 0  # no netlink for this backend
    assert threading.get_ident() not in engine.threads and len(engine.threads) == 1


async def test_the_alloc_backend_is_ready_without_any_netlink():
    kernel = FakeKernel()
    async with running(AllocBackend(EXT, config("alloc")), kernel) as dataplane:
        dataplane.set_peers([peer(2, "")])
        await programmed(dataplane)
        await until(lambda: kernel.watching == 0, "the event watch stopped")
    assert kernel.handles == []


class BuggyHostGw(HostGwBackend):
    """host-gw with a fault injected into its description of the kernel state."""

    pass_errors = (device.DeviceError,)

    def __init__(self) -> None:
        super().__init__(EXT, config("host-gw"))
        self.lease = OWN
        self.fault: Exception | None = None

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        if self.fault is not None:
            raise self.fault
        return super().desired_state(peers, route_get)


async def test_a_bug_in_a_backend_ends_the_data_plane_instead_of_being_retried(caplog):
    caplog.set_level(logging.INFO, "flannel.dataplane.loop")
    backend = BuggyHostGw()
    backend.fault = TypeError("unsupported operand type(s) for +: 'int' and 'str'")
    dataplane = Dataplane(backend, Readiness([COMPONENT]), netlink=FakeKernel().open,
                          watch=FakeKernel().watch, clock=FakeClock())
    dataplane.set_peers([peer(2)])
    with pytest.raises(TypeError, match="unsupported operand"):
        await asyncio.wait_for(dataplane.run(), 5)
    assert "reconcile failed" not in caplog.text
    assert dataplane.status.failed_passes == 0


@pytest.mark.parametrize("error", [
    device.DeviceError("flannel.1 disappeared while being set up"),  # declared by it
    rtnl.NetlinkError(errno.ENOBUFS, "dump routes"),  # I/O
])
async def test_the_errors_a_backend_declares_are_retried(error):
    backend = BuggyHostGw()
    backend.fault = error
    kernel = FakeKernel()
    clock = FakeClock()
    async with running(backend, kernel, clock=clock) as dataplane:
        dataplane.set_peers([peer(2)])
        await parked(clock, 0.05)
        assert readiness(dataplane) == (False, NOT_PROGRAMMED + str(error))
        backend.fault = None
        await clock.advance(0.05)
        await programmed(dataplane)
        assert kernel.ours() == {route(2)}


async def test_a_bug_in_an_applier_ends_the_data_plane():
    engine = RecordingApplier()
    engine.raises = AttributeError("'NoneType' object has no attribute 'peers'")
    dataplane = Dataplane(AllocWithEngine(engine), Readiness([COMPONENT]),
                          netlink=FakeKernel().open, watch=FakeKernel().watch,
                          clock=FakeClock())
    dataplane.set_peers([peer(2, "")])
    with pytest.raises(AttributeError, match="no attribute 'peers'"):
        await asyncio.wait_for(dataplane.run(), 5)


def test_the_real_clock_waits_for_the_event_or_the_time():
    from flannel.timing.clock import SYSTEM

    async def both() -> tuple[bool, bool, float]:
        event = asyncio.Event()
        asyncio.get_running_loop().call_soon(event.set)
        woken = await SYSTEM.wait(event, 5)
        started = SYSTEM.monotonic()
        timed_out = await SYSTEM.wait(asyncio.Event(), 0.01)
        return woken, timed_out, SYSTEM.monotonic() - started

    woken, timed_out, waited = asyncio.run(both())
    assert woken and not timed_out and 0.01 <= waited < 5
    assert abs(SYSTEM.monotonic() - time.monotonic()) < 1


async def test_a_bug_in_the_kernel_event_watch_ends_the_data_plane():
    async def watch(on_event: object, on_overrun: object) -> None:
        raise ValueError("invalid literal for int() with base 10: 'x'")

    dataplane = Dataplane(hostgw(), Readiness([COMPONENT]), netlink=FakeKernel().open,
                          watch=watch, clock=FakeClock())
    dataplane.set_peers([peer(2)])
    with pytest.raises(ValueError, match="invalid literal"):
        await asyncio.wait_for(dataplane.run(), 5)
    assert dataplane.status.event_watch_failures == 0  # not taken for a failed watch
