"""Lab fixtures: every lab gets a name from this test run's prefix and is always torn down."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flannel.lab.cluster import Lab
from tests.support import netns

_numbers = itertools.count(1)


@pytest.fixture
def make_lab(tmp_path: Path) -> Iterator:
    if os.geteuid() != 0 or shutil.which("etcd") is None:
        pytest.skip("needs root and etcd-server")
    labs: list[Lab] = []

    def factory() -> Lab:
        lab = Lab(f"{netns.RUN_PREFIX}L{next(_numbers)}", root=tmp_path / "labs")
        labs.append(lab)
        return lab

    try:
        yield factory
    finally:
        for lab in labs:
            lab.down()
