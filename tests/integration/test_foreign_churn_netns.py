"""State flanneld does not own costs it nothing, against a real kernel in a namespace: with
thousands of FDB entries on a bridge (as a pod flooding random source MACs makes) and
neighbours on the underlay, a pass reads none of them (and reads the same entries, at a
higher cost, where the kernel cannot filter dumps), their notifications and those of other
routing tables never reach the decoder, and drift of our own entries is still seen and
repaired."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from flannel.backend.routed import RoutedBackend
from flannel.kernel import events, rtnl
from flannel.kernel.host import Host
from flannel.kernel.reconcile import read_actual, read_unless_converged, reconcile
from tests.support import netns
from tests.support.netns_dataplane import (
    OWN,
    make_backend,
    programmed_for,
    running,
    underlay,
    vxlan_peer,
)
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.netns

FOREIGN_FDB = 5000
FOREIGN_NEIGHBOURS = 500
PEERS = [vxlan_peer(third) for third in range(2, 6)]


def bridge(ns: str, *args: str) -> None:
    subprocess.run(["bridge", "-n", ns, *args], check=True, timeout=20, capture_output=True)


def ifindex(ns: str, name: str) -> int:
    return int(netns.ip("-o", "link", "show", name, netns=ns).stdout.split(":")[0])


def foreign_tables(ns: str, tmp: Path) -> None:
    """cni0 (a bridge with one veth port) holding FOREIGN_FDB static entries, and
    FOREIGN_NEIGHBOURS neighbours on the underlay: none of it flannel's."""
    netns.ip("link", "add", "cni0", "type", "bridge", netns=ns)
    netns.ip("link", "add", "vethpod0", "type", "veth", "peer", "name", "vethpod1", netns=ns)
    netns.ip("link", "set", "vethpod0", "master", "cni0", netns=ns)
    for dev in ("cni0", "vethpod0", "vethpod1"):
        netns.ip("link", "set", dev, "up", netns=ns)
    fdb = tmp / "fdb.batch"
    fdb.write_text("".join(f"fdb add 02:aa:00:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:"
                           f"{i & 255:02x} dev vethpod0 master static\n"
                           for i in range(FOREIGN_FDB)))
    bridge(ns, "-batch", str(fdb))
    neigh = tmp / "neigh.batch"
    neigh.write_text("".join(
        f"neigh add 192.168.{51 + (i >> 8)}.{i & 255} lladdr 02:bb:00:00:{i >> 8:02x}:"
        f"{i & 255:02x} dev {'eth0' if i % 2 else 'cni0'}\n"
        for i in range(FOREIGN_NEIGHBOURS)))
    subprocess.run(["ip", "-n", ns, "-batch", str(neigh)], check=True, timeout=60,
                   capture_output=True)


async def vxlan_backend(ns: str) -> RoutedBackend:
    underlay(ns)
    backend = await make_backend(ns, {"Type": "vxlan"})
    await backend.prepare()
    await backend.activate(OWN)
    return backend


async def test_a_pass_reads_nothing_of_other_devices_tables(ns, tmp_path):
    backend = await vxlan_backend(ns)
    await asyncio.to_thread(foreign_tables, ns, tmp_path)
    with rtnl.Rtnl(Host(ns)) as sock:
        assert sock.strict  # this kernel filters dumps: what the bound below relies on
        await asyncio.to_thread(sock.neighbours, rtnl.AF_BRIDGE)
        assert sock.dumped >= FOREIGN_FDB  # an unfiltered dump reads every foreign entry
        desired = backend.desired_state(PEERS, sock.route_get)
        first = await asyncio.to_thread(reconcile, sock, desired)
        assert first.total() == 3 * len(PEERS)
        sock.dumped = 0
        assert not await asyncio.to_thread(reconcile, sock, desired)
        # Our routes (by protocol, then by device), neighbours and FDB entries, and the
        # underlay's two routes: none of the 5500 foreign entries.
        assert sock.dumped <= 4 * len(PEERS) + 2


async def test_without_strict_dump_checking_a_pass_reads_the_same(ns, tmp_path):
    """Kernels before 4.20 ignore dump filters (and read the FDB dump's ifindex from an
    ifinfomsg header): the option turned off, this kernel takes those paths."""
    backend = await vxlan_backend(ns)
    await asyncio.to_thread(foreign_tables, ns, tmp_path)
    with rtnl.Rtnl(Host(ns)) as strict, rtnl.Rtnl(Host(ns)) as legacy:
        legacy.sock.setsockopt(rtnl.SOL_NETLINK, rtnl.NETLINK_GET_STRICT_CHK, 0)
        legacy.strict = False
        desired = backend.desired_state(PEERS, strict.route_get)
        await asyncio.to_thread(reconcile, strict, desired)
        # Adoptable: what Go flannel would leave for a peer gone while no daemon ran.
        netns.ip("route", "add", "10.244.77.0/24", "via", "10.244.77.0", "dev", "flannel.1",
                 "onlink", netns=ns)
        ours = await asyncio.to_thread(read_actual, strict, desired)
        assert len(ours.fdb) == len(ours.neighbours) == len(PEERS)
        assert [r.dst for r in ours.adopted] == ["10.244.77.0/24"]
        assert await asyncio.to_thread(read_actual, legacy, desired) == ours
        # Every device's neighbours were read and filtered here; the legacy FDB dump still
        # selects the device from the ifinfomsg header (since Linux 4.12).
        assert FOREIGN_NEIGHBOURS < legacy.dumped < FOREIGN_FDB
        # A periodic pass's read: the same answer, made of desired's own sets (no entry of
        # the dumps held), with either kind of kernel; none once a desired entry is gone.
        for sock in (strict, legacy):
            counted = await asyncio.to_thread(read_unless_converged, sock, desired)
            assert counted == ours
            assert counted is not None and counted.routes is desired.routes \
                and counted.fdb is desired.fdb
        gone = next(iter(desired.neighbours))
        netns.ip("neigh", "del", gone.ip, "dev", "flannel.1", netns=ns)
        for sock in (strict, legacy):
            assert await asyncio.to_thread(read_unless_converged, sock, desired) is None
        assert gone not in (await asyncio.to_thread(read_actual, strict, desired)).neighbours


async def test_foreign_neighbour_events_never_reach_the_decoder(ns, tmp_path, monkeypatch):
    backend = await vxlan_backend(ns)
    ours = ifindex(ns, "flannel.1")
    decoded: list[int] = []  # the ifindex of every neighbour or FDB message decoded
    tables: set[int] = set()  # the tables of the route messages decoded
    decode = events.decode

    def counting(msg_type: int, body: bytes) -> events.KernelEvent | None:
        if msg_type in (rtnl.RTM_NEWROUTE, rtnl.RTM_DELROUTE):
            route = rtnl.decode_route(body)
            tables.add(route[2] if route else -1)
        event = decode(msg_type, body)
        if event is not None and isinstance(event.obj, rtnl.Neighbour | rtnl.FdbEntry):
            decoded.append(event.obj.ifindex)
        return event

    monkeypatch.setattr(events, "decode", counting)
    seen: list[events.KernelEvent] = []
    with rtnl.Rtnl(Host(ns)) as sock:
        await asyncio.to_thread(reconcile, sock, backend.desired_state(PEERS, sock.route_get))
        interest = events.EventFilter(sock.port, frozenset({ours}))
        watch = asyncio.create_task(events.watch(seen.append, lambda: None, Host(ns),
                                                 interest))
        try:
            await asyncio.sleep(0)  # the watch subscribes before its first wait
            await asyncio.to_thread(foreign_tables, ns, tmp_path)
            netns.ip("route", "add", "10.99.0.0/24", "dev", "eth0", "table", "100", netns=ns)
            netns.ip("route", "add", "10.99.1.0/24", "dev", "eth0", netns=ns)
            # Notifications are queued in order: once these are seen, every foreign one
            # before them was either delivered or dropped.
            netns.ip("neigh", "del", "10.244.2.0", "dev", "flannel.1", netns=ns)
            await asyncio.to_thread(bridge, ns, "fdb", "del", "0e:00:00:00:00:03", "dev",
                                    "flannel.1", "dst", "192.168.50.3", "self")
            await async_wait_until(lambda: asyncio.sleep(0, {
                type(e.obj) for e in seen if e.deleted} >= {rtnl.Neighbour, rtnl.FdbEntry}),
                5.0, what="the deletions of our neighbour and FDB entry")
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
    assert decoded and set(decoded) == {ours}
    assert tables == {rtnl.RT_TABLE_MAIN}  # the route in table 100 never reached it


async def test_drift_of_ours_is_repaired_under_foreign_churn(ns, tmp_path):
    backend = await vxlan_backend(ns)
    async with running(backend, PEERS) as plane:
        await plane.programmed()
        await asyncio.to_thread(foreign_tables, ns, tmp_path)
        netns.ip("route", "del", "10.244.4.0/24", netns=ns)
        netns.ip("neigh", "del", "10.244.5.0", "dev", "flannel.1", netns=ns)
        await asyncio.to_thread(bridge, ns, "fdb", "del", "0e:00:00:00:00:02", "dev",
                                "flannel.1", "dst", "192.168.50.2", "self")
        await async_wait_until(lambda: asyncio.to_thread(programmed_for, ns, PEERS), 5.0,
                               what="our route, neighbour and FDB entry back")
        await plane.programmed()
        status = plane.dataplane.status
        assert status.event_overruns == 0
        assert {"route", "neighbour", "fdb"} <= set(status.repaired)
