"""A pytest plugin for the guest's run of the vm lane: every test's outcome, as it ends, in a
JSON file the host reads (``FLANNEL_VM_REPORT``), so a VM stopped at its bound still leaves
what it ran. Under pytest-xdist only the controller writes it (it gets every worker's reports).

The file maps each node id to {"outcome": passed | failed | skipped | xfailed | xpassed,
"seconds": setup + call + teardown, "details": the failure or skip text (its tail),
"properties": what the test recorded with ``record_property``}.
Must not touch: anything but that file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flannel.files.fileutil import write_atomic
from tests.vm.driver import REPORT_ENV

DETAILS = 6000  # characters of a failure kept: its end, where the assertion is

_results: dict[str, dict[str, Any]] = {}
_writer = True  # False in an xdist worker


def pytest_configure(config: pytest.Config) -> None:
    global _writer
    _writer = not hasattr(config, "workerinput")


def _outcome(report: pytest.TestReport, before: str) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.failed or before == "failed":
        return "failed"
    if report.skipped:
        return "skipped"
    return before or "passed"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path or not _writer:
        return
    entry = _results.setdefault(report.nodeid, {"outcome": "", "seconds": 0.0,
                                                "details": "", "properties": {}})
    entry["seconds"] += report.duration
    if report.when == "call" or report.failed or report.skipped:
        entry["outcome"] = _outcome(report, entry["outcome"])
    if report.failed or report.skipped:
        entry["details"] += str(report.longrepr)[-DETAILS:]
    entry["properties"].update(dict(report.user_properties))
    write_atomic(Path(path), json.dumps(_results, indent=1, default=str).encode(), 0o644)
