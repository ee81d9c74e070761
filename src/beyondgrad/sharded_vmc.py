r"""A sharded VMC step (Chapter 6): sampling, local energies, clipping, per-walker
gradients and a natural-gradient (SR / MinSR) update, each written once for one
device and for the body of ``jax.shard_map``.

Every function takes ``axis_name``: ``None`` runs on one device (the batch is all the
walkers); a mesh axis name makes it the body of a ``shard_map`` whose walkers are
split over that axis (``in_specs`` ``P(axis_name)``) and whose parameters and keys are
replicated (``P()``). Global quantities are then assembled with collectives, and the
results that ``out_specs`` declares replicated are invariant.

The Hamiltonian is Chapter 5's (:mod:`beyondgrad.vmc`): ``n`` electrons in a harmonic
trap of frequency :math:`\omega` with Coulomb repulsion,

.. math::
   H = -\tfrac12\sum_i\nabla_{r_i}^2 + \tfrac12\omega^2\sum_i|r_i|^2
       + \sum_{i<j}\frac1{|r_i-r_j|},

and ``log_psi(params, positions (n, 3)) -> scalar`` follows that module's contract.

With :math:`O_{bk} = \partial_{\theta_k}\log|\psi(x_b)|` (:func:`per_walker_grads`),
:math:`\bar O`, :math:`\bar E` the means over all :math:`N` walkers,
:math:`\tilde O = (O-\bar O)/\sqrt N` and :math:`\epsilon = (E_L-\bar E)/\sqrt N`,
the energy gradient is :math:`g = 2\tilde O^\top\epsilon` and
(:func:`natural_gradient`)

.. math::
   \delta_{\rm SR} = (\tilde O^\top\tilde O + \lambda I)^{-1} g, \qquad
   \delta_{\rm MinSR} = \tilde O^\top(\tilde O\tilde O^\top + \lambda I)^{-1}
   2\epsilon,

which are equal (push-through identity): SR solves in parameter space
(:math:`P\times P`, assembled with a ``psum``), MinSR in walker space (:math:`N\times
N`, from an ``all_gather`` of :math:`\tilde O`). SRt is MinSR with :math:`\tilde O`
re-sharded by parameters (an ``all_to_all``), so no device holds all of it; CG-SR
solves SR's system by conjugate gradients on products with :math:`\tilde O`, so
:math:`S` is never formed (:func:`natural_gradient`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import _checks, compat
from beyondgrad.forward_laplacian import forward_laplacian
from beyondgrad.laplacian import check_key
from beyondgrad.vmc import (
    check_log_psi,
    check_walkers,
    potential_energy,
    walker_keys,
)
from beyondgrad.wavefunctions import Params

__all__ = [
    "COLLECTIVES",
    "METHODS",
    "TrainingHistory",
    "blocked_mean",
    "clip_local_energies",
    "collective_bytes",
    "collectives_in",
    "kept_energy",
    "kept_walkers",
    "local_energies",
    "metropolis",
    "natural_gradient",
    "nonfinite_walkers",
    "per_walker_grads",
    "train",
]

LogPsi = Callable[[Params, jax.Array], jax.Array]
Kind = Literal["all_gather", "reduce_scatter", "all_reduce"]

#: The collectives :func:`collective_bytes` prices, with the primitive names
#: :func:`collectives_in` maps onto them.
COLLECTIVES: dict[str, Kind] = {
    "all_gather": "all_gather",
    "all_gather_invariant": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "psum": "all_reduce",
    "psum_invariant": "all_reduce",
    "psum2": "all_reduce",
}


def _check_axis_name(axis_name: object) -> None:
    if axis_name is not None and not isinstance(axis_name, str):
        raise TypeError(
            "axis_name must be None (one device) or the name of the mesh axis the "
            f"walkers are split over, e.g. 'data'; got {type(axis_name).__name__}"
        )


def _total(x: jax.Array, axis_name: str | None) -> jax.Array:
    """Sum over the leading (walker) axis of this batch, and over devices."""
    s = jnp.sum(x, axis=0)
    return s if axis_name is None else lax.psum(s, axis_name)


def _count(local: int, axis_name: str | None) -> int:
    """The global number of walkers (a Python int: the axis size is static)."""
    return local if axis_name is None else local * lax.axis_size(axis_name)


def _walker_step(
    batch_log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    sigma: float | jax.Array,
) -> Callable[[tuple, tuple[jax.Array, jax.Array]], tuple[tuple, None]]:
    """One Metropolis move of every walker, from draws made beforehand.

    The carry is ``(walkers (B, n, 3), log|psi| (B,), summed acceptance count)``; the
    scan's input is this step's ``(xi (B, n, 3), u (B,))``, drawn per walker from its
    own key (:func:`metropolis`), so walker ``b``'s move does not depend on the batch
    it sits in.
    """

    def step(carry: tuple, draws: tuple[jax.Array, jax.Array]) -> tuple[tuple, None]:
        x, logp, accepted = carry
        xi, u = draws
        proposal = x + sigma * xi
        logp_new = batch_log_psi(params, proposal)
        ok = jnp.log(u) < 2.0 * (logp_new - logp)
        x = jnp.where(ok[:, None, None], proposal, x)
        logp = jnp.where(ok, logp_new, logp)
        return (x, logp, accepted + jnp.sum(ok.astype(x.dtype))), None

    return step


def metropolis(
    log_psi: LogPsi,
    params: Params,
    walkers: jax.Array,
    key: jax.Array,
    *,
    steps: int,
    step_size: float | jax.Array,
    axis_name: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""``steps`` Metropolis steps towards :math:`|\psi|^2` for every walker.

    Each step proposes :math:`x' = x + \sigma\xi` (Gaussian :math:`\xi`) and accepts
    it with probability :math:`\min(1, e^{2(\log|\psi(x')|-\log|\psi(x)|)})`. Walker
    ``b`` (its global index: ``axis_index * B + b`` inside ``shard_map``) draws from
    its own key, ``fold_in(key, b)`` (:func:`beyondgrad.vmc.walker_keys`), from which
    all ``steps`` proposals and acceptance draws are made before the chain runs
    (``steps * B * (3n + 1)`` numbers per device). Its chain therefore depends on
    ``key`` and its global index only: the same ``key`` gives the same walkers whatever the number of devices the
    batch is split over. The acceptance rate is the mean over all walkers and steps
    (a ``pmean`` over devices, which hold equally many walkers).

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar``.
        params: its parameters (replicated).
        walkers: ``(B, n, 3)`` floating-point positions (this device's block).
        key: a PRNG key (replicated).
        steps: the number of steps, a positive int.
        step_size: the proposal's standard deviation :math:`\sigma > 0`: a Python
            number, or a floating-point scalar array (traced inside a loop that adapts
            it, as :func:`train` does; a concrete one is checked positive).
        axis_name: ``None`` on one device, else the mesh axis of the walkers.

    Returns:
        ``(walkers (B, n, 3), acceptance rate ())``, the rate invariant.

    Raises:
        TypeError: ``log_psi`` not callable; integer walkers; ``key`` not a PRNG key;
            a bad ``axis_name``; a ``step_size`` array that is not a floating scalar.
        ValueError: walkers not ``(B, n, 3)``; ``steps`` or ``step_size`` not
            positive.
    """
    check_log_psi(log_psi)
    walkers = check_walkers(walkers)
    _check_axis_name(axis_name)
    _checks.integer(steps, "steps", minimum=1, where="metropolis: ")
    _check_step_size(step_size, "step_size", "metropolis: ")
    local = walkers.shape[0]
    first = 0 if axis_name is None else lax.axis_index(axis_name) * local
    keys = walker_keys(key, local, first=first)  # (B,): fold_in(key, global index)
    shape, dtype = (steps, *walkers.shape[1:]), walkers.dtype

    def draws(k: jax.Array) -> tuple[jax.Array, jax.Array]:
        k_move, k_accept = jax.random.split(k)
        return (
            jax.random.normal(k_move, shape, dtype),
            jax.random.uniform(k_accept, (steps,), dtype),
        )

    # every step's draws at once, outside the scan (one random-bit kernel each, not
    # one per step): (B, steps, n, 3) and (B, steps), then steps first
    xi, u = jax.vmap(draws)(keys)
    per_step = (jnp.swapaxes(xi, 0, 1), jnp.swapaxes(u, 0, 1))
    batch = jax.vmap(log_psi, in_axes=(None, 0))
    step = _walker_step(batch, params, step_size)
    zero = jnp.zeros((), walkers.dtype)
    if axis_name is not None:
        zero = compat.pcast_varying(zero, axis_name)  # the carry varies per device
    init = (walkers, batch(params, walkers), zero)
    (x, _, accepted), _ = lax.scan(step, init, per_step)
    rate = accepted / (steps * local)
    return x, rate if axis_name is None else lax.pmean(rate, axis_name)


def _check_step_size(value: object, name: str, where: str) -> None:
    """A proposal width: a positive Python number, or a floating-point scalar array
    (positive when concrete; a traced one is the caller's to keep positive)."""
    if isinstance(value, jax.Array) and not _checks.is_real(value):
        if value.ndim != 0 or not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(
                f"{where}{name} must be a positive number or a floating-point scalar "
                f"array, got an array of dtype {value.dtype} and shape {value.shape}"
            )
        if compat.is_tracer(value):
            return
        value = float(value)
    _checks.number(value, name, above=0, where=where)


def local_energies(
    log_psi: LogPsi, params: Params, walkers: jax.Array, *, omega: float = 1.0
) -> jax.Array:
    r""":math:`E_L = -\tfrac12(\Delta\log|\psi|+|\nabla\log|\psi||^2) + V` per walker.

    The gradient and Laplacian come from one forward pass,
    :func:`beyondgrad.forward_laplacian.forward_laplacian`; :math:`V` is
    :func:`beyondgrad.vmc.potential_energy` (trap + Coulomb). Each walker is
    independent, so this is the same inside ``shard_map`` (no collective).

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar``.
        params: its parameters.
        walkers: ``(B, n, 3)`` floating-point positions.
        omega: the trap frequency.

    Returns:
        ``(B,)`` local energies.

    Raises:
        TypeError: ``log_psi`` not callable; integer walkers.
        ValueError: walkers not ``(B, n, 3)``.
    """
    check_log_psi(log_psi)
    walkers = check_walkers(walkers)
    shape = walkers.shape[1:]

    def one(x: jax.Array) -> jax.Array:
        f = lambda r: log_psi(params, r.reshape(shape))  # noqa: E731
        _, grad, lap = forward_laplacian(f, x.reshape(-1))
        return -0.5 * (lap + grad @ grad) + potential_energy(x, omega=omega)

    return jax.vmap(one)(walkers)


def clip_local_energies(
    e_l: jax.Array,
    *,
    scale: float = 5.0,
    keep: jax.Array | None = None,
    axis_name: str | None = None,
) -> jax.Array:
    r"""Clip local energies to :math:`m \pm` ``scale`` :math:`\cdot\,\mathrm{MAD}`.

    :math:`m` is the median of the kept walkers' energies (an ``all_gather``
    inside ``shard_map``: a median is not a sum of per-device parts, and gathering the
    values is the simplest exact way) and MAD their mean absolute deviation from it,
    :math:`\frac1{N_k}\sum_{b\,\mathrm{kept}}|E_L(x_b)-m|` (two ``psum``), as
    FermiNet clips (its ``clip_local_values``). Near a node of :math:`\psi` the
    kinetic energy diverges; the clipped values bound its weight in the gradient.

    Dropped walkers take no part in the statistics and are returned unchanged, so
    one NaN does not turn every clipped value into NaN. In a step pass
    ``keep=kept_walkers(o, e_l)``: the window is then the one of the walkers that
    :func:`natural_gradient` keeps and :func:`nonfinite_walkers` does not count
    (their clipped energies are finite, the dropped ones are as they came in).

    Args:
        e_l: ``(B,)`` local energies (this device's walkers).
        scale: the half-width in units of the MAD, a positive number.
        keep: ``(B,)`` bool, the walkers kept (:func:`kept_walkers`); ``None``
            keeps the walkers whose energy is finite (no gradient rows to consult).
        axis_name: ``None`` on one device, else the mesh axis of the walkers.

    Returns:
        ``(B,)`` energies: the kept walkers' clipped, the dropped walkers' as given.

    Raises:
        ValueError: ``e_l`` not 1-D; ``keep`` not of ``e_l``'s shape; ``scale`` not
            positive.
        TypeError: ``keep`` not boolean; a bad ``axis_name``.
    """
    _check_axis_name(axis_name)
    e_l = _check_energies(e_l)
    _checks.number(scale, "scale", above=0, where="clip_local_energies: ")
    keep = jnp.isfinite(e_l) if keep is None else _check_keep(keep, e_l)
    mine = jnp.where(keep, e_l, jnp.nan)
    everyone = (
        mine if axis_name is None else lax.all_gather(mine, axis_name, tiled=True)
    )
    median = jnp.nanmedian(everyone)
    spread = _total(jnp.where(keep, jnp.abs(e_l - median), 0), axis_name)
    deviation = spread / _total(keep.astype(e_l.dtype), axis_name)
    clipped = jnp.clip(e_l, median - scale * deviation, median + scale * deviation)
    return jnp.where(keep, clipped, e_l)


def per_walker_grads(
    log_psi: LogPsi,
    params: Params,
    walkers: jax.Array,
    *,
    axis_name: str | None = None,
) -> tuple[jax.Array, Callable[[jax.Array], Params]]:
    r"""The matrix :math:`O_{bk} = \partial_{\theta_k}\log|\psi(x_b)|`, one row per walker.

    Inside ``shard_map`` the replicated (invariant) ``params`` are first cast to
    varying over ``axis_name`` (:func:`beyondgrad.compat.pcast_varying`). Without
    the cast, ``vmap(grad)`` differentiates with respect to an invariant value, whose
    cotangent is summed over devices: depending on the JAX version that is an error,
    or row ``b`` of every device silently becomes the sum over devices of the rows
    at local index ``b`` (Chapter 6).

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar``.
        params: its parameters, a pytree of floating-point arrays.
        walkers: ``(B, n, 3)`` floating-point positions.
        axis_name: ``None`` on one device, else the mesh axis of the walkers.

    Returns:
        ``(O (B, P), unravel)``: ``P`` is the number of parameters, ordered as
        ``jax.flatten_util.ravel_pytree(params)``; ``unravel`` maps a ``(P,)`` vector
        back to a pytree like ``params``.

    Raises:
        TypeError: ``log_psi`` not callable; integer walkers; a bad ``axis_name``.
        ValueError: walkers not ``(B, n, 3)``.
    """
    check_log_psi(log_psi)
    walkers = check_walkers(walkers)
    _check_axis_name(axis_name)
    _, unravel = ravel_pytree(params)
    if axis_name is not None:
        params = compat.pcast_varying(params, axis_name)

    def row(x: jax.Array) -> jax.Array:
        return ravel_pytree(jax.grad(log_psi)(params, x))[0]

    return jax.vmap(row)(walkers), unravel


Method = Literal["sr", "minsr", "srt", "cg"]

#: The methods of :func:`natural_gradient`.
METHODS: tuple[str, ...] = ("sr", "minsr", "srt", "cg")


def natural_gradient(
    o: jax.Array,
    e_l: jax.Array,
    *,
    damping: float,
    method: Method = "sr",
    axis_name: str | None = None,
    tol: float | None = None,
    maxiter: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    r"""The energy gradient :math:`g` and the damped natural-gradient step :math:`\delta`.

    Four ways to the same :math:`\delta` (module docstring), each with what one
    device holds (:math:`B = N/D` walkers per device, :math:`P` parameters):

    - ``"sr"``: :math:`\delta = (S+\lambda I)^{-1}g`, :math:`S = \tilde
      O^\top\tilde O` (:math:`P\times P`, a matmul of each device's rows: no
      :math:`B\times P\times P` temporary), its blocks summed over devices with one
      ``psum``, then a Cholesky solve. Holds :math:`P^2`.
    - ``"minsr"``: :math:`\delta = \tilde O^\top(T+\lambda I)^{-1}2\epsilon`,
      :math:`T = \tilde O\tilde O^\top` (:math:`N\times N`) from an
      ``all_gather`` of :math:`\tilde O`; each device multiplies its own rows and a
      ``psum`` adds them. Holds all :math:`N\times P` of :math:`\tilde O`.
    - ``"srt"``: the same formula with :math:`\tilde O` re-sharded by an
      ``all_to_all`` from rows (walkers) to columns (parameters), as NetKet's
      distributed SRt does: each device holds all :math:`N` rows of its
      :math:`P/D` columns :math:`\tilde O_d`, :math:`T = \sum_d \tilde
      O_d\tilde O_d^\top` is one ``psum`` of :math:`N\times N` blocks, and device
      :math:`d` computes its columns of :math:`\delta`, :math:`\tilde
      O_d^\top y`. Holds :math:`NP/D + N^2` (columns padded with zeros to a
      multiple of :math:`D`; zero columns add nothing to :math:`T`).
    - ``"cg"``: conjugate gradients on :math:`(S+\lambda I)\delta = g` with
      :math:`S` never formed: :math:`Sv = \tilde O^\top(\tilde O v)` from each
      device's rows and one :math:`P`-vector ``psum`` per iteration. Holds a few
      :math:`P`-vectors. Stops when :math:`\|g - (S+\lambda I)\delta_k\| \le`
      ``tol`` :math:`\|g\|` (the recursive residual) or after ``maxiter``
      iterations; the error of :math:`\delta` is then at most
      :math:`\kappa\,`\ ``tol`` relative, :math:`\kappa` the condition number of
      :math:`S+\lambda I`. In exact arithmetic CG ends after at most as many steps
      as :math:`S+\lambda I` has distinct eigenvalues, at most
      :math:`\min(N, P)` here (:math:`S` has rank below :math:`N` after centring),
      but rounding delays it on an ill-conditioned :math:`S` (about twice that
      count at :math:`\kappa \approx 10^4`, measured), so the default
      ``maxiter`` is ``jax.scipy.sparse.linalg.cg``'s :math:`10P` and the loop
      ends on ``tol``. A small ``maxiter`` returns a truncated, less accurate
      :math:`\delta` without an error.

    On one device (``axis_name=None``) ``"srt"`` is ``"minsr"``. All outputs are
    invariant inside ``shard_map``.

    The walkers dropped are those :func:`kept_walkers` drops (energy or a row entry
    not finite): each gets weight 0 in the means, in :math:`g` and in the matrices,
    and :math:`N` counts the walkers kept, so the result equals this function on the
    kept walkers alone. :func:`nonfinite_walkers` returns the count for the step to
    report. Only when every walker is dropped are the outputs NaN.

    Args:
        o: ``(B, P)`` per-walker gradients (:func:`per_walker_grads`).
        e_l: ``(B,)`` local energies (clipped or not).
        damping: :math:`\lambda > 0`.
        method: ``"sr"``, ``"minsr"``, ``"srt"`` or ``"cg"``.
        axis_name: ``None`` on one device, else the mesh axis of the walkers.
        tol: ``"cg"`` only: the relative residual to stop at (default ``1e-10``
            in float64, ``1e-5`` in float32).
        maxiter: ``"cg"`` only: the most iterations (default :math:`10P`).

    Returns:
        ``(g (P,), delta (P,))``.

    Raises:
        ValueError: shapes that do not match; an unknown method; ``damping`` or
            ``tol`` not positive; ``maxiter`` below 1.
        TypeError: a bad ``axis_name``; ``maxiter`` not an int; ``tol`` or
            ``maxiter`` given to another method than ``"cg"``.
    """
    _check_axis_name(axis_name)
    o, e_l = _check_o_e(o, e_l)
    if method not in METHODS:
        raise ValueError(
            f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}"
        )
    _checks.number(damping, "damping", above=0, where="natural_gradient: ")
    for option, value in (("tol", tol), ("maxiter", maxiter)):
        if value is not None and method != "cg":
            _checks.ignored_option(option, value, "cg", method)
    if tol is not None:
        _checks.number(tol, "tol", above=0, where="natural_gradient: ")
    if maxiter is not None:
        _checks.integer(maxiter, "maxiter", minimum=1, where="natural_gradient: ")
    local, p = o.shape
    n_all = _count(local, axis_name)
    keep = kept_walkers(o, e_l)
    n = _total(keep.astype(o.dtype), axis_name)  # walkers kept, over all devices
    o0 = jnp.where(keep[:, None], o, 0)
    e0 = jnp.where(keep, e_l, 0)
    scale = 1 / jnp.sqrt(n)
    o_c = jnp.where(keep[:, None], (o0 - _total(o0, axis_name) / n) * scale, 0)
    eps = jnp.where(keep, (e0 - _total(e0, axis_name) / n) * scale, 0)
    g = 2.0 * (o_c.T @ eps)
    if axis_name is not None:
        g = lax.psum(g, axis_name)
    if method == "sr":
        s = o_c.T @ o_c  # (P, P) from a matmul: no (B, P, P) temporary
        if axis_name is not None:
            s = lax.psum(s, axis_name)
        # S + damping I is symmetric positive definite: a Cholesky solve, which
        # XLA factors in the psum's output buffer (no third P x P temporary)
        a = s + damping * jnp.eye(p, dtype=o.dtype)
        return g, jax.scipy.linalg.solve(a, g, assume_a="pos")
    if method == "cg":
        if tol is None:
            tol = 1e-10 if o.dtype == jnp.float64 else 1e-5
        steps = 10 * p if maxiter is None else maxiter
        return g, _cg_solve(o_c, g, damping, tol, steps, axis_name)
    if method == "srt" and axis_name is not None:
        return g, _srt_update(o_c, eps, damping, axis_name)
    first: jax.Array | int = 0
    if axis_name is None:
        o_all, eps_all = o_c, eps
    else:
        o_all = lax.all_gather(o_c, axis_name, tiled=True)
        eps_all = lax.all_gather(eps, axis_name, tiled=True)
        first = lax.axis_index(axis_name) * local
    # a dropped walker's row and energy are 0: its entry of y is 0, so the solve is
    # the one of the kept walkers alone
    t = o_all @ o_all.T
    y = jnp.linalg.solve(t + damping * jnp.eye(n_all, dtype=o.dtype), 2.0 * eps_all)
    mine = lax.dynamic_slice_in_dim(y, first, local)
    return g, _total(o_c * mine[:, None], axis_name)


def _srt_update(
    o_c: jax.Array, eps: jax.Array, damping: float, axis_name: str
) -> jax.Array:
    """MinSR's update with O re-sharded from walkers to parameters (all_to_all)."""
    local, p = o_c.shape
    devices = lax.axis_size(axis_name)
    width = -(-p // devices)  # columns per device, after padding to a multiple
    padded = jnp.pad(o_c, ((0, 0), (0, width * devices - p)))
    # (B, D*width) rows of this device -> (N, width): every walker, this device's
    # columns, the walkers in device order (as all_gather's tiled order)
    cols = lax.all_to_all(padded, axis_name, split_axis=1, concat_axis=0, tiled=True)
    eps_all = lax.all_gather(eps, axis_name, tiled=True)
    t = lax.psum(cols @ cols.T, axis_name)
    n_all = t.shape[0]
    y = jnp.linalg.solve(t + damping * jnp.eye(n_all, dtype=o_c.dtype), 2.0 * eps_all)
    # this device's columns of delta, placed at its offset; the psum assembles the
    # whole (invariant) vector from the zeros elsewhere
    part = jnp.zeros(width * devices, o_c.dtype)
    part = lax.dynamic_update_slice_in_dim(
        part, cols.T @ y, lax.axis_index(axis_name) * width, axis=0
    )
    return lax.psum(part, axis_name)[:p]


def _cg_solve(
    o_c: jax.Array,
    g: jax.Array,
    damping: float,
    tol: float,
    maxiter: int,
    axis_name: str | None,
) -> jax.Array:
    """(O_c^T O_c + damping I) x = g by conjugate gradients, S never formed."""

    def matvec(v: jax.Array) -> jax.Array:
        sv = o_c.T @ (o_c @ v)
        if axis_name is not None:
            sv = lax.psum(sv, axis_name)
        return sv + damping * v

    stop = (tol * jnp.linalg.norm(g)) ** 2

    def keep_going(state: tuple) -> jax.Array:
        k, _, _, _, rr = state
        return (k < maxiter) & (rr > stop)

    def step(state: tuple) -> tuple:
        k, x, r, d, rr = state
        ad = matvec(d)
        alpha = rr / jnp.vdot(d, ad)
        x = x + alpha * d
        r = r - alpha * ad
        rr_new = jnp.vdot(r, r)
        return k + 1, x, r, r + (rr_new / rr) * d, rr_new

    x0 = jnp.zeros_like(g)
    state = (0, x0, g, g, jnp.vdot(g, g))
    return lax.while_loop(keep_going, step, state)[1]


def _check_o_e(o: jax.Array, e_l: jax.Array) -> tuple[jax.Array, jax.Array]:
    o, e_l = jnp.asarray(o), jnp.asarray(e_l)
    if o.ndim != 2 or e_l.shape != o.shape[:1]:
        raise ValueError(
            f"o must be (B, P) and e_l (B,), got {o.shape} and {e_l.shape}"
        )
    return o, e_l


def _check_energies(e_l: jax.Array) -> jax.Array:
    e_l = jnp.asarray(e_l)
    if e_l.ndim != 1:
        raise ValueError(f"e_l must be 1-D (one energy per walker), got {e_l.shape}")
    return e_l


def _check_keep(keep: jax.Array, e_l: jax.Array) -> jax.Array:
    keep = jnp.asarray(keep)
    if keep.dtype != jnp.bool_:
        raise TypeError(
            f"keep must be a boolean mask, got dtype {keep.dtype}; pass "
            "kept_walkers(o, e_l)"
        )
    if keep.shape != e_l.shape:
        raise ValueError(
            f"keep must have e_l's shape {e_l.shape} (one flag per walker), got "
            f"{keep.shape}; pass kept_walkers(o, e_l)"
        )
    return keep


def kept_walkers(o: jax.Array, e_l: jax.Array) -> jax.Array:
    r"""The walkers a VMC step keeps: the one rule this module's step applies.

    Walker :math:`b` is kept when its local energy :math:`E_L(x_b)` and every entry of
    its row :math:`O_{b\cdot}` are finite (not NaN, not :math:`\pm\infty`); it is
    dropped otherwise (a walker on a node of :math:`\psi`, an overflow). After the
    sampling (its chain goes on, its moves count in the acceptance) a dropped walker
    takes no part: pass this mask to :func:`clip_local_energies`
    (the window's median and width) and :func:`kept_energy` (the reported energy
    and variance); :func:`natural_gradient` (means, :math:`g`, the matrices) and
    :func:`nonfinite_walkers` (the count) apply it themselves. The step is then the
    same step on the kept walkers alone. Each walker is judged on its own values, so
    this is the same inside ``shard_map`` (no collective).

    Args:
        o: ``(B, P)`` per-walker gradients (:func:`per_walker_grads`).
        e_l: ``(B,)`` local energies, clipped or not: :func:`clip_local_energies`
            keeps a finite energy finite and returns a dropped one unchanged, so
            the mask is the same.

    Returns:
        ``(B,)`` bool, ``True`` for a walker kept.

    Raises:
        ValueError: shapes that do not match.
    """
    o, e_l = _check_o_e(o, e_l)
    return jnp.isfinite(e_l) & jnp.all(jnp.isfinite(o), axis=1)


def kept_energy(
    e_l: jax.Array, keep: jax.Array, *, axis_name: str | None = None
) -> tuple[jax.Array, jax.Array]:
    r"""The mean and variance of the kept walkers' local energies, the ones to report.

    With :math:`K` the kept walkers over all devices and :math:`N_k = |K|`,
    :math:`\bar E = \frac1{N_k}\sum_{b\in K}E_L(x_b)` and
    :math:`\sigma^2 = \frac1{N_k}\sum_{b\in K}(E_L(x_b)-\bar E)^2`, in two passes
    (two ``psum`` inside ``shard_map``; the one-pass
    :math:`\overline{E^2}-\bar E^2` cancels when :math:`\sigma \ll |\bar E|`).
    Pass the unclipped energies (FermiNet reports their mean) and the mask
    ``kept_walkers(o, e_l)``.

    Args:
        e_l: ``(B,)`` local energies (this device's walkers).
        keep: ``(B,)`` bool, the walkers kept (:func:`kept_walkers`).
        axis_name: ``None`` on one device, else the mesh axis of the walkers.

    Returns:
        ``(mean, variance)``, scalars (invariant inside ``shard_map``; NaN when no
        walker is kept).

    Raises:
        ValueError: ``e_l`` not 1-D; ``keep`` not of ``e_l``'s shape.
        TypeError: ``keep`` not boolean; a bad ``axis_name``.
    """
    _check_axis_name(axis_name)
    e_l = _check_energies(e_l)
    keep = _check_keep(keep, e_l)
    # the count and the sum in one psum, then the squared deviations in a second
    parts = jnp.stack([keep.astype(e_l.dtype), jnp.where(keep, e_l, 0)], axis=1)
    n, total = _total(parts, axis_name)
    mean = total / n
    square = jnp.where(keep, (e_l - mean) ** 2, 0)
    return mean, _total(square, axis_name) / n


def nonfinite_walkers(
    o: jax.Array, e_l: jax.Array, *, axis_name: str | None = None
) -> jax.Array:
    """The number of walkers, over all devices, that :func:`kept_walkers` drops.

    A walker is dropped when its local energy or any entry of its row of ``O`` is not
    finite (a walker on a node of :math:`\\psi`, an overflow). A step should report
    this count (and a caller stop or resample when it is large): dropping is exact
    for the walkers kept, but the kept walkers are no longer a sample of
    :math:`|\\psi|^2` if the dropped ones are many.

    Args:
        o: ``(B, P)`` per-walker gradients.
        e_l: ``(B,)`` local energies.
        axis_name: ``None`` on one device, else the mesh axis of the walkers.

    Returns:
        An int32 scalar (invariant inside ``shard_map``).

    Raises:
        ValueError: shapes that do not match.
        TypeError: a bad ``axis_name``.
    """
    _check_axis_name(axis_name)
    return _total((~kept_walkers(o, e_l)).astype(jnp.int32), axis_name)


def collective_bytes(kind: str, nbytes: int, devices: int) -> int:
    r"""Bytes each device sends in a bandwidth-optimal ring collective.

    ``nbytes`` is the size of the full array: the gathered result of an all-gather,
    the per-device input of a reduce-scatter or an all-reduce. With :math:`D`
    devices an all-gather and a reduce-scatter each send :math:`\frac{D-1}{D}`
    ``nbytes`` per device, and an all-reduce is a reduce-scatter followed by an
    all-gather: :math:`2\frac{D-1}{D}` ``nbytes``. Divided by a link's bandwidth this
    is the collective's time when bandwidth, not latency, bounds it.

    Args:
        kind: ``"all_gather"``, ``"reduce_scatter"`` or ``"all_reduce"``.
        nbytes: the full array's size in bytes, a non-negative int.
        devices: the number of devices :math:`D`, a positive int.

    Returns:
        Bytes sent per device (an int: exact when ``nbytes`` divides by ``devices``).

    Raises:
        ValueError: an unknown kind, a negative size or a non-positive count.
    """
    if kind not in ("all_gather", "reduce_scatter", "all_reduce"):
        raise ValueError(
            f"kind must be 'all_gather', 'reduce_scatter' or 'all_reduce', got {kind!r}"
        )
    _checks.integer(nbytes, "nbytes", minimum=0, where="collective_bytes: ")
    _checks.integer(devices, "devices", minimum=1, where="collective_bytes: ")
    one = nbytes * (devices - 1) // devices
    return 2 * one if kind == "all_reduce" else one


#: collectives :func:`collectives_in` does not price (it refuses a program with one)
_UNPRICED = frozenset({"pmax", "pmin", "ppermute", "all_to_all", "pbroadcast"})


def _priced(found: Iterable[tuple[str, int]]) -> int:
    return sum(collective_bytes(kind, nbytes, 2) for kind, nbytes in found)


def collectives_in(jaxpr: Any) -> list[tuple[str, int]]:
    """The collectives a ``shard_map`` body runs: ``(kind, full array bytes)`` each.

    Walks ``jaxpr`` (from ``jax.make_jaxpr``) and its sub-jaxprs for the primitives
    of :data:`COLLECTIVES`. The bytes are what :func:`collective_bytes` takes: the
    gathered output of an all-gather, the input of a sum. What runs, not what is
    written: a collective inside a ``scan`` (``fori_loop`` with static bounds,
    ``lax.map``) is listed once per iteration; of a ``cond``'s branches, the one with
    the most bytes is listed (one branch runs; this is the worst case).

    Args:
        jaxpr: a (closed) jaxpr.

    Returns:
        A list of ``(kind, nbytes)`` in program order.

    Raises:
        TypeError: ``jaxpr`` is not a jaxpr.
        ValueError: a collective inside a ``while_loop`` (its trip count is not known
            when the program is traced: count the body and multiply by the
            iterations you expect), or a collective this does not price
            (``pmax``, ``pmin``, ``ppermute``, ``all_to_all``).
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if not hasattr(inner, "eqns"):
        raise TypeError(
            f"expected a jaxpr (from jax.make_jaxpr), got {type(jaxpr).__name__}"
        )
    found: list[tuple[str, int]] = []
    for eqn in inner.eqns:
        name = eqn.primitive.name
        if name in _UNPRICED:
            raise ValueError(
                f"collectives_in prices all-gathers, reduce-scatters and all-reduces; "
                f"the program has a {name!r}, which it does not price"
            )
        kind = COLLECTIVES.get(name)
        if kind is not None:
            avals = (
                [v.aval for v in eqn.outvars]
                if kind == "all_gather"
                else [v.aval for v in eqn.invars]
            )
            for aval in avals:
                found.append((kind, math.prod(aval.shape) * aval.dtype.itemsize))
        subs: list[list[tuple[str, int]]] = []
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    subs.append(collectives_in(sub))
        if name == "while" and any(subs):
            raise ValueError(
                "a collective inside a lax.while_loop: its trip count is not known "
                "when the program is traced; count one iteration (collectives_in of "
                "the body) and multiply by the iterations you expect"
            )
        if name == "cond" and subs:
            found.extend(max(subs, key=_priced))
        elif name == "scan":
            found.extend([c for sub in subs for c in sub] * int(eqn.params["length"]))
        else:
            found.extend(c for sub in subs for c in sub)
    return found


class TrainingHistory(NamedTuple):
    """What :func:`train` records at each step ``t``: each field a ``(steps,)`` array."""

    #: the mean local energy of the kept walkers (unclipped, :func:`kept_energy`) at
    #: the parameters of step ``t``, before its update
    energy: jax.Array
    #: their variance, :math:`\to 0` at an eigenstate (zero-variance principle)
    variance: jax.Array
    #: the Metropolis acceptance of step ``t``'s sweeps over all walkers of all devices
    acceptance: jax.Array
    #: the proposal width step ``t`` sampled with
    width: jax.Array
    #: the walkers :func:`kept_walkers` dropped (:func:`nonfinite_walkers`)
    dropped: jax.Array


def _check_mesh(mesh: object, axis_name: object, batch: int) -> int:
    """The size of the walkers' mesh axis (1 without a mesh), after the checks."""
    if mesh is None:
        return 1
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"train: mesh must be None (one device) or a jax.sharding.Mesh, got "
            f"{type(mesh).__name__}; make one with runtime.demo_mesh(8, 'data')"
        )
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(
            f"train: axis_name must name the mesh axis the walkers are split over, "
            f"one of {tuple(mesh.axis_names)}; got {axis_name!r}"
        )
    size = int(mesh.shape[axis_name])
    if batch % size:
        raise ValueError(
            f"train: {batch} walkers do not split evenly over the {size} devices of "
            f"mesh axis {axis_name!r}; pass a multiple of {size} walkers"
        )
    return size


def train(
    log_psi: LogPsi,
    params: Params,
    walkers: jax.Array,
    key: jax.Array,
    *,
    steps: int,
    learning_rate: float,
    damping: float,
    width: float,
    mesh: jax.sharding.Mesh | None = None,
    axis_name: str = "data",
    method: Method = "sr",
    sweeps: int = 10,
    target_acceptance: float = 0.5,
    adapt_rate: float = 1.0,
    clip_scale: float = 5.0,
    omega: float = 1.0,
) -> tuple[Params, jax.Array, TrainingHistory]:
    r"""VMC training: ``steps`` natural-gradient steps, the chains kept from step to step.

    Step :math:`t = 0, \dots,` ``steps - 1``, at parameters :math:`\theta_t` and
    proposal width :math:`\sigma_t` (:math:`\sigma_0` = ``width``):

    1. *Sample.* ``sweeps`` Metropolis sweeps of every walker towards
       :math:`|\psi_{\theta_t}|^2` (:func:`metropolis`), from where step
       :math:`t-1` left it (the chains are never restarted), with the key
       :math:`k_t = \mathrm{fold\_in}(k, t)`; walker :math:`b` draws from
       :math:`\mathrm{fold\_in}(k_t, b)`, :math:`b` its global index. The draws
       depend on ``key``, :math:`t` and :math:`b` only: the walkers are the same on any
       number of devices.
    2. *Measure.* Local energies (:func:`local_energies`), the rows
       :math:`O_{b\cdot}` (:func:`per_walker_grads`) and the keep mask
       (:func:`kept_walkers`): a walker whose energy or row is not finite is dropped
       from everything this step (it stays in its chain) and counted. Recorded: the
       kept walkers' mean energy and variance (:func:`kept_energy`, unclipped).
    3. *Update.* :math:`\theta_{t+1} = \theta_t - \eta\,\delta_t`, with
       :math:`\delta_t` the damped natural gradient (:func:`natural_gradient`,
       ``method``, :math:`\lambda` = ``damping``) of the energies clipped to
       :math:`m \pm` ``clip_scale`` MAD (:func:`clip_local_energies`). When every
       walker is dropped, :math:`\theta_{t+1} = \theta_t` (the step is recorded with
       a NaN energy).
    4. *Adapt.* With :math:`A_t` the accepted moves over all walkers of all devices
       and sweeps (a collective over ``axis_name``, never one device's rate),
       :math:`\sigma_{t+1} = \sigma_t\exp(\gamma(A_t/(\texttt{sweeps}\,N) - a^*))`,
       :math:`\gamma` = ``adapt_rate``, :math:`a^*` = ``target_acceptance``. The
       acceptance of a Gaussian proposal falls as :math:`\sigma` grows, so the
       width settles where the acceptance is :math:`a^*`; :math:`\gamma = 0` keeps
       it fixed. The acceptance is the exact count divided once by
       ``sweeps`` :math:`\cdot N`, the same on any number of devices: the count is
       recovered by rounding the mean of the devices' rates times the number of
       moves, exact while that product's rounding error stays below 1/2. In
       float64 that holds for any practical run; in float32 while
       ``sweeps`` :math:`\cdot N \cdot D` (:math:`D` devices) is below about
       :math:`10^7` (each of the :math:`D` rates and their sum rounds to
       :math:`2^{-24}` relative; a NumPy model of the sum first misses the count
       near :math:`10^8`).

    The ``steps`` steps run as one compiled program (a ``lax.scan``; with ``mesh``,
    inside ``jax.shard_map`` with the walkers split over ``axis_name`` and
    everything else replicated), compiled at each call. Across device counts the
    walkers and widths agree exactly; the energies and parameters differ by the
    rounding of sums taken in another order.

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar``.
        params: the starting parameters, a pytree of floating-point arrays.
        walkers: ``(N, n, 3)`` floating-point starting positions, ``N`` a multiple of
            the mesh axis' size.
        key: a PRNG key (``jax.random.key(0)``), the run's only source of randomness.
        steps: the number of training steps, a positive int.
        learning_rate: :math:`\eta > 0`.
        damping: :math:`\lambda > 0`, added to the SR / MinSR matrix.
        width: the first proposal width :math:`\sigma_0 > 0`.
        mesh: ``None`` (one device) or the mesh whose ``axis_name`` axis splits the
            walkers.
        axis_name: the mesh axis of the walkers (only read with a mesh).
        method: one of :data:`METHODS` (:func:`natural_gradient`; ``"cg"`` with
            its default ``tol`` and ``maxiter``).
        sweeps: Metropolis sweeps per step, a positive int.
        target_acceptance: :math:`a^*`, strictly between 0 and 1.
        adapt_rate: :math:`\gamma \ge 0`.
        clip_scale: the clipping window's half-width in MADs, positive.
        omega: the trap frequency of the Hamiltonian.

    Returns:
        ``(params, walkers, history)``: the parameters after the last update, the
        walkers after the last step's sweeps (sharded over ``axis_name`` with a
        mesh), and a :class:`TrainingHistory` of ``(steps,)`` arrays.

    Raises:
        TypeError: ``log_psi`` not callable; integer walkers or parameters; ``key``
            not a PRNG key; a number of the wrong kind; ``mesh`` not a ``Mesh``.
        ValueError: walkers not ``(N, n, 3)``; a number out of its range; an unknown
            method; ``axis_name`` not an axis of ``mesh``; ``N`` not a multiple of
            its size; ``params`` without arrays.
    """
    where = "train: "
    check_log_psi(log_psi)
    walkers = check_walkers(walkers)
    check_key(key)
    _checks.float_leaves(
        params,
        "params",
        why="they are trained",
        fix="cast with .astype(jnp.float64), or make them with float values",
        empty="pass the wavefunction's parameters, e.g. vmc_problems.taut_params()",
        where=where,
    )
    _checks.integer(steps, "steps", minimum=1, where=where)
    _checks.integer(sweeps, "sweeps", minimum=1, where=where)
    _checks.number(learning_rate, "learning_rate", above=0, where=where)
    _checks.number(damping, "damping", above=0, where=where)
    _checks.number(width, "width", above=0, where=where)
    _checks.number(
        target_acceptance, "target_acceptance", above=0, below=1, where=where
    )
    _checks.number(adapt_rate, "adapt_rate", at_least=0, where=where)
    _checks.number(clip_scale, "clip_scale", above=0, where=where)
    _checks.number(omega, "omega", where=where)
    if method not in METHODS:
        raise ValueError(
            f"{where}method must be one of {', '.join(map(repr, METHODS))}, "
            f"got {method!r}"
        )
    _check_mesh(mesh, axis_name, walkers.shape[0])
    axis = None if mesh is None else axis_name
    total = walkers.shape[0]  # N, all devices
    dtype = walkers.dtype

    def run(
        theta: Params, x: jax.Array, k: jax.Array, sigma: jax.Array
    ) -> tuple[Params, jax.Array, tuple[jax.Array, ...]]:
        def one_step(
            carry: tuple[Params, jax.Array, jax.Array], t: jax.Array
        ) -> tuple[tuple[Params, jax.Array, jax.Array], tuple[jax.Array, ...]]:
            theta, x, sigma = carry
            x, rate = metropolis(
                log_psi,
                theta,
                x,
                jax.random.fold_in(k, t),
                steps=sweeps,
                step_size=sigma,
                axis_name=axis,
            )
            e = local_energies(log_psi, theta, x, omega=omega)
            o, unravel = per_walker_grads(log_psi, theta, x, axis_name=axis)
            keep = kept_walkers(o, e)
            clipped = clip_local_energies(
                e, scale=clip_scale, keep=keep, axis_name=axis
            )
            energy, variance = kept_energy(e, keep, axis_name=axis)
            _, delta = natural_gradient(
                o, clipped, damping=damping, method=method, axis_name=axis
            )
            dropped = nonfinite_walkers(o, e, axis_name=axis)
            step = unravel(jnp.where(dropped < total, learning_rate * delta, 0))
            theta = jax.tree.map(lambda p, d: p - d, theta, step)
            # the accepted count is an integer: rounding the mean over devices recovers
            # it exactly, and one division makes the rate the same on any device count
            moves = sweeps * total
            acceptance = jnp.round(rate * moves) / moves
            new_sigma = sigma * jnp.exp(adapt_rate * (acceptance - target_acceptance))
            return (theta, x, new_sigma), (energy, variance, acceptance, sigma, dropped)

        (theta, x, _), history = lax.scan(
            one_step, (theta, x, sigma), jnp.arange(steps)
        )
        return theta, x, history

    sigma0 = jnp.asarray(width, dtype)
    if mesh is None:
        program = jax.jit(run)
    else:
        program = jax.jit(
            jax.shard_map(
                run,
                mesh=mesh,
                in_specs=(P(), P(axis_name), P(), P()),
                out_specs=(P(), P(axis_name), P()),
                check_vma=True,
            )
        )
        replicated = NamedSharding(mesh, P())
        params = jax.device_put(params, replicated)
        walkers = jax.device_put(walkers, NamedSharding(mesh, P(axis_name)))
        key = jax.device_put(key, replicated)
        sigma0 = jax.device_put(sigma0, replicated)
    theta, x, history = program(params, walkers, key, sigma0)
    return theta, x, TrainingHistory(*history)


def blocked_mean(values: Any, *, blocks: int = 10) -> tuple[float, float]:
    r"""The mean of a correlated series and its standard error, by blocking.

    The series (e.g. :attr:`TrainingHistory.energy` over the last steps) is cut into
    ``blocks`` consecutive blocks of equal length :math:`L` (the first
    ``len(values) % blocks`` values are left out); with :math:`\bar x_j` the block
    means, the estimate is their mean and the error
    :math:`\sqrt{\sum_j(\bar x_j-\bar x)^2/(b(b-1))}`. Once :math:`L` exceeds the
    series' autocorrelation time the block means are nearly independent, so this
    error accounts for the correlation between steps that the naive
    :math:`\sigma/\sqrt{\text{len}}` ignores. In float64 NumPy, on the host.

    Args:
        values: a 1-D array of at least ``2 * blocks`` finite numbers.
        blocks: the number of blocks :math:`b`, an int >= 2.

    Returns:
        ``(mean, standard error)`` as Python floats.

    Raises:
        ValueError: ``values`` not 1-D, too short, or not finite.
        TypeError: ``blocks`` not an int.
    """
    _checks.integer(blocks, "blocks", minimum=2, where="blocked_mean: ")
    x = np.asarray(values, np.float64)
    if x.ndim != 1 or len(x) < 2 * blocks:
        raise ValueError(
            f"blocked_mean: values must be 1-D with at least 2 * blocks = {2 * blocks} "
            f"entries, got shape {x.shape}; pass more steps or fewer blocks"
        )
    if not np.all(np.isfinite(x)):
        raise ValueError(
            "blocked_mean: values must be finite; leave out the steps whose energy is "
            "NaN (every walker dropped: see TrainingHistory.dropped)"
        )
    length = len(x) // blocks
    means = x[len(x) - blocks * length :].reshape(blocks, length).mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(blocks))
