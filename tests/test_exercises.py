"""The shared checker machinery (beyondgrad.exercises): every kind of bad answer gets
its own message, and non-finite values must match exactly."""

import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import exercises as ex


def test_equal_trees_have_no_mismatch():
    a = {"w": jnp.ones((2, 3)), "b": (jnp.zeros(3), 1.0)}
    assert ex.tree_mismatches(a, {"w": a["w"] + 1e-9, "b": (a["b"][0], 1.0)}) == []


@pytest.mark.parametrize(
    "answer, reference, expected",
    [
        ([np.inf, np.nan], [np.inf, 1.0], "answer[1] has 1 entry whose nan/inf"),
        ([-np.inf], [np.inf], "got -inf, expected inf"),
        ([1.0], [np.nan], "got 1.0, expected nan"),
        ([np.nan, 2.0], [np.nan, 3.0], "relative error 3.33e-01"),
    ],
)
def test_non_finite_values_must_match_in_place_and_sign(answer, reference, expected):
    problems = ex.tree_mismatches(np.array(answer), np.array(reference))
    assert (
        len(problems) == 1 and expected.replace("answer[1]", "answer") in problems[0]
    ), problems


def test_matching_non_finite_values_pass():
    ref = np.array([np.inf, -np.inf, np.nan, 1.0])
    assert ex.tree_mismatches(ref.copy(), ref) == []


def test_each_kind_of_difference_has_its_message():
    ref = {"w": np.ones((2, 3)), "b": np.zeros(3)}
    assert ex.tree_mismatches({"w": ref["w"]}, ref)[0].startswith(
        "answer has structure"
    )
    assert ex.tree_mismatches({"w": np.ones((3, 2)), "b": ref["b"]}, ref) == [
        "answer['w'] has shape (3, 2), expected (2, 3)"
    ]
    dtype = ex.tree_mismatches({"w": np.ones((2, 3), int), "b": ref["b"]}, ref)
    assert dtype == [
        "answer['w'] has dtype int64, expected a floating dtype like float64"
    ]
    off = np.ones((2, 3))
    off[1, 2] = 1.5
    value = ex.tree_mismatches({"w": off, "b": ref["b"]}, ref, rtol=1e-3, atol=0)
    assert value[0].startswith(
        "answer['w'] differs from the reference at index (1, 2): got 1.5 (float64)"
    )
    assert "relative error 5.00e-01" in value[0]


def test_a_python_scalar_where_an_array_is_expected_is_named():
    problems = ex.tree_mismatches(2.0, jnp.asarray(2.0), allow_python_scalars=False)
    assert problems == [
        "answer is a Python float, expected an array (float32[]): "
        "return the JAX array itself (no float()/int()/.item())"
    ]
    assert ex.tree_mismatches(2.0, jnp.asarray(2.0)) == []


def test_float32_answer_against_float64_reference_prints_distinct_digits():
    got = np.float32(1.0000001)
    problems = ex.tree_mismatches(got, np.float64(1.0), rtol=1e-9, atol=0)
    assert "got 1.00000012 (float32), expected 1 (float64)" in problems[0]


def test_integer_leaves_compare_exactly():
    assert ex.tree_mismatches(np.array([1, 2]), np.array([1, 3])) == [
        "answer differs at index (1,): got 2, expected 3"
    ]


def test_tolerances():
    assert ex.tree_mismatches(1.001, 1.0, rtol=1e-2, atol=0) == []
    assert ex.tree_mismatches(1.001, 1.0, rtol=1e-4, atol=0) != []
    with pytest.raises(ValueError):
        ex.tree_mismatches(1.0, 1.0, rtol=-1)


def test_call_answer_stub_errors_and_values():
    def stub(x):
        raise NotImplementedError

    def missing_rule(x):
        raise NotImplementedError("Differentiation rule for 'schur' not implemented")

    def long_error(x):
        raise ValueError("first line\nhint: use lax.pcast(x, 'data', to='varying')")

    def silent(x):
        raise AssertionError

    assert ex.is_stub(ex.call_answer(stub, 1.0))
    assert ex.failed(ex.call_answer(stub, 1.0)) == ex.NOT_ATTEMPTED
    assert ex.failed(ex.call_answer(missing_rule, 1.0)) == (
        "your function raised NotImplementedError: Differentiation rule for 'schur' not implemented"
    )
    assert "lax.pcast(x, 'data', to='varying')" in ex.failed(
        ex.call_answer(long_error, 1.0)
    )
    assert (
        ex.failed(ex.call_answer(silent, 1.0))
        == "your function raised AssertionError (no message)"
    )
    assert ex.failed(ex.call_answer(jnp.ones(3))) == (
        "your function should be a function, but you passed a value (ArrayImpl of shape (3,)); "
        "pass the function itself, without calling it"
    )
    assert ex.failed(ex.call_answer(lambda x: x + 1, 1)) is None


def test_long_messages_are_trimmed_not_cut_to_one_line():
    def noisy(x):
        raise RuntimeError("\n".join(f"line {k}" for k in range(40)))

    msg = ex.failed(ex.call_answer(noisy, 0))
    assert (
        "line 1" in msg
        and "line 11" in msg
        and "line 12" not in msg
        and "28 more lines" in msg
    )


def test_strict_raises_for_wrong_and_for_unattempted():
    with pytest.raises(ex.ExerciseFailed, match="differs from the reference"):
        ex.check_allclose("sum", 3.0, 4.0, strict=True)
    stub = ex.call_answer(lambda: (_ for _ in ()).throw(NotImplementedError()))
    with pytest.raises(ex.ExerciseFailed, match="not attempted yet"):
        ex.check_allclose("sum", stub, 4.0, strict=True)
    assert ex.check_allclose("sum", 4.0, 4.0, strict=True).passed


def test_feedback_prints_marks():
    fb = ex.verdict("e1", ["shape is wrong", "and dtype"])
    assert str(fb) == "✗ e1: not yet\n  - shape is wrong\n  - and dtype"
    assert not fb
    assert (
        str(ex.verdict("e1", [], success="well done")) == "✓ e1: correct\n  - well done"
    )
    assert str(ex.verdict("e1", [], attempted=False)) == f"… e1: {ex.NOT_ATTEMPTED}"


# ------------------------------------------------ time limit, drawn cases, return kinds


@pytest.mark.one_env  # waits out a time limit (conftest.py)
def test_a_python_loop_that_never_ends_is_stopped_with_a_message(monkeypatch):
    """call_answer's limit stops a Python loop; the limit is shortened to 2 s here. On a
    loaded machine it stretches by at most _TIME_LIMIT_MARGIN s, and says how long."""
    import time

    def endless(x):
        while True:
            x = x + 1

    assert ex.TIME_LIMIT == 10.0  # what the guide and the statements promise
    monkeypatch.setattr(ex, "TIME_LIMIT", 2.0)
    start = time.monotonic()
    got = ex.call_answer(endless, 1.0, what="your solver")
    took = time.monotonic() - start
    assert 2.0 - 0.5 <= took <= 2.0 + ex._TIME_LIMIT_MARGIN + 1
    said = ex.failed(got)
    assert said.startswith(
        "your solver did not return within 2 s and was stopped after"
    )
    waited = float(said.split("stopped after ")[1].split(" s")[0])
    assert 2.0 <= waited <= took  # the seconds actually waited, not the limit


def test_an_enclosing_time_limit_governs_and_a_students_except_cannot_swallow_it():
    import time

    def stubborn():
        while True:
            try:
                sum(range(1000))
            except Exception:
                pass

    start = time.monotonic()
    with ex.time_limit(1.5, what="outer"):
        got = ex.call_answer(stubborn, what="inner")
    assert time.monotonic() - start < 1.5 + ex._TIME_LIMIT_MARGIN + 1
    assert ex.failed(got).startswith("inner did not return within 1.5 s")


@pytest.mark.parametrize(
    "bad, exc",
    [(0, ValueError), (-1, ValueError), (True, TypeError), ("10", TypeError)],
)
def test_time_limit_rejects_a_bad_limit(bad, exc):
    # The package's one policy: wrong kind -> TypeError, wrong value -> ValueError.
    with pytest.raises(exc, match="seconds must be a float > 0"):
        with ex.time_limit(bad):
            pass


@pytest.mark.parametrize(
    "answer, said",
    [
        (lambda x: x, "answer is a function (<lambda>), not its value"),
        (None, "answer is None (does your function end without `return`?)"),
        ("0.5", "answer is a str ('0.5'), not a number or array"),
        ((np.ones(3), None), "answer contains None"),
    ],
)
def test_a_wrong_return_kind_is_named(answer, said):
    ref = (np.ones(3), np.ones(3)) if isinstance(answer, tuple) else np.ones(3)
    (got,) = ex.tree_mismatches(answer, ref)
    assert got.startswith(said)


def test_none_where_the_reference_has_none_is_fine():
    assert ex.tree_mismatches((np.ones(2), None), (np.ones(2), None)) == []


def test_case_rng_draws_fresh_cases_unless_a_seed_is_given():
    a, b = ex.case_rng().integers(2**62), ex.case_rng().integers(2**62)
    assert a != b
    assert ex.case_rng(3).integers(99) == ex.case_rng(3).integers(99)
    with pytest.raises(TypeError, match="seed must be an int or None"):
        ex.case_rng(1.5)


def test_scaled_mismatches_measure_the_error_against_the_scale():
    ref = np.array([1e-3, 2.0])  # a small result whose terms were of size 10
    scale = np.array([10.0, 10.0])
    assert ex.scaled_mismatches(ref + 0.9e-6, ref, scale, tol=1e-7) == []
    (problem,) = ex.scaled_mismatches(ref + [2e-6, 0], ref, scale, tol=1e-7)
    assert problem.startswith("answer differs from the reference at index (0,)")
    assert "error 2.00e-06, allowed 1e-07 x 10 (the sum of the magnitudes" in problem


def test_scaled_mismatches_check_kind_and_shape_first_and_refuse_a_bad_scale():
    ref = np.ones(3)
    assert ex.scaled_mismatches(np.ones(2), ref, 1.0, tol=1e-9) == [
        "answer has shape (2,), expected (3,)"
    ]
    assert (
        "Python float"
        in ex.scaled_mismatches(
            1.0, np.array(1.0), 1.0, tol=1e-9, allow_python_scalars=False
        )[0]
    )
    assert ex.scaled_mismatches(1.0, np.array(1.0), 1.0, tol=1e-9) == []
    with pytest.raises(ValueError, match="scale must be finite"):
        ex.scaled_mismatches(ref, ref, -1.0, tol=1e-9)
    with pytest.raises(ValueError, match="tol must be >= 0"):
        ex.scaled_mismatches(ref, ref, 1.0, tol=-1.0)
