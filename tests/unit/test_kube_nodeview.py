"""What the kube subnet manager keeps of a node: a small record whose repeated strings are
shared between nodes, read back in the API's shape by the lease decoder."""

import json

from flannel.subnet.kube.annotations import Annotations, node_lease
from flannel.subnet.kube.manager import node_view

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
        "metadata": {"name": "node2", "resourceVersion": "7", "annotations": {
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
