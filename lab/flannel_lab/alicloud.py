"""The lab's Alibaba Cloud: the VPC API double, the metadata service, and the VPC router, in
one process that the lab runs inside its underlay namespace.

``python -m flannel_lab.alicloud --address A --node 1=192.168.111.11 ... --network N
--router-netns UL --out FILE`` builds a VPC with its vRouter and route table and one ECS
instance per node; serves the API double and one metadata service
(``flannel_lab.aliyunapi``, in enforced hardened mode) that answers each node as the
instance at its address (as 100.100.100.200 answers each instance); writes what the nodes'
flanneld need (the API URL, the metadata URL, the route table, the lab's access key) to
FILE; then, until SIGTERM, makes the router namespace's routes follow the route table
(``vpcrouter``), polling it every 0.2 s.
Must not touch: any namespace but the router's; routes of other protocols.
"""

from __future__ import annotations

import json
import sys

from flannel.files.fileutil import write_atomic
from flannel_lab import labcloud, vpcrouter
from flannel_lab.aliyunapi import FakeAliyunMetadata, FakeAliyunVpc

REGION = "cn-hangzhou"
VPC = "vpc-bp1flannellab000001"
#: The lab's access key: the double accepts only this one.
LAB_KEY_ID = "LTAIflannelLabKey00001"
LAB_SECRET = "flannel-lab-not-a-secret"  # noqa: S105 - the lab double's own key


def instance_id(index: int) -> str:
    return f"i-bp1flannellab{index:06d}"


def main(argv: list[str] | None = None) -> int:
    args = labcloud.parse_args("python -m flannel_lab.alicloud", argv)
    stopping = labcloud.stop_on_sigterm()
    api = FakeAliyunVpc({LAB_KEY_ID: LAB_SECRET}, region=REGION).start(args.address)
    table = api.add_vpc(VPC)[0]
    addresses = {instance_id(index): address for index, address in args.nodes.items()}
    api.instances.update(addresses)
    metadata = FakeAliyunMetadata({
        address: {"region-id": REGION, "instance-id": instance, "vpc-id": VPC}
        for instance, address in addresses.items()}, enforced=True).start(args.address)
    try:
        write_atomic(args.out, json.dumps({
            "endpoint": f"http://{api.endpoint}", "metadata": metadata.url,
            "route_table": table, "key_id": LAB_KEY_ID, "secret": LAB_SECRET}).encode(),
            mode=0o644)
        labcloud.follow(
            args.router_netns,
            lambda: vpcrouter.ali_table(api.entries(table), args.network, addresses),
            stopping, "following the route table again")
    finally:
        metadata.stop()
        api.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
