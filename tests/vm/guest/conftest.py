"""Fixtures of the guest scenarios: a lab maker that lives for a whole module (each scenario
module builds one lab per backend and runs many scenarios on it: a lab costs minutes under
qemu's TCG), and the skip of a module whose kernel feature this kernel lacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flannel_lab.cluster import Lab
from tests.lab.conftest import lab_factory


@pytest.fixture(scope="module")
def module_labs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Lab]]:
    with lab_factory(Path(tmp_path_factory.mktemp("labs"))) as factory:
        yield factory
