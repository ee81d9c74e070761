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
from tools.execute import (
    RunAllStopped,
    executed_notebook,
    executed_student_notebook,
    fresh_executed_notebook,
    implied_run_all,
    run_all,
    run_all_cached,
    run_all_implied_by_build,
)

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
    monkeypatch.setattr(book, "CHAPTERS", tmp_path / "chapters")
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


def test_sync_writes_both_sets_and_pairing_sees_drift(demo):
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
        if c["cell_type"] == "code"
        and c["metadata"].get("cellView") == "form"
        and not _source(c).startswith(book.HIDDEN_CODE_TITLE)  # a remove-input cell
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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_student_notebook_runs_all_and_reports_not_attempted(source):
    """The student notebook, run as Colab's Run all does (no exercise solved), reaches
    its last cell, and every checker says its exercise is not attempted yet."""
    exercises = _solutions(source)
    if not exercises:
        # the same code cells as the self-study notebook, whose Run all is tested
        code = [
            [
                _source(c)
                for c in json.loads(p.read_text())["cells"]
                if c["cell_type"] == "code"
            ]
            for p in (source.with_suffix(".ipynb"), book.student_path(source))
        ]
        assert code[0] == code[1]
        pytest.skip(
            f"{source.name} has no solutions: its student notebook is the chapter"
        )
    nb = executed_student_notebook(source)  # RunAllStopped names the cell that raised
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
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


# --------------------------------------------------------------------------- for readers

_MYST = (
    _HEADER
    + """# 9. Demo

(demo-start)=
## Where it starts

A {term}`tracer` and a {term}`primal point <primal>`; see {ref}`demo-start`, and
{ref}`this section <demo-start>`, and {numref}`fig-demo`. Ratio
{glue:text}`ratio:.2f`, count {glue}`count`, text {glue:text}`label`, math {math}`x^2`.
The [drift report](../drift.md#top), [chapter 0](00_setup.md), a
[file](../benchmarks/laplacian.py), code `[x](y.md)`.

```{code-cell} ipython3
:tags: [remove-cell]

glue("ratio", 3.14159)
assert 1 + 1 == 2, "build-only"
```

```{code-cell} ipython3
:tags: [remove-cell]

from math import pi
```

```{code-cell} ipython3
---
mystnb:
  figure:
    caption: A demo figure.
    name: fig-demo
---
print("a figure")
```

```{code-cell} ipython3
:tags: [remove-input]

print("a table the page shows")
```

```{note}
A note with a {term}`tracer`.
```

:::{admonition} Careful
:class: warning
Nested:
```{tip}
Inner tip.
```
:::

```python
# a fenced code block is left as it is
(not-a-label)=
```
"""
)

_GLOSSARY = (
    "# Glossary\n\n```{glossary}\ntracer\n  A stand-in.\n\nprimal\n  A point.\n```\n"
)


@pytest.fixture
def myst_demo(demo):
    demo.write_text(_MYST)
    (book.ROOT / "glossary.md").write_text(_GLOSSARY)
    book.glue_path(demo).parent.mkdir(parents=True)
    values = {
        "ratio": {"text/plain": "3.14159"},
        "count": {"text/plain": "7"},
        "label": {"text/plain": "'float32[3]'"},
    }
    record = {"code": book.code_digest(demo), "run": "test", "values": values}
    book.glue_path(demo).write_text(json.dumps(record))
    return demo


def test_notebooks_render_myst_as_markdown(myst_demo):
    base = "https://beyond-grad.github.io/beyond-grad/"
    page = base + "chapters/99_demo.html"
    for nb in (book.md_to_notebook(myst_demo), book.student_notebook(myst_demo)):
        assert book.raw_myst(nb) == []
        texts = [(c["cell_type"], _source(c)) for c in nb["cells"]]
        assert not [t for _, t in texts if "build-only" in t or "glue(" in t]
        (kept,) = [c for c in nb["cells"] if _source(c) == "from math import pi"]
        assert "tags" not in kept["metadata"]  # hidden import: later cells may use it
        prose = texts[0][1]
        assert prose.startswith("# 9. Demo\n\n## Where it starts\n\nA [tracer]")
        assert f"[tracer]({base}glossary.html#term-tracer)" in prose
        assert f"[primal point]({base}glossary.html#term-primal)" in prose
        assert f"see [Where it starts]({page}#demo-start)" in prose
        assert f"[this section]({page}#demo-start)" in prose
        assert "and Fig. 1. Ratio" in prose  # stays inside the notebook
        assert "Ratio\n3.14†, count 7†, text float32[3]†, math $x^2$." in prose
        assert prose.endswith(book.build_note("test"))
        assert f"[drift report]({base}drift.html#top)" in prose
        assert f"[chapter 0]({base}chapters/00_setup.html)" in prose
        url, branch = book.repository()
        assert f"[file]({url}/blob/{branch}/benchmarks/laplacian.py)" in prose
        assert "code `[x](y.md)`" in prose
        (fig,) = [i for i, (_, t) in enumerate(texts) if t == 'print("a figure")']
        assert texts[fig + 1] == ("markdown", "**Fig. 1.** A demo figure.")
        (hidden,) = [c for c in nb["cells"] if "a table the page shows" in _source(c)]
        assert _source(hidden).startswith(book.HIDDEN_CODE_TITLE + "\n")
        assert hidden["metadata"]["cellView"] == "form"
        assert "tags" not in hidden["metadata"]
        assert reader_problems(nb, "demo") == []
        shown = "\n".join(t for kind, t in texts if kind == "markdown")
        assert f"> **Note**\n>\n> A note with a [tracer]({base}" in shown
        assert "> **Careful**\n>\n> Nested:\n> > **Tip**\n> >\n> > Inner tip." in shown
        assert (
            "```python\n# a fenced code block is left as it is\n(not-a-label)=\n```"
            in (shown)
        )


def test_a_missing_glued_value_names_the_fix(myst_demo):
    record = json.loads(book.glue_path(myst_demo).read_text())
    del record["values"]["count"]
    book.glue_path(myst_demo).write_text(json.dumps(record))
    with pytest.raises(book.GlueMissing, match=r"'count'.*run `python3 dev.py sync`"):
        book.md_to_notebook(myst_demo)
    assert book.glue_record_problems(myst_demo) == [
        "notebooks/glue/99_demo.json has no value for ['count']: "
        "run `python3 dev.py sync`"
    ]
    myst_demo.write_text(_MYST.replace('print("a figure")', 'print("changed")'))
    assert "recorded from other code" in book.glue_record_problems(myst_demo)[-1]


def test_raw_myst_is_found():
    cells = [
        {"cell_type": "markdown", "source": "fine $x$ and `code` {not a role}"},
        {"cell_type": "markdown", "source": "a {term}`tracer` left"},
        {"cell_type": "markdown", "source": ["```{note}\n", "x\n", "```"]},
        {"cell_type": "markdown", "source": ":::{admonition} x\ny\n:::"},
        {"cell_type": "markdown", "source": "(a-label)=\n# Title"},
        {"cell_type": "code", "source": "{glue}`x`"},
    ]
    found = book.raw_myst({"cells": cells})
    assert [f.split(":")[0] for f in found] == ["cell 1", "cell 2", "cell 3", "cell 4"]


def test_glued_outputs_are_read_from_an_executed_notebook():
    shown = {"output_type": "display_data", "data": {"text/plain": "3.5"}}
    hidden = {
        "output_type": "display_data",
        "data": {"application/papermill.record/text/plain": "'a'"},
        "metadata": {
            "scrapbook": {"name": "b", "mime_prefix": "application/papermill.record/"}
        },
    }
    cells = [
        {"cell_type": "markdown", "source": ""},
        {
            "cell_type": "code",
            "outputs": [{**shown, "metadata": {"scrapbook": {"name": "a"}}}],
        },
        {"cell_type": "code", "outputs": [hidden, {"output_type": "stream"}]},
    ]
    assert book.glued_outputs({"cells": cells}) == {
        "a": {"text/plain": "3.5"},
        "b": {"text/plain": "'a'"},
    }


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_generated_notebooks_carry_no_raw_myst_and_no_build_cells(source):
    for path in (source.with_suffix(".ipynb"), book.student_path(source)):
        nb = json.loads(path.read_text())
        raw = book.raw_myst(nb)
        assert not raw, f"{path.name}: MyST left raw:\n" + "\n".join(raw)
        removed = [
            i
            for i, c in enumerate(nb["cells"])
            if book.REMOVE_TAG in c.get("metadata", {}).get("tags", [])
        ]
        assert not removed, f"{path.name}: build-only cells {removed} in a notebook"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_glue_record_fits_the_chapter(source):
    assert book.glue_record_problems(source) == []


@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_glued_names_are_glued_by_the_executed_chapter(source):
    """Every value the notebooks substitute is one the chapter's run glues (names only:
    the values are measurements of one run)."""
    names = book.glue_names(source)
    if not names:
        pytest.skip(f"{source.name} glues nothing")
    glued = book.glued_outputs(executed_notebook(source))
    assert not [n for n in names if n not in glued]


# --------------------------------------------------------------------------- Run all

_RUN_ALL = (
    _HEADER
    + """# 9. Run all

```{code-cell} ipython3
x = 1
```

```{code-cell} ipython3
:tags: [raises-exception]

{}[x]
```

```{code-cell} ipython3
print("never reached")
```
"""
)


def test_run_all_stops_at_the_first_error_despite_the_tag(tmp_path):
    import jupytext

    path = tmp_path / "stops.ipynb"
    jupytext.write(jupytext.reads(_RUN_ALL, fmt="md:myst"), path)
    with pytest.raises(RunAllStopped) as stopped:
        run_all(path, timeout=120)
    said = str(stopped.value)
    assert said.startswith("stops.ipynb: Run all stopped at cell 2 (code cell 2 of 3)")
    assert "KeyError: 1" in said and "{}[x]" in said


def _executed(*cells: tuple[str, list[str], bool]):
    """A source execution: (code, tags, errored) per cell, outputs as nbclient writes."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for n, (code, tags, errored) in enumerate(cells, start=1):
        cell = nbformat.v4.new_code_cell(code, execution_count=n)
        if tags:
            cell.metadata["tags"] = tags
        if errored:
            cell.outputs = [nbformat.v4.new_output("error", ename="E", evalue="")]
        nb.cells.append(cell)
    return nb


def _self_study(done):
    """The self-study notebook of ``done``: build-only cells left out, no outputs."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for c in done.cells:
        tags = c.metadata.get("tags", [])
        if "remove-cell" in tags and not book.only_imports(c.source):
            continue
        nb.cells.append(nbformat.v4.new_code_cell(c.source))
    return nb


_GLUE = (
    "glue('n', len(xs), display=False)\nassert n_seen == 3",
    ["remove-cell"],
    False,
)


@pytest.mark.parametrize(
    "build_only",
    [
        _GLUE,
        ("from beyondgrad import drift\nfor v in drift.versions():\n    glue(v, 1)",
         ["remove-cell"], False),
        ("tmp = 7\nfor o in xs:\n    print(o)", ["remove-cell"], False),
    ],
)  # fmt: skip
def test_run_all_is_implied_by_an_execution_with_inert_build_cells(build_only):
    """Run all of the self-study notebook is read from the source's execution (no second
    run) when the left-out cells only glue, assert, print or bind names no later cell
    reads before rebinding them (``o`` and ``tmp`` are rebound first below)."""
    done = _executed(
        ("xs = [1, 2, 3]\nn_seen = len(xs)", [], False),
        build_only,
        ("%%raises KeyError\n{}[xs[0]]", [], False),
        ("tmp = [o + 1 for o in xs]\nfor o in tmp:\n    print(o)", [], False),
    )
    nb = implied_run_all(done, _self_study(done))
    assert nb is not None
    assert [c.execution_count for c in nb.cells] == [1, 3, 4]


@pytest.mark.parametrize(
    "why, cells",
    [
        ("a build-only cell binds a name read later",
         [("xs = [1]", [], False), ("xs = [2]", ["remove-cell"], False),
          ("print(xs)", [], False)]),
        ("a later cell's augmented assignment reads the name first",
         [("xs = [1]", [], False), ("xs = [2]", ["remove-cell"], False),
          ("xs += [3]", [], False), ("xs = None", [], False)]),
        ("a build-only cell changes state otherwise",
         [("import jax", [], False),
          ("jax.config.update('jax_enable_x64', True)", ["remove-cell"], False),
          ("print(jax.numpy.ones(1).dtype)", [], False)]),
        ("a build-only cell writes into an object",
         [("d = {}", [], False), ("d['k'] = 1", ["remove-cell"], False),
          ("print(d)", [], False)]),
        ("a cell errored in the execution",
         [("x = 1", [], False), ("{}[x]", [], True)]),
        ("an error was allowed by the tag",
         [("x = 1", [], False), ("{}[x]", ["raises-exception"], False)]),
    ],
)  # fmt: skip
def test_run_all_is_run_when_the_execution_does_not_imply_it(why, cells):
    done = _executed(*cells)
    assert implied_run_all(done, _self_study(done)) is None, why


def test_run_all_is_run_when_the_notebook_differs_from_the_source():
    done = _executed(("x = 1", [], False), _GLUE)
    nb = _self_study(done)
    nb.cells[0].source = "x = 2"
    assert implied_run_all(done, nb) is None


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_an_execution_of_the_chapter_implies_its_self_study_run_all(source):
    """Where the chapter has a fresh execution (the book build's), it stands for the
    self-study notebook's Run all, so CI executes each chapter once: a build-only cell
    that changes state (or an execution record without execution counts) breaks that,
    and this names the chapter."""
    if fresh_executed_notebook(source) is None:
        pytest.skip("no fresh execution of the chapter: build the book first")
    assert run_all_implied_by_build(source.with_suffix(".ipynb")) is not None


@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_self_study_notebook_runs_all_to_the_last_cell(source):
    """The notebook the launch button opens, run as Colab's Run all does."""
    nb = run_all_cached(source.with_suffix(".ipynb"))
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)


# ------------------------------------------------------- notebooks speak to the reader
#
# Issue 34: a generated notebook is run by someone else, on another JAX and machine.
# The static checks below read the committed notebooks; the output checks read their
# executions (Run all with Colab's semantics, as above).

#: Wording that speaks of the reader's kernel: a sentence with it that quotes a value
#: of the build (marked ``†``) states the build's value as the reader's.
BUILD_AS_READERS = re.compile(
    r"\bthis kernel\b|\bon this machine\b|\bthis JAX \(|\bon this JAX\b"
    r"|\bthis JAX,|\bthe running JAX,? \d",
    re.I,
)
#: A glue line as the old runtime.glue printed it on Colab: ``name = value``, where
#: ``name`` is one of the chapter's glued names (a cell's own ``loss = 0.63`` print is
#: the chapter talking to its reader, not glue).
GLUE_LINE = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*) = \S", re.M)
#: Paths of the machine that executed the notebook, and ipykernel's cell file names.
MACHINE_PATH = re.compile(
    r"/root/|/work/|/home/\w+/|site-packages/|dist-packages/|ipykernel_\d+"
    r"|(?<![\w/.<])\d{6,}\.py:\d+"
)
RELATIVE_LINK = re.compile(r"!?\[[^\[\]]*\]\((?![a-zA-Z][\w+.-]*:|#)([^()\s]+)\)")


def _notebook_paths(source: Path) -> list[Path]:
    return [source.with_suffix(".ipynb"), book.student_path(source)]


def _prose(cell: dict) -> str:
    return book.CODE_SPAN.sub("", _source(cell))


def reader_problems(
    nb: dict, name: str, glued: frozenset[str] = frozenset()
) -> list[str]:
    """What a generated notebook shows its reader that was meant for the build
    (``glued``: the chapter's glued names, whose ``name = value`` lines are glue)."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        where = f"{name} cell {i}"
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "markdown":
            text = _prose(cell)
            found += [
                f"{where}: relative link {m}" for m in RELATIVE_LINK.findall(text)
            ]
            for sentence in re.split(r"(?<=[.:;!?])\s+", text.replace("\n", " ")):
                if BUILD_AS_READERS.search(sentence) and book.BUILD_MARK in sentence:
                    found.append(f"{where}: build's value as the reader's: {sentence}")
            continue
        if book.REMOVE_TAG in tags:
            found.append(f"{where}: build-only cell (remove-cell)")
        meta = cell.get("metadata", {})
        if "remove-input" in tags or (
            _source(cell).startswith(book.HIDDEN_CODE_TITLE)
            and meta.get("cellView") != "form"
        ):
            found.append(f"{where}: build code shown (remove-input, not a form)")
        for out in cell.get("outputs", []):
            text = out.get("text") or "".join(
                v if isinstance(v, str) else "".join(v)
                for k, v in out.get("data", {}).items()
                if k.startswith("text/")
            )
            text = text if isinstance(text, str) else "".join(text)
            if out.get("output_type") == "error":
                text = out.get("evalue", "")
            for m in GLUE_LINE.finditer(text):
                if m["name"] not in glued:
                    continue
                found.append(f"{where}: glue line {text[m.start() : m.end() + 20]!r}")
            for m in MACHINE_PATH.finditer(text):
                found.append(
                    f"{where}: path {text[max(0, m.start() - 40) : m.end() + 20]!r}"
                )
    return found


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_generated_notebooks_speak_to_the_reader(source):
    """No relative link, no build-only cell, no build code shown, no sentence stating
    the build's value as the reader's, in the committed notebooks."""
    problems = []
    for path in _notebook_paths(source):
        problems += reader_problems(json.loads(path.read_text()), path.name)
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_run_all_outputs_speak_to_the_reader(source):
    """The self-study notebook run as Colab's Run all does: no ``name = value`` glue
    line, no path of this machine, no ipykernel temp name in any output."""
    nb = run_all_cached(source.with_suffix(".ipynb"))
    problems = [
        p
        for p in reader_problems(
            json.loads(json.dumps(nb)), source.name, frozenset(book.glue_names(source))
        )
        if ": glue line" in p or ": path" in p
    ]
    assert not problems, "\n".join(problems)


def test_reader_problems_finds_each_kind():
    """The checker of the two tests above, on one notebook with each defect."""
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {},
             "source": "See [drift](../drift.md); `[x](y.md)` is code."},
            {"cell_type": "markdown", "metadata": {},
             "source": "This JAX (0.12.0.1†) accepts it; on this machine 3x†. "
                       "The cell records what this kernel does."},
            {"cell_type": "code", "metadata": {"tags": ["remove-cell"]},
             "source": "glue('a', 1)", "outputs": []},
            {"cell_type": "code", "metadata": {"tags": ["remove-input"]},
             "source": "x", "outputs": []},
            {"cell_type": "code", "metadata": {}, "source": "f()", "outputs": [
                {"output_type": "stream", "name": "stdout",
                 "text": "loss = 0.63\nbwd_flat = 4.99\n"},
                {"output_type": "stream", "name": "stderr",
                 "text": "at /usr/lib/python3/site-packages/jax/_src/x.py:3\n"
                         "TRACING CACHE MISS at 3738211955.py:9:11\n"},
            ]},
        ]
    }  # fmt: skip
    said = "\n".join(reader_problems(nb, "nb", frozenset({"bwd_flat"})))
    assert "relative link ../drift.md" in said and "y.md" not in said
    assert said.count("build's value as the reader's") == 2
    assert "build-only cell" in said and "build code shown" in said
    assert "glue line 'bwd_flat = 4.99" in said and "loss = 0.63" not in said
    assert "site-packages" in said and "3738211955.py:9" in said
