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
    "BUMP_TINY",
    "FIX_JIT_ATOL",
    "FIX_JIT_CALLS",
    "FIX_JIT_MAX_N",
    "FIX_JIT_RTOL",
    "FIX_JIT_SIZE",
    "NAN_INTERVAL_RTOL",
    "bump",
    "check_finite_grad",
    "check_fix_jit",
    "check_nan_interval",
    "check_predict_retraces",
    "fix_jit_counts",
    "nan_interval_measured",
    "repeat_sin",
    "retrace_quiz",
    "retrace_quiz_function",
]

EX1, EX2, EX3 = (
    "Exercise 1.1 (a loop count per entry)",
    "Exercise 1.2 (predict the retraces)",
    "Exercise 1.3 (b) (a where with finite gradients)",
)
EX3A = "Exercise 1.3 (a) (where is the gradient NaN?)"

# --------------------------------------------------------------------------------------
# Exercise 1.1
# --------------------------------------------------------------------------------------

#: Exercise 1.1: the checker's ``x`` has this many entries, and each count ``n[j]`` is
#: drawn from ``0 .. FIX_JIT_MAX_N`` (both ends always included), so a loop unrolled
#: to any small fixed count fails.
FIX_JIT_SIZE = 8
FIX_JIT_MAX_N = 64
#: Accuracy required in exercise 1.1: float32 iterates of ``sin`` differ from float64
#: ones by at most 3.6e-7 (relative, every n in 0..64 on ``linspace(-1, 2, 8)``,
#: measured on JAX 0.8.2 and 0.12); 1e-6 leaves a margin of about 3. The absolute part
#: only matters for an entry at 0.
FIX_JIT_RTOL, FIX_JIT_ATOL = 1e-6, 1e-7
#: Exercise 1.1: calls per check, each with other ``x`` and other counts.
FIX_JIT_CALLS = 2


def repeat_sin(x: jax.Array, n: int) -> jax.Array:
    """``sin`` applied ``n`` times, ``sin(sin(...sin(x)))``, with a Python loop.

    ``range(n)`` needs a concrete int, so under ``jax.jit`` (``n`` traced) it raises
    ``TracerIntegerConversionError``.
    """
    for _ in range(n):
        x = jnp.sin(x)
    return x


def _sin_iterates(x: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Float64 ``sin`` applied ``n[j]`` times to ``x[j]`` (``n`` scalar or per entry)."""
    x = np.asarray(x, np.float64)
    counts = np.broadcast_to(np.asarray(n), x.shape)
    want = x.copy()
    for k in range(int(counts.max(initial=0))):
        want = np.where(counts > k, np.sin(want), want)
    return want


def fix_jit_counts(seed: int | None = None) -> np.ndarray:
    """Counts for exercise 1.1: ``FIX_JIT_SIZE`` int32 values in ``0..FIX_JIT_MAX_N``.

    Random (``seed=None`` draws fresh ones at every check), always containing ``0``, a
    count from 1 to 8 and ``FIX_JIT_MAX_N``, in random order.
    """
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, FIX_JIT_MAX_N + 1, size=FIX_JIT_SIZE)
    counts[:3] = (0, rng.integers(1, 9), FIX_JIT_MAX_N)
    return rng.permutation(counts).astype(np.int32)


def _fix_jit_hint(message: str) -> str:
    """What to change, for the usual failures of exercise 1.1."""
    if "static" in message or "hashable" in message:
        return (
            "\n    n is an array of counts, one per entry, so it cannot be a static "
            "argument: keep it traced and let a loop primitive stop each entry at its "
            "own count"
        )
    if any(
        k in message
        for k in ("TracerIntegerConversionError", "Concretization", "scalar index")
    ):
        return (
            "\n    range(n), int(n) and n.max() in Python need concrete numbers; under jit "
            "n is traced: loop with lax.while_loop or lax.fori_loop"
        )
    if "boolean scalar" in message or "must be scalars" in message:
        return (
            "\n    a loop primitive's trip count (or condition) is one scalar for the whole "
            "loop, and here each entry has its own n: vmap the loop over the entries, "
            "or loop to the largest count and keep finished entries with jnp.where"
        )
    return ""


def check_fix_jit(
    answer: Callable[[jax.Array, jax.Array], jax.Array],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> Feedback:
    """Exercise 1.1: ``answer(x, n)`` applies ``sin`` ``n[j]`` times to ``x[j]``, under jit.

    ``x`` is float32 and ``n`` an int32 array of the same shape (:data:`FIX_JIT_SIZE`
    entries, counts from :func:`fix_jit_counts`: random, up to :data:`FIX_JIT_MAX_N`).
    The checker jits a fresh wrapper of ``answer`` (so ``n`` is traced;
    :class:`~beyondgrad.tracers.CompilationCounter`), calls it twice with different
    ``x`` and counts, compares each result with float64 iterates of ``sin``
    (``|got - want| <= FIX_JIT_ATOL + FIX_JIT_RTOL |want|``), and requires one trace for
    both calls: the counts must stay traced.
    """
    msg = exercises.require_callable(answer, "repeat_sin_each")
    if msg:
        return exercises.verdict(EX1, [msg], strict=strict)
    rng = np.random.default_rng(seed)
    fresh = CompilationCounter(answer)
    problems: list[str] = []
    for k in range(FIX_JIT_CALLS):
        x = np.linspace(-1.0, 2.0, FIX_JIT_SIZE, dtype=np.float32) * (1 - 0.25 * k)
        n = fix_jit_counts(int(rng.integers(2**31)))
        got = exercises.call_answer(
            fresh, jnp.asarray(x), jnp.asarray(n), what="jax.jit(your function)"
        )
        if exercises.is_stub(got):
            return exercises.verdict(EX1, [], attempted=False, strict=strict)
        failure = exercises.failed(got)
        if failure:
            return exercises.verdict(
                EX1, [failure + _fix_jit_hint(failure)], strict=strict
            )
        want = _sin_iterates(x, n)
        found = exercises.tree_mismatches(
            got,
            want,
            rtol=FIX_JIT_RTOL,
            atol=FIX_JIT_ATOL,
            name=f"call {k + 1}: result",
        )
        if found:
            problems += found
            shape_ok = np.shape(got) == want.shape
            if shape_ok:
                got64 = np.asarray(got, np.float64)
                bad = np.abs(got64 - want) > FIX_JIT_ATOL + FIX_JIT_RTOL * np.abs(want)
                bad |= ~np.isfinite(got64)
                wrong = sorted({int(c) for c in n[bad]})
                right = sorted({int(c) for c in n[~bad]})
                problems.append(
                    f"with counts n = {n.tolist()}: wrong for n in {wrong}, "
                    f"right for n in {right}"
                    + (
                        "; every count above "
                        f"{max(c for c in right if c < min(wrong))} is wrong: does your "
                        "loop stop at a fixed number of steps?"
                        if right and min(wrong) > min(right) and max(right) < min(wrong)
                        else ""
                    )
                )
            break
    if problems:
        return exercises.verdict(EX1, problems, strict=strict)
    if fresh.traces != 1:
        return exercises.verdict(
            EX1,
            [
                f"a fresh jit traced your function {fresh.traces} times for "
                f"{FIX_JIT_CALLS} calls with the same shapes and dtypes: it should "
                "trace once; something in it depends on the values of n or x"
            ],
            strict=strict,
        )
    success = (
        f"matches sin applied n[j] times to x[j] for random counts up to "
        f"{FIX_JIT_MAX_N} (relative error <= {FIX_JIT_RTOL:g}, absolute "
        f"{FIX_JIT_ATOL:g}); a fresh jit traced it once for {FIX_JIT_CALLS} calls"
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
        ndim = np.ndim(answer)  # pyright: ignore[reportArgumentType]
    except ValueError:  # ragged nesting
        return None, f"answer must be {want}; got a ragged {type(answer).__name__}"
    if isinstance(answer, (str, bytes)) or ndim == 0:
        return None, f"answer must be {want}; got {type(answer).__name__} {answer!r}"
    if ndim != 1:
        shape = np.shape(answer)  # pyright: ignore
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

#: Points of exercise 1.3 (b) next to 0, inside the NaN interval of part (a) on both
#: sides: right of 0 the NaN is in the *selected* branch (``exp(-1/x) = 0`` times an
#: infinite ``x**-2``), so a ``where`` on the other branch alone does not remove it.
BUMP_TINY: tuple[float, ...] = (-1e-30, 1e-30, 1e-20, 1e-10)
#: Grid of exercise 1.3 (float32): every 0.01 on [-0.5, 0.5], so a ``where`` threshold
#: off by 0.02 or more moves the value at some point; points out to ±2; and
#: :data:`BUMP_TINY` (last, so the first wrong point reported stays the nearest one).
BUMP_GRID: np.ndarray = np.concatenate(
    [
        [-2.0, -1.0, -0.75],
        np.arange(-50, 51) / 100,
        [0.75, 1.0, 1.5, 2.0],
        BUMP_TINY,
    ]
).astype(np.float32)
#: Accuracy required in exercise 1.3: a float32 ``exp(-1/x)`` and its derivative differ
#: from float64 by at most 1.9e-6 (relative, measured on JAX 0.8.2 and 0.12 on the
#: grid); 1e-5 leaves a margin of 5. The absolute part only forgives float32 flushing
#: the subnormal e^-100 ≈ 3.7e-44 at x = 0.01 to zero.
BUMP_RTOL, BUMP_ATOL = 1e-5, 1e-30


def bump(x: jax.Array) -> jax.Array:
    """``exp(-1/x)`` for ``x > 0`` and ``0`` otherwise, with one ``jnp.where``.

    Smooth (every derivative is 0 at 0 from both sides), but its float32 gradient is
    NaN on an interval around 0 (:func:`nan_interval_measured`; exercise 1.3 (a)).
    Left of 0 the transpose of ``where`` sends a zero cotangent into the unselected
    ``exp(-1/x)``, which overflows to ``inf`` for ``-0.0113 < x < 0``; right of 0,
    for ``x`` below about ``1.08e-19``, the selected branch itself multiplies
    ``exp(-1/x) = 0`` by ``x**-2 = inf``.
    """
    return jnp.where(x > 0, jnp.exp(-1.0 / x), 0.0)


def _bump_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 value and derivative: ``e^{-1/x}`` and ``e^{-1/x}/x²`` for x > 0, else 0."""
    x = np.asarray(x, np.float64)
    pos = x > 0
    safe = np.where(pos, x, 1.0)
    value = np.where(pos, np.exp(-1.0 / safe), 0.0)
    return value, np.where(pos, value / safe**2, 0.0)


#: Exercise 1.3 (a): each end of the interval must be within this relative distance of
#: the measured end. Bisection on float32 finds the ends exactly; reasoning from
#: ``jnp.finfo(jnp.float32)`` gets within about 1e-6 of them when the reason is right.
NAN_INTERVAL_RTOL = 1e-3


def _grad_bump_is_nan(x: float) -> bool:
    return bool(jnp.isnan(jax.grad(bump)(jnp.float32(x))))


def _bisect_magnitude(sign: float, nan_small: bool = True) -> float:
    """The float32 magnitude where NaN stops, on one side of 0 (bisection on the bits).

    Bit patterns of positive float32 numbers are ordered like the numbers, so bisecting
    the int32 view between 1e-38 (NaN next to 0) and 1.0 (finite) finds the last NaN
    magnitude exactly.
    """
    lo = int(np.float32(1e-38).view(np.int32))
    hi = int(np.float32(1.0).view(np.int32))
    if not _grad_bump_is_nan(sign * float(np.int32(lo).view(np.float32))):
        raise RuntimeError(
            "grad(bump) is finite next to 0: the exercise needs updating"
        )
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _grad_bump_is_nan(sign * float(np.int32(mid).view(np.float32))):
            lo = mid
        else:
            hi = mid
    return float(np.int32(lo).view(np.float32))


def nan_interval_measured() -> tuple[float, float]:
    """``(a, b)``: float32 ``jax.grad(bump)(x)`` is NaN exactly for ``a <= x <= b``.

    Measured on the running JAX by bisection (the NaN set is one interval around 0: the
    left end is where ``exp(-1/x)`` overflows, ``-1/log(finfo.max)``; the right end is
    where ``x*x`` in ``x**-2`` drops below the smallest normal float32 and is flushed
    to zero, ``sqrt(finfo.tiny)``, on the CPU backend). Called by
    :func:`check_nan_interval`; not a value to copy into an answer.
    """
    return -_bisect_magnitude(-1.0), _bisect_magnitude(1.0)


def check_nan_interval(
    answer: Sequence[float] | Callable[[], Sequence[float]], *, strict: bool = False
) -> Feedback:
    """Exercise 1.3 (a): the float32 ``x`` where ``jax.grad(bump)(x)`` is NaN.

    ``answer`` is a pair ``(a, b)`` (or a function returning one): the gradient is NaN
    for ``a <= x <= b`` and finite elsewhere. Each end must be within
    :data:`NAN_INTERVAL_RTOL` (relative) of :func:`nan_interval_measured`. A wrong end
    is answered with the gradient at a point between it and the true end, so the
    message says which way to move it without giving it away.
    """
    given, early = exercises.given_answer(
        EX3A, answer, what="my_nan_interval()", strict=strict
    )
    if early is not None:
        return early
    try:
        a, b = (float(v) for v in given)
    except (TypeError, ValueError):
        return exercises.verdict(
            EX3A,
            [
                "answer must be a pair of numbers (a, b): the gradient is NaN for "
                f"a <= x <= b; got {type(given).__name__} {given!r:.60}"
            ],
            strict=strict,
        )
    if not a < b:
        return exercises.verdict(
            EX3A,
            [f"the left end must be below the right end; got ({a:g}, {b:g})"],
            strict=strict,
        )
    true_a, true_b = nan_interval_measured()
    rtol = NAN_INTERVAL_RTOL
    problems: list[str] = []
    for side, got, want in (("left", a, true_a), ("right", b, true_b)):
        if abs(got - want) <= rtol * abs(want):
            continue
        if np.sign(got) == np.sign(want) and np.isfinite(got) and got != 0:
            probe = float(np.sign(want) * np.sqrt(abs(got) * abs(want)))
        else:
            probe = want * (
                10.0 if abs(got) > abs(want) or not np.isfinite(got) else 0.1
            )
        slope = float(jax.grad(bump)(jnp.float32(probe)))
        inside = a <= probe <= b
        if inside:
            fix = "your interval contains it: move the " + side + " end toward 0"
        else:
            fix = "your interval misses it: move the " + side + " end away from 0"
        problems.append(
            f"{side} end {got:g}: at x = {probe:.6g}, between your end and the true "
            f"one, grad(bump) is {slope:g}; {fix} (required: within {rtol:g} relative)"
        )
    success = (
        f"the gradient is NaN exactly on [{true_a:.8g}, {true_b:.8g}] (float32, "
        f"measured on this JAX); your ends are within {rtol:g} relative"
    )
    return exercises.verdict(EX3A, problems, success=success, strict=strict)


def check_finite_grad(
    answer: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 1.3: :func:`bump` rewritten so that its gradient is finite everywhere.

    Any method is accepted. Checks ``answer`` at one float32 scalar (it must return a
    JAX scalar, not a Python number), then ``vmap(answer)`` and
    ``jit(vmap(grad(answer)))`` on :data:`BUMP_GRID` (which includes the tiny
    magnitudes :data:`BUMP_TINY`) against the float64 closed forms
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
        np.float32(_bump_reference(np.asarray(0.5, np.float32))[0]),
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
    value_failed = exercises.failed(value)
    if value_failed:
        return exercises.verdict(EX3, [value_failed], strict=strict)
    problems = exercises.tree_mismatches(
        value, ref_value, rtol=BUMP_RTOL, atol=BUMP_ATOL, name="value on the grid"
    )
    grad_fn = jax.jit(jax.vmap(jax.grad(answer)))
    slope = exercises.call_answer(grad_fn, xs, what="jit(vmap(grad(bump_safe)))")
    slope_failed = exercises.failed(slope)
    if slope_failed:
        return exercises.verdict(EX3, [*problems, slope_failed], strict=strict)
    problems += exercises.tree_mismatches(
        slope, ref_slope, rtol=BUMP_RTOL, atol=BUMP_ATOL, name="gradient on the grid"
    )
    problems = [_with_x(p) for p in problems]
    tiny_right = (BUMP_GRID > 0) & (BUMP_GRID < 1e-5)
    slope_np = (
        np.asarray(slope, np.float64) if np.shape(slope) == BUMP_GRID.shape else None
    )
    if slope_np is not None and not np.isfinite(slope_np[tiny_right]).all():
        problems.append(
            "the gradient is not finite for tiny x > 0 (the right end of part (a)): "
            "there the *selected* branch is exp(-1/x) = 0 times an infinite x**-2, so "
            "a where on the other branch cannot help; keep 1/x**2 finite for tiny x"
        )
    success = (
        f"values and jit(vmap(grad)) match e^(-1/x) and e^(-1/x)/x^2 (0 for x <= 0) at "
        f"{len(BUMP_GRID)} points of [-2, 2] (down to |x| = "
        f"{min(abs(v) for v in BUMP_TINY):g}), all finite (relative error <= "
        f"{BUMP_RTOL:g})"
    )
    return exercises.verdict(EX3, problems, success=success, strict=strict)


def _with_x(problem: str) -> str:
    """Add the grid point to a message that names an index of :data:`BUMP_GRID`."""
    import re

    m = re.search(r"at index \((\d+),\)", problem)
    if not m:
        return problem
    return f"{problem} [x = {float(BUMP_GRID[int(m.group(1))]):g}]"
