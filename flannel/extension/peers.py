"""The extension backend's config and the bookkeeping of which commands ran for which peer.

Owns: decoding ``PreStartupCommand``, ``PostStartupCommand``, ``SubnetAddCommand``,
``SubnetRemoveCommand`` (case-insensitive, Go's names; ``ShutdownCommand`` of the upstream
examples is ignored, as in Go) and pyflannel's ``EncapOverhead`` (bytes the commands' data
path adds to a pod packet, 0 to 1024), the pre-startup output published as a JSON string in
``BackendData``, the post-startup environment (``NETWORK``, ``SUBNET``, ``IPV6SUBNET``,
``PUBLIC_IP``, ``PUBLIC_IPV6``), and per remote lease: the add command (env ``SUBNET``,
``PUBLIC_IP``, and ``IPV6SUBNET`` / ``PUBLIC_IPV6`` when the lease has them; stdin = the
remote BackendData string and a newline) when the lease appears or changes, the remove
command when it goes. Nothing here is fatal. A subnet command that ran and failed for one
lease (its exit status, a signal, its timeout) makes that lease a bad peer: what it is given
comes from the peer, so one node's bad data must not hold back every other node. A bad
peer is logged once with the command's output, counted, skipped, and parked
(``flannel.reporting.skips.ParkedPeers``: tried again after 5 s doubling to 5 min; at once when its
lease changes). A command that cannot run at all (not found, not executable, empty) fails
for every peer alike: that is this node's own failure, owed and reported on every pass.

API: ``ExtensionConfig.from_backend(backend_obj)``; ``pre_startup(cfg, host) -> str | None``
(the ``BackendData`` JSON text, None without a command; raises ``CommandFailed``);
``post_startup_env(network, ipv6_network, lease)``; ``run_post_startup(cfg, env, host)``;
``ExtensionPeers(cfg, host).reconcile(leases) -> ExtensionStatus`` (synchronous, runs
commands: call from a worker thread after every lease change; it owns no task; its
``retry_in`` says when a bad peer is due again), ``ExtensionPeers.bad`` (the parked peers) and
``.failures`` (commands that failed for a peer since start). Every command
runs in the ``Host``'s network namespace.
Must not touch: the kernel (the user's commands do), the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network

from flannel.backendconf.errors import BackendConfigError
from flannel.backendconf.options import decode_options
from flannel.extension.command import DEFAULT_TIMEOUT, CommandResult, run_command
from flannel.kernel.host import LOCAL, Host
from flannel.lease import Lease, go_string
from flannel.reporting.skips import ParkedPeers
from flannel.untrusted import boundedjson

log = logging.getLogger(__name__)

_CONTEXT = "error decoding backend config"
#: BackendData we publish: what peers accept in a lease value, less room for its other fields.
MAX_PUBLISHED_DATA = boundedjson.MAX_LEASE_BYTES - 1024
_LOG_OUTPUT = 2000
#: The largest ``EncapOverhead``: more than any encapsulation adds, less than any MTU.
MAX_ENCAP_OVERHEAD = 1024


class CommandFailed(Exception):
    """A command whose result the caller needs (pre-startup) failed; message has its output."""


@dataclass(frozen=True)
class ExtensionConfig:
    """``encap_overhead``: the bytes the commands' data path adds to every pod packet
    (``EncapOverhead``, pyflannel's own option); pods get the external MTU less that."""

    pre_startup: str = ""
    post_startup: str = ""
    subnet_add: str = ""
    subnet_remove: str = ""
    timeout: float = DEFAULT_TIMEOUT
    encap_overhead: int = 0

    @classmethod
    def from_backend(cls, backend: Mapping[str, object], timeout: float = DEFAULT_TIMEOUT
                     ) -> ExtensionConfig:
        fields = decode_options(backend, {
            "PreStartupCommand": (str, ""), "PostStartupCommand": (str, ""),
            "SubnetAddCommand": (str, ""), "SubnetRemoveCommand": (str, ""),
            "EncapOverhead": (int, 0),
        }, _CONTEXT)
        overhead = fields["EncapOverhead"]
        if not 0 <= overhead <= MAX_ENCAP_OVERHEAD:
            raise BackendConfigError(
                f"{_CONTEXT}: EncapOverhead {overhead} is out of range; give the bytes your "
                f"commands' data path adds to each pod packet (0 to {MAX_ENCAP_OVERHEAD}; "
                "50 for vxlan over IPv4), or leave it out for none")
        return cls(fields["PreStartupCommand"], fields["PostStartupCommand"],
                   fields["SubnetAddCommand"], fields["SubnetRemoveCommand"], timeout,
                   overhead)


def _log_failure(what: str, command: str, result: CommandResult) -> None:
    output = result.output[:_LOG_OUTPUT] or "(no output)"
    log.error("extension %s command failed (%s): %s; output: %s", what, result.reason(),
              command, output)


def pre_startup(cfg: ExtensionConfig, host: Host = LOCAL) -> str | None:
    """Run the pre-startup command; its trimmed output, JSON-encoded as a string, is the
    ``BackendData`` to publish. None when there is no command (no BackendData)."""
    if not cfg.pre_startup:
        return None
    result = run_command(cfg.pre_startup, {}, timeout=cfg.timeout, host=host)
    if not result.ok:
        _log_failure("pre-startup", cfg.pre_startup, result)
        raise CommandFailed(f"extension pre-startup command failed ({result.reason()}): "
                            f"{cfg.pre_startup}; output: {result.output[:_LOG_OUTPUT]}")
    data = go_string(result.output)
    if len(data.encode("utf-8", "surrogatepass")) > MAX_PUBLISHED_DATA:
        raise CommandFailed(
            f"extension pre-startup command printed {len(result.output)} characters: as "
            f"BackendData that is more than the {MAX_PUBLISHED_DATA} bytes other nodes accept "
            f"in a lease, so every peer would ignore this node; print less: {cfg.pre_startup}")
    return data


def post_startup_env(network: IPv4Network | None, ipv6_network: IPv6Network | None,
                     lease: Lease) -> dict[str, str]:
    attrs = lease.attrs
    return {
        "NETWORK": str(network) if network else "",
        "SUBNET": str(lease.subnet) if lease.subnet and lease.subnet.prefixlen else "",
        "IPV6SUBNET": str(lease.ipv6_subnet) if lease.ipv6_subnet else "",
        "PUBLIC_IP": str(attrs.public_ip) if attrs.public_ip else "",
        "PUBLIC_IPV6": str(attrs.public_ipv6) if attrs.public_ipv6 else "",
    }


def run_post_startup(cfg: ExtensionConfig, env: Mapping[str, str], host: Host = LOCAL
                     ) -> CommandResult | None:
    """Run the post-startup command (failure logged, not raised); None without one."""
    if not cfg.post_startup:
        return None
    result = run_command(cfg.post_startup, env, timeout=cfg.timeout, host=host)
    if not result.ok:
        _log_failure("post-startup", cfg.post_startup, result)
    return result


def peer_env(lease: Lease) -> dict[str, str]:
    """Add/remove environment. Go sets SUBNET and PUBLIC_IP; its docs also promise the IPv6
    twins, set here when the lease has them."""
    env = {"SUBNET": str(lease.subnet) if lease.subnet else "",
           "PUBLIC_IP": str(lease.attrs.public_ip) if lease.attrs.public_ip else ""}
    if lease.ipv6_subnet is not None:
        env["IPV6SUBNET"] = str(lease.ipv6_subnet)
    if lease.attrs.public_ipv6 is not None:
        env["PUBLIC_IPV6"] = str(lease.attrs.public_ipv6)
    return env


def peer_stdin(lease: Lease) -> str | None:
    """The remote BackendData string and a newline; None when the data is not a JSON string
    (Go skips such a lease)."""
    raw = lease.attrs.backend_data
    if not raw:
        return "\n"
    try:
        value = boundedjson.loads(raw, what="BackendData", max_bytes=boundedjson.MAX_LEASE_BYTES)
    except boundedjson.JSONLimitError:
        return None
    return value + "\n" if isinstance(value, str) else None


def _fingerprint(lease: Lease) -> tuple[object, ...]:
    a = lease.attrs
    return (lease.subnet, lease.ipv6_subnet, a.public_ip, a.public_ipv6, a.backend_data)


def _own_failure(result: CommandResult) -> bool:
    """The command could not run at all: whatever the peer, it fails the same way."""
    return result.returncode is None and not result.error.startswith("timed out")


@dataclass
class ExtensionStatus:
    """After a pass: commands that ran successfully (``ran``), this node's own failures still
    owed (retried next pass), bad peers skipped (retried with backoff), by lease key."""

    ran: int = 0
    pending_add: list[str] = field(default_factory=list)
    pending_remove: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    #: Seconds until the next bad peer is due (0: none).
    retry_in: float = 0.0

    @property
    def in_sync(self) -> bool:
        return not self.pending_add and not self.pending_remove


class ExtensionPeers:
    """Runs the add command once per remote lease (again when it changes) and the remove
    command when it goes; this node's failures stay owed and are retried on the next pass,
    a peer the command fails for is retried with backoff."""

    def __init__(self, cfg: ExtensionConfig, host: Host = LOCAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.host = host
        self.clock = clock
        self.applied: dict[str, tuple[Lease, tuple[object, ...]]] = {}
        self.bad = ParkedPeers(clock=clock)
        self.failures = 0
        self.status = ExtensionStatus()

    def _run(self, what: str, command: str, lease: Lease, stdin: str) -> CommandResult:
        result = run_command(command, peer_env(lease), stdin=stdin, timeout=self.cfg.timeout,
                             host=self.host)
        if result.ok:
            log.info("extension %s command for %s ran: %s; output: %s", what, lease.key,
                     command, result.output[:_LOG_OUTPUT])
            if self.bad.release(lease.key):
                log.info("extension lease %s is no longer refused: the %s command succeeded",
                         lease.key, what)
        elif _own_failure(result):
            _log_failure(f"{what} ({lease.key})", command, result)
        else:
            self._refused(what, command, lease, result)
        return result

    def _refused(self, what: str, command: str, lease: Lease, result: CommandResult) -> None:
        self.failures += 1
        first_line = result.output.strip().splitlines()[0][:200] if result.output.strip() \
            else "no output"
        reason = f"{what} command failed ({result.reason()}): {first_line}"
        bad, new = self.bad.park(lease.key, what, _fingerprint(lease), reason)
        if new:
            _log_failure(f"{what} ({lease.key})", command, result)
            log.error("skipping extension lease %s: the %s command fails for it, so this node "
                      "cannot reach that node; the other peers are not held back. Retried in "
                      "%g s, then less and less often (every %g s at most), at once when the "
                      "lease changes", lease.key, what, bad.due - self.clock(),
                      bad.backoff.longest)
        else:
            log.debug("extension %s command still fails for %s (%d time(s)): %s", what,
                      lease.key, bad.failures, reason)

    def _waiting(self, key: str, action: str, lease: Lease) -> bool:
        """Whether ``key`` is a bad peer not due yet (same lease, same command)."""
        return self.bad.waiting(key, action, _fingerprint(lease))

    def reconcile(self, leases: Iterable[Lease]) -> ExtensionStatus:
        status = ExtensionStatus()
        wanted: dict[str, Lease] = {}
        for lease in leases:
            if lease.attrs.backend_type != "extension":
                continue
            wanted[lease.key] = lease
        # A lease gone before it was ever added: nothing is owed.
        self.bad.keep_only({**wanted, **self.applied})
        for key, lease in sorted(wanted.items()):
            fingerprint = _fingerprint(lease)
            done = self.applied.get(key)
            if done is not None and done[1] == fingerprint:
                continue
            stdin = peer_stdin(lease)
            if stdin is None:
                if key not in self.status.skipped:
                    log.error("ignoring extension lease %s: its BackendData is not a JSON "
                              "string (the output of the owner's PreStartupCommand); the node "
                              "that owns it rewrites it on restart, or delete the lease", key)
                status.skipped.append(key)
                continue
            if self._waiting(key, "subnet-add", lease):
                continue
            if self.cfg.subnet_add:
                result = self._run("subnet-add", self.cfg.subnet_add, lease, stdin)
                if not result.ok:
                    (status.pending_add if _own_failure(result) else status.bad).append(key)
                    continue
            status.ran += bool(self.cfg.subnet_add)
            self.applied[key] = (lease, fingerprint)
        for key in sorted(set(self.applied) - set(wanted)):
            lease = self.applied[key][0]
            stdin = peer_stdin(lease) or "\n"
            if self._waiting(key, "subnet-remove", lease):
                continue
            if self.cfg.subnet_remove:
                result = self._run("subnet-remove", self.cfg.subnet_remove, lease, stdin)
                if not result.ok:
                    (status.pending_remove if _own_failure(result) else status.bad).append(key)
                    continue
            status.ran += bool(self.cfg.subnet_remove)
            del self.applied[key]
        status.bad = sorted(self.bad)
        status.retry_in = self.bad.retry_in()
        self.status = status
        return status
