"""The two notebook sets generated from each chapter (issue 16).

* self-study (``chapters/*.ipynb``, the launch button): solution cells are Colab forms,
  first line ``#@title Solution to exercise N.k`` and ``"cellView": "form"`` in the
  cell's metadata (what Colab writes for a form cell; Colab then shows only the title);
* student (``notebooks/student/*.ipynb``): every solution cell replaced by a one-line
  pointer to the solution in the online book; it runs top to bottom with the exercise
  stubs unfilled, and every checker says its exercise is not attempted yet.

That both sets are in sync with the sources and output-free is tests/test_book.py's
pairing test.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tools import book
from tools.execute import executed_student_notebook

SOURCES = book.chapter_sources()
IDS = [s.stem for s in SOURCES]
FORM_TITLE = re.compile(r"#@title Solution to exercise (\d+\.\d+)")

_HEADER = (
    "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
    "    format_version: 0.13\nkernelspec:\n  display_name: Python 3 (ipykernel)\n"
    "  language: python\n  name: python3\n---\n\n"
)
_DEMO = (
    _HEADER
    + """# 9. Demo

## Exercises

### 1. Double it

```{code-cell} ipython3
def double(x):
    raise NotImplementedError

check(double)
```

**Solution**

```{code-cell} ipython3
:tags: [solution, hide-input]

# Solution to exercise 9.1
def solution_double(x):
    return 2 * x

check(solution_double, strict=True)
```

```{code-cell} ipython3
print("after")
```
"""
)


def _source(cell: dict) -> str:
    return (
        cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    )


def _solutions(source: Path) -> list[str]:
    """The exercise numbers of the chapter's solution cells, from its MyST source."""
    return book.solution_exercises(source)


@pytest.fixture
def demo(tmp_path, monkeypatch) -> Path:
    """A one-exercise chapter in a scratch repository with the book's _config.yml."""
    shutil.copy(book.ROOT / "_config.yml", tmp_path / "_config.yml")
    (tmp_path / "chapters").mkdir()
    source = tmp_path / "chapters" / "99_demo.md"
    source.write_text(_DEMO)
    monkeypatch.setattr(book, "ROOT", tmp_path)
    monkeypatch.setattr(book, "STUDENT_DIR", tmp_path / "notebooks" / "student")
    return source


def test_self_study_solution_is_a_colab_form(demo):
    cells = book.md_to_notebook(demo)["cells"]
    (solution,) = [
        c for c in cells if book.SOLUTION_TAG in c["metadata"].get("tags", [])
    ]
    lines = _source(solution).splitlines()
    assert lines[0] == "#@title Solution to exercise 9.1"
    assert lines[1:] == [
        "def solution_double(x):",
        "    return 2 * x",
        "",
        "check(solution_double, strict=True)",
    ]
    assert solution["metadata"]["cellView"] == "form"
    assert solution["metadata"]["jupyter"] == {"source_hidden": True}
    assert solution["metadata"]["tags"] == ["solution", "hide-input"]
    others = [c for c in cells if c is not solution]
    assert all("cellView" not in c["metadata"] for c in others)
    assert _source(others[-1]) == 'print("after")'


def test_student_notebook_points_to_the_book_instead(demo):
    nb = book.student_notebook(demo)
    texts = [(c["cell_type"], _source(c)) for c in nb["cells"]]
    assert not any("solution_double" in t for _, t in texts)
    assert ("markdown", "**Solution**") not in texts
    url = "https://beyond-grad.github.io/beyond-grad/chapters/99_demo.html#exercises"
    pointer = (
        f"**Solution to exercise 9.1:** in the online book, under [the chapter's exercises]({url}) "
        "(open *Show code cell source* below the exercise)."
    )
    assert texts[-2:] == [("markdown", pointer), ("code", 'print("after")')]
    assert "jupytext" not in nb["metadata"]  # no pairing back to the chapter's source


def test_sync_writes_both_sets_and_pairing_sees_drift(demo, monkeypatch):
    monkeypatch.setattr(book, "CHAPTERS", demo.parent)
    written = book.sync()
    assert sorted(p.relative_to(book.ROOT).as_posix() for p in written) == [
        "chapters/99_demo.ipynb",
        "notebooks/student/99_demo.ipynb",
    ]
    assert book.pair_problems(demo) == [] and book.sync() == []
    student = book.student_path(demo)
    nb = json.loads(student.read_text())
    nb["cells"][-1]["metadata"]["cellView"] = "form"
    student.write_text(json.dumps(nb))
    assert book.pair_problems(demo) == [
        "notebooks/student/99_demo.ipynb is out of sync with 99_demo.md: run `python3 dev.py sync`"
    ]


@pytest.mark.parametrize(
    "first_line",
    [
        "def solution_double(x):",
        "# Solution to exercise 9",
        "# solution 9.1",
        "#@title Solution to exercise 9.1",
    ],
)
def test_solution_cell_must_name_its_exercise(demo, first_line):
    demo.write_text(_DEMO.replace("# Solution to exercise 9.1", first_line))
    with pytest.raises(
        ValueError, match=r"must start with '# Solution to exercise N\.k'"
    ):
        book.md_to_notebook(demo)


def test_page_url_follows_the_repository(demo, monkeypatch):
    monkeypatch.setattr(
        book, "repository", lambda: ("https://github.com/Some-Org/some-book", "main")
    )
    assert (
        book.page_url(demo)
        == "https://some-org.github.io/some-book/chapters/99_demo.html"
    )
    assert book.student_colab_url(demo) == (
        "https://colab.research.google.com/github/Some-Org/some-book/blob/main/notebooks/student/99_demo.ipynb"
    )


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_chapter_with_exercises_tags_its_solutions(source):
    if not re.search(r"^## Exercises\s*$", source.read_text(), re.M):
        pytest.skip(f"{source.name} has no exercises")
    assert _solutions(source), (
        f"{source.name} has an Exercises section but no cell tagged 'solution' "
        "(tags: [solution, hide-input]; first line '# Solution to exercise N.k')"
    )


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_self_study_solutions_are_forms(source):
    nb = json.loads(source.with_suffix(".ipynb").read_text())
    forms = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and c["metadata"].get("cellView") == "form"
    ]
    titles = [FORM_TITLE.fullmatch(_source(c).splitlines()[0]) for c in forms]
    assert all(titles), [_source(c).splitlines()[0] for c in forms]
    assert [m.group(1) for m in titles] == _solutions(source)


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_committed_student_notebook_has_no_solution(source):
    nb = json.loads(book.student_path(source).read_text())
    code = [_source(c) for c in nb["cells"] if c["cell_type"] == "code"]
    assert not [c for c in code if "Solution to exercise" in c]
    pointers = [
        c
        for c in nb["cells"]
        if c["cell_type"] == "markdown" and "#exercises)" in _source(c)
    ]
    assert len(pointers) == len(_solutions(source))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_student_notebook_runs_and_reports_not_attempted(source):
    exercises = _solutions(source)
    if not exercises:
        pytest.skip(
            f"{source.name} has no solution cells: its student notebook is the chapter"
        )
    nb = executed_student_notebook(
        source
    )  # raises CellExecutionError on an untagged error
    text = "\n".join(
        o.get("text", "") + "".join(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
    )
    for exercise in exercises:
        # "Exercise 1.3: not attempted yet", or with the exercise's title after the number
        said = rf"Exercise {re.escape(exercise)}\b[^\n]*?: not attempted yet"
        assert re.search(said, text), (
            f"{book.student_path(source).name}: no checker printed 'Exercise {exercise}: not attempted yet'"
        )
