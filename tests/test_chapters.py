"""Chapters' code cells: what must fail raises the class its prose names (executed
chapters), and every code line fits the page (88 characters, as ruff formats the code)."""

from pathlib import Path

import jupytext
import pytest

from tools import book
from tools.execute import error_cells, executed_notebook

SOURCES = book.chapter_sources()
MAX_CODE_LINE = 88  # pyproject.toml's [tool.ruff] line-length


def long_code_lines(source: Path, limit: int = MAX_CODE_LINE) -> list[str]:
    """``file:line: N characters`` for each code-cell line longer than ``limit``.

    The cells come from jupytext (what the book executes); each long line is located in
    the MyST source, searching forward from the previous cell, for the line number.
    """
    text = source.read_text().splitlines()
    where, found = 0, []
    for cell in jupytext.read(source).cells:
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            if len(line) <= limit:
                continue
            at = next((i for i in range(where, len(text)) if text[i] == line), None)
            if at is None:
                at = text.index(line) if line in text else -1
            where = max(where, at + 1)
            rel = source.relative_to(book.ROOT).as_posix()
            found.append(f"{rel}:{at + 1}: {len(line)} characters: {line.strip()[:60]}")
    return found


def test_long_code_lines_are_found_with_their_line_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(book, "ROOT", tmp_path)
    md = tmp_path / "99_x.md"
    long = "y = " + " + ".join(["1"] * 30)  # 4 + 30 + 29 * 3 = 121 characters
    md.write_text(
        "# x\n\n```{code-cell} ipython3\nx = 1\n```\n\nA long prose line "
        + "w" * 100
        + "\n\n```{code-cell} ipython3\n:tags: [hide-input]\n\n"
        + long
        + "\n```\n"
    )
    assert long_code_lines(md) == [f"99_x.md:12: 121 characters: {long[:60]}"]
    assert long_code_lines(md, limit=121) == []


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_code_lines_fit_the_page(source):
    long = long_code_lines(source)
    assert not long, (
        f"{len(long)} code line(s) over {MAX_CODE_LINE} characters:\n" + "\n".join(long)
    )


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_error_cells_raise_the_named_class(source):
    nb = executed_notebook(
        source
    )  # the book build's copy when fresh, else executed now
    for cell in error_cells(nb):
        where = f"{source.name}, cell {cell.index}"
        assert cell.expected, (
            f"{where}: a deliberate-error cell must start with '%%raises ClassName'"
        )
        assert cell.raised == cell.expected, (
            f"{where}: expected {cell.expected}, raised {cell.raised}"
        )
        assert cell.expected in cell.prose, (
            f"{where}: the prose before the cell must name {cell.expected}"
        )


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_only_tagged_cells_raise(source):
    nb = executed_notebook(source)
    tagged = {c.index for c in error_cells(nb)}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and i not in tagged:
            errors = [
                o for o in cell.get("outputs", []) if o.get("output_type") == "error"
            ]
            assert not errors, (
                f"{source.name}, cell {i} raised {errors[0]['ename']} outside a '%%raises' cell"
            )
