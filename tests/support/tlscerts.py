"""Throw-away X.509 material for TLS tests, made with the ``openssl`` command line.

``make_pki(directory)`` writes a CA, a server certificate for 127.0.0.1 (IP SAN) and
localhost signed by it, a client certificate (CN ``flanneld``) signed by it, and a second,
unrelated CA; it returns their paths and ssl contexts for the test double's side, and makes
further client certificates from the same CA on demand (``new_client_cert``).
Must not touch: anything outside the directory it is given.
"""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PKI:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, require_client_cert: bool = False) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            context.load_verify_locations(cafile=self.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def new_client_cert(self, name: str) -> tuple[Path, Path]:
        """Another client certificate (CN ``name``) from the same CA: a rotated one."""
        return _leaf(self.ca.parent, name, (self.ca, self.ca.with_suffix(".key")),
                     "extendedKeyUsage=clientAuth\n")


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext)
    return cert, key


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "test-ca")
    other = _ca(directory, "other-ca")
    server = _leaf(directory, "apiserver", ca, "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                   "extendedKeyUsage=serverAuth\n")
    client = _leaf(directory, "flanneld", ca, "extendedKeyUsage=clientAuth\n")
    return PKI(ca[0], other[0], server[0], server[1], client[0], client[1])
