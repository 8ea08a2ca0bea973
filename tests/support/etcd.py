"""A real etcd (Debian ``etcd-server``) for tests: free loopback ports, a temp data dir.

Optionally inside a network namespace, with TLS client-certificate auth, or with a short
auth-token TTL. Every wait is bounded; ``stop`` always reaps the process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
ETCDCTL = shutil.which("etcdctl") or "/usr/bin/etcdctl"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throw-away CA, a server cert for 127.0.0.1 and a client cert, made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", str(ca_key), "-out", str(ca))
    files = {}
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")):
        key, csr, cert = (directory / f"{name}.key", directory / f"{name}.csr",
                          directory / f"{name}.pem")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key),
            "-out", str(csr))
        extfile = directory / f"{name}.ext"
        extfile.write_text(ext + "\n")
        run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "2", "-extfile", str(extfile), "-out", str(cert))
        files[name] = (cert, key)
    return TlsFiles(ca, files["server"][0], files["server"][1], files["client"][0],
                    files["client"][1])


class EtcdServer:
    def __init__(self, workdir: Path, *, tls: TlsFiles | None = None,
                 auth_token_ttl: int | None = None, netns: str | None = None) -> None:
        self.workdir = workdir
        self.data_dir = workdir / "data"
        self.tls = tls
        self.auth_token_ttl = auth_token_ttl
        self.netns = netns
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / "etcd.log"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    def _prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns] if self.netns else []

    def start(self, timeout: float = 20.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [*self._prefix(), ETCD, "--name", "test", "--data-dir", str(self.data_dir),
               "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"test={peer}", "--log-level", "warn",
               "--logger", "zap"]
        if self.tls:
            cmd += ["--cert-file", str(self.tls.server_cert), "--key-file",
                    str(self.tls.server_key), "--trusted-ca-file", str(self.tls.ca),
                    "--client-cert-auth"]
        if self.auth_token_ttl is not None:
            cmd += ["--auth-token-ttl", str(self.auth_token_ttl)]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_path.read_text()[-2000:]}")
            if self.ctl("endpoint", "health", check=False).returncode == 0:
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def ctl(self, *args: str, check: bool = True, user: str | None = None
            ) -> subprocess.CompletedProcess:
        """Run etcdctl (v3 API) against this server."""
        cmd = [*self._prefix(), ETCDCTL, "--endpoints", self.endpoint,
               "--command-timeout", "5s", "--dial-timeout", "2s"]
        if self.tls:
            cmd += ["--cacert", str(self.tls.ca), "--cert", str(self.tls.client_cert),
                    "--key", str(self.tls.client_key)]
        if user:
            cmd += ["--user", user]
        cmd += list(args)
        env = {**os.environ, "ETCDCTL_API": "3"}
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env=env,
                                check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {result.stderr}")
        return result

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
