"""Differentiate through solvers by the implicit function theorem (Chapter 3).

A solver returns :math:`x^\\star(\\theta)` with :math:`F(x^\\star, \\theta) = 0`. When
:math:`\\partial F/\\partial x` is invertible at the root, the implicit function theorem
gives the derivative without looking at the solver's iterations:

.. math::

    \\frac{\\partial x^\\star}{\\partial \\theta}
      = -\\Big(\\frac{\\partial F}{\\partial x}\\Big)^{-1}
        \\frac{\\partial F}{\\partial \\theta}.

:func:`fixed_point` (``F(x) = f(x, θ) - x``), :func:`anderson_fixed_point` (same
``F``, a faster solver) and :func:`newton_root` (``F = f``) wrap
:func:`jax.lax.custom_root`, so their iterations run in a ``lax.while_loop`` that is
never differentiated; derivatives reach only what ``f`` sees (``params``), never
``x0``. :func:`unrolled_fixed_point` has the same signature but differentiates through
every iteration (a ``lax.scan``), for comparison. All return ``(x_star, SolverInfo)``;
the diagnostics ride along as ``custom_root``'s ``aux`` and carry no derivative.

The worked examples of the chapter (a deep-equilibrium layer, ridge regression) are
here too, with closed forms that check the implicit derivatives independently.
Exercise checkers live in :mod:`beyondgrad.exercises.ch3`, figures and measurements in
:mod:`beyondgrad.figures.ch3`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.scipy.sparse.linalg import cg, gmres

from beyondgrad import compat

__all__ = [
    "SolverError",
    "SolverInfo",
    "TangentSolver",
    "anderson_fixed_point",
    "deq_layer",
    "deq_params",
    "deq_reference_grad_W",
    "dense_tangent_solve",
    "fixed_point",
    "iterative_tangent_solve",
    "newton_root",
    "ridge_closed_form",
    "ridge_normal_equations",
    "unrolled_fixed_point",
]

#: A pytree of arrays (nested tuples, lists, dicts of ``jax.Array``).
PyTree: TypeAlias = Any
#: A linear map ``g`` on pytrees, as ``custom_root`` hands it to a tangent solver.
LinearMap: TypeAlias = Callable[[PyTree], PyTree]
#: ``"dense"``, ``"gmres"``, ``"cg"``, or a function ``(g, y) -> x`` with ``g(x) = y``.
TangentSolver: TypeAlias = (
    Literal["dense", "gmres", "cg"] | Callable[[LinearMap, PyTree], PyTree]
)
_TANGENT_SOLVERS = ("dense", "gmres", "cg")


class SolverInfo(NamedTuple):
    """Diagnostics of one solve (a pytree, so it works under ``jit``/``vmap``).

    ``iterations``: solver steps taken (int32); ``residual``: the 2-norm of ``F`` at the
    returned point, over all leaves; ``converged``: ``residual <= tol``. A solve that
    stops at ``max_iter`` reports ``converged == False`` instead of failing silently.
    """

    iterations: jax.Array
    residual: jax.Array
    converged: jax.Array


class SolverError(RuntimeError):
    """A solve that did not converge, raised when ``throw=True`` (the default).

    Outside ``jit``/``vmap`` it is raised as is. Inside a traced function the check runs
    on the host through ``jax.debug.callback``, so the caller sees the runtime error of
    the backend (``jax.errors.JaxRuntimeError``, also a ``RuntimeError``) whose message
    quotes this one. Pass ``throw=False`` to get ``(x, SolverInfo)`` back instead.
    """


# --------------------------------------------------------------------------- validation


def _tree_norm(tree: PyTree) -> jax.Array:
    """Euclidean norm of all leaves of ``tree`` taken together."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.abs(leaf) ** 2) for leaf in leaves))


def _is_array_tol(tol: object) -> bool:
    """A 0-d floating JAX/NumPy array (a traced tolerance is fine)."""
    return (
        isinstance(tol, (jax.Array, np.ndarray, np.floating))
        and jnp.ndim(tol) == 0
        and jnp.issubdtype(jnp.result_type(tol), jnp.floating)
    )


def _is_int(value: object) -> TypeGuard[int]:
    """A Python int (``bool`` excluded: ``True`` is no iteration count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> TypeGuard[float]:
    """A Python int or float (``bool`` excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _static_zero(tol: object) -> bool:
    """``tol`` is the Python number 0: run a fixed trip count without checks."""
    return isinstance(tol, (int, float)) and tol == 0


def _check_args(
    name: str,
    f: object,
    x0: PyTree,
    params: PyTree,
    tol: object,
    max_iter: object,
    tangent_solver: object,
) -> None:
    """Validate a solver call; raise TypeError/ValueError that say what to pass instead."""
    if not callable(f):
        raise TypeError(
            f"{name}: f must be a function f(x, params), got {type(f).__name__}"
        )
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(
            f"{name}: x0 must be a pytree with at least one array leaf, got {x0!r}"
        )
    for leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name}: every leaf of x0 must be a floating-point array (the root is real-valued), "
                f"got dtype {dtype}; pass e.g. jnp.asarray(x0, jnp.float32)"
            )
    if _is_array_tol(tol):
        pass  # a 0-d float array, possibly traced: one compilation for every tol
    elif not _is_real(tol) or not math.isfinite(tol) or tol < 0:
        raise ValueError(
            f"{name}: tol must be a finite Python float >= 0 (0 means: always run "
            f"max_iter steps) or a 0-d float array, got {tol!r}"
        )
    if not _is_int(max_iter) or max_iter < 1:
        raise ValueError(
            f"{name}: max_iter must be a Python int >= 1, got {max_iter!r}"
        )
    if not (callable(tangent_solver) or tangent_solver in _TANGENT_SOLVERS):
        raise ValueError(
            f"{name}: tangent_solver must be one of {_TANGENT_SOLVERS} or a function (g, y) -> x solving g(x) = y, "
            f"got {tangent_solver!r}"
        )
    out = jax.eval_shape(f, x0, params)
    in_def: Any = jax.tree_util.tree_structure(x0)  # PyTreeDef: untyped in jaxlib
    out_def: Any = jax.tree_util.tree_structure(out)
    if in_def != out_def:
        raise TypeError(
            f"{name}: f(x, params) must return a pytree with the same structure as x; "
            f"x0 has structure {in_def} but f returned {out_def}"
        )
    for path_leaf, o in zip(
        jax.tree_util.tree_flatten_with_path(x0)[0], jax.tree_util.tree_leaves(out)
    ):
        path, leaf = path_leaf
        shape, dtype = jnp.shape(leaf), jnp.result_type(leaf)
        if o.shape != shape or o.dtype != dtype:
            raise TypeError(
                f"{name}: f(x, params) must return leaves shaped like x; at x{jax.tree_util.keystr(path)} "
                f"x0 has {dtype}{list(shape)} but f returned {o.dtype}{list(o.shape)}"
            )


def _check_throw(name: str, throw: object) -> None:
    if not isinstance(throw, bool):
        raise TypeError(
            f"{name}: throw must be True (raise SolverError when the solve does not "
            f"converge) or False (return the state), got {throw!r}"
        )


def _nonfinite_leaves(label: str, tree: PyTree) -> list[str]:
    """Paths of the concrete floating leaves of ``tree`` that hold a NaN or an inf."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if compat.is_tracer(leaf):
            continue
        try:
            arr = np.asarray(leaf)
        except Exception:  # not an array: nothing to say about it
            continue
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            bad.append(f"{label}{jax.tree_util.keystr(path)}")
    return bad


def _failure_message(
    name: str,
    converged: np.ndarray,
    iterations: np.ndarray,
    residual: np.ndarray,
    tol: np.ndarray,
    max_iter: int,
    culprits: list[str],
) -> str:
    """Why a solve failed, in words: the residual against ``tol``, and what to do.

    ``tol`` is NaN for a fixed trip count (``tol=0``): then only a non-finite residual
    fails.
    """
    converged, iterations = np.asarray(converged), np.asarray(iterations)
    residual, tol_value = np.asarray(residual), float(np.max(np.asarray(tol)))
    failed = ~converged
    count = f"{int(failed.sum())} of {failed.size} solves" if failed.size > 1 else ""
    worst = residual[failed]
    finite = np.isfinite(worst)
    target = (
        "a finite residual"
        if math.isnan(tol_value)
        else f"a residual <= tol = {tol_value:.3g}"
    )
    if not np.all(finite):
        where = (
            f"not finite: {', '.join(culprits)}"
            if culprits
            else "a NaN or inf in x0 or params, or f overflowed"
        )
        what = (
            f"{name} did not converge{': ' + count if count else ''}: the residual is "
            f"{worst[~finite].flat[0]} ({where}), expected {target}"
        )
    else:
        what = (
            f"{name} did not converge{': ' + count if count else ''}: residual "
            f"{float(worst.max()):.3g} after {int(iterations[failed].max())} steps "
            f"(max_iter={max_iter}), expected {target}; raise max_iter or tol"
        )
    return (
        what + ", or pass throw=False to get (x, SolverInfo) back and read "
        "info.converged"
    )


def _raise_unless_converged(
    name: str,
    info: SolverInfo,
    tol: float | jax.Array,
    max_iter: int,
    throw: bool,
    inputs: tuple[tuple[str, PyTree], ...],
) -> None:
    """Raise :class:`SolverError` when ``throw`` and the solve failed.

    With ``tol == 0`` (a fixed trip count) only a non-finite residual is a failure.
    Concrete diagnostics are checked here; traced ones on the host, by a
    ``jax.debug.callback`` that runs when the compiled function runs.
    """
    if not throw:
        return
    fixed = _static_zero(tol)
    ok = jnp.isfinite(info.residual) if fixed else info.converged
    tol_arr = jnp.asarray(jnp.nan if fixed else tol, jnp.float32)
    diagnostics = (ok, info.iterations, info.residual, tol_arr)
    if not any(compat.is_tracer(v) for v in diagnostics):
        if bool(np.all(np.asarray(ok))):
            return
        culprits = [c for label, tree in inputs for c in _nonfinite_leaves(label, tree)]
        raise SolverError(
            _failure_message(name, *map(np.asarray, diagnostics), max_iter, culprits)
        )

    def host(
        ok: np.ndarray, iterations: np.ndarray, residual: np.ndarray, tol: np.ndarray
    ) -> None:
        if not np.all(ok):
            raise SolverError(
                _failure_message(name, ok, iterations, residual, tol, max_iter, [])
            )

    jax.debug.callback(host, *diagnostics)


# ------------------------------------------------------------------------ tangent solves


def _default_tangent_tol(x: PyTree) -> float:
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(x))
    return 1e-12 if jnp.finfo(dtype).bits >= 64 else 1e-6


def dense_tangent_solve(g: Callable[[PyTree], PyTree], y: PyTree) -> PyTree:
    """Solve the linear system ``g(x) = y`` by building ``g``'s matrix and ``jnp.linalg.solve``.

    ``g`` is linear, so its Jacobian (built with ``jax.jacfwd`` on the flattened vector) is
    its matrix. Cost: ``n`` JVPs plus an ``O(n^3)`` solve, for ``n`` unknowns: small
    problems only.
    """
    if not callable(g):
        raise TypeError(
            f"dense_tangent_solve: g must be the linear function x -> A x, got "
            f"{type(g).__name__}"
        )
    y_flat, unravel = ravel_pytree(y)

    def g_flat(v: jax.Array) -> jax.Array:
        return ravel_pytree(g(unravel(v)))[0]

    matrix = jax.jacfwd(g_flat)(jnp.zeros_like(y_flat))
    return unravel(jnp.linalg.solve(matrix, y_flat))


def iterative_tangent_solve(
    method: Literal["gmres", "cg"], tol: float
) -> Callable[[LinearMap, PyTree], PyTree]:
    """A tangent solver that never builds a matrix: GMRES or CG inside ``lax.custom_linear_solve``.

    ``custom_linear_solve`` tells JAX that the result is ``A^{-1} y`` and how to solve
    with ``A^T``, so reverse mode transposes the solve as a whole. Calling JAX's
    ``gmres``/``cg`` directly on the tangent ``y`` fails under reverse mode
    (jax-ml/jax#5309): they compute their initial guess and stopping tolerances from
    ``y`` (``atol = max(tol * |y|, atol)``) before their own ``custom_linear_solve``,
    so its ``solve`` closes over values that depend on the linear input, which the
    transpose rule rejects (``NotImplementedError``). Wrapped here, ``y`` is only the
    outer right-hand side and the inner solver runs on known cotangents. ``cg`` needs
    a symmetric positive-definite ``A`` (e.g. a Hessian); ``gmres`` takes any
    invertible ``A``.
    """
    if method not in ("gmres", "cg"):
        raise ValueError(f"method must be 'gmres' or 'cg', got {method!r}")
    if not _is_real(tol) or not 0 < tol < 1:
        raise ValueError(
            f"tol must be a relative tolerance, a float in (0, 1), got {tol!r}"
        )

    def inner(matvec: LinearMap, b: PyTree) -> PyTree:
        if method == "cg":
            return cg(matvec, b, tol=tol, atol=0.0)[0]
        return gmres(matvec, b, tol=tol, atol=0.0, solve_method="batched")[0]

    def solve(g: Callable[[PyTree], PyTree], y: PyTree) -> PyTree:
        return lax.custom_linear_solve(
            g, y, solve=inner, transpose_solve=inner, symmetric=(method == "cg")
        )

    return solve


def _tangent(
    tangent_solver: TangentSolver, x0: PyTree
) -> Callable[[LinearMap, PyTree], PyTree]:
    if callable(tangent_solver):
        return tangent_solver
    if tangent_solver == "dense":
        return dense_tangent_solve
    return iterative_tangent_solve(tangent_solver, _default_tangent_tol(x0))


# -------------------------------------------------------------------------------- solvers


def _iterate(
    step: Callable[[PyTree, PyTree], PyTree],
    residual: Callable[[PyTree], PyTree],
    x0: PyTree,
    tol: float | jax.Array,
    max_iter: int,
) -> tuple[PyTree, SolverInfo]:
    """Apply ``x <- step(x, residual(x))`` until ``||residual(x)|| <= tol`` or ``max_iter`` steps.

    One ``residual`` evaluation per step: the loop carries it. ``tol == 0`` runs exactly
    ``max_iter`` steps with a static trip count (no norm per step); otherwise a
    ``while_loop`` checks the norm before every step.
    """
    if _static_zero(tol):
        x = lax.fori_loop(0, max_iter, lambda _, x: step(x, residual(x)), x0)
        res = _tree_norm(residual(x))
        return x, SolverInfo(jnp.asarray(max_iter, jnp.int32), res, res <= tol)

    def cond(carry):
        _, _, res, k = carry
        return (k < max_iter) & (res > tol)

    def body(carry):
        x, r, _, k = carry
        x = step(x, r)
        r = residual(x)
        return x, r, _tree_norm(r), k + 1

    r0 = residual(x0)
    x, _, res, k = lax.while_loop(
        cond, body, (x0, r0, _tree_norm(r0), jnp.asarray(0, jnp.int32))
    )
    return x, SolverInfo(k, res, res <= tol)


def _fixed_point_residual(
    f: Callable[[PyTree, PyTree], PyTree], params: PyTree
) -> Callable[[PyTree], PyTree]:
    """``F(x) = f(x, params) - x`` (leaf by leaf): zero exactly at a fixed point of ``f``."""

    def residual(x: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda a, b: a - b, f(x, params), x)

    return residual


def _custom_root_with_info(
    root_fn: LinearMap,
    x0: PyTree,
    solve: Callable[[LinearMap, PyTree], tuple[PyTree, SolverInfo]],
    tangent_solver: TangentSolver,
    tol: float | jax.Array,
) -> tuple[PyTree, SolverInfo]:
    """``lax.custom_root(..., has_aux=True)`` with :class:`SolverInfo` as the aux, and
    the tangent solve that :func:`_tangent` makes of ``tangent_solver``.

    The aux is the iteration count (int32) and the residual; ``converged`` is rebuilt
    after. :func:`beyondgrad.compat.custom_root_with_aux` handles the JAX versions
    whose ``custom_root`` cannot differentiate with an integer aux.
    """

    def solve_counts(g: LinearMap, x: PyTree) -> tuple[PyTree, tuple[jax.Array, ...]]:
        root, info = solve(g, x)
        return root, (info.iterations.astype(jnp.int32), info.residual)

    root, (iterations, residual) = compat.custom_root_with_aux(
        root_fn, x0, solve_counts, _tangent(tangent_solver, x0)
    )
    return root, SolverInfo(iterations, residual, residual <= tol)


def fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tol: float | jax.Array = 1e-6,
    max_iter: int = 1000,
    tangent_solver: TangentSolver = "dense",
    throw: bool = True,
) -> tuple[PyTree, SolverInfo]:
    """The fixed point ``x* = f(x*, params)``, differentiable w.r.t. ``params`` implicitly.

    Solve: iterate ``x <- f(x, params)`` from ``x0`` in a ``while_loop`` until
    ``||f(x) - x||_2 <= tol`` (norm over all leaves) or ``max_iter`` steps. ``tol`` is
    a Python float, or a 0-d float array (then it may be traced: one ``jit``
    compilation serves every tolerance).
    Derivative (``custom_root`` on ``F(x) = f(x, params) - x``):
    ``dx* = (I - ∂f/∂x)^{-1} ∂f/∂params · dparams``, one linear solve with
    ``tangent_solver`` ("dense", "gmres", "cg" or ``(g, y) -> x`` with ``g(x) = y``).
    Forward and reverse mode, ``jit`` and ``vmap`` all work; the derivative w.r.t. ``x0``
    is zero. Returns ``(x_star, SolverInfo)``; check ``info.converged``: the implicit
    derivative is only right at a root.
    """
    _check_args("fixed_point", f, x0, params, tol, max_iter, tangent_solver)
    _check_throw("fixed_point", throw)

    root_fn = _fixed_point_residual(f, params)

    def solve(g: Callable[[PyTree], PyTree], x: PyTree) -> tuple[PyTree, SolverInfo]:
        # x + g(x) == f(x, params): the solve only sees the root function.
        return _iterate(
            lambda z, r: jax.tree_util.tree_map(jnp.add, z, r), g, x, tol, max_iter
        )

    x, info = _custom_root_with_info(root_fn, x0, solve, tangent_solver, tol)
    _raise_unless_converged(
        "fixed_point", info, tol, max_iter, throw, (("x0", x0), ("params", params))
    )
    return x, info


def newton_root(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tangent_solver: TangentSolver = "dense",
    tol: float | jax.Array = 1e-6,
    max_iter: int = 50,
    throw: bool = True,
) -> tuple[PyTree, SolverInfo]:
    """A root ``f(x*, params) = 0`` by Newton's method, differentiable w.r.t. ``params``.

    Solve: ``x <- x - J(x)^{-1} f(x, params)`` with ``J = ∂f/∂x`` built densely (so ``x``
    should have at most a few thousand entries), until ``||f(x)||_2 <= tol`` or
    ``max_iter`` steps. Derivative: ``dx* = -(∂f/∂x)^{-1} ∂f/∂params · dparams`` via
    ``custom_root`` and ``tangent_solver``. Returns ``(x_star, SolverInfo)``.
    """
    _check_args("newton_root", f, x0, params, tol, max_iter, tangent_solver)
    _check_throw("newton_root", throw)

    def root_fn(x: PyTree) -> PyTree:
        return f(x, params)

    def solve(g: Callable[[PyTree], PyTree], x: PyTree) -> tuple[PyTree, SolverInfo]:
        _, unravel = ravel_pytree(x)

        def g_flat(v: jax.Array) -> jax.Array:
            return ravel_pytree(g(unravel(v)))[0]

        def step(z: PyTree, r: PyTree) -> PyTree:
            v = ravel_pytree(z)[0]
            return unravel(
                v - jnp.linalg.solve(jax.jacfwd(g_flat)(v), ravel_pytree(r)[0])
            )

        return _iterate(step, g, x, tol, max_iter)

    x, info = _custom_root_with_info(root_fn, x0, solve, tangent_solver, tol)
    _raise_unless_converged(
        "newton_root", info, tol, max_iter, throw, (("x0", x0), ("params", params))
    )
    return x, info


def anderson_fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    memory: int = 5,
    regularization: float = 1e-10,
    tol: float | jax.Array = 1e-6,
    max_iter: int = 1000,
    tangent_solver: TangentSolver = "dense",
    throw: bool = True,
) -> tuple[PyTree, SolverInfo]:
    """The fixed point of :func:`fixed_point` by Anderson acceleration; same implicit derivative.

    Keeps the last ``m = memory`` iterates ``x_i`` and their images ``f(x_i)``; with
    residuals ``r_i = f(x_i) - x_i`` it picks weights ``α`` minimising ``||Σ α_i r_i||``
    subject to ``Σ α_i = 1`` (a regularised ``(m+1)``-sized solve) and steps to
    ``x <- Σ α_i f(x_i)``. Stops when ``||f(x) - x||_2 <= tol`` or after ``max_iter``
    evaluations of ``f``. Only the solver differs from :func:`fixed_point`: the derivative
    is the same ``custom_root`` rule on ``F(x) = f(x, params) - x``.
    """
    _check_args("anderson_fixed_point", f, x0, params, tol, max_iter, tangent_solver)
    _check_throw("anderson_fixed_point", throw)
    if not _is_int(memory) or memory < 2:
        raise ValueError(
            f"anderson_fixed_point: memory must be an int >= 2, got {memory!r}"
        )
    if not _is_real(regularization) or not regularization >= 0:
        raise ValueError(
            "anderson_fixed_point: regularization must be a float >= 0, "
            f"got {regularization!r}"
        )

    root_fn = _fixed_point_residual(f, params)

    def solve(g: Callable[[PyTree], PyTree], x: PyTree) -> tuple[PyTree, SolverInfo]:
        v0, unravel = ravel_pytree(x)

        def fmap(v: jax.Array) -> jax.Array:  # f(x) = x + F(x)
            return v + ravel_pytree(g(unravel(v)))[0]

        m, n = memory, v0.shape[0]
        xs = jnp.zeros((m, n), v0.dtype).at[0].set(v0)
        gs = jnp.zeros((m, n), v0.dtype).at[0].set(fmap(v0))
        res0 = jnp.linalg.norm(gs[0] - xs[0])

        def cond(carry):
            _, _, k, res = carry
            return (k < max_iter) & (res > tol)

        def body(carry):
            xs, gs, k, _ = carry
            valid = jnp.arange(m) < jnp.minimum(k, m)
            r = jnp.where(valid[:, None], gs - xs, 0.0)
            h = r @ r.T
            scale = jnp.max(jnp.diagonal(h)) + jnp.finfo(v0.dtype).tiny
            both = valid[:, None] & valid[None, :]
            h = jnp.where(both, h, 0.0) + jnp.diag(
                jnp.where(valid, regularization * scale, 1.0)
            )
            alpha = jnp.linalg.solve(h, valid.astype(v0.dtype))
            alpha = alpha / jnp.sum(alpha)
            x_new = alpha @ gs
            g_new = fmap(x_new)
            slot = k % m
            return (
                xs.at[slot].set(x_new),
                gs.at[slot].set(g_new),
                k + 1,
                jnp.linalg.norm(g_new - x_new),
            )

        xs, gs, k, res = lax.while_loop(
            cond, body, (xs, gs, jnp.asarray(1, jnp.int32), res0)
        )
        return unravel(xs[(k - 1) % m]), SolverInfo(k, res, res <= tol)

    x, info = _custom_root_with_info(root_fn, x0, solve, tangent_solver, tol)
    _raise_unless_converged(
        "anderson_fixed_point",
        info,
        tol,
        max_iter,
        throw,
        (("x0", x0), ("params", params)),
    )
    return x, info


def unrolled_fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tangent_solver: None = None,
    tol: float | jax.Array = 1e-6,
    max_iter: int = 1000,
    throw: bool = True,
) -> tuple[PyTree, SolverInfo]:
    """Same maths and signature as :func:`fixed_point`, differentiated through the iterations.

    Runs ``max_iter`` steps in a ``lax.scan`` (reverse mode stores every iterate: memory
    grows linearly with ``max_iter``). With ``tol > 0`` the iterate freezes once
    ``||f(x) - x|| <= tol`` (later steps are no-ops), so it returns the same point as
    :func:`fixed_point`. There is no tangent solve to choose: passing
    ``tangent_solver`` raises ``TypeError`` (use :func:`fixed_point` for that).
    The diagnostics carry no derivative.
    """
    if tangent_solver is not None:
        raise TypeError(
            "unrolled_fixed_point differentiates through its iterations and solves no "
            f"linear system, so tangent_solver={tangent_solver!r} would be ignored: "
            "drop it, or use fixed_point(..., tangent_solver=...) for an implicit "
            "derivative"
        )
    _check_args("unrolled_fixed_point", f, x0, params, tol, max_iter, "dense")
    _check_throw("unrolled_fixed_point", throw)
    inputs = (("x0", x0), ("params", params))

    def residual(x: PyTree) -> jax.Array:
        return _tree_norm(_fixed_point_residual(f, params)(x))

    if _static_zero(tol):
        x, _ = lax.scan(lambda x, _: (f(x, params), None), x0, None, length=max_iter)
        res = lax.stop_gradient(residual(x))
        info = SolverInfo(jnp.asarray(max_iter, jnp.int32), res, res <= tol)
        _raise_unless_converged(
            "unrolled_fixed_point", info, tol, max_iter, throw, inputs
        )
        return x, info

    def body(carry, _):
        x, k = carry
        fx = f(x, params)
        done = (
            lax.stop_gradient(
                _tree_norm(jax.tree_util.tree_map(lambda a, b: a - b, fx, x))
            )
            <= tol
        )
        x = jax.tree_util.tree_map(lambda old, new: jnp.where(done, old, new), x, fx)
        return (x, k + jnp.where(done, 0, 1).astype(jnp.int32)), None

    (x, k), _ = lax.scan(body, (x0, jnp.asarray(0, jnp.int32)), None, length=max_iter)
    res = lax.stop_gradient(residual(x))
    info = SolverInfo(k, res, res <= tol)
    _raise_unless_converged("unrolled_fixed_point", info, tol, max_iter, throw, inputs)
    return x, info


# ---------------------------------------------------------------------- worked examples


def _check_deq(params: Any, z: Any, name: str, what: str) -> None:
    if not isinstance(params, dict) or not {"W", "U", "b", "x"} <= set(params):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise TypeError(
            f"{name}: params must be a dict with keys W, U, b, x (from deq_params), "
            f"got {got}"
        )
    d = jnp.shape(params["W"])[0] if jnp.ndim(params["W"]) == 2 else None
    if d is None or jnp.shape(z) != (d,):
        raise ValueError(
            f"{name}: {what} must have shape ({d},) to match W of shape "
            f"{jnp.shape(params['W'])}, got {jnp.shape(z)}"
        )


def deq_layer(z: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """One step of a deep-equilibrium layer: ``tanh(W z + U x + b)``.

    ``params`` is a dict with ``W`` (d, d), ``U`` (d, d_in), ``b`` (d,), ``x`` (d_in,),
    as :func:`deq_params` makes; ``z`` has shape (d,).
    """
    _check_deq(params, z, "deq_layer", "z")
    return jnp.tanh(params["W"] @ z + params["U"] @ params["x"] + params["b"])


def deq_params(
    key: jax.Array,
    d: int = 64,
    d_in: int = 16,
    radius: float = 0.9,
    input_scale: float = 1.0,
    dtype: Any = jnp.float32,
) -> dict[str, jax.Array]:
    """Parameters for :func:`deq_layer` whose fixed-point map is contractive by construction.

    ``W = radius * Q`` with ``Q`` a random orthogonal matrix, so every singular value
    and every eigenvalue of ``W`` has modulus ``radius < 1``. Since
    ``|tanh'| <= 1``, ``||∂f/∂z||_2 <= radius``, so the iteration converges from any start
    with error ``<= radius^k`` times the first step's (Banach), and ``I - ∂f/∂z`` is
    invertible: the implicit derivative exists. A small ``input_scale`` (the size of
    ``U x``) keeps ``tanh`` near its linear regime, where the contraction factor is close
    to ``radius`` and plain iteration is slow.
    """
    for name, value in (("d", d), ("d_in", d_in)):
        if not _is_int(value) or value < 1:
            raise TypeError(
                f"deq_params: {name} must be a Python int >= 1 (a size), got {value!r}"
            )
    if not _is_real(radius) or not 0 < radius < 1:
        raise ValueError(
            f"deq_params: radius must be a float in (0, 1) for a contraction, "
            f"got {radius!r}"
        )
    if not _is_real(input_scale):
        raise TypeError(f"deq_params: input_scale must be a float, got {input_scale!r}")
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"deq_params: dtype must be a floating dtype, got {dtype!r}")
    if not isinstance(key, jax.Array):
        raise TypeError(
            "deq_params: key must be a PRNG key array, e.g. jax.random.key(0), "
            f"got {type(key).__name__}"
        )
    kw, ku, kb, kx = jax.random.split(key, 4)
    q, r = jnp.linalg.qr(jax.random.normal(kw, (d, d), dtype))
    w = radius * q * jnp.sign(jnp.diagonal(r))[None, :]
    return {
        "W": w,
        "U": input_scale * jax.random.normal(ku, (d, d_in), dtype) / math.sqrt(d_in),
        "b": 0.1 * input_scale * jax.random.normal(kb, (d,), dtype),
        "x": jax.random.normal(kx, (d_in,), dtype),
    }


def deq_reference_grad_W(
    params: dict[str, jax.Array], z_star: jax.Array, cotangent: jax.Array
) -> jax.Array:
    """Closed-form ``∂(c·z*)/∂W`` for ``z* = tanh(W z* + U x + b)``.

    With ``D = diag(1 - z*^2)``: ``u = (I - D W)^{-T} c`` and the gradient is
    ``(D u) z*^T``. Independent of ``custom_root``: used to check it.
    """
    _check_deq(params, z_star, "deq_reference_grad_W", "z_star")
    _check_deq(params, cotangent, "deq_reference_grad_W", "cotangent")
    d = 1.0 - z_star**2
    a = jnp.eye(z_star.shape[0], dtype=z_star.dtype) - d[:, None] * params["W"]
    u = jnp.linalg.solve(a.T, cotangent)
    return jnp.outer(d * u, z_star)


def _check_ridge(X: Any, y: Any, w: Any) -> None:
    if jnp.ndim(X) != 2:
        raise ValueError(
            f"X must be a (samples, features) matrix, got shape {jnp.shape(X)}"
        )
    n, p = jnp.shape(X)
    if jnp.shape(y) != (n,):
        raise ValueError(
            f"y must have shape ({n},) to match X {(n, p)}, got {jnp.shape(y)}"
        )
    if w is not None and jnp.shape(w) != (p,):
        raise ValueError(
            f"w must have shape ({p},) to match X {(n, p)}, got {jnp.shape(w)}"
        )


def ridge_normal_equations(
    w: jax.Array, lam: jax.Array, X: jax.Array, y: jax.Array
) -> jax.Array:
    """Gradient of ``0.5||Xw - y||^2 + 0.5 lam ||w||^2``; its root is the ridge solution."""
    _check_ridge(X, y, w)
    return X.T @ (X @ w - y) + lam * w


def ridge_closed_form(
    lam: jax.Array, X: jax.Array, y: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``w*(lam) = (X^T X + lam I)^{-1} X^T y`` and ``dw*/dlam = -(X^T X + lam I)^{-1} w*``."""
    _check_ridge(X, y, None)
    a = X.T @ X + lam * jnp.eye(X.shape[1], dtype=X.dtype)
    w = jnp.linalg.solve(a, X.T @ y)
    return w, -jnp.linalg.solve(a, w)
