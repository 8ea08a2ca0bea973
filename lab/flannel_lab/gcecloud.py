"""The lab's Compute Engine: the gce double (``flannel_lab.gceapi``), a metadata server per
node, and the VPC router, in one process that the lab runs inside its underlay namespace.

``python -m flannel_lab.gcecloud --address A --node 1=192.168.111.11 ... --network N
--router-netns UL --out FILE`` builds a project with one VPC network and one instance per node
at the node's address (IP forwarding on, as flannel needs); writes what the nodes' flanneld
need (the Compute API's URL, each node's metadata server as host:port) to FILE; then, until
SIGTERM, makes the router namespace's routes follow the network's routes (``vpcrouter``),
reading them every 0.2 s.
Must not touch: any namespace but the router's; routes of other protocols.
"""

from __future__ import annotations

import json
import sys

from flannel.files.fileutil import write_atomic
from flannel_lab import labcloud, vpcrouter
from flannel_lab.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

PROJECT = "flannel-lab"
ZONE = "europe-west1-b"
VPC = "flannel-lab-net"


def main(argv: list[str] | None = None) -> int:
    args = labcloud.parse_args("python -m flannel_lab.gcecloud", argv)
    stopping = labcloud.stop_on_sigterm()
    compute = FakeCompute(PROJECT).start(args.address)
    served: dict[int, FakeGceMetadata] = {}
    try:
        network = compute.add_network(VPC)
        for index, address in sorted(args.nodes.items()):
            name = f"node-{index}"
            compute.add_instance(ZONE, name, address=address, network=network)
            served[index] = FakeGceMetadata(
                compute, metadata_paths(compute, ZONE, name, VPC)).start(args.address)
        write_atomic(args.out, json.dumps({
            "compute_url": compute.url,
            "metadata": {str(i): m.host for i, m in served.items()}}).encode(), mode=0o644)
        labcloud.follow(args.router_netns,
                        lambda: vpcrouter.gce_table(*compute.table(), args.network),
                        stopping, "following the network routes again")
    finally:
        for metadata in served.values():
            metadata.stop()
        compute.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
