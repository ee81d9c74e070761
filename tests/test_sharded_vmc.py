"""beyondgrad.sharded_vmc: each piece, and the whole step, inside shard_map on 8 CPU
devices against the same computation on one device (float64 NumPy or
beyondgrad.vmc), and bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, measure, runtime, vmc, wavefunctions
from beyondgrad import sharded_vmc as sv

runtime.ensure_cpu_devices(8)
D = 8
LOG_PSI = wavefunctions.mlp_log_psi


def shard(body, in_specs, out_specs, mesh=None):
    mesh = mesh or compat.make_mesh((D,), ("data",))
    return jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True
        )
    )


@pytest.fixture(scope="module")
def problem():
    with jax.enable_x64(True):
        params = wavefunctions.init_params(
            jax.random.key(1), 3, hidden=6, dtype=jnp.float64
        )
        walkers = jax.random.normal(jax.random.key(2), (32, 3, 3), jnp.float64)
        walkers, _ = vmc.sample_walkers(
            LOG_PSI, params, walkers, jax.random.key(3), steps=20, step_size=0.5
        )
    return params, walkers


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_metropolis_walker_keys_give_the_one_device_chain(problem):
    """Walker b draws from fold_in(key, b) (its global index): the sharded chain is
    the one-device chain of the whole batch, bit for bit, and walker b's chain is
    the one of its own key whatever batch it sits in."""
    params, walkers = problem
    key = jax.random.key(4)
    with jax.enable_x64(True):
        body = lambda p, w, k: sv.metropolis(  # noqa: E731
            LOG_PSI, p, w, k, steps=5, step_size=0.4, axis_name="data"
        )
        got, rate = shard(body, (P(), P("data"), P()), (P("data"), P()))(
            params, walkers, key
        )
        one, rate1 = sv.metropolis(
            LOG_PSI, params, walkers, key, steps=5, step_size=0.4
        )
        # walker 5 alone, by hand: all its draws from fold_in(key, 5)
        k_move, k_accept = jax.random.split(jax.random.fold_in(key, 5))
        xis = jax.random.normal(k_move, (5, 3, 3), walkers.dtype)
        us = jax.random.uniform(k_accept, (5,), walkers.dtype)
        x = walkers[5:6]
        for xi, u in zip(xis, us):
            prop = x + 0.4 * xi
            if np.log(u) < 2 * (LOG_PSI(params, prop[0]) - LOG_PSI(params, x[0])):
                x = prop
    assert np.array_equal(got, one)
    # eager by hand vs one compiled program: same draws and decisions, the update
    # x + 0.4 xi may round differently (fused): 1 ulp of |x| <= 4 is 8.9e-16
    assert np.max(np.abs(np.asarray(one[5:6]) - np.asarray(x))) < 4e-15
    assert not np.array_equal(x, walkers[5:6])  # it moved
    # a mean of 32 x 5 zeros and ones, added in another order: exact in binary
    assert float(rate) == float(rate1)
    moves = np.asarray(got - walkers).reshape(len(walkers), -1)
    assert not np.allclose(moves[0], moves[4])  # walkers of one device differ


def _step(params, walkers, key, axis_name):
    walkers, rate = sv.metropolis(
        LOG_PSI, params, walkers, key, steps=4, step_size=0.5, axis_name=axis_name
    )
    e = sv.local_energies(LOG_PSI, params, walkers)
    energy = jnp.mean(e) if axis_name is None else lax.pmean(jnp.mean(e), axis_name)
    clipped = sv.clip_local_energies(e, scale=2.0, axis_name=axis_name)
    o, _ = sv.per_walker_grads(LOG_PSI, params, walkers, axis_name=axis_name)
    g, d = sv.natural_gradient(o, clipped, damping=1e-3, axis_name=axis_name)
    return walkers, rate, energy, g, d


def test_whole_step_is_the_same_on_1_2_4_and_8_devices(problem):
    """The same seed gives bit-identical walkers on every device count; energy,
    gradient and update differ only by the order of the psums (float64 rounding
    2.2e-16 per add, times the solve's condition number for the update)."""
    params, walkers = problem
    key = jax.random.key(9)
    with jax.enable_x64(True):
        want = jax.jit(lambda p, w, k: _step(p, w, k, None))(params, walkers, key)
        o, _ = sv.per_walker_grads(LOG_PSI, params, want[0])
        oc = np.asarray(o) - np.asarray(o).mean(0)
        cond = np.linalg.cond(oc.T @ oc / len(oc) + 1e-3 * np.eye(oc.shape[1]))
        for d in (1, 2, 4, 8):
            mesh = runtime.demo_mesh(d, "data")
            got = shard(
                lambda p, w, k: _step(p, w, k, "data"),
                (P(), P("data"), P()),
                (P("data"), P(), P(), P(), P()),
                mesh=mesh,
            )(params, walkers, key)
            assert np.array_equal(got[0], want[0]), d
            assert float(got[1]) == float(want[1]), d
            assert rel(got[2], want[2]) < 1e-14, d
            assert rel(got[3], want[3]) < 1e-13, d
            assert rel(got[4], want[4]) < 100 * cond * 2.2e-16, d


@pytest.mark.parametrize("x64", [False, True])
def test_sr_matrix_has_no_b_p_p_temporary(x64):
    """S = O_c^T O_c as a matmul: at B = 64 walkers per device, P = 1024, XLA's
    temporaries are the psum's input and output (two P x P matrices; the Cholesky
    factor reuses the output) plus P-vectors, on both JAX ends. The outer-product
    form O_c[:, :, None] * O_c[:, None, :] planned 553,652,440 bytes (B x P x P x 8)
    in float64 on JAX 0.8.2, 25,178,328 (3 P x P) on 0.12.0.1."""
    b, p = 64, 1024
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        o = jax.ShapeDtypeStruct((b * D, p), dtype)
        e = jax.ShapeDtypeStruct((b * D,), dtype)
        body = lambda a, c: sv.natural_gradient(  # noqa: E731
            a, c, damping=1e-3, axis_name="data"
        )
        temp = measure.temp_bytes(shard(body, (P("data"), P("data")), P()), o, e)
    if temp is None:
        pytest.skip("this backend reports no memory analysis")
    item = jnp.dtype(dtype).itemsize
    # two P x P buffers, plus room for two P-vectors (g and the solve's right side;
    # measured: 1 P-vector + 152 bytes on 0.8.2 and 0.12.0.1)
    assert temp <= 2 * p * p * item + 2 * p * item, temp


@pytest.mark.parametrize("x64", [False, True])
@pytest.mark.parametrize("n, p", [(128, 4096), (256, 2048), (64, 1000)])
def test_srt_and_cg_hold_a_share_of_o_per_device(n, p, x64):
    """Per-device temporaries of each method on 8 devices (B = N/8 walkers each), in
    items: MinSR gathers all of O (at least N x P); SRt holds its N x P/D columns
    twice (the all_to_all's input and output) and T (N x N); CG one copy of its own
    centred rows (N x P/D) and a few P-vectors, S never formed. Measured on JAX
    0.8.2 and 0.12.0.1 at these sizes: SRt 2 N P/D + N^2 + at most 3,600, CG
    N P/D + at most 4.1 P; the bounds below leave room for both and fail for a
    method that gathers O or forms S."""
    item = 8 if x64 else 4
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        o = jax.ShapeDtypeStruct((n, p), dtype)
        e = jax.ShapeDtypeStruct((n,), dtype)
        temp = {}
        for method in ("minsr", "srt", "cg"):
            body = functools.partial(
                sv.natural_gradient, damping=1e-3, method=method, axis_name="data"
            )
            program = shard(body, (P("data"), P("data")), P())
            temp[method] = measure.temp_bytes(program, o, e)
    if None in temp.values():
        pytest.skip("this backend reports no memory analysis")
    items = {k: v / item for k, v in temp.items()}
    share = n * p // D
    assert items["minsr"] >= n * p, items
    assert items["srt"] <= 2 * share + n * n + 4 * (n + p), items
    assert items["cg"] <= share + 8 * p + 4 * n, items


#: The bad walkers of each case, as ``(energies to set, O entries to set)``. With 32
#: walkers on 8 devices, walkers 4 to 7 are device 1's: the last case drops them all.
BAD_WALKERS = {
    "finite-energy-nan-row": ({}, {(26, 4): np.nan}),
    "nan-energy-finite-row": ({3: np.nan}, {}),
    "inf-energy": ({17: np.inf, 9: -np.inf}, {}),
    "inf-in-row": ({}, {(12, 0): np.inf, (30, 7): -np.inf}),
    "every-kind-and-a-whole-device": (
        {4: np.nan, 5: np.inf, 20: -np.inf},
        {(6, 2): np.nan, (7, 0): np.inf, (29, 3): -np.inf},
    ),
}


def _kept_step(o, e, method, axis_name):
    """The step's statistics with the one keep mask: clipping window, clipped
    energies, reported energy and variance, gradient, update and count."""
    keep = sv.kept_walkers(o, e)
    clipped = sv.clip_local_energies(e, scale=1.5, keep=keep, axis_name=axis_name)
    energy, variance = sv.kept_energy(e, keep, axis_name=axis_name)
    g, d = sv.natural_gradient(
        o,
        clipped,
        damping=1e-3,
        method=method,
        axis_name=axis_name,
        **_options(method),
    )
    dropped = sv.nonfinite_walkers(o, e, axis_name=axis_name)
    return clipped, energy, variance, g, d, dropped


@functools.cache
def _kept_step_program(method, devices):
    """:func:`_kept_step` on ``devices`` devices, compiled once for every case."""
    return shard(
        lambda a, c: _kept_step(a, c, method, "data"),
        (P("data"), P("data")),
        (P("data"), P(), P(), P(), P(), P()),
        mesh=runtime.demo_mesh(devices, "data"),
    )


@pytest.mark.parametrize("method", sv.METHODS)
@pytest.mark.parametrize("case", sorted(BAD_WALKERS))
def test_a_dropped_walker_takes_no_part_anywhere(problem, case, method):
    """A walker whose energy or any entry of its gradient row is NaN or infinite is
    dropped from everything: the step on 1, 2 and 8 devices equals the float64 NumPy
    step on the kept walkers alone, the bad ones physically removed (median and MAD
    of the window, clipped energies, reported energy and variance, g, update), and
    the count is the number removed."""
    params, walkers = problem
    with jax.enable_x64(True):
        o, _ = sv.per_walker_grads(LOG_PSI, params, walkers)
        e = sv.local_energies(LOG_PSI, params, walkers)
    o, e = np.array(o), np.array(e)
    energies, entries = BAD_WALKERS[case]
    for b, v in energies.items():
        e[b] = v
    for (b, k), v in entries.items():
        o[b, k] = v
    bad = sorted(set(energies) | {b for b, _ in entries})
    kept = np.setdiff1d(np.arange(len(e)), bad)
    # the reference: NumPy in float64 on the kept walkers, the others removed
    ek, ok = e[kept], o[kept]
    n = len(kept)
    m = np.median(ek)
    mad = np.mean(np.abs(ek - m))
    clipped_np = np.clip(ek, m - 1.5 * mad, m + 1.5 * mad)
    assert np.sum(clipped_np != ek) >= 1  # the window clips someone
    oc = (ok - ok.mean(0)) / np.sqrt(n)
    eps = (clipped_np - clipped_np.mean()) / np.sqrt(n)
    g_np = 2 * oc.T @ eps
    a = oc.T @ oc + 1e-3 * np.eye(o.shape[1])
    d_np = np.linalg.solve(a, g_np)
    tol = _update_tol(method, np.linalg.cond(a))
    # sums of n <= 32 terms in another order: n x 2.2e-16 relative to the sum of
    # magnitudes; the energies are positive, so that is the sum itself (x2: room)
    sum_tol = 2 * n * 2.2e-16
    for devices in (1, 2, 8):
        with jax.enable_x64(True):
            got = _kept_step_program(method, devices)(jnp.asarray(o), jnp.asarray(e))
        clipped, energy, variance, g, d, dropped = map(np.asarray, got)
        where = f"{case}, {devices} devices"
        assert int(dropped) == len(bad), where
        # the window: kept walkers clipped as NumPy clips them (|e| < 16: the
        # median is exact, the MAD a sum of n terms, as above)
        assert np.max(np.abs(clipped[kept] - clipped_np)) < 16 * sum_tol, where
        # a dropped walker's energy is returned as it came in
        assert np.array_equal(clipped[bad], e[bad], equal_nan=True), where
        assert rel(energy, ek.mean()) < sum_tol, where
        # two passes: the mean's error enters squared; the sum of squares as above
        assert rel(variance, ek.var()) < 4 * sum_tol, where
        assert rel(g, g_np) < 1e-13, where
        assert rel(d, d_np) < tol, where


def test_local_energies_match_vmc_loop(problem):
    params, walkers = problem
    with jax.enable_x64(True):
        got = shard(
            lambda p, w: sv.local_energies(LOG_PSI, p, w),
            (P(), P("data")),
            P("data"),
        )(params, walkers)
        want = jax.vmap(
            lambda x: vmc.local_energy(LOG_PSI, params, x, method="hessian")
        )(walkers)
    assert rel(got, want) < 1e-13


def test_clip_matches_numpy_median_and_mad():
    rng = np.random.default_rng(0)
    e = rng.standard_t(2, 48) + 3.0
    with jax.enable_x64(True):
        got = shard(
            lambda v: sv.clip_local_energies(v, scale=1.5, axis_name="data"),
            P("data"),
            P("data"),
        )(jnp.asarray(e))
        one = sv.clip_local_energies(jnp.asarray(e), scale=1.5)
    m = np.median(e)
    mad = np.mean(np.abs(e - m))
    want = np.clip(e, m - 1.5 * mad, m + 1.5 * mad)
    assert np.sum(want != e) >= 2
    assert np.max(np.abs(np.asarray(got) - want)) < 1e-13
    assert np.max(np.abs(np.asarray(one) - want)) < 1e-13


def test_per_walker_grads_cast_and_the_uncast_trap(problem):
    params, walkers = problem
    with jax.enable_x64(True):
        want = jax.vmap(lambda x: ravel_pytree(jax.grad(LOG_PSI)(params, x))[0])(
            walkers
        )
        got = shard(
            lambda p, w: sv.per_walker_grads(LOG_PSI, p, w, axis_name="data")[0],
            (P(), P("data")),
            P("data"),
        )(params, walkers)
        assert rel(got, want) < 1e-14

        def uncast(p, w):
            g = jax.vmap(jax.grad(LOG_PSI), in_axes=(None, 0))(p, w)
            return jax.vmap(lambda t: ravel_pytree(t)[0])(g)

        try:
            wrong = shard(uncast, (P(), P("data")), P("data"))(params, walkers)
        except TypeError:
            return  # JAX 0.8.2 refuses: loud, fine
    # newer JAX: silently the sum over devices at each local index, never right
    summed = np.tile(np.asarray(want).reshape(D, -1, want.shape[1]).sum(0), (D, 1))
    assert rel(wrong, summed) < 1e-13
    assert rel(wrong, want) > 0.1


#: CG's stopping tolerance in the tests (float64): the recursive residual reaches it
#: within the default maxiter on these problems; the error of delta is then at most
#: cond(S + damping I) x CG_TOL (relative), plus the drift of the recursive residual
#: from the true one, a few x cond x 2.2e-16 per iteration (x10 room in total).
CG_TOL = 1e-12


def _update_tol(method: str, cond: float) -> float:
    """The relative error allowed on delta against the float64 NumPy solve: the
    direct solves condition number x float64 rounding (x100), CG its stopping
    tolerance times the condition number (x10; CG_TOL)."""
    if method == "cg":
        return 10 * cond * CG_TOL
    return 100 * cond * 2.2e-16


def _options(method: str) -> dict:
    return {"tol": CG_TOL} if method == "cg" else {}


@pytest.mark.parametrize("method", sv.METHODS)
def test_natural_gradient_matches_numpy_and_vmc(problem, method):
    params, walkers = problem
    damping = 1e-3
    with jax.enable_x64(True):
        o, _ = sv.per_walker_grads(LOG_PSI, params, walkers)
        e = sv.local_energies(LOG_PSI, params, walkers)
        g, delta = shard(
            lambda a, b: sv.natural_gradient(
                a,
                b,
                damping=damping,
                method=method,
                axis_name="data",
                **_options(method),
            ),
            (P("data"), P("data")),
            P(),
        )(o, e)
        g1, delta1 = sv.natural_gradient(
            o, e, damping=damping, method=method, **_options(method)
        )
        centred = e - jnp.mean(e)  # Chapter 5's surrogate loss, no matrix O

        def surrogate(p):
            return 2 * jnp.mean(centred * jax.vmap(LOG_PSI, (None, 0))(p, walkers))

        g_vmc = ravel_pytree(jax.grad(surrogate)(params))[0]
    o, e = np.asarray(o), np.asarray(e)
    n = len(e)
    oc = (o - o.mean(0)) / np.sqrt(n)
    eps = (e - e.mean()) / np.sqrt(n)
    g_np = 2 * oc.T @ eps
    a = oc.T @ oc + damping * np.eye(o.shape[1])
    delta_np = np.linalg.solve(a, g_np)
    tol = _update_tol(method, np.linalg.cond(a))
    assert rel(g, g_np) < 1e-13 and rel(g1, g_np) < 1e-13
    assert rel(g, g_vmc) < 1e-13
    assert rel(delta, delta_np) < tol and rel(delta1, delta_np) < tol
    # the update differs from the plain gradient (not a disguised identity)
    assert rel(delta_np, g_np) > 0.1


def test_whole_step_float32_against_float64_reference(problem):
    """The step as a team runs it (float32) against the float64 reference: float32
    rounding (1.2e-7) times the growth of the solve bounds the update."""
    params64, walkers64 = problem
    params = jax.tree.map(lambda a: a.astype(jnp.float32), params64)
    walkers = walkers64.astype(jnp.float32)

    def body(p, w, axis_name="data"):
        e = sv.local_energies(LOG_PSI, p, w)
        energy = jnp.mean(e) if axis_name is None else lax.pmean(jnp.mean(e), "data")
        o, _ = sv.per_walker_grads(LOG_PSI, p, w, axis_name=axis_name)
        g, d = sv.natural_gradient(o, e, damping=1e-1, axis_name=axis_name)
        return energy, g, d

    energy, g, d = shard(body, (P(), P("data")), P())(params, walkers)
    with jax.enable_x64(True):
        e64, g64, d64 = body(params64, walkers64, axis_name=None)
    assert energy.dtype == jnp.float32
    assert rel(energy, e64) < 1e-5
    assert rel(g, g64) < 1e-4
    assert rel(d, d64) < 1e-3


def test_collective_bytes_ring_accounting():
    assert sv.collective_bytes("all_gather", 800, 8) == 700
    assert sv.collective_bytes("reduce_scatter", 800, 8) == 700
    assert sv.collective_bytes("all_reduce", 800, 8) == 1400
    assert sv.collective_bytes("all_reduce", 800, 1) == 0


def test_collectives_in_lists_psum_and_all_gather():
    def body(x):
        y = lax.all_gather(x, "data", tiled=True)
        return lax.psum(jnp.sum(x * 2), "data") + y  # y is varying

    with jax.enable_x64(True):
        jaxpr = jax.make_jaxpr(shard(body, P("data"), P("data")))(jnp.ones(16))
    kinds = sv.collectives_in(jaxpr)
    assert ("all_gather", 16 * 8) in kinds
    assert ("all_reduce", 8) in kinds
    with pytest.raises(TypeError, match="jaxpr"):
        sv.collectives_in("not a jaxpr")


def test_collectives_in_counts_what_runs_in_loops_and_branches():
    """A psum in a 10-step fori_loop runs 10 times; of a cond's branches the costlier
    one is listed; a while_loop's trip count is unknown and pmax is not priced: both
    refused with the reason."""

    def looped(x):
        return lax.fori_loop(0, 10, lambda i, c: c + lax.psum(c, "data"), x)

    def branched(x):
        big = lambda v: v + lax.psum(jnp.tile(v, 4), "data")[: v.shape[0]]  # noqa: E731
        small = lambda v: v + lax.psum(v, "data")  # noqa: E731
        return lax.cond(jnp.sum(x) > 0, big, small, x)

    def whiled(x):
        return lax.while_loop(
            lambda c: c[0] < 3,
            lambda c: (c[0] + 1, c[1] + lax.psum(jnp.sum(c[1]), "data")),
            (0, x),
        )[1]

    def maxed(x):
        return x + lax.pmax(x, "data")

    spec = (P("data"), P("data"))
    x = jnp.ones(16, jnp.float32)  # 2 elements, 8 bytes, per device
    assert (
        sv.collectives_in(jax.make_jaxpr(shard(looped, *spec))(x))
        == [("all_reduce", 8)] * 10
    )
    assert sv.collectives_in(jax.make_jaxpr(shard(branched, *spec))(x)) == [
        ("all_reduce", 32)
    ]
    with pytest.raises(ValueError, match="while_loop"):
        sv.collectives_in(jax.make_jaxpr(shard(whiled, *spec))(x))
    with pytest.raises(ValueError, match="'pmax'"):
        sv.collectives_in(jax.make_jaxpr(shard(maxed, *spec))(x))


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: sv.metropolis(1, {}, jnp.ones((2, 3, 3)), None, steps=1,
                               step_size=1.0), TypeError, "log_psi"),
        (lambda: sv.metropolis(LOG_PSI, {}, jnp.ones((2, 3)), None, steps=1,
                               step_size=1.0), ValueError, "batch, n, 3"),
        (lambda: sv.metropolis(LOG_PSI, {}, jnp.ones((2, 3, 3)), None, steps=0,
                               step_size=1.0), ValueError, "steps"),
        (lambda: sv.local_energies(LOG_PSI, {}, jnp.ones((2, 3, 3), int)),
         TypeError, "floating"),
        (lambda: sv.clip_local_energies(jnp.ones((2, 2))), ValueError, "1-D"),
        (lambda: sv.clip_local_energies(jnp.ones(4), scale=0), ValueError, "scale"),
        (lambda: sv.clip_local_energies(jnp.ones(4), axis_name=0), TypeError,
         "axis_name"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(3), damping=1.0),
         ValueError, "(B, P)"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=0.0),
         ValueError, "damping"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=1.0,
                                     method="kfac"), ValueError,
         "one of 'sr', 'minsr', 'srt', 'cg'"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=1.0,
                                     tol=1e-6), TypeError,
         "applies only to method='cg'"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=1.0,
                                     method="cg", tol=0.0), ValueError, "tol"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=1.0,
                                     method="cg", maxiter=0), ValueError,
         "maxiter"),
        (lambda: sv.natural_gradient(jnp.ones((4, 2)), jnp.ones(4), damping=1.0,
                                     method="cg", maxiter=2.0), TypeError,
         "maxiter"),
        (lambda: sv.clip_local_energies(jnp.ones(4), keep=jnp.ones(4)), TypeError,
         "kept_walkers(o, e_l)"),
        (lambda: sv.clip_local_energies(jnp.ones(4), keep=jnp.ones(3, bool)),
         ValueError, "e_l's shape (4,)"),
        (lambda: sv.kept_walkers(jnp.ones((4, 2)), jnp.ones(3)), ValueError,
         "(B, P)"),
        (lambda: sv.kept_energy(jnp.ones((4, 2)), jnp.ones(4, bool)), ValueError,
         "1-D"),
        (lambda: sv.kept_energy(jnp.ones(4), jnp.ones((4, 1), bool)), ValueError,
         "e_l's shape (4,)"),
        (lambda: sv.kept_energy(jnp.ones(4), jnp.ones(4, bool), axis_name=0),
         TypeError, "axis_name"),
        (lambda: sv.collective_bytes("broadcast", 8, 2), ValueError, "kind"),
        (lambda: sv.collective_bytes("all_gather", -1, 2), ValueError, "nbytes"),
    ],
)  # fmt: skip
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_uncast_per_walker_grads_behave_as_chapter_6_says_on_this_jax(problem):
    """Chapter 6.5 states what vmap(grad) with respect to invariant parameters does
    across the supported range: JAX 0.8.2 crashes (jax#34249), every later release
    returns for each local walker the sum over devices of the gradients at its local
    index. Run on every CI environment and matrix point, this checks the sentence for
    the running JAX."""
    from pathlib import Path

    from packaging.version import Version

    params, walkers = problem
    text = " ".join(
        (Path(__file__).resolve().parents[1] / "chapters" / "06_sharded_vmc.md")
        .read_text()
        .split()
    )

    def uncast(p, w):
        g = jax.vmap(jax.grad(LOG_PSI), in_axes=(None, 0))(p, w)
        return jax.vmap(lambda t: ravel_pytree(t)[0])(g)

    with jax.enable_x64(True):
        ref = jax.jit(uncast)(params, walkers)
        try:
            got = shard(uncast, (P(), P("data")), P("data"))(params, walkers)
        except TypeError as err:
            outcome, message = "raises", str(err)
        else:
            blocks = np.asarray(ref).reshape(D, -1, ref.shape[-1])
            summed = np.tile(blocks.sum(axis=0), (D, 1))
            np.testing.assert_allclose(np.asarray(got), summed, rtol=1e-12, atol=1e-12)
            assert rel(got, ref) > 0.1  # silently wrong, not close
            outcome = "sums"
    version = Version(jax.__version__)
    if version.release[:3] == (0, 8, 2):
        assert outcome == "raises"
        # jax#34249: psum's batching rule passes axis_index_groups to psum_invariant
        assert "unexpected keyword argument 'axis_index_groups'" in message
        assert (
            "JAX 0.8.2 stops with `TypeError: _psum_invariant_abstract_eval()" in text
        )
    else:  # run at 0.9.2, 0.10.2, 0.11.2 and 0.12.0.1 in the matrix environments
        assert outcome == "sums"
        assert "Every later release in the supported range runs the program" in text


def test_kfac_factors_need_no_cast():
    """Chapter 6.5: KFAC's Kronecker factors of a dense layer s = a W, A = mean a a^T
    (the layer's inputs) and G = mean g g^T (g = d log psi / d s per walker), need no
    cast of the replicated W: both are built from per-walker (varying) values and a
    psum. Against one device in float64: the sums differ only in order (N = 64 terms
    of size <= 1: 64 x 2.2e-16 relative at most)."""
    h = 5
    with jax.enable_x64(True):
        w = jax.random.normal(jax.random.key(0), (3, h), jnp.float64)
        x = jax.random.normal(jax.random.key(1), (64, 3), jnp.float64)

        def factors(w, a, axis_name):
            s = a @ w  # (B, h) pre-activations: varying, W left invariant
            # row b: d log psi_b / d s_b, a gradient with respect to a varying value
            g = jax.vmap(jax.grad(lambda s_b: jnp.sum(jnp.tanh(s_b))))(s)
            big_a, big_g = a.T @ a, g.T @ g
            if axis_name is not None:
                big_a, big_g = lax.psum((big_a, big_g), axis_name)
            return big_a / 64, big_g / 64

        got = shard(lambda w, a: factors(w, a, "data"), (P(), P("data")), P())(w, x)
        want = jax.jit(lambda w, a: factors(w, a, None))(w, x)
        # per-walker gradient of tanh: 1 - tanh^2, by hand
        g_hand = 1 - np.tanh(np.asarray(x) @ np.asarray(w)) ** 2
    assert rel(want[1], g_hand.T @ g_hand / 64) < 1e-14
    for a, b in zip(got, want):
        assert rel(a, b) < 64 * 2.2e-16


def test_netket_record_covers_every_method_within_its_bound():
    """records/netket_compare.json (tools/netket_compare.py, run in an environment
    with NetKet): every method of natural_gradient, on 8 devices and on one,
    against NetKet's own SR and SRt updates on the same Jacobian, each within its
    bound; a method added without a comparison fails here."""
    import json
    from pathlib import Path

    record = json.loads(
        (Path(__file__).parent.parent / "records" / "netket_compare.json").read_text()
    )
    assert record["passed"] and record["versions"]["netket"]
    rows = record["rows"]
    for method in sv.METHODS:
        for where in ("8 devices", "1 device"):
            for ref in ("SR", "SRt"):
                row = rows[f"{method}, {where} vs NetKet {ref}"]
                assert row["error"] <= row["bound"], (method, where, ref, row)
    assert all(r["error"] <= r["bound"] for r in rows.values())
