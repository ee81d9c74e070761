"""Chapter 5's checkers: right answers, near misses, and each kind of bad input.

Each checker is fed answers written independently of its reference (the book's
solutions, and deliberate mistakes), and the tests pin what it prints.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from beyondgrad import exercises as ex
from beyondgrad import runtime, wavefunctions
from beyondgrad.exercises import ch5

runtime.ensure_cpu_devices(8)


def stub(*args):
    raise NotImplementedError


def raises_inside(*args):
    raise ValueError("shapes do not line up")


def text(feedback: ex.Feedback) -> str:
    return str(feedback)


# ---------------------------------------------------------------------------------------
# 5.1: forward Laplacian of a product


def fl_multiply(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv + 2 * jnp.sum(gu * gv, axis=0)


def fl_no_cross(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv


def fl_cross_once(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv + jnp.sum(gu * gv, axis=0)


def fl_half_gradient(a, b):
    (_, gu, _), (v, _, _) = a, b
    return fl_multiply(a, b)[0], gu * v, fl_multiply(a, b)[2]


def test_fl_right_answer_passes_and_says_what_was_checked():
    fb = ch5.check_fl_multiply(fl_multiply, strict=True)
    assert fb.passed and fb.attempted
    assert (
        f"match jax.hessian at 3 points (float64, |error| <= {ch5.FL_ATOL:g} + "
        f"{ch5.FL_RTOL:g}*|expected|)" in text(fb)
    )


def _scaled(answer, factor):
    """``answer`` with every floating leaf of its output multiplied by ``factor``."""

    def scaled(*args):
        return jax.tree.map(lambda t: t * factor, answer(*args))

    return scaled


def _pin(check, answer, rtol):
    """An answer 3x the relative tolerance off is rejected, 0.3x off is accepted.

    Loosening the checker's tolerance 10x makes the first assertion fail; tightening
    it 10x (toward the measured error of correct answers) makes the second fail.
    """
    far = check(_scaled(answer, 1 + 3 * rtol))
    assert not far.passed and far.attempted, text(far)
    assert "differs from the reference" in text(far), text(far)
    near = check(_scaled(answer, 1 + 0.3 * rtol))
    assert near.passed, text(near)


def test_fl_tolerance_is_pinned():
    # correct answers: 8.8e-16 relative (9.2e-15 on an entry of 1.4e-3), FL_RTOL 1e-14
    _pin(ch5.check_fl_multiply, fl_multiply, ch5.FL_RTOL)


@pytest.mark.parametrize(
    "answer, expected",
    [
        (fl_no_cross, "it misses the cross term 2 (grad u . grad v)"),
        (fl_cross_once, "has the cross term grad u . grad v once; it needs 2x"),
        (fl_half_gradient, "your gradient has one half of the product rule"),
    ],
    ids=["no-cross-term", "cross-term-once", "half-gradient"],
)
def test_fl_near_misses_are_pointed_at(answer, expected):
    fb = ch5.check_fl_multiply(answer)
    assert not fb.passed and fb.attempted
    assert expected in text(fb)
    assert "at point 0:" in text(fb)


def _fl_modify(part, change):
    def answer(a, b):
        out = list(fl_multiply(a, b))
        out[part] = change(out[part])
        return tuple(out)

    return answer


FL_BAD = [
    ("stub", stub, "not attempted yet"),
    ("value-not-function", jnp.ones(3), "you passed a value (ArrayImpl of shape (3,))"),
    ("raises", raises_inside, "your function raised ValueError: shapes do not line up"),
    (
        "nan",
        _fl_modify(2, lambda lap: lap.at[1].set(jnp.nan)),
        "whose nan/inf does not match",
    ),
    (
        "inf",
        _fl_modify(0, lambda u: u.at[0].set(jnp.inf)),
        "whose nan/inf does not match",
    ),
    (
        "wrong-shape",
        _fl_modify(1, lambda g: g.T),
        "the gradient has shape (4, 5), expected (5, 4)",
    ),
    (
        "wrong-dtype",
        _fl_modify(2, lambda lap: lap.astype(jnp.int32)),
        "expected a floating dtype",
    ),
    (
        "python-scalar",
        _fl_modify(2, lambda lap: 1.0),
        "is a Python float, expected an array",
    ),
    ("not-a-triple", lambda a, b: fl_multiply(a, b)[:2], "return a triple"),
]


@pytest.mark.parametrize(
    "answer, expected", [c[1:] for c in FL_BAD], ids=[c[0] for c in FL_BAD]
)
def test_fl_bad_inputs_each_get_their_message(answer, expected):
    fb = ch5.check_fl_multiply(answer)
    assert not fb.passed
    assert expected in text(fb), text(fb)
    assert fb.attempted == (answer is not stub)


def test_strict_raises_for_wrong_and_unattempted():
    with pytest.raises(ex.ExerciseFailed):
        ch5.check_fl_multiply(fl_no_cross, strict=True)
    with pytest.raises(ex.ExerciseFailed):
        ch5.check_fl_multiply(stub, strict=True)


# ---------------------------------------------------------------------------------------
# 5.2: the row update


def row_second(a, i, u):
    column = jnp.linalg.solve(a, jnp.eye(a.shape[0], dtype=a.dtype)[:, i])
    return -((u @ column) ** 2)


def row_by_autodiff(a, i, u):
    along = lambda t: (
        jnp.linalg.slogdet(a + t * jnp.zeros_like(a).at[i].set(u)).logabsdet
    )  # noqa: E731
    return jax.grad(jax.grad(along))(jnp.zeros((), a.dtype))


def test_row_right_answers_pass_any_method_is_accepted():
    for answer in (row_second, row_by_autodiff):
        fb = ch5.check_row_update_second_derivative(answer, strict=True)
        assert fb.passed
    assert (
        f"3 matrices, float64, |error| <= {ch5.ROW_ATOL:g} + {ch5.ROW_RTOL:g}"
        in text(fb)
    )


def test_row_tolerance_is_pinned_with_independent_answers():
    # correct answers (solve, inv, autodiff) differ from the reference by <= 6.5e-16
    # relative; ROW_RTOL is 5e-15
    for answer in (row_second, row_by_autodiff):
        _pin(ch5.check_row_update_second_derivative, answer, ch5.ROW_RTOL)


@pytest.mark.parametrize(
    "answer, expected",
    [
        (lambda a, i, u: -row_second(a, i, u), "the sign is flipped"),
        (
            lambda a, i, u: -((u @ jnp.linalg.inv(a)[i]) ** 2),
            "you used row i of A^{-1}; the formula needs column i",
        ),
        (
            lambda a, i, u: 0.5 * row_second(a, i, u),
            "for n = 3, row 0: answer differs from the reference",
        ),
    ],
    ids=["sign", "row-not-column", "factor-half"],
)
def test_row_near_misses(answer, expected):
    fb = ch5.check_row_update_second_derivative(answer)
    assert not fb.passed and fb.attempted
    assert expected in text(fb), text(fb)


ROW_BAD = [
    ("stub", stub, "not attempted yet"),
    ("value-not-function", 3.0, "you passed a value (float)"),
    ("raises", raises_inside, "your function raised ValueError: shapes do not line up"),
    (
        "nan",
        lambda a, i, u: jnp.asarray(jnp.nan, a.dtype),
        "whose nan/inf does not match",
    ),
    (
        "inf",
        lambda a, i, u: jnp.asarray(-jnp.inf, a.dtype),
        "whose nan/inf does not match",
    ),
    (
        "wrong-shape",
        lambda a, i, u: row_second(a, i, u)[None],
        "has shape (1,), expected ()",
    ),
    (
        "wrong-dtype",
        lambda a, i, u: row_second(a, i, u).astype(jnp.int32),
        "expected a floating dtype",
    ),
    (
        "python-scalar",
        lambda a, i, u: float(row_second(a, i, u)),
        "is a Python float, expected an array",
    ),
]


@pytest.mark.parametrize(
    "answer, expected", [c[1:] for c in ROW_BAD], ids=[c[0] for c in ROW_BAD]
)
def test_row_bad_inputs_each_get_their_message(answer, expected):
    fb = ch5.check_row_update_second_derivative(answer)
    assert not fb.passed
    assert expected in text(fb), text(fb)


# ---------------------------------------------------------------------------------------
# 5.3: the sharded kinetic step


def _kinetic(p, x, *, cast=True):
    f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))  # noqa: E731
    g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
    eye = jnp.eye(g.shape[0], dtype=g.dtype)
    if cast:
        eye = lax.pcast(eye, "data", to="varying")
    return -0.5 * (jnp.trace(jax.vmap(hvp)(eye)) + g @ g)


def sharded_step(params, walkers):
    def mean(p):
        local = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        return lax.psum(jnp.sum(local), "data") / (
            walkers.shape[0] * lax.axis_size("data")
        )

    return jax.value_and_grad(mean)(params)


def loop_step(params, walkers):
    """A second method (loop over the basis), written independently."""

    def kinetic(p, x):
        f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))  # noqa: E731
        g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
        eye = lax.pcast(jnp.eye(g.shape[0], dtype=g.dtype), "data", to="varying")
        body = lambda i, acc: acc + hvp(eye[i])[i]  # noqa: E731
        return -0.5 * (lax.fori_loop(0, g.shape[0], body, jnp.zeros_like(g[0])) + g @ g)

    def mean(p):
        return (
            lax.psum(jnp.sum(jax.vmap(kinetic, in_axes=(None, 0))(p, walkers)), "data")
            / 16
        )

    return jax.value_and_grad(mean)(params)


def pmean_of_grad(params, walkers):
    """The device-count bug: local mean, its gradient, then a psum of both."""
    local = lambda p: jnp.mean(jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers))  # noqa: E731
    e, g = jax.value_and_grad(local)(params)
    return lax.pmean(e, "data"), jax.tree.map(lambda t: lax.pmean(t, "data"), g)


def psum_of_means(params, walkers):
    def mean(p):
        return lax.psum(
            jnp.mean(jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)), "data"
        )

    return jax.value_and_grad(mean)(params)


def test_sharded_right_answers_pass():
    for answer in (sharded_step, loop_step):
        fb = ch5.check_sharded_kinetic_step(answer, strict=True)
        assert fb.passed
    assert "runs in shard_map over 'data' (8 devices, check_vma=True)" in text(fb)
    assert f"{ch5.STEP_ATOL:g} + {ch5.STEP_RTOL:g}*|expected|" in text(fb)


def test_sharded_tolerance_is_pinned():
    # correct answers differ from the reference by <= 5.5e-13 absolute (1.2e-11
    # relative only on entries below 0.05); STEP_RTOL 1e-11, STEP_ATOL 5e-12. Scaled
    # by 1 + 3 * STEP_RTOL, the largest gradient entries (about 36) are off by 1.1e-9.
    _pin(ch5.check_sharded_kinetic_step, sharded_step, ch5.STEP_RTOL)


def test_sharded_near_misses():
    fb = ch5.check_sharded_kinetic_step(pmean_of_grad)
    assert not fb.passed
    assert (
        "your gradient is +8 x the single-device gradient (8 devices): the device-count bug"
        in text(fb)
    )
    fb = ch5.check_sharded_kinetic_step(psum_of_means)
    assert "your energy is +8 x the mean over all 16 walkers: divide the psum" in text(
        fb
    )


def test_sharded_uncast_basis_keeps_jax_hint_and_names_the_mesh():
    fb = ch5.check_sharded_kinetic_step(_uncast)
    out = text(fb)
    assert (
        "your step inside shard_map raised ValueError: linearized function called on tangent values"
        in out
    )
    assert "pcast(..., ('data',), to='varying')" in out  # JAX's own hint survives
    assert "one axis named 'data'" in out


def _uncast(params, walkers):
    def mean(p):
        local = jax.vmap(lambda x: _kinetic(p, x, cast=False))(walkers)
        return lax.psum(jnp.sum(local), "data") / 16

    return jax.value_and_grad(mean)(params)


def _wrong_axis(params, walkers):
    return lax.psum(jnp.sum(walkers), "i"), params


SHARD_BAD = [
    ("stub", stub, "not attempted yet"),
    ("value-not-function", {"w1": 1.0}, "you passed a value (dict)"),
    ("raises", raises_inside, "raised ValueError: shapes do not line up"),
    ("wrong-axis", _wrong_axis, "one axis named 'data'"),
    (
        "varying-output",
        lambda p, w: (jnp.sum(w), p),
        "both outputs must be invariant",
    ),
    (
        "nan",
        lambda p, w: (jnp.float64(jnp.nan) * jnp.ones(()), sharded_step(p, w)[1]),
        "nan/inf",
    ),
    (
        "not-a-pair",
        lambda p, w: (sharded_step(p, w)[0],),
        "return a pair (mean kinetic energy, gradient)",
    ),
    (
        "wrong-dtype",
        lambda p, w: (sharded_step(p, w)[0].astype(jnp.int32), sharded_step(p, w)[1]),
        "the energy has dtype int32",
    ),
    (
        "wrong-shape",
        lambda p, w: (sharded_step(p, w)[0][None], sharded_step(p, w)[1]),
        "has shape (1,)",
    ),
]


@pytest.mark.parametrize(
    "answer, expected", [c[1:] for c in SHARD_BAD], ids=[c[0] for c in SHARD_BAD]
)
def test_sharded_bad_inputs_each_get_their_message(answer, expected):
    fb = ch5.check_sharded_kinetic_step(answer)
    assert not fb.passed
    assert expected in text(fb), text(fb)
