"""Figures, the widget's callback and the measured experiments of Chapter 3.

Timing and memory come from :mod:`beyondgrad.measure` (one clock policy: wall time,
warm-up, interleaved repeats; the minimum over repeats is reported, as in Chapters 1
and 2); the maths is :mod:`beyondgrad.implicit`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import measure
from beyondgrad.implicit import (
    SolverInfo,
    TangentSolver,
    anderson_fixed_point,
    deq_layer,
    deq_params,
    fixed_point,
    newton_root,
    unrolled_fixed_point,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "BenchmarkRow",
    "SolverComparison",
    "ToleranceReport",
    "benchmark_implicit_vs_unrolled",
    "compare_solvers",
    "plot_tolerance_report",
    "tolerance_report",
]


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
        params = deq_params(
            jax.random.key(0), d=16, d_in=4, radius=0.9, dtype=jnp.float64
        )
        z_ref, _ = fixed_point(
            deq_layer, jnp.zeros(16), params, tol=1e-14, max_iter=10_000
        )
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
        raise ValueError(f"tol must be a Python float > 0, e.g. 1e-6, got {tol!r}")
    return _tolerance_report(float(tol))


@functools.lru_cache(maxsize=1)
def _tolerance_grad() -> Callable[[jax.Array, jax.Array], tuple[jax.Array, SolverInfo]]:
    """The jitted implicit gradient, with the tolerance as a traced argument."""
    params, _ = _tolerance_problem()

    def loss(b: jax.Array, tol: jax.Array) -> tuple[jax.Array, SolverInfo]:
        p = {**params, "b": b}
        z, info = fixed_point(deq_layer, jnp.zeros_like(b), p, tol=tol, max_iter=10_000)
        return jnp.sum(z), info

    return jax.jit(jax.grad(loss, has_aux=True))


@functools.lru_cache(maxsize=64)
def _tolerance_report(tol: float) -> ToleranceReport:
    params, ref = _tolerance_problem()
    with jax.enable_x64(True):
        g, info = _tolerance_grad()(params["b"], jnp.float64(tol))
        err = float(jnp.linalg.norm(g - ref) / jnp.linalg.norm(ref))
        return ToleranceReport(
            float(tol),
            int(info.iterations),
            float(info.residual),
            np.asarray(g),
            np.asarray(ref),
            err,
        )


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
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"d must be a Python int >= 2 (the state size), got {d!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a Python int >= 1, got {repeats!r}")
    if (
        isinstance(min_time, bool)
        or not isinstance(min_time, (int, float))
        or min_time < 0
    ):
        raise ValueError(f"min_time must be a number of seconds >= 0, got {min_time!r}")


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
    _check_sizes(d, repeats, min_time)
    counts = (
        tuple(iteration_counts) if isinstance(iteration_counts, (tuple, list)) else ()
    )
    if not counts or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts
    ):
        raise ValueError(
            "iteration_counts must be a non-empty tuple of ints >= 1, e.g. (100, 1000), "
            f"got {iteration_counts!r}"
        )
    params = deq_params(jax.random.key(0), d=d, d_in=16, radius=0.99, input_scale=0.1)
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)
    w = params["W"]

    def loss(solver: Callable, n: int, tol: float) -> Callable[[jax.Array], jax.Array]:
        extra = (
            {} if solver is unrolled_fixed_point else {"tangent_solver": tangent_solver}
        )

        def fn(w: jax.Array) -> jax.Array:
            p = {**params, "W": w}
            # tol=1e-30 is never met on purpose: no convergence check (throw=False)
            z, _ = solver(deq_layer, z0, p, tol=tol, max_iter=n, throw=False, **extra)
            return c @ z

        return fn

    def pullback(fn: Callable) -> tuple[Callable, tuple[Any, ...]]:
        _, vjp_fn = jax.vjp(fn, w)
        return jax.jit(lambda pb, ct: pb(ct)), (vjp_fn, jnp.ones((), jnp.float32))

    rows = []
    for n in counts:
        imp, imp0, unr = (
            loss(fixed_point, n, 1e-30),
            loss(fixed_point, n, 0.0),
            loss(unrolled_fixed_point, n, 0.0),
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
    """
    _check_sizes(d, repeats, min_time)
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"tol must be a Python float > 0, e.g. 1e-5, got {tol!r}")
    params = deq_params(
        jax.random.key(0), d=d, d_in=16, radius=radius, input_scale=input_scale
    )
    z0 = jnp.zeros((d,), jnp.float32)
    c = jnp.linspace(-1.0, 1.0, d, dtype=jnp.float32)

    def residual_map(z: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
        return deq_layer(z, p) - z

    solvers = {
        "fixed-point iteration": lambda p: fixed_point(
            deq_layer, z0, p, tol=tol, max_iter=100_000
        ),
        "Anderson (m=5)": lambda p: anderson_fixed_point(
            deq_layer, z0, p, tol=tol, max_iter=10_000
        ),
        "Newton": lambda p: newton_root(residual_map, z0, p, tol=tol, max_iter=100),
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


# ------------------------------------------------------------------------------ figures


def plot_tolerance_report(report: ToleranceReport, ax: Axes | None = None) -> Axes:
    """Scatter the implicit gradient against the exact one (one dot per entry of ``b``).

    Dots on the diagonal mean the implicit gradient is right; the title gives the solver
    tolerance, its iterations and the relative gradient error. Returns the axes.
    """
    import matplotlib.pyplot as plt

    if not isinstance(report, ToleranceReport):
        raise TypeError(
            "plot_tolerance_report: pass the ToleranceReport from tolerance_report(tol), "
            f"got {type(report).__name__}"
        )

    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    ref, got = report.reference_grad, report.implicit_grad
    lo, hi = float(min(ref.min(), got.min())), float(max(ref.max(), got.max()))
    ax.plot([lo, hi], [lo, hi], color="0.7", lw=1)
    ax.scatter(ref, got, s=14, color="C3" if report.rel_error > 1e-3 else "C0")
    ax.set_xlabel("exact ∂Σz*/∂b")
    ax.set_ylabel("implicit ∂Σz*/∂b")
    ax.set_title(
        f"tol={report.tol:.0e}: {report.iterations} its\nrel. error {report.rel_error:.1e}",
        fontsize=9,
    )
    return ax
