"""The gce route engine, over HTTP, against the Compute Engine double (tests/support/gceapi.py:
the REST shapes, error answers and operations of the public Compute Engine API reference, a
metadata server per instance, the OAuth token endpoint verifying a signed JWT)."""

from __future__ import annotations

import json
import logging
import os

import pytest

from flannel.cloud.base import CloudError
from flannel.cloud.gce import DESCRIPTION, GceConfig, GceRoutes
from flannel.cloud.gceauth import GceMetadata
from tests.support.cloudengines import (
    FAST,
    NETWORK,
    SUBNETS,
    full_table_error,
    lease,
    reconcile_all,
)
from tests.support.fifos import outcome_of_reading
from tests.support.gceapi import FakeCompute, FakeGceMetadata, metadata_paths

pytestmark = pytest.mark.cloud

ZONE = "europe-west1-b"
VPC = "flannel-net"
NODES = ["node-1", "node-2", "node-3"]


@pytest.fixture
def compute(no_proxy):
    api = FakeCompute("flannel-test").start()
    api.network_link = api.add_network(VPC)
    api.add_network("other-net")
    served: list[FakeGceMetadata] = []
    api.metadata = lambda instance: served[NODES.index(instance)]
    for name in NODES:
        api.add_instance(ZONE, name)
        served.append(FakeGceMetadata(api, metadata_paths(api, ZONE, name, VPC)).start())
    yield api
    for server in (*served, api):
        server.stop()


def engine(api, instance: str = NODES[0], backend: dict | None = None,
           environ: dict | None = None, **options) -> GceRoutes:
    config = GceConfig.from_backend({"Endpoint": api.url, **(backend or {})}, NETWORK,
                                    environ=environ or {})
    metadata = GceMetadata(f"http://{api.metadata(instance).host}", timeout=2)
    return GceRoutes(config, metadata, backoff=FAST, poll_interval=0.01, **options)


def routes(api) -> dict[str, tuple[str, str]]:
    """name -> (destRange, next hop instance name)."""
    return {name: (r["destRange"], r.get("nextHopInstance", "").rsplit("/", 1)[-1])
            for name, r in api.routes.items()}


def test_each_node_routes_its_subnet_to_its_instance(compute, caplog):
    caplog.set_level(logging.DEBUG)
    nodes = [engine(compute, name) for name in NODES]
    for node in nodes:
        node.prepare()
    changes = reconcile_all(nodes)
    assert [[str(c) for c in node_changes] for node_changes in changes] == [
        [f"create {cidr} -> {name} in flannel-test/{VPC}"]
        for cidr, name in zip(SUBNETS, NODES, strict=True)]
    assert routes(compute) == {"flannel-10-244-1-0-24": ("10.244.1.0/24", "node-1"),
                               "flannel-10-244-2-0-24": ("10.244.2.0/24", "node-2"),
                               "flannel-10-244-3-0-24": ("10.244.3.0/24", "node-3")}
    inserted = compute.routes["flannel-10-244-1-0-24"]
    assert (inserted["network"], inserted["priority"], inserted["tags"]) == (
        compute.network_link, 1000, [])
    # Each insert was waited on through globalOperations.get.
    assert compute.actions.count("globalOperations.get") == 3
    assert reconcile_all(nodes) == [[], [], []]
    assert nodes[0].status().healthy
    # The metadata server's tokens are never logged.
    assert not any(token in caplog.text for token in compute.tokens)


def test_route_deleted_in_the_console_or_pointed_elsewhere_is_repaired(compute):
    node = engine(compute)
    node.prepare()
    node.reconcile(lease(SUBNETS[0]), [])
    compute.delete_route("flannel-10-244-1-0-24")
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    compute.routes["flannel-10-244-1-0-24"]["nextHopInstance"] = \
        compute.instances[f"{ZONE}/node-2"]["selfLink"]
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [])] == [
        f"delete {SUBNETS[0]} -> node-2 in flannel-test/{VPC}",
        f"create {SUBNETS[0]} -> node-1 in flannel-test/{VPC}"]
    assert routes(compute)["flannel-10-244-1-0-24"] == (SUBNETS[0], "node-1")


def test_vanished_leases_collected_after_two_passes_and_foreign_routes_kept(compute):
    node = engine(compute)
    node.prepare()
    net, other = compute.network_link, compute.networks["other-net"]["selfLink"]
    gone = compute.instances[f"{ZONE}/node-3"]["selfLink"]
    mark = {"description": DESCRIPTION}
    compute.add_route("flannel-10-244-9-0-24", "10.244.9.0/24", net, nextHopInstance=gone,
                      **mark)
    compute.add_route("flannel-10-244-2-0-24", SUBNETS[1], net, nextHopInstance=gone,
                      **mark)  # live
    foreign = {
        # Not flannel's: another network, the default route, a next hop that is not an
        # instance, another name, the whole Network, outside it, a name of another subnet.
        "flannel-10-244-8-0-24": ("10.244.8.0/24", other, {"nextHopInstance": gone, **mark}),
        "default-route-abc": ("0.0.0.0/0", net, {"nextHopGateway": "default-internet-gateway"}),
        "flannel-10-244-7-0-24": ("10.244.7.0/24", net, {"nextHopIp": "192.168.0.9", **mark}),
        "my-10-244-6-0-24": ("10.244.6.0/24", net, {"nextHopInstance": gone, **mark}),
        "flannel-10-244-0-0-16": ("10.244.0.0/16", net, {"nextHopInstance": gone, **mark}),
        "flannel-192-168-5-0-24": ("192.168.5.0/24", net, {"nextHopInstance": gone, **mark}),
        "flannel-10-244-4-0-25": ("10.244.4.0/24", net, {"nextHopInstance": gone, **mark}),
        # Without flannel's mark, inside the Network, to an instance: an admin's, one Go
        # flannel (or pyflannel before the mark) made, one another tool described.
        "admin-10-244-5-0-24": ("10.244.5.0/24", net, {"nextHopInstance": gone}),
        "flannel-10-244-6-0-24": ("10.244.6.0/24", net, {"nextHopInstance": gone}),
        "flannel-10-244-7-0-25": ("10.244.7.0/25", net, {"nextHopInstance": gone,
                                                         "description": "kept by ops"}),
    }
    for name, (dest, network, hop) in foreign.items():
        compute.add_route(name, dest, network, **hop)
    peers = [lease(SUBNETS[1])]
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), peers)] == ["create"]
    assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), peers)] == [
        f"delete 10.244.9.0/24 -> node-3 in flannel-test/{VPC}"]
    assert node.reconcile(lease(SUBNETS[0]), peers) == []
    assert set(compute.routes) == {"flannel-10-244-1-0-24", "flannel-10-244-2-0-24",
                                   *foreign}
    assert compute.routes["flannel-10-244-1-0-24"]["description"] == DESCRIPTION


def test_a_foreign_route_holding_our_name_is_reported(compute):
    node = engine(compute)
    node.prepare()
    compute.add_route("flannel-10-244-1-0-24", SUBNETS[0], compute.network_link,
                      nextHopGateway="default-internet-gateway")
    with pytest.raises(CloudError, match=r"a route named flannel-10-244-1-0-24 exists in "
                                         r"project flannel-test that is not flannel's"):
        node.reconcile(lease(SUBNETS[0]), [])
    assert compute.routes["flannel-10-244-1-0-24"]["nextHopGateway"]


@pytest.mark.parametrize(("status", "reason"), [(429, "rateLimitExceeded"),
                                                (403, "rateLimitExceeded"),
                                                (403, "userRateLimitExceeded")])
def test_throttling_is_retried_with_backoff(compute, caplog, status, reason):
    node = engine(compute)
    node.prepare()
    compute.fail("routes.insert", status, reason, times=2)
    with caplog.at_level(logging.WARNING, logger="flannel"):
        assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    assert compute.actions.count("routes.insert") == 3
    retries = [r.getMessage() for r in caplog.records if "throttled" in r.getMessage()]
    assert len(retries) == 2
    assert retries[0].startswith(f"Compute Engine routes.insert throttled ({reason}); "
                                 "retrying in")


def test_a_throttled_operation_poll_retries_the_change_once_not_in_a_loop(compute):
    node = engine(compute)
    node.prepare()
    compute.pending_polls = 2
    compute.fail("globalOperations.get", 429, "rateLimitExceeded", times=1)
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    # The insert is sent again and finds its route made (409): the change is done.
    assert compute.actions.count("routes.insert") == 2
    assert routes(compute) == {"flannel-10-244-1-0-24": (SUBNETS[0], "node-1")}
    assert node.reconcile(lease(SUBNETS[0]), []) == []


def test_throttling_in_a_data_plane_pass_fails_the_pass_at_once(compute):
    node = engine(compute)
    node.prepare()
    compute.fail("routes.list", 429, "rateLimitExceeded", times=1)
    with pytest.raises(CloudError, match="the cloud API is throttling"):
        node.reconcile(lease(SUBNETS[0]), [], wait_throttled=False)
    assert compute.actions.count("routes.list") == 1


@pytest.mark.parametrize("in_operation", [False, True])
def test_route_quota_is_reported_as_route_limit_reached(compute, in_operation):
    nodes = [engine(compute, name) for name in NODES]
    for node in nodes:
        node.prepare()

    def fill() -> None:
        compute.route_limit, compute.limit_in_operation = len(compute.routes), in_operation

    message = full_table_error(nodes, fill)  # also: the status holds the message
    assert message.startswith(f"route limit reached: project flannel-test refused the route "
                              f"for {SUBNETS[2]} in network flannel-test/{VPC} (")
    assert "Quota 'ROUTES' exceeded" in message
    assert message.endswith("Raise the ROUTES quota of the project, or use a backend that "
                            "needs no route per node (vxlan)")
    compute.route_limit = None  # raised: the next pass routes it
    assert [[c.action for c in changes] for changes in reconcile_all(nodes)] == [
        [], [], ["create"]]


def test_an_operation_error_fails_the_pass_by_name(compute):
    node = engine(compute)
    node.prepare()
    compute.op_fail("RESOURCE_NOT_READY", "The resource 'node-1' is not ready")
    with pytest.raises(CloudError, match=r"Compute Engine routes\.insert failed: "
                                         r"RESOURCE_NOT_READY: The resource 'node-1' is not "
                                         r"ready"):
        node.reconcile(lease(SUBNETS[0]), [])


def test_an_operation_never_done_is_waited_on_with_a_bound(compute):
    node = engine(compute, operation_polls=30)
    node.prepare()
    compute.pending_polls = 100
    with pytest.raises(CloudError, match=r"Compute Engine routes.insert: operation "
                                         r"operation-\S+ not done after 0s"):
        node.reconcile(lease(SUBNETS[0]), [])
    assert compute.actions.count("globalOperations.get") == 30
    # A data plane pass waits less: its worker thread serves every other pass too.
    compute.delete_route("flannel-10-244-1-0-24")
    with pytest.raises(CloudError, match=r"not done after 0s; the next reconciliation"):
        node.reconcile(lease(SUBNETS[0]), [], wait_throttled=False)
    assert compute.actions.count("globalOperations.get") == 30 + 10


def test_an_api_that_does_not_answer_in_time_fails_the_call(compute, monkeypatch):
    monkeypatch.setattr("flannel.cloud.gce.API_TIMEOUT", 0.3)
    node = engine(compute)
    node.prepare()
    compute.delay = 1.0
    with pytest.raises(CloudError, match=r"Compute Engine routes.list: no usable answer from "
                                         r"http://127.0.0.1:\d+ \(no whole answer within "
                                         r"0.3s\)"):
        node.reconcile(lease(SUBNETS[0]), [])
    compute.delay = 0


#: Deeper than the decoder's recursion limit: json.loads alone raises RecursionError.
DEEP = "[" * 50_000


@pytest.mark.parametrize(("status", "message"), [
    pytest.param(200, "Compute Engine routes.list's answer nests JSON deeper than the limit "
                      "of 32 levels", id="answer"),
    # An error answer that cannot be read is reported by its status.
    pytest.param(500, "Compute Engine routes.list failed: HTTP 500: ", id="error-answer"),
])
def test_a_deeply_nested_api_answer_is_refused_by_name(compute, status, message):
    node = engine(compute)
    node.prepare()
    compute.garble("routes.list", status, "[" * 40_000)  # within the element bound
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value).startswith(message)
    assert node.status().last_error == str(raised.value)


def test_a_deeply_nested_token_answer_is_refused_by_name(compute):
    path = "instance/service-accounts/default/token"
    for deep, message in ((DEEP, "has more JSON elements than the limit of 100"),
                          ("[" * 50 + "]" * 50, "nests JSON deeper than the limit of 32 levels")):
        compute.metadata(NODES[0]).paths[path] = deep
        with pytest.raises(CloudError) as raised:
            engine(compute).prepare()
        assert str(raised.value) == f"the answer of the metadata server's {path} {message}"


def test_missing_permission_names_the_role(compute):
    node = engine(compute)
    node.prepare()
    compute.fail("routes.insert", 403, "forbidden")
    with pytest.raises(CloudError, match=r"Compute Engine routes.insert failed: forbidden: "
                                         r"injected forbidden \(the service account needs "):
        node.reconcile(lease(SUBNETS[0]), [])


def test_a_refused_token_is_fetched_again_once(compute):
    node = engine(compute)
    node.prepare()
    compute.tokens.clear()  # revoked
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    # One token at start, one fresh one after the refusal: not one per retry.
    assert [r for r in compute.metadata(NODES[0]).requests
            if r.endswith("service-accounts/default/token")] == \
        ["/computeMetadata/v1/instance/service-accounts/default/token"] * 2


def test_project_and_network_options_route_in_another_network(compute):
    node = engine(compute, backend={"Project": "flannel-test", "Network": "other-net"})
    node.prepare()
    node.reconcile(lease(SUBNETS[0]), [])
    assert compute.routes["flannel-10-244-1-0-24"]["network"] == \
        compute.networks["other-net"]["selfLink"]
    with pytest.raises(CloudError, match=r"network absent-net not found in project "
                                         r"flannel-test; set Backend\.Network"):
        engine(compute, backend={"Network": "absent-net"}).prepare()


def test_ip_forwarding_off_is_warned_about(compute):
    compute.instances[f"{ZONE}/node-1"]["canIpForward"] = False
    node = engine(compute)
    node.prepare()
    assert node.status().warnings == [
        "instance node-1 has IP forwarding off (canIpForward false): Compute Engine drops "
        "packets to its pods; create the instance with --can-ip-forward"]


@pytest.mark.parametrize(("path", "value", "message"), [
    ("project/project-id", "Not A Project", "GCE metadata project/project-id: unexpected "
                                            "value 'Not A Project'"),
    ("instance/zone", "projects/1/zones/../x", "GCE metadata instance/zone: unexpected value "
                                               "'x'"),
    ("instance/name", "node_1;rm", "GCE metadata instance/name: unexpected value "
                                   "'node_1;rm'"),
    ("instance/network-interfaces/0/network", "projects/1/networks/" + "n" * 70,
     "GCE metadata instance/network-interfaces/0/network: unexpected value 'nnn"),
])
def test_bad_metadata_is_refused_by_name(compute, path, value, message):
    compute.metadata(NODES[0]).paths[path] = value
    with pytest.raises(CloudError) as raised:
        engine(compute).prepare()
    assert str(raised.value).startswith(message)


def test_a_server_without_the_metadata_flavor_header_is_not_believed(compute):
    compute.metadata(NODES[0]).flavor = False
    with pytest.raises(CloudError, match="answered without the header Metadata-Flavor: "
                                         "Google, so it is not the GCE metadata server"):
        engine(compute).prepare()


def test_no_metadata_server_says_so(compute):
    metadata = GceMetadata("http://127.0.0.1:9", timeout=0.5)
    config = GceConfig.from_backend({"Endpoint": compute.url}, NETWORK, environ={})
    with pytest.raises(CloudError, match=r"the GCE metadata server at http://127\.0\.0\.1:9 did "
                                         r"not answer .*is this node a Compute Engine "
                                         r"instance\?"):
        GceRoutes(config, metadata).prepare()


def _key_file(tmp_path, compute) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    email = "flannel@flannel-test.iam.gserviceaccount.com"
    compute.keys["key-1"] = (email, public.decode())
    path = tmp_path / "key.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"type": "service_account", "project_id": "flannel-test",
                   "private_key_id": "key-1", "private_key": private, "client_email": email,
                   "token_uri": f"{compute.url}/token"}, file)
    return str(path), private


def test_a_service_account_key_file_signs_for_its_token(compute, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    path, private = _key_file(tmp_path, compute)
    node = engine(compute, environ={"GOOGLE_APPLICATION_CREDENTIALS": path})
    node.prepare()
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    assert not any(r.endswith("service-accounts/default/token")
                   for r in compute.metadata(NODES[0]).requests)
    assert "the service-account key of flannel@flannel-test.iam.gserviceaccount.com" in \
        caplog.text
    body = private.splitlines()[1]
    assert body not in caplog.text
    assert not any(token in caplog.text for token in compute.tokens)


def test_a_key_the_token_endpoint_does_not_know_is_refused(compute, tmp_path):
    path, _ = _key_file(tmp_path, compute)
    compute.keys.clear()
    with pytest.raises(CloudError, match=r"the token endpoint http://127.0.0.1:\d+/token "
                                         r"refused the key of flannel@flannel-test.iam."
                                         r"gserviceaccount.com: HTTP 400 invalid_grant"):
        engine(compute, environ={"GOOGLE_APPLICATION_CREDENTIALS": path}).prepare()


@pytest.mark.parametrize(("content", "message"), [
    ('{"type": "authorized_user"}', "holds credentials of type 'authorized_user'"),
    ("[]", "is not a JSON object"),
    ('{"type": "service_account"}', "lacks client_email, private_key"),
    pytest.param(DEEP, "nests JSON deeper than the limit of 32 levels", id="deeply-nested"),
    pytest.param('{"type": "service_account", "x": "' + "x" * 70_000 + '"}',
                 "is over 65536 bytes; not a service-account key file", id="oversized"),
])
def test_unusable_key_files_are_refused_by_name(compute, tmp_path, content, message):
    path = tmp_path / "key.json"
    path.write_text(content)
    with pytest.raises(CloudError, match=f"GOOGLE_APPLICATION_CREDENTIALS: '{path}' ") \
            as raised:
        engine(compute, environ={"GOOGLE_APPLICATION_CREDENTIALS": str(path)}).prepare()
    assert message in str(raised.value)


def test_a_fifo_as_the_key_file_is_refused_at_once(compute, tmp_path):
    """Opening a FIFO for reading waits for a writer: flanneld's start would hang."""
    fifo = tmp_path / "key.json"
    os.mkfifo(fifo, 0o600)

    def attempt() -> str:
        try:
            engine(compute, environ={"GOOGLE_APPLICATION_CREDENTIALS": str(fifo)}).prepare()
        except CloudError as error:
            return str(error)
        return "accepted"

    outcome = [outcome_of_reading(fifo, attempt, "GOOGLE_APPLICATION_CREDENTIALS")]
    assert outcome == [f"GOOGLE_APPLICATION_CREDENTIALS: cannot read '{fifo}' (Not a regular "
                       "file but a FIFO); point it at a service-account key file or unset it "
                       "to use the instance's service account"]


def test_our_route_from_before_the_mark_is_replaced_by_a_marked_one_first(compute, caplog):
    """An upgrade from Go flannel or an older pyflannel: our route has no description. A
    marked route is inserted beside it (under the second name, the first being taken)
    before the old one is deleted: the subnet is routed all along."""
    node = engine(compute)
    node.prepare()
    me = compute.instances[f"{ZONE}/node-1"]["selfLink"]
    compute.add_route("flannel-10-244-1-0-24", SUBNETS[0], compute.network_link,
                      nextHopInstance=me)
    with caplog.at_level(logging.INFO, logger="flannel"):
        assert [str(c) for c in node.reconcile(lease(SUBNETS[0]), [])] == [
            f"create {SUBNETS[0]} -> node-1 in flannel-test/{VPC}",
            f"delete {SUBNETS[0]} -> node-1 in flannel-test/{VPC}"]
    assert "adopting our route flannel-10-244-1-0-24" in caplog.text
    assert routes(compute) == {"flannel-10-244-1-0-24-m": (SUBNETS[0], "node-1")}
    assert compute.routes["flannel-10-244-1-0-24-m"]["description"] == DESCRIPTION
    # The insert came first.
    writes = [a for a in compute.actions if a in ("routes.insert", "routes.delete")]
    assert writes == ["routes.insert", "routes.delete"]
    assert node.reconcile(lease(SUBNETS[0]), []) == []
    # Deleted in the console, it comes back under the first name.
    compute.delete_route("flannel-10-244-1-0-24-m")
    assert [c.action for c in node.reconcile(lease(SUBNETS[0]), [])] == ["create"]
    assert routes(compute) == {"flannel-10-244-1-0-24": (SUBNETS[0], "node-1")}


def test_an_unmarked_route_for_our_subnet_elsewhere_is_reported_not_deleted(compute):
    node = engine(compute)
    node.prepare()
    other = compute.instances[f"{ZONE}/node-2"]["selfLink"]
    compute.add_route("flannel-10-244-1-0-24", SUBNETS[0], compute.network_link,
                      nextHopInstance=other)
    with pytest.raises(CloudError) as raised:
        node.reconcile(lease(SUBNETS[0]), [])
    assert str(raised.value) == (
        f"the route flannel-10-244-1-0-24 in project flannel-test sends our subnet "
        f"{SUBNETS[0]} to instance node-2, and flannel did not make it (it lacks flannel's "
        "description); delete it (gcloud compute routes delete flannel-10-244-1-0-24) so "
        "that flannel can route its subnet")
    assert routes(compute) == {"flannel-10-244-1-0-24": (SUBNETS[0], "node-2")}
