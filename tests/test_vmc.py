"""Tests for beyondgrad.vmc's compile cache and size checks (issue 26): a bound method
``model.log_psi`` compiles once, the cache lets the model go, and parameters made for
another number of electrons are reported with both sizes before JAX sees them."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import runtime, vmc, wavefunctions

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax/_src/dispatch.py


@contextlib.contextmanager
def count_compiles() -> Iterator[list[str]]:
    """The XLA compilations that happen inside the block (one entry per program)."""
    events: list[str] = []

    def listener(event: str, duration: float, **kwargs: object) -> None:
        if event == BACKEND_COMPILE:
            events.append(str(kwargs.get("fun_name", "?")))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield events
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


class Model:
    """A wavefunction as users write one: parameters on the instance, a method."""

    def __init__(self, n: int, scale: float = 1.0) -> None:
        self.n = n
        self.scale = scale

    def log_psi(self, params: dict, x: jax.Array) -> jax.Array:
        return self.scale * wavefunctions.mlp_log_psi(params, x)


def _problem(n: int = 2, batch: int = 8):
    params = wavefunctions.init_params(jax.random.key(0), n, hidden=4)
    grid = jnp.arange(batch * n * 3, dtype=jnp.float32).reshape(batch, n, 3)
    return params, 0.4 * jnp.sin(grid)


def test_the_compile_counter_counts():
    """The listener sees a fresh program compile, and nothing for a cached one."""
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
    x = jnp.ones(5)
    with count_compiles() as first:
        f(x).block_until_ready()
    with count_compiles() as second:
        f(x).block_until_ready()
    assert first == ["jit(<lambda>)"] and second == []


def test_bound_method_is_a_new_object_each_access():
    model = Model(2)
    # why a cache keyed on the callable's identity missed every call
    assert model.log_psi is not model.log_psi
    assert model.log_psi == model.log_psi


def test_energy_and_grad_with_a_bound_method_compiles_once():
    model = Model(2)
    params, walkers = _problem()
    with count_compiles() as first:
        e1, g1 = vmc.energy_and_grad(model.log_psi, params, walkers)
    assert len(first) >= 1  # the step was compiled here
    with count_compiles() as second:
        e2, g2 = vmc.energy_and_grad(model.log_psi, params, walkers)
    assert second == [], f"the second call compiled {second}"
    assert float(e1) == float(e2)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the method and the plain function compute the same energy
    e_fn, _ = vmc.energy_and_grad(wavefunctions.mlp_log_psi, params, walkers)
    assert float(e_fn) == float(e1)


def test_two_instances_get_their_own_programs():
    params, walkers = _problem()
    small, large = Model(2, scale=1.0), Model(2, scale=2.0)
    e1, _ = vmc.energy_and_grad(small.log_psi, params, walkers)
    e2, _ = vmc.energy_and_grad(large.log_psi, params, walkers)
    # the programs close over the instance: scale 2 must not reuse scale 1's program
    assert len(vmc._PROGRAMS.programs(small.log_psi)) == 1
    assert len(vmc._PROGRAMS.programs(large.log_psi)) == 1
    assert float(e2) != pytest.approx(float(e1), rel=1e-3)


def test_sample_walkers_with_a_bound_method_compiles_once():
    model = Model(2)
    params, walkers = _problem()
    key = jax.random.key(3)
    opts = {"steps": 3, "step_size": 0.2}
    with count_compiles() as first:
        out1, acc1 = vmc.sample_walkers(model.log_psi, params, walkers, key, **opts)
    assert len(first) >= 1
    with count_compiles() as second:
        out2, acc2 = vmc.sample_walkers(model.log_psi, params, walkers, key, **opts)
    assert second == [], f"the second call compiled {second}"
    np.testing.assert_array_equal(np.asarray(out1), np.asarray(out2))
    assert float(acc1) == float(acc2)


def test_sharded_energy_and_grad_with_a_bound_method_compiles_once():
    model = Model(2)
    params, walkers = _problem()
    mesh = runtime.demo_mesh(4, "data")
    with count_compiles() as first:
        e1, _ = vmc.sharded_energy_and_grad(model.log_psi, params, walkers, mesh)
    assert len(first) >= 1
    with count_compiles() as second:
        e2, _ = vmc.sharded_energy_and_grad(model.log_psi, params, walkers, mesh)
    assert second == [], f"the second call compiled {second}"
    assert float(e1) == float(e2)


def test_the_cache_lets_the_model_go():
    params, walkers = _problem()
    model = Model(2)
    before = len(vmc._PROGRAMS)
    vmc.energy_and_grad(model.log_psi, params, walkers)
    assert len(vmc._PROGRAMS) == before + 1
    dead = weakref.ref(model)
    del model
    gc.collect()
    assert dead() is None, "the cache kept the model (and its programs) alive"
    assert len(vmc._PROGRAMS) == before


def test_a_callable_that_cannot_be_weakly_referenced_still_runs():
    class Slots:
        __slots__ = ()

        def log_psi(self, params: dict, x: jax.Array) -> jax.Array:
            return wavefunctions.mlp_log_psi(params, x)

    params, walkers = _problem()
    e_slots, _ = vmc.energy_and_grad(Slots().log_psi, params, walkers)
    e_fn, _ = vmc.energy_and_grad(wavefunctions.mlp_log_psi, params, walkers)
    assert float(e_slots) == float(e_fn)


# --- sizes that do not match ---------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda p, w: vmc.energy_and_grad(wavefunctions.mlp_log_psi, p, w),
        lambda p, w: vmc.energy_and_grad(Model(4).log_psi, p, w, estimator="direct"),
        lambda p, w: vmc.sample_walkers(
            wavefunctions.mlp_log_psi, p, w, jax.random.key(0), steps=1, step_size=0.1
        ),
        lambda p, w: vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, p, w, runtime.demo_mesh(4, "data")
        ),
        lambda p, w: vmc.local_energy(wavefunctions.mlp_log_psi, p, w[0]),
        lambda p, w: wavefunctions.mlp_log_psi(p, w[0]),
        lambda p, w: wavefunctions.mlp_slater_laplacian(p, w[0]),
    ],
    ids=[
        "energy_and_grad",
        "energy_and_grad-direct-method",
        "sample_walkers",
        "sharded",
        "local_energy",
        "mlp_log_psi",
        "mlp_slater_laplacian",
    ],
)
def test_params_for_4_electrons_with_walkers_of_3(call):
    params = wavefunctions.init_params(jax.random.key(0), 4, hidden=6)
    _, walkers = _problem(n=3, batch=8)
    with pytest.raises(ValueError) as info:
        call(params, walkers)
    message = str(info.value)
    assert "made for 4 electrons" in message and "hold 3 electrons" in message
    assert "init_params(key, 3)" in message


def test_matching_sizes_still_pass_the_check_under_jit_and_vmap():
    params, walkers = _problem(n=3)
    lp = jax.jit(jax.vmap(wavefunctions.mlp_log_psi, in_axes=(None, 0)))(
        params, walkers
    )
    assert lp.shape == (8,) and bool(jnp.all(jnp.isfinite(lp)))


def test_forward_method_runs_with_particle_sparsity_and_matches_loop():
    """method='forward' passes particles=n to the forward Laplacian: the same local
    energy as the Hessian-vector loop, in float64, on the all-electron FermiNet-like
    model, and the program is the sparse one (smaller than the dense engine's)."""
    from beyondgrad import all_electron
    from beyondgrad import laplacian as L

    n = 4
    with jax.enable_x64(True):
        params = all_electron.init_ferminet(
            jax.random.key(0), n, width=8, dtype=jnp.float64
        )
        x = jax.random.normal(jax.random.key(1), (n, 3), jnp.float64)
        got = vmc.local_energy(
            all_electron.ferminet_log_psi, params, x, method="forward"
        )
        want = vmc.local_energy(all_electron.ferminet_log_psi, params, x, method="loop")
        np.testing.assert_allclose(float(got), float(want), rtol=1e-10)
        fn = lambda v: all_electron.ferminet_log_psi(params, v)  # noqa: E731
        sparse = jax.make_jaxpr(
            lambda v: vmc.local_energy(
                all_electron.ferminet_log_psi, params, v, method="forward"
            )
        )(x)
        dense = jax.make_jaxpr(lambda v: L.kinetic_energy(fn, v, method="forward"))(x)

        def shapes(closed):
            return {
                tuple(v.aval.shape)
                for eqn in closed.jaxpr.eqns
                for v in eqn.outvars
                if hasattr(v.aval, "shape")
            }

        # the dense engine carries the pair stream's Jacobian, 3n rows of (n, n, w);
        # with particles it is 3 rows per term
        pair_dense = (3 * n, n, n, 8)  # init_ferminet's pair_width
        assert pair_dense in shapes(dense)
        assert pair_dense not in shapes(sparse) and (3, n, n, 8) in shapes(sparse)
