"""The lab's Alibaba Cloud: the VPC API double, the metadata service, and the VPC router, in
one process that the lab runs inside its underlay namespace.

``python -m flannel.lab.alicloud --address A --node 1=192.168.111.11 ... --network N
--router-netns UL --out FILE`` builds a VPC with its vRouter and route table and one ECS
instance per node; serves the API double (``flannel.lab.aliyunapi``) and one metadata
service that answers each node as the instance at its address (as 100.100.100.200 answers
each instance); writes what the nodes' flanneld need (the API URL, the metadata URL, the
route table, the lab's access key) to FILE; then, until SIGTERM, makes the router
namespace's routes follow the route table (``vpcrouter``), polling it every 0.2 s.
Must not touch: any namespace but the router's; routes of other protocols.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from flannel.fileutil import write_atomic
from flannel.kernel.host import LOCAL, Host
from flannel.lab import vpcrouter
from flannel.lab.aliyunapi import FakeAliyunVpc
from flannel.lab.cluster import LabError
from flannel.lab.served import endpoint, serve, shut

REGION = "cn-hangzhou"
VPC = "vpc-bp1flannellab000001"
#: The lab's access key: the double accepts only this one.
LAB_KEY_ID = "LTAIflannelLabKey00001"
LAB_SECRET = "flannel-lab-not-a-secret"  # noqa: S105 - the lab double's own key
POLL = 0.2


def instance_id(index: int) -> str:
    return f"i-bp1flannellab{index:06d}"


def serve_metadata(address: str, by_client: dict[str, dict[str, str]], host: Host = LOCAL
                   ) -> ThreadingHTTPServer:
    """A metadata service in ``host``'s namespace answering ``GET /latest/meta-data/<path>``
    with the value for the asking node (``by_client``: by its source address); 404 for
    anything else."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            paths = by_client.get(self.client_address[0], {})
            prefix = "/latest/meta-data/"
            value = paths.get(self.path[len(prefix):]) if self.path.startswith(prefix) else None
            data = (value or "").encode()
            self.send_response(200 if value is not None else 404)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return serve(Handler, address, host)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flannel.lab.alicloud")
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
    api = FakeAliyunVpc({LAB_KEY_ID: LAB_SECRET}, region=REGION).start(args.address)
    table = api.add_vpc(VPC)[0]
    addresses = {instance_id(index): address for index, address in nodes.items()}
    api.instances.update(addresses)
    metadata = serve_metadata(args.address, {
        address: {"region-id": REGION, "instance-id": instance, "vpc-id": VPC}
        for instance, address in addresses.items()})
    try:
        write_atomic(args.out, json.dumps({
            "endpoint": f"http://{api.endpoint}", "metadata": f"http://{endpoint(metadata)}",
            "route_table": table, "key_id": LAB_KEY_ID, "secret": LAB_SECRET}).encode(),
            mode=0o644)
        logged = ""
        while not stopping.wait(POLL):
            try:
                vpcrouter.sync(args.router_netns,
                               vpcrouter.ali_table(api.entries(table), args.network, addresses))
                failure = ""
            except (LabError, OSError) as err:
                failure = str(err)  # reported, and the next poll tries again
            if failure != logged:
                print(f"{time.strftime('%H:%M:%S')} VPC router: "
                      f"{failure or 'following the route table again'}", file=sys.stderr,
                      flush=True)
                logged = failure
    finally:
        shut(metadata)
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
