"""``flannelctl doctor``: is this node healthy, and if not, why and how to fix it.

Owns gathering what the checks look at (subnet.env, the store's config and leases, the
kernel of this network namespace, the store's clock, the running flanneld's /status, asked
when a check needs it), running every check, and printing
the ranked findings as text or JSON. Exit status 0 only when nothing is wrong.
Must not change anything unless a ``--fix-*`` flag asks for it.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import ssl
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.ops.checks import Context, all_checks
from flannel.ops.findings import Finding, exit_code, rank, render
from flannel.ops.kernelview import read_kernel

if TYPE_CHECKING:
    from flannel.ops.options import DoctorOptions
    from flannel.ops.storeflags import StoreOptions
    from flannel.settings import EtcdSettings

STORE_TIMEOUT = 10.0


def read_subnet_env(ctx: Context) -> None:
    from flannel.subnet.envfile import parse_dotenv

    try:
        with ctx.subnet_file.open("rb") as handle:
            text = handle.read(1 << 16).decode(errors="replace")
    except FileNotFoundError:
        ctx.env_error = "missing"
        return
    except OSError as err:
        ctx.env_error = f"unreadable ({err.strerror})"
        return
    ctx.env = parse_dotenv(text)


def _etcd_clock_skew(etcd: EtcdSettings, timeout: float) -> float | None:
    """This node's clock minus the first answering etcd endpoint's (from its HTTP Date)."""
    from flannel.clients.etcd import parse_endpoints

    context = None
    for endpoint in parse_endpoints(etcd.endpoints):
        if endpoint.path:
            continue  # urllib speaks TCP only
        url = f"{endpoint.scheme}://{endpoint.target}/version"
        try:
            if endpoint.scheme == "https":
                context = ssl.create_default_context(cafile=etcd.cafile or None)
                if etcd.certfile:
                    context.load_cert_chain(etcd.certfile, etcd.keyfile or None)
            before = time.time()
            with urllib.request.urlopen(url, timeout=timeout, context=context) as reply:  # noqa: S310 - http(s) only
                date = reply.headers.get("Date")
            after = time.time()
        except (OSError, ValueError):
            continue
        if not date:
            continue
        try:
            server = email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            continue
        # The Date header is truncated to the second: compare with its middle.
        return (before + after) / 2 - (server + 0.5)
    return None


async def read_store(ctx: Context, store: StoreOptions) -> None:
    from flannel.ops.leases import list_rows
    from flannel.settings import EtcdSettings
    from flannel.subnet import open_store
    from flannel.subnet.errors import STORE_FAILURES

    try:
        manager = open_store(store.store)
    except STORE_FAILURES as err:
        ctx.store_error = str(err)
        return
    try:
        try:
            ctx.rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
            ctx.config = await asyncio.wait_for(manager.get_network_config(), STORE_TIMEOUT)
        except STORE_FAILURES as err:
            ctx.store_error = str(err) or f"no answer within {STORE_TIMEOUT:g}s"
            return
        if isinstance(store.store, EtcdSettings):
            ctx.clock_skew = await asyncio.to_thread(_etcd_clock_skew, store.store, 3.0)
    finally:
        await manager.close()


def gather(opts: DoctorOptions) -> Context:
    from flannel.process.procscan import running_flanneld

    ctx = Context(subnet_file=Path(opts.store.subnet_file), sysctl_root=Path("/proc/sys"),
                  cni_bin_dirs=list(opts.cni_bin_dirs), cni_conf_dirs=list(opts.cni_conf_dirs),
                  probe_timeout=opts.probe_timeout, fix_checksum=opts.fix_checksum_offload)
    ctx.kube_mode = opts.store.kube
    ctx.flanneld_pids = running_flanneld()
    ctx.flanneld = opts.found
    read_subnet_env(ctx)
    asyncio.run(read_store(ctx, opts.store))
    ctx.kernel = read_kernel()
    return ctx


def diagnose(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    for name, check in all_checks():
        try:
            findings.extend(check(ctx))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            findings.append(Finding(name, "warning", f"the {name} check could not run: {err}"))
    return rank(findings)


def store_source(opts: DoctorOptions) -> str:
    """Which store doctor read, and whose settings say so."""
    from flannel.ops.locate import Located

    return Located(opts.store, opts.found, opts.note, opts.given).source()


def cmd_doctor(opts: DoctorOptions) -> int:
    source = store_source(opts)
    # Without flags, settings that could not be read leave doctor guessing: say so.
    unread = [Finding("store", "warning", f"flanneld's settings are unknown: {opts.note}",
                      "run flannelctl doctor as root, or give flanneld's store flags")
              ] if opts.note and not opts.given else []
    findings = rank([*diagnose(gather(opts)), *unread])
    if opts.json:
        doc: dict[str, Any] = {"healthy": exit_code(findings) == 0, "store": source,
                               "findings": [f.as_json() for f in findings]}
        print(json.dumps(doc, indent=2))
    else:
        print(render(findings))
        print(f"store read: {source}")
    return exit_code(findings)
