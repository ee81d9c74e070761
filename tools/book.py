"""Repository tooling shared by dev.py, the Sphinx extension and the tests.

Single sources of truth: the repository URL and branch live in ``_config.yml``;
the supported JAX floor lives in ``pyproject.toml``. Everything here derives from them.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
COLAB = "https://colab.research.google.com"


def config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "_config.yml").read_text())


def repository() -> tuple[str, str]:
    """(URL, branch) of the book's repository, from ``_config.yml``."""
    repo = config()["repository"]
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def jax_floor() -> str:
    """The oldest supported JAX version, from the package's ``jax>=`` requirement."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
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
    """The first code cell of every chapter (generated; a test keeps chapters in sync)."""
    return f'''# On Colab: install the book's helper package. Colab's own JAX stays as it is: every
# installed jax* package is pinned with a pip constraint. Elsewhere this cell does nothing.
import importlib.metadata, importlib.util, subprocess, sys
if "google.colab" in sys.modules and importlib.util.find_spec("beyondgrad") is None:
    keep = sorted({{f"{{d.metadata['Name']}}=={{d.version}}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"].lower().startswith(("jax", "libtpu"))}})
    with open("/tmp/keep-colab-jax.txt", "w") as f:
        f.write("\\n".join(keep) + "\\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--constraint", "/tmp/keep-colab-jax.txt",
                    "{package_spec()}"], check=True)'''


def colab_url(source: Path) -> str:
    """Colab's URL for a chapter: the paired .ipynb on the configured branch."""
    url, branch = repository()
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if not m:
        raise ValueError(f"repository.url must be a https://github.com/ORG/REPO URL, got {url!r}")
    rel = source.with_suffix(".ipynb").resolve().relative_to(ROOT).as_posix()
    return f"{COLAB}/github/{m.group(1)}/{m.group(2)}/blob/{branch}/{rel}"


def cached_execution(source: Path):
    """(notebook, executed-at timestamp) of ``source`` from the book build's jupyter-cache.

    myst-nb writes ``_build/jupyter_execute/*.ipynb`` without outputs when it serves a
    page from its cache, so readers of executed outputs (the status page, the error-cell
    tests) look here. The cache matches on the code cells, so an edited chapter misses.
    Returns None when there is no matching record.
    """
    cache_dir = ROOT / "_build" / ".jupyter_cache"
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
    cached = [c for c in cache.get_cache_bundle(record.pk).nb.cells if c.cell_type == "code"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(cached) != len(code):
        return None
    for cell, done in zip(code, cached):
        cell.outputs = done.outputs
    return nb, record.created.timestamp()


def _cells(nb: dict) -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for c in nb["cells"]:
        src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        out.append((c["cell_type"], src.strip(), tuple(c.get("metadata", {}).get("tags", []))))
    return out


def md_to_notebook(source: Path) -> dict:
    """The output-free .ipynb that jupytext makes from a chapter's MyST source."""
    import jupytext

    nb = jupytext.read(source)
    for i, cell in enumerate(nb.cells):  # stable ids: a re-sync of an unchanged chapter is a no-op
        cell["id"] = f"cell-{i:03d}"
    nb.metadata.setdefault("jupytext", {})["formats"] = "ipynb,md:myst"
    nb.metadata["colab"] = {"provenance": []}
    return json.loads(jupytext.writes(nb, fmt="ipynb"))


def pair_problems(source: Path) -> list[str]:
    """Why ``source`` and its .ipynb are not a clean pair (empty list when they are)."""
    ipynb = source.with_suffix(".ipynb")
    if not ipynb.exists():
        return [f"{ipynb.name} is missing: run `python3 dev.py sync`"]
    nb = json.loads(ipynb.read_text())
    problems = []
    if any(c.get("outputs") or c.get("execution_count") for c in nb["cells"] if c["cell_type"] == "code"):
        problems.append(f"{ipynb.name} carries outputs: run `python3 dev.py sync`")
    if _cells(nb) != _cells(md_to_notebook(source)):
        problems.append(f"{ipynb.name} is out of sync with {source.name}: run `python3 dev.py sync`")
    return problems


def sync() -> list[Path]:
    """Rewrite every chapter's .ipynb from its MyST source; return the files changed."""
    changed = []
    for source in chapter_sources():
        ipynb = source.with_suffix(".ipynb")
        text = json.dumps(md_to_notebook(source), indent=1, ensure_ascii=False) + "\n"
        if not ipynb.exists() or ipynb.read_text() != text:
            ipynb.write_text(text)
            changed.append(ipynb)
    return changed


if __name__ == "__main__":
    for p in sync():
        print(f"wrote {p.relative_to(ROOT)}")
