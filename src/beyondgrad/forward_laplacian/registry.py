r"""The rule table: :data:`RULES` maps each ``jax.extend.core.Primitive`` *object*
(never a name) to its :class:`Rule`, and this module is the one place it is written.

Each entry is built by a constructor that declares the operation's structure
(``beyondgrad.forward_laplacian.constructors``, ``.control``), or wraps a dense rule
of ``beyondgrad.forward_laplacian.dense`` or ``.custom_jvp``. An entry whose rule
keeps particle sparsity names its sparse form beside it,
``_with_sparse(dense_rule, sparse.<same name>)``. :data:`FALLBACK` lists the
primitives that use the generic rule deliberately; any other primitive without an
entry gets it too, with a :class:`GenericRuleWarning` (:func:`rule_for`). Users change
the table only through :func:`register_rule` and :func:`rules_overridden`.
Primitives JAX names differently across versions are looked up through
:func:`beyondgrad.compat.primitive`; the table holds only those the running JAX has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from jax import lax

from beyondgrad import _checks, compat
from beyondgrad import _sparse_jets as sp
from beyondgrad.compat import Primitive
from beyondgrad.compat import primitives as P
from beyondgrad.forward_laplacian import custom_jvp, dense, sparse
from beyondgrad.forward_laplacian.constructors import (
    bilinear,
    constant,
    custom,
    elementwise,
    generic,
    linear,
    reduction,
)
from beyondgrad.forward_laplacian.control import (
    call,
    cond_rule,
    scan_rule,
    while_rule,
)
from beyondgrad.forward_laplacian.jets import GenericRuleWarning, Rule


def _prims(*names: str) -> list[Primitive]:
    """The primitives with these names on the running JAX (absent ones are skipped)."""
    found = [compat.primitive(n) for n in names]
    return [p for p in found if p is not None]


def _with_sparse(
    rule: Rule,
    sparse_form: Callable[[Any, list[Any]], list[Any] | None],
    *,
    mixed: bool = False,
) -> Rule:
    """``rule`` declaring that it keeps particle sparsity through ``sparse_form``
    (:func:`~beyondgrad.forward_laplacian.constructors.elementwise`,
    ``reduction``, ``constant`` and ``call`` declare it themselves); ``mixed``: the
    form also takes dense Jets beside sparse ones (``Rule.mixed``)."""
    return dataclasses.replace(rule, sparse=sparse_form, mixed=mixed)


#: The generic rule of a primitive with no entry (:func:`rule_for`).
NO_RULE = generic("no structured rule")

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
    # moves, repeats or selects elements: linear, and sparse through the owner maps
    **{p: _with_sparse(linear(0), sparse.structural) for p in sp.OWNER_MAPS},
    **{p: linear(0) for p in _LINEAR_0 if p not in sp.OWNER_MAPS},
    # unstack (jnp.unstack, lax.unstack and iterating over a traced array, e.g.
    # x, y, z = r, from JAX 0.10.1; absent on 0.8.2, whose jnp.unstack is a jit of
    # split and squeeze): linear, one slice of operand 0 per result
    **dict.fromkeys(_prims("unstack"), linear(0)),
    # every FFT type is a real-linear map of its operand
    lax.fft_p: linear(0),
    lax.add_p: _with_sparse(linear(0, 1), sparse.add),
    lax.sub_p: _with_sparse(linear(0, 1), sparse.add),
    P.add_jaxvals_p: _with_sparse(linear(0, 1), sparse.add),
    lax.complex_p: linear(0, 1),
    lax.pad_p: linear(0, 1),
    lax.dynamic_update_slice_p: linear(0, 1),
    lax.scatter_add_p: linear(0, 2),
    lax.scatter_sub_p: linear(0, 2),
    lax.scatter_p: custom(
        dense.scatter,
        "linear in operand and updates for unique indices; generic for repeated "
        "ones; an update function raises",
    ),
    **dict.fromkeys(
        (lax.scatter_max_p, lax.scatter_min_p),
        custom(
            dense.scatter_extremum,
            "generic (JAX's JVP), CLIP-mode indices clamped first",
        ),
    ),
    lax.gather_p: custom(
        dense.gather, "linear in the operand; filled slots have tangent 0"
    ),
    lax.select_n_p: linear(all_from=1),  # the cases; the predicate is never a Jet
    lax.concatenate_p: _with_sparse(linear(all_from=0), sparse.concatenate),
    lax.device_put_p: linear(all_from=0),
    lax.optimization_barrier_p: linear(all_from=0),
    **dict.fromkeys(_prims("stack"), linear(all_from=0)),
    lax.mul_p: _with_sparse(bilinear(), sparse.mul, mixed=True),
    lax.dot_general_p: _with_sparse(bilinear(), sparse.dot_general, mixed=True),
    lax.conv_general_dilated_p: bilinear(),
    lax.div_p: _with_sparse(
        custom(dense.div, "linear in the numerator; a * (1/b) otherwise"),
        sparse.div,
        mixed=True,
    ),
    lax.max_p: custom(dense.chooser, "the chosen operand's jet; ties weigh 1/2 each"),
    lax.min_p: custom(dense.chooser, "the chosen operand's jet; ties weigh 1/2 each"),
    lax.reduce_max_p: custom(
        dense.reduce_chooser, "weighted sum of the chosen elements"
    ),
    lax.reduce_min_p: custom(
        dense.reduce_chooser, "weighted sum of the chosen elements"
    ),
    **dict.fromkeys(_prims("polynomial"), custom(dense.polynomial, "elementwise in x")),
    P.custom_jvp_call_p: _with_sparse(
        custom(
            custom_jvp.rule,
            "slogdet/det: trace identities, one LU; elementwise: elementwise rule; "
            "else generic through the custom rule",
        ),
        custom_jvp.sparse_rule,
    ),
    P.custom_vjp_call_p: Rule(
        "custom_vjp",
        custom_jvp.custom_vjp_rule,
        "the whole function as method='hessian'",
    ),
    # elementwise, reduction, constant and call declare their sparse forms themselves
    **dict.fromkeys(_ELEMENTWISE, elementwise()),
    lax.abs_p: elementwise(holomorphic=False),
    lax.sign_p: elementwise(holomorphic=False),
    lax.reduce_sum_p: reduction(),
    **dict.fromkeys(_CONSTANT, constant()),
    P.jit_p: call("jaxpr"),
    P.closed_call_p: call("call_jaxpr"),
    P.call_p: call("call_jaxpr"),
    P.remat_p: call("jaxpr"),
    # lax.composite: its decomposition, interpreted in place (the parameter is
    # "jaxpr" on 0.8.2, "call_jaxpr" on 0.12)
    **dict.fromkeys(_prims("composite"), call("call_jaxpr", "jaxpr")),
    lax.scan_p: Rule("control", scan_rule, "body on jets inside lax.scan"),
    lax.while_p: Rule("control", while_rule, "body on jets inside lax.while_loop"),
    lax.cond_p: Rule("control", cond_rule, "branches on jets inside lax.switch"),
    # collectives inside shard_map that sum or move values elementwise across
    # devices: the same collective on each part (see dense.across_devices)
    **dict.fromkeys(
        _prims("psum", "psum_invariant", "ppermute"),
        custom(dense.across_devices, "the same collective on val, jac and lap"),
    ),
    # collectives that gather or split along an axis: linear in every operand
    **dict.fromkeys(
        _prims("all_gather", "all_gather_invariant", "all_to_all"),
        linear(all_from=0),
    ),
}

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

#: the primitives whose generic-rule warning was issued (once per primitive)
WARNED: set[Primitive] = set()


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
    _checks.instance(
        primitive,
        Primitive,
        "rule_for needs a jax.extend.core.Primitive (e.g. jax.lax.sin_p), got "
        f"{type(primitive).__name__} {primitive!r}",
    )
    found = RULES.get(primitive)
    if found is not None:
        return found
    if primitive not in FALLBACK and primitive not in WARNED:
        WARNED.add(primitive)
        cost = "2*d" if d is None else f"2*d = {2 * d}"
        warnings.warn(
            f"forward_laplacian: no rule for the primitive {primitive.name!r}; using the "
            f"generic rule (forward over forward mode on it alone: about {cost} extra "
            "JVPs of it, d = the input size). Register a rule with "
            "beyondgrad.forward_laplacian.register_rule to keep the savings.",
            GenericRuleWarning,
            stacklevel=2,
        )
    return NO_RULE


def _check_entry(primitive: object, rule: object) -> None:
    _checks.instance(
        primitive,
        Primitive,
        "register_rule needs a jax.extend.core.Primitive (e.g. jax.lax.mul_p), got "
        f"{type(primitive).__name__} {primitive!r}",
    )
    name = getattr(primitive, "name", "")
    _checks.instance(
        rule,
        Rule,
        f"the rule for {name!r} must be a Rule (build it with linear(), "
        "bilinear(), elementwise(), custom(fn) or from_triples(fn)), got "
        f"{type(rule).__name__}",
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
