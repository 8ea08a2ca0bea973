"""Interface selection reading a real kernel: links, addresses and routes in a netns."""

from __future__ import annotations

from ipaddress import ip_address

import pytest

from flannel.kernel.host import Host
from flannel.kernel.iface import (
    IfaceOptions,
    InterfaceError,
    read_snapshot,
    select_external_interface,
)
from tests.support import netns
from tests.support.waiting import wait_until

pytestmark = pytest.mark.netns


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
    ext = select_external_interface(read_snapshot(Host(host)), IfaceOptions())
    assert (ext.name, str(ext.iface_addr)) == ("eth-a", "10.61.0.2")


def test_can_reach_follows_the_kernel_route(host):
    ext = select_external_interface(read_snapshot(Host(host)),
                                    IfaceOptions(iface_can_reach="192.0.2.10"))
    assert (ext.name, ext.mtu, str(ext.iface_addr)) == ("eth-b", 1400, "10.62.0.2")


def test_iface_by_ip_and_dual_stack_by_name(host):
    snapshot = read_snapshot(Host(host))
    assert select_external_interface(snapshot, IfaceOptions(ifaces=["10.62.0.2"])).name == \
        "eth-b"
    ext = select_external_interface(snapshot, IfaceOptions(ifaces=["eth-b"]), ipv6=True)
    assert ext.iface_v6_addr == ip_address("fd00:62::2")


def test_dual_stack_without_v6_default_route_is_refused(host):
    with pytest.raises(InterfaceError, match="no IPv6 default route"):
        select_external_interface(read_snapshot(Host(host)), IfaceOptions(), ipv6=True)


@pytest.fixture
def v6_host(ns):
    """eth-a with 10.61.0.2/24 and, for IPv6, only its kernel-made link-local address; IPv4
    and IPv6 default routes on it."""
    netns.ip("link", "add", "eth-a", "type", "veth", "peer", "name", "peer-a", netns=ns)
    netns.ip("addr", "add", "10.61.0.2/24", "dev", "eth-a", netns=ns)
    for link in ("eth-a", "peer-a"):
        netns.ip("link", "set", link, "up", netns=ns)
    netns.ip("route", "add", "default", "via", "10.61.0.1", "dev", "eth-a", netns=ns)
    netns.ip("-6", "route", "add", "default", "via", "fe80::1", "dev", "eth-a", netns=ns)
    wait_until(lambda: "fe80::" in netns.ip("-6", "addr", "show", "dev", "eth-a",
                                            netns=ns).stdout, 5, what="a link-local address")
    return ns


def test_only_a_link_local_ipv6_address_is_refused(v6_host):
    with pytest.raises(InterfaceError, match=r"^failed to find IPv6 address for interface "
                                             r"eth-a: it has only unusable ones \(fe80::\S+ is "
                                             r"link-local\); other nodes must reach this node "
                                             r"at a global IPv6 address"):
        select_external_interface(read_snapshot(Host(v6_host)), IfaceOptions(), ipv6=True)


def test_a_tentative_ipv6_address_is_refused_until_dad_finishes(v6_host):
    # Duplicate address detection waits this long for an answer: the address stays tentative.
    netns.ip("netns", "exec", v6_host, "sysctl", "-qw",
             "net.ipv6.neigh.eth-a.retrans_time_ms=600000")
    netns.ip("addr", "add", "2001:db8::2/64", "dev", "eth-a", netns=v6_host)
    assert "tentative" in netns.ip("-6", "addr", "show", "dev", "eth-a", netns=v6_host).stdout
    with pytest.raises(InterfaceError) as caught:
        select_external_interface(read_snapshot(Host(v6_host)), IfaceOptions(), ipv6=True)
    message = str(caught.value)
    assert "2001:db8::2 is tentative: duplicate address detection has not finished" in message
    assert message.endswith("give eth-a one (or wait for duplicate address detection to "
                            "finish) or choose another interface with --iface")
    netns.ip("addr", "del", "2001:db8::2/64", "dev", "eth-a", netns=v6_host)
    netns.ip("addr", "add", "2001:db8::2/64", "dev", "eth-a", "nodad", netns=v6_host)
    ext = select_external_interface(read_snapshot(Host(v6_host)), IfaceOptions(), ipv6=True)
    assert str(ext.ext_v6_addr) == "2001:db8::2"
