"""``flannelctl status``: this node's flanneld as its ``/status`` endpoint tells it.

Owns finding where to ask (``--health-url``: plain HTTP to the health server; ``--socket``,
or the socket next to ``--subnet-file``; with neither, the local socket of the flanneld of
this network namespace, found by ``flannel.ops.discover``, else the default
``/run/flannel/flanneld.sock``), fetching ``/status`` (one bounded request), checking the
answer's shape, and showing it: a human table by default, the document itself with
``--json``. Exit codes: 0 ready, 1 running but not ready, 2 a bad flag, 3 flanneld did not
answer (not running, a stale socket, no right to use it) or answered something that is not
its status.
Must not touch: the kernel, the store (the daemon's view is what is shown).
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flannel.monitor.localsock import connect, socket_path
from flannel.untrusted import boundedjson

if TYPE_CHECKING:
    from flannel.ops.discover import Flanneld
    from flannel.ops.options import StatusOptions

DEFAULT_HEALTH_URL = "http://127.0.0.1:8081"
DEFAULT_SUBNET_FILE = "/run/flannel/subnet.env"
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


@dataclass(frozen=True)
class Where:
    """Where flanneld is asked: a health server URL, or a local socket."""

    url: str = ""
    socket: Path | None = None
    shown: str = ""  # how the socket is named to the user
    pid: int = 0  # the flanneld found running in this network namespace, if any
    looked: bool = False  # no flag said where: this network namespace was searched

    def __str__(self) -> str:
        return self.url or self.shown or str(self.socket)


class _SocketConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = connect(self._path, self.timeout if self.timeout is not None else 3.0)


def _socket_failure(where: Where, err: OSError) -> StatusUnavailable:
    """What a socket that cannot be used means, and what to do."""
    running = (f"flanneld (pid {where.pid}) runs in this network namespace, but "
               if where.pid else "")
    if err.errno == errno.ENOENT:
        if where.pid:
            return StatusUnavailable(f"{running}{where} does not exist: its log says why "
                                     "it does not serve flannelctl")
        if where.looked:
            return StatusUnavailable(
                f"flanneld is not running in this network namespace (no flanneld process, "
                f"no socket {where}); run flannelctl in flanneld's network namespace, or "
                "give --health-url")
        return StatusUnavailable(f"there is no socket {where}: is flanneld running, and "
                                 "is that next to its --subnet-file?")
    if err.errno == errno.ECONNREFUSED:
        if where.pid:
            return StatusUnavailable(f"{running}nobody answers on {where}: it is starting "
                                     "or stopping; try again")
        return StatusUnavailable(f"flanneld is not running: {where} is a stale socket left "
                                 "by a flanneld that ended (the next flanneld replaces it)")
    if err.errno in (errno.EACCES, errno.EPERM):
        return StatusUnavailable(f"{where} is flanneld's and only root (or flanneld's user) "
                                 f"may use it ({err.strerror}): run flannelctl as root")
    return StatusUnavailable(f"flanneld's socket {where} cannot be used: "
                             f"{err.strerror or err}")


def fetch(where: Where, path: str, timeout: float, limit: int = MAX_STATUS_BYTES,
          accept: str = "application/json") -> tuple[http.client.HTTPResponse, bytes]:
    """One GET of ``path`` from flanneld's health server or local socket: its answer and up
    to ``limit`` + 1 bytes of its body; StatusUnavailable says why there is none."""
    base = str(where)
    connection: http.client.HTTPConnection
    if where.url:
        host, port = check_url(where.url)
        connection = http.client.HTTPConnection(host, port, timeout=timeout)
    else:
        assert where.socket is not None
        connection = _SocketConnection(where.socket, timeout)
    try:
        connection.request("GET", path, headers={"Accept": accept})
        reply = connection.getresponse()
        body = reply.read(limit + 1)
    except (OSError, http.client.HTTPException) as err:
        if not where.url and isinstance(err, OSError) and err.errno is not None:
            raise _socket_failure(where, err) from None
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise StatusUnavailable(
            f"flanneld's health server at {base} did not answer ({why}); is flanneld "
            "running with --healthz-port, and is --health-url its --healthz-ip:"
            "--healthz-port?" if where.url else
            f"flanneld did not answer on {base} ({why})") from None
    finally:
        connection.close()
    return reply, body


def fetch_status(where: Where | str, timeout: float) -> dict[str, Any]:
    """flanneld's status document from its health server or local socket."""
    where = Where(url=where) if isinstance(where, str) else where
    base = str(where)
    reply, body = fetch(where, "/status", timeout)
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


#: Each kind of refusal /status lists: (its label, what the count says of those peers).
REFUSALS = {
    "invalid_data": ("bad data", "refused for their data"),
    "identity_taken": ("identity", "refused for an identity another lease holds"),
    "kernel_refused": ("parked", "parked (the kernel refused their entries; retried)"),
    "engine": ("engine", "refused by the backend's engine"),
}


def _refusal_counts(total: Any, refused: dict[Any, Any], kinds: dict[Any, Any]) -> str:
    """", 1 refused for their data, 2 parked (...)": the listed refusals by kind, then any
    more it counts."""
    if not total:
        return ""
    counted: dict[str, int] = {}
    for key in refused:
        kind = str(kinds.get(key))
        counted[kind] = counted.get(kind, 0) + 1
    parts = [f"{n} {REFUSALS.get(kind, ('', 'refused'))[1]}"
             for kind, n in sorted(counted.items(), key=lambda kn: list(REFUSALS).index(kn[0])
                                   if kn[0] in REFUSALS else len(REFUSALS))]
    more = total - len(refused) if isinstance(total, int) else 0
    if more > 0:
        parts.append(f"{more} more refused")
    return "".join(f", {part}" for part in parts)


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


def _store_place(kind: str, options: dict[Any, Any]) -> str:
    """Where the store is, from flanneld's options (credentials are masked there)."""
    if kind == "etcd":
        return f"{options.get('etcd-endpoints')}, prefix {options.get('etcd-prefix')}"
    api = options.get("kube-api-url") or options.get("kubeconfig-file") or "in-cluster"
    return f"{api}, annotations {options.get('kube-annotation-prefix')}"


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
    flanneld = doc.get("flanneld")
    if isinstance(flanneld, dict):
        rows.append(("serving", ", ".join(
            f"{what} {where}" for what, where in (("socket", flanneld.get("socket")),
                                                 ("health", flanneld.get("health"))) if where)
            or "no socket, no health port"))
    options = {_get(o, "name"): _get(o, "value")
               for o in (_get(flanneld, "options") or []) if isinstance(o, dict)}
    store = doc.get("store")
    if isinstance(store, dict) and options:
        rows.append(("store at", _store_place(str(store.get("kind")), options)))
    if isinstance(store, dict):
        rows.append(("store", f"{store.get('kind')}: "
                              f"{'watching' if store.get('watching') else 'NOT watching'}, "
                              f"{store.get('relists')} listing(s), "
                              f"{store.get('reconnects')} reconnect(s), "
                              f"{store.get('compactions')} compaction(s); renewals "
                              f"{store.get('renewals')} ok, {store.get('renewal_failures')} "
                              "failed"))
        writes = store.get("writes")
        if isinstance(writes, dict) and writes:
            rows.append(("  writes", "; ".join(
                f"{name} {'ok' if _get(w, 'ok') else 'FAILING'}, {_get(w, 'failures')} failed"
                for name, w in sorted(writes.items()))))
    devices = doc.get("devices")
    if isinstance(devices, list) and devices:
        rows.append(("devices", "; ".join(
            f"{_get(d, 'name')} mtu {_get(d, 'mtu')} mac {_get(d, 'mac')}" for d in devices)))
    peers = doc.get("peers")
    if isinstance(peers, dict):
        refused = peers.get("refused_reasons")
        refused = refused if isinstance(refused, dict) else {}
        kinds = peers.get("refused_kinds")
        kinds = kinds if isinstance(kinds, dict) else {}
        rows.append(("peers", f"{peers.get('known')} known, {peers.get('for_backend')} for "
                              f"this backend, {peers.get('programmed')} programmed, "
                              f"{peers.get('skipped')} skipped as invalid"
                              + _refusal_counts(peers.get("refused"), refused, kinds)))
        reasons = peers.get("skipped_reasons")
        for key, why in (reasons.items() if isinstance(reasons, dict) else ()):
            rows.append(("  skipped", f"{key}: {why}"))
        for key, why in refused.items():
            label = REFUSALS.get(str(kinds.get(key)), ("refused", ""))[0]
            rows.append((f"  {label}", f"{key}: {why}"))
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


def locate(args: StatusOptions, environ: dict[str, str] | None = None) -> Where:
    """Where to ask: ``--health-url``, ``--socket``, the socket next to ``--subnet-file``
    (or ``FLANNELD_SUBNET_FILE``), else that of this network namespace's flanneld, else the
    default one. NotFound when several flanneld run here."""
    from flannel.ops.discover import find

    environ = dict(os.environ if environ is None else environ)
    if args.health_url:
        return Where(url=args.health_url)
    if args.socket:
        return Where(socket=Path(args.socket))
    given = args.subnet_file or environ.get("FLANNELD_SUBNET_FILE")
    if given:
        return Where(socket=socket_path(given))
    found = find()
    if found is None:
        return Where(socket=socket_path(DEFAULT_SUBNET_FILE), looked=True)
    return where_of(found)


def where_of(found: Flanneld) -> Where:
    """The local socket of a flanneld found running here, named as it names it."""
    shown = str(socket_path(found.subnet_file))
    if found.socket != Path(shown):
        shown += f" (in the mount namespace of flanneld pid {found.pid})"
    return Where(socket=found.socket, shown=shown, pid=found.pid, looked=True)


def cmd_status(args: StatusOptions) -> int:
    from flannel.ops.discover import NotFound

    if args.health_url:
        try:
            check_url(args.health_url)
        except ValueError as err:
            print(f"flannelctl status: --health-url {err}", file=sys.stderr)
            return 2
    try:
        where = locate(args)
        doc = fetch_status(where, args.timeout)
    except (StatusUnavailable, NotFound) as err:
        print(f"flannelctl status: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(render(doc, str(where)))
    return 0 if doc["ready"] else EXIT_NOT_READY
