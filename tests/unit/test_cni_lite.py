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
