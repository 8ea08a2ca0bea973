"""Benchmark: Python heap bytes flanneld keeps per peer (etcd mode, vxlan backend).

Builds, for N synthetic vxlan peers, the objects a running flanneld keeps, the way the daemon
builds them: the etcd subnet manager decodes the listing (etcd-shaped key/value records whose
values are the JSON Go flannel writes) and remembers it, the lease watcher filters and caches
it, the data plane is handed the peer set and runs its first (full) pass and then an
incremental one with the backend's desired state, against the netlink stand-in
``tests/support/fakenetlink.py`` (no kernel events: a daemon's event socket filters out the
echo of its own changes). Figure: tracemalloc bytes still allocated after each stage, less
the same build with 0 peers, divided by N; and the traced peak, likewise. The stand-in's own
tables are left out (the kernel holds its memory outside flanneld), and it keeps copies of
what it is given, as a kernel does, so nothing of ours stays alive only through it.
Baseline, in the same run: the raw JSON bytes per lease value. Byte counts do not depend on
the machine's load.

    .venv/bin/python -m bench.peer_bytes --peers 5000
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import secrets
import subprocess
import time
import tracemalloc
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.backend.vxlan import VxlanBackend, _Family
from flannel.clients.etcd import KeyValue
from flannel.config import NetworkConfig, check_network_config, parse_config
from flannel.dataplane.loop import COMPONENT, Dataplane
from flannel.kernel.device import VxlanSpec
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease, LeaseAttrs
from flannel.reporting.readiness import Readiness
from flannel.subnet.etcd.manager import EtcdSubnetManager
from flannel.subnet.watch import LeaseWatcher, Snapshot
from tests.support import fakenetlink

PREFIX = "/coreos.com/network"
NETWORK = {"Network": "10.0.0.0/8", "SubnetLen": 24, "Backend": {"Type": "vxlan"}}
EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("172.30.0.2"), None,
                        IPv4Address("172.30.0.2"), None)
OWN = Lease(IPv4Network("10.1.0.0/24"), attrs=LeaseAttrs(public_ip=EXT.ext_addr,
                                                         backend_type="vxlan"))


def records(peers: int) -> list[KeyValue]:
    """The listing etcd returns: one record per peer, as Go flannel writes them."""
    out = []
    for i in range(peers):
        second, third = 100 + i // 250, i % 250
        value = {"PublicIP": f"172.30.{1 + i // 250}.{1 + i % 250}", "PublicIPv6": None,
                 "BackendType": "vxlan",
                 "BackendData": {"VNI": 1, "VtepMAC": f"0e:00:00:00:{second:02x}:{third:02x}"}}
        out.append(KeyValue(f"{PREFIX}/subnets/10.{second}.{third}.0-24".encode(),
                            json.dumps(value, separators=(",", ":")).encode(),
                            0x1000 + i, 10 + i, 10 + i))
    return out


class _Listing:
    """The one etcd client call a listing makes, answered with ``records``."""

    def __init__(self, kvs: list[KeyValue]) -> None:
        self.kvs = kvs

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        return self.kvs, 10 + len(self.kvs)


class _CopyingKernel(fakenetlink.FakeKernel):
    """Keeps a copy of each entry it is given, texts included, as the kernel keeps its own
    (an entry made only to be encoded must not stay alive through the stand-in)."""

    def put(self, obj: object, protocol: int = 0) -> None:
        assert dataclasses.is_dataclass(obj) and not isinstance(obj, type)
        super().put(dataclasses.replace(obj, **{
            f.name: value.encode().decode() for f in dataclasses.fields(obj)
            if isinstance(value := getattr(obj, f.name), str)}), protocol)


_COPY_LINES = {line for _start, _end, line in _CopyingKernel.put.__code__.co_lines()}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


async def _no_events(_on_event: Any, _on_overrun: Any) -> None:
    """The kernel's echo of our own changes, which the event socket filters out."""
    await asyncio.Event().wait()


def network_config() -> NetworkConfig:
    config = parse_config(json.dumps(NETWORK))
    check_network_config(config)
    return config


def vxlan_backend() -> VxlanBackend:
    backend = VxlanBackend(EXT, network_config())
    spec = VxlanSpec("flannel.1", 1, 0, EXT.iface_addr, 2, False, False, 1450,
                     "0e:00:00:00:00:01")
    backend.families[4] = _Family(spec, index=7, mac=spec.mac)
    backend.lease = OWN
    return backend


def flanneld_owns(traceback: tracemalloc.Traceback) -> bool:
    """Whether an allocation is flanneld's: each is charged to the innermost frame of this
    project, and what the netlink stand-in itself allocates is the kernel's memory."""
    frame = next((f for f in reversed(traceback) if f.filename.startswith(ROOT)), None)
    return frame is None or not (frame.filename == fakenetlink.__file__ or (
        frame.filename == __file__ and frame.lineno in _COPY_LINES))


def traced(snapshot: tracemalloc.Snapshot) -> int:
    return sum(stat.size for stat in snapshot.statistics("traceback")
               if flanneld_owns(stat.traceback))


#: The highest traced size between measurements (what taking a snapshot allocates is left out).
PEAK = [0]


def measure() -> int:
    PEAK[0] = max(PEAK[0], tracemalloc.get_traced_memory()[1])
    gc.collect()
    size = traced(tracemalloc.take_snapshot())
    tracemalloc.reset_peak()
    return size


async def build(kvs: list[KeyValue], marks: list[tuple[str, int]]) -> list[Any]:
    """Every stage the daemon runs, keeping what it keeps; a mark after each."""
    base = measure()
    sm = EtcdSubnetManager(_Listing(kvs))  # type: ignore[arg-type]
    leases, _revision = await sm.list_leases()
    snapshot = Snapshot(leases)
    sm._remember(snapshot)
    marks.append(("store: leases decoded and remembered", measure() - base))
    watcher = LeaseWatcher(OWN, network_config())
    watcher.apply(snapshot)
    del leases, snapshot
    marks.append(("lease watcher: peers filtered and cached", measure() - base))
    kernel = _CopyingKernel()
    dataplane = Dataplane(vxlan_backend(), Readiness([COMPONENT]), netlink=kernel.open,
                          watch=_no_events)
    task = asyncio.create_task(dataplane.run())
    for version in (1, 2):  # a full pass, then an incremental one with the same peers
        dataplane.set_peers(watcher.leases)
        deadline = time.monotonic() + 120
        while dataplane.status.programmed_version < version:
            if task.done() or time.monotonic() > deadline:
                raise RuntimeError(f"pass {version} did not finish: {dataplane.status}")
            await asyncio.sleep(0.01)
    if len(kernel.ours()) != 3 * len(kvs):
        raise RuntimeError(f"the kernel holds {len(kernel.ours())} entries, not 3 per peer")
    marks.append(("data plane: desired and programmed entries", measure() - base))
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return [sm, watcher, dataplane]


def run(peers: int) -> tuple[list[tuple[str, int]], int, int]:
    """The marks of ``build``, the lease JSON bytes, and the traced peak."""
    kvs = records(peers)
    raw = sum(len(kv.value) for kv in kvs)
    marks: list[tuple[str, int]] = []
    tracemalloc.start(64)
    try:
        PEAK[0] = 0
        kept = asyncio.run(build(kvs, marks))
        peak = PEAK[0]
        del kept
    finally:
        tracemalloc.stop()
    return marks, raw, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=5000)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    # The backend sets up its vxlan device through the real kernel (only the entries go to
    # the stand-in): in a namespace of this run's own, whose eth0 is the spec's index 2.
    netns = f"pfbench{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", netns], check=True, timeout=30)
    try:
        for command in (["link", "add", "eth0", "type", "veth", "peer", "name", "eth1"],
                        ["addr", "add", f"{EXT.iface_addr}/16", "dev", "eth0"],
                        ["link", "set", "eth0", "up"]):
            subprocess.run(["ip", "-n", netns, *command], check=True, timeout=30)
        with Host(netns).entered():
            empty, _, empty_peak = run(0)
            marks, raw, peak = run(args.peers)
    finally:
        subprocess.run(["ip", "netns", "delete", netns], check=False, timeout=30)
    per_lease = raw / args.peers
    print(f"{args.peers} vxlan peers; load average {load:.2f} on {os.cpu_count()} cores")
    print(f"baseline: {per_lease:.0f} bytes of lease value JSON per peer")
    previous = 0.0
    for (label, size), (_, fixed) in zip(marks, empty, strict=True):
        per_peer = (size - fixed) / args.peers
        print(f"  {label:46s} {per_peer:7.0f} B/peer (+{per_peer - previous:5.0f})")
        previous = per_peer
    print(f"total: {previous:.0f} bytes per peer, {previous / per_lease:.1f} x the lease JSON")
    print(f"peak while building (the stand-in's tables and the passes' transients included): "
          f"{(peak - empty_peak) / args.peers:.0f} B/peer")


if __name__ == "__main__":
    main()
