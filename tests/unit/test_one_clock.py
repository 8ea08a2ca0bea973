"""Every waiter in the stores, the retry helper, the rules resync and the data plane takes
the clock (flannel/timing/clock.py): none reads ``time.monotonic``/``time.time`` or sleeps
on its own, so a test's clock, or a virtual-time loop, drives all of them."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "flannel"
#: The rooms whose waits and readings go through the clock.
ON_THE_CLOCK = ["subnet", "dataplane", "rules/manager.py", "timing/backoff.py", "reporting"]


def direct_time(path: Path, root: Path = ROOT) -> list[str]:
    """``time.monotonic()``, ``time.time()``, ``asyncio.sleep(<not 0>)``,
    ``asyncio.wait_for(...)`` and ``*.call_later(...)`` calls in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        name = f"{owner}.{node.func.attr}"
        yields = (name == "asyncio.sleep" and len(node.args) == 1
                  and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0)
        if name in ("time.monotonic", "time.time", "asyncio.wait_for") or (
                name == "asyncio.sleep" and not yields) or node.func.attr == "call_later":
            found.append(f"{path.relative_to(root.parent)}:{node.lineno}: {name}")
    return found


def test_the_stores_retries_rules_and_data_plane_wait_only_on_the_clock():
    paths = []
    for room in ON_THE_CLOCK:
        where = ROOT / room
        paths += sorted(where.rglob("*.py")) if where.is_dir() else [where]
    assert len(paths) > 10
    assert [hit for path in paths for hit in direct_time(path)] == []


def test_the_check_finds_a_direct_reading_and_a_sleep(tmp_path):
    target = tmp_path / "flannel" / "subnet" / "sample.py"
    target.parent.mkdir(parents=True)
    target.write_text("import asyncio, time\n"
                      "async def f():\n"
                      "    await asyncio.sleep(0)\n"
                      "    start = time.monotonic()\n"
                      "    await asyncio.sleep(1)\n")
    assert direct_time(target, tmp_path / "flannel") == [
        "flannel/subnet/sample.py:4: time.monotonic", "flannel/subnet/sample.py:5: asyncio.sleep"]
