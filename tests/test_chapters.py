"""Every cell that must fail raises the class its prose names (executed chapters)."""

import pytest

from tools import book
from tools.execute import error_cells, executed_notebook

SOURCES = book.chapter_sources()


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_error_cells_raise_the_named_class(source):
    nb = executed_notebook(source)  # the book build's copy when fresh, else executed now
    for cell in error_cells(nb):
        where = f"{source.name}, cell {cell.index}"
        assert cell.expected, f"{where}: a raises-exception cell must start with '# raises ClassName'"
        assert cell.raised == cell.expected, f"{where}: expected {cell.expected}, raised {cell.raised}"
        assert cell.expected in cell.prose, f"{where}: the prose before the cell must name {cell.expected}"


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_only_tagged_cells_raise(source):
    nb = executed_notebook(source)
    tagged = {c.index for c in error_cells(nb)}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and i not in tagged:
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, f"{source.name}, cell {i} raised {errors[0]['ename']} without the raises-exception tag"
