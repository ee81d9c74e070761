"""Chapter 4's checkers: right answers, near-miss wrong answers and each bad-input kind.

The expected varying axes are pinned literally here (not read from the checker's own
answer key), and the tests run on both ends of the supported JAX range.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondgrad import compat
from beyondgrad.exercises import ExerciseFailed, ch4

# ------------------------------------------------------------------------ exercise 4.1

#: What JAX 0.8.2 and 0.12 both say (measured by running the expressions).
PINNED = {
    "a * w": {"data"},
    "a + b": {"data", "model"},
    "psum(a * b, 'data')": {"model"},
    "all_gather(a, 'data') + w": {"data"},
    "pmean(a + b, ('data', 'model'))": set(),
}


def _stub(*args, **kwargs):
    raise NotImplementedError


def test_pinned_sets_are_what_jax_says():
    """The checker's reference (the explainer) against the literal sets."""
    assert list(PINNED) == list(ch4.VMA_EXPRESSIONS)
    assert {k: set(v) for k, v in ch4._explained_vma().items()} == PINNED


def test_predict_vma_accepts_the_pinned_sets_in_any_reasonable_form():
    assert ch4.check_predict_vma(PINNED, strict=True)
    assert ch4.check_predict_vma(lambda: PINNED, strict=True)
    forms = {
        "a * w": " Data ",
        "a + b": ["model", "data"],
        "psum(a * b, 'data')": ("MODEL",),
        "all_gather(a, 'data') + w": frozenset({np.str_("data")}),
        "pmean(a + b, ('data', 'model'))": None,
    }
    assert ch4.check_predict_vma(forms, strict=True)
    assert ch4.check_predict_vma(
        dict(forms, **{"pmean(a + b, ('data', 'model'))": "{}"}), strict=True
    )
    assert ch4.check_predict_vma(dict(forms, **{"a + b": "{data, model}"}), strict=True)


@pytest.mark.parametrize("expr", list(PINNED))
def test_predict_vma_near_misses_name_the_expression(expr):
    """One axis too many or too few, in one expression."""
    wrong = set(PINNED[expr]) ^ {"model"}
    fb = ch4.check_predict_vma(dict(PINNED, **{expr: wrong}))
    assert not fb
    text = str(fb)
    assert f"{expr}: you predicted " in text and text.count("you predicted") == 1


def test_predict_vma_all_gather_is_varying_by_default():
    """The belief the chapter corrects: all_gather's result is not invariant."""
    fb = ch4.check_predict_vma(dict(PINNED, **{"all_gather(a, 'data') + w": set()}))
    assert (
        "all_gather(a, 'data') + w: you predicted {}, the explainer says {data}"
        in str(fb)
    )


PREDICT_BAD = [
    ([1, 2], "answers must be a dict {expression: set of axes}, got list"),
    ({k: v for k, v in PINNED.items() if k != "a + b"}, "no prediction for 'a + b'"),
    (dict(PINNED, extra={"data"}), "unknown expression(s) ['extra']"),
    (
        dict(PINNED, **{"a * w": {"i"}}),
        "a * w: ['i'] is not a mesh axis; the axes are ('data', 'model')",
    ),
    (dict(PINNED, **{"a * w": 3}), "a * w: give a set of mesh axis names"),
    (lambda: 1 / 0, "your predictions raised ZeroDivisionError"),
]


@pytest.mark.parametrize(
    "answer,quote", PREDICT_BAD, ids=[f"bad{k}" for k in range(len(PREDICT_BAD))]
)
def test_predict_vma_bad_input(answer, quote):
    fb = ch4.check_predict_vma(answer)
    assert not fb and fb.attempted
    assert quote in str(fb)
    with pytest.raises(ExerciseFailed):
        ch4.check_predict_vma(answer, strict=True)


def test_predict_vma_stub_is_not_attempted():
    fb = ch4.check_predict_vma(_stub)
    assert not fb.attempted and "not attempted yet" in str(fb)
    with pytest.raises(ExerciseFailed):
        ch4.check_predict_vma(_stub, strict=True)


# ------------------------------------------------------------------------ exercise 4.2


def _mse(w, X, y):
    return jnp.mean((X @ w - y) ** 2)


def solution_through_all_gather(w_block, X, y, lr=0.1):
    def global_loss(v):
        return lax.pmean(_mse(lax.all_gather(v, "data", tiled=True), X, y), "data")

    return w_block - lr * jax.grad(global_loss)(w_block)


def solution_local_then_scatter(w_block, X, y, lr=0.1):
    w_full = lax.all_gather(
        w_block, "data", tiled=True
    )  # varying: local gradients below
    g = lax.psum_scatter(jax.grad(_mse)(w_full, X, y), "data", tiled=True)
    return w_block - lr * g / lax.psum(1, "data")


def no_pmean(w_block, X, y, lr=0.1):  # the psum_scatter of the transpose sums D means
    return w_block - lr * jax.grad(
        lambda v: _mse(lax.all_gather(v, "data", tiled=True), X, y)
    )(w_block)


def sign_error(w_block, X, y, lr=0.1):
    return 2 * w_block - solution_through_all_gather(w_block, X, y, lr)


def lr_off_by_one_percent(w_block, X, y):
    return solution_through_all_gather(w_block, X, y, lr=0.099)


def own_block_of_local_gradient(w_block, X, y, lr=0.1):
    w_full = lax.all_gather(w_block, "data", tiled=True)
    g = jax.grad(_mse)(w_full, X, y).reshape(-1, w_block.shape[0])[
        lax.axis_index("data")
    ]
    return w_block - lr * g


@pytest.mark.parametrize(
    "step", [solution_through_all_gather, solution_local_then_scatter]
)
def test_sharded_step_right(step):
    fb = ch4.check_sharded_step(step, strict=True)
    assert fb and "1, 2, 4 and 8 devices" in str(fb)


@pytest.mark.parametrize(
    "step,quote",
    [
        (no_pmean, "on 2 device(s): your update is +2 x the single-device update"),
        (sign_error, "on 1 device(s): your update is -1 x the single-device update"),
        (
            lr_off_by_one_percent,
            "on 1 device(s): your update is +0.99 x the single-device update",
        ),
        (own_block_of_local_gradient, "on 2 device(s): your update is"),
    ],
)
def test_sharded_step_near_misses_give_signed_ratios(step, quote):
    fb = ch4.check_sharded_step(step)
    assert not fb and quote in str(fb), str(fb)


STEP_BAD = [
    (lambda w, X, y: w * jnp.nan, "new w has 8 entries whose nan/inf does not match"),
    (lambda w, X, y: jnp.concatenate([w, w]), "new w has shape (16,), expected (8,)"),
    (
        lambda w, X, y: jnp.round(w).astype(jnp.int32),
        "new w has dtype int32, expected a floating",
    ),
    (
        lambda w, X, y: lax.psum(w, "i"),
        "your step raised AssertionError (no message) (the checker's mesh has axes 'data' of size 1; "
        "every collective must name one of them)",
    ),
    (lambda w, X, y: 1 / 0, "your step raised ZeroDivisionError"),
    (
        np.ones(8),
        "your step should be a function, but you passed a value (ndarray of shape (8,))",
    ),
]


@pytest.mark.parametrize(
    "step,quote", STEP_BAD, ids=[f"bad{k}" for k in range(len(STEP_BAD))]
)
def test_sharded_step_bad_input(step, quote):
    fb = ch4.check_sharded_step(step)
    assert not fb and fb.attempted
    assert quote in str(fb), str(fb)


def test_sharded_step_stub_is_not_attempted():
    fb = ch4.check_sharded_step(_stub)
    assert not fb.attempted and "not attempted yet" in str(fb)


# ------------------------------------------------------------------------ exercise 4.3


def _body(xb):
    return lambda k, acc: acc + (k + 1) * lax.psum(jnp.sum(xb, axis=1), "model")


def carry_cast(xb):
    return lax.fori_loop(
        0, 3, _body(xb), compat.pcast_varying(jnp.zeros(xb.shape[0]), "data")
    )


def carry_from_psum(xb):
    return lax.fori_loop(0, 3, _body(xb), jnp.zeros_like(lax.psum(xb[:, 0], "model")))


def carry_invariant(xb):
    return lax.fori_loop(0, 3, _body(xb), jnp.zeros(xb.shape[0]))


def carry_like_block(xb):  # varies over model too: out_specs=P("data") refuses it
    return lax.fori_loop(0, 3, _body(xb), jnp.zeros_like(xb[:, 0]))


def two_iterations(xb):
    return lax.fori_loop(
        0, 2, _body(xb), compat.pcast_varying(jnp.zeros(xb.shape[0]), "data")
    )


@pytest.mark.parametrize("fn", [carry_cast, carry_from_psum])
def test_two_axis_carry_right(fn):
    assert ch4.check_two_axis_carry(fn, strict=True)


@pytest.mark.parametrize(
    "fn,quote",
    [
        (
            carry_invariant,
            "on the 4x2 mesh: your weighted_row_sums raised TypeError: scan body function "
            "carry input and carry output must have equal types",
        ),
        (carry_like_block, "on the 4x2 mesh: your weighted_row_sums raised ValueError"),
        (two_iterations, "on the 4x2 mesh: row sums differs from the reference"),
        (
            lambda xb: 6.0 * lax.psum(jnp.sum(xb, axis=1), "model"),
            "your function has no loop",
        ),
    ],
)
def test_two_axis_carry_near_misses(fn, quote):
    fb = ch4.check_two_axis_carry(fn)
    assert not fb and quote in str(fb), str(fb)
    if fn is carry_like_block:
        assert "'model'" in str(
            fb
        )  # the message names the axis the claim is wrong about


CARRY_BAD = [
    (
        lambda xb: jnp.full(xb.shape[0], jnp.inf) * lax.psum(xb[:, 0], "model"),
        "nan/inf does not match",
    ),
    (lambda xb: lax.psum(xb, "model") * 6, "row sums has shape (8, 4), expected (8,)"),
    (
        lambda xb: lax.psum(xb[:, 0], "i"),
        "(the checker's mesh has axes 'data' of size 4, 'model' of size 2",
    ),
    (lambda xb: xb.undefined_attribute, "your weighted_row_sums raised AttributeError"),
    (np.zeros(8), "you passed a value"),
]


@pytest.mark.parametrize(
    "fn,quote", CARRY_BAD, ids=[f"bad{k}" for k in range(len(CARRY_BAD))]
)
def test_two_axis_carry_bad_input(fn, quote):
    fb = ch4.check_two_axis_carry(fn)
    assert not fb and fb.attempted and quote in str(fb), str(fb)


def test_two_axis_carry_stub_is_not_attempted():
    fb = ch4.check_two_axis_carry(_stub)
    assert not fb.attempted and "not attempted yet" in str(fb)
    with pytest.raises(ExerciseFailed):
        ch4.check_two_axis_carry(_stub, strict=True)


# ------------------------------------------------------------ tolerances, pinned


def _times(fn, factor):
    return lambda *args: fn(*args) * factor


U32 = 2.0**-24  # float32 unit roundoff


def _step_scale_by_hand(w, X, y, lr=0.1):
    """S_j = |w_j| + lr (2/n) sum_i |X_ij| (sum_k |X_ik w_k| + |y_i|), term by term."""
    w, X, y = (np.asarray(a, np.float64) for a in (w, X, y))
    n, d = X.shape
    out = []
    for j in range(d):
        rows = [
            abs(X[i, j]) * (sum(abs(X[i, k] * w[k]) for k in range(d)) + abs(y[i]))
            for i in range(n)
        ]
        out.append(abs(w[j]) + lr * 2 / n * sum(rows))
    return np.array(out)


def _offset_step(fn, factor):
    """``fn``'s step plus ``factor`` x 128 u S_j on every entry (S_j of the full data,
    picked for this device's block by the block's position)."""
    w, X, y = ch4.step_problem()
    shift = jnp.asarray(factor * 128 * U32 * _step_scale_by_hand(w, X, y), jnp.float32)

    def step(w_block, X_block, y_block):
        size = w_block.shape[0]
        start = lax.axis_index("data") * size
        return fn(w_block, X_block, y_block) + lax.dynamic_slice(
            shift, (start,), (size,)
        )

    return step


def test_sharded_step_tolerance_in_use():
    assert ch4.STEP_RTOL == 128 * U32  # derived in ch4's comment: 54 u S, 2.4x that
    w, X, y = ch4.step_problem()
    np.testing.assert_allclose(
        ch4._step_scale(w, X, y, 0.1), _step_scale_by_hand(w, X, y), rtol=1e-13
    )
    far = ch4.check_sharded_step(_offset_step(solution_local_then_scatter, 2.0))
    assert not far and "on 1 device(s)" in str(far), str(far)
    assert "allowed 7.6e-06 x" in str(far), str(far)
    near = ch4.check_sharded_step(_offset_step(solution_through_all_gather, 0.5))
    assert near, str(near)
    assert "(|error| <= 7.6e-06 x S_j" in str(near), str(near)
    below = ch4.check_sharded_step(_offset_step(solution_through_all_gather, -2.0))
    assert not below, str(below)


def test_two_axis_carry_tolerance_is_pinned():
    # the sums are exact in float32 (measured error 0); CARRY_RTOL is 1e-6
    rtol = ch4.CARRY_RTOL
    far = ch4.check_two_axis_carry(_times(carry_cast, 1 + 3 * rtol))
    assert not far and "row sums differs from the reference" in str(far), str(far)
    near = ch4.check_two_axis_carry(_times(carry_from_psum, 1 + 0.3 * rtol))
    assert near, str(near)
    assert f"(relative error <= {rtol:g}" in str(near)


# ---------------------------------------------- first messages that name the slip (#44)


def block_as_whole_w(w_block, X, y, lr=0.1):  # no gather: X_block @ w_block
    return w_block - lr * jax.grad(_mse)(w_block, X, y)


def whole_gradient_from_block(w_block, X, y, lr=0.1):  # the chapter's step, w gathered
    w_full = lax.all_gather(w_block, "data", tiled=True)
    return w_block - lr * lax.pmean(jax.grad(_mse)(w_full, X, y), "data")


@pytest.mark.parametrize(
    "step,first",
    [
        (
            block_as_whole_w,
            "w_block holds 4 of the 8 entries of w on 2 devices, but "
            "X_block has all 8 columns: gather the whole w first",
        ),
        (
            whole_gradient_from_block,
            "w_block holds 4 of the 8 entries of w on 2 "
            "devices; a result or gradient of the whole w's shape (8,) does not fit it",
        ),
    ],
)
def test_sharded_step_shape_errors_name_the_block_first(step, first):
    """JAX's shape error comes second: the first line says which w has which size."""
    fb = ch4.check_sharded_step(step)
    assert not fb and fb.messages[0].startswith(first), str(fb)
    assert "on 2 device(s): your step raised TypeError" in fb.messages[1], str(fb)


def three_x_row_sums(xb):  # weights k instead of k + 1: 0 + 1 + 2 = 3
    body = lambda k, acc: acc + k * lax.psum(jnp.sum(xb, axis=1), "model")  # noqa: E731
    return lax.fori_loop(
        0, 3, body, compat.pcast_varying(jnp.zeros(xb.shape[0]), "data")
    )


@pytest.mark.parametrize(
    "fn,first,then",
    [
        (
            carry_invariant,
            "your loop's initial carry has another type than the body's output",
            "carry input and carry output must have equal types",
        ),
        (
            carry_like_block,
            "your result varies over 'model' in its type, and "
            "out_specs=P('data') needs it the same on every 'model' device",
            "raised ValueError",
        ),
        (
            three_x_row_sums,
            "on the 4x2 mesh: your result is 0.5 x the expected 6 x "
            "row sums, everywhere",
            "row sums differs from the reference",
        ),
        (
            two_iterations,
            "on the 4x2 mesh: your result is 0.5 x the expected",
            "row sums differs from the reference",
        ),
    ],
)
def test_two_axis_carry_first_message_names_the_slip(fn, first, then):
    """The slip in the exercise's words first (not JAX's error, not a bare entry),
    then what JAX or the comparison says."""
    fb = ch4.check_two_axis_carry(fn)
    assert not fb and fb.messages[0].startswith(first), str(fb)
    assert then in fb.messages[1], str(fb)
