r"""The cost report: :func:`generic_report` lists the equations of a program that the
forward Laplacian sends to the generic rule, each with its compiled flops on its own,
beside the compiled flops of the whole forward Laplacian.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from beyondgrad.forward_laplacian import generic_rule
from beyondgrad.forward_laplacian.generic_rule import recording
from beyondgrad.forward_laplacian.interpreter import forward_jet
from beyondgrad.forward_laplacian.jets import Jet, bind, jet_dim, val


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


def compiled_flops(compiled: Any) -> float:
    """The flops XLA's ``cost_analysis`` reports for a compiled program.

    Args:
        compiled: a ``jax.stages.Compiled``.

    Returns:
        The ``"flops"`` entry (0.0 where the backend reports none).
    """
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
    with recording() as ledger:
        program = jax.jit(lambda v: forward_jet(fn, v)).lower(r).compile()
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
            lambda *args, eqn=eqn: generic_rule.generic_rule(
                functools.partial(bind, eqn), list(args)
            )
        )
        flops = compiled_flops(alone.lower(*specs).compile())
        uses.append(
            GenericUse(
                eqn.primitive.name,
                tuple(tuple(jnp.shape(val(x))) for x in ins),
                2 * jet_dim(ins) + 1,
                flops,
            )
        )
    return GenericReport(
        tuple(uses), sum(u.flops for u in uses), compiled_flops(program)
    )
