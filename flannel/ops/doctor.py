"""``flannelctl doctor``: is this node healthy, and if not, why and how to fix it.

Owns gathering what the checks look at (subnet.env, the store's config and leases, the
kernel of this network namespace, the store's clock), running every check, and printing
the ranked findings as text or JSON. Exit status 0 only when nothing is wrong.
Must not change anything unless a ``--fix-*`` flag asks for it.
"""

from __future__ import annotations

import argparse
import asyncio
import email.utils
import json
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.ops.checks import Context, all_checks
from flannel.ops.findings import Finding, exit_code, rank, render
from flannel.ops.kernelview import read_kernel

if TYPE_CHECKING:
    from flannel.ops.discover import Flanneld

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


def _etcd_clock_skew(args: argparse.Namespace, timeout: float) -> float | None:
    """This node's clock minus the first answering etcd endpoint's (from its HTTP Date)."""
    from flannel.subnet.etcdclient import parse_endpoints

    context = None
    for endpoint in parse_endpoints(args.etcd_endpoints):
        if endpoint.path:
            continue  # urllib speaks TCP only
        url = f"{endpoint.scheme}://{endpoint.target}/version"
        try:
            if endpoint.scheme == "https":
                context = ssl.create_default_context(cafile=args.etcd_cafile or None)
                if args.etcd_certfile:
                    context.load_cert_chain(args.etcd_certfile, args.etcd_keyfile or None)
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


async def read_store(ctx: Context, args: argparse.Namespace) -> None:
    from flannel.cli import store_settings
    from flannel.config import ConfigError
    from flannel.ops.leases import list_rows
    from flannel.subnet import StoreOpenError, open_store
    from flannel.subnet.errors import StoreError, StoreUnavailable
    from flannel.subnet.kube import KubeError

    errors = (StoreOpenError, ConfigError, OSError, ValueError, asyncio.TimeoutError)
    try:
        manager = open_store(store_settings(args))
    except errors as err:
        ctx.store_error = str(err)
        return
    try:
        try:
            ctx.rows = await asyncio.wait_for(list_rows(manager), STORE_TIMEOUT)
        except (*errors, StoreError, StoreUnavailable, KubeError) as err:
            ctx.store_error = str(err) or f"no answer within {STORE_TIMEOUT:g}s"
            return
        try:
            ctx.config = await asyncio.wait_for(manager.get_network_config(), STORE_TIMEOUT)
        except (*errors, StoreError, StoreUnavailable, KubeError) as err:
            ctx.store_error = str(err) or f"no answer within {STORE_TIMEOUT:g}s"
            return
        if manager.name == "etcd":
            ctx.clock_skew = await asyncio.to_thread(_etcd_clock_skew, args, 3.0)
    finally:
        await manager.close()


def gather(args: argparse.Namespace) -> Context:
    from flannel.procscan import running_flanneld

    ctx = Context(subnet_file=Path(args.subnet_file), sysctl_root=Path("/proc/sys"),
                  cni_bin_dirs=args.cni_bin_dir or [Path("/opt/cni/bin")],
                  cni_conf_dirs=args.cni_conf_dir or [Path("/etc/cni/net.d")],
                  probe_timeout=args.probe_timeout, fix_checksum=args.fix_checksum_offload)
    ctx.kube_mode = bool(getattr(args, "kube_subnet_mgr", False))
    ctx.flanneld_pids = running_flanneld()
    read_subnet_env(ctx)
    asyncio.run(read_store(ctx, args))
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


def store_source(args: argparse.Namespace, found: Flanneld | None, given: list[str]) -> str:
    """Which store doctor read, and whose settings say so."""
    from flannel.cli import FLAGS, shown_value

    flags = {flag.name: flag for flag in FLAGS}
    if args.kube_subnet_mgr:
        api = args.kube_api_url or args.kubeconfig_file or "in-cluster"
        place = f"the Kubernetes API ({api}), network config {args.net_config_path}"
    else:
        place = (f"etcd {shown_value(flags['etcd-endpoints'], args.etcd_endpoints)}, "
                 f"prefix {args.etcd_prefix}")
    if found is not None and found.args is not None:
        whose = "the settings of the flanneld running here"
        if given:
            whose += f", overridden by {', '.join('--' + name for name in given)}"
    elif given:
        whose = "the flags given"
    else:
        whose = "flanneld's defaults"
    env = (found.subnet_file if found is not None and found.args is not None
           and "subnet-file" not in given else args.subnet_file)
    return f"{place}, from {whose}; subnet.env {env}"


def cmd_doctor(args: argparse.Namespace) -> int:
    from flannel.cli import UsageError
    from flannel.ops.discover import NotFound, find
    from flannel.ops.storeopts import explicit, of_running, quiet_store_logs, resolve

    given = explicit(args)
    try:
        found, note = find(), ""
    except NotFound as err:
        found, note = None, str(err)
    if found is not None:
        note = found.why
    try:
        resolve(args, running=of_running(found) if found is not None else None)
    except UsageError as err:
        print(f"flannelctl doctor: {err}", file=sys.stderr)
        return 2
    quiet_store_logs()
    source = store_source(args, found, given)
    # Without flags, settings that could not be read leave doctor guessing: say so.
    unread = [Finding("store", "warning", f"flanneld's settings are unknown: {note}",
                      "run flannelctl doctor as root, or give flanneld's store flags")
              ] if note and not given else []
    try:
        findings = rank([*diagnose(gather(args)), *unread])
    except KeyboardInterrupt:
        return 130
    if args.json:
        doc: dict[str, Any] = {"healthy": exit_code(findings) == 0, "store": source,
                               "findings": [f.as_json() for f in findings]}
        print(json.dumps(doc, indent=2))
    else:
        print(render(findings))
        print(f"store read: {source}")
    return exit_code(findings)


