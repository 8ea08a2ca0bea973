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


def described(text) -> str:
    with pytest.raises(ConfigError) as caught:
        checked(text)
    return caught.value.describe()


def test_subnet_min_above_subnet_max_says_so():
    assert described('{"Network": "10.0.0.0/16", "SubnetMin": "10.0.9.0", '
                     '"SubnetMax": "10.0.3.0"}') == (
        "SubnetMin 10.0.9.0 is greater than SubnetMax 10.0.3.0; swap them, or leave them out "
        "to use all of the Network")


def test_ipv6_subnet_min_above_max_says_so():
    assert described('{"EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fc00::/48", '
                     '"IPv6SubnetMin": "fc00:0:0:9::", "IPv6SubnetMax": "fc00:0:0:3::"}'
                     ).startswith("IPv6SubnetMin fc00:0:0:9:: is greater than IPv6SubnetMax "
                                  "fc00:0:0:3::; swap them")


@pytest.mark.parametrize("backend", ['"Backend": {}', '"Backend": null', '"backend": {"vni": 1}'])
def test_missing_backend_type_says_how_to_set_it(backend):
    assert described(f'{{"Network": "10.0.0.0/16", {backend}}}') == (
        'Backend.Type is missing; name the backend, e.g. "Backend": {"Type": "vxlan"}')


@pytest.mark.parametrize(("field", "network", "what"), [
    ("Network", "224.0.0.0/4", "the multicast range 224.0.0.0/4"),
    ("Network", "239.1.0.0/16", "the multicast range 224.0.0.0/4"),
    ("Network", "127.0.0.0/16", "the loopback range 127.0.0.0/8"),
    ("Network", "0.0.0.0/16", "the 'this network' range 0.0.0.0/8"),
    ("Network", "169.254.0.0/16", "the link-local range 169.254.0.0/16"),
    ("IPv6Network", "ff00::/16", "the multicast range ff00::/8"),
    ("IPv6Network", "::/127", "the loopback address ::1"),
    ("IPv6Network", "fe80::/56", "the link-local range fe80::/10"),
])
def test_reserved_networks_are_refused(field, network, what):
    example = "10.244.0.0/16" if field == "Network" else "fd00:10:244::/56"
    with pytest.raises(ConfigError) as caught:
        parse_config(f'{{"{field}": "{network}", "EnableIPv6": true}}')
    assert caught.value.describe() == (
        f"config field '{field}': {network} overlaps {what}; use a private range such as "
        f"{example}")


def test_deep_config_is_refused_with_the_limit():
    text = '{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "X": ' + "[" * 1000 \
        + "]" * 1000 + "}}"
    assert described(text) == (
        "network config nests JSON deeper than the limit of 32 levels; a network config is "
        'one small JSON object, e.g. {"Network": "10.244.0.0/16", "Backend": {"Type": '
        '"vxlan"}}')


def test_huge_config_is_refused_with_the_limit():
    text = '{"Network": "10.0.0.0/16", "Pad": "' + "x" * (1 << 20) + '"}'
    assert described(text).startswith(
        "network config is larger than the limit of 1048576 bytes; ")


@pytest.mark.parametrize(("text", "message"), [
    ('{"Network": NaN}', "network config is not valid JSON: NaN is not a JSON number"),
    ('{"Network": "10.0.0.0/8", "SubnetLen": 1e400}',
     "network config is not valid JSON: number 1e400 is out of range"),
    ('{"Network": "' + "9" * 200 + '"}',
     "config field 'Network': '" + "9" * 60 + "'... is not a CIDR such as 10.244.0.0/16"),
])
def test_hostile_values_are_refused_briefly(text, message):
    assert described(text).startswith(message)


def test_non_utf8_bytes_decode_as_go_does():
    cfg = parse_config(b'{"Network": "10.0.0.0/16", "Backend": {"Type": "vxlan", "X": "\xff"}}')
    assert cfg.backend == {"Type": "vxlan", "X": "\ufffd"}


def test_network_overlapping_the_node_address_is_named():
    from flannel.config import network_overlaps_underlay

    cfg = checked('{"Network": "10.0.0.0/8", "EnableIPv6": true, "IPv6Network": "fd00::/56"}')
    assert network_overlaps_underlay(cfg, [IPv4Address("192.168.1.5"), None]) is None
    assert network_overlaps_underlay(cfg, [IPv4Address("10.99.0.2")]) == (
        "Network 10.0.0.0/8 contains this node's address 10.99.0.2; choose another Network "
        "that does not overlap the hosts' own network")
    assert network_overlaps_underlay(cfg, [IPv6Address("fd00::7")]) == (
        "IPv6Network fd00::/56 contains this node's address fd00::7; choose another IPv6Network "
        "that does not overlap the hosts' own network")


def test_unknown_keys_are_named_once_with_the_nearest_known_one(caplog):
    from flannel.backend import backend_class

    text = ('{"Network": "10.244.0.0/16", "SubnetLenght": 22, "Backend": {"Type": "vxlan", '
            '"DirectRoutng": true, "vni": 7, "Colour": "blue"}}')
    with caplog.at_level("WARNING", logger="flannel.config"):
        cfg = checked(text)
        backend_class("vxlan").check_options(cfg)
        checked(text)  # parsed again (a restart of the config wait): not warned again
        backend_class("vxlan").check_options(cfg)
    assert cfg.subnet_len == 24  # ignored as Go ignores it: the default applies
    assert caplog.messages == [
        'unknown key "SubnetLenght" in the network config is ignored; did you mean '
        '"SubnetLen"?',
        'unknown key "DirectRoutng" in Backend is ignored; did you mean "DirectRouting"?',
        'unknown key "Colour" in Backend is ignored; known keys: DirectRouting, GBP, '
        'Learning, MTU, Port, Type, VNI']


@pytest.mark.parametrize(("backend", "message"), [
    ({"Type": "vxlan", "VNI": "one"},
     'error decoding VXLAN backend config: VNI must be an integer, got string "one"'),
    ({"Type": "udp", "Port": 0}, "error decoding UDP backend config: Port 0 is not a UDP port"),
    ({"Type": "wireguard", "Mode": "both"}, "no valid Mode configured"),
    ({"Type": "ipip", "DirectRouting": "yes"},
     "error decoding IPIP backend config: DirectRouting must be a bool"),
])
def test_backend_options_are_checked_without_building_anything(backend, message):
    from flannel.backend import BackendError, backend_class

    cfg = checked('{"Network": "10.244.0.0/16"}')
    cfg.backend = backend
    with pytest.raises(BackendError, match="^" + message.replace("(", r"\(")):
        backend_class(backend["Type"]).check_options(cfg)


def test_unknown_keys_of_a_hostile_config_are_few_lines_and_quoted():
    from flannel.config import unknown_keys

    doc = {"Network": "10.244.0.0/16", **{f"k\n{i}": i for i in range(500)}}
    found = [message for _key, message in unknown_keys(doc, ("Network",), "the network config")]
    assert len(found) == 11
    assert found[0] == 'unknown key "k\\n0" in the network config is ignored; known keys: Network'
    assert found[-1] == "490 more unknown keys in the network config are ignored"
