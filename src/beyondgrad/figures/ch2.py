"""Chapter 2's measurement experiments and plots: Jacobian strategies, timed.

:func:`mlp_map` is the test function (``x -> W2 tanh(W1 x)``);
:func:`jacobian_timings` times ``jacfwd``, ``jacrev`` and linearize-then-materialize on
it with :mod:`beyondgrad.measure` (one clock policy for the book); and
:func:`plot_jacobian_timings` draws the chapter's small-multiples figure (also the
widget's callback). Timings are information only: no exercise is graded on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from beyondgrad import _checks, linear, measure

if TYPE_CHECKING:  # matplotlib is imported only when a figure is drawn
    from matplotlib.figure import Figure

__all__ = ["STRATEGIES", "jacobian_timings", "mlp_map", "plot_jacobian_timings"]

#: The three ways of computing a dense Jacobian that the chapter compares.
STRATEGIES = ("jacfwd", "jacrev", "linearize + materialize")


def _positive_int(name: str, n: object) -> int:
    return _checks.integer(n, name, minimum=1)


def mlp_map(
    n_in: int, n_out: int, *, hidden: int = 32, seed: int = 0
) -> tuple[Callable[[jax.Array], jax.Array], jax.Array]:
    """A smooth map ``R^n_in -> R^n_out``, ``x -> W2 tanh(W1 x)``, and a point ``x``.

    Its Jacobian costs ``n_in`` JVPs column by column or ``n_out`` VJPs row by row,
    each of ``O(hidden * (n_in + n_out))`` work. ``W1``, ``W2`` and ``x`` are normal
    draws from ``jax.random.key(seed)``, scaled by ``1/sqrt(fan-in)``.
    """
    n_in, n_out = _positive_int("n_in", n_in), _positive_int("n_out", n_out)
    hidden = _positive_int("hidden", hidden)
    _checks.integer(seed, "seed")
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    w1 = jax.random.normal(k1, (hidden, n_in)) / math.sqrt(n_in)
    w2 = jax.random.normal(k2, (n_out, hidden)) / math.sqrt(hidden)
    x = jax.random.normal(k3, (n_in,))

    def f(x: jax.Array) -> jax.Array:
        return w2 @ jnp.tanh(w1 @ x)

    return f, x


def jacobian_timings(
    n_in: int,
    n_out: int,
    *,
    hidden: int = 32,
    repeats: int = 5,
    min_time: float = 0.002,
) -> dict[str, measure.Timing]:
    """Seconds to compute the ``n_out x n_in`` Jacobian of :func:`mlp_map` three ways.

    ``jacfwd`` (``n_in`` JVPs), ``jacrev`` (``n_out`` VJPs), and ``linearize +
    materialize`` (one linearization, then ``n_in`` applications of the linear map).
    All are jitted and timed side by side by :func:`beyondgrad.measure.time_calls`
    (warm-up, interleaved repeats, min and median).
    """
    f, x = mlp_map(n_in, n_out, hidden=hidden)

    def lin_mat(x: jax.Array) -> jax.Array:
        return linear.materialize(jax.linearize(f, x)[1], x, check=False)

    fns = [jax.jit(jax.jacfwd(f)), jax.jit(jax.jacrev(f)), jax.jit(lin_mat)]
    timings = measure.time_calls(
        [(fn, (x,)) for fn in fns], repeats=repeats, min_time=min_time
    )
    return dict(zip(STRATEGIES, timings))


def plot_jacobian_timings(
    timings_by_shape: Mapping[tuple[int, int], Mapping[str, measure.Timing]],
) -> Figure:
    """Small multiples: one bar chart of :func:`jacobian_timings` per ``(n_in, n_out)``.

    Bars are the minimum time per Jacobian in milliseconds; each panel's title names the
    shape and the measured ``jacfwd / jacrev`` time ratio. Returns the figure.
    """
    import matplotlib.pyplot as plt

    if not isinstance(timings_by_shape, Mapping) or not timings_by_shape:
        raise ValueError(
            "timings_by_shape must be a non-empty dict "
            "{(n_in, n_out): jacobian_timings(n_in, n_out), ...}"
        )
    for shape, times in timings_by_shape.items():
        missing = [k for k in STRATEGIES if k not in times]
        if missing:
            raise ValueError(
                f"timings for {shape} lack {missing}: use jacobian_timings"
            )
    n = len(timings_by_shape)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.0), squeeze=False)
    colors = ("tab:blue", "tab:orange", "tab:green")
    for ax, ((n_in, n_out), times) in zip(axes[0], timings_by_shape.items()):
        ms = [times[k].min * 1e3 for k in STRATEGIES]
        ax.bar(range(len(STRATEGIES)), ms, color=colors)
        labels = [k.replace(" + ", "\n+ ") for k in STRATEGIES]
        ax.set_xticks(range(len(STRATEGIES)), labels, fontsize=8)
        ratio = times["jacfwd"].min / times["jacrev"].min
        ax.set_title(
            f"{n_in} inputs → {n_out} outputs\njacfwd / jacrev time = {ratio:.2g}",
            fontsize=9,
        )
        ax.set_ylabel("time per Jacobian (ms, min)", fontsize=8)
    fig.tight_layout()
    return fig
