"""Link and address requests are byte for byte what iproute2's ``ip`` sends for the same
object (messages captured from iproute2 6.1; ``tests/integration/test_links_netns.py``
re-captures them from the installed ``ip``)."""

from __future__ import annotations

import pytest

from flannel.kernel import links
from tests.support.iproute2_wire import CASES, GOLDEN, GOLDEN_INDICES, normalised


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_request_is_what_iproute2_sends(case):
    assert normalised(case.encode(GOLDEN_INDICES)).hex() == GOLDEN[case.name]


def test_every_case_has_a_capture():
    assert {case.name for case in CASES} == set(GOLDEN)


def test_sequence_number_is_the_one_given():
    message = links.encode_del_link(4, 0x01020304)
    assert message[8:12] == bytes([4, 3, 2, 1])
