"""External interface selection over synthetic host snapshots (compat reference 8.1)."""

from ipaddress import ip_address

import pytest

from flannel.kernel.iface import (
    IFA_F_DADFAILED,
    IFA_F_DEPRECATED,
    IFA_F_PERMANENT,
    IFA_F_TEMPORARY,
    IFA_F_TENTATIVE,
    IfaceAddr,
    IfaceOptions,
    Interface,
    InterfaceError,
    NetSnapshot,
    select_external_interface,
)


def addr(text: str, flags: int = IFA_F_PERMANENT) -> IfaceAddr:
    return IfaceAddr(ip_address(text), 24 if ":" not in text else 64, flags)


LO = Interface(1, "lo", 65536, (addr("127.0.0.1"), addr("::1")))
ETH0 = Interface(2, "eth0", 1500, (addr("192.168.1.10"), addr("fd00::10"),
                                   addr("fe80::1")))
ETH1 = Interface(3, "eth1", 9000, (addr("10.20.0.5"), addr("10.20.0.6")))


def snapshot(**kwargs) -> NetSnapshot:
    defaults = {"interfaces": [LO, ETH0, ETH1], "default_v4_ifindex": 2,
                "default_v6_ifindex": 2}
    defaults.update(kwargs)
    return NetSnapshot(**defaults)


def select(opts: IfaceOptions, snap: NetSnapshot | None = None, **kwargs):
    return select_external_interface(snap or snapshot(), opts, **kwargs)


def test_default_route_interface():
    ext = select(IfaceOptions())
    assert (ext.name, ext.mtu, str(ext.iface_addr), str(ext.ext_addr)) == (
        "eth0", 1500, "192.168.1.10", "192.168.1.10")


def test_dual_stack_needs_same_default_interface():
    ext = select(IfaceOptions(), ipv6=True)
    assert str(ext.iface_v6_addr) == "fd00::10"
    with pytest.raises(InterfaceError, match="must be the same with v4 default route"):
        select(IfaceOptions(), snapshot(default_v6_ifindex=3), ipv6=True)


def test_no_default_route_says_what_to_do():
    with pytest.raises(InterfaceError, match="--iface"):
        select(IfaceOptions(), snapshot(default_v4_ifindex=None))


def test_iface_by_name_and_by_ip_in_order():
    assert select(IfaceOptions(ifaces=["nope", "eth1"])).name == "eth1"
    ext = select(IfaceOptions(ifaces=["10.20.0.6"]))
    assert (ext.name, str(ext.iface_addr)) == ("eth1", "10.20.0.6")


def test_iface_regex_matches_addresses_then_names():
    ext = select(IfaceOptions(iface_regexes=[r"10\.20\.0\.\d+"]))
    assert (ext.name, str(ext.iface_addr)) == ("eth1", "10.20.0.5")
    assert select(IfaceOptions(iface_regexes=[r"eth\d"])).name == "eth0"


def test_iface_regex_invalid_is_named():
    with pytest.raises(InterfaceError, match="--iface-regex"):
        select(IfaceOptions(iface_regexes=["("]))


def test_can_reach_uses_route_lookup():
    snap = snapshot(route_get=lambda dst: (3, ip_address("10.20.0.6")))
    ext = select(IfaceOptions(iface_can_reach="10.20.0.99"), snap)
    assert (ext.name, str(ext.iface_addr)) == ("eth1", "10.20.0.6")


def test_nothing_matches():
    with pytest.raises(InterfaceError, match="matches the interfaces and/or regexes"):
        select(IfaceOptions(ifaces=["eth7"], iface_regexes=["wlan"]))


def test_public_ip_alone_picks_the_interface_holding_it():
    ext = select(IfaceOptions(public_ip="10.20.0.6"))
    assert (ext.name, str(ext.ext_addr), str(ext.iface_addr)) == (
        "eth1", "10.20.0.6", "10.20.0.6")
    with pytest.raises(InterfaceError, match="no interface holds the public IP"):
        select(IfaceOptions(public_ip="203.0.113.1"))


def test_public_ip_with_iface_is_published_as_is():
    ext = select(IfaceOptions(ifaces=["eth0"], public_ip="203.0.113.1"))
    assert (str(ext.iface_addr), str(ext.ext_addr)) == ("192.168.1.10", "203.0.113.1")


@pytest.mark.parametrize(("opts", "flag"), [
    (IfaceOptions(public_ip="nope"), "--public-ip"),
    (IfaceOptions(public_ip="fd00::1"), "--public-ip"),
    (IfaceOptions(public_ipv6="1.2.3.4"), "--public-ipv6"),
    (IfaceOptions(iface_can_reach="host.example"), "--iface-can-reach"),
])
def test_bad_addresses_name_the_flag(opts, flag):
    with pytest.raises(InterfaceError, match=flag):
        select(opts)


def test_address_preference_global_permanent_stable():
    iface = Interface(5, "wl0", 1500, (
        addr("fe80::5"),
        addr("2001:db8::7", IFA_F_TEMPORARY),
        addr("2001:db8::9", 0),
        addr("2001:db8::1", IFA_F_PERMANENT | IFA_F_DEPRECATED),
        addr("2001:db8::2", IFA_F_PERMANENT),
    ))
    snap = NetSnapshot([iface], 5, 5)
    assert str(select(IfaceOptions(), snap, ipv4=False, ipv6=True).iface_v6_addr) == \
        "2001:db8::2"
    only_dynamic = Interface(5, "wl0", 1500, (addr("fe80::5"), addr("2001:db8::7",
                                                                     IFA_F_TEMPORARY),
                                              addr("2001:db8::9", 0)))
    assert str(select(IfaceOptions(), NetSnapshot([only_dynamic], 5, 5), ipv4=False,
                      ipv6=True).iface_v6_addr) == "2001:db8::9"


def test_interface_without_address_or_mtu():
    bare = Interface(7, "br0", 1500, ())
    with pytest.raises(InterfaceError, match="failed to find IPv4 address for interface br0"):
        select(IfaceOptions(ifaces=["br0"]), snapshot(interfaces=[bare]))
    no_mtu = Interface(7, "br0", 0, (addr("10.0.0.1"),))
    with pytest.raises(InterfaceError, match="MTU"):
        select(IfaceOptions(ifaces=["br0"]), snapshot(interfaces=[no_mtu]))


@pytest.mark.parametrize(("flags", "text", "why"), [
    (IFA_F_PERMANENT, "fe80::5", "fe80::5 is link-local"),
    (IFA_F_PERMANENT | IFA_F_TENTATIVE, "2001:db8::5",
     "2001:db8::5 is tentative: duplicate address detection has not finished"),
    (IFA_F_PERMANENT | IFA_F_DADFAILED | IFA_F_TENTATIVE, "2001:db8::5",
     "2001:db8::5 is a duplicate: duplicate address detection failed"),
])
def test_no_usable_ipv6_address_is_refused_naming_the_interface(flags, text, why):
    iface = Interface(5, "eth0", 1500, (addr("192.168.1.10"), addr(text, flags)))
    with pytest.raises(InterfaceError) as caught:
        select(IfaceOptions(), NetSnapshot([iface], 5, 5), ipv6=True)
    message = str(caught.value)
    assert message.startswith(f"failed to find IPv6 address for interface eth0: it has only "
                              f"unusable ones ({why}); other nodes must reach this node at a "
                              "global IPv6 address: give eth0 one")
    assert message.endswith("or choose another interface with --iface")
    assert ("wait for duplicate address detection" in message) == why.endswith("finished")


def test_a_usable_address_wins_over_tentative_and_link_local_ones():
    iface = Interface(5, "eth0", 1500, (addr("fe80::5"), addr("2001:db8::1", IFA_F_TENTATIVE),
                                        addr("2001:db8::2", 0)))
    ext = select(IfaceOptions(), NetSnapshot([iface], 5, 5), ipv4=False, ipv6=True)
    assert str(ext.ext_v6_addr) == "2001:db8::2"


def test_ipv4_link_local_is_not_published():
    iface = Interface(5, "eth0", 1500, (addr("169.254.3.4"),))
    with pytest.raises(InterfaceError, match=r"it has only unusable ones \(169.254.3.4 is "
                                             r"link-local\); other nodes must reach this node "
                                             r"at an IPv4 address"):
        select(IfaceOptions(), NetSnapshot([iface], 5, None))


def test_iface_naming_an_unusable_address_is_refused():
    with pytest.raises(InterfaceError, match=r"^--iface fe80::1: that address of eth0 is "
                                             r"link-local; other nodes cannot reach"):
        select(IfaceOptions(ifaces=["fe80::1"]), ipv4=False, ipv6=True)
