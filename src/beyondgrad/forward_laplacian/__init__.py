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
program's derivative work by a cost proxy (``generic_rule.Ledger``), and
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
``reduce_sum``, ``dot_general`` contracting axes along which the owners are
constant (one operand on ``r``, or both: attention logits ``q @ k.T``),
``concatenate``, calls). ``mul``, ``div`` and ``dot_general`` also take one dense and
one sparse operand (``Rule.mixed``): the result is dense, but the Laplacian's cross
term reads the dense Jacobian only at the sparse operand's owners (a softmax's
``e / sum(e)``; ``softmax(s) @ v`` over the owner axis). Every other rule, control
flow and registered rules included, receives dense Jets (the terms summed into a
``(d, *shape)`` Jacobian first), so the default is always correct. Without ``particles`` nothing changes: the
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

The package, one job a file
---------------------------
This module is the public face; the engine's files each do one job, in the order
they depend on each other:

* ``jets``: the types (:class:`Jet`, :class:`Rule`, :class:`GenericRuleWarning`),
  :func:`bind`, :func:`has_float_result` and the helpers every rule uses;
* ``generic_rule``: the generic rule and the cost ledger that counts its share;
* ``dense``: the dense rules (linear, bilinear, elementwise maths; one rule per
  primitive whose parameters change it: ``div``, ``gather``, ``scatter``, …);
* ``sparse``: their particle-sparse forms, each named after the dense rule it
  stands beside;
* ``constructors``: :func:`generic`, :func:`linear`, :func:`bilinear`,
  :func:`elementwise`, :func:`reduction`, :func:`constant`, :func:`custom`,
  :func:`from_triples`;
* ``control``: :func:`call` and the ``scan``/``while``/``cond`` rules, which
  re-interpret a body on jets;
* ``custom_jvp``: recognition of JAX's ``slogdet``/``det`` and of elementwise
  ``custom_jvp`` functions, and the ``custom_vjp`` rule;
* ``registry``: the table :data:`RULES` (the one place it is written, each sparse
  form beside its dense rule), :data:`FALLBACK`, :func:`rule_for`,
  :func:`register_rule`, :func:`rules_overridden`;
* ``interpreter``: :func:`forward_jet`, :func:`forward_laplacian` and the loop that
  carries jets through a jaxpr;
* ``cost``: :func:`generic_report`.

The engine depends on :mod:`beyondgrad.compat`, ``beyondgrad._checks`` and
``beyondgrad._sparse_jets`` only, so it can be lifted with them.
"""

from __future__ import annotations

from beyondgrad.compat import Primitive

# The registry before the other rule modules: it builds the table from all of them,
# and control and interpreter, which call each other back at run time only (a body
# is interpreted; the interpreter looks rules up), find it in place when imported.
from beyondgrad.forward_laplacian import generic_rule as _generic_rule
from beyondgrad.forward_laplacian import registry as _registry
from beyondgrad.forward_laplacian.constructors import (
    bilinear,
    constant,
    custom,
    elementwise,
    from_triples,
    generic,
    linear,
    reduction,
)
from beyondgrad.forward_laplacian.control import call
from beyondgrad.forward_laplacian.cost import GenericReport, GenericUse, generic_report
from beyondgrad.forward_laplacian.interpreter import forward_jet, forward_laplacian
from beyondgrad.forward_laplacian.jets import (
    GenericRuleWarning,
    Jet,
    Rule,
    bind,
    has_float_result,
)
from beyondgrad.forward_laplacian.registry import (
    register_rule,
    rule_for,
    rules_overridden,
)

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

#: The rule table: ``Primitive`` object -> :class:`Rule` (the same dict the
#: interpreter reads). Change it only through :func:`register_rule` /
#: :func:`rules_overridden`.
RULES: dict[Primitive, Rule] = _registry.RULES

#: Primitives for which the generic rule (forward over forward mode on the primitive
#: alone) is the deliberate choice: no cheaper structure, or the custom rule must be
#: used (``custom_jvp_call``). They use it without a warning.
FALLBACK: frozenset[Primitive] = _registry.FALLBACK

#: :func:`forward_jet` warns when the generic rule's share of the cost proxy (derivative
#: elements written) is above this.
GENERIC_SHARE_WARNING: float = _generic_rule.GENERIC_SHARE_WARNING
