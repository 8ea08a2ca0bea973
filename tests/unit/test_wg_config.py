"""The wireguard backend config and lease data, as Go flannel decodes and encodes them."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flannel.backendconf.errors import BackendConfigError
from flannel.wireguard.config import (
    DeviceLayout,
    LeaseData,
    WireguardConfig,
    decode_lease_data,
    encode_lease_data,
)
from tests.support.fuzzing import examples

KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


def test_defaults_are_go_flannels():
    cfg = WireguardConfig.from_backend({"Type": "wireguard"})
    assert (cfg.listen_port, cfg.listen_port_v6, cfg.mtu, cfg.psk, cfg.keepalive,
            cfg.mode) == (51820, 51821, 0, None, 0, "separate")
    assert cfg.device_mtu(1500) == 1420


def test_member_names_match_case_insensitively():
    cfg = WireguardConfig.from_backend({"listenport": 4000, "LISTENPORTV6": 4001, "mtu": 9000,
                                 "psk": KEY, "persistentkeepaliveinterval": 25,
                                 "mode": "auto"})
    assert (cfg.listen_port, cfg.listen_port_v6, cfg.keepalive, cfg.mode) == (4000, 4001, 25,
                                                                             "auto")
    assert cfg.psk is not None and cfg.psk.base64() == KEY
    assert cfg.device_mtu(1500) == 8920


@pytest.mark.parametrize(("backend", "message"), [
    ({"Mode": "both"}, 'no valid Mode configured: "both"; use one of separate, auto, ipv4, '
                       "ipv6"),
    ({"Mode": "Auto"}, 'no valid Mode configured: "Auto"; use one of separate, auto, ipv4, '
                       "ipv6"),
    ({"ListenPort": "51820"}, 'error decoding backend config: ListenPort must be an integer, '
                              'got string "51820"'),
    ({"ListenPort": 0}, "error decoding backend config: ListenPort 0 is not a UDP port; use 1 "
                        "to 65535"),
    ({"ListenPortV6": 70000}, "error decoding backend config: ListenPortV6 70000 is not a UDP "
                              "port; use 1 to 65535"),
    ({"MTU": 500}, "error decoding backend config: MTU 500 is out of range; give the underlay "
                   "MTU (1280 to 65535), or leave it out to use the external interface's"),
    ({"PersistentKeepaliveInterval": -1}, "error decoding backend config: "
     "PersistentKeepaliveInterval -1 is out of range; give seconds from 0 (off) to 65535"),
    ({"PersistentKeepaliveInterval": 2.5}, "error decoding backend config: "
     "PersistentKeepaliveInterval must be an integer, got number 2.5"),
])
def test_bad_values_are_refused_with_a_message_that_says_what_to_fix(backend, message):
    with pytest.raises(BackendConfigError) as err:
        WireguardConfig.from_backend(backend)
    assert str(err.value) == message


@pytest.mark.parametrize("psk", ["c2VjcmV0", KEY[:-2] + "!=", KEY + "AAAA", 12345])
def test_a_bad_psk_is_refused_without_echoing_it(psk):
    with pytest.raises(BackendConfigError) as err:
        WireguardConfig.from_backend({"PSK": psk})
    assert str(psk) not in str(err.value)
    assert str(err.value).startswith("error decoding backend config: ")
    assert "wg genpsk" in str(err.value) or "wg genkey" in str(err.value)


def test_a_bad_psk_is_told_by_its_field_not_by_the_text_of_another_fields_error():
    # A mistyped MTU whose value reads "PSK" is an MTU error, named as such.
    with pytest.raises(BackendConfigError) as err:
        WireguardConfig.from_backend({"MTU": "PSK"})
    assert str(err.value) == ('error decoding backend config: MTU must be an integer, got '
                              'string "PSK"')
    with pytest.raises(BackendConfigError) as err:
        WireguardConfig.from_backend({"psk": ["secret"]})  # member names match in any case
    assert "secret" not in str(err.value) and "PSK must be a string" in str(err.value)


def test_the_psk_never_shows_in_the_config_repr():
    cfg = WireguardConfig.from_backend({"PSK": KEY})
    assert KEY not in repr(cfg) and "Secret(<hidden>)" in repr(cfg)


@pytest.mark.parametrize(("mode", "v4", "v6", "layout"), [
    ("separate", True, False, [DeviceLayout("flannel-wg", 51820, (4,))]),
    ("separate", True, True, [DeviceLayout("flannel-wg", 51820, (4,)),
                              DeviceLayout("flannel-wg-v6", 51821, (6,))]),
    ("separate", False, True, [DeviceLayout("flannel-wg-v6", 51821, (6,))]),
    ("auto", True, True, [DeviceLayout("flannel-wg", 51820, (4, 6))]),
    ("ipv6", True, True, [DeviceLayout("flannel-wg", 51820, (4, 6))]),
    ("ipv4", True, False, [DeviceLayout("flannel-wg", 51820, (4,))]),
])
def test_devices_per_mode(mode, v4, v6, layout):
    assert WireguardConfig.from_backend({"Mode": mode}).devices(v4, v6) == layout


def test_lease_data_is_byte_for_byte_gos():
    assert encode_lease_data(KEY, 51820) == f'{{"PublicKey":"{KEY}","Port":51820}}'
    assert encode_lease_data("ab+/cd==", 51821) == '{"PublicKey":"ab+/cd==","Port":51821}'


def test_lease_data_is_decoded_case_insensitively_and_checked():
    assert decode_lease_data(encode_lease_data(KEY, 51820)) == LeaseData(KEY, 51820)
    # Older Go flannel publishes no Port: 0 means "use our own listen port".
    assert decode_lease_data(json.dumps({"publickey": KEY})) == LeaseData(KEY, 0)
    for bad in (None, "", "null", '"text"', "[1]", "{bad json",
                json.dumps({"PublicKey": "short"}), json.dumps({"PublicKey": KEY, "Port": -1}),
                json.dumps({"PublicKey": KEY, "Port": "51820"}),
                # Nested past the recursion limit, or beyond float range: skipped, no crash.
                "[" * 5000 + "]" * 5000, '{"PublicKey":' + "[" * 2000, '{"Port":1e400}'):
        assert decode_lease_data(bad) is None, bad[:80]


def test_a_key_spelled_with_padding_bits_is_read_as_the_device_spells_it():
    # wireguard-go and the kernel report a peer's key with zero padding bits: a lease's
    # other spelling, kept as written, would never read back as set (not ready for ever).
    spelled = "C" * 43 + "="
    assert decode_lease_data(encode_lease_data(spelled, 51820)) == LeaseData(
        "C" * 42 + "A=", 51820)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=50),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=4)
_members = st.sampled_from(["ListenPort", "listenportv6", "MTU", "PSK", "Mode",
                            "PersistentKeepaliveInterval", "PublicKey", "Port", "x"])


@settings(max_examples=examples(150), deadline=None)
@given(st.dictionaries(_members, _json, max_size=6))
def test_any_backend_object_gives_a_config_or_a_config_error(obj):
    try:
        WireguardConfig.from_backend(obj)
    except BackendConfigError:
        pass
    data = decode_lease_data(json.dumps(obj))
    assert data is None or ("PublicKey" in obj and isinstance(data, LeaseData))


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=200))
def test_any_lease_data_text_decodes_or_is_skipped(text):
    data = decode_lease_data(text)
    assert data is None or isinstance(data, LeaseData)
