"""Laplacians of scalar functions, and of log|det| in particular (Chapter 5).

For a scalar function :math:`f:\\mathbb{R}^d\\to\\mathbb{R}` the Laplacian is the trace
of its Hessian, :math:`\\Delta f(x) = \\sum_i \\partial^2 f/\\partial x_i^2 = \\operatorname{tr} H_f(x)`.
:func:`laplacian` computes it in five ways that give the same number (the last one in
expectation):

``"hessian"``
    ``jnp.trace(jax.hessian(f)(x))``: builds all :math:`d^2` entries.
``"loop"``
    linearize ``grad f`` once at ``x`` and loop (``lax.fori_loop``) over the basis
    vectors :math:`e_i`, adding :math:`e_i^\\top H e_i`: one Hessian-vector product at a
    time, little memory (FermiNet's default).
``"vmap"``
    the same Hessian-vector products, all at once with ``vmap``: faster, :math:`d`
    times the memory of one product.
``"folx"``
    folx's forward Laplacian (``folx.forward_laplacian``): propagates value, gradient
    and Laplacian together through the function in one forward pass.
``"hutchinson"``
    the unbiased stochastic estimate :math:`\\frac1S\\sum_s v_s^\\top H v_s` with
    Rademacher probes :math:`v_s` (``E[v v^\\top] = I``).

Every method works under ``jit``, ``vmap``, ``grad`` with respect to closed-over
parameters, and inside ``shard_map`` with ``check_vma=True``: the internal constants
(the identity basis, the probes, the loop's initial carry) are given the varying mesh
axes of ``x`` (:func:`beyondgrad.compat.pcast_varying`), which is what the seed of the
chapter (jax-ml/jax#33947) was missing.

Determinant wavefunctions and VMC energies live in :mod:`beyondgrad.slater`; the
names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
from jax import lax

from beyondgrad import compat

Method = Literal["hessian", "loop", "vmap", "folx", "hutchinson"]
METHODS: tuple[str, ...] = ("hessian", "loop", "vmap", "folx", "hutchinson")


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"unknown Laplacian method {method!r}; expected one of {', '.join(map(repr, METHODS))}")


def _check_input(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    if not callable(f):
        raise TypeError(f"f must be a function of a 1-D array, got {type(f).__name__}")
    x = jnp.asarray(x)
    if x.ndim != 1:
        raise ValueError(
            f"x must be a 1-D array (flatten it, e.g. x.reshape(-1)), got shape {x.shape}; "
            "for a batch of points use jax.vmap over laplacian"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be a floating-point array, got dtype {x.dtype}")
    out = jax.eval_shape(f, x)
    if getattr(out, "shape", None) != ():
        raise ValueError(f"f must return a scalar (shape ()), got {getattr(out, 'shape', type(out).__name__)}")
    return x


def _varying_like(value: jax.Array, like: jax.Array) -> jax.Array:
    """``value`` cast to vary over the mesh axes that ``like`` varies over (no-op outside shard_map)."""
    return compat.pcast_varying(value, tuple(sorted(compat.varying_axes(like))))


def basis(x: jax.Array) -> jax.Array:
    """The identity basis ``eye(d)`` of ``x``'s space, with ``x``'s dtype and varying axes.

    Inside ``shard_map`` a tangent must have the same varying type as its primal; a bare
    ``jnp.eye`` is invariant, so it is cast to the axes of ``x`` here.
    """
    return _varying_like(jnp.eye(x.shape[0], dtype=x.dtype), x)


def grad_and_laplacian(
    f: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    *,
    method: Method = "loop",
    key: jax.Array | None = None,
    num_samples: int = 16,
    sparsity_threshold: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """``(∇f(x), Δf(x))`` computed together (the gradient comes for free in most methods).

    See :func:`laplacian` for the methods and arguments; the gradient is exact for every
    method (only the Laplacian of ``"hutchinson"`` is stochastic).
    """
    _check_method(method)
    x = _check_input(f, x)
    if method == "hutchinson":
        if key is None:
            raise ValueError("method='hutchinson' needs a PRNG key: pass key=jax.random.key(0)")
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    grad_f = jax.grad(f)
    if method == "hessian":
        return grad_f(x), jnp.trace(jax.hessian(f)(x))
    if method == "folx":
        import folx  # optional dependency (the 'chapters' extra)

        out = folx.forward_laplacian(f, sparsity_threshold=sparsity_threshold)(x)
        return grad_f(x), out.laplacian
    g, hvp = jax.linearize(grad_f, x)  # hvp(v) = H v, reusing the linearization
    if method == "loop":
        eye = basis(x)

        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            return acc + hvp(eye[i])[i]

        # the carry starts varying like g (zeros_like keeps the type), not as an invariant 0.0
        return g, lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(g[0]))
    if method == "vmap":
        return g, jnp.trace(jax.vmap(hvp)(basis(x)))
    probes = hutchinson_probes(key, x, num_samples)
    return g, jnp.mean(jnp.sum(jax.vmap(hvp)(probes) * probes, axis=-1))


def hutchinson_probes(key: jax.Array, x: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` Rademacher vectors (entries ±1) shaped like ``x``, varying like ``x``."""
    v = jax.random.rademacher(key, (num_samples, x.shape[0]), dtype=x.dtype)
    return _varying_like(v, x)


def hutchinson_samples(
    f: Callable[[jax.Array], jax.Array], x: jax.Array, key: jax.Array, num_samples: int
) -> jax.Array:
    """The individual Hutchinson estimates :math:`v_s^\\top H_f(x) v_s`, shape ``(num_samples,)``.

    Their mean is ``laplacian(f, x, method="hutchinson", ...)``; their variance over
    ``num_samples`` is the estimator's variance (for Rademacher probes
    :math:`2\\sum_{i\\ne j} H_{ij}^2` per sample).
    """
    x = _check_input(f, x)
    _, hvp = jax.linearize(jax.grad(f), x)
    probes = hutchinson_probes(key, x, num_samples)
    return jnp.sum(jax.vmap(hvp)(probes) * probes, axis=-1)


def laplacian(
    f: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    *,
    method: Method = "loop",
    key: jax.Array | None = None,
    num_samples: int = 16,
    sparsity_threshold: int = 0,
) -> jax.Array:
    """The Laplacian :math:`\\Delta f(x)=\\operatorname{tr}\\nabla^2 f(x)` of a scalar ``f`` at a 1-D ``x``.

    ``method`` is one of ``"hessian"``, ``"loop"``, ``"vmap"``, ``"folx"``, ``"hutchinson"``
    (see the module docstring). ``"hutchinson"`` needs ``key`` and averages
    ``num_samples`` Rademacher probes; ``"folx"`` passes ``sparsity_threshold`` to
    ``folx.forward_laplacian`` (0 = dense). Returns a scalar of ``x``'s dtype.

    Raises ``ValueError`` for an unknown method, a non-1-D ``x`` or a non-scalar ``f``.
    """
    return grad_and_laplacian(
        f, x, method=method, key=key, num_samples=num_samples, sparsity_threshold=sparsity_threshold
    )[1]


def kinetic_energy(
    log_psi: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    *,
    method: Method = "loop",
    key: jax.Array | None = None,
    num_samples: int = 16,
    sparsity_threshold: int = 0,
) -> jax.Array:
    """Local kinetic energy :math:`-\\tfrac12(\\Delta\\log|\\psi| + |\\nabla\\log|\\psi||^2)` at ``x``.

    This is :math:`-\\tfrac12 \\Delta\\psi/\\psi` (units ħ = m = 1), written with
    log|ψ| so that it never forms ψ itself. ``x`` may have any shape (e.g. ``(n, 3)``
    electron positions): ``log_psi`` is called with an array of that shape, and the
    derivatives are taken with respect to all its entries.
    """
    x = jnp.asarray(x)
    shape = x.shape

    def flat(v: jax.Array) -> jax.Array:
        return log_psi(v.reshape(shape))

    g, lap = grad_and_laplacian(
        flat, x.reshape(-1), method=method, key=key, num_samples=num_samples, sparsity_threshold=sparsity_threshold
    )
    return -0.5 * (lap + jnp.sum(g * g))


# ---------------------------------------------------------------------------------------
# Measuring cost


def time_call(fn: Callable[..., Any], *args: Any, repeats: int = 5) -> tuple[float, float]:
    """``(first-call seconds minus one run, median seconds of `repeats` runs)`` of a jitted ``fn``.

    The first call compiles; the difference to a warm call is the compile time.
    """
    import statistics
    import time

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        runs.append(time.perf_counter() - t0)
    median = statistics.median(runs)
    return max(first - median, 0.0), median


# ---------------------------------------------------------------------------------------
# The widget's callback: Hutchinson's cost/variance trade-off


def hutchinson_tradeoff(profile: dict[int, dict[str, float]], n: int, num_samples: int) -> dict[str, float]:
    r"""Cost and statistical error of a ``num_samples``-probe Hutchinson Laplacian at ``n`` electrons.

    ``profile[n]`` holds measured numbers: ``"probe_seconds"`` (one Hessian-vector
    product), ``"sample_variance"`` (variance of one probe's estimate
    :math:`v^\top H v`), ``"exact_seconds"`` (the exact loop method, :math:`3n`
    products) and ``"laplacian"`` (the exact value). Returns the cost
    :math:`S\,t_{probe}`, the standard error :math:`\sqrt{\sigma^2/S}`, that error
    relative to :math:`|\Delta|`, and the cost relative to the exact method.
    """
    if n not in profile:
        raise ValueError(f"no measurements for n = {n}; measured sizes are {sorted(profile)}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    p = profile[n]
    cost = num_samples * p["probe_seconds"]
    std_error = (p["sample_variance"] / num_samples) ** 0.5
    return {
        "cost_seconds": cost,
        "std_error": std_error,
        "relative_error": std_error / max(abs(p["laplacian"]), 1e-30),
        "cost_vs_exact": cost / p["exact_seconds"],
        "probes_for_exact_cost": p["exact_seconds"] / p["probe_seconds"],
    }


def describe_tradeoff(profile: dict[int, dict[str, float]], n: int, num_samples: int) -> str:
    """One line of text for the widget: what ``num_samples`` probes cost and how noisy they are."""
    t = hutchinson_tradeoff(profile, n, num_samples)
    return (
        f"n = {n} electrons (d = {3 * n}), S = {num_samples} probes: cost {1e3 * t['cost_seconds']:.3f} ms "
        f"= {t['cost_vs_exact']:.2f} x the exact loop; std. error {t['std_error']:.3g} "
        f"({100 * t['relative_error']:.1f}% of |Laplacian|)"
    )


def plot_tradeoff(profile: dict[int, dict[str, float]], sample_counts: list[int], axes: Any = None) -> Any:
    """Small multiples, one panel per ``n``: relative std. error (left axis) and cost/exact (right)."""
    import matplotlib.pyplot as plt

    sizes = sorted(profile)
    if axes is None:
        fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes), 2.8), sharey=True, squeeze=False)
        axes = axes[0]
    for ax, n in zip(axes, sizes):
        rows = [hutchinson_tradeoff(profile, n, s) for s in sample_counts]
        ax.loglog(sample_counts, [r["relative_error"] for r in rows], "o-", color="C0", label="rel. std. error")
        ax.set_title(f"n = {n} (d = {3 * n})")
        ax.set_xlabel("probes S")
        twin = ax.twinx()
        twin.loglog(sample_counts, [r["cost_vs_exact"] for r in rows], "s--", color="C1", label="cost / exact")
        twin.axhline(1.0, color="C1", lw=0.8, ls=":")
        if n == sizes[-1]:
            twin.set_ylabel("cost / exact loop", color="C1")
    axes[0].set_ylabel("relative std. error", color="C0")
    return axes


# ---------------------------------------------------------------------------------------
# Exercise checkers


def _exercise_functions() -> list[tuple[str, Callable[[jax.Array], jax.Array], jax.Array]]:
    x6 = jnp.linspace(-0.9, 1.1, 6)

    def mlp(v: jax.Array) -> jax.Array:
        w = jnp.sin(jnp.arange(v.shape[0] * 4.0)).reshape(v.shape[0], 4)
        return jnp.sum(jnp.tanh(v @ w) ** 2)

    def logdet(v: jax.Array) -> jax.Array:
        a = jnp.eye(3) * 2.0 + jnp.outer(v[:3], v[3:]) + jnp.diag(v[:3])
        return jnp.linalg.slogdet(a)[1]

    return [("an MLP", mlp, x6), ("a log|det|", logdet, x6), ("a coupled sin", lambda v: jnp.sin(v @ v), x6[:4])]


def check_loop_laplacian(fn: Callable[..., Any], strict: bool = False) -> Any:
    """Exercise 1: ``fn(f, x)`` must return ``tr H_f(x)``, also under ``jit``."""
    from beyondgrad import exercises as ex

    problems: list[str] = []
    for name, f, x in _exercise_functions():
        got = ex.call_answer(lambda x_: jax.jit(lambda v: fn(f, v))(x_), x, what="your loop Laplacian")
        msg = ex.failed(got)
        if msg:
            problems.append(f"on {name}: {msg}")
            break
        want = jnp.trace(jax.hessian(f)(x))
        problems += [f"on {name}: {m}" for m in ex.tree_mismatches(got, want, rtol=1e-4, atol=1e-4)]
    return ex.verdict("loop Laplacian", problems, success="matches trace(jax.hessian) under jit", strict=strict)


def check_row_update_second_derivative(fn: Callable[..., Any], strict: bool = False) -> Any:
    """Exercise 2: ``fn(a, i, u)`` = d²/dt² log|det(A + t e_i uᵀ)| at t = 0."""
    from beyondgrad import exercises as ex

    problems: list[str] = []
    for seed, (n, i) in enumerate([(3, 0), (4, 2), (5, 4)]):
        ka, ku = jax.random.split(jax.random.key(seed))
        a = jax.random.normal(ka, (n, n)) + 2.0 * jnp.eye(n)
        u = jax.random.normal(ku, (n,))
        row = jnp.zeros((n, n)).at[i].set(u)

        def along(t: jax.Array) -> jax.Array:
            return jnp.linalg.slogdet(a + t * row)[1]

        want = jax.jvp(lambda t: jax.jvp(along, (t,), (1.0,))[1], (0.0,), (1.0,))[1]
        got = ex.call_answer(fn, a, i, u, what="your second derivative")
        msg = ex.failed(got)
        if msg:
            problems.append(msg)
            break
        problems += [f"for n = {n}, row {i}: {m}" for m in ex.tree_mismatches(got, want, rtol=1e-3, atol=1e-4)]
    return ex.verdict("row-update second derivative", problems,
                      success="matches the second derivative of slogdet along the row update", strict=strict)


def check_sharded_kinetic(fn: Callable[..., Any], strict: bool = False) -> Any:
    """Exercise 3: ``fn(log_psi, x)`` (x of shape (n, 3)) must run per walker inside ``shard_map``."""
    from jax.sharding import PartitionSpec as P

    from beyondgrad import exercises as ex
    from beyondgrad import runtime, slater

    mesh = runtime.demo_mesh(8, "data")
    params = slater.init_params(jax.random.key(0), 3, hidden=8)
    walkers = jax.random.normal(jax.random.key(1), (16, 3, 3))

    def log_psi(x: jax.Array) -> jax.Array:
        return slater.mlp_log_psi(params, x)

    want = jax.vmap(lambda x: kinetic_energy(log_psi, x, method="hessian"))(walkers)
    step = jax.shard_map(lambda w: jax.vmap(lambda x: fn(log_psi, x))(w), mesh=mesh, in_specs=P("data"),
                         out_specs=P("data"), check_vma=True)
    got = ex.call_answer(jax.jit(step), walkers, what="your kinetic energy inside shard_map")
    return ex.check_allclose("sharded kinetic energy", got, want, rtol=1e-3, atol=1e-3,
                             success="runs inside shard_map with check_vma=True and matches one device",
                             strict=strict)


__all__ = [
    "METHODS",
    "basis",
    "check_loop_laplacian",
    "check_row_update_second_derivative",
    "check_sharded_kinetic",
    "describe_tradeoff",
    "grad_and_laplacian",
    "hutchinson_tradeoff",
    "plot_tradeoff",
    "time_call",
    "hutchinson_probes",
    "hutchinson_samples",
    "kinetic_energy",
    "laplacian",
]
