"""The extension engine building a vxlan by hand with ``ip`` and ``bridge`` in two
namespaces joined by a veth: the commands of the config, run by our runner with Go's
environment, expansion and stdin, carry pod traffic."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.extension.command import run_command
from flannel.extension.peers import (
    ExtensionConfig,
    ExtensionPeers,
    post_startup_env,
    pre_startup,
    run_post_startup,
)
from flannel.lease import Lease, LeaseAttrs
from tests.support import netns

pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
              pytest.mark.skipif(shutil.which("bridge") is None, reason="needs iproute2")]

NETWORK = IPv4Network("10.6.0.0/16")

# No shell runs the config's commands; a user who needs several steps and stdin writes a
# script, as here for the per-peer neighbour, FDB entry and route.
ADD_SCRIPT = """#!/bin/sh
set -eu
read -r mac
base=${SUBNET%/*}
ip -n "$1" neigh replace "$base" lladdr "$mac" dev flannel-ext nud permanent
bridge -n "$1" fdb replace "$mac" dev flannel-ext dst "$PUBLIC_IP" self permanent
ip -n "$1" route replace "$SUBNET" via "$base" dev flannel-ext onlink
"""


@pytest.fixture
def two_nodes() -> Iterator[list[str]]:
    created = []
    try:
        for _ in range(2):
            created.append(netns.create("ext"))
        a, b = created
        netns.ip("link", "add", "ul0", "type", "veth", "peer", "name", "ul0", "netns", b,
                 netns=a)
        for n, ns in enumerate(created, 1):
            netns.ip("addr", "add", f"192.168.78.{n}/24", "dev", "ul0", netns=ns)
            netns.ip("link", "set", "ul0", "up", netns=ns)
        yield created
    finally:
        for ns in created:
            netns.delete(ns)


def node_config(tmp_path) -> ExtensionConfig:
    script = tmp_path / "add-peer"
    script.write_text(ADD_SCRIPT)
    script.chmod(0o755)
    return ExtensionConfig.from_backend({
        "PreStartupCommand": "ip netns exec $NODE_NS cat /sys/class/net/flannel-ext/address",
        "PostStartupCommand": "ip -n $NODE_NS addr add ${SUBNET} dev flannel-ext",
        "SubnetAddCommand": f"{script} $NODE_NS",
        "SubnetRemoveCommand": "ip -n $NODE_NS route del $SUBNET",
    }, timeout=10)


def ping(ns: str, src: str, dst: str) -> int:
    return subprocess.run(["ip", "netns", "exec", ns, "ping", "-n", "-q", "-c", "2", "-i",
                           "0.2", "-W", "1", "-I", src, dst], capture_output=True,
                          timeout=30, check=False).returncode


def test_commands_build_a_working_vxlan(two_nodes, tmp_path, monkeypatch):
    cfg = node_config(tmp_path)
    leases = []
    for n, ns in enumerate(two_nodes, 1):
        # The device itself, as an operator's unit would create it before flanneld starts.
        monkeypatch.setenv("NODE_NS", ns)
        for step in ("ip -n $NODE_NS link add flannel-ext type vxlan id 7 dstport 4789 "
                     "dev ul0 nolearning",
                     "ip -n $NODE_NS link set flannel-ext up"):
            assert run_command(step, {}).ok
        data = pre_startup(cfg)
        mac = netns.ip("-br", "link", "show", "flannel-ext", netns=ns).stdout.split()[2]
        assert data == f'"{mac}"'
        own = Lease(IPv4Network(f"10.6.{n}.0/24"), attrs=LeaseAttrs(
            public_ip=IPv4Address(f"192.168.78.{n}"), backend_type="extension",
            backend_data=data))
        leases.append(own)
        assert run_post_startup(cfg, post_startup_env(NETWORK, None, own)).ok
    engines = []
    for n, ns in enumerate(two_nodes):
        monkeypatch.setenv("NODE_NS", ns)
        engine = ExtensionPeers(cfg)
        assert engine.reconcile([leases[1 - n]]).in_sync
        engines.append(engine)
    a = two_nodes[0]
    assert ping(a, "10.6.1.0", "10.6.2.0") == 0
    # The peer goes: its remove command runs with the peer's SUBNET, and traffic stops.
    monkeypatch.setenv("NODE_NS", a)
    assert engines[0].reconcile([]).in_sync
    assert netns.ip("route", "show", "10.6.2.0/24", netns=a).stdout == ""
    assert ping(a, "10.6.1.0", "10.6.2.0") != 0
