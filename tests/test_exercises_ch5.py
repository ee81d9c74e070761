"""Chapter 5's checkers: right answers, near misses, and each kind of bad input.

Each checker is fed answers written independently of its reference (the book's
solutions, and deliberate mistakes), and the tests pin what it prints.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from beyondgrad import exercises as ex
from beyondgrad import runtime, vmc, wavefunctions
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
        "match jax.hessian in 3 drawn cases (float64, |error| <= 7.1e-15 x the sum "
        "of the magnitudes of the terms of each entry)" in text(fb)
    )


def _scaled(answer, factor):
    """``answer`` with every floating leaf of its output multiplied by ``factor``."""

    def scaled(*args):
        return jax.tree.map(lambda t: t * factor, answer(*args))

    return scaled


def test_fl_tolerance_is_pinned():
    # FL_TOL = 64 u (7.1e-15) times the sum of the magnitudes of an entry's terms,
    # which is at least |expected|: an answer off by 3e-13 relative is rejected; the
    # in-use test (0.5x and 2x the allowed error) is in test_exercises_tolerances.py
    far = ch5.check_fl_multiply(_scaled(fl_multiply, 1 + 3e-13), seed=1)
    assert not far.passed and "differs from the reference" in text(far), text(far)
    assert ch5.check_fl_multiply(_scaled(fl_multiply, 1 + 1e-16), seed=1).passed


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
    assert expected in fb.messages[0], text(fb)
    assert "case 1 (d = " in text(fb)


def fl_cross_minus(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv - 2 * jnp.sum(gu * gv, axis=0)


def fl_lap_product(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * lv


def fl_grad_product(a, b):
    (u, gu, _), (v, gv, _) = a, b
    return u * v, gu * gv, fl_multiply(a, b)[2]


def fl_float32(a, b):
    return tuple(t.astype(jnp.float32) for t in fl_multiply(a, b))


def fl_hard_coded_d(a, b):
    """The cross term summed over the 5 inputs of the old fixed case, written in."""
    (u, gu, lu), (v, gv, lv) = a, b
    cross = sum(gu[k] * gv[k] for k in range(5))  # indices past d clamp
    return u * v, gu * v + u * gv, lu * v + u * lv + 2 * cross


@pytest.mark.parametrize(
    "answer, expected",
    [
        (fl_no_cross, "it misses the cross term 2 (grad u . grad v)"),
        (fl_cross_once, "has the cross term grad u . grad v once; it needs 2x"),
        (fl_cross_minus, "your Laplacian subtracts the cross term"),
        (fl_lap_product, "your Laplacian multiplies the two Laplacians"),
        (fl_half_gradient, "your gradient has one half of the product rule"),
        (fl_grad_product, "your gradient is gu * gv"),
        (fl_float32, "your triple is float32 for float64 inputs"),
        (lambda a, b: (a[0] + b[0], *fl_multiply(a, b)[1:]), "your value is u + v"),
    ],
    ids=[
        "no-cross",
        "cross-once",
        "cross-minus",
        "lap-product",
        "half-gradient",
        "grad-product",
        "float32",
        "sum-not-product",
    ],
)
def test_fl_first_message_names_the_mistake(answer, expected):
    for seed in range(3):
        fb = ch5.check_fl_multiply(answer, seed=seed)
        assert not fb.passed and expected in fb.messages[0], text(fb)


def test_fl_and_row_draw_their_cases_so_written_in_sizes_fail():
    """A sum over a fixed 5 inputs, or an answer for row 0 whatever i, fails every
    draw; the checkers print no seed; a right answer passes every draw."""
    for seed in range(8):
        assert not ch5.check_fl_multiply(fl_hard_coded_d, seed=seed).passed
        row0 = ch5.check_row_update_second_derivative(
            lambda a, i, u: row_second(a, 0, u), seed=seed
        )
        assert not row0.passed, text(row0)
        assert ch5.check_fl_multiply(fl_multiply, seed=seed).passed
        assert ch5.check_row_update_second_derivative(row_second, seed=seed).passed
    for fb in (
        ch5.check_fl_multiply(fl_no_cross),
        ch5.check_row_update_second_derivative(row_second),
    ):
        assert "seed" not in text(fb)


@pytest.mark.parametrize(
    "answer, expected",
    [
        (lambda a, i, u: -row_second(a, i, u), "the sign is flipped"),
        (
            lambda a, i, u: (
                -((u @ jnp.linalg.solve(a.T, jnp.eye(a.shape[0])[:, i])) ** 2)
            ),
            "you used row i of A^{-1}",
        ),
        (
            lambda a, i, u: u @ jnp.linalg.solve(a, jnp.eye(a.shape[0])[:, i]),
            "you returned the first derivative",
        ),
        (
            lambda a, i, u: 2 * row_second(a, i, u),
            "your answer is 2 times the right one",
        ),
        (
            lambda a, i, u: row_second(a.astype(jnp.float32), i, u.astype(jnp.float32)),
            "your answer is float32",
        ),
    ],
    ids=["sign", "transposed", "first-derivative", "factor-2", "float32"],
)
def test_row_first_message_names_the_mistake(answer, expected):
    for seed in range(3):
        fb = ch5.check_row_update_second_derivative(answer, seed=seed)
        assert not fb.passed and expected in fb.messages[0], text(fb)


def test_row_another_row_is_named():
    fb = ch5.check_row_update_second_derivative(
        lambda a, i, u: row_second(a, (i + 1) % a.shape[0], u), seed=4
    )
    assert "the checker asked for row" in fb.messages[0], text(fb)


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
        "it is (d, m) = (",
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
    ("none", lambda a, b: None, "your result is None (does your function end"),
    ("a-function", lambda a, b: fl_multiply, "your result is a function"),
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
        "3 drawn matrices, float64, |error| <= 7.1e-15 n cond(A) (|u| |A^-1 e_i|)^2)"
        in text(fb)
    )


def test_row_tolerance_is_pinned_with_independent_answers():
    # ROW_TOL = 64 u times n cond(A) (|u| |A^-1 e_i|)^2 >= 2 |expected|: correct
    # answers (solve, autodiff) are off by <= 1.84 u of that; an answer off by 1e-11
    # relative is rejected (the in-use test, 0.5x and 2x, is in
    # test_exercises_tolerances.py)
    check = functools.partial(ch5.check_row_update_second_derivative, seed=4)
    for answer in (row_second, row_by_autodiff):
        far = check(_scaled(answer, 1 + 1e-11))
        assert not far.passed and "differs from the reference" in text(far), text(far)
        assert check(_scaled(answer, 1 + 1e-16)).passed


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
            "your answer is 0.5 times the right one",
        ),
    ],
    ids=["sign", "row-not-column", "factor-half"],
)
def test_row_near_misses(answer, expected):
    fb = ch5.check_row_update_second_derivative(answer)
    assert not fb.passed and fb.attempted
    assert expected in fb.messages[0], text(fb)
    assert "answer differs from the reference" in text(fb)


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
]


@pytest.mark.parametrize(
    "answer, expected", [c[1:] for c in ROW_BAD], ids=[c[0] for c in ROW_BAD]
)
def test_row_bad_inputs_each_get_their_message(answer, expected):
    fb = ch5.check_row_update_second_derivative(answer)
    assert not fb.passed
    assert expected in text(fb), text(fb)


# ---------------------------------------------------------------------------------------
# 5.3: the sharded variance step

SEED = 3  # sizes drawn by the checker from this seed (the tests repeat them)


def check(answer, seed=SEED):
    """The checker at the sizes of ``seed`` (the public one draws its own)."""
    return ch5._check_variance(answer, False, seed)


def _kinetic_only(p, x, *, cast=True):
    f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))  # noqa: E731
    g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
    eye = jnp.eye(g.shape[0], dtype=g.dtype)
    if cast:
        eye = lax.pcast(eye, "data", to="varying")
    return -0.5 * (jnp.trace(jax.vmap(hvp)(eye)) + g @ g)


def _kinetic(p, x, *, cast=True):  # the local energy E_L = T + V
    return _kinetic_only(p, x, cast=cast) + vmc.potential_energy(x)


def _all(t):
    """(sum over all walkers, their number) of the per-walker values t."""
    return lax.psum(jnp.sum(t), "data"), t.shape[0] * lax.axis_size("data")


def variance_step(params, walkers):
    def variance(p):
        t = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        total, count = _all(t)
        return _all((t - total / count) ** 2)[0] / count

    return jax.value_and_grad(variance)(params)


def moments_step(params, walkers):
    """A second method, written independently: the Hessian's trace, and E[T^2] - E[T]^2."""

    def kinetic(p, x):
        f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))  # noqa: E731
        v = x.reshape(-1)
        t = -0.5 * (jnp.trace(jax.hessian(f)(v)) + jnp.sum(jax.grad(f)(v) ** 2))
        # the potential written out: trap (omega = 1) and Coulomb, pair by pair
        pot = 0.5 * jnp.sum(x * x)
        for i in range(x.shape[0]):
            for j in range(i + 1, x.shape[0]):
                pot = pot + 1 / jnp.linalg.norm(x[i] - x[j])
        return t + pot

    def variance(p):
        t = jax.vmap(kinetic, in_axes=(None, 0))(p, walkers)
        (s1, n), (s2, _) = _all(t), _all(t * t)
        return s2 / n - (s1 / n) ** 2

    return jax.value_and_grad(variance)(params)


def per_device_variance(params, walkers):
    def variance(p):
        t = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        return lax.pmean(jnp.var(t), "data")

    return jax.value_and_grad(variance)(params)


def unbiased_variance(params, walkers):
    def variance(p):
        t = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        total, count = _all(t)
        return _all((t - total / count) ** 2)[0] / (count - 1)

    return jax.value_and_grad(variance)(params)


def mean_not_variance(params, walkers):
    def mean(p):
        total, count = _all(jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers))
        return total / count

    return jax.value_and_grad(mean)(params)


def kinetic_only_variance(params, walkers):
    """The old statement's answer: the variance of T without the potential."""

    def variance(p):
        t = jax.vmap(_kinetic_only, in_axes=(None, 0))(p, walkers)
        total, count = _all(t)
        return _all((t - total / count) ** 2)[0] / count

    return jax.value_and_grad(variance)(params)


def hard_coded_count(params, walkers):
    """Divides by the number of walkers of the first drawn case, written in."""
    count = ch5._variance_sizes(SEED)[0][1] * ch5.SHARDED_DEVICES

    def variance(p):
        t = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        mean = lax.psum(jnp.sum(t), "data") / count
        return lax.psum(jnp.sum((t - mean) ** 2), "data") / count

    return jax.value_and_grad(variance)(params)


def hard_coded_electrons(params, walkers):
    """Reshapes each walker to the electron count of the first drawn case."""
    n = ch5._variance_sizes(SEED)[0][0]

    def variance(p):
        t = jax.vmap(lambda x: _kinetic(p, x.reshape(-1)[: 3 * n].reshape(n, 3)))(
            walkers
        )
        total, count = _all(t)
        return _all((t - total / count) ** 2)[0] / count

    return jax.value_and_grad(variance)(params)


def psum_of_grad(params, walkers):
    """The device-count bug: the right variance, then a psum of its gradient."""
    value, grad = variance_step(params, walkers)
    return value, jax.tree.map(lambda t: lax.psum(t, "data"), grad)


def test_sharded_right_answers_pass_at_drawn_sizes():
    for answer in (variance_step, moments_step):
        fb = check(answer)
        assert fb.passed, text(fb)
    out = text(fb)
    assert "runs in shard_map over 'data' (8 devices, check_vma=True)" in out
    assert f"at {ch5.VAR_CASES} sizes drawn at random" in out
    assert "the variance of E_L = T + V" in out
    assert f"|error| <= {ch5.VAR_TOL:g} (1 + max|expected|)" in out


def test_sharded_sizes_are_drawn_beyond_any_small_unroll():
    draws = [ch5._variance_sizes(seed) for seed in range(40)]
    electrons = {e for case in draws for e, _ in case}
    walkers = {w for case in draws for _, w in case}
    assert electrons == set(ch5.VAR_ELECTRONS) and min(electrons) > 3  # 5.8 has 3
    assert walkers == set(ch5.VAR_WALKERS_PER_DEVICE)
    assert ch5.VAR_CASES >= 2
    for case in draws:  # distinct in both sizes: no written-in size passes them all
        assert len({e for e, _ in case}) == len({w for _, w in case}) == ch5.VAR_CASES
    assert len({tuple(case) for case in draws}) > 10


def test_sharded_checker_prints_no_seed_and_takes_none():
    import inspect

    assert "seed" not in inspect.signature(ch5.check_sharded_variance_step).parameters
    fb = ch5.check_sharded_variance_step(mean_not_variance)
    assert not fb.passed
    assert "seed" not in text(fb) and "the next check draws anew" in text(fb)


@pytest.mark.parametrize("answer", [hard_coded_count, hard_coded_electrons])
def test_sharded_written_in_sizes_fail_every_draw(answer):
    # the answer is right at the first drawn case's size and wrong at the other
    fb = check(answer)
    assert not fb.passed, text(fb)


def test_sharded_tolerance_is_pinned():
    # VAR_TOL is 1e-12 (the numbers below are written out, so that loosening it 10x
    # fails here): correct answers are off by <= 1.1e-13 (1 + max|expected|) (the
    # worst seen). An answer off by 3e-12 relative (3x) is rejected, 3e-13 (0.3x)
    # accepted.
    far = check(_scaled(variance_step, 1 + 3e-12))
    assert not far.passed and "differs from the reference" in text(far), text(far)
    near = check(_scaled(variance_step, 1 + 3e-13))
    assert near.passed, text(near)


@pytest.mark.parametrize(
    "answer, expected",
    [
        (per_device_variance, "the mean of each device's own variance"),
        (unbiased_variance, "you divided by N - 1"),
        (
            mean_not_variance,
            "you returned the mean local energy; return its variance",
        ),
        (
            kinetic_only_variance,
            "your variance is that of the kinetic energy T alone: the local energy "
            "is E_L = T + V",
        ),
        (
            psum_of_grad,
            "your gradient is 8 x the single-device gradient (8 devices): the "
            "device-count bug",
        ),
        (
            lambda p, w: (variance_step(p, w)[0], _scaled(variance_step, 2.0)(p, w)[1]),
            "your gradient is +2 x the right one: differentiate the variance itself",
        ),
        (
            lambda p, w: tuple(variance_step(p, w)[::-1]),
            "return (variance, gradient) in that order",
        ),
        (
            lambda p, w: (
                variance_step(p, w)[0].astype(jnp.float32),
                variance_step(p, w)[1],
            ),
            "your variance is float32",
        ),
        (
            lambda p, w: (
                variance_step(p, w)[0] * ch5.SHARDED_DEVICES,
                variance_step(p, w)[1],
            ),
            "your variance is 8 x the right one: divide by the number of walkers on "
            "all devices",
        ),
    ],
    ids=[
        "per-device",
        "n-minus-1",
        "mean",
        "kinetic-only",
        "psum-of-grad",
        "twice-the-gradient",
        "swapped",
        "float32",
        "one-device-count",
    ],
)
def test_sharded_near_misses_say_what_to_change(answer, expected):
    fb = check(answer)
    assert not fb.passed
    assert expected in fb.messages[0], text(fb)  # the first thing a student reads
    assert "the gradient" in text(fb) or "the variance" in text(fb), text(fb)
    assert len(fb.messages) >= 3  # the hint, the mismatch it explains, the sizes
    assert "(sizes drawn for this check: " in text(fb)


def no_final_psum(params, walkers):
    """The global mean right, the squared deviations summed on each device only."""

    def variance(p):
        t = jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers)
        total, count = _all(t)
        return jnp.sum((t - total / count) ** 2) / count

    return jax.value_and_grad(variance)(params)


def local_variance(params, walkers):
    """No collective at all: each device's own jnp.var."""

    def variance(p):
        return jnp.var(jax.vmap(_kinetic, in_axes=(None, 0))(p, walkers))

    return jax.value_and_grad(variance)(params)


@pytest.mark.parametrize(
    "answer, expected",
    [
        (no_final_psum, "an output of your step still varies across the devices"),
        (local_variance, "so a psum over 'data' (of the sums, then of the squared"),
        (hard_coded_count, "is a count written in?"),
    ],
    ids=["no-final-psum", "no-collective", "count-written-in"],
)
def test_sharded_missing_collective_and_written_in_count_are_named_first(
    answer, expected
):
    fb = check(answer)
    assert not fb.passed and expected in fb.messages[0], text(fb)


def test_sharded_uncast_basis_keeps_jax_hint_and_names_the_mesh():
    fb = check(_uncast)
    out = text(fb)
    assert (
        "your step inside shard_map raised ValueError: linearized function called on "
        "tangent values" in out
    )
    assert "pcast(..., ('data',), to='varying')" in out  # JAX's own hint survives
    assert "one axis named 'data'" in out


def _uncast(params, walkers):
    def variance(p):
        t = jax.vmap(lambda x: _kinetic(p, x, cast=False))(walkers)
        total, count = _all(t)
        return _all((t - total / count) ** 2)[0] / count

    return jax.value_and_grad(variance)(params)


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
        lambda p, w: (jnp.float64(jnp.nan) * jnp.ones(()), variance_step(p, w)[1]),
        "nan/inf",
    ),
    (
        "not-a-pair",
        lambda p, w: (variance_step(p, w)[0],),
        "return a pair (variance, gradient), as jax.value_and_grad does",
    ),
    (
        "wrong-dtype",
        lambda p, w: (variance_step(p, w)[0].astype(jnp.int32), variance_step(p, w)[1]),
        "the variance has dtype int32",
    ),
    (
        "wrong-shape",
        lambda p, w: (variance_step(p, w)[0][None], variance_step(p, w)[1]),
        "has shape (1,)",
    ),
]


@pytest.mark.parametrize(
    "answer, expected", [c[1:] for c in SHARD_BAD], ids=[c[0] for c in SHARD_BAD]
)
def test_sharded_bad_inputs_each_get_their_message(answer, expected):
    fb = check(answer)
    assert not fb.passed
    assert expected in text(fb), text(fb)


def test_sharded_bad_seed_is_refused():
    with pytest.raises(TypeError, match="seed must be an int or None"):
        ch5._check_variance(variance_step, False, "3")


def test_sharded_stub_is_answered_before_any_reference_work(monkeypatch):
    """The answer is traced first (shapes only): a bare stub gets its verdict without
    the problems and references being built, which cost compiles; any other answer,
    a wrong one included, still reaches them."""

    def no_references(*args):
        raise AssertionError("the references were built")

    monkeypatch.setattr(ch5, "_variance_cases", no_references)
    fb = check(stub)
    assert not fb.passed and not fb.attempted
    assert "not attempted yet" in text(fb)
    for answer in (variance_step, _wrong_axis, raises_inside):
        with pytest.raises(AssertionError, match="the references were built"):
            check(answer)


def fl_cross_over_outputs(a, b):  # the cross term summed over axis 1, the m outputs
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv + 2 * jnp.sum(gu * gv, axis=1)


def test_fl_shape_error_names_the_axes_first():
    """JAX's broadcasting error comes second; first the shapes and the axis (#44). The
    seeds draw cases with d != m first, where the wrong axis raises."""
    shape_errors = 0
    for seed in range(3):
        fb = ch5.check_fl_multiply(fl_cross_over_outputs, seed=seed)
        assert not fb.passed, text(fb)
        if "fails on shapes" not in fb.messages[0]:  # a case with d == m came first
            assert "sums over the outputs (axis 1)" in fb.messages[0], text(fb)
            continue
        shape_errors += 1
        assert fb.messages[0].startswith("your function fails on shapes for d = ")
        assert "jnp.sum(gu * gv, axis=0)" in fb.messages[0], text(fb)
        assert "incompatible shapes for broadcasting" in fb.messages[1], text(fb)
    assert shape_errors, "no seed drew d != m first: pick other seeds"
