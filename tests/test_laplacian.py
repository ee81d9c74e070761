"""Tests for beyondgrad.laplacian / beyondgrad.slater against float64 jax.hessian."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, runtime
from beyondgrad import laplacian as L
from beyondgrad import slater

EXACT = ("hessian", "loop", "vmap", "folx")


def quadratic(x):
    a = jnp.arange(1.0, x.shape[0] ** 2 + 1, dtype=x.dtype).reshape(x.shape[0], -1) / x.shape[0] ** 2
    return 0.5 * x @ (a + a.T) @ x


def sin_product(x):
    return jnp.prod(jnp.sin(x)) + jnp.sum(jnp.cos(2.0 * x) * x)


def logsumexp(x):
    return jax.nn.logsumexp(jnp.outer(x, x[::-1]))


def small_mlp(x):
    w = jnp.linspace(-1.0, 1.0, x.shape[0] * 5, dtype=x.dtype).reshape(x.shape[0], 5)
    return jnp.sum(jnp.tanh(x @ w) ** 2) + jnp.exp(-jnp.sum(x * x))


FUNCTIONS = [quadratic, sin_product, logsumexp, small_mlp]


# float32 parameters made once, eagerly (inside a trace, jit may round them differently)
SLATER_PARAMS = jax.tree.map(np.asarray, slater.init_params(jax.random.key(3), 3, hidden=8))


def slater_fn(x, *, n=3):
    params = jax.tree.map(lambda a: jnp.asarray(a, x.dtype), SLATER_PARAMS)
    return slater.mlp_log_psi(params, x.reshape(n, 3))


@pytest.fixture(scope="module")
def mesh():
    return runtime.demo_mesh(4, "data")


def jlap(f, x, method, **kw):
    """laplacian under jit (eager dispatch of every small op is what makes tests slow)."""
    return jax.jit(lambda v: L.laplacian(f, v, method=method, **kw))(x)


def jtrace_hessian(f, x):
    return jax.jit(lambda v: jnp.trace(jax.hessian(f)(v)))(x)


def x64_point(d, seed=0):
    return jax.random.normal(jax.random.key(seed), (d,), jnp.float64)


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("f", FUNCTIONS + [slater_fn], ids=lambda f: getattr(f, "__name__", "f"))
def test_exact_methods_match_float64_hessian(method, f):
    with jax.enable_x64(True):
        x = x64_point(9)
        want = float(jtrace_hessian(f, x))
        g, got = jax.jit(lambda v: L.grad_and_laplacian(f, v, method=method))(x)
        assert got.dtype == jnp.float64 and got.shape == ()
        np.testing.assert_allclose(float(got), want, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(np.asarray(g), np.asarray(jax.jit(jax.grad(f))(x)), rtol=1e-10, atol=1e-12)


def test_float32_close_to_float64():
    x32 = jax.random.normal(jax.random.key(1), (9,), jnp.float32)
    with jax.enable_x64(True):
        want = float(jtrace_hessian(slater_fn, x32.astype(jnp.float64)))
    for method in ("loop", "folx"):
        got = float(jlap(slater_fn, x32, method))
        assert abs(got - want) <= 1e-3 * max(1.0, abs(want)), method


def test_hutchinson_is_unbiased_and_its_samples_average():
    with jax.enable_x64(True):
        x = x64_point(6, seed=2)
        want = float(jnp.trace(jax.hessian(small_mlp)(x)))
        samples = L.hutchinson_samples(small_mlp, x, jax.random.key(0), 4000)
        assert samples.shape == (4000,)
        se = float(jnp.std(samples)) / np.sqrt(4000)
        assert abs(float(jnp.mean(samples)) - want) < 5 * se + 1e-12
        est = L.laplacian(small_mlp, x, method="hutchinson", key=jax.random.key(0), num_samples=4000)
        np.testing.assert_allclose(float(est), float(jnp.mean(samples)), rtol=1e-12)
        # a diagonal Hessian has zero Rademacher variance: every probe gives the exact trace
        diag = L.hutchinson_samples(lambda v: jnp.sum(jnp.sin(v)), x, jax.random.key(1), 8)
        np.testing.assert_allclose(np.asarray(diag), -float(jnp.sum(jnp.sin(x))), rtol=1e-12)


@pytest.mark.parametrize("method", ["loop", "vmap", "folx", "hessian"])
def test_jit_vmap_and_grad_wrt_closed_over_params(method):
    with jax.enable_x64(True):
        xs = jax.random.normal(jax.random.key(0), (3, 6), jnp.float64)

        def f(w, x):
            return jnp.sum(jnp.tanh(w * x) ** 2) + w * jnp.sum(x**3)

        def lap(w, x, m):
            return L.laplacian(functools.partial(f, w), x, method=m)

        batched = jax.jit(jax.vmap(lambda x: lap(0.7, x, method)))(xs)
        ref = jax.vmap(lambda x: lap(0.7, x, "hessian"))(xs)
        np.testing.assert_allclose(np.asarray(batched), np.asarray(ref), rtol=1e-10)
        dw = jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: lap(w, x, method))(xs)))(0.7)
        eps = 1e-6
        fd = (jnp.sum(jax.vmap(lambda x: lap(0.7 + eps, x, "hessian"))(xs))
              - jnp.sum(jax.vmap(lambda x: lap(0.7 - eps, x, "hessian"))(xs))) / (2 * eps)
        np.testing.assert_allclose(float(dw), float(fd), rtol=1e-6)


@pytest.mark.parametrize("method", ["loop", "vmap", "folx", "hessian", "hutchinson"])
def test_inside_shard_map_check_vma(mesh, method):
    xs = jax.random.normal(jax.random.key(0), (8, 6), jnp.float32)
    key = jax.random.key(5)

    def per_shard(w, block):
        lap = jax.vmap(lambda x: L.laplacian(lambda v: jnp.sum(jnp.tanh(w * v) ** 2), x, method=method,
                                             key=key, num_samples=4))(block)
        return lap, jax.lax.psum(jnp.sum(lap), "data")

    def loss(w, xs):
        fn = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P("data"), P()),
                           check_vma=True)
        return fn(w, xs)[1]

    ref_one = jax.vmap(lambda x: L.laplacian(lambda v: jnp.sum(jnp.tanh(0.5 * v) ** 2), x, method=method,
                                             key=key, num_samples=4))(xs)
    total, dw = jax.jit(jax.value_and_grad(loss))(0.5, xs)
    np.testing.assert_allclose(float(total), float(jnp.sum(ref_one)), rtol=1e-4)
    dw_ref = jax.grad(lambda w: jnp.sum(jax.vmap(lambda x: L.laplacian(
        lambda v: jnp.sum(jnp.tanh(w * v) ** 2), x, method=method, key=key, num_samples=4))(xs)))(0.5)
    np.testing.assert_allclose(float(dw), float(dw_ref), rtol=1e-4)


def test_basis_carries_the_varying_axes(mesh):
    seen = {}

    def body(block):
        seen["basis"] = compat.varying_axes(L.basis(block[0]))
        seen["eye"] = compat.varying_axes(jnp.eye(3))
        return jax.lax.psum(jnp.sum(block), "data")

    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=True)(jnp.ones((4, 3)))
    assert seen == {"basis": frozenset({"data"}), "eye": frozenset()}


def test_kinetic_energy_matches_definition():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (3, 3), jnp.float64)
        flat = slater_fn
        g = jax.grad(flat)(x.reshape(-1))
        want = -0.5 * (jnp.trace(jax.hessian(flat)(x.reshape(-1))) + g @ g)
        log_psi = lambda pos: slater_fn(pos.reshape(-1))  # noqa: E731
        for method in ("loop", "folx"):
            got = jax.jit(lambda p, m=method: L.kinetic_energy(log_psi, p, method=m))(x)
            np.testing.assert_allclose(float(got), float(want), rtol=1e-10)


def test_slater_laplacian_matches_hessian_and_grad():
    with jax.enable_x64(True):
        for n in (1, 4):
            params = slater.init_params(jax.random.key(n), n, hidden=6, dtype=jnp.float64)
            orb = functools.partial(slater.mlp_orbitals, params)
            pos = jax.random.normal(jax.random.key(10 + n), (n, 3), jnp.float64)
            flat = lambda v: slater.slater_log_psi(orb, v.reshape(n, 3))  # noqa: E731
            logabs, grad, lap = jax.jit(lambda p: slater.slater_laplacian(orb, p))(pos)
            np.testing.assert_allclose(float(logabs), float(flat(pos.reshape(-1))), rtol=1e-12)
            assert grad.shape == (n, 3)
            np.testing.assert_allclose(np.asarray(grad).ravel(), np.asarray(jax.grad(flat)(pos.reshape(-1))),
                                       rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(float(lap), float(jnp.trace(jax.hessian(flat)(pos.reshape(-1)))),
                                       rtol=1e-9, atol=1e-9)


def test_slater_log_psi_is_log_abs_det_on_a_non_mlp_orbital_set():
    with jax.enable_x64(True):
        def orbitals(r):  # polynomial times Gaussian: 1, x, y, z
            return jnp.concatenate([jnp.ones(1), r]) * jnp.exp(-0.5 * r @ r)

        pos = jax.random.normal(jax.random.key(4), (4, 3), jnp.float64)
        a = np.stack([np.asarray(orbitals(r)) for r in pos])
        np.testing.assert_allclose(float(slater.slater_log_psi(orbitals, pos)), np.log(abs(np.linalg.det(a))),
                                   rtol=1e-12)
        flat = lambda v: slater.slater_log_psi(orbitals, v.reshape(4, 3))  # noqa: E731
        lap = jax.jit(lambda p: slater.slater_laplacian(orbitals, p)[2])(pos)
        np.testing.assert_allclose(float(lap), float(jtrace_hessian(flat, pos.reshape(-1))), rtol=1e-9)


def test_potential_energy_by_hand():
    pos = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    want = 0.5 * 4.0 * (1.0 + 4.0) + 1.0 + 0.5 + 1.0 / np.sqrt(5.0)
    np.testing.assert_allclose(float(slater.potential_energy(pos, omega=2.0)), want, rtol=1e-6)


def _walkers(b, n, dtype):
    return jax.random.normal(jax.random.key(7), (b, n, 3), dtype)


def test_energy_and_grad_vmc_estimator_by_hand():
    with jax.enable_x64(True):
        n = 3
        params = slater.init_params(jax.random.key(0), n, hidden=6, dtype=jnp.float64)
        walkers = _walkers(8, n, jnp.float64)
        energy, grad = slater.energy_and_grad(slater.wavefunction, params, walkers, method="loop")
        e_l = jax.jit(jax.vmap(lambda w: slater.local_energy(slater.wavefunction, params, w, method="hessian")))(walkers)
        np.testing.assert_allclose(float(energy), float(jnp.mean(e_l)), rtol=1e-10)
        grads = jax.jit(jax.vmap(jax.grad(slater.wavefunction), in_axes=(None, 0)))(params, walkers)
        per_walker = [jax.tree.map(lambda a, i=i: a[i], grads) for i in range(8)]
        want = jax.tree.map(lambda *gs: 2 * sum((e - jnp.mean(e_l)) * g for e, g in zip(e_l, gs)) / 8, *per_walker)
        for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10)
        # the direct estimator differentiates the mean local energy: check one entry by differences
        _, direct = slater.energy_and_grad(slater.wavefunction, params, walkers, method="vmap", estimator="direct")
        eps = 1e-6

        def mean_e(b2):
            p = dict(params, b2=b2)
            return slater.energy_and_grad(slater.wavefunction, p, walkers, method="hessian")[0]

        bump = jnp.zeros(n).at[1].set(eps)
        fd = (mean_e(params["b2"] + bump) - mean_e(params["b2"] - bump)) / (2 * eps)
        np.testing.assert_allclose(float(direct["b2"][1]), float(fd), rtol=1e-5)


@pytest.mark.parametrize("estimator", ["vmc", "direct"])
@pytest.mark.parametrize("method", ["loop", "folx"])
def test_sharded_matches_single_device(mesh, method, estimator):
    with jax.enable_x64(True):
        n = 3
        params = slater.init_params(jax.random.key(1), n, hidden=6, dtype=jnp.float64)
        walkers = _walkers(8, n, jnp.float64)
        e1, g1 = slater.energy_and_grad(slater.wavefunction, params, walkers, method=method, estimator=estimator)
        e2, g2 = slater.sharded_energy_and_grad(slater.wavefunction, params, walkers, mesh, method=method,
                                           estimator=estimator)
        np.testing.assert_allclose(float(e2), float(e1), rtol=1e-12)
        for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)


# --- bad input ------------------------------------------------------------------------


def test_laplacian_rejects_bad_input():
    x = jnp.ones(3)
    with pytest.raises(ValueError, match="unknown Laplacian method 'trace'"):
        L.laplacian(jnp.sum, x, method="trace")
    with pytest.raises(ValueError, match="x must be a 1-D array"):
        L.laplacian(jnp.sum, jnp.ones((2, 3)), method="loop")
    with pytest.raises(ValueError, match="f must return a scalar"):
        L.laplacian(lambda v: v * 2, x, method="loop")
    with pytest.raises(ValueError, match="needs a PRNG key"):
        L.laplacian(jnp.sum, x, method="hutchinson")
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        L.laplacian(jnp.sum, x, method="hutchinson", key=jax.random.key(0), num_samples=0)
    with pytest.raises(TypeError, match="floating-point"):
        L.laplacian(jnp.sum, jnp.arange(3), method="loop")
    with pytest.raises(TypeError, match="f must be a function"):
        L.laplacian(3.0, x, method="loop")


def test_slater_rejects_bad_input():
    orb = lambda r: jnp.concatenate([jnp.ones(1), r])  # noqa: E731  4 orbitals
    with pytest.raises(ValueError, match=r"positions must have shape \(n, 3\)"):
        slater.slater_laplacian(orb, jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"positions must have shape \(n, 3\)"):
        slater.slater_log_psi(orb, jnp.ones(12))
    with pytest.raises(ValueError, match="orbitals must map one position"):
        slater.slater_log_psi(orb, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="n_electrons must be a positive int"):
        slater.init_params(jax.random.key(0), 0)


def test_energy_and_grad_rejects_bad_input(mesh):
    params = slater.init_params(jax.random.key(0), 2, hidden=4)
    with pytest.raises(ValueError, match=r"walkers must have shape \(batch, n, 3\)"):
        slater.energy_and_grad(slater.wavefunction, params, jnp.ones((4, 6)))
    with pytest.raises(ValueError, match="estimator must be"):
        slater.energy_and_grad(slater.wavefunction, params, jnp.ones((4, 2, 3)), estimator="mean")
    with pytest.raises(ValueError, match="unknown Laplacian method"):
        slater.energy_and_grad(slater.wavefunction, params, jnp.ones((4, 2, 3)), method="jet")
    with pytest.raises(ValueError, match="must be divisible"):
        slater.sharded_energy_and_grad(slater.wavefunction, params, jnp.ones((6, 2, 3)), mesh)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        slater.sharded_energy_and_grad(slater.wavefunction, params, jnp.ones((8, 2, 3)), mesh, axis_name="batch")


# --- widget callback and exercise checkers ----------------------------------------------

PROFILE = {
    2: {"probe_seconds": 1e-4, "sample_variance": 16.0, "exact_seconds": 6e-4, "laplacian": -8.0},
    4: {"probe_seconds": 2e-4, "sample_variance": 100.0, "exact_seconds": 2.4e-3, "laplacian": -50.0},
}


@pytest.mark.parametrize("n,s", [(2, 1), (2, 6), (4, 4), (4, 100)])
def test_hutchinson_tradeoff_values(n, s):
    t = L.hutchinson_tradeoff(PROFILE, n, s)
    p = PROFILE[n]
    assert t["cost_seconds"] == pytest.approx(s * p["probe_seconds"])
    assert t["std_error"] == pytest.approx(np.sqrt(p["sample_variance"] / s))
    assert t["relative_error"] == pytest.approx(t["std_error"] / abs(p["laplacian"]))
    assert t["cost_vs_exact"] == pytest.approx(s * p["probe_seconds"] / p["exact_seconds"])
    assert t["probes_for_exact_cost"] == pytest.approx(3 * n)  # the profile above has exact = 3n probes
    text = L.describe_tradeoff(PROFILE, n, s)
    assert f"n = {n} electrons" in text and f"S = {s} probes" in text


def test_hutchinson_tradeoff_error_falls_and_cost_rises():
    rows = [L.hutchinson_tradeoff(PROFILE, 4, s) for s in (1, 4, 16, 64)]
    assert all(a["std_error"] > b["std_error"] for a, b in zip(rows, rows[1:]))
    assert all(a["cost_seconds"] < b["cost_seconds"] for a, b in zip(rows, rows[1:]))
    with pytest.raises(ValueError, match="no measurements for n = 8"):
        L.hutchinson_tradeoff(PROFILE, 8, 4)
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        L.hutchinson_tradeoff(PROFILE, 4, 0)


def test_plot_tradeoff_draws_one_panel_per_size():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = L.plot_tradeoff(PROFILE, [1, 4, 16])
    assert len(axes) == 2 and axes[0].get_title() == "n = 2 (d = 6)"
    assert len(axes[0].get_lines()) == 1
    plt.close("all")


def test_time_call():
    compile_s, median = L.time_call(jax.jit(lambda v: v * 2), jnp.ones(3), repeats=3)
    assert compile_s >= 0 and median > 0
    with pytest.raises(ValueError, match="repeats"):
        L.time_call(jnp.sin, 1.0, repeats=0)


def _loop_solution(f, x):
    g, hvp = jax.linearize(jax.grad(f), x)
    eye = jnp.eye(x.shape[0], dtype=x.dtype)
    return jax.lax.fori_loop(0, x.shape[0], lambda i, acc: acc + hvp(eye[i])[i], jnp.zeros_like(g[0]))


def test_check_loop_laplacian():
    assert L.check_loop_laplacian(_loop_solution, strict=True)
    wrong = L.check_loop_laplacian(lambda f, x: jnp.sum(jax.grad(f)(x)))
    assert not wrong and "differs" in str(wrong)
    stub = L.check_loop_laplacian(lambda f, x: (_ for _ in ()).throw(NotImplementedError))
    assert not stub and "stub" in str(stub)


def test_check_row_update_second_derivative():
    def right(a, i, u):
        return -(u @ jnp.linalg.solve(a, jnp.eye(a.shape[0])[:, i])) ** 2

    assert L.check_row_update_second_derivative(right, strict=True)
    wrong = L.check_row_update_second_derivative(lambda a, i, u: (u @ jnp.linalg.solve(a, jnp.eye(a.shape[0])[:, i])) ** 2)
    assert not wrong


def test_check_sharded_kinetic():
    def fixed(log_psi, x):
        f = lambda v: log_psi(v.reshape(x.shape))  # noqa: E731
        g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
        eye = L.basis(g)
        lap = jax.lax.fori_loop(0, g.shape[0], lambda i, acc: acc + hvp(eye[i])[i], jnp.zeros_like(g[0]))
        return -0.5 * (lap + g @ g)

    def broken(log_psi, x):
        f = lambda v: log_psi(v.reshape(x.shape))  # noqa: E731
        g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
        eye = jnp.eye(g.shape[0], dtype=g.dtype)
        lap = jax.lax.fori_loop(0, g.shape[0], lambda i, acc: acc + hvp(eye[i])[i], jnp.zeros_like(g[0]))
        return -0.5 * (lap + g @ g)

    assert L.check_sharded_kinetic(fixed, strict=True)
    bad = L.check_sharded_kinetic(broken)
    assert not bad and "ValueError" in str(bad)
