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


def fresh_executed_notebook(source: Path):
    """The executed chapter if a copy newer than the chapter and the package exists: the
    book build's (jupyter-cache), the tests' or ``dev.py chapter``'s; else None."""
    import nbformat

    source = Path(source)
    newest = _newest_input_mtime(source)
    built = cached_execution(source)
    if built is not None and built[1] >= newest:
        return built[0]
    candidate = test_cache() / f"{source.stem}.ipynb"
    if candidate.exists() and candidate.stat().st_mtime >= newest:
        return nbformat.read(candidate, as_version=4)
    return None


def executed_notebook(source: Path):
    """The executed chapter: a fresh copy (:func:`fresh_executed_notebook`), else the
    chapter executed here (and kept in the build folder for the next caller)."""
    nb = fresh_executed_notebook(source)
    if nb is None:
        nb, _ = execute(Path(source))
        _write_atomically(nb, test_cache() / f"{Path(source).stem}.ipynb")
    return nb


class RunAllStopped(AssertionError):
    """*Run all* stopped before the notebook's last cell."""


def run_all(path: Path, timeout: int = 600):
    """Execute the notebook at ``path`` as Colab's *Runtime > Run all* does; return it.

    A fresh kernel in the notebook's folder, every cell in order, no ``allow_errors``,
    and every ``raises-exception`` tag stripped (Colab ignores the tag), so the first
    exception stops the run: :class:`RunAllStopped` then names the cell and the error.
    A deliberate error inside a ``%%raises`` cell is caught by the magic and goes on.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        if tags and "raises-exception" in tags:
            cell.metadata["tags"] = [t for t in tags if t != "raises-exception"]
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    except CellExecutionError as e:
        raise RunAllStopped(stopped_at(nb, path, e)) from None
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    if code and nb.cells[code[-1]].get("execution_count") is None:
        raise RunAllStopped(f"{path.name}: Run all did not reach the last code cell")
    return nb


def stopped_at(nb, path: Path, error: Exception) -> str:
    """Where and why *Run all* stopped: cell number, its first lines, the error."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    for k, i in enumerate(code, start=1):
        errors = [
            o for o in nb.cells[i].get("outputs", []) if o.get("output_type") == "error"
        ]
        if errors:
            head = "\n    ".join(nb.cells[i].source.splitlines()[:4])
            return (
                f"{path.name}: Run all stopped at cell {i} (code cell {k} of "
                f"{len(code)}) with {errors[0]['ename']}: "
                f"{str(errors[0]['evalue'])[:500]}\n    {head}"
            )
    return f"{path.name}: Run all stopped: {str(error)[-1500:]}"


def run_all_cached(path: Path, timeout: int = 600):
    """:func:`run_all` of a generated notebook, kept in the build folder until the
    notebook or the package changes (each notebook runs once per environment)."""
    import nbformat

    path = Path(path).resolve()
    newest = max(
        path.stat().st_mtime,
        max(p.stat().st_mtime for p in (ROOT / "src" / "beyondgrad").rglob("*.py")),
    )
    rel = path.relative_to(ROOT).as_posix().replace("/", "__")
    candidate = test_cache() / "run_all" / rel
    if candidate.exists() and candidate.stat().st_mtime >= newest:
        return nbformat.read(candidate, as_version=4)
    nb = run_all(path, timeout)
    _write_atomically(nb, candidate)
    return nb


def executed_student_notebook(source: Path, timeout: int = 600):
    """The chapter's student notebook run with *Run all* semantics, as a class would
    (:func:`run_all_cached`)."""
    return run_all_cached(student_path(Path(source)), timeout)


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
        # kept for the tests and for `dev.py sync` (the glued values)
        _write_atomically(nb, test_cache() / f"{source.stem}.ipynb")
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
