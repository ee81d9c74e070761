"""Execute chapters outside the book build and read their error cells.

Convention for cells that must fail: the cell's first line is the cell magic
``%%raises ClassName`` (``beyondgrad.raises``, e.g. ``%%raises
jax.errors.TracerBoolConversionError``), which shows the error and lets the notebook go
on; a cell that raises another class, or nothing, stops the run. The tests check that
the executed cell raised exactly that class and that the prose just before the cell
names it.
"""

from __future__ import annotations

import ast
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tools.book import (
    REMOVE_TAG,
    ROOT,
    chapter_sources,
    expected_exception,
    only_imports,
    raised_exception,
    solution_exercises,
    student_path,
)
from tools.executed import (  # noqa: F401  (execute, test_cache: the tests' readers)
    code_of,
    execute,
    executed_notebook,
    fresh_executed_notebook,
    is_fresh,
    test_cache,
    with_outputs_of,
    write_atomically,
)


class RunAllStopped(AssertionError):
    """*Run all* stopped before the notebook's last cell."""


def _without_raises_tags(nb):
    """``nb`` with every ``raises-exception`` tag stripped (Colab ignores the tag)."""
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags")
        if tags and "raises-exception" in tags:
            cell.metadata["tags"] = [t for t in tags if t != "raises-exception"]
    return nb


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
    nb = _without_raises_tags(nbformat.read(path, as_version=4))
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


#: What a build-only cell may call at its top level and still be inert for Run all.
_INERT_CALLS = {"glue", "print", "display"}
_LINE_MAGIC = re.compile(r"^(\s*)%+\w+\s?(.*)$")


def _python_of(cell_source: str) -> ast.Module | None:
    """The Python of a code cell: a ``%%magic`` line dropped (its body is Python here:
    ``%%raises``), ``%magic args`` read as ``args``, shell lines dropped."""
    lines = cell_source.splitlines()
    if lines and lines[0].startswith("%%"):
        lines = lines[1:]
    body = []
    for ln in lines:
        if ln.lstrip().startswith("!"):
            continue
        m = _LINE_MAGIC.match(ln)
        body.append(f"{m.group(1)}{m.group(2)}" if m else ln)
    try:
        return ast.parse("\n".join(body))
    except SyntaxError:
        return None


def _locally_bound(stmt: ast.AST) -> set[str]:
    """Names bound inside scopes nested in ``stmt`` (comprehension targets, arguments and
    assignments of functions and lambdas): their loads there do not read the kernel's."""
    names: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.comprehension):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    names.add(arg.arg)
            if not isinstance(node, ast.Lambda):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        names.add(sub.id)
    return names


def _free_loads(stmt: ast.stmt) -> set[str]:
    """Names ``stmt`` may read from the kernel (a ``for`` target is bound before its
    body; an augmented assignment reads its target)."""

    def loads(nodes: list) -> set[str]:
        found = {
            n.id
            for node in nodes
            for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        }
        # ``x += 1`` reads x, though its target is stored
        found |= {
            n.target.id
            for node in nodes
            for n in ast.walk(node)
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
        }
        return found - set().union(*(_locally_bound(node) for node in nodes))

    if isinstance(stmt, ast.For):
        target = {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
        return loads([stmt.iter]) | (loads([*stmt.body, *stmt.orelse]) - target)
    return loads([stmt])


def _binds(stmt: ast.stmt) -> set[str]:
    """Names a statement binds by itself: imports, definitions, and the plain names
    among assignment targets (``a[i] = x`` binds nothing; ``for``/``if`` bodies are
    not looked into)."""
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {stmt.name}
    if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {
            n.id
            for t in targets
            for n in ast.walk(t)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
        }
    return set()


def _top_level_binds(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement always rebinds without reading them first (an
    augmented assignment reads its target; a ``for`` may not run)."""
    return set() if isinstance(stmt, ast.AugAssign) else _binds(stmt)


def _read_before_bound(names: set[str], later_cells: list[str]) -> bool:
    """Whether a later cell may read one of ``names`` before rebinding it (walked in
    order, statement by statement; a name rebound at a cell's top level is no longer
    watched; a cell that is not Python counts as reading everything)."""
    watched = set(names)
    for source in later_cells:
        if not watched:
            return False
        tree = _python_of(source)
        if tree is None:
            return True
        for stmt in tree.body:
            if _free_loads(stmt) & watched:
                return True
            watched -= _top_level_binds(stmt)
    return False


def _bound_names(node: ast.AST) -> set[str] | None:
    """Names a build-only statement binds, or None if it may change kernel state
    otherwise (anything but imports, assignments to names, asserts, calls of
    :data:`_INERT_CALLS`, and ``for``/``if`` made of those)."""
    if isinstance(node, ast.Assert):
        return set()
    if isinstance(node, ast.Expr):
        call = node.value
        ok = isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
        return set() if ok and call.func.id in _INERT_CALLS else None  # type: ignore[union-attr]
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        writes_into = (ast.Attribute, ast.Subscript, ast.Starred)
        if any(isinstance(sub, writes_into) for t in targets for sub in ast.walk(t)):
            return None  # writes into an object a later cell may read
        return _binds(node)
    if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef):
        return _binds(node)
    if isinstance(node, ast.For | ast.If):
        names = set()
        if isinstance(node, ast.For):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        for child in [*node.body, *node.orelse]:
            inner = _bound_names(child)
            if inner is None:
                return None
            names |= inner
        return names
    return None


def _code_lines(source: str) -> list[str]:
    """A code cell's lines without full-line comments (the self-study notebook retitles
    each solution's first comment line as a Colab form title)."""
    return [ln for ln in source.splitlines() if not ln.lstrip().startswith("#")]


def run_all_implied_by_build(path: Path):
    """The self-study notebook's *Run all*, read from an execution of its source, or None.

    ``chapters/X.ipynb`` is ``chapters/X.md`` with the build-only cells (tagged
    ``remove-cell``) left out and each solution's first comment line retitled. The book
    build and ``dev.py chapter`` execute ``X.md`` top to bottom with ``allow_errors``
    off; so when (1) a fresh execution of ``X.md`` exists (:func:`fresh_executed_notebook`)
    in which every code cell ran and none shows an error, (2) no cell carries the
    ``raises-exception`` tag, (3) the notebook's code cells are the source's in order,
    less the build-only ones (a cell that only imports is kept), and (4) every left-out cell is inert (it only imports,
    assigns names, asserts, glues or prints: :func:`_bound_names`) and binds no name
    that a later kept cell mentions, then *Run all* of the notebook runs the same code
    in the same order with the same state, and its outcome is that execution's.
    Otherwise None, and the caller runs the notebook (:func:`run_all`).
    """
    import nbformat

    path = Path(path).resolve()
    source = path.with_suffix(".md")
    if path.parent != ROOT / "chapters" or not source.exists():
        return None
    done = fresh_executed_notebook(source)
    if done is None:
        return None
    return implied_run_all(done, nbformat.read(path, as_version=4))


def implied_run_all(done, nb):
    """``nb`` (a self-study notebook) with the outputs of ``done`` (an execution of its
    source with ``allow_errors`` off) if that execution implies *Run all* of ``nb``
    (conditions 1-4 of :func:`run_all_implied_by_build`), else None."""
    ran = [c for c in done.cells if c.cell_type == "code"]
    for c in ran:
        tags = c.get("metadata", {}).get("tags", [])
        if "raises-exception" in tags or not c.get("execution_count"):
            return None
        if any(o.get("output_type") == "error" for o in c.get("outputs", [])):
            return None
    mine = [c for c in nb.cells if c.cell_type == "code"]
    kept, left_out = [], []
    for k, c in enumerate(ran):
        tags = c.get("metadata", {}).get("tags", [])
        build_only = REMOVE_TAG in tags and not only_imports(c.source)
        (left_out if build_only else kept).append((k, c))
    if len(kept) != len(mine) or any(
        _code_lines(c.source) != _code_lines(m.source) for (_, c), m in zip(kept, mine)
    ):
        return None
    for k, c in left_out:
        try:
            body = ast.parse(c.source).body
        except SyntaxError:
            return None
        bound: set[str] = set()
        for node in body:
            names = _bound_names(node)
            if names is None:
                return None
            bound |= names
        if _read_before_bound(bound, [kc.source for j, kc in kept if j > k]):
            return None
    for (_, c), m in zip(kept, mine):
        m.outputs = c.get("outputs", [])
        m.execution_count = c.get("execution_count")
    return nb


def run_all_cached(path: Path, timeout: int = 600):
    """:func:`run_all` of a generated notebook, kept in the build folder until the
    notebook's code, the package or a version changes (``tools.executed.is_fresh``) (each notebook runs once per environment); a
    self-study notebook whose Run all the book build already performed
    (:func:`run_all_implied_by_build`) is not run again."""
    import nbformat

    path = Path(path).resolve()
    rel = path.relative_to(ROOT).as_posix().replace("/", "__")
    candidate = test_cache() / "run_all" / rel
    if candidate.exists():
        kept = nbformat.read(candidate, as_version=4)
        now = _without_raises_tags(nbformat.read(path, as_version=4))
        if is_fresh(candidate, [path], lambda: code_of(kept) == code_of(now)):
            return with_outputs_of(kept, now)
    nb = run_all_implied_by_build(path)
    if nb is not None:  # the book build's execution already was this Run all
        return nb
    nb = run_all(path, timeout)
    write_atomically(nb, candidate)
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
        write_atomically(nb, test_cache() / f"{source.stem}.ipynb")
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
