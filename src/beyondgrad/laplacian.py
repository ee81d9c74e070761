"""Laplacians of scalar functions (Chapter 5).

For a scalar function :math:`f:\\mathbb{R}^d\\to\\mathbb{R}` the Laplacian is the trace of
its Hessian, :math:`\\Delta f(x) = \\sum_i \\partial^2 f/\\partial x_i^2 =
\\operatorname{tr} H_f(x)`. :func:`laplacian` computes it in five ways that give the same
number (the last one in expectation):

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
    folx's forward Laplacian (``folx.forward_laplacian``, Li et al., Nature Machine
    Intelligence 2024): value, gradient and Laplacian propagated together through the
    function in one forward pass. The gradient is read from folx's own output (its
    Jacobian); no reverse pass is run.
``"hutchinson"``
    the unbiased stochastic estimate :math:`\\frac1S\\sum_s v_s^\\top H v_s` with
    Rademacher probes :math:`v_s` (:math:`E[v v^\\top] = I`). One key gives one set of
    probes: give each walker (and each shard) its own key, e.g. with
    ``jax.random.fold_in`` (as :mod:`beyondgrad.vmc` does), or their noise does not
    average out over the batch.

Every method works under ``jit``, ``vmap``, ``grad`` with respect to closed-over
parameters, and inside ``shard_map`` with ``check_vma=True``: the internal constants
(the identity basis, the probes, the loop's initial carry) are given the varying mesh
axes of ``x`` (:func:`beyondgrad.compat.pcast_varying`). Without them a hand-built
basis raises a ``ValueError`` there, and a loop started from ``0.0`` a ``TypeError``
(Chapter 5.8). These are not the chapter's seed (jax-ml/jax#33947): that was a JAX bug
in the transpose rule of ``split`` (JAX 0.7.0 to 0.8.1, fixed in 0.8.2), which fires
under ``check_vma=True`` whenever a piece of a split gets a symbolic-zero cotangent,
whatever the types of the pieces, and which no cast in user code avoids.

Determinants and their structured Laplacian are in :mod:`beyondgrad.slater`, the
forward-Laplacian interpreter in :mod:`beyondgrad.forward_laplacian`, wavefunction
models in :mod:`beyondgrad.wavefunctions` and VMC energies in :mod:`beyondgrad.vmc`
(they import this module; this module imports nothing from them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypedDict, Unpack

import jax
import jax.numpy as jnp
from jax import lax

from beyondgrad import compat

__all__ = [
    "METHODS",
    "LaplacianOptions",
    "Method",
    "basis",
    "grad_and_laplacian",
    "hutchinson_probes",
    "hutchinson_samples",
    "kinetic_energy",
    "laplacian",
]

Method = Literal["hessian", "loop", "vmap", "folx", "hutchinson"]


class LaplacianOptions(TypedDict, total=False):
    """The keyword options :func:`laplacian` and :func:`kinetic_energy` pass on to
    :func:`grad_and_laplacian` (defaults there: ``method="loop"``, ``key=None``,
    ``num_samples=16``, ``sparsity_threshold=0``)."""

    method: Method
    key: jax.Array | None
    num_samples: int
    sparsity_threshold: float


METHODS: tuple[str, ...] = ("hessian", "loop", "vmap", "folx", "hutchinson")


def _check_method(method: str) -> None:
    """Raise ``ValueError`` unless ``method`` is one of :data:`METHODS`."""
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(
            f"unknown Laplacian method {method!r}; expected one of "
            f"{', '.join(map(repr, METHODS))}"
        )


def _check_function(f: object, name: str = "f") -> None:
    if not callable(f):
        raise TypeError(
            f"{name} must be a function of a 1-D array returning a scalar, got "
            f"{type(f).__name__} (pass the function itself, e.g. log_psi, not its value)"
        )


def _check_num_samples(num_samples: object) -> None:
    if (
        isinstance(num_samples, bool)
        or not isinstance(num_samples, int)
        or num_samples < 1
    ):
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")


def _check_key(key: object, method: str) -> jax.Array:
    if key is None:
        raise ValueError(
            f"method={method!r} needs a PRNG key: pass key=jax.random.key(0) "
            "(one key per walker: jax.random.fold_in(key, walker_index))"
        )
    if not isinstance(key, jax.Array):
        raise TypeError(
            f"key must be a JAX PRNG key (jax.random.key(0)), got {type(key).__name__}"
        )
    return key


def _check_input(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    _check_function(f)
    x = jnp.asarray(x)
    if x.ndim != 1:
        raise ValueError(
            f"x must be a 1-D array (flatten it, e.g. x.reshape(-1)), got shape {x.shape}; "
            "for a batch of points use jax.vmap over laplacian"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"x must be a floating-point array (e.g. x.astype(jnp.float32)), got dtype {x.dtype}"
        )
    out = jax.eval_shape(f, x)
    if getattr(out, "shape", None) != ():
        got = getattr(out, "shape", type(out).__name__)
        raise ValueError(f"f must return a scalar (shape ()), got {got}")
    return x


def _varying_like(value: jax.Array, like: jax.Array) -> jax.Array:
    """``value`` cast to vary over the mesh axes ``like`` varies over (no-op outside shard_map)."""
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
    sparsity_threshold: float = 0,
) -> tuple[jax.Array, jax.Array]:
    """``(∇f(x), Δf(x))`` computed together, shapes ``(d,)`` and ``()``.

    See :func:`laplacian` for the methods and arguments. The gradient is exact for every
    method (only the Laplacian of ``"hutchinson"`` is stochastic) and costs nothing
    extra: the Hessian-vector methods linearize ``grad f``, whose primal output is the
    gradient, and ``"folx"`` reads it from the Jacobian folx propagates anyway.
    """
    _check_method(method)
    x = _check_input(f, x)
    if method == "hutchinson":
        _check_key(key, method)
        _check_num_samples(num_samples)
    if method == "hessian":
        return jax.grad(f)(x), jnp.trace(jax.hessian(f)(x))
    if method == "folx":
        import folx  # optional dependency (the 'chapters' extra)

        out = folx.forward_laplacian(f, sparsity_threshold=sparsity_threshold)(x)
        return out.jacobian.dense_array.reshape(x.shape), out.laplacian
    g, hvp = jax.linearize(jax.grad(f), x)  # hvp(v) = H v, reusing the linearization
    if method == "loop":
        eye = basis(x)

        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            return acc + hvp(eye[i])[i]

        # the carry starts varying like g (zeros_like keeps the type), not as an invariant 0.0
        return g, lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(g[0]))
    if method == "vmap":
        return g, jnp.trace(jax.vmap(hvp)(basis(x)))
    probes = hutchinson_probes(_check_key(key, method), x, num_samples)
    return g, jnp.mean(jnp.sum(jax.vmap(hvp)(probes) * probes, axis=-1))


def hutchinson_probes(key: jax.Array, x: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` Rademacher vectors (entries ±1) shaped like ``x``, varying like ``x``.

    The probes are a function of ``key`` alone: the same key gives the same probes at
    every point, so a batch needs one key per point (``jax.random.fold_in``).
    """
    _check_key(key, "hutchinson")
    _check_num_samples(num_samples)
    x = jnp.asarray(x)
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
    probes = hutchinson_probes(key, x, num_samples)
    _, hvp = jax.linearize(jax.grad(f), x)
    return jnp.sum(jax.vmap(hvp)(probes) * probes, axis=-1)


def laplacian(
    f: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    **options: Unpack[LaplacianOptions],
) -> jax.Array:
    """The Laplacian :math:`\\operatorname{tr}\\nabla^2 f(x)` of a scalar ``f`` at a 1-D ``x``.

    ``method`` is one of ``"hessian"``, ``"loop"``, ``"vmap"``, ``"folx"``,
    ``"hutchinson"`` (see the module docstring). ``"hutchinson"`` needs ``key`` and
    averages ``num_samples`` Rademacher probes; ``"folx"`` passes ``sparsity_threshold``
    to ``folx.forward_laplacian`` (0 = dense). Returns a scalar of ``x``'s dtype.

    Raises ``ValueError`` for an unknown method, a non-1-D ``x``, a non-scalar ``f``,
    a missing key or ``num_samples < 1``; ``TypeError`` for a non-function ``f`` or an
    integer ``x``.
    """
    return grad_and_laplacian(f, x, **options)[1]


def kinetic_energy(
    log_psi: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    **options: Unpack[LaplacianOptions],
) -> jax.Array:
    """Local kinetic energy :math:`-\\tfrac12(\\Delta\\log|\\psi| + |\\nabla\\log|\\psi||^2)` at ``x``.

    This is :math:`-\\tfrac12 \\Delta\\psi/\\psi` (units ħ = m = 1), written with
    log|ψ| so that it never forms ψ itself. ``x`` may have any shape (e.g. ``(n, 3)``
    electron positions): ``log_psi`` is called with an array of that shape, and the
    derivatives are taken with respect to all its entries.
    """
    _check_function(log_psi, "log_psi")
    x = jnp.asarray(x)
    shape = x.shape

    def flat(v: jax.Array) -> jax.Array:
        return log_psi(v.reshape(shape))

    g, lap = grad_and_laplacian(flat, x.reshape(-1), **options)
    return -0.5 * (lap + jnp.sum(g * g))
