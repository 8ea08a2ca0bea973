"""The cloud clients against servers that answer as a broken or compromised one would
(lab/flannel_lab/hostile.py, through the API doubles): huge bodies, amplifying JSON, deep
nesting, wrong types, endless and cycling pagination, redirects to another host, slow drip,
resets mid-body, 401/429/503 storms. Each is refused by name within its bound of time and
memory, no credential reaches the other host, and no route flanneld did not make, nor any
route at all on a failed listing, is deleted."""

from __future__ import annotations

import itertools
import json
import time
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from flannel.cloud.base import CloudError, Stopper
from flannel.cloud.gce import DESCRIPTION, MAX_ANSWER, MAX_ELEMENTS, MAX_PAGES, GceRoutes
from flannel.cloud.gceauth import GceMetadata, metadata_tokens
from flannel.cloud.metadata import ALIYUN_TOKENS, AWS_TOKENS, MetadataClient
from flannel_lab import hostile
from flannel_lab.hostile import Witness
from tests.support.alivpc import engine as ali_engine
from tests.support.cloudengines import SUBNETS, lease
from tests.support.gce import NODES, ZONE, engine
from tests.support.imds import FakeMetadata

pytestmark = pytest.mark.cloud

MiB = 1024 * 1024
#: A byte every DRIP seconds: the answer a stop must cut while it drips.
DRIP = 5.0
#: What a stop may take to cut a call under way. Not a speed bound (a loaded machine takes its
#: time to switch threads): uncut, the call runs on for 10 s or more (an operation never DONE,
#: a dripping answer until its timeout), and a cut that waited for the next byte would take
#: most of DRIP (the stop comes 0.5 s into it).
STOP_CUT = 2.5


@pytest.fixture
def witness() -> Iterator[Witness]:
    server = Witness().start()
    yield server
    server.stop()


def prepared(compute) -> GceRoutes:
    node = engine(compute)
    node.prepare()
    return node


def refused(call: Callable[[], object], within: float = 10.0) -> tuple[str, float, float]:
    """(the CloudError's message, seconds it took, peak MiB Python allocated meanwhile)."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(CloudError) as raised:
            call()
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1] / MiB
    finally:
        tracemalloc.stop()
    assert elapsed < within, (str(raised.value), elapsed)
    return str(raised.value), elapsed, peak


def with_orphan(compute) -> str:
    """A marked route of a vanished lease, which a successful second pass would delete."""
    gone = compute.instances[f"{ZONE}/node-3"]["selfLink"]
    compute.add_route("flannel-10-244-9-0-24", "10.244.9.0/24", compute.network_link,
                      nextHopInstance=gone, description=DESCRIPTION)
    return "flannel-10-244-9-0-24"


# -- Compute Engine: shapes ------------------------------------------------------------------


@pytest.mark.parametrize(("action", "answer", "message"), [
    ("routes.list", {"items": 5},
     "Compute Engine routes.list's answer: items is a number, not an array"),
    ("routes.list", {"items": [{"name": "flannel-10-244-1-0-24", "destRange": 7}]},
     "Compute Engine routes.list's answer: items[0].destRange is a number, not a string"),
    ("routes.list", {"items": ["flannel"]},
     "Compute Engine routes.list's answer: items[0] is a string, not an object"),
    ("routes.list", {"items": [], "nextPageToken": ["a"]},
     "Compute Engine routes.list's answer: nextPageToken is an array, not a string"),
    ("routes.list", [], "Compute Engine routes.list's answer: the answer is an array, not an "
                        "object"),
    ("routes.insert", {"name": "operation-1", "status": "DONE", "error": "boom"},
     "Compute Engine routes.insert's operation: error is a string, not an object"),
    ("routes.insert", {"name": "operation-1", "status": "DONE", "error": {"errors": 7}},
     "Compute Engine routes.insert's operation: error.errors is a number, not an array"),
    ("routes.insert", {"name": "operation-1", "status": "DONE", "httpErrorStatusCode": "abc",
                       "error": {"errors": [{"code": "X", "message": "m"}]}},
     "Compute Engine routes.insert's operation: httpErrorStatusCode is a string, not an "
     "integer"),
    ("routes.insert", {"name": "operation-1", "status": 3},
     "Compute Engine routes.insert's operation: status is a number, not a string"),
])
def test_an_answer_of_the_wrong_shape_is_refused_naming_the_field(compute, action, answer,
                                                                  message):
    node = prepared(compute)
    orphan = with_orphan(compute) if action == "routes.list" else ""
    compute.garble(action, 200, json.dumps(answer), times=2)
    for _ in range(2):
        assert refused(lambda: node.reconcile(lease(SUBNETS[0]), []))[0] == message
    assert not orphan or orphan in compute.routes  # a listing refused deletes nothing


@pytest.mark.parametrize(("action", "answer", "message"), [
    ("networks.get", {"selfLink": 5},
     "Compute Engine networks.get's answer: selfLink is a number, not a string"),
    ("networks.get", {"selfLink": ""}, "Compute Engine networks.get's answer: selfLink is empty"),
    ("instances.get", {"selfLink": "projects/p/zones/z/instances/i", "canIpForward": "yes"},
     "Compute Engine instances.get's answer: canIpForward is a string, not a boolean"),
])
def test_a_start_answer_of_the_wrong_shape_is_refused_naming_the_field(compute, action,
                                                                       answer, message):
    compute.garble(action, 200, json.dumps(answer))
    assert refused(engine(compute).prepare)[0] == message


def test_a_token_answer_of_the_wrong_shape_is_refused_naming_the_field(compute):
    compute.metadata(NODES[0]).answer_with(
        "instance/service-accounts/default/token",
        hostile.verbatim(200, '{"access_token": "t", "expires_in": "soon"}',
                         {"Metadata-Flavor": "Google"}))
    assert refused(engine(compute).prepare)[0] == (
        "the answer of the metadata server's instance/service-accounts/default/token: "
        "expires_in is a string, not a number")


# -- Compute Engine: size, elements, nesting --------------------------------------------------


@pytest.mark.parametrize(("behaviour", "message"), [
    pytest.param(hostile.huge(100 * 1024 * MiB), "an answer of 107374182400 bytes, over the "
                 f"limit of {MAX_ANSWER}", id="announced"),
    pytest.param(hostile.huge(100 * 1024 * MiB, announced=False),
                 f"an answer over the limit of {MAX_ANSWER} bytes", id="chunked"),
    pytest.param(hostile.amplifying(600_000), "Compute Engine routes.list's answer has more "
                 f"JSON elements than the limit of {MAX_ELEMENTS}", id="amplifying"),
    pytest.param(hostile.deep(40_000), "Compute Engine routes.list's answer nests JSON deeper "
                 "than the limit of 32 levels", id="deep"),
])
def test_a_huge_amplifying_or_deep_answer_is_refused_within_bounds(compute, behaviour,
                                                                   message):
    node = prepared(compute)
    orphan = with_orphan(compute)
    compute.answer_with("routes.list", behaviour, times=2)
    for _ in range(2):
        text, _, peak = refused(lambda: node.reconcile(lease(SUBNETS[0]), []))
        assert message in text
        # What a page may cost: its bytes a few times over, never the server's gigabytes.
        assert peak < 6 * MAX_ANSWER / MiB, peak
    assert orphan in compute.routes


def test_endless_pagination_ends_at_the_page_bound(compute):
    node = prepared(compute)
    orphan = with_orphan(compute)
    tokens = itertools.count()

    def page(handler) -> None:
        # A page as large as a real one (500 routes named flannel-*, not ours), a new token.
        items = [{"name": f"flannel-x-{i}", "destRange": "192.168.0.0/24",
                  "network": compute.network_link, "description": "x" * 500}
                 for i in range(500)]
        hostile.verbatim(200, json.dumps({"items": items,
                                          "nextPageToken": f"t{next(tokens)}"}))(handler)

    compute.answer_with("routes.list", page, times=None)
    text, elapsed, peak = refused(lambda: node.reconcile(lease(SUBNETS[0]), []), within=60)
    assert text == ("Compute Engine routes.list in project flannel-test: more than "
                    f"{MAX_PAGES} pages; refusing the listing")
    print(f"\n{MAX_PAGES} pages in {elapsed:.1f}s, peak {peak:.1f} MiB")
    assert peak < 40, peak
    assert orphan in compute.routes


def test_a_page_token_that_cycles_ends_the_listing(compute):
    node = prepared(compute)
    orphan = with_orphan(compute)
    tokens = itertools.cycle(["a", "b", "c"])
    compute.answer_with("routes.list", lambda handler: hostile.verbatim(
        200, json.dumps({"items": [], "nextPageToken": next(tokens)}))(handler), times=None)
    text, _, _ = refused(lambda: node.reconcile(lease(SUBNETS[0]), []))
    assert text == ("Compute Engine routes.list in project flannel-test: the page token "
                    "repeats (the listing goes round in a circle after 4 pages); refusing it")
    assert compute.actions.count("routes.list") == 4
    assert orphan in compute.routes


# -- Compute Engine: time, resets, storms ------------------------------------------------------


def test_a_dripping_answer_is_cut_at_the_whole_answer_deadline(compute, monkeypatch):
    monkeypatch.setattr("flannel.cloud.gce.API_TIMEOUT", 1.0)
    node = prepared(compute)
    compute.answer_with("routes.list", hostile.drip(b'{"items": []}' + b" " * 100, 0.2))
    text, elapsed, _ = refused(lambda: node.reconcile(lease(SUBNETS[0]), []), within=3)
    assert text.endswith("(no whole answer within 1s)"), text
    assert elapsed >= 1.0


def test_a_reset_mid_body_fails_the_call(compute):
    node = prepared(compute)
    compute.answer_with("routes.list", hostile.reset(10_000, b'{"items": ['))
    text, _, _ = refused(lambda: node.reconcile(lease(SUBNETS[0]), []))
    assert text.startswith("Compute Engine routes.list: no usable answer from http://"), text


def test_storms_of_401_429_and_503_are_bounded(compute):
    node = prepared(compute)
    orphan = with_orphan(compute)
    tokens_before = len(compute.metadata(NODES[0]).requests)
    compute.answer_with("routes.list", hostile.verbatim(401, '{"error": {"code": 401}}'),
                        times=None)
    assert refused(lambda: node.reconcile(lease(SUBNETS[0]), []))[0].startswith(
        "Compute Engine routes.list failed: HTTP 401")
    # One fresh token, one more try: not a loop.
    assert compute.actions.count("routes.list") == 2
    assert len(compute.metadata(NODES[0]).requests) - tokens_before == 1
    compute.calm()
    compute.answer_with("routes.list", hostile.verbatim(429, "{}"), times=None)
    assert "the cloud API kept throttling (429) after 5 attempts" in refused(
        lambda: node.reconcile(lease(SUBNETS[0]), []))[0]
    compute.calm()
    compute.answer_with("routes.list", hostile.verbatim(503, "<html>down</html>"), times=None)
    assert refused(lambda: node.reconcile(lease(SUBNETS[0]), []))[0] == (
        "Compute Engine routes.list failed: HTTP 503: ")
    assert orphan in compute.routes


# -- credentials stay with their host ----------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_compute_engine_redirects_are_not_followed(compute, witness, status):
    node = prepared(compute)
    compute.answer_with("routes.list", hostile.redirect(status, f"{witness.url}/steal"))
    text, _, _ = refused(lambda: node.reconcile(lease(SUBNETS[0]), []))
    assert text.startswith(f"Compute Engine routes.list: {compute.url} answered HTTP {status}, "
                           f"a redirect to '{witness.url[7:]}'; not followed"), text
    assert witness.requests == []


def test_the_token_endpoint_is_not_redirected(compute, witness, tmp_path):
    from tests.support.gce import service_account_key

    path, _ = service_account_key(tmp_path, compute)
    compute.answer_with("routes.list", hostile.redirect(307, f"{witness.url}/token"))
    node = engine(compute, environ={"GOOGLE_APPLICATION_CREDENTIALS": path})
    # The token endpoint is the double's /token: redirect it (a POST carrying the assertion).
    server = compute._server
    assert server is not None
    original = server.RequestHandlerClass.do_POST

    def redirecting(handler) -> None:
        if handler.path == "/token":
            return hostile.redirect(307, f"{witness.url}/token")(handler)
        return original(handler)

    server.RequestHandlerClass.do_POST = redirecting
    try:
        text, _, _ = refused(node.prepare)
    finally:
        server.RequestHandlerClass.do_POST = original
    assert text.startswith(f"the token endpoint {compute.url}/token refused the key of "
                           "flannel@flannel-test.iam.gserviceaccount.com: HTTP 307"), text
    assert witness.requests == []


def test_gce_metadata_redirects_are_not_followed(compute, witness):
    compute.metadata(NODES[0]).answer_with(
        "instance/service-accounts/default/token",
        hostile.redirect(302, f"{witness.url}/token"))
    text, _, _ = refused(engine(compute).prepare)
    assert text.startswith("GCE metadata instance/service-accounts/default/token: HTTP 302")
    assert witness.requests == []


@pytest.mark.parametrize("scheme", [AWS_TOKENS, ALIYUN_TOKENS], ids=["aws", "aliyun"])
def test_instance_metadata_redirects_never_carry_the_session_token(witness, scheme):
    service = FakeMetadata({"instance-id": "i-0123456789abcdef0"}, mode="required")
    service.token_header = scheme.token_header
    service.start()
    try:
        client = MetadataClient(service.url, token=True, scheme=scheme)
        assert client.get("instance-id") == "i-0123456789abcdef0"
        service.answer_with("/latest/meta-data/instance-id",
                            hostile.redirect(307, f"{witness.url}/latest/meta-data/x"))
        text, _, _ = refused(lambda: client.get("instance-id"))
        assert "answered HTTP 307, a redirect; not followed" in text
        assert witness.requests == []
    finally:
        service.stop()


# -- metadata: size and time --------------------------------------------------------------------


def test_metadata_answers_are_bounded_in_size_and_time():
    service = FakeMetadata({"instance-id": "i-0123456789abcdef0"}, mode="v1-only").start()
    try:
        client = MetadataClient(service.url, token=False, timeout=0.5)
        service.answer_with("/latest/meta-data/instance-id", hostile.huge(10 * 1024 * MiB))
        text, _, _ = refused(lambda: client.get("instance-id"))
        assert "sent an answer of 10737418240 bytes, over the limit of 65536" in text
        service.answer_with("/latest/meta-data/instance-id",
                            hostile.huge(10 * 1024 * MiB, announced=False))
        assert "sent an answer over the limit of 65536 bytes" in refused(
            lambda: client.get("instance-id"))[0]
        service.answer_with("/latest/meta-data/instance-id", hostile.drip(b"i-0" * 50, 0.1))
        text, _, _ = refused(lambda: client.get("instance-id"), within=2)
        assert text.startswith(f"the instance metadata service at {service.url} did not "
                               "answer (no whole answer within 0.5s)"), text
    finally:
        service.stop()


def test_gce_metadata_dripping_is_cut(compute):
    metadata = GceMetadata(f"http://{compute.metadata(NODES[0]).host}", timeout=0.5)
    compute.metadata(NODES[0]).answer_with(
        "project/project-id", hostile.drip(b"flannel-test", 0.2,
                                           headers={"Metadata-Flavor": "Google"}))
    text, _, _ = refused(lambda: metadata.get("project/project-id"), within=2)
    assert text.startswith("the GCE metadata server at http://127.0.0.1:") and \
        "(no whole answer within 0.5s)" in text, text


# -- stopping ----------------------------------------------------------------------------------


def test_a_stop_cuts_a_dripping_call_and_an_operation_waited_on_at_once(compute):
    import threading

    node = engine(compute, operation_polls=1000)
    node.prepare()
    compute.pending_polls = 10 ** 6  # never DONE
    outcome: list[str] = []

    def run() -> None:
        try:
            node.reconcile(lease(SUBNETS[0]), [])
        except CloudError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)  # inside the wait for the operation
    started = time.monotonic()
    node.interrupt()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < STOP_CUT
    assert outcome[0].endswith("flanneld is stopping"), outcome
    # A dripping answer is cut just as fast, and nothing is asked once stopped.
    fresh = engine(compute)
    fresh.prepare()
    compute.answer_with("routes.list", hostile.drip(b"{}" * 100, DRIP))
    thread = threading.Thread(target=lambda: refused(
        lambda: fresh.reconcile(lease(SUBNETS[0]), [])))
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    fresh.interrupt()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < STOP_CUT
    calls = len(compute.actions)
    with pytest.raises(CloudError, match="flanneld is stopping"):
        fresh.reconcile(lease(SUBNETS[0]), [])
    assert len(compute.actions) == calls


def test_a_stop_cuts_the_metadata_token_read(compute):
    import threading

    stopper = Stopper()
    metadata = GceMetadata(f"http://{compute.metadata(NODES[0]).host}", timeout=60,
                           stopper=stopper)
    compute.metadata(NODES[0]).answer_with(
        "instance/service-accounts/default/token",
        hostile.drip(b'{"access_token": "t"}', 1.0, headers={"Metadata-Flavor": "Google"}))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            metadata_tokens(metadata).token()
        except CloudError as error:
            outcome.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    stopper.stop()
    thread.join(2)
    assert not thread.is_alive()
    assert str(outcome[0]).endswith("flanneld is stopping"), outcome


# -- Alibaba Cloud -------------------------------------------------------------------------------


@pytest.mark.parametrize(("action", "answer", "message"), [
    ("DescribeVpcs", {"Vpcs": {"Vpc": [{"VRouterId": 5}]}},
     "the answer to Alibaba Cloud VPC DescribeVpcs: Vpcs.Vpc[0].VRouterId is a number, not a "
     "string"),
    ("DescribeVpcs", {"Vpcs": "none"},
     "the answer to Alibaba Cloud VPC DescribeVpcs: Vpcs is a string, not an object"),
    ("DescribeVpcs", {"Code": 5},
     "the answer to Alibaba Cloud VPC DescribeVpcs: Code is a number, not a string"),
    ("DescribeVpcs", [1], "the answer to Alibaba Cloud VPC DescribeVpcs: the answer is an "
                          "array, not an object"),
])
def test_alibaba_answers_of_the_wrong_shape_are_refused_naming_the_field(cloud, action,
                                                                         answer, message):
    api, _ = cloud
    api.answer_with(action, hostile.verbatim(200, json.dumps(answer)))
    assert refused(ali_engine(cloud, 0).prepare)[0] == message


def test_alibaba_route_entries_of_the_wrong_shape_are_refused(cloud):
    api, _ = cloud
    node = ali_engine(cloud, 0)
    node.prepare()
    for entries, message in (
            ("x", "RouteTables.RouteTable[0].RouteEntrys.RouteEntry is a string, not an array"),
            ([{"DestinationCidrBlock": ["10.244.1.0/24"]}],
             "RouteTables.RouteTable[0].RouteEntrys.RouteEntry[0].DestinationCidrBlock is an "
             "array, not a string")):
        api.answer_with("DescribeRouteTables", hostile.verbatim(200, json.dumps(
            {"RouteTables": {"RouteTable": [{"RouteEntrys": {"RouteEntry": entries}}]}})))
        assert refused(lambda: node.reconcile(lease(SUBNETS[0]), []))[0] == (
            f"the answer to Alibaba Cloud VPC DescribeRouteTables: {message}")


def test_alibaba_redirects_are_not_followed(cloud, witness):
    api, _ = cloud
    api.answer_with("DescribeVpcs", hostile.redirect(302, f"{witness.url}/?Action=x"))
    text, _, _ = refused(ali_engine(cloud, 0).prepare)
    assert text.startswith("Alibaba Cloud VPC DescribeVpcs: HTTP 302, not a JSON answer"), text
    assert witness.requests == []


def test_alibaba_answers_are_bounded_in_size_elements_and_time(cloud):
    api, _ = cloud
    node = ali_engine(cloud, 0, timeout=1.0)
    node.prepare()
    for behaviour, message in (
            (hostile.huge(10 * 1024 * MiB), "over the limit of 2097152"),
            (hostile.huge(10 * 1024 * MiB, announced=False), "over the limit of 2097152"),
            (hostile.amplifying(600_000, "RouteTables"),
             "has more JSON elements than the limit of 200000"),
            (hostile.deep(100_000), "nests JSON deeper than the limit of 32 levels"),
            (hostile.drip(b"{}" * 50, 0.2), "no answer from"),
            (hostile.reset(10_000, b"{"), "could not talk to")):
        api.answer_with("DescribeRouteTables", behaviour)
        text, _, peak = refused(lambda: node.reconcile(lease(SUBNETS[0]), []), within=5)
        assert message in text, text
        assert peak < 50, (text, peak)


def test_alibaba_storms_are_bounded(cloud):
    api, _ = cloud
    node = ali_engine(cloud, 0)
    node.prepare()
    api.answer_with("DescribeRouteTables", hostile.verbatim(503, "<html>busy</html>"),
                    times=None)
    assert "kept throttling (ServiceUnavailable) after 5 attempts" in refused(
        lambda: node.reconcile(lease(SUBNETS[0]), []))[0]
    assert api.actions.count("DescribeRouteTables") == 0  # answered before the double's logic
    api.calm()
    api.answer_with("DescribeRouteTables", hostile.verbatim(401, '{"Code": "InvalidAccessKey'
                                                                 'Id.NotFound"}'), times=None)
    assert refused(lambda: node.reconcile(lease(SUBNETS[0]), []))[0].startswith(
        "Alibaba Cloud VPC DescribeRouteTables failed: InvalidAccessKeyId.NotFound")


def test_a_stop_cuts_an_alibaba_call_at_once(cloud):
    import threading

    api, _ = cloud
    node = ali_engine(cloud, 0, timeout=60)
    node.prepare()
    api.answer_with("DescribeRouteTables", hostile.drip(b"{}" * 100, DRIP))
    outcome: list[str] = []

    def run() -> None:
        try:
            node.reconcile(lease(SUBNETS[0]), [])
        except CloudError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    node.interrupt()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - started < STOP_CUT
    assert outcome == ["Alibaba Cloud VPC DescribeRouteTables: not done, flanneld is stopping"]

