"""Durations counted into fixed buckets, without the metrics library.

Owns the bucket counts of one kind of duration (a reconcile pass), kept by whoever measures
it and read at scrape time by ``flannel.monitor.metrics``, so that the code that measures never
imports prometheus_client. Must not touch: anything else.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

#: Upper bounds in seconds: a pass over a few peers takes ~1 ms, 5000 vxlan peers ~0.5 s.
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Durations:
    """How many durations fell at or under each bound (not cumulative), their sum and count."""

    def __init__(self, bounds: Sequence[float] = PASS_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"bucket bounds must be distinct and increasing: {bounds!r}")
        self.bounds = tuple(bounds)
        #: One count per bound, and a last one for what exceeds every bound.
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, count at or under it) for every bound, then (inf, count)."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out
