"""Checkers for the exercises of Chapter 1 ("Tracers and concreteness").

* Exercise 1.1, :func:`check_fix_jit`: a version of :func:`repeat_sin` that works under
  ``jit``. Checks the values for ``n`` in ``(0, 1, 3, 6)`` against float64 ``sin``
  iterates (relative error ≤ 1e-6) and counts the traces (one compilation each) of a
  ``jit`` of a fresh wrapper function over those four calls, so a re-run reports the
  same count.
* Exercise 1.2, :func:`check_predict_retraces`: for each call of
  :func:`retrace_quiz`, predict whether ``jit`` traces again. Any sequence of nine
  booleans (``True``/``False``, ``0``/``1``, NumPy bools) is accepted; the truth is
  measured with :func:`beyondgrad.tracers.count_traces` on a fresh ``jit``.
* Exercise 1.3, :func:`check_finite_grad`: :func:`bump` with a gradient that is finite
  everywhere. Checks values and ``jit(vmap(grad(answer)))`` against the float64 closed
  forms on a grid with a point every 0.01 on ``[-0.5, 0.5]`` (so a ``where`` whose
  threshold is not the function's own ``0`` is caught), plus points out to ``±2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import exercises
from beyondgrad.exercises import Feedback
from beyondgrad.tracers import Call, CompilationCounter, call, count_traces

__all__ = [
    "BUMP_ATOL",
    "BUMP_GRID",
    "BUMP_RTOL",
    "FIX_JIT_ATOL",
    "FIX_JIT_NS",
    "FIX_JIT_RTOL",
    "bump",
    "check_finite_grad",
    "check_fix_jit",
    "check_predict_retraces",
    "repeat_sin",
    "retrace_quiz",
    "retrace_quiz_function",
]

EX1, EX2, EX3 = (
    "Exercise 1.1 (fix a jit failure)",
    "Exercise 1.2 (predict the retraces)",
    "Exercise 1.3 (a where with finite gradients)",
)

# --------------------------------------------------------------------------------------
# Exercise 1.1
# --------------------------------------------------------------------------------------

#: The values of ``n`` exercise 1.1 is checked at.
FIX_JIT_NS: tuple[int, ...] = (0, 1, 3, 6)
#: Accuracy required in exercise 1.1: float32 iterates of ``sin`` differ from float64
#: ones by at most 7.1e-8 (relative, measured on JAX 0.8.2 and 0.12); 1e-6 leaves a
#: margin of 14.
FIX_JIT_RTOL, FIX_JIT_ATOL = 1e-6, 1e-7


def repeat_sin(x: jax.Array, n: int) -> jax.Array:
    """``sin`` applied ``n`` times, ``sin(sin(...sin(x)))``, with a Python loop.

    ``range(n)`` needs a concrete int, so under ``jax.jit`` (``n`` traced) it raises
    ``TracerIntegerConversionError``.
    """
    for _ in range(n):
        x = jnp.sin(x)
    return x


def _sin_iterates(x: np.ndarray, n: int) -> np.ndarray:
    want = np.asarray(x, np.float64)
    for _ in range(n):
        want = np.sin(want)
    return want


def _is_jitted(fn: object) -> bool:
    return callable(fn) and all(
        hasattr(fn, a) for a in ("lower", "trace", "__wrapped__")
    )


def _loop_primitives(fn: Callable, x: jax.Array) -> set[str]:
    """Loop primitives (``while``, ``scan``) anywhere in the jaxpr of ``fn(x, 3)``."""
    found: set[str] = set()

    def walk(jaxpr: object) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("while", "scan"):
                found.add(eqn.primitive.name)
            for param in eqn.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    inner = getattr(sub, "jaxpr", sub)  # ClosedJaxpr -> Jaxpr
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(x, 3).jaxpr)
    return found


def check_fix_jit(
    answer: Callable[[jax.Array, int], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 1.1: a version of :func:`repeat_sin` that works under ``jit``.

    Two answers are accepted: a function made by ``jax.jit`` with a static ``n``
    (``static_argnums=1`` or ``static_argnames="n"``), or a plain function whose loop
    is a loop primitive (``lax.fori_loop``), which the checker jits with ``n`` traced.
    The checker jits a fresh wrapper of the function (for a jitted answer: of the
    function it wraps, with ``n`` static when the answer's trace takes ``x`` alone;
    :class:`~beyondgrad.tracers.CompilationCounter`), calls it at ``n`` in
    :data:`FIX_JIT_NS` on ``x = linspace(-1, 2, 5)`` and compares with float64 iterates
    of ``sin`` (relative error ≤ :data:`FIX_JIT_RTOL`). It reports how often that fresh
    ``jit`` traced (and compiled): once per static value of ``n``, or once for a traced
    ``n``. A plain answer is first called once without ``jit`` at ``n = 1``, which must
    return a JAX array (not a Python number).
    """
    msg = exercises.require_callable(answer, "repeat_sin_fixed")
    if msg:
        return exercises.verdict(EX1, [msg], strict=strict)
    x = jnp.linspace(-1.0, 2.0, 5)
    if _is_jitted(answer):
        traced = exercises.call_answer(answer.trace, x, 1, what="your jitted function")
        early = exercises.early_verdict(EX1, traced, strict=strict)
        if early is not None:
            return early
        static_n = len(traced.jaxpr.in_avals) == 1
        inner = answer.__wrapped__
        how = "your jitted function"
    else:
        eager = exercises.call_answer(
            answer, x, 1, what="your function (called without jit)"
        )
        wrong = exercises.mismatch_verdict(
            EX1,
            eager,
            _sin_iterates(x, 1),
            rtol=FIX_JIT_RTOL,
            atol=FIX_JIT_ATOL,
            name="repeat_sin_fixed(x, 1)",
            allow_python_scalars=False,
            strict=strict,
        )
        if wrong is not None:
            return wrong
        static_n, inner = False, answer
        how = "jax.jit(your function)"
    # A fresh wrapper function: jit's caches belong to the function object, so a new
    # jax.jit of the same function would share the entries of earlier runs.
    fresh = CompilationCounter(inner, **({"static_argnums": 1} if static_n else {}))
    problems: list[str] = []
    for n in FIX_JIT_NS:
        got = exercises.call_answer(fresh, x, n, what=how)
        msg = exercises.failed(got)
        if msg:
            problems.append(f"n={n}: {msg}")
            break
        problems += exercises.tree_mismatches(
            got,
            _sin_iterates(x, n),
            rtol=FIX_JIT_RTOL,
            atol=FIX_JIT_ATOL,
            name=f"result for n={n}",
        )
    if problems:
        return exercises.verdict(EX1, problems, strict=strict)
    compiled = fresh.traces
    if static_n:
        method = "n is a static argument"
    else:
        loops = sorted(_loop_primitives(answer, x))
        method = f"n is traced and the loop is the {'/'.join(loops) or 'no'} primitive"
    success = (
        f"matches sin applied n times for n in {FIX_JIT_NS} under jit; {method}; "
        f"a fresh jit traced and compiled it {compiled} time(s) for these "
        f"{len(FIX_JIT_NS)} values of n"
    )
    return exercises.verdict(EX1, [], success=success, strict=strict)


# --------------------------------------------------------------------------------------
# Exercise 1.2
# --------------------------------------------------------------------------------------


def retrace_quiz_function(x: jax.Array, n: int) -> jax.Array:
    """The function of exercise 1.2: ``x * n``, jitted with ``static_argnames="n"``."""
    return x * n


def retrace_quiz() -> list[Call]:
    """The calls of exercise 1.2, in order (built on demand: arrays need a backend)."""
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


def _as_booleans(answer: object, count: int) -> tuple[list[bool] | None, str]:
    """``answer`` as ``count`` Python bools, or ``(None, why not)``."""
    want = f"a list of {count} True/False values (0/1 also work), one per call"
    try:
        ndim = np.ndim(answer)
    except ValueError:  # ragged nesting
        return None, f"answer must be {want}; got a ragged {type(answer).__name__}"
    if isinstance(answer, (str, bytes)) or ndim == 0:
        return None, f"answer must be {want}; got {type(answer).__name__} {answer!r}"
    if ndim != 1:
        shape = np.shape(answer)
        return (
            None,
            f"answer must be {want}; got a {type(answer).__name__} of shape {shape}",
        )
    if isinstance(answer, (list, tuple)):
        arr = list(answer)
    else:  # a NumPy or JAX array: its entries as Python scalars
        arr = list(np.asarray(answer).astype(object))
    if len(arr) != count:
        return None, f"answer must be {want}; got {len(arr)} value(s)"
    out = []
    for k, v in enumerate(arr):
        if isinstance(v, (bool, np.bool_)):
            out.append(bool(v))
        elif isinstance(v, (int, np.integer)) and v in (0, 1):
            out.append(bool(v))
        else:
            return None, (
                f"entry {k} is {v!r} ({type(v).__name__}); each entry must be "
                "True/False (or 1/0): True means jit traces again"
            )
    return out, ""


def check_predict_retraces(
    answer: Sequence[bool] | Callable[[], Sequence[bool]], *, strict: bool = False
) -> Feedback:
    """Exercise 1.2: for each call of :func:`retrace_quiz`, does ``jit`` trace again?

    ``answer`` is a sequence of nine booleans (``True`` = traced again; ``0``/``1`` and
    NumPy bools are accepted), or a function returning one. The truth is measured, not
    stored: :func:`beyondgrad.tracers.count_traces` runs the calls in order on a fresh
    ``jax.jit(retrace_quiz_function, static_argnames="n")``. Each wrong entry is named
    with the call's signature.
    """
    calls = retrace_quiz()
    answer, early = exercises.given_answer(
        EX2, answer, what="my_prediction()", strict=strict
    )
    if early is not None:
        return early
    guesses, why = _as_booleans(answer, len(calls))
    if guesses is None:
        return exercises.verdict(EX2, [why], strict=strict)
    log = count_traces(retrace_quiz_function, calls, static_argnames="n")
    problems = []
    for k, (guess, truth, c) in enumerate(zip(guesses, log.retraced, calls)):
        if guess != truth:
            said = "retrace" if guess else "cached"
            did = "traced it again" if truth else "reused a cached trace"
            problems.append(f"call {k} {c.signature()}: you said {said}, jit {did}")
    success = (
        f"all {len(calls)} predictions match the trace counter ({log.traces} traces)"
    )
    return exercises.verdict(EX2, problems, success=success, strict=strict)


# --------------------------------------------------------------------------------------
# Exercise 1.3
# --------------------------------------------------------------------------------------

#: Grid of exercise 1.3 (float32): every 0.01 on [-0.5, 0.5], so a ``where`` threshold
#: off by 0.02 or more moves the value at some point; plus points out to ±2.
BUMP_GRID: np.ndarray = np.concatenate(
    [
        [-2.0, -1.0, -0.75],
        np.arange(-50, 51) / 100,
        [0.75, 1.0, 1.5, 2.0],
    ]
).astype(np.float32)
#: Accuracy required in exercise 1.3: a float32 ``exp(-1/x)`` and its derivative differ
#: from float64 by at most 1.9e-6 (relative, measured on JAX 0.8.2 and 0.12 on the
#: grid); 1e-5 leaves a margin of 5. The absolute part only forgives float32 flushing
#: the subnormal e^-100 ≈ 3.7e-44 at x = 0.01 to zero.
BUMP_RTOL, BUMP_ATOL = 1e-5, 1e-30


def bump(x: jax.Array) -> jax.Array:
    """``exp(-1/x)`` for ``x > 0`` and ``0`` otherwise, with one ``jnp.where``.

    Smooth (every derivative is 0 at 0 from both sides), but its gradient is NaN at
    ``x ≤ 0``: the transpose of ``where`` sends a zero cotangent into the unselected
    ``exp(-1/x)``, whose derivative ``exp(-1/x)/x²`` is not finite there.
    """
    return jnp.where(x > 0, jnp.exp(-1.0 / x), 0.0)


def _bump_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 value and derivative: ``e^{-1/x}`` and ``e^{-1/x}/x²`` for x > 0, else 0."""
    x = np.asarray(x, np.float64)
    pos = x > 0
    safe = np.where(pos, x, 1.0)
    value = np.where(pos, np.exp(-1.0 / safe), 0.0)
    return value, np.where(pos, value / safe**2, 0.0)


def check_finite_grad(
    answer: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 1.3: :func:`bump` rewritten so that its gradient is finite everywhere.

    Any method is accepted. Checks ``answer`` at one float32 scalar (it must return a
    JAX scalar, not a Python number), then ``vmap(answer)`` and
    ``jit(vmap(grad(answer)))`` on :data:`BUMP_GRID` against the float64 closed forms
    ``e^{-1/x}`` and ``e^{-1/x}/x²`` (0 for ``x ≤ 0``), within relative error
    :data:`BUMP_RTOL`. A NaN or infinity anywhere is reported with its first position.
    """
    msg = exercises.require_callable(answer, "bump_safe")
    if msg:
        return exercises.verdict(EX3, [msg], strict=strict)
    one = exercises.call_answer(answer, jnp.float32(0.5), what="bump_safe(0.5)")
    wrong = exercises.mismatch_verdict(
        EX3,
        one,
        np.float32(_bump_reference(np.float32(0.5))[0]),
        name="bump_safe(0.5)",
        allow_python_scalars=False,
        rtol=BUMP_RTOL,
        atol=BUMP_ATOL,
        strict=strict,
    )
    if wrong is not None:
        return wrong
    ref_value, ref_slope = _bump_reference(BUMP_GRID)
    xs = jnp.asarray(BUMP_GRID)
    value = exercises.call_answer(jax.vmap(answer), xs, what="vmap(bump_safe)")
    if exercises.failed(value):
        return exercises.verdict(EX3, [exercises.failed(value)], strict=strict)
    problems = exercises.tree_mismatches(
        value, ref_value, rtol=BUMP_RTOL, atol=BUMP_ATOL, name="value on the grid"
    )
    grad_fn = jax.jit(jax.vmap(jax.grad(answer)))
    slope = exercises.call_answer(grad_fn, xs, what="jit(vmap(grad(bump_safe)))")
    if exercises.failed(slope):
        return exercises.verdict(
            EX3, [*problems, exercises.failed(slope)], strict=strict
        )
    problems += exercises.tree_mismatches(
        slope, ref_slope, rtol=BUMP_RTOL, atol=BUMP_ATOL, name="gradient on the grid"
    )
    problems = [_with_x(p) for p in problems]
    success = (
        f"values and jit(vmap(grad)) match e^(-1/x) and e^(-1/x)/x^2 (0 for x <= 0) at "
        f"{len(BUMP_GRID)} points of [-2, 2], all finite"
    )
    return exercises.verdict(EX3, problems, success=success, strict=strict)


def _with_x(problem: str) -> str:
    """Add the grid point to a message that names an index of :data:`BUMP_GRID`."""
    import re

    m = re.search(r"at index \((\d+),\)", problem)
    if not m:
        return problem
    return f"{problem} [x = {float(BUMP_GRID[int(m.group(1))]):g}]"
