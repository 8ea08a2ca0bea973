"""What a running flanneld is made of, gathered for ``/status`` and ``/metrics``.

Owns ``NodeState``, the references the daemon fills in as it starts (store, config,
backend, data plane, rules, lease watcher), and ``status_document``: this node's lease,
backend and what it declares it leaves on the node (its footprint), devices, peers known vs
programmed, readiness and why, the writes of this node's record the store retries, rules,
the peers the probes find unreachable and last errors, as the JSON ``flannelctl status``
reads, of the shape ``flannel/monitor/statusdoc.py`` declares; and ``probes_document``:
every probed peer's latest result, as ``/probes`` serves it to ``flannelctl doctor`` and
``check``.
Everything is read from the live objects when asked: nothing here is updated by the
components. The document holds no credentials, keys or backend data (the VTEP MAC of a
device is the one the lease publishes anyway); flanneld's options are listed as its start-up
line shows them (credentials in URLs masked), the password flag left out.
Must not touch: the components it reads (reads only, on the event loop's thread).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flannel.reporting.readiness import Readiness
from flannel.settings import OptionSource
from flannel.version import __version__

if TYPE_CHECKING:
    from flannel.backend.base import Backend, EngineSample
    from flannel.config import NetworkConfig
    from flannel.dataplane.loop import Dataplane
    from flannel.lease import Lease
    from flannel.monitor.health import HealthStats
    from flannel.monitor.statusdoc import Dataplane as DataplaneDoc
    from flannel.monitor.statusdoc import (
        Device,
        Footprint,
        LeaseInfo,
        Network,
        Peers,
        Probes,
        Rules,
        StatusDocument,
        Store,
    )
    from flannel.probing.prober import ProbeStatus
    from flannel.rules.manager import RulesStatus
    from flannel.subnet.manager import SubnetManager
    from flannel.subnet.watch import LeaseWatcher

#: Skipped peer leases listed with their reason (all are counted; the log names each).
SKIPPED_SHOWN = 50
#: The kind of a refusal an engine reports (``Applier.refused_peers``).
ENGINE = "engine"
#: Unreachable peers listed with their cause (all are counted; the log names each).
UNREACHABLE_SHOWN = 100


@dataclass
class NodeState:
    """The live parts of one daemon run; None until the daemon has created them."""

    readiness: Readiness
    started: float = field(default_factory=time.time)
    store: SubnetManager | None = None
    config: NetworkConfig | None = None
    backend: Backend | None = None
    dataplane: Dataplane | None = None
    rules: RulesStatus | None = None
    peers: LeaseWatcher | None = None
    health: HealthStats | None = None
    #: What the probes of the peers found (None: probing is off, or not started yet).
    probes: ProbeStatus | None = None
    #: The effective options and their sources, secrets masked (``settings.options``).
    options: tuple[OptionSource, ...] = ()
    #: Where flannelctl reaches this flanneld: its local socket, its health server.
    socket: str | None = None
    health_address: str | None = None

    def engines(self) -> list[tuple[str, Sequence[EngineSample]]]:
        """(engine name, samples) of every applier that reports figures."""
        if self.backend is None:
            return []
        return [(applier.name, samples) for applier in self.backend.appliers()
                if (samples := applier.samples())]

    def refused(self) -> dict[str, tuple[str, str]]:
        """Peers this node does not program, or an engine finds bad: lease key -> (kind,
        why). Kinds: ``invalid_data``, ``identity_taken``, ``kernel_refused`` (the backend's
        admission: left out of desired state), ``engine`` (an engine's: the extension's
        commands fail for it, IKE authentication fails with it)."""
        if self.backend is None:
            return {}
        out = dict(self.backend.admission.refused)
        for applier in self.backend.appliers():
            out.update((key, (ENGINE, why)) for key, why in applier.refused_peers().items())
        return out

    def programmed(self) -> int:
        """Peers the last successful pass programmed, less those an engine refused."""
        if self.dataplane is None:
            return 0
        engines = sum(len(a.refused_peers()) for a in self.backend.appliers()) \
            if self.backend is not None else 0
        return max(0, self.dataplane.status.programmed_peers - engines)

    def skipped_now(self) -> int:
        """Lease records skipped right now: undecodable in the store, or unusable as peers."""
        count = len(self.peers.skipped.current) if self.peers is not None else 0
        return count + (len(self.store.undecodable.current) if self.store is not None else 0)

    def skipped_total(self) -> int:
        """Lease records skipped since start (each delivery counts)."""
        total = self.peers.skipped.total if self.peers is not None else 0
        return total + (self.store.undecodable.total if self.store is not None else 0)


def _iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def status_document(state: NodeState, now: float | None = None) -> StatusDocument:
    """This node's status as ``/status`` serves it (see docs/operations.md)."""
    # The schema's module is the readers' (TypedDicts and their checks): loaded at the first
    # /status, not by every flanneld.
    from flannel.monitor.statusdoc import STATUS_FORMAT

    now = time.time() if now is None else now
    ready, why = state.readiness.current()
    sm = state.store
    doc: StatusDocument = {
        "format": STATUS_FORMAT,
        "version": __version__,
        "uptime_seconds": round(now - state.started, 3),
        "ready": ready,
        "reason": why,
        "readiness": [{"component": name, "ready": ok, "reason": reason}
                      for name, ok, reason in state.readiness.components()],
        "flanneld": {"pid": os.getpid(), "socket": state.socket,
                     "health": state.health_address,
                     "options": [{"name": o.name, "value": o.shown, "source": o.source}
                                 for o in state.options if not o.secret]},
        "lease": _lease(sm.lease, now) if sm is not None and sm.lease is not None else None,
        "network": _network(state.config) if state.config is not None else None,
        "store": _store(sm) if sm is not None else None,
        "devices": _devices(state.dataplane),
        "peers": _peers(state),
        "dataplane": _dataplane(state.dataplane) if state.dataplane is not None else None,
        "rules": _rules(state.rules) if state.rules is not None else None,
        "engines": {name: {s.name: s.value for s in samples}
                    for name, samples in state.engines()},
        "footprint": footprint_document(state.backend) if state.backend is not None else None,
        "probes": probes_section(state.probes, now) if state.probes is not None else None,
        "last_errors": [],
    }
    doc["last_errors"] = last_errors(doc)
    return doc


def _store(sm: SubnetManager) -> Store:
    store = sm.status
    return {"kind": sm.name, "ready": store.ready, "reason": store.reason,
            "watching": store.watching, "reconnects": store.reconnects,
            "compactions": store.compactions, "relists": store.relists,
            "renewals": store.renewals, "renewal_failures": store.renewal_failures,
            "writes": {write: {"ok": write not in store.writes.failing, "failures": failures,
                               "error": store.writes.failing.get(write)}
                       for write, failures in sorted(store.writes.failures.items())}}


def _lease(lease: Lease, now: float) -> LeaseInfo:
    expiry = lease.expiration
    return {"subnet": _text(lease.subnet), "ipv6_subnet": _text(lease.ipv6_subnet),
            "public_ip": _text(lease.attrs.public_ip),
            "public_ipv6": _text(lease.attrs.public_ipv6),
            "backend_type": lease.attrs.backend_type,
            "reservation": expiry is None,
            "expires_at": None if expiry is None else _iso(expiry),
            "expires_in_seconds": None if expiry is None else round(expiry - now, 3)}


def _network(config: NetworkConfig) -> Network:
    return {"network": _text(config.network), "ipv6_network": _text(config.ipv6_network),
            "backend": config.backend_type}


def _devices(dataplane: Dataplane | None) -> list[Device]:
    desired = dataplane.desired if dataplane is not None else None
    if desired is None:
        return []
    return [{"name": link.name, "mtu": link.mtu, "mac": link.mac}
            for link in sorted(desired.links, key=lambda x: x.name)]


def _dataplane(dataplane: Dataplane) -> DataplaneDoc:
    status, desired = dataplane.status, dataplane.desired
    return {"in_sync": status.in_sync, "passes": status.passes,
            "failed_passes": status.failed_passes, "last_error": status.last_error,
            "routes_wanted": len(desired.routes) if desired is not None else None,
            "applied": dict(sorted(status.applied.items())),
            "repaired": dict(sorted(status.repaired.items())),
            "netlink_errors": status.netlink_errors,
            "event_overruns": status.event_overruns}


def _peers(state: NodeState) -> Peers:
    peers, dataplane = state.peers, state.dataplane
    refused = sorted(state.refused().items())
    return {"known": peers.count if peers is not None else 0,
            "for_backend": dataplane.status.wanted_peers if dataplane is not None else 0,
            "programmed": state.programmed(),
            "skipped": state.skipped_now(),
            "skipped_reasons": dict(sorted(peers.skipped.current.items())[:SKIPPED_SHOWN])
            if peers is not None else {},
            "refused": len(refused),
            "refused_reasons": {key: why for key, (_kind, why) in refused[:SKIPPED_SHOWN]},
            "refused_kinds": {key: kind for key, (kind, _why) in refused[:SKIPPED_SHOWN]}}


def _rules(rules: RulesStatus) -> Rules:
    doc: Rules = {"mode": rules.mode, "installed": rules.installed, "reason": rules.reason,
                  "checks": rules.checks, "repairs": rules.repairs,
                  "failures": rules.failures}
    if rules.filtered:  # --encap-peers-only
        doc["encap_filter"] = {
            f"ipv{v}": {"peers": rules.peers.get(v, 0),
                        "dropped_packets": rules.not_peer_dropped.get(v, (0, 0))[0]}
            for v in rules.filtered}
    if rules.pod_encap:  # --drop-pod-encap
        doc["pod_encap_drop"] = {
            f"ipv{v}": {"dropped_packets": rules.pod_encap_dropped.get(v, (0, 0))[0]}
            for v in rules.pod_encap}
    return doc


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def probes_section(probes: ProbeStatus, now: float) -> Probes:
    """The probes of the peers: their pace, how far behind, what is not probed and why,
    and the peers unreachable now (the first ``UNREACHABLE_SHOWN`` by lease)."""
    from flannel.probing.sequence import CAUSES

    assert probes.schedule is not None
    ticks = probes.schedule.clock.monotonic()
    failing = sorted(probes.failing.items())
    return {
        "interval_seconds": probes.interval, "rate_per_second": probes.rate,
        "period_seconds": round(probes.period, 3), "peers": probes.peers,
        "oldest_result_seconds": _rounded(probes.oldest()),
        "unprobed": {f"ipv{version}": why for version, why in sorted(probes.unprobed.items())},
        "unreachable": len(failing), "by_cause": probes.by_cause(),
        "listed": [{"lease": key, "family": version, "public_ip": f.public, "target": f.target,
                    "cause": f.cause, "label": CAUSES[f.cause], "detail": f.detail,
                    "since": _iso(f.since), "for_seconds": round(now - f.since, 3),
                    "checked_seconds_ago": round(ticks - f.checked, 3)}
                   for (key, version), f in failing[:UNREACHABLE_SHOWN]],
        "probes": dict(sorted(probes.probes.items())),
        "errors": dict(sorted(probes.errors.items()))}


def probes_document(state: NodeState) -> dict[str, Any]:
    """Every probed peer's latest result, for the operator tools (``/probes``): the period,
    how old a result grows before the next one replaces it (the period and the longest a
    probe takes: ``fresh_seconds``), and per peer and IP family its result ("none"
    before its first probe, "reached", or a cause), how old it is, its round trip, and for
    an unreachable one what was seen."""
    from flannel.probing.sequence import LONGEST

    probes = state.probes
    if probes is None:
        return {"period_seconds": None, "fresh_seconds": None, "peers": []}
    rows = []
    for key, version, result, age, rtt in probes.results():
        row: dict[str, Any] = {"lease": key, "family": version, "result": result,
                               "age_seconds": _rounded(age),
                               "rtt_ms": None if rtt is None else round(rtt * 1000, 3)}
        failing = probes.failing.get((key, version))
        if failing is not None and failing.cause == result:
            row["detail"] = failing.detail
        rows.append(row)
    # A result is renewed once a period, by a probe that may take up to LONGEST.
    return {"period_seconds": round(probes.period, 3),
            "fresh_seconds": round(probes.period + LONGEST, 3), "peers": rows}


def footprint_document(backend: Backend) -> Footprint:
    """What the backend declares it leaves on the node (``flannel/backend/footprint.py``),
    and the UDP port any host may inject into the pods on (its first unauthenticated
    carrier's, ``Backend.carriers``; null for none)."""
    from flannel.backend.plan import injectable

    footprint = backend.footprint
    ports = injectable(type(backend).carriers(backend.config))
    return {"routes": footprint.routes, "device": footprint.device,
            "links": [{"pattern": link.pattern, "kind": link.kind} for link in footprint.links],
            "encap_port": ports[0] if ports else None, "vtep": footprint.vtep,
            "dual_stack": footprint.dual_stack}


def last_errors(doc: StatusDocument) -> list[str]:
    """What is failing now, most basic first: store, rules, data plane."""
    errors = []
    store, rules, dataplane = doc["store"], doc["rules"], doc["dataplane"]
    if store is not None and not store["ready"]:
        errors.append(f"store: {store['reason']}")
    if store is not None:
        errors += [f"store: {name}: {write['error']}" for name, write in store["writes"].items()
                   if write["error"]]
    if rules is not None and not rules["installed"] and rules["checks"]:
        errors.append(f"rules: {rules['reason']}")
    if dataplane is not None and dataplane["last_error"]:
        errors.append(f"data plane: {dataplane['last_error']}")
    return errors
