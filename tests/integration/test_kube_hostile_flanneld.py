"""flanneld as a process in kube mode (host-gw, its own network namespace) against the API
double gone hostile (tests/support/kubeapi.py, ``hostile``): whatever the server does,
SIGTERM ends flanneld within 5 s with its subnet.env left in place, and its memory under a
hostile answer stays within twice what it holds for the same cluster."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.integration.test_kube_lifecycle import HOST_GW, api_in
from tests.support import netns
from tests.support.flanneld import Flanneld
from tests.support.kubeapi import FakeKubeAPI
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.netns

MIB = 1024 * 1024
P = "flannel.alpha.coreos.com/"


@pytest.fixture
async def api(ns) -> AsyncIterator[tuple[str, FakeKubeAPI]]:
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("addr", "add", "10.99.0.2/24", "dev", "veth0", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("link", "set", "veth1", "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.99.0.1", "dev", "veth0", netns=ns)
    async with api_in(ns) as server:
        server.put_node("node1", ["10.244.1.0/24"])
        server.put_node("node2", ["10.244.2.0/24"], {
            P + "kube-subnet-manager": "true", P + "backend-type": "host-gw",
            P + "backend-data": "null", P + "public-ip": "10.99.0.3"})
        yield ns, server


def start_flanneld(tmp_path: Path, ns: str, server: FakeKubeAPI) -> Flanneld:
    conf = tmp_path / "net-conf.json"
    conf.write_text(json.dumps(HOST_GW))
    return Flanneld(tmp_path, [
        "--kube-subnet-mgr", f"--kube-api-url={server.url}", f"--net-config-path={conf}",
        f"--subnet-file={tmp_path / 'subnet.env'}", "--iptables-forward-rules=false",
        "--healthz-port=0"], netns=ns, env={"NODE_NAME": "node1"}).start()


async def until(check: Callable[[], object], what: str, daemon: Flanneld,
                timeout: float = 30) -> None:
    async def holds() -> bool:
        assert daemon.proc is not None and daemon.proc.poll() is None, \
            f"flanneld exited:\n{daemon.log}"
        return bool(check())
    await async_wait_until(holds, timeout, what=f"{what}:\n{daemon.log}")


async def stop_within(daemon: Flanneld, seconds: float) -> float:
    assert daemon.proc is not None
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)

    async def exited() -> bool:
        return daemon.proc.poll() is not None
    await async_wait_until(exited, seconds, what=f"flanneld to exit:\n{daemon.log}")
    assert daemon.proc.returncode == 0, daemon.log
    return time.monotonic() - started


async def never() -> AsyncIterator[bytes]:
    await asyncio.Event().wait()
    yield b""


async def drip(head: bytes) -> AsyncIterator[bytes]:
    yield head
    while True:
        yield b" "
        await asyncio.sleep(1)


async def watch_drip() -> AsyncIterator[bytes]:
    yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + b'c\r\n{"type": "MO\r\n')
    while True:
        yield b"1\r\n \r\n"
        await asyncio.sleep(1)


async def endless(opening: bytes, unit: bytes, size: int, closing: bytes) -> AsyncIterator[bytes]:
    def chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"
    yield (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n" + chunk(opening))
    piece = unit * (65536 // len(unit))
    for _ in range(size // len(piece)):
        yield chunk(piece)
    yield chunk(closing) + b"0\r\n\r\n"


NODE = "/api/v1/nodes/node1"
LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99999\r\n\r\n"
STARTING = {
    "its node's answer dripping": lambda m, p, q: drip(LENGTH_HEAD) if p == NODE else None,
    "an API server that stops answering": lambda m, p, q: never(),
}
RUNNING = {
    "a watch that never ends": None,
    "a watch event dripping": lambda m, p, q: watch_drip() if q.get("watch") else None,
}


@pytest.mark.parametrize("case", list(STARTING))
async def test_sigterm_ends_a_starting_flanneld_within_5s(api, tmp_path, case):
    ns, server = api
    server.hostile = STARTING[case]
    daemon = start_flanneld(tmp_path, ns, server)
    try:
        await until(lambda: any(NODE in r for r in server.requests), "flanneld asking for "
                    "its node", daemon)
        await asyncio.sleep(0.5)
        took = await stop_within(daemon, 3)  # the call under way is cancelled, not awaited
    finally:
        daemon.stop()
    print(f"\n{case}: flanneld exited {took:.2f}s after SIGTERM")


@pytest.mark.parametrize("case", list(RUNNING))
async def test_sigterm_ends_a_running_flanneld_within_5s_leaving_its_lease(api, tmp_path,
                                                                           case):
    ns, server = api
    daemon = start_flanneld(tmp_path, ns, server)
    env = tmp_path / "subnet.env"
    try:
        await until(lambda: "Ready:" in daemon.log, "flanneld ready", daemon)
        written = env.read_text()
        if RUNNING[case] is not None:
            server.hostile = RUNNING[case]
            watches = sum("watch=true" in r for r in server.requests)
            server.cut_watches()
            await until(lambda: sum("watch=true" in r for r in server.requests) > watches,
                        "the watch reopened", daemon)
        await asyncio.sleep(1)
        took = await stop_within(daemon, 5)
    finally:
        daemon.stop()
    assert env.read_text() == written
    print(f"\n{case}: flanneld exited {took:.2f}s after SIGTERM")


def peak_kib(daemon: Flanneld) -> int:
    assert daemon.proc is not None
    status = Path(f"/proc/{daemon.proc.pid}/status").read_text()
    return int(status.split("VmHWM:", 1)[1].split()[0])


async def test_memory_under_hostile_answers_stays_within_twice_the_steady(api, tmp_path):
    """A 60 MiB page of ``{}``, one of ``[]``, a 60 MiB watch event: each is cut at its
    budget, never decoded, and flanneld's peak memory stays within twice its steady."""
    ns, server = api
    daemon = start_flanneld(tmp_path, ns, server)
    try:
        await until(lambda: "Ready:" in daemon.log, "flanneld ready", daemon)
        await asyncio.sleep(3)
        steady = daemon.rss_kib()
        pages = (
            lambda m, p, q: endless(b'{"kind":"NodeList","metadata":{"resourceVersion":"1"},'
                                    b'"items":[', b"{},", 60 * MIB, b"{}]}")
            if p == "/api/v1/nodes" and not q.get("watch") else None,
            lambda m, p, q: endless(b'{"kind":"NodeList","metadata":{"resourceVersion":"1"},'
                                    b'"items":[', b"[],", 60 * MIB, b"[]]}")
            if p == "/api/v1/nodes" and not q.get("watch") else None,
            lambda m, p, q: endless(b'{"type":"MODIFIED","object":{"a":[', b"{},", 60 * MIB,
                                    b"{}]}}\n") if q.get("watch") else None,
        )
        for hostile, relist in zip(pages, (True, True, False), strict=True):
            server.hostile = hostile
            server.expire_watches = relist  # every watch gets 410 Gone: a relist
            asked = len(server.requests)
            server.cut_watches()
            await until(lambda n=asked: len(server.requests) >= n + 3, "three hostile answers",
                        daemon, timeout=60)
        server.expire_watches = False
        server.hostile = None
        peak = peak_kib(daemon)
        assert daemon.proc.poll() is None, daemon.log
    finally:
        daemon.stop()
    print(f"\nflanneld (kube) steady RSS {steady / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB "
          "under 60 MiB pages of {} and [] and a 60 MiB watch event")
    assert peak <= 2 * steady, (steady, peak)
