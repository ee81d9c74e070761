r"""The dense rules: the structured maths on :class:`Jet` s with a ``(d, *shape)``
Jacobian.

* a map linear in some operands applies to the value, each Jacobian row and the
  Laplacian (:func:`linear_rule`);
* a bilinear :math:`B` gives :math:`\partial_k B(a, b) = B(\partial_k a, b) +
  B(a, \partial_k b)` and :math:`\Delta B(a, b) = B(\Delta a, b) + B(a, \Delta b) +
  2\sum_k B(\partial_k a, \partial_k b)` (:func:`bilinear_rule`);
* an elementwise :math:`f` gives :math:`f'(v)\,\partial_k v` and
  :math:`f'(v)\Delta v + f''(v)\sum_k(\partial_k v)^2` (:func:`unary_rule`);
* the primitives whose parameters change that maths (``div``, ``max``/``min``, their
  reductions, ``gather``, ``scatter``, collectives, ``polynomial``) have a rule each
  below, named after the primitive.

The particle-sparse form of a rule, where it has one, is the function of the same
name in ``beyondgrad.forward_laplacian.sparse``; the table
(``beyondgrad.forward_laplacian.registry``) pairs them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from beyondgrad.forward_laplacian.generic_rule import apply_generic
from beyondgrad.forward_laplacian.jets import (
    Jet,
    WithParams,
    bind,
    dep,
    is_complex,
    is_float,
    sum_axes,
    val,
    zeros_if_none,
)

# ----------------------------------------------------------------------------- rule bodies


def linear_rule(
    apply: Callable,
    ins: list,
    positions: tuple[int, ...],
    tangent: Callable | None = None,
) -> list:
    """``apply`` is linear in the inputs at ``positions`` (the others do not depend on r).

    ``tangent`` (default ``apply``) is the map applied to the Jacobian rows and the
    Laplacian: it differs from ``apply`` where the primitive adds a constant (a
    ``gather`` whose out-of-bounds slots take a fill value has derivative 0 there).

    Args:
        apply: the map on plain values, ``apply(vals) -> outs``.
        ins: one entry per operand, a :class:`Jet` where it depends on ``r``.
        positions: the operands in which ``apply`` is jointly linear.
        tangent: the map on derivatives; ``None``: ``apply``.

    Returns:
        One entry per result: a :class:`Jet`, or the plain value of a result that is
        not floating-point.
    """
    vals = [val(x) for x in ins]
    outs = apply(vals)
    tangent = apply if tangent is None else tangent

    def with_(parts: dict[int, jax.Array]) -> list:
        return tangent(
            [parts.get(k, v) if k in positions else v for k, v in enumerate(vals)]
        )

    on_r = [k for k in positions if k < len(ins) and isinstance(ins[k], Jet)]
    zero = {
        k: jnp.zeros_like(vals[k]) for k in positions if k < len(ins) and k not in on_r
    }
    jacs = jax.vmap(lambda *js: with_({**zero, **dict(zip(on_r, js))}))(
        *[ins[k].jac for k in on_r]
    )
    if all(ins[k].lap is None for k in on_r):
        laps = [None] * len(outs)
    else:
        laps = with_({**zero, **{k: zeros_if_none(ins[k].lap, vals[k]) for k in on_r}})
    return [Jet(o, j, lp) if is_float(o) else o for o, j, lp in zip(outs, jacs, laps)]


def bilinear_rule(apply: Callable, a: Jet, b: Jet) -> list:
    """``apply(a, b)`` bilinear, both inputs depending on r: the product rule, twice.

    Args:
        apply: the bilinear map on plain values, ``apply([a, b]) -> [out]``.
        a: the first operand's jet.
        b: the second operand's jet.

    Returns:
        ``[Jet]`` of the result.
    """
    (out,) = apply([a.val, b.val])
    jac = jax.vmap(lambda ja, jb: apply([ja, b.val])[0] + apply([a.val, jb])[0])(
        a.jac, b.jac
    )
    cross = sum_axes(jax.vmap(lambda ja, jb: apply([ja, jb])[0])(a.jac, b.jac), (0,))
    lap = 2.0 * cross
    if a.lap is not None:
        lap = lap + apply([a.lap, b.val])[0]
    if b.lap is not None:
        lap = lap + apply([a.val, b.lap])[0]
    return [Jet(out, jac, lap)]


def slopes(apply: Callable, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(f(v), f'(v), f''(v))`` of an elementwise ``f``: forward over forward on ones.

    Args:
        apply: the elementwise ``f`` on plain values, ``apply([v]) -> [f(v)]``.
        v: the point.

    Returns:
        The value and the first and second derivatives, each shaped like ``v``.
    """
    ones = jnp.ones_like(v)

    def slope(u: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.jvp(lambda w: apply([w])[0], (u,), (ones,))

    (out, d1), (_, d2) = jax.jvp(slope, (v,), (ones,))
    return out, d1, d2


def unary_rule(apply: Callable, x: Jet) -> list:
    """Elementwise ``f``: jac = f'(x) jac_x, lap = f'(x) lap_x + f''(x) sum_k jac_x[k]^2.

    Args:
        apply: ``f`` on plain values, ``apply([v]) -> [f(v)]``.
        x: the operand's jet.

    Returns:
        ``[Jet]`` of ``f(x)``, or the plain value if it is not floating-point.
    """
    out, d1, d2 = slopes(apply, x.val)
    if not is_float(out):
        return [out]
    lap = d2 * sum_axes(x.jac * x.jac, (0,))
    if x.lap is not None:
        lap = lap + d1 * x.lap
    return [Jet(out, d1 * x.jac, lap)]


def reduce_sum_rule(x: Jet, axes: tuple[int, ...]) -> list:
    """``reduce_sum`` is linear: the same sum of each part (jac's axes are shifted by one).

    Args:
        x: the operand's jet.
        axes: the summed axes of the value.

    Returns:
        ``[Jet]`` of the sum.
    """
    jac = sum_axes(x.jac, tuple(a + 1 for a in axes))
    lap = None if x.lap is None else sum_axes(x.lap, axes)
    return [Jet(sum_axes(x.val, axes), jac, lap)]


# ----------------------------------------------------------------------------- per primitive
# Each takes ``(eqn, ins)`` (the rule contract) and goes to the generic rule for a
# case its maths does not cover.


def broadcast_jet(x: Any, shape: tuple[int, ...]) -> Any:
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


def div(eqn: Any, ins: list) -> list:
    """``a / b``: linear in ``a``; for ``b`` depending on r, ``a * (1/b)`` with the
    elementwise rule for ``1/b`` and the product rule (operands of different shapes,
    a scalar literal over an array, are broadcast first).

    Args:
        eqn: the ``div`` equation.
        ins: its two operands.

    Returns:
        ``[Jet]`` of the quotient.
    """
    if dep(ins) == [0]:
        return linear_rule(functools.partial(bind, eqn), ins, (0,))
    a, b = ins
    if is_complex(b.val):
        return apply_generic(eqn, ins)
    shape = jnp.broadcast_shapes(jnp.shape(val(a)), jnp.shape(b.val))
    a, b = broadcast_jet(a, shape), broadcast_jet(b, shape)
    (inv,) = unary_rule(lambda v: [1.0 / v[0]], b)
    if not isinstance(a, Jet):
        return linear_rule(lambda v: [v[0] * v[1]], [a, inv], (1,))
    return bilinear_rule(lambda v: [v[0] * v[1]], a, inv)


def chooser(eqn: Any, ins: list) -> list:
    """``max``/``min`` of two operands: the jet of the chosen operand, the mean of the
    two where they are equal (JAX's own JVP of ``max``/``min`` weighs ties 1/2 each,
    so this is ``jax.hessian``'s convention). Complex operands: the generic rule.

    Args:
        eqn: the ``max`` or ``min`` equation.
        ins: its two operands.

    Returns:
        ``[Jet]`` of the result.
    """
    if any(is_complex(val(x)) for x in ins):
        return apply_generic(eqn, ins)
    a, b = (val(x) for x in ins)
    (ans,) = bind(eqn, [a, b])
    wa = jnp.where(a == ans, jnp.where(b == ans, 0.5, 1.0), 0.0).astype(ans.dtype)
    wb = jnp.where(b == ans, jnp.where(a == ans, 0.5, 1.0), 0.0).astype(ans.dtype)
    shape = ans.shape
    outs = linear_rule(
        lambda v: [jnp.broadcast_to(wa * v[0] + wb * v[1], shape)], list(ins), (0, 1)
    )
    return [Jet(ans, outs[0].jac, outs[0].lap)]


def reduce_chooser(eqn: Any, ins: list) -> list:
    """``reduce_max``/``reduce_min``: linear with the weights of JAX's JVP (the chosen
    elements, ties sharing equally): a weighted sum over ``eqn.params['axes']``.

    Args:
        eqn: the ``reduce_max`` or ``reduce_min`` equation.
        ins: its one operand.

    Returns:
        ``[Jet]`` of the result.
    """
    (x,) = ins
    if is_complex(x.val):
        return apply_generic(eqn, ins)
    axes = tuple(eqn.params["axes"])
    (ans,) = bind(eqn, [x.val])
    keep = jnp.expand_dims(ans, axes)
    hit = (x.val == keep).astype(x.val.dtype)
    w = hit / jnp.sum(hit, axis=axes, keepdims=True)
    jac = jnp.sum(x.jac * w, axis=tuple(a + 1 for a in axes))
    lap = None if x.lap is None else jnp.sum(x.lap * w, axis=axes)
    return [Jet(ans, jac, lap)]


def gather(eqn: Any, ins: list) -> list:
    """``gather``: linear in the operand, except that a slot out of bounds under
    ``mode=FILL_OR_DROP`` takes ``fill_value`` (a constant, NaN by default): its
    derivatives are 0, so the Jacobian rows and the Laplacian are gathered with fill
    value 0 (as JAX's own JVP of ``gather`` does).

    Args:
        eqn: the ``gather`` equation.
        ins: its operand and indices.

    Returns:
        ``[Jet]`` of the gathered values.
    """
    if dep(ins) != [0]:
        return apply_generic(eqn, ins)
    zero_fill = WithParams(eqn.primitive, {**eqn.params, "fill_value": 0})
    return linear_rule(
        functools.partial(bind, eqn),
        ins,
        (0,),
        tangent=functools.partial(bind, zero_fill),
    )


def scatter(eqn: Any, ins: list) -> list:
    """``scatter`` (``x.at[i].set(y)``): jointly linear in the operand and the updates
    when each slot is written at most once (``unique_indices``). With repeated
    indices the slot keeps one of its updates, chosen by the backend: the generic
    rule (JAX's own JVP, which tracks which update won) keeps the derivatives with
    the value. An update function (``x.at[i].apply(fn)``: ``update_jaxpr``) has no
    derivative in JAX (its JVP raises), and neither has it here.

    Args:
        eqn: the ``scatter`` equation.
        ins: its operand, indices and updates.

    Returns:
        ``[Jet]`` of the result.

    Raises:
        NotImplementedError: the scatter has an update function.
    """
    if eqn.params.get("update_jaxpr") is not None:
        raise NotImplementedError(
            "forward_laplacian: scatter with an update function (update_jaxpr, from "
            "x.at[i].apply(fn)) has no derivative rule, in JAX or here; write "
            "x.at[i].set(fn(x[i])) instead"
        )
    if not eqn.params.get("unique_indices", False):
        return apply_generic(eqn, clamped_indices(eqn, ins))
    if not set(dep(ins)) <= {0, 2}:
        return apply_generic(eqn, clamped_indices(eqn, ins))
    return linear_rule(functools.partial(bind, eqn), ins, (0, 2))


def scatter_extremum(eqn: Any, ins: list) -> list:
    """``scatter-min``/``scatter-max`` (``x.at[i].min(y)``): the generic rule (JAX's
    own JVP, which weighs tied slots equally), on indices clamped into range first
    when the mode is ``CLIP`` (:func:`clamped_indices`).

    Args:
        eqn: the ``scatter-min`` or ``scatter-max`` equation.
        ins: its operand, indices and updates.

    Returns:
        ``[Jet]`` of the result.
    """
    return apply_generic(eqn, clamped_indices(eqn, ins))


def clamped_indices(eqn: Any, ins: list) -> list:
    """A scatter's operands with ``CLIP``-mode indices clamped into range.

    ``CLIP`` means each index vector is clamped to ``[0, shape - window]`` along the
    operand dimensions it addresses, so the clamped indices give the same scatter.
    JAX's own JVPs of ``scatter`` with repeated indices and of
    ``scatter-min``/``scatter-max`` up to 0.10 gather at the indices without the
    mode, so an out-of-range index reads a NaN fill there; clamping first keeps
    their derivatives exact. Other modes are returned unchanged.

    Args:
        eqn: a scatter equation (params ``mode`` and ``dimension_numbers``).
        ins: its operand, indices and updates (the indices are never a Jet).

    Returns:
        ``ins``, with the indices clamped when the mode is ``CLIP``.
    """
    if eqn.params.get("mode") != jax.lax.GatherScatterMode.CLIP:
        return ins
    operand, indices, updates = (val(x) for x in ins[:3])
    dims = eqn.params["dimension_numbers"]
    unit = set(dims.inserted_window_dims) | set(dims.operand_batching_dims)
    window, pos = [], 0
    for axis in range(jnp.ndim(operand)):
        if axis in unit:
            window.append(1)
        else:
            window.append(jnp.shape(updates)[dims.update_window_dims[pos]])
            pos += 1
    upper = [
        jnp.shape(operand)[a] - window[a] for a in dims.scatter_dims_to_operand_dims
    ]
    clamped = jnp.clip(indices, 0, jnp.asarray(upper, jnp.result_type(indices)))
    return [ins[0], clamped, *ins[2:]]


def across_devices(eqn: Any, ins: list) -> list:
    """``psum``/``ppermute`` act on each element across devices and are linear, so they
    apply to ``val``, ``jac`` (with its leading ``d`` axis) and ``lap`` as they are, one
    operand at a time: no ``vmap`` over the ``d`` rows (``vmap`` of ``psum`` inside
    ``shard_map`` raises a ``TypeError`` in JAX 0.8.2 and 0.8.3).

    Args:
        eqn: the collective's equation.
        ins: its operands.

    Returns:
        One entry per operand's result.
    """
    outs = []
    for x in ins:
        if not isinstance(x, Jet):
            outs.append(bind(eqn, [x])[0])
            continue
        lap = None if x.lap is None else bind(eqn, [x.lap])[0]
        outs.append(Jet(bind(eqn, [x.val])[0], bind(eqn, [x.jac])[0], lap))
    return outs


def polynomial(eqn: Any, ins: list) -> list:
    """``polynomial(x, *coeffs)`` (``jnp.polyval``, ``jnp.sinc`` on JAX 0.12): with
    constant coefficients an elementwise function of ``x``; otherwise the generic rule.

    Args:
        eqn: the ``polynomial`` equation.
        ins: ``x`` and the coefficients.

    Returns:
        ``[Jet]`` of the polynomial's value.
    """
    x, *coeffs = ins
    if not isinstance(x, Jet) or any(isinstance(c, Jet) for c in coeffs):
        return apply_generic(eqn, ins)
    return unary_rule(lambda vals: bind(eqn, [vals[0], *coeffs]), x)
