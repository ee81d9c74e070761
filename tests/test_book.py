"""The book's plumbing: paired notebooks, TOC, Colab links and the Colab install cell."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jupytext
import pytest
import yaml

from tools import book

SOURCES = book.chapter_sources()
IDS = [s.stem for s in SOURCES]


def code_cells(source: Path) -> list[str]:
    return [c.source for c in jupytext.read(source).cells if c.cell_type == "code"]


def test_there_are_chapters():
    assert SOURCES, "no chapters/*.md found"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_pair_in_sync_and_output_free(source):
    assert book.pair_problems(source) == []


def test_no_unpaired_notebooks():
    orphans = [p.name for p in book.CHAPTERS.glob("*.ipynb") if not p.with_suffix(".md").exists()]
    assert orphans == [], f"notebooks without a .md source: {orphans}"


def _toc_files() -> list[str]:
    toc = yaml.safe_load((book.ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [c["file"] for c in part.get("chapters", [])]
    return files


def test_toc_lists_every_chapter_and_only_existing_files():
    files = _toc_files()
    for f in files:
        assert any((book.ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb")), f"_toc.yml names missing {f}"
    for source in SOURCES:
        assert source.relative_to(book.ROOT).with_suffix("").as_posix() in files, f"{source.name} not in _toc.yml"


def test_book_builds_from_md_only():
    cfg = book.config()
    assert "chapters/*.ipynb" in cfg["exclude_patterns"], "the .ipynb twins must be excluded from the build"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_first_cell_is_the_generated_colab_install(source):
    assert code_cells(source)[0] == book.colab_install_cell()


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_second_cell_sets_up_runtime_and_describes(source):
    cell = code_cells(source)[1]
    assert "from beyondgrad import runtime" in cell
    assert "runtime.ensure_cpu_devices(" in cell
    assert cell.strip().splitlines()[-1] == "runtime.describe()"


@pytest.mark.parametrize("source", SOURCES, ids=IDS)
def test_colab_link_targets_an_existing_notebook(source):
    url, branch = book.repository()
    link = book.colab_url(source)
    org_repo = url.removeprefix("https://github.com/")
    prefix = f"https://colab.research.google.com/github/{org_repo}/blob/{branch}/"
    assert link.startswith(prefix)
    assert (book.ROOT / link.removeprefix(prefix)).exists()


def test_colab_url_rejects_non_github_repository(monkeypatch):
    monkeypatch.setattr(book, "repository", lambda: ("https://example.org/x/y", "main"))
    with pytest.raises(ValueError, match="github.com"):
        book.colab_url(SOURCES[0])


def _run_install_cell(monkeypatch) -> list[str]:
    """Execute the install cell as if on Colab, without beyondgrad; return pip's argv."""
    calls = []
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "beyondgrad" else real_find_spec(name, *a))
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    exec(book.colab_install_cell(), {})
    assert len(calls) == 1, "the cell must run exactly one pip install"
    return calls[0]


def test_install_cell_does_nothing_off_colab(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    exec(book.colab_install_cell(), {})
    assert calls == []


def test_install_cell_pins_every_installed_jax_package(monkeypatch):
    argv = _run_install_cell(monkeypatch)
    assert argv[1:4] == ["-m", "pip", "install"]
    forbidden = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I"}
    assert not forbidden & set(argv), f"install flags could replace jax: {argv}"
    assert not any(a.split("==")[0].split(">")[0].strip().lower() in {"jax", "jaxlib"} for a in argv)
    constraints = Path(argv[argv.index("--constraint") + 1]).read_text().split()
    installed = {
        f"{d.metadata['Name']}=={d.version}"
        for d in importlib.metadata.distributions()
        if d.metadata["Name"].lower().startswith(("jax", "libtpu"))
    }
    assert {"jax", "jaxlib"} <= {c.split("==")[0].lower() for c in constraints}
    assert set(constraints) == installed
    assert argv[-1] == book.package_spec()


def test_install_cell_resolution_keeps_jax(monkeypatch, tmp_path):
    """pip's own resolver, given the cell's arguments, installs no jax/jaxlib."""
    argv = _run_install_cell(monkeypatch)
    monkeypatch.undo()
    local = argv[:-1] + [f"{book.ROOT}[chapters]", "--dry-run", "--report", str(tmp_path / "r.json")]
    done = subprocess.run(local, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    names = {item["metadata"]["name"].lower() for item in report["install"]}
    assert "beyondgrad" in names
    assert not {n for n in names if n.startswith(("jax", "libtpu")) and n != "jaxtyping"}, names


def test_config_is_the_single_source_of_the_repository():
    url, branch = book.repository()
    assert url in book.package_spec() and branch in book.package_spec()
    cfg = book.config()
    assert cfg["launch_buttons"]["colab_url"] == book.COLAB
