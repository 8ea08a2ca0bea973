"""The udp backend's TUN device in a real namespace, without a forwarder: the route as Go
flannel sets it, repairs of a route sent elsewhere, refusals a user sees, and removal."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.kernel.host import Host
from flannel.udp.device import TunSpec, delete, ensure_tun
from flannel.udp.tunfd import TunError
from tests.support import netns

SPEC = TunSpec("flannel0", IPv4Address("10.5.1.0"), 1472, IPv4Network("10.5.0.0/16"))


def test_created_tun_carries_the_address_and_a_universe_scope_route(ns):
    assert ensure_tun(SPEC, Host(ns)) == ["flannel0 was missing: created",
                                    "flannel0 MTU was 1500: set to 1472",
                                    "flannel0 was down: set up",
                                    "flannel0 address 10.5.1.0/32 was missing: added",
                                    "route 10.5.0.0/16 dev flannel0 was missing: set"]
    link = netns.ip("-d", "link", "show", "flannel0", netns=ns).stdout
    assert "mtu 1472" in link and ",UP" in link and "tun type tun" in link
    assert "inet 10.5.1.0/32 scope global flannel0" in netns.ip(
        "addr", "show", "dev", "flannel0", netns=ns).stdout
    # ip hides scope global ("scope link" would be the wrong scope); linkdown: no reader yet.
    assert netns.ip("route", "show", "10.5.0.0/16", netns=ns).stdout.strip() == \
        "10.5.0.0/16 dev flannel0 proto static linkdown"
    assert ensure_tun(SPEC, Host(ns)) == []


def test_route_pointing_elsewhere_is_put_back(ns):
    ensure_tun(SPEC, Host(ns))
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("link", "set", "veth0", "up", netns=ns)
    netns.ip("route", "replace", "10.5.0.0/16", "dev", "veth0", netns=ns)
    assert ensure_tun(SPEC, Host(ns)) == ["route 10.5.0.0/16 dev flannel0 pointed elsewhere: set"]
    assert "dev flannel0" in netns.ip("route", "show", "10.5.0.0/16", netns=ns).stdout


def test_another_kind_of_device_with_the_name_is_refused(ns):
    netns.ip("link", "add", "flannel0", "type", "veth", "peer", "name", "veth1", netns=ns)
    with pytest.raises(TunError) as err:
        ensure_tun(SPEC, Host(ns))
    assert str(err.value) == ("flannel0 exists and is a veth device; delete it or choose "
                              "another name")


def test_mtu_the_kernel_refuses_is_named(ns):
    with pytest.raises(TunError) as err:
        ensure_tun(TunSpec("flannel0", SPEC.address, 70000), Host(ns))
    assert str(err.value) == "cannot set MTU 70000 on flannel0: Invalid argument"


def test_delete_removes_the_device_and_ignores_an_absent_one(ns):
    ensure_tun(SPEC, Host(ns))
    delete("flannel0", Host(ns))
    assert "flannel0" not in netns.ip("link", "show", netns=ns).stdout
    delete("flannel0", Host(ns))
