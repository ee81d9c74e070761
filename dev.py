#!/usr/bin/env python3
"""Set up, build and test Beyond grad. Needs only Python 3.11+.

    python3 dev.py book        # install into .venv if needed, build the executed book (_build/html)
    python3 dev.py test        # install into .venv if needed, run the test suite
    python3 dev.py sync        # regenerate chapters/*.ipynb from their MyST sources
    python3 dev.py chapter chapters/01_tracers.md   # execute one chapter, report errors and time
    python3 dev.py page chapters/01_tracers.md      # build only that chapter as a book, with -W
    python3 dev.py drift [--versions ...]  # probes under every JAX of tools/drift.py (drift.md)

Options (before the command): --venv DIR (default .venv, or $BEYONDGRAD_VENV),
--jax VERSION|floor|newest (default newest, or $BEYONDGRAD_JAX), --force (book:
re-execute every notebook, ignoring the cache; always on when CI=true).
Re-running is fast: the environment is reinstalled only when requirements change.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from tools.book import jax_floor  # noqa: E402  (stdlib only)


def jax_requirements(spec: str) -> list[str]:
    if spec == "newest":
        return [f"jax>={jax_floor()}"]
    version = jax_floor() if spec == "floor" else spec
    return [f"jax=={version}", f"jaxlib=={version}"]


def venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env(env: Path, jax_spec: str) -> Path:
    """Create/refresh the virtual environment; skip when nothing it depends on changed."""
    if sys.version_info < (3, 11):
        sys.exit(f"Python 3.11+ is needed, this is {sys.version.split()[0]}")
    reqs = jax_requirements(jax_spec)
    # The venv keeps the Python it was created with; the stamp covers what is installed into it.
    stamp_text = "\n".join([*reqs, (ROOT / "requirements.txt").read_text(), (ROOT / "pyproject.toml").read_text()])
    stamp = hashlib.sha256(stamp_text.encode()).hexdigest()
    stamp_file = env / ".beyondgrad-stamp"
    py = venv_python(env)
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return py
    t0 = time.perf_counter()
    print(f"[dev] installing into {env} ({', '.join(reqs)}) ...", flush=True)
    if not py.exists():
        venv.create(env, with_pip=True, clear=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-U", "pip"], check=True)
    subprocess.run([*pip, "-r", str(ROOT / "requirements.txt"), *reqs], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    stamp_file.write_text(stamp)
    print(f"[dev] environment ready in {time.perf_counter() - t0:.0f} s", flush=True)
    return py


def run_env() -> dict[str, str]:
    env = dict(os.environ)
    # Several notebooks may share one GPU during a build: allocate on demand.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # This checkout's src/ first: a worktree or a plain clone runs its own package,
    # whatever the virtual environment has installed.
    paths = [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    return env


def cmd_book(py: Path, force: bool) -> int:
    build = ROOT / "_build"
    if force:
        for sub in ("html", ".jupyter_cache", "jupyter_execute", ".doctrees"):
            shutil.rmtree(build / sub, ignore_errors=True)
    t0 = time.perf_counter()
    rc = subprocess.run(
        [str(py.parent / "jupyter-book"), "build", str(ROOT), "-W", "-n", "--keep-going"], env=run_env()
    ).returncode
    print(f"[dev] book build exited {rc} after {time.perf_counter() - t0:.0f} s; open _build/html/index.html")
    return rc


def cmd_page(py: Path, paths: list[str]) -> int:
    """Build a small book of the given chapters only (for authors): same config, -W."""
    if not paths:
        sys.exit("dev.py page needs chapter files, e.g. chapters/01_tracers.md")
    stems = [Path(p).with_suffix("").as_posix() for p in paths]
    out = ROOT / "_build" / "pages" / "-".join(Path(s).name for s in stems)
    out.mkdir(parents=True, exist_ok=True)
    toc = out / "_toc.yml"
    # The first page is the root, so the intro (which links every chapter) stays out;
    # links from these pages to chapters outside the selection still warn.
    rest = [p for p in dict.fromkeys([*stems[1:], "glossary", "status"]) if p != stems[0]]
    entries = "\n".join(f"      - file: {s}" for s in rest)
    toc.write_text(f"format: jb-book\nroot: {stems[0]}\nparts:\n  - caption: Pages\n    chapters:\n{entries}\n")
    cmd = [str(py.parent / "jupyter-book"), "build", str(ROOT), "--toc", str(toc), "--path-output", str(out)]
    rc = subprocess.run([*cmd, "-W", "-n", "--keep-going"], env=run_env()).returncode
    print(f"[dev] page build exited {rc}; open {out}/_build/html/index.html")
    return rc


def cmd_test(py: Path, pytest_args: list[str]) -> int:
    rc = subprocess.run([str(py), "-m", "pytest", *pytest_args], cwd=ROOT, env=run_env()).returncode
    if rc == 5:  # pytest: no tests collected (e.g. a -k filter matched nothing)
        print("[dev] pytest collected no tests")
    return rc


def cmd_chapter(py: Path, paths: list[str]) -> int:
    code = "import sys; from tools.execute import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([str(py), "-c", code, *paths], cwd=ROOT, env=run_env()).returncode


def main(argv: list[str]) -> int:
    if argv[:1] == ["drift"]:  # maintainers: probes under many JAX versions, own venvs
        from tools.drift import main as drift_main

        return drift_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=os.environ.get("BEYONDGRAD_VENV", str(ROOT / ".venv")), help="virtual environment")
    ap.add_argument("--jax", default=os.environ.get("BEYONDGRAD_JAX", "newest"), help="newest (default), floor, or X.Y.Z")
    ap.add_argument("--force", action="store_true", help="book: re-execute every notebook")
    ap.add_argument("command", choices=["book", "test", "sync", "chapter", "page", "setup"])
    ap.add_argument("args", nargs=argparse.REMAINDER, help="pytest arguments (test) or chapter files (chapter)")
    ns = ap.parse_args(argv)
    py = ensure_env(Path(ns.venv).resolve(), ns.jax)
    if ns.command == "book":
        return cmd_book(py, ns.force or os.environ.get("CI") == "true")
    if ns.command == "test":
        return cmd_test(py, ns.args)
    if ns.command == "sync":
        return subprocess.run([str(py), "-m", "tools.book"], cwd=ROOT, env=run_env()).returncode
    if ns.command == "chapter":
        return cmd_chapter(py, ns.args)
    if ns.command == "page":
        return cmd_page(py, ns.args)
    return 0  # setup: environment only


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
