"""Checkers for the exercises of Chapter 1 ("Tracers and concreteness").

* Exercise 1.1, :func:`check_fix_jit`: ``repeat_sin_each(x, n, n_max)``, ``sin`` applied
  ``n[j]`` times to ``x[j]``, under ``jit`` (``n_max`` static) and ``jax.grad``, in
  cases drawn at every check (:func:`fix_jit_counts`); a loop longer than ``n_max``
  steps, plus one unused step, is refused, and named a bound written into the code
  when its length stays the same for another ``n_max``.
* Exercise 1.2, :func:`check_predict_retraces`: ``my_cache_key(x, n)``, what ``jit``
  keys its traces on, checked against quizzes drawn at every check
  (:func:`retrace_quiz`); the truth is measured with
  :func:`beyondgrad.tracers.count_traces` on a fresh ``jit``.
* Every check runs under :func:`beyondgrad.exercises.run_with_time_limit`
  (:data:`TIME_LIMIT` seconds) where the student's code may loop for ever.
* Exercise 1.3, :func:`check_finite_grad`: :func:`bump` with a gradient that is finite
  everywhere. Checks values and ``jit(vmap(grad(answer)))`` against the float64 closed
  forms on a grid with a point every 0.01 on ``[-0.5, 0.5]`` (so a ``where`` whose
  threshold is not the function's own ``0`` is caught), plus points out to ``±2``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
    "RETRACE_QUIZZES",
    "TIME_LIMIT",
    "TRACED_TRIP_COUNT",
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
    "Exercise 1.2 (what a trace is keyed on)",
    "Exercise 1.3 (b) (a where with finite gradients)",
)
EX3A = "Exercise 1.3 (a) (where is the gradient NaN?)"

# --------------------------------------------------------------------------------------
# Exercise 1.1
# --------------------------------------------------------------------------------------

#: Exercise 1.1: each check draws :data:`FIX_JIT_CALLS` cases (:func:`fix_jit_counts`).
#: ``x`` has from ``FIX_JIT_SIZE[0]`` to ``FIX_JIT_SIZE[1]`` entries; the static bound
#: ``n_max`` of the first two cases is drawn from ``FIX_JIT_MAX_N[0]``, of the third
#: from ``FIX_JIT_MAX_N[1]``, so no bound written into the answer fits every check.
FIX_JIT_SIZE = (5, 12)
#: Exercise 1.1: the ranges the static bound ``n_max`` is drawn from (first two
#: cases, third case); see :data:`FIX_JIT_SIZE`.
FIX_JIT_MAX_N = ((3, 30), (60, 200))
#: Accuracy required in exercise 1.1, for values and gradients: float32 iterates of
#: ``sin`` and their derivative (a product of up to 200 cosines) differ from float64 by
#: at most 2.3e-6 relative (40 draws with ``n_max`` up to 200, measured on JAX 0.8.2 and
#: 0.12); 1e-5 leaves a margin of about 4. The absolute part only matters at ``x = 0``.
#: Error count (u32 = 2**-24): one step v <- sin(v) adds a rounding of <= u32 (plus
#: sin's own ulp) to the relative error r and multiplies r by v cot(v) <= 1, which for
#: the iterates v ~ sqrt(3 / k) is 1 - 1 / k: after n steps r is a sum of the n
#: roundings weighted by k / n, <= n u32 / 2 if every rounding had the same sign
#: (1.2e-5 at n = 200), about sqrt(n / 3) u32 (5e-7) for roundings of random sign, as
#: measured; the derivative, a product of n cosines, likewise. 1e-5 sits between the
#: random-sign size and the same-sign worst case (a float64 answer errs by ~1e-16 and
#: passes); an answer one step off is off by 2e-3 or more (one step at n = 200 moves
#: v ~ 0.12 by v^3 / 6 = 2.5e-3 of v).
FIX_JIT_RTOL, FIX_JIT_ATOL = 1e-5, 1e-7
#: Exercise 1.1: cases per check. The first two share their size and ``n_max`` (so the
#: second must reuse the first's trace); the third has others.
FIX_JIT_CALLS = 3
#: Seconds a check may take before it stops waiting for the student's code.
TIME_LIMIT = 10.0


def repeat_sin(x: jax.Array, n: int) -> jax.Array:
    """``sin`` applied ``n`` times, ``sin(sin(...sin(x)))``, with a Python loop.

    ``range(n)`` needs a concrete int, so under ``jax.jit`` (``n`` traced) it raises
    ``TracerIntegerConversionError``.
    """
    for _ in range(n):
        x = jnp.sin(x)
    return x


def _sin_iterates(x: np.ndarray, n: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 ``sin`` applied ``n[j]`` times to ``x[j]``, and its derivative.

    The derivative of the ``n``-fold iterate is the product of ``cos`` at the ``n``
    iterates before it (the chain rule).
    """
    x = np.asarray(x, np.float64)
    counts = np.broadcast_to(np.asarray(n), x.shape)
    value, slope = x.copy(), np.ones_like(x)
    for k in range(int(counts.max(initial=0))):
        active = counts > k
        slope = np.where(active, slope * np.cos(value), slope)
        value = np.where(active, np.sin(value), value)
    return value, slope


def fix_jit_counts(seed: int | None = None) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The cases of one check of exercise 1.1: ``(x, n, n_max)`` triples.

    Random (``seed=None`` draws fresh ones at every check): :data:`FIX_JIT_CALLS` cases,
    the first two with the same size and ``n_max``, the third with other ones. Each ``n``
    is int32 and holds ``0``, ``n_max`` and a count from 1 to 3; ``x`` is float32 in
    ``[-2, 2]``.
    """
    rng = np.random.default_rng(seed)
    sizes = rng.choice(
        np.arange(FIX_JIT_SIZE[0], FIX_JIT_SIZE[1] + 1), 2, replace=False
    )
    bounds = [int(rng.integers(lo, hi + 1)) for lo, hi in FIX_JIT_MAX_N]
    cases = []
    for size, n_max in [(sizes[0], bounds[0])] * 2 + [(sizes[1], bounds[1])]:
        n = rng.integers(0, n_max + 1, size=int(size))
        n[:3] = (0, n_max, rng.integers(1, 4))
        x = rng.uniform(-2.0, 2.0, size=int(size)).astype(np.float32)
        cases.append((x, rng.permutation(n).astype(np.int32), n_max))
    return cases


#: Exercise 1.1: the first line when reverse mode meets a loop whose trip count is not
#: known when the loop is compiled: a ``while_loop`` (``vmap``-ped as in the chapter, or
#: stopping at the static ``n_max``: its condition still runs at run time) or a
#: ``fori_loop`` to ``jnp.max(n)``.
TRACED_TRIP_COUNT = (
    "reverse mode cannot go through a lax.while_loop, even one that stops at the "
    "static n_max (its condition is evaluated at run time), nor a fori_loop with "
    "traced bounds such as jnp.max(n): the backward pass needs every step's values, "
    "and the number of steps is unknown when the loop is compiled. Loop a static n_max "
    "times (lax.fori_loop(0, n_max, ...)) and keep each entry's finished value with a "
    "mask, jnp.where(i < n, step, value), as the exercise says"
)


def _fix_jit_hint(message: str) -> str:
    """What to change, for the usual failures of exercise 1.1 (the checker's own line,
    put before JAX's error by :func:`_with_hint`), or ``""``."""
    message = message.split(" raised ", 1)[-1]  # the error, not what was called
    if "Reverse-mode differentiation does not work" in message:
        return TRACED_TRIP_COUNT
    if "TracerArrayConversionError" in message:  # named by call_answer already
        return ""
    if "static" in message or "hashable" in message:
        return (
            "n is an array of counts, one per entry, so it cannot be a static "
            "argument: keep it traced; n_max is the static one"
        )
    if any(
        k in message
        for k in ("TracerIntegerConversionError", "Concretization", "scalar index")
    ):
        return (
            "range(n), int(n) and n.max() in Python need concrete numbers; under "
            "jit n is traced: the number of steps you may use in Python is n_max"
        )
    if "boolean scalar" in message or "must be scalars" in message:
        return (
            "a loop primitive's trip count is one scalar for the whole loop, and "
            "here each entry has its own n: loop n_max times and keep finished "
            "entries with jnp.where"
        )
    return ""


def _with_hint(failure: str) -> str:
    """``failure`` (the student's error) after the checker's line naming the slip
    (:func:`_fix_jit_hint`), where it has one."""
    hint = _fix_jit_hint(failure)
    return f"{hint}\n    {failure}" if hint else failure


def _loop_steps(answer: Callable, x: jax.Array, n: jax.Array, n_max: int) -> int:
    """The most ``sin`` steps the answer's program can take: a ``scan`` length times the
    ``sin`` calls in its body, or the ``sin`` calls of an unrolled loop (0 if unknown)."""
    try:
        jaxpr = jax.make_jaxpr(answer, static_argnums=2)(x, n, n_max)
    except Exception:
        return 0

    def steps(jx: Any) -> int:
        total = 0
        for eqn in jx.eqns:
            total += eqn.primitive.name == "sin"
            inner = []
            for v in eqn.params.values():
                for item in v if isinstance(v, (tuple, list)) else (v,):
                    if hasattr(item, "eqns"):  # a Jaxpr or ClosedJaxpr
                        inner.append(item)
            count = sum(steps(j) for j in inner)
            if eqn.primitive.name == "scan":
                count *= int(eqn.params["length"])
            total += count
        return total

    return steps(jaxpr.jaxpr)


def _bound_problem(
    answer: Callable, x: jax.Array, n: jax.Array, n_max: int, where: str
) -> str | None:
    """What is wrong with the answer's loop length in one drawn case, or None.

    The answer's ``sin`` steps (:func:`_loop_steps`) may be at most ``n_max`` plus one
    unused step (a ``scan`` that also computes the iterate after the last one it keeps,
    or a loop to ``n_max + 1``). A longer loop is refused; when its length is the same
    for ``n_max + 1`` (traced again, not run) it is a bound written into the code, and
    the message names it.
    """
    steps = _loop_steps(answer, x, n, n_max)
    if steps <= n_max + 1:
        return None
    other = _loop_steps(answer, x, n, n_max + 1)
    expected = f"got {steps} steps, expected n_max = {n_max} (or one more, unused)"
    if other == steps:
        return (
            f"{where}: a bound written into the code: your program applies sin "
            f"{steps} times whatever n_max is ({steps} for n_max = {n_max} and for "
            f"n_max = {n_max + 1}); {expected}: the bound does work no entry needs "
            "here, and is too little for a larger n_max; use n_max"
        )
    return (
        f"{where}: your program applies sin {steps} times for n_max = {n_max} "
        f"({other} for n_max = {n_max + 1}); {expected}: the {steps - n_max} steps "
        "past n_max do work no entry needs; loop n_max times"
    )


def _short_bound(answer: Callable, x: jax.Array, n: jax.Array, n_max: int) -> str:
    """A line naming a bound written into the code that is below ``n_max`` (why
    counts above it come out wrong), or ``""``."""
    steps = _loop_steps(answer, x, n, n_max)
    if not 0 < steps < n_max or _loop_steps(answer, x, n, n_max + 1) != steps:
        return ""
    return (
        f"your program applies sin at most {steps} times whatever n_max is ({steps} "
        f"for n_max = {n_max} and for n_max = {n_max + 1}): a bound written into the "
        f"code, too small for n_max = {n_max}; use n_max"
    )


def check_fix_jit(
    answer: Callable[[jax.Array, jax.Array, int], jax.Array],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> Feedback:
    """Exercise 1.1: ``answer(x, n, n_max)`` applies ``sin`` ``n[j]`` times to ``x[j]``.

    ``x`` is float32, ``n`` an int32 array of the same shape, ``n_max`` a Python int
    that no count exceeds. The checker draws :data:`FIX_JIT_CALLS` cases
    (:func:`fix_jit_counts`), jits a fresh wrapper of ``answer`` with ``n_max`` static
    (:class:`~beyondgrad.tracers.CompilationCounter`), and compares its values and
    ``jax.grad`` of their sum with respect to ``x`` with float64 iterates of ``sin`` and
    their derivative (``|got - want| <= FIX_JIT_ATOL + FIX_JIT_RTOL |want|``). It
    requires one trace per size and ``n_max`` (the counts stay traced) and a loop of at
    most ``n_max`` steps plus one unused step (:func:`_bound_problem`: a longer one is
    refused, and named a bound written into the code when its length does not follow
    ``n_max``). It stops waiting after :data:`TIME_LIMIT` seconds.
    """
    msg = exercises.require_callable(answer, "repeat_sin_each")
    if msg:
        return exercises.verdict(EX1, [msg], strict=strict)
    result = exercises.run_with_time_limit(
        lambda: _check_fix_jit(answer, seed), TIME_LIMIT
    )
    return _strict(EX1, result, strict)


def _strict(exercise: str, result: Any, strict: bool) -> Feedback:
    """The checker's :class:`Feedback` (a timeout becomes one), raised when strict."""
    if not isinstance(result, Feedback):
        result = exercises.verdict(exercise, [exercises.failed(result) or ""])
    if strict and not result.passed:
        raise exercises.ExerciseFailed(str(result))
    return result


def _check_fix_jit(answer: Callable, seed: int | None) -> Feedback:
    fresh = CompilationCounter(answer, static_argnums=2)
    grad = jax.jit(jax.grad(lambda x, n, m: jnp.sum(answer(x, n, m))), static_argnums=2)
    cases = fix_jit_counts(seed)
    for k, (x, n, n_max) in enumerate(cases):
        args = (jnp.asarray(x), jnp.asarray(n), n_max)
        got = exercises.call_answer(
            fresh, *args, what="jax.jit(your function, static_argnums=2)"
        )
        if exercises.is_stub(got):
            return exercises.verdict(EX1, [], attempted=False)
        failure = exercises.failed(got)
        if failure:
            return exercises.verdict(EX1, [_with_hint(failure)])
        want, want_slope = _sin_iterates(x, n)
        where = f"case {k + 1} (n_max = {n_max})"
        problems = exercises.tree_mismatches(
            got, want, rtol=FIX_JIT_RTOL, atol=FIX_JIT_ATOL, name=f"{where}: result"
        )
        if problems and np.shape(got) == want.shape:
            got64 = np.asarray(got, np.float64)
            bad = np.abs(got64 - want) > FIX_JIT_ATOL + FIX_JIT_RTOL * np.abs(want)
            bad |= ~np.isfinite(got64)
            wrong = sorted({int(c) for c in n[bad]})
            right = sorted({int(c) for c in n[~bad]})
            problems.append(f"wrong for the counts {wrong}, right for {right}")
            short = _short_bound(answer, *args)
            if short:
                problems.append(short)
        if problems:
            return exercises.verdict(EX1, problems)
        slope = exercises.call_answer(
            grad, *args, what="jax.grad of the sum of your function"
        )
        failure = exercises.failed(slope)
        if failure:
            return exercises.verdict(EX1, [_with_hint(failure)])
        problems = exercises.tree_mismatches(
            slope,
            want_slope,
            rtol=FIX_JIT_RTOL,
            atol=FIX_JIT_ATOL,
            name=f"{where}: gradient with respect to x",
        )
        if problems:
            return exercises.verdict(EX1, problems)
        bound = _bound_problem(answer, *args, where)
        if bound:
            return exercises.verdict(EX1, [bound])
    shapes = {(len(x), n_max) for x, _, n_max in cases}
    if fresh.traces != len(shapes):
        return exercises.verdict(
            EX1,
            [
                f"a fresh jit traced your function {fresh.traces} times for "
                f"{len(cases)} calls with {len(shapes)} different sizes and n_max: "
                "it should trace once for each; something in it depends on the "
                "values of n or x"
            ],
        )
    success = (
        f"values and gradients match sin applied n[j] times to x[j] in "
        f"{len(cases)} random cases with n_max up to {max(m for *_, m in cases)} "
        f"(relative error <= {FIX_JIT_RTOL:g}, absolute {FIX_JIT_ATOL:g}); one trace "
        "per size and n_max"
    )
    return exercises.verdict(EX1, [], success=success)


# --------------------------------------------------------------------------------------
# Exercise 1.2
# --------------------------------------------------------------------------------------


def retrace_quiz_function(x: jax.Array, n: int) -> jax.Array:
    """The function of exercise 1.2: ``x * n``, jitted with ``static_argnames="n"``."""
    return x * n


#: Exercise 1.2: quizzes per check.
RETRACE_QUIZZES = 2


def retrace_quiz(seed: int | None = None) -> list[Call]:
    """One drawn quiz of exercise 1.2: calls of ``retrace_quiz_function``, in order.

    The first call is a float32 array of a drawn length with a drawn static ``n``; then
    every kind of change comes once, in random order, with two repeats: new values;
    the same array as NumPy float32 and as NumPy float64; another length; int32; another
    ``n``; a 0-d float32 array; a Python float; a Python int. (``n`` is always an int:
    whether ``n=2.0`` reuses the trace of ``n=2`` depends on the JAX version.)
    """
    rng = np.random.default_rng(seed)
    m, n0 = int(rng.integers(2, 7)), int(rng.integers(2, 6))

    def values(size: int) -> np.ndarray:
        return rng.uniform(-3.0, 3.0, size)

    kinds: list[Callable[[], Call]] = [
        lambda: call(jnp.asarray(values(m), jnp.float32), n=n0),
        lambda: call(values(m).astype(np.float32), n=n0),
        lambda: call(values(m), n=n0),  # NumPy float64
        lambda: call(jnp.ones(m + int(rng.integers(1, 3))), n=n0),
        lambda: call(jnp.arange(m, dtype=jnp.int32), n=n0),
        lambda: call(jnp.ones(m), n=n0 + int(rng.integers(1, 3))),
        lambda: call(jnp.float32(round(rng.uniform(-3, 3), 2)), n=n0),
        lambda: call(round(float(rng.uniform(-3, 3)), 2), n=n0),
        lambda: call(int(rng.integers(1, 9)), n=n0),
        # a 0-d int32 array: not weakly typed, unlike the Python int above
        lambda: call(jnp.int32(rng.integers(1, 9)), n=n0),
    ]
    order = [*rng.permutation(len(kinds)), *rng.integers(0, len(kinds), 2)]
    return [kinds[0](), *(kinds[int(k)]() for k in order)]


def _key_of(answer: Callable, c: Call) -> tuple[Any, str | None]:
    """The student's key for one call, or ``(None, what went wrong)``."""
    key = exercises.call_answer(answer, *c.args, c.kwargs["n"], what="my_cache_key")
    failure = exercises.failed(key)
    if failure is not None:
        x = c.args[0]
        if isinstance(x, (bool, int, float, complex)) and "AttributeError" in failure:
            # x.shape / x.dtype on a Python number: name the call, then Python's error
            return key, (
                f"call {c.signature()} passes x as a Python {type(x).__name__}, which "
                "has no .shape or .dtype (jit takes Python numbers too): read them "
                "with functions that accept any argument jit does, jnp.shape(x), "
                f"jnp.result_type(x) or jax.typeof(x)\n    {failure}"
            )
        return key, failure
    try:
        hash(key)
    except TypeError:
        return None, (
            f"my_cache_key{c.signature()} returned an unhashable "
            f"{type(key).__name__}: return a tuple (or another hashable value), so "
            "that it can be a dictionary key, as jit's keys are"
        )
    return key, None


def check_predict_retraces(
    answer: Callable[..., Any], *, strict: bool = False, seed: int | None = None
) -> Feedback:
    """Exercise 1.2: ``answer(x, n)`` returns what ``jit`` keys its traces on.

    ``answer`` is called with the arguments of each call of :data:`RETRACE_QUIZZES`
    drawn quizzes (:func:`retrace_quiz`) and must return a hashable key. The key
    predicts a retrace exactly when it was not returned for an earlier call of the same
    quiz; the truth is measured with :func:`beyondgrad.tracers.count_traces` on a fresh
    ``jax.jit(retrace_quiz_function, static_argnames="n")``. Each wrong prediction is
    named with the call and, for a predicted cache hit, the earlier call it matched.
    Stops waiting after :data:`TIME_LIMIT` seconds.
    """
    msg = exercises.require_callable(answer, "my_cache_key")
    if msg:
        msg += (
            " (this exercise asks for a function my_cache_key(x, n) that returns "
            "what jit's trace cache is keyed on)"
        )
        return exercises.verdict(EX2, [msg], strict=strict)
    result = exercises.run_with_time_limit(
        lambda: _check_predict_retraces(answer, seed), TIME_LIMIT
    )
    return _strict(EX2, result, strict)


def _check_predict_retraces(answer: Callable, seed: int | None) -> Feedback:
    rng = np.random.default_rng(seed)
    total = traces = 0
    for _ in range(RETRACE_QUIZZES):
        calls = retrace_quiz(int(rng.integers(2**31)))
        keys: list[Any] = []
        for c in calls:
            key, why = _key_of(answer, c)
            if exercises.is_stub(key):
                return exercises.verdict(EX2, [], attempted=False)
            if why is not None:
                return exercises.verdict(EX2, [why])
            keys.append(key)
        log = count_traces(retrace_quiz_function, calls, static_argnames="n")
        problems = []
        for k, (c, truth) in enumerate(zip(calls, log.retraced)):
            earlier = [j for j in range(k) if keys[j] == keys[k]]
            if (not earlier) == truth:
                continue
            if earlier:
                j = earlier[0]
                problems.append(
                    f"call {k} {c.signature()}: your key equals the key of call {j} "
                    f"{calls[j].signature()}, so you predict a cache hit, but jit traced "
                    "again: the two differ in something jit's key includes"
                )
            else:
                problems.append(
                    f"call {k} {c.signature()}: your key {keys[k]!r:.80} is new, so you "
                    "predict a retrace, but jit reused an earlier trace: your key "
                    "includes something jit's key does not"
                )
        if problems:
            head = (
                "in a quiz drawn for this check (the next check draws another), "
                f"{len(problems)} of {len(calls)} predictions are wrong:"
            )
            return exercises.verdict(EX2, [head, *problems[:3]])
        total += len(calls)
        traces += log.traces
    success = (
        f"your key predicts every retrace in {RETRACE_QUIZZES} drawn quizzes "
        f"({total} calls, {traces} traces)"
    )
    return exercises.verdict(EX2, [], success=success)


# --------------------------------------------------------------------------------------
# Exercise 1.3
# --------------------------------------------------------------------------------------

#: Points of exercise 1.3 (b) next to 0: all but ``1e-10`` are inside the NaN interval
#: of part (a) (``1e-10`` is just right of it, where ``grad(bump)`` is 0); right of 0
#: the NaN is in the *selected* branch (``exp(-1/x) = 0`` times an infinite
#: ``x**-2``), so a ``where`` on the other branch alone does not remove it.
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
#: Error count (u32 = 2**-24, the grid points are float32 in both computations): the
#: float32 -1/x is off by u32 relative, which exp turns into u32 / x relative, largest
#: at the smallest normal case x = 0.02 (e^-50): 50 u32 = 3.0e-6; exp itself and the
#: derivative's e^(-1/x) / x^2 add a few roundings of 2**-23 (~6e-7): <= 3.6e-6 in
#: all, so 1e-5 is 2.8x above the worst case, and a wrong branch or threshold (off by
#: the value itself at some grid point) is far outside.
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
    message says which way to move it without giving it away. Stops waiting after
    :data:`TIME_LIMIT` seconds.
    """
    result = exercises.run_with_time_limit(
        lambda: _check_nan_interval(answer), TIME_LIMIT
    )
    return _strict(EX3A, result, strict)


def _check_nan_interval(
    answer: Sequence[float] | Callable[[], Sequence[float]],
) -> Feedback:
    strict = False
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
    Stops waiting after :data:`TIME_LIMIT` seconds.
    """
    msg = exercises.require_callable(answer, "bump_safe")
    if msg:
        return exercises.verdict(EX3, [msg], strict=strict)
    result = exercises.run_with_time_limit(
        lambda: _check_finite_grad(answer), TIME_LIMIT
    )
    return _strict(EX3, result, strict)


def _check_finite_grad(answer: Callable[[jax.Array], jax.Array]) -> Feedback:
    strict = False
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
