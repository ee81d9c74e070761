"""Sphinx extension for Beyond grad.

* ``{{ jax_floor }}`` substitution from pyproject.toml (one source of truth).
* ``ipythontb`` lexer that never fails: IPython's traceback lexer stops at characters
  such as backticks in JAX's error messages, and Sphinx then warns (fatal under ``-W``).
  Ours keeps IPython's highlighting and passes the untokenisable text through as text.
* ``{book-status}`` directive: the versions of jax, jaxlib, folx and numpy in the
  environment that built the book, and a table, filled at build time, of each executed
  page's run time (myst-nb's execution data) and the JAX/jaxlib/Python versions and
  devices that produced its outputs (the ``describe()`` record printed by its setup cell).
* At the end of each chapter's *Summary* section, links to the API reference entries
  of the ``beyondgrad`` helpers the chapter's code calls (``tools.api.names_used``).
* On every chapter page with solutions, a box at the top of its *Exercises* section that
  opens the chapter's student notebook (solutions replaced by links back to the book)
  on Colab; the launch button opens the self-study notebook.
"""

from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tools.api import names_used  # noqa: E402
from tools.book import (  # noqa: E402
    cached_execution,
    jax_floor,
    solution_exercises,
    student_colab_url,
    student_path,
)

LOGGER = logging.getLogger(__name__)
STATUS_DOC = "status"
#: Packages whose installed versions the status page records for the build environment.
BUILD_PACKAGES = ("jax", "jaxlib", "folx", "numpy")
EXERCISES_TITLE = "Exercises"


def robust_traceback_lexer():
    from IPython.lib.lexers import IPythonTracebackLexer
    from pygments.token import Error, Text

    class RobustIPythonTracebackLexer(IPythonTracebackLexer):
        """IPython's traceback lexer, with text it cannot tokenise rendered as plain text."""

        def get_tokens_unprocessed(self, text):
            for index, token, value in super().get_tokens_unprocessed(text):
                yield index, (Text if token in Error else token), value

    return RobustIPythonTracebackLexer


class status_placeholder(nodes.General, nodes.Element):
    pass


class BookStatus(SphinxDirective):
    def run(self):
        return [status_placeholder()]


def _runtime_record(source: Path) -> dict | None:
    found = cached_execution(source)
    if found is None:
        return None
    for cell in found[0]["cells"]:
        for out in cell.get("outputs", []):
            rec = out.get("metadata", {}).get("beyondgrad_runtime")
            if isinstance(rec, dict):
                return rec
    return None


def _table(rows: list[list[str]], header: list[str]) -> nodes.table:
    table = nodes.table(classes=["book-status"])
    group = nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)
    head = nodes.thead()
    group += head
    body = nodes.tbody()
    group += body
    for target, cells in ((head, [header]), (body, rows)):
        for cells_row in cells:
            row = nodes.row()
            for text in cells_row:
                entry = nodes.entry()
                entry += nodes.paragraph(text=text)
                row += entry
            target += row
    return table


def fill_status(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    if docname != STATUS_DOC:
        return
    from myst_nb.sphinx_ import NbMetadataCollector

    env = app.env
    header = [
        "page",
        "executed",
        "run time (s)",
        "result",
        "platform / devices",
        "JAX",
        "jaxlib",
        "Python",
    ]
    rows = []
    for doc in sorted(env.found_docs):
        data = NbMetadataCollector.get_exec_data(env, doc)
        if not data:
            continue
        rec = _runtime_record(Path(env.doc2path(doc))) or {}
        devices = (
            f"{rec['platform']}: {rec['device_count']} x {rec['device_kind']}"
            if rec
            else "(no describe() output)"
        )
        rows.append(
            [
                doc,
                str(data.get("method", "")),
                f"{data['runtime']:.1f}" if data.get("runtime") is not None else "-",
                "ok" if data.get("succeeded") else "FAILED",
                devices,
                str(rec.get("jax_version", "-")),
                str(rec.get("jaxlib_version", "-")),
                str(rec.get("python_version", "-")),
            ]
        )
    built_with = nodes.paragraph(text="Built with " + build_versions() + ".")
    for node in doctree.findall(status_placeholder):
        table = (
            _table(rows, header)
            if rows
            else nodes.paragraph(text="No page was executed.")
        )
        node.replace_self([built_with.deepcopy(), table])


def build_versions() -> str:
    """``jax X, jaxlib Y, folx Z, numpy W, Python V``: the environment building the book."""
    import importlib.metadata
    import platform

    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    parts = [f"{name} {version(name)}" for name in BUILD_PACKAGES]
    return ", ".join([*parts, f"Python {platform.python_version()}"])


def student_notebook_box(url: str) -> nodes.admonition:
    """The box that opens the student notebook on Colab."""
    box = nodes.admonition(classes=["tip", "student-notebook"])
    box += nodes.title(text="Exercises without the solutions")
    para = nodes.paragraph()
    para += nodes.Text("Working through these in a class or on your own? Open the ")
    para += nodes.reference(
        "", "student notebook on Colab", refuri=url, classes=["student-notebook-link"]
    )
    para += nodes.Text(
        ": the same chapter, with each solution replaced by a link back to this page. "
        "The launch button at the top opens the self-study notebook, solutions included "
        "(collapsed)."
    )
    box += para
    return box


def add_student_notebook_link(app: Sphinx, doctree: nodes.document) -> None:
    """Put the student-notebook box at the top of a chapter's Exercises section.

    Only for chapters (paired with an .ipynb) that have solution cells. The section is
    found by its title, at any level; a chapter with solutions but no Exercises section
    gets a warning (fatal under -W), as does one whose student notebook is missing.
    """
    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".md" or not source.with_suffix(".ipynb").exists():
        return
    if not solution_exercises(source):
        return
    logger = LOGGER
    if not student_path(source).exists():
        logger.warning(
            f"{student_path(source).name} is missing: run `python3 dev.py sync`",
            location=app.env.docname,
        )
        return
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is not None and title.astext().strip() == EXERCISES_TITLE:
            section.insert(
                section.index(title) + 1,
                student_notebook_box(student_colab_url(source)),
            )
            return
    logger.warning(
        f"{source.name} has solution cells but no '## {EXERCISES_TITLE}' section for the student-notebook link",
        location=app.env.docname,
    )


def always_rewrite_status(app, env, added, changed, removed):
    return [STATUS_DOC] if STATUS_DOC in env.found_docs else []


def drop_launch_without_notebook(
    app: Sphinx, pagename: str, templatename: str, context: dict, doctree
) -> None:
    """Remove the launch (Colab) buttons from executed pages that have no .ipynb twin.

    The theme would point Colab at the page's .md source, which Colab cannot open. Only
    chapters are paired with an .ipynb; other executed pages (the appendix) are read here.
    """
    source = Path(app.env.doc2path(pagename))
    if source.with_suffix(".ipynb").exists():
        return
    buttons = context.get("header_buttons", [])
    buttons[:] = [b for b in buttons if b.get("label") != "launch-buttons"]


def dedupe_inline_scripts(
    app: Sphinx, pagename, templatename, context, doctree
) -> None:
    """Drop repeated inline scripts from a page.

    Sphinx 7.4 adds an inline script registered after ``Builder.init()`` (sphinx-thebe's
    ``const THEBE_JS_URL``, sphinx-togglebutton's selector) twice, once with filename
    ``None`` and once with ``''``; the second ``const`` declaration is a JavaScript
    SyntaxError on every page (the browser checks of tools/browser.py catch it).
    """
    seen, unique = set(), []
    for js in context.get("script_files", []):
        key = (js.filename or "", js.priority, tuple(sorted(js.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    context["script_files"] = unique


def add_substitutions(app: Sphinx, config) -> None:
    subs = dict(getattr(config, "myst_substitutions", {}) or {})
    subs.setdefault("jax_floor", jax_floor())
    config.myst_substitutions = subs


SUMMARY_TITLE = "Summary"


def add_api_links(app: Sphinx, doctree: nodes.document) -> None:
    """Link each ``beyondgrad`` helper a chapter calls to its API reference entry.

    A paragraph at the end of the chapter's *Summary* section (or of the page when it
    has none) lists them in order of first use; teaching apparatus (exercise checkers)
    is left out. The links are ordinary Python cross-references, so a name missing
    from the API page fails the build (it runs with -n -W).
    """
    from sphinx.addnodes import pending_xref

    source = Path(app.env.doc2path(app.env.docname))
    if source.suffix != ".md" or not source.with_suffix(".ipynb").exists():
        return
    used = [n for n in names_used(source.read_text()) if ".exercises." not in n]
    if not used:
        return
    para = nodes.paragraph()
    para += nodes.Text("The helpers from ")
    para += nodes.literal(text="beyondgrad")
    para += nodes.Text(" that this page calls (see the API reference): ")
    for i, dotted in enumerate(used):
        if i:
            para += nodes.Text(", ")
        ref = pending_xref(
            "", refdomain="py", reftype="obj", reftarget=dotted, refexplicit=True
        )
        ref += nodes.literal(text=dotted.removeprefix("beyondgrad."))
        para += ref
    para += nodes.Text(".")
    target = None
    for section in doctree.findall(nodes.section):
        title = section.next_node(nodes.title)
        if title is not None and title.astext().strip() == SUMMARY_TITLE:
            target = section
            break
    if target is None:
        target = next(iter(doctree.findall(nodes.section)), doctree)
    target += para


def setup(app: Sphinx) -> dict:
    app.add_lexer("ipythontb", robust_traceback_lexer())
    app.add_node(status_placeholder)
    app.add_directive("book-status", BookStatus)
    app.connect("config-inited", add_substitutions)
    app.connect("doctree-resolved", fill_status)
    app.connect("doctree-read", add_student_notebook_link)
    app.connect("doctree-read", add_api_links)
    app.connect(
        "html-page-context", drop_launch_without_notebook, priority=502
    )  # after the theme
    app.connect("env-get-outdated", always_rewrite_status)
    app.connect("html-page-context", dedupe_inline_scripts, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
