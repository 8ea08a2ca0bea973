"""The lab's AWS: moto's EC2 server, a fake instance metadata service per node, and the VPC
router, in one process that the lab runs inside its underlay namespace.

``python -m flannel_lab.awscloud --address A --node 1=192.168.111.11 ... --network N
--router-netns UL --out FILE`` builds a VPC holding a subnet per node /24, one route table
associated with them, and one instance per node at the node's address; writes what the nodes'
flanneld need (the EC2 URL, the route table, each node's metadata URL) to FILE; then, until
SIGTERM, makes the router namespace's routes follow the route table (``vpcrouter``), polling
it every 0.2 s. moto (PyPI ``moto[server]``, in the test extras) is needed only here.
Must not touch: any namespace but the router's; routes of other protocols.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from typing import Any

from flannel.files.fileutil import write_atomic
from flannel_lab import labcloud, vpcrouter
from flannel_lab.imds import FakeMetadata, aws_paths

REGION = "eu-west-1"
VPC_CIDR = "192.168.0.0/16"
#: Credentials the lab's nodes and moto use (moto accepts any).
LAB_KEY_ID = "AKIALABKEY0000000000"
LAB_SECRET = "flannel-lab-not-a-secret"  # noqa: S105 - moto accepts any key


def build_vpc(ec2: Any, nodes: dict[int, str], serve_at: str
              ) -> tuple[str, dict[int, FakeMetadata]]:
    """The VPC, its subnets and route table, an instance and a metadata service per node."""
    vpc = ec2.create_vpc(CidrBlock=VPC_CIDR)["Vpc"]["VpcId"]
    table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
    subnets: dict[str, str] = {}
    served: dict[int, FakeMetadata] = {}
    for index, address in sorted(nodes.items()):
        cidr = str(ipaddress.ip_network(f"{address}/24", strict=False))
        if cidr not in subnets:
            subnets[cidr] = ec2.create_subnet(VpcId=vpc, CidrBlock=cidr)["Subnet"]["SubnetId"]
            ec2.associate_route_table(RouteTableId=table, SubnetId=subnets[cidr])
        instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                     SubnetId=subnets[cidr],
                                     PrivateIpAddress=address)["Instances"][0]
        eni = instance["NetworkInterfaces"][0]
        served[index] = FakeMetadata(aws_paths(instance["InstanceId"], REGION, [
            {"mac": eni["MacAddress"], "ip": address, "eni": eni["NetworkInterfaceId"],
             "subnet": subnets[cidr], "vpc": vpc}]), mode="required").start(serve_at)
    return table, served


def main(argv: list[str] | None = None) -> int:
    args = labcloud.parse_args("python -m flannel_lab.awscloud", argv)
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"  # seconds per region, unused here
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
        from moto.server import ThreadedMotoServer
    except ImportError as err:
        print(f"the aws-vpc lab needs moto's EC2 server and boto3 ({err}): install "
              "'moto[server]' and boto3 (the project's test extras have both)", file=sys.stderr)
        return 1
    stopping = labcloud.stop_on_sigterm()
    moto = ThreadedMotoServer(ip_address=args.address, port=0, verbose=False)
    moto.start()
    try:
        host, port = moto.get_host_and_port()
        ec2_url = f"http://{host}:{port}"
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=ec2_url,
                           aws_access_key_id=LAB_KEY_ID, aws_secret_access_key=LAB_SECRET)
        table, served = build_vpc(ec2, args.nodes, args.address)
        write_atomic(args.out, json.dumps({
            "ec2_url": ec2_url, "route_table": table,
            "metadata": {str(i): m.url for i, m in served.items()}}).encode(), mode=0o644)
        labcloud.follow(args.router_netns, lambda: vpcrouter.aws_table(ec2, table, args.network),
                        stopping, "following the route table again", (BotoCoreError, ClientError))
        for metadata in served.values():
            metadata.stop()
    finally:
        moto.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
