"""A throw-away etcd (Debian ``etcd-server``) for the lab, the tests and the benchmarks.

Owns one etcd process: free ports, a data dir of the caller's, optionally inside a network
namespace, with TLS (client-certificate auth unless told not to) or a short auth-token
TTL, on a TCP port or a unix socket (in ``socket_dir``, named ``localhost:<port>``: etcd
takes a socket as ``unix://host:port``, relative to its working directory). Every wait is
bounded; ``stop`` always reaps the process. Must not touch: anything outside its data dir
and its own process.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from flannel_lab import slowness

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


#: Where ``free_port`` looks first: below the kernel's ephemeral range, from which every
#: outgoing connection on the machine takes its local port (one may take a port between our
#: check and etcd's bind).
LOWEST_PORT = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port nothing is bound to now: a random one below the ephemeral range
    when one is free there, else one the kernel picks."""
    top = _ephemeral_start()
    for _ in range(50 if top > LOWEST_PORT + 1000 else 0):
        port = random.randrange(LOWEST_PORT, top)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


class EtcdServer:
    def __init__(self, workdir: Path, *, tls: TlsFiles | None = None,
                 auth_token_ttl: int | None = None, netns: str | None = None,
                 host: str = "127.0.0.1", socket_dir: Path | None = None,
                 client_cert_auth: bool = True) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.netns = netns
        self.host = host
        self.socket_dir = socket_dir
        self.client_cert_auth = client_cert_auth
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False  # once it answered, its ports are known to others
        self.log_path = workdir / "etcd.log"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        if self.socket_dir is not None:
            return f"unix{'s' if self.tls else ''}://{self.socket_path}"
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def socket_path(self) -> Path:
        assert self.socket_dir is not None
        return self.socket_dir.resolve() / f"localhost:{self.client_port}"

    @property
    def _listen_url(self) -> str:
        if self.socket_dir is not None:
            return f"unix{'s' if self.tls else ''}://localhost:{self.client_port}"
        return self.endpoint

    def _prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def start(self, timeout: float = 20.0, tries: int = 3) -> None:
        """Start etcd and wait until it answers; before it ever answered, ports taken
        meanwhile by another process are given up for new ones (``tries`` in all)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [*self._prefix(), ETCD, "--name", "test", "--data-dir", str(self.data_dir),
               "--listen-client-urls", self._listen_url,
               "--advertise-client-urls", self._listen_url,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"test={peer}", "--log-level", "warn",
               "--logger", "zap"]
        if self.tls:
            cmd += ["--cert-file", str(self.tls.server_cert), "--key-file",
                    str(self.tls.server_key)]
            if self.client_cert_auth:
                # etcd asks every client for a certificate once it has a CA to check it with.
                cmd += ["--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        if self.auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(self.auth_token_ttl)]
        log = self.log_path.open("ab")
        logged, had_data = log.tell(), self.data_dir.exists()
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.socket_dir)
        log.close()
        deadline = time.monotonic() + slowness.scaled(timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.log_path.read_bytes()[logged:].decode(errors="replace")[-2000:]
                if "address already in use" in said and not self.started and tries > 1:
                    # Taken between our check and etcd's bind; nobody knows these ports yet.
                    self.proc = None
                    if not had_data:
                        shutil.rmtree(self.data_dir, ignore_errors=True)
                    self.client_port, self.peer_port = free_port(), free_port()
                    return self.start(timeout, tries - 1)
                raise RuntimeError(f"etcd exited: {said}")
            if self.ctl("endpoint", "health", check=False).returncode == 0:
                self.started = True
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy within {slowness.within(timeout)}: "
                           f"{self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=slowness.scaled(10))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=slowness.scaled(10))
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def wipe(self) -> None:
        """Restart with no data at all (every key, lease and revision gone), same ports."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.start()

    def restore(self, snapshot: Path) -> None:
        """Restart from ``snapshot`` (``ctl("snapshot", "save", path)``), as after a restore
        from backup: the keys, leases and revision of that moment."""
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        peer = f"http://{self.host}:{self.peer_port}"
        result = subprocess.run(
            [ETCDCTL, "snapshot", "restore", str(snapshot), "--data-dir", str(self.data_dir),
             "--name", "test", "--initial-cluster", f"test={peer}",
             "--initial-advertise-peer-urls", peer],
            capture_output=True, text=True, timeout=slowness.scaled(60), check=False,
            env={**os.environ, "ETCDCTL_API": "3"})
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl snapshot restore failed: {result.stderr}")
        self.start()

    def ctl(self, *args: str, check: bool = True, user: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run etcdctl (v3 API) against this server."""
        cmd = [*self._prefix(), ETCDCTL, "--endpoints", self.endpoint,
               "--command-timeout", f"{slowness.scaled(5):g}s",
               "--dial-timeout", f"{slowness.scaled(2):g}s"]
        if self.tls:
            cmd += ["--cacert", str(self.tls.ca), "--cert", str(self.tls.client_cert),
                    "--key", str(self.tls.client_key)]
            if self.socket_dir is not None:
                # etcdctl 3.4 checks a socket's whole path as the server name.
                cmd.append("--insecure-skip-tls-verify")
        if user:
            cmd += ["--user", user]
        cmd += list(args)
        env = {**os.environ, "ETCDCTL_API": "3"}
        result = subprocess.run(cmd, capture_output=True, text=True,
                                timeout=slowness.scaled(30), env=env, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {result.stderr}")
        return result

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # already gone
            self.stop()
