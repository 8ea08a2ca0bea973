"""flanneld as a process, with the gce or ali-vpc backend, against cloud doubles that stop
answering as they should (lab/flannel_lab/hostile.py): whatever the server does (an operation
never DONE, an answer dripping a byte a second, a metadata server dripping at start-up),
SIGTERM ends flanneld within 5 s, exit 0; and a listing of endless pages of megabytes keeps
its peak memory under twice its steady memory while /readyz says why it is not ready.

Each node is a namespace with a real etcd; the doubles serve on its loopback."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flannel.clients.aliyunrpc import MAX_ANSWER
from flannel.cloud.gce import MAX_PAGES
from flannel.kernel.host import Host
from flannel_lab import hostile
from flannel_lab.etcd import EtcdServer
from tests.support.aliyunapi import FakeAliyunMetadata, FakeAliyunVpc
from tests.support.flanneld import PREFIX, Flanneld, flanneld
from tests.support.gceapi import FakeCompute, FakeGceMetadata, metadata_paths
from tests.support.traffic import http_get
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cloud

NETWORK = "10.5.0.0/16"
ZONE = "europe-west1-b"
KEY_ID, SECRET = "LTAIflannelTestKey0001", "flannel-aliyun-secret-never-logged-9876"
INSTANCE, VPC = "i-bp1flannelnode00001", "vpc-bp1flannel0000000001"
PORT = 8082
#: What SIGTERM may take, whatever the cloud does: the calls it must cut would otherwise run
#: to their own timeout (10 s a call, 120 s a listing) or forever (an operation never DONE).
SHUTDOWN = 5.0


@dataclass
class Gce:
    compute: FakeCompute
    metadata: FakeGceMetadata

    def backend(self) -> dict[str, Any]:
        return {"Type": "gce", "Endpoint": self.compute.url}

    def env(self) -> dict[str, str]:
        return {"GCE_METADATA_HOST": self.metadata.host}


@dataclass
class Ali:
    api: FakeAliyunVpc
    metadata: FakeAliyunMetadata

    def backend(self) -> dict[str, Any]:
        return {"Type": "ali-vpc", "AccessKeyID": KEY_ID, "AccessKeySecret": SECRET,
                "Endpoint": f"http://{self.api.endpoint}", "MetadataURL": self.metadata.url}

    def env(self) -> dict[str, str]:
        return {}


@pytest.fixture
def gce(node, no_proxy) -> Iterator[tuple[str, EtcdServer, Gce]]:
    ns, server = node
    compute = FakeCompute("flannel-test").start("127.0.0.1", Host(ns))
    network = compute.add_network("flannel-net")
    compute.add_instance(ZONE, "node-1", address="10.99.0.2", network=network)
    metadata = FakeGceMetadata(compute, metadata_paths(compute, ZONE, "node-1", "flannel-net"))
    metadata.start("127.0.0.1", Host(ns))
    try:
        yield ns, server, Gce(compute, metadata)
    finally:
        metadata.stop()
        compute.stop()


@pytest.fixture
def ali(node, no_proxy) -> Iterator[tuple[str, EtcdServer, Ali]]:
    ns, server = node
    api = FakeAliyunVpc({KEY_ID: SECRET}).start("127.0.0.1", Host(ns))
    api.add_vpc(VPC)
    api.instances.add(INSTANCE)
    metadata = FakeAliyunMetadata({"127.0.0.1": {"region-id": "cn-hangzhou",
                                                 "instance-id": INSTANCE, "vpc-id": VPC}})
    metadata.start("127.0.0.1", Host(ns))
    try:
        yield ns, server, Ali(api, metadata)
    finally:
        metadata.stop()
        api.stop()


def start(tmp_path: Path, ns: str, server: EtcdServer, cloud: Gce | Ali,
          *extra: str) -> Flanneld:
    server.ctl("put", f"{PREFIX}/config", json.dumps({"Network": NETWORK,
                                                     "Backend": cloud.backend()}))
    proc = flanneld(tmp_path, ns, server, "--healthz-ip=127.0.0.1", f"--healthz-port={PORT}",
                    *extra)
    proc.env = cloud.env()
    return proc.start()


def stopped_within(proc: Flanneld, bound: float = SHUTDOWN) -> float:
    """SIGTERM; the seconds flanneld took to exit 0 (at most ``bound``)."""
    started = time.monotonic()
    proc.signal(signal.SIGTERM)
    code = proc.wait_exit(timeout=bound + 10)
    took = time.monotonic() - started
    assert code == 0, proc.log
    assert took < bound, (took, proc.log)
    assert "Traceback" not in proc.log and "failed on a bug" not in proc.log, proc.log
    return took


def test_sigterm_while_an_operation_is_never_done(gce, tmp_path):
    ns, server, cloud = gce
    cloud.compute.pending_polls = 10 ** 6
    proc = start(tmp_path, ns, server, cloud)
    try:
        wait_until(lambda: cloud.compute.actions.count("globalOperations.get") >= 2, 30,
                   what=f"flanneld waiting on its insert:\n{proc.log}")
        print(f"\nstopped in {stopped_within(proc):.2f}s while polling an operation")
    finally:
        proc.stop()


def test_sigterm_while_a_listing_drips(gce, tmp_path):
    ns, server, cloud = gce
    proc = start(tmp_path, ns, server, cloud, "--reconcile-interval=1")
    try:
        proc.wait_log("Ready:", timeout=60)
        cloud.compute.answer_with("routes.list", hostile.drip(b"{}" * 1000, 1.0), times=None)
        # Counted after: every later listing drips (the double counts it, then answers).
        listed = cloud.compute.actions.count("routes.list")
        wait_until(lambda: cloud.compute.actions.count("routes.list") > listed, 30,
                   what="a pass reading the dripping listing")
        time.sleep(1.5)  # well into the answer
        print(f"\nstopped in {stopped_within(proc):.2f}s while a listing dripped")
    finally:
        proc.stop()


def test_sigterm_while_the_metadata_server_drips_at_start(gce, tmp_path):
    ns, server, cloud = gce
    cloud.metadata.answer_with("project/project-id", hostile.drip(
        b"flannel-test", 1.0, headers={"Metadata-Flavor": "Google"}), times=None)
    proc = start(tmp_path, ns, server, cloud)
    try:
        wait_until(lambda: any("project-id" in r for r in cloud.metadata.requests), 30,
                   what=f"flanneld reading its identity:\n{proc.log}")
        print(f"\nstopped in {stopped_within(proc):.2f}s while metadata dripped")
    finally:
        proc.stop()


def test_a_metadata_server_dripping_at_start_is_cut_and_named(gce, tmp_path):
    ns, server, cloud = gce
    cloud.metadata.answer_with("project/project-id", hostile.drip(
        b"flannel-test", 1.0, headers={"Metadata-Flavor": "Google"}), times=None)
    proc = start(tmp_path, ns, server, cloud)
    try:
        assert proc.wait_exit(timeout=30) == 1
        assert ("gce backend: the GCE metadata server at http://127.0.0.1:"
                in proc.log), proc.log
        assert "(no whole answer within 2s); is this node a Compute Engine instance?" in \
            proc.log
        assert "Traceback" not in proc.log
    finally:
        proc.stop()


def test_sigterm_while_an_alibaba_call_drips(ali, tmp_path):
    ns, server, cloud = ali
    proc = start(tmp_path, ns, server, cloud, "--reconcile-interval=1")
    try:
        proc.wait_log("Ready:", timeout=60)
        dripping = hostile.drip(b"{}" * 1000, 1.0)
        served = [0]

        def counted(handler: Any) -> None:
            served[0] += 1
            dripping(handler)

        cloud.api.answer_with("DescribeRouteTables", counted, times=None)
        wait_until(lambda: served[0] > 0, 30, what="a pass reading the dripping answer")
        time.sleep(1.5)  # well into the answer
        print(f"\nstopped in {stopped_within(proc):.2f}s while an Alibaba call dripped")
    finally:
        proc.stop()


def test_sigterm_while_the_alibaba_metadata_service_drips_at_start(ali, tmp_path):
    ns, server, cloud = ali
    cloud.metadata.answer_with("/latest/meta-data/region-id", hostile.drip(b"cn-hangzhou", 1.0),
                               times=None)
    proc = start(tmp_path, ns, server, cloud)
    try:
        wait_until(lambda: any("region-id" in r[1] for r in cloud.metadata.requests), 30,
                   what=f"flanneld reading its identity:\n{proc.log}")
        print(f"\nstopped in {stopped_within(proc):.2f}s while metadata dripped")
    finally:
        proc.stop()


def peak_rss_kib(proc: Flanneld) -> int:
    assert proc.proc is not None
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    return int(status.split("VmHWM:", 1)[1].split()[0])


def test_endless_pages_of_megabytes_keep_memory_under_twice_the_steady(gce, tmp_path):
    """The probe that once took flanneld to 4 GB and the OOM killer: routes.list pages of
    megabytes of ``{}`` with a new page token each time, pass after pass."""
    ns, server, cloud = gce
    proc = start(tmp_path, ns, server, cloud, "--reconcile-interval=1")
    try:
        proc.wait_log("Ready:", timeout=60)
        wait_until(lambda: http_get(ns, f"http://127.0.0.1:{PORT}/readyz")[0] == 200, 30,
                   what="ready")
        time.sleep(3)  # a few passes: steady
        steady = proc.rss_kib()
        pages = iter(range(10 ** 9))

        def page(handler: Any) -> None:
            hostile.verbatim(200, '{"items": [' + "{}," * 650_000 + '{}], "nextPageToken": '
                             f'"t{next(pages)}"}}')(handler)

        def valid_page(handler: Any) -> None:
            # Near the most a page may hold: 1.3 MiB of valid routes (not ours), longest
            # link and description, a new token each time.
            items = [{"name": f"flannel-x-{i}", "destRange": "192.168.0.0/24",
                      "network": "projects/" + "n" * 500, "description": "d" * 2000}
                     for i in range(500)]
            hostile.verbatim(200, json.dumps({"items": items,
                                              "nextPageToken": f"t{next(pages)}"}))(handler)

        # Refused pages fail the pass (retried with backoff up to 5 s); pages of valid
        # routes are read up to the bound of 50 a pass: one whole pass and into the next.
        for behaviour, pages_read in ((page, 6), (valid_page, MAX_PAGES + 10)):
            cloud.compute.calm()
            cloud.compute.answer_with("routes.list", behaviour, times=None)
            enough = cloud.compute.actions.count("routes.list") + pages_read
            wait_until(lambda e=enough: cloud.compute.actions.count("routes.list") > e, 60,
                       what="passes over hostile pages")
            status, body = http_get(ns, f"http://127.0.0.1:{PORT}/readyz")
            assert status == 503 and "routes.list" in body, (status, body)
        peak = peak_rss_kib(proc)
        print(f"\nsteady RSS {steady} KiB, peak {peak} KiB ({peak / steady:.2f}x) over "
              f"{cloud.compute.actions.count('routes.list')} pages")
        assert peak <= 2 * steady, (steady, peak)
        cloud.compute.calm()  # the server comes back: so does readiness
        wait_until(lambda: http_get(ns, f"http://127.0.0.1:{PORT}/readyz")[0] == 200, 30,
                   what=f"ready again:\n{proc.log[-2000:]}")
        stopped_within(proc)
    finally:
        proc.stop()


def test_alibaba_answers_at_their_bounds_keep_memory_under_twice_the_steady(ali, tmp_path):
    """DescribeRouteTables answering as much as it may, pass after pass: megabytes of
    ``{}`` (refused by their elements), and a table of as many entries as 2 MiB hold (read,
    then dropped but for those that may be flannel's: none here)."""
    ns, server, cloud = ali
    proc = start(tmp_path, ns, server, cloud, "--reconcile-interval=1")
    try:
        proc.wait_log("Ready:", timeout=60)
        time.sleep(3)
        steady = proc.rss_kib()
        amplified = hostile.amplifying(650_000, "RouteTables")
        entries = [{"DestinationCidrBlock": f"192.168.{i // 250}.{i % 250}/32",
                    "Type": "Custom", "Status": "Available", "NextHopType": "Instance",
                    "InstanceId": f"i-bp1other{i:011d}", "RouteEntryName": f"admin-{i}",
                    "RouteEntryId": f"rte-{i:017d}", "RouteTableId": "vtb-x"}
                   for i in range(10_000)]
        while len(body := json.dumps({"RouteTables": {"RouteTable": [
                {"RouteTableId": "vtb-x", "RouteEntrys": {"RouteEntry": entries}}]}})) \
                > MAX_ANSWER:
            del entries[-500:]  # the most entries the answer's bound lets through
        table = hostile.verbatim(200, body)
        # Six passes over the megabytes of {}; three over the table, whose passes each end in
        # a failed create and its backoff (~5 s).
        for behaviour, passes in ((amplified, 6), (table, 3)):
            served = [0]

            def counted(handler: Any, behave: Any = behaviour, n: list[int] = served) -> None:
                n[0] += 1
                behave(handler)

            cloud.api.calm()
            cloud.api.answer_with("DescribeRouteTables", counted, times=None)
            wait_until(lambda n=served, p=passes: n[0] >= p, 90, what="passes over the answers")
        peak = peak_rss_kib(proc)
        print(f"\nsteady RSS {steady} KiB, peak {peak} KiB ({peak / steady:.2f}x); a table "
              f"of {len(entries)} entries, {len(body)} bytes")
        # The table was read (and our entry, missing from it, asked for again).
        assert "CreateRouteEntry failed: InvalidCIDRBlock.Duplicate" in proc.log
        assert peak <= 2 * steady, (steady, peak)
        stopped_within(proc)
    finally:
        proc.stop()
