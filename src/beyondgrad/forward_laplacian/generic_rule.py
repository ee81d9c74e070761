r"""The generic rule (forward over forward mode on one primitive) and the cost ledger
that measures its share of a program's derivative work.

For an output :math:`y = p(x)` of a primitive :math:`p` the generic rule computes, per
Jacobian row :math:`k`, :math:`\partial_k y = J_p\,\partial_k x` and
:math:`\partial_k^2 y = J_p\,\partial_k^2 x + \partial_k x^\top \nabla^2 p\,
\partial_k x` (a JVP of a JVP), then sums the second over :math:`k`: about ``2 d + 1``
JVPs of the primitive. The ledger counts a proxy of the work while ``forward_jet``
traces: derivative elements written, ``(d + 1) × size`` per result of a structured
rule and ``(2 d + 1) × (operand + result sizes)`` per generic use, times ``n`` for
the factorisations and solves of ``n × n`` matrices (:data:`CUBIC`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from beyondgrad.compat import primitives as P
from beyondgrad.forward_laplacian.jets import (
    Jet,
    bind,
    dep,
    is_float,
    jet_dim,
    sum_axes,
    val,
    zeros_if_none,
)

#: ``forward_jet`` warns when the generic rule's share of the ledger's cost proxy
#: (:class:`Ledger`) is above this
GENERIC_SHARE_WARNING = 0.5


def generic_rule(apply: Callable, ins: list) -> list:
    """Any primitive: forward over forward mode on it alone, along each jac direction.

    Args:
        apply: the primitive on plain values, ``apply(vals) -> outs``.
        ins: one entry per operand, a :class:`Jet` where it depends on ``r``.

    Returns:
        One entry per result: a :class:`Jet` for a floating-point result, else the
        plain value.
    """
    vals = [val(x) for x in ins]
    on_r = dep(ins)

    def f(*dep_vals: jax.Array) -> list:
        full = list(vals)
        for k, v in zip(on_r, dep_vals):
            full[k] = v
        return apply(full)

    primals = tuple(vals[k] for k in on_r)

    def along(*tangents: jax.Array) -> tuple[list, list]:
        def first(*p: jax.Array) -> list:
            return jax.jvp(f, p, tangents)[1]

        return jax.jvp(first, primals, tangents)

    outs = f(*primals)
    float_out = [is_float(o) for o in outs]
    if not any(float_out):
        return outs
    firsts, seconds = jax.vmap(along)(*[ins[k].jac for k in on_r])
    laps_in = tuple(zeros_if_none(ins[k].lap, vals[k]) for k in on_r)
    _, lin = jax.jvp(f, primals, laps_in)
    return [
        Jet(o, j, lp + sum_axes(s, (0,))) if fl else o
        for o, j, s, lp, fl in zip(outs, firsts, seconds, lin, float_out)
    ]


class Ledger:
    """What one trace of ``forward_jet`` sent to the generic rule, and the cost proxy
    (module docstring) for the whole program and for the generic rule's part."""

    def __init__(self) -> None:
        self.uses: list[tuple[Any, list[Any]]] = []
        self.total = 0
        self.generic = 0


#: the ledgers open now (one per ``forward_jet`` or ``generic_report`` being traced)
_LEDGERS: list[Ledger] = []
#: matrix factorisations and solves: ``n^3`` work on ``n^2`` elements
CUBIC = {
    P.lu_p,
    P.cholesky_p,
    P.qr_p,
    P.eigh_p,
    P.svd_p,
    P.triangular_solve_p,
    lax.linear_solve_p,
}


@contextlib.contextmanager
def recording() -> Iterator[Ledger]:
    """A new :class:`Ledger`, open (counting) inside the ``with`` block.

    Yields:
        The ledger; it is closed on exit, also after an error.
    """
    ledger = Ledger()
    _LEDGERS.append(ledger)
    try:
        yield ledger
    finally:
        _LEDGERS.remove(ledger)


def _size(x: Any) -> int:
    return int(jnp.size(val(x)))


def record_structured(ins: list, outs: list) -> None:
    """Count the results ``outs`` of a structured rule in every open ledger.

    Args:
        ins: the rule's operands (``d`` is read from them).
        outs: its results.
    """
    if _LEDGERS:
        cost = (jet_dim(ins) + 1) * sum(_size(o) for o in outs)
        for ledger in _LEDGERS:
            ledger.total += cost


def apply_generic(eqn: Any, ins: list) -> list:
    """The generic rule on ``eqn``, counted in every open ledger.

    Args:
        eqn: the jaxpr equation.
        ins: one entry per operand, a :class:`Jet` where it depends on ``r``.

    Returns:
        One entry per result, as :func:`generic_rule` gives it.
    """
    if _LEDGERS:
        d = jet_dim(ins)
        cost = (2 * d + 1) * (
            sum(_size(x) for x in ins)
            + sum(int(np.prod(v.aval.shape)) for v in eqn.outvars)
        )
        if eqn.primitive in CUBIC:  # n^3 work on n^2 elements
            cost *= int(jnp.shape(val(ins[0]))[-1])
        for ledger in _LEDGERS:
            ledger.uses.append((eqn, list(ins)))
            ledger.generic += cost
            ledger.total += cost
    return generic_rule(functools.partial(bind, eqn), ins)
