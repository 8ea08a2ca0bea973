"""``/metrics``: this node's figures in the Prometheus text format.

Owns the metric families (names, help, labels; listed in docs/operations.md) and their
rendering. A collector reads the live ``NodeState`` at every scrape, so the components only
keep plain counters and never import prometheus_client; this module is imported by the
health server on the first scrape only, in a thread (not by the CNI plugin nor by
``flannelctl``).
Names follow Prometheus conventions: ``flannel_`` prefix, base units, ``_total`` counters,
labels of bounded cardinality (kinds, components, engines; never a peer).
Must not touch: the components it reads (reads only, on the event loop's thread).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from flannel.backend.admission import KINDS
from flannel.monitor.nodestate import ENGINE
from flannel.version import __version__

if TYPE_CHECKING:
    from flannel.monitor.nodestate import NodeState

#: The classic text format: every Prometheus version reads it, and our names need no more.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
_SAMPLE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}$")


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _bound(seconds: float) -> str:
    """A bucket's ``le`` as Prometheus writes it: 0.005, 1.0, +Inf."""
    return "+Inf" if math.isinf(seconds) else repr(seconds)


def _by(name: str, doc: str, label: str, values: Mapping[str, float],
        counter: bool = True) -> Metric:
    family = (CounterMetricFamily(name, doc, labels=[label]) if counter
              else GaugeMetricFamily(name, doc, labels=[label]))
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class NodeCollector(Collector):
    """Every ``flannel_*`` family, read from a ``NodeState`` when scraped."""

    def __init__(self, state: NodeState, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        state = self.state
        yield InfoMetricFamily("flannel_build", "The running flanneld's version.",
                               value={"version": __version__})
        ready, _ = state.readiness.current()
        yield _gauge("flannel_ready", "1 when this node is ready (/readyz answers 200).",
                     int(ready))
        yield _by("flannel_component_ready", "1 for each readiness component that is ready.",
                  "component", {name: int(ok) for name, ok, _ in
                                state.readiness.components()}, counter=False)
        yield from self._lease()
        yield from self._peers()
        yield from self._dataplane()
        yield from self._rules()
        yield from self._engines()
        yield from self._health()

    def _lease(self) -> Iterator[Metric]:
        sm = self.state.store
        if sm is None:
            return
        lease, status = sm.lease, sm.status
        if lease is not None:
            backend = self.state.config.backend_type if self.state.config else ""
            yield InfoMetricFamily(
                "flannel_lease", "This node's lease (1, with its subnets as labels).",
                value={"subnet": str(lease.subnet or ""),
                       "ipv6_subnet": str(lease.ipv6_subnet or ""),
                       "backend": backend, "store": sm.name})
            if lease.expiration is not None:  # a reservation never expires
                yield _gauge("flannel_lease_remaining_seconds",
                             "Seconds until this node's lease expires unless renewed.",
                             lease.expiration - self._clock())
        yield _counter("flannel_lease_renewals", "Lease renewals that succeeded.",
                       status.renewals)
        yield _counter("flannel_lease_renewal_failures", "Lease renewals that failed "
                       "(retried every minute).", status.renewal_failures)
        yield _gauge("flannel_store_watch_connected",
                     "1 while the lease watch is connected to the store.", int(status.watching))
        yield _counter("flannel_store_watch_reconnects",
                       "Times the lease watch was cut and resumed.", status.reconnects)
        yield _counter("flannel_store_watch_compactions", "Times the watch's revision was "
                       "compacted away (etcd) or gone (kube 410), forcing a relist.",
                       status.compactions)
        yield _counter("flannel_store_relists", "Full listings of every lease, the first "
                       "one included.", status.relists)
        writes = status.writes
        yield _by("flannel_store_write_failures", "Failed writes of this node's own record "
                  "(kube: annotations, condition), retried with backoff.", "write",
                  writes.failures)
        yield _by("flannel_store_write_failing", "1 while a write of this node's own record "
                  "fails (kube: annotations, condition).", "write",
                  {write: int(write in writes.failing) for write in writes.failures},
                  counter=False)

    def _peers(self) -> Iterator[Metric]:
        state = self.state
        known = state.peers.count if state.peers is not None else 0
        status = state.dataplane.status if state.dataplane is not None else None
        wanted = status.wanted_peers if status is not None else 0
        programmed = state.programmed()
        yield _gauge("flannel_peers_known", "Usable remote leases the lease watch holds.",
                     known)
        yield _gauge("flannel_peers_wanted", "Usable remote leases of this node's backend "
                     "type: the peers to program.", wanted)
        yield _gauge("flannel_peers_programmed", "Peers the last successful reconcile pass "
                     "programmed (those of this node's backend).", programmed)
        yield _gauge("flannel_peers_skipped", "Lease records skipped right now as invalid "
                     "(undecodable, outside the Network, overlapping, bad public IP).",
                     state.skipped_now())
        yield _counter("flannel_peer_records_skipped", "Lease records skipped as invalid "
                       "since start (each delivery counts).", state.skipped_total())
        if state.backend is not None:
            refused = dict.fromkeys((*KINDS, ENGINE), 0)
            for kind, _why in state.refused().values():
                refused[kind] += 1
            yield _by("flannel_peers_refused", "Peer leases refused right now, by reason: "
                      "backend data the backend cannot use, an identity (VTEP MAC, public "
                      "key) another lease holds, the kernel refused their entries (retried "
                      "with backoff), an engine refused them.", "reason", refused,
                      counter=False)
            yield _by("flannel_peer_refusals", "Peer leases refused since start, by reason: "
                      "each lease refused anew, and each time the kernel refused a peer.",
                      "reason", state.backend.admission.refusals)

    def _dataplane(self) -> Iterator[Metric]:
        dataplane = self.state.dataplane
        if dataplane is None:
            return
        status = dataplane.status
        passes = CounterMetricFamily("flannel_reconcile_passes", "Reconcile passes, by "
                                     "result.", labels=["result"])
        passes.add_metric(["ok"], status.passes - status.failed_passes)
        passes.add_metric(["error"], status.failed_passes)
        yield passes
        durations = status.pass_durations
        yield HistogramMetricFamily(
            "flannel_reconcile_pass_duration_seconds", "Duration of reconcile passes.",
            buckets=[(_bound(bound), count) for bound, count in durations.cumulative()],
            sum_value=durations.sum)
        yield _gauge("flannel_dataplane_in_sync", "1 when the kernel holds the latest "
                     "desired state.", int(status.in_sync))
        yield _by("flannel_reconcile_changes", "Changes applied by reconcile passes that "
                  "succeeded, by kind (route, neighbour, fdb, or an engine's name).", "kind",
                  status.applied)
        yield _by("flannel_drift_repairs", "Drift from desired state seen in kernel events "
                  "and repaired, by kind of object.", "kind", status.repaired)
        yield _counter("flannel_netlink_errors", "Passes whose netlink part failed.",
                       status.netlink_errors)
        yield _counter("flannel_netlink_event_overruns", "Kernel event buffer overruns "
                       "(each forces a full pass).", status.event_overruns)
        yield _counter("flannel_netlink_event_watch_failures", "Times the kernel event "
                       "watch failed and was subscribed again.", status.event_watch_failures)

    def _rules(self) -> Iterator[Metric]:
        rules = self.state.rules
        if rules is None:
            return
        yield _by("flannel_rules_installed", "1 when the traffic rules are in place, by "
                  "mode.", "mode", {rules.mode: int(rules.installed)}, counter=False)
        yield _counter("flannel_rules_resyncs", "Checks of the traffic rules (start-up and "
                       "every --iptables-resync).", rules.checks)
        yield _counter("flannel_rules_repairs", "Checks that found rules missing and "
                       "re-applied them.", rules.repairs)
        yield _counter("flannel_rules_failures", "Checks that could not install the "
                       "rules.", rules.failures)
        if rules.filtered:
            families = [f"ipv{version}" for version in rules.filtered]
            dropped = {f"ipv{v}": rules.not_peer_dropped.get(v, (0, 0)) for v in rules.filtered}
            yield _by("flannel_encap_not_peer_dropped_packets", "Encapsulated packets (vxlan, "
                      "udp) dropped because their source is no lease's public address "
                      "(--encap-peers-only), by IP family; read at each rules check.",
                      "family", {f: dropped[f][0] for f in families}, counter=True)
            yield _by("flannel_encap_not_peer_dropped_bytes", "Bytes of those packets.",
                      "family", {f: dropped[f][1] for f in families}, counter=True)
            yield _by("flannel_encap_filter_peers", "Addresses in the encapsulation "
                      "filter's peer set, by IP family.", "family",
                      {f"ipv{v}": rules.peers.get(v, 0) for v in rules.filtered}, counter=False)
            yield _counter("flannel_encap_filter_updates", "Peer set changes written to the "
                           "encapsulation filter.", rules.peer_updates)
        if rules.pod_encap:
            dropped = {f"ipv{v}": rules.pod_encap_dropped.get(v, (0, 0)) for v in rules.pod_encap}
            yield _by("flannel_pod_encap_dropped_packets", "Packets from the pod network to the "
                      "backend's encapsulation ports and protocols, dropped (--drop-pod-encap), "
                      "by IP family; read at each rules check.", "family",
                      {f: counted[0] for f, counted in dropped.items()}, counter=True)
            yield _by("flannel_pod_encap_dropped_bytes", "Bytes of those packets.", "family",
                      {f: counted[1] for f, counted in dropped.items()}, counter=True)

    def _health(self) -> Iterator[Metric]:
        health = self.state.health
        if health is None:
            return
        yield _gauge("flannel_health_connections_open", "Connections to the health server "
                     "open now.", health.open)
        yield _counter("flannel_health_connections_accepted", "Connections the health server "
                       "accepted.", health.accepted)
        yield _counter("flannel_health_connections_dropped", "Connections closed at once "
                       "because the most the health server keeps were open.", health.dropped)
        yield _counter("flannel_health_connections_timed_out", "Connections closed because "
                       "the request did not arrive, or the reply was not taken, in time.",
                       health.timed_out)
        yield _counter("flannel_health_accept_errors", "Failures to accept a connection "
                       "(e.g. out of files).", health.accept_errors)

    def _engines(self) -> Iterator[Metric]:
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for engine, samples in self.state.engines():
            for sample in samples:
                if not _SAMPLE_NAME.match(sample.name):
                    continue  # a bad name would break the whole exposition
                name = f"flannel_engine_{sample.name}"
                family = families.get(name)
                if family is None:
                    family = (CounterMetricFamily(name, sample.help, labels=["engine"])
                              if sample.counter else
                              GaugeMetricFamily(name, sample.help, labels=["engine"]))
                    families[name] = family
                family.add_metric([engine], sample.value)
        yield from families.values()


class Exposition:
    """The registry of one daemon run: its collector and the process's own figures."""

    def __init__(self, state: NodeState) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(NodeCollector(state))
        ProcessCollector(namespace="", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
