"""Executed chapters: where they are kept, when a kept copy is fresh, and executing one.

Imported by ``tools.book`` (glue records) and ``tools.execute`` (the tests' readers);
it imports neither, so the two do not import each other.

A kept execution is *fresh* for a chapter when it was computed from the chapter's code
cells, this package and these versions. Two ways to know:

* keyed (``dev.py`` names the cache in ``$BEYONDGRAD_EXEC_CACHE``): the cache folder is
  keyed on every installed version and the package's sources (``dev.py``'s
  ``caches``), so a copy in it is fresh when its code cells are the chapter's;
* otherwise (pytest run directly): a copy is fresh when it is newer than the chapter
  and every file of the package (modification times).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Environment variable naming the build folder (set by dev.py, one per environment).
BUILD_DIR_VARIABLE = "BEYONDGRAD_BUILD_DIR"
#: Environment variable naming the keyed execution cache (set by dev.py).
EXEC_CACHE_VARIABLE = "BEYONDGRAD_EXEC_CACHE"


def build_dir() -> Path:
    """The build folder of this environment: ``_build`` unless dev.py names another.

    Each JAX environment builds into its own folder (``dev.py`` sets
    ``BEYONDGRAD_BUILD_DIR``: ``_build`` for the newest JAX, ``_build-floor/_build`` for
    the floor), so that executed-notebook caches never cross from one JAX to another.
    """
    named = os.environ.get(BUILD_DIR_VARIABLE)
    return Path(named).resolve() if named else ROOT / "_build"


def keyed() -> bool:
    """Whether the build folder's caches are dev.py's keyed execution cache."""
    return bool(os.environ.get(EXEC_CACHE_VARIABLE, "").strip())


def test_cache() -> Path:
    """Where executed chapters are kept between test runs (inside this environment's
    build; dev.py links it to the keyed execution cache)."""
    return build_dir() / "test_execute"


def write_atomically(nb, path: Path) -> None:
    """Write ``nb`` so that a parallel test worker never reads half a file."""
    import tempfile

    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    os.replace(tmp, path)


def package_mtime() -> float:
    """The newest modification time of the package's files."""
    return max(p.stat().st_mtime for p in (ROOT / "src" / "beyondgrad").rglob("*.py"))


def code_of(nb) -> list[str]:
    """The sources of a notebook's code cells, in order."""
    return [c.source for c in nb.cells if c.cell_type == "code"]


def with_outputs_of(kept, nb):
    """``nb`` (a notebook as it is now) with the outputs of ``kept`` (a run of the same
    code cells, :func:`is_fresh`): a prose edit does not re-execute, and a reader of the
    result sees the prose as it is now, as in the book's cache."""
    ran = [c for c in kept.cells if c.cell_type == "code"]
    for cell, done in zip((c for c in nb.cells if c.cell_type == "code"), ran):
        cell.outputs = done.get("outputs", [])
        cell.execution_count = done.get("execution_count")
    return nb


def is_fresh(kept: Path | float, inputs: list[Path], same_code) -> bool:
    """Whether a kept execution (a file, or its timestamp) is fresh for ``inputs``:
    keyed, when ``same_code()`` (its code cells are the inputs'); else when newer than
    every input and the package."""
    if keyed():
        return bool(same_code())
    stamp = kept if isinstance(kept, float) else kept.stat().st_mtime
    return stamp >= max([package_mtime(), *(p.stat().st_mtime for p in inputs)])


def cached_execution(source: Path):
    """(notebook, executed-at timestamp) of ``source`` from the book build's jupyter-cache.

    myst-nb writes ``_build/jupyter_execute/*.ipynb`` without outputs when it serves a
    page from its cache, so readers of executed outputs (the status page, the error-cell
    tests) look here. The cache matches on the code cells, so an edited chapter misses.
    Returns None when there is no matching record.
    """
    cache_dir = build_dir() / ".jupyter_cache"
    if not cache_dir.exists():
        return None
    import jupytext
    from jupyter_cache import get_cache

    cache = get_cache(cache_dir)
    nb = jupytext.read(source)
    try:
        record = cache.match_cache_notebook(nb)
    except KeyError:
        return None
    # The cache keeps code cells and their outputs; the prose comes from the source.
    kept = cache.get_cache_bundle(record.pk).nb
    if len(code_of(kept)) != len(code_of(nb)):
        return None
    return with_outputs_of(kept, nb), record.created.timestamp()


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
    """The executed chapter if a fresh copy (module docstring) exists: the book build's
    (jupyter-cache, matched on code cells), the tests' or ``dev.py chapter``'s; else
    None."""
    import jupytext
    import nbformat

    source = Path(source)
    built = cached_execution(source)
    if built is not None and is_fresh(built[1], [source], lambda: True):
        return built[0]
    candidate = test_cache() / f"{source.stem}.ipynb"
    if not candidate.exists():
        return None
    kept = nbformat.read(candidate, as_version=4)
    nb = jupytext.read(source)
    same = lambda: code_of(kept) == code_of(nb)  # noqa: E731
    if not is_fresh(candidate, [source], same):
        return None
    return with_outputs_of(kept, nb)


def executed_notebook(source: Path):
    """The executed chapter: a fresh copy (:func:`fresh_executed_notebook`), else the
    chapter executed here (and kept in the build folder for the next caller)."""
    nb = fresh_executed_notebook(source)
    if nb is None:
        nb, _ = execute(Path(source))
        write_atomically(nb, test_cache() / f"{Path(source).stem}.ipynb")
    return nb
