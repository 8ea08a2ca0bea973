"""What the kube subnet manager keeps of a node: a small record whose repeated strings are
shared between nodes, read back in the API's shape by the lease decoder."""

import ipaddress
import json
from datetime import UTC, datetime

import pytest

from flannel.subnet.kube.annotations import AnnotationError, Annotations, node_lease, pod_cidrs
from flannel.subnet.kube.manager import NOT_CREATED, NodeView, UnusableNode, node_view

NAMES = Annotations.for_prefix("flannel.alpha.coreos.com")


def raw_node(name: str, cidr: str, ip: str) -> dict:
    # Decoded from JSON text, as the client does: no string is shared by construction.
    return json.loads(json.dumps({
        "metadata": {"name": name, "resourceVersion": "7", "annotations": {
            NAMES.subnet_manager: "true", NAMES.backend_type: "vxlan",
            NAMES.backend_data: '{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}',
            NAMES.public_ip: ip, "other.example.com/ignored": "x"},
            "labels": {"big": "y" * 1000}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}, "status": {"images": []}}))


def test_the_view_keeps_only_what_the_lease_needs_and_decodes_to_the_same_lease():
    raw = raw_node("node2", "10.244.2.0/24", "10.0.0.2")
    view = node_view(raw, NAMES.prefix)
    assert view.as_node() == {
        "metadata": {"name": "node2", "annotations": {
            k: v for k, v in raw["metadata"]["annotations"].items()
            if k.startswith(NAMES.prefix)}},
        "spec": {"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]}}
    assert node_lease(view.as_node(), NAMES, True, False) == node_lease(raw, NAMES, True, False)


def test_nodes_share_their_annotation_names_and_repeated_values():
    a = node_view(raw_node("node2", "10.244.2.0/24", "10.0.0.2"), NAMES.prefix)
    b = node_view(raw_node("node3", "10.244.3.0/24", "10.0.0.3"), NAMES.prefix)
    for (key_a, value_a), (key_b, value_b) in zip(a.annotations.items(), b.annotations.items(),
                                                  strict=True):
        assert key_a is key_b
        if key_a in (NAMES.subnet_manager, NAMES.backend_type):
            assert value_a is value_b
    # podCIDRs[0] is podCIDR's own string.
    assert a.pod_cidrs is not None and a.pod_cidrs[0] is a.pod_cidr
    # An unchanged node gives equal decoder inputs; a changed annotation does not.
    again = node_view(raw_node("node2", "10.244.2.0/24", "10.0.0.2"), NAMES.prefix)
    assert again.inputs() == a.inputs()
    moved = node_view(raw_node("node2", "10.244.2.0/24", "10.0.0.9"), NAMES.prefix)
    assert moved.inputs() != a.inputs()


def copy_of(raw: dict, change) -> dict:
    doc = json.loads(json.dumps(raw))
    change(doc)
    return doc


def heartbeat(doc):
    doc["metadata"]["resourceVersion"] = "8"
    doc["metadata"]["annotations"]["other.example.com/heartbeat"] = "now"
    doc["status"]["images"] = [{"names": ["x"]}]


def foreign_annotation(doc):
    doc["metadata"]["annotations"]["other.example.com/n"] = 1  # not flannel's: not read


@pytest.mark.parametrize("change", [
    heartbeat,
    lambda doc: doc["metadata"]["annotations"].update({NAMES.public_ip: "10.0.0.9"}),
    lambda doc: doc["metadata"]["annotations"].update({NAMES.public_ip: 9}),
    lambda doc: doc["metadata"]["annotations"].update({NAMES.name("extra"): "x"}),
    lambda doc: doc["metadata"]["annotations"].pop(NAMES.backend_data),
    foreign_annotation,
    lambda doc: doc["metadata"].update(annotations=["not", "a", "map"]),
    lambda doc: doc["metadata"].pop("annotations"),
    lambda doc: doc["metadata"].update(resourceVersion=8),
    lambda doc: doc["metadata"].update(name="node3"),
    lambda doc: doc["metadata"].update(creationTimestamp="2026-12-08T05:00:00Z"),
    lambda doc: doc["spec"].update(podCIDR="10.244.9.0/24"),
    lambda doc: doc["spec"].update(podCIDRs=["10.244.2.0/24", "fd00:2::/64"]),
    lambda doc: doc["spec"].update(podCIDRs=[1]),
    lambda doc: doc.update(spec=["not", "a", "map"]),
])
def test_a_newer_copy_reads_the_same_exactly_when_its_view_would_be_the_same(change):
    """The watch keeps the view in place for a copy that reads the same; any copy whose view
    would differ, or which node_view refuses, goes the whole way."""
    raw = raw_node("node2", "10.244.2.0/24", "10.0.0.2")
    raw["metadata"]["creationTimestamp"] = "2026-12-07T05:00:00Z"
    view = node_view(raw, NAMES.prefix)
    new = copy_of(raw, change)
    try:
        again = node_view(new, NAMES.prefix)
    except UnusableNode:
        same = False
    else:
        same = again.inputs() == view.inputs() and again.stamp == view.stamp and \
            again.name == view.name
    assert view.reads_same(new, new["metadata"], NAMES.prefix) is same
    assert same is (change in (heartbeat, foreign_annotation))


@pytest.mark.parametrize("text", [
    "10.244.2.0/24", "10.244.2.7/24", "10.0.0.0/024", "0.0.0.0/0", "10.0.0.1/32",
    "10.0.0.0/33", "010.0.0.0/8", "10.0.0.0/255.255.255.0", "10.0.0.1", "10.0.0.0/",
    "10.0.0.0/+8", "10.0.0.0/\uff18", "10.0.0/8", "10.0.0.0\x00/8", "fd00:1::5/64", "x/8",
])
def test_a_pod_cidr_reads_as_ip_network_reads_it(text):
    """The IPv4 fast path gives what ``ip_network(strict=False)`` gives, or the same
    refusal."""
    try:
        expected = ipaddress.ip_network(text, strict=False)
    except ValueError:
        with pytest.raises(AnnotationError, match="is not a CIDR"):
            pod_cidrs("n", {"podCIDRs": [text]})
        return
    v4, v6 = pod_cidrs("n", {"podCIDRs": [text]})
    assert (v4 or v6) == expected


@pytest.mark.parametrize("stamp", [
    "2026-12-07T05:00:00Z", "1970-01-01T00:00:00Z", "2024-02-29T23:59:59Z",
    "2026-02-30T00:00:00Z", "2026-12-07T24:00:00Z", "2026-12-07T05:60:00Z",
    "2026-12-07T05:00:60Z", "2026-12-07T-1:00:00Z", "0000-01-01T00:00:00Z",
    "2026-12-07 05:00:00Z", "2026-12-07T05:00:00", 5, None,
])
def test_creation_times_read_as_the_calendar_has_them(stamp):
    try:
        expected = int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=UTC).timestamp())
    except (TypeError, ValueError):
        expected = NOT_CREATED
    assert NodeView("n", {}, None, None, stamp).created == expected
