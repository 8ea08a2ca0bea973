"""docs/operations.md shows the truth matrix as the lab tests define it: the table between
its markers is ``tests/support/matrix.py``'s ``table()``, made from the cells the matrix
tests assert."""

from __future__ import annotations

from pathlib import Path

from tests.support.matrix import CELLS, LABS, SITUATIONS, table

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
START, END = "<!-- matrix:start -->\n", "<!-- matrix:end -->"


def test_the_documented_matrix_is_the_tested_one():
    text = DOC.read_text()
    shown = text[text.index(START) + len(START):text.index(END)].strip()
    assert shown == table(), f"paste into docs/operations.md between the markers:\n{table()}"


def test_every_cell_names_a_lab_and_a_situation_and_each_lab_has_its_healthy_cell():
    assert {cell.lab for cell in CELLS} == set(LABS)
    assert {cell.situation for cell in CELLS} <= set(SITUATIONS)
    assert {cell.lab for cell in CELLS if cell.situation == "healthy"} == set(LABS)
    assert len({cell.id for cell in CELLS}) == len(CELLS)
