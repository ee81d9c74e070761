"""``requirements.txt``: uv.lock exported for pip users (Binder, a plain venv, Colab).

    pip install -r requirements.txt     # the lock's versions, this package editable
    jupyter-book build .                # then builds the book (chapters executed)

The file is generated, never edited: ``python3 dev.py sync`` rewrites it from uv.lock
with :data:`EXPORT` (``uv export``), and ``tests/test_workflows.py`` checks it is
current. It holds the package (``-e .``) with its ``chapters`` extra and the toolchain
(the ``dev`` group), each with the markers that pick Python 3.11's or 3.12's version.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = ROOT / "requirements.txt"
#: The arguments of ``uv export`` that make the file (its header repeats them).
EXPORT = (
    "export",
    "--locked",
    "--no-hashes",
    "--no-annotate",
    "--extra",
    "chapters",
    "--format",
    "requirements-txt",
    "--quiet",
)


def uv() -> str:
    """uv on PATH, else the one dev.py installed beside this environment's Python."""
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        raise SystemExit("uv is needed to export requirements.txt: pip install uv")
    return found


def exported() -> str:
    """What ``uv export`` makes of uv.lock now."""
    return subprocess.run(
        [uv(), *EXPORT],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout


def write() -> bool:
    """Rewrite requirements.txt from uv.lock; True if it changed."""
    text = exported()
    if PATH.exists() and PATH.read_text(encoding="utf-8") == text:
        return False
    PATH.write_text(text, encoding="utf-8")
    return True


if __name__ == "__main__":
    print("requirements.txt", "rewritten" if write() else "unchanged")
