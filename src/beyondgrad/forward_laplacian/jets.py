r"""The types the engine carries and the small helpers every rule uses.

A :class:`Jet` is a value :math:`v` that depends on the input ``r`` (shape ``(d,)``)
with its Jacobian rows :math:`\partial v/\partial r_k` and its Laplacian
:math:`\sum_k \partial^2 v/\partial r_k^2`; a :class:`Rule` maps the jets (and plain
arrays) of one equation's operands to those of its results. The particle-sparse form
of a jet is ``beyondgrad._sparse_jets.SparseJet``; the helpers here accept both.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from beyondgrad import compat
from beyondgrad._sparse_jets import SparseJet
from beyondgrad.compat import Primitive


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


class NeedsHessian(Exception):
    """Raised at trace time by a ``custom_vjp`` call on r's path: the interpreter
    (``forward_jet``) then computes the whole function as ``method="hessian"`` does."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """A forward-Laplacian rule: ``rule(eqn, ins) -> outs`` (see the module docstring).

    ``kind`` names the structure it declares (``"linear"``, ``"bilinear"``,
    ``"elementwise"``, ``"reduction"``, ``"constant"``, ``"call"``, ``"control"``,
    ``"generic"``, ``"custom"``, ``"triples"``, ``"custom_vjp"``); ``detail`` says more
    (the linear positions, the sub-jaxpr parameter, …).

    ``sparse`` declares that the rule keeps particle sparsity (:func:`forward_jet`
    with ``particles``): a function ``sparse(eqn, ins) -> outs`` whose ``ins`` hold
    ``SparseJet`` s of ``beyondgrad._sparse_jets`` (and plain arrays; a dense
    :class:`Jet` only where ``mixed`` is set), returning SparseJets, Jets or plain
    arrays, or ``None`` for a case it does not cover. A rule without it (``None``), or a ``None`` answer, gets its
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
        mixed: whether ``sparse`` also takes dense :class:`Jet` s beside the
            SparseJets (``mul``, ``div``, ``dot_general``: a dense result whose
            cross term reads the dense Jacobian only at the sparse operand's
            owners); ``False`` (the default): a dense operand densifies all.
    """

    kind: str
    apply: Callable[[Any, list[Any]], list[Any]]
    detail: str = ""
    sparse: Callable[[Any, list[Any]], list[Any] | None] | None = None
    mixed: bool = False

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


class WithParams(NamedTuple):
    """An equation's primitive with changed parameters, for :func:`bind`."""

    #: The equation's primitive.
    primitive: Primitive
    #: The parameters to bind it with.
    params: dict[str, Any]


def seed(r: jax.Array) -> Jet:
    """The dense jet of the input itself: ``(r, I, None)``, the identity Jacobian with
    ``r``'s dtype and the mesh axes ``r`` varies over (inside ``shard_map`` a tangent
    has its primal's varying type).

    Args:
        r: the 1-D input of length ``d``.

    Returns:
        ``Jet(r, eye(d), None)`` (its Laplacian is zero).
    """
    eye = jnp.eye(r.shape[0], dtype=r.dtype)
    return Jet(r, compat.varying_like(eye, r), None)


# ----------------------------------------------------------------------------- helpers


def is_float(x: Any) -> bool:
    """True if ``x``'s dtype is floating-point or complex (it can carry derivatives).

    Args:
        x: an array, a scalar or a dtype-carrying value.

    Returns:
        Whether its dtype is a subtype of ``jnp.inexact``.
    """
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def is_complex(x: Any) -> bool:
    """True if ``x``'s dtype is complex.

    Args:
        x: an array, a scalar or a dtype-carrying value.

    Returns:
        Whether its dtype is a subtype of ``jnp.complexfloating``.
    """
    return jnp.issubdtype(jnp.result_type(x), jnp.complexfloating)


def zeros_if_none(lap: jax.Array | None, like: jax.Array) -> jax.Array:
    """``lap``, or zeros shaped like ``like`` for a Laplacian known to be zero.

    Args:
        lap: a Laplacian, or ``None`` (known to be zero).
        like: the value it belongs to.

    Returns:
        ``lap`` itself, or ``jnp.zeros_like(like)``.
    """
    return jnp.zeros_like(like) if lap is None else lap


def is_jet(x: Any) -> bool:
    """True if ``x`` depends on ``r`` (a dense :class:`Jet` or a ``SparseJet``).

    Args:
        x: an operand or result.

    Returns:
        Whether it is a :class:`Jet` or a ``SparseJet``.
    """
    return isinstance(x, (Jet, SparseJet))


def val(x: Any) -> Any:
    """The value of a jet, or ``x`` itself when it is a plain array.

    Args:
        x: a jet or a plain array.

    Returns:
        ``x.val`` for a jet, else ``x``.
    """
    return x.val if is_jet(x) else x


def dep(ins: Sequence[Any]) -> list[int]:
    """The positions of the operands that depend on ``r``.

    Args:
        ins: one entry per operand.

    Returns:
        The indices of the entries that are jets.
    """
    return [k for k, x in enumerate(ins) if is_jet(x)]


def jet_dim(ins: Sequence[Any]) -> int:
    """``d``, the length of ``r``, read from the first jet among ``ins``.

    Args:
        ins: one entry per operand, at least one of them a jet.

    Returns:
        ``d``.
    """
    return next(
        x.d if isinstance(x, SparseJet) else int(x.jac.shape[0])
        for x in ins
        if is_jet(x)
    )


#: summed axes at most this long are summed slice by slice (see :func:`sum_axes`)
UNROLL_SUM = 16


def sum_axes(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``jnp.sum(x, axes)``, short axes as a sum of their slices (elementwise adds).

    Short reductions (3 coordinates, 10 polynomial terms) are the common case in
    orbitals; as adds they fuse with their neighbours instead of being a separate
    reduction over a short innermost axis, which the CPU compiler does slowly.

    Args:
        x: the array.
        axes: the axes summed (removed from the result).

    Returns:
        The sum.
    """
    long_axes = tuple(a for a in axes if x.shape[a] > UNROLL_SUM)
    short = sorted((a for a in axes if x.shape[a] <= UNROLL_SUM), reverse=True)
    if long_axes:
        x = jnp.sum(x, axis=long_axes, keepdims=True)
    for a in short:  # from the last axis, so earlier axis numbers stay valid
        parts = [
            jax.lax.index_in_dim(x, k, a, keepdims=False) for k in range(x.shape[a])
        ]
        x = functools.reduce(jnp.add, parts) if parts else jnp.sum(x, axis=a)
    return jnp.squeeze(x, axis=tuple(a - sum(b < a for b in short) for a in long_axes))


def add_laps(*laps: jax.Array | None) -> jax.Array | None:
    """The sum of the Laplacians given, ``None`` ones (zero) left out; ``None`` if all are."""
    present = [lp for lp in laps if lp is not None]
    return functools.reduce(jnp.add, present) if present else None


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
