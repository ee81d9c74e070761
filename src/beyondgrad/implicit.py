"""Differentiate through solvers by the implicit function theorem (Chapter 3).

A solver returns :math:`x^\\star(\\theta)` with :math:`F(x^\\star, \\theta) = 0`. When
:math:`\\partial F/\\partial x` is invertible at the root, the implicit function theorem
gives the derivative without looking at the solver's iterations:

.. math::

    \\frac{\\partial x^\\star}{\\partial \\theta}
      = -\\Big(\\frac{\\partial F}{\\partial x}\\Big)^{-1}
        \\frac{\\partial F}{\\partial \\theta}.

Two entry points, one per problem: :func:`fixed_point` (``F(x) = f(x, θ) - x``) and
:func:`root_find` (``F = f``). Each takes the solver (``solver=``: plain iteration,
Anderson acceleration, Newton) and the derivative (``adjoint=``, as in optimistix):
``"implicit"`` wraps the solve in :func:`jax.lax.custom_root`, so the iterations run
in a ``lax.while_loop`` that is never differentiated and derivatives reach only what
``f`` sees (``params``), never ``x0``; ``"unrolled"`` runs the same steps in a
``lax.scan`` and differentiates through every one. Both return
``(x_star, SolverInfo)`` and, by default, raise :class:`SolverError` when the solve
does not converge (``throw=False`` returns the state instead, as optimistix's
``throw=``).

The chapter's worked examples (a deep-equilibrium layer, ridge regression) are not
here: Chapter 3 defines them in view, and :mod:`beyondgrad.implicit_problems` keeps the
copies its experiments and the tests use. Exercise checkers live in
:mod:`beyondgrad.exercises.ch3`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.scipy.sparse.linalg import cg, gmres

from beyondgrad import _checks, compat

__all__ = [
    "Adjoint",
    "FixedPointSolver",
    "RootSolver",
    "SolverError",
    "SolverInfo",
    "TangentSolver",
    "dense_tangent_solve",
    "fixed_point",
    "iterative_tangent_solve",
    "root_find",
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
#: ``fixed_point``'s solvers: plain iteration, Anderson acceleration, Newton on ``f - x``.
FixedPointSolver: TypeAlias = Literal["iterate", "anderson", "newton"]
#: ``root_find``'s solvers.
RootSolver: TypeAlias = Literal["newton"]
#: How the solve is differentiated: the implicit function theorem, or through the steps.
Adjoint: TypeAlias = Literal["implicit", "unrolled"]


class SolverInfo(NamedTuple):
    """Diagnostics of one solve (a pytree, so it works under ``jit``/``vmap``).

    A solve stopped by ``max_iter`` reports ``converged`` ``False``; with
    ``throw=True`` it raises :class:`SolverError` instead. With ``tol=0`` (a fixed
    trip count) ``converged`` is ``False`` unless the residual is exactly zero, and
    nothing is raised for it (by design: only a non-finite residual fails then).
    """

    #: Solver steps taken (int32).
    iterations: jax.Array
    #: The 2-norm of ``F`` at the returned point, over all leaves.
    residual: jax.Array
    #: Whether ``residual <= tol`` (bool).
    converged: jax.Array


class SolverError(RuntimeError):
    """A solve that did not converge, raised when ``throw=True`` (the default).

    With concrete diagnostics it is raised as is. With traced ones the check runs on
    the host through ``jax.debug.callback``: under an eager ``vmap`` or ``grad`` the
    callback runs at once and the caller gets this error itself (JAX may also log
    "jax.debug.callback failed"); under ``jit`` the caller gets JAX's runtime error
    (``jax.errors.JaxRuntimeError``, also a ``RuntimeError``), whose message quotes
    this one. Pass ``throw=False`` to get ``(x, SolverInfo)`` back instead.
    """


# --------------------------------------------------------------------------- validation


def _tree_norm(tree: PyTree) -> jax.Array:
    """Euclidean norm of all leaves of ``tree`` taken together.

    Computed as ``m * ||tree / m||`` with ``m`` the largest ``|entry|``, so squares
    do not underflow: a float32 residual of 1e-20 has norm 1e-20, not 0 (which would
    stop a solve with ``tol`` below 1e-19 at once)."""
    leaves = jax.tree_util.tree_leaves(tree)
    big = _tree_max_abs(tree)
    scale = jnp.where((big > 0) & jnp.isfinite(big), big, jnp.ones_like(big))
    unit = jnp.sqrt(sum(jnp.sum(jnp.abs(leaf / scale) ** 2) for leaf in leaves))
    return jnp.where(jnp.isfinite(big), scale * unit, big)


def _refuse_half(dtype: Any, where: str, what: str) -> None:
    """A TypeError naming the fix when ``dtype`` is float16 or bfloat16."""
    if jnp.dtype(dtype) in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        raise TypeError(
            f"{where}: {what} takes no half-precision state ({jnp.dtype(dtype)}); "
            "use tangent_solver='cg' (a symmetric definite system), or keep the "
            "state in float32"
        )


#: Solvers that call ``jnp.linalg.solve`` at every step (Anderson's weights, Newton's
#: Jacobian), so JAX's LU, which takes no float16 or bfloat16.
_LU_SOLVERS = ("anderson", "newton")


def _half_dtypes(tree: PyTree) -> list[str]:
    """The names of the float16 and bfloat16 dtypes among the leaves of ``tree``."""
    half = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
    return [
        str(d)
        for d in (jnp.result_type(leaf) for leaf in jax.tree_util.tree_leaves(tree))
        if d in half
    ]


def _tree_max_abs(tree: PyTree) -> jax.Array:
    """The largest ``|leaf_i|`` over all leaves of ``tree`` (no squares: no underflow)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return functools.reduce(jnp.maximum, [jnp.max(jnp.abs(leaf)) for leaf in leaves])


def _is_array_tol(tol: object) -> bool:
    """A 0-d floating JAX/NumPy array (a traced tolerance is fine)."""
    return (
        isinstance(tol, (jax.Array, np.ndarray, np.floating))
        and jnp.ndim(tol) == 0
        and jnp.issubdtype(jnp.result_type(tol), jnp.floating)
    )


def _is_int(value: object) -> TypeGuard[int]:
    """A Python int (``bool`` excluded: ``True`` is no iteration count)."""
    return _checks.is_int(value)


def _is_real(value: object) -> TypeGuard[float]:
    """A Python int or float (``bool`` excluded)."""
    return _checks.is_real(value)


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
    f = _checks.function(f, "f", "a function f(x, params)", where=f"{name}: ")
    leaves = jax.tree_util.tree_leaves(x0)
    if not leaves:
        raise ValueError(
            f"{name}: x0 must be a pytree with at least one array leaf, got {x0!r}"
        )
    _checks.float_leaves(
        x0,
        "x0",
        why="the root is real-valued",
        where=f"{name}: ",
        fix="pass e.g. jnp.asarray(x0, jnp.float32)",
    )
    if _is_array_tol(tol):
        pass  # a 0-d float array, possibly traced: one compilation for every tol
    elif hasattr(tol, "shape"):  # an array, but not a 0-d float one
        raise ValueError(
            f"{name}: tol must be a finite Python float >= 0 or a 0-d float array, "
            f"got an array of shape {getattr(tol, 'shape', None)} and dtype "
            f"{getattr(tol, 'dtype', None)}"
        )
    else:
        _checks.number(
            tol,
            "tol",
            at_least=0,
            below=math.inf,
            where=f"{name}: ",
            meaning="finite; 0 means: always run max_iter steps; or a 0-d float array",
        )
    _checks.integer(max_iter, "max_iter", minimum=1, where=f"{name}: ")
    if not callable(tangent_solver):
        _checks.choice(
            tangent_solver,
            "tangent_solver",
            _TANGENT_SOLVERS,
            where=f"{name}: ",
            about="or a function (g, y) -> x solving g(x) = y",
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
    _checks.boolean(
        throw,
        "throw (True: raise SolverError when the solve does not converge; "
        "False: return the state)",
        where=f"{name}: ",
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
            _failure_message(
                name,
                np.asarray(ok),
                np.asarray(info.iterations),
                np.asarray(info.residual),
                np.asarray(tol_arr),
                max_iter,
                culprits,
            )
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
    problems only. For a pytree of real floating arrays: ``jax.jacfwd`` refuses
    complex input unless told ``holomorphic=True``, and that matrix is wrong for a
    ``g`` that is only real-linear (one using ``conj``).

    Args:
        g: A linear function on pytrees shaped like ``y`` (``custom_root`` passes
            ``x -> ∂F/∂x · x``).
        y: The right-hand side, a pytree of real float32 or float64 arrays.

    Returns:
        ``x`` with ``g(x) = y``, structured like ``y``.

    Raises:
        TypeError: ``g`` is not callable, a leaf of ``y`` is not a real floating
            array, or the leaves are half precision (float16, bfloat16), which JAX's
            LU does not take.
    """
    _checks.function(
        g, "g", "the linear function x -> A x", where="dense_tangent_solve: "
    )
    _checks.float_leaves(
        y,
        "y",
        why="jax.jacfwd builds the matrix, which is wrong for a real-linear g",
        where="dense_tangent_solve: ",
        fix="split a complex unknown into real and imaginary parts, or pass a "
        "matrix-free tangent_solver",
    )
    y_flat, unravel = ravel_pytree(y)
    _refuse_half(y_flat.dtype, "dense_tangent_solve", "JAX's LU (jnp.linalg.solve)")

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
    (jax-ml/jax#5309): before its own ``custom_linear_solve``, ``gmres`` computes its
    stopping tolerances from ``y`` (``atol = max(tol * |y|, atol)`` and a
    preconditioned ``ptol``), and both pass ``y`` and the initial guess
    (``zeros_like(y)``) through one two-operand ``device_put``, which ties the guess
    to ``y`` (``cg`` computes its tolerance inside its solve). So the inner ``solve``
    closes over values that depend on the linear input, which the transpose rule
    rejects (``NotImplementedError``). Wrapped here, ``y`` is only the outer
    right-hand side and the inner solver runs on known cotangents.

    Each inner solve runs on ``b / s`` and scales its result back by ``s``, where ``s``
    is the largest ``|b_i|`` over all leaves (a zero ``b`` is left as is). JAX's
    ``gmres`` treats a right-hand side whose norm is at most the dtype's machine
    epsilon as zero (an absolute threshold, ``1.2e-7`` in float32), so an unscaled
    solve returns an exact-zero gradient for a small cotangent. ``cg`` works with
    squared quantities (the stopping test ``r.r > tol**2 * b.b`` and the step
    ``r.r / p.Ap``), which in float32 are flushed to zero below the smallest normal
    number (``1.2e-38``; XLA on CPU flushes subnormals), i.e. for entries below about
    ``1e-19``: once ``tol * |b|`` is that small the solve cannot stop on its
    tolerance, once the residual is, the step is ``0/0`` and the result NaN (sooner
    for small eigenvalues), and once ``|b|`` is, the result is zero. On an 8x8 system
    with eigenvalues 0.01 to 0.1, float32 ``cg`` loses digits and returns NaN from
    right-hand sides near ``1e-16``. The largest entry, unlike the squared norm, does
    not underflow.

    ``cg`` needs a symmetric definite ``A``, or a Hermitian definite one for complex
    operands (positive or negative definite, e.g. a
    positive definite Hessian at a minimum; a strict minimum is not enough: the
    Hessian of ``w**4`` vanishes at ``w = 0``); on an indefinite one it can return NaN
    without an error. ``gmres`` (restarted every 20 steps) needs an ``A`` on which restarted
    GMRES converges: it can stagnate on some invertible ``A`` (a cyclic permutation
    longer than the restart length, for one), and then returns an inaccurate solution
    without an error (JAX's ``gmres`` reports ``info = 0`` unless the answer is NaN).

    Args:
        method: ``"gmres"`` (a general ``A`` on which restarted GMRES converges) or
            ``"cg"`` (symmetric definite ``A``).
        tol: Relative tolerance of the inner solves, a float in ``(0, 1)``.
            ``tangent_solver="gmres"``/``"cg"`` use ``1e-6`` in float32 and ``1e-12``
            in float64.

    Returns:
        A tangent solver ``(g, y) -> x`` with ``g(x) = y``, for ``tangent_solver=``.

    Raises:
        ValueError: An unknown ``method``, or ``tol`` outside ``(0, 1)``.
    """
    if method not in ("gmres", "cg"):
        raise ValueError(f"method must be 'gmres' or 'cg', got {method!r}")
    _checks.number(tol, "tol", above=0, below=1, meaning="a relative tolerance")

    def inner(matvec: LinearMap, b: PyTree) -> PyTree:
        # One vector of the leaves' common dtype: JAX's cg/gmres promote their step
        # sizes over all leaves, so a float32 leaf beside a float64 one would change
        # dtype inside their loops; unravel casts each leaf back.
        flat_b, unravel = ravel_pytree(b)
        if method == "gmres":
            _refuse_half(flat_b.dtype, "gmres tangent solve", "JAX's gmres")
        flat_matvec = lambda v: ravel_pytree(matvec(unravel(v)))[0]  # noqa: E731
        big = _tree_max_abs(flat_b)
        scale = jnp.where(big > 0, big, jnp.ones_like(big)).astype(flat_b.dtype)
        if method == "cg":
            x = cg(flat_matvec, flat_b / scale, tol=tol, atol=0.0)[0]
        else:
            x = gmres(
                flat_matvec, flat_b / scale, tol=tol, atol=0.0, solve_method="batched"
            )[0]
        return unravel(x * scale)

    def solve(g: Callable[[PyTree], PyTree], y: PyTree) -> PyTree:
        # A real symmetric A is its own transpose; a complex Hermitian one is not
        # (A^T = conj(A)), so JAX's own cg claims symmetry only for real operands, and
        # so does this: the transposed solve then runs cg on A^T, Hermitian as well.
        real = all(
            not jnp.issubdtype(jnp.result_type(leaf), jnp.complexfloating)
            for leaf in jax.tree_util.tree_leaves(y)
        )
        return lax.custom_linear_solve(
            g,
            y,
            solve=inner,
            transpose_solve=inner,
            symmetric=(method == "cg" and real),
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


# ------------------------------------------------------------------- root functions


def _fixed_point_residual(
    f: Callable[[PyTree, PyTree], PyTree], params: PyTree
) -> Callable[[PyTree], PyTree]:
    """``F(x) = f(x, params) - x`` (leaf by leaf): zero exactly at a fixed point of ``f``."""

    def residual(x: PyTree) -> PyTree:
        return jax.tree_util.tree_map(lambda a, b: a - b, f(x, params), x)

    return residual


# -------------------------------------------------------------------------------- solvers


class _Method(NamedTuple):
    """One solver on a root function ``F``: a state, a step, and what to read from it.

    ``init(x0)`` builds the state, ``step(state)`` advances it by one iteration,
    ``point(state)`` is the current iterate and ``norm(state)`` is ``||F||_2`` there
    (carried in the state, so each step evaluates ``F`` once).
    """

    init: Callable[[PyTree], Any]
    step: Callable[[Any], Any]
    point: Callable[[Any], PyTree]
    norm: Callable[[Any], jax.Array]


def _carry_residual(
    F: LinearMap, update: Callable[[PyTree, PyTree], PyTree]
) -> _Method:
    """A method whose state is ``(x, F(x))`` and whose step is ``x <- update(x, F(x))``."""

    def init(x: PyTree) -> tuple[PyTree, PyTree]:
        return x, F(x)

    def step(state: tuple[PyTree, PyTree]) -> tuple[PyTree, PyTree]:
        x = update(*state)
        return x, F(x)

    return _Method(init, step, lambda s: s[0], lambda s: _tree_norm(s[1]))


def _iterate_method(F: LinearMap, options: dict[str, Any]) -> _Method:
    """Plain fixed-point iteration on ``F(x) = f(x) - x``: ``x <- x + F(x) = f(x)``."""
    return _carry_residual(F, lambda x, r: jax.tree_util.tree_map(jnp.add, x, r))


def _newton_method(F: LinearMap, options: dict[str, Any]) -> _Method:
    """Newton's method: ``x <- x - J(x)^{-1} F(x)`` with ``J = ∂F/∂x`` built densely."""

    def update(x: PyTree, r: PyTree) -> PyTree:
        v, unravel = ravel_pytree(x)

        def F_flat(u: jax.Array) -> jax.Array:
            return ravel_pytree(F(unravel(u)))[0]

        return unravel(v - jnp.linalg.solve(jax.jacfwd(F_flat)(v), ravel_pytree(r)[0]))

    return _carry_residual(F, update)


def _anderson_method(F: LinearMap, options: dict[str, Any]) -> _Method:
    """Anderson acceleration of ``x <- f(x) = x + F(x)`` with the last ``memory`` iterates.

    With residuals ``r_i = f(x_i) - x_i`` it picks weights ``α`` minimising
    ``||Σ α_i r_i||`` subject to ``Σ α_i = 1`` (a regularised solve of size ``memory``)
    and steps to ``x <- Σ α_i f(x_i)``. The weights solve ``(H + λ I) α = 1`` (then
    scaled to sum to 1) with ``H = R Rᵀ / max_i ||r_i||²``; ``λ`` is
    ``regularization``, raised to ``10 ε`` of the dtype: ``H`` is singular when
    residuals are parallel (a scalar ``x`` after two steps), and a smaller ridge
    vanishes in rounding (``1e-10`` is below float32's ``ε``), leaving a nan.
    """
    m = options["memory"]
    unravel_box: list[Callable[[jax.Array], PyTree]] = []

    def fmap(v: jax.Array) -> jax.Array:  # f(x) = x + F(x), on the flat vector
        return v + ravel_pytree(F(unravel_box[0](v)))[0]

    def init(x: PyTree) -> tuple[jax.Array, jax.Array, jax.Array]:
        v0, unravel = ravel_pytree(x)
        unravel_box[:] = [unravel]
        xs = jnp.zeros((m, v0.shape[0]), v0.dtype).at[0].set(v0)
        gs = jnp.zeros((m, v0.shape[0]), v0.dtype).at[0].set(fmap(v0))
        return xs, gs, jnp.asarray(1, jnp.int32)

    def step(state: tuple[jax.Array, jax.Array, jax.Array]) -> Any:
        xs, gs, k = state
        ridge = max(
            float(options["regularization"]), 10 * float(jnp.finfo(xs.dtype).eps)
        )
        valid = jnp.arange(m) < jnp.minimum(k, m)
        r = jnp.where(valid[:, None], gs - xs, 0.0)
        # divide first, so that r @ r.T neither overflows nor underflows
        big = jnp.max(jnp.abs(r))
        r = r / jnp.where(big > 0, big, 1.0)
        h = r @ r.T
        scale = jnp.max(jnp.diagonal(h))
        h = h / jnp.where(scale > 0, scale, 1.0)  # largest diagonal entry 1 (or all 0)
        both = valid[:, None] & valid[None, :]
        h = jnp.where(both, h, 0.0) + jnp.diag(jnp.where(valid, ridge, 1.0))
        alpha = jnp.linalg.solve(h, valid.astype(xs.dtype))
        x_new = (alpha / jnp.sum(alpha)) @ gs
        slot = k % m
        return xs.at[slot].set(x_new), gs.at[slot].set(fmap(x_new)), k + 1

    def newest(state: Any) -> tuple[jax.Array, jax.Array]:
        xs, gs, k = state
        return xs[(k - 1) % m], gs[(k - 1) % m]

    def point(state: Any) -> PyTree:
        return unravel_box[0](newest(state)[0])

    def norm(state: Any) -> jax.Array:
        x, g = newest(state)
        return _tree_norm(g - x)  # scaled: a float32 residual of 1e-20 is not 0

    return _Method(init, step, point, norm)


#: The solvers of each entry point, with the options each one takes and their defaults.
_FIXED_POINT_SOLVERS: dict[str, Callable[[LinearMap, dict[str, Any]], _Method]] = {
    "iterate": _iterate_method,
    "anderson": _anderson_method,
    "newton": _newton_method,
}
_ROOT_SOLVERS: dict[str, Callable[[LinearMap, dict[str, Any]], _Method]] = {
    "newton": _newton_method,
}
_SOLVER_OPTIONS: dict[str, dict[str, Any]] = {
    "iterate": {},
    "anderson": {"memory": 5, "regularization": 1e-10},
    "newton": {},
}
_DEFAULT_MAX_ITER = {"iterate": 1000, "anderson": 1000, "newton": 50}
_ADJOINTS = ("implicit", "unrolled")


def _loop(
    method: _Method, x0: PyTree, tol: float | jax.Array, max_iter: int
) -> tuple[PyTree, SolverInfo]:
    """Run ``method`` until ``norm <= tol`` or ``max_iter`` steps, in a ``while_loop``.

    Never differentiated (``custom_root`` hides it). ``tol`` the Python number 0
    runs exactly ``max_iter`` steps with a static trip count and no norm per step.
    """
    state = method.init(x0)
    if _static_zero(tol):
        state = lax.fori_loop(0, max_iter, lambda _, s: method.step(s), state)
        res = method.norm(state)
        return method.point(state), SolverInfo(
            jnp.asarray(max_iter, jnp.int32), res, res <= tol
        )

    def cond(carry: tuple[Any, jax.Array]) -> jax.Array:
        state, k = carry
        return (k < max_iter) & (method.norm(state) > tol)

    def body(carry: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
        state, k = carry
        return method.step(state), k + 1

    state, k = lax.while_loop(cond, body, (state, jnp.asarray(0, jnp.int32)))
    res = method.norm(state)
    return method.point(state), SolverInfo(k, res, res <= tol)


def _unrolled(
    method: _Method, x0: PyTree, tol: float | jax.Array, max_iter: int
) -> tuple[PyTree, SolverInfo]:
    """Run ``method`` for ``max_iter`` steps in a ``lax.scan``, differentiated through.

    With ``tol > 0`` the state freezes once ``norm <= tol`` (the remaining steps are
    no-ops), so it stops where :func:`_loop` stops. The diagnostics carry no derivative.
    """
    state = method.init(x0)
    if _static_zero(tol):
        state, _ = lax.scan(
            lambda s, _: (method.step(s), None), state, None, length=max_iter
        )
        k = jnp.asarray(max_iter, jnp.int32)
    else:

        def body(carry: tuple[Any, jax.Array], _: None) -> Any:
            state, k = carry
            done = lax.stop_gradient(method.norm(state)) <= tol
            new = method.step(state)
            state = jax.tree_util.tree_map(
                lambda old, nxt: jnp.where(done, old, nxt), state, new
            )
            return (state, k + jnp.where(done, 0, 1).astype(jnp.int32)), None

        (state, k), _ = lax.scan(
            body, (state, jnp.asarray(0, jnp.int32)), None, length=max_iter
        )
    res = lax.stop_gradient(method.norm(state))
    return method.point(state), SolverInfo(k, res, res <= tol)


def _implicit(
    method_of: Callable[[LinearMap], _Method],
    root_fn: LinearMap,
    x0: PyTree,
    tol: float | jax.Array,
    max_iter: int,
    tangent_solver: TangentSolver,
) -> tuple[PyTree, SolverInfo]:
    """:func:`_loop` inside ``lax.custom_root(..., has_aux=True)``: the derivative is the
    implicit one, with the tangent solve that :func:`_tangent` makes of
    ``tangent_solver``.

    The aux is the iteration count (int32) and the residual; ``converged`` is rebuilt
    after. :func:`beyondgrad.compat.custom_root_with_aux` handles the JAX versions
    whose ``custom_root`` cannot differentiate with an integer aux.
    """

    def solve(g: LinearMap, x: PyTree) -> tuple[PyTree, tuple[jax.Array, ...]]:
        # the solve sees only custom_root's root function g (== root_fn, no derivative)
        root, info = _loop(method_of(g), x, tol, max_iter)
        return root, (info.iterations.astype(jnp.int32), info.residual)

    root, (iterations, residual) = compat.custom_root_with_aux(
        root_fn, x0, solve, _tangent(tangent_solver, x0)
    )
    return root, SolverInfo(iterations, residual, residual <= tol)


def _options(
    name: str,
    solver: object,
    solvers: dict[str, Any],
    adjoint: object,
    given: dict[str, Any],
) -> dict[str, Any]:
    """Check ``solver``, ``adjoint`` and the options passed; return the solver's options.

    An option that the chosen solver or adjoint does not use is an error, not ignored.
    """
    if not isinstance(solver, str) or solver not in solvers:
        raise ValueError(
            f"{name}: solver must be one of {tuple(solvers)}, got {solver!r}"
        )
    if not isinstance(adjoint, str) or adjoint not in _ADJOINTS:
        raise ValueError(
            f"{name}: adjoint must be one of {_ADJOINTS} ('implicit': the implicit "
            f"function theorem; 'unrolled': through the iterations), got {adjoint!r}"
        )
    if adjoint == "unrolled" and given.get("tangent_solver") is not None:
        raise TypeError(
            f"{name}: adjoint='unrolled' differentiates through the iterations and "
            f"solves no linear system, so tangent_solver={given['tangent_solver']!r} "
            "would be ignored: drop it, or use adjoint='implicit'"
        )
    defaults = _SOLVER_OPTIONS[solver]
    options: dict[str, Any] = {}
    for option in ("memory", "regularization"):
        value = given.get(option)
        if option not in defaults:
            if value is not None:
                users = [s for s, opts in _SOLVER_OPTIONS.items() if option in opts]
                raise TypeError(
                    f"{name}: {option}={value!r} applies to solver={users[0]!r} only; "
                    f"solver={solver!r} would ignore it: drop it or pass "
                    f"solver={users[0]!r}"
                )
            continue
        options[option] = defaults[option] if value is None else value
    if "memory" in options:
        _checks.integer(options["memory"], "memory", minimum=2, where=f"{name}: ")
    if "regularization" in options:
        _checks.number(
            options["regularization"], "regularization", at_least=0, where=f"{name}: "
        )
    return options


def _solve(
    name: str,
    root_fn: LinearMap,
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    solver: str,
    solvers: dict[str, Callable[[LinearMap, dict[str, Any]], _Method]],
    adjoint: str,
    tol: float | jax.Array,
    max_iter: int | None,
    throw: bool,
    given: dict[str, Any],
) -> tuple[PyTree, SolverInfo]:
    options = _options(name, solver, solvers, adjoint, given)
    if max_iter is None:
        max_iter = _DEFAULT_MAX_ITER[solver]
    given_tangent = given.get("tangent_solver")
    tangent_solver: TangentSolver = "dense" if given_tangent is None else given_tangent
    _check_args(name, f, x0, params, tol, max_iter, tangent_solver)
    _check_throw(name, throw)
    if solver in _LU_SOLVERS:
        half = _half_dtypes(x0)
        if half:
            raise TypeError(
                f"{name}: solver={solver!r} solves a linear system with JAX's LU at "
                f"every step, which takes no half-precision state ({half[0]}); use "
                "fixed_point's solver='iterate' (with tangent_solver='cg'), or keep "
                "the state in float32"
            )

    def method_of(F: LinearMap) -> _Method:
        return solvers[solver](F, options)

    if adjoint == "implicit":
        x, info = _implicit(method_of, root_fn, x0, tol, max_iter, tangent_solver)
    else:
        x, info = _unrolled(method_of(root_fn), x0, tol, max_iter)
    _raise_unless_converged(
        name, info, tol, max_iter, throw, (("x0", x0), ("params", params))
    )
    return x, info


def fixed_point(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    solver: FixedPointSolver = "iterate",
    adjoint: Adjoint = "implicit",
    tol: float | jax.Array = 1e-6,
    max_iter: int | None = None,
    throw: bool = True,
    tangent_solver: TangentSolver | None = None,
    memory: int | None = None,
    regularization: float | None = None,
) -> tuple[PyTree, SolverInfo]:
    """The fixed point ``x* = f(x*, params)``, differentiable w.r.t. ``params``.

    The solve stops when ``||f(x, params) - x||_2 <= tol`` (norm over all leaves) or
    after ``max_iter`` steps. ``solver`` picks how: ``"iterate"`` (``x <- f(x)``),
    ``"anderson"`` (Anderson acceleration over the last ``memory`` iterates) or
    ``"newton"`` (Newton on ``F(x) = f(x) - x``, with ``∂F/∂x`` built densely: at most
    a few thousand unknowns). ``adjoint`` picks the derivative: ``"implicit"`` wraps
    the solve in ``lax.custom_root`` on ``F``, so
    ``dx* = (I - ∂f/∂x)^{-1} ∂f/∂params · dparams`` costs one linear solve with
    ``tangent_solver`` whatever the number of steps, and the derivative w.r.t. ``x0``
    is zero; ``"unrolled"`` runs the same steps in a ``lax.scan`` and differentiates
    through them (the state freezes once the tolerance is met, so both stop at the
    same point; but the ``scan`` has ``max_iter`` steps, and reverse mode stores the
    residuals of all of them, frozen ones included: memory grows with ``max_iter``, not
    with the steps taken, so keep ``max_iter`` near the steps a solve needs). Forward
    and reverse mode, ``jit`` and ``vmap`` all work.

    Args:
        f: The map, ``f(x, params)``, returning a pytree shaped like ``x``.
        x0: The starting point: a pytree of floating arrays.
        params: What ``f`` depends on (any pytree); derivatives flow to it.
        solver: ``"iterate"``, ``"anderson"`` or ``"newton"``.
        adjoint: ``"implicit"`` (implicit function theorem) or ``"unrolled"``.
        tol: Residual norm to reach: a Python float ``>= 0`` or a 0-d float array
            (which may be traced: one compilation serves every tolerance). The
            Python number ``0`` runs exactly ``max_iter`` steps (a static trip count,
            no check per step); an array equal to 0 is an ordinary tolerance, met
            only by a residual of exactly 0.
        max_iter: Most steps; ``None`` means 1000 (``"iterate"``, ``"anderson"``) or
            50 (``"newton"``).
        throw: Raise :class:`SolverError` when the solve does not converge (the
            default); ``False`` returns the state and leaves ``info.converged`` to
            the caller. With ``tol=0`` only a non-finite residual is a failure.
        tangent_solver: ``adjoint="implicit"`` only: ``"dense"`` (the default),
            ``"gmres"``, ``"cg"`` or a function ``(g, y) -> x`` solving ``g(x) = y``.
            A float16 or bfloat16 state takes ``"cg"`` only, with
            ``solver="iterate"`` (JAX's LU and ``gmres`` refuse half precision:
            ``"dense"``, ``"gmres"``, ``"anderson"`` and ``"newton"`` raise
            ``TypeError``).
        memory: ``solver="anderson"`` only: iterates kept (an int ``>= 2``; 5).
        regularization: ``solver="anderson"`` only: ridge added to the
            least-squares solve for the weights, relative to its scale (``1e-10``;
            at least ``10 ε`` of ``x0``'s dtype, so float32 gets ``1.2e-6``).

    Returns:
        ``(x_star, info)``: the fixed point (structured like ``x0``) and a
        :class:`SolverInfo` (iterations, residual, converged), which carries no
        derivative.

    Raises:
        SolverError: With ``throw=True``, when the residual is above ``tol`` after
            ``max_iter`` steps, or not finite (a NaN parameter). Under ``jit`` the
            check runs on the host and the error arrives as JAX's runtime error
            (``jax.errors.JaxRuntimeError``), quoting the message; under an eager
            ``vmap`` or ``grad`` it arrives as itself.
        TypeError: ``f`` not callable, ``x0`` not floating, ``f`` returning another
            structure, shape or dtype than ``x0``, ``throw`` not a bool, or an option
            that the chosen ``solver`` or ``adjoint`` does not use (``memory`` without
            ``"anderson"``, ``tangent_solver`` with ``"unrolled"``); a float16 or
            bfloat16 state with ``"anderson"`` or ``"newton"`` (JAX's LU).
        ValueError: An unknown ``solver``, ``adjoint`` or ``tangent_solver``; a
            negative or non-finite ``tol``; ``max_iter < 1``; ``memory < 2``; a
            negative ``regularization``.
    """
    return _solve(
        "fixed_point",
        _fixed_point_residual(f, params),
        f,
        x0,
        params,
        solver,
        _FIXED_POINT_SOLVERS,
        adjoint,
        tol,
        max_iter,
        throw,
        {
            "tangent_solver": tangent_solver,
            "memory": memory,
            "regularization": regularization,
        },
    )


def root_find(
    f: Callable[[PyTree, PyTree], PyTree],
    x0: PyTree,
    params: PyTree,
    *,
    solver: RootSolver = "newton",
    adjoint: Adjoint = "implicit",
    tol: float | jax.Array = 1e-6,
    max_iter: int | None = None,
    throw: bool = True,
    tangent_solver: TangentSolver | None = None,
) -> tuple[PyTree, SolverInfo]:
    """A root ``f(x*, params) = 0``, differentiable w.r.t. ``params``.

    The solve (``solver="newton"``: ``x <- x - J(x)^{-1} f(x, params)`` with
    ``J = ∂f/∂x`` built densely, so at most a few thousand unknowns) stops when
    ``||f(x, params)||_2 <= tol`` or after ``max_iter`` steps. With
    ``adjoint="implicit"`` the derivative is
    ``dx* = -(∂f/∂x)^{-1} ∂f/∂params · dparams`` through ``lax.custom_root`` and
    ``tangent_solver``; with ``"unrolled"`` it goes through the Newton steps.

    Args:
        f: The equation, ``f(x, params)``, returning a pytree shaped like ``x``.
        x0: The starting point: a pytree of floating arrays.
        params: What ``f`` depends on (any pytree); derivatives flow to it.
        solver: ``"newton"`` (the only root finder).
        adjoint: ``"implicit"`` (implicit function theorem) or ``"unrolled"``.
        tol: Residual norm to reach (as in :func:`fixed_point`).
        max_iter: Most steps; ``None`` means 50.
        throw: Raise :class:`SolverError` when the solve does not converge (the
            default); ``False`` returns the state.
        tangent_solver: ``adjoint="implicit"`` only, as in :func:`fixed_point`.

    Returns:
        ``(x_star, info)``: the root (structured like ``x0``) and its
        :class:`SolverInfo`.

    Raises:
        SolverError: With ``throw=True``, when the solve does not converge (as in
            :func:`fixed_point`).
        TypeError: As in :func:`fixed_point`.
        ValueError: As in :func:`fixed_point`.
    """

    def root_fn(x: PyTree) -> PyTree:
        return f(x, params)

    return _solve(
        "root_find",
        root_fn,
        f,
        x0,
        params,
        solver,
        _ROOT_SOLVERS,
        adjoint,
        tol,
        max_iter,
        throw,
        {"tangent_solver": tangent_solver},
    )
