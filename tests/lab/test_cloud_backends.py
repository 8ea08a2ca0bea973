"""aws-vpc, tencent-vpc, ali-vpc and gce in a lab: real flanneld processes (real etcd, one
namespace per node) against moto's EC2 server (through the fault-injecting relay) with a fake
metadata service per node, or against the Tencent or Alibaba Cloud VPC API double, or the
Compute Engine double with a metadata server per node. The underlay namespace, every node's
default gateway, plays the VPC router: its routes follow the cloud's route table
(``flannel_lab.vpcrouter``), so pods reach each other only through the routes the backend
wrote. Checked: every node's route, blackholes removed at start, a route deleted in the
console repaired, a removed node's route collected, throttling retried, a full table
reported (and recovered from), credentials never in the logs (-v included). Also the lab's
aws-vpc, ali-vpc and gce modes (``flannel-lab up --backend aws-vpc`` / ``ali-vpc`` /
``gce``)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flannel.kernel.host import Host
from flannel_lab import vpcrouter
from flannel_lab.cluster import UNDERLAYS, Lab
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.netns, pytest.mark.etcd]

NETWORK = "10.244.0.0/16"
FLANNEL_LAB = str(Path(sys.executable).parent / "flannel-lab")
ROUTER = f"{UNDERLAYS[0][0]}.1"  # the underlay namespace's address on the nodes' bridge
REGION = "eu-west-1"
AWS_KEY_ID = "AKIAFLANNELLABKEY001"
AWS_SECRET = "flannel-lab-secret-never-logged-0123456789"
TC_KEY_ID = "AKIDflannelLabKey0001"
TC_SECRET = "flannel-lab-tencent-secret-never-logged"
ALI_KEY_ID = "LTAIflannelLabTestKey01"
ALI_SECRET = "flannel-lab-aliyun-secret-never-logged"
QUIET_AWS = {"AWS_EC2_METADATA_DISABLED": "true",  # credentials come from the environment
             "AWS_CONFIG_FILE": "/nonexistent/aws-config",
             "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials"}


def subnet(lab: Lab, index: int) -> str:
    return str(ipaddress.ip_network(lab.wait_subnet_env(index)["FLANNEL_SUBNET"],
                                    strict=False))


def assert_no_credentials(lab: Lab, nodes: list[int], *secrets: str) -> None:
    for index in nodes:
        log = lab.log(index)
        for secret in secrets:
            assert secret not in log, f"node {index} logged a credential"


def pods_connected(lab: Lab, nodes: list[int], wanted: dict[str, str]) -> bool:
    vpcrouter.sync(lab.underlay_ns, wanted)
    return all(lab.ping(src, dst) for src in nodes for dst in nodes if src != dst)


def assert_pods_connect(lab: Lab, nodes: list[int],
                        table: Callable[[], dict[str, str]]) -> None:
    """Pods on ``nodes`` reach each other once the VPC router follows ``table()``."""
    for index in nodes:
        lab.attach_pod_bridge(index)
    wait_until(lambda: pods_connected(lab, nodes, table()), 30,
               what="pods connected through the VPC router")


def assert_routes_repaired_collected_and_full(
        lab: Lab, routes: Callable[[], dict[str, str]], routed: Callable[[int], bool],
        delete: Callable[[str], None], limit: Callable[[bool], None],
        add_node: Callable[[int], None], full: Callable[[], str]) -> None:
    """With nodes 1 to 3 routed: node 2's route, deleted in the console, is put back; node 3
    leaves and its route is collected; node 4 joins a full table (``limit(True)``), logs
    ``full()`` and keeps running, then routes once there is room (``limit(False)``)."""
    delete(subnet(lab, 2))
    wait_until(lambda: routed(2), 20, what="node 2's route repaired")
    gone = subnet(lab, 3)
    lab.remove_node(3)
    wait_until(lambda: gone not in routes(), 20, what=f"{gone} collected")
    limit(True)
    add_node(4)
    message = full()
    wait_until(lambda: message in lab.log(4), 30, what=f"the full table in {lab.log(4)}")
    assert lab.flanneld_running(4)
    limit(False)
    wait_until(lambda: routed(4), 30, what="node 4's route once the table has room")
    wait_until(lambda: "reconcile recovered" in lab.log(4), 10, what="the recovery logged")


# --- aws-vpc ---------------------------------------------------------------------------


@pytest.fixture
def aws_env(monkeypatch) -> Iterator[None]:
    pytest.importorskip("moto")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    for name, value in QUIET_AWS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "HTTP_PROXY",
                 "http_proxy", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    yield


def test_aws_vpc_nodes_route_each_other_through_the_vpc_table(make_lab, aws_env):
    import boto3

    from tests.support.ec2faults import Ec2Relay
    from tests.support.imds import FakeMetadata, aws_paths

    lab = make_lab()
    lab.create_underlay()
    relay = Ec2Relay().start(ROUTER, Host(lab.underlay_ns))
    served: list[FakeMetadata] = []
    try:
        host, port = relay.moto.get_host_and_port()
        ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=f"http://{host}:{port}")
        vpc = ec2.create_vpc(CidrBlock="192.168.0.0/16")["Vpc"]["VpcId"]
        vpc_subnet = ec2.create_subnet(VpcId=vpc, CidrBlock=f"{UNDERLAYS[0][0]}.0/24")[
            "Subnet"]["SubnetId"]
        table = ec2.create_route_table(VpcId=vpc)["RouteTable"]["RouteTableId"]
        ec2.associate_route_table(RouteTableId=table, SubnetId=vpc_subnet)
        lab.put_config({"Network": NETWORK,
                        "Backend": {"Type": "aws-vpc", "RouteTableID": table}})
        enis: dict[int, str] = {}

        def add_node(index: int) -> None:
            node = lab.add_node(index)
            instance = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                         SubnetId=vpc_subnet,
                                         PrivateIpAddress=node.address)["Instances"][0]
            eni = instance["NetworkInterfaces"][0]
            enis[index] = eni["NetworkInterfaceId"]
            metadata = FakeMetadata(aws_paths(instance["InstanceId"], REGION, [
                {"mac": eni["MacAddress"], "ip": node.address, "eni": enis[index],
                 "subnet": vpc_subnet, "vpc": vpc}]), mode="required")
            served.append(metadata.start(ROUTER, Host(lab.underlay_ns)))
            # -v: debug logs too must hold no credential.
            lab.start_flanneld(index, "--reconcile-interval=1", "-v=2", env={
                **QUIET_AWS, "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_ENDPOINT_URL_EC2": relay.url,
                "AWS_EC2_METADATA_SERVICE_ENDPOINT": metadata.url})

        def routes() -> dict[str, str]:
            found = ec2.describe_route_tables(RouteTableIds=[table])["RouteTables"][0]
            return {r["DestinationCidrBlock"]: r.get("NetworkInterfaceId", "")
                    for r in found["Routes"]}

        def routed(index: int) -> bool:
            return routes().get(subnet(lab, index)) == enis[index]

        # A route left by an instance that is gone (EC2 shows it as a blackhole).
        dead = ec2.create_network_interface(SubnetId=vpc_subnet)["NetworkInterface"][
            "NetworkInterfaceId"]
        ec2.create_route(RouteTableId=table, DestinationCidrBlock="10.244.250.0/24",
                         NetworkInterfaceId=dead)
        relay.gone_targets.add(dead)
        # The first node's first CreateRoute calls are throttled: retried with backoff.
        relay.fail("CreateRoute", "RequestLimitExceeded", times=2, status=503)
        add_node(1)
        wait_until(lambda: routed(1), 30, what=f"node 1's route in {table}: {lab.log(1)}")
        # The blackhole went at start, before our route was made (not as a lease-less route).
        log = lab.log(1)
        cleaned = log.find(f"aws-vpc: delete 10.244.250.0/24 -> {dead} in {table}")
        assert -1 < cleaned < log.find(f"aws-vpc: create {subnet(lab, 1)} -> {enis[1]}"), log
        assert "10.244.250.0/24" not in routes()
        assert lab.log(1).count("EC2 CreateRoute throttled (RequestLimitExceeded); "
                                "retrying in") == 2
        for index in (2, 3):
            add_node(index)
        wait_until(lambda: routed(2) and routed(3), 30, what="the routes of nodes 2 and 3")
        nodes = [1, 2, 3]
        for index in nodes:
            eni = ec2.describe_network_interfaces(NetworkInterfaceIds=[enis[index]])
            assert eni["NetworkInterfaces"][0]["SourceDestCheck"] is False

        def table_routes() -> dict[str, str]:
            return vpcrouter.aws_table(ec2, table, NETWORK)

        assert_pods_connect(lab, nodes, table_routes)

        # Deleted in the console: the owner's next periodic pass puts it back.
        ec2.delete_route(RouteTableId=table, DestinationCidrBlock=subnet(lab, 2))
        wait_until(lambda: routed(2), 20, what="node 2's route repaired")
        assert f"aws-vpc: create {subnet(lab, 2)} -> {enis[2]} in {table}" in lab.log(2)

        # A node leaves (its lease is deleted): the others collect its route.
        gone = subnet(lab, 3)
        lab.remove_node(3)
        nodes = [1, 2]
        wait_until(lambda: gone not in routes(), 20,
                   what=f"{gone} collected: {lab.log(1)[-3000:]}")
        wait_until(lambda: pods_connected(lab, nodes, table_routes()), 20,
                   what="pods still connected")

        # A full table: the newcomer says so, keeps running, and recovers once there is room.
        relay.route_limit = len(routes())
        add_node(4)
        full = (f"reconcile failed (retrying with backoff): aws-vpc routes: route table "
                f"{table} is full: EC2 refused the route for {subnet(lab, 4)}")
        wait_until(lambda: full in lab.log(4), 30, what=f"the full table in {lab.log(4)}")
        assert "RouteLimitExceeded" in lab.log(4) and lab.flanneld_running(4)
        assert not routed(4)
        relay.route_limit = None
        wait_until(lambda: routed(4), 30, what="node 4's route once the table has room")
        wait_until(lambda: "reconcile recovered" in lab.log(4), 10, what="the recovery logged")
        assert_no_credentials(lab, [1, 2, 4], AWS_KEY_ID, AWS_SECRET)
    finally:
        lab.down()
        for metadata in served:
            metadata.stop()
        relay.stop()


# --- tencent-vpc -----------------------------------------------------------------------


def test_tencent_vpc_nodes_route_each_other_through_the_vpc_table(make_lab, no_proxy):
    pytest.importorskip("tencentcloud.vpc")
    from tests.support.imds import FakeMetadata
    from tests.support.tencentapi import FakeTencentVpc

    lab = make_lab()
    lab.create_underlay()
    api = FakeTencentVpc({TC_KEY_ID: TC_SECRET}).start(ROUTER, Host(lab.underlay_ns))
    mac = "52:54:00:ab:cd:ef"
    metadata = FakeMetadata({"placement/region": "ap-guangzhou", "mac": mac,
                             f"network/interfaces/macs/{mac}/vpc-id": "vpc-2flannel"},
                            mode="v1-only").start(ROUTER, Host(lab.underlay_ns))
    try:
        table = api.add_table("vpc-2flannel", main=True)
        api.add_table("vpc-2flannel")
        lab.put_config({"Network": NETWORK, "Backend": {
            "Type": "tencent-vpc", "Endpoint": f"http://{api.endpoint}",
            "MetadataURL": metadata.url}})
        env = {"ACCESS_KEY_ID": TC_KEY_ID, "ACCESS_KEY_SECRET": TC_SECRET}

        def routes() -> dict[str, str]:
            return {r["DestinationCidrBlock"]: r["GatewayId"] for r in api.routes(table)}

        def routed(index: int) -> bool:
            return routes().get(subnet(lab, index)) == lab.node(index).address

        api.fail("CreateRoutes", "RequestLimitExceeded", times=2)
        for index in (1, 2, 3):
            lab.add_node(index)
            lab.start_flanneld(index, "--reconcile-interval=1", "-v=2", env=env)
        nodes = [1, 2, 3]
        wait_until(lambda: all(routed(i) for i in nodes), 30, what="every node's route")
        assert sum(lab.log(i).count("Tencent VPC CreateRoutes throttled "
                                    "(RequestLimitExceeded); retrying in") for i in nodes) == 2
        assert_pods_connect(lab, nodes,
                            lambda: vpcrouter.tencent_table(api.routes(table), NETWORK))

        def limit(full: bool) -> None:
            api.route_limit = len(routes()) if full else None

        def add_node(index: int) -> None:
            lab.add_node(index)
            lab.start_flanneld(index, "--reconcile-interval=1", env=env)

        assert_routes_repaired_collected_and_full(
            lab, routes, routed, lambda destination: api.delete_route(table, destination),
            limit, add_node,
            lambda: (f"reconcile failed (retrying with backoff): tencent-vpc routes: route "
                     f"table {table} is full: Tencent Cloud refused the route for "
                     f"{subnet(lab, 4)} (LimitExceeded)"))
        assert_no_credentials(lab, [1, 2, 4], TC_SECRET)
    finally:
        lab.down()
        metadata.stop()
        api.stop()


# --- ali-vpc ---------------------------------------------------------------------------


def test_ali_vpc_nodes_route_each_other_through_the_vpc_table(make_lab, no_proxy):
    from flannel_lab.alicloud import REGION as ALI_REGION
    from flannel_lab.alicloud import instance_id
    from tests.support.aliyunapi import FakeAliyunMetadata, FakeAliyunVpc

    lab = make_lab()
    lab.create_underlay()
    api = FakeAliyunVpc({ALI_KEY_ID: ALI_SECRET}, region=ALI_REGION).start(
        ROUTER, Host(lab.underlay_ns))
    vpc = "vpc-bp1flannellabtest01"
    by_node: dict[str, dict[str, str]] = {}  # the metadata service answers each node's own
    metadata = FakeAliyunMetadata(by_node, enforced=True).start(ROUTER, Host(lab.underlay_ns))
    try:
        table = api.add_vpc(vpc, tables=2)[0]
        lab.put_config({"Network": NETWORK, "Backend": {
            "Type": "ali-vpc", "Endpoint": f"http://{api.endpoint}",
            "MetadataURL": metadata.url}})
        env = {"ACCESS_KEY_ID": ALI_KEY_ID, "ACCESS_KEY_SECRET": ALI_SECRET}
        addresses: dict[str, str] = {}

        def add(index: int) -> None:
            lab.add_node(index)
            instance = instance_id(index)
            addresses[instance] = lab.node(index).address
            api.instances.add(instance)
            by_node[lab.node(index).address] = {"region-id": ALI_REGION, "vpc-id": vpc,
                                                "instance-id": instance}

        def entries() -> dict[str, str]:
            return {e["DestinationCidrBlock"]: e["InstanceId"] for e in api.entries(table)
                    if e["Type"] == "Custom"}

        def routed(index: int) -> bool:
            return entries().get(subnet(lab, index)) == instance_id(index)

        api.fail("CreateRouteEntry", "Throttling.User", times=2)
        for index in (1, 2, 3):
            add(index)
            lab.start_flanneld(index, "--reconcile-interval=1", "-v=10", env=env)
        nodes = [1, 2, 3]
        wait_until(lambda: all(routed(i) for i in nodes), 30, what="every node's entry")
        assert sum(lab.log(i).count("Alibaba Cloud VPC CreateRouteEntry throttled "
                                    "(Throttling.User); retrying in") for i in nodes) == 2
        assert_pods_connect(lab, nodes,
                            lambda: vpcrouter.ali_table(api.entries(table), NETWORK, addresses))

        def limit(full: bool) -> None:
            api.entry_limit = len(entries()) if full else None

        def add_node(index: int) -> None:
            add(index)
            lab.start_flanneld(index, "--reconcile-interval=1", env=env)

        assert_routes_repaired_collected_and_full(
            lab, entries, routed, lambda destination: api.delete_entry(table, destination),
            limit, add_node,
            lambda: (f"reconcile failed (retrying with backoff): ali-vpc routes: route table "
                     f"{table} is full: Alibaba Cloud refused the entry for {subnet(lab, 4)} "
                     "(QuotaExceeded)"))
        assert_no_credentials(lab, [1, 2, 4], ALI_SECRET)

        # A wrong secret: the node stops at start, saying what to check, without a traceback.
        wrong = "not-the-lab-secret-0000"
        add(5)
        lab.start_flanneld(5, env={"ACCESS_KEY_ID": ALI_KEY_ID, "ACCESS_KEY_SECRET": wrong})
        wait_until(lambda: not lab.flanneld_running(5), 30, what="node 5 stopping")
        log = lab.log(5)
        assert ("ali-vpc backend: Alibaba Cloud VPC DescribeVpcs failed: SignatureDoesNotMatch: "
                "Specified signature is not matched with our calculation. (check "
                "AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)") in log, log
        assert "Traceback" not in log and wrong not in log
    finally:
        lab.down()
        metadata.stop()
        api.stop()


# --- gce -------------------------------------------------------------------------------


def test_gce_nodes_route_each_other_through_the_network_routes(make_lab, no_proxy):
    from flannel.cloud.gce import route_name
    from tests.support.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

    lab = make_lab()
    lab.create_underlay()
    compute = FakeCompute("flannel-lab-test").start(ROUTER, Host(lab.underlay_ns))
    served: list[FakeGceMetadata] = []
    try:
        network = compute.add_network("lab-net")
        lab.put_config({"Network": NETWORK, "Backend": {"Type": "gce",
                                                        "Endpoint": compute.url}})

        def add_node(index: int) -> None:
            node = lab.add_node(index)
            compute.add_instance("europe-west1-b", f"node-{index}", address=node.address,
                                 network=network)
            metadata = FakeGceMetadata(compute, metadata_paths(
                compute, "europe-west1-b", f"node-{index}", "lab-net"))
            served.append(metadata.start(ROUTER, Host(lab.underlay_ns)))
            # -v: debug logs too must hold no token.
            lab.start_flanneld(index, "--reconcile-interval=1", "-v=2",
                               env={"GCE_METADATA_HOST": metadata.host})

        def routes() -> dict[str, str]:
            return {r["destRange"]: r["nextHopInstance"].rsplit("/", 1)[-1]
                    for r in compute.table()[0]}

        def routed(index: int) -> bool:
            return routes().get(subnet(lab, index)) == f"node-{index}"

        compute.fail("routes.insert", 429, "rateLimitExceeded", times=2)
        nodes = [1, 2, 3]
        for index in nodes:
            add_node(index)
        wait_until(lambda: all(routed(i) for i in nodes), 30, what="every node's route")
        assert sum(lab.log(i).count("Compute Engine routes.insert throttled "
                                    "(rateLimitExceeded); retrying in") for i in nodes) == 2
        assert_pods_connect(lab, nodes, lambda: vpcrouter.gce_table(*compute.table(), NETWORK))

        def limit(full: bool) -> None:
            compute.route_limit = len(compute.routes) if full else None

        assert_routes_repaired_collected_and_full(
            lab, routes, routed,
            lambda destination: compute.delete_route(
                route_name(ipaddress.IPv4Network(destination))),
            limit, add_node,
            lambda: ("reconcile failed (retrying with backoff): gce routes: route limit "
                     f"reached: project flannel-lab-test refused the route for "
                     f"{subnet(lab, 4)} in network flannel-lab-test/lab-net ("))
        assert_no_credentials(lab, [1, 2, 4], *compute.tokens)
    finally:
        lab.down()
        for metadata in served:
            metadata.stop()
        compute.stop()


# --- the lab's cloud modes --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["aws-vpc", "ali-vpc", "gce"])
def test_lab_up_with_a_cloud_backend_connects_pods_through_the_vpc_router(make_lab, backend):
    if backend == "aws-vpc":
        pytest.importorskip("moto")
    lab = make_lab()

    def lab_cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([FLANNEL_LAB, "--root", str(lab.directory.parent), argv[0],
                               "--name", lab.name, *argv[1:]], capture_output=True, text=True,
                              timeout=300, check=False)

    up = lab_cli("up", "--backend", backend, "--nodes", "3", "--pods-per-node", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"==> lab {lab.name} is up: 3 nodes, every pair connected" in up.stdout
    recorded = Lab(lab.name, root=lab.directory.parent)
    cloud_pid = recorded.state.cloud_pid
    assert cloud_pid and Path(f"/proc/{cloud_pid}").exists()
    subnets = {str(ipaddress.ip_network(recorded.wait_subnet_env(i)["FLANNEL_SUBNET"],
                                        strict=False)): recorded.node(i).address
               for i in (1, 2, 3)}
    # The router's routes are the cloud's route table, which only the backends wrote.
    assert vpcrouter.installed(recorded.underlay_ns) == subnets
    ping = lab_cli("ping")
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert "IPv4 pod ping matrix:" in ping.stdout and "FAIL" not in ping.stdout
    status = lab_cli("status")
    for destination, via in subnets.items():
        assert f"  {destination} via {via}" in status.stdout
    down = lab_cli("down")
    assert down.returncode == 0, down.stderr
    wait_until(lambda: not Path(f"/proc/{cloud_pid}").exists(), 10, what="the cloud stopped")
