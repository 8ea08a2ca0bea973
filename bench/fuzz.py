"""Fuzz command: 10,000+ hostile inputs per decoder, crashes counted per class (target: 0).

Runs every target of ``tests.support.fuzz_store`` (network config, etcd lease, subnet key
through the peer filter, node annotations, previous subnet.env),
``tests.support.fuzz_backends`` (every backend's options, the BackendData decoders applied
to peers' leases), ``tests.support.fuzz_udp`` (the udp forwarder's receive path, raw
datagrams), ``tests.support.fuzz_http`` (the API clients' HTTP/1.1 response reader, over
loopback), ``tests.support.fuzz_answers`` (every etcd and Kubernetes API answer as the
clients and stores decode it), ``tests.support.fuzz_cloud`` (what the cloud APIs, metadata
services, charon's VICI and WireGuard answer) and ``tests.support.fuzz_cni`` (the CNI plugin)
under hypothesis. A crash is counted by class (exception type and where it was raised)
instead of stopping the run. Baseline, measured in the same run: the time hypothesis spends
generating the inputs; the ratio is the decoders' time over that.

    .venv/bin/python -m bench.fuzz --examples 10000

Exits 1 when any target crashed.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from tests.support import (
    fuzz_answers,
    fuzz_backends,
    fuzz_cloud,
    fuzz_cni,
    fuzz_http,
    fuzz_store,
    fuzz_udp,
)
from tests.support.fuzzing import FuzzTarget, crash_class


def drive(target: FuzzTarget, examples: int) -> tuple[int, Counter, float, float]:
    """Run ``examples`` generated inputs; (inputs run, crashes by class, seconds in the
    decoder, seconds in all)."""
    crashes: Counter = Counter()
    count = 0
    decoding = 0.0

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(target.inputs)
    def one(value: Any) -> None:
        nonlocal count, decoding
        count += 1
        started = time.perf_counter()
        try:
            target.run(value)
        except Exception as err:  # every class is counted, none stops the run
            crashes[crash_class(err)] += 1
        decoding += time.perf_counter() - started

    started = time.perf_counter()
    one()
    return count, crashes, decoding, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10000, help="inputs per target")
    parser.add_argument("--only", default="", help="run only targets whose name contains this")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # refusals log warnings by design
    every = (fuzz_store.TARGETS + fuzz_backends.TARGETS + fuzz_udp.TARGETS + fuzz_http.TARGETS
             + fuzz_answers.TARGETS + fuzz_cloud.TARGETS + fuzz_cni.TARGETS)
    targets = [t for t in every if args.only in t.name]
    load = os.getloadavg()[0]
    print(f"fuzz: {args.examples} examples per target, {len(targets)} targets, "
          f"load average {load:.2f} on {os.cpu_count()} cores")
    total_crashes = 0
    for target in targets:
        count, crashes, decoding, elapsed = drive(target, args.examples)
        total_crashes += sum(crashes.values())
        generating = elapsed - decoding
        print(f"{target.name}: {count} examples in {elapsed:.1f}s; decoding "
              f"{1000 * decoding / max(count, 1):.3f} ms/example, generating "
              f"{1000 * generating / max(count, 1):.3f} ms/example (baseline), ratio "
              f"{decoding / generating:.2f}; crashes: {sum(crashes.values())}")
        for cls, n in crashes.most_common():
            print(f"    {n:6d}  {cls}")
    print(f"total crashes: {total_crashes}")
    return 1 if total_crashes else 0


if __name__ == "__main__":
    sys.exit(main())
