"""Runs this checkout's ``flanneld`` (tests/support/checkout.py) as a real process, optionally
in a netns and with a private ``/run`` (``run_dir``, as a lab node has); the ``node`` fixture
(a host namespace with its own etcd, tests/integration/conftest.py) and ``flanneld(...)``, a
daemon on it for the etcd store at ``PREFIX``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from flannel.kernel import nsexec
from flannel.kernel.host import LOCAL
from flannel.udp.forwarder import cpu_seconds
from flannel_lab.etcd import EtcdServer
from tests.support import netns
from tests.support.checkout import FLANNELD
from tests.support.waiting import wait_until


class Flanneld:
    """``command``: what runs instead of flanneld (e.g. ``python -c`` with a fault
    injected before flanneld's ``main``), given the same arguments."""

    def __init__(self, workdir: Path, args: list[str], netns: str | None = None,
                 name: str = "flanneld", env: dict[str, str] | None = None,
                 open_files: tuple[int, int] | None = None,
                 run_dir: Path | None = None,
                 command: list[str] | None = None) -> None:
        self.workdir = workdir
        self.run_dir = run_dir
        self.command = command or [*FLANNELD]
        self.env = env
        self.args = args
        self.netns = netns
        self.open_files = open_files  # (soft, hard) RLIMIT_NOFILE it starts with
        self.log_path = workdir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Flanneld:
        self.workdir.mkdir(parents=True, exist_ok=True)
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        if self.open_files is not None:
            prefix += ["prlimit", "--nofile={}:{}".format(*self.open_files), "--"]
        argv = [*self.command, *self.args]
        if self.run_dir is not None:
            self.run_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
            argv = nsexec.command(argv, LOCAL, self.run_dir)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*prefix, *argv], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=None if self.env is None else
                                         {**os.environ, **self.env})
        return self

    def rss_kib(self) -> int:
        """The process's resident memory now (VmRSS), in KiB."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(status.split("VmRSS:", 1)[1].split()[0])

    def cpu_seconds(self) -> float:
        """The CPU time (user and system) the process has used so far: unlike its wall time,
        what a loaded machine does not stretch."""
        assert self.proc is not None
        return cpu_seconds(self.proc.pid)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, needle: str, timeout: float = 15.0) -> None:
        wait_until(lambda: needle in self.log, timeout, what=f"{needle!r} in log:\n{self.log}")

    def wait_exit(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"flanneld still running after {timeout}s:\n{self.log}") from None

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=10)


PREFIX = "/coreos.com/network"


CONFIG = {"Network": "10.5.0.0/16", "Backend": {"Type": "alloc"}}


@pytest.fixture
def node(ns, tmp_path):
    """A host: veth0 with 10.99.0.2-4/24 and a default route, and a real etcd inside."""
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    for address in ("10.99.0.2/24", "10.99.0.3/24", "10.99.0.4/24"):
        netns.ip("addr", "add", address, "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    with EtcdServer(tmp_path / "etcd", netns=ns) as server:
        yield ns, server


def flanneld(tmp_path: Path, ns: str, server: EtcdServer, *extra: str, name: str = "flanneld",
             subnet_file: Path | None = None, command: list[str] | None = None) -> Flanneld:
    subnet_file = subnet_file or tmp_path / name / "subnet.env"
    return Flanneld(tmp_path, [f"--etcd-endpoints={server.endpoint}",
                               f"--subnet-file={subnet_file}", *extra], netns=ns, name=name,
                    command=command)
