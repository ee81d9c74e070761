r"""Particle-sparse jets for the forward Laplacian (:func:`forward_jet` with
``particles``; Chapter 5).

The input ``r`` (length ``d``) holds ``P`` particles of ``c = d / P`` coordinates each,
particle ``p`` owning ``r[p c : (p + 1) c]``. A :class:`SparseJet` stores the Jacobian
of a value :math:`v` as *terms* ``(owner, data)``: ``owner`` is an integer array of
``v``'s shape (trace-time numpy, never traced) and ``data`` has shape ``(c, *v.shape)``,

.. math::
   \frac{\partial v[i]}{\partial r_{p c + k}}
   = \sum_t [\,\mathrm{owner}_t[i] = p\,]\;\mathrm{data}_t[k, i],

so each element of each term depends on the coordinates of one particle. A
one-electron feature ``h[i, f]`` has one term with ``owner[i, f] = i``; a pair feature
``h[i, j, f]`` two, ``owner = i`` and ``owner = j``, stored in ``2 c`` rows instead of
``d = P c``. On the diagonal ``i = j`` both terms name the same particle, and that is
where products and squares of terms meet: the sum over coordinates of two
Jacobians, the quantity every bilinear and elementwise rule needs, is

.. math::
   \sum_{q} \partial_q a[i]\,\partial_q b[i]
   = \sum_{t, s} [\,\mathrm{owner}^a_t[i] = \mathrm{owner}^b_s[i]\,]
     \sum_k \mathrm{data}^a_t[k, i]\,\mathrm{data}^b_s[k, i]

(:func:`coordinate_dot`), a mask computed from the owner arrays at trace time.
Summing over an axis along which a term's owner varies mixes particles: that term's
contribution becomes a dense Jacobian (:func:`reduce_sum`). Everything not covered
here is made dense first (:func:`densify`), which is always exact.

This module holds the maths of the representation (no rule table); the rules that use
it are in :mod:`beyondgrad.forward_laplacian`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondgrad import compat

#: summed coordinate blocks at most this long are summed as adds (they fuse)
_UNROLL = 16


class Term(NamedTuple):
    """One particle term of a :class:`SparseJet`: ``owner`` (numpy ints, the value's
    shape) names the particle each element's derivative belongs to, ``data`` (shape
    ``(c, *value.shape)``) holds that derivative by coordinate of the particle."""

    owner: np.ndarray
    data: jax.Array


class SparseJet(NamedTuple):
    """A value that depends on ``r`` with its Jacobian as particle terms (module
    docstring) and its Laplacian ``lap`` (``None``: known to be zero)."""

    val: jax.Array
    terms: tuple[Term, ...]
    lap: jax.Array | None
    particles: int

    @property
    def block(self) -> int:
        """``c``, the coordinates per particle."""
        return int(self.terms[0].data.shape[0])

    @property
    def d(self) -> int:
        """The input size ``P c``."""
        return self.particles * self.block


def seed(r: jax.Array, particles: int) -> SparseJet:
    """The jet of the input itself: one term, ``owner[j] = j // c`` and
    ``data[k, j] = [j mod c = k]``."""
    d = int(r.shape[0])
    c = d // particles
    j = np.arange(d)
    data = (j[None, :] % c == np.arange(c)[:, None]).astype(np.dtype(r.dtype))
    data = compat.varying_like(jnp.asarray(data), r)
    return SparseJet(r, (Term(j // c, data),), None, particles)


def compress(mask: np.ndarray) -> np.ndarray:
    """``mask`` with each axis along which it is constant cut to length 1 (it
    broadcasts back to the same array)."""
    for a in range(mask.ndim):
        if mask.shape[a] > 1:
            first = np.take(mask, [0], axis=a)
            if np.array_equal(np.broadcast_to(first, mask.shape), mask):
                mask = first
    return mask


def constant_along(owner: np.ndarray, axes: Sequence[int]) -> bool:
    """True if ``owner`` does not change along any of ``axes``."""
    shrunk = compress(owner)
    return all(shrunk.shape[a] == 1 for a in axes)


def first_along(owner: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    """``owner`` at index 0 of ``axes``, those axes removed."""
    index = tuple(0 if a in axes else slice(None) for a in range(owner.ndim))
    return np.asarray(owner[index])


def _one_hot(owner: np.ndarray, particles: int, dtype: Any) -> np.ndarray:
    """``E[p, i] = [owner[i] = p]``, shape ``(P, *compressed owner shape)``."""
    shrunk = compress(owner)
    ps = np.arange(particles).reshape((particles,) + (1,) * shrunk.ndim)
    return (shrunk[None] == ps).astype(np.dtype(dtype))


def densify(x: SparseJet) -> jax.Array:
    """The dense Jacobian ``(d, *val.shape)`` of ``x``:
    ``jac[p c + k, i] = sum_t [owner_t[i] = p] data_t[k, i]``."""
    shape = tuple(x.val.shape)
    jac = None
    for owner, data in x.terms:
        hot = jnp.asarray(_one_hot(owner, x.particles, data.dtype))  # (P, ...)
        part = (hot[:, None] * data[None]).reshape((x.d, *shape))
        jac = part if jac is None else jac + part
    assert jac is not None
    return jac


def merge(terms: Sequence[Term]) -> tuple[Term, ...]:
    """Terms with equal owner arrays added into one (order of first appearance)."""
    out: list[Term] = []
    for owner, data in terms:
        for k, (o, dd) in enumerate(out):
            if o.shape == owner.shape and np.array_equal(o, owner):
                out[k] = Term(o, dd + data)
                break
        else:
            out.append(Term(owner, data))
    return tuple(out)


def broadcast(x: SparseJet, shape: tuple[int, ...]) -> SparseJet:
    """``x`` broadcast to ``shape`` by numpy's rules (leading axes added)."""
    if tuple(x.val.shape) == tuple(shape):
        return x
    ndim = len(shape) - x.val.ndim
    terms = tuple(
        Term(
            np.broadcast_to(owner, shape),
            jnp.broadcast_to(
                data.reshape((data.shape[0],) + (1,) * ndim + tuple(x.val.shape)),
                (data.shape[0], *shape),
            ),
        )
        for owner, data in x.terms
    )
    lap = None if x.lap is None else jnp.broadcast_to(x.lap, shape)
    return SparseJet(jnp.broadcast_to(x.val, shape), terms, lap, x.particles)


def block_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """``sum_k a[k] b[k]`` over the leading (coordinate) axis."""
    c = a.shape[0]
    if c > _UNROLL:
        return jnp.sum(a * b, axis=0)
    return functools.reduce(jnp.add, [a[k] * b[k] for k in range(c)])


def coordinate_dot(a: SparseJet, b: SparseJet) -> jax.Array:
    """``sum_q ∂_q a ∂_q b`` elementwise (``a`` and ``b`` of one shape): per pair of
    terms, the mask ``owner_a = owner_b`` times the sum over the block's coordinates.
    ``a is b`` gives the sum of squares (each cross pair counted twice)."""
    shape = tuple(a.val.shape)
    pairs: list[tuple[Term, Term, float]] = []
    if a is b:
        for t, ta in enumerate(a.terms):
            pairs.append((ta, ta, 1.0))
            pairs += [(ta, tb, 2.0) for tb in a.terms[t + 1 :]]
    else:
        pairs = [(ta, tb, 1.0) for ta in a.terms for tb in b.terms]
    total = jnp.zeros(shape, a.val.dtype)
    for (oa, da), (ob, db), weight in pairs:
        mask = compress(np.asarray(oa == ob))
        if not mask.any():
            continue
        part = block_dot(da, db)
        if not mask.all():
            part = part * mask.astype(np.dtype(part.dtype))
        total = total + (weight * part if weight != 1.0 else part)
    return total


def _owner_sum(
    owner: np.ndarray, data: jax.Array, axes: tuple[int, ...], particles: int
) -> jax.Array:
    """The dense Jacobian ``(d, *rest)`` of one term summed over ``axes`` (along some
    of which its owner varies): ``jac[p c + k, rest] = sum_axes [owner = p] data[k]``."""
    c = data.shape[0]
    vary = tuple(a for a in axes if not constant_along(owner, (a,)))
    same = tuple(a for a in axes if a not in vary)
    if same:  # the owner does not change along these: a plain sum first
        data = jnp.sum(data, axis=tuple(a + 1 for a in same), keepdims=True)
        for a in same:
            owner = np.take(owner, [0], axis=a)
    shrunk = compress(owner)
    others = [a for a in range(owner.ndim) if shrunk.shape[a] > 1]
    if len(vary) == 1 and others == list(vary):  # owner = o[index along one axis]
        (b,) = vary
        o = shrunk.reshape(-1)
        if len(set(o.tolist())) == len(o):  # each particle at most once: a gather
            inverse = np.full(particles, len(o))
            inverse[o] = np.arange(len(o))
            got = jnp.take(data, inverse, axis=b + 1, mode="fill", fill_value=0)
            got = jnp.expand_dims(jnp.moveaxis(got, b + 1, 0), b + 2)
        else:
            hot = (o[:, None] == np.arange(particles)[None]).astype(data.dtype)
            got = jnp.tensordot(data, hot, axes=[[b + 1], [0]])
            got = jnp.expand_dims(jnp.moveaxis(got, -1, 0), b + 2)
    else:  # the general case: the one-hot product, summed
        hot = jnp.asarray(_one_hot(owner, particles, data.dtype))
        got = jnp.sum(
            hot[:, None] * data[None], axis=tuple(a + 2 for a in vary), keepdims=True
        )
    got = jnp.squeeze(got, axis=tuple(a + 2 for a in axes))
    return got.reshape((particles * c, *got.shape[2:]))


def reduce_sum(
    x: SparseJet, axes: tuple[int, ...]
) -> tuple[tuple[Term, ...], jax.Array | None]:
    """The Jacobian of ``sum(x, axes)``: terms whose owner is constant along ``axes``
    stay terms (their data summed); the others become a dense Jacobian (``None`` if
    there are none)."""
    kept: list[Term] = []
    dense = None
    for owner, data in x.terms:
        if constant_along(owner, axes):
            summed = jnp.sum(data, axis=tuple(a + 1 for a in axes))
            kept.append(Term(first_along(owner, axes), summed))
        else:
            part = _owner_sum(owner, data, axes, x.particles)
            dense = part if dense is None else dense + part
    return merge(kept), dense


# ----------------------------------------------------------------------------- owner maps
# Where an operation only moves, repeats or selects elements, each result element has
# the owner of the element it came from: the same operation applied to the owner array.


def _same(owner: np.ndarray, params: dict[str, Any]) -> np.ndarray | None:
    return owner


def _reshape(owner: np.ndarray, params: dict[str, Any]) -> np.ndarray | None:
    if params.get("dimensions") is not None:
        return None
    return owner.reshape(tuple(params["new_sizes"]))


def _broadcast_in_dim(owner: np.ndarray, params: dict[str, Any]) -> np.ndarray | None:
    shape = tuple(params["shape"])
    expanded = [1] * len(shape)
    for axis, dim in enumerate(params["broadcast_dimensions"]):
        expanded[dim] = owner.shape[axis]
    return np.broadcast_to(owner.reshape(expanded), shape)


def _slice(owner: np.ndarray, params: dict[str, Any]) -> np.ndarray | None:
    strides = params.get("strides") or (1,) * owner.ndim
    starts, limits = params["start_indices"], params["limit_indices"]
    return owner[tuple(slice(*s) for s in zip(starts, limits, strides))]


#: primitive -> the map of owner arrays (``None`` from it: not handled, densify)
OWNER_MAPS = {
    lax.neg_p: _same,
    lax.convert_element_type_p: _same,
    lax.copy_p: _same,
    lax.reduce_precision_p: _same,
    # real-linear maps of each element (r is real, so they commute with ∂)
    lax.real_p: _same,
    lax.imag_p: _same,
    lax.conj_p: _same,
    lax.reshape_p: _reshape,
    lax.broadcast_in_dim_p: _broadcast_in_dim,
    lax.transpose_p: lambda o, p: np.transpose(o, tuple(p["permutation"])),
    lax.squeeze_p: lambda o, p: np.squeeze(o, axis=tuple(p["dimensions"])),
    lax.slice_p: _slice,
    lax.rev_p: lambda o, p: np.flip(o, axis=tuple(p["dimensions"])),
}
