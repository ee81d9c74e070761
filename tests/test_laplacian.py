"""Tests for beyondgrad.laplacian / beyondgrad.slater against float64 jax.hessian."""

import functools
import gc
import warnings
import weakref

import folx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from references import hessian_trace  # tests/references.py

from beyondgrad import compat, runtime, slater, vmc, wavefunctions
from beyondgrad import laplacian as L

EXACT = ("hessian", "loop", "vmap", "folx", "forward")


def quadratic(x):
    a = (
        jnp.arange(1.0, x.shape[0] ** 2 + 1, dtype=x.dtype).reshape(x.shape[0], -1)
        / x.shape[0] ** 2
    )
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
SLATER_PARAMS = jax.tree.map(
    np.asarray, wavefunctions.init_params(jax.random.key(3), 3, hidden=8)
)


def slater_fn(x, *, n=3):
    params = jax.tree.map(lambda a: jnp.asarray(a, x.dtype), SLATER_PARAMS)
    return wavefunctions.mlp_log_psi(params, x.reshape(n, 3))


@pytest.fixture(scope="module")
def mesh():
    return runtime.demo_mesh(4, "data")


def jlap(f, x, method, **kw):
    """laplacian under jit (eager dispatch of every small op is what makes tests slow)."""
    return jax.jit(lambda v: L.laplacian(f, v, method=method, **kw))(x)


def jtrace_hessian(f, x):
    return jax.jit(lambda v: hessian_trace(f, v))(x)


def x64_point(d, seed=0):
    return jax.random.normal(jax.random.key(seed), (d,), jnp.float64)


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize(
    "f", FUNCTIONS + [slater_fn], ids=lambda f: getattr(f, "__name__", "f")
)
def test_exact_methods_match_float64_hessian(method, f):
    with jax.enable_x64(True):
        x = x64_point(9)
        want = float(jtrace_hessian(f, x))
        g, got = jax.jit(lambda v: L.grad_and_laplacian(f, v, method=method))(x)
        assert got.dtype == jnp.float64 and got.shape == ()
        np.testing.assert_allclose(float(got), want, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(jax.jit(jax.grad(f))(x)), rtol=1e-10, atol=1e-12
        )


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
        want = float(hessian_trace(small_mlp, x))
        samples = L.hutchinson_samples(small_mlp, x, jax.random.key(0), 4000)
        assert samples.shape == (4000,)
        se = float(jnp.std(samples)) / np.sqrt(4000)
        assert abs(float(jnp.mean(samples)) - want) < 5 * se + 1e-12
        est = L.laplacian(
            small_mlp, x, method="hutchinson", key=jax.random.key(0), num_samples=4000
        )
        np.testing.assert_allclose(float(est), float(jnp.mean(samples)), rtol=1e-12)
        # a diagonal Hessian has zero Rademacher variance: every probe gives the exact trace
        diag = L.hutchinson_samples(
            lambda v: jnp.sum(jnp.sin(v)), x, jax.random.key(1), 8
        )
        np.testing.assert_allclose(
            np.asarray(diag), -float(jnp.sum(jnp.sin(x))), rtol=1e-12
        )


@pytest.mark.parametrize("method", ["loop", "vmap", "folx", "forward", "hessian"])
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
        fd = (
            jnp.sum(jax.vmap(lambda x: lap(0.7 + eps, x, "hessian"))(xs))
            - jnp.sum(jax.vmap(lambda x: lap(0.7 - eps, x, "hessian"))(xs))
        ) / (2 * eps)
        np.testing.assert_allclose(float(dw), float(fd), rtol=1e-6)


@pytest.mark.parametrize(
    "method", ["loop", "vmap", "folx", "forward", "hessian", "hutchinson"]
)
def test_inside_shard_map_check_vma(mesh, method):
    xs = jax.random.normal(jax.random.key(0), (8, 6), jnp.float32)
    # the key and the probe count apply to "hutchinson" only (an error elsewhere)
    opts = (
        {"key": jax.random.key(5), "num_samples": 4} if method == "hutchinson" else {}
    )

    def per_shard(w, block):
        lap = jax.vmap(
            lambda x: L.laplacian(
                lambda v: jnp.sum(jnp.tanh(w * v) ** 2),
                x,
                method=method,
                **opts,
            )
        )(block)
        return lap, jax.lax.psum(jnp.sum(lap), "data")

    def loss(w, xs):
        fn = jax.shard_map(
            per_shard,
            mesh=mesh,
            in_specs=(P(), P("data")),
            out_specs=(P("data"), P()),
            check_vma=True,
        )
        return fn(w, xs)[1]

    ref_one = jax.vmap(
        lambda x: L.laplacian(
            lambda v: jnp.sum(jnp.tanh(0.5 * v) ** 2),
            x,
            method=method,
            **opts,
        )
    )(xs)
    total, dw = jax.jit(jax.value_and_grad(loss))(0.5, xs)
    np.testing.assert_allclose(float(total), float(jnp.sum(ref_one)), rtol=1e-4)
    dw_ref = jax.grad(
        lambda w: jnp.sum(
            jax.vmap(
                lambda x: L.laplacian(
                    lambda v: jnp.sum(jnp.tanh(w * v) ** 2),
                    x,
                    method=method,
                    **opts,
                )
            )(xs)
        )
    )(0.5)
    np.testing.assert_allclose(float(dw), float(dw_ref), rtol=1e-4)


def test_basis_carries_the_varying_axes(mesh):
    seen = {}

    def body(block):
        seen["basis"] = compat.varying_axes(L.basis(block[0]))
        seen["eye"] = compat.varying_axes(jnp.eye(3))
        return jax.lax.psum(jnp.sum(block), "data")

    jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=True)(
        jnp.ones((4, 3))
    )
    assert seen == {"basis": frozenset({"data"}), "eye": frozenset()}


def test_kinetic_energy_matches_definition():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (3, 3), jnp.float64)
        flat = slater_fn
        g = jax.grad(flat)(x.reshape(-1))
        want = -0.5 * (hessian_trace(flat, x.reshape(-1)) + g @ g)
        log_psi = lambda pos: slater_fn(pos.reshape(-1))  # noqa: E731
        for method in ("loop", "folx"):
            got = jax.jit(lambda p, m=method: L.kinetic_energy(log_psi, p, method=m))(x)
            np.testing.assert_allclose(float(got), float(want), rtol=1e-10)


def test_slater_laplacian_matches_hessian_and_grad():
    with jax.enable_x64(True):
        for n in (1, 4):
            params = wavefunctions.init_params(
                jax.random.key(n), n, hidden=6, dtype=jnp.float64
            )
            orb = functools.partial(wavefunctions.mlp_orbitals, params)
            pos = jax.random.normal(jax.random.key(10 + n), (n, 3), jnp.float64)
            flat = lambda v, orb=orb, n=n: slater.slater_log_psi(orb, v.reshape(n, 3))  # noqa: E731
            logabs, grad, lap = jax.jit(
                lambda p, orb=orb: slater.slater_laplacian(orb, p)
            )(pos)
            np.testing.assert_allclose(
                float(logabs), float(flat(pos.reshape(-1))), rtol=1e-12
            )
            assert grad.shape == (n, 3)
            np.testing.assert_allclose(
                np.asarray(grad).ravel(),
                np.asarray(jax.grad(flat)(pos.reshape(-1))),
                rtol=1e-9,
                atol=1e-10,
            )
            np.testing.assert_allclose(
                float(lap),
                float(hessian_trace(flat, pos.reshape(-1))),
                rtol=1e-9,
                atol=1e-9,
            )


def test_slater_log_psi_is_log_abs_det_on_a_non_mlp_orbital_set():
    with jax.enable_x64(True):

        def orbitals(r):  # polynomial times Gaussian: 1, x, y, z
            return jnp.concatenate([jnp.ones(1), r]) * jnp.exp(-0.5 * r @ r)

        pos = jax.random.normal(jax.random.key(4), (4, 3), jnp.float64)
        a = np.stack([np.asarray(orbitals(r)) for r in pos])
        np.testing.assert_allclose(
            float(slater.slater_log_psi(orbitals, pos)),
            np.log(abs(np.linalg.det(a))),
            rtol=1e-12,
        )
        flat = lambda v: slater.slater_log_psi(orbitals, v.reshape(4, 3))  # noqa: E731
        lap = jax.jit(lambda p: slater.slater_laplacian(orbitals, p)[2])(pos)
        np.testing.assert_allclose(
            float(lap), float(jtrace_hessian(flat, pos.reshape(-1))), rtol=1e-9
        )


def test_potential_energy_by_hand():
    pos = jnp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    want = 0.5 * 4.0 * (1.0 + 4.0) + 1.0 + 0.5 + 1.0 / np.sqrt(5.0)
    np.testing.assert_allclose(
        float(vmc.potential_energy(pos, omega=2.0)), want, rtol=1e-6
    )


def _walkers(b, n, dtype):
    return jax.random.normal(jax.random.key(7), (b, n, 3), dtype)


def test_energy_and_grad_vmc_estimator_by_hand():
    with jax.enable_x64(True):
        n = 3
        params = wavefunctions.init_params(
            jax.random.key(0), n, hidden=6, dtype=jnp.float64
        )
        walkers = _walkers(8, n, jnp.float64)
        energy, grad = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, params, walkers, method="loop"
        )
        e_l = jax.jit(
            jax.vmap(
                lambda w: vmc.local_energy(
                    wavefunctions.mlp_log_psi, params, w, method="hessian"
                )
            )
        )(walkers)
        np.testing.assert_allclose(float(energy), float(jnp.mean(e_l)), rtol=1e-10)
        grads = jax.jit(
            jax.vmap(jax.grad(wavefunctions.mlp_log_psi), in_axes=(None, 0))
        )(params, walkers)
        per_walker = [jax.tree.map(lambda a, i=i: a[i], grads) for i in range(8)]
        want = jax.tree.map(
            lambda *gs: 2 * sum((e - jnp.mean(e_l)) * g for e, g in zip(e_l, gs)) / 8,
            *per_walker,
        )
        for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(want)):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10
            )
        # the direct estimator differentiates the mean local energy: check one entry by differences
        _, direct = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi,
            params,
            walkers,
            method="vmap",
            estimator="direct",
        )
        eps = 1e-6

        def mean_e(b2):
            p = dict(params, b2=b2)
            return vmc.energy_and_grad(
                wavefunctions.mlp_log_psi, p, walkers, method="hessian"
            )[0]

        bump = jnp.zeros(n).at[1].set(eps)
        fd = (mean_e(params["b2"] + bump) - mean_e(params["b2"] - bump)) / (2 * eps)
        np.testing.assert_allclose(float(direct["b2"][1]), float(fd), rtol=1e-5)


@pytest.mark.parametrize("estimator", ["vmc", "direct"])
@pytest.mark.parametrize("method", ["loop", "folx"])
def test_sharded_matches_single_device(mesh, method, estimator):
    with jax.enable_x64(True):
        n = 3
        params = wavefunctions.init_params(
            jax.random.key(1), n, hidden=6, dtype=jnp.float64
        )
        walkers = _walkers(8, n, jnp.float64)
        e1, g1 = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi,
            params,
            walkers,
            method=method,
            estimator=estimator,
        )
        e2, g2 = vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi,
            params,
            walkers,
            mesh,
            method=method,
            estimator=estimator,
        )
        np.testing.assert_allclose(float(e2), float(e1), rtol=1e-12)
        for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11
            )


# --- folx: one forward pass, no separate gradient pass ---------------------------------


def _primitive_counts(jaxpr) -> dict[str, int]:
    """Primitive name -> count over a jaxpr and every sub-jaxpr (pjit, loops, custom rules)."""
    counts: dict[str, int] = {}

    def subjaxprs(value):
        if isinstance(value, (tuple, list)):
            for v in value:
                yield from subjaxprs(v)
        elif hasattr(value, "eqns"):  # a Jaxpr
            yield value
        elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # a ClosedJaxpr
            yield value.jaxpr

    def visit(j):
        for eqn in j.eqns:
            counts[eqn.primitive.name] = counts.get(eqn.primitive.name, 0) + 1
            for value in eqn.params.values():
                for sub in subjaxprs(value):
                    visit(sub)

    visit(jaxpr.jaxpr)
    return counts


@pytest.mark.parametrize("f", [small_mlp, slater_fn], ids=["small_mlp", "slater"])
def test_folx_method_is_folx_alone_without_a_gradient_pass(f):
    x = jax.random.normal(jax.random.key(0), (9,), jnp.float32)

    def folx_alone(v):
        out = folx.forward_laplacian(f)(v)
        return out.jacobian.dense_array, out.laplacian

    def old_way(v):  # folx's Laplacian plus a separate reverse-mode gradient
        return jax.grad(f)(v), folx.forward_laplacian(f)(v).laplacian

    ours = _primitive_counts(
        jax.make_jaxpr(lambda v: L.grad_and_laplacian(f, v, method="folx"))(x)
    )
    alone = _primitive_counts(jax.make_jaxpr(folx_alone)(x))
    old = _primitive_counts(jax.make_jaxpr(old_way)(x))
    # the same program as folx called directly: the gradient is folx's own Jacobian ...
    assert ours == alone
    # ... and the criterion sees a separate gradient pass (it adds primitives)
    assert sum(old.values()) > sum(alone.values())
    g, lap = jax.jit(lambda v: L.grad_and_laplacian(f, v, method="folx"))(x)
    np.testing.assert_allclose(
        np.asarray(g), np.asarray(jax.grad(f)(x)), rtol=2e-5, atol=2e-6
    )


# --- Hutchinson: one key per walker and per shard ------------------------------------------


def test_walker_keys_differ_and_follow_the_global_index():
    keys = vmc.walker_keys(jax.random.key(0), 4, first=2)
    data = np.asarray(jax.random.key_data(keys))
    assert len({tuple(row) for row in data}) == 4
    want = np.asarray(jax.random.key_data(jax.random.fold_in(jax.random.key(0), 5)))
    np.testing.assert_array_equal(data[3], want)


def test_hutchinson_noise_averages_down_with_the_batch():
    # B copies of one point: with one key per walker the batch mean's error is about
    # s / sqrt(B) (s: spread of one walker's estimate); with a key shared by all walkers
    # it would stay the error of one walker (about s), whatever B.
    with jax.enable_x64(True):
        n, batch = 2, 1024
        params = wavefunctions.init_params(
            jax.random.key(3), n, hidden=4, dtype=jnp.float64
        )
        x = jax.random.normal(jax.random.key(4), (n, 3), jnp.float64)
        walkers = jnp.broadcast_to(x, (batch, n, 3))
        key = jax.random.key(11)
        exact = float(
            vmc.local_energy(wavefunctions.mlp_log_psi, params, x, method="hessian")
        )
        mean, _ = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, params, walkers, method="hutchinson", key=key
        )
        per_walker = jax.jit(
            jax.vmap(
                lambda k: vmc.local_energy(
                    wavefunctions.mlp_log_psi, params, x, method="hutchinson", key=k
                )
            )
        )(vmc.walker_keys(key, batch))
        s = float(jnp.std(per_walker))
        assert s > 1e-3 * abs(exact)  # the estimates do differ between walkers
        np.testing.assert_allclose(float(mean), float(jnp.mean(per_walker)), rtol=1e-12)
        assert abs(float(mean) - exact) < 4 * s / np.sqrt(batch)  # 4 standard errors
        shared = float(
            vmc.local_energy(
                wavefunctions.mlp_log_psi, params, x, method="hutchinson", key=key
            )
        )
        assert shared != pytest.approx(
            float(mean), rel=1e-6
        )  # a shared key would give this


# --- caches of compiled steps: no leaks, any callable ---------------------------------------


def test_compiled_steps_do_not_keep_the_wavefunction_alive():
    with jax.enable_x64(True):
        params = wavefunctions.init_params(
            jax.random.key(0), 2, hidden=4, dtype=jnp.float64
        )
        log_psi = functools.partial(
            wavefunctions.mlp_log_psi
        )  # a fresh callable object
        walkers = _walkers(4, 2, jnp.float64)
        before = len(vmc._PROGRAMS)
        vmc.energy_and_grad(log_psi, params, walkers)
        assert len(vmc._PROGRAMS) == before + 1
        dead = weakref.ref(log_psi)
        del log_psi
        gc.collect()
        assert dead() is None, (
            "the cache kept the wavefunction (and its compiled programs) alive"
        )
        assert len(vmc._PROGRAMS) == before


class EqualByValue:
    """A callable that defines __eq__ but not __hash__ (so it is unhashable)."""

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, EqualByValue) and other.scale == self.scale

    def __call__(self, params, x):
        return self.scale * wavefunctions.mlp_log_psi(params, x)


def test_unhashable_callables_work_and_are_compiled_once():
    with pytest.raises(TypeError):
        hash(EqualByValue(1.0))
    with jax.enable_x64(True):
        params = wavefunctions.init_params(
            jax.random.key(0), 2, hidden=4, dtype=jnp.float64
        )
        walkers = _walkers(4, 2, jnp.float64)
        fn = EqualByValue(1.0)
        e1, _ = vmc.energy_and_grad(fn, params, walkers)
        e2, _ = vmc.energy_and_grad(wavefunctions.mlp_log_psi, params, walkers)
        np.testing.assert_allclose(float(e1), float(e2), rtol=1e-12)
        programs = dict(vmc._PROGRAMS.programs(fn))
        assert len(programs) == 1
        vmc.energy_and_grad(fn, params, walkers)
        assert vmc._PROGRAMS.programs(fn) == programs  # reused, not rebuilt
        out, _ = vmc.sample_walkers(
            fn, params, walkers, jax.random.key(0), steps=2, step_size=0.1
        )
        assert out.shape == walkers.shape


# --- meshes as users make them ---------------------------------------------------------------


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit", "default"])
@pytest.mark.parametrize("method", ["loop", "hutchinson"])
def test_sharded_step_with_jax_make_mesh_and_plain_arrays(axis_type, method):
    with jax.enable_x64(True):
        n = 3
        params = wavefunctions.init_params(
            jax.random.key(1), n, hidden=6, dtype=jnp.float64
        )
        walkers = np.asarray(_walkers(8, n, jnp.float64))  # plain, unsharded
        if axis_type == "default":
            import warnings

            with warnings.catch_warnings():  # 0.8.x warns that the default will change
                warnings.simplefilter("ignore", DeprecationWarning)
                mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
        else:
            kind = getattr(jax.sharding.AxisType, axis_type)
            mesh = jax.make_mesh(
                (4,), ("data",), axis_types=(kind,), devices=jax.devices()[:4]
            )
        key = jax.random.key(2) if method == "hutchinson" else None  # refused by loop
        e1, g1 = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, params, walkers, method=method, key=key
        )
        e2, g2 = vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, params, walkers, mesh, method=method, key=key
        )
        # the same walkers get the same probes: sharded == one device up to summation order
        np.testing.assert_allclose(float(e2), float(e1), rtol=1e-12)
        for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(g1)):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11
            )


# --- bad input: one table per module ----------------------------------------------------------

X3 = jnp.ones(3)
KEY = jax.random.key(0)

LAPLACIAN_BAD_INPUT = [
    (
        "unknown method",
        lambda: L.laplacian(jnp.sum, X3, method="trace"),
        ValueError,
        "unknown Laplacian method 'trace'",
    ),
    (
        "method not a str",
        lambda: L.grad_and_laplacian(jnp.sum, X3, method=None),
        ValueError,
        "unknown Laplacian method None",
    ),
    (
        "2-D x",
        lambda: L.laplacian(jnp.sum, jnp.ones((2, 3))),
        ValueError,
        "x must be a 1-D array",
    ),
    (
        "non-scalar f",
        lambda: L.laplacian(lambda v: v * 2, X3),
        ValueError,
        "f must return a scalar",
    ),
    (
        "hutchinson without key",
        lambda: L.laplacian(jnp.sum, X3, method="hutchinson"),
        ValueError,
        "needs a PRNG key",
    ),
    (
        "num_samples=0",
        lambda: L.laplacian(jnp.sum, X3, method="hutchinson", key=KEY, num_samples=0),
        ValueError,
        "num_samples must be a positive int",
    ),
    (
        "integer x",
        lambda: L.laplacian(jnp.sum, jnp.arange(3)),
        TypeError,
        "floating-point",
    ),
    (
        "f not a function",
        lambda: L.laplacian(3.0, X3),
        TypeError,
        "f must be a function",
    ),
    (
        "kinetic_energy(3, x)",
        lambda: L.kinetic_energy(3, X3),
        TypeError,
        "log_psi must be a function",
    ),
    (
        "hutchinson_samples num_samples=0",
        lambda: L.hutchinson_samples(jnp.sum, X3, KEY, 0),
        ValueError,
        "num_samples must be a positive int",
    ),
    (
        "hutchinson_samples num_samples=2.0",
        lambda: L.hutchinson_samples(jnp.sum, X3, KEY, 2.0),
        TypeError,
        "num_samples must be a Python int, a positive int",
    ),
    (
        "hutchinson_samples key=0",
        lambda: L.hutchinson_samples(jnp.sum, X3, 0, 4),
        TypeError,
        r"key must be a JAX PRNG key",
    ),
    (
        "hutchinson_probes key=None",
        lambda: L.hutchinson_probes(None, X3, 4),
        ValueError,
        "needs a PRNG key",
    ),
]


@pytest.mark.parametrize(
    "call,error,match",
    [c[1:] for c in LAPLACIAN_BAD_INPUT],
    ids=[c[0] for c in LAPLACIAN_BAD_INPUT],
)
def test_laplacian_module_rejects_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def _ferminet_like(positions):  # orbitals of all electrons at once: (n, 3) -> (n, n)
    mean = jnp.mean(positions, axis=0)
    return jnp.tanh(positions @ jnp.ones((3, positions.shape[0])) + mean @ jnp.ones(3))


ORB4 = lambda r: jnp.concatenate([jnp.ones(1), r])  # noqa: E731  4 orbitals
P2 = wavefunctions.init_params(jax.random.key(0), 2, hidden=4)
W4 = jnp.zeros((4, 2, 3))

SLATER_BAD_INPUT = [
    (
        "positions (n, 2)",
        lambda m: slater.slater_laplacian(ORB4, jnp.ones((4, 2))),
        ValueError,
        r"positions must have shape \(n, 3\)",
    ),
    (
        "positions 1-D",
        lambda m: slater.slater_log_psi(ORB4, jnp.ones(12)),
        ValueError,
        r"positions must have shape \(n, 3\)",
    ),
    (
        "integer positions",
        lambda m: slater.slater_matrix(ORB4, jnp.ones((4, 3), jnp.int32)),
        TypeError,
        "floating-point",
    ),
    (
        "orbital count != n",
        lambda m: slater.slater_log_psi(ORB4, jnp.ones((3, 3))),
        ValueError,
        r"orbitals return 4 values but the positions hold 3 electrons",
    ),
    (
        "orbitals not callable",
        lambda m: slater.slater_laplacian(jnp.ones(4), jnp.ones((4, 3))),
        TypeError,
        "orbitals must be a function",
    ),
    (
        "FermiNet-style orbitals",
        lambda m: slater.slater_laplacian(_ferminet_like, jnp.ones((4, 3))),
        ValueError,
        r"read all electrons .* forward_laplacian.* method='loop'",
    ),
    (
        "row_formula shapes",
        lambda m: slater.row_formula(jnp.eye(3), jnp.zeros((3, 3)), jnp.zeros((3, 3))),
        ValueError,
        r"expected shapes \(n, n\), \(n, n, 3\), \(n, n\)",
    ),
    (
        "init_params n=0",
        lambda m: wavefunctions.init_params(KEY, 0),
        ValueError,
        "n_electrons must be a positive int",
    ),
    (
        "init_params hidden=0",
        lambda m: wavefunctions.init_params(KEY, 2, hidden=0),
        ValueError,
        "hidden must be a positive int",
    ),
    (
        "mlp params for other n",
        lambda m: wavefunctions.mlp_slater_laplacian(P2, jnp.ones((3, 3))),
        ValueError,
        r"made for 2 electrons .* hold 3 electrons",
    ),
    (
        "potential (n, 2)",
        lambda m: vmc.potential_energy(jnp.ones((3, 2))),
        ValueError,
        r"positions must have shape \(n, 3\)",
    ),
    (
        "walkers 2-D",
        lambda m: vmc.energy_and_grad(wavefunctions.mlp_log_psi, P2, jnp.ones((4, 6))),
        ValueError,
        r"walkers must have shape \(batch, n, 3\)",
    ),
    (
        "estimator",
        lambda m: vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, P2, W4, estimator="mean"
        ),
        ValueError,
        "estimator must be",
    ),
    (
        "method",
        lambda m: vmc.energy_and_grad(wavefunctions.mlp_log_psi, P2, W4, method="jet"),
        ValueError,
        "unknown Laplacian method",
    ),
    (
        "hutchinson without key",
        lambda m: vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, P2, W4, method="hutchinson"
        ),
        ValueError,
        "needs a PRNG key",
    ),
    (
        "log_psi not callable",
        lambda m: vmc.energy_and_grad(P2, P2, W4),
        TypeError,
        "log_psi must be a function",
    ),
    (
        "omega a string",
        lambda m: vmc.energy_and_grad(wavefunctions.mlp_log_psi, P2, W4, omega="1"),
        TypeError,
        "omega must be a float",
    ),
    (
        "mesh a dict",
        lambda m: vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, P2, W4, {"data": 4}
        ),
        TypeError,
        r"mesh must be a jax.sharding.Mesh.*jax.make_mesh",
    ),
    (
        "batch not divisible",
        lambda m: vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, P2, jnp.ones((6, 2, 3)), m
        ),
        ValueError,
        "must be divisible",
    ),
    (
        "axis not in mesh",
        lambda m: vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, P2, W4, m, axis_name="batch"
        ),
        ValueError,
        "not an axis of the mesh",
    ),
    (
        "steps=0",
        lambda m: vmc.sample_walkers(
            wavefunctions.mlp_log_psi, P2, W4, KEY, steps=0, step_size=0.1
        ),
        ValueError,
        "steps must be a positive int",
    ),
    (
        "step_size<0",
        lambda m: vmc.sample_walkers(
            wavefunctions.mlp_log_psi, P2, W4, KEY, steps=1, step_size=-1.0
        ),
        ValueError,
        "step_size must be a float > 0 .positive",
    ),
    (
        "integer walkers",
        lambda m: vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            P2,
            W4.astype(jnp.int32),
            KEY,
            steps=1,
            step_size=0.1,
        ),
        TypeError,
        "floating-point",
    ),
]


@pytest.mark.parametrize(
    "call,error,match",
    [c[1:] for c in SLATER_BAD_INPUT],
    ids=[c[0] for c in SLATER_BAD_INPUT],
)
def test_slater_module_rejects_bad_input(mesh, call, error, match):
    with pytest.raises(error, match=match):
        call(mesh)


# --- edge cases of grad_and_laplacian (issue 26, smaller defects) ----------------------------


@pytest.mark.parametrize("method", L.METHODS)
def test_a_function_that_ignores_x_has_zero_gradient_and_laplacian(method):
    """folx returns a plain array (no jacobian) when f does not depend on x."""
    opts = {"key": jax.random.key(0)} if method == "hutchinson" else {}
    x = jnp.array([0.3, -1.2, 2.0], jnp.float32)
    g, lap = L.grad_and_laplacian(lambda v: jnp.float32(3.5), x, method=method, **opts)
    assert g.shape == (3,) and lap.shape == ()
    np.testing.assert_array_equal(np.asarray(g), np.zeros(3, np.float32))
    assert float(lap) == 0.0


@pytest.mark.parametrize("method", L.METHODS)
def test_an_empty_input_has_an_empty_gradient_and_zero_laplacian(method):
    opts = {"key": jax.random.key(0)} if method == "hutchinson" else {}
    x = jnp.zeros((0,), jnp.float32)
    g, lap = L.grad_and_laplacian(
        lambda v: jnp.sum(v**2) + 1.0, x, method=method, **opts
    )
    assert g.shape == (0,) and g.dtype == x.dtype
    assert lap.shape == () and float(lap) == 0.0


@pytest.mark.parametrize(
    "method, option, value",
    [
        ("loop", "num_samples", 4),
        ("vmap", "key", jax.random.key(0)),
        ("hessian", "sparsity_threshold", 3),
        ("folx", "num_samples", 8),
        ("hutchinson", "sparsity_threshold", 0),
        ("forward", "key", jax.random.key(0)),
        ("forward", "sparsity_threshold", 0),
    ],
)
def test_an_option_of_another_method_is_refused(method, option, value):
    """An option the method ignores is a TypeError (the package's one policy)."""
    opts = {"key": jax.random.key(1)} if method == "hutchinson" else {}
    opts[option] = value
    with pytest.raises(TypeError, match=f"{option}.* applies only to method="):
        L.laplacian(jnp.sum, jnp.ones(3), method=method, **opts)


def test_default_options_are_accepted_by_every_method():
    """None (the default) is 'not given': kinetic_energy passes options through."""
    for method in ("hessian", "loop", "vmap", "folx", "forward"):
        x = jnp.array([0.5, -1.0, 2.0], jnp.float32)
        lap = L.laplacian(
            lambda v: jnp.sum(v**3), x, method=method, key=None, num_samples=None
        )
        # float32: measured relative error 0 to 1.2e-7 (exact value 6 * sum(x) = 9)
        np.testing.assert_allclose(float(lap), 9.0, rtol=1e-6)


_X9 = jnp.asarray([0.6, -0.3, 0.8, 0.1, 1.2, -0.7, 0.4, 0.9, -0.2], jnp.float32)


@pytest.mark.parametrize("name", list(L.FOLX_PROBES))
def test_method_folx_warns_on_what_the_probe_measured_wrong(name, monkeypatch):
    """Review of issue 26: folx 0.2.24 on JAX 0.8.2 returns wrong Laplacians on
    cholesky, cumlogsumexp and cumprod without an error. method="folx" warns, once per
    construct, exactly when the probe measured the running folx wrong on it; the
    value it then returns is off the Hessian trace, and right when it does not warn."""
    monkeypatch.setattr(L, "_FOLX_WARNED", set())
    probe = L.FOLX_PROBES[name][1]
    wrong = name in L.folx_wrong_constructs()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = float(L.laplacian(probe, _X9, method="folx"))
        L.laplacian(probe, _X9, method="folx")  # a second call: no second warning
    ours = [w for w in seen if issubclass(w.category, L.FolxWrongValueWarning)]
    assert len(ours) == (1 if wrong else 0)
    if wrong:
        message = str(ours[0].message)
        assert (
            name in message and "forward_laplacian.forward_laplacian(f, x)" in message
        )
        assert (
            "method='hessian'" in message
            and "method='forward_laplacian'" not in message
        )
    want = float(hessian_trace(probe, _X9))
    assert (abs(got - want) > 1e-3 * (1 + abs(want))) == wrong


@pytest.mark.skipif(
    jax.__version__ != "0.8.2", reason="the floor env (folx 0.2.24 + JAX 0.8.2) only"
)
def test_method_folx_warns_on_cholesky_on_the_floor(monkeypatch):
    """On the floor folx is measured wrong on all three probes (review 26: cholesky
    -0.17809 vs -0.16061), so a cholesky-based function warns."""
    monkeypatch.setattr(L, "_FOLX_WARNED", set())
    assert set(L.folx_wrong_constructs()) == set(L.FOLX_PROBES)
    with pytest.warns(L.FolxWrongValueWarning, match="cholesky"):
        L.laplacian(
            L.FOLX_PROBES["cholesky (jnp.linalg.cholesky)"][1], _X9, method="folx"
        )


def test_method_forward_differentiates_a_while_loop_the_reverse_methods_refuse():
    """method="forward" (the project's forward Laplacian through the one entry point)
    runs where reverse mode cannot: a lax.while_loop. Reference: x ** 3 per entry
    (the loop multiplies by x twice), Laplacian 6 * sum(x), gradient 3 x ** 2."""

    def cube(v):
        state = jax.lax.while_loop(
            lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] * v), (0, v)
        )
        return jnp.sum(state[1])

    with jax.enable_x64(True):
        x = x64_point(5, seed=2)
        g, lap = jax.jit(lambda v: L.grad_and_laplacian(cube, v, method="forward"))(x)
        np.testing.assert_allclose(float(lap), float(6 * jnp.sum(x)), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g), np.asarray(3 * x**2), rtol=1e-12)
    with pytest.raises(ValueError, match="method='forward'"):
        L.laplacian(cube, jnp.ones(3), method="loop")


def test_vmc_reaches_method_forward():
    """vmc's local energy and its parameter gradient accept method="forward" and agree
    with method="hessian" in float64."""
    with jax.enable_x64(True):
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), SLATER_PARAMS)
        w = 0.3 * jnp.sin(jnp.arange(36.0, dtype=jnp.float64)).reshape(4, 3, 3)
        fwd = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, params, w, method="forward"
        )
        ref = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi, params, w, method="hessian"
        )
        for got, want in zip(jax.tree.leaves(fwd), jax.tree.leaves(ref)):
            np.testing.assert_allclose(
                np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-11
            )
