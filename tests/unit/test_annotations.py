"""Annotation prefixes and node <-> lease conversion (compat reference 4.2 - 4.4)."""

from ipaddress import IPv4Address, IPv6Address

import pytest

from flannel.lease import LeaseAttrs
from flannel.subnet.kube.annotations import (
    AnnotationError,
    Annotations,
    node_lease,
    pod_cidrs,
    published,
)


@pytest.mark.parametrize(("prefix", "name"), [
    ("flannel.alpha.coreos.com", "flannel.alpha.coreos.com/backend-type"),
    ("flannel.alpha.coreos.com/", "flannel.alpha.coreos.com/backend-type"),
    ("flannel.alpha.coreos.com/prefix", "flannel.alpha.coreos.com/prefix-backend-type"),
    ("flannel.alpha.coreos.com/prefix-", "flannel.alpha.coreos.com/prefix-backend-type"),
    ("org.com", "org.com/backend-type"),
    ("org9.com", "org9.com/backend-type"),
    ("org.com/9", "org.com/9-backend-type"),
])
def test_prefix_vectors(prefix, name):
    assert Annotations.for_prefix(prefix).backend_type == name


@pytest.mark.parametrize("prefix", ["org", "org/", "org/prefix", "org.COM", "org.com/PREFIX",
                                    "a.b/c/d"])
def test_bad_prefixes(prefix):
    with pytest.raises(AnnotationError, match="subnet/kube: prefix"):
        Annotations.for_prefix(prefix)


NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")
P = "flannel.alpha.coreos.com/"


def test_published_vxlan_and_overwrite():
    attrs = LeaseAttrs(public_ip=IPv4Address("10.0.0.5"), backend_type="vxlan",
                       backend_data='{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}')
    assert published(NAMES, attrs, {}, True, False) == {
        P + "backend-type": "vxlan", P + "kube-subnet-manager": "true",
        P + "backend-data": '{"VNI":1,"VtepMAC":"12:c6:65:89:b4:e3"}',
        P + "public-ip": "10.0.0.5"}
    got = published(NAMES, attrs, {P + "public-ip-overwrite": "172.18.0.2"}, True, False)
    assert got[P + "public-ip"] == "172.18.0.2"


def test_published_host_gw_dual_stack():
    attrs = LeaseAttrs(public_ip=IPv4Address("10.0.0.5"), public_ipv6=IPv6Address("fd00::5"),
                       backend_type="host-gw")
    got = published(NAMES, attrs, {}, True, True)
    assert got[P + "backend-data"] == "null" and got[P + "backend-v6-data"] == "null"
    assert got[P + "public-ipv6"] == "fd00::5"


def node(annotations=None, cidrs=("10.244.7.0/24",)):
    return {"metadata": {"name": "n7", "annotations": annotations or {}},
            "spec": {"podCIDR": cidrs[0] if cidrs else "", "podCIDRs": list(cidrs)}}


FAKE = {P + "backend-data": '{"VtepMAC":"96:59:b2:3f:04:ee"}', P + "backend-type": "vxlan",
        P + "kube-subnet-manager": "true", P + "public-ip": "192.168.77.17"}


def test_fake_node_yaml_vector():
    lease = node_lease(node(FAKE), NAMES, True, False)
    assert str(lease.subnet) == "10.244.7.0/24"
    assert lease.attrs.public_ip == IPv4Address("192.168.77.17")
    assert lease.attrs.backend_json() == {"VtepMAC": "96:59:b2:3f:04:ee"}


@pytest.mark.parametrize(("annotations", "cidrs", "message"), [
    ({**FAKE, P + "kube-subnet-manager": "false"}, ("10.244.7.0/24",), "not managed"),
    ({**FAKE, P + "public-ip": "nope"}, ("10.244.7.0/24",), "n7"),
    (FAKE, (), 'node "n7" pod cidr not assigned'),
    (FAKE, ("10.1.0.0/24", "10.2.0.0/24", "fd00::/64"), "IPv4/IPv6 only or dualstack"),
])
def test_unusable_nodes_are_skipped_with_a_reason(annotations, cidrs, message):
    with pytest.raises(AnnotationError, match=message):
        node_lease(node(annotations, cidrs), NAMES, True, False)


def test_dual_stack_pod_cidrs():
    v4, v6 = pod_cidrs("n", {"podCIDRs": ["fd00:10:244:7::/64", "10.244.7.0/24"]})
    assert (str(v4), str(v6)) == ("10.244.7.0/24", "fd00:10:244:7::/64")
    with pytest.raises(AnnotationError, match="missing IPv6 address"):
        node_lease(node(FAKE), NAMES, True, True)


@pytest.mark.parametrize(("change", "message"), [
    ({P + "backend-data": "[" * 1000 + "]" * 1000},
     "node n7: annotation flannel.alpha.coreos.com/backend-data nests JSON deeper than the "
     "limit of 32 levels"),
    ({P + "backend-data": '{"VNI": NaN}'},
     "node n7: annotation flannel.alpha.coreos.com/backend-data is not valid JSON: NaN is not "
     "a JSON number"),
    ({P + "backend-data": '"' + "a" * 70_000 + '"'},
     "node n7: annotation flannel.alpha.coreos.com/backend-data is longer than the limit of "
     "65536 characters"),
    ({P + "public-ip": 17},
     "node n7: annotation flannel.alpha.coreos.com/public-ip must be a string"),
    ({P + "public-ip": "fd00::1"},
     "node n7: annotation flannel.alpha.coreos.com/public-ip: 'fd00::1' is not an IPv4 "
     "address"),
])
def test_hostile_annotations_are_a_refusal_naming_them(change, message):
    with pytest.raises(AnnotationError) as caught:
        node_lease(node({**FAKE, **change}), NAMES, True, False)
    assert str(caught.value) == message


@pytest.mark.parametrize("spec", [{"podCIDRs": "10.244.7.0/24"}, {"podCIDRs": [7]},
                                  {"podCIDR": 167772160}])
def test_pod_cidrs_of_the_wrong_type_are_refused(spec):
    with pytest.raises(AnnotationError) as caught:
        pod_cidrs("n7", spec)
    assert str(caught.value) == 'node "n7": pod CIDRs must be a list of CIDR strings'


@pytest.mark.parametrize("meta", [None, [], "x", {"name": 5, "annotations": ["a"]}])
def test_malformed_metadata_is_not_managed(meta):
    with pytest.raises(AnnotationError, match="is not managed by flannel"):
        node_lease({"metadata": meta, "spec": {}}, NAMES, True, False)
