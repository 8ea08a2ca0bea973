"""What the lab's cloud processes (``awscloud``, ``alicloud``, ``gcecloud``) share: their
command line (``--address A --node INDEX=ADDRESS ... --network N --router-netns UL --out
FILE``), the SIGTERM that stops them, and the loop that keeps the VPC router (``vpcrouter``)
following the cloud's route table until then, reporting each change of its health once.
Must not touch: any namespace but the router's (``vpcrouter`` does the routing).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from flannel_lab import vpcrouter
from flannel_lab.cluster import LabError

#: Seconds between two reads of the cloud's route table.
POLL = 0.2


@dataclass(frozen=True)
class CloudArgs:
    address: str
    nodes: dict[int, str]
    network: str
    router_netns: str
    out: Path


def parse_args(prog: str, argv: list[str] | None) -> CloudArgs:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--address", required=True, help="where to serve (the router's)")
    parser.add_argument("--node", action="append", default=[], metavar="INDEX=ADDRESS")
    parser.add_argument("--network", required=True, help="the flannel Network")
    parser.add_argument("--router-netns", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    nodes = {int(index): address for index, _, address in
             (item.partition("=") for item in args.node)}
    return CloudArgs(args.address, nodes, args.network, args.router_netns, args.out)


def stop_on_sigterm() -> threading.Event:
    """An event SIGTERM sets."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    return stopping


def follow(router_netns: str, table: Callable[[], Mapping[str, str]],
           stopping: threading.Event, following: str,
           errors: tuple[type[Exception], ...] = ()) -> None:
    """Until ``stopping``, make ``router_netns`` route as ``table()`` says every ``POLL``
    seconds. A failure (``LabError``, ``OSError`` or one of ``errors``) is printed when it
    starts, and ``following`` when passes work again; the next poll tries again."""
    caught: tuple[type[Exception], ...] = (LabError, OSError, *errors)
    logged = ""
    while not stopping.wait(POLL):
        try:
            vpcrouter.sync(router_netns, table())
            failure = ""
        except caught as err:
            failure = str(err)
        if failure != logged:
            print(f"{time.strftime('%H:%M:%S')} VPC router: {failure or following}",
                  file=sys.stderr, flush=True)
            logged = failure
