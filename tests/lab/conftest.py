"""Lab fixtures: every lab gets a name from this test run's prefix and is always torn down (at
the test's end, or the module's for the labs its tests share).

A lab built by a ``flannel-lab`` process is torn down from the state file it recorded, so
teardown removes only what the lab created, as ``flannel-lab down`` does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flannel_lab.cluster import Lab, LabError
from tests.support import netns

_numbers = itertools.count(1)


@contextlib.contextmanager
def lab_factory(root: Path) -> Iterator[Callable[[], Lab]]:
    """A maker of labs under ``root``, each named from this test run's prefix; every lab it
    made is torn down at the end, even on failure."""
    if os.geteuid() != 0 or shutil.which("etcd") is None:
        pytest.skip("needs root and etcd-server")
    labs: list[Lab] = []

    def factory() -> Lab:
        lab = Lab(f"{netns.RUN_PREFIX}L{next(_numbers)}", root=root)
        labs.append(lab)
        return lab

    try:
        yield factory
    finally:
        for lab in labs:
            lab.down()
            if lab.exists:  # built by a flannel-lab process: its state file says what it made
                with contextlib.suppress(LabError):
                    Lab(lab.name, root=root).down()


@pytest.fixture
def make_lab(tmp_path: Path) -> Iterator[Callable[[], Lab]]:
    with lab_factory(tmp_path / "labs") as factory:
        yield factory


@pytest.fixture(scope="module")
def module_labs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Lab]]:
    """A maker of labs that live as long as the test module: for the labs its tests share
    (tests/support/sharedlab.py)."""
    with lab_factory(tmp_path_factory.mktemp("labs")) as factory:
        yield factory
