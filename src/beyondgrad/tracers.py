"""What a function receives under each JAX transformation, and how often ``jit`` traces it.

Chapter 1 ("Tracers and concreteness") is built on four pieces:

* :func:`inspect_transformations` runs a function under named transformations
  (``"jit"``, ``"grad"``, ``"vmap"``, ``"jvp"``, ``"vjp"``, ``"linearize"`` and nestings
  such as ``"jit(grad)"``) and reports, per transformation, what the function saw: the
  tracer's type, its aval, the chain of tracers inside it, whether a concrete value is
  reachable, which Python conversions (``bool``, ``int``, ``range``, ``float``,
  ``np.asarray``) work on it, and whether the call raised (and which class).
* :class:`CompilationCounter` / :func:`count_traces`: how many times a jitted function
  was traced (its Python body ran) over a sequence of calls, next to the size of
  ``jit``'s dispatch cache.
* the exercise checkers :func:`check_fix_jit`, :func:`check_predict_retraces` and
  :func:`check_finite_grad`;
* :func:`receives`, the callback of the chapter's widget, and the two figures
  :func:`plot_concreteness` and :func:`plot_layers`.

"Concrete" follows JAX's own definition: ``jax._src.core.to_concrete_value(x)`` is not
``None``. For autodiff tracers (``JVPTracer``, ``LinearizeTracer``) it returns the
concrete value of the primal; for ``jit``/``vmap`` tracers it returns ``None``. (Before
JAX 0.4.36 the same information lived in a ``ConcreteArray`` aval.)
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import exercises

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# --------------------------------------------------------------------------------------
# Transformations, by name
# --------------------------------------------------------------------------------------


def _total(out: Any) -> jax.Array:
    """Scalar ``sum_leaves sum(leaf)``: what ``grad``/``vjp`` differentiate."""
    return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(out))


def _ones_like(tree: Any) -> Any:
    return jax.tree_util.tree_map(jnp.ones_like, tree)


def _wrap_jit(g: Callable) -> Callable:
    return jax.jit(g)


def _wrap_grad(g: Callable) -> Callable:
    return jax.grad(lambda *a: _total(g(*a)))


def _wrap_vmap(g: Callable) -> Callable:
    def batched(*args: Any) -> Any:
        stacked = jax.tree_util.tree_map(lambda a: jnp.stack([jnp.asarray(a)] * 2), args)
        out = jax.vmap(g)(*stacked)
        return jax.tree_util.tree_map(lambda o: o[0], out)

    return batched


def _first_arg(g: Callable, args: tuple) -> Callable:
    return lambda a0: g(a0, *args[1:])


def _wrap_jvp(g: Callable) -> Callable:
    def pushed(*args: Any) -> Any:
        return jax.jvp(_first_arg(g, args), (args[0],), (_ones_like(args[0]),))[1]

    return pushed


def _wrap_vjp(g: Callable) -> Callable:
    def pulled(*args: Any) -> Any:
        out, pull = jax.vjp(_first_arg(g, args), args[0])
        return pull(_ones_like(out))[0]

    return pulled


def _wrap_linearize(g: Callable) -> Callable:
    def linear(*args: Any) -> Any:
        _, f_jvp = jax.linearize(_first_arg(g, args), args[0])
        return f_jvp(_ones_like(args[0]))

    return linear


#: The transformations :func:`inspect_transformations` knows, innermost-first composable
#: as ``"outer(inner)"``. Each keeps the call signature ``f(*args)`` with unbatched
#: arguments: ``grad``/``vjp`` differentiate the sum of all outputs, autodiff is with
#: respect to the first argument (tangent/cotangent of ones), and ``vmap`` maps over two
#: stacked copies of every argument and returns the first row.
BASE_TRANSFORMATIONS: dict[str, Callable[[Callable], Callable] | None] = {
    "eager": None,
    "jit": _wrap_jit,
    "grad": _wrap_grad,
    "vmap": _wrap_vmap,
    "jvp": _wrap_jvp,
    "vjp": _wrap_vjp,
    "linearize": _wrap_linearize,
}

#: What the chapter's table shows: each transformation alone, then some nestings.
DEFAULT_TRANSFORMATIONS: tuple[str, ...] = (
    "eager", "jit", "grad", "vmap", "jvp", "linearize", "vjp",
    "jit(grad)", "grad(jit)", "vmap(grad)", "grad(vmap)", "jit(vmap)",
)


def parse_transformation(name: str) -> tuple[str, ...]:
    """``"jit(grad(vmap))"`` -> ``("jit", "grad", "vmap")``, outermost first.

    Raises ``TypeError`` for a non-string and ``ValueError`` (listing the valid names)
    for an unknown or malformed name.
    """
    valid = ", ".join(BASE_TRANSFORMATIONS)
    if not isinstance(name, str):
        raise TypeError(f"a transformation name must be a str such as 'jit' or 'jit(grad)', got {type(name).__name__}")
    text = name.replace(" ", "")
    parts = tuple(text.replace(")", "").split("("))
    if text != "(".join(parts) + ")" * (len(parts) - 1) or not all(parts):
        raise ValueError(f"malformed transformation {name!r}: write nestings as 'outer(inner)', e.g. 'jit(grad)'; "
                         f"valid names: {valid}")
    unknown = [p for p in parts if p not in BASE_TRANSFORMATIONS]
    if unknown:
        raise ValueError(f"unknown transformation {unknown[0]!r} in {name!r}; valid names: {valid} "
                         "(nest them as 'outer(inner)', e.g. 'jit(grad)')")
    if "eager" in parts and len(parts) > 1:
        raise ValueError(f"'eager' means no transformation and cannot be nested, got {name!r}")
    return parts


def transform(fn: Callable, name: str) -> Callable:
    """``fn`` under the named (possibly nested) transformation, same call signature."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    g = fn
    for part in reversed(parse_transformation(name)):
        wrapper = BASE_TRANSFORMATIONS[part]
        if wrapper is not None:
            g = wrapper(g)
    return g


# --------------------------------------------------------------------------------------
# What the function sees
# --------------------------------------------------------------------------------------


def concrete_value(x: Any) -> Any | None:
    """The concrete value behind ``x`` if JAX can reach one, else ``None``.

    A plain array is its own concrete value. A tracer answers through its
    ``to_concrete_value`` method: autodiff tracers return their primal's concrete
    value, ``jit``/``vmap`` tracers return ``None``. This is
    ``jax._src.core.to_concrete_value`` (private, the same on JAX 0.8.2 .. 0.12).
    """
    from jax._src import core

    return core.to_concrete_value(x)


def is_tracer(x: Any) -> bool:
    """True if ``x`` is a JAX tracer (``jax.core.Tracer``)."""
    from jax._src import core

    return isinstance(x, core.Tracer)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One level of a (possibly nested) tracer: its type name and aval."""

    type_name: str
    aval: str

    def __str__(self) -> str:
        return f"{self.type_name} {self.aval}"


def tracer_layers(x: Any) -> tuple[Layer, ...]:
    """The chain of values inside ``x``, outermost first.

    Autodiff tracers hold their primal (``.primal``), batch tracers the batched value
    (``.val``); the chain ends at a tracer with neither (a ``jit`` tracer) or at a
    plain array.
    """
    layers = []
    while True:
        layers.append(Layer(type(x).__name__, str(jax.typeof(x))))
        if not is_tracer(x):
            break
        inner = next((v for v in (getattr(x, "primal", None), getattr(x, "val", None))
                      if v is not None and (is_tracer(v) or isinstance(v, jax.Array))), None)
        if inner is None:
            break
        x = inner
    return tuple(layers)


#: Python conversions tried on the watched argument (reduced to a scalar by ``sum``).
CONVERSIONS: dict[str, Callable[[Any], Any]] = {
    "bool(x > 0)": lambda x: bool(jnp.sum(x) > 0),
    "int(x)": lambda x: int(jnp.sum(x)),
    "range(x)": lambda x: operator.index(jnp.sum(x).astype(jnp.int32)),
    "float(x)": lambda x: float(jnp.sum(x)),
    "np.asarray(x)": lambda x: np.asarray(x),
}


def _error_name(e: BaseException) -> str:
    return type(e).__name__


def is_jax_error(cls_name: str | None) -> bool:
    """True if ``cls_name`` names a class exported by ``jax.errors``."""
    return cls_name is not None and isinstance(getattr(jax.errors, cls_name, None), type)


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a function saw under one transformation, and how the call ended."""

    transformation: str
    called: bool  # False if the function body never ran (e.g. a cached trace)
    layers: tuple[Layer, ...]  # the watched argument, outermost first
    concrete: bool  # a concrete value is reachable from the argument
    conversions: Mapping[str, str | None]  # conversion -> error class name, None if it worked
    error: str | None  # class name of the exception the transformed call raised
    message: str  # first line of that exception's message

    @property
    def tracer_type(self) -> str:
        return self.layers[0].type_name if self.layers else "-"

    @property
    def aval(self) -> str:
        return self.layers[0].aval if self.layers else "-"

    @property
    def jax_error(self) -> bool:
        return is_jax_error(self.error)

    def row(self) -> dict[str, str]:
        """The table row: transformation, tracer, aval, concrete?, chain, raised."""
        return {
            "transformation": self.transformation,
            "tracer type": self.tracer_type,
            "aval": self.aval,
            "concrete?": "yes" if self.concrete else "no",
            "inside": " > ".join(str(layer) for layer in self.layers[1:]) or "-",
            "raised": (f"jax.errors.{self.error}" if self.jax_error else self.error) if self.error else "-",
        }


def inspect_transformations(
    fn: Callable,
    *args: Any,
    transformations: Sequence[str] = DEFAULT_TRANSFORMATIONS,
    argnum: int = 0,
) -> list[Observation]:
    """Run ``fn(*args)`` under each named transformation and record what ``fn`` saw.

    For each name, a fresh wrapper of ``fn`` (so no trace cache is reused) records the
    positional argument ``argnum`` the first time it is called: its tracer layers, whether
    a concrete value is reachable (:func:`concrete_value`), and which of
    :data:`CONVERSIONS` succeed on it. Then the transformed call runs; an exception is
    recorded (class name, first message line), not raised.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable (the function to inspect), got {type(fn).__name__}")
    if isinstance(transformations, str):
        transformations = (transformations,)
    if not isinstance(transformations, Sequence) or not transformations:
        raise TypeError(f"transformations must be a non-empty sequence of names from {list(BASE_TRANSFORMATIONS)}, "
                        f"got {transformations!r}")
    for name in transformations:
        parse_transformation(name)  # validate all names before running anything
    if isinstance(argnum, bool) or not isinstance(argnum, int) or not 0 <= argnum < len(args):
        raise ValueError(f"argnum must index one of the {len(args)} positional argument(s), got {argnum!r}")
    return [_observe(fn, args, name, argnum) for name in transformations]


def _observe(fn: Callable, args: tuple, name: str, argnum: int) -> Observation:
    seen: dict[str, Any] = {}

    def probe(*a: Any, **k: Any) -> Any:
        if not seen:
            leaves = jax.tree_util.tree_leaves(a[argnum])
            x = leaves[0] if leaves else a[argnum]
            seen["layers"] = tracer_layers(x)
            seen["concrete"] = concrete_value(x) is not None
            conv: dict[str, str | None] = {}
            for label, convert in CONVERSIONS.items():
                try:
                    convert(x)
                    conv[label] = None
                except Exception as e:  # the class of the failure is the observation
                    conv[label] = _error_name(e)
            seen["conversions"] = conv
        return fn(*a, **k)

    error, message = None, ""
    try:
        jax.block_until_ready(transform(probe, name)(*args))
    except Exception as e:  # recorded, not raised: the table shows which class
        error = _error_name(e)
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


def format_table(observations: Sequence[Observation]) -> str:
    """The observations as a fixed-width text table (one row per transformation)."""
    if not observations:
        raise ValueError("format_table needs at least one Observation (from inspect_transformations)")
    rows = [o.row() for o in observations]
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(width[c]) for c in cols), "  ".join("-" * width[c] for c in cols)]
    lines += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


# --------------------------------------------------------------------------------------
# The jax.errors family
# --------------------------------------------------------------------------------------


def jax_error_classes() -> dict[str, list[str]]:
    """Each public class in ``jax.errors`` -> its public base classes, nearest first.

    Read from the live classes' ``__mro__`` (private mixins and ``object`` skipped), so
    the hierarchy printed in the book is the one of the installed JAX.
    """
    out = {}
    for name in sorted(dir(jax.errors)):
        cls = getattr(jax.errors, name)
        if isinstance(cls, type) and issubclass(cls, BaseException) and not name.startswith("_"):
            out[name] = [b.__name__ for b in cls.__mro__[1:] if not b.__name__.startswith("_") and b is not object]
    return out


def error_tree() -> str:
    """The ``jax.errors`` classes as an indented tree under their Python base classes."""
    classes = jax_error_classes()
    children: dict[str, set[str]] = {}
    for name, bases in classes.items():
        chain = [name, *bases]  # e.g. TracerBoolConversionError < ConcretizationTypeError < ... < BaseException
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
# Counting traces and compilations
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """Positional and keyword arguments of one call (see :func:`call`)."""

    args: tuple
    kwargs: Mapping[str, Any]

    def signature(self) -> str:
        """What ``jit`` keys its cache on, in words: avals of arrays, values of the rest."""
        def show(v: Any) -> str:
            if isinstance(v, jax.Array):
                return f"jax.Array {jax.typeof(v)}"
            if isinstance(v, (np.ndarray, np.generic)):
                return f"np.ndarray {jax.typeof(v)}"
            if isinstance(v, (float, complex)):
                return f"Python {type(v).__name__} {v!r} ({jax.typeof(v)})"
            return repr(v)

        parts = [show(a) for a in self.args] + [f"{k}={show(v)}" for k, v in self.kwargs.items()]
        return f"({', '.join(parts)})"


def call(*args: Any, **kwargs: Any) -> Call:
    """Record the arguments of one call, for :func:`count_traces`."""
    return Call(args, kwargs)


class CompilationCounter:
    """``jax.jit(fn, **jit_kwargs)`` that counts how often ``fn``'s Python body runs.

    Every trace runs the Python body once, so ``traces`` is the number of traces.
    ``cache_size()`` is ``jit``'s own count of dispatch-cache entries
    (``_cache_size()``, private, present on JAX 0.8.2 .. 0.12); an entry is added for
    each new trace and sometimes for a new argument kind with the same avals.
    """

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        allowed = {"static_argnums", "static_argnames", "donate_argnums", "donate_argnames"}
        bad = set(jit_kwargs) - allowed
        if bad:
            raise TypeError(f"unsupported jit option(s) {sorted(bad)}; allowed: {sorted(allowed)}")
        self.fn = fn
        self.traces = 0

        def counted(*args: Any, **kwargs: Any) -> Any:  # a fresh function: no shared cache
            self.traces += 1
            return fn(*args, **kwargs)

        self.jitted = jax.jit(counted, **jit_kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.jitted(*args, **kwargs)

    def cache_size(self) -> int | None:
        size = getattr(self.jitted, "_cache_size", None)
        return size() if size is not None else None


@dataclasses.dataclass(frozen=True)
class TraceLog:
    """Per call: did ``jit`` trace the function again, and the cache size after it."""

    calls: tuple[Call, ...]
    retraced: tuple[bool, ...]
    cache_sizes: tuple[int | None, ...]

    @property
    def traces(self) -> int:
        return sum(self.retraced)

    def __str__(self) -> str:
        lines = [f"{'call':<4}  {'traced?':<7}  {'cache':>5}  arguments"]
        for k, (c, r, s) in enumerate(zip(self.calls, self.retraced, self.cache_sizes)):
            lines.append(f"{k:<4}  {'yes' if r else 'no':<7}  {s if s is not None else '?':>5}  {c.signature()}")
        lines.append(f"{self.traces} trace(s) over {len(self.calls)} call(s)")
        return "\n".join(lines)


def count_traces(fn: Callable, calls: Sequence[Call | tuple], **jit_kwargs: Any) -> TraceLog:
    """Call ``jax.jit(fn, **jit_kwargs)`` on each of ``calls`` in order and log retraces.

    A call is a :class:`Call` (from :func:`call`) or a tuple of positional arguments.
    ``retraced[k]`` is True when call ``k`` ran ``fn``'s Python body, i.e. ``jit`` found
    no cached trace for that call's signature (avals of array arguments, values of
    static arguments).
    """
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)) or not calls:
        raise TypeError("calls must be a non-empty list of call(...) records or tuples of positional arguments")
    normalized = []
    for k, c in enumerate(calls):
        if isinstance(c, Call):
            normalized.append(c)
        elif isinstance(c, tuple):
            normalized.append(Call(c, {}))
        else:
            raise TypeError(f"calls[{k}] must be call(...) or a tuple of positional arguments, got {type(c).__name__}")
    counter = CompilationCounter(fn, **jit_kwargs)
    retraced, sizes = [], []
    for c in normalized:
        before = counter.traces
        jax.block_until_ready(counter(*c.args, **c.kwargs))
        retraced.append(counter.traces > before)
        sizes.append(counter.cache_size())
    return TraceLog(tuple(normalized), tuple(retraced), tuple(sizes))


# --------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------


def repeat_sin(x: jax.Array, n: int) -> jax.Array:
    """``sin`` applied ``n`` times: ``sin(sin(...sin(x)))``. Fails under ``jax.jit``."""
    for _ in range(n):  # range needs a concrete int: under jit, n is a tracer
        x = jnp.sin(x)
    return x


def _is_jitted(fn: Any) -> bool:
    return callable(fn) and all(hasattr(fn, a) for a in ("lower", "trace", "_cache_size"))


def check_fix_jit(answer: Callable, *, strict: bool = False) -> exercises.Feedback:
    """Exercise 1: a version of :func:`repeat_sin` that works under ``jit``.

    ``answer(x, n)`` may be a plain function (the checker jits it; ``n`` is then traced,
    so a loop primitive such as ``lax.fori_loop`` is needed) or an already jitted
    function (e.g. ``jax.jit(repeat_sin, static_argnums=1)``). Both are correct; the
    feedback says how many new compilations the answer needed for four values of ``n``
    (counted by :class:`CompilationCounter`, or by the jitted answer's cache size).
    """
    name = "fix a jit failure"
    if not callable(answer):
        return exercises.verdict(name, [f"answer must be a function (x, n) -> array, got {type(answer).__name__}"],
                                 strict=strict)
    x = jnp.linspace(-1.0, 2.0, 5)
    ns = (0, 1, 3, 6)
    if _is_jitted(answer):
        run, how = answer, "your jitted function"
        size0 = answer._cache_size()
        traces = lambda: answer._cache_size() - size0  # noqa: E731
    else:
        counter = CompilationCounter(answer)
        run, how = counter, "jax.jit(your function)"
        traces = lambda: counter.traces  # noqa: E731
    problems: list[str] = []
    for n in ns:
        got = exercises.call_answer(run, x, n, what=how)
        msg = exercises.failed(got)
        if msg:
            problems.append(f"n={n}: {msg}")
            break
        want = np.asarray(x, np.float64)
        for _ in range(n):
            want = np.sin(want)
        problems += [f"n={n}: {p}" for p in exercises.tree_mismatches(got, want, rtol=1e-5, atol=1e-6)]
    k = traces()
    return exercises.verdict(name, problems, strict=strict,
                             success=f"works under jit for n in {ns}; {k} new compilation(s) for these "
                                     f"{len(ns)} values of n (a static n compiles once per value, "
                                     "a traced n once for all)")


def retrace_quiz_function(x: jax.Array, n: int) -> jax.Array:
    """The function of exercise 2: ``x * n``, jitted with ``static_argnames="n"``."""
    return x * n


def retrace_quiz() -> list[Call]:
    """The calls of exercise 2, in order (built on demand: arrays need a started backend)."""
    return [
        call(jnp.ones(3), n=2),
        call(jnp.arange(3.0), n=2),
        call(jnp.ones(4), n=2),
        call(jnp.ones(3), n=3),
        call(jnp.ones(3, dtype=jnp.int32), n=2),
        call(np.ones(3, dtype=np.float32), n=2),
        call(jnp.float32(1.0), n=2),
        call(1.0, n=2),
        call(jnp.ones(3), n=2),
    ]


def check_predict_retraces(answer: Sequence[bool] | Callable[[], Sequence[bool]], *,
                           strict: bool = False) -> exercises.Feedback:
    """Exercise 2: for each call of :func:`retrace_quiz`, predict whether ``jit`` retraces.

    ``answer`` is a list of booleans (``True`` = retrace), or a function returning one.

    The truth is measured, not stored: :func:`count_traces` runs the calls on a fresh
    ``jax.jit(retrace_quiz_function, static_argnames="n")``.
    """
    name = "predict the retraces"
    calls = retrace_quiz()
    if callable(answer):  # the stub is a function returning the list
        answer = exercises.call_answer(answer, what="your prediction")
    msg = exercises.failed(answer)
    if msg:
        return exercises.verdict(name, [msg], strict=strict)
    if isinstance(answer, (str, bytes)) or not isinstance(answer, Sequence):
        return exercises.verdict(name, [f"answer must be a list of {len(calls)} True/False values, "
                                        f"got {type(answer).__name__}"], strict=strict)
    if len(answer) != len(calls) or not all(isinstance(a, (bool, np.bool_)) for a in answer):
        return exercises.verdict(name, [f"answer must be a list of exactly {len(calls)} True/False values "
                                        f"(one per call), got {list(answer)!r}"], strict=strict)
    log = count_traces(retrace_quiz_function, calls, static_argnames="n")
    problems = []
    for k, (guess, truth, c) in enumerate(zip(answer, log.retraced, calls)):
        if bool(guess) != truth:
            problems.append(f"call {k} {c.signature()}: you said {'retrace' if guess else 'cached'}, "
                            f"jit {'traced it again' if truth else 'reused a cached trace'}")
    return exercises.verdict(name, problems, strict=strict,
                             success=f"all {len(calls)} predictions match the counter ({log.traces} traces)")


def bump(x: jax.Array) -> jax.Array:
    """``exp(-1/x)`` for ``x > 0`` and ``0`` otherwise: smooth, but its gradient is NaN here."""
    return jnp.where(x > 0, jnp.exp(-1.0 / x), 0.0)


def _bump_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Value and derivative of the bump in float64: ``e^{-1/x}`` and ``e^{-1/x}/x^2`` for x > 0."""
    x = np.asarray(x, np.float64)
    pos = x > 0
    safe = np.where(pos, x, 1.0)
    value = np.where(pos, np.exp(-1.0 / safe), 0.0)
    return value, np.where(pos, value / safe**2, 0.0)


def check_finite_grad(answer: Callable, *, strict: bool = False) -> exercises.Feedback:
    """Exercise 3: :func:`bump` rewritten so that its gradient is finite everywhere.

    Checks values and ``jit(vmap(grad(answer)))`` at nine points of ``[-2, 2]`` (including 0 and -0.01)
    against the float64 closed forms ``e^{-1/x}`` and ``e^{-1/x}/x^2`` (0 for ``x <= 0``).
    """
    name = "a where with finite gradients"
    if not callable(answer):
        return exercises.verdict(name, [f"answer must be a function x -> array, got {type(answer).__name__}"],
                                 strict=strict)
    xs = jnp.array([-2.0, -1.0, -0.5, -0.01, 0.0, 0.05, 0.5, 1.0, 2.0])
    value, slope = _bump_reference(np.asarray(xs))
    got_value = exercises.call_answer(jax.vmap(answer), xs, what="your function (under vmap)")
    msg = exercises.failed(got_value)
    if msg:
        return exercises.verdict(name, [msg], strict=strict)
    problems = exercises.tree_mismatches(got_value, value, rtol=1e-5, atol=1e-6, name="value")
    grad_fn = jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(answer(x)))))
    got_slope = exercises.call_answer(grad_fn, xs, what="jit(vmap(grad(your function)))")
    msg = exercises.failed(got_slope)
    if msg:
        return exercises.verdict(name, [*problems, msg], strict=strict)
    problems += exercises.tree_mismatches(got_slope, slope, rtol=1e-5, atol=1e-6, name="gradient")
    return exercises.verdict(name, problems, strict=strict,
                             success="values and gradients match e^(-1/x) and e^(-1/x)/x^2, finite on [-2, 2]")


# --------------------------------------------------------------------------------------
# Widget callback and figures
# --------------------------------------------------------------------------------------


def demo_function(x: jax.Array) -> jax.Array:
    """The function the widget inspects: ``sum(sin(x))``."""
    return jnp.sum(jnp.sin(x))


def receives(transformation: str, x: Any = None) -> str:
    """Widget callback: what :func:`demo_function` receives under ``transformation``.

    Plain text: the tracer chain, whether a concrete value is reachable (and which),
    and which Python conversions work. ``x`` defaults to ``[0., 1., 2.]``.
    """
    x = jnp.arange(3.0) if x is None else x
    (obs,) = inspect_transformations(demo_function, x, transformations=(transformation,))
    lines = [f"under {transformation}: f receives a {obs.tracer_type} with aval {obs.aval}"]
    for depth, layer in enumerate(obs.layers[1:], 1):
        lines.append("  " * depth + f"which wraps: {layer}")
    if obs.concrete:
        lines.append(f"a concrete value is reachable: {np.asarray(x).tolist()}")
    else:
        lines.append("no concrete value is reachable: only shape and dtype are known")
    for label, err in obs.conversions.items():
        lines.append(f"  {label:<14} {'works' if err is None else 'raises ' + err}")
    if obs.error:
        lines.append(f"the call raised {obs.error}: {obs.message}")
    return "\n".join(lines)


def plot_concreteness(observations: Sequence[Observation]) -> Figure:
    """Figure: transformations (rows) x conversions (columns), green if it works.

    The first column is "concrete value reachable"; a red cell names the error class.
    Returns the matplotlib ``Figure``.
    """
    import matplotlib.pyplot as plt

    if not observations:
        raise ValueError("plot_concreteness needs at least one Observation (from inspect_transformations)")
    cols = ["concrete?", *CONVERSIONS]
    fig, ax = plt.subplots(figsize=(1.55 * len(cols) + 1.6, 0.42 * len(observations) + 0.9))
    grid = np.zeros((len(observations), len(cols)))
    for i, obs in enumerate(observations):
        for j, col in enumerate(cols):
            ok = obs.concrete if col == "concrete?" else obs.conversions.get(col) is None
            grid[i, j] = 1.0 if ok else 0.0
            text = ("yes" if ok else "no") if col == "concrete?" else ("works" if ok else obs.conversions[col])
            ax.text(j, i, text.replace("Error", "\nError") if len(text) > 12 else text,
                    ha="center", va="center", fontsize=6.5)
    ax.imshow(grid, cmap="RdYlGn", vmin=-0.4, vmax=1.4, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, fontsize=8)
    ax.set_yticks(range(len(observations)), [o.transformation for o in observations], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_xticks(np.arange(-0.5, len(cols)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(observations)), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.5)
    ax.tick_params(which="minor", length=0)
    fig.tight_layout()
    return fig


def plot_layers(observations: Sequence[Observation], ncols: int = 4) -> Figure:
    """Figure: one small panel per transformation, the tracer chain as nested boxes.

    The outermost box is what the function receives; inner boxes are the values it
    wraps. The innermost box is green when it is a concrete array the function can
    reach, yellow when it is an array the function cannot reach as one value (the
    batch inside a ``vmap`` tracer), and hatched grey when it is abstract (a ``jit``
    tracer: shape and dtype only).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if not observations:
        raise ValueError("plot_layers needs at least one Observation (from inspect_transformations)")
    if isinstance(ncols, bool) or not isinstance(ncols, int) or ncols < 1:
        raise ValueError(f"ncols must be a positive int, got {ncols!r}")
    nrows = -(-len(observations) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.0 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.set_axis_off()
    step = 0.15
    for ax, obs in zip(axes.flat, observations):
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_title(obs.transformation, fontsize=9, fontweight="bold")
        n = len(obs.layers)
        for d, layer in enumerate(obs.layers):
            pad = step * d
            innermost = d == n - 1
            is_array = not layer.type_name.endswith("Tracer")
            if not innermost:
                face, hatch = "white", None
            elif obs.concrete:
                face, hatch = "#b9e4b0", None
            elif is_array:
                face, hatch = "#f6e7a6", None
            else:
                face, hatch = "#e6e6e6", "//"
            ax.add_patch(Rectangle((0.02 + pad / 2, 0.02 + pad / 3), 0.96 - pad, 0.94 - pad * 4 / 3,
                                   facecolor=face, edgecolor="#445", hatch=hatch))
            ax.text(0.5, 0.93 - pad, f"{layer.type_name}\n{layer.aval}", ha="center", va="top", fontsize=6.5,
                    bbox={"facecolor": face, "edgecolor": "none", "pad": 0.5})
    fig.tight_layout()
    return fig
