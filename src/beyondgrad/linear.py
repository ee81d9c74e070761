"""Reverse mode as linearize-then-transpose (Chapter 2).

For ``f: X -> Y`` and a point ``x``, ``jax.linearize`` returns ``f(x)`` and the linear
map ``A = J_f(x)`` (``u -> A u``, the JVP); ``jax.linear_transpose`` turns ``A`` into
``A^T`` (``v -> A^T v``, the VJP). This module builds ``vjp`` from those two pieces,
checks a transpose numerically (the dot-product test
``<A u, v> = <u, A^T v>``), turns a linear map into a dense matrix, and names the
tracer that ``jax.grad`` hands a function, and lists what ``jax.checkpoint`` would
save for the backward pass (:func:`saved_residuals`). The chapter's exercise checkers live in
:mod:`beyondgrad.exercises.ch2`, its timing experiments and plots in
:mod:`beyondgrad.figures.ch2`.

Pytrees are welcome everywhere: a pytree of arrays is treated as the vector obtained by
concatenating its raveled leaves (``jax.flatten_util.ravel_pytree`` order), and the
pairing ``<a, b>`` is ``Re sum_leaves sum(a * b)`` (the real part of the bilinear sum,
no complex conjugate). That is the identity ``jax.linear_transpose`` satisfies for every
linear map it transposes, including maps that are linear over the reals only
(``conj``, ``real``, a real input times a complex number). For a complex-linear map the
full complex identity holds as well; for the others only the real part does.
``PyTree`` in the signatures means such a pytree of arrays.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import print_saved_residuals
from jax.flatten_util import ravel_pytree

from beyondgrad import _checks, compat

__all__ = [
    "PyTree",
    "dot_product_test",
    "grad_tracer_name",
    "materialize",
    "saved_residuals",
    "vjp_from_linearize",
]

#: A pytree of arrays (the vector of its raveled leaves).
PyTree = Any

# ------------------------------------------------------------------------- validation


def _require_callable(fn: Any, name: str) -> None:
    _checks.function(fn, name)


def _require_inexact(tree: Any, name: str) -> None:
    """Every leaf of ``tree`` must be a float or complex array."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError(f"{name} has no array leaves; pass at least one float array")
    _checks.float_leaves(
        tree,
        name,
        complex_ok=True,
        why="linear maps here act on them",
        fix="cast it, e.g. x.astype(jnp.float32), or close over integer arguments",
    )


def _match_tree(value: Any, example: Any, name: str, example_name: str) -> None:
    """ValueError for a structure/shape mismatch, TypeError for a dtype mismatch."""
    v_leaves, v_def = jax.tree_util.tree_flatten(value)
    e_leaves, e_def = jax.tree_util.tree_flatten(example)
    v_def, e_def = cast(Any, v_def), cast(Any, e_def)  # PyTreeDef has no stubs
    if v_def != e_def:
        raise ValueError(
            f"{name} has pytree structure {v_def}, but {example_name} has {e_def}"
        )
    paths = [
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_flatten_with_path(example)[0]
    ]
    for path, v, e in zip(paths, v_leaves, e_leaves):
        if jnp.shape(v) != jnp.shape(e):
            raise ValueError(
                f"{name}{path} has shape {jnp.shape(v)}, but {example_name}{path} "
                f"has shape {jnp.shape(e)}"
            )
        if jnp.result_type(v) != jnp.result_type(e):
            raise TypeError(
                f"{name}{path} has dtype {jnp.result_type(v)}, "
                f"but {example_name}{path} "
                f"has dtype {jnp.result_type(e)}; cast it with "
                f".astype({jnp.result_type(e)})"
            )


def _require_key(key: Any) -> None:
    is_new_style = isinstance(key, jax.Array) and jnp.issubdtype(
        key.dtype, jax.dtypes.prng_key
    )
    is_raw = (
        isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,)
    )
    if not (is_new_style or is_raw):
        raise TypeError(
            "key must be a JAX PRNG key such as jax.random.key(0), got "
            f"{type(key).__name__}"
        )


def _python_scalar_as(value: Any, like: Any) -> Any:
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        return jnp.asarray(value, dtype=jnp.result_type(like))
    return value


def _unwrap_single(result: Any, example: Any) -> Any:
    """Unwrap the 1-tuple that ``jax.linear_transpose`` and ``vjp`` return."""
    if (
        isinstance(result, tuple)
        and len(result) == 1
        and cast(Any, jax.tree_util.tree_structure(result))
        != jax.tree_util.tree_structure(example)
    ):
        return result[0]
    return result


# --------------------------------------------------------------- pytree linear algebra


def _random_like(key: jax.Array, tree: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    treedef = cast(Any, treedef)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten(
        [
            jax.random.normal(k, jnp.shape(x), jnp.result_type(x))
            for k, x in zip(keys, leaves)
        ]
    )


def _as64(x: Any) -> np.ndarray:
    a = np.asarray(x)
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def _pairing(a: Any, b: Any) -> float:
    """``<a, b> = Re sum over leaves of sum(a * b)``, accumulated in float64.

    The real part of the bilinear sum (no conjugate): ``jax.linear_transpose`` satisfies
    ``<A u, v> = <u, A^T v>`` with it for real-linear maps too (``conj``, ``real``),
    where the imaginary parts of the bilinear sums differ.
    """
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return float(sum(np.sum(_as64(x) * _as64(y)).real for x, y in pairs))


#: Rounding tolerance of the linearity checks, in units of the coarsest dtype's eps.
_EPS_FACTOR = 16


def _rounding_floor(*trees: Any) -> float:
    """``_EPS_FACTOR`` times the largest ``finfo(dtype).eps`` among the float leaves."""
    eps = [
        float(jnp.finfo(jnp.result_type(leaf)).eps)
        for tree in trees
        for leaf in jax.tree_util.tree_leaves(tree)
        if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact)
    ]
    return _EPS_FACTOR * max(eps, default=0.0)


def _combine64(alpha: float, a: Any, beta: float, b: Any) -> list[np.ndarray]:
    """``alpha a + beta b`` per leaf, computed in float64/complex128 (NumPy)."""
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return [alpha * _as64(x) + beta * _as64(y) for x, y in pairs]


def _norm(a: Any) -> float:
    return math.sqrt(
        sum(float(np.sum(np.abs(_as64(x)) ** 2)) for x in jax.tree_util.tree_leaves(a))
    )


def _combine(alpha: float, a: Any, beta: float, b: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, y: alpha * x + beta * y, a, b)


# ------------------------------------------------------------------------ the helpers


def vjp_from_linearize(
    f: Callable[..., PyTree], *primals: PyTree
) -> tuple[PyTree, Callable[[PyTree], tuple[PyTree, ...]]]:
    """``jax.vjp`` rebuilt from ``jax.linearize`` and ``jax.linear_transpose`` only.

    With ``A = J_f(primals)``: ``linearize`` gives ``out = f(*primals)`` and
    ``u -> A u``;
    ``linear_transpose`` of that map gives ``v -> A^T v``. Returns ``(out, vjp_fn)``;
    ``vjp_fn(cotangent)`` takes a pytree shaped like ``out`` and returns a tuple with
    one cotangent per primal, exactly like ``jax.vjp``.

    A Python scalar cotangent takes the output's dtype.

    Args:
        f: The function ``f(*primals)``, returning a pytree of float arrays.
        *primals: The point ``x`` at which ``A = J_f(x)`` is taken (pytrees of float
            arrays).

    Returns:
        ``(out, vjp_fn)`` with ``out = f(*primals)`` and ``vjp_fn(v) = A^T v``, a tuple
        with one cotangent per primal.

    Raises:
        TypeError: ``f`` is not callable, no primal is given, or a primal or output
            leaf is not a float array; from ``vjp_fn``, a cotangent whose dtype
            differs from ``out``.
        ValueError: From ``vjp_fn``, a cotangent whose structure or shape differs
            from ``out``.
    """
    _require_callable(f, "f")
    if not primals:
        raise TypeError(
            "vjp_from_linearize(f, *primals) needs at least one primal argument"
        )
    _require_inexact(primals, "primals")
    out, f_jvp = jax.linearize(f, *primals)
    _require_inexact(out, "f's output")
    f_transpose = jax.linear_transpose(f_jvp, *primals)

    out_tree: Any = jax.tree_util.tree_structure(out)

    def vjp_fn(cotangent: PyTree) -> tuple[PyTree, ...]:
        if jax.tree_util.tree_structure(cotangent) == out_tree:
            cotangent = jax.tree_util.tree_map(_python_scalar_as, cotangent, out)
        _match_tree(cotangent, out, "cotangent", "f's output")
        return f_transpose(cotangent)

    return out, vjp_fn


def dot_product_test(
    f_lin: Callable[[PyTree], PyTree],
    f_transpose: Callable[[PyTree], PyTree],
    in_example: PyTree,
    out_example: PyTree,
    key: jax.Array,
    *,
    linearity_rtol: float = 1e-3,
) -> float:
    """Relative mismatch of the adjoint identity ``<A u, v> = <u, A^T v>``.

    ``u`` (shaped like ``in_example``) and ``v`` (like ``out_example``) are standard
    normal draws from ``key``. Returns
    ``|<A u, v> - <u, A^T v>| / max(|A u| |v|, |u| |A^T v|)``, with the pairing
    ``<a, b> = Re sum(a * b)`` (bilinear, no conjugate; see the module docstring). The
    denominator is the Cauchy-Schwarz bound of both sides, so the number is meaningful
    even when the pairing is near zero.

    For a correct transpose the number is typically at rounding level (about 1e-7 in
    float32), and for a wrong one orders of magnitude larger. Neither is guaranteed:
    cancellation inside ``A`` (a large term added and subtracted again) raises the
    rounding level of a correct transpose, and an error confined to a part of ``A``
    whose scale is tiny next to the rest stays tiny in the ratio. Test such parts
    separately.

    ``f_transpose`` may return a 1-tuple (as ``jax.linear_transpose`` and ``vjp`` do).

    Args:
        f_lin: The linear map ``u -> A u``.
        f_transpose: Its claimed transpose ``v -> A^T v``.
        in_example: A pytree of float arrays shaped like ``u`` (values unused).
        out_example: A pytree of float arrays shaped like ``A u`` (values unused).
        key: The PRNG key ``u``, ``v`` (and the linearity probe) are drawn from.
        linearity_rtol: Relative tolerance of the check ``A(2u - 3w) = 2Au - 3Aw``,
            a float ``> 0``. The check uses the larger of it and 16 times the
            ``finfo(dtype).eps`` of the coarsest float dtype among the examples, so a
            linear map in float16 or bfloat16 is not refused for its rounding. The
            floor weakens the check too: in bfloat16 (16 eps = 0.125) an affine map
            whose offset is small against ``A u`` passes it.

    Returns:
        The relative mismatch above, a Python float.

    Raises:
        ValueError: ``f_lin`` is not linear beyond ``linearity_rtol``, an output's
            structure or shape does not match the examples, or ``linearity_rtol <= 0``.
        TypeError: A map that is not callable, non-float examples, dtype mismatches
            or a bad key.
    """
    _require_callable(f_lin, "f_lin")
    _require_callable(f_transpose, "f_transpose")
    _require_inexact(in_example, "in_example")
    _require_inexact(out_example, "out_example")
    _require_key(key)
    _checks.number(linearity_rtol, "linearity_rtol", above=0, example="1e-4")
    k_u, k_w, k_v = jax.random.split(key, 3)
    u, w = _random_like(k_u, in_example), _random_like(k_w, in_example)
    v = _random_like(k_v, out_example)

    au = f_lin(u)
    _match_tree(au, out_example, "f_lin(u)", "out_example")
    atv = _unwrap_single(f_transpose(v), in_example)
    _match_tree(atv, in_example, "f_transpose(v)", "in_example")

    aw = f_lin(w)
    a_comb = f_lin(_combine(2.0, u, -3.0, w))
    expected = _combine64(2.0, au, -3.0, aw)
    residual = _norm(_combine64(1.0, a_comb, -1.0, expected))
    scale = 2.0 * _norm(au) + 3.0 * _norm(aw)
    scale = max(scale, np.finfo(np.float64).tiny)
    rtol = max(linearity_rtol, _rounding_floor(in_example, out_example))
    if residual > rtol * scale:
        raise ValueError(
            "f_lin is not linear: f_lin(2u - 3w) differs from 2 f_lin(u) - 3 f_lin(w) "
            f"by a relative {residual / scale:.2e} (tolerance {rtol:.1e}). The "
            "dot-product test applies to linear maps only: pass the linearized map "
            "(jax.linearize(f, x)[1]), not f itself."
        )

    lhs, rhs = _pairing(au, v), _pairing(u, atv)
    denom = max(_norm(au) * _norm(v), _norm(u) * _norm(atv), np.finfo(np.float64).tiny)
    return float(abs(lhs - rhs) / denom)


def materialize(
    linear_fn: Callable[[PyTree], PyTree], in_example: PyTree, *, check: bool = True
) -> jax.Array:
    """The dense matrix ``A`` of a linear map, one column per input coordinate.

    Column ``j`` is ``A e_j``, computed for all ``j`` at once by ``vmap`` over the rows
    of the identity. Input and output pytrees are raveled (``ravel_pytree`` order), so
    the result has shape ``(output size, input size)``. Materializing the linearized
    function (``jax.linearize(f, x)[1]``) gives the Jacobian column by column, like
    ``jacfwd``;
    materializing a VJP function over ``out_example`` gives ``A^T``, row by row, like
    ``jacrev``.

    Args:
        linear_fn: The linear map ``u -> A u``, on pytrees.
        in_example: A pytree of float arrays shaped like ``u`` (values unused).
        check: Compare the matrix with ``linear_fn`` on a random vector (skipped under
            ``jit``/``vmap``, where values are abstract), to a relative tolerance of
            the larger of 1e-3 and 16 times the coarsest dtype's ``finfo(dtype).eps``.
            For a complex input the matrix is complex-linear: a map that is linear
            over the reals only (``jnp.conj``, ``jnp.real``, the linearization of a
            non-holomorphic function) has no such matrix and is refused.

    Returns:
        ``A``, shape ``(output size, input size)``.

    Raises:
        ValueError: ``check`` found ``linear_fn`` not linear (e.g. affine), or, for
            a complex input, linear over the reals but not complex-linear.
        TypeError: Non-float inputs or outputs, ``linear_fn`` not callable, or
            ``check`` not a bool.
    """
    _require_callable(linear_fn, "linear_fn")
    _checks.boolean(check, "check")
    _require_inexact(in_example, "in_example")
    flat_in, unravel_in = ravel_pytree(in_example)
    out_shape = jax.eval_shape(linear_fn, in_example)
    _require_inexact(out_shape, "linear_fn's output")

    def flat_apply(e: jax.Array) -> jax.Array:
        return ravel_pytree(linear_fn(unravel_in(e)))[0]

    basis = jnp.eye(flat_in.size, dtype=flat_in.dtype)
    matrix = jax.vmap(flat_apply)(basis).T  # vmap stacks columns as rows
    if check and not compat.is_tracer(matrix):
        rtol = max(1e-3, _rounding_floor(flat_in, matrix))

        def mismatch(u: jax.Array) -> float:
            direct = _as64(flat_apply(u))
            via_matrix = _as64(matrix) @ _as64(u)
            err = float(np.linalg.norm(direct - via_matrix))
            scale = max(
                float(np.linalg.norm(direct)),
                float(np.linalg.norm(via_matrix)),
                np.finfo(np.float64).tiny,
            )
            return err / scale

        u = jax.random.normal(jax.random.key(0), flat_in.shape, flat_in.dtype)
        rel = mismatch(u)
        if rel > rtol and jnp.iscomplexobj(flat_in):
            # A real-linear map agrees with its matrix on real vectors.
            if mismatch(u.real.astype(flat_in.dtype)) <= rtol:
                raise ValueError(
                    "linear_fn is linear over the reals but not complex-linear "
                    "(as jnp.conj, jnp.real or the linearization of a "
                    "non-holomorphic function are): applying it to a random complex "
                    "vector differs from its complex matrix times that vector by a "
                    f"relative {rel:.2e}. No complex matrix represents it: "
                    "materialize it on real and imaginary parts instead, e.g. "
                    "materialize(lambda p: linear_fn(p[0] + 1j * p[1]), "
                    "(x.real, x.imag))."
                )
        if rel > rtol:
            raise ValueError(
                "linear_fn is not linear: applying it to a random vector differs from "
                "its materialized matrix times that vector by a relative "
                f"{rel:.2e} (tolerance {rtol:.1e})."
                " materialize() needs a linear map, e.g. jax.linearize(f, x)[1], not f "
                "itself."
            )
    return matrix


def grad_tracer_name(use_direct_linearize: bool | None = None) -> str:
    """The class name of the tracer that ``jax.grad`` passes to the function.

    ``use_direct_linearize=None`` uses JAX's current setting. ``True``/``False`` sets
    the ``jax_use_direct_linearize`` option for this one call and restores it (through
    :func:`beyondgrad.compat.set_direct_linearize`, which raises ``ValueError`` where
    JAX has no such option). JAX 0.8.2 obeys ``False`` (``"JVPTracer"``); 0.12 ignores
    it (``"LinearizeTracer"`` either way).

    Args:
        use_direct_linearize: ``None`` (the default): JAX's current setting;
            ``True``/``False``: the ``jax_use_direct_linearize`` option for this call.

    Returns:
        The tracer's class name, e.g. ``"LinearizeTracer"`` or ``"JVPTracer"``.

    Raises:
        TypeError: ``use_direct_linearize`` is not ``None``, ``True`` or ``False``.
        ValueError: a bool is given and this JAX has no ``jax_use_direct_linearize``
            option.
    """
    _checks.boolean(use_direct_linearize, "use_direct_linearize", none_ok=True)
    seen: list[str] = []

    def f(x: jax.Array) -> jax.Array:
        seen.append(type(x).__name__)
        return jnp.sin(x)

    if use_direct_linearize is None:
        jax.grad(f)(1.0)
        return seen[0]
    before = compat.set_direct_linearize(use_direct_linearize)
    try:
        jax.grad(f)(1.0)
    finally:
        compat.set_direct_linearize(before)
    return seen[0]


# Where a residual was made, as print_saved_residuals writes it: " from FILE:LINE[:COL]
# (FUNCTION)". Only the function name is kept; notebook file names are long and change.
_SOURCE = re.compile(r" from \S+:\d+(?::\d+)? \((?P<fn>[^)]*)\)$")


def saved_residuals(f: Callable[..., Any], *args: PyTree) -> list[str]:
    """What reverse mode saves from ``f(*args)`` for the backward pass, one line each.

    The lines of ``jax.ad_checkpoint.print_saved_residuals(f, *args)`` (shape, then
    ``from the argument x``, ``output of sin``, ``named 'h'``, ...), with each source
    location shortened to ``in FUNCTION``. Wrap ``f`` (or a part of it) in
    ``jax.checkpoint(..., policy=...)`` to see what a policy keeps.

    Args:
        f: The function reverse mode differentiates.
        *args: Its arguments (pytrees of arrays).

    Returns:
        One string per saved residual: its shape and dtype, then where it comes from.

    Raises:
        TypeError: ``f`` is not callable.
    """
    _require_callable(f, "f")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(f, *args)
    return [_SOURCE.sub(r" in \g<fn>", line) for line in out.getvalue().splitlines()]
