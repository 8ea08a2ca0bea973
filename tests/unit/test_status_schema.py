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


def test_the_probes_section_reads_back_unchanged_and_shows_each_failing_peer():
    from flannel.monitor.nodestate import probes_section
    from flannel.probing.prober import Failing, ProbeStatus
    from flannel.probing.schedule import Schedule
    from flannel.probing.sequence import ENCAP_BLOCKED
    from tests.support.clock import FakeClock

    status = ProbeStatus(interval=30, rate=20, schedule=Schedule(30, 20, FakeClock()))
    status.failing[("10.5.2.0-24", 4)] = Failing(
        ENCAP_BLOCKED, "UDP 8472 unanswered", 1_700_000_000.0, 0.0, "192.0.2.2", "10.5.2.0")
    section = probes_section(status, 1_700_000_060.0)
    read = read_status({"ready": True, "format": STATUS_FORMAT, "probes": section})
    assert read.problems == [] and read.doc["probes"] == section
    table = render(read, "the socket")
    assert re.search(r"\n  failing +encapsulation blocked: 10\.5\.2\.0-24 since \S+ "
                     r"\(1m0?s?\): UDP 8472 unanswered", table), table
    # A flanneld that does not probe says nothing of them; one with probes off says so.
    assert "probes" not in render(read_status({"ready": True}), "s")
    assert re.search(r"\nprobes +off", render(read_status({"ready": True, "probes": None}), "s"))
