"""Tests for the Chapter 1 checkers (beyondgrad.exercises.ch1).

Right answers, near-miss wrong answers, and every bad-input kind (NaN, inf, shape,
dtype, Python scalar, an exception in the student's code, a value where a function
is expected, the stub) for each checker. The expected retrace pattern is pinned
literally and checked against the measurement on both JAX ends.
"""

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
# The answer is sin applied n[j] times to x[j], n an int32 array (a count per entry).


def _vmap_fori(x, n):
    one = lambda x, n: lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x)  # noqa: E731
    return jax.vmap(one)(x, n)


def _masked_to_max(x, n):
    body = lambda i, v: jnp.where(i < n, jnp.sin(v), v)  # noqa: E731
    return lax.fori_loop(0, jnp.max(n), body, x)


def _while_masked(x, n):
    def body(state):
        i, v = state
        return i + 1, jnp.where(i < n, jnp.sin(v), v)

    return lax.while_loop(lambda s: jnp.any(s[0] < n), body, (0, x))[1]


@pytest.mark.parametrize(
    "answer",
    [_vmap_fori, _masked_to_max, _while_masked, jax.jit(_vmap_fori)],
    ids=["vmap(fori_loop)", "fori_loop to max with where", "while_loop", "jit"],
)
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_fix_jit_right_answers(answer, seed):
    fb = ch1.check_fix_jit(answer, strict=True, seed=seed)
    assert "for random counts up to 64" in str(fb)
    assert f"relative error <= {ch1.FIX_JIT_RTOL:g}" in str(fb)
    assert "a fresh jit traced it once for 2 calls" in str(fb)


def test_fix_jit_counts_reach_beyond_any_small_unroll():
    for seed in range(20):
        counts = ch1.fix_jit_counts(seed)
        assert counts.dtype == np.int32 and counts.shape == (ch1.FIX_JIT_SIZE,)
        assert counts.min() == 0 and counts.max() == ch1.FIX_JIT_MAX_N == 64
        assert np.any((counts >= 1) & (counts <= 8))
    assert len({tuple(ch1.fix_jit_counts()) for _ in range(5)}) > 1  # fresh draws


def _unrolled(k):
    def answer(x, n):
        for i in range(k):
            x = jnp.where(i < n, jnp.sin(x), x)
        return x

    return answer


@pytest.mark.parametrize("k", [6, 8, 32])
def test_fix_jit_rejects_a_loop_unrolled_to_a_fixed_count(k):
    _assert_rejected(
        ch1.check_fix_jit(_unrolled(k), seed=0),
        "differs from the reference",
        "does your loop stop at a fixed number of steps?",
    )


def test_fix_jit_tolerance_is_pinned():
    # correct float32 answers are within 3.6e-7 relative of float64 (measured, every n
    # up to 64); FIX_JIT_RTOL is 1e-6. 3x the tolerance off is rejected, 0.3x accepted.
    rtol = ch1.FIX_JIT_RTOL
    _assert_rejected(
        ch1.check_fix_jit(lambda x, n: _vmap_fori(x, n) * (1 + 3 * rtol), seed=0),
        "differs from the reference",
    )
    assert ch1.check_fix_jit(lambda x, n: _vmap_fori(x, n) * (1 + 0.3 * rtol), seed=0)


NEAR_MISSES_11 = [
    (
        "one iteration too few",
        lambda x, n: _vmap_fori(x, jnp.maximum(n - 1, 0)),
        "differs from the reference",
    ),
    (
        "cos instead of sin",
        lambda x, n: jax.vmap(
            lambda x, n: lax.fori_loop(0, n, lambda i, v: jnp.cos(v), x)
        )(x, n),
        "differs from the reference",
    ),
    (
        "static n (the chapter's fix for a scalar n)",
        jax.jit(ch1.repeat_sin, static_argnums=1),
        "cannot be a static argument",
    ),
    (
        "the Python loop",
        ch1.repeat_sin,
        "need concrete numbers; under jit n is traced",
    ),
    (
        "fori_loop with the array as its bound",
        lambda x, n: lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x),
        "vmap the loop over the entries",
    ),
    (
        "a count read in Python",
        lambda x, n: _masked_to_max(x, n) if int(n.max()) >= 0 else x,
        "under jit n is traced",
    ),
]


@pytest.mark.parametrize("case", NEAR_MISSES_11, ids=[c[0] for c in NEAR_MISSES_11])
def test_fix_jit_near_misses(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_fix_jit(answer, seed=0), fragment)
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_fix_jit(answer, strict=True, seed=0)


BAD_11 = [
    ("nan", lambda x, n: _vmap_fori(x, n) * jnp.nan, "nan/inf does not match"),
    ("inf", lambda x, n: _vmap_fori(x, n) / 0.0, "nan/inf does not match"),
    ("shape", lambda x, n: _vmap_fori(x, n)[:2], "has shape (2,), expected (8,)"),
    (
        "dtype",
        lambda x, n: jnp.round(_vmap_fori(x, n)).astype(jnp.int32),
        "has dtype int32, expected a floating dtype",
    ),
    ("exception", _boom, "raised ValueError: boom in the student's code"),
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
    _assert_not_attempted(ch1.check_fix_jit(jax.jit(_stub)))
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_fix_jit(_stub, strict=True)


# --- Exercise 1.2 -----------------------------------------------------------------------

#: Pinned: measured on JAX 0.8.2 and 0.12 (the same on both).
RIGHT = [True, False, True, True, True, False, True, True, False]


def test_the_measured_truth_is_the_pinned_one():
    calls = ch1.retrace_quiz()
    log = tracers.count_traces(ch1.retrace_quiz_function, calls, static_argnames="n")
    assert list(log.retraced) == RIGHT
    assert log.cache_sizes == (1, 1, 2, 3, 4, 5, 6, 7, 7)


@pytest.mark.parametrize(
    "form",
    [
        RIGHT,
        tuple(RIGHT),
        [int(b) for b in RIGHT],
        np.array(RIGHT),
        [np.bool_(b) for b in RIGHT],
        np.array(RIGHT, dtype=np.int64),
        jnp.array(RIGHT),
        lambda: RIGHT,
    ],
    ids=[
        "list",
        "tuple",
        "0/1",
        "np.bool array",
        "np.bool_ list",
        "np.int array",
        "jax array",
        "function",
    ],
)
def test_predict_retraces_accepts_every_boolean_form(form):
    fb = ch1.check_predict_retraces(form, strict=True)
    assert str(fb).endswith("all 9 predictions match the trace counter (6 traces)")


SIGNATURES = [
    "(jax.Array float32[3], n=2)",
    "(jax.Array float32[3], n=2)",
    "(jax.Array float32[4], n=2)",
    "(jax.Array float32[3], n=3)",
    "(jax.Array int32[3], n=2)",
    "(np.ndarray float32[3], n=2)",
    "(jax.Array float32[], n=2)",
    "(Python float 1.0 (~float32[]), n=2)",
    "(jax.Array float32[3], n=2)",
]


@pytest.mark.parametrize("k", range(9))
def test_predict_retraces_names_each_single_wrong_call(k):
    wrong = list(RIGHT)
    wrong[k] = not wrong[k]
    said = "retrace" if wrong[k] else "cached"
    did = "traced it again" if RIGHT[k] else "reused a cached trace"
    fb = ch1.check_predict_retraces(wrong)
    _assert_rejected(fb, f"call {k} {SIGNATURES[k]}: you said {said}, jit {did}")
    assert str(fb).count("  - call") == 1


BAD_12 = [
    ("nan", [*RIGHT[:-1], float("nan")], "entry 8 is nan (float)"),
    ("inf", [np.inf, *RIGHT[1:]], "entry 0 is inf (float)"),
    ("too short", RIGHT[:-1], "got 8 value(s)"),
    ("2-D", np.array([RIGHT, RIGHT]), "of shape (2, 9)"),
    ("float entries", [0.5] * 9, "entry 0 is 0.5 (float)"),
    ("strings", ["yes"] * 9, "entry 0 is 'yes' (str)"),
    ("integer 2", [2] * 9, "entry 0 is 2 (int)"),
    ("one string", "yes", "got str 'yes'"),
    ("Python scalar", True, "got bool True"),
    ("exception", _boom, "my_prediction() raised ValueError: boom"),
    ("ragged", [[True], [False, True]], "answer must be a list of 9"),
]


@pytest.mark.parametrize("case", BAD_12, ids=[c[0] for c in BAD_12])
def test_predict_retraces_bad_inputs(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_predict_retraces(answer), fragment)


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
