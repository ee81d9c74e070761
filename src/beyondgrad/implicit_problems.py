"""The worked problems of Chapter 3 and the experiments that measure them.

A deep-equilibrium (DEQ) layer ``z* = tanh(W z* + U x + b)`` with a contractive ``W``
and its closed-form gradient, and ridge regression ``w*(lam) = argmin_w
0.5||Xw - y||^2 + 0.5 lam ||w||^2`` with its closed-form derivative: the problems
:mod:`beyondgrad.implicit` is exercised on. Chapter 3 defines them in view and checks
that these copies, which its experiments, ``benchmarks/implicit_vs_unrolled.py``, the
exercise checkers and the tests use, agree with its own.

The experiments (:func:`benchmark_implicit_vs_unrolled`, :func:`compare_solvers`) time
with :mod:`beyondgrad.measure` (wall clock, warm-up, interleaved repeats; the minimum is
reported) and measure memory as XLA's compiled temporary bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks, measure
from beyondgrad.implicit import Adjoint, SolverInfo, TangentSolver, fixed_point

__all__ = [
    "BenchmarkRow",
    "SolverComparison",
    "benchmark_implicit_vs_unrolled",
    "compare_solvers",
    "deq_layer",
    "deq_params",
    "deq_reference_grad_W",
    "ridge_closed_form",
    "ridge_normal_equations",
]


# ---------------------------------------------------------------- the problems


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

    Args:
        z: The state, shape ``(d,)``.
        params: A dict with ``W`` (d, d), ``U`` (d, d_in), ``b`` (d,), ``x`` (d_in,),
            as :func:`deq_params` makes.

    Returns:
        The next state, shape ``(d,)``.

    Raises:
        TypeError: ``params`` lacks one of the keys.
        ValueError: ``z`` does not match ``W``.
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
    (Banach: ``||z_k - z*|| <= r^k ||z_0 - z*|| <= r^k / (1 - r) ||z_1 - z_0||`` with
    ``r = radius``), and ``I - ∂f/∂z`` is invertible: the implicit derivative exists. A small ``input_scale`` (the size of
    ``U x``) keeps ``tanh`` near its linear regime, where the contraction factor is close
    to ``radius`` and plain iteration is slow.

    Args:
        key: A PRNG key (``jax.random.key(0)``; a raw ``PRNGKey`` draws the same).
        d: State size.
        d_in: Input size.
        radius: Contraction factor ``||W||_2``, in ``(0, 1)``.
        input_scale: Size of ``U x`` and ``b``.
        dtype: A floating dtype.

    Returns:
        The dict ``{"W", "U", "b", "x"}`` that :func:`deq_layer` takes.

    Raises:
        TypeError: A size that is not an int ``>= 1``, a non-floating ``dtype``, a
            ``key`` that is not a key array.
        ValueError: ``radius`` outside ``(0, 1)``.
    """
    for name, value in (("d", d), ("d_in", d_in)):
        _checks.integer(value, name, minimum=1, meaning="a size", where="deq_params: ")
    _checks.number(
        radius,
        "radius",
        above=0,
        below=1,
        meaning="for a contraction",
        where="deq_params: ",
    )
    _checks.number(input_scale, "input_scale", where="deq_params: ")
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

    Args:
        params: The layer's parameters (:func:`deq_params`).
        z_star: The fixed point, shape ``(d,)``.
        cotangent: ``c``, shape ``(d,)``.

    Returns:
        ``∂(c·z*)/∂W``, shape ``(d, d)``.

    Raises:
        TypeError: ``params`` lacks one of the keys.
        ValueError: ``z_star`` or ``cotangent`` does not match ``W``.
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
    """Gradient of ``0.5||Xw - y||^2 + 0.5 lam ||w||^2``; its root is the ridge solution.

    Args:
        w: Weights, shape ``(p,)``.
        lam: The ridge penalty.
        X: Design matrix, shape ``(n, p)``.
        y: Targets, shape ``(n,)``.

    Returns:
        ``X^T (X w - y) + lam w``, shape ``(p,)``.

    Raises:
        ValueError: Shapes that do not match.
    """
    _check_ridge(X, y, w)
    return X.T @ (X @ w - y) + lam * w


def ridge_closed_form(
    lam: jax.Array, X: jax.Array, y: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """``w*(lam) = (X^T X + lam I)^{-1} X^T y`` and ``dw*/dlam = -(X^T X + lam I)^{-1} w*``.

    Args:
        lam: The ridge penalty.
        X: Design matrix, shape ``(n, p)``.
        y: Targets, shape ``(n,)``.

    Returns:
        ``(w_star, dw_star_dlam)``, each of shape ``(p,)``.

    Raises:
        ValueError: Shapes that do not match.
    """
    _check_ridge(X, y, None)
    a = X.T @ X + lam * jnp.eye(X.shape[1], dtype=X.dtype)
    w = jnp.linalg.solve(a, X.T @ y)
    return w, -jnp.linalg.solve(a, w)


# ------------------------------------------------------------- the experiments


class BenchmarkRow(NamedTuple):
    """Implicit vs unrolled DEQ gradient at one iteration count (min seconds, bytes)."""

    iterations: int
    fwd_implicit: (
        float  # forward solve, convergence check on every step (unreachable tol)
    )
    fwd_nocheck: float  # forward solve, static trip count (tol=0)
    grad_implicit: float  # value_and_grad through fixed_point (with the check)
    bwd_implicit: float  # the pullback alone: the cost beyond the forward solve
    fwd_unrolled: float
    grad_unrolled: float
    bwd_unrolled: float
    mem_implicit: int | None  # compiled temp bytes of the jitted gradient
    mem_unrolled: int | None


def _check_sizes(d: object, repeats: object, min_time: object) -> None:
    _checks.integer(d, "d", minimum=2, meaning="the state size")
    _checks.integer(repeats, "repeats", minimum=1)
    _checks.number(min_time, "min_time", at_least=0, meaning="seconds")


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
    ``tol=0`` (a static trip count, no check). The unrolled version is a ``scan``
    (``adjoint="unrolled"``).

    Args:
        iteration_counts: The step counts ``N``, a tuple of ints ``>= 1``.
        d: Layer width.
        repeats: Timing repeats (the minimum is kept).
        min_time: Seconds each timed sample lasts at least.
        tangent_solver: The implicit gradient's tangent solve.

    Returns:
        One :class:`BenchmarkRow` per count: times in seconds, XLA temporary bytes.

    Raises:
        ValueError: Bad counts, sizes or timing options.
    """
    _check_sizes(d, repeats, min_time)
    counts = (
        tuple(iteration_counts) if isinstance(iteration_counts, (tuple, list)) else ()
    )
    if not counts:
        raise ValueError(
            "iteration_counts must be a non-empty tuple of ints >= 1, e.g. (100, 1000), "
            f"got {iteration_counts!r}"
        )
    for k, n in enumerate(counts):
        _checks.integer(n, f"iteration_counts[{k}]", minimum=1)
    params = deq_params(jax.random.key(0), d=d, d_in=16, radius=0.99, input_scale=0.1)
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)
    w = params["W"]

    def loss(adjoint: Adjoint, n: int, tol: float) -> Callable[[jax.Array], jax.Array]:
        tangent = None if adjoint == "unrolled" else tangent_solver

        def fn(w: jax.Array) -> jax.Array:
            p = {**params, "W": w}
            # tol=1e-30 is never met on purpose: no convergence check (throw=False)
            z, _ = fixed_point(
                deq_layer,
                z0,
                p,
                adjoint=adjoint,
                tol=tol,
                max_iter=n,
                throw=False,
                tangent_solver=tangent,
            )
            return c @ z

        return fn

    def pullback(fn: Callable) -> tuple[Callable, tuple[Any, ...]]:
        _, vjp_fn = jax.vjp(fn, w)
        return jax.jit(lambda pb, ct: pb(ct)), (vjp_fn, jnp.ones((), jnp.float32))

    rows = []
    for n in counts:
        imp, imp0, unr = (
            loss("implicit", n, 1e-30),
            loss("implicit", n, 0.0),
            loss("unrolled", n, 0.0),
        )
        grad_imp, grad_unr = (
            jax.jit(jax.value_and_grad(imp)),
            jax.jit(jax.value_and_grad(unr)),
        )
        timings = measure.time_calls(
            [
                (jax.jit(imp), (w,)),
                (jax.jit(imp0), (w,)),
                (grad_imp, (w,)),
                pullback(imp),
                (jax.jit(unr), (w,)),
                (grad_unr, (w,)),
                pullback(unr),
            ],
            repeats=repeats,
            min_time=min_time,
        )
        times = [t.min for t in timings]
        mems = measure.temp_bytes(grad_imp, w), measure.temp_bytes(grad_unr, w)
        rows.append(BenchmarkRow._make([n, *times, *mems]))
    return rows


class SolverComparison(NamedTuple):
    """One solver under the shared ``custom_root`` rule: its gradient and its time (s)."""

    name: str
    iterations: int
    residual: float
    grad_time: float
    grad: np.ndarray


def compare_solvers(
    d: int = 64,
    tol: float = 1e-5,
    repeats: int = 7,
    min_time: float = 0.05,
    radius: float = 0.999,
    input_scale: float = 0.01,
) -> list[SolverComparison]:
    """Solve one DEQ fixed point to ``tol`` by plain iteration, Anderson and Newton; time each and its gradient.

    The default layer contracts slowly (``||W||_2 = 0.999``, small inputs keep ``tanh``
    near-linear), the regime where plain iteration needs hundreds of steps.

    Args:
        d: Layer width.
        tol: The solvers' tolerance, a float ``> 0``.
        repeats: Timing repeats (the minimum is kept).
        min_time: Seconds each timed sample lasts at least.
        radius: ``||W||_2``.
        input_scale: Size of the inputs ``U x`` and ``b``.

    Returns:
        One :class:`SolverComparison` per solver: plain iteration, Anderson, Newton.

    Raises:
        ValueError: Bad sizes, tolerance or timing options.
    """
    _check_sizes(d, repeats, min_time)
    _checks.number(tol, "tol", above=0, example="1e-5")
    params = deq_params(
        jax.random.key(0), d=d, d_in=16, radius=radius, input_scale=input_scale
    )
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)

    solvers = {
        "fixed-point iteration": lambda p: fixed_point(
            deq_layer, z0, p, tol=tol, max_iter=100_000
        ),
        "Anderson (m=5)": lambda p: fixed_point(
            deq_layer, z0, p, solver="anderson", memory=5, tol=tol, max_iter=10_000
        ),
        "Newton": lambda p: fixed_point(
            deq_layer, z0, p, solver="newton", tol=tol, max_iter=100
        ),
    }
    runs = []
    for name, solve in solvers.items():

        def loss(w: jax.Array, solve=solve) -> tuple[jax.Array, SolverInfo]:
            z, info = solve({**params, "W": w})
            return c @ z, info

        grad = jax.jit(jax.grad(loss, has_aux=True))
        runs.append((name, grad, grad(params["W"])))
    calls = [(grad, (params["W"],)) for _, grad, _ in runs]
    timings = measure.time_calls(calls, repeats=repeats, min_time=min_time)
    return [
        SolverComparison(
            name, int(info.iterations), float(info.residual), t.min, np.asarray(g)
        )
        for (name, _, (g, info)), t in zip(runs, timings)
    ]
