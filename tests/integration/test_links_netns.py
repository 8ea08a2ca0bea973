"""Link and address requests against the real kernel and the real iproute2 in a namespace:
what ``ip`` sends (captured with strace) equals our encoding, devices ``ip`` creates decode
to their settings, devices we create show up in ``ip -d`` with ours, and ipip/wireguard
devices are created where the kernel has the driver."""

from __future__ import annotations

import errno
import json
import subprocess
from ipaddress import IPv4Address, IPv6Address, ip_address

import pytest

from flannel.kernel import links
from flannel.kernel.host import Host
from flannel.kernel.rtnl import NetlinkError, Rtnl
from tests.support import iproute2_wire, netns


def indices(ns: str) -> dict[str, int]:
    shown = json.loads(netns.ip("-j", "link", "show", netns=ns).stdout)
    return {link["ifname"]: link["ifindex"] for link in shown}


def details(ns: str, name: str) -> dict:
    return json.loads(netns.ip("-d", "-j", "link", "show", name, netns=ns).stdout)[0]


@pytest.fixture
def wire_ns(ns):
    for args in iproute2_wire.SETUP:
        netns.ip(*args, netns=ns)
    return ns


@pytest.mark.skipif(not iproute2_wire.strace_available(),
                    reason="strace is not installed (apt-get install strace): cannot capture "
                           "what ip sends")
@pytest.mark.parametrize("case", iproute2_wire.CASES, ids=lambda case: case.name)
def test_installed_iproute2_sends_what_we_encode(wire_ns, case):
    index_of = indices(wire_ns)
    sent = iproute2_wire.change_request(iproute2_wire.capture(wire_ns, *case.args))
    assert iproute2_wire.normalised(sent).hex() == \
        iproute2_wire.normalised(case.encode(index_of)).hex()


def test_vxlan_devices_ip_creates_decode_to_their_settings(ns):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    netns.ip("link", "add", "vx4", "mtu", "1400", "type", "vxlan", "id", "7", "local",
             "192.168.50.2", "dev", "veth0", "dstport", "4789", "nolearning", "gbp", "l2miss",
             netns=ns)
    netns.ip("link", "add", "vx6", "type", "vxlan", "id", "8", "local", "fd00:50::2", "dev",
             "veth0", "dstport", "0", netns=ns)
    veth0 = indices(ns)["veth0"]
    with Rtnl(Host(ns)) as sock:
        vx4, vx6 = links.get_link(sock, "vx4"), links.get_link(sock, "vx6")
        assert links.get_link(sock, "absent0") is None
        dumped = {d.link.name: d for d in links.dump_links(sock)}
    assert (vx4.kind, vx4.link.mtu, vx4.link.up) == ("vxlan", 1400, False)
    assert vx4.info == links.VxlanInfo(7, IPv4Address("192.168.50.2"), veth0, 4789,
                                       learning=False, gbp=True, l2miss=True)
    assert vx6.info == links.VxlanInfo(8, IPv6Address("fd00:50::2"), veth0, 8472)
    assert dumped["vx4"] == vx4 and dumped["veth0"].kind == "veth"
    assert dumped["lo"].kind == "" and dumped["lo"].info is None


def test_devices_we_create_carry_our_settings(ns):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    veth0 = indices(ns)["veth0"]
    info = links.VxlanInfo(9, IPv6Address("fd00:50::2"), veth0, 4789, learning=False,
                           gbp=True)
    with Rtnl(Host(ns)) as sock:
        links.add_link(sock, links.NewLink("vx9", "vxlan", info, 1430, "0e:00:00:00:00:09"))
        index = links.get_link(sock, "vx9").link.index
        links.set_link(sock, index, "set vx9", mtu=1300, mac="0e:00:00:00:00:0a", up=True)
        links.add_address(sock, index, ip_address("fd00:244::"), 128, links.IFA_F_NODAD)
        links.add_address(sock, index, ip_address("10.244.1.0"), 32)
        found = {str(a.address): a for a in links.dump_addresses(sock, index=index)}
    shown = details(ns, "vx9")
    data = shown["linkinfo"]["info_data"]
    assert (data["id"], data["local6"], data["link"], data["port"], data["learning"]) == \
        (9, "fd00:50::2", "veth0", 4789, False)
    assert data["gbp"] is True
    assert (shown["mtu"], shown["address"]) == (1300, "0e:00:00:00:00:0a")
    assert "UP" in shown["flags"]
    v6 = found["fd00:244::"]
    assert (v6.prefixlen, bool(v6.flags & links.IFA_F_NODAD)) == (128, True)
    assert found["10.244.1.0"].prefixlen == 32
    with Rtnl(Host(ns)) as sock:
        links.delete_address(sock, index, ip_address("10.244.1.0"), 32)
        links.delete_address(sock, index, ip_address("10.244.1.0"), 32)  # gone: no error
        links.delete_link(sock, index, "delete vx9")
        with pytest.raises(NetlinkError) as caught:
            links.delete_link(sock, index, "delete vx9")
    assert caught.value.errno == errno.ENODEV
    assert caught.value.strerror == "No such device (delete vx9)"
    assert "vx9" not in indices(ns)


def create_or_skip(ns: str, link: links.NewLink) -> links.LinkDetails:
    """Create ``link`` in ``ns``; skip the test when the kernel has no driver for its kind."""
    with Rtnl(Host(ns)) as sock:
        try:
            links.add_link(sock, link)
        except NetlinkError as err:
            if err.errno == errno.EOPNOTSUPP:
                pytest.skip(f"this kernel cannot create {link.kind} devices ({err}): the "
                            f"{link.kind} module is not built or not loadable here")
            raise
        found = links.get_link(sock, link.name)
    assert found is not None
    return found


def test_kernel_without_a_driver_names_the_cause(ns):
    with Rtnl(Host(ns)) as sock:
        try:
            links.add_link(sock, links.NewLink("x0", "no-such-kind"))
        except NetlinkError as err:
            assert err.errno == errno.EOPNOTSUPP
            assert "create no-such-kind device x0" in str(err)
        else:
            pytest.fail("the kernel created a device of an unknown kind")


def test_ipip_device(ns):
    netns.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", netns=ns)
    veth0 = indices(ns)["veth0"]
    info = links.IptunInfo(IPv4Address("192.168.50.2"), underlay=veth0, ttl=64,
                           pmtudisc=True)
    found = create_or_skip(ns, links.NewLink("flannel.ipip", "ipip", info, mtu=1480))
    assert (found.kind, found.info, found.link.mtu) == ("ipip", info, 1480)
    data = details(ns, "flannel.ipip")["linkinfo"]["info_data"]
    assert (data["local"], data["link"], data["ttl"], data["pmtudisc"]) == \
        ("192.168.50.2", "veth0", 64, True)


def test_ipip_device_as_go_flannel_creates_it(ns):
    info = links.IptunInfo(IPv4Address("192.168.50.2"))
    found = create_or_skip(ns, links.NewLink("flannel.ipip", "ipip", info))
    assert found.info == info
    assert details(ns, "flannel.ipip")["linkinfo"]["info_data"]["pmtudisc"] is False


def test_wireguard_device(ns):
    found = create_or_skip(ns, links.NewLink("flannel-wg", "wireguard", mtu=1420))
    assert (found.kind, found.link.mtu) == ("wireguard", 1420)


def test_ip_agrees_the_kernel_has_no_ipip_driver_when_we_skip(ns):
    """The skip above is the kernel's answer, not ours: ``ip`` gets the same refusal."""
    result = subprocess.run(["ip", "-n", ns, "link", "add", "t0", "type", "ipip"],
                            capture_output=True, text=True, timeout=20, check=False)
    with Rtnl(Host(ns)) as sock:
        try:
            links.add_link(sock, links.NewLink("t1", "ipip", links.IptunInfo()))
            ours = 0
        except NetlinkError as err:
            ours = err.errno
    assert (result.returncode == 0) == (ours == 0)
    if ours:
        assert ours == errno.EOPNOTSUPP and "Unknown device type" in result.stderr
