r"""A ready-made wavefunction for Chapter 5: the Slater determinant of MLP orbitals
times Gaussian envelopes, its parameters, and its Laplacian by hand.

The model, for ``n`` electrons at positions :math:`r_1..r_n` (rows of an ``(n, 3)``
array) and a hidden width :math:`H`:

.. math::
   \varphi_j(r) &= \big(\tanh(rW_1+b_1)\,W_2 + b_2 + rW_l\big)_j\,
       e^{-s_j|r|^2/2},\\
   s &= \mathrm{softplus}(d),\\
   \log|\psi(r_1..r_n)| &= \log\big|\det[\varphi_j(r_i)]_{ij}\big|,

with :math:`W_1` ``(3, H)``, :math:`b_1` ``(H,)``, :math:`W_2` ``(H, n)``, :math:`b_2`
``(n,)``, :math:`W_l` ``(3, n)`` and :math:`d` ``(n,)``. Each orbital reads one
electron, so the row formula of :mod:`beyondgrad.slater` applies, and the envelopes
make :math:`\psi` normalisable in the harmonic trap of :mod:`beyondgrad.vmc`.

What it provides
----------------
* :func:`init_params` makes the parameters, a dict of the six arrays above, for a
  given number of electrons; the parameters fix ``n``.
* :func:`mlp_log_psi` is a wavefunction in the sense of :mod:`beyondgrad.vmc`:
  ``log_psi(params, positions (n, 3)) -> scalar``. It checks (at trace time, no
  FLOPs) that ``positions`` holds as many electrons as ``params`` was made for, and
  says so with both numbers when it does not.
* :func:`mlp_orbitals` maps positions ``(..., 3)`` to orbital values ``(..., n)``.
* :func:`mlp_slater_laplacian` gives :math:`(\log|\psi|, \nabla\log|\psi|,
  \Delta\log|\psi|)` with the orbitals differentiated by hand (the classical quantum
  Monte Carlo route), exact and :math:`O(n^3 + n^2H)`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks
from beyondgrad.laplacian import check_key
from beyondgrad.slater import check_positions, logdet_and_inverse, slater_log_psi

__all__ = [
    "Params",
    "init_params",
    "mlp_log_psi",
    "mlp_orbitals",
    "mlp_slater_laplacian",
]

#: parameters of a wavefunction: any pytree of arrays (``init_params`` makes a dict)
Params = Any


def init_params(
    key: jax.Array, n_electrons: int, *, hidden: int = 32, dtype: Any = jnp.float32
) -> Params:
    """Parameters of :func:`mlp_orbitals` for ``n_electrons`` orbitals and one hidden layer.

    The ``n`` orbitals are combinations of ``hidden + 4`` functions (the hidden features,
    1, x, y, z) times their envelopes, so keep ``hidden`` comfortably above ``n``: with
    ``hidden + 4 < n`` the determinant is close to 0 everywhere.

    Args:
        key: a PRNG key (``jax.random.key(0)``).
        n_electrons: the number of electrons (and orbitals), a positive int.
        hidden: the hidden width :math:`H`, a positive int.
        dtype: a floating-point dtype.

    Returns:
        A dict of six arrays, by key and shape: ``w1`` ``(3, hidden)``, ``b1``
        ``(hidden,)``, ``w2`` ``(hidden, n)``, ``b2`` ``(n,)``, ``wl`` ``(3, n)`` and
        ``decay`` ``(n,)``.

    Raises:
        TypeError: ``key`` is not a PRNG key; ``dtype`` is not floating-point.
        ValueError: ``n_electrons`` or ``hidden`` is not a positive int.
    """
    check_key(key)
    _checks.integer(n_electrons, "n_electrons", minimum=1)
    _checks.integer(hidden, "hidden", minimum=1, meaning="the hidden width")
    try:
        floating = jnp.issubdtype(dtype, jnp.floating)
    except TypeError:
        floating = False
    if not floating:
        raise TypeError(
            f"dtype must be a floating-point dtype (jnp.float32 or jnp.float64), got "
            f"{dtype!r}"
        )
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    n = n_electrons
    return {
        "w1": jax.random.normal(k1, (3, hidden), dtype),
        "b1": 0.5 * jax.random.normal(k2, (hidden,), dtype),
        "w2": jax.random.normal(k3, (hidden, n), dtype)
        / jnp.sqrt(jnp.asarray(hidden, dtype)),
        "b2": 0.1 * jax.random.normal(k4, (n,), dtype),
        "wl": jax.random.normal(k5, (3, n), dtype),
        # distinct envelope widths per orbital
        "decay": jnp.linspace(-1.0, 1.0, n, dtype=dtype),
    }


def _mlp_parts(
    params: Params, r: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The pieces of :func:`mlp_orbitals` at positions ``r`` ``(..., 3)``: the one definition of the architecture.

    Returns ``(h, u, envelope, s, r2)``: hidden features :math:`\\tanh(rW_1+b_1)` ``(..., H)``,
    read-out :math:`u = hW_2 + b_2 + rW_l` ``(..., n)``, envelopes
    :math:`e^{-s|r|^2/2}` ``(..., n)``, widths :math:`s=\\mathrm{softplus}(d)` ``(n,)`` and
    :math:`|r|^2` ``(..., 1)``; the orbitals are ``u * envelope``.
    """
    h = jnp.tanh(r @ params["w1"] + params["b1"])
    u = h @ params["w2"] + params["b2"] + r @ params["wl"]
    s = jax.nn.softplus(params["decay"])
    r2 = jnp.sum(r * r, axis=-1, keepdims=True)
    return h, u, jnp.exp(-0.5 * s * r2), s, r2


def mlp_orbitals(params: Params, r: jax.Array) -> jax.Array:
    """The orbitals :math:`\\varphi(r) = (\\tanh(rW_1+b_1)W_2 + b_2 + rW_l)\\odot e^{-\\mathrm{softplus}(d)|r|^2/2}`.

    Args:
        params: from :func:`init_params`.
        r: positions ``(..., 3)``, floating-point (one electron: ``(3,)``).

    Returns:
        The ``n`` orbital values at each position, ``(..., n)``.

    Raises:
        ValueError: ``r``'s last axis is not 3; ``params`` lacks the layout of
            :func:`init_params`.
        TypeError: ``r`` or ``params`` is not floating-point.
    """
    _check_mlp_params(params)
    r = jnp.asarray(r)
    if r.ndim < 1 or r.shape[-1] != 3:
        raise ValueError(
            f"r must hold positions along a last axis of size 3, shape (..., 3), got "
            f"{r.shape}"
        )
    if not jnp.issubdtype(r.dtype, jnp.floating):
        raise TypeError(f"r must be floating-point, got dtype {r.dtype}")
    _, u, envelope, _, _ = _mlp_parts(params, r)
    return u * envelope


_MLP_SHAPES = {
    "w1": ("3", "H"),
    "b1": ("H",),
    "w2": ("H", "n"),
    "b2": ("n",),
    "wl": ("3", "n"),
    "decay": ("n",),
}


def _params_electrons(params: Params) -> int:
    """The number of electrons ``params`` was made for (the length of ``b2``)."""
    if not isinstance(params, dict) or set(params) != set(_MLP_SHAPES):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(
            f"params must be the dict of init_params with keys {sorted(_MLP_SHAPES)}, "
            f"got {got}"
        )
    shape = jnp.shape(params["b2"])
    if len(shape) != 1:
        raise ValueError(
            f"params['b2'] must have shape (n,) (one entry per electron), got {shape}"
        )
    return int(shape[0])


def _check_mlp_params(params: Params, n: int | None = None) -> int:
    """Check ``params`` has the :func:`init_params` layout; return its electron count.

    With ``n`` given (the electrons of the positions), a different count is an error
    naming both numbers.
    """
    made_for = _params_electrons(params)
    if n is not None and made_for != n:
        raise ValueError(
            f"params were made for {made_for} electrons (init_params(key, {made_for}))"
            f" but the positions hold {n} electrons: make the parameters with "
            f"init_params(key, {n}) or pass positions of shape ({made_for}, 3)"
        )
    n = made_for
    hidden = jnp.shape(params["w1"])[-1] if jnp.ndim(params["w1"]) == 2 else None
    sizes = {"3": 3, "H": hidden, "n": n}
    for name, dims in _MLP_SHAPES.items():
        want = tuple(sizes[d] for d in dims)
        if jnp.shape(params[name]) != want:
            raise ValueError(
                f"params[{name!r}] must have shape {want} for {n} electrons and hidden "
                f"width {hidden} (as made by init_params(key, {n}, hidden=...)), got "
                f"{jnp.shape(params[name])}"
            )
    for name in _MLP_SHAPES:
        dtype = jnp.result_type(params[name])
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"params[{name!r}] has dtype {dtype}; the parameters must be "
                "floating-point (make them with init_params)"
            )
    return n


def mlp_slater_laplacian(
    params: Params, positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""``(log|ψ|, ∇log|ψ|, Δlog|ψ|)`` for :func:`mlp_log_psi`, with the orbital derivatives by hand.

    The classical quantum Monte Carlo route: when the orbitals are known, differentiate
    them analytically, and contract with :math:`B=A^{-1}` as early as possible. With
    :math:`h_i=\tanh(r_iW_1+b_1)`, :math:`h'_i=1-h_i^2`, :math:`u_{ij}=(h_iW_2+b_2+r_iW_l)_j`,
    envelopes :math:`e_{ij}=\exp(-\tfrac12 s_j|r_i|^2)`, :math:`s=\mathrm{softplus}(d)`, so
    :math:`A_{ij}=u_{ij}e_{ij}`, and the weights :math:`E_{ij}=B_{ji}e_{ij}`,
    :math:`F_{ij}=s_jE_{ij}`, :math:`C=EW_2^\top`, :math:`D=FW_2^\top` (``(n, H)`` each):

    .. math::
       \nabla_{r_i}\log|\psi| &= W_1(h'_i\odot C_i) + W_lE_i^\top
            - r_i\textstyle\sum_j F_{ij}u_{ij},\\
       \frac{\Delta\psi}{\psi} &= \sum_i\Big[-2\,(h_i\odot h'_i\odot C_i)\cdot w
            - 2\,r_i\cdot\big(W_1(h'_i\odot D_i)+W_lF_i^\top\big)\\
       &\qquad + \textstyle\sum_j E_{ij}u_{ij}(s_j^2|r_i|^2-3s_j)\Big],

    with :math:`w_h=\sum_k (W_1)_{kh}^2`, and
    :math:`\Delta\log|\psi| = \Delta\psi/\psi - |\nabla\log|\psi||^2`. Contracting
    :math:`B` into the read-out :math:`W_2` first leaves three ``(n, n) x (n, H)`` products
    (:math:`u`, :math:`C`, :math:`D`) where forward mode needs five (value, three
    gradient components, Laplacian) and forward-over-forward more. Exact, :math:`O(n^3 + n^2H)`,
    valid for :func:`mlp_orbitals` only; :func:`~beyondgrad.slater.slater_laplacian` takes any orbitals.

    Args:
        params: from :func:`init_params` for ``n`` electrons.
        positions: ``(n, 3)`` floating-point positions.

    Returns:
        ``(log|ψ| (), ∇log|ψ| (n, 3), Δlog|ψ| ())``.

    Raises:
        ValueError: ``positions`` not ``(n, 3)``; ``params`` made for another number
            of electrons or without the layout of :func:`init_params`.
        TypeError: integer positions or parameters.
    """
    positions = check_positions(positions)
    n = positions.shape[0]
    _check_mlp_params(params, n)
    w1, w2, wl = params["w1"], params["w2"], params["wl"]
    hid = w1.shape[1]
    h, u, env, s, r2 = _mlp_parts(
        params, positions
    )  # (n, H), (n, n), (n, n), (n,), (n, 1)
    logdet, b = logdet_and_inverse(u * env)
    e = b.T * env  # E_ij = B_ji e_ij
    f = e * s  # F_ij = s_j E_ij
    # one product for C, D and the linear read-out terms: [E; F] @ [W2; Wl]^T -> (2n, H + 3)
    cd = jnp.concatenate([e, f], axis=0) @ jnp.concatenate([w2, wl], axis=0).T
    c, ew, d, fw = cd[:n, :hid], cd[:n, hid:], cd[n:, :hid], cd[n:, hid:]
    dh = 1.0 - h * h
    back = (
        jnp.concatenate([c * dh, d * dh], axis=0) @ w1.T
    )  # (2n, 3): W1(h' ⊙ C_i), W1(h' ⊙ D_i)
    grad = back[:n] + ew - positions * jnp.sum(f * u, axis=1, keepdims=True)
    lap_psi = (
        -2.0 * jnp.sum(c * dh * h * jnp.sum(w1 * w1, axis=0))
        - 2.0 * jnp.sum(positions * (back[n:] + fw))
        + jnp.sum(e * u * (s * s * r2 - 3.0 * s))
    )
    return logdet, grad, lap_psi - jnp.sum(grad * grad)


def mlp_log_psi(params: Params, positions: jax.Array) -> jax.Array:
    """:math:`\\log|\\det[\\varphi_j(r_i)]|` for the orbitals of :func:`mlp_orbitals`.

    Args:
        params: from :func:`init_params` for ``n`` electrons.
        positions: ``(n, 3)`` floating-point positions.

    Returns:
        :math:`\\log|\\psi|`, a scalar.

    Raises:
        ValueError: ``positions`` not ``(n, 3)``, or holding another number of
            electrons than ``params`` was made for (both numbers are named).
        TypeError: integer positions or parameters.
    """
    if isinstance(params, (jax.Array, np.ndarray)) and not isinstance(
        positions, (jax.Array, np.ndarray)
    ):
        raise TypeError(
            f"mlp_log_psi got an array of shape {jnp.shape(params)} as params and a "
            f"{type(positions).__name__} as positions: arguments swapped? The order "
            "is mlp_log_psi(params, positions)"
        )
    positions = check_positions(positions)
    _check_mlp_params(params, positions.shape[0])
    return slater_log_psi(functools.partial(mlp_orbitals, params), positions)
