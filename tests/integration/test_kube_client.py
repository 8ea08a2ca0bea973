"""flanneld's own Kubernetes API client (flannel.clients.kube.client, kubeconfig, over
flannel.clients.http) against the API-server test double (tests/support/kubeapi.py) over real
HTTP/1.1, with a real TLS handshake (certificates made by the openssl command line):
in-cluster and kubeconfig credentials, error messages, pagination, bounds, hostile nodes."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from flannel.clients.kube.client import ApiUnreachable, KubeClient
from flannel.clients.kube.config import client_config
from flannel.lease import EventType
from flannel.subnet.errors import StoreError, StoreUnavailable
from flannel.subnet.kube.annotations import Annotations
from flannel.subnet.kube.manager import KubeError, KubeSubnetManager, KubeUnavailable, kube_client
from flannel.subnet.watch import Snapshot
from tests.support.kubeapi import FakeKubeAPI, kubelet_node
from tests.support.kubestore import VXLAN, Follower, P, remote, write_kubeconfig
from tests.support.tlscerts import PKI, make_pki
from tests.support.waiting import async_wait_until

NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")

pytestmark = pytest.mark.virtual_time


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def api():
    server = FakeKubeAPI()
    server.put_node("node1", ["10.244.1.0/24"])
    yield server
    await server.stop()


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


async def node_name_through(kubeconfig: Path) -> str:
    """The name of node1 as read by a client made from ``kubeconfig``."""
    client = kube_client("", str(kubeconfig), {})
    try:
        return (await client.get_node("node1"))["metadata"]["name"]
    finally:
        await client.close()


def manager(client: KubeClient, tmp_path: Path) -> KubeSubnetManager:
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}))
    return KubeSubnetManager(client, "node1", NAMES, str(conf), keep_backoff=(0.05, 0.5),
                             retry_interval=0.1)


async def test_in_cluster_token_file_rotation_is_picked_up(api, pki, tmp_path):
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(pki.ca.read_bytes())
    (account / "token").write_text("first-token\n")
    api.authorization = "Bearer first-token"
    await api.start(tls=pki.server_context())
    config = client_config("", "", {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                    "KUBERNETES_SERVICE_PORT": str(api.port)}, str(account))
    client = KubeClient(config)
    try:
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
        # The kubelet rotates the bound token: the server accepts only the new one now.
        api.authorization = "Bearer second-token"
        (account / "token").write_text("second-token\n")
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
        # A token the server never accepts: one re-read, then the refusal reaches the user.
        api.authorization = "Bearer third-token"
        with pytest.raises(KubeError) as caught:
            await manager(client, tmp_path).get_node()
        assert str(caught.value) == (
            "cannot get node 'node1': Unauthorized (HTTP 401): the API server did not accept "
            f"the token file {account}/token; renew or correct these credentials")
    finally:
        await client.close()


async def test_kubeconfig_with_client_certificate_data_leaves_no_key_file(api, pki, tmp_path,
                                                                           monkeypatch):
    scratch = tmp_path / "run"
    scratch.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(scratch))
    await api.start(tls=pki.server_context(require_client_cert=True))
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url.replace("127.0.0.1", "localhost"),
                            {"certificate-authority-data": b64(pki.ca)},
                            {"client-certificate-data": b64(pki.client_cert),
                             "client-key-data": b64(pki.client_key)})
    assert await node_name_through(path) == "node1"
    assert list(scratch.iterdir()) == []  # the key went through a file removed at once
    # Without the certificate the server refuses the handshake.
    path = write_kubeconfig(tmp_path / "nocert", api.url,
                            {"certificate-authority-data": b64(pki.ca)}, {})
    client = kube_client("", str(path), {})
    try:
        with pytest.raises(KubeUnavailable, match="cannot get node 'node1': cannot reach"):
            await manager(client, tmp_path).get_node()
    finally:
        await client.close()


async def test_kubeconfig_with_files_relative_to_it(api, pki, tmp_path):
    await api.start(tls=pki.server_context(require_client_cert=True))
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    for source in (pki.ca, pki.client_cert, pki.client_key):
        (conf_dir / source.name).write_bytes(source.read_bytes())
    path = write_kubeconfig(conf_dir / "kubeconfig", api.url,
                            {"certificate-authority": pki.ca.name},
                            {"client-certificate": pki.client_cert.name,
                             "client-key": pki.client_key.name})
    assert await node_name_through(path) == "node1"


async def test_kubeconfig_with_token_and_a_wrong_one(api, pki, tmp_path):
    api.authorization = "Bearer s3cret"
    await api.start(tls=pki.server_context())
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.ca)}, {"token": "s3cret"})
    assert await node_name_through(path) == "node1"
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.ca)}, {"token": "wrong"})
    client = kube_client("", str(path), {})
    try:
        with pytest.raises(KubeError) as caught:
            await manager(client, tmp_path).get_node()
        assert str(caught.value) == (
            "cannot get node 'node1': Unauthorized (HTTP 401): the API server did not accept "
            f"the token of users[0].user in {path}; renew or correct these credentials")
        assert "wrong" not in str(caught.value)
    finally:
        await client.close()


PLUGIN = """#!{python}
import json, os, sys
with open(sys.argv[1], "a") as runs:
    runs.write(os.environ["FLANNEL_TEST"] + "\\n")
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
status = {{"token": "from-plugin"}}
if sys.argv[2] != "none":
    status["expirationTimestamp"] = sys.argv[2]
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential",
                  "status": status}}))
"""


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
@pytest.mark.virtual_time(False)  # the exec plugin runs as a process, in real time
async def test_kubeconfig_with_an_exec_plugin_cached_until_it_expires(api, pki, tmp_path,
                                                                       version):
    api.authorization = "Bearer from-plugin"
    await api.start(tls=pki.server_context())
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    runs = tmp_path / "runs"
    for expiry, expected_runs in (("2999-01-01T00:00:00Z", 1), ("2000-01-01T00:00:00Z", 3)):
        runs.write_text("")
        path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                                {"certificate-authority": str(pki.ca)}, {"exec": {
                                    "apiVersion": f"client.authentication.k8s.io/{version}",
                                    "command": "./plugin.py", "args": [str(runs), expiry],
                                    "env": [{"name": "FLANNEL_TEST", "value": "ran"}]}})
        client = kube_client("", str(path), {})
        try:
            for _ in range(3):
                assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
        finally:
            await client.close()
        assert runs.read_text().split() == ["ran"] * expected_runs


async def test_bad_kubeconfig_fields_are_named(tmp_path):
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443",
                            {"certificate-authority-data": "not base64!"}, {})
    with pytest.raises(KubeError) as caught:
        kube_client("", str(path), {})
    assert str(caught.value) == (f"cannot build the Kubernetes client config: {path}: "
                                 "clusters[0].cluster.certificate-authority-data is not base64")
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443", {},
                            {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1",
                                      "command": "x"}})
    with pytest.raises(KubeError, match=r"users\[0\]\.user\.exec\.apiVersion must be one of"):
        kube_client("", str(path), {})
    path.write_text("current-context: [")
    with pytest.raises(KubeError, match=f"{path}: not valid YAML at line 1"):
        kube_client("", str(path), {})


async def test_a_server_certificate_from_another_ca_is_refused(api, pki, tmp_path):
    await api.start(tls=pki.server_context())
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.other_ca)}, {})
    client = kube_client("", str(path), {})
    try:
        with pytest.raises(KubeError) as caught:  # not retryable: a wrong CA stays wrong
            await manager(client, tmp_path).get_node()
        assert str(caught.value) == (
            f"cannot get node 'node1': the certificate of {api.url} is not trusted "
            "(unable to get local issuer certificate); check the certificate authority given "
            f"by the kubeconfig {path}")
    finally:
        await client.close()


async def test_api_errors_are_classified_by_http_status_not_text(api, tmp_path):
    """A missing pod (404 from the API) is fatal; 429 and 5xx answers are retryable; 403
    names the permission to grant."""
    await api.start()
    client = kube_client(api.url, "", {})
    sm = manager(client, tmp_path)
    try:
        for code, retryable in ((429, True), (500, True), (503, True), (504, True),
                                (401, False), (403, False), (404, False), (422, False)):
            # Texts that say the opposite of the status: only the status may count.
            api.fail_next.append((code, "service unavailable" if not retryable else "forbidden"))
            with pytest.raises(StoreUnavailable if retryable else StoreError) as caught:
                await sm.get_node()
            assert isinstance(caught.value, KubeUnavailable) is retryable, code
        api.fail_next.append((403, 'nodes "node1" is forbidden: User "system:serviceaccount:'
                                   'kube-flannel:flannel" cannot get resource "nodes"'))
        with pytest.raises(KubeError) as caught:
            await sm.get_node()
        assert str(caught.value) == (
            'cannot get node \'node1\': nodes "node1" is forbidden: User "system:serviceaccount:'
            'kube-flannel:flannel" cannot get resource "nodes" (HTTP 403): allow flanneld\'s '
            "service account to get nodes (the ClusterRole flannel in deploy/kube-flannel.yml)")
    finally:
        await sm.close()


async def test_keep_alive_and_a_body_cut_midway_is_retried(api, tmp_path):
    await api.start()
    client = kube_client(api.url, "", {})
    sm = manager(client, tmp_path)
    try:
        for _ in range(5):
            await client.get_node("node1")
        assert api.connections == 1  # one keep-alive connection for every request
        api.truncate_next = 1
        with pytest.raises(KubeUnavailable, match="closed the connection mid-body"):
            await sm.get_node()
        api.truncate_next = 1  # retried in acquisition too, while the start waits for the node
        config = await sm.get_network_config()
        lease = await sm.acquire_lease(config, VXLAN)
        assert str(lease.subnet) == "10.244.1.0/24"
        assert api.truncate_next == 0
    finally:
        await sm.close()


async def test_list_is_paginated_and_relisted_when_its_continue_token_expires(api, tmp_path):
    for i in range(2, 1201):
        api.put_node(f"node{i}", [f"10.{i // 256}.{i % 256}.0/24"])
    await api.start()
    client = KubeClient(client_config(api.url, "", {}), page_size=500)
    try:
        names, version = await client.list_nodes(lambda n: n["metadata"]["name"])
        assert sorted(names) == sorted(api.nodes) and version == str(api.rv)
        lists = [r for r in api.requests if r.startswith("GET /api/v1/nodes?limit=500")]
        assert len(lists) == 3 and sum("continue=" in r for r in lists) == 2
        api.requests.clear()
        compacted = []

        def keep(node):  # the history is compacted while the list is half read
            if not compacted:
                compacted.append(True)
                api.put_node("late", ["10.250.0.0/24"])
                api.compact()
            return node["metadata"]["name"]
        names, version = await client.list_nodes(keep)
        assert "late" in names and len(names) == len(api.nodes) and version == str(api.rv)
        assert sum(r.startswith("GET /api/v1/nodes?limit=500&continue=") for r in
                   api.requests) == 3  # the expired one, then two from a fresh start
    finally:
        await client.close()


async def test_a_page_of_kubelet_nodes_is_kept_node_by_node_and_gives_the_same_leases(
        api, tmp_path):
    """Each node of a page is decoded and kept before the next is decoded: while the node
    store keeps one, the client holds the page's text and that node, never the page's
    other documents (100 kubelet-shaped Nodes: 1.5 MB of JSON, 6 MB decoded). The leases
    are those of the nodes' annotations, as from nodes that carry nothing else."""
    import tracemalloc

    for i in range(2, 252):
        cidr, ip = f"10.244.{i}.0/24", f"10.0.{i // 250}.{i % 250}"
        mac = f"0e:00:00:00:00:{i % 250:02x}"
        api.put_raw_node(f"node{i}", kubelet_node(f"node{i}", cidr, ip, annotations={
            P + "kube-subnet-manager": "true", P + "backend-type": "vxlan",
            P + "backend-data": json.dumps({"VNI": 1, "VtepMAC": mac}), P + "public-ip": ip}))
    page_bytes = len(json.dumps([api.nodes[f"node{i}"] for i in range(2, 102)]))
    await api.start()
    sm = manager(KubeClient(client_config(api.url, "", {})), tmp_path)
    held: list[int] = []

    def view(raw):
        if raw["metadata"]["name"] == "node150":  # mid-page
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, "*/flannel/untrusted/boundedjson.py",
                                    all_frames=True)])
            held.append(sum(stat.size for stat in snapshot.statistics("filename")))
        return sm._view(raw)
    tracemalloc.start(8)
    try:
        views, _ = await sm.client.list_nodes(view)
    finally:
        tracemalloc.stop()
    assert len(held) == 1 and held[0] < 1.5 * page_bytes, (held, page_bytes)
    assert {v.name for v in views} == set(api.nodes)
    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config)
        try:
            await follower.wait_for(250)
            leases = {lease.key: lease for update in follower.updates for lease in (
                update.leases if isinstance(update, Snapshot) else
                [event.lease for event in update.events])}
            del leases["10.244.1.0-24"]  # this node's own
            assert sorted((key, str(lease.attrs.public_ip), lease.attrs.backend_type,
                           json.loads(lease.attrs.backend_data))
                          for key, lease in leases.items()) == \
                sorted((f"10.244.{i}.0-24", f"10.0.{i // 250}.{i % 250}", "vxlan",
                        {"VNI": 1, "VtepMAC": f"0e:00:00:00:00:{i % 250:02x}"})
                       for i in range(2, 252))
        finally:
            await follower.stop()
    finally:
        await sm.close()


async def test_a_watch_event_over_the_bound_relists_and_others_converge(api, tmp_path, caplog):
    await api.start()
    client = KubeClient(client_config(api.url, "", {}), max_event_bytes=64 * 1024)
    sm = manager(client, tmp_path)
    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config)
        try:
            remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
            await follower.wait_for(1)
            api.put_node("node2", annotations={"example.com/big": "x" * 100_000})
            remote(api, "node3", "10.244.3.0/24", "10.0.0.3")
            await follower.wait_for(2)
            assert sm.status.relists == 2
        finally:
            await follower.stop()
    finally:
        await sm.close()
    assert "node watch: a line of the response is longer than the limit of 65536 bytes; " \
           "relisting the nodes" in caplog.text


async def test_hostile_node_objects_are_skipped_once_and_others_converge(api, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    hostile = {
        "spec-string": {"metadata": {"name": "spec-string"}, "spec": "10.244.7.0/24"},
        "annotations-list": {"metadata": {"name": "annotations-list", "annotations": ["a"]}},
        "metadata-number": {"metadata": 7},
        "name-number": {"metadata": {"name": 42, "annotations": {}}, "spec": {}},
        "deep-annotation": {"metadata": {"name": "deep-annotation", "annotations": {
            "flannel.alpha.coreos.com/backend-data": json.loads("[" * 100 + "]" * 100)}}},
        "cidrs-number": {"metadata": {"name": "cidrs-number", "annotations": {
            "flannel.alpha.coreos.com/kube-subnet-manager": "true"}}, "spec": {"podCIDRs": 7}},
        "annotation-number": {"metadata": {"name": "annotation-number", "annotations": {
            "flannel.alpha.coreos.com/kube-subnet-manager": "true",
            "flannel.alpha.coreos.com/public-ip": 5}}, "spec": {"podCIDR": "10.244.6.0/24"}},
    }
    for name, node in hostile.items():
        api.put_raw_node(name, node)
    await api.start()
    sm = manager(kube_client(api.url, "", {}), tmp_path)
    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config)
        try:
            remote(api, "good", "10.244.8.0/24", "10.0.0.8")
            await follower.wait_for(1)
            for name, node in hostile.items():  # redelivered by the watch: not logged again
                api.put_raw_node(name, node)
            remote(api, "good2", "10.244.9.0/24", "10.0.0.9")
            await follower.wait_for(2)
            assert sorted(follower.events) == [(EventType.ADDED, "10.244.8.0-24"),
                                               (EventType.ADDED, "10.244.9.0-24")]
        finally:
            await follower.stop()
    finally:
        await sm.close()
    assert sm.undecodable.current == {
        "spec-string": "spec is not a map",
        "annotations-list": "metadata.annotations is not a map",
        "(unnamed)": "metadata.name is not a node name",
        "deep-annotation": "annotation flannel.alpha.coreos.com/backend-data must be a string",
        "cidrs-number": 'node "cidrs-number": pod CIDRs must be a list of CIDR strings',
        "annotation-number": "annotation flannel.alpha.coreos.com/public-ip must be a string"}
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ignoring")]
    assert len(warnings) == len(set(warnings)) == 6
    assert sm.undecodable.total >= len(hostile)


def test_key_files_are_private(tmp_path, pki, monkeypatch):
    """The scratch file ssl loads a key from is created 0600, O_EXCL, and is gone after."""
    import ssl

    from flannel.clients.kube import auth as kubeauth

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    seen = []
    real = ssl.SSLContext.load_cert_chain

    def spy(self, path, *rest):
        seen.append(stat.S_IMODE(os.stat(path).st_mode))
        return real(self, path, *rest)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    kubeauth.load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT),
                             pki.client_cert.read_bytes(), pki.client_key.read_bytes())
    assert seen == [0o600] and list(tmp_path.iterdir()) == []


async def test_watch_stream_is_bounded_in_time(api, tmp_path):
    """The server ends a watch after timeoutSeconds; the client resumes from its version."""
    await api.start()
    client = KubeClient(client_config(api.url, "", {}), watch_timeout=(1, 2))
    try:
        events = []
        since = str(api.rv)

        async def follow():
            async for kind, node in client.watch_nodes(since):
                events.append((kind, node["metadata"]["name"]))
        api.put_node("node2", ["10.244.2.0/24"])
        await asyncio.wait_for(follow(), 10)  # ends by itself after timeoutSeconds
        assert events == [("ADDED", "node2")]
    finally:
        await client.close()
    # A stream that stays silent past timeoutSeconds plus the grace is given up.
    api.stall_watches = True
    client = KubeClient(client_config(api.url, "", {}), watch_timeout=(1, 2), watch_grace=0.5)
    try:
        with pytest.raises(ApiUnreachable, match=f"^{api.url} did not answer within 1.5s$"):
            await asyncio.wait_for(anext(client.watch_nodes(str(api.rv))), 10)
    finally:
        await client.close()


async def test_oversized_answers_are_refused_with_the_bound(api, tmp_path):
    await api.start()
    client = KubeClient(client_config(api.url, "", {}))
    sm = manager(client, tmp_path)
    try:
        api.header_padding = 70_000
        with pytest.raises(KubeUnavailable) as caught:
            await sm.get_node()
        assert str(caught.value) == (f"cannot get node 'node1': {api.url}: response "
                                     "headers exceed 65536 bytes")
        api.header_padding = 0
        api.put_node("node1", annotations={"example.com/big": "x" * (4 << 20)})
        with pytest.raises(KubeUnavailable) as caught:
            await sm.get_node()
        assert str(caught.value).endswith("is larger than the limit of 3145728 bytes")
        api.put_node("node1", annotations={"example.com/big": ""})
        assert (await sm.get_node())["metadata"]["name"] == "node1"  # and it recovers
    finally:
        await sm.close()


async def test_kubeconfig_with_user_name_and_password_and_insecure_skip_verify(api, pki,
                                                                              tmp_path):
    api.authorization = "Basic " + base64.b64encode(b"admin:pa:ss").decode()
    await api.start(tls=pki.server_context())
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"insecure-skip-tls-verify": True},
                            {"username": "admin", "password": "pa:ss"})
    assert await node_name_through(path) == "node1"
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"insecure-skip-tls-verify": "yes"}, {"username": "admin"})
    with pytest.raises(KubeError, match=r"clusters\[0\]\.cluster\.insecure-skip-tls-verify "
                                        "must be true or false"):
        kube_client("", str(path), {})


async def test_kube_api_url_replaces_the_kubeconfig_server(api, pki, tmp_path):
    """As Go flannel's BuildConfigFromFlags: the flag wins, the kubeconfig's TLS and user
    stay."""
    api.authorization = "Bearer s3cret"
    await api.start(tls=pki.server_context())
    path = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:1",
                            {"certificate-authority": str(pki.ca)}, {"token": "s3cret"})
    client = kube_client(api.url, str(path), {})
    try:
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
    finally:
        await client.close()


async def test_watch_events_cut_across_chunks_arrive_whole(api, tmp_path):
    await api.start()
    api.chunk_size = 7  # every event line spans many chunks, cut mid-token
    client = KubeClient(client_config(api.url, "", {}), watch_timeout=(1, 2))
    try:
        since = str(api.rv)
        api.put_node("node2", ["10.244.2.0/24"], {"example.com/x": "é" * 50})
        api.delete_node("node2")
        events = [(kind, node["metadata"]["name"], node["metadata"]["annotations"])
                  async for kind, node in client.watch_nodes(since)]
        assert events == [("ADDED", "node2", {"example.com/x": "é" * 50}),
                          ("DELETED", "node2", {"example.com/x": "é" * 50})]
    finally:
        await client.close()


SPLIT_PLUGIN = """#!{python}
import sys, time
credential = ('{{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", '
              '"status": {{"token": "from-plugin"}}}}')
sys.stderr.write("x" * {stderr_bytes})
sys.stderr.flush()
half = len(credential) // 2
sys.stdout.write(credential[:half])
sys.stdout.flush()
time.sleep(0.3)
sys.stdout.write(credential[half:] + "\\n")
"""


@pytest.mark.parametrize("stderr_bytes", [0, 100 * 1024])
@pytest.mark.virtual_time(False)  # the exec plugin runs as a process, in real time
async def test_exec_plugin_answer_in_parts_and_a_noisy_stderr(api, pki, tmp_path, stderr_bytes):
    """A plugin's answer is read to its end, however many writes it takes, and its stderr is
    drained as it runs: 100 KiB of it (more than a pipe holds) does not block the plugin."""
    api.authorization = "Bearer from-plugin"
    await api.start(tls=pki.server_context())
    plugin = tmp_path / "plugin.py"
    plugin.write_text(SPLIT_PLUGIN.format(python=sys.executable, stderr_bytes=stderr_bytes))
    plugin.chmod(0o755)
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.ca)}, {"exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": str(plugin)}})
    client = kube_client("", str(path), {})
    try:
        node = await asyncio.wait_for(client.get_node("node1"), 10)
        assert node["metadata"]["name"] == "node1"
    finally:
        await client.close()


async def test_a_server_url_path_prefixes_every_request(api, tmp_path):
    """A server behind a proxy that serves it under a path (Rancher's /k8s/clusters/<id>):
    list, watch, get and patch all go to that path, as client-go sends them."""
    api.path_prefix = "/k8s/clusters/c-abc"
    await api.start()
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url + "/", {}, {})
    client = kube_client("", str(path), {})
    try:
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
        nodes, version = await client.list_nodes(lambda node: node["metadata"]["name"])
        assert nodes == ["node1"]
        await client.patch_node_status("node1", {"metadata": {"labels": {"a": "b"}}})
        events = client.watch_nodes(version)
        kind, node = await asyncio.wait_for(anext(events), 10)
        assert (kind, node["metadata"]["labels"]) == ("MODIFIED", {"a": "b"})
        await events.aclose()
    finally:
        await client.close()
    assert api.requests and all(r.split()[1].startswith("/k8s/clusters/c-abc/api/v1/nodes")
                                for r in api.requests)


async def test_a_server_answering_every_watch_with_410_is_relisted_with_backoff(api, tmp_path):
    """One relist at once after a 410, then the watch backoff between relists, so a server
    whose history is always too short is not listed in a tight loop."""
    api.expire_watches = True
    await api.start()
    client = KubeClient(client_config(api.url, "", {}))
    sm = manager(client, tmp_path)
    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config)

        async def five_lists() -> bool:
            return len(lists()) >= 5

        def lists() -> list[float]:
            return [t for r, t in zip(api.requests, api.request_times, strict=True)
                    if r.startswith("GET /api/v1/nodes?limit=")]
        try:
            await async_wait_until(five_lists, 10, what="five lists")
        finally:
            await follower.stop()
    finally:
        await sm.close()
    times = lists()
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # list, 410, list at once, 410, 0.1 s, list, 410, 0.2 s, list, 410, 0.4 s, list
    assert [g >= 0.9 * want for g, want in zip(gaps[1:4], (0.1, 0.2, 0.4), strict=True)] == \
        [True] * 3, gaps


async def test_api_connections_have_tcp_keepalive(api):
    """A peer gone without a word is found dead within a minute, as client-go's dialer does."""
    await api.start()
    client = KubeClient(client_config(api.url, "", {}))
    try:
        await client.get_node("node1")
        sock = client._idle[0].transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert [sock.getsockopt(socket.IPPROTO_TCP, option) for option in (
            socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)] == [30, 10, 3]
    finally:
        await client.close()


async def test_a_silent_watch_is_given_up_and_resumed(api, tmp_path, caplog):
    """A watch stream that stays open but sends nothing (a proxy whose upstream is gone) is
    abandoned after the idle bound and resumed from its resourceVersion."""
    caplog.set_level(logging.WARNING)
    await api.start()
    client = KubeClient(client_config(api.url, "", {}), watch_idle=0.5)
    sm = manager(client, tmp_path)

    async def resumed() -> bool:
        return sum("watch=true" in r for r in api.requests) >= 2

    try:
        config = await sm.get_network_config()
        follower = Follower(sm, await sm.acquire_lease(config, VXLAN), config)
        try:
            await async_wait_until(resumed, 10, what="a second watch request")
            remote(api, "node2", "10.244.2.0/24", "10.0.0.2")
            await follower.wait_for(1)
        finally:
            await follower.stop()
    finally:
        await sm.close()
    assert f"node watch interrupted ({api.url} sent nothing on the node watch for 0.5s)" \
        in caplog.text
    assert sm.status.relists == 1


async def test_kubeconfig_certificate_authority_fields_as_client_go_reads_them(api, pki,
                                                                               tmp_path):
    """certificate-authority-data wins over certificate-authority; either one together with
    insecure-skip-tls-verify is refused, as client-go refuses it."""
    await api.start(tls=pki.server_context())
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.other_ca),
                             "certificate-authority-data": b64(pki.ca)}, {})
    assert await node_name_through(path) == "node1"
    for field, value in (("certificate-authority", str(pki.ca)),
                         ("certificate-authority-data", b64(pki.ca))):
        path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                                {field: value, "insecure-skip-tls-verify": True}, {})
        with pytest.raises(KubeError) as caught:
            kube_client("", str(path), {})
        assert str(caught.value) == (
            f"cannot build the Kubernetes client config: {path}: "
            f"clusters[0].cluster.insecure-skip-tls-verify is set together with "
            f"clusters[0].cluster.{field}: specifying a root certificates file with the "
            "insecure flag is not allowed; remove one of them")


async def test_the_host_header_never_carries_user_info(api):
    await api.start()
    client = KubeClient(client_config(f"http://user:pass@127.0.0.1:{api.port}", "", {}))
    try:
        await client.get_node("node1")
    finally:
        await client.close()
    assert api.host_headers == [f"127.0.0.1:{api.port}"]
    assert client_config("https://u:p@[fd00::1]:6443/x", "", {}).host_header == "[fd00::1]:6443"
    assert client_config("https://u:p@[fd00::1]/x", "", {}).host_header == "[fd00::1]"


CERT_PLUGIN = """#!{python}
import json, sys
with open(sys.argv[1]) as cert, open(sys.argv[2]) as key:
    status = {{"clientCertificateData": cert.read(), "clientKeyData": key.read()}}
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": status}}))
"""


@pytest.mark.virtual_time(False)  # the exec plugin runs as a process, in real time
async def test_a_rotated_exec_plugin_certificate_reaches_a_new_connection(api, pki, tmp_path):
    """After a 401 the plugin's renewed client certificate is used at once: idle
    connections, whose handshake carried the old one, are not reused."""
    api.client_common_name = "flanneld"
    await api.start(tls=pki.server_context(require_client_cert=True))
    cert, key = tmp_path / "plugin.crt", tmp_path / "plugin.key"
    cert.write_bytes(pki.client_cert.read_bytes())
    key.write_bytes(pki.client_key.read_bytes())
    plugin = tmp_path / "plugin.py"
    plugin.write_text(CERT_PLUGIN.format(python=sys.executable))
    plugin.chmod(0o755)
    path = write_kubeconfig(tmp_path / "kubeconfig", api.url,
                            {"certificate-authority": str(pki.ca)}, {"exec": {
                                "apiVersion": "client.authentication.k8s.io/v1",
                                "command": str(plugin), "args": [str(cert), str(key)]}})
    client = kube_client("", str(path), {})
    try:
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
        # The certificate is rotated: the server now knows only the new one.
        new_cert, new_key = pki.new_client_cert("flanneld-rotated")
        cert.write_bytes(new_cert.read_bytes())
        key.write_bytes(new_key.read_bytes())
        api.client_common_name = "flanneld-rotated"
        assert (await client.get_node("node1"))["metadata"]["name"] == "node1"
    finally:
        await client.close()


@pytest.mark.parametrize(("environ", "warned"), [
    ({"HTTPS_PROXY": "http://proxy:3128"}, "HTTPS_PROXY"),
    ({"https_proxy": "http://proxy:3128", "NO_PROXY": "example.com,10.0.0.0/8"}, "https_proxy"),
    ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": ".cluster.example"}, None),
    ({"HTTPS_PROXY": "http://proxy:3128", "no_proxy": "api.cluster.example:6443"}, None),
    ({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "*"}, None),
    ({"HTTP_PROXY": "http://proxy:3128"}, None),
])
def test_a_proxy_variable_flanneld_does_not_use_is_warned_about(environ, warned, caplog):
    """client-go would send API requests through HTTPS_PROXY; flanneld connects directly and
    says so once, unless NO_PROXY covers the server."""
    caplog.set_level(logging.WARNING)
    client = kube_client("https://api.cluster.example:6443", "", environ)
    assert client.config.host == "api.cluster.example"
    warnings = [r.getMessage() for r in caplog.records if "proxies" in r.getMessage()]
    assert warnings == ([] if warned is None else [
        f"{warned} is set and NO_PROXY does not cover api.cluster.example, but flanneld does "
        "not use proxies: it connects to the API server directly"])


def test_a_proxy_is_never_warned_about_for_a_loopback_or_covered_address(caplog):
    caplog.set_level(logging.WARNING)
    for url, no_proxy in (("https://127.0.0.1:6443", ""), ("https://10.1.2.3", "10.0.0.0/8"),
                          ("https://[fd00::1]:6443", "fd00::/64")):
        kube_client(url, "", {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy})
    assert "proxies" not in caplog.text


def test_a_refused_server_url_is_shown_without_its_password():
    with pytest.raises(KubeError) as caught:
        kube_client("https://user:s3cret@api.example:99999", "", {})
    assert str(caught.value) == ("cannot build the Kubernetes client config: --kube-api-url: "
                                 "'https://api.example:99999' has a bad port")
