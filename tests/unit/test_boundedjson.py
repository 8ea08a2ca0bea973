"""Bounded JSON decoding: size and depth limits, Go's refusal of NaN and Infinity."""

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
    """A megabyte of ``{}`` or of ``""`` cost the pre-scan an object per match (50 MiB)."""
    import tracemalloc

    for text in ("[" + "{}," * 400_000 + "{}]", "[" + '"",' * 400_000 + '""]'):
        tracemalloc.start()
        try:
            assert not boundedjson.nests_deeper_than(text, 32)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * len(text), peak
