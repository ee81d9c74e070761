r"""Calls and control flow: rules that re-interpret a sub-jaxpr on jets.

A call (``jit``, ``checkpoint``, ``composite``; :func:`call`) interprets its body in
place. ``scan``, ``while`` and ``cond`` re-interpret their body on jets inside the same
control flow (:func:`scan_rule`, :func:`while_rule`, :func:`cond_rule`), so the savings hold
inside loops. A loop carry must keep one structure across iterations, so each carry is
either a Jet in every iteration (its jac and lap always materialised) or a plain array
in every iteration: the carries that are Jets are the least fixed point of "the
initial value is a Jet, or the body makes it one from the Jets it is given", found by
tracing the body abstractly (``_out_mask``), once per body and input mask in one
``forward_jet`` call (:func:`mask_cache`).

The body is interpreted by ``beyondgrad.forward_laplacian.interpreter.interpret``,
looked up when a rule runs (the interpreter, in turn, looks rules up in the table).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from beyondgrad import _checks, compat
from beyondgrad.forward_laplacian import interpreter
from beyondgrad.forward_laplacian.generic_rule import apply_generic
from beyondgrad.forward_laplacian.jets import Jet, Rule, jet_dim, val, zeros_if_none


def open_jaxpr(sub: Any) -> tuple[Any, list]:
    """A sub-jaxpr parameter as ``(jaxpr, consts)`` (a ClosedJaxpr or an open Jaxpr).

    Args:
        sub: a ``ClosedJaxpr`` or an open ``Jaxpr``.

    Returns:
        ``(jaxpr, consts)``, ``consts`` empty for an open jaxpr.
    """
    if hasattr(sub, "consts"):
        return sub.jaxpr, list(sub.consts)
    return sub, []


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
    message = (
        f"call() takes the names of the sub-jaxpr parameter as strs, got {params!r}"
        ' (e.g. call("jaxpr") for jit)'
    )
    for k in params or (None,):  # no name at all is refused too
        _checks.instance(k, str, message)

    def apply(eqn: Any, ins: list) -> list:
        param = next((k for k in params if k in eqn.params), None)
        if param is None:
            return apply_generic(eqn, ins)
        inner, consts = open_jaxpr(eqn.params[param])
        return interpreter.interpret(inner, consts, ins)

    def sparse(eqn: Any, ins: list) -> list | None:
        param = next((k for k in params if k in eqn.params), None)
        if param is None:
            return None
        inner, consts = open_jaxpr(eqn.params[param])
        return interpreter.interpret(inner, consts, ins)

    detail = " or ".join(f"sub-jaxpr eqn.params[{k!r}]" for k in params)
    return Rule("call", apply, detail, sparse)


def _flatten(values: Sequence[Any], mask: Sequence[bool]) -> list[jax.Array]:
    """Jets (where ``mask``) as ``val, jac, lap`` (lap materialised), others as ``val``."""
    flat: list[jax.Array] = []
    for value, is_jet in zip(values, mask):
        if is_jet:
            flat += [value.val, value.jac, zeros_if_none(value.lap, value.val)]
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
        return Jet(value.val, value.jac, zeros_if_none(value.lap, value.val))
    value = jnp.asarray(value)
    return Jet(value, jnp.zeros((d, *value.shape), value.dtype), jnp.zeros_like(value))


def _conform(values: Sequence[Any], mask: Sequence[bool], d: int) -> list[Any]:
    """Promote the values where ``mask`` to Jets (the others must be plain)."""
    return [_as_jet(v, d) if m else v for v, m in zip(values, mask)]


def _jet_mask(values: Sequence[Any]) -> list[bool]:
    return [isinstance(v, Jet) for v in values]


#: masks found in the current ``forward_jet`` call, by (body, input mask): a body's
#: output mask depends on nothing else (``d`` is fixed within one call)
_MASK_CACHES: list[dict[tuple[int, tuple[bool, ...]], list[bool]]] = []
#: > 0 while a body is traced only for its output mask: control flow inside it then
#: returns placeholders of the right structure instead of tracing its own body again,
#: so nested loops cost one body trace per level and mask, not a power of the depth
_ABSTRACT = [0]


@contextlib.contextmanager
def mask_cache() -> Iterator[None]:
    """A fresh cache of the carry masks found inside the ``with`` block (one
    ``forward_jet`` call: ``d`` is fixed there, so a body's output mask depends only on
    the body and its input mask).

    Yields:
        ``None``; the cache is dropped on exit, also after an error.
    """
    _MASK_CACHES.append({})
    try:
        yield
    finally:
        _MASK_CACHES.pop()


def _out_mask(jaxpr: Any, consts: Sequence[Any], ins: Sequence[Any]) -> list[bool]:
    """Which outputs of ``jaxpr`` are Jets given ``ins`` (traced abstractly, run never)."""
    mask: list[bool] = []
    mask_in = _jet_mask(ins)
    key = (id(jaxpr), tuple(mask_in))
    cache = _MASK_CACHES[-1] if _MASK_CACHES else {}
    if key in cache:
        return list(cache[key])

    def run(*flat: jax.Array) -> list:
        outs = interpreter.interpret(jaxpr, consts, _unflatten(flat, mask_in))
        mask[:] = _jet_mask(outs)
        return [val(o) for o in outs]

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


def scan_rule(eqn: Any, ins: list) -> list:
    """``scan``: the body runs on jets inside ``lax.scan``; scanned Jets are sliced
    along their value axis (axis 1 of jac).

    Args:
        eqn: the ``scan`` equation (``eqn.params`` read).
        ins: one entry per operand, a jet where it depends on ``r``.

    Returns:
        One entry per result, a jet or a plain array.
    """
    params = eqn.params
    body, body_consts = open_jaxpr(params["jaxpr"])
    n_consts, n_carry = compat.scan_counts(params)
    consts, init, xs = (
        ins[:n_consts],
        ins[n_consts : n_consts + n_carry],
        ins[n_consts + n_carry :],
    )
    d = jet_dim(ins)
    xs_mask = _jet_mask(xs)
    # one step's slices, only traced abstractly (for the masks); a scan of length 0
    # has none, so zeros of a step's shape stand in
    x_slices = [
        Jet(_step(x.val), _step(x.jac, 1), _step(zeros_if_none(x.lap, x.val)))
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
        outs = interpreter.interpret(body, body_consts, [*consts, *carry, *x])
        new = _conform(outs[:n_carry], mask, d)
        ys = _conform(outs[n_carry:], y_mask, d)
        return _flatten(new, mask), _flatten(ys, y_mask)

    xs_flat = _flatten(
        [
            Jet(x.val, jnp.moveaxis(x.jac, 0, 1), zeros_if_none(x.lap, x.val))
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


def while_rule(eqn: Any, ins: list) -> list:
    """``while``: the body runs on jets inside ``lax.while_loop``; the condition reads
    the values only (the trip count is piecewise constant in r).

    Args:
        eqn: the ``while`` equation (``eqn.params`` read).
        ins: one entry per operand, a jet where it depends on ``r``.

    Returns:
        One entry per result, a jet or a plain array.
    """
    params = eqn.params
    cond, cond_consts_closed = open_jaxpr(params["cond_jaxpr"])
    body, body_consts_closed = open_jaxpr(params["body_jaxpr"])
    nc, nb = params["cond_nconsts"], params["body_nconsts"]
    cond_consts = [val(x) for x in ins[:nc]]
    body_consts, init = ins[nc : nc + nb], ins[nc + nb :]
    d = jet_dim(ins)
    mask = _loop_mask(body, body_consts_closed, body_consts, init, [], d)
    if _ABSTRACT[0]:
        return _placeholder(eqn, mask, d)

    def cond_fun(carry_flat: list) -> jax.Array:
        carry = [val(c) for c in _unflatten(carry_flat, mask)]
        return interpreter.interpret(cond, cond_consts_closed, [*cond_consts, *carry])[
            0
        ]

    def body_fun(carry_flat: list) -> list:
        carry = _unflatten(carry_flat, mask)
        outs = interpreter.interpret(body, body_consts_closed, [*body_consts, *carry])
        return _flatten(_conform(outs, mask, d), mask)

    out = lax.while_loop(cond_fun, body_fun, _flatten(_conform(init, mask, d), mask))
    return _unflatten(out, mask)


def cond_rule(eqn: Any, ins: list) -> list:
    """``cond``: every branch runs on jets inside ``lax.switch``; an output is a Jet if
    any branch makes it one. The index does not depend on r (it is an integer).

    Args:
        eqn: the ``cond`` equation (``eqn.params`` read).
        ins: one entry per operand, a jet where it depends on ``r``.

    Returns:
        One entry per result, a jet or a plain array.
    """
    index, ops = val(ins[0]), ins[1:]
    branches = [open_jaxpr(b) for b in eqn.params["branches"]]
    d = jet_dim(ins)
    op_mask = _jet_mask(ops)
    masks = [_out_mask(j, c, ops) for j, c in branches]
    mask = [any(col) for col in zip(*masks)]
    if _ABSTRACT[0]:
        return _placeholder(eqn, mask, d)

    def branch_fn(jaxpr: Any, consts: list) -> Callable[..., list]:
        def run(*flat: jax.Array) -> list:
            outs = interpreter.interpret(jaxpr, consts, _unflatten(flat, op_mask))
            return _flatten(_conform(outs, mask, d), mask)

        return run

    fns = [branch_fn(j, c) for j, c in branches]
    out = lax.switch(index, fns, *_flatten(ops, op_mask))
    return _unflatten(out, mask)
