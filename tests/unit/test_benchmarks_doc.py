"""docs/benchmarks.md opens with one table of today's figures, and it stays in step with
``bench/``: every module there has a row or is named among the helpers, every row names a
module that exists and the command that runs it, a figure taken at a load above 3 says it is a
note, and every link into the document (from it, README.md and docs/) leads to a heading."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.markdown import anchors

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "benchmarks.md"
COLUMNS = ["benchmark", "figure", "command", "baseline", "ratio", "load", "date"]
#: The load average above which a figure is a note, not a result.
QUIET = 3.0


def table(text: str) -> list[dict[str, str]]:
    """The rows of the first table under the heading "Today's figures", by column name."""
    assert "\n## Today's figures\n" in text, "the document opens with today's figures"
    section = text.split("\n## Today's figures\n", 1)[1].split("\n#", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    return [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")),
                     strict=True)) for line in lines[2:]]


def row_modules(rows: list[dict[str, str]]) -> list[str]:
    names = []
    for row in rows:
        found = re.fullmatch(r"\[`bench\.(\w+)`\]\(#[\w-]+\)", row["benchmark"])
        assert found, f"a row's first cell is not a link named `bench.<module>`: {row}"
        names.append(found[1])
    return names


def helpers(text: str) -> list[str]:
    """The modules the line "Helpers, not benchmarks ..." names."""
    lines = [line for line in text.splitlines() if line.startswith("Helpers, not benchmarks")]
    assert len(lines) == 1, "one line of helpers under the table"
    return re.findall(r"`bench/(\w+)\.py`", lines[0])


def modules() -> set[str]:
    return {path.stem for path in (ROOT / "bench").glob("*.py")}


def loads_of(cell: str) -> list[float]:
    return [float(number) for number in re.findall(r"\d+(?:\.\d+)?", cell)]


def test_every_bench_module_has_a_row_or_is_a_helper() -> None:
    text = DOC.read_text()
    listed = row_modules(table(text)) + helpers(text)
    assert sorted(listed) == sorted(set(listed)), "a module in two rows, or a row and a helper"
    assert modules() - set(listed) == set(), "bench/ modules neither in the table nor helpers"


def test_every_row_and_helper_is_a_module_that_exists() -> None:
    text = DOC.read_text()
    assert set(row_modules(table(text)) + helpers(text)) - modules() == set()


def test_each_row_gives_its_command_load_and_date() -> None:
    for row in table(DOC.read_text()):
        module = row["benchmark"].split("`")[1]
        assert f"`.venv/bin/python -m {module}" in row["command"], row
        if row["figure"] == "not yet recorded":
            assert row["ratio"] == row["load"] == row["date"] == "-", row
            continue
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        assert row["ratio"], row
        load = row["load"]
        if load.startswith("note, load "):
            assert max(loads_of(load)) > QUIET, f"a note taken at a load of 3 or less: {row}"
        elif load != "not recorded":
            assert loads_of(load) and max(loads_of(load)) <= QUIET, (
                f"taken at a load above 3: the load cell must read 'note, load N': {row}")


def test_links_into_the_document_lead_to_its_headings() -> None:
    targets = anchors(DOC.read_text())
    links = set(re.findall(r"\]\(#([^)]+)\)", DOC.read_text()))
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        links |= set(re.findall(r"benchmarks\.md#([\w-]+)", path.read_text()))
    assert links and links <= targets, links - targets
