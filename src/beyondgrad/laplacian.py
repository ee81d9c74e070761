"""Laplacians of scalar functions (Chapter 5).

For a scalar function :math:`f:\\mathbb{R}^d\\to\\mathbb{R}` the Laplacian is the trace of
its Hessian, :math:`\\Delta f(x) = \\sum_i \\partial^2 f/\\partial x_i^2 =
\\operatorname{tr} H_f(x)`. :func:`laplacian` computes it in six ways that give the same
number (the last one in expectation):

``"hessian"``
    ``jnp.trace(jax.hessian(f)(x))``: builds all :math:`d^2` entries.
``"loop"``
    linearize ``grad f`` once at ``x`` and loop (``lax.fori_loop``) over the basis
    vectors :math:`e_i`, adding :math:`e_i^\\top H e_i`: one Hessian-vector product at a
    time, little memory (FermiNet's default).
``"vmap"``
    the same Hessian-vector products, all at once with ``vmap``: :math:`d` times the
    memory of one product, and not always faster than the loop (in the book's
    recorded benchmark the loop is the faster of the two at ``n = 64`` electrons,
    Chapter 5.5).
``"folx"``
    folx's forward Laplacian (``folx.forward_laplacian``, Li et al., Nature Machine
    Intelligence 2024): value, gradient and Laplacian propagated together through the
    function in one forward pass. The gradient is read from folx's own output (its
    Jacobian); no reverse pass is run. Some folx releases return wrong values without
    an error on some constructs (folx 0.2.24 with JAX 0.8.2: ``jnp.linalg.cholesky``,
    ``lax.cumlogsumexp``, ``jnp.cumprod``): ``folx_wrong_constructs()`` measures the
    installed folx on small probes of each, and ``"folx"`` warns
    (``FolxWrongValueWarning``, once per construct) when ``f`` uses one it got
    wrong, recommending ``method="forward"`` or ``method="hessian"``.
``"forward"``
    the project's own forward Laplacian
    (:func:`beyondgrad.forward_laplacian.forward_laplacian`, Chapter 5): the same
    one-pass propagation of value, Jacobian and Laplacian, by an interpreter of ``f``'s
    jaxpr with a rule per JAX primitive. Forward mode throughout, so it also
    differentiates ``lax.while_loop``, which the reverse-mode methods cannot. With
    ``particles=n`` (``x`` the coordinates of ``n`` particles in equal consecutive
    blocks) values that depend on one or two particles per element carry only those
    particles' Jacobian rows (the same numbers, less work on pair features).
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
under ``check_vma=True`` whenever a piece of a split gets a symbolic-zero cotangent
while another piece does not (the rule then called ``full_like`` on an abstract
value), whatever the types of the pieces, and which no cast in user code avoids.

Determinants and their structured Laplacian are in :mod:`beyondgrad.slater`, the
forward-Laplacian interpreter in :mod:`beyondgrad.forward_laplacian`, wavefunction
models in :mod:`beyondgrad.wavefunctions` and VMC energies in :mod:`beyondgrad.vmc`
(they import this module; this module imports nothing from them).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from typing import Literal, TypedDict, Unpack

import jax
import jax.numpy as jnp
from jax import lax

from beyondgrad import _checks, compat
from beyondgrad.forward_laplacian import forward_laplacian

__all__ = [
    "METHODS",
    "LaplacianOptions",
    "Method",
    "basis",
    "check_key",
    "check_method",
    "grad_and_laplacian",
    "hutchinson_probes",
    "hutchinson_samples",
    "kinetic_energy",
    "laplacian",
]

#: The names :func:`laplacian` accepts for ``method`` (a type for annotations);
#: :data:`METHODS` holds the same names as a tuple.
Method = Literal["hessian", "loop", "vmap", "folx", "forward", "hutchinson"]


class LaplacianOptions(TypedDict, total=False):
    """The keyword options :func:`laplacian` and :func:`kinetic_energy` pass on to
    :func:`grad_and_laplacian` (defaults there: ``method="loop"``, ``key=None``,
    ``num_samples=None`` (16 probes), ``sparsity_threshold=None`` (0, dense),
    ``particles=None`` (dense)). An option read by one method only is an error with
    any other method.

    Attributes:
        method: one of :data:`METHODS`; ``"loop"`` by default.
        key: a PRNG key, needed by ``"hutchinson"`` alone (its probes).
        num_samples: the number of Hutchinson probes, an int ``>= 1``
            (``"hutchinson"`` only); ``None``: 16.
        sparsity_threshold: folx's sparsity threshold (``"folx"`` only); ``None``:
            0, dense.
        particles: the number of particles whose coordinates ``x`` holds in equal
            consecutive blocks, for particle sparsity (``"forward"`` only); ``None``:
            dense.
    """

    method: Method
    key: jax.Array | None
    num_samples: int | None
    sparsity_threshold: float | None
    particles: int | None


#: The Laplacian methods, in the order the module docstring describes them (the
#: values of :data:`Method`, which :func:`check_method` accepts).
METHODS: tuple[str, ...] = ("hessian", "loop", "vmap", "folx", "forward", "hutchinson")


def check_method(method: object) -> None:
    """Raise ``ValueError`` unless ``method`` is one of :data:`METHODS`.

    Args:
        method: the name of a Laplacian method.

    Raises:
        ValueError: ``method`` is not one of :data:`METHODS`; the message lists them.
    """
    _checks.choice(method, "Laplacian method", METHODS)


def _check_function(f: object, name: str = "f") -> None:
    _checks.function(
        f, name, "a function of a 1-D array returning a scalar", example="log_psi"
    )


def _check_num_samples(num_samples: object) -> None:
    _checks.integer(num_samples, "num_samples", minimum=1, meaning="the probe count")


def check_key(key: object, name: str = "key") -> jax.Array:
    """``key`` itself, after checking that it is a JAX PRNG key.

    Accepted: a typed key (``jax.random.key(0)``, dtype ``key<...>``) or a legacy raw
    key (``jax.random.PRNGKey(0)``: a 1-D ``uint32`` array), concrete or traced.

    Args:
        key: the value to check.
        name: the argument's name, for the message.

    Returns:
        ``key`` unchanged.

    Raises:
        TypeError: ``key`` is not a JAX array, or an array of another dtype (an int,
            floats); the message names what was given and shows ``jax.random.key(0)``.
    """
    typed = isinstance(key, jax.Array) and jnp.issubdtype(
        key.dtype, jax.dtypes.prng_key
    )
    raw = isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.ndim == 1
    if not (typed or raw):
        got = (
            f"an array of dtype {key.dtype} and shape {key.shape}"
            if isinstance(key, jax.Array)
            else f"{type(key).__name__} {key!r}"
        )
        raise TypeError(
            f"{name} must be a JAX PRNG key, e.g. jax.random.key(0) (or a legacy "
            f"jax.random.PRNGKey(0)), got {got}"
        )
    return key  # type: ignore[return-value]


def _check_key(key: object, method: str) -> jax.Array:
    if key is None:
        raise ValueError(
            f"method={method!r} needs a PRNG key: pass key=jax.random.key(0) "
            "(one key per walker: jax.random.fold_in(key, walker_index))"
        )
    return check_key(key)


#: the options of :func:`grad_and_laplacian` that only one method reads
_OPTION_OF = {
    "key": "hutchinson",
    "num_samples": "hutchinson",
    "sparsity_threshold": "folx",
    "particles": "forward",
}


def _check_options(method: str, given: dict[str, object]) -> None:
    """Raise ``TypeError`` for an option given that ``method`` would silently ignore."""
    for option, value in given.items():
        owner = _OPTION_OF[option]
        if value is not None and owner != method:
            _checks.ignored_option(option, value, owner, method)


def _check_point(x: object) -> jax.Array:
    return _checks.point(
        x, "x", batch="; for a batch of points use jax.vmap over laplacian"
    )


def _check_input(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.Array:
    _check_function(f)
    x = _check_point(x)
    out = jax.eval_shape(f, x)
    if getattr(out, "shape", None) != ():
        got = getattr(out, "shape", type(out).__name__)
        raise ValueError(f"f must return a scalar (shape ()), got {got}")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"f must return a real floating-point scalar, got dtype {out.dtype} (a "
            "complex f: take the Laplacians of jnp.real(f(x)) and jnp.imag(f(x)); an "
            "integer f has no derivatives)"
        )
    return x


def basis(x: jax.Array) -> jax.Array:
    """The identity basis ``eye(d)`` of ``x``'s space, with ``x``'s dtype and varying axes.

    Inside ``shard_map`` a tangent must have the same varying type as its primal; a bare
    ``jnp.eye`` is invariant, so it is cast to the axes of ``x`` here.

    Args:
        x: a 1-D array of length ``d`` (its values are not read); floating-point for
            use as tangents.

    Returns:
        The ``(d, d)`` identity matrix of ``x``'s dtype, row ``i`` the unit vector
        :math:`e_i`, varying over the mesh axes ``x`` varies over.

    Raises:
        ValueError: ``x`` is not 1-D (the message gives its shape).
    """
    if jnp.ndim(x) != 1:
        raise ValueError(
            f"basis needs a 1-D x (the point whose space it spans), got shape "
            f"{jnp.shape(x)}; flatten it first, e.g. x.reshape(-1)"
        )
    return compat.varying_like(jnp.eye(x.shape[0], dtype=x.dtype), x)


def grad_and_laplacian(
    f: Callable[[jax.Array], jax.Array],
    x: jax.Array,
    *,
    method: Method = "loop",
    key: jax.Array | None = None,
    num_samples: int | None = None,
    sparsity_threshold: float | None = None,
    particles: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``(∇f(x), Δf(x))`` computed together, shapes ``(d,)`` and ``()``.

    See :func:`laplacian` for the methods and arguments. The gradient is exact for every
    method (only the Laplacian of ``"hutchinson"`` is stochastic) and costs nothing
    extra: the Hessian-vector methods linearize ``grad f``, whose primal output is the
    gradient, and ``"folx"`` and ``"forward"`` read it from the Jacobian they
    propagate anyway.

    Args:
        f: a scalar function of a 1-D array.
        x: the point, a 1-D floating-point array of any size (``d = 0`` gives
            ``(empty, 0)``).
        method: one of :data:`METHODS`.
        key: the PRNG key of ``"hutchinson"`` (required there, refused elsewhere).
        num_samples: the number of probes of ``"hutchinson"`` (default 16; refused
            with another method).
        sparsity_threshold: folx's sparsity threshold for ``"folx"`` (default 0,
            dense; refused with another method).
        particles: for ``"forward"``, the number of particles whose coordinates
            ``x`` holds in equal consecutive blocks (particle sparsity, see
            :func:`beyondgrad.forward_laplacian.forward_jet`; default dense; refused
            with another method).

    Returns:
        ``(gradient (d,), Laplacian ())``.

    Raises:
        ValueError: unknown ``method``; no ``key`` for ``"hutchinson"``;
            ``num_samples < 1``; ``x`` not 1-D; ``f`` not scalar.
        TypeError: an option of another method (which would ignore it); ``f`` not
            callable; ``x`` not floating-point; ``key`` not a key; ``num_samples`` not
            an int.
    """
    check_method(method)
    x = _check_input(f, x)
    _check_options(
        method,
        {
            "key": key,
            "num_samples": num_samples,
            "sparsity_threshold": sparsity_threshold,
            "particles": particles,
        },
    )
    if method == "hutchinson":
        _check_key(key, method)
        num_samples = 16 if num_samples is None else num_samples
        _check_num_samples(num_samples)
    if method == "hessian":
        return jax.grad(f)(x), jnp.trace(jax.hessian(f)(x))
    if method == "folx":
        return _folx_grad_and_laplacian(f, x, sparsity_threshold)
    if method == "forward":
        _, jac, lap = forward_laplacian(f, x, particles=particles)
        return jac.reshape(x.shape), lap
    g, hvp = _linearize_grad(f, x)  # hvp(v) = H v, reusing the linearization
    if method == "loop":
        if x.shape[0] == 0:  # nothing to loop over (and eye[i] cannot be traced)
            return g, jnp.sum(jnp.zeros_like(g))
        eye = basis(x)

        def body(i: jax.Array, acc: jax.Array) -> jax.Array:
            return acc + hvp(eye[i])[i]

        # the carry starts varying like g (zeros_like keeps the type), not as an
        # invariant 0.0
        return g, lax.fori_loop(0, x.shape[0], body, jnp.zeros_like(g[0]))
    if method == "vmap":
        return g, jnp.trace(jax.vmap(hvp)(basis(x)))
    assert num_samples is not None  # set above for "hutchinson"
    probes = hutchinson_probes(_check_key(key, method), x, num_samples)
    return g, jnp.mean(jnp.sum(jax.vmap(hvp)(probes) * probes, axis=-1))


def _linearize_grad(
    f: Callable[[jax.Array], jax.Array], x: jax.Array
) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """``jax.linearize(jax.grad(f), x)``, with the error on ``while_loop`` made clear.

    Reverse mode cannot differentiate ``lax.while_loop``. JAX 0.12 says so
    (``ValueError: Reverse-mode differentiation does not work for lax.while_loop``);
    JAX 0.8.2 instead fails inside its own ``_while_loop_jvp`` (``cond_debug.arg_names``
    is ``None`` when ``linearize`` re-traces the loop's condition) with ``TypeError:
    unsupported operand type(s) for +: 'NoneType' and 'tuple'``: a JAX bug, not ours.
    On that error ``jax.grad`` alone is traced abstractly to get JAX's own clear
    message; either way the error raised names the method that works.
    """
    try:
        return jax.linearize(jax.grad(f), x)
    except (TypeError, ValueError) as e:
        cause: Exception = e
        if isinstance(e, TypeError):
            if "NoneType" not in str(e) or "tuple" not in str(e):
                raise
            try:
                jax.eval_shape(jax.grad(f), x)
            except Exception as clear:  # JAX's reverse-mode message
                cause = clear
            else:
                raise
        if "Reverse-mode differentiation does not work" not in str(cause):
            raise
        first = str(cause).splitlines()[0]
        raise ValueError(
            f"{first} The Hessian-vector methods ('loop', 'vmap', 'hutchinson') and "
            "'hessian' use reverse mode; for a lax.while_loop use method='forward' "
            "(forward_laplacian.forward_laplacian(f, x)), which differentiates it in "
            "forward mode"
        ) from e


class FolxWrongValueWarning(UserWarning):
    """``method="folx"`` on a function with a construct the running folx gets wrong."""


def _folx_matrix(v: jax.Array) -> jax.Array:
    m = v[:9].reshape(3, 3) + 3 * jnp.eye(3, dtype=v.dtype)
    return m @ m.T + jnp.eye(3, dtype=v.dtype)


#: constructs on which folx has been seen to return wrong values without an error
#: (folx 0.2.24 with JAX 0.8.2): name -> (the primitive in f's jaxpr, a probe of it)
FOLX_PROBES: dict[str, tuple[str, Callable[[jax.Array], jax.Array]]] = {
    "cholesky (jnp.linalg.cholesky)": (
        "cholesky",
        lambda v: jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(_folx_matrix(v))))),
    ),
    "lax.cumlogsumexp": ("cumlogsumexp", lambda v: jnp.sum(lax.cumlogsumexp(v))),
    "jnp.cumprod": ("cumprod", lambda v: jnp.sum(jnp.cumprod(1 + v / 10))),
}

_FOLX_WARNED: set[str] = set()


@functools.cache
def folx_wrong_constructs() -> tuple[str, ...]:
    """The constructs of :data:`FOLX_PROBES` on which the installed folx, on the running
    JAX, gives a wrong Laplacian (measured, not read from version numbers).

    Each probe (9 inputs, float32) is run through ``folx.forward_laplacian`` and compared
    with ``trace(jax.hessian(probe))``; wrong means off by more than
    ``1e-3 * (1 + |reference|)``. A probe on which folx raises is not listed (an error
    is not a silent wrong value). ``()`` without folx. Measured: folx 0.2.24 + JAX 0.8.2
    is wrong on all three, folx 0.2.30 + JAX 0.12.0.1 on none.
    """
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # folx logs on the root logger
    try:
        try:
            import folx
        except ImportError:
            return ()
        wrong = []
        with jax.ensure_compile_time_eval():  # concrete, even inside a jit trace
            x = jnp.asarray(
                [0.6, -0.3, 0.8, 0.1, 1.2, -0.7, 0.4, 0.9, -0.2], jnp.float32
            )
            for name, (_, probe) in FOLX_PROBES.items():
                try:
                    got = float(folx.forward_laplacian(probe)(x).laplacian)
                except Exception:  # folx raises: loud, not silently wrong
                    continue
                want = float(jnp.trace(jax.hessian(probe)(x)))
                if not abs(got - want) <= 1e-3 * (1 + abs(want)):
                    wrong.append(name)
        return tuple(wrong)
    finally:
        logging.disable(before)


def _warn_if_folx_is_wrong(f: Callable[[jax.Array], jax.Array], x: jax.Array) -> None:
    """Warn (once per construct) when ``f`` uses a construct the running folx gets wrong."""
    wrong = [name for name in folx_wrong_constructs() if name not in _FOLX_WARNED]
    if not wrong:
        return
    try:
        used = set(compat.primitive_names(jax.make_jaxpr(f)(x)))
    except Exception:  # f fails to trace: folx will say so itself
        return
    for name in wrong:
        if FOLX_PROBES[name][0] in used:
            _FOLX_WARNED.add(name)
            warnings.warn(
                f"method='folx': the installed folx gives wrong Laplacians on {name} "
                "with this JAX (measured on a probe, no error raised), and this "
                "function uses it; use method='forward' "
                "(forward_laplacian.forward_laplacian(f, x)) or method='hessian'",
                FolxWrongValueWarning,
                stacklevel=4,
            )


def _folx_grad_and_laplacian(
    f: Callable[[jax.Array], jax.Array], x: jax.Array, sparsity_threshold: float | None
) -> tuple[jax.Array, jax.Array]:
    """The ``"folx"`` method: gradient and Laplacian read from folx's one forward pass."""
    threshold = 0 if sparsity_threshold is None else sparsity_threshold
    _checks.number(threshold, "sparsity_threshold", at_least=0, meaning="0 = dense")
    import folx  # optional dependency (the 'chapters' extra)

    _warn_if_folx_is_wrong(f, x)
    out = folx.forward_laplacian(f, sparsity_threshold=threshold)(x)
    if not hasattr(out, "laplacian"):
        # folx returns a plain array when f's output does not depend on x: its
        # gradient and Laplacian are zero (summing zeros keeps x's varying axes)
        zeros = jnp.zeros_like(x)
        return zeros, jnp.sum(zeros)
    return out.jacobian.dense_array.reshape(x.shape), out.laplacian


def hutchinson_probes(key: jax.Array, x: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` Rademacher vectors (entries ±1) shaped like ``x``, varying like ``x``.

    The probes are a function of ``key`` alone: the same key gives the same probes at
    every point, so a batch needs one key per point (``jax.random.fold_in``).

    Args:
        key: a PRNG key (``jax.random.key(0)``).
        x: a 1-D floating-point array (its size, dtype and varying axes are used).
        num_samples: the number of probes, a positive int.

    Returns:
        ``(num_samples, d)`` entries ±1 of ``x``'s dtype.

    Raises:
        TypeError: ``key`` is not a PRNG key; ``x`` is not floating-point;
            ``num_samples`` is not an int.
        ValueError: ``key`` is None; ``num_samples < 1``; ``x`` is not 1-D.
    """
    _check_key(key, "hutchinson")
    _check_num_samples(num_samples)
    x = _check_point(x)
    v = jax.random.rademacher(key, (num_samples, x.shape[0]), dtype=x.dtype)
    return compat.varying_like(v, x)


def hutchinson_samples(
    f: Callable[[jax.Array], jax.Array], x: jax.Array, key: jax.Array, num_samples: int
) -> jax.Array:
    """The individual Hutchinson estimates :math:`v_s^\\top H_f(x) v_s`, shape ``(num_samples,)``.

    Their mean is ``laplacian(f, x, method="hutchinson", ...)``; their variance over
    ``num_samples`` is the estimator's variance (for Rademacher probes
    :math:`2\\sum_{i\\ne j} H_{ij}^2` per sample).

    Args:
        f: a scalar function of a 1-D array.
        x: the point, 1-D and floating-point.
        key: a PRNG key.
        num_samples: the number of probes, a positive int.

    Returns:
        ``(num_samples,)`` estimates.

    Raises:
        ValueError, TypeError: as :func:`hutchinson_probes` and :func:`laplacian`.
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
    ``"forward"``, ``"hutchinson"`` (see the module docstring). ``"hutchinson"``
    needs ``key`` and averages ``num_samples`` Rademacher probes; ``"folx"`` passes
    ``sparsity_threshold`` to ``folx.forward_laplacian`` (0 = dense), and
    ``"forward"`` reads ``particles`` (particle sparsity). An option of
    another method is a ``TypeError``, not silently ignored.

    Args:
        f: a scalar function of a 1-D array.
        x: the point, 1-D and floating-point.
        **options: ``method``, ``key``, ``num_samples``, ``sparsity_threshold``,
            ``particles`` (see :func:`grad_and_laplacian`).

    Returns:
        A scalar of ``x``'s dtype (0 when ``f`` does not depend on ``x`` or ``x`` is
        empty).

    Raises:
        ValueError: an unknown method, a non-1-D ``x``, a non-scalar ``f``, a missing
            key or ``num_samples < 1``.
        TypeError: an option of another method, a non-function ``f``, an integer
            ``x``, a key that is not a PRNG key or a ``num_samples`` that is not an
            int.
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

    Args:
        log_psi: ``log|ψ|`` as a function of one array shaped like ``x``.
        x: the positions, floating-point, any shape.
        **options: as for :func:`laplacian`.

    Returns:
        A scalar.

    Raises:
        ValueError, TypeError: as :func:`laplacian`.
    """
    _check_function(log_psi, "log_psi")
    x = jnp.asarray(x)
    shape = x.shape

    def flat(v: jax.Array) -> jax.Array:
        return log_psi(v.reshape(shape))

    g, lap = grad_and_laplacian(flat, x.reshape(-1), **options)
    return -0.5 * (lap + jnp.sum(g * g))
