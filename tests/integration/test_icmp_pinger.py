"""The raw-socket pinger of ``flannelctl check`` against the real kernel, in namespaces the
tests create: answers, silence, an ICMP error from a router, and an echo that cannot leave."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.kernel.host import Host
from flannel.ops.check import PeerResult, probe_all
from flannel.ops.icmp import Pinger
from tests.support import netns


def probe(ns: str, target: str, sources: list[str] = (), count: int = 2,
          timeout: float = 0.5):
    with Host(ns).entered():  # the socket stays in the namespace it was created in
        pinger = Pinger([IPv4Address(s) for s in sources])

    async def run():
        try:
            return await pinger.probe(IPv4Address(target), count, 0.05, timeout)
        finally:
            pinger.close()

    return pinger, asyncio.run(run())


def test_answers_are_timed(ns):
    netns.ip("addr", "add", "10.7.0.1/24", "dev", "lo", netns=ns)
    pinger, result = probe(ns, "10.7.0.1", ["10.9.9.9", "10.7.0.1"], count=3)
    assert pinger.source == IPv4Address("10.7.0.1")  # the first address this host holds
    assert (result.sent, result.lost, result.errors, result.send_error) == (3, 0, [], "")
    assert all(0 < rtt < 0.5 for rtt in result.rtts)


def black_hole(ns: str, *targets: str) -> None:
    """A veth whose other end holds no address: what is sent there vanishes, no error."""
    netns.ip("link", "add", "va", "type", "veth", "peer", "name", "vb", netns=ns)
    netns.ip("addr", "add", "10.7.0.1/24", "dev", "va", netns=ns)
    for target in targets:
        netns.ip("neigh", "add", target, "lladdr", "02:00:00:00:00:02", "dev", "va", "nud",
                 "permanent", netns=ns)
    for device in ("va", "vb"):
        netns.ip("link", "set", device, "up", netns=ns)


def test_silence_is_a_timeout(ns):
    black_hole(ns, "10.7.0.2")
    _, result = probe(ns, "10.7.0.2", ["10.7.0.1"])
    assert (result.sent, result.rtts, result.errors, result.send_error) == (2, [], [], "")


def test_the_deadline_bounds_the_whole_check(ns):
    black_hole(ns, "10.7.0.2", "10.7.0.3", "10.7.0.4")
    netns.ip("addr", "add", "10.8.0.1/24", "dev", "lo", netns=ns)
    rows = [PeerResult(IPv4Network(f"{t}/32"), "", "vxlan", target=t)
            for t in ("10.8.0.1", "10.7.0.2", "10.7.0.3", "10.7.0.4")]
    with Host(ns).entered():
        pinger = Pinger([IPv4Address("10.7.0.1")])
    # One peer at a time, each silent one taking 3 s: only the first two get an answer.
    args = argparse.Namespace(parallel=1, count=1, interval=0.1, timeout=3.0, deadline=4.0)

    async def run():
        try:
            await probe_all(rows, {4: pinger}, args)
        finally:
            pinger.close()

    start = time.monotonic()
    asyncio.run(run())
    assert time.monotonic() - start < 6
    assert [row.verdict for row in rows] == ["ok", "timeout", "not-probed", "not-probed"]
    assert rows[3].detail == "the --deadline of 4s passed before its probe ended"
    assert rows[3].next_step == "give a longer --deadline or a larger --parallel"


def test_unreachable_from_a_router_is_told_apart(ns):
    router = netns.create("r")
    try:
        netns.ip("link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", router,
                 netns=ns)
        netns.ip("addr", "add", "10.7.0.1/24", "dev", "va", netns=ns)
        netns.ip("link", "set", "va", "up", netns=ns)
        netns.ip("route", "add", "10.6.0.0/24", "via", "10.7.0.2", netns=ns)
        netns.ip("addr", "add", "10.7.0.2/24", "dev", "vb", netns=router)
        netns.ip("link", "set", "vb", "up", netns=router)
        # The router forwards but has an unreachable route: it answers "host unreachable".
        netns.ip("route", "add", "unreachable", "10.6.0.0/24", netns=router)
        with Host(router).entered():
            with open("/proc/sys/net/ipv4/ip_forward", "w") as sysctl:
                sysctl.write("1")
        _, result = probe(ns, "10.6.0.5", ["10.7.0.1"], timeout=2.0)
        assert result.sent == 2 and result.rtts == []
        assert result.errors == ["host unreachable from 10.7.0.2"] * 2
    finally:
        netns.delete(router)


def test_an_echo_that_cannot_leave_says_why(ns):
    netns.ip("route", "add", "prohibit", "10.6.0.0/24", netns=ns)
    _, result = probe(ns, "10.6.0.5")
    assert (result.sent, result.send_error) == (0, "Permission denied")


def test_without_cap_net_raw_the_message_says_what_is_needed():
    import os

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop the capability")
    import subprocess
    import sys

    script = ("from flannel.ops.icmp import Pinger, IcmpError\n"
              "try:\n    Pinger([])\nexcept IcmpError as err:\n    print(err)\n")
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.stdout.strip() == ("sending ICMP echoes needs CAP_NET_RAW: run it as root, "
                                   "or in flanneld's pod (which has NET_RAW)"), proc.stderr
