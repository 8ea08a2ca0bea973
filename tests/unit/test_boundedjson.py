"""Bounded JSON decoding: size and depth limits, Go's refusal of NaN and Infinity."""

import json

import pytest

from flannel.untrusted import boundedjson
from flannel.untrusted.boundedjson import JSONLimitError, loads, nesting_depth


def test_depth_beyond_the_limit_is_refused_before_json_recurses():
    with pytest.raises(JSONLimitError) as caught:
        loads("[" * 100_000 + "]" * 100_000, what="lease value", max_bytes=10 ** 6)
    assert str(caught.value) == "lease value nests JSON deeper than the limit of 32 levels"


def test_unclosed_nesting_is_refused_too():
    with pytest.raises(JSONLimitError, match="deeper than the limit of 32"):
        loads('{"a":' * 5000, what="x", max_bytes=10 ** 6)


def test_depth_at_the_limit_is_accepted():
    assert loads("[" * 32 + "]" * 32, what="x", max_bytes=100) is not None


def test_brackets_inside_strings_and_escapes_do_not_count():
    text = '{"a": "[[[[{{{{\\"[[[[", "b": ["\\\\", [[]]]}'
    assert nesting_depth(text) == 4
    assert loads(text, what="x", max_bytes=100)["a"] == '[[[[{{{{"[[[['


def test_size_limit_names_it():
    with pytest.raises(JSONLimitError) as caught:
        loads(b'"' + b"a" * 70_000 + b'"', what="lease value",
              max_bytes=boundedjson.MAX_LEASE_BYTES)
    assert str(caught.value) == "lease value is larger than the limit of 65536 bytes"


@pytest.mark.parametrize(("text", "message"), [
    ('{"a": NaN}', "x is not valid JSON: NaN is not a JSON number"),
    ("[-Infinity]", "x is not valid JSON: -Infinity is not a JSON number"),
    ("1e400", "x is not valid JSON: number 1e400 is out of range"),
    ("[1,", "x is not valid JSON: Expecting value: line 1 column 4 (char 3)"),
])
def test_what_go_refuses_is_refused(text, message):
    with pytest.raises(JSONLimitError) as caught:
        loads(text, what="x", max_bytes=100)
    assert str(caught.value) == message


def test_huge_integer_is_a_refusal_not_a_crash():
    with pytest.raises(JSONLimitError, match="x is not valid JSON: Exceeds the limit"):
        loads("9" * 5000, what="x", max_bytes=10_000)


def test_invalid_utf8_in_bytes_becomes_a_replacement_character_as_in_go():
    assert loads(b'{"a": "x\xffy"}', what="x", max_bytes=100) == {"a": "x\ufffdy"}


def test_without_the_prescan_the_recursion_guard_still_refuses_deep_input():
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(JSONLimitError) as caught:
        loads(deep, what="a node list", max_bytes=1 << 20, max_depth=None)
    assert str(caught.value) == ("a node list nests JSON deeper than the decoder's recursion "
                                 "limit")
    assert loads("[" * 100 + "]" * 100, what="x", max_bytes=1000, max_depth=None) == \
        loads("[" * 100 + "]" * 100, what="x", max_bytes=1000, max_depth=200)


@pytest.mark.parametrize("doc", ["[]", "{}", "1", '""', "[1]", '{"a": 1}', '[[], {}, [1, 2]]',
                                 '{"a": [1, {"b": [2, 3]}], "c": {}}', '["a,[{"]'])
def test_the_element_bound_never_undercounts(doc):
    import json

    def count(value: object) -> int:
        if isinstance(value, list):
            return 1 + sum(map(count, value))
        if isinstance(value, dict):
            return 1 + sum(map(count, value.values()))
        return 1
    assert boundedjson.element_bound(doc) >= count(json.loads(doc))
    assert boundedjson.element_bound(doc.encode()) == boundedjson.element_bound(doc)


@pytest.mark.parametrize("doc", ["", "1", "[]", "[[]]", ",,,", "[,{", "{[,]}", '"[[[["',
                                 "[" + "[]," * 40 + "[]]"])
def test_the_element_check_skips_counting_only_where_the_count_cannot_exceed(doc):
    """``more_elements_than`` answers as the count would, at every limit around the
    document's length and bound, for text and bytes."""
    bound = boundedjson.element_bound(doc)
    for limit in {0, 1, bound - 1, bound, bound + 1, len(doc) - 1, len(doc), len(doc) + 1}:
        if limit >= 0:
            assert boundedjson.more_elements_than(doc, limit) == (bound > limit), limit
            assert boundedjson.more_elements_than(doc.encode(), limit) == (bound > limit)


def test_many_tiny_elements_are_refused_before_decoding():
    """60 MiB of ``[]`` decode to ~1.2 GiB of lists: the element bound refuses them first."""
    amplifying = b"[" + b"[]," * 100_000 + b"[]]"
    with pytest.raises(JSONLimitError) as caught:
        loads(amplifying, what="a range answer", max_bytes=10 ** 6, max_elements=50_000,
              max_depth=None)
    assert str(caught.value) == ("a range answer has more JSON elements than the limit of "
                                 "50000")
    assert loads(b"[" + b"[]," * 100 + b"[]]", what="x", max_bytes=10 ** 6,
                 max_elements=50_000, max_depth=None) == [[]] * 101


def test_the_depth_pre_scan_builds_no_object_per_string_or_pair():
    """A megabyte of ``{}`` or of ``""`` cost the pre-scan an object per match (50 MiB). An
    object per match costs 7 to 20 times the text whatever its length (the scan: 1 to 2
    times), so 120 KB fail the bound of 4 times as a megabyte did, in a tenth of the time
    (tracemalloc slows every allocation)."""
    import tracemalloc

    for text in ("[" + "{}," * 40_000 + "{}]", "[" + '"",' * 40_000 + '""]'):
        tracemalloc.start()
        try:
            assert not boundedjson.nests_deeper_than(text, 32)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * len(text), peak


def _each_page(items: int) -> bytes:
    """A list page as the API server sends one: metadata first or last, ``items`` of
    documents of ~30 KB decoded each."""
    node = {"metadata": {"name": "n"}, "status": {"images": [{"names": [f"img{i}"] * 2,
                                                              "sizeBytes": i}
                                                             for i in range(60)]}}
    return json.dumps({"kind": "NodeList", "metadata": {"resourceVersion": "7"},
                       "items": [{**node, "metadata": {"name": f"n{i}"}}
                                 for i in range(items)], "apiVersion": "v1"}).encode()


@pytest.mark.parametrize("doc", ['{"items": [1, {"a": [2]}, "x", null, []], "b": {"c": 1}}',
                                 ' { "items" : [ ] , "k" : 1 } ', '{}', '{"items": {}}',
                                 '{"items": 3}', '[1, 2]', '"items"', "3",
                                 '{"a": 1, "items": [[1], [2]], "items2": [3]}'])
def test_loads_each_decodes_as_loads_with_each_element_passed_through(doc):
    seen = []

    def each(value):
        seen.append(value)
        return ("kept", json.dumps(value))
    got = boundedjson.loads_each(doc, "items", each, what="x", max_bytes=1000)
    whole = loads(doc, what="x", max_bytes=1000, max_depth=None)
    if isinstance(whole, dict) and isinstance(whole.get("items"), list):
        assert seen == whole["items"]
        whole["items"] = [("kept", json.dumps(v)) for v in seen]
    else:
        assert seen == []
    assert got == whole


@pytest.mark.parametrize("doc", ['{"items": [1, 2', '{"items": [1 2]}', '{"items": [1,]}',
                                 '{"items": []} x', '{"items" [1]}', '{items: []}',
                                 '{"items": [NaN]}', '{"items": [], }', '{"a": 1 "b": 2}',
                                 '{"items": ["\x01"]}', ""])
def test_loads_each_refuses_what_loads_refuses(doc):
    with pytest.raises(JSONLimitError, match=r"^a page is not valid JSON: "):
        loads(doc, what="a page", max_bytes=1000, max_depth=None)
    with pytest.raises(JSONLimitError, match=r"^a page is not valid JSON: "):
        boundedjson.loads_each(doc, "items", lambda v: v, what="a page", max_bytes=1000)


def test_loads_each_keeps_its_limits_and_each_errors_pass_through():
    deep = '{"items": [' + "[" * 100_000 + "]" * 100_000 + "]}"
    with pytest.raises(JSONLimitError, match="deeper than the decoder's recursion limit"):
        boundedjson.loads_each(deep, "items", lambda v: v, what="x", max_bytes=1 << 20)
    with pytest.raises(JSONLimitError, match="more JSON elements than the limit of 10"):
        boundedjson.loads_each('{"items": [' + "1," * 20 + "1]}", "items", lambda v: v,
                               what="x", max_bytes=1000, max_elements=10)

    def bad(value):
        raise ValueError("a bug in each")
    with pytest.raises(ValueError, match=r"^a bug in each$"):
        boundedjson.loads_each('{"items": [1]}', "items", bad, what="x", max_bytes=1000)


def test_loads_each_never_holds_the_decoded_page():
    """Only one element is alive in its decoded form: the most Python memory held while
    decoding a page of 200 documents of ~30 KB each is the page's text and one document,
    where decoding it whole holds every document (6 MB)."""
    import tracemalloc

    page = _each_page(200)
    names = []

    def each(node):
        names.append(node["metadata"]["name"])
        return node["metadata"]["name"]
    tracemalloc.start()
    try:
        boundedjson.loads_each(page, "items", each, what="x", max_bytes=1 << 24)
        streamed = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        loads(page, what="x", max_bytes=1 << 24, max_depth=None)
        whole = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert names == [f"n{i}" for i in range(200)]
    assert streamed < 2 * len(page) < whole / 2, (streamed, len(page), whole)
