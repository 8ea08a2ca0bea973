"""The extension backend's commands run in the network namespace of its ``Host`` (the lab's
and the tests' way of running a node), never in the one the test runs in."""

from __future__ import annotations

import asyncio
import json
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.base import BackendOptions
from flannel.backend.extension import ExtensionBackend
from flannel.config import check_network_config, parse_config
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.lease import Lease, LeaseAttrs
from tests.support import netns

pytestmark = pytest.mark.netns

EXT = ExternalInterface("eth0", 2, 1500, IPv4Address("192.168.1.1"), None,
                        IPv4Address("192.168.1.1"), None)


def test_commands_run_inside_the_hosts_namespace(ns):
    config = parse_config(json.dumps({"Network": "10.244.0.0/16", "Backend": {
        "Type": "extension", "PreStartupCommand": "ip netns identify",
        "SubnetAddCommand": "ip route replace $SUBNET dev lo",
        "SubnetRemoveCommand": "ip route del $SUBNET dev lo"}}))
    check_network_config(config)
    backend = ExtensionBackend(EXT, config, BackendOptions(Host(ns)))
    assert asyncio.run(backend.prepare()).backend_data == json.dumps(ns)
    peer = Lease(IPv4Network("10.244.77.0/24"), attrs=LeaseAttrs(
        public_ip=IPv4Address("192.168.1.77"), backend_type="extension"))
    (engine,) = backend.appliers()
    assert engine.apply([peer]).error == ""
    assert netns.ip("route", "show", "10.244.77.0/24", netns=ns).stdout.startswith(
        "10.244.77.0/24 dev lo")
    assert netns.ip("route", "show", "10.244.77.0/24").stdout == ""
    assert engine.apply([]).changes == 1
    assert netns.ip("route", "show", "10.244.77.0/24", netns=ns).stdout == ""
