"""Every public name of the reader-facing modules has its arguments documented.

The API page (api.md) renders the docstrings of :data:`tools.api.READER_MODULES`
through napoleon (Google style). For every name in each such module's ``__all__``:

- a function with at least one parameter has an ``Args:`` section with one entry
  per parameter (``*args``/``**kwargs`` by their names) and no entry for a
  parameter it does not have; a function annotated to return a value has a
  ``Returns:`` (a generator context manager: ``Yields:``) section;
- a class defined in the package: each of its public methods (its own or inherited
  from another class of the package) is held to the same rules (a method without
  parameters, like a property, may say what it returns in its summary line alone);
  a dataclass or
  TypedDict has an ``Attributes:`` section naming each of its fields (keys); a
  NamedTuple has a ``#:`` doc comment above each field instead, and no
  ``Attributes:`` section (autodoc lists a NamedTuple's fields as members, so the
  section would describe each twice: a duplicate-object warning, an error in the
  book's ``-W`` build); any other class whose ``__init__`` takes parameters names
  them in the class docstring's ``Args:`` (autodoc shows the class docstring, not
  ``__init__``'s);
- anything else (a constant, a type alias) has a ``#:`` doc comment on the line
  above its assignment: that comment is what the page shows for it (autodoc finds it
  with Sphinx's ``ModuleAnalyzer``, as here).

A failure lists every missing or unknown entry, as ``module.name: what``.

:data:`PENDING` names the objects whose module another change owns; their gaps are
tolerated until it lands, and the test fails once one is documented (to shrink the
list).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import re
import textwrap
import typing
from collections.abc import Callable

import jax
import pytest

from tools import api

# Checks the package's docstrings and API page: the same on every JAX release (conftest.py).
pytestmark = pytest.mark.one_env

#: Objects documented by another change (their module is edited there):
#: ``SolverInfo`` (a NamedTuple) needs a ``#:`` comment above each of its fields.
PENDING: frozenset[str] = frozenset()

_ENTRY = re.compile(r"(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:")


def _section(doc: str, title: str) -> list[str] | None:
    """Entry names of the Google-style section ``title`` in ``doc`` (``None``: absent).

    An entry is a line of the section's least indentation, ``name: text`` or
    ``name (type): text``; the deeper lines continue the entry above them.
    """
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != f"{title}:":
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        depth = min((len(b) - len(b.lstrip()) for b in body if b.strip()), default=None)
        names = []
        for b in body:
            if b.strip() and len(b) - len(b.lstrip()) == depth:
                match = _ENTRY.match(b.strip())
                names.append(match.group(1) if match else b.strip())
        return names
    return None


def _parameters(fn: Callable, *, bound: bool) -> list[str]:
    """Parameter names of ``fn`` as a caller writes them (``*args``, ``**kwargs``)."""
    params = list(inspect.signature(fn).parameters.values())
    if bound and params:
        params = params[1:]  # self or cls
    star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [star.get(p.kind, "") + p.name for p in params]


def _compare(where: str, doc: str, title: str, expected: list[str]) -> list[str]:
    """What ``doc``'s ``title`` section lacks, or names in excess, against ``expected``."""
    if not expected:
        return []
    found = _section(doc, title)
    if found is None:
        return [f"{where}: no {title}: section (expected {', '.join(expected)})"]
    problems = []
    missing = [n for n in expected if n not in found]
    unknown = [n for n in found if n not in expected]
    if missing:
        problems.append(f"{where}: {title}: lacks {', '.join(missing)}")
    if unknown:
        problems.append(f"{where}: {title}: names {', '.join(unknown)}, not a member")
    return problems


def _returns_value(fn: Callable) -> bool:
    """``fn`` is annotated to return something other than ``None``."""
    annotation = inspect.signature(fn).return_annotation
    return annotation not in (None, "None", inspect.Signature.empty)


def _check_function(where: str, fn: Callable, *, bound: bool = False) -> list[str]:
    doc = inspect.getdoc(fn)
    if not doc:
        return [f"{where}: no docstring"]
    params = _parameters(fn, bound=bound)
    problems = _compare(where, doc, "Args", params)
    if (
        (params or not bound)
        and _returns_value(fn)
        and _section(doc, "Returns") is None
        and _section(doc, "Yields") is None
    ):
        problems.append(f"{where}: no Returns: (or Yields:) section")
    return problems


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    if typing.is_typeddict(cls):
        return list(cls.__annotations__)
    return list(getattr(cls, "_fields", ()))  # a NamedTuple


def _commented_fields(cls: type) -> list[str]:
    """The fields of ``cls`` whose annotation in its class body follows a ``#:`` line."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef), source[:200]
    return [
        node.target.id
        for node in body.body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.lineno > 1
        and lines[node.lineno - 2].lstrip().startswith("#:")
    ]


def _own_package(obj: object) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] == "beyondgrad"


def _check_class(where: str, cls: type) -> list[str]:
    doc = cls.__doc__ and inspect.cleandoc(cls.__doc__)
    if not doc:
        return [f"{where}: no docstring"]
    problems = []
    fields = _fields(cls)
    if hasattr(cls, "_fields"):  # a NamedTuple: #: comments, not Attributes:
        bare = [n for n in fields if n not in _commented_fields(cls)]
        if bare:
            problems.append(
                f"{where}: no #: doc comment above field(s) {', '.join(bare)}"
            )
        if _section(doc, "Attributes") is not None:
            problems.append(
                f"{where}: an Attributes: section duplicates the fields autodoc lists; "
                "use #: comments above the fields"
            )
    elif fields:
        problems += _compare(where, doc, "Attributes", fields)
    elif "__init__" in vars(cls) and not issubclass(cls, BaseException):
        problems += _compare(where, doc, "Args", _parameters(cls.__init__, bound=True))
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not _own_package(klass):
            continue
        for name, member in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            if isinstance(member, staticmethod):
                fn, bound = member.__func__, False
            elif isinstance(member, classmethod):
                fn, bound = member.__func__, True
            elif inspect.isfunction(member):
                fn, bound = member, True
            else:
                continue  # a property or class attribute: no arguments
            problems += _check_function(f"{where}.{name}", fn, bound=bound)
    return problems


def _wraps_function(obj: object) -> bool:
    """``obj`` wraps a function (``jax.jit``, ``jax.custom_jvp``, ``functools.wraps``):
    its signature and docstring are the function's."""
    return callable(obj) and inspect.isfunction(inspect.unwrap(obj))


@functools.cache
def _attr_docs(module: str) -> dict:
    """The ``#:`` comments (and docstrings after assignments) autodoc reads."""
    from sphinx.pycode import ModuleAnalyzer

    return ModuleAnalyzer.for_module(module).find_attr_docs()


def undocumented(module: str) -> list[str]:
    """Every missing piece of documentation of ``module``'s public names."""
    mod = importlib.import_module(module)
    problems = []
    for name in mod.__all__:
        obj = getattr(mod, name)
        where = f"{module}.{name}"
        if inspect.isclass(obj) and _own_package(obj):
            problems += _check_class(where, obj)
        elif inspect.isfunction(obj) or _wraps_function(obj):
            problems += _check_function(where, obj)
        elif ("", name) not in _attr_docs(module):
            problems.append(f"{where}: no #: doc comment above its assignment")
    return problems


def _pending(problem: str) -> str | None:
    return next((p for p in PENDING if problem.startswith(p + ":")), None)


@pytest.mark.parametrize("module", sorted(api.READER_MODULES))
def test_public_names_document_their_arguments(module):
    problems = undocumented(module)
    missing = [p for p in problems if _pending(p) is None]
    assert not missing, "undocumented:\n" + "\n".join(missing)
    done = {p for p in PENDING if p.rpartition(".")[0] == module} - {
        _pending(p) for p in problems
    }
    assert not done, f"now documented, remove from PENDING: {sorted(done)}"


def test_the_checker_sees_what_is_missing():
    """The parser reads napoleon's sections as the page does: each way to fail is seen."""

    def fn(a, b, *rest, **extra):
        """Sum.

        Args:
            a: first, a float; continues
                on this line, which names no c: entry.
            b (int): second.
            *rest: more.

        Returns:
            A float.
        """

    assert _section(inspect.getdoc(fn) or "", "Args") == ["a", "b", "*rest"]
    assert _check_function("m.fn", fn) == ["m.fn: Args: lacks **extra"]

    def stale(x):
        """Stale.

        Args:
            y: renamed.
        """

    assert _check_function("m.stale", stale) == [
        "m.stale: Args: lacks x",
        "m.stale: Args: names y, not a member",
    ]

    def bare(x) -> int:
        """No sections."""

    assert _wraps_function(jax.jit(bare)) and not _wraps_function(1.0)
    assert _check_function("m.bare", jax.jit(bare)) == [
        "m.bare: no Args: section (expected x)",
        "m.bare: no Returns: (or Yields:) section",
    ]
    assert _check_function("m.bare", bare) == [
        "m.bare: no Args: section (expected x)",
        "m.bare: no Returns: (or Yields:) section",
    ]

    @dataclasses.dataclass
    class Row:
        """A row.

        Attributes:
            name: its name.
        """

        name: str
        count: int

        def scaled(self, factor):
            """Scaled copy."""

    Row.__module__ = "beyondgrad.fake"  # its methods are held to the rule
    assert _check_class("m.Row", Row) == [
        "m.Row: Attributes: lacks count",
        "m.Row.scaled: no Args: section (expected factor)",
    ]

    class Pair(typing.NamedTuple):
        """A pair.

        Attributes:
            left: the first.
        """

        #: the first
        left: int
        right: int

    assert _check_class("m.Pair", Pair) == [
        "m.Pair: no #: doc comment above field(s) right",
        "m.Pair: an Attributes: section duplicates the fields autodoc lists; "
        "use #: comments above the fields",
    ]
