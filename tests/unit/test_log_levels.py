"""``-v`` levels as klog's: a record at V(n) shows when ``-v`` is n or more, in klog's ``I``
line format; what each level adds is documented in README.md and flannel/log.py."""

from __future__ import annotations

import logging

import pytest

from flannel import log as flannel_log
from flannel.kernel.reconcile import DesiredState, reconcile_difference
from flannel.kernel.rtnl import Route
from tests.support.fakenetlink import FakeKernel

LEVELS = {"V1": flannel_log.V1, "V2": flannel_log.V2, "V4": flannel_log.V4,
          "V6": flannel_log.V6, "DEBUG": logging.DEBUG}


@pytest.fixture(autouse=True)
def _restore_root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("v", "shown"), [
    (0, []),
    (1, ["V1"]),
    (2, ["V1", "V2"]),
    (3, ["V1", "V2"]),
    (4, ["V1", "V2", "V4"]),
    (6, ["V1", "V2", "V4", "V6"]),
    (9, ["V1", "V2", "V4", "V6"]),
    (10, ["V1", "V2", "V4", "V6", "DEBUG"]),
    (2**31 - 1, ["V1", "V2", "V4", "V6", "DEBUG"]),  # klog takes any int32
    (-1, []),
])
def test_each_level_shows_its_records_and_those_below(v, shown, capsys):
    flannel_log.setup(v)
    logger = logging.getLogger("flannel.test")
    logger.info("always")
    for name, level in LEVELS.items():
        logger.log(level, "at %s", name)
    lines = capsys.readouterr().err.splitlines()
    assert [line.rsplit("] ", 1)[1] for line in lines] == ["always"] + [f"at {n}" for n in shown]
    assert all(line.startswith("I") for line in lines)  # klog's V(n).Info is an I line


def test_kernel_changes_show_from_v4(capsys):
    """Every route, neighbour and FDB change a pass makes is a V(4) line (Go's vxlan logs its
    neighbour and FDB calls at V(4))."""
    route = Route("10.5.1.0/24", "192.0.2.1", 7, onlink=True)
    for v, expected in ((3, False), (4, True)):
        flannel_log.setup(v)
        reconcile_difference(FakeKernel().open(), DesiredState(),
                             DesiredState(routes=frozenset({route})))
        err = capsys.readouterr().err
        assert ("netlink: replace route" in err and "10.5.1.0/24" in err) is expected
