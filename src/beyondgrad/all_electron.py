r"""All-electron wavefunctions for Chapter 5: orbitals that read every electron.

The orbitals of :mod:`beyondgrad.wavefunctions` read one electron each, so the row
formula of :mod:`beyondgrad.slater` applies. The networks people train (FermiNet,
PsiFormer and their successors) make every orbital depend on every electron, through
pair features, mean-pooled equivariant layers or attention; there the whole
Laplacian is a forward Laplacian (or a Hessian trace). Two such models, written for
the benchmark and the tests (small, not the published architectures):

FermiNet-like (:func:`ferminet_log_psi`), for ``n`` electrons, ``n_up = n // 2`` of
spin up:

.. math::
   h_i &= (r_i, \rho(r_i)),\quad h_{ij} = (r_i - r_j, \rho(r_i - r_j)),\quad
   \rho(v) = \sqrt{|v|^2 + 1},\\
   h_i &\leftarrow \tanh\big([h_i, \bar h_\uparrow, \bar h_\downarrow,
        \overline{h_{i\cdot}}_\uparrow, \overline{h_{i\cdot}}_\downarrow] W + b\big),\\
   h_{ij} &\leftarrow \tanh(h_{ij} V + c)\quad\text{(each layer)},\\
   \varphi^k_j(i) &= (h_i W^k_\sigma)_j\, e^{-\sigma^k_j \rho(r_i)},\quad
   \log|\psi| = \log\Big|\sum_k \det\varphi^k_\uparrow \det\varphi^k_\downarrow\Big|,

with bars the means over the electrons of one spin (the equivariant pooling) and
the sum over ``k`` a ``logsumexp`` of ``slogdet`` s (one per determinant and spin).

PsiFormer-like (:func:`psiformer_log_psi`): an embedding
:math:`h_i = (r_i, \rho(r_i), s_i) W_0` (``s_i = ±1`` the spin), then per layer
self-attention over the electrons with layer norm,

.. math::
   A &= \mathrm{softmax}\big(\mathrm{LN}(h)W_q\,(\mathrm{LN}(h)W_k)^T/\sqrt{e}\big),\\
   h &\leftarrow h + A\,\mathrm{LN}(h)W_v W_o,\\
   h &\leftarrow h + \tanh(\mathrm{LN}(h) W_1) W_2,

and ``K`` full ``n × n`` determinants of :math:`(h_i W^k)_j e^{-\sigma^k_j\rho(r_i)}`.

Both are wavefunctions in the sense of :mod:`beyondgrad.vmc`:
``log_psi(params, positions (n, 3)) -> scalar``; the parameters fix ``n``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from beyondgrad import _checks
from beyondgrad.laplacian import check_key
from beyondgrad.slater import check_positions

__all__ = [
    "ferminet_log_psi",
    "init_ferminet",
    "init_psiformer",
    "psiformer_log_psi",
]

Params = Any


def _check_sizes(n_electrons: object, **sizes: object) -> None:
    for name, value in {"n_electrons": n_electrons, **sizes}.items():
        _checks.integer(value, name, minimum=1)
    if n_electrons < 2:  # type: ignore[operator]
        raise ValueError(
            f"n_electrons must be at least 2 (one of each spin), got {n_electrons}"
        )


def _dense(key: jax.Array, m: int, k: int, dtype: Any) -> jax.Array:
    return jax.random.normal(key, (m, k), dtype) / jnp.sqrt(jnp.asarray(m, dtype))


def _rho(v: jax.Array) -> jax.Array:
    """A smoothed length ``sqrt(|v|^2 + 1)`` over the last axis (smooth at v = 0)."""
    return jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True) + 1.0)


def _logsumdet(signs: jax.Array, logdets: jax.Array) -> jax.Array:
    """``log|sum_k signs_k exp(logdets_k)|`` (the multi-determinant sum)."""
    shift = jax.lax.stop_gradient(jnp.max(logdets))
    return jnp.log(jnp.abs(jnp.sum(signs * jnp.exp(logdets - shift)))) + shift


def _check_call(
    name: str, params: Params, positions: jax.Array, key: str, n_of: Any
) -> jax.Array:
    if not isinstance(params, dict) or key not in params:
        raise TypeError(
            f"{name}(params, positions) needs params from its init function (a dict "
            f"with {key!r}), got {type(params).__name__}: arguments swapped?"
        )
    positions = check_positions(positions)
    n = n_of(params)
    if positions.shape[0] != n:
        raise ValueError(
            f"{name}: params were made for {n} electrons, positions hold "
            f"{positions.shape[0]}"
        )
    return positions


def init_ferminet(
    key: jax.Array,
    n_electrons: int,
    *,
    width: int = 16,
    pair_width: int = 8,
    layers: int = 2,
    determinants: int = 2,
    dtype: Any = jnp.float32,
) -> Params:
    """Parameters of :func:`ferminet_log_psi`.

    Args:
        key: a PRNG key.
        n_electrons: ``n >= 2`` (``n // 2`` spin up, the rest down).
        width: one-electron stream width.
        pair_width: two-electron stream width.
        layers: equivariant layers.
        determinants: ``K``, the determinants summed.
        dtype: a floating-point dtype.

    Returns:
        A dict: ``layers`` (a list of ``(W, b, V, c)``), ``orb_up``
        ``(K, width, n_up)``, ``orb_down`` ``(K, width, n_down)``, ``sigma_up``,
        ``sigma_down`` (same shapes without ``width``) and ``n`` (an int).
    """
    check_key(key)
    _check_sizes(
        n_electrons,
        width=width,
        pair_width=pair_width,
        layers=layers,
        determinants=determinants,
    )
    n_up = n_electrons // 2
    n_down = n_electrons - n_up
    keys = iter(jax.random.split(key, 4 * layers + 4))
    one, two = 4, 4
    stack = []
    for _ in range(layers):
        fan_in = 3 * one + 2 * two
        stack.append(
            (
                _dense(next(keys), fan_in, width, dtype),
                0.1 * jax.random.normal(next(keys), (width,), dtype),
                _dense(next(keys), two, pair_width, dtype),
                0.1 * jax.random.normal(next(keys), (pair_width,), dtype),
            )
        )
        one, two = width, pair_width
    k = determinants
    return {
        "layers": stack,
        "orb_up": jax.random.normal(next(keys), (k, width, n_up), dtype),
        "orb_down": jax.random.normal(next(keys), (k, width, n_down), dtype),
        "sigma_up": 1.0 + 0.1 * jax.random.uniform(next(keys), (k, n_up), dtype),
        "sigma_down": 1.0 + 0.1 * jax.random.uniform(next(keys), (k, n_down), dtype),
    }


def _ferminet_n(params: Params) -> int:
    return int(params["orb_up"].shape[-1] + params["orb_down"].shape[-1])


def ferminet_log_psi(params: Params, positions: jax.Array) -> jax.Array:
    """:math:`\\log|\\psi|` of the FermiNet-like model (module docstring).

    Args:
        params: from :func:`init_ferminet` for ``n`` electrons.
        positions: ``(n, 3)`` floating-point positions.

    Returns:
        A scalar.

    Raises:
        ValueError: ``positions`` not ``(n, 3)`` for the ``n`` of ``params``.
        TypeError: ``params`` not from :func:`init_ferminet`; integer positions.
    """
    r = _check_call("ferminet_log_psi", params, positions, "orb_up", _ferminet_n)
    n_up = params["orb_up"].shape[-1]
    h = jnp.concatenate([r, _rho(r)], axis=-1)  # (n, 4)
    diff = r[:, None, :] - r[None, :, :]
    h2 = jnp.concatenate([diff, _rho(diff)], axis=-1)  # (n, n, 4)
    for w, b, v, c in params["layers"]:
        up, down = h[:n_up].mean(0), h[n_up:].mean(0)
        pair_up, pair_down = h2[:, :n_up].mean(1), h2[:, n_up:].mean(1)
        pooled = jnp.broadcast_to(
            jnp.concatenate([up, down]), (h.shape[0], 2 * h.shape[1])
        )
        f = jnp.concatenate([h, pooled, pair_up, pair_down], axis=-1)
        h_new = jnp.tanh(f @ w + b)
        h = h_new + h if h_new.shape == h.shape else h_new
        h2_new = jnp.tanh(h2 @ v + c)
        h2 = h2_new + h2 if h2_new.shape == h2.shape else h2_new
    dist = _rho(r)  # (n, 1)
    phi_up = jnp.einsum("if,kfj->kij", h[:n_up], params["orb_up"]) * jnp.exp(
        -params["sigma_up"][:, None, :] * dist[None, :n_up]
    )
    phi_down = jnp.einsum("if,kfj->kij", h[n_up:], params["orb_down"]) * jnp.exp(
        -params["sigma_down"][:, None, :] * dist[None, n_up:]
    )
    s_up, l_up = jnp.linalg.slogdet(phi_up)
    s_down, l_down = jnp.linalg.slogdet(phi_down)
    return _logsumdet(s_up * s_down, l_up + l_down)


def init_psiformer(
    key: jax.Array,
    n_electrons: int,
    *,
    width: int = 16,
    layers: int = 2,
    determinants: int = 2,
    dtype: Any = jnp.float32,
) -> Params:
    """Parameters of :func:`psiformer_log_psi`.

    Args:
        key: a PRNG key.
        n_electrons: ``n >= 2`` (``n // 2`` spin up, the rest down).
        width: the embedding width ``e``.
        layers: attention layers.
        determinants: ``K``, full ``n × n`` determinants summed.
        dtype: a floating-point dtype.

    Returns:
        A dict: ``embed`` ``(5, e)``, ``layers`` (a list of dicts of ``q, k, v, o,
        w1, w2``, each ``(e, e)``), ``orbitals`` ``(K, e, n)``, ``sigma`` ``(K, n)``,
        ``spins`` ``(n,)``.
    """
    check_key(key)
    _check_sizes(n_electrons, width=width, layers=layers, determinants=determinants)
    n_up = n_electrons // 2
    keys = iter(jax.random.split(key, 6 * layers + 3))
    stack = [
        {name: _dense(next(keys), width, width, dtype) for name in "qkvo"}
        | {name: _dense(next(keys), width, width, dtype) for name in ("w1", "w2")}
        for _ in range(layers)
    ]
    spins = jnp.where(jnp.arange(n_electrons) < n_up, 1.0, -1.0).astype(dtype)
    return {
        "embed": _dense(next(keys), 5, width, dtype),
        "layers": stack,
        "orbitals": jax.random.normal(
            next(keys), (determinants, width, n_electrons), dtype
        ),
        "sigma": 1.0
        + 0.1 * jax.random.uniform(next(keys), (determinants, n_electrons), dtype),
        "spins": spins,
    }


def _layer_norm(h: jax.Array) -> jax.Array:
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
    return (h - mean) / jnp.sqrt(var + 1e-5)


def _psiformer_n(params: Params) -> int:
    return int(params["orbitals"].shape[-1])


def psiformer_log_psi(params: Params, positions: jax.Array) -> jax.Array:
    """:math:`\\log|\\psi|` of the PsiFormer-like model (module docstring).

    Args:
        params: from :func:`init_psiformer` for ``n`` electrons.
        positions: ``(n, 3)`` floating-point positions.

    Returns:
        A scalar.

    Raises:
        ValueError: ``positions`` not ``(n, 3)`` for the ``n`` of ``params``.
        TypeError: ``params`` not from :func:`init_psiformer`; integer positions.
    """
    r = _check_call("psiformer_log_psi", params, positions, "orbitals", _psiformer_n)
    spins = params["spins"].astype(r.dtype)[:, None]
    h = jnp.concatenate([r, _rho(r), spins], axis=-1) @ params["embed"]
    scale = 1.0 / jnp.sqrt(jnp.asarray(h.shape[-1], h.dtype))
    for layer in params["layers"]:
        x = _layer_norm(h)
        att = jax.nn.softmax((x @ layer["q"]) @ (x @ layer["k"]).T * scale, axis=-1)
        h = h + (att @ (x @ layer["v"])) @ layer["o"]
        h = h + jnp.tanh(_layer_norm(h) @ layer["w1"]) @ layer["w2"]
    phi = jnp.einsum("if,kfj->kij", h, params["orbitals"]) * jnp.exp(
        -params["sigma"][:, None, :] * _rho(r)[None]
    )
    signs, logdets = jnp.linalg.slogdet(phi)
    return _logsumdet(signs, logdets)
