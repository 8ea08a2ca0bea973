"""docs/install.md's backend table names every backend flanneld accepts, and nothing else:
a new backend is not done until an operator can read what it needs on the node and what
``flannelctl cleanup`` leaves."""

from __future__ import annotations

import re
from pathlib import Path

from flannel import backend

DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def documented_backends() -> set[str]:
    text = DOC.read_text()
    section = text.split("## What each backend needs on the node", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([a-z0-9-]+)`", first_cell))
    return names


def test_every_backend_is_in_the_install_guide():
    assert documented_backends() == set(backend.supported())
