"""The ipsec backend's options and VICI messages, as Go flannel reads and sends them: option
names and defaults, the messages a user sees for an unusable config (never the PSK), the MTU,
and the ``load-shared``/``load-conn`` messages encoded by the vici package's own encoder and
decoded back, field by field as Go's goStrongswanVici sends them."""

from __future__ import annotations

import asyncio
from ipaddress import IPv4Address, IPv4Network

import pytest

from flannel.backend import BackendConfigError, backend_class, supported
from flannel.config import NetworkConfig
from flannel.ipsec import config as ipsec
from flannel.ipsec.config import IpsecConfig, Pair
from flannel.kernel.iface import ExternalInterface

PSK = "k" * 40 + "0123456789abcdef" * 4  # 104 characters
PAIR = Pair(IPv4Address("192.168.1.10"), IPv4Network("10.244.3.0/24"),
            IPv4Address("192.168.1.11"), IPv4Network("10.244.7.0/24"))


def test_defaults_and_option_names_are_gos_and_matched_case_insensitively():
    cfg = IpsecConfig.from_backend({"Type": "ipsec", "psk": PSK})
    assert (cfg.psk, cfg.udp_encap, cfg.esp_proposal) == (
        PSK, False, "aes128gcm16-sha256-prfsha256-ecp256")
    cfg = IpsecConfig.from_backend({"PSK": PSK, "udpencap": True,
                                    "ESPPROPOSAL": "aes256gcm16-sha384"})
    assert (cfg.udp_encap, cfg.esp_proposal) == (True, "aes256gcm16-sha384")
    assert ipsec.OPTION_NAMES == ("UDPEncap", "ESPProposal", "PSK")
    assert "ipsec" in supported()


@pytest.mark.parametrize(("backend", "message"), [
    ({}, "config error, password is too short: the ipsec backend's PSK has 0 characters, "
     "it needs at least 96"),
    ({"PSK": PSK[:95]}, "config error, password is too short: the ipsec backend's PSK has 95 "
     "characters, it needs at least 96"),
    ({"PSK": 12345}, "error decoding IPSEC backend config: PSK must be a string of at least "
     "96 characters"),
    ({"PSK": PSK, "UDPEncap": "yes"}, "error decoding IPSEC backend config: UDPEncap must be a "
     'bool, got string "yes"'),
    ({"PSK": PSK, "ESPProposal": "aes128; rm -rf /"}, 'ESPProposal "aes128; rm -rf /" is not '
     "a strongSwan ESP proposal"),
    ({"PSK": PSK, "ESPProposal": ""}, "is not a strongSwan ESP proposal"),
    ({"PSK": PSK[:90] + "\n" + PSK}, "PSK must be at most 4096 printable characters"),
])
def test_an_unusable_config_is_refused_by_name_and_never_echoes_the_psk(backend, message):
    with pytest.raises(BackendConfigError) as err:
        IpsecConfig.from_backend(backend)
    assert message in str(err.value)
    assert PSK[:90] not in str(err.value)


def test_the_psk_hides_itself_from_reprs():
    cfg = IpsecConfig.from_backend({"PSK": PSK})
    assert PSK not in repr(cfg) and "hidden" in repr(cfg)


def test_mtu_is_gos_and_counts_udp_when_encapsulated():
    cfg = IpsecConfig.from_backend({"PSK": PSK})
    assert cfg.mtu(1500) == 1423
    assert IpsecConfig.from_backend({"PSK": PSK, "UDPEncap": True}).mtu(1500) == 1415
    assert cfg.mtu(1500, udp_encap=True) == 1415  # forced by kernel-libipsec


def test_names_are_gos():
    assert ipsec.connection_name(PAIR) == "192.168.1.10-10.244.3.0/24-10.244.7.0/24-192.168.1.11"
    assert ipsec.child_name(PAIR) == "10.244.3.0/24-10.244.7.0/24"


def roundtrip(message: dict) -> dict:
    """Through the vici package's encoder and decoder, as charon receives it."""
    protocol = pytest.importorskip("vici.protocol", reason="needs the vici package")
    raw = protocol.Message.serialize(message)
    return protocol.Message.deserialize(protocol.FiniteStream(raw))


def test_load_conn_carries_gos_parameters_for_kernel_esp():
    cfg = IpsecConfig.from_backend({"PSK": PSK})
    decoded = roundtrip(ipsec.connection_message(PAIR, cfg, encap=False, install_policies=False))
    conn = decoded["192.168.1.10-10.244.3.0/24-10.244.7.0/24-192.168.1.11"]
    assert conn["local_addrs"] == [b"192.168.1.10"]
    assert conn["remote_addrs"] == [b"192.168.1.11"]
    assert conn["proposals"] == [b"aes256-sha256-modp4096"]
    assert (conn["version"], conn["keyingtries"], conn["encap"]) == (b"2", b"0", b"no")
    assert conn["local"] == {"auth": b"psk"} and conn["remote"] == {"auth": b"psk"}
    child = conn["children"]["10.244.3.0/24-10.244.7.0/24"]
    assert child == {
        "local_ts": [b"10.244.3.0/24"], "remote_ts": [b"10.244.7.0/24"],
        "esp_proposals": [b"aes128gcm16-sha256-prfsha256-ecp256"], "start_action": b"start",
        "close_action": b"trap", "dpd_action": b"restart", "mode": b"tunnel",
        "rekey_time": b"1h", "policies": b"no", "reqid": b"11"}


def test_load_conn_with_kernel_libipsec_lets_charon_install_policies_and_pick_reqids():
    cfg = IpsecConfig.from_backend({"PSK": PSK, "ESPProposal": "aes256gcm16"})
    decoded = roundtrip(ipsec.connection_message(PAIR, cfg, encap=True, install_policies=True))
    conn = decoded[ipsec.connection_name(PAIR)]
    child = conn["children"][ipsec.child_name(PAIR)]
    assert conn["encap"] == b"yes"
    assert child["policies"] == b"yes" and "reqid" not in child
    assert child["esp_proposals"] == [b"aes256gcm16"]


def test_load_shared_is_an_ike_psk_for_one_owner_with_a_stable_id():
    decoded = roundtrip(ipsec.shared_key_message(ipsec.Secret(PSK), IPv4Address("192.168.1.11")))
    assert decoded == {"id": b"flannel-192.168.1.11", "type": b"IKE", "data": PSK.encode(),
                       "owners": [b"192.168.1.11"]}


def test_prepare_refuses_ipv6_by_name():
    ext = ExternalInterface("eth0", 2, 1500, IPv4Address("10.0.1.5"), None,
                            IPv4Address("10.0.1.5"), None)
    config = NetworkConfig(network=IPv4Network("10.244.0.0/16"), backend_type="ipsec",
                           backend={"Type": "ipsec", "PSK": PSK}, enable_ipv6=True)
    backend = backend_class("ipsec")(ext, config)
    with pytest.raises(Exception, match="the ipsec backend carries IPv4 only"):
        asyncio.run(backend.prepare())
