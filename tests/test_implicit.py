"""Tests for beyondgrad.implicit: closed forms and finite differences in float64.

Every numerical test runs inside ``jax.enable_x64(True)`` (a context, so other test
files keep JAX's float32 default).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import implicit as im
from beyondgrad.exercises import ExerciseFailed


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.fixture
def deq(x64):
    return im.deq_params(jax.random.PRNGKey(0), d=8, d_in=3, radius=0.9, dtype=jnp.float64)


def central_diff(fn, x, dx, eps=1e-6):
    return (fn(x + eps * dx) - fn(x - eps * dx)) / (2 * eps)


# ------------------------------------------------------------------ values and derivatives


def test_fixed_point_value_and_reverse_grad_match_closed_form(deq):
    z0 = jnp.zeros(8)
    c = jnp.linspace(-1.0, 2.0, 8)
    z, info = im.fixed_point(im.deq_layer, z0, deq, tol=1e-13)
    assert bool(info.converged) and int(info.iterations) > 1
    np.testing.assert_allclose(z, im.deq_layer(z, deq), atol=1e-12)
    # gradient w.r.t. the whole params pytree (W, U, b, x) at once
    grads = jax.grad(lambda p: c @ im.fixed_point(im.deq_layer, z0, p, tol=1e-13)[0])(deq)
    assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(deq)
    np.testing.assert_allclose(grads["W"], im.deq_reference_grad_W(deq, z, c), rtol=1e-9, atol=1e-12)
    # b enters like W's bias: ∂/∂b = D u with u = (I - D W)^{-T} c
    d = 1 - z**2
    u = jnp.linalg.solve((jnp.eye(8) - d[:, None] * deq["W"]).T, c)
    np.testing.assert_allclose(grads["b"], d * u, rtol=1e-9, atol=1e-12)


def test_fixed_point_forward_mode_matches_finite_differences(deq):
    z0 = jnp.zeros(8)
    direction = jax.random.normal(jax.random.PRNGKey(5), (8, 8), jnp.float64)

    def solve(w):
        return im.fixed_point(im.deq_layer, z0, {**deq, "W": w}, tol=1e-14)[0]

    _, tangent = jax.jvp(solve, (deq["W"],), (direction,))
    np.testing.assert_allclose(tangent, central_diff(solve, deq["W"], direction), rtol=1e-6, atol=1e-8)


def test_pytree_state_against_finite_differences(x64):
    # x = {"a": scalar, "b": vector}, a coupled contraction
    def f(x, theta):
        return {"a": 0.5 * jnp.sin(x["a"] + jnp.sum(x["b"])) + theta, "b": 0.3 * jnp.cos(x["b"] * theta) + 0.1 * x["a"]}

    x0 = {"a": jnp.zeros(()), "b": jnp.zeros(3)}

    def loss(theta):
        x, _ = im.fixed_point(f, x0, theta, tol=1e-14, max_iter=500)
        return x["a"] + jnp.sum(x["b"] ** 2)

    theta = jnp.asarray(0.4)
    np.testing.assert_allclose(jax.grad(loss)(theta), central_diff(loss, theta, 1.0), rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(loss)(theta), jax.grad(loss)(theta), rtol=1e-10)


def test_newton_sqrt_grad_jit_vmap(x64):
    def f(x, theta):
        return x**2 - theta

    def sqrt(theta):
        return im.newton_root(f, jnp.ones_like(theta), theta, tol=1e-13)[0]

    thetas = jnp.array([0.5, 2.0, 9.0, 100.0])
    np.testing.assert_allclose(jax.jit(jax.vmap(sqrt))(thetas), jnp.sqrt(thetas), rtol=1e-13)
    np.testing.assert_allclose(jax.vmap(jax.grad(sqrt))(thetas), 0.5 / jnp.sqrt(thetas), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.jacfwd(sqrt)))(thetas), 0.5 / jnp.sqrt(thetas), rtol=1e-12)
    _, info = im.newton_root(f, jnp.ones(()), jnp.asarray(2.0), tol=1e-13)
    assert int(info.iterations) <= 8  # quadratic convergence


def test_anderson_matches_fixed_point_and_closed_form(deq):
    z0 = jnp.zeros(8)
    c = jnp.linspace(-1.0, 2.0, 8)
    z, info = im.anderson_fixed_point(im.deq_layer, z0, deq, tol=1e-12, memory=4)
    z_ref, info_ref = im.fixed_point(im.deq_layer, z0, deq, tol=1e-12)
    assert bool(info.converged) and int(info.iterations) < int(info_ref.iterations)
    np.testing.assert_allclose(z, z_ref, atol=1e-11)
    g = jax.jit(jax.grad(lambda w: c @ im.anderson_fixed_point(im.deq_layer, z0, {**deq, "W": w}, tol=1e-12)[0]))(deq["W"])
    np.testing.assert_allclose(g, im.deq_reference_grad_W(deq, z, c), rtol=1e-8, atol=1e-11)
    with pytest.raises(ValueError, match="memory must be"):
        im.anderson_fixed_point(im.deq_layer, z0, deq, memory=1)


def test_vmap_over_params_matches_loop(deq):
    z0 = jnp.zeros(8)
    bs = jnp.stack([deq["b"], -deq["b"], 2 * deq["b"]])

    def grad_b(b):
        return jax.grad(lambda b: jnp.sum(im.fixed_point(im.deq_layer, z0, {**deq, "b": b}, tol=1e-13)[0]))(b)

    batched = jax.jit(jax.vmap(grad_b))(bs)
    for k in range(3):
        np.testing.assert_allclose(batched[k], grad_b(bs[k]), rtol=1e-10)


def test_ridge_hyperparameter_gradient_matches_closed_form(x64):
    X = jax.random.normal(jax.random.PRNGKey(1), (30, 6), jnp.float64)
    y = jax.random.normal(jax.random.PRNGKey(2), (30,), jnp.float64)

    lams = jnp.array([0.01, 1.0, 30.0])
    w_ref, dw_ref = jax.vmap(im.ridge_closed_form, in_axes=(0, None, None))(lams, X, y)
    for solver in ("dense", "cg", "gmres"):

        def w_star(lam, solver=solver):
            f = lambda w, lam: im.ridge_normal_equations(w, lam, X, y)  # noqa: E731
            return im.newton_root(f, jnp.zeros(6), lam, tol=1e-12, tangent_solver=solver)[0]

        w, dw_fwd, dw_rev = jax.jit(jax.vmap(lambda l: (w_star(l), jax.jacfwd(w_star)(l), jax.jacrev(w_star)(l))))(lams)
        np.testing.assert_allclose(w, w_ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(dw_fwd, dw_ref, rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(dw_rev, dw_ref, rtol=1e-7, atol=1e-10)


def test_tangent_solvers_agree_including_a_callable(deq):
    z0 = jnp.zeros(8)

    def grad_w(solver):
        loss = lambda w: jnp.sum(im.fixed_point(im.deq_layer, z0, {**deq, "W": w}, tol=1e-13, tangent_solver=solver)[0])  # noqa: E731
        return jax.grad(loss)(deq["W"])

    def my_solver(g, y):
        return im.dense_tangent_solve(g, y)

    ref = grad_w("dense")
    np.testing.assert_allclose(grad_w("gmres"), ref, rtol=1e-8)
    np.testing.assert_allclose(grad_w(my_solver), ref, rtol=1e-12)


def test_unrolled_matches_implicit_at_convergence(deq):
    z0 = jnp.zeros(8)

    def loss(solver, w):
        z, info = solver(im.deq_layer, z0, {**deq, "W": w}, tol=1e-13, max_iter=400)
        return jnp.sum(z), info

    gi, info_i = jax.grad(lambda w: loss(im.fixed_point, w), has_aux=True)(deq["W"])
    gu, info_u = jax.grad(lambda w: loss(im.unrolled_fixed_point, w), has_aux=True)(deq["W"])
    assert int(info_i.iterations) == int(info_u.iterations)
    assert bool(info_u.converged)
    np.testing.assert_allclose(gu, gi, rtol=1e-8, atol=1e-11)
    # tol=0: exactly max_iter steps, no check
    _, info0 = im.unrolled_fixed_point(im.deq_layer, z0, deq, tol=0.0, max_iter=37)
    assert int(info0.iterations) == 37 and not bool(info0.converged)


def test_diagnostics_are_not_differentiated(deq):
    z0 = jnp.zeros(8)

    def run(b):
        z, info = im.fixed_point(im.deq_layer, z0, {**deq, "b": b}, tol=1e-10)
        return z, info

    (z, info), (dz, dinfo) = jax.jvp(run, (deq["b"],), (jnp.ones(8),))
    assert info.iterations.dtype == jnp.int32 and info.converged.dtype == jnp.bool_
    assert float(dinfo.residual) == 0.0
    assert float(jnp.linalg.norm(dz)) > 0


# ------------------------------------------------------------------- failures reported


def test_non_contractive_map_hits_max_iter_and_says_so(x64):
    def f(x, theta):
        return 2.0 * x + theta  # |f'| = 2: iteration diverges

    x, info = im.fixed_point(f, jnp.zeros(3), jnp.asarray(1.0), tol=1e-8, max_iter=25)
    assert int(info.iterations) == 25
    assert not bool(info.converged)
    assert float(info.residual) > 1.0


@jax.default_matmul_precision("highest")
def test_tutorial_matrix_diverges_with_partitionable_prng():
    """The Deep Implicit Layers tutorial's W: contractive under the old PRNG, not the new."""
    radii = {}
    for flag in (False, True):
        with jax.threefry_partitionable(flag):
            w = jax.random.normal(jax.random.PRNGKey(0), (10, 10)) / jnp.sqrt(10.0)
            x = jax.random.normal(jax.random.PRNGKey(1), (10,))
        radii[flag] = float(np.max(np.abs(np.linalg.eigvals(np.asarray(w, np.float64)))))
        _, info = im.fixed_point(lambda z, p: jnp.tanh(p[0] @ z + p[1]), jnp.zeros(10), (w, x), tol=1e-5, max_iter=500)
        assert bool(info.converged) == (not flag)
    assert radii[False] < 1 < radii[True]


def test_mismatched_structure_raises_type_error_naming_both(x64):
    x0 = {"a": jnp.zeros(2), "b": jnp.zeros(2)}

    def f(x, theta):
        return (x["a"], x["b"])

    with pytest.raises(TypeError, match=r"x0 has structure PyTreeDef\(\{'a': \*, 'b': \*\}\) but f returned PyTreeDef\(\(\*, \*\)\)"):
        im.fixed_point(f, x0, 1.0)
    with pytest.raises(TypeError, match="same structure"):
        im.newton_root(f, x0, 1.0)
    with pytest.raises(TypeError, match="same structure"):
        im.unrolled_fixed_point(f, x0, 1.0)


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        ({"f": lambda x, t: x[:2], "x0": jnp.zeros(3)}, TypeError, re.escape("x0 has float32[3] but f returned float32[2]")),
        ({"x0": jnp.zeros(3, jnp.int32)}, TypeError, "floating-point"),
        ({"x0": {}}, ValueError, "at least one array leaf"),
        ({"tol": -1.0}, ValueError, "tol must be"),
        ({"tol": float("nan")}, ValueError, "tol must be"),
        ({"max_iter": 0}, ValueError, "max_iter must be"),
        ({"max_iter": 10.0}, ValueError, "max_iter must be"),
        ({"tangent_solver": "lu"}, ValueError, "tangent_solver must be one of"),
        ({"f": "cos"}, TypeError, "f must be a function"),
    ],
)
def test_bad_arguments(kwargs, exc, pattern):
    call = {"f": lambda x, t: 0.5 * jnp.cos(x) + t, "x0": jnp.zeros(3), "params": 0.1, **kwargs}
    f, x0, params = call.pop("f"), call.pop("x0"), call.pop("params")
    for solver in (im.fixed_point, im.newton_root, im.unrolled_fixed_point):
        with pytest.raises(exc, match=pattern):
            solver(f, x0, params, **call)


def test_helpers_validate():
    with pytest.raises(ValueError, match="radius"):
        im.deq_params(jax.random.PRNGKey(0), radius=1.0)
    with pytest.raises(ValueError, match="'gmres' or 'cg'"):
        im.iterative_tangent_solve("bicgstab", 1e-6)
    with pytest.raises(ValueError, match="tol must be"):
        im.tolerance_report(0.0)
    with pytest.raises(ValueError, match="repeats"):
        im.median_times([(lambda: 1, ())], repeats=0)


def test_deq_params_contractive():
    p = im.deq_params(jax.random.PRNGKey(1), d=16, radius=0.8)
    s = np.linalg.svd(np.asarray(p["W"], np.float64), compute_uv=False)
    np.testing.assert_allclose(s, 0.8, rtol=1e-5)


# ------------------------------------------------------------------- widget and checkers


def test_tolerance_report_error_shrinks_with_tol():
    reports = [im.tolerance_report(t) for t in (1e-1, 1e-4, 1e-10)]
    errors = [r.rel_error for r in reports]
    assert errors == sorted(errors, reverse=True)
    assert errors[0] > 1e-3 and errors[-1] < 1e-8
    assert all(r.residual <= r.tol for r in reports)
    assert [r.iterations for r in reports] == sorted(r.iterations for r in reports)
    np.testing.assert_allclose(reports[-1].implicit_grad, reports[-1].reference_grad, rtol=1e-8)


def _fp_answer(theta):
    return im.fixed_point(lambda x, t: 0.5 * jnp.cos(x) + t, jnp.zeros_like(theta), theta, tol=1e-13)[0]


def test_check_fixed_point_grad():
    assert im.check_fixed_point_grad(_fp_answer, strict=True).passed

    def wrong(theta):  # right value, no implicit gradient: stop_gradient kills it
        return jax.lax.stop_gradient(_fp_answer(theta))

    fb = im.check_fixed_point_grad(wrong)
    assert not fb.passed and "dx*/dθ" in str(fb)

    def stub(theta):
        raise NotImplementedError

    assert "stub" in str(im.check_fixed_point_grad(stub))
    with pytest.raises(ExerciseFailed):
        im.check_fixed_point_grad(wrong, strict=True)


def test_check_sqrtm():
    def right(a):
        return im.newton_root(lambda x, a: x @ x - a, jnp.eye(3, dtype=a.dtype), a, tol=1e-12)[0]

    def wrong(a):  # the value is right but the derivative treats X as a function of A's diagonal only
        x = right(a)
        return x + 0.1 * (a - jax.lax.stop_gradient(a))

    assert im.check_sqrtm(right, strict=True).passed
    fb = im.check_sqrtm(wrong)
    assert not fb.passed and "dX" in str(fb)


def test_check_tolerance_fix():
    p = im.exercise3_params()

    def grad_at(tol):
        def fn(b):
            loss = lambda b: jnp.sum(im.fixed_point(im.deq_layer, jnp.zeros_like(b), {**p, "b": b}, tol=tol)[0])  # noqa: E731
            return jax.grad(loss)(b)

        return fn

    with jax.enable_x64(True):
        assert im.check_tolerance_fix(grad_at(1e-13), strict=True).passed
        fb = im.check_tolerance_fix(grad_at(1e-3))
    assert not fb.passed and "differs" in str(fb)


# ---------------------------------------------------------------------------- benchmark


def test_plot_tolerance_report_headless():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for tol in (1e-1, 1e-6):
        ax = im.plot_tolerance_report(im.tolerance_report(tol))
        assert f"tol={tol:.0e}" in ax.get_title()
        assert len(ax.collections[0].get_offsets()) == 16  # one dot per entry of b
        plt.close(ax.figure)


@jax.default_matmul_precision("highest")  # float32 comparison: no TF32 matmuls on GPU
def test_benchmark_memory_shape_and_solver_comparison():
    rows = im.benchmark_implicit_vs_unrolled((10, 200), d=8, repeats=1, min_time=1e-4)
    assert [r.iterations for r in rows] == [10, 200]
    assert rows[0].mem_implicit == rows[1].mem_implicit  # constant in the iteration count
    assert rows[1].mem_unrolled > 5 * rows[0].mem_unrolled  # grows with it
    assert all(t > 0 for r in rows for t in r[1:8])
    comp = im.compare_solvers(d=8, tol=1e-5, repeats=1, min_time=1e-4)
    plain, anderson, newton = comp
    assert newton.iterations < plain.iterations
    for s in comp:
        assert s.residual <= 1e-5
        np.testing.assert_allclose(s.grad, plain.grad, rtol=1e-3, atol=1e-4)
