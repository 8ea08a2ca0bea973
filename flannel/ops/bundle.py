"""``flannelctl bundle``: one tar.gz describing this node, for bug reports.

Owns what goes in (links, addresses, routes, rules, neighbours, FDB, firewall rules, chosen
sysctls, leases, network config, subnet.env, flanneld's command line, health/status/metrics
when its health endpoint answers, recent logs, the doctor's findings without probes) and
removing secrets (passwords, tokens, private keys) from every text before it is stored. The
archive is created next to its final name with O_EXCL|O_NOFOLLOW, mode 0600, and renamed
into place only when complete. Must not change anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import socket
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from flannel.ops.kernelview import ToolError, read_sysctl, run_tool

if TYPE_CHECKING:
    from flannel.ops.discover import Flanneld
    from flannel.ops.options import BundleOptions
    from flannel.ops.storeflags import StoreOptions

MAX_LOG_BYTES = 4 << 20
MAX_HTTP_BYTES = 4 << 20
SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding",
           "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
           "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter")
COMMANDS = {
    "links.json": ("ip", "-j", "-d", "link", "show"),
    "addresses.json": ("ip", "-j", "addr", "show"),
    "routes4.json": ("ip", "-j", "-4", "route", "show", "table", "all"),
    "routes6.json": ("ip", "-j", "-6", "route", "show", "table", "all"),
    "rules4.json": ("ip", "-j", "-4", "rule", "show"),
    "rules6.json": ("ip", "-j", "-6", "rule", "show"),
    "neighbours.json": ("ip", "-j", "neigh", "show"),
    "fdb.json": ("bridge", "-j", "fdb", "show"),
    "iptables.txt": ("iptables-save",),
    "ip6tables.txt": ("ip6tables-save",),
    "nftables.txt": ("nft", "list", "ruleset"),
}

_SECRET_FLAG = re.compile(
    r"(?i)((?:--?)?(?:etcd-password|password|passwd|token|secret|client-key-data|"
    r"private[-_]?key)[\"']?\s*[=:]\s*[\"']?)([^\s\"',}]+)")
_BEARER = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_AUTH_HEADER = re.compile(r"(?im)(authorization\s*[:=]\s*).*$")
_PEM_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
                      re.S)
_URL_CREDENTIALS = re.compile(r"(://)[^/@\s:]+:[^/@\s]+@")


def redact(text: str) -> str:
    """``text`` with passwords, tokens and private keys replaced by ``<redacted>``."""
    text = _PEM_KEY.sub("<redacted private key>", text)
    text = _AUTH_HEADER.sub(r"\1<redacted>", text)
    text = _SECRET_FLAG.sub(r"\1<redacted>", text)
    text = _BEARER.sub(r"\1<redacted>", text)
    return _URL_CREDENTIALS.sub(r"\1<redacted>@", text)


def _http(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 - http only, checked by the caller
        body: bytes = reply.read(MAX_HTTP_BYTES)
        return body.decode(errors="replace")


def _tail(path: Path, limit: int = MAX_LOG_BYTES) -> str:
    with path.open("rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(0, size - limit))
        return handle.read(limit).decode(errors="replace")


def _flanneld_cmdlines() -> str:
    from flannel.process.procscan import running_flanneld

    lines = []
    for pid in running_flanneld():
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()[:65536]
        except OSError:
            continue
        words = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        lines.append(f"{pid}: {' '.join(words)}\n")
    return "".join(lines) or "flanneld is not running in this network namespace\n"


async def _store_files(store: StoreOptions) -> dict[str, str]:
    from flannel.ops.leases import STORE_TIMEOUT, etcd_store, list_rows
    from flannel.subnet import open_store
    from flannel.subnet.errors import STORE_FAILURES

    try:
        manager = open_store(store.store)
    except STORE_FAILURES as err:
        return {"leases.txt": f"store not opened: {err}\n"}
    files = {}
    try:
        rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
        files["leases.json"] = json.dumps([row.as_json() for row in rows], indent=2)
        etcd = etcd_store(manager)
        if etcd is not None:
            raw = await asyncio.wait_for(etcd.raw_config(), STORE_TIMEOUT)
            files["config.json"] = raw.decode(errors="replace") if raw else "(none)\n"
    except STORE_FAILURES as err:
        files["leases.txt"] = f"store not read: {err or 'no answer in time'}\n"
    finally:
        await manager.close()
    return files


def _from_socket(found: Flanneld, files: dict[str, str], notes: list[str]) -> None:
    """flanneld's health, readiness, status and metrics, asked on its local socket."""
    from flannel.ops.status import StatusUnavailable, fetch, where_of

    where = where_of(found)
    for path in ("healthz", "readyz", "status", "metrics"):
        try:
            reply, body = fetch(where, f"/{path}", 3.0, MAX_HTTP_BYTES, accept="*/*")
        except StatusUnavailable as err:
            notes.append(f"{path}: {err}")
            continue
        files[f"{path}.txt"] = body[:MAX_HTTP_BYTES].decode(errors="replace")
        if reply.status != 200:
            notes.append(f"{path}: flanneld answered HTTP {reply.status} {reply.reason}")


def collect(args: BundleOptions) -> tuple[dict[str, str], list[str]]:
    """The files of the bundle (name -> text, secrets not yet removed) and notes."""
    files: dict[str, str] = {}
    notes: list[str] = []
    if args.note:
        notes.append(f"store: {args.note}; the store read is flanneld's default, which may "
                     "not be this node's")
    files["node.txt"] = (f"host: {socket.gethostname()}\ntime: "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
                         f"kernel: {os.uname().release}\nstore read: {args.source}\n")
    for name, cmd in COMMANDS.items():
        try:
            files[name] = run_tool(*cmd)
        except ToolError as err:
            notes.append(f"{name}: skipped ({err})")
    files["sysctls.txt"] = "".join(
        f"{key.replace('/', '.')} = {read_sysctl(Path('/proc/sys'), key) or '(absent)'}\n"
        for key in SYSCTLS)
    subnet_file = args.store.subnet_file
    try:
        files["subnet.env"] = _tail(Path(subnet_file), 1 << 16)
    except OSError as err:
        notes.append(f"subnet.env: {subnet_file}: {err.strerror}")
    files["flanneld-cmdline.txt"] = _flanneld_cmdlines()
    files.update(asyncio.run(_store_files(args.store)))
    if args.health_url:
        base = args.health_url.rstrip("/")
        for path in ("healthz", "readyz", "status", "metrics"):
            try:
                files[f"{path}.txt"] = _http(f"{base}/{path}", 3.0)
            except (OSError, ValueError) as err:
                notes.append(f"{path}: {base}/{path} did not answer ({err})")
    elif args.found is not None:
        _from_socket(args.found, files, notes)
    else:
        notes.append("healthz, readyz, status, metrics: skipped (no flanneld runs in this "
                     "network namespace; give --health-url http://127.0.0.1:<healthz port> "
                     "for one that serves a health port)")
    for log in args.log_files:
        try:
            files[f"logs/{log.name}"] = _tail(log)
        except OSError as err:
            notes.append(f"log {log}: {err.strerror}")
    if args.journal:
        try:
            files["logs/journal.txt"] = run_tool("journalctl", "--no-pager", "-u", args.journal,
                                                 "-n", "5000", "-o", "short-iso")
        except ToolError as err:
            notes.append(f"journal: {err}")
    try:
        from flannel.ops.doctor import diagnose, gather
        from flannel.ops.options import DoctorOptions

        ctx = gather(DoctorOptions(args.store, cni_bin_dirs=args.cni_bin_dirs,
                                   cni_conf_dirs=args.cni_conf_dirs, probe_timeout=0.5,
                                   found=args.found))
        ctx.probe = False  # a bundle describes this node; probes belong to doctor
        findings = diagnose(ctx)
        files["doctor.json"] = json.dumps([f.as_json() for f in findings], indent=2)
    except (OSError, ValueError) as err:
        notes.append(f"doctor: {err}")
    return files, notes


def write_bundle(output: Path, files: dict[str, str], notes: list[str]) -> None:
    """Write the archive under a temporary name, then rename it into place."""
    if output.exists() or output.is_symlink():
        raise FileExistsError(f"{output} exists; give another --output")
    partial = output.with_name(f".{output.name}.partial-{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            top = output.name.removesuffix(".tar.gz")
            for name, text in [*sorted(files.items()),
                               ("NOTES.txt", "".join(n + "\n" for n in notes) or "none\n")]:
                data = redact(text).encode()
                info = tarfile.TarInfo(f"{top}/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
                tar.addfile(info, io.BytesIO(data))
        os.link(partial, output)  # fails rather than replace something created meanwhile
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def cmd_bundle(args: BundleOptions) -> int:
    if args.health_url and not re.match(r"https?://[^\s]+$", args.health_url):
        print(f"flannelctl bundle: --health-url {args.health_url!r}: give "
              "http://<healthz-ip>:<healthz-port>", file=sys.stderr)
        return 2
    output = args.output or Path(
        f"flannel-bundle-{socket.gethostname()}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        ".tar.gz")
    files, notes = collect(args)
    try:
        write_bundle(output, files, notes)
    except OSError as err:
        print(f"flannelctl bundle: cannot write {output}: {err}", file=sys.stderr)
        return 1
    print(f"wrote {output} ({len(files)} files, secrets removed)\nstore read: {args.source}")
    for note in notes:
        print(f"note: {note}")
    return 0


