"""beyondgrad.sharded_vmc.train on a system with a known exact energy (Taut's two
electrons in a trap at omega = 1/2, E = 2 Ha: beyondgrad.vmc_problems), the same run
on 1, 2, 4 and 8 devices, the width adaptation, the keys of each step and bad input."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import runtime, vmc
from beyondgrad import sharded_vmc as sv
from beyondgrad import vmc_problems as vp

runtime.ensure_cpu_devices(8)
EPS = float(np.finfo(np.float64).eps)

#: the short training run: 256 walkers equilibrated at the start (100 sweeps), then
#: 60 steps of 5 sweeps, SR at learning rate 0.05
RUN = dict(
    steps=60,
    learning_rate=0.05,
    damping=1e-3,
    width=1.0,
    sweeps=5,
    target_acceptance=0.5,
    omega=vp.TAUT_OMEGA,
)
WALKERS = 256


@functools.cache
def _start():
    with jax.enable_x64(True):
        params = vp.taut_params()  # a = 0.4, b = 0.05: E about 2.37 Ha
        x = jax.random.normal(jax.random.key(1), (WALKERS, 2, 3), jnp.float64)
        x, _ = sv.metropolis(
            vp.taut_log_psi, params, x, jax.random.key(2), steps=100, step_size=1.0
        )
    return params, x


@functools.cache
def _trained(devices: int):
    params, x = _start()
    mesh = None if devices == 1 else runtime.demo_mesh(devices, "data")
    with jax.enable_x64(True):
        theta, walkers, history = sv.train(
            vp.taut_log_psi, params, x, jax.random.key(0), mesh=mesh, **RUN
        )
    return (
        jax.tree.map(np.asarray, theta),
        np.asarray(walkers),
        sv.TrainingHistory(*map(np.asarray, history)),
    )


def test_taut_closed_form_is_an_eigenstate():
    """psi_0 = (1 + r12/2) exp(-(r1^2 + r2^2)/4) has E_L = 2 everywhere (float64, the
    package's local energy, two Laplacian routes), and the ansatz at TAUT_EXACT is
    psi_0: E_L = 2 to float64 rounding (terms of size <= 10 at |r| <= 6: 10 x 2.2e-16
    per operation, a few tens of operations: 1e-13)."""

    def exact(params, x):
        r12 = jnp.sqrt(jnp.sum((x[0] - x[1]) ** 2))
        return -0.25 * jnp.sum(x * x) + jnp.log1p(0.5 * r12)

    with jax.enable_x64(True):
        x = 1.5 * jax.random.normal(jax.random.key(5), (64, 2, 3), jnp.float64)
        forward = sv.local_energies(exact, {}, x, omega=vp.TAUT_OMEGA)
        hessian = jax.vmap(
            lambda r: vmc.local_energy(
                exact, {}, r, method="hessian", omega=vp.TAUT_OMEGA
            )
        )(x)
        ansatz = sv.local_energies(
            vp.taut_log_psi, vp.taut_params(*vp.TAUT_EXACT), x, omega=vp.TAUT_OMEGA
        )
        away = sv.local_energies(
            vp.taut_log_psi, vp.taut_params(), x, omega=vp.TAUT_OMEGA
        )
    for e in (forward, hessian, ansatz):
        assert np.max(np.abs(np.asarray(e) - vp.TAUT_ENERGY)) < 1e-13
    assert np.std(np.asarray(away)) > 0.1  # the start is no eigenstate


def test_training_reaches_the_exact_energy():
    """From E about 2.37 Ha (variance about 0.6) to E = 2 within the stated error.

    The error: the blocked standard error SE of the per-step energies over the last
    30 steps (10 blocks of 3 steps: the blocks absorb the correlation of steps 5
    sweeps apart), 4 SE, plus the bias of the last steps' parameters, which is
    positive (variational) and at most sigma^2 / gap by Temple's bound; the gap to the
    next state of the ansatz' symmetry (L = 0, even) is 2 omega = 1 Ha for the centre
    of mass and of that order for the relative motion: 0.5 Ha is taken, with room.
    Zero variance: the variance of E_L falls by more than 1000 (measured: from 0.6
    to about 1e-5)."""
    theta, _, h = _trained(1)
    # step 0 measures the start: walkers equilibrated at theta_0 (100 + 5 sweeps)
    assert h.energy[0] > 2.1 and np.all(h.dropped == 0)
    mean, se = sv.blocked_mean(h.energy[-30:], blocks=10)
    bias = float(np.mean(h.variance[-30:])) / 0.5
    assert se < 1e-3  # the error is small enough to mean something
    assert abs(mean - vp.TAUT_ENERGY) < 4 * se + bias, (mean, se, bias)
    assert h.variance[-1] < 1e-3 * h.variance[0], (h.variance[0], h.variance[-1])
    with jax.enable_x64(True):
        a, b = (float(jax.nn.softplus(theta[k])) for k in ("a", "b"))
    # the parameters of the exact state: a variance of 1e-5 allows deviations of
    # order sqrt(1e-5) ~ 3e-3 in a and b (E_L - 2 is linear in them)
    assert abs(a - 0.25) < 0.02 and abs(b - 0.5) < 0.05, (a, b)


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_trajectory_is_the_same_on_every_device_count(devices):
    """Same key, 1 device or ``devices``: the same walkers, acceptances and widths
    bit for bit (the draws are per walker, the acceptance an exact count), and
    energies and parameters that differ by rounding only. The bound: each step's update differs by the order of
    its sums, at most 100 cond(S + lambda I) eps relative (as in test_sharded_vmc);
    cond <= (1 + 1e-3) / 1e-3 ~ 1e3 (O's variance is O(1) here, lambda = 1e-3) and
    |delta| <= 1, so theta moves apart by at most lr x 100 x 1e3 x eps = 1.1e-12 a
    step, 6.6e-11 in 60 steps. The energy is a sum of N = 256 local energies of the
    same walkers in another order (N eps relative) whose theta-derivative is below 10
    at |r| < 10: 2 N eps + 10 x 6.6e-11 = 6.6e-10. Measured: 2.2e-16 (one ulp)."""
    one, many = _trained(1), _trained(devices)
    assert np.array_equal(one[1], many[1])
    assert np.array_equal(one[2].acceptance, many[2].acceptance)
    assert np.array_equal(one[2].width, many[2].width)
    assert np.array_equal(one[2].dropped, many[2].dropped)
    theta_tol = RUN["steps"] * RUN["learning_rate"] * 100 * 1e3 * EPS
    for k in ("a", "b"):
        assert abs(float(one[0][k] - many[0][k])) < theta_tol
    tol = 2 * WALKERS * EPS + 10 * theta_tol
    assert np.max(np.abs(one[2].energy / many[2].energy - 1)) < tol
    # the variance: the same sums of squares, of size <= 1
    assert np.max(np.abs(one[2].variance - many[2].variance)) < tol


@pytest.mark.parametrize("method", ["minsr", "srt", "cg"])
def test_every_method_trains_as_sr(method):
    """The same 10 steps on 8 devices with each natural-gradient method: the
    energies follow SR's. The bound, as above with 10 steps: a direct solve's update
    differs by at most 100 cond eps relative, CG's by 10 cond tol (its default tol
    1e-10 in float64; test_sharded_vmc's CG bound), cond <= 1e3: theta moves apart by
    at most steps x lr x that, and the energy by 10 x that plus 2 N eps."""
    params, x = _start()
    mesh = runtime.demo_mesh(8, "data")
    run = dict(RUN, steps=10)
    energies = {}
    with jax.enable_x64(True):
        for m in ("sr", method):
            _, _, history = sv.train(
                vp.taut_log_psi,
                params,
                x,
                jax.random.key(0),
                mesh=mesh,
                method=m,
                **run,
            )
            energies[m] = np.asarray(history.energy)
    per_step = 10 * 1e3 * 1e-10 if method == "cg" else 100 * 1e3 * EPS
    tol = 2 * WALKERS * EPS + 10 * run["steps"] * run["learning_rate"] * per_step
    assert np.max(np.abs(energies[method] / energies["sr"] - 1)) < tol
    # the run moved: not a comparison of two untrained states
    assert energies["sr"][0] - energies["sr"][-1] > 0.05


def _fixed(params, x):
    """|psi|^2 a Gaussian of width 1, independent of the parameter (O = 0: delta = 0
    and theta never moves), so the chain's law does not change from step to step."""
    return -0.5 * jnp.sum(x * x) + 0.0 * params["c"]


def test_width_adaptation_and_per_step_keys():
    """Width: started 4x too wide (acceptance about 0.1), the width follows
    sigma_{t+1} = sigma_t exp(gamma (A_t - a*)) and the acceptance reaches the target
    (the mean of the last 10 steps' acceptance within 0.05 of 0.5: each is a mean of
    64 x 4 = 256 moves, sd <= 0.03, and 10 of them, correlated, sd under 0.02).
    Keys: step t's walkers are those of metropolis from step t-1's walkers with key
    fold_in(key, t): the chains are carried, the keys fresh per step (the same key
    every step, or chains restarted from the start, give other walkers)."""
    key = jax.random.key(7)
    with jax.enable_x64(True):
        params = {"c": jnp.zeros((), jnp.float64)}
        x0 = jax.random.normal(jax.random.key(8), (64, 2, 3), jnp.float64)
        kw = dict(learning_rate=0.1, damping=1e-3, width=4.0, sweeps=4, omega=1.0)
        _, x3, h3 = sv.train(_fixed, params, x0, key, steps=3, **kw)
        _, _, h = sv.train(_fixed, params, x0, key, steps=40, **kw)
        chain = jax.jit(
            lambda x, k, s: sv.metropolis(_fixed, params, x, k, steps=4, step_size=s)
        )
        x, same, restarted = x0, x0, x0
        for t in range(3):
            x, _ = chain(x, jax.random.fold_in(key, t), h3.width[t])
            same, _ = chain(same, jax.random.fold_in(key, 0), h3.width[t])
            restarted, _ = chain(x0, jax.random.fold_in(key, t), h3.width[t])
    acc, width = np.asarray(h.acceptance), np.asarray(h.width)
    # the rule, step by step (exp in XLA and NumPy: a few ulps)
    np.testing.assert_allclose(
        width[1:], width[:-1] * np.exp(acc[:-1] - 0.5), rtol=1e-14
    )
    assert acc[0] < 0.3 and width[0] == 4.0
    assert abs(np.mean(acc[-10:]) - 0.5) < 0.05, acc
    assert np.array_equal(np.asarray(h3.acceptance), acc[:3])
    # one compiled program against three: fused updates may round differently
    assert np.max(np.abs(np.asarray(x3) - np.asarray(x))) < 1e-13
    assert np.max(np.abs(np.asarray(x3) - np.asarray(same))) > 0.1
    assert np.max(np.abs(np.asarray(x3) - np.asarray(restarted))) > 0.1


def test_blocked_mean_against_numpy():
    """Blocks of the last 3 x 10 values (the first 2 of 32 left out), by hand."""
    v = np.random.default_rng(0).normal(size=32)
    means = v[2:].reshape(10, 3).mean(1)
    mean, se = sv.blocked_mean(v, blocks=10)
    assert mean == pytest.approx(means.mean(), rel=1e-15)
    assert se == pytest.approx(means.std(ddof=1) / np.sqrt(10), rel=1e-14)


W = jnp.ones((8, 2, 3))
K = jax.random.key(0)
P0 = {"a": jnp.ones(()), "b": jnp.ones(())}
GOOD = dict(steps=1, learning_rate=0.1, damping=1e-3, width=1.0)


def _train(**changes):
    args = dict(log_psi=vp.taut_log_psi, params=P0, walkers=W, key=K) | GOOD
    args |= changes
    return sv.train(
        args.pop("log_psi"), args.pop("params"), args.pop("walkers"), args.pop("key"),
        **args,
    )  # fmt: skip


@pytest.mark.parametrize(
    "changes, exc, words",
    [
        (dict(log_psi=3), TypeError, "log_psi"),
        (dict(walkers=jnp.ones((8, 6))), ValueError, "batch, n, 3"),
        (dict(walkers=jnp.ones((8, 2, 3), int)), TypeError, "floating"),
        (dict(key=0), TypeError, "jax.random.key"),
        (dict(params={"a": jnp.ones((), int)}), TypeError, "params"),
        (dict(params={}), ValueError, "taut_params"),
        (dict(steps=0), ValueError, "steps"),
        (dict(sweeps=2.0), TypeError, "sweeps"),
        (dict(learning_rate=0.0), ValueError, "learning_rate"),
        (dict(damping=-1.0), ValueError, "damping"),
        (dict(width=0), ValueError, "width"),
        (dict(target_acceptance=1.0), ValueError, "target_acceptance"),
        (dict(adapt_rate=-0.1), ValueError, "adapt_rate"),
        (dict(method="kfac"), ValueError, "one of 'sr', 'minsr', 'srt', 'cg'"),
        (dict(mesh="data"), TypeError, "demo_mesh"),
        (dict(mesh=runtime.demo_mesh(8, "data"), axis_name="batch"), ValueError,
         "one of ('data',)"),
        (dict(mesh=runtime.demo_mesh(8, "data"), walkers=jnp.ones((12, 2, 3))),
         ValueError, "multiple of 8"),
        (dict(omega="1"), TypeError, "omega"),
    ],
)  # fmt: skip
def test_bad_input(changes, exc, words):
    with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
        _train(**changes)


def test_metropolis_traced_width_is_checked_when_concrete():
    with pytest.raises(ValueError, match="step_size"):
        sv.metropolis(vp.taut_log_psi, P0, W, K, steps=1, step_size=jnp.zeros(()))
    with pytest.raises(TypeError, match="scalar"):
        sv.metropolis(vp.taut_log_psi, P0, W, K, steps=1, step_size=jnp.ones(2))
