"""A data plane programming a network namespace's kernel for the reconcile tests: the underlay, a
backend made in the namespace, the data plane running, vxlan peers and whether the kernel holds
what they need."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from ipaddress import IPv4Address, IPv4Network, IPv6Network

from flannel.backend.base import BackendOptions
from flannel.backend.hostgw import HostGwBackend
from flannel.backend.routed import RoutedBackend
from flannel.backend.vxlan import VxlanBackend
from flannel.config import check_network_config, parse_config
from flannel.dataplane.loop import COMPONENT, Dataplane
from flannel.kernel.host import Host
from flannel.kernel.iface import IfaceOptions, read_snapshot, select_external_interface
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.readiness import Readiness
from tests.support import netns
from tests.support.waiting import async_wait_until

OWN = Lease(IPv4Network("10.244.1.0/24"), IPv6Network("fd00:244:0:1::/64"))


def underlay(ns: str) -> None:
    """eth0 (192.168.50.2/24, fd00:50::2/64) with a default route."""
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", "192.168.50.2/24", "dev", "eth0", netns=ns)
    netns.ip("addr", "add", "fd00:50::2/64", "dev", "eth0", "nodad", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    netns.ip("link", "set", "eth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "192.168.50.1", netns=ns)


async def make_backend(ns: str, backend: dict, ipv6: bool = False) -> RoutedBackend:
    doc = {"Network": "10.244.0.0/16", "Backend": backend}
    if ipv6:
        doc.update(EnableIPv6=True, IPv6Network="fd00:244::/48")
    config = parse_config(json.dumps(doc))
    check_network_config(config)
    # The snapshot is read with blocking netlink requests: keep them off the event loop.
    snapshot = await asyncio.to_thread(read_snapshot, Host(ns))
    ext = select_external_interface(snapshot, IfaceOptions(ifaces=["eth0"]), ipv6=ipv6)
    cls = VxlanBackend if backend["Type"] == "vxlan" else HostGwBackend
    return cls(ext, config, BackendOptions(host=Host(ns)))


class Running:
    """A data plane running a backend in a namespace, and what its readiness said."""

    def __init__(self, backend: RoutedBackend) -> None:
        self.readiness = Readiness([COMPONENT])
        self.dataplane = Dataplane(backend, self.readiness, interval=300)
        self.task: asyncio.Task | None = None
        self.seen: list[tuple[bool, str]] = []  # every reported change, as it happened
        report = self.readiness.report

        def recording(component: str, ready: bool, reason: str = "") -> None:
            report(component, ready, reason)
            if not self.seen or self.seen[-1] != self.readiness.current():
                self.seen.append(self.readiness.current())

        self.readiness.report = recording  # type: ignore[method-assign]

    def ready(self) -> tuple[bool, str]:
        return self.readiness.current()

    async def programmed(self, timeout: float = 10.0) -> None:
        await async_wait_until(lambda: asyncio.sleep(0, self.ready()[0]), timeout,
                               what=f"programmed: {self.ready()}")


@contextlib.asynccontextmanager
async def running(backend: RoutedBackend, peers: list[Lease]) -> AsyncIterator[Running]:
    """The data plane started with ``peers``; cancelled (and its socket closed) after."""
    plane = Running(backend)
    plane.task = asyncio.create_task(plane.dataplane.run())
    plane.dataplane.set_peers(peers)
    try:
        yield plane
    finally:
        plane.task.cancel()
        await asyncio.gather(plane.task, return_exceptions=True)


def vxlan_peer(third: int, mac_suffix: int | None = None) -> Lease:
    mac = f"0e:00:00:00:00:{mac_suffix if mac_suffix is not None else third:02x}"
    return Lease(IPv4Network(f"10.244.{third}.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address(f"192.168.50.{third}"), backend_type="vxlan",
        backend_data=json.dumps({"VNI": 1, "VtepMAC": mac})))


def programmed_for(ns: str, peers: list[Lease]) -> bool:
    """Whether the kernel holds exactly the routes, neighbours and FDB entries of ``peers``
    (IPv4) and nothing else of ours."""
    routes = netns.ip("-4", "route", "show", "proto", "151", netns=ns).stdout.splitlines()
    neighbours = netns.ip("-4", "neigh", "show", "dev", "flannel.1", "nud", "permanent",
                          netns=ns).stdout.splitlines()
    fdb = subprocess.run(["bridge", "-n", ns, "fdb", "show", "dev", "flannel.1"],
                         capture_output=True, text=True, timeout=20, check=True).stdout
    want_routes, want_neighbours, want_fdb = set(), set(), set()
    for peer in peers:
        base = str(peer.subnet.network_address)
        mac = json.loads(peer.attrs.backend_data)["VtepMAC"]
        want_routes.add(f"{peer.subnet} via {base} dev flannel.1 onlink")
        want_neighbours.add(f"{base} lladdr {mac} PERMANENT")
        want_fdb.add(f"{mac} dst {peer.attrs.public_ip} self permanent")
    have_fdb = {line.replace(" dev flannel.1", "").strip() for line in fdb.splitlines()
                if "dst" in line}
    def shown(lines: list[str]) -> set[str]:
        return {line.replace(" proto 151", "").strip() for line in lines}

    return (shown(routes), shown(neighbours), have_fdb) == (want_routes, want_neighbours,
                                                             want_fdb)
