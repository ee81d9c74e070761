"""The book's plumbing: paired notebooks, TOC, Colab links and the Colab install cell."""

import importlib.metadata
import importlib.util
import json
import re
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
    orphans = [
        p.name
        for p in book.CHAPTERS.glob("*.ipynb")
        if not p.with_suffix(".md").exists()
    ]
    orphans += [
        p.relative_to(book.ROOT).as_posix()
        for p in book.STUDENT_DIR.glob("*.ipynb")
        if not (book.CHAPTERS / p.with_suffix(".md").name).exists()
    ]
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
        assert any(
            (book.ROOT / f).with_suffix(s).exists() for s in (".md", ".ipynb")
        ), f"_toc.yml names missing {f}"
    for source in SOURCES:
        assert source.relative_to(book.ROOT).with_suffix("").as_posix() in files, (
            f"{source.name} not in _toc.yml"
        )


def test_book_builds_from_md_only():
    cfg = book.config()
    assert "chapters/*.ipynb" in cfg["exclude_patterns"], (
        "the .ipynb twins must be excluded from the build"
    )


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


class _Dist:
    """A preinstalled distribution as importlib.metadata lists it (name, version)."""

    def __init__(self, name: str, version: str):
        self.metadata, self.version = {"Name": name}, version


def _run_install_cell(monkeypatch, preinstalled=()) -> list[str]:
    """Execute the install cell as if on Colab, without beyondgrad, with the
    distributions ``preinstalled`` listed before this environment's; return pip's argv."""
    calls = []
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "beyondgrad" else real_find_spec(name, *a),
    )
    real_distributions = importlib.metadata.distributions
    monkeypatch.setattr(
        importlib.metadata,
        "distributions",
        lambda: [*(_Dist(*d) for d in preinstalled), *real_distributions()],
    )
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    exec(book.colab_install_cell(), {})
    assert len(calls) == 1, "the cell must run exactly one pip install"
    return calls[0]


def test_install_cell_does_nothing_off_colab(monkeypatch):
    calls = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: calls.append(argv))
    exec(book.colab_install_cell(), {})
    assert calls == []


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_install_cell_pins_every_installed_package(monkeypatch):
    argv = _run_install_cell(monkeypatch)
    assert argv[1:4] == ["-m", "pip", "install"]
    forbidden = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I"}
    assert not forbidden & set(argv), f"install flags could replace a package: {argv}"
    constraints = Path(argv[argv.index("--constraint") + 1]).read_text().split()
    installed = {
        _normal(d.metadata["Name"]): d.version
        for d in reversed(list(importlib.metadata.distributions()))
        if d.metadata["Name"]
    }
    assert {"jax", "jaxlib", "ipywidgets"} <= {c.split("==")[0] for c in constraints}
    assert dict(c.split("==", 1) for c in constraints) == installed
    url, branch = book.repository()
    assert argv[argv.index("--constraint") + 2] == f"beyondgrad @ git+{url}@{branch}"


def test_install_cell_keeps_an_older_preinstalled_extra(monkeypatch, capsys):
    """Colab's ipywidgets 7.7.1 (older than the extra's floor) is pinned, not asked
    for, and the reader is told; the other extras are asked for at their floors."""
    argv = _run_install_cell(monkeypatch, [("ipywidgets", "7.7.1")])
    constraints = Path(argv[argv.index("--constraint") + 1]).read_text().split()
    assert "ipywidgets==7.7.1" in constraints
    asked = argv[argv.index("--constraint") + 3 :]
    assert not [a for a in asked if a.startswith("ipywidgets")]
    extra = book.chapters_extra()
    assert sorted(asked) == sorted(
        f"{n}>={v}" for n, v in extra.items() if n != "ipywidgets"
    )
    said = capsys.readouterr().out
    assert "Keeping Colab's ipywidgets 7.7.1" in said and extra["ipywidgets"] in said


def _fake_runtime(tmp_path: Path, dists: dict[str, str]) -> Path:
    """A folder of dist-info records that, first on sys.path, makes Python and pip
    see these distributions as installed (a runtime's preinstalled packages)."""
    site = tmp_path / "preinstalled"
    for name, version in dists.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        (info / "RECORD").write_text("")
        (info / "INSTALLER").write_text("pip\n")
    return site


_SIMULATE = """
import importlib.util, subprocess, sys, types
sys.modules["google.colab"] = types.ModuleType("google.colab")
real_find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: (
    None if name == "beyondgrad" else real_find_spec(name, *a))
calls = []
subprocess.run = lambda argv, **kw: calls.append(argv)
try:
    exec(open(sys.argv[1]).read(), {})
except SystemExit as e:
    print("STOPPED:", e)
print("PIP:", calls)
"""


def _simulate_colab(tmp_path, dists) -> tuple[str, dict]:
    site = _fake_runtime(tmp_path, dists)
    cell = tmp_path / "cell.py"
    cell.write_text(book.colab_install_cell())
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", _SIMULATE, str(cell)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, env


def test_install_cell_below_the_floor_says_what_to_do_before_pip(tmp_path):
    """A runtime whose preinstalled JAX (0.7.2) is older than the floor: one sentence
    naming that JAX, the floor and the command, and pip never runs."""
    out, _ = _simulate_colab(tmp_path, {"jax": "0.7.2", "jaxlib": "0.7.2"})
    floor = book.jax_floor()
    assert "PIP: []" in out
    stopped = next(x for x in out.splitlines() if x.startswith("STOPPED:"))
    assert "JAX 0.7.2" in stopped and floor in stopped
    assert f"!pip install -U 'jax>={floor}'" in stopped
    assert "ResolutionImpossible" not in out


@pytest.mark.timeout(300)
def test_install_cell_inside_the_range_adds_only_ours(tmp_path):
    """A runtime with JAX 0.9.0 and a Colab-like ipywidgets 7.7.1 preinstalled: the
    cell runs pip, and pip's resolver, given the cell's arguments (this checkout in
    place of the git URL), replaces no preinstalled package (a dry run)."""
    preinstalled = {"jax": "0.9.0", "jaxlib": "0.9.0", "ipywidgets": "7.7.1"}
    out, env = _simulate_colab(tmp_path, preinstalled)
    assert "STOPPED" not in out
    argv = json.loads(out.split("PIP: ", 1)[1].replace("'", '"'))[0]
    keep = Path(argv[argv.index("--constraint") + 1]).read_text().split()
    assert {f"{n}=={v}" for n, v in preinstalled.items()} <= set(keep)
    spec = argv.index("--constraint") + 2
    assert argv[spec].startswith("beyondgrad @ git+")
    local = [*argv[:spec], str(book.ROOT), *argv[spec + 1 :]]
    local += ["--dry-run", "--quiet", "--report", str(tmp_path / "r.json")]
    done = subprocess.run(
        local,
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "PIP_NO_INPUT": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    names = {_normal(item["metadata"]["name"]) for item in report["install"]}
    assert "beyondgrad" in names
    pinned = {c.split("==")[0] for c in keep} - {"beyondgrad"}  # ours: editable here
    assert not names & pinned, f"would replace preinstalled {names & pinned}"


def test_config_is_the_single_source_of_the_repository():
    url, branch = book.repository()
    assert url in book.package_spec() and branch in book.package_spec()
    cfg = book.config()
    assert cfg["launch_buttons"]["colab_url"] == book.COLAB


@pytest.mark.parametrize(
    "cell, expected",
    [
        ("%%raises ValueError\nf(1)", "ValueError"),
        (
            "\n%%raises jax.errors.TracerBoolConversionError\njax.jit(f)(1.0)",
            "TracerBoolConversionError",
        ),
        ("%%raises   KeyError  \n[][1]", "KeyError"),
        ("f(1)\n%%raises ValueError", None),  # not the first line
        ("%%raise ValueError\nf(1)", None),
        ("%%raises\nf(1)", None),
        ("%%raises 3Error", None),
        ("# raises ValueError\nf(1)", None),  # the old comment convention is gone
        ("", None),
    ],
)
def test_raises_convention_has_one_parser(cell, expected):
    assert book.expected_exception(cell) == expected


def test_raises_parser_is_the_one_the_tools_use():
    import tools.accelerator_run
    import tools.execute

    for module in (tools.execute, tools.accelerator_run):
        assert not hasattr(module, "RAISES"), (
            f"{module.__name__} parses '# raises' itself"
        )
    assert tools.execute.expected_exception is book.expected_exception
    assert tools.execute.raised_exception is book.raised_exception


def test_raised_exception_reads_the_magics_report_and_error_outputs():
    said = {"output_type": "stream", "name": "stderr"}
    assert book.raised_exception([{**said, "text": "KeyError raised, as expected (…"}])
    assert (
        book.raised_exception([{**said, "text": "KeyError raised, as expected (x)"}])
        == "KeyError"
    )
    assert book.raised_exception([{"output_type": "error", "ename": "IndexError"}]) == (
        "IndexError"
    )
    assert book.raised_exception([{**said, "text": "nothing to see"}]) is None
    assert book.raised_exception([]) is None


def test_sync_rewrites_only_the_install_cell(tmp_path):
    old_cell = "# On Colab: an old install cell\nimport sys\nif 'google.colab' in sys.modules:\n    pass"
    md = tmp_path / "99_x.md"
    head = "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n---\n\n"
    rest = "\n\nText.\n\n```{code-cell} ipython3\nx = 1\n```\n"
    md.write_text(
        head
        + "# x\n\n```{code-cell} ipython3\n:tags: [hide-cell]\n\n"
        + old_cell
        + "\n```"
        + rest
    )
    assert book.sync_install_cell(md) is True
    text = md.read_text()
    assert (
        book.colab_install_cell() in text
        and old_cell not in text
        and text.endswith(rest)
    )
    assert book.sync_install_cell(md) is False  # already in sync


def test_install_cell_fits_the_page():
    assert max(len(line) for line in book.colab_install_cell().splitlines()) <= 78


# --------------------------------------------------------------------------- glossary

GLOSSARY = book.ROOT / "glossary.md"
REQUIRED_TERMS = [
    "tracer", "aval", "concrete value", "linearize", "transpose", "primal", "tangent",
    "cotangent", "residual", "JVP", "VJP", "pytree", "static argument", "weak type",
    "float0", "LinearizeTracer", "psum", "pcast", "check_vma", "Explicit mesh axis",
    "Auto mesh axis",
]  # fmt: skip
PRINTED_TYPE = re.compile(r"`(~?[a-z]+[0-9]+\[[^`\]]*\](?:\{[^`}]*\})?)`")


def glossary_terms() -> list[str]:
    block = GLOSSARY.read_text().split("```{glossary}", 1)[1].split("```", 1)[0]
    return [
        line.strip()
        for line in block.splitlines()
        if line.strip() and not line[0].isspace()
    ]


def test_glossary_has_the_books_terms():
    terms = glossary_terms()
    assert not [t for t in REQUIRED_TERMS if t not in terms]
    assert len(terms) == len(set(terms))


def _printed_types() -> dict[str, str]:
    """What the running JAX prints for the glossary's examples (mesh axis `data`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    seen = {}

    def block(x):
        seen["varying"] = str(jax.typeof(x))
        seen["psum"] = str(jax.typeof(jax.lax.psum(x, "data")))
        return x

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    jax.shard_map(
        block,
        mesh=mesh,
        in_specs=PartitionSpec("data"),
        out_specs=PartitionSpec("data"),
    )(jnp.arange(16.0))
    seen["vector"] = str(jax.typeof(jnp.arange(4.0)))
    seen["weak"] = str(jax.typeof(jnp.asarray(1.0)))
    for kind in ("Explicit", "Auto"):
        m = jax.make_mesh(
            (4,),
            ("data",),
            axis_types=(getattr(AxisType, kind),),
            devices=jax.devices()[:4],
        )
        x = jax.device_put(jnp.arange(16.0), NamedSharding(m, PartitionSpec("data")))
        seen[kind] = str(jax.typeof(x))
    return seen


def test_glossary_types_are_the_ones_jax_prints():
    printed = _printed_types()
    text = GLOSSARY.read_text()
    assert printed["varying"] == "float32[4]{V:data}"  # the book's notation, pinned
    in_glossary = set(PRINTED_TYPE.findall(text))
    assert {
        printed["varying"],
        printed["psum"],
        printed["weak"],
        printed["Explicit"],
    } <= in_glossary
    assert in_glossary <= set(printed.values()), in_glossary - set(printed.values())


# --------------------------------------------------------------------------- the student link


def _chapter_doctree(*titles: str):
    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    doc = new_document("chapter", get_default_settings(Parser))
    for title in titles:
        section = nodes.section()
        section += nodes.title(text=title)
        section += nodes.paragraph(text=f"about {title}")
        doc += section
    return doc


class _Env:
    def __init__(self, source: Path):
        self.docname = source.relative_to(book.ROOT).with_suffix("").as_posix()
        self._source = source

    def doc2path(self, docname):
        return str(self._source)


class _App:
    def __init__(self, source: Path):
        self.env = _Env(source)


@pytest.fixture
def book_ext(monkeypatch):
    sys.path.insert(0, str(book.ROOT / "_ext"))
    import book_ext

    sys.path.remove(str(book.ROOT / "_ext"))
    warnings: list[str] = []
    monkeypatch.setattr(
        book_ext.LOGGER, "warning", lambda msg, **kw: warnings.append(msg)
    )
    monkeypatch.setattr(book_ext, "solution_exercises", lambda source: ["1.1"])
    book_ext.warnings_seen = warnings
    return book_ext


def test_student_link_opens_the_exercises_section(book_ext):
    from docutils import nodes

    source = SOURCES[-1]
    doc = _chapter_doctree("Summary", "Exercises")
    book_ext.add_student_notebook_link(_App(source), doc)
    sections = list(doc.children)
    assert [len(s.children) for s in sections] == [2, 3]  # title, box, paragraph
    box = sections[1][1]
    assert "student-notebook" in box["classes"]
    links = [n["refuri"] for n in box.findall(nodes.reference)]
    assert links == [book.student_colab_url(source)]
    assert book_ext.warnings_seen == []


def test_student_link_without_an_exercises_section_warns(book_ext):
    from docutils import nodes

    doc = _chapter_doctree("Summary", "Exercises for later")
    book_ext.add_student_notebook_link(_App(SOURCES[-1]), doc)
    assert (
        len(book_ext.warnings_seen) == 1
        and "no '## Exercises' section" in book_ext.warnings_seen[0]
    )
    assert not list(doc.findall(nodes.admonition))


def test_no_student_link_without_solutions(book_ext, monkeypatch):
    monkeypatch.setattr(book_ext, "solution_exercises", lambda source: [])
    doc = _chapter_doctree("Exercises")
    book_ext.add_student_notebook_link(_App(SOURCES[-1]), doc)
    assert len(doc.children[0].children) == 2 and book_ext.warnings_seen == []


@pytest.mark.parametrize("page", ["instructor_guide.md", "teaching_colab.md"])
def test_local_install_line_is_the_configured_repository(page):
    """The pages quote the install line with the repository and branch of _config.yml
    (no placeholders left to fill in)."""
    text = (book.ROOT / page).read_text()
    assert book.local_install_line() in text
    assert "<repository>" not in text and "<branch>" not in text
