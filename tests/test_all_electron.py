"""The all-electron models (FermiNet-like, PsiFormer-like) through the forward
Laplacian, against the float64 Hessian trace: plain, under jit, vmapped over walkers,
and the parameter gradient of the kinetic energy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from references import hessian_trace  # tests/references.py

from beyondgrad import all_electron
from beyondgrad import forward_laplacian as fl

MODELS = {
    "ferminet": (all_electron.init_ferminet, all_electron.ferminet_log_psi),
    "psiformer": (all_electron.init_psiformer, all_electron.psiformer_log_psi),
}


def _setup(name, n=5):
    init, log_psi = MODELS[name]
    params = init(jax.random.key(3), n, width=8, layers=2, dtype=jnp.float64)
    walkers = jax.random.normal(jax.random.key(4), (2, 3 * n), jnp.float64)
    return params, log_psi, walkers, n


def _kinetic_fl(log_psi, params, x, n, particles=None):
    f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
    _, jac, lap = fl.forward_laplacian(f, x, particles=particles)
    return -0.5 * (lap + jnp.sum(jac * jac))


def _kinetic_hessian(log_psi, params, x, n):
    f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
    return -0.5 * (hessian_trace(f, x) + jnp.sum(jax.grad(f)(x) ** 2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_laplacian_matches_the_hessian_trace(name):
    with jax.enable_x64(True):
        params, log_psi, walkers, n = _setup(name)
        f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
        for x in walkers[:2]:
            value, jac, lap = fl.forward_laplacian(f, x)
            np.testing.assert_allclose(float(value), float(f(x)), rtol=1e-13)
            np.testing.assert_allclose(
                np.asarray(jac), np.asarray(jax.grad(f)(x)), rtol=1e-11, atol=1e-12
            )
            want = hessian_trace(f, x)
            assert abs(float(want)) > 1.0
            np.testing.assert_allclose(float(lap), float(want), rtol=1e-11)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_jit_vmap_over_walkers_and_parameter_gradient(name):
    """The kinetic energy and its parameter gradient under jit and vmap, dense and with
    particle sparsity (``particles=n``), against one float64 Hessian reference."""
    with jax.enable_x64(True):
        params, log_psi, walkers, n = _setup(name)
        want = jax.jit(jax.vmap(lambda x: _kinetic_hessian(log_psi, params, x, n)))(
            walkers
        )

        def mean_kinetic(kinetic, **kw):
            return lambda p: jnp.mean(
                jax.vmap(lambda x: kinetic(log_psi, p, x, n, **kw))(walkers)
            )

        g_h = jax.jit(jax.grad(mean_kinetic(_kinetic_hessian)))(params)
        flat_h = jax.tree.leaves(g_h)
        scale = max(float(jnp.max(jnp.abs(b))) for b in flat_h)
        assert len(flat_h) > 5 and scale > 0.1
        # float64 rounding of lap + |grad|^2: measured up to 1.8e-11 (psiformer, sparse)
        for particles, rtol in ((None, 1e-11), (n, 1e-10)):
            got = jax.jit(
                jax.vmap(lambda x, pt=particles: _kinetic_fl(log_psi, params, x, n, pt))
            )(walkers)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol)
            g_fl = jax.jit(jax.grad(mean_kinetic(_kinetic_fl, particles=particles)))(
                params
            )
            flat_fl = jax.tree.leaves(g_fl)
            assert len(flat_fl) == len(flat_h)
            for a, b in zip(
                flat_fl, flat_h
            ):  # float64 rounding, relative to the largest
                np.testing.assert_allclose(
                    np.asarray(a), np.asarray(b), atol=1e-10 * scale
                )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_are_antisymmetric_under_same_spin_exchange(name):
    with jax.enable_x64(True):
        params, log_psi, walkers, n = _setup(name)
        pos = walkers[0].reshape(n, 3)
        swapped = pos.at[jnp.array([0, 1])].set(pos[jnp.array([1, 0])])
        np.testing.assert_allclose(
            float(log_psi(params, pos)), float(log_psi(params, swapped)), rtol=1e-12
        )


def test_bad_input_gets_a_clear_error():
    params = all_electron.init_ferminet(jax.random.key(0), 4)
    with pytest.raises(ValueError, match="made for 4 electrons, positions hold 5"):
        all_electron.ferminet_log_psi(params, jnp.ones((5, 3)))
    with pytest.raises(TypeError, match="arguments swapped"):
        all_electron.ferminet_log_psi(jnp.ones((4, 3)), params)
    with pytest.raises(ValueError, match="n_electrons must be at least 2"):
        all_electron.init_psiformer(jax.random.key(0), 1)
    with pytest.raises(ValueError, match="width must be a positive int"):
        all_electron.init_psiformer(jax.random.key(0), 4, width=0)
