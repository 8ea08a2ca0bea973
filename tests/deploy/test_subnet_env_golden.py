"""subnet.env as flanneld writes it is byte-for-byte what Go flanneld writes, and what
upstream's static flannel CNI plugin (the default on every node) parses without error.

The golden files hold upstream's own examples (Documentation/running.md,
dist/sample_subnet.env, the dual-stack example of Documentation/configuration.md) and an
IPv6-only file in the same format."""

import ipaddress
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network
from pathlib import Path

import pytest

from flannel.subnet.envfile import SubnetEnv, write_subnet_env

GOLDEN = Path(__file__).parent / "golden"


@dataclass
class PluginView:
    """What upstream's flannel CNI plugin (flannel-io/cni-plugin v1.9.1, loadFlannelSubnetEnv)
    reads from subnet.env: lines split at the first ``=``; network lists split at ``,`` with
    duplicates dropped; subnets masked; MTU an unsigned decimal; IPMASQ true only for
    ``true``. Any unparsable value of a known key is an error; so are missing keys."""

    networks: list
    subnet: object
    ipv6_networks: list
    ipv6_subnet: object
    mtu: int | None
    ipmasq: bool | None

    @classmethod
    def parse(cls, text: str) -> "PluginView":
        view = cls([], None, [], None, None, None)
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key in ("FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"):
                target = view.networks if key == "FLANNEL_NETWORK" else view.ipv6_networks
                target.clear()
                for item in value.split(","):
                    network = go_parse_cidr(item)
                    if network not in target:
                        target.append(network)
            elif key == "FLANNEL_SUBNET":
                view.subnet = go_parse_cidr(value)
            elif key == "FLANNEL_IPV6_SUBNET":
                view.ipv6_subnet = go_parse_cidr(value)
            elif key == "FLANNEL_MTU":
                if not value.isascii() or not value.isdigit() or int(value) >= 2**32:
                    raise ValueError(f"strconv.ParseUint: parsing {value!r}: invalid syntax")
                view.mtu = int(value)
            elif key == "FLANNEL_IPMASQ":
                view.ipmasq = value == "true"
        missing = []
        if not view.networks and not view.ipv6_networks:
            missing.append("FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK")
        if view.subnet is None and view.ipv6_subnet is None:
            missing.append("FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET")
        if view.mtu is None:
            missing.append("FLANNEL_MTU")
        if view.ipmasq is None:
            missing.append("FLANNEL_IPMASQ")
        if missing:
            raise ValueError(f"subnet.env is missing {', '.join(missing)}")
        return view


def go_parse_cidr(text: str):
    """Go's net.ParseCIDR: address/prefix, no spaces, returns the masked network."""
    if text != text.strip() or "/" not in text:
        raise ValueError(f"invalid CIDR address: {text}")
    return ipaddress.ip_interface(text).network


CASES = {
    "running.env": SubnetEnv(IPv4Network("10.5.0.0/16"), IPv4Network("10.5.72.0/24"), None,
                             None, 1450, False),
    "sample_subnet.env": SubnetEnv(IPv4Network("10.1.0.0/16"), IPv4Network("10.1.74.0/24"),
                                   None, None, 1472, False),
    "dual-stack.env": SubnetEnv(IPv4Network("10.42.0.0/16"), IPv4Network("10.42.0.0/24"),
                                IPv6Network("2001:cafe:42::/56"),
                                IPv6Network("2001:cafe:42::/64"), 1450, True),
    "ipv6-only.env": SubnetEnv(None, None, IPv6Network("fc00::/48"),
                               IPv6Network("fc00:0:0:5::/64"), 1430, True),
}


@pytest.mark.parametrize("golden", sorted(CASES))
def test_written_file_is_the_golden_file(golden, tmp_path):
    path = tmp_path / "subnet.env"
    write_subnet_env(path, CASES[golden])
    assert path.read_bytes() == (GOLDEN / golden).read_bytes()


@pytest.mark.parametrize("golden", sorted(CASES))
def test_upstream_plugin_reads_what_was_written(golden):
    env = CASES[golden]
    view = PluginView.parse((GOLDEN / golden).read_text())
    assert view.networks == ([env.network] if env.network else [])
    assert view.subnet == env.subnet
    assert view.ipv6_networks == ([env.ipv6_network] if env.ipv6_network else [])
    assert view.ipv6_subnet == env.ipv6_subnet
    assert (view.mtu, view.ipmasq) == (env.mtu, env.ip_masq)


def test_plugin_view_rejects_what_the_plugin_rejects():
    with pytest.raises(ValueError, match="is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, "
                                         "FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, "
                                         "FLANNEL_IPMASQ"):
        PluginView.parse("foo=bar\n")
    with pytest.raises(ValueError):
        PluginView.parse("FLANNEL_NETWORK=10.1.0.0/16 \n")
    with pytest.raises(ValueError):
        PluginView.parse("FLANNEL_MTU=-1\n")
