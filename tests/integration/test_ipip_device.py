"""The ipip device against the real kernel in a namespace: what a user sees when the kernel
has no ipip support, a foreign device of that name refused and left alone, and, where the
kernel has ipip, the device created as Go flannel creates it, reused, recreated when its
local address is wrong, its MTU and state restored; the backend's start-up over it."""

from __future__ import annotations

import asyncio
import json
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend.base import BackendError, BackendOptions
from flannel.backend.ipip import IpipBackend
from flannel.config import check_network_config, parse_config
from flannel.kernel import links
from flannel.kernel.device import DeviceError
from flannel.kernel.host import Host
from flannel.kernel.iface import ExternalInterface
from flannel.kernel.ipipdev import IpipSpec, ensure_ipip
from flannel.kernel.rtnl import Rtnl
from flannel.lease import Lease
from tests.support import netns
from tests.support.kernelpaths import missing_ipip

pytestmark = pytest.mark.netns

LOCAL = IPv4Address("192.168.60.2")
SPEC = IpipSpec("flannel.ipip", LOCAL, 1480)
NO_IPIP = ("cannot create ipip device flannel.ipip: this kernel has no ipip support "
           "(Operation not supported); load the ipip module on the host ('modprobe ipip', or "
           "add 'ipip' to /etc/modules-load.d/), use a kernel built with CONFIG_NET_IPIP, or "
           "choose another backend (vxlan needs no extra module on most kernels)")


def needs_ipip() -> None:
    if reason := missing_ipip():
        pytest.skip(reason)


def get(ns: str, name: str = "flannel.ipip") -> links.LinkDetails | None:
    with Rtnl(Host(ns)) as sock:
        return links.get_link(sock, name)


def underlay(ns: str) -> ExternalInterface:
    netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1", netns=ns)
    netns.ip("addr", "add", f"{LOCAL}/24", "dev", "eth0", netns=ns)
    netns.ip("link", "set", "eth0", "up", netns=ns)
    index = json.loads(netns.ip("-j", "link", "show", "eth0", netns=ns).stdout)[0]["ifindex"]
    return ExternalInterface("eth0", index, 1500, LOCAL, None, IPv4Address("203.0.113.2"),
                             None)


def ipip_backend(ns: str, ext: ExternalInterface) -> IpipBackend:
    config = parse_config(json.dumps({"Network": "10.244.0.0/16",
                                      "Backend": {"Type": "ipip"}}))
    check_network_config(config)
    return IpipBackend(ext, config, BackendOptions(Host(ns)))


def test_a_kernel_without_ipip_gets_a_clear_error(ns):
    if not missing_ipip():
        pytest.skip("this kernel has ipip: the error cannot be produced here")
    with pytest.raises(DeviceError) as err:
        ensure_ipip(SPEC, Host(ns))
    assert str(err.value) == NO_IPIP
    assert get(ns) is None


def test_the_backend_refuses_to_start_without_ipip_and_says_why(ns):
    if not missing_ipip():
        pytest.skip("this kernel has ipip: the error cannot be produced here")
    with pytest.raises(BackendError) as err:
        asyncio.run(ipip_backend(ns, underlay(ns)).prepare())
    assert str(err.value) == NO_IPIP


def test_a_device_of_another_kind_with_the_name_is_refused_and_kept(ns):
    netns.ip("link", "add", "flannel.ipip", "type", "veth", "peer", "name", "other0", netns=ns)
    with pytest.raises(DeviceError) as err:
        ensure_ipip(SPEC, Host(ns))
    assert str(err.value) == ("flannel.ipip exists but is not an ipip device (it is a veth "
                              "device); remove it ('ip link delete flannel.ipip') and start "
                              "flanneld again")
    kept = get(ns)
    assert kept is not None and kept.kind == "veth"


def test_an_mtu_the_kernel_cannot_take_is_refused_before_any_request(ns):
    with pytest.raises(DeviceError) as err:
        ensure_ipip(IpipSpec("flannel.ipip", LOCAL, 40), Host(ns))
    assert "its MTU would be 40" in str(err.value)


def test_created_as_go_flannel_creates_it_then_reused(ns):
    needs_ipip()
    index = ensure_ipip(SPEC, Host(ns))
    found = get(ns)
    assert found is not None and found.link.index == index
    assert (found.kind, found.info) == ("ipip", links.IptunInfo(LOCAL))
    assert (found.link.mtu, found.link.up) == (1480, True)
    shown = json.loads(netns.ip("-d", "-j", "link", "show", "flannel.ipip", netns=ns).stdout)[0]
    assert shown["linkinfo"]["info_data"]["remote"] == "any"
    assert ensure_ipip(SPEC, Host(ns)) == index


def test_mtu_and_state_changed_by_hand_are_restored(ns):
    needs_ipip()
    index = ensure_ipip(SPEC, Host(ns))
    netns.ip("link", "set", "flannel.ipip", "mtu", "1400", "down", netns=ns)
    assert ensure_ipip(SPEC, Host(ns)) == index
    found = get(ns)
    assert found is not None and (found.link.mtu, found.link.up) == (1480, True)


def test_a_device_with_the_wrong_local_address_is_recreated(ns, caplog):
    needs_ipip()
    netns.ip("link", "add", "flannel.ipip", "type", "ipip", "local", "192.168.60.9", netns=ns)
    ensure_ipip(SPEC, Host(ns))
    found = get(ns)
    assert found is not None and found.info == links.IptunInfo(LOCAL)
    assert ("flannel.ipip exists but is incompatible (local address is 192.168.60.9, want "
            "192.168.60.2); recreating it") in caplog.text


def test_the_backend_sets_up_device_address_and_mtu(ns):
    needs_ipip()
    ext = underlay(ns)
    backend = ipip_backend(ns, ext)
    local = asyncio.run(backend.prepare())
    assert (local.backend_type, local.mtu, local.backend_data) == ("ipip", 1480, None)
    backend.lease = Lease(IPv4Network("10.244.3.0/24"))
    backend.ensure_local()
    shown = netns.ip("-4", "-o", "addr", "show", "dev", "flannel.ipip", netns=ns).stdout
    assert "inet 10.244.3.0/32" in shown
