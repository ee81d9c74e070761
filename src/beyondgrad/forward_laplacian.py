r"""The forward Laplacian: the value, Jacobian and Laplacian of a function of one
vector, carried forward through its jaxpr in one pass (Chapter 5).

The maths
---------
For :math:`f:\mathbb{R}^d\to\mathbb{R}^{m}`, every intermediate value :math:`v` of
``f``'s program travels as a :class:`Jet` ``(v, ∂v/∂r, Δv)`` (Li et al., "A
computational framework for neural network-based variational Monte Carlo with Forward
Laplacian", Nature Machine Intelligence 2024), and each primitive maps jets to jets:

* a map linear in some inputs applies to all three parts;
* a bilinear map (``mul``, ``dot_general``) gives
  :math:`\Delta(ab) = a\Delta b + b\Delta a + 2\sum_k \partial_k a\,\partial_k b`;
* an elementwise :math:`g` gives :math:`g'(v)\Delta v + g''(v)\sum_k(\partial_k v)^2`;
* a call (``jit``, ``checkpoint``) and control flow (``scan``, ``while``, ``cond``)
  re-interpret their body on jets, so the savings hold inside loops;
* any other primitive is differentiated alone by forward over forward mode (the
  *generic rule*, below).

Values that do not depend on ``r`` stay plain arrays and cost nothing extra. Compared
with forward over forward mode along the ``d`` directions, the summed second derivative
is carried once instead of ``d`` times.

The rule contract
-----------------
A rule is a :class:`Rule`: ``rule(eqn, ins) -> outs``, where ``eqn`` is the jaxpr
equation (``eqn.primitive``, ``eqn.params``; :func:`bind` re-applies it to plain
values), ``ins`` has one entry per operand, a :class:`Jet` where the operand depends on
``r`` and a plain array otherwise (at least one is a Jet: equations with no Jet input
are simply evaluated, and so are equations with integer or boolean results only:
:func:`has_float_result`), and ``outs`` has one entry per result, a :class:`Jet` or a plain
array where the result does not depend on ``r`` (integer and boolean results are always
plain). A Jet's ``jac`` has shape ``(d, *val.shape)``; its ``lap`` may be ``None``
(known to be zero).

The table :data:`RULES` maps :class:`jax.extend.core.Primitive` *objects* (never names)
to rules, each built by a constructor that *declares* the operation's structure:
:func:`linear`, :func:`bilinear`, :func:`elementwise`, :func:`reduction`,
:func:`constant`, :func:`call`, :func:`generic`, :func:`custom` (any function with the
contract above) and :func:`from_triples` (a function of ``(val, jac, lap)`` triples, the
format of exercise 5.1). Primitives JAX names differently across versions are looked up
through :func:`beyondgrad.compat.primitive`; the table holds only those the running JAX
has.

Adding a rule
-------------
:func:`register_rule` is the one way in (it checks that the key is a ``Primitive``)::

    register_rule(jax.lax.mul_p, from_triples(my_fl_multiply))

and :func:`rules_overridden` does the same for a ``with`` block and restores the table
on exit. Rules are read when ``forward_laplacian`` *traces* ``fn``: a ``jax.jit``
function traced before the change keeps the rules it was traced with.

The generic fallback and its cost
---------------------------------
A primitive without a rule is differentiated on its own by forward over forward mode
along each of the ``d`` Jacobian rows (:func:`generic`): correct for any primitive JAX
can differentiate twice in forward mode, but it costs about ``2 d`` extra JVPs of that
primitive and loses the sharing a structured rule has. :data:`FALLBACK` lists the
primitives that use it deliberately (``pow``, ``sort``, the linear-algebra
factorisations, …). For any other primitive without a rule the interpreter warns once
per primitive (:class:`GenericRuleWarning`, naming the primitive and the cost) and
proceeds. Whatever the primitives, :func:`forward_jet` also warns (once per set of
primitives) when the generic rule makes more than :data:`GENERIC_SHARE_WARNING` of a
program's derivative work by a cost proxy (:class:`_Ledger`), and
:func:`generic_report` lists each equation sent to it with its compiled flops beside
the whole program's.

Particle sparsity
-----------------
With ``particles = P`` (:func:`forward_jet`), ``r`` holds ``P`` particles of
``c = d / P`` coordinates, and a value whose elements each depend on one particle
(or on two, as a pair feature ``h_ij`` does, through two terms) carries its Jacobian
as particle terms of ``c`` rows each instead of ``d`` rows
(``beyondgrad._sparse_jets`` states the maths: owner arrays, and the owner masks
that products and squares of terms need where owners coincide, as on ``i = j``).
A rule keeps the terms if it declares ``Rule.sparse`` (elementwise functions and
elementwise ``custom_jvp`` calls, ``add``/``sub``/``mul``/``div``, the reshapes,
broadcasts, transposes, slices and real-linear maps of ``_sparse_jets.OWNER_MAPS``,
``reduce_sum``, ``dot_general`` with one operand depending on ``r``,
``concatenate``, calls); every other rule, control flow and registered rules
included, receives dense Jets (the terms summed into a ``(d, *shape)`` Jacobian
first), so the default is always correct. Without ``particles`` nothing changes: the
program is the dense one.

Complex values
--------------
Complex intermediates are carried like real ones (the derivatives are with respect to
the real ``r``). The elementwise rule uses :math:`g'` and :math:`g''` of the complex
function, which is right only for a holomorphic :math:`g`: a non-holomorphic one
(``abs``, ``sign``) with a complex input goes to the generic rule, which is exact.

``custom_jvp`` and ``custom_vjp``
---------------------------------
``custom_jvp``: the custom rule is used, as ``jax.jvp`` uses it, never the primal
program's derivative. JAX's own ``slogdet`` and ``det`` (recognised by the identity of
their primal and JVP functions) take their trace identities (one LU factorisation);
a call whose primal *and* JVP programs are elementwise (``softplus``, ``relu``,
``logaddexp``, …) takes the elementwise rule with :math:`g', g''` from the custom rule;
any other goes through the generic rule (forward over forward mode through the custom
JVP rule, which is how ``jax.hessian`` differentiates it too). Where the
rule is the derivative of its own primal output (its purpose: stability, speed) this
gives ``jax.hessian``'s numbers. A rule that is *not* that derivative makes JAX's own
second derivatives mix the two (the rule for one factor of a product, the derivative
of the rule's primal output for the other, so ``jax.hessian`` is not symmetric); a jet
carries one Jacobian, the rule's, and differs from them there.

``custom_vjp``: JAX has no forward mode for it (``jax.jvp`` raises ``TypeError``), and
the methods ``"hessian"``, ``"loop"``, ``"vmap"`` and ``"hutchinson"`` of
:func:`beyondgrad.laplacian.laplacian` all go through its backward rule (reverse mode,
then forward mode over it). Where the backward rule is not the derivative of the
forward function (a straight-through estimator: round forward, identity backward),
that "Hessian" is not the derivative of any single Jacobian a jet could carry. So a
``custom_vjp`` call whose input depends on ``r`` makes :func:`forward_jet` compute the
whole function as ``laplacian(..., method="hessian")`` does: ``jax.jacrev`` for the
Jacobian and the trace of ``jax.jacfwd(jax.jacrev(fn))`` for the Laplacian (same
numbers by construction; it costs a full ``d × d`` Hessian and warns once with
:class:`GenericRuleWarning`).

This module depends on :mod:`beyondgrad.compat` only, so it can be lifted alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondgrad import _checks, compat
from beyondgrad import _sparse_jets as sp
from beyondgrad._sparse_jets import SparseJet, Term
from beyondgrad.compat import Primitive
from beyondgrad.compat import primitives as P

__all__ = [
    "FALLBACK",
    "RULES",
    "GenericRuleWarning",
    "Jet",
    "Rule",
    "bilinear",
    "bind",
    "call",
    "constant",
    "custom",
    "elementwise",
    "forward_jet",
    "forward_laplacian",
    "from_triples",
    "generic",
    "generic_report",
    "GENERIC_SHARE_WARNING",
    "GenericReport",
    "GenericUse",
    "has_float_result",
    "linear",
    "reduction",
    "register_rule",
    "rule_for",
    "rules_overridden",
]


class Jet(NamedTuple):
    """A value that depends on the input ``r`` (shape ``(d,)``), with its derivatives.

    ``jac[k]`` is :math:`\\partial v/\\partial r_k` (shape ``(d, *v.shape)``) and ``lap``
    is :math:`\\sum_k \\partial^2 v/\\partial r_k^2` (``None``: known to be zero).
    Values that do not depend on ``r`` are kept as plain arrays.
    """

    #: The value :math:`v`, any shape, floating-point or complex.
    val: jax.Array
    #: Its Jacobian rows :math:`\partial v/\partial r_k`, shape ``(d, *val.shape)``,
    #: ``val``'s dtype.
    jac: jax.Array
    #: Its Laplacian :math:`\sum_k \partial^2 v/\partial r_k^2`, shaped like ``val``;
    #: ``None`` where it is known to be zero (e.g. a linear function of ``r``).
    lap: jax.Array | None


class GenericRuleWarning(UserWarning):
    """A primitive with no rule is differentiated by the generic rule (forward over
    forward mode on it alone, about ``2 d`` extra JVPs); issued once per primitive."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """A forward-Laplacian rule: ``rule(eqn, ins) -> outs`` (see the module docstring).

    ``kind`` names the structure it declares (``"linear"``, ``"bilinear"``,
    ``"elementwise"``, ``"reduction"``, ``"constant"``, ``"call"``, ``"control"``,
    ``"generic"``, ``"custom"``, ``"triples"``, ``"custom_vjp"``); ``detail`` says more
    (the linear positions, the sub-jaxpr parameter, …).

    ``sparse`` declares that the rule keeps particle sparsity (:func:`forward_jet`
    with ``particles``): a function ``sparse(eqn, ins) -> outs`` whose ``ins`` hold
    ``SparseJet`` s of ``beyondgrad._sparse_jets`` (and plain arrays, never a dense
    :class:`Jet`), returning SparseJets, Jets or plain arrays, or ``None`` for a case
    it does not cover. A rule without it (``None``), or a ``None`` answer, gets its
    operands as dense Jets: correct by default.

    Build one with :func:`linear`, :func:`bilinear`, :func:`elementwise`,
    :func:`custom`, :func:`from_triples`, … rather than by hand; calling the rule
    calls ``apply``.

    Attributes:
        kind: the structure the rule declares, one of the names above.
        apply: the rule itself, ``apply(eqn, ins) -> outs``: ``eqn`` the jaxpr
            equation, ``ins`` one entry per operand (a :class:`Jet` where it depends
            on ``r``, a plain array otherwise), ``outs`` one entry per result.
        detail: a human-readable description of the rule; empty by default.
        sparse: the particle-sparse form ``sparse(eqn, ins) -> outs or None``
            described above; ``None`` (the default): operands are densified.
    """

    kind: str
    apply: Callable[[Any, list[Any]], list[Any]]
    detail: str = ""
    sparse: Callable[[Any, list[Any]], list[Any] | None] | None = None

    def __call__(self, eqn: Any, ins: list[Any]) -> list[Any]:
        return self.apply(eqn, ins)


def bind(eqn: Any, vals: Sequence[Any]) -> list[Any]:
    """Apply ``eqn``'s primitive (with its parameters) to plain values; a list of outputs.

    Args:
        eqn: a jaxpr equation (``eqn.primitive``, ``eqn.params``), as a rule receives it.
        vals: one plain array (not a :class:`Jet`) per operand of ``eqn``, in operand
            order; their shapes may differ from the traced ones where the primitive
            allows it (e.g. a ``jac`` row, or under ``jax.vmap``).

    Returns:
        A list with one array per result of the primitive (a one-element list for a
        primitive with a single result).
    """
    return compat.bind_equation(eqn, list(vals))


# ----------------------------------------------------------------------------- helpers


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _is_complex(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.complexfloating)


def _zeros_if_none(lap: jax.Array | None, like: jax.Array) -> jax.Array:
    return jnp.zeros_like(like) if lap is None else lap


def _is_jet(x: Any) -> bool:
    return isinstance(x, (Jet, SparseJet))


def _val(x: Any) -> Any:
    return x.val if _is_jet(x) else x


def _dep(ins: Sequence[Any]) -> list[int]:
    return [k for k, x in enumerate(ins) if _is_jet(x)]


def _jet_dim(ins: Sequence[Any]) -> int:
    return next(
        x.d if isinstance(x, SparseJet) else int(x.jac.shape[0])
        for x in ins
        if _is_jet(x)
    )


#: summed axes at most this long are summed slice by slice (see :func:`_sum_axes`)
_UNROLL_SUM = 16


def _sum_axes(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``jnp.sum(x, axes)``, short axes as a sum of their slices (elementwise adds).

    Short reductions (3 coordinates, 10 polynomial terms) are the common case in
    orbitals; as adds they fuse with their neighbours instead of being a separate
    reduction over a short innermost axis, which the CPU compiler does slowly.
    """
    long_axes = tuple(a for a in axes if x.shape[a] > _UNROLL_SUM)
    short = sorted((a for a in axes if x.shape[a] <= _UNROLL_SUM), reverse=True)
    if long_axes:
        x = jnp.sum(x, axis=long_axes, keepdims=True)
    for a in short:  # from the last axis, so earlier axis numbers stay valid
        parts = [
            jax.lax.index_in_dim(x, k, a, keepdims=False) for k in range(x.shape[a])
        ]
        x = functools.reduce(jnp.add, parts) if parts else jnp.sum(x, axis=a)
    return jnp.squeeze(x, axis=tuple(a - sum(b < a for b in short) for a in long_axes))


# ----------------------------------------------------------------------------- rule bodies


def _linear_rule(
    apply: Callable,
    ins: list,
    positions: tuple[int, ...],
    tangent: Callable | None = None,
) -> list:
    """``apply`` is linear in the inputs at ``positions`` (the others do not depend on r).

    ``tangent`` (default ``apply``) is the map applied to the Jacobian rows and the
    Laplacian: it differs from ``apply`` where the primitive adds a constant (a
    ``gather`` whose out-of-bounds slots take a fill value has derivative 0 there)."""
    vals = [_val(x) for x in ins]
    outs = apply(vals)
    tangent = apply if tangent is None else tangent

    def with_(parts: dict[int, jax.Array]) -> list:
        return tangent(
            [parts.get(k, v) if k in positions else v for k, v in enumerate(vals)]
        )

    dep = [k for k in positions if k < len(ins) and isinstance(ins[k], Jet)]
    zero = {
        k: jnp.zeros_like(vals[k]) for k in positions if k < len(ins) and k not in dep
    }
    jacs = jax.vmap(lambda *js: with_({**zero, **dict(zip(dep, js))}))(
        *[ins[k].jac for k in dep]
    )
    if all(ins[k].lap is None for k in dep):
        laps = [None] * len(outs)
    else:
        laps = with_({**zero, **{k: _zeros_if_none(ins[k].lap, vals[k]) for k in dep}})
    return [Jet(o, j, lp) if _is_float(o) else o for o, j, lp in zip(outs, jacs, laps)]


def _bilinear_rule(apply: Callable, a: Jet, b: Jet) -> list:
    """``apply(a, b)`` bilinear, both inputs depending on r: the product rule, twice."""
    (out,) = apply([a.val, b.val])
    jac = jax.vmap(lambda ja, jb: apply([ja, b.val])[0] + apply([a.val, jb])[0])(
        a.jac, b.jac
    )
    cross = _sum_axes(jax.vmap(lambda ja, jb: apply([ja, jb])[0])(a.jac, b.jac), (0,))
    lap = 2.0 * cross
    if a.lap is not None:
        lap = lap + apply([a.lap, b.val])[0]
    if b.lap is not None:
        lap = lap + apply([a.val, b.lap])[0]
    return [Jet(out, jac, lap)]


def _slopes(apply: Callable, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(f(v), f'(v), f''(v))`` of an elementwise ``f``: forward over forward on ones."""
    ones = jnp.ones_like(v)

    def slope(u: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.jvp(lambda w: apply([w])[0], (u,), (ones,))

    (out, d1), (_, d2) = jax.jvp(slope, (v,), (ones,))
    return out, d1, d2


def _unary_rule(apply: Callable, x: Jet) -> list:
    """Elementwise ``f``: jac = f'(x) jac_x, lap = f'(x) lap_x + f''(x) sum_k jac_x[k]^2."""
    out, d1, d2 = _slopes(apply, x.val)
    if not _is_float(out):
        return [out]
    lap = d2 * _sum_axes(x.jac * x.jac, (0,))
    if x.lap is not None:
        lap = lap + d1 * x.lap
    return [Jet(out, d1 * x.jac, lap)]


def _reduce_sum_rule(x: Jet, axes: tuple[int, ...]) -> list:
    """``reduce_sum`` is linear: the same sum of each part (jac's axes are shifted by one)."""
    jac = _sum_axes(x.jac, tuple(a + 1 for a in axes))
    lap = None if x.lap is None else _sum_axes(x.lap, axes)
    return [Jet(_sum_axes(x.val, axes), jac, lap)]


def _generic_rule(apply: Callable, ins: list) -> list:
    """Any primitive: forward over forward mode on it alone, along each jac direction."""
    vals = [_val(x) for x in ins]
    dep = _dep(ins)

    def f(*dep_vals: jax.Array) -> list:
        full = list(vals)
        for k, v in zip(dep, dep_vals):
            full[k] = v
        return apply(full)

    primals = tuple(vals[k] for k in dep)

    def along(*tangents: jax.Array) -> tuple[list, list]:
        def first(*p: jax.Array) -> list:
            return jax.jvp(f, p, tangents)[1]

        return jax.jvp(first, primals, tangents)

    outs = f(*primals)
    float_out = [_is_float(o) for o in outs]
    if not any(float_out):
        return outs
    firsts, seconds = jax.vmap(along)(*[ins[k].jac for k in dep])
    laps_in = tuple(_zeros_if_none(ins[k].lap, vals[k]) for k in dep)
    _, lin = jax.jvp(f, primals, laps_in)
    return [
        Jet(o, j, lp + _sum_axes(s, (0,))) if fl else o
        for o, j, s, lp, fl in zip(outs, firsts, seconds, lin, float_out)
    ]


# ----------------------------------------------------------------------------- sparse bodies
# The particle-sparse versions of the rules (``Rule.sparse``; the representation and
# its maths are in ``beyondgrad._sparse_jets``). Each receives SparseJets and plain
# arrays and returns ``None`` for a case it does not cover (the interpreter then
# passes dense Jets to the rule's ``apply``).


def _densify(x: Any) -> Any:
    """A SparseJet as the dense :class:`Jet` it stands for; anything else unchanged."""
    if isinstance(x, SparseJet):
        return Jet(x.val, sp.densify(x), x.lap)
    return x


def _out_shape(eqn: Any, k: int = 0) -> tuple[int, ...]:
    return tuple(eqn.outvars[k].aval.shape)


def _sparse_unary(apply: Callable, x: SparseJet) -> list:
    """Elementwise ``f``: each term's data times ``f'(x)``;
    ``lap = f'(x) lap_x + f''(x) sum_q (∂_q x)^2`` (the sum by owner masks)."""
    out, d1, d2 = _slopes(apply, x.val)
    if not _is_float(out):
        return [out]
    lap = d2 * sp.coordinate_dot(x, x)
    if x.lap is not None:
        lap = lap + d1 * x.lap
    terms = tuple(Term(owner, d1 * data) for owner, data in x.terms)
    return [SparseJet(out, terms, lap, x.particles)]


def _sparse_structural(eqn: Any, ins: list) -> list | None:
    """A primitive that moves, repeats or selects elements (``reshape``,
    ``broadcast_in_dim``, ``transpose``, ``slice``, …) or acts on each alone linearly
    (``neg``, ``convert_element_type``): the primitive on each term's data (one row per
    coordinate of the block) and on the Laplacian, its owner map on the owners."""
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


def _add_laps(*laps: jax.Array | None) -> jax.Array | None:
    present = [lp for lp in laps if lp is not None]
    return functools.reduce(jnp.add, present) if present else None


def _sparse_add(eqn: Any, ins: list) -> list | None:
    """``add``/``sub``: the terms of both operands (broadcast to the result's shape,
    the subtrahend's negated), equal owners merged; the Laplacians added."""
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [_val(x) for x in ins])
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
    return [SparseJet(out, sp.merge(terms), _add_laps(*laps), particles)]


def _sparse_product(a: Any, b: Any, out: jax.Array) -> list:
    """``a * b`` elementwise (both of ``out``'s shape or plain): each operand's terms
    times the other's value; ``lap = a Δb + b Δa + 2 sum_q ∂_q a ∂_q b``."""
    terms: list[Term] = []
    laps: list[jax.Array | None] = []
    va, vb = _val(a), _val(b)
    if isinstance(a, SparseJet):
        terms += [Term(o, data * vb) for o, data in a.terms]
        laps.append(None if a.lap is None else a.lap * vb)
    if isinstance(b, SparseJet):
        terms += [Term(o, va * data) for o, data in b.terms]
        laps.append(None if b.lap is None else va * b.lap)
    if isinstance(a, SparseJet) and isinstance(b, SparseJet):
        laps.append(2.0 * sp.coordinate_dot(a, b))
    particles = next(x.particles for x in (a, b) if isinstance(x, SparseJet))
    return [SparseJet(out, sp.merge(terms), _add_laps(*laps), particles)]


def _sparse_mul(eqn: Any, ins: list) -> list | None:
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [_val(x) for x in ins])
    a, b = (sp.broadcast(x, shape) if isinstance(x, SparseJet) else x for x in ins)
    return _sparse_product(a, b, out)


def _sparse_div(eqn: Any, ins: list) -> list | None:
    """``a / b``: linear in ``a`` (data and Laplacian divided by ``b``); a ``b`` that
    depends on r: ``a * (1/b)``, the elementwise rule for ``1/b`` then the product."""
    shape = _out_shape(eqn)
    (out,) = bind(eqn, [_val(x) for x in ins])
    a, b = (sp.broadcast(x, shape) if isinstance(x, SparseJet) else x for x in ins)
    if not isinstance(b, SparseJet):
        terms = tuple(Term(o, data / b) for o, data in a.terms)
        lap = None if a.lap is None else a.lap / b
        return [SparseJet(out, terms, lap, a.particles)]
    if _is_complex(b.val):
        return None
    (inv,) = _sparse_unary(lambda v: [1.0 / v[0]], b)
    return _sparse_product(a, inv, out)


def _sparse_reduce_sum(eqn: Any, ins: list) -> list | None:
    """``reduce_sum``: a term whose owner is constant along the summed axes stays a
    term (its data summed); one whose owner varies there mixes particles and becomes
    a dense Jacobian (and then the whole result is a dense :class:`Jet`)."""
    (x,) = ins
    axes = tuple(eqn.params["axes"])
    val = _sum_axes(x.val, axes)
    lap = None if x.lap is None else _sum_axes(x.lap, axes)
    kept, dense = sp.reduce_sum(x, axes)
    if dense is None:
        return [SparseJet(val, kept, lap, x.particles)]
    if kept:
        dense = dense + sp.densify(SparseJet(val, kept, lap, x.particles))
    return [Jet(val, dense, lap)]


def _sparse_dot_general(eqn: Any, ins: list) -> list | None:
    """``dot_general`` with one operand depending on r, contracting axes along which
    its owners are constant (``h @ W`` over features): linear, each term's data
    through the same product, its owners placed at the result's axes (batch axes,
    then the free axes of the left operand, then those of the right)."""
    dep = _dep(ins)
    if len(dep) != 1:
        return None
    (k,) = dep
    x, other = ins[k], ins[1 - k]
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
    lap = None if x.lap is None else f(x.lap)
    return [SparseJet(f(x.val), sp.merge(terms), lap, x.particles)]


def _sparse_concatenate(eqn: Any, ins: list) -> list | None:
    """``concatenate``: term ``t`` of the result joins term ``t`` of each operand (zero
    data, with owners copied from a neighbour, where an operand has fewer terms or
    does not depend on r): exact whatever the operands' terms are."""
    dim = eqn.params["dimension"]
    jets = [x for x in ins if isinstance(x, SparseJet)]
    (out,) = bind(eqn, [_val(x) for x in ins])
    c, particles = jets[0].block, jets[0].particles
    terms = []
    for t in range(max(len(x.terms) for x in jets)):
        ref = next(x.terms[t].owner for x in jets if len(x.terms) > t)
        owners, datas = [], []
        for x in ins:
            shape = tuple(jnp.shape(_val(x)))
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
                _zeros_if_none(x.lap, x.val)
                if isinstance(x, SparseJet)
                else jnp.zeros(jnp.shape(x), out.dtype)
                for x in ins
            ],
            axis=dim,
        )
    return [SparseJet(out, sp.merge(terms), lap, particles)]


# ----------------------------------------------------------------------------- constructors


class _Ledger:
    """What one trace of :func:`forward_jet` sent to the generic rule, and a cost proxy
    for the whole program: derivative elements written, ``(d + 1) × size`` per result
    of a structured rule, ``(2 d + 1) × (operand + result sizes)`` per generic use (it
    runs the primitive's own JVP ``2 d + 1`` times), times ``n`` for the matrix
    factorisations and solves of ``n × n`` matrices (:data:`_CUBIC`)."""

    def __init__(self) -> None:
        self.uses: list[tuple[Any, list[Any]]] = []
        self.total = 0
        self.generic = 0


_LEDGERS: list[_Ledger] = []
_CUBIC = {
    P.lu_p,
    P.cholesky_p,
    P.qr_p,
    P.eigh_p,
    P.svd_p,
    P.triangular_solve_p,
    lax.linear_solve_p,
}


def _size(x: Any) -> int:
    return int(jnp.size(_val(x)))


def _apply_generic(eqn: Any, ins: list) -> list:
    if _LEDGERS:
        d = _jet_dim(ins)
        cost = (2 * d + 1) * (
            sum(_size(x) for x in ins)
            + sum(int(np.prod(v.aval.shape)) for v in eqn.outvars)
        )
        if eqn.primitive in _CUBIC:  # n^3 work on n^2 elements
            cost *= int(jnp.shape(_val(ins[0]))[-1])
        for ledger in _LEDGERS:
            ledger.uses.append((eqn, list(ins)))
            ledger.generic += cost
            ledger.total += cost
    return _generic_rule(functools.partial(bind, eqn), ins)


def generic(reason: str = "") -> Rule:
    """The generic rule, chosen deliberately: forward over forward mode on the primitive
    alone along each Jacobian row (about ``2 d`` JVPs of it). ``reason`` documents why.

    For an output :math:`y = p(x)` of the primitive :math:`p` it computes, per row
    :math:`k`, :math:`\\partial_k y = J_p\\,\\partial_k x` and
    :math:`\\partial_k^2 y = J_p\\,\\partial_k^2 x + \\partial_k x^\\top
    \\nabla^2 p\\,\\partial_k x` (a JVP of a JVP), then sums the second over
    :math:`k`.

    Args:
        reason: why no structured rule is written, kept as the rule's ``detail``;
            empty by default.

    Returns:
        A :class:`Rule` of kind ``"generic"``.

    Raises:
        TypeError: ``reason`` is not a str.
    """
    if not isinstance(reason, str):
        raise TypeError(
            f"generic(): reason must be a str (why no structured rule is written), "
            f"got {type(reason).__name__}"
        )
    return Rule("generic", _apply_generic, reason)


_GENERIC = generic("no structured rule")


def linear(*positions: int, all_from: int | None = None) -> Rule:
    """Linear in the operands at ``positions`` jointly (or in every operand from
    ``all_from`` on: ``concatenate`` has ``all_from=0``, ``select_n`` ``all_from=1``, after
    its predicate); the other operands must not depend on ``r`` (if one does, the generic
    rule is used). Each of jac's ``d`` rows and the Laplacian go through the same map as
    the value.

    Args:
        *positions: the operand positions (Python ints, 0-based) in which the primitive
            is jointly linear, e.g. ``linear(0)``.
        all_from: the first of the linear operands, which run to the last one (when
            given, ``positions`` is ignored); ``None``: ``positions`` alone.

    Returns:
        A :class:`Rule` of kind ``"linear"``.

    Raises:
        ValueError: if neither ``positions`` nor ``all_from`` is given.
        TypeError: if a position or ``all_from`` is not a Python int.
    """
    if not positions and all_from is None:
        raise ValueError("linear() needs the linear positions or all_from")
    for k in (*positions, all_from or 0):
        _checks.integer(
            k,
            "each operand position",
            meaning="e.g. linear(0) or linear(all_from=1)",
            where="linear() takes operand positions as ints: ",
        )

    def apply(eqn: Any, ins: list) -> list:
        pos = positions if all_from is None else tuple(range(all_from, len(ins)))
        if not set(_dep(ins)) <= set(pos):
            return _GENERIC(eqn, ins)
        return _linear_rule(functools.partial(bind, eqn), ins, pos)

    detail = f"operands {positions}" if all_from is None else f"operands {all_from}.."
    return Rule("linear", apply, detail)


def bilinear() -> Rule:
    """Bilinear in operands 0 and 1 (``mul``, ``dot_general``): linear when only one of
    them depends on ``r``, the product rule (two Jacobian terms, one cross term summed
    over the ``d`` rows) when both do.

    For :math:`y = B(a, b)` with both operands depending on ``r``:
    :math:`\\partial_k y = B(\\partial_k a, b) + B(a, \\partial_k b)` and
    :math:`\\Delta y = B(\\Delta a, b) + B(a, \\Delta b) + 2\\sum_k B(\\partial_k a,
    \\partial_k b)`.

    Returns:
        A :class:`Rule` of kind ``"bilinear"``.
    """

    def apply(eqn: Any, ins: list) -> list:
        dep = _dep(ins)
        if len(dep) == 1:
            return _linear_rule(functools.partial(bind, eqn), ins, tuple(dep))
        return _bilinear_rule(functools.partial(bind, eqn), ins[0], ins[1])

    return Rule("bilinear", apply, "operands (0, 1)")


def elementwise(*, holomorphic: bool = True) -> Rule:
    """An elementwise function of one operand: ``f'`` and ``f''`` by forward over forward
    mode on ones (elementwise, so one JVP each, not ``d``). ``holomorphic=False``
    (``abs``, ``sign``): a complex operand goes to the generic rule, since the chain rule
    with ``f'`` of a non-holomorphic ``f`` is wrong for complex values.

    For :math:`y = f(x)` elementwise: :math:`\\partial_k y = f'(x)\\,\\partial_k x` and
    :math:`\\Delta y = f'(x)\\,\\Delta x + f''(x) \\sum_k (\\partial_k x)^2`. The rule
    keeps particle sparsity (it has a ``sparse`` form). An equation with more than
    one operand goes to the generic rule.

    Args:
        holomorphic: ``True`` (the default): ``f`` is complex-differentiable, so the
            rule also serves complex operands; ``False``: it serves real operands only
            and sends a complex one to the generic rule.

    Returns:
        A :class:`Rule` of kind ``"elementwise"``.

    Raises:
        TypeError: ``holomorphic`` is not ``True`` or ``False``.
    """
    _checks.boolean(holomorphic, "holomorphic", where="elementwise(): ")

    def apply(eqn: Any, ins: list) -> list:
        if len(ins) != 1 or (not holomorphic and _is_complex(ins[0].val)):
            return _GENERIC(eqn, ins)
        return _unary_rule(functools.partial(bind, eqn), ins[0])

    def sparse(eqn: Any, ins: list) -> list | None:
        if len(ins) != 1 or (not holomorphic and _is_complex(ins[0].val)):
            return None
        return _sparse_unary(functools.partial(bind, eqn), ins[0])

    detail = "holomorphic" if holomorphic else "real only"
    return Rule("elementwise", apply, detail, sparse)


def reduction() -> Rule:
    """``reduce_sum``: linear; short summed axes are summed slice by slice.

    The value, each Jacobian row and the Laplacian are summed over the equation's
    ``axes``; the rule keeps particle sparsity.

    Returns:
        A :class:`Rule` of kind ``"reduction"``.
    """
    return Rule(
        "reduction",
        lambda eqn, ins: _reduce_sum_rule(ins[0], tuple(eqn.params["axes"])),
        "sum over eqn.params['axes']",
        _sparse_reduce_sum,
    )


def constant() -> Rule:
    """Results that do not depend on ``r`` (integer or boolean results, or a derivative
    that is zero almost everywhere: ``floor``, ``round``, comparisons): plain values.

    Returns:
        A :class:`Rule` of kind ``"constant"`` (the primitive applied to the
        operands' values, with no Jacobian or Laplacian).
    """

    def apply(eqn: Any, ins: list) -> list:
        return bind(eqn, [_val(x) for x in ins])

    return Rule("constant", apply, "zero derivative", apply)


def call(*params: str) -> Rule:
    """A call of the sub-jaxpr in ``eqn.params[param]``, for the first of ``params``
    the equation has (``jit``, ``checkpoint``; a parameter renamed across JAX versions
    is given by both names): the body is interpreted in place on jets
    (``checkpoint``'s rematerialisation is for reverse mode, which the forward
    Laplacian does not run). An equation that has none of ``params`` goes to the
    generic rule.

    Args:
        *params: the names (strs) under which the equation's parameters hold the
            sub-jaxpr, tried in order, e.g. ``call("jaxpr")`` for ``jit``.

    Returns:
        A :class:`Rule` of kind ``"call"``.

    Raises:
        TypeError: if no name is given or a name is not a str.
    """
    if not params or not all(isinstance(k, str) for k in params):
        raise TypeError(
            f"call() takes the names of the sub-jaxpr parameter as strs, got {params!r}"
            ' (e.g. call("jaxpr") for jit)'
        )

    def apply(eqn: Any, ins: list) -> list:
        param = next((k for k in params if k in eqn.params), None)
        if param is None:
            return _GENERIC(eqn, ins)
        inner, consts = _open(eqn.params[param])
        return _interpret(inner, consts, ins)

    def sparse(eqn: Any, ins: list) -> list | None:
        param = next((k for k in params if k in eqn.params), None)
        if param is None:
            return None
        inner, consts = _open(eqn.params[param])
        return _interpret(inner, consts, ins)

    detail = " or ".join(f"sub-jaxpr eqn.params[{k!r}]" for k in params)
    return Rule("call", apply, detail, sparse)


def custom(fn: Callable[[Any, list[Any]], list[Any]], detail: str = "") -> Rule:
    """A rule written against the contract ``fn(eqn, ins) -> outs`` (module docstring).

    Args:
        fn: a function ``fn(eqn, ins) -> outs``: ``eqn`` the jaxpr equation, ``ins``
            a list with one entry per operand (a :class:`Jet` where it depends on
            ``r``, a plain array otherwise), ``outs`` a list with one entry per result
            (a :class:`Jet` whose ``jac`` has shape ``(d, *shape)``, or a plain array).
        detail: a description shown in the rule's ``detail``; empty: ``fn``'s
            ``__name__``.

    Returns:
        A :class:`Rule` of kind ``"custom"``.

    Raises:
        TypeError: if ``fn`` is not callable.
    """
    _checks.function(fn, "fn", "a function fn(eqn, ins)", where="custom(): ")
    return Rule("custom", fn, detail or getattr(fn, "__name__", ""))


def from_triples(fn: Callable[..., Any]) -> Rule:
    """A rule from a function of ``(val, jac, lap)`` triples, one per operand (exercise
    5.1's format: ``jac`` has shape ``(d, *val.shape)``, Jacobian rows first).

    ``fn(*triples)`` returns one triple (or a list of triples for a primitive with
    several results). The engine passes every operand as a triple: one that does not
    depend on ``r`` gets zero ``jac`` and ``lap``, a ``lap`` known to be zero is passed
    as zeros, and a scalar operand of an elementwise primitive (a literal such as the
    ``2.0`` of ``2.0 * x``) is broadcast to the result's shape. The primitive's
    parameters are not passed, so this suits primitives without parameters that change
    the maths (``mul``, ``add``, ``sin``); otherwise write a :func:`custom` rule.
    Results that are not floating-point are kept as plain values.

    Args:
        fn: a function ``fn(*triples)`` of one ``(val, jac, lap)`` triple per operand,
            returning one triple (a list of triples for a primitive with several
            results): ``val`` and ``lap`` of the result's shape, ``jac`` of shape
            ``(d, *shape)``.

    Returns:
        A :class:`Rule` of kind ``"triples"``; when the rule runs, a result that is
        not a triple is a ``TypeError`` and a triple of other shapes a
        ``ValueError``, both naming the primitive.

    Raises:
        TypeError: if ``fn`` is not callable.
    """
    _checks.function(
        fn, "fn", "a function of (val, jac, lap) triples", where="from_triples(): "
    )

    def apply(eqn: Any, ins: list) -> list:
        d = _jet_dim(ins)
        triples = []
        for x, atom in zip(ins, eqn.invars):
            if isinstance(x, Jet):
                triples.append((x.val, x.jac, _zeros_if_none(x.lap, x.val)))
            else:  # a constant, in the shape the equation declares (a literal: ())
                x = jnp.reshape(jnp.asarray(x), atom.aval.shape)
                triples.append(
                    (x, jnp.zeros((d, *x.shape), x.dtype), jnp.zeros_like(x))
                )
        want = jax.eval_shape(lambda *v: bind(eqn, v), *[t[0] for t in triples])
        if len(want) == 1 and want[0].shape:  # a scalar operand of an elementwise op
            shape = want[0].shape
            triples = [
                (
                    jnp.broadcast_to(v, shape),
                    jnp.broadcast_to(j[(...,) + (None,) * len(shape)], (d, *shape)),
                    jnp.broadcast_to(lp, shape),
                )
                if v.shape == ()
                else (v, j, lp)
                for v, j, lp in triples
            ]
        got = fn(*triples)
        results = list(got) if eqn.primitive.multiple_results else [got]
        outs = []
        for k, (res, spec) in enumerate(zip(results, want)):
            if not isinstance(res, (tuple, list)) or len(res) != 3:
                raise TypeError(
                    f"the rule for {eqn.primitive.name} must return (val, jac, lap) "
                    f"triples; result {k} is {type(res).__name__}"
                )
            val, jac, lap = (jnp.asarray(p) for p in res)
            shapes = (val.shape, jac.shape, lap.shape)
            expected = (spec.shape, (d, *spec.shape), spec.shape)
            if shapes != expected:
                raise ValueError(
                    f"the rule for {eqn.primitive.name} returned shapes {shapes} for "
                    f"(val, jac, lap); expected {expected}"
                )
            outs.append(Jet(val, jac, lap) if _is_float(val) else val)
        return outs

    return Rule("triples", apply, getattr(fn, "__name__", ""))


# ----------------------------------------------------------------------------- the rules


def _broadcast_jet(x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` (a Jet or a plain value) broadcast to ``shape`` (numpy rules)."""
    if not isinstance(x, Jet):
        return jnp.broadcast_to(x, shape)
    if tuple(x.val.shape) == tuple(shape):
        return x
    d = x.jac.shape[0]
    jac = jnp.broadcast_to(
        jnp.reshape(x.jac, (d,) + (1,) * (len(shape) - x.val.ndim) + x.val.shape),
        (d, *shape),
    )
    lap = None if x.lap is None else jnp.broadcast_to(x.lap, shape)
    return Jet(jnp.broadcast_to(x.val, shape), jac, lap)


def _div(eqn: Any, ins: list) -> list:
    """``a / b``: linear in ``a``; for ``b`` depending on r, ``a * (1/b)`` with the
    elementwise rule for ``1/b`` and the product rule (operands of different shapes,
    a scalar literal over an array, are broadcast first)."""
    if _dep(ins) == [0]:
        return _linear_rule(functools.partial(bind, eqn), ins, (0,))
    a, b = ins
    if _is_complex(b.val):
        return _GENERIC(eqn, ins)
    shape = jnp.broadcast_shapes(jnp.shape(_val(a)), jnp.shape(b.val))
    a, b = _broadcast_jet(a, shape), _broadcast_jet(b, shape)
    (inv,) = _unary_rule(lambda v: [1.0 / v[0]], b)
    if not isinstance(a, Jet):
        return _linear_rule(lambda v: [v[0] * v[1]], [a, inv], (1,))
    return _bilinear_rule(lambda v: [v[0] * v[1]], a, inv)


def _chooser(eqn: Any, ins: list) -> list:
    """``max``/``min`` of two operands: the jet of the chosen operand, the mean of the
    two where they are equal (JAX's own JVP of ``max``/``min`` weighs ties 1/2 each,
    so this is ``jax.hessian``'s convention). Complex operands: the generic rule."""
    if any(_is_complex(_val(x)) for x in ins):
        return _GENERIC(eqn, ins)
    a, b = (_val(x) for x in ins)
    (ans,) = bind(eqn, [a, b])
    wa = jnp.where(a == ans, jnp.where(b == ans, 0.5, 1.0), 0.0).astype(ans.dtype)
    wb = jnp.where(b == ans, jnp.where(a == ans, 0.5, 1.0), 0.0).astype(ans.dtype)
    shape = ans.shape
    outs = _linear_rule(
        lambda v: [jnp.broadcast_to(wa * v[0] + wb * v[1], shape)], list(ins), (0, 1)
    )
    return [Jet(ans, outs[0].jac, outs[0].lap)]


def _reduce_chooser(eqn: Any, ins: list) -> list:
    """``reduce_max``/``reduce_min``: linear with the weights of JAX's JVP (the chosen
    elements, ties sharing equally): a weighted sum over ``eqn.params['axes']``."""
    (x,) = ins
    if _is_complex(x.val):
        return _GENERIC(eqn, ins)
    axes = tuple(eqn.params["axes"])
    (ans,) = bind(eqn, [x.val])
    keep = jnp.expand_dims(ans, axes)
    hit = (x.val == keep).astype(x.val.dtype)
    w = hit / jnp.sum(hit, axis=axes, keepdims=True)
    jac = jnp.sum(x.jac * w, axis=tuple(a + 1 for a in axes))
    lap = None if x.lap is None else jnp.sum(x.lap * w, axis=axes)
    return [Jet(ans, jac, lap)]


class _WithParams(NamedTuple):
    """An equation's primitive with changed parameters, for :func:`bind`."""

    primitive: Primitive
    params: dict[str, Any]


def _gather(eqn: Any, ins: list) -> list:
    """``gather``: linear in the operand, except that a slot out of bounds under
    ``mode=FILL_OR_DROP`` takes ``fill_value`` (a constant, NaN by default): its
    derivatives are 0, so the Jacobian rows and the Laplacian are gathered with fill
    value 0 (as JAX's own JVP of ``gather`` does)."""
    if _dep(ins) != [0]:
        return _GENERIC(eqn, ins)
    zero_fill = _WithParams(eqn.primitive, {**eqn.params, "fill_value": 0})
    return _linear_rule(
        functools.partial(bind, eqn),
        ins,
        (0,),
        tangent=functools.partial(bind, zero_fill),
    )


def _scatter(eqn: Any, ins: list) -> list:
    """``scatter`` (``x.at[i].set(y)``): jointly linear in the operand and the updates
    when each slot is written at most once (``unique_indices``). With repeated
    indices the slot keeps one of its updates, chosen by the backend: the generic
    rule (JAX's own JVP, which tracks which update won) keeps the derivatives with
    the value. An update function (``x.at[i].apply(fn)``: ``update_jaxpr``) has no
    derivative in JAX (its JVP raises), and neither has it here."""
    if eqn.params.get("update_jaxpr") is not None:
        raise NotImplementedError(
            "forward_laplacian: scatter with an update function (update_jaxpr, from "
            "x.at[i].apply(fn)) has no derivative rule, in JAX or here; write "
            "x.at[i].set(fn(x[i])) instead"
        )
    if not eqn.params.get("unique_indices", False):
        return _GENERIC(eqn, ins)
    if not set(_dep(ins)) <= {0, 2}:
        return _GENERIC(eqn, ins)
    return _linear_rule(functools.partial(bind, eqn), ins, (0, 2))


# ----------------------------------------------------------------------------- custom_jvp
# A ``custom_jvp_call`` keeps its custom rule (see the module docstring). Two kinds
# of call have a structure the generic rule would throw away, and get it back here:
#
# * ``jnp.linalg.slogdet`` and ``jnp.linalg.det`` (recognised by the identity of
#   JAX's own primal and JVP functions, never by a name a user could reuse), with
#   :math:`\partial_k \log|\det A| = \mathrm{tr}(A^{-1}\partial_k A)` and
#   :math:`\Delta \log|\det A| = \mathrm{tr}(A^{-1}\Delta A)
#   - \sum_k \mathrm{tr}(A^{-1}\partial_k A\,A^{-1}\partial_k A)`
#   (Chapter 5): one LU factorisation, whose triangular factors give both the value
#   and :math:`A^{-1}` (two triangular solves), then matrix products;
# * elementwise functions (``softplus``, ``logaddexp``, ``relu``, …): a call whose
#   primal program *and* custom JVP program are elementwise in the one operand that
#   depends on r takes the elementwise rule, with :math:`g'` and :math:`g''` from
#   the custom rule (forward over forward mode on ones, as ``jax.hessian`` would).


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
    # tr(A^{-1} A_k) and, with B_k = A^{-1} A_k, sum_k tr(B_k B_k)
    jac = jnp.einsum("...ij,k...ji->k...", inv, a.jac)
    b = jnp.einsum("...ij,k...jl->k...il", inv, a.jac)
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
    lap = sigma * _sum_axes(second, (0,))
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
        rule = RULES.get(prim)
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
    (k,) = _dep(ins)
    shape = tuple(ins[k].val.shape)
    if any(tuple(v.aval.shape) != shape for v in eqn.outvars) or len(eqn.outvars) != 1:
        return False
    if not _is_float(ins[k].val) or _is_complex(ins[k].val):
        return False
    call = eqn.params.get("call_jaxpr")
    if call is None or not _is_pointwise(getattr(call, "jaxpr", call), shape):
        return False
    vals = [_val(x) for x in ins]

    def tangent_map(x: jax.Array, t: jax.Array) -> Any:
        def at(v: jax.Array) -> Any:
            return bind(eqn, [*vals[:k], v, *vals[k + 1 :]])[0]

        return jax.jvp(at, (x,), (t,))

    jvp = jax.make_jaxpr(tangent_map)(vals[k], vals[k]).jaxpr
    return _is_pointwise(jvp, shape)


def _custom_jvp_rule(eqn: Any, ins: list) -> list:
    """A ``custom_jvp_call``: JAX's ``slogdet``/``det`` by their trace identities, an
    elementwise function by the elementwise rule (both with the custom rule's
    derivatives), anything else by the generic rule through the custom rule."""
    dep = _dep(ins)
    kind = _linalg_sources().get(compat.custom_jvp_sources(eqn))
    if (
        kind is not None
        and dep == [0]
        and len(ins) == 1
        and not _is_complex(ins[0].val)
    ):
        return _slogdet_rule(ins) if kind == "slogdet" else _det_rule(ins)
    if len(dep) == 1 and _pointwise_custom_jvp(eqn, ins):
        k = dep[0]
        vals = [_val(x) for x in ins]
        return _unary_rule(
            lambda v: bind(eqn, [*vals[:k], v[0], *vals[k + 1 :]]), ins[k]
        )
    return _GENERIC(eqn, ins)


def _sparse_custom_jvp(eqn: Any, ins: list) -> list | None:
    """An elementwise ``custom_jvp`` call keeps particle sparsity (the elementwise
    rule with the custom rule's derivatives); any other is made dense."""
    dep = _dep(ins)
    if len(dep) != 1 or not _pointwise_custom_jvp(eqn, ins):
        return None
    k = dep[0]
    vals = [_val(x) for x in ins]
    return _sparse_unary(lambda v: bind(eqn, [*vals[:k], v[0], *vals[k + 1 :]]), ins[k])


def _open(sub: Any) -> tuple[Any, list]:
    """A sub-jaxpr parameter as ``(jaxpr, consts)`` (a ClosedJaxpr or an open Jaxpr)."""
    if hasattr(sub, "consts"):
        return sub.jaxpr, list(sub.consts)
    return sub, []


def _custom_vjp_rule(eqn: Any, ins: list) -> list:
    raise _NeedsHessian(eqn.primitive)


class _NeedsHessian(Exception):
    """Raised at trace time by a ``custom_vjp`` call on r's path (see forward_jet)."""


def _prims(*names: str) -> list[Primitive]:
    """The primitives with these names on the running JAX (absent ones are skipped)."""
    found = [compat.primitive(n) for n in names]
    return [p for p in found if p is not None]


_LINEAR_0 = [
    lax.neg_p,
    lax.reshape_p,
    lax.broadcast_in_dim_p,
    lax.transpose_p,
    lax.squeeze_p,
    lax.slice_p,
    lax.convert_element_type_p,
    lax.copy_p,
    lax.rev_p,
    lax.real_p,
    lax.imag_p,
    lax.conj_p,
    lax.cumsum_p,
    lax.reduce_precision_p,
    lax.dynamic_slice_p,
    lax.sharding_constraint_p,
    lax.reduce_window_sum_p,
    lax.split_p,
    *_prims("pvary", "pcast", "tile"),
]
_ELEMENTWISE = [
    lax.tanh_p,
    lax.exp_p,
    lax.exp2_p,
    lax.log_p,
    lax.log1p_p,
    lax.expm1_p,
    lax.sin_p,
    lax.cos_p,
    lax.tan_p,
    lax.logistic_p,
    lax.sqrt_p,
    lax.rsqrt_p,
    lax.cbrt_p,
    lax.integer_pow_p,
    lax.square_p,
    lax.erf_p,
    lax.erfc_p,
    lax.erf_inv_p,
    lax.atan_p,
    lax.asin_p,
    lax.acos_p,
    lax.sinh_p,
    lax.cosh_p,
    lax.asinh_p,
    lax.acosh_p,
    lax.atanh_p,
    lax.lgamma_p,
    lax.digamma_p,
    lax.bessel_i0e_p,
    lax.bessel_i1e_p,
    *_prims("log2", "one_minus_square"),
]
_CONSTANT = [
    lax.floor_p,
    lax.ceil_p,
    lax.round_p,
    lax.is_finite_p,
    lax.eq_p,
    lax.ne_p,
    lax.lt_p,
    lax.le_p,
    lax.gt_p,
    lax.ge_p,
    lax.argmax_p,
    lax.argmin_p,
    lax.and_p,
    lax.or_p,
    lax.not_p,
    lax.xor_p,
    lax.iota_p,
    lax.stop_gradient_p,
    lax.bitcast_convert_type_p,  # a reinterpretation of the bits: no derivative
]

#: The rule table: ``Primitive`` object -> :class:`Rule`. Change it only through
#: :func:`register_rule` / :func:`rules_overridden`.
RULES: dict[Primitive, Rule] = {
    **dict.fromkeys(_LINEAR_0, linear(0)),
    lax.add_p: linear(0, 1),
    lax.sub_p: linear(0, 1),
    P.add_jaxvals_p: linear(0, 1),
    lax.complex_p: linear(0, 1),
    lax.pad_p: linear(0, 1),
    lax.dynamic_update_slice_p: linear(0, 1),
    lax.scatter_add_p: linear(0, 2),
    lax.scatter_sub_p: linear(0, 2),
    lax.scatter_p: custom(
        _scatter,
        "linear in operand and updates for unique indices; generic for repeated "
        "ones; an update function raises",
    ),
    lax.gather_p: custom(_gather, "linear in the operand; filled slots have tangent 0"),
    lax.select_n_p: linear(all_from=1),  # the cases; the predicate is never a Jet
    lax.concatenate_p: linear(all_from=0),
    lax.device_put_p: linear(all_from=0),
    lax.optimization_barrier_p: linear(all_from=0),
    **dict.fromkeys(_prims("stack"), linear(all_from=0)),
    lax.mul_p: bilinear(),
    lax.dot_general_p: bilinear(),
    lax.conv_general_dilated_p: bilinear(),
    lax.div_p: custom(_div, "linear in the numerator; a * (1/b) otherwise"),
    lax.max_p: custom(_chooser, "the chosen operand's jet; ties weigh 1/2 each"),
    lax.min_p: custom(_chooser, "the chosen operand's jet; ties weigh 1/2 each"),
    lax.reduce_max_p: custom(_reduce_chooser, "weighted sum of the chosen elements"),
    lax.reduce_min_p: custom(_reduce_chooser, "weighted sum of the chosen elements"),
    P.custom_jvp_call_p: custom(
        _custom_jvp_rule,
        "slogdet/det: trace identities, one LU; elementwise: elementwise rule; "
        "else generic through the custom rule",
    ),
    **dict.fromkeys(_ELEMENTWISE, elementwise()),
    lax.abs_p: elementwise(holomorphic=False),
    lax.sign_p: elementwise(holomorphic=False),
    lax.reduce_sum_p: reduction(),
    **dict.fromkeys(_CONSTANT, constant()),
    P.jit_p: call("jaxpr"),
    P.closed_call_p: call("call_jaxpr"),
    P.call_p: call("call_jaxpr"),
    P.remat_p: call("jaxpr"),
    P.custom_vjp_call_p: Rule(
        "custom_vjp", _custom_vjp_rule, "the whole function as method='hessian'"
    ),
}


def _keeps_sparsity(
    sparse: Callable[[Any, list[Any]], list[Any] | None], *primitives: Primitive
) -> None:
    """Declare that the rules of ``primitives`` keep particle sparsity (``Rule.sparse``;
    :func:`elementwise`, :func:`reduction`, :func:`constant` and :func:`call` declare
    it themselves)."""
    for primitive in primitives:
        RULES[primitive] = dataclasses.replace(RULES[primitive], sparse=sparse)


_keeps_sparsity(_sparse_structural, *sp.OWNER_MAPS)
_keeps_sparsity(_sparse_add, lax.add_p, lax.sub_p, P.add_jaxvals_p)
_keeps_sparsity(_sparse_mul, lax.mul_p)
_keeps_sparsity(_sparse_div, lax.div_p)
_keeps_sparsity(_sparse_dot_general, lax.dot_general_p)
_keeps_sparsity(_sparse_concatenate, lax.concatenate_p)
_keeps_sparsity(_sparse_custom_jvp, P.custom_jvp_call_p)

#: Primitives for which the generic rule (forward over forward mode on the primitive
#: alone) is the deliberate choice: no cheaper structure, or the custom rule must be
#: used (``custom_jvp_call``). They use it without a warning.
FALLBACK: frozenset[Primitive] = frozenset(
    [
        lax.pow_p,
        lax.atan2_p,
        lax.rem_p,
        lax.clamp_p,
        lax.nextafter_p,
        lax.reduce_prod_p,
        lax.cumprod_p,
        lax.cummax_p,
        lax.cummin_p,
        lax.cumlogsumexp_p,
        lax.sort_p,
        lax.scatter_mul_p,
        lax.scatter_max_p,
        lax.scatter_min_p,
        lax.reduce_window_max_p,
        lax.reduce_window_min_p,
        lax.igamma_p,
        lax.polygamma_p,
        lax.zeta_p,
        lax.linear_solve_p,
        P.triangular_solve_p,
        P.cholesky_p,
        P.lu_p,
        P.qr_p,
        P.eigh_p,
        P.svd_p,
        *_prims("custom_lin", "linear_call"),
        # rare in wavefunctions; no structure cheaper than the generic rule
        lax.top_k_p,
        *_prims("approx_top_k", "regularized_incomplete_beta", "call_hi_primitive"),
        # JAX has no JVP of a general reduce_window (or reduce): the generic rule
        # raises JAX's error
        *_prims("reduce_window", "reduce"),
        # piecewise or rarely met: the generic rule is exact and cheap enough
        *_prims("pmax", "pmin", "ragged_all_to_all", "igammac", "igamma_grad_a"),
        *_prims("random_gamma", "rng_uniform", "select_and_gather_add"),
        *_prims("select_and_scatter", "select_and_scatter_add"),
        # matrix decompositions besides those above
        *_prims("eig", "schur", "hessenberg", "householder_product", "tridiagonal"),
        *_prims("tridiagonal_solve"),
        # pmap or shard_map inside the function: the body runs per device with its
        # own axis names, so it is not inlined
        *_prims("xla_pmap", "shard_map"),
    ]
)

_WARNED: set[Primitive] = set()
_WARNED_SHARE: set[tuple[str, ...]] = set()


def rule_for(primitive: Primitive, d: int | None = None) -> Rule:
    """The rule the interpreter uses for ``primitive``: its entry in :data:`RULES`, else
    the generic rule (with a :class:`GenericRuleWarning`, once per primitive, unless
    ``primitive`` is in :data:`FALLBACK`; ``d``, the input size, goes into its cost).

    Args:
        primitive: a :class:`jax.extend.core.Primitive` object (e.g.
            ``jax.lax.sin_p``), not its name.
        d: the input size (length of ``r``), quoted in the warning's cost; ``None``:
            the cost is given as ``2*d``.

    Returns:
        The :class:`Rule` registered for ``primitive``, else the generic rule.

    Raises:
        TypeError: if ``primitive`` is not a ``jax.extend.core.Primitive``.
    """
    if not isinstance(primitive, Primitive):
        raise TypeError(
            "rule_for needs a jax.extend.core.Primitive (e.g. jax.lax.sin_p), got "
            f"{type(primitive).__name__} {primitive!r}"
        )
    found = RULES.get(primitive)
    if found is not None:
        return found
    if primitive not in FALLBACK and primitive not in _WARNED:
        _WARNED.add(primitive)
        cost = "2*d" if d is None else f"2*d = {2 * d}"
        warnings.warn(
            f"forward_laplacian: no rule for the primitive {primitive.name!r}; using the "
            f"generic rule (forward over forward mode on it alone: about {cost} extra "
            "JVPs of it, d = the input size). Register a rule with "
            "beyondgrad.forward_laplacian.register_rule to keep the savings.",
            GenericRuleWarning,
            stacklevel=2,
        )
    return _GENERIC


def _check_entry(primitive: object, rule: object) -> None:
    if not isinstance(primitive, Primitive):
        raise TypeError(
            "register_rule needs a jax.extend.core.Primitive (e.g. jax.lax.mul_p), got "
            f"{type(primitive).__name__} {primitive!r}"
        )
    if not isinstance(rule, Rule):
        raise TypeError(
            f"the rule for {primitive.name!r} must be a Rule (build it with linear(), "
            "bilinear(), elementwise(), custom(fn) or from_triples(fn)), got "
            f"{type(rule).__name__}"
        )


def register_rule(primitive: Primitive, rule: Rule) -> Rule | None:
    """Make ``rule`` the forward-Laplacian rule of ``primitive``; returns the previous
    rule (``None`` if there was none). Raises ``TypeError`` if ``primitive`` is not a
    ``jax.extend.core.Primitive`` (e.g. a name) or ``rule`` is not a :class:`Rule`.

    Args:
        primitive: the :class:`jax.extend.core.Primitive` object (e.g.
            ``jax.lax.mul_p``) whose entry in :data:`RULES` is set.
        rule: a :class:`Rule`, built by :func:`linear`, :func:`bilinear`,
            :func:`elementwise`, :func:`custom`, :func:`from_triples`, ….

    Returns:
        The rule previously registered for ``primitive``, or ``None``.

    Raises:
        TypeError: if ``primitive`` is not a ``jax.extend.core.Primitive`` or ``rule``
            is not a :class:`Rule`.
    """
    _check_entry(primitive, rule)
    before = RULES.get(primitive)
    RULES[primitive] = rule
    return before


@contextlib.contextmanager
def rules_overridden(rules: Mapping[Primitive, Rule]) -> Iterator[None]:
    """Use ``rules`` (``{primitive: rule}``) inside a ``with`` block; the table is
    restored on exit, also after an error.

    Args:
        rules: a mapping from :class:`jax.extend.core.Primitive` objects to
            :class:`Rule` s, added to (or replacing entries of) :data:`RULES` for the
            block.

    Yields:
        ``None``, once the rules are in place.

    Raises:
        TypeError: on entering the block, if a key is not a
            ``jax.extend.core.Primitive`` or a value is not a :class:`Rule` (the table
            is then unchanged).
    """
    for primitive, rule in rules.items():
        _check_entry(primitive, rule)
    saved = dict(RULES)
    RULES.update(rules)
    try:
        yield
    finally:
        RULES.clear()
        RULES.update(saved)


# ----------------------------------------------------------------------------- control flow
# scan, while and cond re-interpret their body on jets. A loop carry must keep one
# structure across iterations, so each carry is either a Jet in every iteration (its
# jac and lap always materialised) or a plain array in every iteration: the carries
# that are Jets are the least fixed point of "the initial value is a Jet, or the body
# makes it one from the Jets it is given" (found by tracing the body, abstractly).


def _flatten(values: Sequence[Any], mask: Sequence[bool]) -> list[jax.Array]:
    """Jets (where ``mask``) as ``val, jac, lap`` (lap materialised), others as ``val``."""
    flat: list[jax.Array] = []
    for value, is_jet in zip(values, mask):
        if is_jet:
            flat += [value.val, value.jac, _zeros_if_none(value.lap, value.val)]
        else:
            flat.append(value)
    return flat


def _unflatten(flat: Sequence[Any], mask: Sequence[bool]) -> list[Any]:
    values: list[Any] = []
    it = iter(flat)
    for is_jet in mask:
        values.append(Jet(next(it), next(it), next(it)) if is_jet else next(it))
    return values


def _as_jet(value: Any, d: int) -> Jet:
    """``value`` as a Jet (a plain value gets zero jac and lap)."""
    if isinstance(value, Jet):
        return Jet(value.val, value.jac, _zeros_if_none(value.lap, value.val))
    value = jnp.asarray(value)
    return Jet(value, jnp.zeros((d, *value.shape), value.dtype), jnp.zeros_like(value))


def _conform(values: Sequence[Any], mask: Sequence[bool], d: int) -> list[Any]:
    """Promote the values where ``mask`` to Jets (the others must be plain)."""
    return [_as_jet(v, d) if m else v for v, m in zip(values, mask)]


def _jet_mask(values: Sequence[Any]) -> list[bool]:
    return [isinstance(v, Jet) for v in values]


#: masks found in the current :func:`forward_jet` call, by (body, input mask): a body's
#: output mask depends on nothing else (``d`` is fixed within one call)
_MASK_CACHES: list[dict[tuple[int, tuple[bool, ...]], list[bool]]] = []
#: > 0 while a body is traced only for its output mask: control flow inside it then
#: returns placeholders of the right structure instead of tracing its own body again,
#: so nested loops cost one body trace per level and mask, not a power of the depth
_ABSTRACT = [0]


def _out_mask(jaxpr: Any, consts: Sequence[Any], ins: Sequence[Any]) -> list[bool]:
    """Which outputs of ``jaxpr`` are Jets given ``ins`` (traced abstractly, run never)."""
    mask: list[bool] = []
    mask_in = _jet_mask(ins)
    key = (id(jaxpr), tuple(mask_in))
    cache = _MASK_CACHES[-1] if _MASK_CACHES else {}
    if key in cache:
        return list(cache[key])

    def run(*flat: jax.Array) -> list:
        outs = _interpret(jaxpr, consts, _unflatten(flat, mask_in))
        mask[:] = _jet_mask(outs)
        return [_val(o) for o in outs]

    _ABSTRACT[0] += 1
    try:
        jax.eval_shape(run, *_flatten(ins, mask_in))
    finally:
        _ABSTRACT[0] -= 1
    cache[key] = list(mask)
    return mask


def _placeholder(eqn: Any, mask: Sequence[bool], d: int) -> list[Any]:
    """Zeros with the structure ``eqn``'s results have (Jets where ``mask``): what a
    control-flow rule returns while its caller is traced only for a mask."""
    outs = [jnp.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
    return _conform(outs, mask, d)


def _loop_mask(
    jaxpr: Any,
    consts: Sequence[Any],
    fixed: Sequence[Any],
    carry: Sequence[Any],
    extra: Sequence[Any],
    d: int,
) -> list[bool]:
    """The carries that are Jets: least fixed point over the body ``fixed, carry, extra
    -> carry, ...``."""
    mask = _jet_mask(carry)
    while True:
        outs = _out_mask(jaxpr, consts, [*fixed, *_conform(carry, mask, d), *extra])
        grown = [m or o for m, o in zip(mask, outs[: len(carry)])]
        if grown == mask:
            return mask
        mask = grown


def _step(a: jax.Array, axis: int = 0) -> jax.Array:
    """The first slice of ``a`` along the scanned ``axis``, or zeros of that shape
    when the axis has length 0."""
    if a.shape[axis]:
        return lax.index_in_dim(a, 0, axis, keepdims=False)
    return jnp.zeros(a.shape[:axis] + a.shape[axis + 1 :], a.dtype)


def _scan_rule(eqn: Any, ins: list) -> list:
    """``scan``: the body runs on jets inside ``lax.scan``; scanned Jets are sliced
    along their value axis (axis 1 of jac)."""
    params = eqn.params
    body, body_consts = _open(params["jaxpr"])
    n_consts, n_carry = compat.scan_counts(params)
    consts, init, xs = (
        ins[:n_consts],
        ins[n_consts : n_consts + n_carry],
        ins[n_consts + n_carry :],
    )
    d = _jet_dim(ins)
    xs_mask = _jet_mask(xs)
    # one step's slices, only traced abstractly (for the masks); a scan of length 0
    # has none, so zeros of a step's shape stand in
    x_slices = [
        Jet(_step(x.val), _step(x.jac, 1), _step(_zeros_if_none(x.lap, x.val)))
        if m
        else _step(x)
        for x, m in zip(xs, xs_mask)
    ]
    mask = _loop_mask(body, body_consts, consts, init, x_slices, d)
    y_mask = _out_mask(
        body, body_consts, [*consts, *_conform(init, mask, d), *x_slices]
    )[n_carry:]
    if _ABSTRACT[0]:
        return _placeholder(eqn, [*mask, *y_mask], d)

    def step(carry_flat: list, x_flat: list) -> tuple[list, list]:
        carry = _unflatten(carry_flat, mask)
        x = _unflatten(x_flat, xs_mask)
        outs = _interpret(body, body_consts, [*consts, *carry, *x])
        new = _conform(outs[:n_carry], mask, d)
        ys = _conform(outs[n_carry:], y_mask, d)
        return _flatten(new, mask), _flatten(ys, y_mask)

    xs_flat = _flatten(
        [
            Jet(x.val, jnp.moveaxis(x.jac, 0, 1), _zeros_if_none(x.lap, x.val))
            if m
            else x
            for x, m in zip(xs, xs_mask)
        ],
        xs_mask,
    )
    carry_out, ys_flat = lax.scan(
        step,
        _flatten(_conform(init, mask, d), mask),
        xs_flat,
        length=params["length"],
        reverse=params["reverse"],
        unroll=params["unroll"],
    )
    ys = [
        Jet(y.val, jnp.moveaxis(y.jac, 1, 0), y.lap) if m else y
        for y, m in zip(_unflatten(ys_flat, y_mask), y_mask)
    ]
    return [*_unflatten(carry_out, mask), *ys]


def _while_rule(eqn: Any, ins: list) -> list:
    """``while``: the body runs on jets inside ``lax.while_loop``; the condition reads
    the values only (the trip count is piecewise constant in r)."""
    params = eqn.params
    cond, cond_consts_closed = _open(params["cond_jaxpr"])
    body, body_consts_closed = _open(params["body_jaxpr"])
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cond_consts = [_val(x) for x in ins[:nc]]
    body_consts, init = ins[nc : nc + nb], ins[nc + nb :]
    d = _jet_dim(ins)
    mask = _loop_mask(body, body_consts_closed, body_consts, init, [], d)
    if _ABSTRACT[0]:
        return _placeholder(eqn, mask, d)

    def cond_fun(carry_flat: list) -> jax.Array:
        carry = [_val(c) for c in _unflatten(carry_flat, mask)]
        return _interpret(cond, cond_consts_closed, [*cond_consts, *carry])[0]

    def body_fun(carry_flat: list) -> list:
        carry = _unflatten(carry_flat, mask)
        outs = _interpret(body, body_consts_closed, [*body_consts, *carry])
        return _flatten(_conform(outs, mask, d), mask)

    out = lax.while_loop(cond_fun, body_fun, _flatten(_conform(init, mask, d), mask))
    return _unflatten(out, mask)


def _cond_rule(eqn: Any, ins: list) -> list:
    """``cond``: every branch runs on jets inside ``lax.switch``; an output is a Jet if
    any branch makes it one. The index does not depend on r (it is an integer)."""
    index, ops = _val(ins[0]), ins[1:]
    branches = [_open(b) for b in eqn.params["branches"]]
    d = _jet_dim(ins)
    op_mask = _jet_mask(ops)
    masks = [_out_mask(j, c, ops) for j, c in branches]
    mask = [any(col) for col in zip(*masks)]
    if _ABSTRACT[0]:
        return _placeholder(eqn, mask, d)

    def branch_fn(jaxpr: Any, consts: list) -> Callable[..., list]:
        def run(*flat: jax.Array) -> list:
            outs = _interpret(jaxpr, consts, _unflatten(flat, op_mask))
            return _flatten(_conform(outs, mask, d), mask)

        return run

    fns = [branch_fn(j, c) for j, c in branches]
    out = lax.switch(index, fns, *_flatten(ops, op_mask))
    return _unflatten(out, mask)


RULES.update(
    {
        lax.scan_p: Rule("control", _scan_rule, "body on jets inside lax.scan"),
        lax.while_p: Rule("control", _while_rule, "body on jets inside lax.while_loop"),
        lax.cond_p: Rule("control", _cond_rule, "branches on jets inside lax.switch"),
    }
)

#: ``unstack`` (``jnp.unstack``, ``lax.unstack`` and iterating over a traced array, e.g.
#: ``x, y, z = r``, from JAX 0.10.1; absent on 0.8.2, whose ``jnp.unstack`` is a ``jit``
#: of ``split`` and ``squeeze``): linear, one slice of operand 0 per result.
RULES.update(dict.fromkeys(_prims("unstack"), linear(0)))


def _across_devices(eqn: Any, ins: list) -> list:
    """``psum``/``ppermute`` act on each element across devices and are linear, so they
    apply to ``val``, ``jac`` (with its leading ``d`` axis) and ``lap`` as they are, one
    operand at a time: no ``vmap`` over the ``d`` rows (``vmap`` of ``psum`` inside
    ``shard_map`` raises a ``TypeError`` in JAX 0.8.2 and 0.8.3)."""
    outs = []
    for x in ins:
        if not isinstance(x, Jet):
            outs.append(bind(eqn, [x])[0])
            continue
        lap = None if x.lap is None else bind(eqn, [x.lap])[0]
        outs.append(Jet(bind(eqn, [x.val])[0], bind(eqn, [x.jac])[0], lap))
    return outs


def _polynomial(eqn: Any, ins: list) -> list:
    """``polynomial(x, *coeffs)`` (``jnp.polyval``, ``jnp.sinc`` on JAX 0.12): with
    constant coefficients an elementwise function of ``x``; otherwise the generic rule."""
    x, *coeffs = ins
    if not isinstance(x, Jet) or any(isinstance(c, Jet) for c in coeffs):
        return _GENERIC(eqn, ins)
    return _unary_rule(lambda vals: bind(eqn, [vals[0], *coeffs]), x)


RULES.update(
    {
        **dict.fromkeys(_prims("polynomial"), custom(_polynomial, "elementwise in x")),
        # every FFT type is a real-linear map of its operand
        lax.fft_p: linear(0),
        # collectives inside shard_map that sum or move values elementwise across
        # devices: the same collective on each part (see _across_devices)
        **dict.fromkeys(
            _prims("psum", "psum_invariant", "ppermute"),
            custom(_across_devices, "the same collective on val, jac and lap"),
        ),
        # collectives that gather or split along an axis: linear in every operand
        **dict.fromkeys(
            _prims("all_gather", "all_gather_invariant", "all_to_all"),
            linear(all_from=0),
        ),
        # lax.composite: its decomposition, interpreted in place (the parameter is
        # "jaxpr" on 0.8.2, "call_jaxpr" on 0.12)
        **dict.fromkeys(_prims("composite"), call("call_jaxpr", "jaxpr")),
    }
)


# ----------------------------------------------------------------------------- the interpreter


def has_float_result(eqn: Any) -> bool:
    """True if one of ``eqn``'s results is floating-point or complex. An equation with
    integer or boolean results only needs no rule: its results carry no derivative.

    Args:
        eqn: a jaxpr equation (its ``outvars`` are read); an outvar without a dtype
            counts as an integer.

    Returns:
        ``True`` if some result's dtype is a subtype of ``jnp.inexact``.
    """
    return any(
        jnp.issubdtype(getattr(v.aval, "dtype", jnp.int32), jnp.inexact)
        for v in eqn.outvars
    )


def _check_outputs(eqn: Any, rule: Rule, outs: Any, d: int) -> None:
    """A rule's results must be a list with, per result of ``eqn``, an array of its
    shape or a :class:`Jet` whose ``jac`` is ``(d, *shape)`` (trace-time shapes only:
    a registered rule with a slip fails here, not with a wrong value later)."""
    name = f"the {rule.kind} rule for {eqn.primitive.name!r}"
    listed = isinstance(outs, (list, tuple)) and not isinstance(outs, Jet)
    if not listed or len(outs) != len(eqn.outvars):
        got = f"a {type(outs).__name__}"
        if listed:
            got += f" of {len(outs)}"
        raise TypeError(
            f"{name} returned {got}; a rule returns a list with one array or Jet per "
            f"result of the primitive ({len(eqn.outvars)} here)"
        )
    for k, (var, out) in enumerate(zip(eqn.outvars, outs)):
        shape = tuple(var.aval.shape)
        val = _val(out)
        parts = [("value", None if val is None else jnp.shape(val), shape)]
        if isinstance(out, Jet):
            parts.append(("jac", jnp.shape(out.jac), (d, *shape)))
        if isinstance(out, SparseJet):
            if not out.terms:
                raise ValueError(
                    f"{name} returned result {k} as a SparseJet of no terms"
                )
            c = d // out.particles
            for owner, data in out.terms:
                parts.append(("owner", np.shape(owner), shape))
                parts.append(("term data", jnp.shape(data), (c, *shape)))
        if isinstance(out, (Jet, SparseJet)) and out.lap is not None:
            parts.append(("lap", jnp.shape(out.lap), shape))
        for part, got_shape, want in parts:
            if got_shape is None or tuple(got_shape) != want:
                raise ValueError(
                    f"{name} returned result {k} with {part} of shape {got_shape}; "
                    f"expected {want} (jac is (d, *value.shape), d = {d})"
                )


def _interpret(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list:
    """Interpret ``jaxpr`` on inputs that are arrays or :class:`Jet` s."""
    env: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        ins = [compat.jaxpr_atom_value(a, env) for a in eqn.invars]
        if any(_is_jet(x) for x in ins) and has_float_result(eqn):
            rule = rule_for(eqn.primitive, _jet_dim(ins))
            outs = None
            if any(isinstance(x, SparseJet) for x in ins):
                if (
                    rule.sparse is not None
                    and not any(isinstance(x, Jet) for x in ins)
                    and all(jnp.size(_val(x)) for x in ins)
                ):
                    outs = rule.sparse(eqn, ins)
                if outs is None:  # not covered: the dense rule on dense jets
                    ins = [_densify(x) for x in ins]
            if outs is None:
                outs = rule(eqn, ins)
            _check_outputs(eqn, rule, outs, _jet_dim(ins))
            if _LEDGERS and rule.kind not in ("call", "control"):
                cost = (_jet_dim(ins) + 1) * sum(_size(o) for o in outs)
                for ledger in _LEDGERS:
                    ledger.total += cost
        else:  # nothing depends on r, or only integer/boolean results
            outs = bind(eqn, [_val(x) for x in ins])
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [compat.jaxpr_atom_value(a, env) for a in jaxpr.outvars]


def forward_laplacian(
    fn: Callable[[jax.Array], jax.Array], r: jax.Array, *, particles: int | None = None
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(f(r), ∂f/∂r, Σ_k ∂²f/∂r_k²)`` of ``fn`` at a 1-D ``r``, in one forward pass.

    The forward Laplacian (Li et al., Nature Machine Intelligence 2024): every
    intermediate value :math:`v` travels with its Jacobian :math:`\\partial v/\\partial r`
    (``d`` rows) and its Laplacian :math:`\\Delta v`, and each operation maps the triple
    on by its rule in :data:`RULES`: a linear map applies to all three, a product
    :math:`ab` gives
    :math:`\\Delta(ab) = a\\Delta b + b\\Delta a + 2\\sum_k\\partial_k a\\,\\partial_k b`,
    an elementwise :math:`f` gives :math:`f'(v)\\Delta v + f''(v)\\sum_k(\\partial_k v)^2`,
    loops and branches carry the triple through their body, and any other operation is
    differentiated on its own by forward over forward mode. Values that do not depend
    on ``r`` (parameters) carry no derivatives. ``custom_jvp`` rules are used;
    ``custom_vjp`` makes the whole function go the way of ``method="hessian"`` (module
    docstring).

    Returns shapes ``out``, ``(*out, d)`` (Jacobian, last axis = input coordinate) and
    ``out`` (``fn`` returns one array of shape ``out``).

    With ``particles = P``, ``r`` is read as ``P`` particles of ``c = d / P``
    coordinates each (``r[p c : (p + 1) c]`` is particle ``p``), and a value that
    depends on one or two particles per element (an electron's features, a pair
    feature :math:`h_{ij}`) carries its Jacobian as particle terms, ``c`` rows per
    term instead of ``d`` (:func:`forward_jet`). Same numbers, less work where the
    network keeps such values; every rule that does not declare sparse support
    (``Rule.sparse``) receives dense jets.

    Args:
        fn: a JAX-traceable function of one 1-D array of shape ``(d,)`` that returns
            one array (of any shape ``out``, not a pytree).
        r: the point, a 1-D floating-point array of shape ``(d,)``.
        particles: ``None`` (dense Jacobians throughout) or the number of particles
            ``P`` whose coordinates ``r`` holds in equal consecutive blocks (``P``
            divides ``d``; ``r = positions.reshape(-1)`` for ``(P, 3)`` positions).

    Returns:
        A tuple ``(value, jacobian, laplacian)``: ``fn(r)`` of shape ``out``, the
        Jacobian of shape ``(*out, d)`` and the Laplacian of shape ``out``.

    Raises:
        TypeError: if the arguments are swapped (an array first, a function second)
            or ``fn`` returns more than one array; ``particles`` not an int.
        ValueError: if ``r`` is not a 1-D floating-point array; ``particles < 1`` or
            not dividing ``d``.
    """
    jet = forward_jet(fn, r, particles=particles)
    return jet.val, jnp.moveaxis(jet.jac, 0, -1), _zeros_if_none(jet.lap, jet.val)


def _check_particles(particles: object, d: int) -> None:
    """``particles`` is ``None`` or a positive int dividing ``d``."""
    if particles is None:
        return
    count = _checks.integer(
        particles,
        "particles",
        minimum=1,
        meaning="the number of particles whose coordinates r holds",
        where="forward_laplacian: ",
    )
    if d % count:
        raise ValueError(
            f"forward_laplacian: particles={particles} does not divide the input size "
            f"d = {d}; r must hold the particles' coordinates in equal consecutive "
            "blocks: pass particles=n for r = positions.reshape(-1) of n particles, "
            "or particles=None (dense)"
        )


def _hessian_jet(fn: Callable[[jax.Array], jax.Array], r: jax.Array) -> Jet:
    """What ``laplacian(..., method="hessian")`` computes, as a Jet (custom_vjp case)."""
    val = fn(r)
    jac = jax.jacrev(fn)(r)  # (*out, d)
    hess = jax.jacfwd(jax.jacrev(fn))(r)  # (*out, d, d)
    lap = jnp.trace(hess, axis1=-2, axis2=-1)
    return Jet(val, jnp.moveaxis(jac, -1, 0), lap)


def basis(x: jax.Array) -> jax.Array:
    """The identity basis ``eye(d)`` of ``x``'s space, with ``x``'s dtype and varying axes.

    Inside ``shard_map`` a tangent must have the same varying type as its primal; a bare
    ``jnp.eye`` is invariant, so it is cast to the axes of ``x`` here.

    Args:
        x: a 1-D array of length ``d`` (its values are not read); floating-point for
            use as tangents.

    Returns:
        The ``(d, d)`` identity matrix of ``x``'s dtype, row ``i`` the unit vector
        :math:`e_i`, varying over the mesh axes ``x`` varies over.

    Raises:
        ValueError: ``x`` is not 1-D (the message gives its shape).
    """
    if jnp.ndim(x) != 1:
        raise ValueError(
            f"basis needs a 1-D x (the point whose space it spans), got shape "
            f"{jnp.shape(x)}; flatten it first, e.g. x.reshape(-1)"
        )
    return compat.varying_like(jnp.eye(x.shape[0], dtype=x.dtype), x)


def forward_jet(
    fn: Callable[[jax.Array], jax.Array], r: jax.Array, *, particles: int | None = None
) -> Jet:
    r"""The :class:`Jet` of ``fn`` at a 1-D ``r``: :func:`forward_laplacian` with the
    Jacobian's input axis first, ``(d, *out)`` (the layout the interpreter carries, and
    the one :func:`beyondgrad.slater.orbital_derivatives` contracts without a transpose).

    Particle sparsity (``particles = P``, ``c = d / P``): inside the program a value
    :math:`v` may carry, instead of the dense ``(d, *v.shape)`` Jacobian, terms
    ``(owner, data)`` with ``data`` of shape ``(c, *v.shape)`` and

    .. math::
       \partial v[i] / \partial r_{p c + k} = \sum_t [\mathrm{owner}_t[i] = p]\,
       \mathrm{data}_t[k, i]

    (``beyondgrad._sparse_jets``): the input has one term (``owner[j] = j // c``), a
    pair feature two (owners ``i`` and ``j``), and products and squares of terms are
    masked where the owners coincide (the diagonal ``i = j``). The rules that declare
    ``Rule.sparse`` (elementwise functions, ``add``/``sub``/``mul``/``div``,
    reshapes, broadcasts, transposes, slices, ``reduce_sum``, ``dot_general`` with one
    operand depending on ``r``, ``concatenate``, calls) keep it; a sum over an axis
    along which the owner varies, and every other rule, makes the value dense. The
    result is the same Jet (dense ``jac``) either way.

    Args:
        fn: a JAX-traceable function of one 1-D array of shape ``(d,)`` that returns
            one array (of any shape ``out``, not a pytree).
        r: the point, a 1-D floating-point array of shape ``(d,)``.
        particles: ``None`` (dense Jacobians throughout) or the number of particles
            ``P`` whose coordinates ``r`` holds in equal consecutive blocks (``P``
            divides ``d``).

    Returns:
        A :class:`Jet` ``(val, jac, lap)``: ``val = fn(r)`` of shape ``out``, ``jac``
        of shape ``(d, *out)`` and ``lap`` of shape ``out`` (never ``None`` here).

    Raises:
        TypeError: if the arguments are swapped (an array first, a function second)
            or ``fn`` returns more than one array; ``particles`` not an int.
        ValueError: if ``r`` is not a 1-D floating-point array; ``particles < 1`` or
            not dividing ``d``.
    """
    if callable(r) and not callable(fn):
        raise TypeError(
            "forward_laplacian takes (fn, r): got an array first and a function "
            "second; call forward_laplacian(fn, r)"
        )
    r = jnp.asarray(r)
    if r.ndim != 1 or not jnp.issubdtype(r.dtype, jnp.floating):
        raise ValueError(
            f"r must be a 1-D floating-point array, got shape {r.shape}, dtype {r.dtype}"
        )
    _check_particles(particles, r.shape[0])
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(r)
    if not isinstance(out_shape, jax.ShapeDtypeStruct):
        raise TypeError(
            "fn must return one array, got "
            f"{jax.tree.structure(out_shape)}; return one array (e.g. a sum, or "
            "jnp.concatenate of the leaves) or take the Laplacian of each leaf"
        )
    ledger = _Ledger()
    _LEDGERS.append(ledger)
    _MASK_CACHES.append({})
    try:
        if particles is None or r.shape[0] == 0:
            start: Any = Jet(r, basis(r), None)
        else:
            start = sp.seed(r, particles)
        (out,) = _interpret(closed.jaxpr, list(closed.consts), [start])
    except _NeedsHessian as seen:
        primitive = seen.args[0]
        if primitive not in _WARNED:
            _WARNED.add(primitive)
            warnings.warn(
                f"forward_laplacian: {primitive.name!r} (a custom_vjp function) depends "
                "on r; the whole function is differentiated as "
                "laplacian(..., method='hessian') does (reverse mode with the custom "
                "backward rule, forward mode over it): a full d x d Hessian.",
                GenericRuleWarning,
                stacklevel=2,
            )
        return _hessian_jet(fn, r)
    finally:
        _LEDGERS.remove(ledger)
        _MASK_CACHES.pop()
    names = sorted({eqn.primitive.name for eqn, _ in ledger.uses})
    dominant = ledger.generic > GENERIC_SHARE_WARNING * ledger.total
    if dominant and tuple(names) not in _WARNED_SHARE:  # once per set of primitives
        _WARNED_SHARE.add(tuple(names))
        warnings.warn(
            f"forward_laplacian: the generic rule makes about "
            f"{ledger.generic / ledger.total:.0%} of this program's derivative work "
            f"(primitives {', '.join(names)}; forward over forward mode on each, "
            f"2*d + 1 = {2 * r.shape[0] + 1} JVPs of it). "
            "beyondgrad.forward_laplacian.generic_report(fn, r) measures it; "
            "register_rule adds a structured rule.",
            GenericRuleWarning,
            stacklevel=2,
        )
    out = _densify(out)
    if not isinstance(out, Jet):  # fn does not depend on r
        out = Jet(out, jnp.zeros((r.shape[0], *jnp.shape(out)), r.dtype), None)
    return Jet(out.val, out.jac, _zeros_if_none(out.lap, out.val))


#: :func:`forward_jet` warns when the generic rule's share of the cost proxy of
#: :class:`_Ledger` is above this
GENERIC_SHARE_WARNING = 0.5


class GenericUse(NamedTuple):
    """One equation sent to the generic rule: the primitive's name, the shapes of its
    operands, ``2 d + 1`` (the JVPs of the primitive it costs) and the compiled flops
    of the generic rule on it alone (XLA's ``cost_analysis``).
    """

    #: The primitive's name, e.g. ``"cumsum"``.
    primitive: str
    #: The shape of each operand's value, in operand order.
    shapes: tuple[tuple[int, ...], ...]
    #: ``2 d + 1``, with ``d`` the length of ``r``.
    jvps: int
    #: The compiled flops of the generic rule on this equation alone.
    flops: float


class GenericReport(NamedTuple):
    """What :func:`generic_report` measured: each use of the generic rule, their
    flops summed, the compiled flops of the whole forward Laplacian, and the share.
    """

    #: One :class:`GenericUse` per equation sent to the generic rule (an equation in
    #: a loop body once).
    uses: tuple[GenericUse, ...]
    #: The sum of the uses' ``flops``.
    generic_flops: float
    #: The compiled flops of the whole forward Laplacian.
    total_flops: float

    @property
    def share(self) -> float:
        """``generic_flops / total_flops`` (0.0 when ``total_flops`` is 0)."""
        return self.generic_flops / self.total_flops if self.total_flops else 0.0


def _flops(compiled: Any) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", 0.0))


def generic_report(fn: Callable[[jax.Array], jax.Array], r: jax.Array) -> GenericReport:
    """Which equations of ``fn``'s program the forward Laplacian at ``r`` sends to the
    generic rule, and at what cost: each one's compiled flops on its own (the generic
    rule, forward over forward mode along the ``d`` Jacobian rows, lowered alone at
    its operands' shapes) beside the compiled flops of the whole forward Laplacian.
    Fallbacks (:data:`FALLBACK`) are reported like any other. An equation inside a
    loop body is counted once (flops per iteration); nothing is run, only compiled.

    Args:
        fn: as for :func:`forward_laplacian`.
        r: a 1-D floating-point array (its shape and dtype are what matter).

    Returns:
        A :class:`GenericReport`.
    """
    r = jnp.asarray(r)
    ledger = _Ledger()
    _LEDGERS.append(ledger)
    try:
        program = jax.jit(lambda v: forward_jet(fn, v)).lower(r).compile()
    finally:
        _LEDGERS.remove(ledger)
    seen: set[int] = set()
    uses = []
    for eqn, ins in ledger.uses:
        if id(eqn) in seen:
            continue
        seen.add(id(eqn))
        specs = [
            jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), x)
            if isinstance(x, Jet)
            else jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x))
            for x in ins
        ]
        alone = jax.jit(
            lambda *args, eqn=eqn: _generic_rule(
                functools.partial(bind, eqn), list(args)
            )
        )
        flops = _flops(alone.lower(*specs).compile())
        uses.append(
            GenericUse(
                eqn.primitive.name,
                tuple(tuple(jnp.shape(_val(x))) for x in ins),
                2 * _jet_dim(ins) + 1,
                flops,
            )
        )
    return GenericReport(tuple(uses), sum(u.flops for u in uses), _flops(program))
