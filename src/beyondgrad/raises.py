"""Cells that must fail: show the error, check its class, and let *Run all* go on.

A chapter shows many errors on purpose. A plain failing cell stops *Run all* on Colab
and in Jupyter at the first of them, so each deliberate-error cell starts with the cell
magic this module defines::

    %%raises jax.errors.TracerBoolConversionError
    jax.jit(f)(1.0)

The magic runs the rest of the cell in the notebook's namespace and then

* if the cell raised exactly the named class: prints the error (class, message and the
  frames of the reader's own code, i.e. notebook cells and ``beyondgrad``, with JAX's
  internal frames left out) and returns, so the next cell runs;
* if it raised another class: lets that exception propagate unchanged, so the notebook
  (and the book build, which allows no errors) stops there with the real traceback;
* if it raised nothing: raises :class:`ExpectedErrorMissing`, which stops it too.

Load it once per notebook with ``%load_ext beyondgrad.raises``. Outside IPython the same
check is the context manager :func:`expect_error`. Importing this module has no side
effects; only ``load_ipython_extension`` registers the magic.
"""

from __future__ import annotations

import builtins
import linecache
import os
import re
import sys
import textwrap
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

__all__ = [
    "ExpectedErrorMissing",
    "ReadablePaths",
    "expect_error",
    "format_error",
    "load_ipython_extension",
    "readable_paths",
    "resolve_exception",
]

#: Width of the printed message: the book's content column fits about 78 characters.
WIDTH = 78
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: Names that IPython and ipykernel give cells in messages (machine-specific paths):
#: ``/tmp/ipykernel_123/3738211955.py``, its file name alone, ``<ipython-input-4-…>``.
_CELL_FILE = re.compile(
    r"(?:(?:\S*/)?ipykernel_\d+/|(?<![\w/.]))\d{6,}\.py\b|<ipython-input-[\w-]+>"
)
#: The folder part of an installed package's path (``…/site-packages/``) or of this
#: package's source tree (``…/src/`` before ``beyondgrad/``).
_INSTALL_PREFIX = re.compile(
    r"(?:[^\s\"'()<>:]*/)?(?:site|dist)-packages/|[^\s\"'()<>:]*/src/(?=beyondgrad/)"
)


class ExpectedErrorMissing(AssertionError):
    """A cell that should have raised an exception finished without one."""


def resolve_exception(name: str, namespace: dict[str, Any]) -> type[BaseException]:
    """The exception class that ``name`` (``TypeError``, ``jax.errors.X``) names.

    The first dotted part is looked up in ``namespace`` (the notebook's variables), then
    among the builtins; the rest are attributes.

    Args:
        name: A class name, plain or dotted (``"TypeError"``, ``"jax.errors.X"``).
        namespace: The variables to look the first part up in (a notebook's
            ``user_ns``).

    Returns:
        The exception class.

    Raises:
        ValueError: ``name`` does not name an exception class; the message says which
            part was not found.
    """
    parts = name.strip().split(".")
    if not name.strip() or not all(p.isidentifier() for p in parts):
        raise ValueError(
            f"%%raises needs an exception class, e.g. '%%raises TypeError' or "
            f"'%%raises jax.errors.ConcretizationTypeError'; got {name!r}"
        )
    head, *rest = parts
    if head in namespace:
        obj = namespace[head]
    elif hasattr(builtins, head):
        obj = getattr(builtins, head)
    else:
        raise ValueError(
            f"%%raises {name}: {head!r} is not defined here; import it first "
            f"(e.g. 'import jax') or use the full dotted name"
        )
    for i, attr in enumerate(rest):
        if not hasattr(obj, attr):
            where = ".".join(parts[: i + 1])
            raise ValueError(f"%%raises {name}: {where} has no attribute {attr!r}")
        obj = getattr(obj, attr)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ValueError(f"%%raises {name}: {obj!r} is not an exception class")
    return obj


def readable_paths(text: str) -> str:
    """``text`` with the paths only this machine has made readable anywhere.

    An installed package's file is shown from the package on
    (``…/site-packages/jax/_src/numpy/lax_numpy.py`` becomes
    ``jax/_src/numpy/lax_numpy.py``; ``…/src/beyondgrad/x.py``, ``beyondgrad/x.py``),
    and a notebook cell's temporary file (``/tmp/ipykernel_7/3738211955.py``, or its
    name alone) becomes ``<cell>``. Line and column numbers are kept.

    Args:
        text: any text, e.g. a traceback or a log message.

    Returns:
        ``text`` with those paths rewritten; the rest unchanged.
    """
    return _CELL_FILE.sub("<cell>", _INSTALL_PREFIX.sub("", text))


class ReadablePaths:
    """A :mod:`logging` filter that applies :func:`readable_paths` to each record's
    message (JAX's ``jax_explain_cache_misses`` and ``jax_log_compiles`` messages
    name cells and files by their paths on this machine)."""

    def filter(self, record: Any) -> bool:
        """Rewrite ``record``'s message in place; never drop it.

        Args:
            record: a :class:`logging.LogRecord`; where :func:`readable_paths` changes
                its formatted message, that becomes its ``msg`` (and its ``args``
                ``None``).

        Returns:
            Always ``True`` (the record is logged).
        """
        message = record.getMessage()
        readable = readable_paths(message)
        if readable != message:
            record.msg, record.args = readable, None
        return True


def _is_readers_frame(filename: str) -> bool:
    """A notebook cell (no file on disk) or this package's own code."""
    if filename.startswith("<") and filename.endswith(">"):
        return not filename.startswith("<frozen")
    if not os.path.exists(filename):  # ipykernel's cell "files" exist only in linecache
        return True
    return os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


def _frame_label(filename: str) -> str:
    if os.path.exists(filename):
        return "beyondgrad/" + os.path.relpath(filename, _PACKAGE_DIR)
    return "cell"


def _wrap(text: str) -> str:
    lines = []
    for line in text.splitlines() or [""]:
        lines.extend(
            textwrap.wrap(
                line,
                WIDTH,
                subsequent_indent="  " if line[:1] not in (" ", "") else "",
                break_long_words=False,
                break_on_hyphens=False,
            )
            or [""]
        )
    return "\n".join(lines)


def format_error(error: BaseException, *, expected: str | None = None) -> str:
    """The error as the reader should see it: frames of their own code, then the message.

    JAX's internal frames (and IPython's, and this module's) are left out; each kept
    frame shows where it is (``cell`` or ``beyondgrad/<module>.py``), the function and
    the line. The message is wrapped at :data:`WIDTH` characters.

    Args:
        error: The exception caught, with its traceback.
        expected: The name the lesson expects it under (e.g. ``"TypeError"``); when
            given, the head says "raised, as expected" and the message is prefixed
            with it instead of the class's module and qualified name.

    Returns:
        The text: a head line, the reader's frames (innermost last), the message.
    """
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if _is_readers_frame(f.filename)
        and os.path.abspath(f.filename) != os.path.abspath(__file__)
    ]
    cls = type(error)
    qualname = cls.__name__ if cls.__module__ == "builtins" else cls.__qualname__
    head = f"{qualname} raised, as expected" if expected else f"{qualname} raised"
    out = [head + " (the next cells still run).", "Your code's frames, innermost last:"]
    for f in frames:
        line = (f.line or linecache.getline(f.filename, f.lineno or 0)).strip()
        where = f"  {_frame_label(f.filename)}, line {f.lineno}, in {f.name}"
        out.append(where)
        if line:
            out.append("    " + textwrap.shorten(line, WIDTH - 4, placeholder=" ..."))
    if not frames:
        out.append("  (none: the error was raised inside JAX)")
    module = cls.__module__
    full = expected or (qualname if module == "builtins" else f"{module}.{qualname}")
    out.append(_wrap(readable_paths(f"{full}: {error}")))
    return "\n".join(out)


@contextmanager
def expect_error(
    exception: type[BaseException],
    *,
    name: str | None = None,
    stream: IO[str] | None = None,
) -> Iterator[None]:
    """Run the ``with`` body, which must raise exactly ``exception``.

    The expected error is printed (:func:`format_error`) to ``stream`` (default
    ``sys.stderr``) and swallowed, under ``name`` (default: the class's module and
    qualified name); any other exception propagates unchanged; no
    exception raises :class:`ExpectedErrorMissing`. A subclass of ``exception`` counts as
    another class: the book pins the class each lesson shows.

    Args:
        exception: The exception class the body must raise.
        name: The name printed for it (e.g. ``"jax.errors.TracerBoolConversionError"``).
        stream: Where the formatted error is printed; ``sys.stderr`` when ``None``.

    Yields:
        Nothing; the body runs inside the context.

    Raises:
        TypeError: ``exception`` is not an exception class.
        ExpectedErrorMissing: the body raised nothing.
    """
    if not (isinstance(exception, type) and issubclass(exception, BaseException)):
        raise TypeError(
            f"expect_error needs an exception class such as TypeError, "
            f"got {exception!r}"
        )
    name = name or f"{exception.__module__}.{exception.__qualname__}"
    try:
        yield
    except BaseException as error:  # noqa: BLE001 (re-raised unless it is the one)
        if type(error) is not exception:
            raise
        print(format_error(error, expected=name), file=stream or sys.stderr)
        return
    raise ExpectedErrorMissing(
        f"this cell should raise {name}, but it finished without an error: the "
        "behaviour it demonstrates has changed (check the JAX version and the text)"
    )


def _raises_magic(shell: Any, line: str, cell: str) -> None:
    exception = resolve_exception(line, shell.user_ns)
    # Compile like IPython does, so the cell's frames show its own lines.
    source = shell.transform_cell(cell)
    filename = shell.compile.cache(source, shell.execution_count)
    code = compile(source, filename, "exec")
    with expect_error(exception, name=line.strip()):
        exec(code, shell.user_global_ns, shell.user_ns)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext beyondgrad.raises``: register the ``%%raises`` cell magic, and make
    log messages show paths as :func:`readable_paths` does (a :class:`ReadablePaths`
    filter on the handlers that print JAX's warnings in a notebook: the ``jax`` and
    root loggers' handlers and logging's last-resort handler). Loading it again adds
    no second filter to a handler.

    Args:
        ipython: the running IPython shell (IPython passes it on ``%load_ext``).
    """
    import logging

    handlers = [*logging.getLogger("jax").handlers, *logging.getLogger().handlers]
    for where in [*handlers, logging.lastResort]:
        if where is not None and not any(
            isinstance(f, ReadablePaths) for f in where.filters
        ):
            where.addFilter(ReadablePaths())

    def raises(line: str, cell: str) -> None:
        """%%raises ClassName: the cell must raise exactly that class; show the error
        and go on (see ``beyondgrad.raises``)."""
        _raises_magic(ipython, line, cell)

    ipython.register_magic_function(raises, magic_kind="cell", magic_name="raises")
