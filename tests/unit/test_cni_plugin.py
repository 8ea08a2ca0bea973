"""The CNI plugin's pure parts: subnet.env parsing and the golden delegate configs (compat
reference section 10)."""

from __future__ import annotations

import json
import re

import pytest

from flannel.cni import plugin
from flannel.cni.plugin import CniError, build_delegate, encode, load_netconf, parse_subnet_env

V4_ENV = "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\n" \
         "FLANNEL_IPMASQ=true\n"
V6_ENV = "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\n" \
         "FLANNEL_IPMASQ=true\n"
INPUT = {"name": "cni-flannel", "type": "flannel"}


def env_file(tmp_path, text: str):
    path = tmp_path / "subnet.env"
    path.write_text(text)
    return str(path)


def delegate_for(tmp_path, env_text: str, conf: dict = INPUT) -> str:
    env = parse_subnet_env(env_file(tmp_path, env_text))
    return encode(build_delegate(load_netconf(json.dumps(conf).encode()), env)).decode()


def test_golden_ipv4(tmp_path):
    assert delegate_for(tmp_path, V4_ENV) == (
        '{"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}]],'
        '"routes":[{"dst":"10.1.0.0/16"}],"type":"host-local"},"isGateway":true,"mtu":1472,'
        '"name":"cni-flannel","type":"bridge"}')


def test_golden_dual_stack(tmp_path):
    doc = json.loads(delegate_for(tmp_path, V4_ENV + V6_ENV))
    assert doc["ipam"]["ranges"] == [[{"subnet": "10.1.17.0/24"}], [{"subnet": "fc00::/64"}]]
    assert doc["ipam"]["routes"] == [{"dst": "10.1.0.0/16"}, {"dst": "fc00::/48"}]


def test_golden_ipv6_only(tmp_path):
    doc = json.loads(delegate_for(tmp_path, V6_ENV))
    assert doc["ipam"]["ranges"] == [[{"subnet": "fc00::/64"}]]
    assert doc["ipam"]["routes"] == [{"dst": "fc00::/48"}]


def test_two_networks_give_two_routes_one_range(tmp_path):
    text = V4_ENV.replace("10.1.0.0/16", "10.1.0.0/16,192.168.0.0/16,10.1.0.0/16")
    doc = json.loads(delegate_for(tmp_path, text))
    assert doc["ipam"]["routes"] == [{"dst": "10.1.0.0/16"}, {"dst": "192.168.0.0/16"}]
    assert doc["ipam"]["ranges"] == [[{"subnet": "10.1.17.0/24"}]]


def test_custom_ipam_and_extra_routes_are_kept_first(tmp_path):
    conf = {**INPUT, "cniVersion": "1.0.0", "ipam": {
        "type": "my-ipam", "unknown-param": "value",
        "routes": [{"dst": "10.96.0.0/12"}, {"dst": "192.168.244.0/24", "gw": "10.1.17.20"}]}}
    doc = json.loads(delegate_for(tmp_path, V4_ENV, conf))
    assert doc["cniVersion"] == "1.0.0"
    assert doc["ipam"]["type"] == "my-ipam" and doc["ipam"]["unknown-param"] == "value"
    assert doc["ipam"]["routes"] == [{"dst": "10.96.0.0/12"},
                                     {"dst": "192.168.244.0/24", "gw": "10.1.17.20"},
                                     {"dst": "10.1.0.0/16"}]


def test_delegate_settings_win_and_runtime_config_is_copied(tmp_path):
    conf = {**INPUT, "delegate": {"type": "ptp", "ipMasq": True, "mtu": 9000},
            "runtimeConfig": {"portMappings": [{"hostPort": 80}]}}
    doc = json.loads(delegate_for(tmp_path, V4_ENV, conf))
    assert (doc["type"], doc["ipMasq"], doc["mtu"]) == ("ptp", True, 9000)
    assert "isGateway" not in doc  # only defaulted for bridge
    assert doc["runtimeConfig"] == {"portMappings": [{"hostPort": 80}]}


@pytest.mark.parametrize(("conf", "message"), [
    ({**INPUT, "delegate": {"name": "x"}}, "must not have 'name' field"),
    ({**INPUT, "delegate": {"ipam": {}}}, "must not have 'ipam' field"),
    ({**INPUT, "delegate": {"type": 7}}, "must have (string) 'type' field"),
    ({**INPUT, "cniVersion": "9.9.9"}, "incompatible CNI versions"),
])
def test_bad_netconf(conf, message):
    with pytest.raises(CniError, match=re.escape(message)):
        load_netconf(json.dumps(conf).encode())


def test_bad_ipam_routes(tmp_path):
    conf = {**INPUT, "ipam": {"routes": [{"gw": "1.2.3.4"}]}}
    with pytest.raises(CniError, match=r"failed to read IPAM routes: failed to parse ipam\.routes"):
        delegate_for(tmp_path, V4_ENV, conf)


def test_missing_keys_are_listed_in_order(tmp_path):
    with pytest.raises(CniError) as caught:
        parse_subnet_env(env_file(tmp_path, "foo=bar\n"))
    assert "is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, FLANNEL_SUBNET, " \
           "FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ" in caught.value.msg
    assert caught.value.msg.startswith("failed to load flannel 'subnet.env' file: ")


def test_missing_file_says_to_check_flanneld(tmp_path):
    with pytest.raises(CniError) as caught:
        parse_subnet_env(str(tmp_path / "absent.env"))
    assert "no such file or directory" in caught.value.msg
    assert "Is flanneld running on this node?" in caught.value.msg
    assert caught.value.code == plugin.TRY_AGAIN_LATER


@pytest.mark.parametrize("line", ["FLANNEL_MTU=-1", "FLANNEL_MTU=abc", "FLANNEL_SUBNET=10.1.x",
                                  "FLANNEL_NETWORK=10.1.0.0/16,bogus"])
def test_parse_errors_are_fatal(tmp_path, line):
    with pytest.raises(CniError):
        parse_subnet_env(env_file(tmp_path, V4_ENV + line + "\n"))


def test_subnet_is_masked_and_ipmasq_needs_exactly_true(tmp_path):
    env = parse_subnet_env(env_file(tmp_path, V4_ENV.replace("=true", "=TRUE")))
    assert str(env["subnet"]) == "10.1.17.0/24" and env["ipmasq"] is False


@pytest.mark.parametrize("container_id", ["../etc", "a/b", ".hidden", "", "x" * 300])
def test_unsafe_container_ids_are_refused(tmp_path, container_id):
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": container_id, "CNI_NETNS": "/x",
               "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni"}
    conf = {**INPUT, "subnetFile": env_file(tmp_path, V4_ENV), "dataDir": str(tmp_path / "d")}
    with pytest.raises(CniError):
        plugin.run(environ, json.dumps(conf).encode())
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())


def test_version_lists_every_supported_version():
    out = json.loads(plugin.run({"CNI_COMMAND": "VERSION"}, b'{"cniVersion":"0.4.0"}'))
    assert out == {"cniVersion": "0.4.0", "supportedVersions": [
        "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


@pytest.mark.parametrize("command", ["CHECK", "GC", "STATUS"])
def test_check_gc_status_succeed_quietly(command):
    conf = {**INPUT, "cniVersion": "1.1.0"}
    environ = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/x",
               "CNI_IFNAME": "eth0", "CNI_PATH": "/usr/lib/cni"}
    assert plugin.run(environ, json.dumps(conf).encode()) == b""


def test_unknown_command_is_an_env_error():
    with pytest.raises(CniError) as caught:
        plugin.run({"CNI_COMMAND": "FROB"}, json.dumps(INPUT).encode())
    assert caught.value.code == plugin.INVALID_ENV
