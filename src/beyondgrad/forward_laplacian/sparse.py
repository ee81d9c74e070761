r"""The particle-sparse forms of the rules (``Rule.sparse``).

The representation and its maths (owner arrays, and the owner masks that products
and squares of terms need where owners coincide) are in ``beyondgrad._sparse_jets``.
Each function here is the sparse form of the dense rule of the same name in
``beyondgrad.forward_laplacian.dense`` (``unary`` that of ``unary_rule``), takes
``(eqn, ins)`` with ``ins`` holding ``SparseJet`` s and plain arrays, and returns
``None`` for a case it does not cover: the interpreter then passes dense jets to
the rule's ``apply``, which is always exact. The table
(``beyondgrad.forward_laplacian.registry``) pairs each with its dense rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondgrad import _sparse_jets as sp
from beyondgrad._sparse_jets import SparseJet, Term
from beyondgrad.forward_laplacian.dense import broadcast_jet, slopes, unary_rule
from beyondgrad.forward_laplacian.jets import (
    Jet,
    WithParams,
    add_laps,
    bind,
    dep,
    is_complex,
    is_float,
    sum_axes,
    val,
    zeros_if_none,
)


def densify(x: Any) -> Any:
    """A SparseJet as the dense :class:`Jet` it stands for; anything else unchanged.

    Args:
        x: a ``SparseJet``, a :class:`Jet` or a plain array.

    Returns:
        ``x`` with a dense ``(d, *shape)`` Jacobian if it was sparse, else ``x``.
    """
    if isinstance(x, SparseJet):
        return Jet(x.val, sp.densify(x), x.lap)
    return x


def _out_shape(eqn: Any, k: int = 0) -> tuple[int, ...]:
    return tuple(eqn.outvars[k].aval.shape)


def unary(apply: Callable, x: SparseJet) -> list:
    """Elementwise ``f``: each term's data times ``f'(x)``;
    ``lap = f'(x) lap_x + f''(x) sum_q (∂_q x)^2`` (the sum by owner masks).

    Args:
        apply: ``f`` on plain values, ``apply([v]) -> [f(v)]``.
        x: the operand.

    Returns:
        ``[SparseJet]`` of ``f(x)``, or the plain value if it is not floating-point.
    """
    out, d1, d2 = slopes(apply, x.val)
    if not is_float(out):
        return [out]
    lap = d2 * sp.coordinate_dot(x, x)
    if x.lap is not None:
        lap = lap + d1 * x.lap
    terms = tuple(Term(owner, d1 * data) for owner, data in x.terms)
    return [SparseJet(out, terms, lap, x.particles)]


def structural(eqn: Any, ins: list) -> list | None:
    """A primitive that moves, repeats or selects elements (``reshape``,
    ``broadcast_in_dim``, ``transpose``, ``slice``, …) or acts on each alone linearly
    (``neg``, ``convert_element_type``): the primitive on each term's data (one row per
    coordinate of the block) and on the Laplacian, its owner map on the owners.

    Args:
        eqn: the moving or elementwise-linear equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    owner_map = sp.OWNER_MAPS.get(eqn.primitive)
    if owner_map is None or len(ins) != 1:
        return None
    (x,) = ins
    owners = [owner_map(owner, eqn.params) for owner, _ in x.terms]
    if any(o is None for o in owners):
        return None

    def f(v: jax.Array) -> jax.Array:
        return bind(eqn, [v])[0]

    out = f(x.val)
    terms = [
        Term(np.asarray(o), jax.vmap(f)(data)) for o, (_, data) in zip(owners, x.terms)
    ]
    lap = None if x.lap is None else f(x.lap)
    return [SparseJet(out, sp.merge(terms), lap, x.particles)]


def add(eqn: Any, ins: list) -> list | None:
    """``add``/``sub``: the terms of both operands (broadcast to the result's shape,
    the subtrahend's negated), equal owners merged; the Laplacians added.

    Args:
        eqn: the ``add`` or ``sub`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [val(x) for x in ins])
    negate = eqn.primitive is lax.sub_p
    terms: list[Term] = []
    laps: list[jax.Array | None] = []
    particles = 0
    for k, x in enumerate(ins):
        if not isinstance(x, SparseJet):
            continue
        x = sp.broadcast(x, shape)
        particles = x.particles
        sign = -1 if negate and k == 1 else 1
        terms += [Term(o, data if sign == 1 else -data) for o, data in x.terms]
        laps.append(None if x.lap is None else (x.lap if sign == 1 else -x.lap))
    return [SparseJet(out, sp.merge(terms), add_laps(*laps), particles)]


def _product(a: Any, b: Any, out: jax.Array) -> list:
    """``a * b`` elementwise (both of ``out``'s shape or plain): each operand's terms
    times the other's value; ``lap = a Δb + b Δa + 2 sum_q ∂_q a ∂_q b``."""
    terms: list[Term] = []
    laps: list[jax.Array | None] = []
    va, vb = val(a), val(b)
    if isinstance(a, SparseJet):
        terms += [Term(o, data * vb) for o, data in a.terms]
        laps.append(None if a.lap is None else a.lap * vb)
    if isinstance(b, SparseJet):
        terms += [Term(o, va * data) for o, data in b.terms]
        laps.append(None if b.lap is None else va * b.lap)
    if isinstance(a, SparseJet) and isinstance(b, SparseJet):
        laps.append(2.0 * sp.coordinate_dot(a, b))
    particles = next(x.particles for x in (a, b) if isinstance(x, SparseJet))
    return [SparseJet(out, sp.merge(terms), add_laps(*laps), particles)]


def _mixed_product(a: Any, b: Any, out: jax.Array) -> list:
    """``a * b`` elementwise with one operand a dense :class:`Jet` and the other a
    ``SparseJet`` (both of ``out``'s shape): a dense result, whose cross term
    ``sum_q ∂_q a ∂_q b`` reads the dense Jacobian only at the sparse operand's
    owners (``c`` rows per element instead of ``d``)."""
    dense_x, sparse_x = (a, b) if isinstance(a, Jet) else (b, a)
    dv, sv = dense_x.val, sparse_x.val
    scaled = SparseJet(
        out,
        tuple(Term(o, data * dv) for o, data in sparse_x.terms),
        None,
        sparse_x.particles,
    )
    jac = dense_x.jac * sv + sp.densify(scaled)
    rows = dense_x.jac.reshape(
        (sparse_x.particles, sparse_x.block, *dense_x.jac.shape[1:])
    )
    cross = jnp.zeros(out.shape, out.dtype)
    for owner, data in sparse_x.terms:
        index = np.broadcast_to(owner, out.shape)[None, None]
        at_owner = jnp.take_along_axis(rows, jnp.asarray(index), axis=0)[0]
        cross = cross + sp.block_dot(at_owner, data)
    laps = [
        None if dense_x.lap is None else dense_x.lap * sv,
        None if sparse_x.lap is None else dv * sparse_x.lap,
        2.0 * cross,
    ]
    return [Jet(out, jac, add_laps(*laps))]


def _to_shape(x: Any, shape: tuple[int, ...]) -> Any:
    """A dense or sparse jet broadcast to ``shape`` (numpy's rules)."""
    if isinstance(x, SparseJet):
        return sp.broadcast(x, shape)
    return broadcast_jet(x, shape)


def mul(eqn: Any, ins: list) -> list | None:
    """``mul``: the product rule on terms (operands broadcast to the result first);
    with one operand a dense Jet, the mixed product (a dense result).

    Args:
        eqn: the ``mul`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [val(x) for x in ins])
    if any(isinstance(x, Jet) for x in ins):  # one dense, one sparse operand
        if is_complex(out):
            return None
        a, b = (_to_shape(x, shape) for x in ins)
        return _mixed_product(a, b, out)
    a, b = (sp.broadcast(x, shape) if isinstance(x, SparseJet) else x for x in ins)
    return _product(a, b, out)


def div(eqn: Any, ins: list) -> list | None:
    """``a / b``: linear in ``a`` (data and Laplacian divided by ``b``); a ``b`` that
    depends on r: ``a * (1/b)``, the elementwise rule for ``1/b`` then the product
    (with one operand a dense Jet, the mixed product: a softmax's ``e / sum(e)``).

    Args:
        eqn: the ``div`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [val(x) for x in ins])
    if any(isinstance(x, Jet) for x in ins):  # one dense, one sparse operand
        if is_complex(out):
            return None
        a, b = (_to_shape(x, shape) for x in ins)
        if isinstance(b, Jet):
            return _mixed_product(a, unary_rule(lambda v: [1.0 / v[0]], b)[0], out)
        return _mixed_product(a, unary(lambda v: [1.0 / v[0]], b)[0], out)
    a, b = (sp.broadcast(x, shape) if isinstance(x, SparseJet) else x for x in ins)
    if not isinstance(b, SparseJet):
        terms = tuple(Term(o, data / b) for o, data in a.terms)
        lap = None if a.lap is None else a.lap / b
        return [SparseJet(out, terms, lap, a.particles)]
    if is_complex(b.val):
        return None
    (inv,) = unary(lambda v: [1.0 / v[0]], b)
    return _product(a, inv, out)


def reduce_sum(eqn: Any, ins: list) -> list | None:
    """``reduce_sum``: a term whose owner is constant along the summed axes stays a
    term (its data summed); one whose owner varies there mixes particles and becomes
    a dense Jacobian (and then the whole result is a dense :class:`Jet`).

    Args:
        eqn: the ``reduce_sum`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    (x,) = ins
    axes = tuple(eqn.params["axes"])
    value = sum_axes(x.val, axes)
    lap = None if x.lap is None else sum_axes(x.lap, axes)
    kept, dense = sp.reduce_sum(x, axes)
    if dense is None:
        return [SparseJet(value, kept, lap, x.particles)]
    if kept:
        dense = dense + sp.densify(SparseJet(value, kept, lap, x.particles))
    return [Jet(value, dense, lap)]


def _placed_terms(eqn: Any, ins: list, k: int) -> list[Term] | None:
    """Operand ``k``'s terms carried through ``dot_general`` with the other operand's
    value: each term's data through the same product, its owners placed at the
    result's axes (batch axes, then the free axes of the left operand, then those of
    the right); ``None`` if an owner varies along a contracted axis."""
    x, other = ins[k], val(ins[1 - k])
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
    contract, batch = (contract_l, batch_l) if k == 0 else (contract_r, batch_r)
    other_free = jnp.ndim(other) - len(contract_l) - len(batch_l)
    free = [a for a in range(x.val.ndim) if a not in contract and a not in batch]
    shape = _out_shape(eqn)

    def f(v: jax.Array) -> jax.Array:
        return bind(eqn, [v, other] if k == 0 else [other, v])[0]

    terms = []
    for owner, data in x.terms:
        if not sp.constant_along(owner, tuple(contract)):
            return None
        moved = np.transpose(owner, (*batch, *free, *contract))
        moved = moved[(Ellipsis,) + (0,) * len(contract)] if contract else moved
        nb = len(batch)
        if k == 0:
            placed = moved.reshape(moved.shape + (1,) * other_free)
        else:
            placed = moved.reshape(
                moved.shape[:nb] + (1,) * other_free + moved.shape[nb:]
            )
        terms.append(Term(np.broadcast_to(placed, shape), jax.vmap(f)(data)))
    return terms


def _mixed_dot(eqn: Any, ins: list) -> list | None:
    """``dot_general`` of a dense :class:`Jet` and a ``SparseJet`` with no batch axes
    (attention's ``softmax(s) @ v``): a dense result. The dense operand's rows go
    through the product as in the dense rule. Each sparse term must have owners that
    vary along exactly one contracted axis ``j``, one particle per index there, and
    are constant elsewhere (else ``None``: the dense rule): the product with ``j``
    made a batch axis, not summed, gives each particle's rows at once, and the
    Laplacian's cross term reads the dense Jacobian's rows only at ``owner(j)``."""
    (contract_l, contract_r), (batch_l, batch_r) = eqn.params["dimension_numbers"]
    if batch_l or batch_r:
        return None
    k = 0 if isinstance(ins[0], SparseJet) else 1  # the sparse operand
    x, dense_x = ins[k], ins[1 - k]
    contract, other_contract = (
        (contract_l, contract_r)[k],
        (contract_l, contract_r)[1 - k],
    )
    (out,) = bind(eqn, [val(ins[0]), val(ins[1])])
    if not is_float(out) or is_complex(out):
        return None

    def f(u: jax.Array, v: jax.Array) -> jax.Array:  # u: the dense side, v: sparse
        return bind(eqn, [v, u] if k == 0 else [u, v])[0]

    d = dense_x.jac.shape[0]
    jac = jax.vmap(lambda row: f(row, x.val))(dense_x.jac)
    rows = dense_x.jac.reshape((x.particles, x.block, *dense_x.jac.shape[1:]))
    cross = jnp.zeros(out.shape, out.dtype)
    for owner, data in x.terms:
        vary = [a for a in contract if not sp.constant_along(owner, (a,))]
        shrunk = sp.compress(owner)
        if len(vary) != 1 or any(
            shrunk.shape[a] > 1 for a in range(owner.ndim) if a != vary[0]
        ):
            return None
        (j,) = vary
        o = shrunk.reshape(-1)
        if len(set(o.tolist())) != len(o):
            return None
        jd = other_contract[list(contract).index(j)]  # the dense side's axis
        rest = [a for a in contract if a != j]
        rest_d = [other_contract[list(contract).index(a)] for a in rest]
        if k == 0:
            dims = ((tuple(rest), tuple(rest_d)), ((j,), (jd,)))
        else:
            dims = ((tuple(rest_d), tuple(rest)), ((jd,), (j,)))
        unsummed = WithParams(eqn.primitive, {**eqn.params, "dimension_numbers": dims})

        def g(u: jax.Array, v: jax.Array, unsummed: Any = unsummed) -> jax.Array:
            return bind(unsummed, [v, u] if k == 0 else [u, v])[0]

        per = jax.vmap(lambda v: g(dense_x.val, v))(data)  # (c, n_j, *out)
        inverse = np.full(x.particles, len(o))
        inverse[o] = np.arange(len(o))
        got = jnp.take(per, inverse, axis=1, mode="fill", fill_value=0)  # (c, P, *out)
        jac = jac + jnp.moveaxis(got, 1, 0).reshape((d, *out.shape))
        # cross term: the dense rows at particle owner(j), for each j
        moved = jnp.moveaxis(rows, 2 + jd, 2)  # (P, c, n_j, ...)
        picked = moved[o, :, np.arange(len(o))]  # (n_j, c, ...)
        picked = jnp.moveaxis(jnp.moveaxis(picked, 0, 1), 1, 1 + jd)  # (c, *dense)
        cross = cross + sum(f(picked[q], data[q]) for q in range(x.block))
    laps = [
        None if dense_x.lap is None else f(dense_x.lap, x.val),
        None if x.lap is None else f(dense_x.val, x.lap),
        2.0 * cross,
    ]
    return [Jet(out, jac, add_laps(*laps))]


def dot_general(eqn: Any, ins: list) -> list | None:
    """``dot_general`` contracting axes along which every operand's owners are
    constant (``h @ W`` over features; attention logits ``q @ k.T`` over features,
    both operands depending on r). Each operand's terms go through the same product
    with the other's value, their owners placed at the result's axes (batch axes,
    then the free axes of the left operand, then those of the right). With both
    operands on r, ``lap = Δa·b + a·Δb + 2 sum_q ∂_q a·∂_q b``, the last sum per pair
    of terms: the product of their data summed over the block's coordinates, masked
    where their placed owners coincide (the owners do not vary along the contracted
    axes, so the mask factors out of the contraction).

    Args:
        eqn: the ``dot_general`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    if any(isinstance(x, Jet) for x in ins):  # one dense, one sparse operand
        return _mixed_dot(eqn, ins)
    on_r = dep(ins)
    placed = [_placed_terms(eqn, ins, k) for k in on_r]
    if any(t is None for t in placed):
        return None
    terms = [t for ts in placed for t in (ts or [])]
    a, b = ins
    (out,) = bind(eqn, [val(a), val(b)])
    laps: list[jax.Array | None] = []
    if isinstance(a, SparseJet):
        laps.append(None if a.lap is None else bind(eqn, [a.lap, val(b)])[0])
    if isinstance(b, SparseJet):
        laps.append(None if b.lap is None else bind(eqn, [val(a), b.lap])[0])
    if len(on_r) == 2:
        if not is_float(out):
            return None
        cross = jnp.zeros(out.shape, out.dtype)
        for (oa, _), (_, da) in zip(placed[0] or [], a.terms, strict=True):
            for (ob, _), (_, db) in zip(placed[1] or [], b.terms, strict=True):
                mask = sp.compress(np.asarray(oa == ob))
                if not mask.any():
                    continue
                part = jnp.sum(
                    jax.vmap(lambda u, v: bind(eqn, [u, v])[0])(da, db), axis=0
                )
                if not mask.all():
                    part = part * mask.astype(np.dtype(part.dtype))
                cross = cross + part
        laps.append(2.0 * cross)
    particles = next(x.particles for x in ins if isinstance(x, SparseJet))
    return [SparseJet(out, sp.merge(terms), add_laps(*laps), particles)]


def concatenate(eqn: Any, ins: list) -> list | None:
    """``concatenate``: term ``t`` of the result joins term ``t`` of each operand (zero
    data, with owners copied from a neighbour, where an operand has fewer terms or
    does not depend on r): exact whatever the operands' terms are.

    Args:
        eqn: the ``concatenate`` equation (``eqn.params`` read).
        ins: one entry per operand, a ``SparseJet`` where it depends on ``r``.

    Returns:
        One entry per result, or ``None`` for a case not covered (the rule's
        dense form then runs on dense jets).
    """
    dim = eqn.params["dimension"]
    jets = [x for x in ins if isinstance(x, SparseJet)]
    (out,) = bind(eqn, [val(x) for x in ins])
    c, particles = jets[0].block, jets[0].particles
    terms = []
    for t in range(max(len(x.terms) for x in jets)):
        ref = next(x.terms[t].owner for x in jets if len(x.terms) > t)
        owners, datas = [], []
        for x in ins:
            shape = tuple(jnp.shape(val(x)))
            if isinstance(x, SparseJet) and len(x.terms) > t:
                owners.append(x.terms[t].owner)
                datas.append(x.terms[t].data)
            else:
                owners.append(np.broadcast_to(np.take(ref, [0], axis=dim), shape))
                datas.append(jnp.zeros((c, *shape), out.dtype))
        terms.append(
            Term(np.concatenate(owners, axis=dim), jnp.concatenate(datas, axis=dim + 1))
        )
    lap = None
    if any(x.lap is not None for x in jets):
        lap = jnp.concatenate(
            [
                zeros_if_none(x.lap, x.val)
                if isinstance(x, SparseJet)
                else jnp.zeros(jnp.shape(x), out.dtype)
                for x in ins
            ],
            axis=dim,
        )
    return [SparseJet(out, sp.merge(terms), lap, particles)]
