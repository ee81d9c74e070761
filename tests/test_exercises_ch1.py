"""Tests for the Chapter 1 checkers (beyondgrad.exercises.ch1).

Right answers, the wrong answers students write, and every bad-input kind (NaN, inf,
shape, dtype, Python scalar, an exception in the student's code, a value where a
function is expected, the stub, a loop that never ends) for each checker. Exercises 1.1
and 1.2 draw their cases at every check, so the wrong answers are tried on several
draws.
"""

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondgrad import exercises, tracers
from beyondgrad.exercises import ch1


def _stub(*args):
    raise NotImplementedError


def _boom(*args):
    raise ValueError("boom in the student's code")


def _assert_rejected(feedback, *fragments):
    text = str(feedback)
    assert not feedback and feedback.attempted, text
    assert text.startswith("✗ Exercise 1."), text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"


def _assert_not_attempted(feedback):
    assert not feedback and not feedback.attempted
    assert "not attempted yet" in str(feedback)


# --- Exercise 1.1 -----------------------------------------------------------------------
# The answer is sin applied n[j] times to x[j] (n an int32 array, a count per entry),
# with n_max a static bound; jax.grad must work through it.


def _masked_fori(x, n, n_max):
    return lax.fori_loop(0, n_max, lambda i, v: jnp.where(i < n, jnp.sin(v), v), x)


def _masked_python(x, n, n_max):
    for i in range(n_max):
        x = jnp.where(i < n, jnp.sin(x), x)
    return x


def _masked_scan(x, n, n_max):
    def step(v, i):
        return jnp.where(i < n, jnp.sin(v), v), None

    return lax.scan(step, x, jnp.arange(n_max))[0]


def _vmap_while(x, n, n_max):  # the chapter's slow-lane cell, adapted
    def one(n, v):
        body = lambda c: (c[0] + 1, jnp.sin(c[1]))  # noqa: E731
        return lax.while_loop(lambda c: c[0] < n, body, (0, v))[1]

    return jax.vmap(one)(n, x)


@pytest.mark.parametrize(
    "answer",
    [
        _masked_fori,
        _masked_python,
        _masked_scan,
        jax.jit(_masked_fori, static_argnums=2),
    ],
    ids=["fori_loop with where", "Python loop with where", "scan", "jit"],
)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_fix_jit_right_answers(answer, seed):
    fb = ch1.check_fix_jit(answer, strict=True, seed=seed)
    assert f"relative error <= {ch1.FIX_JIT_RTOL:g}" in str(fb)
    assert "values and gradients match" in str(fb)
    assert "one trace per size and n_max" in str(fb)


def test_fix_jit_cases_are_drawn_and_reach_past_any_fixed_bound():
    bounds = set()
    for seed in range(40):
        cases = ch1.fix_jit_counts(seed)
        assert len(cases) == ch1.FIX_JIT_CALLS == 3
        (x1, n1, m1), (x2, n2, m2), (x3, n3, m3) = cases
        assert (len(x1), m1) == (len(x2), m2) and (len(x3), m3) != (len(x1), m1)
        assert 3 <= m1 <= 30 and 60 <= m3 <= 200
        for x, n, m in cases:
            assert x.dtype == np.float32 and n.dtype == np.int32 and x.shape == n.shape
            assert n.min() == 0 and n.max() == m and np.any((n >= 1) & (n <= 3))
            assert np.all(np.abs(x) <= 2)
        bounds.add(m3)
    assert len(bounds) > 20  # not a handful of fixed values
    assert len({ch1.fix_jit_counts()[2][2] for _ in range(10)}) > 1  # fresh draws


@pytest.mark.parametrize("bound", [30, 64, 200, 1000])
def test_fix_jit_refuses_a_bound_written_into_the_code(bound):
    def answer(x, n, n_max):
        return _masked_fori(x, n, bound)

    for seed in range(3):
        fb = ch1.check_fix_jit(answer, seed=seed)
        _assert_rejected(fb)
        text = str(fb)
        assert "a bound written into the code" in text or "differs from the" in text


def _scan_take_along_axis(x, n, n_max):
    """Every iterate 0 .. n_max stacked by a scan, each entry's picked by its count; the
    scan's last carry, sin applied n_max + 1 times, is computed and dropped."""

    def step(v, _):
        return jnp.sin(v), v

    _, iterates = lax.scan(step, x, None, length=n_max + 1)
    return jnp.take_along_axis(iterates, n[None], axis=0)[0]


def _one_unused_step(x, n, n_max):  # step n_max + 1 is masked out for every entry
    return _masked_fori(x, n, n_max + 1)


@pytest.mark.parametrize(
    "answer",
    [_scan_take_along_axis, _one_unused_step],
    ids=["scan and take_along_axis", "one unused step"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fix_jit_accepts_one_unused_step(answer, seed):
    # the program applies sin n_max + 1 times (counted from the same jaxpr the checker
    # reads); the values and gradients are right, so the extra step is unused
    x, n, n_max = ch1.fix_jit_counts(seed)[0]
    args = (jnp.asarray(x), jnp.asarray(n), n_max)
    assert ch1._loop_steps(answer, *args) == n_max + 1
    fb = ch1.check_fix_jit(answer, strict=True, seed=seed)
    assert "values and gradients match" in str(fb), str(fb)


@pytest.mark.parametrize("bound", [64, 200, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fix_jit_names_the_bound_written_into_the_code(bound, seed):
    """A loop of a fixed length above every first-case n_max (<= 30): refused in case 1
    with the bound, that case's n_max and the other n_max it was traced at."""

    def answer(x, n, n_max):
        return _masked_fori(x, n, bound)

    n_max = ch1.fix_jit_counts(seed)[0][2]
    fb = ch1.check_fix_jit(answer, seed=seed)
    _assert_rejected(
        fb,
        f"case 1 (n_max = {n_max}): a bound written into the code: your program "
        f"applies sin {bound} times whatever n_max is ({bound} for n_max = {n_max} and "
        f"for n_max = {n_max + 1}); got {bound} steps, expected n_max = {n_max} (or "
        "one more, unused)",
    )
    assert fb.messages[0].startswith("case 1 (n_max = "), str(fb)


def test_fix_jit_refuses_a_loop_that_grows_faster_than_n_max():
    def answer(x, n, n_max):
        return _masked_fori(x, n, 2 * n_max)

    n_max = ch1.fix_jit_counts(0)[0][2]
    fb = ch1.check_fix_jit(answer, seed=0)
    _assert_rejected(
        fb,
        f"case 1 (n_max = {n_max}): your program applies sin {2 * n_max} times for "
        f"n_max = {n_max} ({2 * n_max + 2} for n_max = {n_max + 1}); got {2 * n_max} "
        f"steps, expected n_max = {n_max} (or one more, unused): the {n_max} steps "
        "past n_max do work no entry needs",
    )
    assert "a bound written into the code" not in str(fb)


def test_fix_jit_names_a_bound_written_into_the_code_below_n_max():
    def answer(x, n, n_max):
        return _masked_python(x, n, 8)

    seed = next(s for s in range(20) if ch1.fix_jit_counts(s)[0][2] > 8)
    n_max = ch1.fix_jit_counts(seed)[0][2]
    fb = ch1.check_fix_jit(answer, seed=seed)
    _assert_rejected(
        fb,
        "wrong for the counts",
        f"your program applies sin at most 8 times whatever n_max is (8 for n_max = "
        f"{n_max} and for n_max = {n_max + 1}): a bound written into the code, too "
        f"small for n_max = {n_max}; use n_max",
    )


@pytest.mark.parametrize("k", [8, 64, 200])
def test_fix_jit_refuses_a_python_loop_of_fixed_length(k):
    def answer(x, n, n_max):
        return _masked_python(x, n, k)

    fb = ch1.check_fix_jit(answer, seed=0)
    _assert_rejected(fb)
    assert "a bound written into the code" in str(fb) or "wrong for the counts" in str(
        fb
    )


def test_fix_jit_tolerance_is_pinned():
    # correct float32 answers are within 2.3e-6 relative of float64 (measured, n_max up
    # to 200); FIX_JIT_RTOL is 1e-5. 3x the tolerance off is rejected, 0.3x accepted.
    _assert_rejected(
        ch1.check_fix_jit(lambda x, n, m: _masked_fori(x, n, m) * (1 + 3e-5), seed=0),
        "differs from the reference",
    )
    assert ch1.check_fix_jit(lambda x, n, m: _masked_fori(x, n, m) * (1 + 3e-6), seed=0)


@jax.custom_vjp
def _wrong_slope(x):
    return x


_wrong_slope.defvjp(lambda x: (x, None), lambda _, ct: (2.0 * ct,))


NEAR_MISSES_11 = [
    (
        "the chapter's vmap of a while_loop",
        _vmap_while,
        "reverse mode cannot go through a lax.while_loop",
    ),
    (
        "one iteration too few",
        lambda x, n, m: _masked_fori(x, jnp.maximum(n - 1, 0), m),
        "wrong for the counts",
    ),
    (
        "cos instead of sin",
        lambda x, n, m: lax.fori_loop(
            0, m, lambda i, v: jnp.where(i < n, jnp.cos(v), v), x
        ),
        "differs from the reference",
    ),
    (
        "right values, gradient stopped",
        lambda x, n, m: lax.stop_gradient(_masked_fori(x, n, m)),
        "gradient with respect to x",
    ),
    (
        "right values, wrong gradient",
        lambda x, n, m: _wrong_slope(_masked_fori(x, n, m)),
        "gradient with respect to x",
    ),
    (
        "static n",
        lambda x, n, m: jax.jit(ch1.repeat_sin, static_argnums=1)(x, n),
        "cannot be a static argument",
    ),
    (
        "the Python loop over n",
        lambda x, n, m: ch1.repeat_sin(x, n),
        "the number of steps you may use in Python is n_max",
    ),
    (
        "fori_loop with the array as its bound",
        lambda x, n, m: lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x),
        "loop n_max times and keep finished entries with jnp.where",
    ),
    (
        "a count read in Python",
        lambda x, n, m: _masked_fori(x, n, int(n.max())),
        "under jit n is traced",
    ),
    (
        "n_max ignored, loop to max(n)",
        lambda x, n, m: lax.fori_loop(
            0, jnp.max(n), lambda i, v: jnp.where(i < n, jnp.sin(v), v), x
        ),
        "nor a fori_loop with traced bounds such as jnp.max(n)",
    ),
]


@pytest.mark.parametrize("case", NEAR_MISSES_11, ids=[c[0] for c in NEAR_MISSES_11])
def test_fix_jit_near_misses(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_fix_jit(answer, seed=0), fragment)
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_fix_jit(answer, strict=True, seed=0)


BAD_11 = [
    ("nan", lambda x, n, m: _masked_fori(x, n, m) * jnp.nan, "nan/inf does not match"),
    ("inf", lambda x, n, m: _masked_fori(x, n, m) / 0.0, "nan/inf does not match"),
    ("shape", lambda x, n, m: _masked_fori(x, n, m)[:2], "has shape (2,), expected"),
    (
        "dtype",
        lambda x, n, m: jnp.round(_masked_fori(x, n, m)).astype(jnp.int32),
        "has dtype int32, expected a floating dtype",
    ),
    ("exception", _boom, "raised ValueError: boom in the student's code"),
    ("two arguments", lambda x, n: x, "raised TypeError"),
    (
        "value, not function",
        jnp.ones(5),
        "you passed a value (ArrayImpl of shape (5,))",
    ),
]


@pytest.mark.parametrize("case", BAD_11, ids=[c[0] for c in BAD_11])
def test_fix_jit_bad_inputs(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_fix_jit(answer, seed=0), fragment)


def test_fix_jit_stub_plain_and_jitted():
    _assert_not_attempted(ch1.check_fix_jit(_stub))
    _assert_not_attempted(ch1.check_fix_jit(jax.jit(_stub, static_argnums=2)))
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_fix_jit(_stub, strict=True)


def _python_forever(*args):
    steps = 0
    while steps >= 0:
        steps += 1
    return args[0]


@pytest.mark.one_env  # waits out a time limit (conftest.py)
def test_checkers_stop_waiting_for_an_endless_loop(monkeypatch):
    import time

    monkeypatch.setattr(ch1, "TIME_LIMIT", 0.5)
    for check in (ch1.check_fix_jit, ch1.check_predict_retraces):
        start = time.perf_counter()
        fb = check(_python_forever)
        # limit + at most 3 s while the machine is loaded + 1 s to stop the thread
        assert time.perf_counter() - start < 0.5 + 3 + 1 + 0.5
        # a Python loop is stopped for good: nothing to restart
        _assert_rejected(fb, "did not finish within 0.5 s", "It was stopped.")
        assert not [
            t
            for t in threading.enumerate()
            if t.name == "beyondgrad-check"
            and (t.is_alive() or os.path.exists(f"/proc/self/task/{t.native_id}"))
        ]


def test_run_with_time_limit_passes_values_and_errors_through():
    assert exercises.run_with_time_limit(lambda: 3, 5.0) == 3
    with pytest.raises(ZeroDivisionError):
        exercises.run_with_time_limit(lambda: 1 / 0, 5.0)


# --- Exercise 1.2 -----------------------------------------------------------------------


def _right_key(x, n):
    return jax.typeof(x), n


def _right_key_by_hand(x, n):  # shape, canonical dtype, weak type, without jax.typeof
    weak = isinstance(x, (bool, int, float, complex))
    dtype = jnp.dtype(jnp.asarray(x).dtype)
    return np.shape(x), dtype, weak, n


@pytest.mark.parametrize("answer", [_right_key, _right_key_by_hand])
@pytest.mark.parametrize("seed", [None, 0, 1, 2])
def test_cache_key_right_answers(answer, seed):
    fb = ch1.check_predict_retraces(answer, strict=True, seed=seed)
    assert "your key predicts every retrace in 2 drawn quizzes" in str(fb)


def test_quiz_is_drawn_and_covers_every_kind():
    signatures = {tuple(c.signature() for c in ch1.retrace_quiz()) for _ in range(5)}
    assert len(signatures) == 5  # a new draw each time
    for seed in range(10):
        calls = ch1.retrace_quiz(seed)
        assert len(calls) == 13
        kinds = {c.signature().split(" ")[0].strip("(") for c in calls}
        assert kinds == {"jax.Array", "np.ndarray", "Python"}, kinds
        assert all(isinstance(c.kwargs["n"], int) for c in calls)
        # the truth has both cache hits and retraces in every quiz
        log = tracers.count_traces(
            ch1.retrace_quiz_function, calls, static_argnames="n"
        )
        assert 0 < log.traces < len(calls)


WRONG_KEYS = [
    # what students write, and the fragment that names the mistake
    (
        "shape and dtype, no weak type",
        lambda x, n: (np.shape(x), jnp.result_type(x), n),
        "jit traced again",
    ),
    (
        "the class of x",
        lambda x, n: (type(x), jax.typeof(x), n),
        "jit reused an earlier",
    ),
    ("the values", lambda x, n: (str(np.asarray(x)), n), "jit reused an earlier"),
    ("n ignored", lambda x, n: jax.typeof(x), "jit traced again"),
    ("shape only", lambda x, n: (np.shape(x), n), "jit traced again"),
    (
        "dtype without canonicalization",
        lambda x, n: (np.shape(x), np.asarray(x).dtype, isinstance(x, float), n),
        "jit reused an earlier",
    ),
    ("always the same", lambda x, n: 0, "jit traced again"),
    ("always new (id)", lambda x, n: id(x), "jit reused an earlier"),
]


@pytest.mark.parametrize("case", WRONG_KEYS, ids=[c[0] for c in WRONG_KEYS])
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_cache_key_wrong_answers_are_refused_on_every_draw(case, seed):
    _, answer, fragment = case
    fb = ch1.check_predict_retraces(answer, seed=seed)
    _assert_rejected(fb, "in a quiz drawn for this check", fragment)


def test_cache_key_messages_do_not_give_a_pattern_to_copy():
    # a list of booleans (the old answer) is refused as such, whatever it says
    for answer in ([True] * 12, [False] * 12, np.ones(12, bool)):
        _assert_rejected(
            ch1.check_predict_retraces(answer), "should be a function, but you passed"
        )


BAD_12 = [
    ("unhashable", lambda x, n: [np.shape(x), n], "returned an unhashable list"),
    ("exception", _boom, "my_cache_key raised ValueError: boom"),
    ("no arguments", lambda: 0, "my_cache_key raised TypeError"),
]


@pytest.mark.parametrize("case", BAD_12, ids=[c[0] for c in BAD_12])
def test_predict_retraces_bad_inputs(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_predict_retraces(answer), fragment)


@pytest.mark.parametrize("seed", [0, 1])
def test_predict_retraces_names_x_shape_on_a_python_number_first(seed):
    """x.shape on the quiz's Python numbers: the call and the slip first, Python's
    AttributeError after it (#44, workshop simulation 9)."""
    fb = ch1.check_predict_retraces(lambda x, n: (x.shape, x.dtype, n), seed=seed)
    _assert_rejected(fb)
    first, *rest = fb.messages[0].split("\n")
    assert first.startswith("call (Python "), str(fb)
    assert "which has no .shape or .dtype (jit takes Python numbers too)" in first
    assert rest and rest[0].lstrip().startswith(
        "my_cache_key raised AttributeError: "
    ), str(fb)


def test_predict_retraces_other_attribute_errors_are_not_renamed():
    def key(x, n):
        return x.no_such_attribute

    fb = ch1.check_predict_retraces(key, seed=0)
    _assert_rejected(fb)
    # the quiz's first call is a jax.Array: its own AttributeError, not the hint
    assert fb.messages[0].startswith("my_cache_key raised AttributeError"), str(fb)


def test_predict_retraces_stub():
    _assert_not_attempted(ch1.check_predict_retraces(_stub))
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_predict_retraces(_stub, strict=True)


# --- Exercise 1.3 (a) -------------------------------------------------------------------


def _nan_interval_by_grid():
    """The NaN set of grad(bump) found independently: a dense float32 grid per side."""
    g = jax.jit(jax.vmap(jax.grad(ch1.bump)))
    ends = []
    for sign, grid in (
        (-1, np.logspace(-6, 0, 100001)),
        (1, np.logspace(-25, -1, 100001)),
    ):
        xs = (sign * grid).astype(np.float32)
        nan = np.isnan(np.asarray(g(jnp.asarray(xs))))
        assert nan[0] and not nan[-1]
        ends.append(float(xs[nan][np.argmax(np.abs(xs[nan]))]))
    return tuple(ends)


def test_nan_interval_measured_matches_an_independent_grid_scan():
    # grid spacing is 1.4e-4 (left) and 5.5e-4 (right) relative, below the 1e-3 allowed
    a, b = ch1.nan_interval_measured()
    ga, gb = _nan_interval_by_grid()
    assert abs(a - ga) <= 2e-4 * abs(a) and abs(b - gb) <= 6e-4 * abs(b), (a, b, ga, gb)
    assert -0.0114 < a < -0.0112 and 1e-20 < b < 1e-18  # exp(-1/x) overflows; 1/x**k
    fb = ch1.check_nan_interval((ga, gb), strict=True)
    assert f"within {ch1.NAN_INTERVAL_RTOL:g} relative" in str(fb)


def test_nan_interval_tolerance_is_pinned():
    a, b = ch1.nan_interval_measured()
    rtol = ch1.NAN_INTERVAL_RTOL
    for end in (0, 1):
        far = [a, b]
        far[end] *= 1 + 3 * rtol
        _assert_rejected(ch1.check_nan_interval(tuple(far)), "(required: within 0.001")
        near = [a, b]
        near[end] *= 1 + 0.3 * rtol
        assert ch1.check_nan_interval(tuple(near))


NEAR_MISSES_13A = [
    (
        "the old statement: 0 and left of it",
        (-np.inf, 0.0),
        "move the left end toward 0",
    ),
    ("rounded to -0.0113", (-0.0113, 1.0842e-19), "move the left end toward 0"),
    ("x <= 0 only", (-0.011271, 0.0), "move the right end away from 0"),
    (
        "1/sqrt(float32 max) on the right",
        (-0.011271, float(1 / np.sqrt(np.finfo(np.float32).max))),
        "move the right end away from 0",
    ),
    ("reversed", (0.0, -0.0113), "the left end must be below the right end"),
    ("one number", -0.0113, "answer must be a pair of numbers"),
]


@pytest.mark.parametrize("case", NEAR_MISSES_13A, ids=[c[0] for c in NEAR_MISSES_13A])
def test_nan_interval_wrong_answers(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_nan_interval(answer), fragment)


def test_nan_interval_stub():
    _assert_not_attempted(ch1.check_nan_interval(_stub))
    assert ch1.check_nan_interval(lambda: ch1.nan_interval_measured())


# --- Exercise 1.3 (b) -------------------------------------------------------------------


def _guarded(fill):
    """The book's solution: the inner where replaces x <= 0 by ``fill`` and clamps tiny
    x > 0 to 0.01, where e^(-1/x) is already 0 (or a subnormal) in float32."""

    def answer(x):
        positive = x > 0
        safe_x = jnp.where(positive, jnp.maximum(x, 0.01), fill)
        return jnp.where(positive, jnp.exp(-1.0 / safe_x), 0.0)

    return answer


_safe = _guarded(1.0)
_safe_other_value = _guarded(42.0)
# exp(-1/0) = exp(-inf) = 0; the NaN of 0 * inf goes to the dropped branch
_safe_zero = _guarded(0.0)


def _safe_clamped(x):  # a different method: clamp the input, keep the outer where
    return jnp.where(x > 0, jnp.exp(-1.0 / jnp.maximum(x, 1e-3)), 0.0)


@pytest.mark.parametrize(
    "answer", [_safe, _safe_other_value, _safe_zero, _safe_clamped, jax.jit(_safe)]
)
def test_finite_grad_right_answers(answer):
    fb = ch1.check_finite_grad(answer, strict=True)
    assert "at 112 points of [-2, 2] (down to |x| = 1e-30), all finite" in str(fb)


def test_finite_grad_tolerance_is_pinned():
    # correct float32 answers are within 1.9e-6 relative of float64; BUMP_RTOL is 1e-5
    rtol = ch1.BUMP_RTOL
    _assert_rejected(
        ch1.check_finite_grad(lambda x: _safe(x) * (1 + 3 * rtol)), "differs"
    )
    assert ch1.check_finite_grad(lambda x: _safe(x) * (1 + 0.3 * rtol))


def _threshold(t, inner=0.0):
    def answer(x):
        return jnp.where(x > t, jnp.exp(-1.0 / jnp.where(x > inner, x, 1.0)), 0.0)

    return answer


@pytest.mark.parametrize("t", [0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.05, 0.02])
def test_finite_grad_rejects_a_where_threshold_that_is_not_zero(t):
    """The student report: thresholds 0.1..0.45 used to pass (no grid point in between)."""
    _assert_rejected(
        ch1.check_finite_grad(_threshold(t, inner=t)), "value on the grid differs"
    )


@pytest.mark.parametrize("t", [-0.1, -0.02])
def test_finite_grad_rejects_a_negative_threshold(t):
    _assert_rejected(ch1.check_finite_grad(_threshold(t)), "value on the grid differs")


def test_finite_grad_rejects_a_wrong_inner_threshold():
    _assert_rejected(ch1.check_finite_grad(_threshold(0.0, inner=0.3)), "[x = 0.01]")


NEAR_MISSES_13 = [
    (
        "one where (the bump itself)",
        ch1.bump,
        "gradient on the grid has 5 entries whose nan/inf does not match",
        "[x = -0.01]",
    ),
    (
        "inner where at 0 only (NaN right of 0 for tiny x)",
        lambda x: jnp.where(x > 0, jnp.exp(-1.0 / jnp.where(x > 0, x, 1.0)), 0.0),
        "gradient on the grid has 2 entries whose nan/inf does not match",
        "[x = 1e-30]",
        "the *selected* branch is exp(-1/x) = 0 times an infinite x**-2",
    ),
    (
        "inner where only",
        lambda x: jnp.exp(-1.0 / jnp.where(x > 0, x, 1.0)),
        "value on the grid differs",
        "[x = -2]",
    ),
    (
        ">= instead of >",
        lambda x: jnp.where(x >= 0, jnp.exp(-1.0 / jnp.where(x >= 0, x, 1.0)), 0.0),
        "gradient on the grid has",
        "[x = 0]",
    ),
    (
        "gradient stopped",
        lambda x: lax.stop_gradient(_safe(x)),
        "gradient on the grid differs",
        "expected",
    ),
    (
        "Python if",
        lambda x: jnp.exp(-1.0 / x) if x > 0 else 0.0,
        "vmap(bump_safe) raised TracerBoolConversionError",
        "",
    ),
]


@pytest.mark.parametrize("case", NEAR_MISSES_13, ids=[c[0] for c in NEAR_MISSES_13])
def test_finite_grad_near_misses(case):
    _, answer, *fragments = case
    _assert_rejected(ch1.check_finite_grad(answer), *fragments)
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_finite_grad(answer, strict=True)


BAD_13 = [
    ("nan", lambda x: _safe(x) * jnp.nan, "nan/inf does not match"),
    ("inf", lambda x: _safe(x) + jnp.inf, "nan/inf does not match"),
    ("shape", lambda x: jnp.stack([_safe(x), _safe(x)]), "has shape (2,), expected ()"),
    (
        "dtype",
        lambda x: (x > 0).astype(jnp.int32),
        "has dtype int32, expected a floating",
    ),
    ("Python scalar", lambda x: 0.0, "is a Python float, expected an array"),
    ("exception", _boom, "bump_safe(0.5) raised ValueError: boom"),
    (
        "value, not function",
        _safe(jnp.float32(0.5)),
        "you passed a value (ArrayImpl of shape ())",
    ),
]


@pytest.mark.parametrize("case", BAD_13, ids=[c[0] for c in BAD_13])
def test_finite_grad_bad_inputs(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_finite_grad(answer), fragment)


def test_finite_grad_stub():
    _assert_not_attempted(ch1.check_finite_grad(_stub))
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_finite_grad(_stub, strict=True)


def test_bump_reference_against_finite_differences():
    x = np.array([-1.0, 0.2, 0.5, 1.0, 3.0])
    h = 1e-6
    value, slope = ch1._bump_reference(x)
    fd = (ch1._bump_reference(x + h)[0] - ch1._bump_reference(x - h)[0]) / (2 * h)
    # central differences in float64 at h = 1e-6: measured error < 3e-10 relative
    np.testing.assert_allclose(slope, fd, rtol=1e-8, atol=1e-12)
    np.testing.assert_array_equal(value[0], 0.0)
    np.testing.assert_allclose(value[1:], np.exp(-1 / x[1:]), rtol=1e-15)


def test_bump_grid_leaves_no_gap_for_a_threshold():
    inner = np.sort(ch1.BUMP_GRID[(ch1.BUMP_GRID >= -0.5) & (ch1.BUMP_GRID <= 0.5)])
    assert inner[0] == np.float32(-0.5) and inner[-1] == np.float32(0.5)
    assert np.max(np.diff(inner)) <= np.float32(0.0101)
    assert 0.0 in ch1.BUMP_GRID and ch1.BUMP_GRID.dtype == np.float32


def test_the_accuracy_bounds_hold_with_their_margin():
    """The measured float32 error of the book's solution is well inside BUMP_RTOL."""
    xs = jnp.asarray(ch1.BUMP_GRID)
    value, slope = ch1._bump_reference(ch1.BUMP_GRID)
    got_v = np.asarray(jax.vmap(_safe)(xs), np.float64)
    got_s = np.asarray(jax.jit(jax.vmap(jax.grad(_safe)))(xs), np.float64)
    big = value > 1e-30
    worst = max(
        np.max(np.abs(got_v - value)[big] / value[big]),
        np.max(np.abs(got_s - slope)[big] / slope[big]),
    )
    assert worst < ch1.BUMP_RTOL / 4  # measured 1.9e-6 against 1e-5


# --- Slips named first (issue #44) ------------------------------------------------------
# The first line a student sees names the slip; JAX's own error follows on later lines.


def _numpy_bump(x):  # NumPy on the input: works on a number, not on a tracer
    return np.where(x > 0, np.exp(-1.0 / np.where(x > 0, x, 1.0)), 0.0)


def _numpy_inside_bump(x):  # one np. call among jnp ones
    return jnp.where(x > 0, np.exp(-1.0 / jnp.where(x > 0, x, 1.0)), 0.0)


@pytest.mark.parametrize("answer", [_numpy_bump, _numpy_inside_bump])
def test_finite_grad_names_numpy_on_a_tracer_first(answer):
    fb = ch1.check_finite_grad(answer)
    _assert_rejected(fb)
    first, *rest = fb.messages[0].split("\n")
    assert first == exercises.NUMPY_ON_TRACER, str(fb)
    assert "jax.numpy" in first and "tracer" in first
    # JAX's own error after it, with what was called
    assert rest and rest[0].lstrip().startswith(
        "vmap(bump_safe) raised TracerArrayConversionError"
    ), str(fb)


def test_finite_grad_names_a_python_if_on_a_tracer_first():
    fb = ch1.check_finite_grad(lambda x: jnp.exp(-1.0 / x) if x > 0 else 0.0)
    _assert_rejected(fb)
    first, *rest = fb.messages[0].split("\n")
    assert first == exercises.PYTHON_BOOL_ON_TRACER, str(fb)
    assert rest and rest[0].lstrip().startswith(
        "vmap(bump_safe) raised TracerBoolConversionError"
    ), str(fb)


def test_fix_jit_names_numpy_on_a_tracer_first():
    fb = ch1.check_fix_jit(lambda x, n, m: np.sin(x), seed=0)
    _assert_rejected(fb)
    lines = fb.messages[0].split("\n")
    assert lines[0] == exercises.NUMPY_ON_TRACER, str(fb)
    assert "raised TracerArrayConversionError" in lines[1], str(fb)


def _fori_to_max_n(x, n, n_max):  # n_max ignored: the trip count max(n) is traced
    return lax.fori_loop(0, jnp.max(n), lambda i, v: jnp.where(i < n, jnp.sin(v), v), x)


def _while_to_static_n_max(x, n, n_max):  # a static bound, still a while_loop
    def body(c):
        return c[0] + 1, jnp.where(c[0] < n, jnp.sin(c[1]), c[1])

    return lax.while_loop(lambda c: c[0] < n_max, body, (0, x))[1]


@pytest.mark.parametrize(
    "answer", [_vmap_while, _fori_to_max_n, _while_to_static_n_max]
)
def test_fix_jit_names_a_traced_trip_count_before_jax_error(answer):
    fb = ch1.check_fix_jit(answer, seed=0)
    _assert_rejected(fb)
    first, *rest = fb.messages[0].split("\n")
    assert first == ch1.TRACED_TRIP_COUNT, str(fb)
    assert "n_max" in first and "mask" in first
    # a while_loop bounded by the static n_max is named as such (workshop sim 9)
    assert "even one that stops at the static n_max" in first
    assert rest and rest[0].lstrip().startswith(
        "jax.grad of the sum of your function raised ValueError: Reverse-mode "
        "differentiation does not work"
    ), str(fb)


def test_call_answer_names_numpy_on_a_tracer_only_for_that_error():
    """The named slip comes from the exception's type, not from its text."""

    def boom(x):
        raise ValueError("TracerArrayConversionError in a message of my own")

    plain = exercises.failed(exercises.call_answer(boom, 1.0))
    assert plain.startswith("your function raised ValueError"), plain
    traced = exercises.failed(exercises.call_answer(jax.jit(np.asarray), jnp.ones(2)))
    assert traced.startswith(exercises.NUMPY_ON_TRACER + "\n    your function raised")
    branched = exercises.failed(
        exercises.call_answer(jax.jit(lambda x: x if x > 0 else -x), 1.0)
    )
    assert branched.startswith(
        exercises.PYTHON_BOOL_ON_TRACER + "\n    your function raised"
    ), branched

    def says_bool(x):
        raise ValueError("TracerBoolConversionError in a message of my own")

    assert exercises.failed(exercises.call_answer(says_bool, 1.0)).startswith(
        "your function raised ValueError"
    )
