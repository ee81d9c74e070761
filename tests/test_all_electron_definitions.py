"""The all-electron models against their documented definitions (the module docstring
of ``beyondgrad.all_electron``), not only against their own Hessian: an independent
per-electron implementation written here (loops over electrons, ``det`` rather than
``slogdet``, explicit per-spin means, attention normalised over keys) gives the
signed ψ; the models' log|ψ| must equal log|ψ_ref| to float64 rounding, and ψ_ref
changes sign under the exchange of two same-spin electrons (of either spin).

Each of these mutations of ``all_electron.py`` makes a test here fail (checked by
applying it, running this file, and reverting): spin-down pooling reading the
spin-up mean; attention normalised over queries; pair features pooled over all
electrons; determinants summed without their signs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import all_electron

N = 5  # 2 up, 3 down: both spins have an exchange


def _rho(v):
    return jnp.sqrt(jnp.dot(v, v) + 1.0)


def _mean(rows):
    return sum(rows[1:], rows[0]) / len(rows)


def _ferminet_psi(params, r):
    """ψ of the FermiNet-like model, electron by electron (module docstring)."""
    n = r.shape[0]
    n_up = params["orb_up"].shape[-1]
    spin = [range(n_up), range(n_up, n)]
    h = [jnp.concatenate([r[i], _rho(r[i])[None]]) for i in range(n)]
    h2 = [
        [jnp.concatenate([r[i] - r[j], _rho(r[i] - r[j])[None]]) for j in range(n)]
        for i in range(n)
    ]
    for w, b, v, c in params["layers"]:
        pooled = [_mean([h[j] for j in s]) for s in spin]
        new_h = []
        for i in range(n):
            pair = [_mean([h2[i][j] for j in s]) for s in spin]
            f = jnp.concatenate([h[i], *pooled, *pair])
            out = jnp.tanh(f @ w + b)
            new_h.append(out + h[i] if out.shape == h[i].shape else out)
        new_h2 = []
        for i in range(n):
            row = []
            for j in range(n):
                out = jnp.tanh(h2[i][j] @ v + c)
                row.append(out + h2[i][j] if out.shape == h2[i][j].shape else out)
            new_h2.append(row)
        h, h2 = new_h, new_h2
    psi = 0.0
    for k in range(params["orb_up"].shape[0]):
        dets = []
        for s, orb, sig in (
            (spin[0], params["orb_up"][k], params["sigma_up"][k]),
            (spin[1], params["orb_down"][k], params["sigma_down"][k]),
        ):
            phi = jnp.stack([(h[i] @ orb) * jnp.exp(-sig * _rho(r[i])) for i in s])
            dets.append(jnp.linalg.det(phi))
        psi = psi + dets[0] * dets[1]
    return psi


def _layer_norm(x):
    mu = jnp.mean(x)
    return (x - mu) / jnp.sqrt(jnp.mean((x - mu) ** 2) + 1e-5)


def _psiformer_psi(params, r):
    """ψ of the PsiFormer-like model, electron by electron (module docstring)."""
    n = r.shape[0]
    e = params["embed"].shape[1]
    h = [
        jnp.concatenate([r[i], _rho(r[i])[None], params["spins"][i][None]])
        @ params["embed"]
        for i in range(n)
    ]
    for layer in params["layers"]:
        x = [_layer_norm(hi) for hi in h]
        q = [xi @ layer["q"] for xi in x]
        kk = [xi @ layer["k"] for xi in x]
        vv = [xi @ layer["v"] for xi in x]
        new_h = []
        for i in range(n):  # query i attends over the keys j: normalised over j
            logits = jnp.stack([jnp.dot(q[i], kk[j]) / np.sqrt(e) for j in range(n)])
            weights = jnp.exp(logits - jnp.max(logits))
            weights = weights / jnp.sum(weights)
            mixed = sum((weights[j] * vv[j] for j in range(1, n)), weights[0] * vv[0])
            new_h.append(h[i] + mixed @ layer["o"])
        h = [hi + jnp.tanh(_layer_norm(hi) @ layer["w1"]) @ layer["w2"] for hi in new_h]
    psi = 0.0
    for k in range(params["orbitals"].shape[0]):
        phi = jnp.stack(
            [
                (h[i] @ params["orbitals"][k])
                * jnp.exp(-params["sigma"][k] * _rho(r[i]))
                for i in range(n)
            ]
        )
        psi = psi + jnp.linalg.det(phi)
    return psi


MODELS = {
    "ferminet": (all_electron.init_ferminet, all_electron.ferminet_log_psi),
    "psiformer": (all_electron.init_psiformer, all_electron.psiformer_log_psi),
}
REFERENCES = {"ferminet": _ferminet_psi, "psiformer": _psiformer_psi}


def _setup(name):
    init, log_psi = MODELS[name]
    params = init(jax.random.key(7), N, width=8, layers=2, dtype=jnp.float64)
    configs = jax.random.normal(jax.random.key(8), (3, N, 3), jnp.float64)
    return params, log_psi, configs


def _swap(pos, i, j):
    return pos.at[jnp.array([i, j])].set(pos[jnp.array([j, i])])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_log_psi_equals_the_independent_implementation(name):
    """log|ψ| against log|ψ_ref| at three configurations and at configurations with
    one up-down pair exchanged (which the per-spin pooling and the spin-resolved
    determinants do not treat symmetrically). float64: both sides are O(10) flops
    deep in tanh/exp/det of O(1) numbers, so they agree to ~1e-14 relative;
    rtol 1e-10 leaves room for the det of a mildly ill-conditioned φ (cond ≲ 1e3)."""
    with jax.enable_x64(True):
        params, log_psi, configs = _setup(name)
        ref = REFERENCES[name]
        for pos in [*configs, _swap(configs[0], 0, 3), _swap(configs[1], 1, 4)]:
            want = float(jnp.log(jnp.abs(ref(params, pos))))
            np.testing.assert_allclose(float(log_psi(params, pos)), want, rtol=1e-10)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("pair", [(0, 1), (2, 3), (2, 4), (3, 4)])
def test_psi_changes_sign_under_same_spin_exchange(name, pair):
    """ψ (sign included) is antisymmetric under exchanging two same-spin electrons
    (up: 0, 1; down: 2, 3, 4); the model's log|ψ| is unchanged, and equals the
    reference's on both sides (so the model is the antisymmetric ψ, not another
    function with the same modulus at one point)."""
    with jax.enable_x64(True):
        params, log_psi, configs = _setup(name)
        ref = REFERENCES[name]
        pos = configs[2]
        swapped = _swap(pos, *pair)
        a, b = float(ref(params, pos)), float(ref(params, swapped))
        assert abs(a) > 1e-6  # not at a node, where the sign says nothing
        np.testing.assert_allclose(b, -a, rtol=1e-11)
        np.testing.assert_allclose(
            float(log_psi(params, swapped)), float(log_psi(params, pos)), rtol=1e-12
        )
        np.testing.assert_allclose(
            float(log_psi(params, pos)), np.log(abs(a)), rtol=1e-10
        )


def test_ferminet_pooling_is_per_spin():
    """Moving only the spin-down electrons changes the spin-down means that every
    electron's features read: the spin-up block of the model must change with them
    exactly as the reference's does (a model that pooled the spin-down stream from
    the spin-up electrons, or pair features over all electrons, differs)."""
    with jax.enable_x64(True):
        params, log_psi, configs = _setup("ferminet")
        pos = configs[0]
        moved = pos.at[2:].add(0.3)
        for p in (pos, moved):
            want = float(jnp.log(jnp.abs(_ferminet_psi(params, p))))
            np.testing.assert_allclose(float(log_psi(params, p)), want, rtol=1e-10)


def test_psiformer_attention_normalises_over_keys():
    """With one attention layer, the model equals the reference whose softmax runs
    over the keys (each query's weights sum to 1); weights normalised over the
    queries give another value."""
    with jax.enable_x64(True):
        init, log_psi = MODELS["psiformer"]
        params = init(jax.random.key(9), N, width=8, layers=1, dtype=jnp.float64)
        pos = jax.random.normal(jax.random.key(10), (N, 3), jnp.float64)
        want = float(jnp.log(jnp.abs(_psiformer_psi(params, pos))))
        np.testing.assert_allclose(float(log_psi(params, pos)), want, rtol=1e-10)
