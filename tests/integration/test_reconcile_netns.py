"""The vxlan and host-gw backends against a real kernel in a namespace: drift of every kind
of owned state repaired within a second (readiness says so meanwhile), adoption of routes a
previous flannel left, accept_ra, and the errors an operator sees for an unusable setup."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from flannel.backend.base import BackendError
from flannel.dataplane.loop import NOT_PROGRAMMED
from flannel.kernel import events, rtnl
from flannel.kernel.host import Host
from flannel.kernel.reconcile import read_unless_converged, reconcile
from flannel.lease import Lease, LeaseAttrs
from tests.support import netns
from tests.support.netns_dataplane import (
    OWN,
    Running,
    make_backend,
    programmed_for,
    running,
    underlay,
    vxlan_peer,
)
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.netns

PEER_MAC = "0e:00:00:00:00:02"
PEER = Lease(IPv4Network("10.244.2.0/24"), IPv6Network("fd00:244:0:2::/64"), LeaseAttrs(
    public_ip=IPv4Address("192.168.50.3"), public_ipv6=IPv6Address("fd00:50::3"),
    backend_type="vxlan", backend_data=json.dumps({"VNI": 1, "VtepMAC": PEER_MAC}),
    backend_v6_data=json.dumps({"VNI": 1, "VtepMAC": "0e:00:00:00:06:02"})))


@pytest.fixture
async def vxlan(ns) -> AsyncIterator[tuple[str, Running]]:
    """A running vxlan data plane with our lease and one peer, fully programmed."""
    underlay(ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    await backend.prepare()
    await backend.activate(OWN)
    async with running(backend, [PEER]) as plane:
        await plane.programmed()
        plane.seen.clear()
        yield ns, plane


def kernel_state(ns: str) -> tuple[str, str]:
    """What we own in the namespace, as iproute2 shows it (two processes, so polls are
    cheap): routes in the network, permanent neighbours, the device and its IPv4 addresses,
    and the FDB."""
    shown = subprocess.run(["ip", "-4", "-d", "-n", ns, "-batch", "-"], input="\n".join([
        "route show 10.244.0.0/16", "neigh show dev flannel.1 nud permanent",
        "link show flannel.1", "addr show dev flannel.1"]) + "\n", capture_output=True,
        text=True, timeout=20, check=True).stdout
    fdb = subprocess.run(["bridge", "-n", ns, "fdb", "show", "dev", "flannel.1"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    return shown, fdb


TAMPERING: list[tuple[str, list[str], str]] = [
    ("fdb entry replaced with a wrong dst",
     ["bridge", "fdb", "replace", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.99", "self",
      "permanent"], f"fdb entry {PEER_MAC} changed (dst 192.168.50.99)"),
    ("fdb entry given another port",
     ["bridge", "fdb", "replace", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.3", "port",
      "9999", "self", "permanent"], f"fdb entry {PEER_MAC} changed"),
    ("stray permanent fdb entry",
     ["bridge", "fdb", "add", "0e:00:00:00:00:77", "dev", "flannel.1", "dst", "192.168.50.77",
      "self", "permanent"], "stray fdb entry 0e:00:00:00:00:77 dst 192.168.50.77"),
    ("stray flood entry",
     ["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "flannel.1", "dst",
      "192.168.50.77", "self", "permanent"], "stray fdb entry 00:00:00:00:00:00"),
    ("fdb entry deleted",
     ["bridge", "fdb", "del", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.3", "self"],
     f"fdb entry {PEER_MAC} deleted"),
    ("neighbour changed",
     ["ip", "neigh", "replace", "10.244.2.0", "lladdr", "0e:00:00:00:00:99", "dev",
      "flannel.1", "nud", "permanent"], "neighbour 10.244.2.0 changed (0e:00:00:00:00:99)"),
    ("stray permanent neighbour",
     ["ip", "neigh", "add", "10.244.77.0", "lladdr", "0e:00:00:00:00:77", "dev", "flannel.1",
      "nud", "permanent"], "stray neighbour 10.244.77.0 on flannel.1"),
    ("route changed",
     ["ip", "route", "replace", "10.244.2.0/24", "via", "192.168.50.99", "dev", "eth0"],
     "route 10.244.2.0/24 changed (via 192.168.50.99"),
    ("Go-style route added by hand",
     ["ip", "route", "add", "10.244.77.0/24", "via", "10.244.77.0", "dev", "flannel.1",
      "onlink"], "stray route 10.244.77.0/24 (protocol 3)"),
    ("device MTU changed", ["ip", "link", "set", "flannel.1", "mtu", "1300"],
     "device flannel.1 MTU changed to 1300 (want 1450)"),
    ("device MAC changed", ["ip", "link", "set", "flannel.1", "address", "02:11:22:33:44:55"],
     "device flannel.1 MAC changed to 02:11:22:33:44:55"),
    ("device down", ["ip", "link", "set", "flannel.1", "down"], "device flannel.1 down"),
    ("lease address removed", ["ip", "addr", "del", "10.244.1.0/32", "dev", "flannel.1"],
     "address 10.244.1.0/32 removed from flannel.1"),
    ("stray address in the network", ["ip", "addr", "add", "10.244.9.9/32", "dev",
                                      "flannel.1"], "stray address 10.244.9.9/32"),
]


@pytest.mark.parametrize(("command", "reason"), [(c, r) for _, c, r in TAMPERING],
                         ids=[name for name, _, _ in TAMPERING])
async def test_tampering_is_repaired(vxlan, command, reason):
    ns, plane = vxlan
    seen = plane.seen
    healthy = await asyncio.to_thread(kernel_state, ns)
    await asyncio.to_thread(netns.ip, "netns", "exec", ns, *command)
    started = time.monotonic()
    assert await asyncio.to_thread(kernel_state, ns) != healthy or seen, "tampering had no effect"

    async def repaired() -> bool:
        return await asyncio.to_thread(kernel_state, ns) == healthy and plane.ready()[0]

    # Waits for the repair, bounded generously: how fast is printed, not asserted (a
    # loaded machine can delay the pass, which comes well under a second on an idle one).
    await async_wait_until(repaired, 30.0, interval=0.02, what=f"repair after {command}")
    took = time.monotonic() - started
    print(f"\n{reason}: repaired in {took * 1000:.0f} ms")
    assert seen and seen[0][0] is False
    assert seen[0][1].startswith(f"{NOT_PROGRAMMED}repairing: {reason}"), seen


# What a kernel change does to the read-back of a converged pass: the entries the vxlan
# backend describes are told from the kernel's messages without decoding them, exactly.
SILENT_DRIFT = [
    ["bridge", "fdb", "replace", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.99", "self",
     "permanent"],
    ["bridge", "fdb", "replace", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.3", "port",
     "9999", "self", "permanent"],
    ["bridge", "fdb", "replace", PEER_MAC, "dev", "flannel.1", "dst", "192.168.50.3", "vni",
     "7", "self", "permanent"],
    ["ip", "neigh", "replace", "10.244.2.0", "lladdr", "0e:00:00:00:00:99", "dev", "flannel.1",
     "nud", "permanent"],
    ["ip", "route", "replace", "10.244.2.0/24", "via", "10.244.2.0", "dev", "flannel.1",
     "onlink", "metric", "5", "proto", "151"],
    ["ip", "route", "replace", "10.244.2.0/25", "via", "10.244.2.0", "dev", "flannel.1",
     "onlink", "proto", "151"],
]


@pytest.mark.parametrize("command", SILENT_DRIFT, ids=[" ".join(c[:3] + c[5:7])
                                                        for c in SILENT_DRIFT])
async def test_a_converged_read_back_sees_every_difference(vxlan, command):
    ns, plane = vxlan
    desired = plane.dataplane.desired
    assert desired is not None and plane.task is not None
    plane.task.cancel()  # nothing repairs the change but the passes below
    with contextlib.suppress(asyncio.CancelledError):
        await plane.task
    sock = rtnl.Rtnl(Host(ns))
    try:
        converged = read_unless_converged(sock, desired)
        assert converged is not None and converged.routes == desired.routes
        await asyncio.to_thread(netns.ip, "netns", "exec", ns, *command)
        changed = read_unless_converged(sock, desired)
        assert changed is None or changed.routes != desired.routes
        assert reconcile(sock, desired)  # the difference is found and repaired
        assert not reconcile(sock, desired)
    finally:
        sock.close()


async def test_lease_changes_apply_the_difference_and_drift_in_between_is_repaired(ns):
    underlay(ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    await backend.prepare()
    await backend.activate(OWN)
    peers = [vxlan_peer(third) for third in range(2, 8)]
    async with running(backend, peers) as plane:
        await plane.programmed()
        status = plane.dataplane.status
        assert (status.full_passes, programmed_for(ns, peers)) == (1, True)
        # Two leave, one joins, one changes its VTEP MAC: applied without reading back.
        peers = [vxlan_peer(2, 0x42), *peers[1:4], vxlan_peer(9)]
        plane.dataplane.set_peers(peers)
        await async_wait_until(lambda: asyncio.to_thread(programmed_for, ns, peers), 5.0,
                               what="the changed peers programmed")
        assert status.full_passes == 1
        assert status.applied == {"route": 6 + 3, "neighbour": 6 + 4, "fdb": 6 + 5}
        # Tampering, then a lease change at once: the event makes the next pass full.
        netns.ip("route", "del", "10.244.3.0/24", netns=ns)
        peers = peers[:-1]
        plane.dataplane.set_peers(peers)
        await async_wait_until(lambda: asyncio.to_thread(programmed_for, ns, peers), 5.0,
                               what="the tampered route back and the peer gone")
        await plane.programmed()
        assert status.full_passes == 2


async def test_the_event_watch_drops_our_own_changes_and_keeps_everyone_elses(ns):
    underlay(ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    await backend.prepare()
    await backend.activate(OWN)
    seen: list[events.KernelEvent] = []
    with rtnl.Rtnl(Host(ns)) as sock:
        watch = asyncio.create_task(events.watch(seen.append, lambda: None, Host(ns),
                                                 events.EventFilter(sock.port)))
        try:
            # Subscribed and filtered once another program's change shows up: re-add a
            # probe route until one of its notifications arrives.
            async def probe_seen() -> bool:
                netns.ip("route", "del", "10.244.76.0/24", netns=ns, check=False)
                netns.ip("route", "add", "10.244.76.0/24", "dev", "flannel.1", netns=ns)
                await asyncio.sleep(0.05)
                return any(isinstance(e.obj, rtnl.Route) for e in seen)
            await async_wait_until(probe_seen, 5.0, what="the watch to see a route added by ip")
            peers = [vxlan_peer(third) for third in range(2, 6)]
            await asyncio.to_thread(reconcile, sock, backend.desired_state(peers, sock.route_get))
            netns.ip("route", "add", "10.244.77.0/24", "dev", "flannel.1", netns=ns)
            await async_wait_until(
                lambda: asyncio.sleep(0, any(isinstance(e.obj, rtnl.Route)
                                             and e.obj.dst == "10.244.77.0/24" for e in seen)),
                5.0, what="the route added by ip")
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    # Our routes and neighbours never reach us; the FDB notifications of vxlan carry no
    # sender and do; the route added by another program does.
    assert [e.obj.dst for e in seen if isinstance(e.obj, rtnl.Route)
            and e.obj.dst != "10.244.76.0/24"] == ["10.244.77.0/24"]
    assert not [e for e in seen if isinstance(e.obj, rtnl.Neighbour)]
    assert len([e for e in seen if isinstance(e.obj, rtnl.FdbEntry)]) == 4


async def test_adopts_routes_a_previous_flannel_left_and_nothing_else(ns):
    underlay(ns)
    netns.ip("link", "add", "dummy0", "type", "bridge", netns=ns)
    netns.ip("link", "set", "dummy0", "up", netns=ns)
    netns.ip("link", "add", "cni0", "type", "bridge", netns=ns)
    netns.ip("addr", "add", "10.244.1.1/24", "dev", "cni0", netns=ns)
    netns.ip("link", "set", "cni0", "up", netns=ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    await backend.prepare()  # the device Go flannel left is reused; now its routes:
    left = {
        "live peer": ["10.244.2.0/24", "via", "10.244.2.0", "dev", "flannel.1", "onlink"],
        "vanished peer": ["10.244.77.0/24", "via", "10.244.77.0", "dev", "flannel.1",
                          "onlink"],
        "vanished peer, static": ["10.244.78.0/24", "via", "10.244.78.0", "dev", "flannel.1",
                                  "onlink", "proto", "static"],
        "vanished host-gw peer": ["10.244.79.0/24", "via", "192.168.50.79", "dev", "eth0"],
        "link scope, by hand": ["10.244.76.0/24", "dev", "flannel.1"],
    }
    foreign = {
        "outside the network on our device": ["172.16.9.0/24", "via", "10.244.77.0", "dev",
                                              "flannel.1", "onlink"],
        "another device": ["10.244.80.0/24", "dev", "dummy0"],
        "the whole network": ["10.244.0.0/16", "via", "192.168.50.1", "dev", "eth0",
                              "metric", "500"],
        "a routing daemon's": ["10.244.81.0/24", "via", "10.244.81.0", "dev", "flannel.1",
                               "onlink", "proto", "bird"],
        "blackhole": ["blackhole", "10.244.82.0/24"],
    }
    for route in (*left.values(), *foreign.values()):
        netns.ip("route", "add", *route, netns=ns)
    before = netns.ip("route", "show", netns=ns).stdout
    await backend.activate(OWN)
    async with running(backend, [PEER]) as plane:
        await plane.programmed()
        after = netns.ip("route", "show", netns=ns).stdout
    assert "10.244.2.0/24 via 10.244.2.0 dev flannel.1 proto 151 onlink" in after
    for gone in ("10.244.76.0/24", "10.244.77.0/24", "10.244.78.0/24", "10.244.79.0/24"):
        assert gone in before and gone not in after, after
    for line in [line for line in before.splitlines()
                 if any(line.startswith(f"{r[0]} ") or line.startswith(" ".join(r[:2]))
                        for r in foreign.values())] + [
            "10.244.1.0/24 dev cni0 proto kernel scope link src 10.244.1.1"]:
        assert line in after, f"{line!r} was touched:\n{after}"


async def test_accept_ra_is_off_on_every_vxlan_device(ns):
    underlay(ns)
    backend = await make_backend(ns, {"Type": "vxlan"}, ipv6=True)
    await backend.prepare()
    for device in ("flannel.1", "flannel-v6.1"):
        value = netns.ip("netns", "exec", ns, "cat",
                         f"/proc/sys/net/ipv6/conf/{device}/accept_ra").stdout.strip()
        assert value == "0", device


async def test_host_gw_across_a_router_parks_that_peer_and_says_it_needs_one_segment(ns):
    underlay(ns)
    backend = await make_backend(ns, {"Type": "host-gw"})
    await backend.prepare()
    await backend.activate(OWN)
    routed_peer = Lease(IPv4Network("10.244.2.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address("10.9.0.2"), backend_type="host-gw"))
    async with running(backend, [routed_peer]) as plane:
        await async_wait_until(lambda: asyncio.sleep(0, bool(backend.admission.refused)),
                               5, what="the peer parked")
        ready, why = plane.ready()
    # The kernel's refusal is that peer's problem: this node stays ready, the peer is parked
    # with the refusal and the advice.
    assert (ready, why) == (True, "")
    assert backend.admission.refused == {"10.244.2.0-24": ("kernel_refused", (
        "Network is unreachable (replace route 10.244.2.0/24 via 10.9.0.2); host-gw needs "
        "every node on one L2 segment: a peer's public IP must be directly reachable on eth0, "
        "with no router in between; across routed networks use the vxlan backend "
        "(DirectRouting keeps direct routes for the peers on the same segment)"))}


async def test_a_vni_already_in_use_is_named(ns):
    underlay(ns)
    netns.ip("link", "add", "vx-other", "type", "vxlan", "id", "1", "dev", "eth0", "dstport",
             "8472", netns=ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    with pytest.raises(BackendError) as caught:
        await backend.prepare()
    assert str(caught.value) == (
        "cannot create vxlan device flannel.1: File exists; another device already uses VNI 1 "
        "on port 8472; remove it or choose another VNI")
