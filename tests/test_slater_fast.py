"""Tests for wavefunctions.mlp_slater_laplacian (analytic orbital derivatives),
vmc.sample_walkers, and slater's check that orbitals are single-particle."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from references import hessian_trace  # tests/references.py

from beyondgrad import (
    forward_laplacian,
    laplacian,
    runtime,
    slater,
    vmc,
    wavefunctions,
)


def _problem(n, hidden, seed, dtype=jnp.float64):
    params = wavefunctions.init_params(
        jax.random.key(seed), n, hidden=hidden, dtype=dtype
    )
    pos = jax.random.normal(jax.random.key(100 + seed), (n, 3), dtype)
    return params, pos


@pytest.mark.parametrize("n,hidden,seed", [(1, 4, 0), (3, 7, 1), (6, 16, 2)])
def test_mlp_slater_laplacian_matches_float64_hessian(n, hidden, seed):
    with jax.enable_x64(True):
        params, pos = _problem(n, hidden, seed)
        flat = lambda v: wavefunctions.mlp_log_psi(params, v.reshape(n, 3))  # noqa: E731
        logabs, grad, lap = jax.jit(wavefunctions.mlp_slater_laplacian)(params, pos)
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
        want = jax.jit(lambda v: hessian_trace(flat, v))(pos.reshape(-1))
        np.testing.assert_allclose(float(lap), float(want), rtol=1e-9, atol=1e-9)


def _rel(a, b):
    """Norm-wise relative error ||a - b|| / ||b|| (in float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_float32_structured_laplacians_against_float64():
    # Measured (JAX 0.8.2 and 0.12, CPU): every float32 output within 9e-7 of float64
    # (norm-wise), the two float32 formulas within 3.4e-7 of each other. Tolerances:
    # about 6x those.
    params, pos = _problem(8, 16, 3, jnp.float32)
    generic = lambda p, x: slater.slater_laplacian(
        functools.partial(wavefunctions.mlp_orbitals, p), x
    )  # noqa: E731
    fwdfwd = lambda p, x: slater.row_formula(  # noqa: E731
        *slater.orbital_derivatives_fwdfwd(
            functools.partial(wavefunctions.mlp_orbitals, p), x
        )
    )
    # "highest": compare the formulas, not TF32 / bfloat16 matmul passes on GPU or TPU
    with jax.default_matmul_precision("highest"):
        got = {
            name: jax.jit(fn)(params, pos)
            for name, fn in [
                ("analytic", wavefunctions.mlp_slater_laplacian),
                ("forward Laplacian", generic),
                ("fwd-over-fwd", fwdfwd),
            ]
        }
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda a: a.astype(jnp.float64), params)
        want = jax.jit(wavefunctions.mlp_slater_laplacian)(p64, pos.astype(jnp.float64))
    for name, out in got.items():
        for what, a, b in zip(("log|psi|", "grad", "laplacian"), out, want):
            assert _rel(a, b) < 5e-6, (name, what, _rel(a, b))
    for a, b in zip(got["analytic"], got["forward Laplacian"]):
        assert _rel(a, b) < 2e-6


def test_mlp_slater_laplacian_under_vmap_and_grad_wrt_params():
    with jax.enable_x64(True):
        params, _ = _problem(3, 5, 4)
        walkers = jax.random.normal(jax.random.key(9), (4, 3, 3), jnp.float64)

        def loss(p, slater_fn):
            _, g, lap = jax.vmap(lambda x: slater_fn(p, x))(walkers)
            return jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2))))

        generic = lambda p, x: slater.slater_laplacian(
            functools.partial(wavefunctions.mlp_orbitals, p), x
        )  # noqa: E731
        got = jax.jit(jax.grad(loss), static_argnums=1)(
            params, wavefunctions.mlp_slater_laplacian
        )
        want = jax.jit(jax.grad(loss), static_argnums=1)(params, generic)
        for k in params:
            np.testing.assert_allclose(
                np.asarray(got[k]), np.asarray(want[k]), rtol=1e-8, atol=1e-10
            )
        # and one parameter against a central finite difference
        eps = 1e-6
        bump = lambda s: {**params, "b2": params["b2"].at[1].add(s)}  # noqa: E731
        fd = (
            loss(bump(eps), wavefunctions.mlp_slater_laplacian)
            - loss(bump(-eps), wavefunctions.mlp_slater_laplacian)
        ) / (2 * eps)
        np.testing.assert_allclose(float(got["b2"][1]), float(fd), rtol=1e-5)


def test_mlp_slater_laplacian_inside_shard_map_check_vma():
    mesh = runtime.demo_mesh(4, "data")
    params, _ = _problem(3, 5, 5, jnp.float32)
    walkers = jax.random.normal(jax.random.key(1), (8, 3, 3), jnp.float32)

    def kinetic(p, block):
        _, g, lap = jax.vmap(lambda x: wavefunctions.mlp_slater_laplacian(p, x))(block)
        return jax.lax.psum(jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2)))), "data")

    sharded = jax.shard_map(
        kinetic, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=True
    )
    total, grads = jax.jit(jax.value_and_grad(sharded))(params, walkers)
    want, want_grads = jax.jit(jax.value_and_grad(lambda p: _one_device(p, walkers)))(
        params
    )
    # float32, sharded against one device. Measured relative error of the total:
    # 4.1e-7 (JAX 0.8.2), 8.3e-8 (0.12.0.1); rtol 2e-6 is 5x the worst.
    np.testing.assert_allclose(float(total), float(want), rtol=2e-6)
    for k in params:
        want_k = np.asarray(want_grads[k])
        # Measured max|error| / max|want| per parameter: <= 4.1e-6 (0.8.2),
        # <= 1.2e-7 (0.12.0.1); 2e-5 is 5x the worst.
        np.testing.assert_allclose(
            np.asarray(grads[k]), want_k, rtol=0, atol=2e-5 * np.abs(want_k).max()
        )


def _one_device(p, walkers):
    _, g, lap = jax.vmap(lambda x: wavefunctions.mlp_slater_laplacian(p, x))(walkers)
    return jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2))))


def test_mlp_slater_laplacian_rejects_bad_input():
    params = wavefunctions.init_params(jax.random.key(0), 4, hidden=6)
    with pytest.raises(ValueError, match=r"positions must have shape \(n, 3\)"):
        wavefunctions.mlp_slater_laplacian(params, jnp.ones((4, 2)))
    with pytest.raises(ValueError, match=r"made for 4 electrons .* hold 3 electrons"):
        wavefunctions.mlp_slater_laplacian(params, jnp.ones((3, 3)))
    with pytest.raises(ValueError, match="params must be the dict of init_params"):
        wavefunctions.mlp_slater_laplacian({"w1": params["w1"]}, jnp.ones((4, 3)))
    with pytest.raises(TypeError, match="floating-point"):
        wavefunctions.mlp_slater_laplacian(params, jnp.ones((4, 3), jnp.int32))


def test_sample_walkers_targets_psi_squared():
    # log|psi| = -a|x|^2/2 per coordinate: |psi|^2 is a Gaussian of variance 1/(2a)
    a = 2.0

    def log_psi(p, x):
        return -0.5 * p * jnp.sum(x * x)

    walkers = jnp.zeros((256, 2, 3), jnp.float32)
    out, acc = vmc.sample_walkers(
        log_psi, a, walkers, jax.random.key(0), steps=400, step_size=0.5
    )
    assert out.shape == walkers.shape and out.dtype == walkers.dtype
    assert 0.2 < float(acc) < 0.95
    np.testing.assert_allclose(float(jnp.var(out)), 1.0 / (2 * a), rtol=0.1)
    np.testing.assert_allclose(float(jnp.mean(out)), 0.0, atol=0.05)


def test_sample_walkers_moves_walkers_away_from_nodes():
    n = 8
    params = wavefunctions.init_params(jax.random.key(n), n, hidden=2 * n)
    start = 1.5 * jax.random.normal(jax.random.key(1), (16, n, 3), jnp.float32)
    end, acc = vmc.sample_walkers(
        wavefunctions.mlp_log_psi,
        params,
        start,
        jax.random.key(2),
        steps=300,
        step_size=0.2,
    )
    assert 0.05 < float(acc) < 1.0
    logpsi = jax.vmap(wavefunctions.mlp_log_psi, in_axes=(None, 0))
    # sampling from |psi|^2 raises the typical log|psi| (fewer walkers in low-density regions)
    assert float(jnp.median(logpsi(params, end))) > float(
        jnp.median(logpsi(params, start))
    )


def test_sample_walkers_rejects_bad_input():
    params = wavefunctions.init_params(jax.random.key(0), 2, hidden=4)
    w = jnp.zeros((4, 2, 3))
    with pytest.raises(ValueError, match=r"walkers must have shape \(batch, n, 3\)"):
        vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            params,
            jnp.zeros((4, 6)),
            jax.random.key(0),
            steps=1,
            step_size=0.1,
        )
    with pytest.raises(ValueError, match="steps must be a positive int"):
        vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            params,
            w,
            jax.random.key(0),
            steps=0,
            step_size=0.1,
        )
    with pytest.raises(ValueError, match="step_size must be a float > 0 .positive"):
        vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            params,
            w,
            jax.random.key(0),
            steps=1,
            step_size=-1.0,
        )
    with pytest.raises(TypeError, match="floating-point"):
        vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            params,
            w.astype(jnp.int32),
            jax.random.key(0),
            steps=1,
            step_size=0.1,
        )


def test_orbital_derivatives_against_jacfwd_and_hessian():
    with jax.enable_x64(True):
        params, pos = _problem(4, 6, 7)
        orb = functools.partial(wavefunctions.mlp_orbitals, params)
        phi, dphi, lphi = jax.jit(lambda x: slater.orbital_derivatives(orb, x))(pos)
        assert phi.shape == (4, 4) and dphi.shape == (4, 4, 3) and lphi.shape == (4, 4)
        np.testing.assert_allclose(
            np.asarray(phi), np.asarray(jax.vmap(orb)(pos)), rtol=1e-13
        )
        np.testing.assert_allclose(
            np.asarray(dphi), np.asarray(jax.vmap(jax.jacfwd(orb))(pos)), rtol=1e-12
        )
        hess = jax.vmap(jax.hessian(orb))(pos)  # (n electrons, n orbitals, 3, 3)
        np.testing.assert_allclose(
            np.asarray(lphi), np.asarray(jnp.trace(hess, axis1=2, axis2=3)), rtol=1e-11
        )


def test_row_formula_rejects_mismatched_shapes():
    with pytest.raises(
        ValueError, match=r"expected shapes \(n, n\), \(n, n, 3\), \(n, n\)"
    ):
        slater.row_formula(jnp.eye(3), jnp.zeros((3, 3)), jnp.zeros((3, 3)))


# --- the forward Laplacian behind slater_laplacian -----------------------------------------


def _gto(r):
    centres = jnp.linspace(-1.0, 1.0, 12, dtype=r.dtype).reshape(4, 3)
    d = r - centres
    x, y, z = d[:, 0], d[:, 1], d[:, 2]
    poly = jnp.stack([jnp.ones_like(x), x, y * z, x * x - z * z], axis=-1)
    return jnp.sum(poly, axis=-1) * jnp.exp(-0.7 * jnp.sum(d * d, axis=-1))


def _plane_waves_jastrow(r):
    k = jnp.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]], r.dtype)
    mix = jnp.eye(4, dtype=r.dtype) + 0.1
    waves = jnp.where(jnp.arange(4) % 2 == 0, jnp.cos(k @ r), jnp.sin(k @ r))
    return (mix @ waves) * jnp.exp(-0.25 * r @ r + 0.3 * jnp.sqrt(1.0 + r @ r))


def _every_rule(r):
    """Exercises each rule: select_n, softplus (custom_jvp), a nested jit, division by a
    function of r, concatenate, integer_pow, max and norm (generic), indexing (gather/slice)."""
    a = jnp.where(r[0] > 0, jnp.sin(r), r**3)
    b = jax.nn.softplus(r @ jnp.ones((3, 4), r.dtype)) / (1.0 + r @ r)
    c = jax.jit(lambda u: jnp.cos(u) * u)(b) + jnp.concatenate([a, r[:1]]) * jnp.exp(
        -r[1]
    )
    return c**2 + jnp.max(c) + jnp.linalg.norm(r) + jnp.tanh(r[jnp.array([2, 0, 1, 2])])


def _sums(r):
    """reduce_sum over short axes (summed slice by slice), long ones (> 16) and both."""
    t = jnp.sin(jnp.arange(4 * 20 * 3, dtype=r.dtype).reshape(4, 20, 3) * r[0] + r)
    u = jnp.tanh(t * r[1])
    return (
        jnp.sum(u, axis=(1, 2))
        + jnp.sum(u * t, axis=(0, 2))[:4]
        + jnp.sum(t, axis=1)[:, 2]
        + jnp.sum(jnp.stack([u, t], axis=-1) ** 2, axis=(0, 1, 2, 3))
    )


ORBITAL_FUNCTIONS = {
    "gto": _gto,
    "sums over short and long axes": _sums,
    "plane waves x Jastrow": _plane_waves_jastrow,
    "every rule": _every_rule,
}


@pytest.mark.parametrize("name", list(ORBITAL_FUNCTIONS))
def test_forward_laplacian_matches_jacfwd_and_hessian(name):
    f = ORBITAL_FUNCTIONS[name]
    with jax.enable_x64(True):
        r = jnp.array([0.3, -0.7, 0.45], jnp.float64)
        value, jac, lap = jax.jit(lambda v: forward_laplacian.forward_laplacian(f, v))(
            r
        )
        np.testing.assert_allclose(np.asarray(value), np.asarray(f(r)), rtol=1e-14)
        np.testing.assert_allclose(
            np.asarray(jac), np.asarray(jax.jacfwd(f)(r)), rtol=1e-12, atol=1e-14
        )
        want = jnp.trace(jax.hessian(f)(r), axis1=-2, axis2=-1)
        np.testing.assert_allclose(
            np.asarray(lap), np.asarray(want), rtol=1e-11, atol=1e-13
        )


@pytest.mark.parametrize("name", ["gto", "plane waves x Jastrow"])
def test_slater_laplacian_on_other_orbital_families(name):
    f = ORBITAL_FUNCTIONS[name]
    with jax.enable_x64(True):
        pos = 0.8 * jax.random.normal(jax.random.key(5), (4, 3), jnp.float64)
        flat = lambda v: slater.slater_log_psi(f, v.reshape(4, 3))  # noqa: E731
        logabs, grad, lap = jax.jit(lambda p: slater.slater_laplacian(f, p))(pos)
        np.testing.assert_allclose(
            float(logabs), float(flat(pos.reshape(-1))), rtol=1e-12
        )
        np.testing.assert_allclose(
            np.asarray(grad).ravel(),
            np.asarray(jax.grad(flat)(pos.reshape(-1))),
            rtol=1e-9,
            atol=1e-10,
        )
        want = jax.jit(lambda v: hessian_trace(flat, v))(pos.reshape(-1))
        np.testing.assert_allclose(float(lap), float(want), rtol=1e-9)
        # and the previous forward-over-forward derivatives agree entry by entry
        for a, b in zip(
            slater.orbital_derivatives(f, pos),
            slater.orbital_derivatives_fwdfwd(f, pos),
        ):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14
            )


def test_forward_laplacian_carries_fewer_arrays_than_forward_over_forward():
    # the MLP orbitals' read-out matmul (hidden -> n) dominates: count the rows that go
    # through it. Forward Laplacian: value, 3 Jacobian rows, 1 Laplacian = 5 per electron;
    # forward over forward: value + 3 directions x (first, first again, second) = 10.
    params, pos = _problem(4, 8, 6, jnp.float32)
    orb = functools.partial(wavefunctions.mlp_orbitals, params)

    def readout_rows(fn):
        jaxpr = jax.make_jaxpr(lambda x: fn(orb, x))(pos)
        rows = 0

        def visit(j):
            nonlocal rows
            for eqn in j.eqns:
                if eqn.primitive.name == "dot_general" and any(
                    getattr(v.aval, "shape", ()) == (8, 4) for v in eqn.invars
                ):
                    rows += int(np.prod(eqn.outvars[0].aval.shape)) // 4
                for value in eqn.params.values():
                    sub = getattr(value, "jaxpr", value)
                    if hasattr(sub, "eqns"):
                        visit(sub)

        visit(jaxpr.jaxpr)
        return rows // pos.shape[0]  # per electron

    assert readout_rows(slater.orbital_derivatives) == 5
    assert readout_rows(slater.orbital_derivatives_fwdfwd) == 10


def test_slater_laplacian_inside_shard_map_check_vma():
    # float64: the comparison checks the structure (types, collectives), not rounding
    mesh = runtime.demo_mesh(4, "data")

    def kinetic(block):
        _, g, lap = jax.vmap(lambda x: slater.slater_laplacian(_gto, x))(block)
        return jax.lax.psum(jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2)))), "data")

    with jax.enable_x64(True):
        walkers = jax.random.normal(jax.random.key(1), (8, 4, 3), jnp.float64)
        sharded = jax.shard_map(
            kinetic, mesh=mesh, in_specs=P("data"), out_specs=P(), check_vma=True
        )
        _, g, lap = jax.jit(jax.vmap(lambda x: slater.slater_laplacian(_gto, x)))(
            walkers
        )
        want = jnp.sum(-0.5 * (lap + jnp.sum(g * g, axis=(1, 2))))
        np.testing.assert_allclose(
            float(jax.jit(sharded)(walkers)), float(want), rtol=1e-10
        )


# --- the compat helpers the interpreter uses ------------------------------------------------


class _FakePrimitive:
    """Stands in for a primitive whose get_bind_params returns either layout."""

    multiple_results = False
    name = "fake"

    def __init__(self, layout):
        self.layout = layout

    def get_bind_params(self, params):
        return ((), dict(params)) if self.layout == "tuple" else dict(params)

    def bind(self, *args, **params):
        return ("bound", args, params)


class _FakeEqn:
    def __init__(self, layout):
        self.primitive = _FakePrimitive(layout)
        self.params = {"axis": 1}


@pytest.mark.parametrize("layout", ["tuple", "dict"])
def test_compat_bind_equation_handles_both_bind_param_layouts(layout):
    from beyondgrad import compat

    assert compat.bind_equation(_FakeEqn(layout), [1, 2]) == [
        ("bound", (1, 2), {"axis": 1})
    ]


def test_compat_bind_equation_and_atom_value_on_a_real_jaxpr():
    from beyondgrad import compat

    closed = jax.make_jaxpr(lambda v: jnp.sin(v) * 2.0)(jnp.ones(3))
    env = {closed.jaxpr.invars[0]: jnp.arange(3.0)}
    for eqn in closed.jaxpr.eqns:
        ins = [compat.jaxpr_atom_value(a, env) for a in eqn.invars]
        for var, value in zip(eqn.outvars, compat.bind_equation(eqn, ins)):
            env[var] = value
    out = compat.jaxpr_atom_value(closed.jaxpr.outvars[0], env)
    np.testing.assert_allclose(np.asarray(out), 2.0 * np.sin(np.arange(3.0)), rtol=1e-6)


# --- orbitals the row formula does not apply to (issue 26, honest guidance) ----------------

N_ALL = 4


def _weights(dtype):
    k = jax.random.split(jax.random.key(42), 3)
    return (
        jax.random.normal(k[0], (3, 8), dtype),
        jax.random.normal(k[1], (3, 8), dtype),
        jax.random.normal(k[2], (8, N_ALL), dtype) / 3,
    )


def _ferminet_like(x, dtype=jnp.float64):
    """Orbitals of all electrons, written for (m, 3) positions, that also run on (3,).

    Each row reads a feature pooled over every electron it is given, refined by a
    fori_loop (a loop: what folx 0.2.30 fails on with JAX 0.12)."""
    w0, w1, w2 = _weights(dtype)
    pooled = jnp.mean(jnp.tanh(jnp.atleast_2d(x) @ w0), axis=0)
    pooled = jax.lax.fori_loop(0, 2, lambda i, p: jnp.tanh(p + 0.1 * i), pooled)
    h = jnp.tanh(x @ w1 + pooled)
    return (h @ w2) * jnp.exp(-0.5 * jnp.sum(x * x, axis=-1, keepdims=True))


def _all_electron_log_psi(v):
    return jnp.linalg.slogdet(_ferminet_like(v.reshape(N_ALL, 3)))[1]


def _positions():
    return jax.random.normal(jax.random.key(7), (N_ALL, 3), jnp.float64)


def test_orbitals_of_all_electrons_are_refused_and_would_have_been_wrong():
    with jax.enable_x64(True):
        pos = _positions()
        want = hessian_trace(_all_electron_log_psi, pos.reshape(-1))
        # what the row formula computes: the Laplacian of log|det| of rows evaluated
        # one electron at a time (each row then sees one electron only)
        rows = lambda v: jnp.linalg.slogdet(  # noqa: E731
            jax.vmap(_ferminet_like)(v.reshape(N_ALL, 3))
        )[1]
        unchecked = hessian_trace(rows, pos.reshape(-1))
        # measured: -83.1 where the all-electron Laplacian is -238.9
        assert abs(float(unchecked) - float(want)) > 0.5 * abs(float(want))
        for call in (
            lambda: slater.slater_laplacian(_ferminet_like, pos),
            lambda: jax.jit(lambda p: slater.slater_laplacian(_ferminet_like, p))(pos),
            lambda: slater.slater_matrix(_ferminet_like, pos),
            lambda: slater.orbital_derivatives(_ferminet_like, pos),
        ):
            with pytest.raises(ValueError, match="read all electrons"):
                call()


def _generic_net(params, x, flat=False):
    """Orbitals written for any number of electrons: ``x`` is ``(3,)`` or ``(m, 3)``;
    each row also reads the mean of a feature over all the rows it is given."""
    w0, w1, w2 = params
    xs = x.reshape(-1, 3)
    pooled = jnp.mean(jnp.tanh(xs @ w0), axis=0)
    h = jnp.tanh(xs @ w1 + pooled)
    out = (h @ w2) * jnp.exp(-0.5 * jnp.sum(xs * xs, axis=-1, keepdims=True))
    return out.reshape(-1) if flat else out.reshape(x.shape[:-1] + (N_ALL,))


@pytest.mark.parametrize("flat", [False, True], ids=["rows", "flattened"])
@pytest.mark.parametrize("where", ["eager", "jit-traced-params", "vmap-params", "grad"])
def test_electron_count_generic_networks_are_refused(where, flat):
    """Issue 26: a network generic in the electron count passed the check when its
    parameters were traced (the VMC step: jit over the parameters) or when it
    flattened its output, and slater_laplacian returned a wrong Laplacian."""
    with jax.enable_x64(True):
        params, pos = _weights(jnp.float64), _positions()

        def log_psi(v):
            return jnp.linalg.slogdet(_generic_net(params, v.reshape(N_ALL, 3)))[1]

        want = float(hessian_trace(log_psi, pos.reshape(-1)))
        rows = lambda v: jnp.linalg.slogdet(  # noqa: E731
            jax.vmap(lambda r: _generic_net(params, r))(v.reshape(N_ALL, 3))
        )[1]
        # measured: -95.1 (row formula, rows one electron at a time) vs -258.5
        assert abs(float(hessian_trace(rows, pos.reshape(-1))) - want) > 100

        def lap(q, p):
            orbitals = functools.partial(_generic_net, q, flat=flat)
            return slater.slater_laplacian(orbitals, p)[2]

        calls = {
            "eager": lambda: lap(params, pos),
            "jit-traced-params": lambda: jax.jit(lap)(params, pos),
            "vmap-params": lambda: jax.vmap(lap, in_axes=(0, None))(
                jax.tree.map(lambda w: jnp.stack([w, 2 * w]), params), pos
            ),
            "grad": lambda: jax.grad(lambda q: lap(q, pos))(params),
        }
        with pytest.raises(ValueError, match="read all electrons"):
            calls[where]()


def test_the_check_skips_what_it_cannot_evaluate():
    """Orbitals closing over a traced PRNG key cannot be run on stand-in values: the
    comparison is skipped (no false alarm) and the result is the eager one."""
    with jax.enable_x64(True):
        params, pos = _problem(4, 6, 3)

        def noisy(key, r):
            shift = jax.random.normal(key, (3,), r.dtype) * 0.0
            return wavefunctions.mlp_orbitals(params, r + shift)

        want = slater.slater_laplacian(
            functools.partial(noisy, jax.random.key(0)), pos
        )[2]
        got = jax.jit(
            lambda k, p: slater.slater_laplacian(functools.partial(noisy, k), p)[2]
        )(jax.random.key(0), pos)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-12)


def test_orbitals_that_pool_over_any_number_of_electrons_are_refused():
    def pooling(x):
        xs = x.reshape(-1, 3)
        return jnp.tanh(jnp.mean(xs @ jnp.ones((3, N_ALL)), axis=0) * jnp.arange(1, 5))

    with pytest.raises(ValueError, match="pool over all the electrons"):
        slater.slater_laplacian(
            pooling, jnp.ones((N_ALL, 3)) * jnp.arange(4.0)[:, None]
        )


def test_the_hint_recommends_methods_that_work_on_the_running_jax():
    """The recommended calls give the float64 Hessian-trace reference on a network with
    a loop; folx is recommended only if it handles that network here."""
    with jax.enable_x64(True):
        pos = _positions()
        x = pos.reshape(-1)
        want = float(hessian_trace(_all_electron_log_psi, x))
        with pytest.raises(ValueError) as info:
            slater.slater_laplacian(_ferminet_like, pos)
        hint = str(info.value)
        assert "laplacian.grad_and_laplacian(" in hint and "method='loop'" in hint
        assert "forward_laplacian.forward_laplacian(" in hint
        assert "method='forward'" in hint  # laplacian's name for the forward Laplacian
        assert "faster" not in hint.split("folx")[0]  # no speed claim for vmap/loop
        for method in ("loop", "vmap"):
            _, lap = laplacian.grad_and_laplacian(
                _all_electron_log_psi, x, method=method
            )
            # float64 rounding against the jitted Hessian trace: the largest of the
            # three methods measured 6.5e-15 relative on JAX 0.12.0.1
            np.testing.assert_allclose(float(lap), want, rtol=2e-14)
        _, _, lap = forward_laplacian.forward_laplacian(_all_electron_log_psi, x)
        np.testing.assert_allclose(float(lap), want, rtol=2e-14)
        assert "particles=n" in hint  # what the hint recommends, run as it says
        _, lap = laplacian.grad_and_laplacian(
            _all_electron_log_psi, x, method="forward", particles=pos.shape[0]
        )
        np.testing.assert_allclose(float(lap), want, rtol=2e-14)
        try:  # an independent try of folx on this very network
            import folx

            folx_ok = bool(
                np.isclose(
                    float(folx.forward_laplacian(_all_electron_log_psi)(x).laplacian),
                    want,
                    rtol=1e-8,
                )
            )
        except Exception:
            folx_ok = False
        assert ("also works on this JAX" in hint) == folx_ok
        assert ("not method='folx'" in hint) == (not folx_ok)


def test_folx_failures_are_what_folx_does_on_this_jax():
    """The hint's capability probe (abstract evaluation) agrees with running folx on
    each probe for real and comparing with the float64 Hessian trace; the hint names
    exactly the failures (issue 26: folx 0.2.30 on JAX 0.12 fails on loops, while_loop
    and custom_vjp, and must not be recommended there)."""
    import folx

    failures = slater._folx_failures()
    with jax.enable_x64(True):
        x = jnp.array([0.3, -0.7])
        for name, probe in slater._FOLX_PROBES.items():
            try:
                got = folx.forward_laplacian(probe)(x).laplacian
                # jax.hessian through the custom_vjp's backward rule; forward over
                # forward for the while_loop, which reverse mode cannot differentiate
                hess = (
                    jax.jacfwd(jax.jacfwd(probe))(x)
                    if name == "while_loop"
                    else jax.hessian(probe)(x)
                )
                works = bool(np.isclose(float(got), float(jnp.trace(hess)), rtol=1e-10))
            except Exception:
                works = False
            assert (name in failures) == (not works), name
    with jax.enable_x64(True), pytest.raises(ValueError) as info:
        slater.slater_laplacian(_ferminet_like, _positions())
    hint = str(info.value)
    for name in failures:
        assert name in hint
    assert ("also works on this JAX" in hint) == (not failures)


@pytest.mark.parametrize(
    "call",
    [
        lambda orb, pos: slater.slater_laplacian(orb, pos),
        lambda orb, pos: slater.slater_matrix(orb, pos),
        lambda orb, pos: slater.orbital_derivatives(orb, pos),
        lambda orb, pos: slater.orbital_derivatives_fwdfwd(orb, pos),
    ],
    ids=["slater_laplacian", "slater_matrix", "orbital_derivatives", "fwdfwd"],
)
def test_complex_orbitals_are_refused(call):
    """Refused: the row formula with complex orbitals returns complex values of which
    only the real part is log|det|'s (issue 26)."""

    def plane_waves(r):
        k = jnp.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [1.0, 1.0, 0]])
        return jnp.exp(1j * (k @ r)) * jnp.exp(-0.1 * r @ r)

    with pytest.raises(TypeError, match="complex values .* real orbitals only"):
        call(plane_waves, jnp.ones((4, 3)) * jnp.arange(4.0)[:, None])


@pytest.mark.parametrize("name", ["gto", "plane waves x Jastrow", "every rule", "mlp"])
def test_single_particle_orbitals_pass_the_check(name):
    """No false alarm on the book's and the tests' single-particle families, eagerly,
    under jit with concrete parameters and under jit with traced parameters."""
    with jax.enable_x64(True):
        params, pos = _problem(4, 6, 3)
        if name == "mlp":
            orbitals = functools.partial(wavefunctions.mlp_orbitals, params)
        else:
            orbitals = ORBITAL_FUNCTIONS[name]
        want = slater.slater_laplacian(orbitals, pos)[2]
        got = jax.jit(lambda p: slater.slater_laplacian(orbitals, p))(pos)[2]
        np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
        if name == "mlp":
            traced = jax.jit(
                lambda q, p: slater.slater_laplacian(
                    functools.partial(wavefunctions.mlp_orbitals, q), p
                )
            )(params, pos)[2]
            np.testing.assert_allclose(float(traced), float(want), rtol=1e-12)


@pytest.mark.parametrize("n", [3, 4])
def test_orbitals_reducing_over_the_whole_position_are_accepted(n):
    """Review of issue 26: Slater-type orbitals written for one position with
    ``jnp.linalg.norm(r)`` (no ``axis=``) meet the contract ``(3,) -> (n,)`` but were
    refused (n = 3: on a batch they pool). The check calls them on ``(3,)`` positions
    only; the result is the float64 Hessian trace of log|det| of their rows."""
    with jax.enable_x64(True):

        def sto(r):
            k = jnp.arange(n, dtype=r.dtype) / n
            poly = 1 + r[0] * k + r[1] * k**2 + r[2] * k**3
            return jnp.exp(-0.8 * jnp.linalg.norm(r)) * poly

        pos = 0.5 * jax.random.normal(jax.random.key(3), (n, 3), jnp.float64)
        rows = lambda v: jnp.linalg.slogdet(jax.vmap(sto)(v.reshape(n, 3)))[1]  # noqa: E731
        want = float(hessian_trace(rows, pos.reshape(-1)))
        got = slater.slater_laplacian(sto, pos)[2]
        jitted = jax.jit(lambda p: slater.slater_laplacian(sto, p)[2])(pos)
        np.testing.assert_allclose(float(got), want, rtol=1e-10)
        np.testing.assert_allclose(float(jitted), want, rtol=1e-10)
