"""flannelctl's readers take /status as its schema declares (flannel/monitor/statusdoc.py):
an older, newer or hostile flanneld's fields of the wrong type are named and left out, its
containers cut at a bound, and the table still shows what is of the right shape."""

from __future__ import annotations

import re

import pytest

from flannel.monitor.statusdoc import MAX_ITEMS, STATUS_FORMAT, NotAStatus, read_status
from flannel.ops.status import render


def test_fields_of_the_wrong_type_are_named_and_left_out():
    read = read_status({"ready": False, "reason": "rules", "format": STATUS_FORMAT,
                        "peers": {"known": "12", "programmed": 3,
                                  "refused_reasons": {"a": "why", "b": ["x"]}},
                        "lease": {"subnet": 10, "reservation": True},
                        "engines": {"udp": {"packets_total": 7, "bad": True}},
                        "readiness": [{"component": "rules", "ready": "no", "reason": ""}]})
    assert read.problems == [
        "readiness[0].ready: str, not true or false",
        "lease.subnet: int, not a string",
        "peers.known: str, not an integer",
        "peers.refused_reasons.b: list, not a string",
        "engines.udp.bad: bool, not a number",
    ]
    assert read.doc["peers"]["known"] == 0 and read.doc["peers"]["programmed"] == 3
    assert read.doc["peers"]["refused_reasons"] == {"a": "why"}
    assert read.doc["lease"] is not None and read.doc["lease"]["subnet"] is None
    assert read.doc["engines"] == {"udp": {"packets_total": 7}}
    assert "flanneld" in read.missing and "store" in read.missing
    table = render(read, "the socket")
    assert re.search(r"\npeers +0 known, 0 for this backend, 3 programmed", table)
    assert table.splitlines()[-1] == (
        "ignored, not of flanneld's status shape: readiness[0].ready: str, not true or false; "
        "lease.subnet: int, not a string; peers.known: str, not an integer; "
        "peers.refused_reasons.b: list, not a string; engines.udp.bad: bool, not a number")


def test_a_newer_flanneld_is_read_for_what_this_one_knows():
    read = read_status({"ready": True, "format": STATUS_FORMAT + 1, "version": "9.9",
                        "probe": {"peers": 3}, "devices": [{"name": "flannel.1", "mtu": 1450,
                                                            "mac": "0e:00:00:00:00:01"}]})
    assert read.newer and read.problems == []
    assert "probe" not in read.doc and read.doc["devices"][0]["mtu"] == 1450
    assert "note: a newer flanneld (status format 2): what it added is not shown" in \
        render(read, "the socket")


def test_containers_are_cut_at_their_bound():
    read = read_status({"ready": True,
                        "peers": {"skipped_reasons": {f"k{i}": "x" for i in range(5000)}},
                        "last_errors": ["e"] * (MAX_ITEMS + 1)})
    assert len(read.doc["peers"]["skipped_reasons"]) == MAX_ITEMS
    assert len(read.doc["last_errors"]) == MAX_ITEMS
    assert read.cut == ["peers.skipped_reasons", "last_errors"]


@pytest.mark.parametrize("raw", [[], "ready", {"ready": "yes"}, {"format": 1}])
def test_what_is_not_a_status_is_refused(raw):
    with pytest.raises(NotAStatus):
        read_status(raw)
