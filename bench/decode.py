"""Benchmark: the cost of bounded JSON decoding over plain ``json.loads``.

Figure: microseconds per ``flannel.untrusted.boundedjson.loads`` call (size check, depth pre-scan,
strict decoder) on real inputs; baseline: ``json.loads`` of the same bytes in the same run,
rounds interleaved, medians reported.

    .venv/bin/python -m bench.decode --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import timeit

from flannel.untrusted import boundedjson

LEASE = (b'{"PublicIP":"192.168.111.2","PublicIPv6":null,"BackendType":"vxlan",'
         b'"BackendData":{"VNI":1,"VtepMAC":"0e:4c:1a:7b:22:01"}}')
CONFIG = (b'{"Network": "10.244.0.0/16", "EnableNFTables": false, "EnableIPv6": true, '
          b'"IPv6Network": "fd00:10:244::/56", "Backend": {"Type": "vxlan", "VNI": 1, '
          b'"Port": 8472, "DirectRouting": false}}')
# Near the lease size limit, with many small nested values: the pre-scan's worst honest case.
LARGE = json.dumps({"BackendData": [{"k": [i, "[x]"]} for i in range(2900)]}).encode()


def per_call(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=3)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for name, raw, number in (("lease value", LEASE, 20000), ("network config", CONFIG, 20000),
                              (f"{len(LARGE)}-byte value", LARGE, 50)):
        ours, base = [], []
        for _ in range(args.rounds):
            base.append(per_call(lambda raw=raw: json.loads(raw), number))
            ours.append(per_call(lambda raw=raw: boundedjson.loads(
                raw, what="x", max_bytes=boundedjson.MAX_LEASE_BYTES), number))
        figure, baseline = statistics.median(ours), statistics.median(base)
        print(f"{name}: bounded {figure:.2f} us, json.loads {baseline:.2f} us, "
              f"ratio {figure / baseline:.2f}")


if __name__ == "__main__":
    main()
