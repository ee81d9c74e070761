"""Which modules the book's two API pages document, and which helpers a chapter calls.

Sphinx writes the pages (api.md, internals.md) from the docstrings: each page is a
table of modules (``sphinx.ext.autosummary``) and one ``automodule`` per module with
``:members:`` (``sphinx.ext.autodoc`` documents the module's ``__all__``; napoleon reads
the Google-style ``Args``/``Returns``/``Raises`` sections); the extensions are enabled
in ``_config.yml``. The modules a reader of the book imports (:data:`READER_MODULES`:
the idea modules and ``runtime``, ``measure``, ``raises``) are on api.md; every other
public module (the teaching apparatus: exercises, figures, drift, the worked problems;
and ``compat``) on internals.md, "Book internals". tests/test_imports.py checks that
each public module is on its page, once; tests/test_docstrings.py that the reader's
functions document every argument. :func:`names_used` finds the helpers a chapter
calls (the book's Sphinx extension links them at the end of the chapter). Nothing here
imports JAX.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "api.md"
INTERNALS = ROOT / "internals.md"

#: The modules a reader of the book imports; the API page documents these alone.
READER_MODULES = frozenset(
    f"beyondgrad{suffix}"
    for suffix in (
        "",
        ".tracers",
        ".linear",
        ".implicit",
        ".sharding",
        ".laplacian",
        ".forward_laplacian",
        ".slater",
        ".vmc",
        ".sharded_vmc",
        ".wavefunctions",
        ".all_electron",
        ".runtime",
        ".measure",
        ".raises",
    )
)
PACKAGE = ROOT / "src" / "beyondgrad"


def public_modules() -> list[str]:
    """Dotted names of the package's modules that define ``__all__``, in file order."""
    return list(_public_modules())


@functools.cache
def _public_modules() -> tuple[str, ...]:
    """:func:`public_modules`, read once per process (the sources do not change)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue  # a private module (e.g. beyondgrad._checks)
        if "__all__" in path.read_text():
            names.append(".".join(parts))
    order = {"beyondgrad": 0}
    return tuple(sorted(names, key=lambda n: (order.get(n, 1), n.count("."), n)))


def static_public_names(module: str) -> list[str]:
    """``module.__all__`` read from its source (no import, so no JAX in Sphinx)."""
    return list(_static_public_names(module))


@functools.cache
def _static_public_names(module: str) -> tuple[str, ...]:
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                return tuple(
                    str(v) for v in ast.literal_eval(node.value or ast.List([]))
                )
    return ()


_IMPORT = re.compile(
    r"^\s*from (beyondgrad(?:\.\w+)*) import ([\w, ()]+?)\s*$", re.MULTILINE
)


def names_used(source: str) -> list[str]:
    """Public ``beyondgrad`` names that a chapter's code calls, as ``module.name``.

    Reads the chapter's ``from beyondgrad[.pkg] import mod [as alias]`` lines, then
    every ``alias.name`` in the text whose ``name`` is in that module's ``__all__``;
    in order of first use, each once. The book's Sphinx extension links them to this
    page at the end of each chapter.
    """
    modules = set(public_modules())
    aliases: dict[str, str] = {}
    for package, names in _IMPORT.findall(source):
        for item in names.strip("()").split(","):
            words = item.split()
            if not words:
                continue
            dotted = f"{package}.{words[0]}"
            if dotted in modules:
                aliases[words[-1]] = dotted
    if not aliases:
        return []
    found: list[str] = []
    pattern = re.compile(rf"\b({'|'.join(map(re.escape, aliases))})\.(\w+)\b")
    for alias, name in pattern.findall(source):
        dotted = f"{aliases[alias]}.{name}"
        if name in static_public_names(aliases[alias]) and dotted not in found:
            found.append(dotted)
    return found


def page_of(module: str) -> Path:
    """The page that documents ``module``: api.md for a reader's module, else internals.md."""
    return PAGE if module in READER_MODULES else INTERNALS
