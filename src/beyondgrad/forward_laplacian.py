r"""The forward Laplacian: the value, Jacobian and Laplacian of a function of one
vector, carried forward through its jaxpr in one pass (Chapter 5).

For :math:`f:\mathbb{R}^d\to\mathbb{R}^{m}`, every intermediate value :math:`v` of
``f``'s program travels as a :class:`Jet` ``(v, ∂v/∂r, Δv)`` (Li et al., "A
computational framework for neural network-based variational Monte Carlo with Forward
Laplacian", Nature Machine Intelligence 2024), and each primitive maps jets to jets:

* linear maps apply to all three parts;
* a product gives :math:`\Delta(ab) = a\Delta b + b\Delta a + 2\sum_k \partial_k a\,\partial_k b`;
* an elementwise :math:`g` gives :math:`g'(v)\Delta v + g''(v)\sum_k(\partial_k v)^2`;
* any other primitive is differentiated alone by forward over forward mode.

Values that do not depend on ``r`` stay plain arrays. This module depends on
:mod:`beyondgrad.compat` and :func:`beyondgrad.laplacian.basis` only, so it can be lifted
alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from beyondgrad import compat
from beyondgrad.laplacian import basis

__all__ = ["Jet", "forward_jet", "forward_laplacian"]


class Jet(NamedTuple):
    """A value that depends on the input ``r`` (shape ``(d,)``), with its derivatives.

    ``jac[k]`` is :math:`\\partial v/\\partial r_k` (shape ``(d, *v.shape)``) and ``lap``
    is :math:`\\sum_k \\partial^2 v/\\partial r_k^2` (``None``: known to be zero).
    Values that do not depend on ``r`` are kept as plain arrays.
    """

    val: jax.Array
    jac: jax.Array
    lap: jax.Array | None


#: primitives linear in the inputs at these positions (the other inputs must not depend on r)
_LINEAR = {
    **dict.fromkeys(
        [
            "neg",
            "reshape",
            "broadcast_in_dim",
            "transpose",
            "squeeze",
            "expand_dims",
            "slice",
            "convert_element_type",
            "copy",
            "copy_p",
            "rev",
            "real",
            "cumsum",
            "reduce_precision",
            "dynamic_slice",
            "gather",
            "sharding_constraint",
            "pvary",
            "pcast",
        ],
        (0,),
    ),
    "add": (0, 1),
    "sub": (0, 1),
    "add_any": (0, 1),
    "pad": (0, 1),
    "dynamic_update_slice": (0, 1),
    "scatter-add": (0, 2),
    "scatter_add": (0, 2),
}
#: bilinear primitives: linear in each input when the other one is fixed
_BILINEAR = {"mul", "dot_general"}
#: elementwise functions of one input: f' and f'' from forward over forward mode
_UNARY = {
    "tanh",
    "exp",
    "exp2",
    "log",
    "log1p",
    "expm1",
    "sin",
    "cos",
    "tan",
    "logistic",
    "sqrt",
    "rsqrt",
    "cbrt",
    "integer_pow",
    "square",
    "erf",
    "erfc",
    "atan",
    "asin",
    "acos",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "lgamma",
    "digamma",
    "abs",
}
#: primitives holding a sub-jaxpr that is interpreted in place (custom rules are not used:
#: the primal program is differentiated, as forward-mode JAX does for custom_vjp)
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
}


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _zeros_if_none(lap: jax.Array | None, like: jax.Array) -> jax.Array:
    return jnp.zeros_like(like) if lap is None else lap


def _linear_rule(apply: Callable, ins: list, positions: tuple[int, ...]) -> list:
    """``apply`` is linear in the inputs at ``positions`` (the others do not depend on r)."""
    vals = [x.val if isinstance(x, Jet) else x for x in ins]
    outs = apply(vals)

    def with_(parts: dict[int, jax.Array]) -> list:
        return apply(
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


def _reduce_sum_rule(x: Jet, axes: tuple[int, ...]) -> list:
    """``reduce_sum`` is linear: the same sum of each part (jac's axes are shifted by one)."""
    jac = _sum_axes(x.jac, tuple(a + 1 for a in axes))
    lap = None if x.lap is None else _sum_axes(x.lap, axes)
    return [Jet(_sum_axes(x.val, axes), jac, lap)]


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


def _unary_rule(apply: Callable, x: Jet) -> list:
    """Elementwise ``f``: jac = f'(x) jac_x, lap = f'(x) lap_x + f''(x) sum_k jac_x[k]^2."""
    ones = jnp.ones_like(x.val)

    def slope(v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.jvp(lambda u: apply([u])[0], (v,), (ones,))

    (out, d1), (_, d2) = jax.jvp(slope, (x.val,), (ones,))
    lap = d2 * _sum_axes(x.jac * x.jac, (0,))
    if x.lap is not None:
        lap = lap + d1 * x.lap
    return [Jet(out, d1 * x.jac, lap)]


def _generic_rule(apply: Callable, ins: list) -> list:
    """Any primitive: forward over forward mode on it alone, along each jac direction."""
    vals = [x.val if isinstance(x, Jet) else x for x in ins]
    dep = [k for k, x in enumerate(ins) if isinstance(x, Jet)]

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


def _forward_laplacian_jaxpr(jaxpr: Any, consts: list, args: list) -> list:
    """Interpret ``jaxpr`` on inputs that are arrays or :class:`Jet` s."""
    env: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        ins = [compat.jaxpr_atom_value(a, env) for a in eqn.invars]
        name = eqn.primitive.name

        def apply(invals: list, eqn: Any = eqn) -> list:
            return compat.bind_equation(eqn, invals)

        dep = [k for k, x in enumerate(ins) if isinstance(x, Jet)]
        if not dep:
            outs = apply(ins)
        elif name in _CALLS and _CALLS[name] in eqn.params:
            sub = eqn.params[_CALLS[name]]
            inner, inner_consts = (
                (sub.jaxpr, list(sub.consts)) if hasattr(sub, "consts") else (sub, [])
            )
            outs = _forward_laplacian_jaxpr(inner, inner_consts, ins)
        elif name == "reduce_sum":  # linear; short axes summed slice by slice
            outs = _reduce_sum_rule(ins[0], tuple(eqn.params["axes"]))
        elif name in _LINEAR and set(dep) <= set(_LINEAR[name]):
            outs = _linear_rule(apply, ins, _LINEAR[name])
        elif name == "select_n" and 0 not in dep:  # piecewise linear in the cases
            outs = _linear_rule(apply, ins, tuple(range(1, len(ins))))
        elif name in ("concatenate", "stack"):  # newer JAX has a stack primitive
            outs = _linear_rule(apply, ins, tuple(range(len(ins))))
        elif name in _BILINEAR and len(dep) == 1:
            outs = _linear_rule(apply, ins, tuple(dep))
        elif name in _BILINEAR:
            outs = _bilinear_rule(apply, ins[0], ins[1])
        elif name == "div" and dep == [0]:
            outs = _linear_rule(apply, ins, (0,))
        elif name in _UNARY and len(ins) == 1:
            outs = _unary_rule(apply, ins[0])
        else:
            outs = _generic_rule(apply, ins)
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [compat.jaxpr_atom_value(a, env) for a in jaxpr.outvars]


def forward_laplacian(
    fn: Callable[[jax.Array], jax.Array], r: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(f(r), ∂f/∂r, Σ_k ∂²f/∂r_k²)`` of ``fn`` at a 1-D ``r``, in one forward pass.

    The forward Laplacian (Li et al., Nature Machine Intelligence 2024): every
    intermediate value :math:`v` travels with its Jacobian :math:`\\partial v/\\partial r`
    (``d`` rows) and its Laplacian :math:`\\Delta v`, and each operation maps the triple
    on: a linear map applies to all three, a product :math:`ab` gives
    :math:`\\Delta(ab) = a\\Delta b + b\\Delta a + 2\\sum_k\\partial_k a\\,\\partial_k b`,
    an elementwise :math:`f` gives :math:`f'(v)\\Delta v + f''(v)\\sum_k(\\partial_k v)^2`,
    and any other operation is differentiated on its own by forward over forward mode.
    Values that do not depend on ``r`` (parameters) carry no derivatives. Compared with
    forward over forward mode along the ``d`` directions, the summed second derivative is
    carried once instead of ``d`` times, and no first derivative is computed twice.

    Returns shapes ``out``, ``(*out, d)`` (Jacobian, last axis = input coordinate) and
    ``out`` (``fn`` returns one array of shape ``out``).
    """
    jet = forward_jet(fn, r)
    return jet.val, jnp.moveaxis(jet.jac, 0, -1), _zeros_if_none(jet.lap, jet.val)


def forward_jet(fn: Callable[[jax.Array], jax.Array], r: jax.Array) -> Jet:
    """The :class:`Jet` of ``fn`` at a 1-D ``r``: :func:`forward_laplacian` with the
    Jacobian's input axis first, ``(d, *out)`` (the layout the interpreter carries, and
    the one :func:`beyondgrad.slater.orbital_derivatives` contracts without a transpose).
    """
    r = jnp.asarray(r)
    if r.ndim != 1 or not jnp.issubdtype(r.dtype, jnp.floating):
        raise ValueError(
            f"r must be a 1-D floating-point array, got shape {r.shape}, dtype {r.dtype}"
        )
    closed = jax.make_jaxpr(fn)(r)
    if len(closed.jaxpr.outvars) != 1:
        raise ValueError(
            f"fn must return one array, got {len(closed.jaxpr.outvars)} outputs"
        )
    (out,) = _forward_laplacian_jaxpr(
        closed.jaxpr, list(closed.consts), [Jet(r, basis(r), None)]
    )
    if not isinstance(out, Jet):  # fn does not depend on r
        out = Jet(out, jnp.zeros((r.shape[0], *jnp.shape(out)), r.dtype), None)
    return Jet(out.val, out.jac, _zeros_if_none(out.lap, out.val))
