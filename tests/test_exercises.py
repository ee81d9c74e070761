import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import exercises as ex


def test_tree_mismatches_equal_trees():
    a = {"w": jnp.ones((2, 3)), "b": (jnp.zeros(3), 1.0)}
    assert ex.tree_mismatches(a, jax.tree_util.tree_map(lambda x: x + 1e-9, a)) == []


def test_tree_mismatches_names_each_kind_of_difference():
    ref = {"w": np.ones((2, 3)), "b": np.zeros(3)}
    assert "structure" in ex.tree_mismatches({"w": ref["w"]}, ref)[0]
    shape = ex.tree_mismatches({"w": np.ones((3, 2)), "b": ref["b"]}, ref)
    assert shape == ["answer['w'] has shape (3, 2), expected (2, 3)"]
    dtype = ex.tree_mismatches({"w": np.ones((2, 3), int), "b": ref["b"]}, ref)
    assert "floating" in dtype[0]
    nan = ex.tree_mismatches({"w": np.full((2, 3), np.nan), "b": ref["b"]}, ref)
    assert "6 non-finite" in nan[0]
    off = np.ones((2, 3))
    off[1, 2] = 1.5
    value = ex.tree_mismatches({"w": off, "b": ref["b"]}, ref, rtol=1e-3, atol=0)
    assert "at index (1, 2)" in value[0] and "1.5" in value[0] and "expected 1 " in value[0]


def test_tree_mismatches_respects_tolerances():
    assert ex.tree_mismatches(1.001, 1.0, rtol=1e-2, atol=0) == []
    assert ex.tree_mismatches(1.001, 1.0, rtol=1e-4, atol=0) != []
    with pytest.raises(ValueError):
        ex.tree_mismatches(1.0, 1.0, rtol=-1)


def test_call_answer_turns_stub_and_errors_into_words():
    def stub(x):
        raise NotImplementedError

    def broken(x):
        return x[10]

    def missing_rule(x):
        raise NotImplementedError("Differentiation rule for 'schur' not implemented")

    assert "still the stub" in ex.failed(ex.call_answer(stub, 1.0))
    assert ex.failed(ex.call_answer(missing_rule, 1.0)) == (
        "your function raised NotImplementedError: Differentiation rule for 'schur' not implemented"
    )
    assert ex.failed(ex.call_answer(broken, [1])).startswith("your function raised IndexError")
    assert "must be a function" in ex.failed(ex.call_answer(3))
    assert ex.failed(ex.call_answer(lambda x: x + 1, 1)) is None


def test_check_function_right_and_wrong_answers_under_jit():
    def reference(x):
        return jnp.where(x > 0, x, 0.0)

    def python_if(x):  # fails under jit: Python if on a tracer
        return x if x > 0 else 0.0

    good = ex.check_function("relu", lambda x: jnp.maximum(x, 0.0), reference, [(jnp.array(2.0),), (jnp.array(-1.0),)], transform=jax.jit)
    bad = ex.check_function("relu", python_if, reference, [(jnp.array(2.0),)], transform=jax.jit)
    wrong = ex.check_function("relu", lambda x: x, reference, [(jnp.array(-1.0),)])
    assert good.passed and str(good).startswith("✓ relu: correct")
    assert not bad.passed and "TracerBoolConversionError" in str(bad)
    assert not wrong.passed and "got -1, expected 0 " in str(wrong)
    with pytest.raises(ValueError):
        ex.check_function("relu", reference, reference, [])
    with pytest.raises(TypeError, match="tuple"):
        ex.check_function("relu", reference, reference, [jnp.array(1.0)])


def test_strict_mode_raises_with_the_feedback():
    with pytest.raises(ex.ExerciseFailed, match="differs from the reference"):
        ex.check_allclose("sum", 3.0, 4.0, strict=True)
    assert ex.check_allclose("sum", 4.0, 4.0, strict=True).passed


def test_feedback_prints_marks():
    fb = ex.verdict("e1", ["shape is wrong", "and dtype"])
    assert str(fb) == "✗ e1: not yet\n  - shape is wrong\n  - and dtype"
    assert not fb
    assert str(ex.verdict("e1", [], success="well done")) == "✓ e1: correct\n  - well done"
