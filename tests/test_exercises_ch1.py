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


def _loop(x, n):
    return lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x)


@pytest.mark.parametrize(
    "answer, method, count",
    [
        (
            lambda: jax.jit(ch1.repeat_sin, static_argnums=1),
            "n is a static argument",
            4,
        ),
        (
            lambda: jax.jit(ch1.repeat_sin, static_argnames="n"),
            "n is a static argument",
            4,
        ),
        (lambda: _loop, "n is traced and the loop is the while primitive", 1),
        (lambda: jax.jit(_loop), "n is traced and the loop is the while primitive", 1),
    ],
    ids=["static_argnums", "static_argnames", "fori_loop", "jit(fori_loop)"],
)
def test_fix_jit_right_answers_and_a_count_that_survives_reruns(answer, method, count):
    fn = answer()
    expected = (
        f"{method}; a fresh jit traced and compiled it {count} time(s) for these 4"
    )
    first = ch1.check_fix_jit(fn, strict=True)
    fn(jnp.ones(7), 2)  # use the answer elsewhere between runs
    second = ch1.check_fix_jit(fn, strict=True)
    assert expected in str(first) and expected in str(second)


def _static(body):
    return jax.jit(body, static_argnums=1)


def _one_too_few(x, n):
    for _ in range(n - 1):
        x = jnp.sin(x)
    return x


NEAR_MISSES_11 = [
    ("one iteration too few", lambda: _static(_one_too_few), "result for n=1 differs"),
    (
        "cos instead of sin",
        lambda: lambda x, n: lax.fori_loop(0, n, lambda i, v: jnp.cos(v), x),
        "repeat_sin_fixed(x, 1) differs",
    ),
    (
        "loop from 1",
        lambda: lambda x, n: lax.fori_loop(1, n, lambda i, v: jnp.sin(v), x),
        "repeat_sin_fixed(x, 1) differs",
    ),
    (
        "an extra sin",
        lambda: _static(lambda x, n: jnp.sin(ch1.repeat_sin(x, n))),
        "result for n=0 differs",
    ),
    (
        "Python loop, checker jits it",
        lambda: ch1.repeat_sin,
        "n=0: jax.jit(your function) raised TracerIntegerConversionError",
    ),
    (
        "jit without static",
        lambda: jax.jit(ch1.repeat_sin),
        "your jitted function raised TracerIntegerConversionError: The __index__() method",
    ),
]


@pytest.mark.parametrize("case", NEAR_MISSES_11, ids=[c[0] for c in NEAR_MISSES_11])
def test_fix_jit_near_misses(case):
    _, answer, fragment = case
    _assert_rejected(ch1.check_fix_jit(answer()), fragment)
    with pytest.raises(exercises.ExerciseFailed):
        ch1.check_fix_jit(answer(), strict=True)


BAD_11 = [
    ("nan", lambda x, n: _loop(x, n) * jnp.nan, "nan/inf does not match"),
    ("inf", lambda x, n: _loop(x, n) / 0.0, "nan/inf does not match"),
    ("shape", lambda x, n: _loop(x, n)[:2], "has shape (2,), expected (5,)"),
    (
        "dtype",
        lambda x, n: jnp.round(_loop(x, n)).astype(jnp.int32),
        "has dtype int32, expected a floating dtype",
    ),
    ("Python scalar", lambda x, n: 0.5, "is a Python float, expected an array"),
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
    _assert_rejected(ch1.check_fix_jit(answer), fragment)


def test_fix_jit_stub_plain_and_jitted():
    _assert_not_attempted(ch1.check_fix_jit(_stub))
    _assert_not_attempted(ch1.check_fix_jit(jax.jit(_stub, static_argnums=1)))
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


# --- Exercise 1.3 -----------------------------------------------------------------------


def _safe(x):
    positive = x > 0
    return jnp.where(positive, jnp.exp(-1.0 / jnp.where(positive, x, 1.0)), 0.0)


def _safe_other_value(x):
    positive = x > 0
    return jnp.where(positive, jnp.exp(-1.0 / jnp.where(positive, x, 42.0)), 0.0)


def _safe_zero(
    x,
):  # exp(-1/0) = exp(-inf) = 0; the NaN of 0 * inf goes to the dropped branch
    positive = x > 0
    return jnp.where(positive, jnp.exp(-1.0 / jnp.where(positive, x, 0.0)), 0.0)


def _safe_clamped(x):  # a different method: clamp the input, keep the outer where
    return jnp.where(x > 0, jnp.exp(-1.0 / jnp.maximum(x, 1e-3)), 0.0)


@pytest.mark.parametrize(
    "answer", [_safe, _safe_other_value, _safe_zero, _safe_clamped, jax.jit(_safe)]
)
def test_finite_grad_right_answers(answer):
    fb = ch1.check_finite_grad(answer, strict=True)
    assert "at 108 points of [-2, 2], all finite" in str(fb)


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
        "gradient on the grid has 2 entries whose nan/inf does not match",
        "[x = -0.01]",
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
