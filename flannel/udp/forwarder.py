"""The control plane's handle on the udp forwarder process.

Owns the child process (``flannel/udp/worker.py``) and its control socket: ``start`` (or
restart after a death, re-sending the last peer set), ``set_peers`` (atomic swap, answered
once the worker uses it), ``status`` and ``stop``. Each request carries a sequence number
that the worker's answer echoes: an answer that comes after its request timed out is
discarded, never taken for the answer to the next request. The forwarder runs in a process of its
own: a Python packet loop holds the GIL for most of its time, and sharing it with the asyncio
control plane would delay one by the other (docs/benchmarks.md, "udp forwarder").
Calls block for at most ``timeout`` seconds: from asyncio, call them through
``asyncio.to_thread``. Thread-safe.
Must not touch: the TUN device's configuration (``flannel/udp/device.py``), the store.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network
from typing import Any

from flannel.kernel.host import LOCAL, Host

START_TIMEOUT = 10.0
REQUEST_TIMEOUT = 2.0
# Building a peer table is linear in its size (~15 us a peer on an idle core): a set of
# 20000 peers gets 20 s more, room for a worker starved of CPU on a loaded node.
PER_PEER_TIMEOUT = 0.001
SO_SNDBUFFORCE = 32
CONTROL_BUFFER = 8 << 20


class ForwarderError(Exception):
    """The forwarder cannot start or answer; the message says why."""


@dataclass(frozen=True)
class ForwarderConfig:
    tun: str  # TUN device name, e.g. flannel0
    bind: IPv4Address  # the external interface address (not the public IP)
    port: int  # UDP port, the same on every node
    source: IPv4Address  # our lease base address: source of ICMP unreachable replies
    mtu: int  # the TUN MTU
    host: Host = LOCAL  # where the TUN and the socket live
    segment_send: bool = True  # one sendmsg with UDP_SEGMENT per same-size burst
    gro: bool = True  # UDP_GRO on receive and merged TCP writes into the TUN
    peers_only: bool = False  # drop datagrams whose source is no peer's public IP


@dataclass(frozen=True)
class ForwarderStatus:
    alive: bool
    pid: int | None
    peers: int = 0
    tun_attached: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    last_error: str = ""


class UdpForwarder:
    def __init__(self, config: ForwarderConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._peers: list[tuple[str, str]] = []
        self._last_error = ""
        self._seq = 0

    def start(self) -> None:
        """Start the worker (again, if it died); returns once it forwards."""
        with self._lock:
            if self._process is not None and self._process.poll() is None:
                return
            self._reap()
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:  # a peer set is one message: room for ~100k peers
                parent.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, CONTROL_BUFFER)
            except OSError:
                parent.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CONTROL_BUFFER)
            config = {"tun": self.config.tun, "bind": str(self.config.bind),
                      "port": self.config.port, "source": str(self.config.source),
                      "mtu": self.config.mtu, "netns": self.config.host.netns,
                      "segment_send": self.config.segment_send, "gro": self.config.gro,
                      "peers_only": self.config.peers_only}
            try:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "flannel.udp.worker", json.dumps(config),
                     str(child.fileno())], pass_fds=[child.fileno()], stdin=subprocess.DEVNULL)
            finally:
                child.close()
            self._control = parent
            reply = self._receive(START_TIMEOUT)
            if reply.get("op") != "ready":
                self._last_error = reply.get("error", f"unexpected reply {reply}")
                self._reap()
                raise ForwarderError(f"udp forwarder did not start: {self._last_error}")
            self._last_error = ""
            if self._peers:
                self._request({"op": "peers", "peers": self._peers}, self._peers_timeout())

    def set_peers(self, peers: Mapping[IPv4Network, IPv4Address]) -> None:
        """Replace the whole peer table (subnet -> public IP); in use when this returns.

        Remembered even while the worker is down, and re-sent when it starts again.
        """
        entries = sorted((str(subnet), str(ip)) for subnet, ip in peers.items())
        with self._lock:
            self._peers = entries
            if self._alive():
                self._request({"op": "peers", "peers": entries}, self._peers_timeout())

    def status(self) -> ForwarderStatus:
        with self._lock:
            process = self._process
            if process is None or not self._alive():
                return ForwarderStatus(False, None, last_error=self._death_reason())
            process = self._worker()
            try:
                reply = self._request({"op": "status"})
            except ForwarderError as err:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(REQUEST_TIMEOUT)  # it closed the channel: dying
                if not self._alive():
                    return ForwarderStatus(False, None, last_error=self._death_reason())
                return ForwarderStatus(False, process.pid, last_error=str(err))
            return ForwarderStatus(True, process.pid, reply["peers"],
                                   reply["tun_attached"], reply["counters"],
                                   reply["cpu_seconds"], reply["last_error"])

    def stop(self, timeout: float = 5.0) -> None:
        with self._lock:
            process, control = self._process, self._control
            if process is not None and control is not None and self._alive():
                with contextlib.suppress(OSError):
                    control.send(json.dumps({"op": "stop"}).encode())
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
            self._reap()

    # --- internals (lock held) ---------------------------------------------------------

    def _alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _worker(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise ForwarderError("udp forwarder not started")
        return self._process

    def _channel(self) -> socket.socket:
        if self._control is None:
            raise ForwarderError("udp forwarder not started")
        return self._control

    def _death_reason(self) -> str:
        if self._process is None:
            return self._last_error or "udp forwarder not started"
        code = self._process.returncode
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with status {code}"
        return f"udp forwarder {how}" + (f": {self._last_error}" if self._last_error else "")

    def _reap(self) -> None:
        if self._process is not None:
            if self._process.poll() is None:
                self._process.kill()
            self._process.wait()
        if self._control is not None:
            self._control.close()
            self._control = None

    def _peers_timeout(self) -> float:
        return REQUEST_TIMEOUT + len(self._peers) * PER_PEER_TIMEOUT

    def _receive(self, timeout: float, seq: int | None = None) -> dict[str, Any]:
        """The next message, or with ``seq`` the answer to that request (older answers,
        to requests that timed out, are dropped)."""
        control = self._control
        if control is None:
            raise ForwarderError("udp forwarder not started")
        poller = select.poll()  # select() fails on a descriptor numbered 1024 or more
        poller.register(control, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                raise ForwarderError(f"udp forwarder did not answer within {timeout:g} s")
            try:
                raw = control.recv(1 << 20)
            except OSError:
                raw = b""
            if not raw:
                raise ForwarderError("udp forwarder closed its control channel")
            reply: dict[str, Any] = json.loads(raw)
            if seq is None or reply.get("op") == "fatal" or reply.get("seq") == seq:
                return reply

    def _request(self, message: dict[str, Any], timeout: float = REQUEST_TIMEOUT
                 ) -> dict[str, Any]:
        if self._control is None:
            raise ForwarderError("udp forwarder not started")
        self._seq += 1
        try:
            self._channel().send(json.dumps({**message, "seq": self._seq}).encode())
        except OSError as err:
            raise ForwarderError(f"udp forwarder unreachable: {err.strerror}") from None
        reply = self._receive(timeout, self._seq)
        if reply.get("op") == "fatal":
            self._last_error = reply.get("error", "")
            raise ForwarderError(f"udp forwarder failed: {self._last_error}")
        return reply

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (from /proc), for benchmarks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
