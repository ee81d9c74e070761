"""Execute chapters outside the book build and read their error cells.

Convention for cells that must fail: the cell's first line is the cell magic
``%%raises ClassName`` (``beyondgrad.raises``, e.g. ``%%raises
jax.errors.TracerBoolConversionError``), which shows the error and lets the notebook go
on; a cell that raises another class, or nothing, stops the run. The tests check that
the executed cell raised exactly that class and that the prose just before the cell
names it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.book import (
    ROOT,
    build_dir,
    cached_execution,
    chapter_sources,
    expected_exception,
    raised_exception,
    solution_exercises,
    student_path,
)


def test_cache() -> Path:
    """Where executed chapters are kept between test runs (inside this environment's build)."""
    return build_dir() / "test_execute"


def _write_atomically(nb, path: Path) -> None:
    """Write ``nb`` so that a parallel test worker never reads half a file."""
    import os
    import tempfile

    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    os.replace(tmp, path)


def _newest_input_mtime(source: Path) -> float:
    package = max(
        p.stat().st_mtime for p in (ROOT / "src" / "beyondgrad").rglob("*.py")
    )
    return max(source.stat().st_mtime, package)


def execute(source: Path, timeout: int = 600):
    """Run a chapter top to bottom in a fresh kernel; return (notebook, seconds)."""
    import jupytext
    from nbclient import NotebookClient

    nb = jupytext.read(source)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(source.parent)}},
    )
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def executed_notebook(source: Path):
    """The executed chapter: the book build's (jupyter-cache) copy if fresh, else executed here."""
    import nbformat

    source = Path(source)
    newest = _newest_input_mtime(source)
    built = cached_execution(source)
    if built is not None and built[1] >= newest:
        return built[0]
    cache = test_cache()
    candidate = cache / f"{source.stem}.ipynb"
    if candidate.exists() and candidate.stat().st_mtime >= newest:
        return nbformat.read(candidate, as_version=4)
    nb, _ = execute(source)
    _write_atomically(nb, cache / f"{source.stem}.ipynb")
    return nb


def executed_student_notebook(source: Path, timeout: int = 600):
    """The chapter's student notebook run top to bottom in a fresh kernel, as a class would.

    Kept in the build folder until the notebook or the package changes. A cell that
    raises (other than an expected error inside a ``%%raises`` cell) stops the run (nbclient's
    ``CellExecutionError``, which names the cell and carries the traceback).
    """
    import nbformat
    from nbclient import NotebookClient

    student = student_path(Path(source))
    newest = max(_newest_input_mtime(Path(source)), student.stat().st_mtime)
    candidate = test_cache() / f"student-{student.name}"
    if candidate.exists() and candidate.stat().st_mtime >= newest:
        return nbformat.read(candidate, as_version=4)
    nb = nbformat.read(student, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(student.parent)}},
    )
    client.execute()
    _write_atomically(nb, candidate)
    return nb


@dataclass(frozen=True)
class ErrorCell:
    index: int
    expected: str | None  # class named on the "%%raises X" first line
    raised: str | None  # class the cell raised (tools.book.raised_exception), or None
    prose: str  # the markdown just before the cell


def error_cells(nb) -> list[ErrorCell]:
    """Every ``%%raises`` code cell, with what it should and did raise."""
    found = []
    prose = ""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            prose = cell.source
            continue
        if cell.cell_type != "code" or expected_exception(cell.source) is None:
            continue
        found.append(
            ErrorCell(
                index=i,
                expected=expected_exception(cell.source),
                raised=raised_exception(cell.get("outputs", [])),
                prose=prose,
            )
        )
    return found


def run_student_notebooks(sources: list[Path]) -> int:
    """Execute (or find fresh in the cache) the student notebook of each chapter with exercises."""
    worst = 0
    for source in sources:
        if not solution_exercises(source):
            continue
        t0 = time.perf_counter()
        try:
            executed_student_notebook(source)
        except Exception as e:  # the test (tests/test_notebooks.py) reports it in full
            print(
                f"[student] FAIL {student_path(source).name}: {type(e).__name__}: {str(e)[-500:]}",
                flush=True,
            )
            worst = 1
            continue
        print(
            f"[student] ok {student_path(source).name}: {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    return worst


def main(paths: list[str]) -> int:
    """Execute the given chapters (default: all) and print time and error-cell checks.

    With ``--student`` first, execute the chapters' student notebooks instead (kept in
    the build folder, where tests/test_notebooks.py finds them).
    """
    if paths[:1] == ["--student"]:
        return run_student_notebooks(
            [Path(p).resolve() for p in paths[1:]] or chapter_sources()
        )
    sources = [Path(p).resolve() for p in paths] or chapter_sources()
    worst = 0
    for source in sources:
        try:
            nb, seconds = execute(source)
        except Exception as e:  # report and go on with the next chapter
            print(f"FAIL {source.name}: {type(e).__name__}: {str(e)[-2000:]}")
            worst = 1
            continue
        bad = [
            c for c in error_cells(nb) if c.expected is None or c.raised != c.expected
        ]
        status = "ok" if not bad else "ERROR-CELLS"
        print(
            f"{status} {source.name}: {seconds:.1f} s, {len(error_cells(nb))} error cell(s)"
        )
        for c in bad:
            print(
                f"   cell {c.index}: expected {c.expected} (first line '%%raises X'), raised {c.raised}"
            )
        worst = max(worst, 1 if bad else 0)
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
