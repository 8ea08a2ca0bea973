"""flanneld: wires a subnet manager (the lease store) to a backend (the data plane).

Owns the startup order of upstream (health server, config, interface, backend, lease, traffic
rules, subnet.env, lease watch, renewal), retries of the startup store phases while the store
is unavailable (a store error that retrying cannot fix exits 1 with its message), retries of
the subnet.env write, the lease-to-backend data flow (the full set of remote leases is handed
to the backend after every change, so the backend reconciles rather than patches), readiness
(subnet.env written, store view complete, rules installed, peers programmed; systemd is told
once), and shutdown: a signal stops the process and leaves the lease, subnet.env, the
rules and every kernel object in place so that a restart is hitless; a second signal kills.
Must not touch: store internals or kernel internals beyond the interfaces it calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

from flannel import log as flannel_log
from flannel.backend import BackendError, backend_class
from flannel.config import ConfigError, NetworkConfig, network_overlaps_underlay
from flannel.dataplane import COMPONENT as DATAPLANE
from flannel.dataplane import Dataplane
from flannel.health import HealthServer
from flannel.kernel.blackhole import keep_blackholes
from flannel.kernel.iface import (
    ExternalInterface,
    IfaceOptions,
    InterfaceError,
    read_snapshot,
    select_external_interface,
)
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.readiness import Readiness
from flannel.rules import iptables, nftables
from flannel.rules.iptables import RulesError
from flannel.rules.manager import TrafficManager, check_br_netfilter
from flannel.rules.spec import FamilyRules
from flannel.sdnotify import notify
from flannel.subnet import StoreOpenError, open_store
from flannel.subnet.envfile import SubnetEnv, write_subnet_env
from flannel.subnet.errors import RetryLog, StoreError, StoreUnavailable
from flannel.subnet.kube import KubeError
from flannel.subnet.manager import SubnetManager
from flannel.subnet.watch import LeaseWatcher, Snapshot

log = logging.getLogger("flanneld")

ACQUIRE_BACKOFF = (0.5, 10.0)  # first and longest wait between acquisition attempts
SUBNET_ENV_BACKOFF = (0.5, 30.0)


class StartupError(Exception):
    """flanneld cannot start; the message says what to fix."""


@dataclass
class Outcome:
    """Why the daemon stopped."""

    reason: str
    exit_code: int = 0


def make_manager(args: argparse.Namespace) -> SubnetManager:
    try:
        return open_store(args)
    except StoreOpenError as err:
        raise StartupError(str(err)) from None


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds`` or until ``stop`` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def wait_for_config(sm: SubnetManager, stop: asyncio.Event) -> NetworkConfig | None:
    """Fetch the network config, retrying every second while the store cannot give it."""
    retries = RetryLog(log, "Couldn't fetch network config")
    while not stop.is_set():
        try:
            config = await sm.get_network_config()
        except ConfigError as err:
            raise StartupError(f"invalid network config: {err.describe()}") from None
        except StoreError as err:
            raise StartupError(f"Couldn't fetch network config: {err}") from None
        except StoreUnavailable as err:
            retries.failed(err, 1.0)
            await _pause(stop, 1.0)
            continue
        retries.succeeded()
        return config
    return None


async def acquire_lease(sm: SubnetManager, attrs: LeaseAttrs, stop: asyncio.Event
                        ) -> Lease | None:
    """Our lease, retrying with backoff while the store is unavailable; None when stopped."""
    retries = RetryLog(log, "Couldn't acquire a lease")
    backoff, longest = ACQUIRE_BACKOFF
    while not stop.is_set():
        try:
            lease = await sm.acquire_lease(attrs)
        except StoreError as err:
            raise StartupError(f"failed to acquire lease: {err}") from None
        except StoreUnavailable as err:
            retries.failed(err, backoff)
            await _pause(stop, backoff)
            backoff = min(backoff * 2, longest)
            continue
        retries.succeeded()
        return lease
    return None


def traffic_rules(args: argparse.Namespace, config: NetworkConfig, lease: Lease
                  ) -> TrafficManager:
    families = []
    for version, network, subnet in ((4, config.network, lease.subnet),
                                     (6, config.ipv6_network, lease.ipv6_subnet)):
        if network is None or subnet is None:
            continue
        try:
            fully_random = (nftables.supports_fully_random() if config.enable_nftables
                            else iptables.supports_random_fully(version))
        except RulesError:
            fully_random = False  # the binary is missing: installing will say so
        families.append(FamilyRules(
            version, network, subnet, masquerade=args.ip_masq,
            forward=args.iptables_forward_rules,
            fully_random=fully_random and not args.ip_masq_fully_random_disable,
            non_masquerade=tuple(n for n in config.non_masquerade if n.version == version)))
    return TrafficManager(families, config.enable_nftables, resync=args.iptables_resync,
                          iptables_mode=args.iptables_mode)


class Daemon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = asyncio.Event()
        self.outcome = Outcome("stopped by signal")
        self.lease: Lease | None = None
        self.phase = "waiting for the network config"
        self.subnet_env_written = False
        self.dataplane: Dataplane | None = None
        self.traffic: TrafficManager | None = None
        self.sm: SubnetManager | None = None
        self._was_ready = False
        self._failures: list[BaseException] = []

    def request_stop(self, outcome: Outcome) -> None:
        if not self.stop.is_set():
            self.outcome = outcome
            self.stop.set()

    def readiness(self) -> tuple[bool, str]:
        if not self.subnet_env_written:
            return False, self.phase
        if self.sm is not None and not self.sm.status.ready:
            return False, self.sm.status.reason
        if self.traffic is not None and not self.traffic.status.installed:
            return False, self.traffic.status.reason
        if self.dataplane is not None:
            programmed, why = self.dataplane.readiness.current()
            if not programmed:
                return False, why
        return True, ""

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            log.info("Received %s, shutting down (the lease and data plane stay in place); "
                     "send it again to exit immediately", signal.Signals(signum).name)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.request_stop(Outcome("stopped by signal"))

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)

    async def run(self) -> int:
        self._install_signals()
        health = None
        if self.args.healthz_port:
            health = HealthServer(self.readiness)
            try:
                await health.start(self.args.healthz_ip, self.args.healthz_port)
            except OSError as err:
                raise StartupError(f"--healthz-ip/--healthz-port {self.args.healthz_ip}:"
                                   f"{self.args.healthz_port}: {err.strerror}") from None
        try:
            sm = make_manager(self.args)
            try:
                return await self._run_with(sm)
            except KubeError as err:
                raise StartupError(str(err)) from None
            finally:
                await sm.close()
        finally:
            if health is not None:
                await health.stop()

    async def _external_interface(self, sm: SubnetManager, config: NetworkConfig
                                  ) -> ExternalInterface:
        args = self.args
        public_v4, public_v6 = await sm.public_ip_overrides()
        options = IfaceOptions(args.iface, args.iface_regex, args.iface_can_reach,
                               str(public_v4) if public_v4 else args.public_ip,
                               str(public_v6) if public_v6 else args.public_ipv6)
        try:
            # Netlink reads block: keep them off the event loop.
            return await asyncio.to_thread(
                lambda: select_external_interface(read_snapshot(), options,
                                                  ipv4=config.enable_ipv4,
                                                  ipv6=config.enable_ipv6))
        except InterfaceError as err:
            raise StartupError(str(err)) from None

    async def _run_with(self, sm: SubnetManager) -> int:
        args = self.args
        config = await wait_for_config(sm, self.stop)
        if config is None:
            return 0
        log.info("Network config: backend %r, network %s%s", config.backend_type,
                 config.network, f", IPv6 network {config.ipv6_network}"
                 if config.enable_ipv6 else "")
        if not config.enable_nftables and (args.ip_masq or args.iptables_forward_rules):
            try:
                check_br_netfilter([v for v, on in ((4, config.enable_ipv4),
                                                    (6, config.enable_ipv6)) if on])
            except RulesError as err:
                raise StartupError(str(err)) from None
        self.phase = "selecting the external interface"
        ext = await self._external_interface(sm, config)
        if overlap := network_overlaps_underlay(config, (ext.iface_addr, ext.ext_addr,
                                                         ext.iface_v6_addr, ext.ext_v6_addr)):
            raise StartupError(f"invalid network config: {overlap}")
        log.info("Using interface with name %s and address %s", ext.name,
                 ext.iface_addr or ext.iface_v6_addr)
        log.info("Defaulting external address to interface address (%s)"
                 if ext.ext_addr == ext.iface_addr else "Using public address %s",
                 ext.ext_addr or ext.ext_v6_addr)
        try:
            backend = backend_class(config.backend_type)(
                ext, config)
            self.phase = f"setting up the {config.backend_type} backend"
            local = await backend.prepare()
            attrs = LeaseAttrs(public_ip=ext.ext_addr, public_ipv6=ext.ext_v6_addr,
                               backend_type=local.backend_type,
                               backend_data=local.backend_data,
                               backend_v6_data=local.backend_v6_data)
            self.phase = "acquiring a lease"
            lease = await acquire_lease(sm, attrs, self.stop)
            if lease is None:  # stopped by a signal while etcd was unavailable
                return 0
            self.lease = lease
            await backend.activate(lease)
        except BackendError as err:
            raise StartupError(str(err)) from None
        except ConfigError as err:
            raise StartupError(f"invalid network config: {err.describe()}") from None
        dataplane = Dataplane(backend, Readiness([DATAPLANE]), interval=args.reconcile_interval)
        self.dataplane = dataplane
        tasks: list[asyncio.Task] = []
        try:
            self.phase = "installing traffic rules"
            self.traffic = traffic_rules(args, config, lease)
            await self.traffic.start()
            tasks.append(asyncio.create_task(self.traffic.run(), name="traffic rules"))
            if args.ip_blackhole_route:
                subnets = [s for s in (lease.subnet, lease.ipv6_subnet) if s is not None]
                tasks.append(asyncio.create_task(
                    keep_blackholes(subnets, args.iptables_resync), name="blackhole"))
            self.sm = sm
            tasks += [
                asyncio.create_task(self._keep_writing_subnet_env(config, lease, local.mtu),
                                    name="subnet.env"),
                asyncio.create_task(dataplane.run(), name="data plane"),
                asyncio.create_task(self._follow_leases(sm, dataplane, lease), name="leases"),
                asyncio.create_task(sm.complete_lease(
                    lease, args.subnet_lease_renew_margin * 60, self._renewed), name="lease"),
                asyncio.create_task(self._watch_readiness(), name="readiness"),
            ]
            for task in tasks:
                task.add_done_callback(self._supervise)
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._failures:
            log.error("Exiting: %s: %s", self.outcome.reason, self._failures[0])
            return 1
        log.info("Exiting: %s", self.outcome.reason)
        return self.outcome.exit_code

    def _supervise(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failures.append(task.exception())
            self.request_stop(Outcome(f"{task.get_name()} failed", 1))

    async def _keep_writing_subnet_env(self, config: NetworkConfig, lease: Lease,
                                       mtu: int) -> None:
        """Write subnet.env, retrying with backoff until it works (the cause, such as an
        unwritable directory, can be fixed while we run); not ready meanwhile."""
        env = SubnetEnv(
            network=config.network if lease.subnet is not None else None,
            subnet=lease.subnet,
            ipv6_network=config.ipv6_network if lease.ipv6_subnet is not None else None,
            ipv6_subnet=lease.ipv6_subnet, mtu=mtu, ip_masq=self.args.ip_masq)
        path = self.args.subnet_file
        backoff, longest = SUBNET_ENV_BACKOFF
        retries = RetryLog(log, f"could not write {path}")
        while True:
            try:
                write_subnet_env(path, env)
            except OSError as err:
                self.phase = (f"could not write {path}: {err.strerror or err}; pods on this "
                              "node cannot start until it exists (retrying)")
                retries.failed(err.strerror or str(err), backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, longest)
                continue
            break
        retries.succeeded()
        self.subnet_env_written = True
        log.info("Wrote %s: subnet %s, MTU %d", path, lease.key, mtu)

    def _renewed(self, lease: Lease) -> None:
        self.lease = lease

    async def _watch_readiness(self) -> None:
        """Log every readiness change; tell systemd the first time the node is ready."""
        while True:
            ready, why = self.readiness()
            if ready != self._was_ready:
                if ready:
                    log.info("Ready: subnet.env written, rules installed, peers programmed")
                    if notify("READY=1"):
                        log.info("Notified systemd: READY=1")
                else:
                    log.warning("Not ready: %s", why)
                self._was_ready = ready
            await asyncio.sleep(0.1)

    async def _follow_leases(self, sm: SubnetManager, dataplane: Dataplane, own: Lease
                             ) -> None:
        watcher = LeaseWatcher(own, dataplane.backend.config)
        async for update in sm.watch_leases():
            result = watcher.apply(update)
            for event in result.events:
                verb = "added" if event.type is EventType.ADDED else "removed"
                log.info("Subnet %s: %s (public IP %s)", verb, event.lease.key,
                         event.lease.attrs.public_ip)
            if result.own_lease_removed:
                log.warning("Lease has been revoked. Shutting down daemon.")
                self.request_stop(Outcome("own lease revoked", 0))
                return
            if isinstance(update, Snapshot):
                log.info("Lease snapshot: %d remote subnet(s) known", len(watcher.leases))
            dataplane.set_peers(watcher.leases)


def main(args: argparse.Namespace) -> int:
    flannel_log.setup(args.v)

    async def runner() -> int:
        return await Daemon(args).run()

    try:
        return asyncio.run(runner())
    except StartupError as err:
        log.error("%s", err)
        return 1
