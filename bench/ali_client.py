"""Benchmark: what the ali-vpc engine's API client costs a flanneld, ours against the SDK's.

Each figure is measured in a fresh interpreter that has first imported what every cloud
backend loads anyway (asyncio, ssl, the cloud-route frame and the metadata reader): the time
and the RSS that importing the client then adds. Ours: ``flannel.cloud.alivpc`` (the engine
and its signed RPC client). The SDK's: ``aliyunsdkcore`` and three VPC request classes, a
client constructed, imported from a directory where ``aliyun-python-sdk-vpc`` is installed
(it is not a project dependency: ``pip install --target DIR aliyun-python-sdk-vpc``).

    .venv/bin/python -m bench.ali_client --sdk-site DIR --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

_PROBE = """
import sys, time
def rss():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
import asyncio, ssl
import flannel.backend.cloudroutes, flannel.cloud.metadata
before, started = rss(), time.perf_counter()
if sys.argv[1] == "sdk":
    sys.path.append(sys.argv[2])
    from aliyunsdkcore.client import AcsClient
    from aliyunsdkvpc.request.v20160428 import (
        CreateRouteEntryRequest, DescribeRouteTablesRequest, DescribeVpcsRequest)
    AcsClient("id", "secret", "cn-hangzhou")
else:
    import flannel.cloud.alivpc
print(time.perf_counter() - started, (rss() - before) / 1024)
"""


def measure(which: str, sdk_site: str) -> tuple[float, float]:
    out = subprocess.run([sys.executable, "-c", _PROBE, which, sdk_site], check=True,
                         capture_output=True, text=True, timeout=120).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ali_client")
    parser.add_argument("--sdk-site", required=True,
                        help="a directory holding aliyun-python-sdk-vpc and its dependencies")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with open("/proc/loadavg") as loadavg:
        print(f"load average at start: {loadavg.read().split()[0]}")
    figures = {}
    for which in ("ours", "sdk"):
        runs = [measure(which, args.sdk_site) for _ in range(args.rounds)]
        seconds = statistics.median(r[0] for r in runs)
        mib = statistics.median(r[1] for r in runs)
        figures[which] = (seconds, mib)
        print(f"{which:>4}: import {seconds * 1000:.0f} ms, RSS +{mib:.1f} MiB "
              f"(median of {args.rounds})")
    ours, sdk = figures["ours"], figures["sdk"]
    print(f"ratio ours/sdk: time {ours[0] / sdk[0]:.2f}, RSS {ours[1] / max(sdk[1], 0.1):.2f}")


if __name__ == "__main__":
    main()
