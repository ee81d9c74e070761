r"""``custom_jvp`` recognition, and the ``custom_vjp`` rule.

A ``custom_jvp_call`` keeps its custom rule (the module docstring of
``beyondgrad.forward_laplacian``); two kinds of call have a structure the generic rule
would throw away, and get it back here (:func:`rule`, and :func:`sparse_rule` for the
elementwise kind with particles):

* ``jnp.linalg.slogdet`` and ``jnp.linalg.det`` (recognised by the identity of JAX's
  own primal and JVP functions, never by a name a user could reuse): for ``slogdet``
  :math:`\partial_k \log|\det A| = \mathrm{tr}(A^{-1}\partial_k A)` and
  :math:`\Delta \log|\det A| = \mathrm{tr}(A^{-1}\Delta A)
  - \sum_k \mathrm{tr}(A^{-1}\partial_k A\,A^{-1}\partial_k A)` from one LU
  factorisation; for ``det`` the adjugate form through the singular value
  decomposition (:func:`det_rule`), exact at singular matrices;
* elementwise functions (``softplus``, ``logaddexp``, ``relu``, …): a call whose primal
  program *and* custom JVP program are elementwise in the one operand that depends on
  r takes the elementwise rule, with :math:`g'` and :math:`g''` from the custom rule.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondgrad import compat
from beyondgrad.compat import primitives as P
from beyondgrad.forward_laplacian import registry, sparse
from beyondgrad.forward_laplacian.dense import unary_rule
from beyondgrad.forward_laplacian.generic_rule import apply_generic
from beyondgrad.forward_laplacian.jets import (
    Jet,
    NeedsHessian,
    bind,
    dep,
    is_complex,
    is_float,
    sum_axes,
    val,
)


def _find_custom_jvp(jaxpr: Any) -> Any:
    for eqn in jaxpr.eqns:
        if eqn.primitive is P.custom_jvp_call_p:
            return eqn
        for value in eqn.params.values():
            sub = getattr(value, "jaxpr", value)
            if hasattr(sub, "eqns"):
                found = _find_custom_jvp(sub)
                if found is not None:
                    return found
    return None


@functools.cache
def _linalg_sources() -> dict[tuple[str | None, str | None], str]:
    """The sources of JAX's own ``slogdet`` (LU) and ``det`` (closed forms for n = 2,
    3, LU beyond) custom_jvp functions, found by tracing the public functions once."""
    known = {}
    cases = (
        (jnp.linalg.slogdet, 4, "slogdet"),
        *((jnp.linalg.det, n, "det") for n in (2, 3, 4)),
    )
    for fn, n, kind in cases:
        eqn = _find_custom_jvp(jax.make_jaxpr(fn)(jnp.eye(n)).jaxpr)
        if eqn is not None and None not in compat.custom_jvp_sources(eqn):
            known[compat.custom_jvp_sources(eqn)] = kind
    return known


def _lu_inverse(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(sign, log|det a|, a^{-1})`` of a real ``(..., n, n)`` ``a`` from one LU
    factorisation (``P a = L U``: two triangular solves give ``U^{-1} L^{-1} P``)."""
    n = a.shape[-1]
    lu, pivots, perm = lax.linalg.lu(a)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    singular = jnp.any(diag == 0, axis=-1)
    swaps = jnp.sum(pivots != jnp.arange(n, dtype=pivots.dtype), axis=-1)
    parity = (swaps + jnp.sum(diag < 0, axis=-1)) % 2
    sign = jnp.where(singular, 0, 1 - 2 * parity).astype(a.dtype)
    logdet = jnp.where(singular, -jnp.inf, jnp.sum(jnp.log(jnp.abs(diag)), axis=-1))
    eye = jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)
    x = jnp.take_along_axis(eye, perm[..., :, None], axis=-2)
    x = lax.linalg.triangular_solve(
        lu, x, left_side=True, lower=True, unit_diagonal=True
    )
    inv = lax.linalg.triangular_solve(lu, x, left_side=True, lower=False)
    return sign, logdet, inv


def _logdet_jet(a: Jet) -> tuple[jax.Array, Jet]:
    """``sign`` and the Jet of ``log|det a|`` for a Jet of real ``(..., n, n)``."""
    sign, logdet, inv = _lu_inverse(a.val)
    # with B_k = A^{-1} A_k: tr(B_k), and sum_k tr(B_k B_k)
    b = jnp.einsum("...ij,k...jl->k...il", inv, a.jac)
    jac = jnp.trace(b, axis1=-2, axis2=-1)
    lap = -jnp.einsum("k...ij,k...ji->...", b, b)
    if a.lap is not None:
        lap = lap + jnp.einsum("...ij,...ji->...", inv, a.lap)
    return sign, Jet(logdet, jac, lap)


def _slogdet_rule(ins: list) -> list:
    sign, logdet = _logdet_jet(ins[0])
    return [sign, logdet]  # the sign of a real determinant is piecewise constant


def _products_without(s: jax.Array, skip: int) -> jax.Array:
    """Products of the entries of ``s`` (shape ``(..., n)``) with ``skip`` of them left
    out, without division (exact when entries are 0): ``skip=1`` gives
    ``m[..., i] = prod_{l != i} s_l``, ``skip=2`` gives ``M[..., i, j] =
    prod_{l != i, j} s_l`` (the diagonal is ``m[..., i]``, unused)."""
    n = s.shape[-1]
    eye = np.eye(n, dtype=bool)
    if skip == 1:
        return jnp.prod(jnp.where(eye, 1, s[..., None, :]), axis=-1)
    out = np.logical_or(eye[:, None, :], eye[None, :, :])  # l == i or l == j
    return jnp.prod(jnp.where(out, 1, s[..., None, None, :]), axis=-1)


def _det_rule(ins: list) -> list:
    """``det A`` by the singular value decomposition ``A = U diag(s) V^T``, with no
    division by ``det A`` or by a singular value, so it is exact at and near singular
    matrices (two electrons at one point), as ``jax.hessian`` is.

    With ``C = U^T B V`` for a direction ``B``, ``m_i = prod_{l != i} s_l`` and
    ``M_ij = prod_{l != i, j} s_l`` and ``σ = det U det V = ±1``:
    ``D det[B] = tr(adj(A) B) = σ Σ_i m_i C_ii`` and
    ``D² det[B, B] = σ Σ_{i != j} M_ij (C_ii C_jj - C_ij C_ji)`` (for invertible ``A``
    these are ``det A tr(A^{-1}B)`` and ``det A ((tr A^{-1}B)^2 - tr((A^{-1}B)^2))``).
    So ``∂_k det = D det[A_k]`` and ``Δ det = D det[ΔA] + Σ_k D² det[A_k, A_k]``."""
    (a,) = ins
    u, s, vt = jnp.linalg.svd(a.val)
    # det U, det V^T = ±1 (orthogonal, so perfectly conditioned)
    sigma = jnp.sign(jnp.linalg.det(u) * jnp.linalg.det(vt)).astype(a.val.dtype)
    m = _products_without(s, 1)
    big_m = _products_without(s, 2)
    val = sigma * jnp.prod(s, axis=-1)
    c = jnp.einsum("...ji,k...jl,...ml->k...im", u, a.jac, vt)  # U^T A_k V
    diag = jnp.diagonal(c, axis1=-2, axis2=-1)  # (d, ..., n)
    jac = sigma * jnp.sum(m * diag, axis=-1)
    pairs = diag[..., :, None] * diag[..., None, :] - c * jnp.swapaxes(c, -1, -2)
    n = s.shape[-1]
    off = ~np.eye(n, dtype=bool)
    second = jnp.sum(jnp.where(off, big_m * pairs, 0), axis=(-2, -1))
    lap = sigma * sum_axes(second, (0,))
    if a.lap is not None:
        cl = jnp.einsum("...ji,...jl,...ml->...im", u, a.lap, vt)
        lap = lap + sigma * jnp.sum(m * jnp.diagonal(cl, axis1=-2, axis2=-1), axis=-1)
    return [Jet(val, jac, lap)]


#: primitives a program may use and stay elementwise (with operands of one shape, or
#: scalars): an elementwise custom_jvp function is one built of these alone
_POINTWISE_KINDS = ("elementwise", "constant")
_POINTWISE_EXTRA = {
    lax.add_p,
    lax.sub_p,
    lax.mul_p,
    lax.div_p,
    lax.max_p,
    lax.min_p,
    lax.pow_p,
    lax.atan2_p,
    lax.rem_p,
    lax.clamp_p,
    lax.nextafter_p,
    lax.select_n_p,
    lax.neg_p,
    lax.convert_element_type_p,
    lax.copy_p,
    lax.broadcast_in_dim_p,  # of a scalar only (the shape check below)
    P.custom_jvp_call_p,
    P.jit_p,
    P.closed_call_p,
    *(compat.primitive(name) for name in ("pjit", "square")),
} - {None}
_NOT_POINTWISE = {lax.iota_p, lax.argmax_p, lax.argmin_p}


def _is_pointwise(jaxpr: Any, shape: tuple[int, ...]) -> bool:
    """True if every value in ``jaxpr`` (and its calls) has shape ``shape`` or ``()``,
    and every primitive acts element by element: each result element then depends
    only on the operand elements at the same index."""
    for var in [*jaxpr.invars, *jaxpr.outvars]:
        if getattr(var, "aval", None) is not None:
            if tuple(var.aval.shape) not in (shape, ()):
                return False
    for eqn in jaxpr.eqns:
        prim = eqn.primitive
        rule = registry.RULES.get(prim)
        ok = prim in _POINTWISE_EXTRA or (
            rule is not None and rule.kind in _POINTWISE_KINDS
        )
        if not ok or prim in _NOT_POINTWISE:
            return False
        for var in [*eqn.invars, *eqn.outvars]:
            if tuple(getattr(var.aval, "shape", ())) not in (shape, ()):
                return False
        for value in eqn.params.values():
            sub = getattr(value, "jaxpr", value)
            if hasattr(sub, "eqns") and not _is_pointwise(sub, shape):
                return False
    return True


def _pointwise_custom_jvp(eqn: Any, ins: list) -> bool:
    """True if ``eqn`` (a custom_jvp_call with one Jet operand) is elementwise in that
    operand: its primal program and the JVP program of its custom rule both are."""
    (k,) = dep(ins)
    shape = tuple(ins[k].val.shape)
    if any(tuple(v.aval.shape) != shape for v in eqn.outvars) or len(eqn.outvars) != 1:
        return False
    if not is_float(ins[k].val) or is_complex(ins[k].val):
        return False
    call = eqn.params.get("call_jaxpr")
    if call is None or not _is_pointwise(getattr(call, "jaxpr", call), shape):
        return False
    vals = [val(x) for x in ins]

    def tangent_map(x: jax.Array, t: jax.Array) -> Any:
        def at(v: jax.Array) -> Any:
            return bind(eqn, [*vals[:k], v, *vals[k + 1 :]])[0]

        return jax.jvp(at, (x,), (t,))

    jvp = jax.make_jaxpr(tangent_map)(vals[k], vals[k]).jaxpr
    return _is_pointwise(jvp, shape)


def rule(eqn: Any, ins: list) -> list:
    """A ``custom_jvp_call``: JAX's ``slogdet``/``det`` by their trace identities, an
    elementwise function by the elementwise rule (both with the custom rule's
    derivatives), anything else by the generic rule through the custom rule.

    Args:
        eqn: the ``custom_jvp_call`` equation (``eqn.params`` read).
        ins: one entry per operand, a jet where it depends on ``r``.

    Returns:
        One entry per result, a jet or a plain array.
    """
    on_r = dep(ins)
    kind = _linalg_sources().get(compat.custom_jvp_sources(eqn))
    if (
        kind is not None
        and on_r == [0]
        and len(ins) == 1
        and not is_complex(ins[0].val)
    ):
        return _slogdet_rule(ins) if kind == "slogdet" else _det_rule(ins)
    if len(on_r) == 1 and _pointwise_custom_jvp(eqn, ins):
        k = on_r[0]
        vals = [val(x) for x in ins]
        return unary_rule(
            lambda v: bind(eqn, [*vals[:k], v[0], *vals[k + 1 :]]), ins[k]
        )
    return apply_generic(eqn, ins)


def sparse_rule(eqn: Any, ins: list) -> list | None:
    """An elementwise ``custom_jvp`` call keeps particle sparsity (the elementwise
    rule with the custom rule's derivatives); any other is made dense.

    Args:
        eqn: the ``custom_jvp_call`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    on_r = dep(ins)
    if len(on_r) != 1 or not _pointwise_custom_jvp(eqn, ins):
        return None
    k = on_r[0]
    vals = [val(x) for x in ins]
    return sparse.unary(lambda v: bind(eqn, [*vals[:k], v[0], *vals[k + 1 :]]), ins[k])


def custom_vjp_rule(eqn: Any, ins: list) -> list:
    """A ``custom_vjp`` call on r's path: no jet can carry it (module docstring of
    ``beyondgrad.forward_laplacian``), so the whole function goes the way of
    ``method="hessian"``.

    Args:
        eqn: the ``custom_vjp_call`` equation.
        ins: its operands.

    Returns:
        Never returns.

    Raises:
        NeedsHessian: always, naming the primitive (``forward_jet`` catches it).
    """
    raise NeedsHessian(eqn.primitive)
