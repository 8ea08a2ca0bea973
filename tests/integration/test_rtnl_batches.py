"""A batch of netlink requests against a real kernel, over many chunks (one ACK each): every
request is applied, every refusal is reported whichever chunk it is in, and a delete of what
is gone is no refusal."""

from __future__ import annotations

import errno
import json

import pytest

from flannel.kernel import rtnl
from flannel.kernel.host import Host
from tests.support import netns

pytestmark = pytest.mark.netns

CHUNK = 256
NO_SUCH_DEVICE = 9999


def route(i: int, oif: int) -> rtnl.Route:
    return rtnl.Route(f"10.{i // 250}.{i % 250}.0/24", "192.168.7.2", oif)


def test_a_batch_over_many_chunks_applies_every_request_and_reports_every_refusal(ns):
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", "192.168.7.1/24", "dev", "eth0", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    netns.ip("link", "set", "eth1", "up", netns=ns)
    index = json.loads(netns.ip("-j", "link", "show", "eth0", netns=ns).stdout)[0]["ifindex"]
    refused = {3, CHUNK + 40, 3 * CHUNK - 1, 3 * CHUNK + 10}  # in the 1st, 2nd, 3rd, 4th chunk
    ops: list[tuple[str, object]] = [
        ("replace", route(i, NO_SUCH_DEVICE if i in refused else index)) for i in range(900)]
    ops += [("delete", route(i, index)) for i in range(1000, 1100)]  # never there

    sock = rtnl.Rtnl(Host(ns))
    try:
        failures = sock.run(ops, chunk=CHUNK)
    finally:
        sock.close()

    assert [f.request for f in failures] == [
        rtnl.describe("replace", route(i, NO_SUCH_DEVICE)) for i in sorted(refused)]
    assert all(f.errno in (errno.ENODEV, errno.ENETUNREACH) for f in failures), failures
    shown = netns.ip("-4", "route", "show", "dev", "eth0", netns=ns).stdout
    installed = {line.split()[0] for line in shown.splitlines() if " via " in line}
    assert installed == {route(i, index).dst for i in range(900) if i not in refused}
