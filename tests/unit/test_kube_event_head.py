"""A node watch event read without its status (flannel.clients.kube.client.node_event_head):
the same metadata and spec as decoding the whole event, for every event in the API server's
shape; any other event, or one that is not valid JSON before its status, is left to the
decoder that reads it whole."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from flannel.clients.kube.client import node_event_head
from tests.support.kubeapi import kubelet_node

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


def event(kind: str, node: dict, separators: tuple[str, str] = (",", ":")) -> str:
    return json.dumps({"type": kind, "object": node}, separators=separators)


def test_a_kubelets_node_reads_as_its_metadata_and_spec_whatever_its_status_holds():
    node = kubelet_node("node2", "10.244.2.0/24", "10.0.0.2")
    node["status"]["images"].append({"names": ['"metadata":{"name":"forged"}}'],
                                     "sizeBytes": 1})
    head = {k: v for k, v in node.items() if k != "status"}
    for separators in ((",", ":"), (", ", ": ")):
        assert node_event_head(event("MODIFIED", node, separators)) == ("MODIFIED", head)
    assert node_event_head(event("DELETED", node)) == ("DELETED", head)
    # What follows the status is not read (the API server writes nothing there).
    cut = event("ADDED", head)[:-2] + ',"status":{"conditions":[ not JSON'
    assert node_event_head(cut) == ("ADDED", head)


def test_other_shapes_are_left_to_the_whole_decoder():
    node = {"kind": "Node", "metadata": {"name": "n"}, "spec": {}, "status": {}}
    assert node_event_head(event("ERROR", {"code": 410})) is None
    assert node_event_head(json.dumps({"object": node, "type": "ADDED"})) is None
    # What flanneld reads after the status, or missing before it: read whole.
    assert node_event_head(event("ADDED", {"status": {}, "metadata": {"name": "n"},
                                           "spec": {}})) is None
    assert node_event_head(event("ADDED", {"metadata": {"name": "n"}, "status": {},
                                           "spec": {"podCIDR": "10.0.0.0/24"}})) is None
    assert node_event_head(event("ADDED", {"metadata": {"name": "n"}, "spec": {}})) is None
    # Not JSON before the status: the whole decoder names what is wrong.
    for bad in ('{"type":"ADDED","object":{"metadata":{"name":"n",},"spec":{},"status":{}}}',
                '{"type":"ADDED","object":{"metadata":{"name":"\x01"},"spec":{},"status":{}}}',
                '{"type":"ADDED","object":{"metadata":' + "[" * 100_000,
                '{"type":"ADDED","object":{"metadata":{"name":"n"},"spec":{}',
                '{"type":"ADDED","object":{"metadata"'):
        assert node_event_head(bad) is None


def test_keys_are_read_as_the_decoder_reads_them_escapes_quotes_and_brackets_included():
    """A key written with escapes is the key it decodes to ("sp\\u0065c" is the spec, an
    escaped "status" ends the head); a key or string holding quotes, colons or brackets is
    not taken for the structure around it."""
    spec = {"podCIDR": "10.0.0.0/24"}
    tricky = {'a"b': 1, "c\\": "}", '{"spec":{"podCIDR":"evil"}}': '"status":{', "\u00e9": []}
    text = ('{"type":"ADDED","object":{"metadata":' + json.dumps({"name": "n", **tricky})
            + ',"sp\\u0065c":' + json.dumps(spec) + ',"st\\u0061tus":{"x":1}}}')
    assert node_event_head(text) == ("ADDED", {"metadata": {"name": "n", **tricky},
                                               "spec": spec})
    assert node_event_head(text) == (json.loads(text)["type"], {
        k: v for k, v in json.loads(text)["object"].items() if k != "status"})
    # Whitespace JSON allows around colons and commas; none that it refuses.
    spaced = '{"type":"ADDED","object":{ "metadata" :\t{"name":"n"}\n,\r"spec" : {} , "status":1}}'
    assert node_event_head(spaced) == ("ADDED", {"metadata": {"name": "n"}, "spec": {}})
    assert node_event_head(spaced.replace("\t", "\v")) is None
    assert node_event_head('{"type":"ADDED","object":{"metadata":{},"spec":{},'
                           '"stat\x01us":{},"status":{}}}') is None  # a control character


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
       members=st.dictionaries(st.text(), JSON, max_size=4), status=JSON,
       spaced=st.booleans())
def test_the_head_is_what_the_whole_decoder_reads_before_the_status(kind, members, status,
                                                                     spaced):
    members.pop("status", None)
    node = {**members, "status": status}
    text = event(kind, node, (", ", ": ") if spaced else (",", ":"))
    head = node_event_head(text)
    if "metadata" in members and "spec" in members:
        whole = json.loads(text)["object"]
        assert head == (kind, {k: v for k, v in whole.items() if k != "status"})
    else:
        assert head is None
