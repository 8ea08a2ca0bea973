"""A throw-away flannel cluster on one machine, built from network namespaces.

Owns, for one lab name: an underlay namespace ``<name>-ul`` holding the underlay bridges (one
per underlay subnet, routed between each other) and a real etcd; node namespaces
``<name>-n<i>``, each wired to an underlay bridge by a veth pair and running ``flanneld``;
the lab directory (etcd data, logs, subnet files, ``state.json``) under the lab root.
``state.json`` records every namespace and process the lab created (a process by pid and
start time, so a reused pid is never signalled); ``down`` removes exactly those, what still
runs inside the node namespaces (wireguard-go, which outlives flanneld by design), and the
lab directory, never something that merely has a lab-like name. Each node's flanneld runs
the same flannel as the lab itself (``launchers/flanneld`` with PYTHONPATH naming the lab's
own sources first: a test's checkout, not whatever the virtualenv's console script points
at), with a private ``/run`` (``<node dir>/run``, the lab directory kept visible), as on a host of
its own: its ``/run/flannel`` and ``/run/wireguard`` are the node's. Creating the lab directory is
the claim on the name: a lab that exists is never built over.
Must not touch: the root namespace's links, routes or firewall; namespaces, processes and
files it did not record creating.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import flannel
import flannel_lab
from flannel.files.fileutil import write_atomic
from flannel.kernel import nsexec
from flannel.kernel.host import LOCAL
from flannel.ops import commands
from flannel.process import stopping
from flannel_lab import slowness
from flannel_lab.etcd import EtcdServer

DEFAULT_ROOT = Path("/run/flannel-lab")
STATE_FILE = "state.json"
ETCD_PREFIX = "/coreos.com/network"
UNDERLAYS = (("192.168.111", "fd00:111"), ("192.168.112", "fd00:112"))
FLANNELD = [sys.executable, str(Path(__file__).resolve().parent / "launchers" / "flanneld")]
# Where the flannel and flannel_lab this process imported live: their processes import them
# from there first.
SOURCES = tuple(dict.fromkeys(str(Path(package.__path__[0]).resolve().parent)
                              for package in (flannel, flannel_lab)))
IP = shutil.which("ip") or "/usr/sbin/ip"  # absolute: flanneld may get a PATH of its own


def same_code(env: dict[str, str]) -> dict[str, str]:
    """``env`` with PYTHONPATH naming this lab's sources first."""
    rest = [path for path in env.get("PYTHONPATH", "").split(os.pathsep)
            if path and path not in SOURCES]
    return {**env, "PYTHONPATH": os.pathsep.join([*SOURCES, *rest])}


class LabError(Exception):
    """A lab step failed; the message says which and why."""


class LabExists(LabError):
    """A lab of that name exists already; it is left as it is."""


class FlanneldExited(LabError):
    """A node's flanneld ended while the lab waited for it: the reason its log gives."""

    def __init__(self, index: int, reason: str, log_file: str) -> None:
        super().__init__(f"flanneld on node {index} exited: {reason} (its log: {log_file})")
        self.index = index
        self.reason = reason
        self.log_file = log_file


#: How a flanneld log line of an error starts (glog: severity, date, time, pid, place).
_GLOG_ERROR = re.compile(r"^[EF]\d{4} \S+\s+\d+ \S+\] ")
_GLOG_LINE = re.compile(r"^[IWEF]\d{4} \S+\s+\d+ \S+\] ")
#: The line flanneld starts every run with.
_FIRST_LINE = "CLI flags config:"
MAX_REASON_LINES = 5


def exit_reason(log: str) -> str:
    """Why a flanneld that ended did, from its log: the error lines ending its last run
    (their glog prefix dropped), else that run's last line (a traceback's, or a clean exit's;
    a process killed outright leaves no word)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if _FIRST_LINE in line]
    run_lines = [line for line in lines[starts[-1] if starts else 0:] if line.strip()]
    errors = [i for i, line in enumerate(run_lines) if _GLOG_ERROR.match(line)]
    if not errors:
        return (f"no error in its log, whose last line is: "
                f"{_GLOG_LINE.sub('', run_lines[-1]).strip()}" if run_lines
                else "its log is empty")
    block = [errors[-1]]
    while len(block) < MAX_REASON_LINES and block[0] - 1 in errors:
        block.insert(0, block[0] - 1)
    return "; ".join(_GLOG_LINE.sub("", run_lines[i]).strip() for i in block)


def run(cmd: list[str], *, check: bool = True, timeout: float = 30.0
        ) -> subprocess.CompletedProcess[str]:
    """``cmd``'s result; LabError when it fails (``check``) or gives no answer within
    ``timeout`` (scaled by the lab's slowness factor)."""
    try:
        result = subprocess.run(cmd, capture_output=True, text=True,
                                timeout=slowness.scaled(timeout), check=False)
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(cmd)}: no answer after {slowness.within(timeout)}"
                       ) from None
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def ip(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run(["ip", "-n", netns, *args], check=check)


def in_ns(netns: str, *cmd: str, check: bool = True, timeout: float = 30.0
          ) -> subprocess.CompletedProcess[str]:
    return run(["ip", "netns", "exec", netns, *cmd], check=check, timeout=timeout)


def sysctl(netns: str, key: str, value: str) -> None:
    in_ns(netns, "sysctl", "-q", "-w", f"{key}={value}")


@dataclass
class Node:
    index: int
    netns: str
    underlay: int
    address: str
    address6: str
    subnet_file: str
    log_file: str
    pid: int = 0
    started: int = 0  # the process's start time (clock ticks since boot), with pid
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # flanneld's, beyond the lab's own


@dataclass
class Pod:
    node: int
    name: str
    netns: str
    address: str
    address6: str = ""


@dataclass
class LabState:
    name: str
    directory: str
    etcd_endpoint: str = ""
    etcd_pid: int = 0
    etcd_started: int = 0
    cloud_pid: int = 0  # the lab's cloud (awscloud, alicloud, gcecloud), if its backend needs one
    cloud_started: int = 0
    ipv6: bool = False
    backend: str = ""
    namespaces: list[str] = field(default_factory=list)  # created by the lab, in order
    nodes: list[Node] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)

    def save(self) -> None:
        write_atomic(Path(self.directory) / STATE_FILE,
                     json.dumps(asdict(self), indent=2).encode(), mode=0o644)

    @classmethod
    def load(cls, name: str, directory: Path) -> LabState | None:
        """The recorded state; None without a state file; LabError if it is unusable."""
        path = directory / STATE_FILE
        try:
            with path.open("rb") as file:
                data = json.loads(file.read(1 << 20))
            data["nodes"] = [Node(**node) for node in data.get("nodes", [])]
            data["pods"] = [Pod(**pod) for pod in data.get("pods", [])]
            state = cls(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise LabError(f"lab {name}: cannot use {path} ({err}); remove the lab's "
                           "namespaces and that directory by hand") from None
        if state.name != name or not all(isinstance(n, str) for n in state.namespaces):
            raise LabError(f"lab {name}: {path} describes another lab; remove it by hand")
        return state


class Lab:
    def __init__(self, name: str = "fl-lab", root: Path = DEFAULT_ROOT,
                 progress: Callable[[str], None] | None = None) -> None:
        if not name or len(name) > 20 or not all(c.isalnum() or c in "-_" for c in name):
            raise LabError(f"lab name {name!r}: use up to 20 letters, digits, '-' or '_'")
        try:
            slowness.factor()
        except slowness.SlownessError as err:
            raise LabError(str(err)) from None
        self.name = name
        self.directory = root / name
        self.progress = progress or (lambda _msg: None)
        loaded = LabState.load(name, self.directory)
        #: Whether the lab directory is this lab's: recorded before, or claimed here.
        self.owns_directory = loaded is not None
        self.state = loaded or LabState(name, str(self.directory))
        self.etcd: EtcdServer | None = None
        #: When (time.monotonic) this object first started a flanneld: what mesh times count from.
        self.first_flanneld_start = 0.0

    @property
    def exists(self) -> bool:
        """Whether something (a lab, or a leftover) holds this lab's directory."""
        return self.directory.exists()

    def command(self, verb: str, *args: str) -> str:
        """A ``flannel-lab`` command line about this lab, to paste (the script by its full
        path; ``--root`` when it is not the default)."""
        root = self.directory.parent
        return shlex.join([commands.script("flannel-lab"),
                           *(["--root", str(root)] if root != DEFAULT_ROOT else []), verb,
                           *args, "--name", self.name])

    def exists_error(self) -> LabExists:
        return LabExists(f"lab {self.name} already exists ({self.directory}); it is left as "
                         f"it is: '{self.command('down')}' removes it")

    @property
    def underlay_ns(self) -> str:
        return f"{self.name}-ul"

    def node_ns(self, index: int) -> str:
        return f"{self.name}-n{index}"

    def node_run_dir(self, index: int) -> Path:
        """What node ``index``'s flanneld (and what it starts) sees as ``/run``."""
        return self.directory / f"n{index}" / "run"

    def node(self, index: int) -> Node:
        for node in self.state.nodes:
            if node.index == index:
                return node
        raise LabError(f"lab {self.name} has no node {index}")

    # -- building ---------------------------------------------------------------------

    def _claim(self) -> None:
        """Create the lab directory; LabExists if it is there already (nothing touched)."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.directory.mkdir()
        except FileExistsError:
            raise self.exists_error() from None
        self.owns_directory = True
        os.chmod(self.directory, 0o755)  # noqa: S103 - logs and subnet files are for reading
        self.state.save()

    def _add_netns(self, netns: str) -> None:
        """Create ``netns`` and record it as the lab's (only once it is really ours; a stop
        waits until it is recorded)."""
        with stopping.held():
            run(["ip", "netns", "add", netns])
            self.state.namespaces.append(netns)
            self.state.save()

    def create_underlay(self, underlays: int = 1, ipv6: bool = False) -> None:
        self._claim()
        self.state.ipv6 = ipv6
        self.state.save()
        ul = self.underlay_ns
        self.progress(f"creating underlay namespace {ul}")
        self._add_netns(ul)
        ip(ul, "link", "set", "lo", "up")
        sysctl(ul, "net.ipv4.ip_forward", "1")
        if ipv6:
            sysctl(ul, "net.ipv6.conf.all.forwarding", "1")
        for k in range(underlays):
            v4, v6 = UNDERLAYS[k]
            bridge = f"br{k}"
            # A set MAC: a bridge otherwise takes its lowest port's, which changes when that
            # node leaves, and the other nodes' ARP entries for the gateway go stale.
            ip(ul, "link", "add", bridge, "address", f"02:f1:00:00:00:{k:02x}", "type",
               "bridge")
            ip(ul, "addr", "add", f"{v4}.1/24", "dev", bridge)
            if ipv6:
                ip(ul, "addr", "add", f"{v6}::1/64", "dev", bridge, "nodad")
            ip(ul, "link", "set", bridge, "up")
        self.progress("starting etcd")
        self.etcd = EtcdServer(self.directory / "etcd", netns=ul,
                               host=f"{UNDERLAYS[0][0]}.1")
        try:
            self.etcd.start()
        except RuntimeError as err:
            raise LabError(str(err)) from None
        self.state.etcd_endpoint = self.etcd.endpoint
        self.state.etcd_pid = self.etcd.proc.pid if self.etcd.proc else 0
        self.state.etcd_started = _start_ticks(self.state.etcd_pid)
        self.state.save()

    def add_node(self, index: int, underlay: int = 0) -> Node:
        ns = self.node_ns(index)
        v4, v6 = UNDERLAYS[underlay]
        node = Node(index, ns, underlay, f"{v4}.{10 + index}", f"{v6}::{10 + index}",
                    str(self.directory / f"n{index}" / "subnet.env"),
                    str(self.directory / f"n{index}" / "flanneld.log"))
        (self.directory / f"n{index}").mkdir(parents=True, exist_ok=True)
        self.progress(f"creating node {index} ({ns}, {node.address})")
        self._add_netns(ns)
        self.state.nodes.append(node)
        self.state.save()
        ip(ns, "link", "set", "lo", "up")
        ip(ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"n{index}", "netns",
           self.underlay_ns)
        ip(self.underlay_ns, "link", "set", f"n{index}", "master", f"br{underlay}", "up")
        ip(ns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        if self.state.ipv6:
            ip(ns, "addr", "add", f"{node.address6}/64", "dev", "eth0", "nodad")
        ip(ns, "link", "set", "eth0", "up")
        ip(ns, "route", "add", "default", "via", f"{v4}.1")
        if self.state.ipv6:
            ip(ns, "-6", "route", "add", "default", "via", f"{v6}::1")
        sysctl(ns, "net.ipv4.ip_forward", "1")
        if self.state.ipv6:
            sysctl(ns, "net.ipv6.conf.all.forwarding", "1")
        return node

    def put_config(self, config: dict[str, Any] | str) -> None:
        text = config if isinstance(config, str) else json.dumps(config)
        self.etcdctl("put", f"{ETCD_PREFIX}/config", text)

    def etcdctl(self, *args: str) -> str:
        cmd = ["etcdctl", "--endpoints", self.state.etcd_endpoint, "--command-timeout", "5s",
               "--dial-timeout", "2s", *args]
        env_cmd = ["env", "ETCDCTL_API=3", *cmd]
        output: str = in_ns(self.underlay_ns, *env_cmd).stdout
        return output

    def leases(self) -> dict[str, str]:
        lines = self.etcdctl("get", "--prefix", f"{ETCD_PREFIX}/subnets/").splitlines()
        return {lines[i].rsplit("/", 1)[1]: lines[i + 1] for i in range(0, len(lines) - 1, 2)}

    def start_aws_cloud(self, network: str, timeout: float = 90.0) -> str:
        """Start the lab's AWS (``flannel_lab.awscloud``: moto, a metadata service per node,
        the underlay namespace as VPC router) for the nodes added so far, point their
        flanneld at it, and return its route table's ID."""
        cloud = self._start_cloud("flannel_lab.awscloud", "AWS", network, timeout)
        from flannel_lab.awscloud import LAB_KEY_ID, LAB_SECRET

        for node in self.state.nodes:
            node.env = {"AWS_ACCESS_KEY_ID": LAB_KEY_ID, "AWS_SECRET_ACCESS_KEY": LAB_SECRET,
                        "AWS_ENDPOINT_URL_EC2": cloud["ec2_url"],
                        "AWS_EC2_METADATA_SERVICE_ENDPOINT": cloud["metadata"][str(node.index)],
                        "AWS_EC2_METADATA_DISABLED": "true",
                        "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE":
                        "/nonexistent"}
        self.state.save()
        return str(cloud["route_table"])

    def start_ali_cloud(self, network: str, timeout: float = 60.0) -> dict[str, str]:
        """Start the lab's Alibaba Cloud (``flannel_lab.alicloud``: the VPC API double, the
        metadata service, the underlay namespace as VPC router) for the nodes added so far,
        give their flanneld its access key, and return what the network config needs
        (``Endpoint``, ``MetadataURL``)."""
        cloud = self._start_cloud("flannel_lab.alicloud", "Alibaba Cloud", network, timeout)
        for node in self.state.nodes:
            node.env = {"ACCESS_KEY_ID": cloud["key_id"], "ACCESS_KEY_SECRET": cloud["secret"]}
        self.state.save()
        return {"Endpoint": cloud["endpoint"], "MetadataURL": cloud["metadata"]}

    def start_gce_cloud(self, network: str, timeout: float = 60.0) -> str:
        """Start the lab's Compute Engine (``flannel_lab.gcecloud``: the API double, a
        metadata server per node, the underlay namespace as VPC router) for the nodes added
        so far, point their flanneld at their metadata server, and return the API's URL."""
        cloud = self._start_cloud("flannel_lab.gcecloud", "Compute Engine", network, timeout)
        for node in self.state.nodes:
            node.env = {"GCE_METADATA_HOST": cloud["metadata"][str(node.index)]}
        self.state.save()
        return str(cloud["compute_url"])

    def _start_cloud(self, module: str, what: str, network: str, timeout: float
                     ) -> dict[str, Any]:
        """Run the lab cloud ``module`` in the underlay namespace; what it wrote to
        ``cloud.json`` once it serves."""
        out = self.directory / "cloud.json"
        router = f"{UNDERLAYS[0][0]}.1"
        argv = [IP, "netns", "exec", self.underlay_ns, sys.executable, "-m",
                module, "--address", router, "--network", network,
                "--router-netns", self.underlay_ns, "--out", str(out),
                *(f"--node={node.index}={node.address}" for node in self.state.nodes)]
        with stopping.held(), open(self.directory / "cloud.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=same_code(dict(os.environ)))
            self.state.cloud_pid, self.state.cloud_started = proc.pid, _start_ticks(proc.pid)
            self.state.save()
        deadline = time.monotonic() + slowness.scaled(timeout)
        while not out.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.directory / "cloud.log").read_text(errors="replace")
                raise LabError(f"the lab's {what} did not start:\n{log_text[-3000:]}")
            time.sleep(0.1)
        cloud: dict[str, Any] = json.loads(out.read_text())
        return cloud

    # -- flanneld ---------------------------------------------------------------------

    def start_flanneld(self, index: int, *extra: str, env: dict[str, str] | None = None
                       ) -> Node:
        node = self.node(index)
        if extra:
            node.extra_args = list(extra)
        if env:
            node.env = {**node.env, **env}
        args = [*FLANNELD, f"--etcd-endpoints={self.state.etcd_endpoint}",
                f"--subnet-file={node.subnet_file}", "--iface=eth0", *node.extra_args]
        run_dir = self.node_run_dir(index)
        run_dir.mkdir(mode=0o755, exist_ok=True)
        keep = [self.directory] if self.directory.is_relative_to("/run") else []
        args = nsexec.command(args, LOCAL, run_dir, keep)
        with stopping.held(), open(node.log_file, "ab") as log:
            proc = subprocess.Popen([IP, "netns", "exec", node.netns, *args], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    env=same_code({**os.environ, **node.env}))
            node.pid, node.started = proc.pid, _start_ticks(proc.pid)
            self.state.save()
        self.first_flanneld_start = self.first_flanneld_start or time.monotonic()
        return node

    def stop_flanneld(self, index: int, sig: int = signal.SIGTERM,
                      timeout: float = 15.0) -> int | None:
        node = self.node(index)
        if not node.pid:
            return None
        code = _stop_pid(node.pid, node.started, sig, timeout)
        node.pid = node.started = 0
        self.state.save()
        return code

    def flanneld_running(self, index: int) -> bool:
        node = self.node(index)
        return bool(node.pid) and _alive(node.pid)

    def flanneld_gone(self, index: int) -> str:
        """Why node ``index`` has no flanneld running ("" when it has): never started or
        stopped by the lab, or its recorded process ended (gone, or a zombie its parent has
        not collected)."""
        node = self.node(index)
        if not node.pid:
            return "flanneld is not running (stopped by the lab)"
        fields = _stat(node.pid)
        if fields and int(fields[19]) == node.started and fields[0] not in ("Z", "X"):
            return ""
        how = ("exited, a zombie its parent has not collected" if fields
               and int(fields[19]) == node.started else "exited")
        return f"flanneld (pid {node.pid}) {how}: {self.exited(index).reason}"

    def exited(self, index: int) -> FlanneldExited:
        """The error saying why node ``index``'s flanneld ended, from its log."""
        node = self.node(index)
        return FlanneldExited(index, exit_reason(self.log(index)), node.log_file)

    def restart_flanneld(self, index: int, timeout: float = 15.0) -> Node:
        """Stop node ``index``'s flanneld if it runs, start it again with the flags and
        environment it was started with (recorded in the lab's state)."""
        node = self.node(index)
        if node.pid and not self.flanneld_gone(index):
            self.stop_flanneld(index, timeout=timeout)
        node.pid = node.started = 0
        return self.start_flanneld(index)

    def lease_key(self, index: int) -> str:
        """The key of node ``index``'s IPv4 lease (``10.244.3.0-24``), from its subnet.env."""
        address, plen = self.wait_subnet_env(index)["FLANNEL_SUBNET"].split("/")
        network = ipaddress.ip_network(f"{address}/{plen}", strict=False)
        return f"{network.network_address}-{plen}"

    def remove_node(self, index: int) -> None:
        """The node leaves: flanneld stops, its lease is deleted (as an operator removing a
        node does; flanneld keeps it on exit, like upstream), its namespace goes."""
        node = self.node(index)
        key = self.lease_key(index) if Path(node.subnet_file).exists() else ""
        self.stop_flanneld(index)
        # Dual-stack keys hold both subnets: 10.244.3.0-24&fd00:10:244:3::-64.
        for stored in self.leases() if key else ():
            if stored == key or stored.startswith(f"{key}&"):
                self.etcdctl("del", f"{ETCD_PREFIX}/subnets/{stored}")
        _stop_processes_in(node.netns)
        run(["ip", "netns", "del", node.netns], check=False)
        self.state.nodes = [n for n in self.state.nodes if n.index != index]
        self.state.namespaces = [n for n in self.state.namespaces if n != node.netns]
        self.state.save()

    def wait_subnet_env(self, index: int, timeout: float = 30.0) -> dict[str, str]:
        node = self.node(index)
        path = Path(node.subnet_file)
        deadline = time.monotonic() + slowness.scaled(timeout)
        while not path.exists():
            if node.pid and not _alive(node.pid):
                raise self.exited(index)
            if time.monotonic() > deadline:
                raise LabError(f"node {index}: no subnet.env after "
                               f"{slowness.within(timeout)} (its log: "
                               f"{node.log_file})")
            time.sleep(0.05)
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

    def attach_pod_bridge(self, index: int) -> None:
        """Put the node's first pod address on a bridge ``cni0`` (as upstream's tests do)."""
        env = self.wait_subnet_env(index)
        ns = self.node_ns(index)
        if ip(ns, "link", "show", "cni0", check=False).returncode != 0:
            ip(ns, "link", "add", "cni0", "type", "bridge")
        ip(ns, "addr", "flush", "dev", "cni0")
        ip(ns, "addr", "add", env["FLANNEL_SUBNET"], "dev", "cni0")
        if "FLANNEL_IPV6_SUBNET" in env:
            ip(ns, "addr", "add", env["FLANNEL_IPV6_SUBNET"], "dev", "cni0", "nodad")
            # No duplicate address detection on the lab's bridge (its link-local address
            # included): there is nothing to collide with, and a tentative address would
            # make the first pings after 'up' fail.
            sysctl(ns, "net.ipv6.conf.cni0.accept_dad", "0")
        ip(ns, "link", "set", "cni0", "up")

    def pod_address(self, index: int, v6: bool = False) -> str:
        env = self.wait_subnet_env(index)
        return env["FLANNEL_IPV6_SUBNET" if v6 else "FLANNEL_SUBNET"].split("/")[0]

    # -- pods, through the real CNI plugin -------------------------------------------

    @property
    def cni_bin(self) -> Path:
        return self.directory / "cni-bin"

    def netconf(self, index: int) -> dict[str, Any]:
        """The conflist's flannel entry (upstream's cbr0), with per-node state paths."""
        node_dir = self.directory / f"n{index}"
        return {"cniVersion": "1.0.0", "name": "cbr0", "type": "flannel",
                "subnetFile": self.node(index).subnet_file, "dataDir": str(node_dir / "cni"),
                "ipam": {"dataDir": str(node_dir / "ipam")},
                "delegate": {"hairpinMode": True, "isDefaultGateway": True}}

    def cni(self, command: str, pod: Pod) -> dict[str, Any]:
        from flannel.cni.install import CHECK_TIMEOUT, install_plugin

        plugin = self.cni_bin / "flannel"
        if not plugin.exists():
            install_plugin(self.cni_bin, check_timeout=slowness.scaled(CHECK_TIMEOUT))
        env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin"), "CNI_COMMAND": command,
               "CNI_CONTAINERID": pod.name, "CNI_NETNS": f"/run/netns/{pod.netns}",
               "CNI_IFNAME": "eth0", "CNI_PATH": f"{self.cni_bin}:/usr/lib/cni"}
        proc = subprocess.run(["ip", "netns", "exec", self.node_ns(pod.node), str(plugin)],
                              input=json.dumps(self.netconf(pod.node)).encode(), env=env,
                              capture_output=True, timeout=slowness.scaled(60),
                              check=False)
        if proc.returncode != 0:
            raise LabError(f"CNI {command} of {pod.name} on node {pod.node} failed: "
                           f"{proc.stdout.decode().strip()} {proc.stderr.decode().strip()}")
        return json.loads(proc.stdout) if proc.stdout.strip() else {}

    def add_pod(self, index: int) -> Pod:
        """A pod: a namespace attached to node ``index`` by the flannel CNI plugin."""
        self.wait_subnet_env(index)
        number = 1 + max((int(p.name.rsplit("p", 1)[1]) for p in self.state.pods
                          if p.node == index), default=0)
        name = f"n{index}p{number}"
        pod = Pod(index, name, f"{self.name}-{name}", "")
        self._add_netns(pod.netns)
        self.state.pods.append(pod)
        self.state.save()
        result = self.cni("ADD", pod)
        for entry in result.get("ips", []):
            address = entry["address"].split("/")[0]
            if ":" in address:
                pod.address6 = address
            else:
                pod.address = address
        self.state.save()
        return pod

    def delete_pod(self, pod: Pod) -> None:
        self.cni("DEL", pod)
        run(["ip", "netns", "del", pod.netns], check=False)
        self.state.pods = [p for p in self.state.pods if p.name != pod.name]
        self.state.namespaces = [n for n in self.state.namespaces if n != pod.netns]
        self.state.save()

    def ipam_reservations(self, index: int) -> list[str]:
        """Addresses host-local holds on node ``index`` (one file each)."""
        store = self.directory / f"n{index}" / "ipam" / "cbr0"
        if not store.exists():
            return []
        return sorted(p.name for p in store.iterdir() if p.name[0].isdigit() or ":" in p.name)

    def pod_ping(self, pod: Pod, target: str, count: int = 1, timeout: float = 1.0,
                 within: float = 0.0) -> bool:
        result = in_ns(pod.netns, "ping", "-c", str(count), "-W", f"{timeout:g}",
                       *_retries(within), target, check=False,
                       timeout=count * timeout + within + 10)
        return result.returncode == 0

    def log(self, index: int) -> str:
        path = Path(self.node(index).log_file)
        return path.read_text(errors="replace") if path.exists() else ""

    def ping(self, src: int, dst: int, v6: bool = False, count: int = 1,
             timeout: float = 1.0, within: float = 0.0) -> bool:
        """Whether ``count`` echoes are answered; with ``within``, echoes are sent every
        0.2 s until they are or ``within`` seconds passed (a first echo lost to a
        neighbour still being resolved is not a failure)."""
        result = in_ns(self.node_ns(src), "ping", "-6" if v6 else "-4", "-c", str(count),
                       "-W", f"{timeout:g}", *_retries(within), "-I",
                       self.pod_address(src, v6), self.pod_address(dst, v6), check=False,
                       timeout=count * timeout + within + 10)
        return result.returncode == 0

    # -- teardown ---------------------------------------------------------------------

    def down(self) -> None:
        """Stop the processes, remove the namespaces and the directory this lab recorded
        creating, and nothing else; safe to run twice. LabError when something could not
        be removed: the state then records only that, for the next ``down``."""
        for node in self.state.nodes:  # all at once: a big lab's daemons stop in parallel
            if node.pid:
                _signal_own(node.pid, node.started, signal.SIGTERM)
        for node in self.state.nodes:
            if node.pid:
                _stop_pid(node.pid, node.started, signal.SIGTERM, 10.0)
        if self.state.cloud_pid:
            _stop_pid(self.state.cloud_pid, self.state.cloud_started, signal.SIGTERM, 10.0)
        if self.etcd is not None:
            self.etcd.stop()
        elif self.state.etcd_pid:
            _stop_pid(self.state.etcd_pid, self.state.etcd_started, signal.SIGTERM, 10.0)
        for node in self.state.nodes:
            if node.netns.startswith(f"{self.name}-"):
                _stop_processes_in(node.netns)
        for netns in reversed(self.state.namespaces):
            if netns.startswith(f"{self.name}-"):  # a state file edited by hand stays harmless
                run(["ip", "netns", "del", netns], check=False)
        left = self._left_running()
        if left:
            self.state.save()
            raise LabError(f"lab {self.name}: could not remove {', '.join(left)}; "
                           f"'{self.command('down')}' tries again")
        if self.owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.owns_directory = False
        self.state = LabState(self.name, str(self.directory))

    def _left_running(self) -> list[str]:
        """What ``down`` left: the lab's processes still running, namespaces still there
        (and the state reduced to them)."""
        left = []
        for node in self.state.nodes:
            if node.pid and _running(node.pid, node.started):
                left.append(f"flanneld of node {node.index} (pid {node.pid})")
            else:
                node.pid = node.started = 0
        state = self.state
        for what, pid, started in (("etcd", state.etcd_pid, state.etcd_started),
                                   ("the lab's cloud", state.cloud_pid, state.cloud_started)):
            if pid and _running(pid, started):
                left.append(f"{what} (pid {pid})")
        namespaces = [ns for ns in state.namespaces if ns.startswith(f"{self.name}-")
                      and os.path.lexists(f"/run/netns/{ns}")]
        left += [f"namespace {ns}" for ns in namespaces]
        state.namespaces = namespaces
        return left


def _stop_processes_in(netns: str, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL, every process whose network namespace is ``netns`` (one the
    lab created: what runs there is the lab's, such as a wireguard-go left by flanneld)."""
    try:
        target = os.stat(f"/run/netns/{netns}")
    except OSError:
        return
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            found = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            pid = int(entry)
            pids.append((pid, _start_ticks(pid)))
    for pid, started in pids:
        _signal_own(pid, started, signal.SIGTERM)
    deadline = time.monotonic() + slowness.scaled(timeout)
    while time.monotonic() < deadline and any(_running(p, s) for p, s in pids):
        time.sleep(0.02)
    for pid, started in pids:
        _signal_own(pid, started, signal.SIGKILL)


def _retries(within: float) -> list[str]:
    """ping's options to keep sending, every 0.2 s, for up to ``within`` seconds (scaled)."""
    return ["-i", "0.2", "-w", f"{slowness.scaled(within):g}"] if within else []


def _stat(pid: int) -> list[str]:
    """Fields 3 and on of ``/proc/<pid>/stat`` (state first); [] if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    # The command name (field 2) may hold spaces and parentheses: count from its end.
    return stat[stat.rindex(")") + 2:].split()


def _start_ticks(pid: int) -> int:
    """When process ``pid`` started (clock ticks since boot); 0 if there is no such process."""
    fields = _stat(pid)
    return int(fields[19]) if fields else 0


def _running(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process that started at ``started`` and has not exited.
    An exited process whose parent has not reaped it yet (a zombie: flanneld, etcd or
    wireguard-go of a lab built by another process, left to init) has stopped: waiting for
    init to reap it would only add its reaping delay to every ``down``."""
    fields = _stat(pid)
    return bool(fields) and int(fields[19]) == started and fields[0] not in ("Z", "X")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    return True


def _signal_own(pid: int, started: int, sig: int) -> bool:
    """Send ``sig`` if ``pid`` is still the process that started at ``started``."""
    if not started or _start_ticks(pid) != started:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    return True


def _stop_pid(pid: int, started: int, sig: int, timeout: float) -> int | None:
    """Signal our process ``pid`` and wait for it; SIGKILL after ``timeout`` (scaled). Its
    exit code if it is a child of this process; nothing happens if ``pid`` is now someone
    else's."""
    if not _signal_own(pid, started, sig):
        return None
    deadline = time.monotonic() + slowness.scaled(timeout)
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            if not _running(pid, started):
                return None
        else:
            if done:
                return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    _signal_own(pid, started, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    return None
