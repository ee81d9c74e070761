"""What a function receives under each JAX transformation, and how often ``jit`` traces it.

The reusable ideas of Chapter 1 ("Tracers and concreteness"):

* :func:`transform` / :func:`inspect_transformations`: run a function under named
  transformations (``"jit"``, ``"grad"``, ``"vmap"``, ``"jvp"``, ``"vjp"``,
  ``"linearize"``, ``"jacfwd"``, ``"jacrev"``, ``"hessian"`` and nestings such as
  ``"jit(grad)"``) and record what it received:
  the tracer's type and aval, the chain of values inside it, whether a concrete
  value is reachable, which Python conversions work on it, and what the call raised.
  :func:`format_table` prints the observations.
* :func:`count_traces` / :class:`CompilationCounter`: how often ``jit`` runs a
  function's Python body (one run per trace) over a sequence of calls, next to the
  size of ``jit``'s own dispatch cache.
* :func:`error_tree`: the ``jax.errors`` classes as a tree of the installed JAX.
* :func:`jax_log`: turn on one of JAX's logging options (``jax_explain_cache_misses``,
  ``jax_log_compiles``) for a block of code and collect the messages JAX logs.
* :func:`innermost_frames`: the frames of an exception from the caller's innermost
  line down to the JAX function that raised, with JAX's traceback filtering off.

"Concrete" is JAX's own test, :func:`beyondgrad.compat.concrete_value`: for autodiff
tracers (``JVPTracer``, ``LinearizeTracer``) it is the concrete value of the primal,
recursively; an eager ``shard_map`` tracer (``ShardMapTracer``) answers for a value
invariant over every mesh axis; for ``jit`` and ``vmap`` tracers it is ``None``
(``compat.concreteness_answerers`` lists the classes that answer). The exercise
checkers are in :mod:`beyondgrad.exercises.ch1`, the widget callback in
:mod:`beyondgrad.figures.ch1`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import textwrap
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks, compat
from beyondgrad.raises import readable_paths

__all__ = [
    "BASE_TRANSFORMATIONS",
    "CONVERSIONS",
    "DEFAULT_TRANSFORMATIONS",
    "Call",
    "CompilationCounter",
    "Layer",
    "LOG_OPTIONS",
    "Observation",
    "RaisingFrames",
    "TraceLog",
    "call",
    "count_traces",
    "error_tree",
    "format_log",
    "format_table",
    "innermost_frames",
    "inspect_transformations",
    "jax_log",
    "tracer_layers",
    "transform",
]

#: A pytree of arrays (JAX has no narrower public type for it).
PyTree = Any

# --------------------------------------------------------------------------------------
# Transformations, by name
# --------------------------------------------------------------------------------------


def _total(out: PyTree) -> jax.Array:
    """Scalar ``s(out) = sum over leaves of sum(leaf)``: what ``grad``/``vjp`` differentiate."""
    total = sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(out))
    return jnp.asarray(total)


def _ones_like(tree: PyTree) -> PyTree:
    return jax.tree_util.tree_map(jnp.ones_like, tree)


def _wrap_jit(g: Callable) -> Callable:
    return jax.jit(g)


def _wrap_grad(g: Callable) -> Callable:
    return jax.grad(lambda *a: _total(g(*a)))


def _wrap_vmap(g: Callable) -> Callable:
    def batched(*args: PyTree) -> PyTree:
        stacked = jax.tree_util.tree_map(
            lambda a: jnp.stack([jnp.asarray(a)] * 2), args
        )
        out = jax.vmap(g)(*stacked)
        return jax.tree_util.tree_map(lambda o: o[0], out)

    return batched


def _first_arg(g: Callable, args: tuple) -> Callable:
    return lambda a0: g(a0, *args[1:])


def _wrap_jvp(g: Callable) -> Callable:
    def pushed(*args: PyTree) -> PyTree:
        return jax.jvp(_first_arg(g, args), (args[0],), (_ones_like(args[0]),))[1]

    return pushed


def _wrap_vjp(g: Callable) -> Callable:
    def pulled(*args: PyTree) -> PyTree:
        out, pull = jax.vjp(_first_arg(g, args), args[0])
        return pull(_ones_like(out))[0]

    return pulled


def _wrap_linearize(g: Callable) -> Callable:
    def linear(*args: PyTree) -> PyTree:
        _, f_jvp = jax.linearize(_first_arg(g, args), args[0])
        return f_jvp(_ones_like(args[0]))

    return linear


def _wrap_jacfwd(g: Callable) -> Callable:
    def jacobian(*args: PyTree) -> PyTree:
        return jax.jacfwd(_first_arg(g, args))(args[0])

    return jacobian


def _wrap_jacrev(g: Callable) -> Callable:
    def jacobian(*args: PyTree) -> PyTree:
        return jax.jacrev(_first_arg(g, args))(args[0])

    return jacobian


def _wrap_hessian(g: Callable) -> Callable:
    def hessian(*args: PyTree) -> PyTree:
        return jax.hessian(lambda a0: _total(g(a0, *args[1:])))(args[0])

    return hessian


#: The transformations :func:`transform` knows, composable as ``"outer(inner)"``. Each
#: keeps the call signature ``f(*args)`` with unbatched arguments. With ``x = args[0]``
#: and ``s(y)`` the sum of every entry of every output leaf:
#: ``grad`` and ``vjp`` return ``∇_x s(f(x, ...))`` (the cotangent of ones pulled back),
#: ``jvp`` and ``linearize`` return ``∂f(x, ...)·1`` (the tangent of ones pushed
#: forward), ``vmap`` maps over two stacked copies of every argument and returns
#: the first row, ``jacfwd`` and ``jacrev`` return ``∂f/∂x`` and ``hessian`` returns
#: ``∂²s(f(x, ...))/∂x²``, so every transformation computes a value you can check by
#: hand. ``jacfwd`` is ``vmap`` of ``jvp`` over basis tangents, ``jacrev`` ``vmap`` of
#: a VJP over basis cotangents, ``hessian`` ``jacfwd(jacrev)``: nestings in which the
#: primal is not batched.
BASE_TRANSFORMATIONS: dict[str, Callable[[Callable], Callable] | None] = {
    "eager": None,
    "jit": _wrap_jit,
    "grad": _wrap_grad,
    "vmap": _wrap_vmap,
    "jvp": _wrap_jvp,
    "vjp": _wrap_vjp,
    "linearize": _wrap_linearize,
    "jacfwd": _wrap_jacfwd,
    "jacrev": _wrap_jacrev,
    "hessian": _wrap_hessian,
}

#: What the chapter's table shows: each transformation alone, then some nestings.
DEFAULT_TRANSFORMATIONS: tuple[str, ...] = (
    "eager",
    "jit",
    "grad",
    "vmap",
    "jvp",
    "linearize",
    "vjp",
    "jit(grad)",
    "grad(jit)",
    "vmap(grad)",
    "grad(vmap)",
    "jit(vmap)",
    "jacfwd",
    "jacrev",
    "hessian",
)


def _parse_transformation(name: str) -> tuple[str, ...]:
    """``"jit(grad(vmap))"`` -> ``("jit", "grad", "vmap")``, outermost first.

    Raises ``TypeError`` for a non-string and ``ValueError`` (listing the valid names)
    for an unknown or malformed name.
    """
    valid = ", ".join(BASE_TRANSFORMATIONS)
    if not isinstance(name, str):
        raise TypeError(
            "a transformation name must be a str such as 'jit' or 'jit(grad)', "
            f"got {type(name).__name__}"
        )
    text = name.replace(" ", "")
    parts = tuple(text.replace(")", "").split("("))
    if text != "(".join(parts) + ")" * (len(parts) - 1) or not all(parts):
        raise ValueError(
            f"malformed transformation {name!r}: write nestings as 'outer(inner)', "
            f"e.g. 'jit(grad)'; valid names: {valid}"
        )
    unknown = [p for p in parts if p not in BASE_TRANSFORMATIONS]
    if unknown:
        raise ValueError(
            f"unknown transformation {unknown[0]!r} in {name!r}; valid names: {valid} "
            "(nest them as 'outer(inner)', e.g. 'jit(grad)')"
        )
    if "eager" in parts and len(parts) > 1:
        raise ValueError(
            f"'eager' means no transformation and cannot be nested, got {name!r}"
        )
    return parts


def transform(fn: Callable, name: str) -> Callable:
    """``fn`` under the named (possibly nested) transformation, same call signature.

    ``transform(f, "jit(grad)")`` is ``jit(grad(s∘f))`` in the sense of
    :data:`BASE_TRANSFORMATIONS`: the innermost name is applied first.

    Args:
        fn: The function to transform.
        name: A name from :data:`BASE_TRANSFORMATIONS`, or nested ones such as
            ``"jit(grad)"`` or ``"vmap(grad)"``.

    Returns:
        The transformed function.

    Raises:
        TypeError: ``fn`` is not callable or ``name`` is not a str.
        ValueError: ``name`` is unknown or malformed (the message lists the names).
    """
    _checks.function(fn, "fn", "callable")
    g = fn
    for part in reversed(_parse_transformation(name)):
        wrapper = BASE_TRANSFORMATIONS[part]
        if wrapper is not None:
            g = wrapper(g)
    return g


# --------------------------------------------------------------------------------------
# What the function sees
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layer:
    """One level of a (possibly nested) tracer: its type name and aval.

    ``str()`` gives ``"type_name aval"``.

    Attributes:
        type_name: the class name of the value at this level, e.g. ``"JVPTracer"``,
            ``"BatchTracer"`` or ``"ArrayImpl"``.
        aval: its abstract value as ``str(jax.typeof(value))``, e.g. ``"f32[3]"``.
    """

    type_name: str
    aval: str

    def __str__(self) -> str:
        return f"{self.type_name} {self.aval}"


def tracer_layers(x: PyTree) -> tuple[Layer, ...]:
    """The chain of values inside ``x``, outermost first.

    Autodiff tracers hold their primal (``.primal``), batch tracers the batched value
    (``.val``); the chain ends at a tracer with neither (a ``jit`` tracer) or at a
    plain array. ``x`` must be one array, scalar or tracer (not a pytree).

    Args:
        x: one JAX or NumPy array, a Python or NumPy scalar, or a tracer (e.g. the
            argument a transformed function receives).

    Returns:
        One :class:`Layer` per level, outermost (``x`` itself) first.

    Raises:
        TypeError: ``x`` is none of those (e.g. a list or dict: pass one leaf).
    """
    leaf_types = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)
    if not (compat.is_tracer(x) or isinstance(x, leaf_types)):
        raise TypeError(
            f"tracer_layers needs an array, a scalar or a tracer, got {type(x).__name__}; "
            "pass one leaf (jax.tree_util.tree_leaves(tree)[0])"
        )
    layers = []
    while True:
        layers.append(Layer(type(x).__name__, str(jax.typeof(x))))
        if not compat.is_tracer(x):
            break
        candidates = (getattr(x, "primal", None), getattr(x, "val", None))
        inner = next(
            (
                v
                for v in candidates
                if v is not None and (compat.is_tracer(v) or isinstance(v, jax.Array))
            ),
            None,
        )
        if inner is None:
            break
        x = inner
    return tuple(layers)


#: Python conversions tried on the watched argument ``x``; all but the last are tried on
#: the scalar ``s = jnp.sum(x)``, and ``range`` on ``s`` cast to int32 (``range`` of a
#: float raises ``TypeError`` under every transformation, eager included).
CONVERSIONS: dict[str, Callable[[Any], object]] = {
    "bool(s > 0)": lambda x: bool(jnp.sum(x) > 0),
    "int(s)": lambda x: int(jnp.sum(x)),
    "range(s.astype(int32))": lambda x: range(jnp.sum(x).astype(jnp.int32)),
    "float(s)": lambda x: float(jnp.sum(x)),
    "np.asarray(x)": lambda x: np.asarray(x),
}

#: Short column labels for :func:`format_table`.
_SHORT = {
    "bool(s > 0)": "bool",
    "int(s)": "int",
    "range(s.astype(int32))": "range",
    "float(s)": "float",
    "np.asarray(x)": "np",
}


def _is_jax_error(cls_name: str | None) -> bool:
    return cls_name is not None and isinstance(
        getattr(jax.errors, cls_name, None), type
    )


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a function saw under one transformation, and how the call ended.

    Made by :func:`inspect_transformations`; :meth:`row` gives its table row.

    Attributes:
        transformation: the transformation's name, e.g. ``"jit(grad)"``.
        called: whether the function body ran (``False``, e.g., when a cached trace
            was reused); if not, ``layers``, ``concrete`` and ``conversions`` are
            empty.
        layers: the watched argument's :class:`Layer` s, outermost first.
        concrete: whether a concrete value is reachable from the argument.
        conversions: for each label of :data:`CONVERSIONS`, the class name of the
            exception that conversion raised, or ``None`` if it worked.
        error: the class name of the exception the transformed call raised, or
            ``None`` if it returned.
        message: the first line of that exception's message (``""`` if none).
    """

    transformation: str
    called: bool  # False if the function body never ran (e.g. a cached trace)
    layers: tuple[Layer, ...]  # the watched argument, outermost first
    concrete: bool  # a concrete value is reachable from the argument
    conversions: Mapping[
        str, str | None
    ]  # conversion -> error class name, None if it worked
    error: str | None  # class name of the exception the transformed call raised
    message: str  # first line of that exception's message

    @property
    def tracer_type(self) -> str:
        """The outermost layer's type name (``"-"`` if the body never ran)."""
        return self.layers[0].type_name if self.layers else "-"

    @property
    def aval(self) -> str:
        """The outermost layer's aval (``"-"`` if the body never ran)."""
        return self.layers[0].aval if self.layers else "-"

    @property
    def jax_error(self) -> bool:
        """True when :attr:`error` names a class exported by ``jax.errors``."""
        return _is_jax_error(self.error)

    def row(self) -> dict[str, str]:
        """The table row: transformation, tracer, aval, concrete?, what works, inside, raised."""
        works = [_SHORT[c] for c, err in self.conversions.items() if err is None]
        raised = "-"
        if self.error:
            raised = f"jax.errors.{self.error}" if self.jax_error else self.error
        return {
            "transformation": self.transformation,
            "tracer type": self.tracer_type,
            "aval": self.aval,
            "concrete?": "yes" if self.concrete else "no",
            "works": ",".join(works) or "none",
            "inside": " > ".join(str(layer) for layer in self.layers[1:]) or "-",
            "raised": raised,
        }


def inspect_transformations(
    fn: Callable,
    *args: PyTree,
    transformations: Sequence[str] = DEFAULT_TRANSFORMATIONS,
    argnum: int = 0,
) -> list[Observation]:
    """Run ``fn(*args)`` under each named transformation and record what ``fn`` saw.

    For each name, a fresh wrapper of ``fn`` (so no trace cache is reused) records the
    first leaf of positional argument ``argnum`` the first time it is called: its
    tracer layers (:func:`tracer_layers`), whether a concrete value is reachable
    (:func:`beyondgrad.compat.concrete_value` is not ``None``), and which of
    :data:`CONVERSIONS` succeed on it. Then the transformed call runs; an exception is
    recorded (class name, first message line), not raised.

    Args:
        fn: The function to inspect.
        *args: Its positional arguments.
        transformations: The transformation names (as :func:`transform` takes them),
            each run in order.
        argnum: Which positional argument's first leaf to record.

    Returns:
        One :class:`Observation` per name in ``transformations``.

    Raises:
        TypeError: ``fn`` is not callable, ``transformations`` is empty or not a
            sequence, a name is not a str, or ``argnum`` is not an int.
        ValueError: A name is unknown or malformed, or ``argnum`` is negative or
            indexes no argument.
    """
    _checks.function(fn, "fn", "callable (the function to inspect)")
    if isinstance(transformations, str):
        transformations = (transformations,)
    if not isinstance(transformations, Sequence) or not transformations:
        raise TypeError(
            "transformations must be a non-empty sequence of names from "
            f"{list(BASE_TRANSFORMATIONS)}, got {transformations!r}"
        )
    for name in transformations:
        _parse_transformation(name)  # validate all names before running anything
    _checks.integer(argnum, "argnum", minimum=0, meaning="a positional index")
    if not 0 <= argnum < len(args):
        raise ValueError(
            f"argnum must index one of the {len(args)} positional argument(s), got {argnum!r}"
        )
    return [_observe(fn, args, name, argnum) for name in transformations]


def _observe(fn: Callable, args: tuple, name: str, argnum: int) -> Observation:
    seen: dict[str, Any] = {}

    def probe(*a: PyTree, **k: PyTree) -> PyTree:
        if not seen:
            leaves = jax.tree_util.tree_leaves(a[argnum])
            x = leaves[0] if leaves else a[argnum]
            seen["layers"] = tracer_layers(x)
            seen["concrete"] = compat.concrete_value(x) is not None
            conv: dict[str, str | None] = {}
            for label, convert in CONVERSIONS.items():
                try:
                    convert(x)
                    conv[label] = None
                except Exception as e:  # the class of the failure is the observation
                    conv[label] = type(e).__name__
            seen["conversions"] = conv
        return fn(*a, **k)

    error, message = None, ""
    try:
        jax.block_until_ready(transform(probe, name)(*args))
    except Exception as e:  # recorded, not raised: the table shows which class
        error = type(e).__name__
        message = (str(e).strip().splitlines() or [""])[0]
    return Observation(
        transformation=name,
        called=bool(seen),
        layers=seen.get("layers", ()),
        concrete=seen.get("concrete", False),
        conversions=seen.get("conversions", {}),
        error=error,
        message=message,
    )


# Column headers shorter than the row keys (the table must fit a 78-column page).
_HEADERS = {"transformation": "transform"}


def format_table(
    observations: Sequence[Observation], columns: Sequence[str] | None = None
) -> str:
    """The observations as a fixed-width text table (one row per transformation).

    Columns: transformation, tracer type, aval, whether a concrete value is reachable,
    which conversions of :data:`CONVERSIONS` work (``bool``, ``int``, ``range``,
    ``float``, ``np``), the values inside the tracer, and what the call raised (left
    out when no call raised). ``columns`` picks some of them, in the order given (the
    ``transformation`` column always comes first), to keep a table narrow.

    Args:
        observations: What :func:`inspect_transformations` returned (or one
            :class:`Observation`).
        columns: The column names to keep; all when ``None``.

    Returns:
        The table, one line per row, columns padded to a fixed width.

    Raises:
        ValueError: ``observations`` is empty or not a sequence, or a column name is
            unknown.
        TypeError: An entry is not an :class:`Observation`, or ``columns`` is not a
            list of str.
    """
    if isinstance(observations, Observation):
        observations = [observations]
    if not isinstance(observations, Sequence) or not observations:
        raise ValueError(
            "format_table needs a non-empty list of Observation (from inspect_transformations)"
        )
    bad = [type(o).__name__ for o in observations if not isinstance(o, Observation)]
    if bad:
        raise TypeError(
            f"format_table needs Observation objects (from inspect_transformations), got {bad[0]}"
        )
    rows = [o.row() for o in observations]
    cols = list(rows[0])
    if columns is not None:
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise TypeError(f"columns must be a list of column names, got {columns!r}")
        unknown = [c for c in columns if c not in cols]
        if unknown:
            raise ValueError(
                f"format_table has no column {unknown[0]!r}; choose from {cols[1:]}"
            )
        cols = [cols[0], *(c for c in columns if c != cols[0])]
    if "raised" in cols and all(r["raised"] == "-" for r in rows):
        cols.remove("raised")
    header = {c: _HEADERS.get(c, c) for c in cols}
    width = {c: max(len(header[c]), *(len(r[c]) for r in rows)) for c in cols}
    lines = [
        "  ".join(header[c].ljust(width[c]) for c in cols),
        "  ".join("-" * width[c] for c in cols),
    ]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --------------------------------------------------------------------------------------
# The jax.errors family
# --------------------------------------------------------------------------------------


def _jax_error_classes() -> dict[str, list[str]]:
    """Each public class in ``jax.errors`` -> its public base classes, nearest first.

    Read from the live classes' ``__mro__`` (private mixins and ``object`` skipped), so
    the hierarchy printed in the book is the one of the installed JAX.
    """
    out = {}
    for name in sorted(dir(jax.errors)):
        cls = getattr(jax.errors, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, BaseException)
            and not name.startswith("_")
        ):
            out[name] = [
                b.__name__
                for b in cls.__mro__[1:]
                if not b.__name__.startswith("_") and b is not object
            ]
    return out


def error_tree() -> str:
    """The ``jax.errors`` classes as an indented tree under their Python base classes.

    Returns:
        The text, one class a line from ``BaseException`` down, each indented four
        spaces deeper than its base class; the ``jax.errors`` classes are written
        ``jax.errors.Name``.
    """
    classes = _jax_error_classes()
    children: dict[str, set[str]] = {}
    for name, bases in classes.items():
        chain = [
            name,
            *bases,
        ]  # e.g. TracerBoolConversionError < ConcretizationTypeError < ...
        for child, parent in zip(chain, chain[1:]):
            children.setdefault(parent, set()).add(child)
    lines: list[str] = []

    def walk(node: str, depth: int) -> None:
        mark = "jax.errors." if node in classes else ""
        lines.append("    " * depth + mark + node)
        for kid in sorted(children.get(node, [])):
            walk(kid, depth + 1)

    walk("BaseException", 0)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Counting traces
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """Positional and keyword arguments of one call (see :func:`call`).

    Attributes:
        args: the positional arguments, in order.
        kwargs: the keyword arguments, by name.
    """

    args: tuple
    kwargs: Mapping[str, Any]

    def signature(self) -> str:
        """The call in words: each positional argument's kind, value and aval (``~``
        marks a weak type), and the keyword arguments (static in this book's uses) as
        values."""

        def show(v: object) -> str:
            if isinstance(v, jax.Array):
                return f"jax.Array {jax.typeof(v)}"
            if isinstance(v, (np.ndarray, np.generic)):
                shape = ",".join(str(d) for d in np.shape(v))
                return f"np.ndarray {np.asarray(v).dtype}[{shape}]"
            if isinstance(v, (int, float, complex)) and not isinstance(v, bool):
                return f"Python {type(v).__name__} {v!r} ({jax.typeof(v)})"
            return repr(v)

        parts = [show(a) for a in self.args] + [
            f"{k}={v!r}" for k, v in self.kwargs.items()
        ]
        return f"({', '.join(parts)})"


def call(*args: PyTree, **kwargs: PyTree) -> Call:
    """Record the arguments of one call, for :func:`count_traces`.

    Args:
        *args: The call's positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        A :class:`Call` holding them.
    """
    return Call(args, kwargs)


_JIT_OPTIONS = frozenset(
    {"static_argnums", "static_argnames", "donate_argnums", "donate_argnames"}
)


class CompilationCounter:
    """``jax.jit(fn, **jit_kwargs)`` that counts how often ``fn``'s Python body runs.

    ``jit`` runs the body once per trace, and traces once per new cache key (the avals
    of array arguments and the values of static ones), so ``traces`` counts the keys
    seen. The wrapper is a fresh function, so no trace cached for ``fn`` elsewhere is
    reused. :meth:`cache_size` is ``jit``'s own count of dispatch-cache entries
    (:func:`beyondgrad.compat.jit_cache_size`); it grows at every trace, and also at
    some calls that reuse a trace (a NumPy argument with the same aval).

    Calling the counter calls the jitted function with the same arguments.

    Args:
        fn: the function to jit and count.
        **jit_kwargs: passed to ``jax.jit``: only ``static_argnums``,
            ``static_argnames``, ``donate_argnums`` and ``donate_argnames``.

    Attributes:
        fn: the function given.
        traces: how many times ``fn``'s body has run (starts at 0).
        jitted: the ``jax.jit`` of the counting wrapper.

    Raises:
        TypeError: ``fn`` is not callable, or another ``jit`` option is given.
    """

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        _checks.function(fn, "fn", "callable")
        bad = set(jit_kwargs) - _JIT_OPTIONS
        if bad:
            raise TypeError(
                f"unsupported jit option(s) {sorted(bad)}; allowed: {sorted(_JIT_OPTIONS)}"
            )
        self.fn = fn
        self.traces = 0

        def counted(*args: PyTree, **kwargs: PyTree) -> PyTree:
            self.traces += 1
            return fn(*args, **kwargs)

        self.jitted = jax.jit(counted, **jit_kwargs)

    def __call__(self, *args: PyTree, **kwargs: PyTree) -> PyTree:
        return self.jitted(*args, **kwargs)

    def cache_size(self) -> int:
        """Entries in the dispatch cache of this counter's ``jit`` function."""
        return compat.jit_cache_size(self.jitted)


@dataclasses.dataclass(frozen=True)
class TraceLog:
    """Per call: did ``jit`` trace the function again, and the cache size after it.

    Made by :func:`count_traces`; ``str()`` gives one line per call and the total.

    Attributes:
        calls: the calls, in the order made.
        retraced: per call, whether it ran the function's Python body (a new trace).
        cache_sizes: per call, ``jit``'s dispatch-cache entries after it
            (:meth:`CompilationCounter.cache_size`).
    """

    calls: tuple[Call, ...]
    retraced: tuple[bool, ...]
    cache_sizes: tuple[int, ...]

    @property
    def traces(self) -> int:
        """How many of the calls traced the function."""
        return sum(self.retraced)

    def __str__(self) -> str:
        lines = [f"{'call':<4}  {'traced?':<7}  {'cache':>5}  arguments"]
        for k, (c, r, s) in enumerate(zip(self.calls, self.retraced, self.cache_sizes)):
            lines.append(f"{k:<4}  {'yes' if r else 'no':<7}  {s:>5}  {c.signature()}")
        lines.append(f"{self.traces} trace(s) over {len(self.calls)} call(s)")
        return "\n".join(lines)


def count_traces(
    fn: Callable, calls: Sequence[Call | tuple], **jit_kwargs: Any
) -> TraceLog:
    """Call a fresh ``jax.jit(fn, **jit_kwargs)`` on each of ``calls`` in order; log retraces.

    A call is a :class:`Call` (from :func:`call`) or a tuple of positional arguments.
    ``retraced[k]`` is True when call ``k`` ran ``fn``'s Python body, i.e. ``jit`` found
    no cached trace for that call's key (avals of array arguments, values of static
    arguments). The counter is new at every call of this function, so the log does not
    depend on what ran before.

    Args:
        fn: The function to jit.
        calls: The calls, in order: :class:`Call` records or tuples of positional
            arguments.
        **jit_kwargs: Passed to ``jax.jit`` (e.g. ``static_argnums``).

    Returns:
        A :class:`TraceLog`: per call, whether ``fn`` was traced again and the cache
        size after it.

    Raises:
        TypeError: ``fn`` is not callable, or ``calls`` is empty, not a sequence, or
            holds an entry that is neither a :class:`Call` nor a tuple.
    """
    _checks.function(fn, "fn", "callable")
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)) or not calls:
        raise TypeError(
            "calls must be a non-empty list of call(...) records or tuples of positional "
            f"arguments, got {type(calls).__name__}"
        )
    normalized = []
    for k, c in enumerate(calls):
        if isinstance(c, Call):
            normalized.append(c)
        elif isinstance(c, tuple):
            normalized.append(Call(c, {}))
        else:
            raise TypeError(
                f"calls[{k}] must be call(...) or a tuple of positional arguments, "
                f"got {type(c).__name__}"
            )
    counter = CompilationCounter(fn, **jit_kwargs)
    retraced, sizes = [], []
    for c in normalized:
        before = counter.traces
        jax.block_until_ready(counter(*c.args, **c.kwargs))
        retraced.append(counter.traces > before)
        sizes.append(counter.cache_size())
    return TraceLog(tuple(normalized), tuple(retraced), tuple(sizes))


# --------------------------------------------------------------------------------------
# What JAX logs, and where it raised
# --------------------------------------------------------------------------------------

#: The boolean options that make JAX log why it traces or compiles.
LOG_OPTIONS = ("jax_explain_cache_misses", "jax_log_compiles")


class _Collect(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


@contextlib.contextmanager
def jax_log(option: str) -> Iterator[list[str]]:
    """Turn a JAX logging option on for a block and collect what JAX logs.

    ``option`` is one of :data:`LOG_OPTIONS`. Inside the block the option is ``True``
    and every message of the ``"jax"`` logger is appended to the yielded list instead
    of going to JAX's own handlers (so nothing is printed twice). On exit the option,
    the handlers and propagation are restored::

        with tracers.jax_log("jax_explain_cache_misses") as messages:
            jax.jit(f)(x)
        print("\\n".join(messages))

    Args:
        option: the option to turn on, one of :data:`LOG_OPTIONS`
            (``"jax_explain_cache_misses"`` or ``"jax_log_compiles"``).

    Yields:
        The list the messages are appended to, as they are logged; it keeps them
        after the block.

    Raises:
        ValueError: ``option`` is not in :data:`LOG_OPTIONS`.
    """
    if option not in LOG_OPTIONS:
        raise ValueError(f"option must be one of {LOG_OPTIONS}, got {option!r}")
    messages: list[str] = []
    logger = logging.getLogger("jax")
    handlers, propagate = list(logger.handlers), logger.propagate
    before = bool(getattr(jax.config, option))
    logger.handlers = [_Collect(messages)]
    logger.propagate = False
    jax.config.update(option, True)
    try:
        yield messages
    finally:
        jax.config.update(option, before)
        logger.handlers = handlers
        logger.propagate = propagate


_LOG_PATH = re.compile(r"(?:[^\s():]*/)([^/\s():]+\.py)")
_LOG_ID = re.compile(r" id=\d+")


def format_log(messages: Sequence[str], width: int = 78) -> str:
    """JAX's log messages, readable on a page of ``width`` columns.

    File paths are cut to the file name (a notebook cell's to ``<cell>``), object ids (``id=140...``, different on
    every run) are dropped, and long lines are wrapped with their indentation kept.
    Messages are separated by a blank line.

    Args:
        messages: The log messages (what ``jax_log`` collected), a list of str.
        width: The page width in columns, an int ``>= 20``.

    Returns:
        The messages, cleaned and wrapped, one block each.

    Raises:
        TypeError: ``messages`` is not a list of str, or ``width`` is not an int.
        ValueError: ``width`` is below 20.
    """
    if isinstance(messages, str) or not isinstance(messages, Sequence):
        raise TypeError(
            "messages must be a list of strings (what jax_log collected), "
            f"got {type(messages).__name__}"
        )
    _checks.integer(width, "width", minimum=20)
    blocks = []
    for message in messages:
        lines = []
        shown = _LOG_PATH.sub(r"\1", readable_paths(str(message)))
        for line in _LOG_ID.sub("", shown).splitlines():
            indent = line[: len(line) - len(line.lstrip())]
            lines += textwrap.wrap(
                line, width, subsequent_indent=indent + "  ", break_on_hyphens=False
            ) or [""]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


@dataclasses.dataclass(frozen=True)
class RaisingFrames:
    """An exception and the frames from the caller's innermost line to the raise.

    ``str()`` gives the error's class and first message line, then each frame as
    ``folder/file.py:line in function`` with its source line below it, every line cut
    to :attr:`width` columns.

    Attributes:
        error: the exception raised.
        frames: the frames from the caller's innermost line down to the one that
            raised, outermost first.
        width: the columns ``str()`` cuts each line to; 78 by default.
    """

    error: BaseException
    frames: tuple[traceback.FrameSummary, ...]
    width: int = 78

    def __str__(self) -> str:
        def cut(text: str) -> str:
            return text if len(text) <= self.width else text[: self.width - 1] + "…"

        message = str(self.error).splitlines()
        head = f"{type(self.error).__name__}: {message[0] if message else ''}"
        lines = textwrap.wrap(head, self.width, subsequent_indent="  ") or [head]
        for fr in self.frames:
            where = f"{Path(fr.filename).parent.name}/{Path(fr.filename).name}"
            where = readable_paths(where)  # a notebook cell's temp file: <cell>
            lines.append(cut(f"  {where}:{fr.lineno} in {fr.name}"))
            if fr.line:
                lines.append(cut(f"      {fr.line.strip()}"))
        return "\n".join(lines)


def innermost_frames(fn: Callable, *args: Any, **kwargs: Any) -> RaisingFrames:
    """Call ``fn(*args, **kwargs)``, which must raise; return where it raised.

    JAX hides its own frames from tracebacks (``jax_traceback_filtering``); this turns
    the filtering off for the one call and keeps the frames from the innermost frame
    outside the ``jax`` package (the caller's last line) down to the frame that
    raised. ``str()`` of the result prints them one per line as
    ``folder/file.py:line in function: source``.

    Args:
        fn: The function to call; it must raise.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        A :class:`RaisingFrames`: the exception and the frames from the caller's
        line down to the one that raised.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``fn`` returned without raising.
    """
    _checks.function(fn, "fn", "callable")
    previous = jax.config.jax_traceback_filtering
    jax.config.update("jax_traceback_filtering", "off")  # keep JAX's own frames
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any error is the answer
        error: BaseException = e
    else:
        raise ValueError(
            f"{getattr(fn, '__name__', fn)!r} returned without raising: "
            "innermost_frames shows where a call fails; pass one that raises"
        )
    finally:
        jax.config.update("jax_traceback_filtering", previous)
    frames = traceback.extract_tb(error.__traceback__)[1:]  # drop this function's
    jax_dir = Path(jax.__file__).parent
    outside = [
        k for k, fr in enumerate(frames) if jax_dir not in Path(fr.filename).parents
    ]
    start = outside[-1] if outside else 0
    return RaisingFrames(error, tuple(frames[start:]))
