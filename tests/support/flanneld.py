"""Runs this checkout's ``flanneld`` (tests/support/checkout.py) as a real process, optionally
in a netns and with a private ``/run`` (``run_dir``, as a lab node has)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from flannel.kernel import nsexec
from flannel.kernel.host import LOCAL
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
