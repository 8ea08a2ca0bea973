"""The lab's Compute Engine: the gce double (``flannel.lab.gceapi``), a metadata server per
node, and the VPC router, in one process that the lab runs inside its underlay namespace.

``python -m flannel.lab.gcecloud --address A --node 1=192.168.111.11 ... --network N
--router-netns UL --out FILE`` builds a project with one VPC network and one instance per node
at the node's address (IP forwarding on, as flannel needs); writes what the nodes' flanneld
need (the Compute API's URL, each node's metadata server as host:port) to FILE; then, until
SIGTERM, makes the router namespace's routes follow the network's routes (``vpcrouter``),
reading them every 0.2 s.
Must not touch: any namespace but the router's; routes of other protocols.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from flannel.fileutil import write_atomic
from flannel.lab import vpcrouter
from flannel.lab.cluster import LabError
from flannel.lab.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

PROJECT = "flannel-lab"
ZONE = "europe-west1-b"
VPC = "flannel-lab-net"
POLL = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flannel.lab.gcecloud")
    parser.add_argument("--address", required=True, help="where to serve (the router's)")
    parser.add_argument("--node", action="append", default=[], metavar="INDEX=ADDRESS")
    parser.add_argument("--network", required=True, help="the flannel Network")
    parser.add_argument("--router-netns", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    nodes = {int(index): address for index, _, address in
             (item.partition("=") for item in args.node)}
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    compute = FakeCompute(PROJECT).start(args.address)
    served: dict[int, FakeGceMetadata] = {}
    try:
        network = compute.add_network(VPC)
        for index, address in sorted(nodes.items()):
            name = f"node-{index}"
            compute.add_instance(ZONE, name, address=address, network=network)
            served[index] = FakeGceMetadata(
                compute, metadata_paths(compute, ZONE, name, VPC)).start(args.address)
        write_atomic(args.out, json.dumps({
            "compute_url": compute.url,
            "metadata": {str(i): m.host for i, m in served.items()}}).encode(), mode=0o644)
        logged = ""
        while not stopping.wait(POLL):
            try:
                vpcrouter.sync(args.router_netns, vpcrouter.gce_table(*compute.table(),
                                                                      args.network))
                failure = ""
            except (LabError, OSError) as err:
                failure = str(err)  # reported, and the next poll tries again
            if failure != logged:
                print(f"{time.strftime('%H:%M:%S')} VPC router: "
                      f"{failure or 'following the network routes again'}", file=sys.stderr,
                      flush=True)
                logged = failure
    finally:
        for metadata in served.values():
            metadata.stop()
        compute.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
