"""Repository tooling shared by dev.py, the Sphinx extension and the tests.

Single sources of truth: the repository URL and branch live in ``_config.yml``;
the supported JAX floor lives in ``pyproject.toml``. Everything here derives from them.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
COLAB = "https://colab.research.google.com"
#: The first line of a cell that must fail: the cell magic ``%%raises ClassName``
#: (``beyondgrad.raises``; a dotted path is allowed, e.g.
#: ``%%raises jax.errors.TracerBoolConversionError``).
RAISES = re.compile(r"%%raises\s+([A-Za-z_][\w.]*)\s*")
#: The first line the magic prints when the cell raised the class it names.
RAISED_AS_EXPECTED = re.compile(r"([A-Za-z_]\w*) raised, as expected\b")
#: Environment variable naming the build folder (set by dev.py, one per environment).
BUILD_DIR_VARIABLE = "BEYONDGRAD_BUILD_DIR"


def expected_exception(cell_source: str) -> str | None:
    """The class a deliberate-error cell names on its first line, or None.

    The one parser of the ``%%raises ClassName`` convention (the chapter tests, the
    accelerator run and dev.py's chapter command all use it). Returns the bare class
    name (``TracerBoolConversionError`` for
    ``%%raises jax.errors.TracerBoolConversionError``), which is what the magic prints
    first when the cell raised that class.
    """
    lines = cell_source.strip().splitlines()
    m = RAISES.fullmatch(lines[0].strip()) if lines else None
    return m.group(1).rsplit(".", 1)[-1] if m else None


def raised_exception(outputs: list) -> str | None:
    """The class an executed cell raised: the ``%%raises`` magic's report (on stderr)
    of an expected error, else the ``ename`` of an error output, else None."""
    for out in outputs:
        if out.get("output_type") == "error":
            return out.get("ename")
        if out.get("output_type") == "stream":
            m = RAISED_AS_EXPECTED.match(out.get("text", ""))
            if m:
                return m.group(1)
    return None


def build_dir() -> Path:
    """The build folder of this environment: ``_build`` unless dev.py names another.

    Each JAX environment builds into its own folder (``dev.py`` sets
    ``BEYONDGRAD_BUILD_DIR``: ``_build`` for the newest JAX, ``_build-floor/_build`` for
    the floor), so that executed-notebook caches never cross from one JAX to another.
    """
    named = os.environ.get(BUILD_DIR_VARIABLE)
    return Path(named).resolve() if named else ROOT / "_build"


def config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "_config.yml").read_text())


def repository() -> tuple[str, str]:
    """(URL, branch) of the book's repository, from ``_config.yml``."""
    repo = config()["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def jax_floor() -> str:
    """The oldest supported JAX version, from the package's ``jax>=`` requirement."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    for dep in deps:
        m = re.fullmatch(r"jax\s*>=\s*([0-9.]+)", dep.strip())
        if m:
            return m.group(1)
    raise RuntimeError("pyproject.toml has no 'jax>=X' dependency")


def chapter_sources() -> list[Path]:
    """The MyST sources of the chapters (each paired with an .ipynb)."""
    return sorted(CHAPTERS.glob("*.md"))


def package_spec() -> str:
    url, branch = repository()
    return f"beyondgrad[chapters] @ git+{url}@{branch}"


def colab_install_cell() -> str:
    """The first code cell of every chapter (generated; a test keeps chapters in sync).

    ``python3 dev.py sync`` writes it into each chapter's source (:func:`sync_install_cell`).
    Every line fits 88 columns, like every other code line of the book.
    """
    url, branch = repository()
    return f"""# On Colab: install the book's helper package. Colab's own JAX stays as it is:
# every installed jax* package is pinned with a pip constraint. Elsewhere this cell
# does nothing.
import importlib.metadata, importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("beyondgrad") is None:
    keep = sorted({{
        f"{{d.metadata['Name']}}=={{d.version}}"
        for d in importlib.metadata.distributions()
        if d.metadata["Name"].lower().startswith(("jax", "libtpu"))
    }})
    with open("/tmp/keep-colab-jax.txt", "w") as f:
        f.write("\\n".join(keep) + "\\n")
    repo = "git+{url}@{branch}"
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    pip += ["--constraint", "/tmp/keep-colab-jax.txt"]
    subprocess.run([*pip, f"beyondgrad[chapters] @ {{repo}}"], check=True)"""


def sync_install_cell(source: Path) -> bool:
    """Make the chapter's first code cell the generated install cell; True if changed.

    Only that cell's text is replaced in the MyST source; the rest is left as written.
    """
    import jupytext

    code = [c for c in jupytext.read(source).cells if c.cell_type == "code"]
    want = colab_install_cell()
    if not code or code[0].source == want or "google.colab" not in code[0].source:
        return (
            False  # no install cell to update (tests/test_book.py says what is missing)
        )
    text = source.read_text()
    if code[0].source not in text:
        return False
    source.write_text(text.replace(code[0].source, want, 1))
    return True


def _github_org_repo() -> tuple[str, str]:
    url, _ = repository()
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if not m:
        raise ValueError(
            f"repository.url must be a https://github.com/ORG/REPO URL, got {url!r}"
        )
    return m.group(1), m.group(2)


def _colab_url_of(notebook: Path) -> str:
    org, repo = _github_org_repo()
    _, branch = repository()
    rel = Path(notebook).resolve().relative_to(ROOT).as_posix()
    return f"{COLAB}/github/{org}/{repo}/blob/{branch}/{rel}"


def colab_url(source: Path) -> str:
    """Colab's URL for a chapter: its self-study .ipynb on the configured branch."""
    return _colab_url_of(Path(source).with_suffix(".ipynb"))


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
    cached = [
        c for c in cache.get_cache_bundle(record.pk).nb.cells if c.cell_type == "code"
    ]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(cached) != len(code):
        return None
    for cell, done in zip(code, cached):
        cell.outputs = done.outputs
    return nb, record.created.timestamp()


# --------------------------------------------------------------------------- notebook sets
#
# From each chapter's MyST source (the one source) two output-free notebook sets are
# generated, both committed and kept in sync by ``python3 dev.py sync``:
#
# * the self-study set, ``chapters/NN_name.ipynb`` (the launch button opens it): every
#   cell, with each solution cell turned into a Colab form (first line ``#@title``,
#   ``"cellView": "form"`` in the cell's metadata), which Colab shows collapsed to its
#   title; ``jupyter.source_hidden`` collapses it in JupyterLab too;
# * the student set, ``notebooks/student/NN_name.ipynb`` (for a class): every solution
#   cell replaced by a one-line pointer to the solution in the online book.
#
# A solution cell carries the tag ``solution`` and its first line is
# ``# Solution to exercise N.k``.

SOLUTION_TAG = "solution"
SOLUTION_LINE = re.compile(r"#\s*Solution to exercise\s+(\d+\.\d+)\s*")
STUDENT_DIR = ROOT / "notebooks" / "student"
#: Markdown cells that only announce the solution cell after them (dropped with it).
SOLUTION_HEADINGS = ("**Solution**", "**Solution:**", "Solution", "Solution:")


def solution_exercise(cell_source: str) -> str:
    """``"N.k"`` from a solution cell's first line ``# Solution to exercise N.k``.

    Raises ValueError naming the expected first line when the cell does not start so.
    """
    lines = cell_source.strip().splitlines()
    m = SOLUTION_LINE.fullmatch(lines[0].strip()) if lines else None
    if not m:
        first = lines[0] if lines else "(empty cell)"
        raise ValueError(
            f"a cell tagged {SOLUTION_TAG!r} must start with '# Solution to exercise N.k' "
            f"(e.g. '# Solution to exercise 1.2'); this one starts with {first!r}"
        )
    return m.group(1)


def is_solution(cell) -> bool:
    return cell.get("cell_type") == "code" and SOLUTION_TAG in cell.get(
        "metadata", {}
    ).get("tags", [])


def html_base_url() -> str:
    """The online book's address: GitHub Pages of the repository in ``_config.yml``.

    ``.github/workflows/publish.yml`` publishes the book there. ``html.baseurl`` in
    ``_config.yml``, when set, takes precedence (a custom domain).
    """
    base = (config().get("html") or {}).get("baseurl")
    if base:
        return base.rstrip("/") + "/"
    org, repo = _github_org_repo()
    return f"https://{org.lower()}.github.io/{repo}/"


def page_url(source: Path) -> str:
    """The chapter's page in the online book."""
    rel = Path(source).resolve().relative_to(ROOT).with_suffix(".html").as_posix()
    return html_base_url() + rel


def student_path(source: Path) -> Path:
    """The student notebook of a chapter: ``notebooks/student/NN_name.ipynb``."""
    return STUDENT_DIR / Path(source).with_suffix(".ipynb").name


def student_colab_url(source: Path) -> str:
    """Colab's URL for the chapter's student notebook."""
    return _colab_url_of(student_path(source))


def solution_pointer(source: Path, exercise: str) -> str:
    """The one-line markdown cell that stands for a solution in the student notebook."""
    return (
        f"**Solution to exercise {exercise}:** in the online book, under "
        f"[the chapter's exercises]({page_url(source)}#exercises) "
        "(open *Show code cell source* below the exercise)."
    )


def _read_chapter(source: Path):
    import jupytext

    nb = jupytext.read(source)
    for i, cell in enumerate(
        nb.cells
    ):  # stable ids: a re-sync of an unchanged chapter is a no-op
        cell["id"] = f"cell-{i:03d}"
    nb.metadata.setdefault("jupytext", {})["formats"] = "ipynb,md:myst"
    nb.metadata["colab"] = {"provenance": []}
    return nb


def _as_json(nb) -> dict:
    import jupytext

    return json.loads(jupytext.writes(nb, fmt="ipynb"))


def md_to_notebook(source: Path) -> dict:
    """The self-study notebook: every cell of the chapter, solutions as Colab forms."""
    nb = _read_chapter(source)
    for cell in nb.cells:
        if not is_solution(cell):
            continue
        exercise = solution_exercise(cell.source)
        body = cell.source.strip().splitlines()[1:]
        cell.source = "\n".join([f"#@title Solution to exercise {exercise}", *body])
        cell.metadata["cellView"] = "form"
        cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    return _as_json(nb)


def student_notebook(source: Path) -> dict:
    """The student notebook: the chapter with every solution cell replaced by a pointer."""
    import nbformat

    nb = _read_chapter(source)
    cells = []
    for cell in nb.cells:
        if not is_solution(cell):
            cells.append(cell)
            continue
        if (
            cells
            and cells[-1].cell_type == "markdown"
            and cells[-1].source.strip() in SOLUTION_HEADINGS
        ):
            cells.pop()  # the "**Solution**" line announcing the cell: the pointer says it
        pointer = nbformat.v4.new_markdown_cell(
            solution_pointer(source, solution_exercise(cell.source))
        )
        pointer["id"] = cell["id"]
        cells.append(pointer)
    nb.cells = cells
    # jupytext's pairing would write a student notebook back over the chapter's source
    nb.metadata.pop("jupytext", None)
    return _as_json(nb)


def solution_exercises(source: Path) -> list[str]:
    """The exercise numbers (``"N.k"``) of the chapter's solution cells, in order."""
    return [
        solution_exercise(c.source)
        for c in _read_chapter(source).cells
        if is_solution(c)
    ]


def notebook_sets(source: Path) -> dict[Path, dict]:
    """Every generated notebook of a chapter: {path: notebook JSON}."""
    return {
        source.with_suffix(".ipynb"): md_to_notebook(source),
        student_path(source): student_notebook(source),
    }


def _cells(nb: dict) -> list[tuple[str, str, str]]:
    out = []
    for c in nb["cells"]:
        src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        meta = json.dumps(c.get("metadata", {}), sort_keys=True)
        out.append((c["cell_type"], src.strip(), meta))
    return out


def pair_problems(source: Path) -> list[str]:
    """Why ``source`` and its generated notebooks are not in sync (empty list when they are)."""
    problems = []
    for path, want in notebook_sets(source).items():
        name = path.relative_to(ROOT).as_posix()
        if not path.exists():
            problems.append(f"{name} is missing: run `python3 dev.py sync`")
            continue
        nb = json.loads(path.read_text())
        if any(
            c.get("outputs") or c.get("execution_count")
            for c in nb["cells"]
            if c["cell_type"] == "code"
        ):
            problems.append(f"{name} carries outputs: run `python3 dev.py sync`")
        if _cells(nb) != _cells(want):
            problems.append(
                f"{name} is out of sync with {source.name}: run `python3 dev.py sync`"
            )
    return problems


def sync() -> list[Path]:
    """Rewrite every chapter's install cell and its two notebooks; return the files changed."""
    changed = []
    for source in chapter_sources():
        if sync_install_cell(source):
            changed.append(source)
        for path, nb in notebook_sets(source).items():
            text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
            if not path.exists() or path.read_text() != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                changed.append(path)
    return changed


if __name__ == "__main__":
    for p in sync():
        print(f"wrote {p.relative_to(ROOT)}")
