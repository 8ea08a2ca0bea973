"""Free-subnet search and lease compatibility (compat reference 3.5)."""

from ipaddress import IPv4Address, IPv4Network, IPv6Network

from flannel.config import check_network_config, parse_config
from flannel.subnet.etcd import free_candidates, subnet_fits


def cfg(text: str):
    config = parse_config(text)
    check_network_config(config)
    return config


def test_candidates_skip_taken_and_overlapping_subnets():
    taken = [IPv4Network("10.3.1.0/24"), IPv4Network("10.3.2.0/23"), IPv4Network("10.3.5.128/25")]
    free = free_candidates(IPv4Network, 24, 32, IPv4Address("10.3.1.0"),
                           IPv4Address("10.3.8.0"), taken)
    assert [str(n) for n in free] == ["10.3.4.0/24", "10.3.6.0/24", "10.3.7.0/24",
                                      "10.3.8.0/24"]


def test_candidates_stop_at_the_limit():
    free = free_candidates(IPv4Network, 24, 32, IPv4Address("10.0.1.0"),
                           IPv4Address("10.255.255.0"), [])
    assert len(free) == 100 and str(free[-1]) == "10.0.100.0/24"


def test_candidates_jump_over_a_large_lease():
    free = free_candidates(IPv4Network, 24, 32, IPv4Address("10.0.0.0"),
                           IPv4Address("10.2.0.0"), [IPv4Network("10.0.0.0/15")])
    assert [str(n) for n in free] == ["10.2.0.0/24"]


def test_ipv6_candidates():
    free = free_candidates(IPv6Network, 64, 128, IPv6Network("fc00:0:0:1::/64").network_address,
                           IPv6Network("fc00:0:0:3::/64").network_address,
                           [IPv6Network("fc00:0:0:2::/64")])
    assert [str(n) for n in free] == ["fc00:0:0:1::/64", "fc00:0:0:3::/64"]


def test_subnet_fits():
    config = cfg('{"Network": "10.3.0.0/16", "SubnetMin": "10.3.1.0", "SubnetMax": "10.3.25.0"}')
    assert subnet_fits(config, IPv4Network("10.3.6.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.4.1.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.3.31.0/24"), None)
    assert not subnet_fits(config, IPv4Network("10.3.6.0/25"), None)
    assert not subnet_fits(config, IPv4Network("10.3.6.0/24"), IPv6Network("fd00::/64"))
    dual = cfg('{"Network": "10.3.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00::/56"}')
    assert subnet_fits(dual, IPv4Network("10.3.6.0/24"), IPv6Network("fd00:0:0:5::/64"))
    assert not subnet_fits(dual, IPv4Network("10.3.6.0/24"), None)
