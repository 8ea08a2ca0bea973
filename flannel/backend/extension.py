"""The extension backend: the operator's commands build the data path, as in Go flannel.

Owns the backend's place in the data plane contract: the pre-startup command at ``prepare``
(its output, as a JSON string, is our ``BackendData``; a failure stops the start, since
there would be nothing true to publish), the post-startup command once our lease is known,
and an applier that runs the subnet-add command for every new or changed peer lease and the
subnet-remove command for every lease that went. A failed post-startup command, or a subnet
command that cannot run at all, is this node's failure: logged with its output, it fails the
pass (readiness says so) and is tried again on the next one (the data plane retries with
backoff). A subnet command that fails for one peer makes that peer a bad peer: skipped,
counted on /metrics (``flannel_engine_extension_*``), listed in /status, retried with its own
backoff, and not a readiness failure: every node would otherwise go not ready for one bad
node. Nothing is fatal once started. The lease is published with the interface's addresses,
not ``--public-ip``, as Go does. Pods get the external MTU less ``EncapOverhead`` (pyflannel's
option: Go has none and gives them the external MTU, which a data path that encapsulates
cannot carry). How commands run (no shell, ``$VAR`` expansion, timeouts, stdin)
is ``flannel/extension``'s.
Must not touch: the store; the kernel (the commands do, in the ``Host``'s namespace).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from flannel.backend.base import (
    Applier,
    ApplyResult,
    Backend,
    BackendError,
    BackendOptions,
    EngineSample,
    LocalNetwork,
    PeerPlanner,
)
from flannel.backend.footprint import BY_USER, Footprint
from flannel.backend.plan import (
    Carrier,
    FamilyPlan,
    NodePlan,
    NodeView,
    family_subnet,
    gateway_address,
    versions,
)
from flannel.config import NetworkConfig
from flannel.extension.peers import (
    CommandFailed,
    ExtensionConfig,
    ExtensionPeers,
    post_startup_env,
    pre_startup,
    run_post_startup,
)
from flannel.kernel.device import MIN_MTU
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease

log = logging.getLogger(__name__)

#: The least MTU an IPv6 link may have (RFC 8200).
IPV6_MIN_MTU = 1280


def _some(keys: list[str]) -> str:
    return keys[0] + (f" and {len(keys) - 1} more" if len(keys) > 1 else "")


class ExtensionCommands(Applier):
    """The ``Applier`` of the extension backend: the post-startup command until it has
    succeeded once, then the subnet commands for the peer set of each pass."""

    name = "extension commands"

    def __init__(self, commands: ExtensionConfig, host: Host = LOCAL) -> None:
        self.commands = commands
        self.host = host
        self.peers = ExtensionPeers(commands, host)
        self._post_startup_env: Mapping[str, str] | None = None

    def post_startup(self, env: Mapping[str, str]) -> bool:
        """Run the post-startup command; if it fails it is owed, and run again by the next
        ``apply`` before any subnet command. Whether it succeeded (True without one)."""
        result = run_post_startup(self.commands, env, self.host)
        done = result is None or result.ok
        self._post_startup_env = None if done else dict(env)
        return done

    def apply(self, peers: Sequence[Lease]) -> ApplyResult:
        changes = 0
        if self._post_startup_env is not None:
            if not self.post_startup(self._post_startup_env):
                # Subnet commands may rely on what it sets up: they wait, as in Go.
                return ApplyResult(0, "the post-startup command failed (its output is in the "
                                      "log); subnet commands wait until it succeeds")
            changes += 1
        status = self.peers.reconcile(peers)
        changes += status.ran
        failed = []
        if status.pending_add:
            failed.append(f"subnet-add command failed for {_some(status.pending_add)}")
        if status.pending_remove:
            failed.append(f"subnet-remove command failed for {_some(status.pending_remove)}")
        if failed:
            return ApplyResult(changes, "; ".join(failed) + " (output in the log); retrying",
                               status.retry_in)
        return ApplyResult(changes, recheck=status.retry_in)

    def samples(self) -> list[EngineSample]:
        return [
            EngineSample("extension_bad_peers", "Peer leases skipped because the subnet "
                         "command fails for them (retried with backoff).",
                         len(self.peers.bad)),
            EngineSample("extension_peer_command_failures_total", "Subnet commands that "
                         "failed for a peer since start.", self.peers.failures, counter=True)]

    def refused_peers(self) -> dict[str, str]:
        """Bad peers: lease key -> why (for /status)."""
        return self.peers.bad.reasons()


class ExtensionBackend(Backend):
    backend_type = "extension"
    footprint = Footprint(BY_USER, dual_stack=True,
                          unjudged="the extension's own commands (SubnetAddCommand) program "
                          "each peer, so this node's kernel is not judged")
    # ShutdownCommand: in upstream's examples, ignored by Go flannel and here.
    option_names = ("PreStartupCommand", "PostStartupCommand", "SubnetAddCommand",
                    "SubnetRemoveCommand", "ShutdownCommand", "EncapOverhead")

    @classmethod
    def parse_options(cls, config: NetworkConfig) -> None:
        ExtensionConfig.from_backend(config.backend)

    def __init__(self, ext: ExternalInterface, config: NetworkConfig,
                 options: BackendOptions | None = None) -> None:
        super().__init__(ext, config, options)
        self.commands = ExtensionConfig.from_backend(config.backend)
        self.engine = ExtensionCommands(self.commands, self.options.host)

    async def prepare(self) -> LocalNetwork:
        mtu = self.pods_mtu()  # a refusal before any command has run
        try:
            data = await asyncio.to_thread(pre_startup, self.commands, self.options.host)
        except CommandFailed as err:
            raise BackendError(f"{err}; fix the command (it runs without a shell: write a "
                               "script for pipes, redirections or several steps)") from None
        ext, config = self.ext, self.config
        return LocalNetwork(
            "extension", mtu, data,
            public_ip=ext.iface_addr if config.enable_ipv4 else None,
            public_ipv6=ext.iface_v6_addr if config.enable_ipv6 else None)

    def pods_mtu(self) -> int:
        """The external MTU less what the commands' encapsulation adds (``EncapOverhead``;
        none by default, as in Go, which gives pods the external MTU)."""
        mtu = self.ext.mtu - self.commands.encap_overhead
        least = IPV6_MIN_MTU if self.config.enable_ipv6 else MIN_MTU
        if mtu < least:
            raise BackendError(
                f"the extension backend's EncapOverhead ({self.commands.encap_overhead}) leaves "
                f"pods an MTU of {mtu} on {self.ext.name} (MTU {self.ext.mtu}); "
                f"{'IPv6 needs' if least == IPV6_MIN_MTU else 'a link needs'} at least {least}: "
                "give the bytes the commands' data path really adds")
        return mtu

    async def activate(self, lease: Lease) -> None:
        await super().activate(lease)
        env = post_startup_env(self.config.network if self.config.enable_ipv4 else None,
                               self.config.ipv6_network if self.config.enable_ipv6 else None,
                               lease)
        if not await asyncio.to_thread(self.engine.post_startup, env):
            log.error("the extension post-startup command failed; it is run again before "
                      "the subnet commands")

    def appliers(self) -> Sequence[ExtensionCommands]:
        return (self.engine,)

    @classmethod
    def node_plan(cls, node: NodeView) -> NodePlan:
        """As every backend without a device of its own, the underlay carrying what the
        commands' data path adds (``EncapOverhead``)."""
        plan = super().node_plan(node)
        return replace(plan, overhead=ExtensionConfig.from_backend(node.config.backend)
                       .encap_overhead)

    @classmethod
    def carriers(cls, config: NetworkConfig) -> tuple[Carrier, ...]:
        # Whatever the commands build: no port or protocol flanneld knows of.
        return (Carrier("the extension's data path", unprobed="the extension's own commands "
                        "(SubnetAddCommand) choose what carries it", versions=versions(config)),)

    @classmethod
    def peer_planner(cls, node: NodeView) -> PeerPlanner:
        carrier, = cls.carriers(node.config)

        def plan(lease: Lease) -> tuple[FamilyPlan, ...]:
            out = []
            for version in versions(node.config):
                subnet, public = family_subnet(lease, version)
                if subnet is not None:
                    out.append(FamilyPlan(version, subnet, public, carrier=carrier,
                                          answers_on=gateway_address(subnet)))
            return tuple(out)

        return plan
