"""Figures and the tolerance widget's callback of Chapter 3.

The chapter's worked problems (the deep-equilibrium layer, ridge regression) and the
experiments that time them live in :mod:`beyondgrad.implicit_problems`, beside the idea
they exercise; they are imported here under the names the chapter calls them by
(``figs.deq_params``, ``figs.benchmark_implicit_vs_unrolled``, ``figs.compare_solvers``)
and documented there. The maths is :mod:`beyondgrad.implicit`'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks, implicit_problems
from beyondgrad.implicit import SolverInfo, fixed_point

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["ToleranceReport", "plot_tolerance_report", "tolerance_report"]

# The chapter calls these by these names (figs.<name>); one definition, in
# beyondgrad.implicit_problems.
deq_layer = implicit_problems.deq_layer
deq_params = implicit_problems.deq_params
benchmark_implicit_vs_unrolled = implicit_problems.benchmark_implicit_vs_unrolled
compare_solvers = implicit_problems.compare_solvers


# ------------------------------------------------------------------ the tolerance widget


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

    Args:
        tol: The solver tolerance, a Python float ``> 0``.

    Returns:
        A :class:`ToleranceReport`.

    Raises:
        ValueError: ``tol`` is not a float ``> 0``.
    """
    _checks.number(tol, "tol", above=0, example="1e-6")
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


# ------------------------------------------------------------------------------ figures


def plot_tolerance_report(report: ToleranceReport, ax: Axes | None = None) -> Axes:
    """Scatter the implicit gradient against the exact one (one dot per entry of ``b``).

    Dots on the diagonal mean the implicit gradient is right; the title gives the solver
    tolerance, its iterations and the relative gradient error.

    Args:
        report: What :func:`tolerance_report` returned.
        ax: The axes to draw on; a new 3.2-inch figure when ``None``.

    Returns:
        The axes.

    Raises:
        TypeError: ``report`` is not a :class:`ToleranceReport`.
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
