"""The cloud clients and engines have one story: they block, in the engines' worker thread,
and are cut by the caller's ``Cutter``; none runs an event loop of its own (a loop per call
costs its setup every call and cannot run where a loop already runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FLANNEL = Path(__file__).resolve().parents[2] / "flannel"
CLOUD = [*sorted((FLANNEL / "cloud").glob("*.py")), FLANNEL / "clients" / "aliyunrpc.py",
         FLANNEL / "clients" / "fetch.py"]


@pytest.mark.parametrize("path", CLOUD, ids=lambda p: str(p.relative_to(FLANNEL)))
def test_no_cloud_client_runs_an_event_loop(path: Path):
    imported = [alias.name for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in (node.names if isinstance(node, ast.Import)
                              else [ast.alias(node.module or "")])]
    assert not [name for name in imported if name.split(".")[0] == "asyncio"], imported
