"""The paths flanneld's prober probes (``flannel/probing/prober.py``): planned from the
backend's own plan of each peer, ``PLAN_AHEAD`` slots at a time in its worker thread (a
hand-over to the thread costs more than the planning), a peer whose lease changes probed on
its new path although its old one was planned ahead, a peer that leaves not probed again.
The backend is a real host-gw backend; the pinger and the probe are the prober's seams (no
socket: the probe records the path it is given and answers reached); time is a
``FakeClock``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network

from flannel.backend.base import PeerPlanner
from flannel.backend.hostgw import HostGwBackend
from flannel.backend.plan import FamilyPlan, IPAddress, NodeView
from flannel.config import check_network_config, parse_config
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease, LeaseAttrs
from flannel.probing.prober import PLAN_AHEAD, PeerProber
from flannel.probing.schedule import BATCH
from flannel.probing.sequence import OK, Outcome, Path
from flannel.settings import ProbeSettings
from tests.support.clock import FakeClock
from tests.support.waiting import async_wait_until

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.0.1"), None,
                        IPv4Address("192.168.0.1"), None)
OWN = Lease(IPv4Network("10.0.0.0/24"), attrs=LeaseAttrs(public_ip=IPv4Address("192.168.0.1")),
            etcd_lease_id=7)
PEERS = 300  # more than PLAN_AHEAD


def peer(n: int, public: str = "") -> Lease:
    """Peer ``n``: 10.(n / 250 + 1).(n % 250).0/24 at 192.168.(n / 250 + 1).(n % 250 + 1)."""
    third, fourth = n // 250 + 1, n % 250
    return Lease(IPv4Network(f"10.{third}.{fourth}.0/24"),
                 attrs=LeaseAttrs(public_ip=IPv4Address(public or
                                                        f"192.168.{third}.{fourth + 1}"),
                                  backend_type="host-gw"), etcd_lease_id=9)


def gateway(n: int) -> IPv4Address:
    """Where peer ``n`` answers over the overlay: its cni0 gateway."""
    return IPv4Address(f"10.{n // 250 + 1}.{n % 250}.1")


class Planned(HostGwBackend):
    """host-gw, counting the leases its peer planner is asked about."""

    leases: list[str] = []

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        plan = super().peer_planner(node)

        def counted(lease: Lease) -> tuple[FamilyPlan, ...]:
            cls.leases.append(lease.key)
            return plan(lease)

        return counted


class Opened:
    """The pinger's stand-in: it holds this node's overlay address; nothing is sent."""

    def __init__(self, source: IPAddress) -> None:
        self.source: IPAddress | None = source

    def close(self) -> None:
        pass


async def test_paths_are_planned_ahead_and_a_changed_lease_is_probed_on_its_new_path():
    config = parse_config(json.dumps({"Network": "10.0.0.0/8", "SubnetLen": 24,
                                      "Backend": {"Type": "host-gw"}}))
    check_network_config(config)
    backend = Planned(EXT, config)
    backend.lease = OWN
    Planned.leases = []
    peers: tuple[Lease, ...] = tuple(peer(n) for n in range(PEERS))
    probed: list[Path] = []

    async def probe(_pinger: object, path: Path) -> Outcome:
        probed.append(path)
        return Outcome(OK, 0.001)

    def opened(_version: int, sources: Sequence[IPAddress], _host: Host) -> Opened:
        return Opened(sources[0])

    clock = FakeClock()
    prober = PeerProber(backend, ProbeSettings(interval=1, rate=20), 1450, lambda: peers,
                        clock=clock, pinger=opened, probe=probe)  # type: ignore[arg-type]
    running = asyncio.ensure_future(prober.run())

    async def batches(count: int) -> None:
        """Let ``count`` more batches of 10 leave (the first left at the start)."""
        for _ in range(count):
            total = len(probed) + 10
            await clock.advance(BATCH)
            await settled(total)

    async def settled(total: int) -> None:
        async def parked() -> bool:
            return len(probed) >= total and bool(clock.timers())

        await async_wait_until(parked, what=f"{total} probes and the prober waiting")

    def paths_of(n: int) -> list[Path]:
        return [path for path in probed if path.overlay == gateway(n)]

    try:
        await settled(10)
        assert len(probed) == 10  # 300 peers at 20 a second: 10 every half second
        assert len(Planned.leases) == PLAN_AHEAD  # one hand-over for the next 256 slots
        assert [(p.overlay, p.public) for p in probed[:2]] == [
            (gateway(0), IPv4Address("192.168.1.1")), (gateway(1), IPv4Address("192.168.1.2"))]
        # Peer 20 (planned ahead, not probed yet) moves to another public address.
        peers = (*peers[:20], peer(20, "192.168.9.9"), *peers[21:])
        await batches(2)
        assert [path.public for path in paths_of(20)] == [IPv4Address("192.168.9.9")]
        # Peer 299 (planned ahead) leaves: probed no more.
        peers = peers[:-1]
        await batches(PEERS // 10)
        assert paths_of(299) == [] and len(paths_of(298)) == 1
        assert len(paths_of(0)) == 2  # the others' turn comes round again
        assert prober.status.peers == PEERS - 1
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
