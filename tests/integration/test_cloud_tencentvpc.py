"""The tencent-vpc route engine, through the real Tencent Cloud SDK, against the VPC API
double (tests/support/tencentapi.py: signed requests verified, documented shapes and error
codes) and a fake metadata service; and the API answering as a broken or compromised server
would (a dripping answer cut at its deadline and at once when flanneld stops, answers over
their bytes or elements refused, redirects never followed)."""

from __future__ import annotations

import logging
import time
from ipaddress import IPv4Address

import pytest

from flannel.cloud import tencentvpc
from flannel.cloud.base import CloudError, ThrottleRetry
from flannel.cloud.metadata import MetadataClient
from flannel.cloud.tencentvpc import DESCRIPTION, TencentVpcConfig, TencentVpcRoutes
from flannel_lab import hostile
from tests.support.cloudengines import (
    FAST,
    NETWORK,
    SUBNETS,
    assert_keys_read_as_go_reads_them,
    assert_refused,
    full_table_error,
    lease,
    reconcile_all,
    redirected_pass,
    stop_while_asking,
)
from tests.support.imds import FakeMetadata
from tests.support.tencentapi import FakeTencentVpc

pytestmark = pytest.mark.cloud

KEY_ID = "AKIDflannelTestKey0001"
SECRET = "flannel-tencent-secret-never-logged-9876"
VPC = "vpc-2flannel"
MAC = "52:54:00:ab:cd:ef"
ADDRESSES = ["172.16.0.11", "172.16.0.12", "172.16.0.13"]


@pytest.fixture
def cloud(no_proxy):
    api = FakeTencentVpc({KEY_ID: SECRET}).start()
    metadata = FakeMetadata({"placement/region": "ap-guangzhou", "mac": MAC,
                             f"network/interfaces/macs/{MAC}/vpc-id": VPC},
                            mode="v1-only").start()
    api.table = api.add_table(VPC, main=True)
    api.add_table(VPC)
    api.add_table("vpc-other")
    yield api, metadata
    metadata.stop()
    api.stop()


def engine(cloud, address: str, backend: dict | None = None,
           backoff: ThrottleRetry = FAST) -> TencentVpcRoutes:
    api, metadata = cloud
    members = backend if backend is not None else {"AccessKeyID": KEY_ID,
                                                   "AccessKeySecret": SECRET}
    config = TencentVpcConfig.from_backend({**members, "Endpoint": f"http://{api.endpoint}"},
                                           NETWORK, IPv4Address(address), environ={})
    return TencentVpcRoutes(config, MetadataClient(metadata.url, token=False), backoff=backoff)


def routes(api) -> dict[str, tuple[str, str, bool]]:
    return {r["DestinationCidrBlock"]: (r["GatewayType"], r["GatewayId"], r["Enabled"])
            for r in api.routes(api.table)}


def all_nodes(cloud):
    nodes = [engine(cloud, address) for address in ADDRESSES]
    for node in nodes:
        node.prepare()
    return nodes


def test_each_node_routes_its_subnet_in_the_vpcs_first_table(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    api, _ = cloud
    nodes = all_nodes(cloud)
    assert all(node.table == api.table for node in nodes)
    changes = reconcile_all(nodes)
    assert [[str(c) for c in node_changes] for node_changes in changes] == [
        [f"create {cidr} -> {address} in {api.table}"]
        for cidr, address in zip(SUBNETS, ADDRESSES, strict=True)]
    assert routes(api) == {cidr: ("NORMAL_CVM", address, True)
                           for cidr, address in zip(SUBNETS, ADDRESSES, strict=True)}
    assert reconcile_all(nodes) == [[], [], []]
    assert nodes[0].status().healthy
    assert SECRET not in caplog.text
    assert SECRET not in repr(nodes[0].config)


def test_disabled_duplicates_are_deleted_and_deleted_route_repaired(cloud):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    api.add_route(api.table, SUBNETS[0], "NORMAL_CVM", ADDRESSES[0], enabled=False,
                  description=DESCRIPTION)
    changes = node.reconcile(lease(SUBNETS[0]), [])
    assert [c.action for c in changes] == ["delete", "create"]
    assert [(r["GatewayId"], r["Enabled"]) for r in api.routes(api.table)] == [
        (ADDRESSES[0], True)]
    # Deleted in the console: re-created. Pointed elsewhere: pointed back at us.
    api.tables[0]["RouteSet"].clear()
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    api.tables[0]["RouteSet"][0]["GatewayId"] = "172.16.0.99"
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [])] == [
        f"replace {SUBNETS[0]} -> {ADDRESSES[0]} in {api.table}"]
    assert routes(api)[SUBNETS[0]] == ("NORMAL_CVM", ADDRESSES[0], True)


def test_routes_of_vanished_leases_are_collected_and_foreign_routes_kept(cloud):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    mark = {"description": DESCRIPTION}
    api.add_route(api.table, "10.244.9.0/24", "NORMAL_CVM", "172.16.0.19",
                  **mark)  # vanished lease
    api.add_route(api.table, SUBNETS[1], "NORMAL_CVM", ADDRESSES[1], **mark)  # a live peer
    api.add_route(api.table, "10.244.0.0/16", "NORMAL_CVM", "172.16.0.5",
                  **mark)  # whole Network
    api.add_route(api.table, "10.244.8.0/24", "NAT", "nat-12345678", **mark)  # not a CVM
    api.add_route(api.table, "192.168.0.0/24", "NORMAL_CVM", "172.16.0.19", **mark)  # outside
    api.add_route(api.table, "10.244.7.0/24", "NORMAL_CVM", "172.16.0.17",
                  route_type="CCN", **mark)  # not a user route
    # Not flannel's mark: an admin's route, one Go flannel (or pyflannel before the mark)
    # made.
    api.add_route(api.table, "10.244.5.0/24", "NORMAL_CVM", "172.16.0.15",
                  description="to the build farm")
    api.add_route(api.table, "10.244.6.0/24", "NORMAL_CVM", "172.16.0.16")
    # Deleted when a second pass in a row finds it without a lease (not a newcomer's).
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])])] == [
        f"create {SUBNETS[0]} -> {ADDRESSES[0]} in {api.table}"]
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])])] == [
        f"delete 10.244.9.0/24 -> 172.16.0.19 in {api.table}"]
    assert node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])]) == []
    assert set(routes(api)) == {SUBNETS[0], SUBNETS[1], "10.244.0.0/16", "10.244.8.0/24",
                                "192.168.0.0/24", "10.244.7.0/24", "10.244.5.0/24",
                                "10.244.6.0/24"}
    assert descriptions(api)[SUBNETS[0]] == DESCRIPTION


def test_our_route_from_before_the_mark_is_adopted_in_place(cloud, caplog):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    route_id = api.add_route(api.table, SUBNETS[0], "NORMAL_CVM", ADDRESSES[0])
    with caplog.at_level(logging.INFO, logger="flannel"):
        assert node.reconcile(lease(SUBNETS[0]), []) == []
    assert [(r["RouteId"], r["RouteDescription"]) for r in api.routes(api.table)] == [
        (route_id, DESCRIPTION)]
    assert "DeleteRoutes" not in api.actions and "CreateRoutes" not in api.actions
    assert f"adopted our route {SUBNETS[0]} -> {ADDRESSES[0]}" in caplog.text


def test_an_unmarked_route_for_our_subnet_elsewhere_is_reported_not_replaced(cloud):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    api.add_route(api.table, SUBNETS[0], "NORMAL_CVM", "172.16.0.99")
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value).startswith(
        f"route table {api.table} sends our subnet {SUBNETS[0]} to 172.16.0.99 through a "
        "route flannel did not make")
    assert routes(api)[SUBNETS[0]] == ("NORMAL_CVM", "172.16.0.99", True)


def descriptions(api) -> dict[str, str]:
    return {r["DestinationCidrBlock"]: r["RouteDescription"] for r in api.routes(api.table)}


def test_throttling_is_retried_with_backoff(cloud, caplog):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    api.fail("CreateRoutes", "RequestLimitExceeded", times=2)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    assert api.actions.count("CreateRoutes") == 3
    retries = [r.getMessage() for r in caplog.records if "throttled" in r.getMessage()]
    assert len(retries) == 2
    assert retries[0].startswith("Tencent VPC CreateRoutes throttled (RequestLimitExceeded); "
                                 "retrying in")


def test_full_route_table_is_reported_clearly(cloud):
    api, _ = cloud
    assert full_table_error(all_nodes(cloud), lambda: setattr(api, "route_limit", 2)) == (
        f"route table {api.table} is full: Tencent Cloud refused the route for {SUBNETS[2]} "
        "(LimitExceeded). Raise the route-per-table quota of the VPC, or use a backend that "
        "needs no route per node (vxlan)")


def test_wrong_secret_is_refused_by_the_signature_check(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-secret-either-0000"
    node = engine(cloud, ADDRESSES[0], backend={"AccessKeyID": KEY_ID,
                                                "AccessKeySecret": wrong})
    with pytest.raises(CloudError) as raised:
        node.prepare()
    assert str(raised.value).startswith(
        "Tencent VPC DescribeRouteTables failed: AuthFailure.SignatureFailure: ")
    assert str(raised.value).endswith(
        "(check AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)")
    assert wrong not in caplog.text


def test_missing_permission_names_the_cam_action(cloud):
    api, _ = cloud
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    api.fail("CreateRoutes", "UnauthorizedOperation", times=1)
    with pytest.raises(CloudError, match=r"the key's CAM policy needs the action "
                                         r"vpc:CreateRoutes"):
        node.reconcile(lease(SUBNETS[0]), [])


def test_vpc_without_route_tables_is_reported(cloud):
    api, _ = cloud
    api.tables = [t for t in api.tables if t["VpcId"] != VPC]
    with pytest.raises(CloudError, match=f"no suitable routing table found in VPC {VPC} "
                                         r"\(ap-guangzhou\)"):
        engine(cloud, ADDRESSES[0]).prepare()


def read(members: dict, environ: dict) -> TencentVpcConfig:
    return TencentVpcConfig.from_backend(members, NETWORK, IPv4Address(ADDRESSES[0]),
                                         environ=environ)


def test_credentials_from_the_environment_as_go_reads_them():
    assert_keys_read_as_go_reads_them(read, KEY_ID, SECRET, "Tencent Cloud")


@pytest.mark.parametrize(("members", "message"), [
    ({"Endpoint": "vpc.tencentcloudapi.com"}, "Backend.Endpoint: 'vpc.tencentcloudapi.com' is "
     "not a URL of the form http://host[:port] or https://host[:port]"),
    ({"Endpoint": "https://user:pw@vpc.tencentcloudapi.com"}, "Backend.Endpoint: "),
    ({"MetadataURL": "https://metadata.tencentyun.com"}, "Backend.MetadataURL: "
     "'https://metadata.tencentyun.com' is not a URL of the form http://host[:port]"),
    ({"MetadataURL": "http://127.0.0.1:notaport"}, "Backend.MetadataURL: "),
])
def test_bad_endpoint_options_are_refused(members, message):
    assert_refused(read, {"AccessKeyID": KEY_ID, "AccessKeySecret": SECRET, **members},
                   message, SECRET)


def test_endpoint_options_default_to_tencents_services():
    config = TencentVpcConfig.from_backend({"AccessKeyID": KEY_ID, "AccessKeySecret": SECRET,
                                            "endpoint": "https://vpc.internal.tencentcloudapi"
                                                        ".com/"},
                                           NETWORK, IPv4Address(ADDRESSES[0]), environ={})
    assert config.endpoint == "https://vpc.internal.tencentcloudapi.com"
    assert config.metadata_url == "http://metadata.tencentyun.com"


# -- the API answering as a broken or compromised server would ------------------------------

#: A byte every DRIP seconds: an answer the SDK's own sender (a timeout per read) waited on
#: for ever.
DRIP = 5.0
#: What a stop may take to cut a call under way: uncut, the dripping call runs on for 10 s or
#: more; a cut that waited for the next byte would take most of DRIP (the stop comes 0.5 s in).
STOP_CUT = 2.5
ANSWER = b'{"Response": {"RouteTableSet": [], "TotalCount": 0, "RequestId": "r"}}'


def prepared(cloud) -> TencentVpcRoutes:
    node = engine(cloud, ADDRESSES[0])
    node.prepare()
    return node


def test_a_stop_cuts_a_dripping_answer_at_once(cloud):
    api, _ = cloud
    node = prepared(cloud)
    api.answer_with("DescribeRouteTables", hostile.drip(ANSWER, DRIP))
    took, outcome = stop_while_asking(node, lambda: api.actions.count("DescribeRouteTables"),
                                      DRIP)
    assert took < STOP_CUT
    assert outcome == ["Tencent VPC DescribeRouteTables: not done, flanneld is stopping"]
    asked = len(api.actions)
    with pytest.raises(CloudError, match="flanneld is stopping"):
        node.reconcile(lease(SUBNETS[0]), [])
    assert len(api.actions) == asked  # nothing asked once stopped


def test_a_dripping_answer_is_cut_at_the_whole_answer_deadline(cloud, monkeypatch):
    api, _ = cloud
    monkeypatch.setattr(tencentvpc, "API_TIMEOUT", 1)
    node = prepared(cloud)
    api.answer_with("DescribeRouteTables", hostile.drip(ANSWER, 0.2))
    started = time.monotonic()
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    # Each byte comes well within a read's timeout: only a deadline for the whole answer ends it.
    assert time.monotonic() - started < DRIP
    assert str(raised.value) == ("Tencent VPC DescribeRouteTables: no usable answer from "
                                 f"{api.endpoint} (no whole answer within 1s)")


@pytest.mark.parametrize(("behaviour", "message"), [
    (hostile.huge(64 * 1024 * 1024), "an answer of 67108864 bytes, over the limit of 2097152"),
    (hostile.huge(64 * 1024 * 1024, announced=False),
     "an answer over the limit of 2097152 bytes"),
    (hostile.amplifying(200_000, "Response"), "holds more than 100000 JSON elements; not read"),
])
def test_an_answer_over_its_bytes_or_elements_is_refused_undecoded(cloud, behaviour, message):
    api, _ = cloud
    node = prepared(cloud)
    api.answer_with("DescribeRouteTables", behaviour)
    routes = api.routes(api.table)
    with pytest.raises(CloudError, match=message):
        node.reconcile(lease(SUBNETS[0]), [])
    assert api.routes(api.table) == routes  # nothing changed on a listing refused


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_never_followed(cloud, status):
    api, _ = cloud
    error, elsewhere = redirected_pass(prepared(cloud), api.answer_with, status)
    assert error.startswith(
        f"Tencent VPC DescribeRouteTables: {api.endpoint} answered HTTP {status}, a redirect "
        f"to '{elsewhere}'; not followed")
