"""The ali-vpc route engine, through its signed RPC client over the project's HTTP layer,
against the Alibaba Cloud VPC API double (lab/flannel_lab/aliyunapi.py: signatures verified,
documented shapes and error codes) and a fake metadata service."""

from __future__ import annotations

import logging
import time
from ipaddress import IPv4Network

import pytest

from flannel.clients.aliyunrpc import signature
from flannel.cloud.alivpc import AliVpcConfig, AliVpcRoutes, entry_name
from flannel.cloud.base import CloudError
from flannel.cloud.metadata import ALIYUN_TOKENS, MetadataClient
from tests.support.alivpc import INSTANCES, KEY_ID, REGION, SECRET, VPC, engine
from tests.support.cloudengines import (
    FAST,
    NETWORK,
    SUBNETS,
    assert_keys_read_as_go_reads_them,
    assert_refused,
    full_table_error,
    lease,
    reconcile_all,
)
from tests.support.imds import FakeMetadata

pytestmark = pytest.mark.cloud


#: The names that mark each subnet's entry as flannel's.
OURS = [entry_name(IPv4Network(cidr)) for cidr in SUBNETS]


def names(api) -> dict[str, str]:
    return {e["DestinationCidrBlock"]: e["RouteEntryName"] for e in api.entries(api.table)}


def custom(api) -> dict[str, str]:
    return {e["DestinationCidrBlock"]: e["InstanceId"] for e in api.entries(api.table)
            if e["Type"] == "Custom"}


def all_nodes(cloud):
    nodes = [engine(cloud, index) for index in range(3)]
    for node in nodes:
        node.prepare()
    return nodes


def test_signature_matches_alibabas_documented_example():
    # The worked example of Alibaba Cloud's "request signature" page (RPC, version 1.0).
    params = {"AccessKeyId": "testid", "Action": "DescribeRegions", "Format": "XML",
              "SignatureMethod": "HMAC-SHA1", "SignatureNonce": "3ee8c1b8-83d3-44af-a94f-"
              "4e0ad82fd6cf", "SignatureVersion": "1.0", "Timestamp": "2016-02-23T12:46:24Z",
              "Version": "2014-05-26"}
    assert signature("GET", params, "testsecret") == "OLeaidS1JvxuMvnyHOwuJ+uX5qY="


def test_each_node_routes_its_subnet_in_the_vrouters_first_table(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    api, _ = cloud
    nodes = all_nodes(cloud)
    assert all(node.table == api.table for node in nodes)
    assert api.actions[:3] == ["DescribeVpcs", "DescribeVRouters", "DescribeVpcs"]
    changes = reconcile_all(nodes)
    assert [[str(c) for c in node_changes] for node_changes in changes] == [
        [f"create {cidr} -> {instance} in {api.table}"]
        for cidr, instance in zip(SUBNETS, INSTANCES, strict=True)]
    entries = {e["DestinationCidrBlock"]: (e["NextHopType"], e["InstanceId"])
               for e in api.entries(api.table) if e["Type"] == "Custom"}
    assert entries == {cidr: ("Instance", instance)
                       for cidr, instance in zip(SUBNETS, INSTANCES, strict=True)}
    # Created in the background (Pending first): present all the same, nothing re-made.
    assert reconcile_all(nodes) == [[], [], []]
    assert nodes[0].status().healthy
    assert nodes[0].status().target == INSTANCES[0]
    assert SECRET not in caplog.text
    assert SECRET not in repr(nodes[0].config)


def test_entry_deleted_or_redirected_in_the_console_is_repaired(cloud):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    node.reconcile(lease(SUBNETS[0]), [])
    api.delete_entry(api.table, SUBNETS[0])
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [])] == [
        f"create {SUBNETS[0]} -> {INSTANCES[0]} in {api.table}"]
    api.delete_entry(api.table, SUBNETS[0])
    api.add_entry(api.table, SUBNETS[0], "i-bp1somewhereelse0001", name=OURS[0])
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [])] == [
        f"delete {SUBNETS[0]} -> i-bp1somewhereelse0001 in {api.table}",
        f"create {SUBNETS[0]} -> {INSTANCES[0]} in {api.table}"]
    assert custom(api) == {SUBNETS[0]: INSTANCES[0]}


def test_entries_of_vanished_leases_are_collected_and_foreign_entries_kept(cloud):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.add_entry(api.table, "10.244.9.0/24", "i-bp1vanishednode0009",
                  name="flannel-10-244-9-0-24")  # vanished lease
    api.add_entry(api.table, SUBNETS[1], INSTANCES[1], name=OURS[1])  # a live peer
    api.add_entry(api.table, "10.244.0.0/16", "i-bp1gatewaynode00005",
                  name="flannel-10-244-0-0-16")  # the whole Network
    api.add_entry(api.table, "10.244.8.0/24", "vpn-bp1gateway000001",
                  next_hop_type="VpnGateway", name="flannel-10-244-8-0-24")  # not an instance
    api.add_entry(api.table, "172.16.0.0/24", INSTANCES[0])  # outside the Network, to us
    api.add_entry(api.table, "0.0.0.0/0", INSTANCES[0])  # a default route through us
    # Not flannel's mark: an admin's entry, one Go flannel (or pyflannel before the mark)
    # made, one named for another subnet.
    api.add_entry(api.table, "10.244.5.0/24", "i-bp1adminsinstance05", name="to-the-lab")
    api.add_entry(api.table, "10.244.6.0/24", "i-bp1vanishednode0006")
    api.add_entry(api.table, "10.244.7.0/24", "i-bp1vanishednode0007",
                  name="flannel-10-244-70-0-24")
    # Deleted when a second pass in a row finds it without a lease (not a newcomer's).
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])])] == [
        f"create {SUBNETS[0]} -> {INSTANCES[0]} in {api.table}"]
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])])] == [
        f"delete 10.244.9.0/24 -> i-bp1vanishednode0009 in {api.table}"]
    assert node.reconcile(lease(SUBNETS[0]), [lease(SUBNETS[1])]) == []
    assert set(custom(api)) == {SUBNETS[0], SUBNETS[1], "10.244.0.0/16", "10.244.8.0/24",
                                "172.16.0.0/24", "0.0.0.0/0", "10.244.5.0/24",
                                "10.244.6.0/24", "10.244.7.0/24"}
    assert any(e["Type"] == "System" for e in api.entries(api.table))
    assert names(api)[SUBNETS[0]] == OURS[0]


@pytest.mark.parametrize("code", ["Throttling", "Throttling.User", "ServiceUnavailable",
                                  "TaskConflict"])
def test_throttling_is_retried_with_backoff(cloud, caplog, code):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.fail("CreateRouteEntry", code, times=2)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    assert api.actions.count("CreateRouteEntry") == 3
    retries = [r.getMessage() for r in caplog.records if "throttled" in r.getMessage()]
    assert len(retries) == 2
    assert retries[0].startswith(f"Alibaba Cloud VPC CreateRouteEntry throttled ({code}); "
                                 "retrying in")


def test_an_entry_still_being_deleted_fails_the_pass_until_it_is_gone(cloud):
    # DeleteRouteEntry works in the background: re-creating the destination at once may be
    # refused as a duplicate. The pass fails saying so; the next one creates it.
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.fail("CreateRouteEntry", "InvalidCIDRBlock.Duplicate", times=1)
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value).startswith("Alibaba Cloud VPC CreateRouteEntry failed: "
                                        "InvalidCIDRBlock.Duplicate: ")
    assert str(raised.value).endswith("still being deleted: the next pass looks again)")
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]


def test_a_pass_that_must_not_wait_fails_at_once_when_throttled(cloud):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.fail("DescribeRouteTables", "Throttling.User", times=1)
    with pytest.raises(CloudError, match=r"throttling \(Throttling.User\); the pass is retried"):
        node.reconcile(lease(SUBNETS[0]), [], wait_throttled=False)
    assert api.actions.count("DescribeRouteTables") == 1


def test_full_route_table_is_reported_clearly(cloud):
    api, _ = cloud
    assert full_table_error(all_nodes(cloud), lambda: setattr(api, "entry_limit", 2)) == (
        f"route table {api.table} is full: Alibaba Cloud refused the entry for {SUBNETS[2]} "
        "(QuotaExceeded). Raise the route-entry quota of the VPC, or use a backend that needs "
        "no route per node (vxlan)")


def test_wrong_secret_is_refused_by_the_signature_check(cloud, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-secret-either-0000"
    node = engine(cloud, 0, backend={"AccessKeyID": KEY_ID, "AccessKeySecret": wrong})
    with pytest.raises(CloudError) as raised:
        node.prepare()
    assert str(raised.value).startswith(
        "Alibaba Cloud VPC DescribeVpcs failed: SignatureDoesNotMatch: Specified signature is "
        "not matched with our calculation.")
    assert str(raised.value).endswith(
        "(check AccessKeyID/AccessKeySecret or ACCESS_KEY_ID/ACCESS_KEY_SECRET)")
    assert wrong not in caplog.text and wrong not in str(raised.value)
    unknown = engine(cloud, 0, backend={"AccessKeyID": "LTAInobodyhasthiskey01",
                                        "AccessKeySecret": SECRET})
    with pytest.raises(CloudError, match=r"InvalidAccessKeyId\.NotFound: Specified access key"):
        unknown.prepare()


def test_missing_permission_names_the_ram_action(cloud):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.fail("DeleteRouteEntry", "Forbidden.RAM", times=1)
    api.add_entry(api.table, SUBNETS[0], "i-bp1somewhereelse0001", name=OURS[0])
    with pytest.raises(CloudError, match=r"the key's RAM policy needs the action "
                                         r"vpc:DeleteRouteEntry"):
        node.reconcile(lease(SUBNETS[0]), [])


def test_an_api_that_does_not_answer_times_out(cloud):
    api, _ = cloud
    node = engine(cloud, 0, timeout=0.3)
    api.delay = 2.0
    started = time.monotonic()
    with pytest.raises(CloudError) as raised:
        node.prepare()
    assert time.monotonic() - started < 1.5  # not waiting for the answer 2 s late
    assert str(raised.value) == (f"Alibaba Cloud VPC DescribeVpcs: no answer from "
                                 f"http://{api.endpoint} within 0.3 s; check the node's route "
                                 "to the API endpoint (Endpoint)")


def test_vpc_not_found_is_reported(cloud):
    api, _ = cloud
    api.vpcs.pop(VPC)
    with pytest.raises(CloudError, match=f"VPC {VPC} not found in {REGION}"):
        engine(cloud, 0).prepare()


@pytest.mark.parametrize(("path", "value"), [
    ("region-id", "cn-hangzhou; rm -rf /"),
    ("instance-id", "../../i-bp1flannel"),
    ("vpc-id", "vpc-" + "a" * 200),
])
def test_bad_metadata_is_refused_by_name(cloud, path, value):
    api, served = cloud
    served[0].by_client["127.0.0.1"][path] = value
    with pytest.raises(CloudError) as raised:
        engine(cloud, 0).prepare()
    assert str(raised.value).startswith(f"instance metadata {path}: unexpected value ")
    assert api.actions == []


def test_missing_metadata_is_refused_by_name(cloud):
    _, served = cloud
    del served[0].by_client["127.0.0.1"]["vpc-id"]
    with pytest.raises(CloudError, match=r"instance metadata vpc-id: HTTP 404"):
        engine(cloud, 0).prepare()


def test_metadata_in_hardened_mode_with_a_token_else_in_normal_mode(cloud, caplog):
    api, served = cloud
    node = engine(cloud, 0)
    node.prepare()  # the service refuses GETs without a token
    assert node.status().target == INSTANCES[0]
    assert served[0].requests[0] == ("PUT", "/latest/api/token", False)
    assert all(token for method, _, token in served[0].requests if method == "GET")
    # A service that hands out no token (normal mode only): plain GETs, said once.
    plain = FakeMetadata({"region-id": REGION, "instance-id": INSTANCES[1], "vpc-id": VPC},
                         mode="v1-only").start()
    try:
        config = AliVpcConfig.from_backend({"AccessKeyID": KEY_ID, "AccessKeySecret": SECRET,
                                            "Endpoint": f"http://{api.endpoint}"},
                                           NETWORK, environ={})
        with caplog.at_level(logging.WARNING, logger="flannel"):
            other = AliVpcRoutes(config, MetadataClient(plain.url, token=True,
                                                        scheme=ALIYUN_TOKENS), backoff=FAST)
            other.prepare()
        assert other.status().target == INSTANCES[1]
        assert [r.getMessage() for r in caplog.records] == [
            f"hardened mode token request to {plain.url} failed (HTTP 403); falling back to "
            "normal mode"]
    finally:
        plain.stop()


def read(members: dict, environ: dict) -> AliVpcConfig:
    return AliVpcConfig.from_backend(members, NETWORK, environ=environ)


def test_credentials_from_the_environment_as_go_reads_them():
    assert_keys_read_as_go_reads_them(read, KEY_ID, SECRET, "Alibaba Cloud")


@pytest.mark.parametrize(("members", "message"), [
    ({"Endpoint": "vpc.aliyuncs.com"}, "Backend.Endpoint: 'vpc.aliyuncs.com' is not a URL of "
     "the form http://host[:port] or https://host[:port]"),
    ({"Endpoint": "https://vpc.aliyuncs.com/?Action=x"}, "Backend.Endpoint: "),
    ({"MetadataURL": "https://100.100.100.200"}, "Backend.MetadataURL: "
     "'https://100.100.100.200' is not a URL of the form http://host[:port]"),
])
def test_bad_endpoint_options_are_refused(members, message):
    assert_refused(read, {"AccessKeyID": KEY_ID, "AccessKeySecret": SECRET, **members},
                   message, SECRET)


def test_options_default_to_alibabas_services():
    config = AliVpcConfig.from_backend({"accesskeyid": KEY_ID, "ACCESSKEYSECRET": SECRET},
                                       NETWORK, environ={})
    assert (config.endpoint, config.metadata_url) == ("", "http://100.100.100.200")


def test_our_entry_from_before_the_mark_is_adopted_in_place(cloud, caplog):
    """An upgrade from Go flannel or an older pyflannel: our subnet's entry carries no name.
    It is named in place (ModifyRouteEntry), never deleted: the subnet stays routed."""
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.add_entry(api.table, SUBNETS[0], INSTANCES[0])
    before = {e["RouteEntryId"] for e in api.entries(api.table)}
    with caplog.at_level(logging.INFO, logger="flannel"):
        assert node.reconcile(lease(SUBNETS[0]), []) == []
    assert {e["RouteEntryId"] for e in api.entries(api.table)} == before
    assert names(api)[SUBNETS[0]] == OURS[0]
    assert "DeleteRouteEntry" not in api.actions and "CreateRouteEntry" not in api.actions
    assert f"adopted our entry {SUBNETS[0]} -> {INSTANCES[0]}" in caplog.text
    assert node.reconcile(lease(SUBNETS[0]), []) == []
    assert api.actions.count("ModifyRouteEntry") == 1


def test_an_unmarked_entry_for_our_subnet_elsewhere_is_reported_not_deleted(cloud):
    api, _ = cloud
    node = engine(cloud, 0)
    node.prepare()
    api.add_entry(api.table, SUBNETS[0], "i-bp1adminsinstance05")
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value) == (
        f"route table {api.table} sends our subnet {SUBNETS[0]} to instance "
        f"i-bp1adminsinstance05 through an entry flannel did not make (it lacks the name "
        f"{OURS[0]}); delete that entry so that flannel can route its subnet")
    assert custom(api) == {SUBNETS[0]: "i-bp1adminsinstance05"}
