"""The aws-vpc route engine against moto's EC2 server (through a fault-injecting relay) and
a fake instance metadata service: several nodes, repair, garbage collection, blackholes,
throttling, the route quota, IMDSv2/v1, credentials kept out of the logs, and EC2 answering
as a broken or compromised server would (a dripping answer cut at its deadline and at once
when flanneld stops, answers over their bytes or tags refused, redirects never followed)."""

from __future__ import annotations

import logging
import time
from ipaddress import IPv4Address

import boto3
import botocore.loaders
import botocore.session
import pytest

from flannel.backendconf.errors import BackendConfigError
from flannel.cloud import awsvpc
from flannel.cloud.awsvpc import MARK, AwsVpcConfig, AwsVpcRoutes
from flannel.cloud.base import CloudError, RouteChange, ThrottleRetry
from flannel.cloud.metadata import MetadataClient
from flannel_lab import hostile
from tests.support.cloudengines import (
    NETWORK,
    SUBNETS,
    lease,
    redirected_pass,
    stop_while_asking,
)
from tests.support.ec2faults import Ec2Relay
from tests.support.imds import FakeMetadata, aws_paths

pytestmark = pytest.mark.cloud

REGION = "eu-west-1"
KEY_ID = "AKIAFLANNELTESTKEY01"
SECRET = "flannel-test-secret-never-logged-0123456789"
FAST = ThrottleRetry(attempts=6, base=0.01, cap=0.05)


@pytest.fixture(scope="module")
def moto_relay():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        patch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # boto3 must never try 169.254.
        patch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
        # moto's catalogue of public AMIs costs seconds per region and no test needs it.
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "HTTP_PROXY",
                     "http_proxy"):
            patch.delenv(name, raising=False)
        # Each engine makes a boto3 session of its own, whose loader would parse the EC2 model
        # again (a quarter of a second of CPU each time): the module's sessions share one
        # loader, as the clients of one session do.
        loader = botocore.loaders.create_loader()
        patch.setattr(botocore.session, "create_loader", lambda *_: loader)
        started = Ec2Relay().start()
        yield started
        started.stop()


@pytest.fixture
def relay(moto_relay):
    moto_relay.reset()  # no faults left over; each test makes its own VPC
    return moto_relay


class Vpc:
    """A VPC in moto with one subnet, its own route table, and instances as nodes."""

    def __init__(self, relay: Ec2Relay) -> None:
        host, port = relay.moto.get_host_and_port()
        self.relay = relay
        self.ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=f"http://{host}:{port}")
        self.vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
        self.subnet = self.ec2.create_subnet(VpcId=self.vpc, CidrBlock="10.0.1.0/24")[
            "Subnet"]["SubnetId"]
        self.table = self.ec2.create_route_table(VpcId=self.vpc)["RouteTable"]["RouteTableId"]
        self.ec2.associate_route_table(RouteTableId=self.table, SubnetId=self.subnet)
        self.igw = self.ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
        self.ec2.attach_internet_gateway(InternetGatewayId=self.igw, VpcId=self.vpc)
        self.metadata: list[FakeMetadata] = []

    def node(self, mode: str = "optional") -> tuple[FakeMetadata, dict[str, str]]:
        instance = self.ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1,
                                          SubnetId=self.subnet)["Instances"][0]
        interface = instance["NetworkInterfaces"][0]
        info = {"instance": instance["InstanceId"], "eni": interface["NetworkInterfaceId"],
                "ip": interface["PrivateIpAddress"], "mac": interface["MacAddress"]}
        fake = FakeMetadata(aws_paths(info["instance"], REGION, [
            {"mac": info["mac"], "ip": info["ip"], "eni": info["eni"],
             "subnet": self.subnet, "vpc": self.vpc}]), mode).start()
        self.metadata.append(fake)
        return fake, info

    def engine(self, fake: FakeMetadata, info: dict[str, str], backend: dict | None = None,
               backoff: ThrottleRetry = FAST) -> AwsVpcRoutes:
        config = AwsVpcConfig.from_backend(backend if backend is not None else
                                           {"RouteTableID": self.table},
                                           NETWORK, IPv4Address(info["ip"]))
        return AwsVpcRoutes(config, MetadataClient(fake.url, token=True),
                            endpoint_url=self.relay.url, backoff=backoff)

    def routes(self, table: str | None = None) -> dict[str, str]:
        """destination -> target of the table's routes, as the console shows them."""
        found = self.ec2.describe_route_tables(RouteTableIds=[table or self.table])
        return {route["DestinationCidrBlock"]: route.get("NetworkInterfaceId")
                or route.get("GatewayId") or route.get("InstanceId", "")
                for route in found["RouteTables"][0]["Routes"]}

    def close(self) -> None:
        for fake in self.metadata:
            fake.stop()


@pytest.fixture
def vpc(relay):
    made = Vpc(relay)
    yield made
    made.close()


def three_nodes(vpc: Vpc) -> list[tuple[AwsVpcRoutes, dict[str, str]]]:
    nodes = []
    for _ in SUBNETS:
        fake, info = vpc.node()
        nodes.append((vpc.engine(fake, info), info))
    return nodes


def reconcile_all(nodes, subnets=SUBNETS):
    leases = [lease(cidr) for cidr in subnets]
    return [engine.reconcile(leases[i], leases[:i] + leases[i + 1:])
            for i, (engine, _) in enumerate(nodes)]


def test_each_node_routes_its_subnet_to_its_eni(vpc, caplog):
    caplog.set_level(logging.DEBUG)
    nodes = three_nodes(vpc)
    for engine, _ in nodes:
        assert engine.prepare() == []
    changes = reconcile_all(nodes)
    assert [[str(c) for c in node_changes] for node_changes in changes] == [
        [f"create {cidr} -> {info['eni']} in {vpc.table}"]
        for cidr, (_, info) in zip(SUBNETS, nodes, strict=True)]
    routes = vpc.routes()
    for cidr, (_, info) in zip(SUBNETS, nodes, strict=True):
        assert routes[cidr] == info["eni"]
        eni = vpc.ec2.describe_network_interfaces(NetworkInterfaceIds=[info["eni"]])
        assert eni["NetworkInterfaces"][0]["SourceDestCheck"] is False
    # A second pass changes nothing: reconciliation is idempotent.
    assert reconcile_all(nodes) == [[], [], []]
    status = nodes[0][0].status()
    assert status.healthy and status.tables == [vpc.table] and status.target == nodes[0][1]["eni"]
    # The secret never reaches any log (ours or the SDK's debug output); nor does the key ID
    # reach ours.
    assert SECRET not in caplog.text
    assert not [r for r in caplog.records
                if r.name.startswith("flannel") and KEY_ID in r.getMessage()]


def test_route_deleted_or_redirected_in_the_console_is_repaired(vpc):
    nodes = three_nodes(vpc)
    for engine, _ in nodes:
        engine.prepare()
    reconcile_all(nodes)
    vpc.ec2.delete_route(RouteTableId=vpc.table, DestinationCidrBlock=SUBNETS[1])
    vpc.ec2.replace_route(RouteTableId=vpc.table, DestinationCidrBlock=SUBNETS[2],
                          NetworkInterfaceId=nodes[0][1]["eni"])
    changes = reconcile_all(nodes)
    assert [str(c) for c in changes[1]] == [
        f"create {SUBNETS[1]} -> {nodes[1][1]['eni']} in {vpc.table}"]
    assert [str(c) for c in changes[2]] == [
        f"replace {SUBNETS[2]} -> {nodes[2][1]['eni']} in {vpc.table}"]
    routes = vpc.routes()
    assert [routes[cidr] for cidr in SUBNETS] == [info["eni"] for _, info in nodes]


def test_routes_of_vanished_leases_are_collected_and_foreign_routes_kept(vpc):
    (engine, info), (_, other), (_, admins) = three_nodes(vpc)
    engine.prepare()
    # The node that held 10.244.9.0/24 tagged its ENI so; an admin's instance is untagged.
    vpc.ec2.create_tags(Resources=[other["eni"]], Tags=[{"Key": MARK,
                                                         "Value": "10.244.9.0/24"}])
    foreign = {"0.0.0.0/0": vpc.igw, "192.168.7.0/24": other["eni"], "10.244.0.0/16":
               other["eni"], "10.244.50.0/24": vpc.igw,
               # Not flannel's: an admin's instance route, and a route to a flannel node
               # for a subnet its tag does not name.
               "10.244.5.0/24": admins["eni"], "10.244.6.0/24": other["eni"]}
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock="0.0.0.0/0",
                         GatewayId=vpc.igw)
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock="10.244.50.0/24",
                         GatewayId=vpc.igw)
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock="10.244.5.0/24",
                         NetworkInterfaceId=admins["eni"])
    for cidr in ("192.168.7.0/24", "10.244.0.0/16", "10.244.9.0/24", "10.244.6.0/24",
                 SUBNETS[1]):
        vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock=cidr,
                             NetworkInterfaceId=other["eni"])
    # Lease 10.244.9.0/24 is gone; SUBNETS[1] is still a live peer's. A route without a lease
    # goes when a second pass in a row finds it so: a node that has just joined may route its
    # subnet before our lease snapshot shows its lease.
    assert [str(c) for c in engine.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])])] == [
        f"create {SUBNETS[0]} -> {info['eni']} in {vpc.table}"]
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock=SUBNETS[2],
                         NetworkInterfaceId=other["eni"])  # a newcomer, its lease not seen yet
    assert engine.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])]) == [
        RouteChange("delete", vpc.table, "10.244.9.0/24", other["eni"])]
    assert engine.reconcile(lease(SUBNETS[0]), [lease(s) for s in SUBNETS[1:]]) == []
    routes = vpc.routes()
    assert "10.244.9.0/24" not in routes
    # Our own route is marked the same way, for the other nodes.
    tags = vpc.ec2.describe_network_interfaces(NetworkInterfaceIds=[info["eni"]])[
        "NetworkInterfaces"][0]["TagSet"]
    assert {"Key": MARK, "Value": SUBNETS[0]} in tags
    assert routes[SUBNETS[1]] == routes[SUBNETS[2]] == other["eni"]
    for cidr, target in foreign.items():
        assert routes[cidr] == target


def test_blackholes_inside_the_network_are_removed_at_start(vpc):
    fake, info = vpc.node()
    _, dead = vpc.node()
    for cidr in ("10.244.7.0/24", "172.16.0.0/24"):
        vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock=cidr,
                             NetworkInterfaceId=dead["eni"])
    vpc.relay.gone_targets.add(dead["eni"])  # the instance was terminated: EC2 says blackhole
    engine = vpc.engine(fake, info)
    assert [str(c) for c in engine.prepare()] == [
        f"delete 10.244.7.0/24 -> {dead['eni']} in {vpc.table}"]
    routes = vpc.routes()
    assert "10.244.7.0/24" not in routes and routes["172.16.0.0/24"] == dead["eni"]


def test_throttled_calls_are_retried_with_backoff(vpc, caplog):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info)
    engine.prepare()
    vpc.relay.fail("CreateRoute", "RequestLimitExceeded", times=3, status=503)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        changes = engine.reconcile(lease(SUBNETS[0]), [])
    assert [c.action for c in changes] == ["create"]
    assert vpc.relay.count("CreateRoute") == 4
    retries = [r.getMessage() for r in caplog.records if "throttled" in r.getMessage()]
    assert len(retries) == 3
    assert retries[0].startswith("EC2 CreateRoute throttled (RequestLimitExceeded); retrying in")
    assert vpc.routes()[SUBNETS[0]] == info["eni"]


def test_a_data_plane_pass_never_waits_out_throttling(vpc, caplog):
    from flannel.backend.cloudroutes import CloudRoutes

    fake, info = vpc.node()
    engine = vpc.engine(fake, info)
    engine._sleep = lambda seconds: pytest.fail(f"the pass slept {seconds}s in the worker")
    engine.prepare()
    routes = CloudRoutes("aws-vpc routes", engine, lease(SUBNETS[0]))
    vpc.relay.fail("CreateRoute", "RequestLimitExceeded", times=1, status=503)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        failed = routes.apply([])
    # One call, then the pass fails: the data plane retries it with its backoff.
    assert vpc.relay.count("CreateRoute") == 1
    assert failed.error == ("EC2 CreateRoute: the cloud API is throttling "
                            "(RequestLimitExceeded); the pass is retried with backoff")
    assert SUBNETS[0] not in vpc.routes()
    assert routes.apply([]).changes == 1  # the retry
    assert vpc.routes()[SUBNETS[0]] == info["eni"]
    # Out of a pass (at start), throttling is still waited out with the engine's backoff.
    vpc.relay.fail("ReplaceRoute", "RequestLimitExceeded", times=1, status=503)
    elsewhere = vpc.node()[1]["eni"]  # another flannel node's
    vpc.ec2.create_tags(Resources=[elsewhere], Tags=[{"Key": MARK, "Value": SUBNETS[1]}])
    vpc.ec2.replace_route(RouteTableId=vpc.table, DestinationCidrBlock=SUBNETS[0],
                          NetworkInterfaceId=elsewhere)
    waits: list[float] = []
    engine._sleep = waits.append
    assert [c.action for c in engine.reconcile(lease(SUBNETS[0]), [])] == ["replace"]
    assert len(waits) == 1 and 0 <= waits[0] <= FAST.cap


def test_persistent_throttling_fails_the_pass_with_a_clear_error(vpc):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info, backoff=ThrottleRetry(attempts=3, base=0.01, cap=0.02))
    engine.prepare()
    vpc.relay.fail("DescribeRouteTables", "RequestLimitExceeded", times=3, status=503)
    with pytest.raises(CloudError) as raised:
        engine.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value).startswith(
        "EC2 DescribeRouteTables: the cloud API kept throttling (RequestLimitExceeded) "
        "after 3 attempts")
    assert engine.status().last_error == str(raised.value)
    engine.reconcile(lease(SUBNETS[0]), [])  # the next pass succeeds
    assert engine.status().healthy


def test_full_route_table_is_reported_clearly(vpc):
    nodes = three_nodes(vpc)
    for engine, _ in nodes:
        engine.prepare()
    reconcile_all(nodes[:2], SUBNETS[:2])
    vpc.relay.route_limit = len(vpc.routes())  # the table is now at its quota
    engine = nodes[2][0]
    with pytest.raises(CloudError) as raised:
        engine.reconcile(lease(SUBNETS[2]), [lease(s) for s in SUBNETS[:2]])
    assert str(raised.value) == (
        f"route table {vpc.table} is full: EC2 refused the route for {SUBNETS[2]} "
        "(RouteLimitExceeded; a VPC route table holds 50 routes by default). Raise the "
        "'Routes per route table' quota in Service Quotas (Amazon VPC), or use a backend that "
        "needs no route per node (vxlan)")
    assert not engine.status().healthy


def test_source_dest_check_refused_is_a_warning_naming_the_permission(vpc, caplog):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info)
    vpc.relay.fail("ModifyNetworkInterfaceAttribute", "UnauthorizedOperation", times=1,
                   status=403, message="You are not authorized to perform this operation.")
    with caplog.at_level(logging.WARNING, logger="flannel"):
        engine.prepare()
    engine.reconcile(lease(SUBNETS[0]), [])
    warnings = engine.status().warnings
    assert len(warnings) == 1
    assert "ec2:ModifyNetworkInterfaceAttribute" in warnings[0]
    assert warnings[0].startswith(f"could not disable SourceDestCheck on {info['eni']}")
    assert any(warnings[0] in r.getMessage() for r in caplog.records)
    assert vpc.routes()[SUBNETS[0]] == info["eni"]


def test_missing_permission_names_it(vpc):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info)
    engine.prepare()
    vpc.relay.fail("CreateRoute", "UnauthorizedOperation", times=1, status=403,
                   message="You are not authorized to perform this operation.")
    with pytest.raises(CloudError, match=r"the node's IAM role needs the permission "
                                         r"ec2:CreateRoute"):
        engine.reconcile(lease(SUBNETS[0]), [])


def test_route_table_discovered_from_subnet_then_main_table(vpc):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info, backend={})
    engine.prepare()
    assert engine.tables == (vpc.table,)
    # Without an association for the node's subnet, the VPC's main table is used.
    association = next(a["RouteTableAssociationId"] for a in vpc.ec2.describe_route_tables(
        RouteTableIds=[vpc.table])["RouteTables"][0]["Associations"])
    vpc.ec2.disassociate_route_table(AssociationId=association)
    main = vpc.ec2.describe_route_tables(Filters=[
        {"Name": "vpc-id", "Values": [vpc.vpc]},
        {"Name": "association.main", "Values": ["true"]}])["RouteTables"][0]["RouteTableId"]
    engine = vpc.engine(fake, info, backend={})
    engine.prepare()
    assert engine.tables == (main,)
    engine.reconcile(lease(SUBNETS[0]), [])
    assert vpc.routes(main)[SUBNETS[0]] == info["eni"]


def test_several_route_tables_all_get_the_route(vpc):
    second = vpc.ec2.create_route_table(VpcId=vpc.vpc)["RouteTable"]["RouteTableId"]
    fake, info = vpc.node()
    engine = vpc.engine(fake, info, backend={"routeTableID": [vpc.table, second]})
    engine.prepare()
    engine.reconcile(lease(SUBNETS[0]), [])
    assert vpc.routes()[SUBNETS[0]] == vpc.routes(second)[SUBNETS[0]] == info["eni"]


def test_unknown_route_table_is_reported(vpc):
    fake, info = vpc.node()
    engine = vpc.engine(fake, info, backend={"RouteTableID": "rtb-0123456789abcdef0"})
    with pytest.raises(CloudError, match=r"check Backend.RouteTableID \(rtb-0123456789abcdef0\)"):
        engine.prepare()


@pytest.mark.parametrize("mode", ["required", "v1-only"])
def test_metadata_v2_tokens_and_v1_fallback(vpc, mode, caplog):
    fake, info = vpc.node(mode=mode)
    engine = vpc.engine(fake, info)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        engine.prepare()
    assert engine.identity is not None and engine.identity.eni_id == info["eni"]
    gets = [had_token for method, _, had_token in fake.requests if method == "GET"]
    fell_back = any("falling back to IMDSv1" in r.getMessage() for r in caplog.records)
    if mode == "required":
        assert all(gets) and not fell_back
    else:
        assert not any(gets) and fell_back


def test_expired_metadata_token_is_renewed(vpc):
    fake, info = vpc.node(mode="required")
    client = MetadataClient(fake.url, token=True)
    assert client.get("instance-id") == info["instance"]
    fake.expire_tokens()
    assert client.get("instance-id") == info["instance"]
    assert [m for m, path, _ in fake.requests if path == "/latest/api/token"] == ["PUT", "PUT"]


def test_unreachable_metadata_service_is_explained():
    client = MetadataClient("http://127.0.0.1:9", token=True, timeout=1)
    with pytest.raises(CloudError, match=r"did not answer .*is this node running on the cloud"):
        client.get("instance-id")


@pytest.mark.parametrize(("backend", "message"), [
    ({"RouteTableID": 42}, "Backend.RouteTableID must be a string or a list of strings, "
                           "not a number"),
    ({"RouteTableID": ["rtb-00000000", "main"]}, "Backend.RouteTableID: 'main' is not a route "
                                                 "table ID (rtb- followed by hex digits)"),
])
def test_bad_route_table_config_is_refused(backend, message):
    with pytest.raises(BackendConfigError) as raised:
        AwsVpcConfig.from_backend(backend, NETWORK, IPv4Address("10.0.1.5"))
    assert str(raised.value) == message


def test_our_subnet_routed_to_an_instance_flannel_did_not_mark_is_reported(vpc):
    fake, info = vpc.node()
    _, admins = vpc.node()
    engine = vpc.engine(fake, info)
    engine.prepare()
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock=SUBNETS[0],
                         NetworkInterfaceId=admins["eni"])
    with pytest.raises(CloudError) as raised:
        engine.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value) == (
        f"route table {vpc.table} sends our subnet {SUBNETS[0]} to {admins['eni']}, which is "
        f"not a flannel node (no tag {MARK}); delete that route so that flannel can route its "
        "subnet")
    assert vpc.routes()[SUBNETS[0]] == admins["eni"]


def test_without_the_tag_permissions_nothing_is_deleted_and_it_says_why(vpc, caplog):
    (engine, info), (_, other) = three_nodes(vpc)[:2]
    engine.prepare()
    vpc.ec2.create_tags(Resources=[other["eni"]], Tags=[{"Key": MARK,
                                                         "Value": "10.244.9.0/24"}])
    vpc.ec2.create_route(RouteTableId=vpc.table, DestinationCidrBlock="10.244.9.0/24",
                         NetworkInterfaceId=other["eni"])
    vpc.relay.fail("CreateTags", "UnauthorizedOperation", times=1, status=403,
                   message="You are not authorized to perform this operation.")
    vpc.relay.fail("DescribeNetworkInterfaces", "UnauthorizedOperation", times=1, status=403,
                   message="You are not authorized to perform this operation.")
    with caplog.at_level(logging.WARNING, logger="flannel"):
        engine.reconcile(lease(SUBNETS[0]), [])
        assert engine.reconcile(lease(SUBNETS[0]), []) == []
    assert "10.244.9.0/24" in vpc.routes()
    warnings = engine.status().warnings
    assert [w.split(" (", 1)[0] for w in warnings] == [
        f"could not tag {info['eni']} with {MARK}={SUBNETS[0]}",
        "cannot read the tags of route targets"]
    assert "ec2:CreateTags" in warnings[0] and "ec2:DescribeNetworkInterfaces" in warnings[1]
    # Granted: the next passes tag our ENI and collect the marked route.
    engine.reconcile(lease(SUBNETS[0]), [])
    assert "10.244.9.0/24" not in vpc.routes()


# -- EC2 answering as a broken or compromised server would ---------------------------------

#: A byte every DRIP seconds: an answer botocore's own sender (a timeout per read) waited on
#: for ever.
DRIP = 5.0
#: What a stop may take to cut a call under way: uncut, the dripping call runs on for 10 s or
#: more; a cut that waited for the next byte would take most of DRIP (the stop comes 0.5 s in).
STOP_CUT = 2.5
DESCRIBED = b'<?xml version="1.0" encoding="UTF-8"?><DescribeRouteTablesResponse>' + \
    b"<routeTableSet/>" * 100 + b"</DescribeRouteTablesResponse>"


def prepared(vpc: Vpc) -> AwsVpcRoutes:
    fake, info = vpc.node()
    engine = vpc.engine(fake, info)
    engine.prepare()
    return engine


def test_a_stop_cuts_a_dripping_ec2_answer_at_once(vpc):
    engine = prepared(vpc)
    vpc.relay.answer_with("DescribeRouteTables", hostile.drip(DESCRIBED, DRIP))
    took, outcome = stop_while_asking(engine, lambda: vpc.relay.count("DescribeRouteTables"),
                                      DRIP)
    assert took < STOP_CUT
    assert outcome == ["EC2 DescribeRouteTables: not done, flanneld is stopping"]
    asked = len(vpc.relay.actions)
    with pytest.raises(CloudError, match="flanneld is stopping"):
        engine.reconcile(lease(SUBNETS[0]), [])
    assert len(vpc.relay.actions) == asked  # nothing asked once stopped


def test_a_dripping_ec2_answer_is_cut_at_the_whole_answer_deadline(vpc, monkeypatch):
    monkeypatch.setattr(awsvpc, "API_TIMEOUT", 1)
    engine = prepared(vpc)
    vpc.relay.answer_with("DescribeRouteTables", hostile.drip(DESCRIBED, 0.2))
    started = time.monotonic()
    with pytest.raises(CloudError) as raised:
        engine.reconcile(lease(SUBNETS[0]), [])
    # Each byte comes well within a read's timeout: only a deadline for the whole answer ends it.
    assert time.monotonic() - started < DRIP
    assert str(raised.value) == ("EC2 DescribeRouteTables: no usable answer from "
                                 f"{vpc.relay.url.removeprefix('http://')} (no whole answer "
                                 "within 1s)")


@pytest.mark.parametrize(("behaviour", "message"), [
    (hostile.huge(64 * 1024 * 1024, chunk=b"<a/>" * 4096),
     "an answer of 67108864 bytes, over the limit of 8388608"),
    (hostile.huge(64 * 1024 * 1024, announced=False, chunk=b"<a/>" * 4096),
     "an answer over the limit of 8388608 bytes"),
    (hostile.verbatim(200, b"<r>" + b"<a/>" * 400_000 + b"</r>"),
     "holds more than 300000 XML tags; not read"),
])
def test_an_ec2_answer_over_its_bytes_or_tags_is_refused_unparsed(vpc, behaviour, message):
    engine = prepared(vpc)
    vpc.relay.answer_with("DescribeRouteTables", behaviour)
    routes = vpc.routes()
    with pytest.raises(CloudError, match=message):
        engine.reconcile(lease(SUBNETS[0]), [])
    assert vpc.routes() == routes  # nothing changed on a listing refused


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_an_ec2_redirect_is_never_followed(vpc, status):
    error, elsewhere = redirected_pass(prepared(vpc), vpc.relay.answer_with, status)
    assert error.startswith(
        f"EC2 DescribeRouteTables: {vpc.relay.url.removeprefix('http://')} answered HTTP "
        f"{status}, a redirect to '{elsewhere}'; not followed")


def test_a_route_table_described_without_its_id_is_refused_by_name(vpc):
    engine = prepared(vpc)
    vpc.relay.answer_with("DescribeRouteTables", hostile.verbatim(
        200, b"<DescribeRouteTablesResponse><routeTableSet><item><routeSet/></item>"
             b"</routeTableSet></DescribeRouteTablesResponse>", {"Content-Type": "text/xml"}))
    with pytest.raises(CloudError, match="EC2 DescribeRouteTables answered a route table "
                                         "without its routeTableId"):
        engine.reconcile(lease(SUBNETS[0]), [])
