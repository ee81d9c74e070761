"""Tests for slater.mlp_slater_laplacian (analytic orbital derivatives) and slater.sample_walkers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from beyondgrad import runtime, slater


def _problem(n, hidden, seed, dtype=jnp.float64):
    params = slater.init_params(jax.random.key(seed), n, hidden=hidden, dtype=dtype)
    pos = jax.random.normal(jax.random.key(100 + seed), (n, 3), dtype)
    return params, pos


@pytest.mark.parametrize("n,hidden,seed", [(1, 4, 0), (3, 7, 1), (6, 16, 2)])
def test_mlp_slater_laplacian_matches_float64_hessian(n, hidden, seed):
    with jax.enable_x64(True):
        params, pos = _problem(n, hidden, seed)
        flat = lambda v: slater.mlp_log_psi(params, v.reshape(n, 3))  # noqa: E731
        logabs, grad, lap = jax.jit(slater.mlp_slater_laplacian)(params, pos)
        np.testing.assert_allclose(float(logabs), float(flat(pos.reshape(-1))), rtol=1e-12)
        assert grad.shape == (n, 3)
        np.testing.assert_allclose(np.asarray(grad).ravel(), np.asarray(jax.grad(flat)(pos.reshape(-1))),
                                   rtol=1e-9, atol=1e-10)
        want = jax.jit(lambda v: jnp.trace(jax.hessian(flat)(v)))(pos.reshape(-1))
        np.testing.assert_allclose(float(lap), float(want), rtol=1e-9, atol=1e-9)


def test_mlp_slater_laplacian_agrees_with_forward_mode_row_formula_in_float32():
    params, pos = _problem(8, 16, 3, jnp.float32)
    # "highest": compare the two formulas, not TF32 / bfloat16 matmul passes on GPU or TPU
    with jax.default_matmul_precision("highest"):
        fast = jax.jit(slater.mlp_slater_laplacian)(params, pos)
        generic = jax.jit(lambda p, x: slater.slater_laplacian(functools.partial(slater.mlp_orbitals, p), x))(
            params, pos)
    for a, b in zip(fast, generic):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-3)


def test_mlp_slater_laplacian_under_vmap_and_grad_wrt_params():
    with jax.enable_x64(True):
        params, _ = _problem(3, 5, 4)
        walkers = jax.random.normal(jax.random.key(9), (4, 3, 3), jnp.float64)

        def loss(p, slater_fn):
            _, g, lap = jax.vmap(lambda x: slater_fn(p, x))(walkers)
            return jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2))))

        generic = lambda p, x: slater.slater_laplacian(functools.partial(slater.mlp_orbitals, p), x)  # noqa: E731
        got = jax.jit(jax.grad(loss), static_argnums=1)(params, slater.mlp_slater_laplacian)
        want = jax.jit(jax.grad(loss), static_argnums=1)(params, generic)
        for k in params:
            np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-8, atol=1e-10)
        # and one parameter against a central finite difference
        eps = 1e-6
        bump = lambda s: {**params, "b2": params["b2"].at[1].add(s)}  # noqa: E731
        fd = (loss(bump(eps), slater.mlp_slater_laplacian) - loss(bump(-eps), slater.mlp_slater_laplacian)) / (2 * eps)
        np.testing.assert_allclose(float(got["b2"][1]), float(fd), rtol=1e-5)


def test_mlp_slater_laplacian_inside_shard_map_check_vma():
    mesh = runtime.demo_mesh(4, "data")
    params, _ = _problem(3, 5, 5, jnp.float32)
    walkers = jax.random.normal(jax.random.key(1), (8, 3, 3), jnp.float32)

    def kinetic(p, block):
        _, g, lap = jax.vmap(lambda x: slater.mlp_slater_laplacian(p, x))(block)
        return jax.lax.psum(jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2)))), "data")

    sharded = jax.shard_map(kinetic, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=True)
    total, grads = jax.jit(jax.value_and_grad(sharded))(params, walkers)
    want, want_grads = jax.jit(jax.value_and_grad(lambda p: _one_device(p, walkers)))(params)
    np.testing.assert_allclose(float(total), float(want), rtol=1e-4)
    for k in params:
        np.testing.assert_allclose(np.asarray(grads[k]), np.asarray(want_grads[k]), rtol=1e-3, atol=1e-4)


def _one_device(p, walkers):
    _, g, lap = jax.vmap(lambda x: slater.mlp_slater_laplacian(p, x))(walkers)
    return jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2))))


def test_mlp_slater_laplacian_rejects_bad_input():
    params = slater.init_params(jax.random.key(0), 4, hidden=6)
    with pytest.raises(ValueError, match=r"positions must have shape \(n, 3\)"):
        slater.mlp_slater_laplacian(params, jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"params\['w2'\] must have shape \(6, 3\) for 3 electrons"):
        slater.mlp_slater_laplacian(params, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="params must be the dict of init_params"):
        slater.mlp_slater_laplacian({"w1": params["w1"]}, jnp.ones((4, 3)))
    with pytest.raises(TypeError, match="floating-point"):
        slater.mlp_slater_laplacian(params, jnp.ones((4, 3), jnp.int32))


def test_sample_walkers_targets_psi_squared():
    # log|psi| = -a|x|^2/2 per coordinate: |psi|^2 is a Gaussian of variance 1/(2a)
    a = 2.0

    def log_psi(p, x):
        return -0.5 * p * jnp.sum(x * x)

    walkers = jnp.zeros((256, 2, 3), jnp.float32)
    out, acc = slater.sample_walkers(log_psi, a, walkers, jax.random.key(0), steps=400, step_size=0.5)
    assert out.shape == walkers.shape and out.dtype == walkers.dtype
    assert 0.2 < float(acc) < 0.95
    np.testing.assert_allclose(float(jnp.var(out)), 1.0 / (2 * a), rtol=0.1)
    np.testing.assert_allclose(float(jnp.mean(out)), 0.0, atol=0.05)


def test_sample_walkers_moves_walkers_away_from_nodes():
    n = 8
    params = slater.init_params(jax.random.key(n), n, hidden=2 * n)
    start = 1.5 * jax.random.normal(jax.random.key(1), (16, n, 3), jnp.float32)
    end, acc = slater.sample_walkers(slater.mlp_log_psi, params, start, jax.random.key(2), steps=300, step_size=0.2)
    assert 0.05 < float(acc) < 1.0
    logpsi = jax.vmap(slater.mlp_log_psi, in_axes=(None, 0))
    # sampling from |psi|^2 raises the typical log|psi| (fewer walkers in low-density regions)
    assert float(jnp.median(logpsi(params, end))) > float(jnp.median(logpsi(params, start)))


def test_sample_walkers_rejects_bad_input():
    params = slater.init_params(jax.random.key(0), 2, hidden=4)
    w = jnp.zeros((4, 2, 3))
    with pytest.raises(ValueError, match=r"walkers must have shape \(batch, n, 3\)"):
        slater.sample_walkers(slater.mlp_log_psi, params, jnp.zeros((4, 6)), jax.random.key(0), steps=1, step_size=0.1)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        slater.sample_walkers(slater.mlp_log_psi, params, w, jax.random.key(0), steps=0, step_size=0.1)
    with pytest.raises(ValueError, match="step_size must be a positive number"):
        slater.sample_walkers(slater.mlp_log_psi, params, w, jax.random.key(0), steps=1, step_size=-1.0)
    with pytest.raises(TypeError, match="floating-point"):
        slater.sample_walkers(slater.mlp_log_psi, params, w.astype(jnp.int32), jax.random.key(0), steps=1,
                              step_size=0.1)


def test_orbital_derivatives_against_jacfwd_and_hessian():
    with jax.enable_x64(True):
        params, pos = _problem(4, 6, 7)
        orb = functools.partial(slater.mlp_orbitals, params)
        phi, dphi, lphi = jax.jit(lambda x: slater.orbital_derivatives(orb, x))(pos)
        assert phi.shape == (4, 4) and dphi.shape == (4, 4, 3) and lphi.shape == (4, 4)
        np.testing.assert_allclose(np.asarray(phi), np.asarray(jax.vmap(orb)(pos)), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(dphi), np.asarray(jax.vmap(jax.jacfwd(orb))(pos)), rtol=1e-12)
        hess = jax.vmap(jax.hessian(orb))(pos)  # (n electrons, n orbitals, 3, 3)
        np.testing.assert_allclose(np.asarray(lphi), np.asarray(jnp.trace(hess, axis1=2, axis2=3)), rtol=1e-11)


def test_row_formula_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"expected shapes \(n, n\), \(n, n, 3\), \(n, n\)"):
        slater.row_formula(jnp.eye(3), jnp.zeros((3, 3)), jnp.zeros((3, 3)))
