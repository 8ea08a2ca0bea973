"""Interface selection reading a real kernel: links, addresses and routes in a netns."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from flannel.kernel.iface import (
    IfaceOptions,
    InterfaceError,
    read_snapshot,
    select_external_interface,
)
from tests.support import netns


@pytest.fixture
def host(ns):
    """eth-a (default route, 10.61.0.2) and eth-b (10.62.0.2 and fd00:62::2), MTU 1400."""
    netns.ip("link", "add", "eth-a", "type", "veth", "peer", "name", "peer-a", netns=ns)
    netns.ip("link", "add", "eth-b", "type", "veth", "peer", "name", "peer-b", netns=ns)
    netns.ip("link", "set", "eth-b", "mtu", "1400", netns=ns)
    netns.ip("addr", "add", "10.61.0.2/24", "dev", "eth-a", netns=ns)
    netns.ip("addr", "add", "10.62.0.2/24", "dev", "eth-b", netns=ns)
    netns.ip("addr", "add", "fd00:62::2/64", "dev", "eth-b", "nodad", netns=ns)
    for link in ("eth-a", "peer-a", "eth-b", "peer-b"):
        netns.ip("link", "set", link, "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.61.0.1", "dev", "eth-a", netns=ns)
    netns.ip("route", "add", "192.0.2.0/24", "via", "10.62.0.1", "dev", "eth-b", netns=ns)
    return ns


def test_default_route_interface_from_the_kernel(host):
    ext = select_external_interface(read_snapshot(host), IfaceOptions())
    assert (ext.name, str(ext.iface_addr)) == ("eth-a", "10.61.0.2")


def test_can_reach_follows_the_kernel_route(host):
    ext = select_external_interface(read_snapshot(host),
                                    IfaceOptions(iface_can_reach="192.0.2.10"))
    assert (ext.name, ext.mtu, str(ext.iface_addr)) == ("eth-b", 1400, "10.62.0.2")


def test_iface_by_ip_and_dual_stack_by_name(host):
    snapshot = read_snapshot(host)
    assert select_external_interface(snapshot, IfaceOptions(ifaces=["10.62.0.2"])).name == \
        "eth-b"
    ext = select_external_interface(snapshot, IfaceOptions(ifaces=["eth-b"]), ipv6=True)
    assert ext.iface_v6_addr == ip_address("fd00:62::2")


def test_dual_stack_without_v6_default_route_is_refused(host):
    with pytest.raises(InterfaceError, match="no IPv6 default route"):
        select_external_interface(read_snapshot(host), IfaceOptions(), ipv6=True)
