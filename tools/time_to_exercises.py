"""Time a student notebook's teaching path: execute its code cells up to the Exercises
heading (the first markdown cell with a line ``## Exercises`` or ``### Exercise``) in a
fresh kernel, and print the wall seconds. The instructor guide budgets these numbers.

    PYTHONPATH=src .venv/bin/python tools/time_to_exercises.py notebooks/student/0*.ipynb
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HEADING = re.compile(r"^#{2,3} Exercises?\b", re.M)


def teaching_path(path: Path) -> nbformat.NotebookNode:
    """The notebook cut before its Exercises heading (all of it if it has none)."""
    nb = nbformat.read(path, as_version=4)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and HEADING.search(cell.source):
            nb.cells = nb.cells[:k]
            break
    return nb


def main(paths: list[str]) -> None:
    for name in paths:
        nb = teaching_path(Path(name))
        cells = sum(c.cell_type == "code" for c in nb.cells)
        start = time.perf_counter()
        NotebookClient(nb, timeout=600, kernel_name="python3").execute()
        took = time.perf_counter() - start
        print(
            f"{name}: {cells} code cells before the exercises, {took:.0f} s", flush=True
        )


if __name__ == "__main__":
    main(sys.argv[1:])
