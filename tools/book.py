"""Repository tooling shared by dev.py, the Sphinx extension and the tests.

Single sources of truth: the repository URL and branch live in ``_config.yml``;
the supported JAX floor lives in ``pyproject.toml``. Everything here derives from them.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

# Where executed chapters are kept (tools.executed imports nothing from here).
from tools.executed import (  # noqa: F401  (re-exported: the tests and dev.py read them)
    BUILD_DIR_VARIABLE,
    ROOT,
    build_dir,
    cached_execution,
    executed_notebook,
    fresh_executed_notebook,
)

CHAPTERS = ROOT / "chapters"
COLAB = "https://colab.research.google.com"
#: The first line of a cell that must fail: the cell magic ``%%raises ClassName``
#: (``beyondgrad.raises``; a dotted path is allowed, e.g.
#: ``%%raises jax.errors.TracerBoolConversionError``).
RAISES = re.compile(r"%%raises\s+([A-Za-z_][\w.]*)\s*")
#: The first line the magic prints when the cell raised the class it names.
RAISED_AS_EXPECTED = re.compile(r"([A-Za-z_]\w*) raised, as expected\b")


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


def chapters_extra() -> dict[str, str]:
    """``{name: lowest version}`` of the ``chapters`` extra (all ``name>=X`` in
    ``pyproject.toml``): what the install cell adds where Colab lacks it."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["chapters"]
    found = {}
    for dep in extra:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", dep.strip())
        if not m:
            raise RuntimeError(f"the chapters extra must list name>=X, got {dep!r}")
        found[m.group(1).lower()] = m.group(2)
    return found


def local_install_line() -> str:
    """The command that installs the helper package from the book's repository."""
    url, branch = repository()
    return f'pip install "beyondgrad[chapters] @ git+{url}@{branch}"'


def colab_install_cell() -> str:
    """The first code cell of every chapter (generated; a test keeps chapters in sync).

    ``python3 dev.py sync`` writes it into each chapter's source (:func:`sync_install_cell`).
    On Colab it (1) stops with one sentence when the runtime's JAX is older than the
    floor (which JAX, the floor, the command that fixes it) before pip runs; (2) pins
    every installed distribution with a pip constraint, so that installing adds
    packages and replaces none (Colab's JAX and its widget manager included); (3) adds
    of the ``chapters`` extra only what is missing, keeping (and saying so) an installed
    package older than the extra asks for. Every line fits 78 columns.
    """
    url, branch = repository()
    extra = ", ".join(f'"{n}": "{v}"' for n, v in chapters_extra().items())
    return f"""# On Colab: install the book's helper package. Nothing Colab installed is
# replaced: every installed package is pinned with a pip constraint.
# Elsewhere this cell does nothing.
import importlib.metadata as md, importlib.util, re, subprocess, sys
on_colab = "google.colab" in sys.modules
if on_colab and importlib.util.find_spec("beyondgrad") is None:
    def older(have, need):  # version strings, compared on their numbers
        nums = lambda v: tuple(int(x) for x in re.findall(r"\\d+", v)[:3])
        return nums(have) < nums(need)
    have = {{}}
    for d in md.distributions():
        if d.metadata["Name"]:
            name = re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower()
            have.setdefault(name, d.version)
    floor, jax = "{jax_floor()}", have.get("jax", "0")
    if older(jax, floor):
        plat = ("[cuda12]" if "jax-cuda12-plugin" in have
                else "[tpu]" if "libtpu" in have else "")
        raise SystemExit(
            f"This runtime has JAX {{jax}}, older than the {{floor}} the book "
            f"needs: run `!pip install -U 'jax{{plat}}>={{floor}}'` in a cell, "
            "then Runtime > Restart session, and run this notebook again.")
    with open("/tmp/keep-colab.txt", "w") as f:
        f.write("".join(f"{{n}}=={{v}}\\n" for n, v in sorted(have.items())))
    extra = {{{extra}}}
    add = [f"{{n}}>={{v}}" for n, v in extra.items()
           if n not in have or not older(have[n], v)]
    for n in sorted(set(extra) - {{a.split(">")[0] for a in add}}):
        print(f"Keeping Colab's {{n}} {{have[n]}} (the book is tested with "
              f"{{extra[n]}} or newer; a few outputs may look different).")
    repo = "git+{url}@{branch}"
    pip = [sys.executable, "-m", "pip", "install", "-q"]
    pip += ["--constraint", "/tmp/keep-colab.txt"]
    subprocess.run([*pip, f"beyondgrad @ {{repo}}", *add], check=True)"""


def sync_install_cell(source: Path) -> bool:
    """Make the chapter's first code cell the generated install cell; True if changed.

    Only that cell's text is replaced in the MyST source; the rest is left as written.
    """
    import jupytext

    code = [c for c in jupytext.read(source).cells if c.cell_type == "code"]
    if not code or "google.colab" not in code[0].source:
        return (
            False  # no install cell to update (tests/test_book.py says what is missing)
        )
    want = colab_install_cell()
    if code[0].source == want:
        return False  # already in sync
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


# --------------------------------------------------------------------------- for readers
#
# Jupyter and Colab render Markdown, not MyST: a role such as {term}`primal` or
# {glue:text}`n`, a directive such as ```{note}``` or a label line ``(name)=`` would show
# as literal text in a notebook. The generated notebooks carry plain Markdown instead:
#
# * glued values (``{glue}``, ``{glue:text}``, ``{glue:md}``) are substituted with the
#   values of an executed run, recorded in ``notebooks/glue/<chapter>.json`` (committed,
#   so that a notebook is generated the same way on every machine and JAX version;
#   ``python3 dev.py sync`` refreshes the record from the newest executed run when the
#   chapter's code changed, executing the chapter when no executed copy is fresh);
# * ``{term}``, ``{ref}``, ``{numref}`` and ``{doc}`` become links to the online book,
#   ``{math}`` becomes ``$...$``;
# * admonitions become block quotes with a bold title, ``{figure}`` an image,
#   ``{math}`` blocks ``$$ ... $$``, code blocks fenced code, label lines disappear;
# * code cells tagged ``remove-cell`` (build-only: glue, build asserts) are left out,
#   except a cell that only imports (a later cell may use the name); cells tagged
#   ``remove-input`` become collapsed Colab forms (:func:`reader_cell`).
#
# The notebooks speak to the person running them:
#
# * every glued value is the build's, so it is marked ``†`` and its cell ends with a
#   line saying so (:func:`build_note`);
# * relative Markdown links (``../drift.md``, ``04_shard_map_vma.md#x``) point at the
#   online book, other relative files at the repository on GitHub (:func:`_render_link`);
# * a figure's caption (``mystnb: figure:`` metadata, read only by the build) is a
#   markdown cell under the figure, ``**Fig. N.** ...``, and ``{numref}`` of it is the
#   plain ``Fig. N`` (:func:`figure_caption_cell`), so the reference stays in the notebook.

REMOVE_TAG = "remove-cell"
#: MyST left raw: a role (``{name}`text```) or a directive fence (```{name}``, :::{name}).
RAW_MYST = re.compile(r"\{[a-z][a-z:-]*\}`|(`{3,}|:{3,})\{|^\([\w.-]+\)=\s*$", re.M)
CODE_BLOCK = re.compile(r"^\s*(`{3,}|~{3,})(?![`~{]).*?^\s*\1\s*$", re.M | re.S)
ROLE = re.compile(r"\{(?P<role>[a-z][\w:-]*)\}`(?P<body>[^`]*)`")
TITLE_TARGET = re.compile(r"(?s)(?P<title>.*?)\s*<(?P<target>[^<>]+)>")
LABEL_LINE = re.compile(r"\(([\w.:-]+)\)=\s*")
FENCE = re.compile(
    r"(?P<indent>\s*)(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}\s*(?P<arg>.*)"
)
GLUE_ROLES = {"glue", "glue:", "glue:any", "glue:text", "glue:md"}
ADMONITIONS = {
    "admonition", "attention", "caution", "danger", "error", "hint", "important",
    "note", "seealso", "tip", "warning", "dropdown", "margin", "sidebar", "topic",
}  # fmt: skip
GLUE_MIMES = ("text/plain", "text/markdown")


class GlueMissing(LookupError):
    """A glued value the chapter's prose uses has no recorded value."""


def glue_path(source: Path) -> Path:
    """Where the glued values of a chapter's executed run are recorded."""
    return ROOT / "notebooks" / "glue" / f"{Path(source).stem}.json"


def glue_names(source: Path) -> list[str]:
    """The glued names the chapter's markdown uses (roles and ``glue`` directives)."""
    text = Path(source).read_text()
    names = [
        _glue_key(m["role"], m["body"])
        for m in ROLE.finditer(text)
        if m["role"] in GLUE_ROLES
    ]
    names += [
        m["arg"].split()[0]
        for line in text.splitlines()
        if (m := FENCE.fullmatch(line)) and m["name"].startswith("glue") and m["arg"]
    ]
    return list(dict.fromkeys(names))


def _glue_key(role: str, body: str) -> str:
    key = body.rsplit(":", 1)[0] if role == "glue:text" and ":" in body else body
    return key.strip()


def glued_outputs(nb) -> dict[str, dict[str, str]]:
    """``{name: {mime: text}}`` of every ``glue`` output of an executed notebook.

    myst-nb's glue writes a display output whose metadata names the value
    (``scrapbook.name``) and whose mime types carry a prefix when not displayed.
    """
    found: dict[str, dict[str, str]] = {}
    for cell in nb["cells"]:
        for out in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            scrap = out.get("metadata", {}).get("scrapbook")
            if not isinstance(scrap, dict) or "name" not in scrap:
                continue
            prefix = scrap.get("mime_prefix", "")
            data = {k.removeprefix(prefix): v for k, v in out.get("data", {}).items()}
            found[scrap["name"]] = {
                mime: v if isinstance(v, str) else "".join(v)
                for mime, v in data.items()
                if mime in GLUE_MIMES
            }
    return found


def code_digest(source: Path) -> str:
    """A digest of the chapter's code cells: glued values are recorded against it."""
    import hashlib

    import jupytext

    code = [c.source for c in jupytext.read(source).cells if c.cell_type == "code"]
    if code and "google.colab" in code[0]:
        code = code[1:]  # the generated install cell glues nothing
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()[:16]


def recorded_glue(source: Path) -> dict:
    """The chapter's glue record: ``{"code": digest, "run": what ran, "values": {...}}``."""
    path = glue_path(source)
    if not path.exists():
        return {"code": "", "run": "", "values": {}}
    return json.loads(path.read_text())


def glue_record_problems(source: Path) -> list[str]:
    """Why the chapter's glue record cannot render its notebooks as they are now."""
    rec = recorded_glue(source)
    name = glue_path(source).relative_to(ROOT).as_posix()
    if not glue_names(source):
        return []
    problems = []
    missing = [n for n in glue_names(source) if n not in rec["values"]]
    if missing:
        problems.append(f"{name} has no value for {missing}")
    if rec["code"] != code_digest(source):
        problems.append(
            f"{name} was recorded from other code than {Path(source).name}'s"
        )
    return [p + ": run `python3 dev.py sync`" for p in problems]


def format_glue(value: dict[str, str], role: str, body: str) -> str:
    """A glued value as myst-nb shows it inline (``{glue:text}`name:.3g``` formats it)."""
    plain = value.get("text/plain", "")
    if role == "glue:md":
        return value.get("text/markdown", plain)
    if role != "glue:text":
        return plain
    spec = body.rsplit(":", 1)[1] if ":" in body else "s"
    import ast

    try:
        parsed = ast.literal_eval(plain)
    except (SyntaxError, ValueError):
        parsed = plain
    if not spec:
        return str(parsed)
    kind = spec[-1]
    if kind == "s":
        parsed = str(parsed)
    elif kind in "bcdoxX":
        parsed = int(parsed)
    elif kind in "eEfFgGn%":
        parsed = float(parsed)
    return format(parsed, spec)


@dataclass(frozen=True)
class Links:
    """What the links of one chapter's notebooks point at, in the online book."""

    source: Path
    labels: dict  # label -> (doc, title)
    terms: dict  # lower-case term -> term as the glossary writes it
    figures: dict  # figure name in this chapter -> its number ("Fig. N")

    def page(self, doc: str, anchor: str = "") -> str:
        return html_base_url() + doc + ".html" + (f"#{anchor}" if anchor else "")


def _book_docs() -> list[Path]:
    """The MyST pages whose labels and terms a chapter may link to."""
    skip = {"README.md", "CONTRIBUTING.md"}
    return sorted(
        p for p in [*ROOT.glob("*.md"), *CHAPTERS.glob("*.md")] if p.name not in skip
    )


def _labels() -> dict[str, tuple[str, str]]:
    found = {}
    for path in _book_docs():
        doc = path.relative_to(ROOT).with_suffix("").as_posix()
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            m = LABEL_LINE.fullmatch(line.strip())
            if not m:
                continue
            after = next((x for x in lines[i + 1 :] if x.strip()), "")
            title = after.lstrip("#").strip() if after.startswith("#") else ""
            found[m.group(1)] = (doc, title)
    return found


def _glossary_terms() -> dict[str, str]:
    path = ROOT / "glossary.md"
    if not path.exists():
        return {}
    block = path.read_text().split("```{glossary}", 1)[-1].split("```", 1)[0]
    terms = [x.strip() for x in block.splitlines() if x.strip() and not x[0].isspace()]
    return {t.lower(): t for t in terms}


def _figure_numbers(nb) -> dict[str, str]:
    """``{name: "Fig. N"}``: Sphinx numbers a page's captioned figures 1, 2, ..."""
    numbers, n = {}, 0
    for cell in nb.cells:
        fig = cell.metadata.get("mystnb", {}).get("figure", {})
        named = fig.get("name")
        if cell.cell_type == "code" and fig.get("caption"):
            n += 1
        for m in FENCE.finditer(cell.source if cell.cell_type == "markdown" else ""):
            if m["name"] in ("figure", "glue:figure"):
                n += 1
                body = cell.source[m.end() :]
                nm = re.search(r"^\s*:name:\s*(\S+)", body, re.M)
                if nm:
                    numbers[nm.group(1)] = f"Fig. {n}"
        if named and fig.get("caption"):
            numbers[named] = f"Fig. {n}"
        if cell.cell_type == "code" and fig.get("caption") and "id" in cell:
            numbers[f"#cell:{cell['id']}"] = f"Fig. {n}"
    return numbers


def _anchor(text: str) -> str:
    from docutils.nodes import make_id

    return make_id(text)


def _render_role(m: re.Match, links: Links, glue: dict) -> str:
    role, body = m["role"], m["body"]
    tt = TITLE_TARGET.fullmatch(body)
    title, target = (tt["title"], tt["target"]) if tt else ("", body)
    if role in GLUE_ROLES:
        key = _glue_key(role, body)
        if key not in glue:
            raise GlueMissing(
                f"{links.source.name} uses the glued value {key!r}, which "
                f"{glue_path(links.source).relative_to(ROOT).as_posix()} does not "
                "record: run `python3 dev.py sync` (it executes the chapter if needed)"
            )
        return format_glue(glue[key], role, body) + BUILD_MARK
    if role == "term":
        term = links.terms.get(target.strip().lower())
        if term is None:
            raise ValueError(
                f"{links.source.name}: {{term}}`{body}` names no term of glossary.md"
            )
        from sphinx.util.nodes import _make_id

        return (
            f"[{title or target}]({links.page('glossary', _make_id('term-' + term))})"
        )
    if role in ("ref", "numref"):
        label = target.strip()
        if role == "numref" and label in links.figures:
            # the notebook shows "Fig. N" under the figure (figure_caption_cell): the
            # reference stays inside the notebook
            return (title or "%s").replace("%s", links.figures[label])
        if label not in links.labels:
            raise ValueError(f"{links.source.name}: no label ({label})= in the book")
        doc, section = links.labels[label]
        return f"[{title or section or label}]({links.page(doc, _anchor(label))})"
    if role == "doc":
        here = links.source.parent
        doc = (here / target.strip()).resolve().relative_to(ROOT).with_suffix("")
        return f"[{title or doc.name}]({links.page(doc.as_posix())})"
    if role in ("math", "eq"):
        return f"${body}$" if role == "math" else f"({body})"
    return f"`{title or target}`" if role in ("code", "samp", "kbd") else title or body


def _directive_options(lines: list[str]) -> tuple[dict, list[str]]:
    opts, i = {}, 0
    if lines[:1] and lines[0].strip() == "---":
        end = next((j for j in range(1, len(lines)) if lines[j].strip() == "---"), 0)
        import yaml

        opts = yaml.safe_load("\n".join(lines[1:end])) or {}
        return opts, lines[end + 1 :]
    while i < len(lines) and re.match(r"\s*:[\w-]+:", lines[i]):
        key, _, value = lines[i].strip()[1:].partition(":")
        opts[key] = value.strip()
        i += 1
    return opts, lines[i:]


def _render_directive(name: str, arg: str, body: list[str], links: Links) -> list[str]:
    opts, body = _directive_options(body)
    text = _render_blocks(body, links)
    if name in ADMONITIONS:
        title = arg or name.capitalize()
        quoted = [f"> {x}" if x.strip() else ">" for x in text]
        return [f"> **{title}**", ">", *quoted] if quoted else [f"> **{title}**"]
    if name == "figure":
        url, branch = repository()
        rel = (links.source.parent / arg).resolve().relative_to(ROOT).as_posix()
        raw = url.replace("https://github.com/", "https://raw.githubusercontent.com/")
        caption = " ".join(x.strip() for x in text if x.strip())
        shown = [f"![{opts.get('alt', caption)}]({raw}/{branch}/{rel})"]
        return [*shown, "", f"*{caption}*"] if caption else shown
    if name == "glue:figure":
        caption = " ".join(x.strip() for x in text if x.strip())
        doc = links.source.relative_to(ROOT).with_suffix("").as_posix()
        where = links.page(
            doc, _anchor(opts.get("name", "")) if opts.get("name") else ""
        )
        return [
            f"*Figure: {caption} (drawn by a cell of this notebook; [on the online page]({where}))*"
        ]
    if name in ("math", "glue:math"):
        return ["$$", *text, "$$"]
    if name in ("code-block", "code", "sourcecode"):
        return [f"```{arg}", *body, "```"]
    return text


def _render_blocks(lines: list[str], links: Links) -> list[str]:
    """Directives and label lines of a markdown cell as plain Markdown (recursively)."""
    out, i, plain_fence = [], 0, None
    while i < len(lines):
        line = lines[i]
        if plain_fence is None and (m := FENCE.fullmatch(line)):
            fence, close = m["fence"], None
            for j in range(i + 1, len(lines)):
                s = lines[j].strip()
                if s and set(s) == {fence[0]} and len(s) >= len(fence):
                    close = j
                    break
            end = close if close is not None else len(lines)
            body = [x[len(m["indent"]) :] for x in lines[i + 1 : end]]
            shown = _render_directive(m["name"], m["arg"].strip(), body, links)
            out += [m["indent"] + x if x else x for x in shown]
            i = end + 1
            continue
        fence_m = re.match(r"\s*(`{3,}|~{3,})", line)
        if fence_m and plain_fence is None:
            plain_fence = fence_m.group(1)  # a fenced code block: left as it is
        elif fence_m and line.strip() == plain_fence[0] * len(line.strip()):
            plain_fence = None if len(line.strip()) >= len(plain_fence) else plain_fence
        if plain_fence is None and LABEL_LINE.fullmatch(line.strip()):
            i += 1
            continue
        out.append(line)
        i += 1
    return out


#: Marks a glued value in a notebook: it is the build's, not the reader's (build_note).
BUILD_MARK = "†"
#: A Markdown link or image whose target has no scheme: ``[text](../drift.md#x)``.
MD_LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\[\]]*)\]\((?P<target>[^()\s]+)\)")
#: Inline code and fenced code blocks: their text is shown as it is.
CODE_SPAN = re.compile(r"(`{3,}|~{3,}).*?\1|(`+)[^`].*?\2|``", re.S)
#: Cell tags whose code is build-only (the page hides the cell, or its code).
BUILD_ONLY_TAGS = (REMOVE_TAG, "remove-input")
#: Colab form title of a cell whose code the page hides but whose output it shows.
HIDDEN_CODE_TITLE = "#@title Run to show what the online page shows here (code hidden)"


def build_note(built_with: str) -> str:
    """The line ending a notebook cell that quotes glued values (:data:`BUILD_MARK`)."""
    run = built_with.removeprefix("jax ").split(",")
    jax = f"JAX {run[0].strip()}" if run and run[0].strip() else "its JAX"
    where = f" on {run[1].strip().upper()}" if len(run) > 1 and run[1].strip() else ""
    return (
        f"*{BUILD_MARK} As recorded when the online book was built ({jax}{where}); "
        "your run prints its own.*"
    )


def _outside_code(text: str, fn) -> str:
    """``fn`` applied to the parts of ``text`` outside code spans and blocks."""
    out, at = [], 0
    for m in CODE_SPAN.finditer(text):
        out += [fn(text[at : m.start()]), m.group(0)]
        at = m.end()
    return "".join([*out, fn(text[at:])])


def _render_link(m: re.Match, links: Links) -> str:
    """A relative Markdown link or image as an absolute one that works from Colab:
    a page of the book (``.md``/``.ipynb``, or an anchor of this page) goes to the
    online book, any other file to the repository on GitHub."""
    target = m["target"]
    if re.match(r"[a-zA-Z][\w+.-]*:|/", target):
        return m.group(0)  # absolute already (https:, mailto:, /...)
    path, _, anchor = target.partition("#")
    here = links.source.parent
    if not path:
        doc = links.source.relative_to(ROOT).with_suffix("").as_posix()
        return f"{m['bang']}[{m['text']}]({links.page(doc, anchor)})"
    resolved = (here / path).resolve()
    try:
        rel = resolved.relative_to(ROOT)
    except ValueError:
        raise ValueError(
            f"{links.source.name}: the link target {target!r} is outside the book"
        ) from None
    if rel.suffix in (".md", ".ipynb") and not m["bang"]:
        url = links.page(rel.with_suffix("").as_posix(), anchor)
    else:
        url, branch = repository()
        kind = "raw" if m["bang"] else "blob"
        if kind == "raw":
            url = url.replace(
                "https://github.com/", "https://raw.githubusercontent.com/"
            )
            url = f"{url}/{branch}/{rel.as_posix()}"
        else:
            url = f"{url}/blob/{branch}/{rel.as_posix()}" + (
                f"#{anchor}" if anchor else ""
            )
    return f"{m['bang']}[{m['text']}]({url})"


def reader_markdown(text: str, links: Links, glue: dict, built_with: str = "") -> str:
    """A MyST markdown cell as plain Markdown for Jupyter and Colab.

    Each glued value is marked :data:`BUILD_MARK`, and a cell that shows one ends with
    a line saying whose value it is (:func:`build_note`: the run that built the online
    book, ``built_with``), so the reader never takes it for their own.
    """
    lines = _render_blocks(text.splitlines(), links)
    rendered = ROLE.sub(lambda m: _render_role(m, links, glue), "\n".join(lines))
    rendered = _outside_code(
        rendered, lambda t: MD_LINK.sub(lambda m: _render_link(m, links), t)
    )
    rendered = re.sub(r"\n{3,}", "\n\n", rendered).strip("\n")
    if BUILD_MARK in rendered:
        rendered += "\n\n" + build_note(built_with)
    return rendered


def links_for(source: Path, nb) -> Links:
    return Links(Path(source), _labels(), _glossary_terms(), _figure_numbers(nb))


def only_imports(code: str) -> bool:
    """Whether a code cell only imports (kept in the notebooks even when hidden from
    the page: later cells may use what it imports)."""
    import ast

    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(n, ast.Import | ast.ImportFrom) for n in body)


def reader_cell(cell):
    """A chapter cell as the notebooks carry it, or None when it is build-only.

    * tagged ``remove-cell`` (glue, build asserts): left out, except a cell that only
      imports (a later cell may use the name), kept without its comments and tags;
    * tagged ``remove-input`` (the page shows its output, a table drawn from recorded
      data, and hides its code): a collapsed Colab form, so the notebook shows what the
      page shows without the build's code;
    * any other cell as it is, without a ``remove-output`` tag (it hides a widget from
      the static page; in a notebook the widget is the point).
    """
    tags = cell.metadata.get("tags", [])
    if "remove-output" in tags:  # an instruction to the page only: the cell stays whole
        tags = [t for t in tags if t != "remove-output"]
        if tags:
            cell.metadata["tags"] = tags
        else:
            del cell.metadata["tags"]
    if cell.cell_type != "code" or not (set(tags) & set(BUILD_ONLY_TAGS)):
        return cell
    if is_solution(cell):
        return cell
    if REMOVE_TAG in tags:
        if not only_imports(cell.source):
            return None
        lines = cell.source.splitlines()
        cell.source = "\n".join(x for x in lines if not x.lstrip().startswith("#"))
    else:
        cell.source = f"{HIDDEN_CODE_TITLE}\n{cell.source}"
        cell.metadata["cellView"] = "form"
        cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    cell.metadata["tags"] = [t for t in tags if t not in BUILD_ONLY_TAGS]
    if not cell.metadata["tags"]:
        del cell.metadata["tags"]
    return cell


def figure_caption_cell(cell, links: Links, glue: dict, built_with: str = ""):
    """The markdown cell shown under a captioned figure cell (``mystnb: figure:``
    metadata, which only the book's build reads), or None: ``**Fig. N.** caption``."""
    if cell.cell_type != "code":
        return None
    fig = cell.metadata.get("mystnb", {}).get("figure", {})
    caption = fig.get("caption")
    if not caption:
        return None
    import nbformat

    number = links.figures.get(fig.get("name", ""), "")
    if not number:  # an unnamed figure: count it like Sphinx does
        number = _unnamed_figure_number(cell, links)
    text = reader_markdown(str(caption), links, glue, built_with)
    out = nbformat.v4.new_markdown_cell(f"**{number}.** {text}" if number else text)
    out["id"] = f"{cell['id']}-caption"
    return out


def _unnamed_figure_number(cell, links: Links) -> str:
    return links.figures.get(f"#cell:{cell['id']}", "")


def for_readers(nb, source: Path):
    """The chapter notebook ``nb`` as its readers get it (:func:`reader_cells`)."""
    links = links_for(source, nb)
    record = recorded_glue(source)
    built_with = record.get("run", "")
    cells = []
    for cell in nb.cells:
        kept = reader_cell(cell)
        if kept is None:
            continue
        if kept.cell_type == "markdown":
            kept.source = reader_markdown(
                kept.source, links, record["values"], built_with
            )
            if not kept.source.strip():
                continue
        cells.append(kept)
        caption = figure_caption_cell(kept, links, record["values"], built_with)
        if caption is not None:
            cells.append(caption)
    nb.cells = cells
    return nb


def raw_myst(nb: dict) -> list[str]:
    """``cell N: ...`` for each markdown cell of a notebook that still carries MyST."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        src = (
            cell["source"]
            if isinstance(cell["source"], str)
            else "".join(cell["source"])
        )
        src = CODE_BLOCK.sub("", src)  # a fenced code block shows its text as it is
        for m in RAW_MYST.finditer(src):
            found.append(f"cell {i}: {src[max(0, m.start() - 30) : m.end() + 30]!r}")
    return found


def md_to_notebook(source: Path) -> dict:
    """The self-study notebook: the chapter as a reader runs it, solutions as Colab forms.

    Markdown is rendered for Jupyter and Colab (:func:`for_readers`); build-only cells
    (tagged ``remove-cell``) are left out.
    """
    nb = for_readers(_read_chapter(source), source)
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

    nb = for_readers(_read_chapter(source), source)
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
    problems = glue_record_problems(source)
    if problems:
        return problems
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


def record_glue(source: Path, executed) -> Path | None:
    """Write the glued values the chapter's prose uses, from the executed notebook
    ``executed``, into its glue record; return the record's path if it changed."""
    names = glue_names(source)
    found = glued_outputs(executed)
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(
            f"{Path(source).name} uses glued values its executed run does not glue: "
            f"{missing} (is a glue(...) call missing or renamed?)"
        )
    run = next(
        (
            out["metadata"]["beyondgrad_runtime"]
            for cell in executed["cells"]
            for out in cell.get("outputs", [])
            if isinstance(out.get("metadata", {}).get("beyondgrad_runtime"), dict)
        ),
        {},
    )
    record = {
        "code": code_digest(source),
        "run": f"jax {run.get('jax_version', '?')}, {run.get('platform', '?')}",
        "values": {n: found[n] for n in sorted(names)},
    }
    path = glue_path(source)
    text = json.dumps(record, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
    if path.exists() and path.read_text() == text:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def sync_glue(source: Path) -> Path | None:
    """Refresh the chapter's glue record: from a fresh executed copy when there is one
    (the book build's or the tests'), else, when the record does not fit the chapter
    (other code, a missing value), from an execution now. Returns the path if changed."""
    if not glue_names(source):
        return None
    executed = fresh_executed_notebook(source)
    if executed is None and glue_record_problems(source):
        print(
            f"[sync] executing {Path(source).name} for its glued values ...", flush=True
        )
        executed = executed_notebook(source)
    return None if executed is None else record_glue(source, executed)


def sync() -> list[Path]:
    """Rewrite every chapter's install cell, glue record and two notebooks; return the
    files changed."""
    changed = []
    for source in chapter_sources():
        if sync_install_cell(source):
            changed.append(source)
        if (record := sync_glue(source)) is not None:
            changed.append(record)
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
