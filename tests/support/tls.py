"""Throw-away TLS material for testing etcd with client certificates (made with openssl)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from flannel_lab.etcd import TlsFiles


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


def make_client_without_cn(tls: TlsFiles, directory: Path) -> tuple[Path, Path]:
    """A client certificate and key signed by ``tls``'s CA whose subject has no Common Name
    (etcd's JSON gateway with authentication on accepts only such certificates)."""
    key, csr, cert = directory / "nocn.key", directory / "nocn.csr", directory / "nocn.pem"
    extfile = directory / "nocn.ext"
    extfile.write_text("extendedKeyUsage=clientAuth\n")
    for args in (["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/O=flannel", "-keyout",
                  str(key), "-out", str(csr)],
                 ["x509", "-req", "-in", str(csr), "-CA", str(tls.ca), "-CAkey",
                  str(tls.ca.with_name("ca.key")), "-CAcreateserial", "-days", "2",
                  "-extfile", str(extfile), "-out", str(cert)]):
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    return cert, key
