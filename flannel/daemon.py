"""flanneld: wires a subnet manager (the lease store) to a backend and its data plane.

Owns the startup order of upstream (health server, config, interface, backend, lease, traffic
rules, subnet.env, lease watch, renewal), retries of the startup store phases while the store
is unavailable (a store error that retrying cannot fix exits 1 with its message), retries of
the subnet.env write, the lease-to-data-plane flow (the full set of remote leases is handed
to the data plane after every change, so it reconciles rather than patches), the readiness
components it reports itself (startup phase, subnet.env, store status, this node's record
as the store keeps it, rules; the data plane reports its own) and their reading (log lines,
systemd told once), and the supervision of its tasks: they run in one ``asyncio.TaskGroup``;
a task that fails, or one meant to run forever that returns, stops the daemon with exit 1;
this node's lease removed on purpose stops it with exit 0 (where the store says removal is
revocation: etcd; kube puts it back). A signal stops the process and leaves the lease,
subnet.env, the rules and every kernel object in place so that a restart is hitless; a
second signal kills. The backend is closed through an ``AsyncExitStack`` once the tasks,
the data plane among them, have ended (or start-up failed after it was created).
Everything it creates is injectable (store, backend, data plane, interface selection, rules)
so it runs in-process in tests; the defaults are production's.
Must not touch: store internals or kernel internals beyond the interfaces it calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from flannel import log as flannel_log
from flannel.backend import Backend, BackendConfigError, BackendError, backend_class
from flannel.backend.base import BackendOptions, Encapsulation
from flannel.config import ConfigError, NetworkConfig, network_overlaps_underlay
from flannel.dataplane import heap
from flannel.dataplane.loop import Dataplane
from flannel.kernel.iface import ExternalInterface, InterfaceError, PublicIPs, select_interface
from flannel.kernel.privilege import PrivilegeError, privilege_refusal
from flannel.kernel.rtnl import NetlinkError
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.log import V2
from flannel.monitor.health import HealthServer
from flannel.monitor.localsock import LocalSocket, SocketError, listen, socket_path
from flannel.monitor.nodestate import NodeState
from flannel.monitor.sdnotify import notify
from flannel.process.fdlimit import raise_open_files_limit
from flannel.reporting.readiness import Readiness
from flannel.rules.build import traffic_rules
from flannel.rules.iptables import RulesError
from flannel.settings import InterfaceSettings, RulesSettings, Settings, options_line
from flannel.subnet import open_store
from flannel.subnet.envfile import SubnetEnv, write_subnet_env
from flannel.subnet.errors import OwnLeaseRevoked, RetryLog, StoreError, StoreUnavailable
from flannel.subnet.manager import SubnetManager
from flannel.subnet.watch import LeaseUpdate, LeaseWatcher, Snapshot
from flannel.timing.backoff import Backoff

if TYPE_CHECKING:
    from flannel.rules.manager import RulesStatus
    from flannel.rules.spec import PeerAddresses

log = logging.getLogger("flanneld")
T = TypeVar("T")

CONFIG_BACKOFF = (1.0, 1.0)  # upstream retries the config every second
ACQUIRE_BACKOFF = (0.5, 10.0)  # first and longest wait between acquisition attempts
SUBNET_ENV_BACKOFF = (0.5, 30.0)
#: Lease updates with more events than this log them in one line (each one at -v).
SNAPSHOT_LINES = 20
#: The readiness components, in the order their reasons are shown.
COMPONENTS = ("startup", "subnet.env", "store", "lease", "rules", "dataplane")
#: What a task may fail with by design (the message says what to fix). Anything else is a
#: bug: logged with its traceback, and flanneld exits for its supervisor to restart it.
DECLARED_FAILURES = (OSError, StoreError, StoreUnavailable, BackendError, ConfigError,
                     RulesError, PrivilegeError)


class StartupError(Exception):
    """flanneld cannot start; the message says what to fix."""


class TaskFailed(Exception):
    """A supervised task failed, or returned although it should run until flanneld stops."""


class _Stopped(Exception):
    """A signal asked the daemon to stop (ends the task group)."""


class Rules(Protocol):
    """What the daemon needs of the traffic rules (``flannel.rules.manager.TrafficManager``):
    one attempt at installing them, the next attempt (a new peer set, or the periodic
    check), the peer addresses of the encapsulation filter, and the outcome."""

    status: RulesStatus

    async def start(self) -> None: ...

    async def next(self) -> None: ...

    def set_peers(self, peers: PeerAddresses) -> None: ...


@dataclass(frozen=True)
class Supervised:
    name: str
    work: Coroutine[Any, Any, object]
    forever: bool = True


SelectInterface = Callable[[InterfaceSettings, NetworkConfig, PublicIPs],
                           Awaitable[ExternalInterface]]
MakeBackend = Callable[[ExternalInterface, NetworkConfig, BackendOptions], Backend]
#: The rules of the flags for our lease, given the backend's encapsulation.
MakeRules = Callable[[RulesSettings, NetworkConfig, Lease, Encapsulation], Rules]


def make_backend(ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions) -> Backend:
    return backend_class(config.backend_type)(ext, config, options)


async def unless_stopped(call: Callable[[], Awaitable[T]], stop: asyncio.Event
                         ) -> tuple[bool, T | None]:
    """(True, ``call``'s result), or (False, None) once ``stop`` is set first: the call is
    cancelled then, so a store that answers slowly or never cannot hold a shutdown."""
    work = asyncio.ensure_future(call())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((work, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        return False, None
    return True, work.result()


async def retried(call: Callable[[], Awaitable[T]], what: str, fatal: str,
                  backoff: Backoff, stop: asyncio.Event) -> T | None:
    """``call``'s result, retried with ``backoff`` while the store is unavailable (logged as
    ``what``); a fatal store error stops flanneld with ``fatal`` and the reason; None when
    ``stop`` is set first (a call under way is cancelled)."""
    retries = RetryLog(log, what)
    while not stop.is_set():
        try:
            done, result = await unless_stopped(call, stop)
            if not done:
                return None
        except StoreError as err:
            raise StartupError(f"{fatal}: {err}") from None
        except StoreUnavailable as err:
            retries.failed(err, backoff.delay)
            await backoff.wait(stop)
            continue
        retries.succeeded()
        return result
    return None


async def wait_for_config(sm: SubnetManager, stop: asyncio.Event) -> NetworkConfig | None:
    """Fetch the network config, retrying every second while the store cannot give it."""
    try:
        return await retried(sm.get_network_config, "Couldn't fetch network config",
                             "Couldn't fetch network config", Backoff(*CONFIG_BACKOFF), stop)
    except ConfigError as err:
        raise StartupError(f"invalid network config: {err.describe()}") from None


def refuse_unsupported_families(config: NetworkConfig, backend: Backend) -> None:
    """The store leases a subnet of every family the config enables: IPv6 only to a backend
    whose footprint carries it (most refuse it in ``prepare`` already, in their words)."""
    if config.enable_ipv6 and not backend.footprint.dual_stack:
        raise BackendConfigError(f"the {config.backend_type} backend carries IPv4 only: set "
                                 "EnableIPv6 to false in the network config")


async def acquire_lease(sm: SubnetManager, config: NetworkConfig, attrs: LeaseAttrs,
                        stop: asyncio.Event) -> Lease | None:
    """Our lease, retrying with backoff while the store is unavailable; None when stopped."""
    return await retried(lambda: sm.acquire_lease(config, attrs), "Couldn't acquire a lease",
                         "failed to acquire lease", Backoff(*ACQUIRE_BACKOFF), stop)


class Daemon:
    def __init__(self, settings: Settings, *,
                 store: Callable[[Settings], SubnetManager] = lambda s: open_store(s.store),
                 interface: SelectInterface = select_interface,
                 backend: MakeBackend = make_backend,
                 dataplane: type[Dataplane] = Dataplane,
                 rules: MakeRules = traffic_rules) -> None:
        self.settings = settings
        self._open_store = store
        self._select_interface = interface
        self._make_backend = backend
        self._dataplane_class = dataplane
        self._make_rules = rules
        self.stop = asyncio.Event()
        probes = settings.probes
        # Readiness waits for the peers only when asked: by default a node is ready once
        # its own data plane is programmed, whatever its peers.
        self.readiness = Readiness((*COMPONENTS, "peers") if probes.enabled and probes.readiness
                                   else COMPONENTS)
        self._phase = "waiting for the network config"
        self._started = False
        self._backend: Backend | None = None  # interrupted by the first signal
        self.readiness.report("startup", False, self._phase)
        #: What /status and /metrics read; filled in as the parts are created.
        self.state = NodeState(self.readiness, options=settings.options)

    def phase(self, what: str) -> None:
        """The startup step under way; with what the store waits for, if it does."""
        self._phase = what
        store = self.state.store
        why = store.status.reason if store is not None and not store.status.ready else ""
        self.readiness.report("startup", False, f"{what}: {why}" if why else what)

    def _store_status(self, ready: bool, why: str) -> None:
        self.readiness.report("store", ready, why)
        if not self._started:
            self.phase(self._phase)

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            log.info("Received %s, shutting down (the lease and data plane stay in place); "
                     "send it again to exit immediately", signal.Signals(signum).name)
            self._remove_signals()
            self.stop.set()
            if self._backend is not None:  # a cloud call under way must not hold the exit
                self._backend.interrupt()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)

    @staticmethod
    def _remove_signals() -> None:
        """Back to the default actions: a second signal kills at once."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    async def run(self) -> int:
        self._install_signals()
        try:
            return await self._serve()
        finally:
            self._remove_signals()

    async def _serve_locally(self, health: HealthServer) -> LocalSocket | None:
        """The health endpoints on the local socket next to subnet.env, for flannelctl;
        flanneld runs without it (with a warning) when it cannot be made."""
        path = socket_path(self.settings.files.subnet_file)
        try:
            local = listen(path)
        except (SocketError, OSError) as err:
            log.warning("Not serving flannelctl on %s: %s", path,
                        err if isinstance(err, SocketError) else err.strerror or err)
            return None
        await health.start_unix(local.sock)
        self.state.socket = str(path)
        log.info("Serving /healthz, /readyz, /metrics and /status to flannelctl on %s "
                 "(mode 0600)", path)
        return local

    async def _serve(self) -> int:
        health = HealthServer(self.readiness.current, self.state)
        self.state.health = health.stats
        if self.settings.health.port:
            ip, port = self.settings.health.ip, self.settings.health.port
            try:
                await health.start(ip, port)
            except OSError as err:
                raise StartupError(f"--healthz-ip/--healthz-port {ip}:{port}: "
                                   f"{err.strerror}") from None
            self.state.health_address = f"{ip}:{port}"
        local = await self._serve_locally(health)
        try:
            try:
                sm = self._open_store(self.settings)
            except StoreError as err:
                raise StartupError(str(err)) from None
            self.state.store = sm
            sm.status.follow(self._store_status)
            try:
                return await self._run_with(sm)
            except StoreError as err:
                raise StartupError(str(err)) from None
            finally:
                await sm.close()
        finally:
            await health.stop()
            if local is not None:
                local.remove()

    async def _start_backend(self, sm: SubnetManager, config: NetworkConfig,
                             ext: ExternalInterface, closing: contextlib.AsyncExitStack
                             ) -> tuple[Backend, Lease, int] | None:
        """The backend prepared and activated on our lease, and the MTU; None if stopped.
        Its ``close`` is pushed on ``closing`` as soon as it exists (kernel state stays)."""
        try:
            backend = self._make_backend(ext, config, BackendOptions(
                encap_peers_only=self.settings.rules.encap_peers_only))
            self._backend = backend
            closing.push_async_callback(asyncio.to_thread, backend.close)
            self.phase(f"setting up the {config.backend_type} backend")
            local = await backend.prepare()
            refuse_unsupported_families(config, backend)
            attrs = LeaseAttrs(public_ip=local.public_ip or ext.ext_addr,
                               public_ipv6=local.public_ipv6 or ext.ext_v6_addr,
                               backend_type=local.backend_type,
                               backend_data=local.backend_data,
                               backend_v6_data=local.backend_v6_data)
            self.phase("acquiring a lease")
            lease = await acquire_lease(sm, config, attrs, self.stop)
            if lease is None:  # stopped by a signal while the store was unavailable
                return None
            await backend.activate(lease)
        except (BackendError, NetlinkError) as err:
            if self.stop.is_set():  # the signal cut the backend's start short
                return None
            # EPERM first: a device helper's own advice would send the operator astray.
            refusal = privilege_refusal(err)
            raise StartupError(str(refusal or err)) from None
        except ConfigError as err:
            raise StartupError(f"invalid network config: {err.describe()}") from None
        return backend, lease, local.mtu

    async def _run_with(self, sm: SubnetManager) -> int:
        config = await wait_for_config(sm, self.stop)
        if config is None:
            return 0
        self.state.config = config
        log.info("Network config: backend %r, network %s%s", config.backend_type,
                 config.network, f", IPv6 network {config.ipv6_network}"
                 if config.enable_ipv6 else "")
        rules = self.settings.rules
        if not config.enable_nftables and (rules.ip_masq or rules.forward):
            from flannel.rules.manager import check_br_netfilter

            try:
                check_br_netfilter([v for v, on in ((4, config.enable_ipv4),
                                                    (6, config.enable_ipv6)) if on])
            except RulesError as err:
                raise StartupError(str(err)) from None
        self.phase("reading this node's public IP from the store")
        imposed = await retried(sm.public_ip_overrides, "Couldn't read this node's public IP",
                                "Couldn't read this node's public IP", Backoff(*ACQUIRE_BACKOFF),
                                self.stop)
        if imposed is None:
            return 0
        self.phase("selecting the external interface")
        try:
            ext = await self._select_interface(self.settings.interface, config, imposed)
        except InterfaceError as err:
            raise StartupError(str(err)) from None
        if overlap := network_overlaps_underlay(config, (ext.iface_addr, ext.ext_addr,
                                                         ext.iface_v6_addr, ext.ext_v6_addr)):
            raise StartupError(f"invalid network config: {overlap}")
        log.info("Using interface with name %s and address %s", ext.name,
                 ext.iface_addr or ext.iface_v6_addr)
        log.info("Defaulting external address to interface address (%s)"
                 if ext.ext_addr == ext.iface_addr else "Using public address %s",
                 ext.ext_addr or ext.ext_v6_addr)
        # Closed when flanneld stops or start-up fails, after the task group (the data
        # plane) has ended: what the backend runs stops only once nothing drives it.
        async with contextlib.AsyncExitStack() as closing:
            started = await self._start_backend(sm, config, ext, closing)
            if started is None:
                return 0
            backend, lease, mtu = started
            dataplane = self._dataplane_class(
                backend, self.readiness, interval=self.settings.dataplane.reconcile_interval)
            self.state.backend, self.state.dataplane = backend, dataplane
            self.phase("installing traffic rules")
            traffic = self._make_rules(rules, config, lease, backend.encapsulation())
            self.state.rules = traffic.status
            await traffic.start()
            self._report_rules(traffic)
            sm.status.writes.follow(lambda ready, why: self.readiness.report("lease", ready, why))
            self.readiness.report("subnet.env", False, "subnet.env not written yet")
            self._started = True
            self.readiness.report("startup", True)
            tasks = [
                Supervised("dataplane", dataplane.run()),
                Supervised("traffic rules", self._keep_rules(traffic)),
                Supervised("subnet.env", self._keep_writing_subnet_env(config, lease, mtu),
                           forever=False),
                Supervised("leases", self._follow_leases(sm, config, dataplane, traffic, lease)),
                Supervised("lease", sm.keep_lease(lease)),
                Supervised("readiness", self._watch_readiness()),
            ]
            if self.settings.probes.enabled:
                from flannel.probing.prober import PeerProber

                prober = PeerProber(backend, self.settings.probes, mtu,
                                    lambda: dataplane.programmed, self.readiness)
                self.state.probes = prober.status
                tasks.append(Supervised("peer probes", prober.run()))
            if rules.blackhole_route:
                from flannel.kernel.blackhole import keep_blackholes

                subnets = [s for s in (lease.subnet, lease.ipv6_subnet) if s is not None]
                tasks.append(Supervised("blackhole", keep_blackholes(subnets, rules.resync)))
            return await self._supervise(tasks)

    async def _supervise(self, tasks: list[Supervised]) -> int:
        """Run the tasks until a signal, a fault or the revocation of our lease."""
        try:
            async with asyncio.TaskGroup() as group:
                for task in tasks:
                    group.create_task(self._guard(task), name=task.name)
                group.create_task(self._until_stopped(), name="signals")
        except BaseExceptionGroup as ended:
            return self._exit_code(ended)
        raise AssertionError("the task group ended without a reason")  # _until_stopped raises

    async def _until_stopped(self) -> None:
        await self.stop.wait()
        raise _Stopped

    @staticmethod
    async def _guard(task: Supervised) -> None:
        try:
            await task.work
        except (OwnLeaseRevoked, asyncio.CancelledError):
            raise
        except DECLARED_FAILURES as err:
            raise TaskFailed(f"{task.name} failed: {err}") from err
        except Exception as err:  # the supervisor's boundary: a bug ends flanneld, loudly
            log.critical("%s failed on a bug in flanneld; please report it with this "
                         "traceback", task.name, exc_info=True)
            raise TaskFailed(f"{task.name} failed: {type(err).__name__}: {err}") from err
        if task.forever:
            raise TaskFailed(f"{task.name} stopped: it returned, but it must run until "
                             "flanneld stops")

    @staticmethod
    def _exit_code(ended: BaseExceptionGroup) -> int:
        reasons = ended.exceptions
        failures = [e for e in reasons if isinstance(e, TaskFailed)]
        unexpected = [e for e in reasons if not isinstance(e, TaskFailed | OwnLeaseRevoked
                                                           | _Stopped)]
        if unexpected:
            raise unexpected[0]
        if failures:
            log.error("Exiting: %s", failures[0])
            return 1
        if any(isinstance(e, OwnLeaseRevoked) for e in reasons):
            log.info("Exiting: own lease revoked")
            return 0
        log.info("Exiting: stopped by signal")
        return 0

    def _report_rules(self, traffic: Rules) -> None:
        status = traffic.status
        self.readiness.report("rules", status.installed, status.reason)

    async def _keep_rules(self, traffic: Rules) -> None:
        """Re-check (and repair) the rules every ``--iptables-resync`` seconds; write each
        new peer set of the encapsulation filter at once."""
        while True:
            await traffic.next()
            self._report_rules(traffic)

    async def _keep_writing_subnet_env(self, config: NetworkConfig, lease: Lease,
                                       mtu: int) -> None:
        """Write subnet.env, retrying with backoff until it works (the cause, such as an
        unwritable directory, can be fixed while we run); not ready meanwhile."""
        env = SubnetEnv(
            network=config.network if lease.subnet is not None else None,
            subnet=lease.subnet,
            ipv6_network=config.ipv6_network if lease.ipv6_subnet is not None else None,
            ipv6_subnet=lease.ipv6_subnet, mtu=mtu, ip_masq=self.settings.rules.ip_masq)
        path = self.settings.files.subnet_file
        backoff = Backoff(*SUBNET_ENV_BACKOFF)
        retries = RetryLog(log, f"could not write {path}")
        while True:
            try:
                write_subnet_env(path, env)
            except OSError as err:
                self.readiness.report(
                    "subnet.env", False, f"could not write {path}: {err.strerror or err}; pods "
                    "on this node cannot start until it exists (retrying)")
                retries.failed(err.strerror or str(err), backoff.delay)
                await backoff.wait()
                continue
            break
        retries.succeeded()
        self.readiness.report("subnet.env", True)
        log.info("Wrote %s: subnet %s, MTU %d", path, lease.key, mtu)

    async def _watch_readiness(self) -> None:
        """Log every change between ready and not ready; tell systemd the first time."""
        was_ready, told = False, False
        ready, why = self.readiness.current()
        while True:
            if ready != was_ready:
                if ready:
                    log.info("Ready: subnet.env written, rules installed, peers programmed")
                    if not told and notify("READY=1"):
                        log.info("Notified systemd: READY=1")
                    told = True
                else:
                    log.warning("Not ready: %s", why)
                was_ready = ready
            ready, why = await self.readiness.wait_changed()

    async def _follow_leases(self, sm: SubnetManager, config: NetworkConfig,
                             dataplane: Dataplane, traffic: Rules, own: Lease) -> None:
        watcher = LeaseWatcher(own, config)
        self.state.peers = watcher
        handed = False  # the data plane was given a peer set
        async with contextlib.aclosing(sm.watch_leases(config)) as updates:
            async for update in updates:
                # In a call of its own, so that a snapshot's events (5000 at start) are not
                # kept alive while the next update is awaited.
                handed = self._take_update(sm, watcher, own, update, handed, dataplane,
                                           traffic)

    def _take_update(self, sm: SubnetManager, watcher: LeaseWatcher, own: Lease,
                     update: LeaseUpdate, handed: bool, dataplane: Dataplane,
                     traffic: Rules) -> bool:
        """Apply one lease update and hand the peer set over if it changed; whether a peer
        set was ever handed over."""
        result = watcher.apply(update)
        # A line per subnet of a large snapshot (5000 cost ~0.15 s) only at -v=2.
        level = logging.INFO if len(result.events) <= SNAPSHOT_LINES else V2
        if log.isEnabledFor(level):
            for event in result.events:
                verb = "added" if event.type is EventType.ADDED else "removed"
                log.log(level, "Subnet %s: %s (public IP %s)", verb, event.lease.key,
                        event.lease.attrs.public_ip)
        if result.own_lease_removed and sm.revocable:
            log.warning("Lease has been revoked. Shutting down daemon.")
            raise OwnLeaseRevoked(f"this node's lease {own.key} was removed")
        if isinstance(update, Snapshot):
            log.info("Lease snapshot: %d remote subnet(s) known (%d added, %d removed)",
                     watcher.count, sum(e.type is EventType.ADDED for e in result.events),
                     sum(e.type is EventType.REMOVED for e in result.events))
        if not result.events and (handed or not isinstance(update, Snapshot)):
            # A renewal, or a relist that found what we had: the data plane has this peer
            # set, and readiness must not flip while it is programmed.
            return handed
        peers = watcher.leases
        dataplane.set_peers(peers)
        if self.settings.rules.encap_peers_only:
            traffic.set_peers(encap_peers(own, peers))
        return True


def encap_peers(own: Lease, leases: Sequence[Lease]) -> PeerAddresses:
    """The addresses encapsulated traffic is accepted from: the public addresses of every
    lease the watcher passes (another backend's too: it is a node of the network) and
    ours."""
    from flannel.rules.spec import peer_addresses

    return peer_addresses(address for lease in (own, *leases)
                          for address in (lease.attrs.public_ip, lease.attrs.public_ipv6))


def main(settings: Settings) -> int:
    flannel_log.setup(settings.log.v)
    log.info("CLI flags config: %s", options_line(settings.options))
    raise_open_files_limit()
    heap.one_arena()  # before the event loop's and the data plane's threads
    for warning in settings.warnings:
        log.warning("%s", warning)

    async def runner() -> int:
        return await Daemon(settings).run()

    try:
        return asyncio.run(runner())
    except StartupError as err:
        log.error("%s", err)
        return 1
    except Exception:  # a bug during startup: in the log with its traceback, exit 1
        log.critical("flanneld failed on a bug; please report it with this traceback",
                     exc_info=True)
        return 1
