"""Chapters' code cells: what must fail raises the class its prose names (executed
chapters), every code line fits the page (78 characters: the content column at 1280 px),
and no visible cell only serves the build (glue, drift look-ups, build asserts)."""

import ast
from pathlib import Path

import jupytext
import pytest

from tools import book
from tools.execute import error_cells, executed_notebook

SOURCES = book.chapter_sources()
#: The page's content column at 1280 px holds about 78 characters of code (666 px);
#: tools/browser.py measures every code block of the built pages against it, and every
#: chapter's source keeps its code lines within it.
MAX_CODE_LINE = 78
PAGE_CODE_LINE = 78
#: Tags that keep a cell's code off the page.
HIDDEN = {"remove-cell", "remove-input"}


def long_code_lines(source: Path, limit: int = MAX_CODE_LINE) -> list[str]:
    """``file:line: N characters`` for each code-cell line longer than ``limit``
    (cells tagged ``remove-cell`` excepted: ruff's 88 columns are theirs).

    The cells come from jupytext (what the book executes); each long line is located in
    the MyST source, searching forward from the previous cell, for the line number.
    """
    text = source.read_text().splitlines()
    where, found = 0, []
    for cell in jupytext.read(source).cells:
        if cell.cell_type != "code" or "remove-cell" in cell.metadata.get("tags", []):
            continue  # a build-only cell is neither on the page nor in the notebooks
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
    fits = "z = " + "2" * (MAX_CODE_LINE - 4)  # exactly the limit
    md.write_text(
        "# x\n\n```{code-cell} ipython3\nx = 1\n```\n\nA long prose line "
        + "w" * 100
        + "\n\n```{code-cell} ipython3\n:tags: [hide-input]\n\n"
        + long
        + "\n"
        + fits
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


def test_chapter5_code_lines_fit_the_content_column():
    source = book.CHAPTERS / "05_laplacians.md"
    found = long_code_lines(source, PAGE_CODE_LINE)
    assert not found, (
        f"{len(found)} code line(s) over {PAGE_CODE_LINE} characters:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_chapters_that_draw_select_the_inline_backend(source):
    """A kernel's default matplotlib backend depends on the ipykernel and matplotlib
    releases (on the floor set it is not inline, and a figure shows as the text
    ``<Figure size ...>``), so every chapter that draws selects it."""
    code = [c.source for c in jupytext.read(source).cells if c.cell_type == "code"]
    if code and "google.colab" in code[0]:
        code = code[1:]  # the install cell names the extras it keeps, matplotlib too
    draws = any("matplotlib" in c or "beyondgrad.figures" in c for c in code)
    if draws:
        assert any(
            line.strip() == "%matplotlib inline"
            for c in code
            for line in c.splitlines()
        ), f"{source.name} draws figures: add '%matplotlib inline' to its import cell"


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


def _is_glue(node: ast.AST) -> bool:
    """A call of ``glue(...)`` or ``runtime.glue(...)``."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return False
    f = node.value.func
    return (isinstance(f, ast.Name) and f.id == "glue") or (
        isinstance(f, ast.Attribute) and f.attr == "glue"
    )


def _reads_drift(node: ast.AST) -> bool:
    """The statement looks something up in the drift record (``drift.<name>``)."""
    return any(
        isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and n.value.id == "drift"
        for n in ast.walk(node)
    )


def build_only(cell_source: str) -> bool:
    """Whether a code cell only serves the build: every statement a ``glue(...)`` call,
    a drift look-up (or a function built on one), a build ``assert`` or an import, and
    at least one that is not an import."""
    code = "\n".join(
        line for line in cell_source.splitlines() if not line.lstrip().startswith("%")
    )
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    kinds = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            kinds.append("import")
        elif _is_glue(node) or isinstance(node, ast.Assert) or _reads_drift(node):
            kinds.append("build")
        else:
            return False
    return "build" in kinds


def visible_build_cells(source: Path) -> list[str]:
    """``file:line: first line`` of each code cell on the page that only serves the build."""
    text = source.read_text().splitlines()
    found, where = [], 0
    for cell in jupytext.read(source).cells:
        tags = set(cell.metadata.get("tags", []))
        if cell.cell_type != "code" or tags & HIDDEN or not build_only(cell.source):
            continue
        first = cell.source.strip().splitlines()[0]
        at = next((i for i in range(where, len(text)) if text[i] == first), where)
        where = at + 1
        rel = source.relative_to(book.ROOT).as_posix()
        found.append(f"{rel}:{at + 1}: {first[:60]}")
    return found


@pytest.mark.parametrize(
    "cell, expected",
    [
        ('glue("n", n, display=False)', True),
        ('runtime.glue("n", f"{t:.0f}")\nglue("m", 2)', True),
        ("from beyondgrad import drift\nv = drift.first_version('p', 'raises')", True),
        ("def recorded(p):\n    return drift.versions()\nglue('a', recorded(1))", True),
        ("assert concrete == ['eager'], by_name", True),
        ("Markdown(drift.table(['p']))", True),
        ("import jax", False),  # only imports: the chapter's import cell
        ("x = jnp.arange(3.0)\nglue('n', x.size)", False),  # teaches, then glues
        ("%%raises TypeError\nf(1)", False),
        ("print(drift_check)\nruntime.glue('s', 1)", False),
        ("def f(x:\n", False),  # not Python: not judged
    ],
)
def test_build_only_cells_are_recognised(cell, expected):
    assert build_only(cell) is expected


def test_visible_build_cells_are_found_and_hidden_ones_are_not(tmp_path, monkeypatch):
    monkeypatch.setattr(book, "ROOT", tmp_path)
    md = tmp_path / "99_x.md"
    cell = "```{{code-cell}} ipython3\n{tags}{code}\n```\n\n"
    md.write_text(
        "# x\n\n"
        + cell.format(tags="", code="x = 1")
        + cell.format(tags="", code='glue("x", x)')
        + cell.format(tags=":tags: [remove-cell]\n\n", code='glue("y", x)')
        + cell.format(
            tags=":tags: [remove-input]\n\n", code="Markdown(drift.table([]))"
        )
    )
    assert visible_build_cells(md) == ['99_x.md:8: glue("x", x)']


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_no_visible_cell_only_serves_the_build(source):
    found = visible_build_cells(source)
    assert not found, (
        f"{len(found)} code cell(s) on the page only glue, look up the drift record or "
        "assert for the build: tag them [remove-cell] (or [remove-input] to keep the "
        "output):\n" + "\n".join(found)
    )


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_a_chapter_reads_as_a_path_and_its_summary_states_the_rules_briefly(source):
    """A chapter page's teaching path is at most about 7,000 prose words and its
    Summary at most 250 (``tools/prose_words.py``: code, math and markup left out)."""
    from tools import prose_words

    words = prose_words.count(source)
    assert words <= prose_words.TEACHING_PATH_MAX, (
        f"{source.name}: {words} prose words before '## Exercises' "
        f"(at most {prose_words.TEACHING_PATH_MAX}); move forensics to the appendix"
    )
    summary = prose_words.count_summary(source)
    assert summary is not None, f"{source.name} has no '## Summary' section"
    assert summary <= prose_words.SUMMARY_MAX, (
        f"{source.name}: its Summary has {summary} prose words "
        f"(at most {prose_words.SUMMARY_MAX}); keep the rules, link the details"
    )


def test_the_summary_count_reads_only_the_summary_section():
    from tools import prose_words

    text = "# T\n\nIntro words here.\n\n## Summary\n\n- One `rule` here.\n\n## Exercises\n\nx"
    assert prose_words.summary(text).split() == ["-", "One", "CODE", "here."]
    assert prose_words.summary("# T\n\nNo summary here.") is None
