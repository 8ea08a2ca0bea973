"""Subnet keys and lease values: the vectors of the compat reference, sections 3.2 and 3.3."""

import json
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flannel.lease import (
    Lease,
    LeaseAttrs,
    LeaseDecodeError,
    make_subnet_key,
    parse_subnet_key,
    subnet_key_numbers,
)
from flannel.untrusted import boundedjson


@pytest.mark.parametrize(("key", "v4", "v6"), [
    ("10.12.13.0-24", "10.12.13.0/24", None),
    ("10.12.13.0-24&fd00:12:13::-56", "10.12.13.0/24", "fd00:12:13::/56"),
    ("10.5.34.0-24", "10.5.34.0/24", None),
    ("0.0.0.0-0", "0.0.0.0/0", None),
])
def test_valid_subnet_keys(key, v4, v6):
    parsed = parse_subnet_key(key)
    assert parsed == (IPv4Network(v4), IPv6Network(v6) if v6 else None)
    assert make_subnet_key(*parsed) == key


@pytest.mark.parametrize("key", [
    "10", "10.12.13.0", "10.12.13-24", "10.12.13.300-24", "10.12.13.0-24hi", "&2001::-56",
    "10.12.13.0-24&:12:13:-56", "10.12.13.0-24&20011::-56", "10.12.13.0-24&2001-56",
    "10.12.13.0-24&2001::", "10.12.13.0-24&2001::-56hi", "10.12.13.0-32",
    "10.12.13.0-24&fd00::-128", "10.12.13.0-24&FD00::-64",
])
def test_invalid_subnet_keys(key):
    assert parse_subnet_key(key) is None


@given(st.integers(0, 2**32 - 1), st.integers(0, 31))
def test_a_key_with_host_bits_names_the_network_as_ipaddress_masks_it(address, prefix):
    key = f"{IPv4Address(address)}-{prefix}"
    network = IPv4Network((address, prefix), strict=False)
    assert parse_subnet_key(key) == (network, None)
    numbers = subnet_key_numbers(key)
    assert numbers == (int(network.network_address), prefix, None)
    assert Lease.from_numbers(numbers[:2]) == Lease(network)


def test_key_uses_canonical_ipv6_text():
    key = make_subnet_key(IPv4Network("10.1.0.0/24"), IPv6Network("fd00:0:0:0:0:0:0:0/64"))
    assert key == "10.1.0.0-24&fd00::-64"


def test_registry_vector_is_byte_identical():
    attrs = LeaseAttrs(public_ip=IPv4Address("1.2.3.4"))
    assert attrs.to_json() == '{"PublicIP":"1.2.3.4","PublicIPv6":null}'


def test_reservations_doc_vector_round_trips():
    raw = ('{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan",'
           '"BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}')
    attrs = LeaseAttrs.from_json(raw)
    assert attrs.public_ip == IPv4Address("192.168.64.3")
    assert attrs.backend_type == "vxlan"
    assert attrs.backend_json() == {"VNI": 1, "VtepMAC": "c6:d2:32:6f:8f:44"}
    assert attrs.to_json() == raw


def test_dual_stack_value_and_compaction_of_backend_data():
    attrs = LeaseAttrs(public_ip=IPv4Address("10.0.0.1"), public_ipv6=IPv6Address("fd00::1"),
                       backend_type="vxlan", backend_data='{ "VNI": 1,\n "VtepMAC": "a<b" }',
                       backend_v6_data='{"VNI":1}')
    assert attrs.to_json() == (
        '{"PublicIP":"10.0.0.1","PublicIPv6":"fd00::1","BackendType":"vxlan",'
        '"BackendData":{"VNI":1,"VtepMAC":"a\\u003cb"},"BackendV6Data":{"VNI":1}}')


def test_missing_public_ip_is_written_as_zero_address():
    assert LeaseAttrs().to_json() == '{"PublicIP":"0.0.0.0","PublicIPv6":null}'


def test_decoding_is_case_insensitive():
    attrs = LeaseAttrs.from_json('{"publicip":"1.2.3.4","BACKENDTYPE":"host-gw"}')
    assert attrs.public_ip == IPv4Address("1.2.3.4") and attrs.backend_type == "host-gw"


@pytest.mark.parametrize("raw", [
    b"not json", b"[1]", b'{"PublicIP": 5}', b'{"PublicIP": "1.2.3"}',
    b'{"PublicIP": "fd00::1"}', b'{"PublicIP":"1.2.3.4","PublicIPv6":"1.2.3.4"}',
    b'{"PublicIP":"1.2.3.4","BackendType":7}', b"\xff\xfe",
])
def test_foreign_values_raise_a_decode_error(raw):
    with pytest.raises(LeaseDecodeError):
        LeaseAttrs.from_json(raw)


def test_same_subnet_compares_the_families_both_carry():
    v4 = Lease(IPv4Network("10.1.1.0/24"))
    dual = Lease(IPv4Network("10.1.1.0/24"), IPv6Network("fd00:1::/64"))
    other_v6 = Lease(IPv4Network("10.1.1.0/24"), IPv6Network("fd00:2::/64"))
    assert v4.same_subnet(dual) and dual.same_subnet(v4)
    assert not dual.same_subnet(other_v6)
    assert not v4.same_subnet(Lease(IPv4Network("10.1.2.0/24")))


def test_deeply_nested_backend_data_is_a_decode_error_not_a_crash():
    raw = '{"PublicIP":"10.0.0.2","BackendData":' + "[" * 1000 + "]" * 1000 + "}"
    with pytest.raises(LeaseDecodeError) as caught:
        LeaseAttrs.from_json(raw)
    assert str(caught.value) == "lease value nests JSON deeper than the limit of 32 levels"


def test_backend_json_refuses_what_it_cannot_decode():
    with pytest.raises(LeaseDecodeError) as caught:
        LeaseAttrs(backend_v6_data="[" * 40 + "]" * 40).backend_json(v6=True)
    assert str(caught.value) == "BackendV6Data nests JSON deeper than the limit of 32 levels"


def test_oversized_lease_value_is_refused():
    with pytest.raises(LeaseDecodeError) as caught:
        LeaseAttrs.from_json(b'{"PublicIP":"10.0.0.2","X":"' + b"a" * 70_000 + b'"}')
    assert str(caught.value) == "lease value is larger than the limit of 65536 bytes"


def test_leases_of_one_backend_type_share_its_name():
    """5000 leases hold one "vxlan" string, not 5000 copies."""
    a = LeaseAttrs.from_json(b'{"PublicIP":"10.0.0.1","BackendType":"vxlan"}')
    b = LeaseAttrs.from_json(b'{"PublicIP":"10.0.0.2","BackendType":"vx' + b'lan"}')
    assert a.backend_type == "vxlan" and a.backend_type is b.backend_type


def _decoded(raw: bytes | str) -> LeaseAttrs | str:
    try:
        return LeaseAttrs.from_json(raw)
    except LeaseDecodeError as err:
        return str(err)


_NAMES = st.sampled_from(["VNI", "VtepMAC", "Port"] * 4 + ["1a", "k_1"])
_GOOD_VALUES = st.one_of(st.integers(-10**15 + 1, 10**15 - 1).map(str),
                         st.text(alphabet="aZ09:.+/=_-", max_size=12).map(lambda t: f'"{t}"'))
_OTHER_VALUES = st.one_of(
    st.sampled_from(["-0", "01", "-01", "1.5", "1e3", "true", "null", "[]", "{}"]),
    st.text(alphabet="a<>&\"\\é \n", min_size=1, max_size=4).map(
        lambda text: json.dumps(text, ensure_ascii=False)))


#: One time in 12 (``st.integers`` would favour its bounds).
_ODD = st.sampled_from([False] * 11 + [True])


@st.composite
def _go_like_values(draw) -> bytes:
    """Lease values in Go's shape, most of them, each part now and then changed to something
    just outside it: values the decoder accepts differently, repeated members, spaces, other
    casings, other IP spellings, other JSON types."""
    def odd() -> bool:
        return draw(_ODD)

    def member(name: str, value: str) -> str:
        return f'"{name.lower() if odd() else name}":{value}'

    def flat_object() -> str:
        members = draw(st.lists(st.tuples(_NAMES, _OTHER_VALUES if odd() else _GOOD_VALUES),
                                max_size=4))
        return "{" + (", " if odd() else ",").join(f'"{k}":{v}' for k, v in members) + "}"

    public_ip = draw(st.sampled_from(["0.0.0.0", "999.1.1.1", "1.2.3", "01.2.3.4",
                                      "1.2.3.4.5", "fd00::1"]) if odd()
                     else st.ip_addresses(v=4).map(str))
    public_ipv6 = draw(st.sampled_from(['"FD00::1"', '"1.2.3.4"', '"::ffff:1.2.3.4"', "7"])
                       if odd() else st.one_of(st.just("null"), st.ip_addresses(v=6).map(
                           lambda a: f'"{a.compressed}"')))
    fields = [member("PublicIP", f'"{public_ip}"'), member("PublicIPv6", public_ipv6)]
    if draw(st.booleans()):
        backend_type = draw(st.sampled_from(["", "a_b", "é", "x" * 33]) if odd()
                            else st.sampled_from(["vxlan", "host-gw", "wireguard"]))
        fields.append(member("BackendType", json.dumps(backend_type, ensure_ascii=False)))
    for name in ("BackendData", "BackendV6Data"):
        if draw(st.booleans()):
            fields.append(member(name, draw(st.sampled_from(
                ["null", "[1]", '"x"', '{"a":{"b":1}}']) if odd() else st.builds(flat_object))))
    return ("{" + ",".join(fields) + "}").encode()


@given(_go_like_values())
def test_values_in_gos_shape_decode_as_the_json_decoder_decodes_them(raw):
    """Bytes in Go's shape take a shortcut past the JSON decoder; a str never does: both
    must give the same attrs or the same error for any value."""
    assert _decoded(raw) == _decoded(raw.decode())


@pytest.mark.parametrize("raw", [
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":1,"VNI":2}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendV6Data":{"VNI":1,"VNI":1}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":-0}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":01}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":1.0}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":99999999999999999999}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"K":"\\u0041\\/"}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"K":"a<b"}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{"VNI":1, "Port":2}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":"FD00::1","BackendType":"vxlan"}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":"::ffff:1.2.3.4"}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":"10.0.0.1"}',
    b'{"PublicIP":"0.0.0.0","PublicIPv6":"fd00::1"}',
    b'{"PublicIP":"1.2.3.256","PublicIPv6":null}',
    b'{"PublicIP":"01.2.3.4","PublicIPv6":null}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendType":""}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"backendtype":"vxlan"}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":{}}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null,"BackendData":null}',
    b'{"PublicIP":"10.0.0.1","PublicIPv6":null}\n',
])
def test_values_at_the_edge_of_gos_shape_decode_as_the_json_decoder_decodes_them(raw):
    assert _decoded(raw) == _decoded(raw.decode())


@pytest.mark.parametrize("attrs", [
    LeaseAttrs(IPv4Address("10.0.0.1"), None, "vxlan", '{"VNI":1,"VtepMAC":"0e:00:00:00:65:0a"}'),
    LeaseAttrs(IPv4Address("10.0.0.1"), IPv6Address("fd00::1"), "vxlan",
               '{"VNI":1,"VtepMAC":"0e:00:00:00:65:0a"}',
               '{"VNI":1,"VtepMAC":"0e:00:00:00:65:0b"}'),
    LeaseAttrs(IPv4Address("10.0.0.1"), None, "host-gw"),
    LeaseAttrs(IPv4Address("10.0.0.1"), None, "wireguard",
               '{"PublicKey":"kB4VbJd5XzEnlQm3fzuqk+JnLD5iIDBXdSLpPS4PXWY=","Port":51820}'),
    LeaseAttrs(IPv4Address("10.0.0.1"), None),
])
def test_values_go_writes_decode_without_the_json_decoder(attrs, monkeypatch):
    """What a snapshot of thousands of leases holds is decoded by the shortcut."""
    monkeypatch.setattr(boundedjson, "loads", None)
    assert LeaseAttrs.from_json(attrs.to_json().encode()) == attrs


def test_a_lease_keeps_integers_and_answers_with_the_objects_it_was_made_from():
    """A lease holds its IPv4 subnet and public address as integers (thousands are held at
    once) and gives back equal objects, its key, equality and hash as values, and refuses
    to be changed but through a copy."""
    attrs = LeaseAttrs(IPv4Address("172.30.1.9"), backend_type="vxlan",
                       backend_data='{"VNI":1,"VtepMAC":"0e:00:00:00:00:09"}')
    lease = Lease(IPv4Network("10.5.34.0/24"), IPv6Network("fd00:5::/64"), attrs,
                  expiration=100.0, etcd_lease_id=7, created=3)
    assert (lease.v4_base, lease.v4_prefixlen) == (int(IPv4Address("10.5.34.0")), 24)
    assert lease.subnet == IPv4Network("10.5.34.0/24")
    assert attrs.public_ip_number == int(IPv4Address("172.30.1.9"))
    assert attrs.public_ip == IPv4Address("172.30.1.9")
    assert lease.key == "10.5.34.0-24&fd00:5::-64"
    assert lease.family(4) == (int(IPv4Address("10.5.34.0")), 24)
    assert lease.family(6) == (int(IPv6Address("fd00:5::")), 64)
    same = Lease(IPv4Network("10.5.34.0/24"), IPv6Network("fd00:5::/64"), LeaseAttrs(
        IPv4Address("172.30.1.9"), backend_type="vxlan",
        backend_data='{"VNI":1,"VtepMAC":"0e:00:00:00:00:09"}'), 100.0, 7, 3)
    assert same == lease and hash(same) == hash(lease) and same.attrs == attrs
    renewed = lease.replace(expiration=200.0, etcd_lease_id=8)
    assert renewed != lease and renewed.same_subnet(lease)
    assert (renewed.subnet, renewed.ipv6_subnet, renewed.attrs, renewed.created) == (
        lease.subnet, lease.ipv6_subnet, lease.attrs, lease.created)
    with pytest.raises(AttributeError):
        lease.created = 4  # type: ignore[misc]
    with pytest.raises(AttributeError):
        attrs.backend_type = "host-gw"  # type: ignore[misc]
    v6_only = Lease(None, IPv6Network("fd00:5::/64"))
    assert v6_only.subnet is None and v6_only.family(4) is None
    assert v6_only.key == "0.0.0.0-0&fd00:5::-64"
    assert LeaseAttrs().public_ip is None
    assert repr(lease).startswith("Lease(subnet=IPv4Network('10.5.34.0/24'), ipv6_subnet=")
