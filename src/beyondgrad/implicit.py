"""Differentiate through solvers by the implicit function theorem (Chapter 3).

A solver returns :math:`x^\\star(\\theta)` with :math:`F(x^\\star, \\theta) = 0`. When
:math:`\\partial F/\\partial x` is invertible at the root, the implicit function theorem
gives the derivative without looking at the solver's iterations:

.. math::

    \\frac{\\partial x^\\star}{\\partial \\theta}
      = -\\Big(\\frac{\\partial F}{\\partial x}\\Big)^{-1} \\frac{\\partial F}{\\partial \\theta}.

:func:`fixed_point` (``F(x) = f(x, θ) - x``) and :func:`newton_root` (``F = f``) wrap
:func:`jax.lax.custom_root`, so their iterations run in a ``lax.while_loop`` that is
never differentiated. :func:`unrolled_fixed_point` has the same signature but
differentiates through every iteration (a ``lax.scan``), for comparison. All three return
``(x_star, SolverInfo)``; the diagnostics ride along as ``custom_root``'s ``aux`` and
carry no derivative.

The module also holds the chapter's worked examples (deep-equilibrium layer, ridge
regression), the tolerance widget's callback and the exercise checkers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.scipy.sparse.linalg import cg, gmres

from beyondgrad.exercises import (
    Feedback,
    call_answer,
    check_allclose,
    failed,
    tree_mismatches,
    verdict,
)

PyTree = Any
TangentSolver = Literal["dense", "gmres", "cg"] | Callable[[Callable[[PyTree], PyTree], PyTree], PyTree]
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


# --------------------------------------------------------------------------- validation


def _tree_norm(tree: PyTree) -> jax.Array:
    """Euclidean norm of all leaves of ``tree`` taken together."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.abs(leaf) ** 2) for leaf in leaves))


def _check_args(name: str, f: Any, x0: PyTree, params: PyTree, tol: Any, max_iter: Any, tangent_solver: Any) -> None:
    """Validate a solver call; raise TypeError/ValueError that say what to pass instead."""
    if not callable(f):
        raise TypeError(f"{name}: f must be a function f(x, params), got {type(f).__name__}")
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(f"{name}: x0 must be a pytree with at least one array leaf, got {x0!r}")
    for leaf in leaves:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise TypeError(
                f"{name}: every leaf of x0 must be a floating-point array (the root is real-valued), "
                f"got dtype {dtype}; pass e.g. jnp.asarray(x0, jnp.float32)"
            )
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"{name}: tol must be a finite Python float >= 0 (0 means: always run max_iter steps), got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"{name}: max_iter must be a Python int >= 1, got {max_iter!r}")
    if not (callable(tangent_solver) or tangent_solver in _TANGENT_SOLVERS):
        raise ValueError(
            f"{name}: tangent_solver must be one of {_TANGENT_SOLVERS} or a function (g, y) -> x solving g(x) = y, "
            f"got {tangent_solver!r}"
        )
    out = jax.eval_shape(f, x0, params)
    in_def, out_def = jax.tree_util.tree_structure(x0), jax.tree_util.tree_structure(out)
    if in_def != out_def:
        raise TypeError(
            f"{name}: f(x, params) must return a pytree with the same structure as x; "
            f"x0 has structure {in_def} but f returned {out_def}"
        )
    for path_leaf, o in zip(jax.tree_util.tree_flatten_with_path(x0)[0], jax.tree_util.tree_leaves(out)):
        path, leaf = path_leaf
        shape, dtype = jnp.shape(leaf), jnp.result_type(leaf)
        if o.shape != shape or o.dtype != dtype:
            raise TypeError(
                f"{name}: f(x, params) must return leaves shaped like x; at x{jax.tree_util.keystr(path)} "
                f"x0 has {dtype}{list(shape)} but f returned {o.dtype}{list(o.shape)}"
            )


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
    y_flat, unravel = ravel_pytree(y)

    def g_flat(v: jax.Array) -> jax.Array:
        return ravel_pytree(g(unravel(v)))[0]

    matrix = jax.jacfwd(g_flat)(jnp.zeros_like(y_flat))
    return unravel(jnp.linalg.solve(matrix, y_flat))


def iterative_tangent_solve(method: Literal["gmres", "cg"], tol: float) -> Callable[[Callable, PyTree], PyTree]:
    """A tangent solver that never builds a matrix: GMRES or CG inside ``lax.custom_linear_solve``.

    ``custom_linear_solve`` tells JAX that the result is ``A^{-1} y`` and how to solve
    with ``A^T``, so reverse mode transposes the solve instead of trying to transpose the
    iterative method's ``while_loop`` (which JAX cannot do). ``cg`` needs a symmetric
    definite ``A`` (e.g. a Hessian); ``gmres`` takes any invertible ``A``.
    """
    if method not in ("gmres", "cg"):
        raise ValueError(f"method must be 'gmres' or 'cg', got {method!r}")

    def inner(matvec: Callable, b: PyTree) -> PyTree:
        if method == "cg":
            return cg(matvec, b, tol=tol, atol=0.0)[0]
        return gmres(matvec, b, tol=tol, atol=0.0, solve_method="batched")[0]

    def solve(g: Callable[[PyTree], PyTree], y: PyTree) -> PyTree:
        return lax.custom_linear_solve(g, y, solve=inner, transpose_solve=inner, symmetric=(method == "cg"))

    return solve


def _tangent(tangent_solver: TangentSolver, x0: PyTree) -> Callable[[Callable, PyTree], PyTree]:
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
    tol: float,
    max_iter: int,
) -> tuple[PyTree, SolverInfo]:
    """Apply ``x <- step(x, residual(x))`` until ``||residual(x)|| <= tol`` or ``max_iter`` steps.

    One ``residual`` evaluation per step: the loop carries it. ``tol == 0`` runs exactly
    ``max_iter`` steps with a static trip count (no norm per step); otherwise a
    ``while_loop`` checks the norm before every step.
    """
    if tol == 0:
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
    x, _, res, k = lax.while_loop(cond, body, (x0, r0, _tree_norm(r0), jnp.asarray(0, jnp.int32)))
    return x, SolverInfo(k, res, res <= tol)


def _custom_root_with_info(
    root_fn: Callable[[PyTree], PyTree],
    x0: PyTree,
    solve: Callable[[Callable, PyTree], tuple[PyTree, SolverInfo]],
    tangent_solve: Callable[[Callable, PyTree], PyTree],
    tol: float,
) -> tuple[PyTree, SolverInfo]:
    """``lax.custom_root(..., has_aux=True)`` with :class:`SolverInfo` as the aux.

    The aux crosses ``custom_root`` as floats only: before JAX 0.12 (seen on 0.8.2 and
    0.10.2) ``custom_root`` gives integer/bool aux outputs an integer tangent instead of
    ``float0`` and fails under ``jvp``/``grad``. Integer and bool fields are rebuilt after.
    """
    dtype = jnp.result_type(*jax.tree_util.tree_leaves(x0))

    def solve_float_aux(g: Callable, x: PyTree) -> tuple[PyTree, tuple[jax.Array, jax.Array]]:
        root, info = solve(g, x)
        return root, (info.iterations.astype(dtype), info.residual.astype(dtype))

    root, (iterations, residual) = lax.custom_root(root_fn, x0, solve_float_aux, tangent_solve, has_aux=True)
    iterations, residual = lax.stop_gradient(iterations), lax.stop_gradient(residual)
    return root, SolverInfo(iterations.astype(jnp.int32), residual, residual <= tol)


def fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    tangent_solver: TangentSolver = "dense",
) -> tuple[PyTree, SolverInfo]:
    """The fixed point ``x* = f(x*, params)``, differentiable w.r.t. ``params`` implicitly.

    Solve: iterate ``x <- f(x, params)`` from ``x0`` in a ``while_loop`` until
    ``||f(x) - x||_2 <= tol`` (norm over all leaves) or ``max_iter`` steps.
    Derivative (``custom_root`` on ``F(x) = f(x, params) - x``):
    ``dx* = (I - ∂f/∂x)^{-1} ∂f/∂params · dparams``, one linear solve with
    ``tangent_solver`` ("dense", "gmres", "cg" or ``(g, y) -> x`` with ``g(x) = y``).
    Forward and reverse mode, ``jit`` and ``vmap`` all work; the derivative w.r.t. ``x0``
    is zero. Returns ``(x_star, SolverInfo)``; check ``info.converged``: the implicit
    derivative is only right at a root.
    """
    _check_args("fixed_point", f, x0, params, tol, max_iter, tangent_solver)

    def root_fn(x: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda a, b: a - b, f(x, params), x)

    def solve(g: Callable[[PyTree], PyTree], x: PyTree) -> tuple[PyTree, SolverInfo]:
        # x + g(x) == f(x, params): the solve only sees the root function.
        return _iterate(lambda z, r: jax.tree_util.tree_map(jnp.add, z, r), g, x, tol, max_iter)

    return _custom_root_with_info(root_fn, x0, solve, _tangent(tangent_solver, x0), tol)


def newton_root(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tol: float = 1e-6,
    max_iter: int = 50,
    tangent_solver: TangentSolver = "dense",
) -> tuple[PyTree, SolverInfo]:
    """A root ``f(x*, params) = 0`` by Newton's method, differentiable w.r.t. ``params``.

    Solve: ``x <- x - J(x)^{-1} f(x, params)`` with ``J = ∂f/∂x`` built densely (so ``x``
    should have at most a few thousand entries), until ``||f(x)||_2 <= tol`` or
    ``max_iter`` steps. Derivative: ``dx* = -(∂f/∂x)^{-1} ∂f/∂params · dparams`` via
    ``custom_root`` and ``tangent_solver``. Returns ``(x_star, SolverInfo)``.
    """
    _check_args("newton_root", f, x0, params, tol, max_iter, tangent_solver)

    def root_fn(x: PyTree) -> PyTree:
        return f(x, params)

    def solve(g: Callable[[PyTree], PyTree], x: PyTree) -> tuple[PyTree, SolverInfo]:
        _, unravel = ravel_pytree(x)

        def g_flat(v: jax.Array) -> jax.Array:
            return ravel_pytree(g(unravel(v)))[0]

        def step(z: PyTree, r: PyTree) -> PyTree:
            v = ravel_pytree(z)[0]
            return unravel(v - jnp.linalg.solve(jax.jacfwd(g_flat)(v), ravel_pytree(r)[0]))

        return _iterate(step, g, x, tol, max_iter)

    return _custom_root_with_info(root_fn, x0, solve, _tangent(tangent_solver, x0), tol)


def anderson_fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    memory: int = 5,
    regularization: float = 1e-10,
    tangent_solver: TangentSolver = "dense",
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
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 2:
        raise ValueError(f"anderson_fixed_point: memory must be an int >= 2, got {memory!r}")
    if not regularization >= 0:
        raise ValueError(f"anderson_fixed_point: regularization must be >= 0, got {regularization!r}")

    def root_fn(x: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda a, b: a - b, f(x, params), x)

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
            h = jnp.where(both, h, 0.0) + jnp.diag(jnp.where(valid, regularization * scale, 1.0))
            alpha = jnp.linalg.solve(h, valid.astype(v0.dtype))
            alpha = alpha / jnp.sum(alpha)
            x_new = alpha @ gs
            g_new = fmap(x_new)
            slot = k % m
            return xs.at[slot].set(x_new), gs.at[slot].set(g_new), k + 1, jnp.linalg.norm(g_new - x_new)

        xs, gs, k, res = lax.while_loop(cond, body, (xs, gs, jnp.asarray(1, jnp.int32), res0))
        return unravel(xs[(k - 1) % m]), SolverInfo(k, res, res <= tol)

    return _custom_root_with_info(root_fn, x0, solve, _tangent(tangent_solver, x0), tol)


def unrolled_fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    tol: float = 1e-6,
    max_iter: int = 1000,
    tangent_solver: TangentSolver = "dense",
) -> tuple[PyTree, SolverInfo]:
    """Same maths and signature as :func:`fixed_point`, differentiated through the iterations.

    Runs ``max_iter`` steps in a ``lax.scan`` (reverse mode stores every iterate: memory
    grows linearly with ``max_iter``). With ``tol > 0`` the iterate freezes once
    ``||f(x) - x|| <= tol`` (later steps are no-ops), so it returns the same point as
    :func:`fixed_point`. ``tangent_solver`` is validated and otherwise unused.
    The diagnostics carry no derivative.
    """
    _check_args("unrolled_fixed_point", f, x0, params, tol, max_iter, tangent_solver)

    def residual(x: PyTree) -> jax.Array:
        return _tree_norm(jax.tree_util.tree_map(lambda a, b: a - b, f(x, params), x))

    if tol == 0:
        x, _ = lax.scan(lambda x, _: (f(x, params), None), x0, None, length=max_iter)
        res = lax.stop_gradient(residual(x))
        return x, SolverInfo(jnp.asarray(max_iter, jnp.int32), res, res <= tol)

    def body(carry, _):
        x, k = carry
        fx = f(x, params)
        done = lax.stop_gradient(_tree_norm(jax.tree_util.tree_map(lambda a, b: a - b, fx, x))) <= tol
        x = jax.tree_util.tree_map(lambda old, new: jnp.where(done, old, new), x, fx)
        return (x, k + jnp.where(done, 0, 1).astype(jnp.int32)), None

    (x, k), _ = lax.scan(body, (x0, jnp.asarray(0, jnp.int32)), None, length=max_iter)
    res = lax.stop_gradient(residual(x))
    return x, SolverInfo(k, res, res <= tol)


# ---------------------------------------------------------------------- worked examples


def deq_layer(z: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """One step of a deep-equilibrium layer: ``tanh(W z + U x + b)`` (``params``: W, U, b, x)."""
    return jnp.tanh(params["W"] @ z + params["U"] @ params["x"] + params["b"])


def deq_params(
    key: jax.Array, d: int = 64, d_in: int = 16, radius: float = 0.9, input_scale: float = 1.0, dtype: Any = jnp.float32
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
    if not 0 < radius < 1:
        raise ValueError(f"radius must lie in (0, 1) for a contraction, got {radius}")
    if d < 1 or d_in < 1:
        raise ValueError(f"d and d_in must be >= 1, got d={d}, d_in={d_in}")
    kw, ku, kb, kx = jax.random.split(key, 4)
    q, r = jnp.linalg.qr(jax.random.normal(kw, (d, d), dtype))
    w = radius * q * jnp.sign(jnp.diagonal(r))[None, :]
    return {
        "W": w,
        "U": input_scale * jax.random.normal(ku, (d, d_in), dtype) / math.sqrt(d_in),
        "b": 0.1 * input_scale * jax.random.normal(kb, (d,), dtype),
        "x": jax.random.normal(kx, (d_in,), dtype),
    }


def deq_reference_grad_W(params: dict[str, jax.Array], z_star: jax.Array, cotangent: jax.Array) -> jax.Array:
    """Closed-form ``∂(c·z*)/∂W`` for ``z* = tanh(W z* + U x + b)``.

    With ``D = diag(1 - z*^2)``: ``u = (I - D W)^{-T} c`` and the gradient is
    ``(D u) z*^T``. Independent of ``custom_root``: used to check it.
    """
    d = 1.0 - z_star**2
    a = jnp.eye(z_star.shape[0], dtype=z_star.dtype) - d[:, None] * params["W"]
    u = jnp.linalg.solve(a.T, cotangent)
    return jnp.outer(d * u, z_star)


def ridge_normal_equations(w: jax.Array, lam: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
    """Gradient of ``0.5||Xw - y||^2 + 0.5 lam ||w||^2``; its root is the ridge solution."""
    return X.T @ (X @ w - y) + lam * w


def ridge_closed_form(lam: jax.Array, X: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``w*(lam) = (X^T X + lam I)^{-1} X^T y`` and ``dw*/dlam = -(X^T X + lam I)^{-1} w*``."""
    a = X.T @ X + lam * jnp.eye(X.shape[1], dtype=X.dtype)
    w = jnp.linalg.solve(a, X.T @ y)
    return w, -jnp.linalg.solve(a, w)


# ---------------------------------------------------------------- tolerance widget callback


class ToleranceReport(NamedTuple):
    """What a loose solver tolerance does to the implicit gradient (the widget's record)."""

    tol: float
    iterations: int
    residual: float
    implicit_grad: np.ndarray  # d(sum z*)/db from custom_root at the solver's point
    reference_grad: np.ndarray  # the same from the exact fixed point (closed form)
    rel_error: float  # ||implicit - reference|| / ||reference||


@functools.lru_cache(maxsize=1)
def _tolerance_problem() -> tuple[dict[str, jax.Array], jax.Array]:
    """The widget's DEQ layer (float64, d=16) and its exact ``∂(Σ z*)/∂b`` (computed once)."""
    with jax.enable_x64(True):
        params = deq_params(jax.random.PRNGKey(0), d=16, d_in=4, radius=0.9, dtype=jnp.float64)
        z_ref, _ = fixed_point(deq_layer, jnp.zeros(16), params, tol=1e-14, max_iter=10_000)
        dz = 1.0 - z_ref**2
        a = jnp.eye(16) - dz[:, None] * params["W"]
        return params, dz * jnp.linalg.solve(a.T, jnp.ones(16))


def tolerance_report(tol: float) -> ToleranceReport:
    """Implicit gradient ``∂(Σ z*)/∂b`` of a DEQ layer solved to ``tol``, against the exact one.

    Runs in float64 (inside ``jax.enable_x64``) so the error measured is the solver's, not
    rounding. The exact gradient is ``D (I - W^T D)^{-1} 1`` with
    ``D = diag(1 - z*^2)`` at the fixed point solved to ``1e-14``.
    """
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"tol must be a float > 0, got {tol!r}")
    params, ref = _tolerance_problem()
    with jax.enable_x64(True):

        def loss(b: jax.Array) -> tuple[jax.Array, SolverInfo]:
            z, info = fixed_point(deq_layer, jnp.zeros_like(b), {**params, "b": b}, tol=float(tol), max_iter=10_000)
            return jnp.sum(z), info

        g, info = jax.jit(jax.grad(loss, has_aux=True))(params["b"])
        err = float(jnp.linalg.norm(g - ref) / jnp.linalg.norm(ref))
        return ToleranceReport(float(tol), int(info.iterations), float(info.residual), np.asarray(g), np.asarray(ref), err)


# ------------------------------------------------------------------------------ exercises


def _exercise1_reference(theta: jax.Array) -> jax.Array:
    """x* = 0.5 cos(x*) + theta, solved to float precision (for checking only)."""
    x, _ = fixed_point(lambda x, t: 0.5 * jnp.cos(x) + t, jnp.zeros_like(theta), theta, tol=0.0, max_iter=200)
    return x


def check_fixed_point_grad(fn: Callable[[jax.Array], jax.Array], *, strict: bool = False) -> Feedback:
    """Exercise 1: ``fn(theta)`` returns ``x*`` with ``x* = 0.5 cos(x*) + theta`` (elementwise).

    Checks, in float64: the value; ``jax.grad`` against the closed form
    ``dx*/dθ = 1 / (1 + 0.5 sin x*)``; and that ``fn`` works under ``jit``.
    """
    name = "fixed-point gradient"
    with jax.enable_x64(True):
        thetas = jnp.array([-1.0, 0.0, 0.3, 2.0], jnp.float64)
        want = _exercise1_reference(thetas)
        got = call_answer(jax.vmap(fn), thetas, what="your function (under vmap)")
        if failed(got):
            return verdict(name, [failed(got)], strict=strict)
        problems = tree_mismatches(got, want, rtol=1e-8, atol=1e-10, name="x*")
        if problems:
            return verdict(name, problems, strict=strict)
        grads = call_answer(jax.vmap(jax.grad(fn)), thetas, what="jax.grad of your function")
        if failed(grads):
            return verdict(name, [failed(grads)], strict=strict)
        problems = tree_mismatches(grads, 1.0 / (1.0 + 0.5 * jnp.sin(want)), rtol=1e-6, atol=1e-8, name="dx*/dθ")
        jitted = call_answer(jax.jit(fn), thetas[2], what="your function under jit")
        if failed(jitted):
            problems.append(failed(jitted))
        return verdict(name, problems, success="value, implicit gradient and jit all match", strict=strict)


def _sqrtm_reference(a: jax.Array) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """Principal square root of SPD ``a`` and its derivative map ``dA -> dX``.

    With ``a = Q diag(s^2) Q^T`` and ``X = Q diag(s) Q^T``, differentiating ``X X = A``
    gives ``X dX + dX X = dA``, i.e. ``(Q^T dX Q)_ij = (Q^T dA Q)_ij / (s_i + s_j)``.
    """
    evals, q = jnp.linalg.eigh(a)
    s = jnp.sqrt(evals)
    x = (q * s) @ q.T

    def deriv(da: jax.Array) -> jax.Array:
        return q @ ((q.T @ da @ q) / (s[:, None] + s[None, :])) @ q.T

    return x, deriv


def check_sqrtm(fn: Callable[[jax.Array], jax.Array], *, strict: bool = False) -> Feedback:
    """Exercise 2: ``fn(A)`` returns ``X`` with ``X @ X = A`` (SPD ``A``), differentiably.

    Checks, in float64: the value against an eigendecomposition, and ``jax.jvp`` along a
    symmetric direction against the Sylvester-equation closed form.
    """
    name = "matrix square root"
    with jax.enable_x64(True):
        m = jnp.array([[2.0, 0.3, 0.0], [0.1, 1.5, 0.2], [0.0, 0.4, 1.0]], jnp.float64)
        a = m @ m.T + 0.5 * jnp.eye(3, dtype=jnp.float64)
        da = jnp.array([[1.0, 0.5, -0.2], [0.5, 0.0, 0.3], [-0.2, 0.3, -1.0]], jnp.float64)
        x_ref, deriv = _sqrtm_reference(a)
        out = call_answer(lambda: jax.jvp(fn, (a,), (da,)), what="jax.jvp of your function")
        if failed(out):
            return verdict(name, [failed(out)], strict=strict)
        x, dx = out
        problems = tree_mismatches(x, x_ref, rtol=1e-8, atol=1e-10, name="X")
        problems += tree_mismatches(dx, deriv(da), rtol=1e-6, atol=1e-9, name="dX")
        return verdict(name, problems, success="X @ X = A and its derivative solves X dX + dX X = dA", strict=strict)


def exercise3_params() -> dict[str, jax.Array]:
    """The DEQ parameters of Exercise 3 (float64, d=8; contraction factor 0.95)."""
    with jax.enable_x64(True):
        return deq_params(jax.random.PRNGKey(3), d=8, d_in=3, radius=0.95, dtype=jnp.float64)


def check_tolerance_fix(fn: Callable[[jax.Array], jax.Array], *, strict: bool = False) -> Feedback:
    """Exercise 3: ``fn(b)`` returns ``∂(Σ z*)/∂b`` for the DEQ of :func:`exercise3_params`.

    Compared with the closed form at two values of ``b``, to ``rtol=1e-7`` (float64): a
    gradient from a solver stopped at a loose tolerance fails.
    """
    name = "loose-tolerance gradient"
    with jax.enable_x64(True):
        params = exercise3_params()

        @jax.jit
        def reference(b: jax.Array) -> jax.Array:
            p = {**params, "b": b}
            z, _ = fixed_point(deq_layer, jnp.zeros_like(b), p, tol=1e-14, max_iter=10_000)
            dz = 1.0 - z**2
            a = jnp.eye(b.shape[0], dtype=b.dtype) - dz[:, None] * p["W"]
            return dz * jnp.linalg.solve(a.T, jnp.ones_like(b))

        problems: list[str] = []
        for scale in (1.0, -2.0):
            b = scale * params["b"]
            fb = check_allclose(name, call_answer(fn, b, what="your gradient function"), reference(b), rtol=1e-7, atol=1e-10)
            if not fb.passed:
                problems += list(fb.messages)
                break
        return verdict(name, problems, success="the gradient matches the exact one to 1e-7", strict=strict)


# ---------------------------------------------------------------------------- benchmark


class BenchmarkRow(NamedTuple):
    """Implicit vs unrolled gradient of the DEQ layer at one fixed iteration count (seconds, bytes)."""

    iterations: int
    fwd_implicit: float  # forward solve, convergence check on every step (unreachable tol)
    fwd_nocheck: float  # forward solve, static trip count (tol=0)
    grad_implicit: float  # value_and_grad through fixed_point (with the check)
    bwd_implicit: float  # the pullback alone: the cost beyond the forward solve
    fwd_unrolled: float
    grad_unrolled: float
    bwd_unrolled: float
    mem_implicit: int  # compiled temp bytes of the jitted gradient
    mem_unrolled: int


def timing_clock() -> tuple[str, Callable[[], float]]:
    """The clock the benchmarks use: process CPU time on the CPU backend, wall time otherwise.

    On a CPU shared with other jobs, wall time mostly measures the queue for a core; the
    process's own CPU time does not (XLA runs these small programs on one thread, so on
    an idle machine the two agree). On a GPU or TPU the host only waits, so wall time is
    the honest measure there.
    """
    import time

    if jax.default_backend() == "cpu":
        return "process CPU time", time.process_time
    return "wall time", time.perf_counter


def median_times(
    calls: list[tuple[Callable[..., Any], tuple[Any, ...]]], repeats: int = 7, min_time: float = 0.05
) -> list[float]:
    """Median time (s, :func:`timing_clock`) of each ``fn(*args)`` in ``calls``, sampled round-robin.

    Each call is warmed up once (compilation). Then ``repeats`` rounds each time every
    call in turn, looping until a sample lasts ``min_time`` seconds; interleaving means
    compared calls see the same machine state, which keeps their ratios honest.
    """
    if repeats < 1 or min_time <= 0:
        raise ValueError(f"repeats must be >= 1 and min_time > 0, got {repeats}, {min_time}")
    _, clock = timing_clock()
    for fn, args in calls:
        jax.block_until_ready(fn(*args))
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        for k, (fn, args) in enumerate(calls):
            n, t0 = 0, clock()
            while True:
                jax.block_until_ready(fn(*args))
                n += 1
                dt = clock() - t0
                if dt >= min_time:
                    break
            samples[k].append(dt / n)
    return [float(np.median(s)) for s in samples]


def temp_bytes(fn: Callable[..., Any], *args: Any) -> int:
    """Compiled temporary memory of ``jax.jit(fn)(*args)`` in bytes (XLA's memory analysis).

    ``fn`` may already be jitted (then its own lowering is reused).
    """
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    analysis = jitted.lower(*args).compile().memory_analysis()
    if analysis is None:
        raise RuntimeError("this backend reports no memory analysis for compiled programs")
    return int(analysis.temp_size_in_bytes)


def benchmark_implicit_vs_unrolled(
    iteration_counts: tuple[int, ...] = (100, 1000, 10_000),
    d: int = 64,
    repeats: int = 7,
    min_time: float = 0.05,
    tangent_solver: TangentSolver = "dense",
) -> list[BenchmarkRow]:
    """Time and memory of the DEQ gradient ``∂(c·z*)/∂W``, implicit vs unrolled, per iteration count.

    Every solve runs exactly ``N`` steps: the implicit forward once with a ``while_loop``
    whose tolerance (1e-30) is never met, so its norm check runs every step, and once with
    ``tol=0`` (a static trip count, no check). The unrolled version is a ``scan``.
    """
    if d < 2 or not iteration_counts or min(iteration_counts) < 1:
        raise ValueError(f"need d >= 2 and positive iteration counts, got d={d}, {iteration_counts}")
    params = deq_params(jax.random.PRNGKey(0), d=d, d_in=16, radius=0.99, input_scale=0.1)
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)
    w = params["W"]

    def loss(solver: Callable, n: int, tol: float) -> Callable[[jax.Array], jax.Array]:
        def fn(w: jax.Array) -> jax.Array:
            z, _ = solver(deq_layer, z0, {**params, "W": w}, tol=tol, max_iter=n, tangent_solver=tangent_solver)
            return c @ z

        return fn

    def pullback(fn: Callable) -> tuple[Callable, tuple[Any, ...]]:
        _, vjp_fn = jax.vjp(fn, w)
        return jax.jit(lambda pb, ct: pb(ct)), (vjp_fn, jnp.ones((), jnp.float32))

    rows = []
    for n in iteration_counts:
        imp, imp0, unr = loss(fixed_point, n, 1e-30), loss(fixed_point, n, 0.0), loss(unrolled_fixed_point, n, 0.0)
        grad_imp, grad_unr = jax.jit(jax.value_and_grad(imp)), jax.jit(jax.value_and_grad(unr))
        times = median_times(
            [
                (jax.jit(imp), (w,)),
                (jax.jit(imp0), (w,)),
                (grad_imp, (w,)),
                pullback(imp),
                (jax.jit(unr), (w,)),
                (grad_unr, (w,)),
                pullback(unr),
            ],
            repeats,
            min_time,
        )
        mems = temp_bytes(grad_imp, w), temp_bytes(grad_unr, w)
        rows.append(BenchmarkRow(n, *times, *mems))
    return rows


class SolverComparison(NamedTuple):
    """Plain iteration vs Newton under the same ``custom_root`` derivative rule."""

    name: str
    iterations: int
    residual: float
    fwd_time: float
    grad_time: float
    grad: np.ndarray


def compare_solvers(
    d: int = 64, tol: float = 1e-5, repeats: int = 7, min_time: float = 0.05, radius: float = 0.999, input_scale: float = 0.01
) -> list[SolverComparison]:
    """Solve one DEQ fixed point to ``tol`` by plain iteration, Anderson and Newton; time each and its gradient.

    The default layer contracts slowly (``||W||_2 = 0.999``, small inputs keep ``tanh``
    near-linear), the regime where plain iteration needs hundreds of steps.
    """
    params = deq_params(jax.random.PRNGKey(0), d=d, d_in=16, radius=radius, input_scale=input_scale)
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)

    def residual_map(z: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        return deq_layer(z, p) - z

    solvers = {
        "fixed-point iteration": lambda p: fixed_point(deq_layer, z0, p, tol=tol, max_iter=100_000),
        "Anderson (m=5)": lambda p: anderson_fixed_point(deq_layer, z0, p, tol=tol, max_iter=10_000),
        "Newton": lambda p: newton_root(residual_map, z0, p, tol=tol, max_iter=100),
    }
    runs = []
    for name, solve in solvers.items():
        def loss(w: jax.Array, solve=solve) -> tuple[jax.Array, SolverInfo]:
            z, info = solve({**params, "W": w})
            return c @ z, info

        fwd, grad = jax.jit(loss), jax.jit(jax.grad(loss, has_aux=True))
        runs.append((name, fwd, grad, grad(params["W"])))
    calls = [(fn, (params["W"],)) for _, fwd, grad, _ in runs for fn in (fwd, grad)]
    times = median_times(calls, repeats, min_time)
    return [
        SolverComparison(name, int(info.iterations), float(info.residual), times[2 * k], times[2 * k + 1], np.asarray(g))
        for k, (name, _, _, (g, info)) in enumerate(runs)
    ]


# ------------------------------------------------------------------------------ figures


def plot_tolerance_report(report: ToleranceReport, ax: Any = None) -> Any:
    """Scatter the implicit gradient against the exact one (one dot per entry of ``b``).

    Dots on the diagonal mean the implicit gradient is right; the title gives the solver
    tolerance, its iterations and the relative gradient error. Returns the axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    ref, got = report.reference_grad, report.implicit_grad
    lo, hi = float(min(ref.min(), got.min())), float(max(ref.max(), got.max()))
    ax.plot([lo, hi], [lo, hi], color="0.7", lw=1)
    ax.scatter(ref, got, s=14, color="C3" if report.rel_error > 1e-3 else "C0")
    ax.set_xlabel("exact ∂Σz*/∂b")
    ax.set_ylabel("implicit ∂Σz*/∂b")
    ax.set_title(f"tol={report.tol:.0e}: {report.iterations} its\nrel. error {report.rel_error:.1e}", fontsize=9)
    return ax
