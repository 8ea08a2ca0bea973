"""No test module imports from another test module: what tests share lives in tests/support/
(fixtures may also come from a conftest.py). A test module imported by another runs its
module-level code twice under two names and ties the two files' edits together."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but expressions (an import is a statement, and no expression
    holds one): what ``ast.walk`` visits, a fraction of the nodes."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        todo += [child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.expr)]


def imported_test_modules(source: str) -> list[str]:
    """The test modules (``test_*``) that ``source`` imports from, however it names them."""
    found = []
    for node in statements(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            # ``from tests.lab import test_x`` names the module in the imported names (a
            # function named ``test_*`` would be collected as a test, so none is imported).
            join = "" if base.endswith(".") else "."
            modules = [base, *(f"{base}{join}{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [m for m in modules if m.split(".")[-1].startswith("test_")]
    return found


def test_each_way_of_importing_a_test_module_is_found():
    assert imported_test_modules("from tests.unit.test_daemon import Node") == [
        "tests.unit.test_daemon"]
    assert imported_test_modules("def f():\n    from .test_x import y\n") == [".test_x"]
    assert imported_test_modules("import tests.lab.test_lab_cli") == ["tests.lab.test_lab_cli"]
    assert imported_test_modules("from tests.lab import test_lab_cli") == [
        "tests.lab.test_lab_cli"]
    assert imported_test_modules("from tests.conftest import MAX_WORKERS\n"
                                 "from tests.support.daemonnode import Node") == []


def test_no_test_module_imports_from_another():
    offenders = {}
    for path in sorted([*(ROOT / "tests").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]):
        imported = imported_test_modules(path.read_text())
        if imported:
            offenders[str(path.relative_to(ROOT))] = imported
    assert offenders == {}, f"move what they share to tests/support/: {offenders}"
