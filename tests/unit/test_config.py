"""Network config parsing and validation: the vectors of the compat reference, section 2."""

from ipaddress import IPv4Address, IPv4Network, IPv6Address

import pytest

from flannel.config import ConfigError, check_network_config, parse_config


def checked(text: str):
    cfg = parse_config(text)
    check_network_config(cfg)
    return cfg


def test_defaults_for_a_slash16():
    cfg = checked('{ "network": "10.3.0.0/16" }')
    assert cfg.network == IPv4Network("10.3.0.0/16")
    assert (cfg.subnet_len, cfg.subnet_min, cfg.subnet_max) == (
        24, IPv4Address("10.3.1.0"), IPv4Address("10.3.255.0"))
    assert cfg.backend_type == "udp"  # upstream's code default when Backend is absent


def test_ipv6_only_defaults():
    cfg = checked('{ "enableIPv6": true, "ipv6Network": "fc00::/48", "enableIPv4": false }')
    assert (cfg.ipv6_subnet_len, cfg.ipv6_subnet_min, cfg.ipv6_subnet_max) == (
        64, IPv6Address("fc00:0:0:1::"), IPv6Address("fc00:0:0:ffff::"))
    assert cfg.enable_ipv4 is False


def test_explicit_values_are_kept():
    cfg = parse_config('{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.5.0", '
                       '"SubnetMax": "10.3.8.0", "SubnetLen": 28 }')
    assert (cfg.subnet_len, cfg.subnet_min, cfg.subnet_max) == (
        28, IPv4Address("10.3.5.0"), IPv4Address("10.3.8.0"))
    checked('{ "Network": "10.3.0.0/16", "SubnetMin": "10.3.5.0", '
            '"SubnetMax": "10.3.8.0", "SubnetLen": 28 }')


def test_explicit_ipv6_values_are_kept():
    cfg = checked('{ "EnableIPv6": true, "IPv6Network": "fc00::/48", '
                  '"IPv6SubnetMin": "fc00:0:0:1::", "IPv6SubnetMax": "fc00:0:0:f::", '
                  '"IPv6SubnetLen": 124, "enableIPv4": false }')
    assert (cfg.ipv6_subnet_len, cfg.ipv6_subnet_min, cfg.ipv6_subnet_max) == (
        124, IPv6Address("fc00:0:0:1::"), IPv6Address("fc00:0:0:f::"))


@pytest.mark.parametrize(("network", "subnet_len", "smin", "smax"), [
    ("10.0.0.0/23", 25, "10.0.0.128", "10.0.1.128"),
    ("10.0.0.0/28", 30, "10.0.0.4", "10.0.0.12"),
    ("10.0.0.0/22", 24, "10.0.1.0", "10.0.3.0"),
])
def test_derived_defaults(network, subnet_len, smin, smax):
    cfg = checked(f'{{"Network": "{network}"}}')
    assert (cfg.subnet_len, str(cfg.subnet_min), str(cfg.subnet_max)) == (subnet_len, smin, smax)


def test_network_is_masked():
    assert checked('{"Network": "10.5.1.7/16"}').network == IPv4Network("10.5.0.0/16")


def test_keys_match_case_insensitively_and_last_spelling_wins():
    cfg = parse_config('{"NETWORK": "10.1.0.0/16", "network": "10.2.0.0/16", '
                       '"backend": {"TYPE": "VXLAN", "vni": 4}, "unknown": 1}')
    assert cfg.network == IPv4Network("10.2.0.0/16")
    assert cfg.backend_type == "vxlan"
    assert cfg.backend == {"TYPE": "VXLAN", "vni": 4}


def test_documentation_example():
    cfg = checked('{"Network":"10.0.0.0/8","SubnetLen":20,"SubnetMin":"10.10.0.0",'
                  '"SubnetMax":"10.99.0.0","Backend":{"Type":"udp","Port":7890}}')
    assert (cfg.subnet_len, str(cfg.subnet_min), str(cfg.subnet_max)) == (
        20, "10.10.0.0", "10.99.0.0")
    assert cfg.backend == {"Type": "udp", "Port": 7890}


def test_manifest_default():
    cfg = checked('{"Network":"10.244.0.0/16","EnableNFTables":false,"Backend":{"Type":"vxlan"}}')
    assert cfg.backend_type == "vxlan" and cfg.enable_nftables is False


@pytest.mark.parametrize(("text", "message"), [
    ('{"Network": "10.0.0.0/29"}', "network is too small. Minimum useful network prefix is /28"),
    ('{}', "please define a correct Network parameter in the flannel config"),
    ('{"Network": "10.0.0.0/16", "SubnetLen": 31}', "SubnetLen must be less than /31"),
    ('{"Network": "10.0.0.0/16", "SubnetLen": 17},',
     "network config is not valid JSON"),
    ('{"Network": "10.0.0.0/16", "SubnetLen": 17}',
     "network must be able to accommodate at least four subnets"),
    ('{"Network": "10.3.0.0/16", "SubnetMin": "10.4.0.0"}',
     "SubnetMin is not in the range of the Network"),
    ('{"Network": "10.3.0.0/16", "SubnetMax": "10.4.0.0"}',
     "SubnetMax is not in the range of the Network"),
    ('{"Network": "10.3.0.0/16", "SubnetMin": "10.3.0.1"}',
     "SubnetMin is not on a SubnetLen boundary: 10.3.0.1"),
    ('{"Network": "10.3.0.0/16", "SubnetMax": "10.3.7.128"}',
     "SubnetMax is not on a SubnetLen boundary: 10.3.7.128"),
    ('{"EnableIPv4": false, "EnableIPv6": true}',
     "please define a correct IPv6Network parameter in the flannel config"),
    ('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fc00::/125"}',
     "IPv6Network is too small. Minimum useful network prefix is /124"),
    ('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fc00::/48", '
     '"IPv6SubnetLen": 127}', "SubnetLen must be less than /127"),
    ('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fc00::/48", '
     '"IPv6SubnetMin": "fd00::"}', "IPv6SubnetMin is not in the range of the IPv6Network"),
    ('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fc00::/48", '
     '"IPv6SubnetMax": "fc00:0:0:1::1"}', "IPv6SubnetMax is not on a SubnetLen boundary: "
     "fc00:0:0:1::1"),
    ('{"EnableIPv4": false}', "none defined stack"),
])
def test_invalid_configs_give_upstream_errors(text, message):
    with pytest.raises(ConfigError) as caught:
        checked(text)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(("text", "field"), [
    ('{"Network": 10}', "'Network'"),
    ('{"Network": "fc00::/48"}', "invalid IPv4 CIDR format"),
    ('{"Network": "10.0.0.0/33"}', "'Network'"),
    ('{"SubnetLen": "24", "Network": "10.0.0.0/8"}', "'SubnetLen'"),
    ('{"SubnetLen": 24.5, "Network": "10.0.0.0/8"}', "'SubnetLen'"),
    ('{"SubnetLen": -1, "Network": "10.0.0.0/8"}', "'SubnetLen'"),
    ('{"EnableIPv6": "yes"}', "'EnableIPv6'"),
    ('{"SubnetMin": "10.0.0.300", "Network": "10.0.0.0/8"}', "'SubnetMin'"),
    ('{"Network": "10.0.0.0/8", "Backend": "vxlan"}', "error decoding Backend property"),
    ('[1, 2]', "must be a JSON object"),
])
def test_wrong_types_name_the_field(text, field):
    with pytest.raises(ConfigError, match=field):
        parse_config(text)


def test_errors_carry_a_fix():
    with pytest.raises(ConfigError) as caught:
        checked('{"Network": "10.0.0.0/16", "SubnetLen": 17}')
    assert "SubnetLen to at least 18" in caught.value.describe()


@pytest.mark.parametrize(("backend", "expected"), [
    ("", "udp"),
    (', "Backend": {"Type": "Host-GW"}', "host-gw"),
])
def test_backend_type_rule(backend, expected):
    assert parse_config(f'{{"Network": "10.0.0.0/8"{backend}}}').backend_type == expected


def test_null_members_leave_defaults():
    cfg = parse_config('{"Network": "10.0.0.0/8", "EnableIPv4": null, "SubnetLen": null}')
    assert cfg.enable_ipv4 is True and cfg.subnet_len == 0


def test_non_masquerade_cidrs_extension():
    cfg = parse_config('{"Network": "10.0.0.0/8", "nonMasqueradeCIDRs": ["192.168.1.7/16", '
                       '"fd00:9::/64"]}')
    assert [str(n) for n in cfg.non_masquerade] == ["192.168.0.0/16", "fd00:9::/64"]
    with pytest.raises(ConfigError, match="NonMasqueradeCIDRs"):
        parse_config('{"Network": "10.0.0.0/8", "NonMasqueradeCIDRs": ["nope"]}')
    with pytest.raises(ConfigError, match="NonMasqueradeCIDRs"):
        parse_config('{"Network": "10.0.0.0/8", "NonMasqueradeCIDRs": "10.0.0.0/8"}')
