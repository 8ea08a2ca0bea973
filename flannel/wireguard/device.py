"""A WireGuard device: kernel when the kernel has WireGuard (its generic netlink family
answers), else wireguard-go, kept across flanneld restarts.

Owns: the link named ``spec.name`` (created, or adopted as it is), its private key and listen
port, MTU, up state, the lease address(es) on it and the route(s) to the cluster network
through it (``<network> dev <name> scope link``, as Go flannel); for the userspace path the
wireguard-go process (started detached: own session, ``WG_PROCESS_FOREGROUND=1``, output to
``spec.log_path``, so it outlives flanneld and the next flanneld adopts it when its UAPI
socket answers) and its socket file (a stale one, left by a killed process, is removed).
Nothing is deleted at shutdown: keys, peers and sessions survive a restart.

API: ``DeviceSpec``; ``WireguardDevice(spec)``: ``.ensure()`` (idempotent: call at start
and whenever the control channel stops answering), ``.kind`` ("kernel" | "userspace"),
``.control`` (a ``uapi.Control``: generic netlink for a kernel device, the UAPI socket for
wireguard-go; no tool is run), ``.index``, ``.pid`` (wireguard-go, when known),
``.public_key``. Synchronous (rtnetlink through ``kernel/links.py``, sockets): call from a
worker thread.
Must not touch: other links, peers (``peers.WireguardPeers``), routes other than its own.
Never logs a key.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from pathlib import Path

from flannel.files.fileutil import log_tail, open_log
from flannel.kernel import links, nsexec, rtnl
from flannel.kernel.device import ensure_address
from flannel.kernel.host import LOCAL, Host
from flannel.kernel.rtnl import NetlinkError, Rtnl
from flannel.wireguard.genl import LOAD_MODULE, NO_FAMILY, GenlControl, wireguard_family
from flannel.wireguard.keys import Secret, public_key
from flannel.wireguard.uapi import (
    Control,
    ControlError,
    DeviceUpdate,
    UapiControl,
    is_stale_socket,
)

log = logging.getLogger(__name__)

RTPROT_BOOT = rtnl.RTPROT_BOOT  # what Go's netlink library leaves it at; not flannel's 151
#: How long a starting wireguard-go may take to answer on its UAPI socket. One that fails
#: exits, which is seen at once; the bound only waits out a slow machine (it is started
#: through an interpreter, nsexec, which an emulated CPU on a loaded host starts in seconds).
STARTUP_TIMEOUT = 60.0
_LOG_TAIL = 600


class WireguardDeviceError(Exception):
    """The device cannot be set up; the message says what to fix."""


@dataclass(frozen=True)
class DeviceSpec:
    """``run_dir``: the directory that stands for ``/run`` in the device's view (None: the
    real ``/run``; labs give each node its own, see ``nsexec``). ``implementation``: "auto"
    (kernel when available), "kernel" or "userspace"."""

    name: str
    listen_port: int
    mtu: int
    private_key: Secret
    addresses: tuple[tuple[IPv4Address | IPv6Address, IPv4Network | IPv6Network], ...] = ()
    routes: tuple[IPv4Network | IPv6Network, ...] = ()
    host: Host = LOCAL
    run_dir: Path | None = None
    log_path: Path | None = None  # wireguard-go output; None: /run/flannel/<name>.log
    implementation: str = "auto"
    wireguard_go: str = "wireguard-go"

    @property
    def wireguard_go_log(self) -> Path:
        return self.log_path or Path("/run/flannel") / f"{self.name}.log"

    @property
    def socket_path(self) -> Path:
        return (self.run_dir or Path("/run")) / "wireguard" / f"{self.name}.sock"


class WireguardDevice:
    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.kind = ""
        self.index = 0
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.control: Control = UapiControl(spec.socket_path)
        self._uapi = UapiControl(spec.socket_path)  # the userspace channel, when that is used
        self.public_key = public_key(spec.private_key)

    # -- finding and creating the link ---------------------------------------------------

    def _find_link(self) -> tuple[int, str | None] | None:
        with Rtnl(self.spec.host) as sock:
            found = links.get_link(sock, self.name)
        if found is None:
            return None
        return found.link.index, found.kind or None

    def _try_kernel(self) -> bool:
        with Rtnl(self.spec.host) as sock:
            try:
                links.add_link(sock, links.NewLink(self.name, "wireguard"))
            except NetlinkError as err:
                if err.errno in (errno.EOPNOTSUPP, errno.ENODEV, errno.EINVAL):
                    return False
                raise WireguardDeviceError(f"cannot create WireGuard device {self.name}: "
                                           f"{os.strerror(err.errno or errno.EIO)}") from None
        return True

    def _create_kernel(self) -> str | None:
        """Create the device with kernel WireGuard: None when done, else why it cannot be.
        The generic netlink family is asked first: it is how the device is configured."""
        try:
            family = wireguard_family(self.spec.host)
        except (OSError, ControlError) as err:
            raise WireguardDeviceError(f"cannot ask the kernel for WireGuard in {self.spec.host}: "
                                       f"{err}") from None
        if family is None:
            return NO_FAMILY
        if not self._try_kernel():
            return "the kernel refused to create a wireguard link"
        return None

    def _use_kernel(self) -> None:
        self.kind = "kernel"
        self.pid = None
        if not isinstance(self.control, GenlControl):  # keeps the resolved family id
            self.control = GenlControl(self.name, self.spec.host)

    def _use_userspace(self) -> None:
        self.kind = "userspace"
        self._uapi = UapiControl(self.spec.socket_path)
        self.control = self._uapi

    def ensure(self) -> None:
        """Create or adopt the device, then make its key, port, MTU, state, addresses and
        routes match the spec (without touching peers)."""
        found = self._find_link()
        if found is not None and found[1] == "wireguard":
            if self.kind != "kernel":
                log.info("%s: adopting the existing kernel WireGuard device", self.name)
            self._use_kernel()
        elif found is not None:
            known = self.kind == "userspace"
            self._use_userspace()
            if not self._uapi.answers():
                if found[1] not in (None, "tun"):
                    raise WireguardDeviceError(
                        f"a {found[1]} device named {self.name} exists; remove "
                        f"it (`ip link del {self.name}`) so flannel can create "
                        "its WireGuard device")
                # A TUN of that name whose wireguard-go no longer answers: replace it.
                log.warning("%s exists but no wireguard-go answers on %s; restarting it",
                            self.name, self.spec.socket_path)
                self._remove_link()
                self._start_userspace()
            else:
                pid = self._uapi.peer_pid()
                if not known or pid != self.pid:  # not once per check of our own device
                    log.info("%s: adopting the running wireguard-go (pid %s, socket %s)",
                             self.name, pid, self.spec.socket_path)
                self.pid = pid
        elif self.spec.implementation != "userspace" and (why := self._create_kernel()) is None:
            log.info("%s: using kernel WireGuard", self.name)
            self._use_kernel()
        elif self.spec.implementation == "kernel":
            raise WireguardDeviceError(f"cannot create {self.name}: {why}; {LOAD_MODULE}")
        else:
            self._use_userspace()
            if self._uapi.answers():
                raise WireguardDeviceError(
                    f"a wireguard-go already answers on {self.spec.socket_path} but there is "
                    f"no {self.name} in this network namespace; stop that wireguard-go (it "
                    "serves another namespace) or give this node its own /run/wireguard")
            log.info("%s: %s; using wireguard-go (userspace)", self.name,
                     "userspace requested" if self.spec.implementation == "userspace"
                     else why)
            self._start_userspace()
        self._configure()

    def _remove_link(self) -> None:
        with Rtnl(self.spec.host) as sock, contextlib.suppress(NetlinkError):
            found = links.get_link(sock, self.name)
            if found is not None:
                links.delete_link(sock, found.link.index, f"delete device {self.name}")

    # -- wireguard-go ---------------------------------------------------------------------

    def _open_log(self) -> int:
        path = self.spec.wireguard_go_log
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return open_log(path)

    def _log_tail(self) -> str:
        return log_tail(self.spec.wireguard_go_log, _LOG_TAIL)

    def _start_userspace(self) -> None:
        binary = shutil.which(self.spec.wireguard_go)
        if binary is None:
            raise WireguardDeviceError(
                "the kernel has no WireGuard and wireguard-go is not installed; "
                "install the wireguard-go package or load the wireguard module")
        sock = self.spec.socket_path
        sock.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        if is_stale_socket(sock):
            log.warning("removing stale socket %s (its wireguard-go was killed)", sock)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)
        elif sock.exists() and not stat.S_ISSOCK(sock.lstat().st_mode):
            raise WireguardDeviceError(f"{sock} is not a socket; remove it")
        env = {k: v for k, v in os.environ.items() if not k.startswith("WG_")}
        env.update(WG_PROCESS_FOREGROUND="1", LOG_LEVEL=env.get("LOG_LEVEL", "error"))
        out = self._open_log()
        try:
            # Own session and no pipes: it survives flanneld and is adopted by the next one.
            self._process = subprocess.Popen(
                nsexec.command([binary, self.name], self.spec.host, self.spec.run_dir),
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True, close_fds=True)
        finally:
            os.close(out)
        self.pid = self._process.pid
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._uapi.answers():
            if self._process.poll() is not None:
                raise WireguardDeviceError(f"wireguard-go for {self.name} exited with status "
                                           f"{self._process.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise WireguardDeviceError(f"wireguard-go for {self.name} did not answer on {sock} "
                                           f"within {STARTUP_TIMEOUT:g}s: {self._log_tail()}")
            time.sleep(0.02)
        log.info("%s: wireguard-go started (pid %d, log %s)", self.name, self.pid,
                 self.spec.wireguard_go_log)

    def reap(self) -> None:
        """Collect an exited wireguard-go we started (no zombie while flanneld runs)."""
        if self._process is not None and self._process.poll() is not None:
            self._process = None

    # -- configuration ----------------------------------------------------------------------

    def _configure(self) -> None:
        try:
            state = self.control.get()
            if (state.private_key != self.spec.private_key
                    or state.listen_port != self.spec.listen_port):
                self.control.set(DeviceUpdate(private_key=self.spec.private_key,
                                              listen_port=self.spec.listen_port))
        except ControlError as err:
            raise WireguardDeviceError(f"cannot configure {self.name}: {err}") from None
        with Rtnl(self.spec.host) as sock:
            found = links.get_link(sock, self.name)
            if found is None:
                raise WireguardDeviceError(f"{self.name} vanished while it was being configured")
            link = found.link
            self.index = link.index
            if link.mtu != self.spec.mtu or not link.up:
                links.set_link(sock, self.index, f"set MTU of {self.name} and bring it up",
                               mtu=self.spec.mtu, up=True)
        for address, network in self.spec.addresses:
            ensure_address(self.index, address, network, self.spec.host)
        with Rtnl(self.spec.host) as sock:
            for net in self.spec.routes:
                sock.replace_route(rtnl.Route(str(net), None, self.index),
                                   protocol=RTPROT_BOOT, scope=rtnl.RT_SCOPE_LINK)
