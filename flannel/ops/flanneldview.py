"""What only the running flanneld knows, as its ``/status`` tells it: the peers it refuses now
and why (those whose entries the kernel refused are parked: left out, retried with backoff),
and whether its rules drop the encapsulation pods send; and, as its ``/probes`` tells it,
what its own probes of each peer found lately.

Owns asking the flanneld of this network namespace, over its local socket (found as every
``flannelctl`` verb finds it: ``flannel/ops/locate.py``, ``discover.py``; fetched by
``flannel/ops/status.py``; ``/status`` read as ``flannel/monitor/statusdoc.py`` declares),
and reading the answers as untrusted input: only the fields it uses, of the types they must
have, bounded. When one cannot be read, ``unread`` says why,
for a "not checked: ... because ..." of the tools. ``doctor`` and ``check`` share it.
A probe result is fresh (``FlanneldProbes.fresh``) when it is at most the tool's
``--max-age`` old, by default flanneld's probe period and the longest one probe takes (its
``fresh_seconds``): flanneld has a newer result of that peer before its result grows older,
so it is what flanneld knows of it now.
Must not touch: anything (one GET of /status, one of /probes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flannel.monitor.statusdoc import Read
    from flannel.ops.discover import Flanneld

#: Seconds flanneld has to answer.
TIMEOUT = 3.0
#: Refusals read at most (flanneld lists 50), and the characters kept of each reason.
MAX_REFUSED = 1000
MAX_REASON = 2000
#: Probe results read at most (one per peer and IP family), and the longest period taken.
MAX_RESULTS = 100_000
MAX_PERIOD = 86400.0


@dataclass(frozen=True)
class FlanneldView:
    """``refused``: lease key -> (kind, why) of every peer flanneld lists as refused now
    (kinds as ``/status`` names them: ``kernel_refused`` for a parked peer, ``engine``,
    ``identity_taken``, ``invalid_data``); ``unlisted``: refusals it counts but does not
    list; ``pod_encap_drop``: whether its rules drop pods' encapsulation (None: unknown, its
    rules not set up yet); ``unread``: why nothing could be read ("" when read)."""

    refused: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    unlisted: int = 0
    pod_encap_drop: bool | None = None
    unread: str = ""

    def of_kind(self, kind: str) -> dict[str, str]:
        """Lease key -> why, of the refusals of one kind."""
        return {key: why for key, (found, why) in self.refused.items() if found == kind}


def read_view(found: Flanneld | None, timeout: float = TIMEOUT) -> FlanneldView:
    """What the flanneld ``found`` running here says (None: none runs here)."""
    from flannel.ops.status import StatusUnavailable, fetch_status, where_of

    if found is None:
        return FlanneldView(unread="no flanneld runs in this network namespace")
    try:
        doc = fetch_status(where_of(found), timeout)
    except StatusUnavailable as err:
        return FlanneldView(unread=f"flanneld's /status could not be read: {err}")
    return view_of(doc)


def view_of(read: Read) -> FlanneldView:
    """The parts of a ``/status`` document the tools use (read as its schema declares: what
    is not of its shape is left out, never trusted)."""
    peers, rules = read.doc["peers"], read.doc["rules"]
    refused = {key: (kind, peers["refused_reasons"][key][:MAX_REASON])
               for key, kind in list(peers["refused_kinds"].items())[:MAX_REFUSED]
               if key in peers["refused_reasons"]}
    unlisted = max(0, peers["refused"] - len(refused))
    return FlanneldView(refused, unlisted,
                        "pod_encap_drop" in rules if rules is not None else None)


@dataclass(frozen=True)
class ProbeResult:
    """flanneld's latest probe of one peer in one IP family: ``result`` ("reached" or a
    cause: ``flannel/probing/sequence.py``), its age in seconds, its round trip over the
    overlay (seconds; None: none) and what was seen when it failed."""

    result: str
    age: float
    rtt: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class FlanneldProbes:
    """(lease key, IP version) -> flanneld's latest probe of it; ``period``: how often it
    probes each peer (None: it does not probe); ``fresh_for``: how old a result grows before
    a newer one replaces it; ``unread``: why nothing could be read."""

    results: Mapping[tuple[str, int], ProbeResult] = field(default_factory=dict)
    period: float | None = None
    unread: str = ""
    fresh_for: float | None = None

    def fresh(self, key: str, version: int, max_age: float | None) -> ProbeResult | None:
        """flanneld's result for that peer when it is fresh (see the module docstring)."""
        limit = (self.fresh_for or self.period) if max_age is None else max_age
        result = self.results.get((key, version))
        if result is None or limit is None or result.age > limit:
            return None
        return result


def read_probes(found: Flanneld | None, timeout: float = TIMEOUT) -> FlanneldProbes:
    """What the flanneld ``found`` running here says its probes found (None: none runs
    here)."""
    from flannel.ops.status import MAX_STATUS_BYTES, StatusUnavailable, fetch, where_of
    from flannel.untrusted import boundedjson

    if found is None:
        return FlanneldProbes(unread="no flanneld runs in this network namespace")
    try:
        reply, body = fetch(where_of(found), "/probes", timeout)
    except StatusUnavailable as err:
        return FlanneldProbes(unread=f"flanneld's /probes could not be read: {err}")
    if reply.status != 200:
        return FlanneldProbes(unread=f"flanneld answered /probes with HTTP {reply.status} "
                              "(a version without probes?)")
    try:
        doc = boundedjson.loads(body, what="flanneld's /probes", max_bytes=MAX_STATUS_BYTES)
    except boundedjson.JSONLimitError as err:
        return FlanneldProbes(unread=f"flanneld's /probes is not usable: {err}")
    return probes_of(doc)


def probes_of(doc: object) -> FlanneldProbes:
    """The results of a ``/probes`` document; what is not of its shape is left out."""
    if not isinstance(doc, dict):
        return FlanneldProbes(unread="flanneld's /probes is not a JSON object")
    period = doc.get("period_seconds")
    if not isinstance(period, int | float) or isinstance(period, bool) \
            or not 0 < period <= MAX_PERIOD:
        return FlanneldProbes(unread="flanneld does not probe its peers "
                              "(--peer-probe-interval=0)")
    fresh = doc.get("fresh_seconds")
    fresh_for = float(fresh) if isinstance(fresh, int | float) and not isinstance(fresh, bool) \
        and period <= fresh <= 2 * MAX_PERIOD else None
    rows = doc.get("peers")
    results: dict[tuple[str, int], ProbeResult] = {}
    for row in rows[:MAX_RESULTS] if isinstance(rows, list) else ():
        if not isinstance(row, dict):
            continue
        key, family, result = row.get("lease"), row.get("family"), row.get("result")
        age, rtt, detail = row.get("age_seconds"), row.get("rtt_ms"), row.get("detail", "")
        if not (isinstance(key, str) and family in (4, 6) and isinstance(result, str)
                and isinstance(age, int | float) and not isinstance(age, bool) and age >= 0
                and isinstance(detail, str)):
            continue  # no result yet ("none", no age), or not of the shape
        seconds = rtt / 1000 if isinstance(rtt, int | float) and not isinstance(rtt, bool) \
            and rtt > 0 else None
        results[(key[:MAX_REASON], int(family))] = ProbeResult(
            result[:64], float(age), seconds, detail[:MAX_REASON])
    return FlanneldProbes(results, float(period), fresh_for=fresh_for)
