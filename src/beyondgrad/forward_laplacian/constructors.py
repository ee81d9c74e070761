r"""The rule constructors: each builds a :class:`Rule` that *declares* the structure of
an operation (linear, bilinear, elementwise, a reduction, constant, generic) or wraps
a function written against the rule contract (:func:`custom`) or of
``(val, jac, lap)`` triples (:func:`from_triples`). The maths is in
``beyondgrad.forward_laplacian.dense`` (and ``.sparse`` for the forms that keep
particle sparsity); ``call`` is with the control flow
(``beyondgrad.forward_laplacian.control``), since it re-interprets a body.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from beyondgrad import _checks
from beyondgrad.forward_laplacian import sparse as sparse_forms
from beyondgrad.forward_laplacian.dense import (
    bilinear_rule,
    linear_rule,
    reduce_sum_rule,
    unary_rule,
)
from beyondgrad.forward_laplacian.generic_rule import apply_generic
from beyondgrad.forward_laplacian.jets import (
    Jet,
    Rule,
    bind,
    dep,
    is_complex,
    is_float,
    jet_dim,
    val,
    zeros_if_none,
)


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
    _checks.instance(
        reason,
        str,
        f"generic(): reason must be a str (why no structured rule is written), "
        f"got {type(reason).__name__}",
    )
    return Rule("generic", apply_generic, reason)


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
        if not set(dep(ins)) <= set(pos):
            return apply_generic(eqn, ins)
        return linear_rule(functools.partial(bind, eqn), ins, pos)

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
        on_r = dep(ins)
        if len(on_r) == 1:
            return linear_rule(functools.partial(bind, eqn), ins, tuple(on_r))
        return bilinear_rule(functools.partial(bind, eqn), ins[0], ins[1])

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
        if len(ins) != 1 or (not holomorphic and is_complex(ins[0].val)):
            return apply_generic(eqn, ins)
        return unary_rule(functools.partial(bind, eqn), ins[0])

    def sparse(eqn: Any, ins: list) -> list | None:
        if len(ins) != 1 or (not holomorphic and is_complex(ins[0].val)):
            return None
        return sparse_forms.unary(functools.partial(bind, eqn), ins[0])

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
        lambda eqn, ins: reduce_sum_rule(ins[0], tuple(eqn.params["axes"])),
        "sum over eqn.params['axes']",
        sparse_forms.reduce_sum,
    )


def constant() -> Rule:
    """Results that do not depend on ``r`` (integer or boolean results, or a derivative
    that is zero almost everywhere: ``floor``, ``round``, comparisons): plain values.

    Returns:
        A :class:`Rule` of kind ``"constant"`` (the primitive applied to the
        operands' values, with no Jacobian or Laplacian).
    """

    def apply(eqn: Any, ins: list) -> list:
        return bind(eqn, [val(x) for x in ins])

    return Rule("constant", apply, "zero derivative", apply)


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
        d = jet_dim(ins)
        triples = []
        for x, atom in zip(ins, eqn.invars):
            if isinstance(x, Jet):
                triples.append((x.val, x.jac, zeros_if_none(x.lap, x.val)))
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
            outs.append(Jet(val, jac, lap) if is_float(val) else val)
        return outs

    return Rule("triples", apply, getattr(fn, "__name__", ""))
