"""A backend defined outside the package that runs a process of its own and declares what
doctor checks of it and what ``flannelctl cleanup`` removes of it: the ``test-sleeper``
backend, plugged in by ``register()`` alone.

It models a backend with a userspace engine (as wireguard-go or charon): ``prepare`` starts
its helper, a child process (the running Python, reading peer sets from a pipe and writing
each to a state file; it ends when the pipe closes, so it cannot outlive flanneld), records
its pid under ``run_dir``; its applier hands the helper every peer set; ``close`` closes the
pipe and reaps the helper (killed after a bounded wait). For the tools it declares one
engine entry per peer (``peer_planner``), reads what the helper holds and whether it runs
(``read_engine``: doctor's ``engine`` check judges it), and its leftovers (the helper and
its pid file). Its kernel state is one route per peer via the peer's public address on the
external interface, as host-gw's, so the data plane programs it (a fake kernel in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
import sys
from collections.abc import Sequence
from ipaddress import IPv4Network
from pathlib import Path

from flannel import backend as registry
from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    LocalNetwork,
    PeerPlanner,
    RouteLookup,
)
from flannel.backend.footprint import PER_PEER, Footprint, Leftovers, Place
from flannel.backend.plan import (
    EngineEntry,
    EngineReading,
    FamilyPlan,
    NodeView,
    gateway_address,
)
from flannel.files.fileutil import read_head, write_atomic
from flannel.kernel.reconcile import DesiredState
from flannel.kernel.rtnl import Route
from flannel.lease import Lease
from flannel.process import procstop

TYPE = "test-sleeper"
#: The helper's name: in its command line (how cleanup tells it from other processes) and
#: the place its entries are in.
HELPER_NAME = "flannel-test-sleeper"
ENTRY = "sleeper peer"
#: The helper: writes each line it reads (one peer set: lease keys) to its state file.
HELPER = ("import os, sys\n"
          "state = sys.argv[1]\n"
          "for line in sys.stdin:\n"
          "    with open(state + '.new', 'w') as out:\n"
          "        out.write(line)\n"
          "    os.replace(state + '.new', state)\n")
#: Seconds the helper has to end once its pipe is closed.
STOP_WAIT = 5.0
MAX_STATE = 64 * 1024


def files(run_dir: Path) -> tuple[Path, Path]:
    """(pid file, state file) under a node's /run."""
    return run_dir / f"{HELPER_NAME}.pid", run_dir / f"{HELPER_NAME}.peers"


def helper_pid(run_dir: Path) -> int | None:
    """The pid its pid file names, when that process is our helper and runs."""
    try:
        text, _ = read_head(files(run_dir)[0], 32)
        pid = int(text)
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            command = handle.read(4096).split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if HELPER_NAME.encode() in command and procstop.alive(pid) else None


def peer_route(lease: Lease, underlay: int) -> Route | None:
    if lease.subnet is None or lease.attrs.public_ip is None:
        return None
    return Route(str(lease.subnet), str(lease.attrs.public_ip), underlay)


class SleeperPeers(Applier):
    """Hands the helper every peer set (a line of lease keys on its pipe)."""

    name = "sleeper peers"

    def __init__(self, helper: subprocess.Popen[bytes]) -> None:
        self.helper = helper

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        assert self.helper.stdin is not None
        self.helper.stdin.write((" ".join(sorted(p.key for p in peers)) + "\n").encode())
        self.helper.stdin.flush()
        return ApplyResult()


class SleeperBackend(Backend):
    backend_type = TYPE
    footprint = Footprint(PER_PEER)
    #: The node's /run (flanneld's is /run; a test gives its own).
    run_dir = Path("/run")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.helper: subprocess.Popen[bytes] | None = None
        self.peers: SleeperPeers | None = None

    async def prepare(self) -> LocalNetwork:
        await asyncio.to_thread(self._start_helper)
        return LocalNetwork(TYPE, self.ext.mtu)

    def _start_helper(self) -> None:
        pid_file, state = files(self.run_dir)
        self.helper = subprocess.Popen([sys.executable, "-c", HELPER, str(state), HELPER_NAME],
                                       stdin=subprocess.PIPE)
        self.peers = SleeperPeers(self.helper)
        write_atomic(pid_file, f"{self.helper.pid}\n".encode(), 0o644)

    def desired_state(self, peers: Sequence[Lease], route_get: RouteLookup) -> DesiredState:
        network = self.config.network
        assert network is not None and self.lease is not None and self.lease.subnet
        routes = {route for p in peers if (route := peer_route(p, self.ext.index))}
        return DesiredState(frozenset(routes), networks=(network,),
                            local_subnets=(self.lease.subnet,))

    def entry_peers(self, entry: object, peers: Sequence[Lease]) -> list[Lease]:
        return [p for p in peers if peer_route(p, self.ext.index) == entry]

    def appliers(self) -> Sequence[Applier]:
        return (self.peers,) if self.peers is not None else ()

    def close(self) -> None:
        super().close()
        helper = self.helper
        if helper is None:
            return
        if helper.stdin is not None:
            with contextlib.suppress(OSError):
                helper.stdin.close()
        try:
            helper.wait(STOP_WAIT)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait(STOP_WAIT)
        files(self.run_dir)[0].unlink(missing_ok=True)

    # -- for the operator tools ------------------------------------------------------------

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        def plan(lease: Lease) -> tuple[FamilyPlan, ...]:
            route = peer_route(lease, node.underlay)
            if route is None or lease.subnet is None:
                return ()
            return (FamilyPlan(4, lease.subnet, lease.attrs.public_ip,
                               routes=frozenset({route}),
                               engine=(EngineEntry(ENTRY, HELPER_NAME, lease.key),),
                               answers_on=gateway_address(IPv4Network(lease.subnet))),)
        return plan

    @classmethod
    def read_engine(cls, node: NodeView, root: Path | None) -> EngineReading:
        run_dir = (root or Path("/")) / cls.run_dir.relative_to("/")
        pid = helper_pid(run_dir)
        if pid is None:
            return EngineReading(problems=(
                ("error", f"the {HELPER_NAME} helper is not running",
                 "restart flanneld: it starts the helper"),))
        try:
            text, _ = read_head(files(run_dir)[1], MAX_STATE)
        except OSError as err:
            return EngineReading(unread=f"its state cannot be read: {err.strerror}")
        keys = text.decode(errors="replace").split()
        return EngineReading(entries={(ENTRY, HELPER_NAME, key): EngineEntry(
            ENTRY, HELPER_NAME, key) for key in keys})

    @classmethod
    def leftovers(cls, place: Place) -> Leftovers:
        found = Leftovers()
        if place.run_dir is None:
            return found
        pid = helper_pid(place.run_dir)
        if pid is not None:
            found.items.append((f"process {HELPER_NAME} (pid {pid})",
                                functools.partial(_stop, pid)))
        found.items += [(f"file {path}", functools.partial(path.unlink, missing_ok=True))
                        for path in files(place.run_dir) if path.exists()]
        return found


def _stop(pid: int) -> None:
    if not procstop.stop(pid, STOP_WAIT):
        raise OSError(f"{HELPER_NAME} (pid {pid}) is still running after SIGKILL")


def register(run_dir: Path) -> None:
    """What a package defining a backend does: one line (the run dir is the test's)."""
    SleeperBackend.run_dir = run_dir
    registry.register(TYPE, SleeperBackend)
