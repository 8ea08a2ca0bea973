"""The CNI plugin's light JSON and CIDR helpers agree with json and ipaddress."""

import ipaddress
import json

import pytest

from flannel.cni import lite

DOCS = [
    {"b": 1, "a": [True, False, None, 1.5, -2, "x\u00e9\n\"<&>"], "c": {"z": {}, "y": []}},
    [], {}, "plain", 0, 12345678901234567890, -0.25, 1e100,
]


@pytest.mark.parametrize("doc", DOCS)
def test_round_trip_matches_json(doc):
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert lite.dumps(doc) == text
    assert lite.loads(text) == doc
    assert lite.loads(f"  {json.dumps(doc, indent=2)}\n") == doc


@pytest.mark.parametrize("bad", ["", "{", "[1,]", "{\"a\":1} x", "nul", "{'a': 1}"])
def test_invalid_json_raises_value_error(bad):
    with pytest.raises(ValueError):
        lite.loads(bad)


@pytest.mark.parametrize("text", ["10.1.17.1/24", "10.1.0.0/16", "0.0.0.0/0", "1.2.3.4/32",
                                  "fc00::1/64", "FD00:0:0:5::/56", "fd00:77:0:5::1/128",
                                  "1:0:2:3:4:5:6:7/64"])
def test_cidrs_match_ipaddress(text):
    assert lite.parse_cidr(text) == str(ipaddress.ip_network(text, strict=False))


@pytest.mark.parametrize("text", ["10.1.17.1", "10.1.17.1/33", "10.1.17/24", "x/8",
                                  "fc00::/129", "10.0.0.0/-1", "10.0.0.0/٣"])
def test_bad_cidrs_raise(text):
    with pytest.raises(ValueError):
        lite.parse_cidr(text)


@pytest.mark.parametrize(("value", "go"), [
    (1400.0, "1400"), (1.5, "1.5"), (-0.0, "-0"), (1e21, "1e+21"),
    (1e20, "100000000000000000000"), (1.2345678901234567e20, "123456789012345670000"),
    (1e-7, "1e-7"), (1e-6, "0.000001"), (-2.5e-8, "-2.5e-8"), (5e-324, "5e-324"),
    (1e16, "10000000000000000"), (0.1, "0.1"), (1.5e300, "1.5e+300")])
def test_floats_are_printed_as_go_prints_a_float64(value, go):
    assert lite.dumps(value) == go


@pytest.mark.parametrize("bad", ["NaN", "[Infinity]", "-Infinity", "1e400", "[-1e999]",
                                 "9" * 500, "[" * 65 + "]" * 65])
def test_what_go_refuses_is_refused(bad):
    with pytest.raises(ValueError):
        lite.loads(bad)


def test_depth_limit_ignores_brackets_inside_strings():
    deep_text = '["' + "[" * 200 + '"]'
    assert lite.loads(deep_text) == ["[" * 200]
    assert lite.loads("[" * 64 + "]" * 64) is not None


def test_routes_keep_their_host_bits():
    assert lite.canonical_cidr("10.96.0.5/12") == "10.96.0.5/12"
    assert lite.canonical_cidr("FD00:0:0::1/64") == "fd00::1/64"
