r"""The interpreter: :func:`forward_jet` and :func:`forward_laplacian` trace ``fn`` to a
jaxpr and carry the input's jet through it, equation by equation (:func:`interpret`),
each equation through its rule from the table
(``beyondgrad.forward_laplacian.registry``). It checks every rule's results against
the equation's shapes at trace time, counts the generic rule's share of the work
(``beyondgrad.forward_laplacian.generic_rule``) and warns when it dominates, and computes a
function with a ``custom_vjp`` call on r's path as ``method="hessian"`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks, compat
from beyondgrad import _sparse_jets as sp
from beyondgrad._sparse_jets import SparseJet
from beyondgrad.forward_laplacian import control, registry
from beyondgrad.forward_laplacian.generic_rule import (
    GENERIC_SHARE_WARNING,
    record_structured,
    recording,
)
from beyondgrad.forward_laplacian.jets import (
    GenericRuleWarning,
    Jet,
    NeedsHessian,
    Rule,
    bind,
    has_float_result,
    is_jet,
    jet_dim,
    seed,
    val,
    zeros_if_none,
)
from beyondgrad.forward_laplacian.sparse import densify

#: the sets of primitives whose dominant-share warning was issued (once per set)
WARNED_SHARE: set[tuple[str, ...]] = set()


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
        value = val(out)
        parts = [("value", None if value is None else jnp.shape(value), shape)]
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


def interpret(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any]) -> list:
    """Interpret ``jaxpr`` on inputs that are arrays or jets: each equation with a jet
    operand and a floating-point result goes through its rule (the sparse form first
    when an operand is a ``SparseJet`` and the rule has one), every other equation is
    evaluated on plain values.

    Args:
        jaxpr: an open jaxpr (``constvars``, ``invars``, ``eqns``, ``outvars``).
        consts: one value per constvar.
        args: one value per invar: a :class:`Jet`, a ``SparseJet`` or a plain array.

    Returns:
        One value per outvar, each a jet or a plain array.
    """
    env: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        ins = [compat.jaxpr_atom_value(a, env) for a in eqn.invars]
        if any(is_jet(x) for x in ins) and has_float_result(eqn):
            rule = registry.rule_for(eqn.primitive, jet_dim(ins))
            outs = None
            if any(isinstance(x, SparseJet) for x in ins):
                if (
                    rule.sparse is not None
                    and (rule.mixed or not any(isinstance(x, Jet) for x in ins))
                    and all(jnp.size(val(x)) for x in ins)
                ):
                    outs = rule.sparse(eqn, ins)
                if outs is None:  # not covered: the dense rule on dense jets
                    ins = [densify(x) for x in ins]
            if outs is None:
                outs = rule(eqn, ins)
            _check_outputs(eqn, rule, outs, jet_dim(ins))
            if rule.kind not in ("call", "control"):
                record_structured(ins, outs)
        else:  # nothing depends on r, or only integer/boolean results
            outs = bind(eqn, [val(x) for x in ins])
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
        TypeError: if the arguments are swapped (an array first, a function second),
            ``r`` is not floating-point or ``fn`` returns more than one array;
            ``particles`` not an int.
        ValueError: if ``r`` is not 1-D; ``particles < 1`` or not dividing ``d``.
    """
    jet = forward_jet(fn, r, particles=particles)
    return jet.val, jnp.moveaxis(jet.jac, 0, -1), zeros_if_none(jet.lap, jet.val)


def _hessian_jet(fn: Callable[[jax.Array], jax.Array], r: jax.Array) -> Jet:
    """What ``laplacian(..., method="hessian")`` computes, as a Jet (custom_vjp case)."""
    val = fn(r)
    jac = jax.jacrev(fn)(r)  # (*out, d)
    hess = jax.jacfwd(jax.jacrev(fn))(r)  # (*out, d, d)
    lap = jnp.trace(hess, axis1=-2, axis2=-1)
    return Jet(val, jnp.moveaxis(jac, -1, 0), lap)


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
        TypeError: if the arguments are swapped (an array first, a function second),
            ``r`` is not floating-point or ``fn`` returns more than one array;
            ``particles`` not an int.
        ValueError: if ``r`` is not 1-D; ``particles < 1`` or not dividing ``d``.
    """
    _checks.function_first(fn, r, "forward_laplacian(fn, r)")
    r = _checks.point(r, "r", where="forward_laplacian: ")
    if particles is not None:
        _checks.divisor(
            particles,
            r.shape[0],
            "particles",
            total_name="the input size d",
            meaning="the number of particles whose coordinates r holds",
            fix="r must hold the particles' coordinates in equal consecutive blocks: "
            "pass particles=n for r = positions.reshape(-1) of n particles, or "
            "particles=None (dense)",
            where="forward_laplacian: ",
        )
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(r)
    if not isinstance(out_shape, jax.ShapeDtypeStruct):
        raise TypeError(
            "fn must return one array, got "
            f"{jax.tree.structure(out_shape)}; return one array (e.g. a sum, or "
            "jnp.concatenate of the leaves) or take the Laplacian of each leaf"
        )
    with recording() as ledger, control.mask_cache():
        try:
            if particles is None or r.shape[0] == 0:
                start: Any = seed(r)
            else:
                start = sp.seed(r, particles)
            (out,) = interpret(closed.jaxpr, list(closed.consts), [start])
        except NeedsHessian as seen:
            primitive = seen.args[0]
            if primitive not in registry.WARNED:
                registry.WARNED.add(primitive)
                warnings.warn(
                    f"forward_laplacian: {primitive.name!r} (a custom_vjp function) "
                    "depends on r; the whole function is differentiated as "
                    "laplacian(..., method='hessian') does (reverse mode with the "
                    "custom backward rule, forward mode over it): a full d x d Hessian.",
                    GenericRuleWarning,
                    stacklevel=2,
                )
            return _hessian_jet(fn, r)
    names = sorted({eqn.primitive.name for eqn, _ in ledger.uses})
    dominant = ledger.generic > GENERIC_SHARE_WARNING * ledger.total
    if dominant and tuple(names) not in WARNED_SHARE:  # once per set of primitives
        WARNED_SHARE.add(tuple(names))
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
    out = densify(out)
    if not isinstance(out, Jet):  # fn does not depend on r
        out = Jet(out, jnp.zeros((r.shape[0], *jnp.shape(out)), r.dtype), None)
    return Jet(out.val, out.jac, zeros_if_none(out.lap, out.val))
