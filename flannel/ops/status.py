"""``flannelctl status``: this node's flanneld as its local ``/status`` endpoint tells it.

Owns fetching ``/status`` from flanneld's health server (``--health-url``, plain HTTP, one
bounded request), checking the answer's shape, and showing it: a human table by default,
the document itself with ``--json``. Exit codes: 0 ready, 1 running but not ready,
2 a bad flag, 3 flanneld did not answer (or answered something that is not its status).
Must not touch: the kernel, the store (the daemon's view is what is shown).
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.parse
from typing import Any

from flannel import boundedjson

DEFAULT_HEALTH_URL = "http://127.0.0.1:8081"
MAX_STATUS_BYTES = 4 << 20
EXIT_NOT_READY = 1
EXIT_UNREACHABLE = 3


class StatusUnavailable(Exception):
    """flanneld's status could not be had; the message says why and what to do."""


def check_url(text: str) -> tuple[str, int]:
    """(host, port) of an ``http://host:port`` URL; ValueError names what is wrong."""
    try:
        url = urllib.parse.urlsplit(text)
        port = url.port
    except ValueError as err:
        raise ValueError(f"{text!r}: {err}") from None
    if url.scheme != "http" or not url.hostname or url.path.strip("/") or url.query:
        raise ValueError(f"{text!r}: give http://<healthz-ip>:<healthz-port>, "
                         f"e.g. {DEFAULT_HEALTH_URL}")
    return url.hostname, port or 80


def fetch_status(base: str, timeout: float) -> dict[str, Any]:
    """flanneld's status document from the health server at ``base``."""
    host, port = check_url(base)
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/status", headers={"Accept": "application/json"})
        reply = connection.getresponse()
        body = reply.read(MAX_STATUS_BYTES + 1)
    except (OSError, http.client.HTTPException) as err:
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise StatusUnavailable(
            f"flanneld's health server at {base} did not answer ({why}); is flanneld "
            "running with --healthz-port, and is --health-url its --healthz-ip:"
            "--healthz-port?") from None
    finally:
        connection.close()
    if reply.status == 403:
        raise StatusUnavailable(
            f"flanneld at {base} serves /status to clients on its own host only: run "
            "flannelctl status on that node (in its network namespace)")
    if reply.status == 404:
        raise StatusUnavailable(f"the server at {base} has no /status: is it flanneld's "
                                "health server, of a version with flannelctl status?")
    if reply.status != 200:
        raise StatusUnavailable(f"flanneld at {base} answered /status with HTTP "
                                f"{reply.status} {reply.reason}")
    if len(body) > MAX_STATUS_BYTES:
        raise StatusUnavailable(f"the /status answer of {base} exceeds "
                                f"{MAX_STATUS_BYTES >> 20} MiB")
    try:
        doc = boundedjson.loads(body, what="flanneld's /status", max_bytes=MAX_STATUS_BYTES)
    except boundedjson.JSONLimitError as err:
        raise StatusUnavailable(f"the /status answer of {base} is not usable: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ready"), bool):
        raise StatusUnavailable(f"the /status answer of {base} is not flanneld's status")
    return doc


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    if seconds < 0:
        return f"{_duration(-seconds)} ago"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{days}d" if days else "", f"{hours}h" if hours else "",
             f"{minutes}m" if minutes else "", f"{secs}s" if secs or not seconds else ""]
    return "".join(p for p in parts if p)


def _counts(values: Any) -> str:
    if not isinstance(values, dict) or not values:
        return "none"
    return ", ".join(f"{k} {v}" for k, v in values.items())


def _lease_line(lease: Any) -> str:
    if not isinstance(lease, dict):
        return "none yet"
    subnets = " + ".join(str(s) for s in (lease.get("subnet"), lease.get("ipv6_subnet")) if s)
    public = " / ".join(str(a) for a in (lease.get("public_ip"), lease.get("public_ipv6")) if a)
    if lease.get("reservation"):
        expiry = "a reservation (never expires)"
    else:
        expiry = (f"expires in {_duration(lease.get('expires_in_seconds'))} "
                  f"({lease.get('expires_at')})")
    return f"{subnets} (public IP {public or '?'}), {expiry}"


def render(doc: dict[str, Any], base: str) -> str:
    """The human table."""
    rows: list[tuple[str, str]] = []
    ready = doc.get("ready")
    rows.append(("ready", "yes" if ready else f"NO: {doc.get('reason') or '?'}"))
    rows.append(("lease", _lease_line(doc.get("lease"))))
    network = doc.get("network")
    if isinstance(network, dict):
        nets = ", ".join(str(n) for n in (network.get("network"), network.get("ipv6_network"))
                         if n)
        rows.append(("network", f"{nets}, backend {network.get('backend')}"))
    store = doc.get("store")
    if isinstance(store, dict):
        rows.append(("store", f"{store.get('kind')}: "
                              f"{'watching' if store.get('watching') else 'NOT watching'}, "
                              f"{store.get('relists')} listing(s), "
                              f"{store.get('reconnects')} reconnect(s), "
                              f"{store.get('compactions')} compaction(s); renewals "
                              f"{store.get('renewals')} ok, {store.get('renewal_failures')} "
                              "failed"))
    devices = doc.get("devices")
    if isinstance(devices, list) and devices:
        rows.append(("devices", "; ".join(
            f"{_get(d, 'name')} mtu {_get(d, 'mtu')} mac {_get(d, 'mac')}" for d in devices)))
    peers = doc.get("peers")
    if isinstance(peers, dict):
        rows.append(("peers", f"{peers.get('known')} known, {peers.get('for_backend')} for "
                              f"this backend, {peers.get('programmed')} programmed, "
                              f"{peers.get('skipped')} skipped as invalid"))
        reasons = peers.get("skipped_reasons")
        for key, why in (reasons.items() if isinstance(reasons, dict) else ()):
            rows.append(("  skipped", f"{key}: {why}"))
    dataplane = doc.get("dataplane")
    if isinstance(dataplane, dict):
        rows.append(("data plane", f"{'in sync' if dataplane.get('in_sync') else 'NOT in sync'}"
                                   f"; {dataplane.get('passes')} pass(es), "
                                   f"{dataplane.get('failed_passes')} failed"))
        rows.append(("  changes", _counts(dataplane.get("applied"))))
        rows.append(("  repaired", _counts(dataplane.get("repaired"))))
    rules = doc.get("rules")
    if isinstance(rules, dict):
        state = "installed" if rules.get("installed") else f"NOT installed: {rules.get('reason')}"
        rows.append(("rules", f"{rules.get('mode') or '?'}: {state} ({rules.get('checks')} "
                              f"check(s), {rules.get('repairs')} repair(s), "
                              f"{rules.get('failures')} failure(s))"))
        encap = rules.get("encap_filter")
        if isinstance(encap, dict):
            rows.append(("encap filter", ", ".join(
                f"{family}: {v.get('peers')} peer(s), {v.get('dropped_packets')} dropped"
                for family, v in sorted(encap.items()) if isinstance(v, dict))))
    engines = doc.get("engines")
    for name, samples in (engines.items() if isinstance(engines, dict) else ()):
        rows.append(("engine", f"{name}: {_counts(samples)}"))
    width = max(len(label) for label, _ in rows)
    lines = [f"flanneld {doc.get('version')} at {base}, up {_duration(doc.get('uptime_seconds'))}"]
    lines += [f"{label:<{width}}  {value}" for label, value in rows]
    components = doc.get("readiness")
    if isinstance(components, list):
        lines += ["", f"{'COMPONENT':<12} {'READY':<5}  REASON"]
        for item in components:
            lines.append(f"{_get(item, 'component')!s:<12} "
                         f"{'yes' if _get(item, 'ready') else 'NO':<5}  "
                         f"{_get(item, 'reason') or ''}".rstrip())
    errors = doc.get("last_errors")
    lines.append("")
    if isinstance(errors, list) and errors:
        lines.append("last errors:")
        lines += [f"  {error}" for error in errors]
    else:
        lines.append("last errors: none")
    return "\n".join(lines) + "\n"


def cmd_status(args: argparse.Namespace) -> int:
    try:
        check_url(args.health_url)
    except ValueError as err:
        print(f"flannelctl status: --health-url {err}", file=sys.stderr)
        return 2
    try:
        doc = fetch_status(args.health_url, args.timeout)
    except StatusUnavailable as err:
        print(f"flannelctl status: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(render(doc, args.health_url))
    return 0 if doc["ready"] else EXIT_NOT_READY
