"""Each tolerance in use: an answer off by 2x the allowed error is refused, one off by
0.5x is accepted, in the checker's own measure.

The tolerances are written out here (not read from the checkers), so that loosening
or tightening one 2x fails a test; each answer is the reference plus a chosen
multiple of the allowed error, built independently of the checker's comparison.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondgrad import compat, runtime
from beyondgrad.exercises import ch2, ch3, ch4, ch5, ch6

runtime.ensure_cpu_devices(8)

U = 2.0**-53  # float64 unit roundoff
FL_TOL = 64 * U  # 5.1, times the sum of the magnitudes of the terms
ROW_TOL = 64 * U  # 5.2, times n cond(A) (|u| |A^-1 e_i|)^2
SQRTM_TOL = 1e-8  # 3.2, absolute plus relative
SHARDED_TOL = 1e-12  # 6.1 and 6.2, times the largest entry of the answer
U32 = 2.0**-24  # float32 unit roundoff
TRANSPOSE_TOL = 64 * U32  # 2.1, times the sum of the magnitudes of the terms (in
# use: tests/test_exercises_ch2.py, test_check_transpose_tolerance_in_use and
# test_check_dot_product_tolerance_in_use)
JACREV_TOL = 256 * U32  # 2.2, times the magnitudes of the terms (in use:
# tests/test_exercises_ch2.py, test_check_rebuilt_jacrev_tolerance_in_use)
STEP_TOL = 128 * U32  # 4.2, times S_j (in use: tests/test_exercises_ch4.py,
# test_sharded_step_tolerance_in_use)


def test_the_tolerances_are_those_written_here():
    assert (ch5.FL_TOL, ch5.ROW_TOL, ch3.SQRTM_TOL) == (FL_TOL, ROW_TOL, SQRTM_TOL)
    assert ch6.TOL == SHARDED_TOL
    assert ch2.TRANSPOSE_RTOL == ch2.DOT_PRODUCT_TOL == TRANSPOSE_TOL
    assert ch2.JACREV_RTOL == JACREV_TOL
    assert ch4.STEP_RTOL == STEP_TOL


# --- 5.1 -------------------------------------------------------------------------------


def _fl_answer(seed, factor):
    """5.1's exact triple plus ``factor * FL_TOL * S`` on every entry (S the sum of the
    magnitudes of the entry's terms, recomputed here from the drawn functions)."""
    table = {}
    with jax.enable_x64(True):
        cases = ch5._fl_cases(seed)
    for a, _, want, scale in cases:
        table[np.asarray(a[0]).tobytes()] = tuple(
            np.asarray(w) + factor * FL_TOL * s for w, s in zip(want, scale)
        )

    def answer(a, b):
        return tuple(jnp.asarray(t) for t in table[np.asarray(a[0]).tobytes()])

    return answer


def _fl_scale_by_hand(w, c, s, vw, x):
    """The Laplacian's scale from the terms of (u v)'' written out one by one."""
    t = np.tanh(x @ w + c)
    z = np.abs(x) @ np.abs(w) + np.abs(c)
    r2 = float(x @ x)
    e = np.exp(-0.5 * s * r2) * (1 + s * r2)
    total = np.zeros_like(c)
    for k in range(len(x)):
        du = np.abs(w[k]) * ((1 - t * t) + 2 * np.abs(t) * (1 - t * t) * z)
        ddu = w[k] ** 2 * (2 * np.abs(t) * (1 - t * t) + 2 * z)
        v = e + np.abs(x) @ np.abs(vw)
        dv = s * abs(x[k]) * e + np.abs(vw[k])
        ddv = e * (s * s * x[k] ** 2 + s)
        u = np.abs(t) + (1 - t * t) * z
        total += ddu * v + 2 * du * dv + u * ddv
    return total


def test_fl_scale_matches_the_terms_written_out():
    rng = np.random.default_rng(0)
    d, m = 4, 3
    draw = ch5._fl_draw(rng, d, m)
    np.testing.assert_allclose(
        ch5._fl_scale(*draw)[2], _fl_scale_by_hand(*draw), rtol=1e-14
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_fl_tolerance_in_use(seed):
    far = ch5.check_fl_multiply(_fl_answer(seed, 2.0), seed=seed)
    assert not far.passed and "differs from the reference" in str(far), str(far)
    assert "allowed 7.1e-15 x" in str(far)
    near = ch5.check_fl_multiply(_fl_answer(seed, 0.5), seed=seed)
    assert near.passed, str(near)
    below = ch5.check_fl_multiply(_fl_answer(seed, -2.0), seed=seed)
    assert not below.passed, str(below)


# --- 5.2 -------------------------------------------------------------------------------


def _row_answer(factor):
    """-(u . A^-1 e_i)^2 plus ``factor * ROW_TOL * n cond(A) (|u| |A^-1 e_i|)^2``,
    computed here with NumPy (SVD for the condition number)."""

    def answer(a, i, u):
        a, u = np.asarray(a), np.asarray(u)
        column = np.linalg.solve(a, np.eye(len(a))[:, i])
        sv = np.linalg.svd(a, compute_uv=False)
        scale = (
            len(a) * sv[0] / sv[-1] * (np.linalg.norm(u) * np.linalg.norm(column)) ** 2
        )
        return jnp.asarray(-((u @ column) ** 2) + factor * ROW_TOL * scale)

    return answer


@pytest.mark.parametrize("seed", [0, 4])
def test_row_tolerance_in_use(seed):
    check = functools.partial(ch5.check_row_update_second_derivative, seed=seed)
    far = check(_row_answer(2.0))
    assert not far.passed and "differs from the reference" in str(far), str(far)
    assert check(_row_answer(0.5)).passed
    assert not check(_row_answer(-2.0)).passed


def test_row_accepts_a_python_float():
    def as_float(a, i, u):
        column = jnp.linalg.solve(a, jnp.eye(a.shape[0], dtype=a.dtype)[:, i])
        return float(-((u @ column) ** 2))

    for seed in range(3):
        fb = ch5.check_row_update_second_derivative(as_float, seed=seed)
        assert fb.passed, str(fb)


# --- 3.2 -------------------------------------------------------------------------------


def _sqrtm_answer(factor):
    """X = A^(-1/2) by eigh, with a custom JVP giving the exact tangent, each entry
    moved by ``factor * SQRTM_TOL * (1 + |entry|)``, through lax.custom_root so that
    the method check passes (the root is the perturbed X)."""

    def exact(a):
        lam, q = jnp.linalg.eigh(a)
        return (q / jnp.sqrt(lam)) @ q.T

    def off(t):
        return t + factor * SQRTM_TOL * (1 + jnp.abs(t))

    @jax.custom_jvp
    def shifted(a):
        return off(exact(a))

    @shifted.defjvp
    def _(primals, tangents):
        (a,), (da,) = primals, tangents
        x, dx = jax.jvp(exact, (a,), (da,))
        return off(x), off(dx) - off(jnp.zeros_like(dx)) + factor * SQRTM_TOL

    def answer(a):
        target = shifted(a)
        return lax.custom_root(
            lambda x: x - target,
            jnp.zeros_like(a),
            lambda f, x0: x0 - f(x0),
            lambda g, y: y,
        )

    return answer


def test_sqrtm_tolerance_in_use():
    for seed in range(2):
        far = ch3.check_sqrtm(_sqrtm_answer(2.0), seed=seed)
        assert not far.passed and "differs from the reference" in str(far), str(far)
        near = ch3.check_sqrtm(_sqrtm_answer(0.5), seed=seed)
        assert near.passed, str(near)


def test_sqrtm_verdict_does_not_depend_on_the_draw():
    """A Newton solve stopped at 1e-10 (3.1's number) passes every draw, and one
    stopped after too few steps fails every draw."""
    from beyondgrad import implicit

    def newton(tol=1e-10, max_iter=100):
        def inv_sqrtm(A):
            eye = jnp.eye(A.shape[0], dtype=A.dtype)
            F = lambda X, A: X @ A @ X - eye  # noqa: E731
            return implicit.root_find(F, eye, A, tol=tol, max_iter=max_iter)[0]

        return inv_sqrtm

    for seed in range(12):
        assert ch3.check_sqrtm(newton(), seed=seed).passed
        assert not ch3.check_sqrtm(newton(tol=1e-4), seed=seed).passed


# --- 6.1 and 6.2 -------------------------------------------------------------------------


def _clip_answer(factor):
    """The global-median clip, plus ``factor * TOL * max|clipped|`` on every walker."""

    def clip(e_l):
        everyone = lax.all_gather(e_l, "data", tiled=True)
        median = jnp.median(everyone)
        mad = jnp.mean(jnp.abs(everyone - median))
        half = ch6.CLIP_SCALE * mad
        largest = jnp.max(jnp.abs(jnp.clip(everyone, median - half, median + half)))
        out = jnp.clip(e_l, median - half, median + half)
        return out + factor * SHARDED_TOL * largest

    return clip


@pytest.mark.parametrize("seed", [0, 1])
def test_clip_tolerance_in_use(seed):
    far = ch6.check_clip(_clip_answer(2.0), seed=seed)
    assert not far.passed and "off by 2.00e-12 of the largest |expected|" in str(far)
    assert "(allowed 1e-12)" in str(far)
    assert ch6.check_clip(_clip_answer(0.5), seed=seed).passed
    # just outside and just inside (1.1x and 0.9x the tolerance, written out here)
    assert not ch6.check_clip(_clip_answer(1.1), seed=seed).passed
    assert ch6.check_clip(_clip_answer(0.9), seed=seed).passed


def _grads_answer(factor):
    def grads(w, x):
        w = compat.pcast_varying(w, "data")
        g = jax.vmap(jax.grad(ch6.toy_log_psi), in_axes=(None, 0))(w, x)
        largest = lax.pmax(jnp.max(jnp.abs(g)), "data")
        return g + factor * SHARDED_TOL * largest

    return grads


@pytest.mark.parametrize("seed", [0, 1])
def test_grads_tolerance_in_use(seed):
    far = ch6.check_per_walker_grads(_grads_answer(2.0), seed=seed)
    assert not far.passed and "off by 2.00e-12 of the largest |expected|" in str(far)
    assert "(allowed 1e-12)" in str(far), str(far)
    assert ch6.check_per_walker_grads(_grads_answer(0.5), seed=seed).passed
    assert not ch6.check_per_walker_grads(_grads_answer(1.1), seed=seed).passed
    assert ch6.check_per_walker_grads(_grads_answer(0.9), seed=seed).passed
