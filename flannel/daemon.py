"""flanneld: wires a subnet manager (the lease store) to a backend (the data plane).

Owns the startup order of upstream (config, interface, backend, lease, subnet.env, watch,
renewal), the lease-to-backend data flow (the full set of remote leases is handed to the
backend after every change, so the backend reconciles rather than patches), and shutdown:
a signal stops the process and leaves the lease and every kernel object in place so that a
restart is hitless; a second signal exits at once.
Must not touch: store internals or kernel internals beyond the interfaces it calls.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from dataclasses import dataclass

from flannel import log as flannel_log
from flannel.backend import Backend, BackendError, BackendOptions, backend_class
from flannel.config import ConfigError, NetworkConfig
from flannel.kernel.iface import (
    IfaceOptions,
    InterfaceError,
    read_snapshot,
    select_external_interface,
)
from flannel.lease import EventType, Lease, LeaseAttrs
from flannel.subnet.envfile import SubnetEnv, read_env, single_cidr, write_subnet_env
from flannel.subnet.etcd import AcquireError, EtcdSubnetManager, PreviousSubnets
from flannel.subnet.etcdclient import (
    EtcdClient,
    EtcdError,
    EtcdOptionError,
    EtcdOptions,
    parse_endpoints,
)
from flannel.subnet.watch import LeaseWatcher, Snapshot

log = logging.getLogger("flanneld")


class StartupError(Exception):
    """flanneld cannot start; the message says what to fix."""


@dataclass
class Outcome:
    """Why the daemon stopped."""

    reason: str
    exit_code: int = 0


def make_etcd_manager(args: argparse.Namespace) -> EtcdSubnetManager:
    try:
        options = EtcdOptions(
            endpoints=parse_endpoints(args.etcd_endpoints),
            cafile=args.etcd_cafile, certfile=args.etcd_certfile, keyfile=args.etcd_keyfile,
            username=args.etcd_username, password=args.etcd_password,
        )
        client = EtcdClient(options)
    except EtcdOptionError as err:
        raise StartupError(str(err)) from None
    if not args.etcd_certfile:
        log.warning("etcd TLS is off: pass --etcd-certfile, --etcd-keyfile and --etcd-cafile "
                    "to secure the connection")
    previous = read_env(args.subnet_file)
    return EtcdSubnetManager(
        client, args.etcd_prefix, lease_ttl=int(args.subnet_lease_ttl),
        previous=PreviousSubnets(single_cidr(previous, "FLANNEL_SUBNET", 4),
                                 single_cidr(previous, "FLANNEL_IPV6_SUBNET", 6)))


async def wait_for_config(sm: EtcdSubnetManager, stop: asyncio.Event) -> NetworkConfig | None:
    """Fetch the network config, retrying every second (a config may be written later)."""
    while not stop.is_set():
        try:
            return await sm.get_network_config()
        except ConfigError as err:
            raise StartupError(f"invalid network config at {sm.config_key.decode()}: "
                               f"{err.describe()}") from None
        except EtcdError as err:
            log.error("Couldn't fetch network config: %s", err)
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass
    return None


class Daemon:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = asyncio.Event()
        self.outcome = Outcome("stopped by signal")
        self.lease: Lease | None = None

    def request_stop(self, outcome: Outcome) -> None:
        if not self.stop.is_set():
            self.outcome = outcome
            self.stop.set()

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
        args = self.args
        if args.kube_subnet_mgr:
            raise StartupError("--kube-subnet-mgr is not available in this pyflannel build; "
                               "use the etcd subnet manager (--etcd-endpoints)")
        sm = make_etcd_manager(args)
        try:
            return await self._run_with(sm)
        finally:
            await sm.client.close()

    async def _run_with(self, sm: EtcdSubnetManager) -> int:
        args = self.args
        config = await wait_for_config(sm, self.stop)
        if config is None:
            return 0
        log.info("Network config: backend %r, network %s%s", config.backend_type,
                 config.network, f", IPv6 network {config.ipv6_network}"
                 if config.enable_ipv6 else "")
        try:
            # pyroute2's synchronous API runs its own event loop: keep it off ours.
            ext = await asyncio.to_thread(
                lambda: select_external_interface(
                    read_snapshot(),
                    IfaceOptions(args.iface, args.iface_regex, args.iface_can_reach,
                                 args.public_ip, args.public_ipv6),
                    ipv4=config.enable_ipv4, ipv6=config.enable_ipv6))
            backend: Backend = backend_class(config.backend_type)(
                ext, config, BackendOptions(reconcile_interval=args.reconcile_interval))
        except (InterfaceError, BackendError) as err:
            raise StartupError(str(err)) from None
        log.info("Using interface with name %s and address %s", ext.name,
                 ext.iface_addr or ext.iface_v6_addr)
        log.info("Defaulting external address to interface address (%s)"
                 if ext.ext_addr == ext.iface_addr else "Using public address %s",
                 ext.ext_addr or ext.ext_v6_addr)

        try:
            local = await backend.prepare()
        except BackendError as err:
            raise StartupError(str(err)) from None
        attrs = LeaseAttrs(public_ip=ext.ext_addr, public_ipv6=ext.ext_v6_addr,
                           backend_type=local.backend_type, backend_data=local.backend_data,
                           backend_v6_data=local.backend_v6_data)
        try:
            lease = await sm.acquire_lease(attrs)
        except AcquireError as err:
            raise StartupError(f"failed to acquire lease: {err}") from None
        except ConfigError as err:
            raise StartupError(f"invalid network config: {err.describe()}") from None
        self.lease = lease
        try:
            await backend.activate(lease)
        except BackendError as err:
            raise StartupError(str(err)) from None
        env = SubnetEnv(
            network=config.network if lease.subnet is not None else None,
            subnet=lease.subnet,
            ipv6_network=config.ipv6_network if lease.ipv6_subnet is not None else None,
            ipv6_subnet=lease.ipv6_subnet, mtu=local.mtu, ip_masq=args.ip_masq)
        try:
            write_subnet_env(args.subnet_file, env)
        except OSError as err:
            log.error("could not write %s: %s; pods on this node will not start until it "
                      "exists", args.subnet_file, err)
        log.info("Wrote %s: subnet %s, MTU %d", args.subnet_file, lease.key, local.mtu)

        tasks = [
            asyncio.create_task(self._follow_leases(sm, backend, lease), name="leases"),
            asyncio.create_task(sm.keep_lease(lease, args.subnet_lease_renew_margin * 60,
                                              on_renewed=self._renewed), name="renew"),
        ]
        failures: list[BaseException] = []

        def supervise(task: asyncio.Task) -> None:
            if not task.cancelled() and task.exception() is not None:
                failures.append(task.exception())
                self.request_stop(Outcome(f"{task.get_name()} failed", 1))

        for task in tasks:
            task.add_done_callback(supervise)
        try:
            await self.stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await backend.close()
        if failures:
            log.error("Exiting: %s: %s", self.outcome.reason, failures[0])
            return 1
        log.info("Exiting: %s", self.outcome.reason)
        return self.outcome.exit_code

    def _renewed(self, lease: Lease) -> None:
        self.lease = lease

    async def _follow_leases(self, sm: EtcdSubnetManager, backend: Backend, own: Lease) -> None:
        watcher = LeaseWatcher(own)
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
            await backend.sync_peers(watcher.leases)


def main(args: argparse.Namespace) -> int:
    flannel_log.setup(args.v)

    async def runner() -> int:
        return await Daemon(args).run()

    try:
        return asyncio.run(runner())
    except StartupError as err:
        log.error("%s", err)
        return 1
