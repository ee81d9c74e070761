r"""Slater determinants of single-particle orbitals, and the derivatives of
:math:`\log|\det A|` by the row formula (Chapter 5).

Conventions
-----------
* ``positions`` are ``(n, 3)``: electron ``i`` sits at ``positions[i]``.
* ``orbitals(r)`` maps one position ``r`` of shape ``(3,)`` to the ``n`` single-particle
  orbital values :math:`(\varphi_1(r),\dots,\varphi_n(r))`. That is the whole
  contract: ``orbitals`` is only ever used on one ``(3,)`` position (``jax.vmap``-ed
  over the electrons), so what it would do on a batch of positions does not matter
  (``jnp.linalg.norm(r)`` without ``axis=`` is fine).
* The check, and its limit. Orbitals that read several electrons break the row
  formula. Refused with a ``ValueError``: functions that fail on one ``(3,)`` position
  or return another shape than ``(n,)``, and networks written for any number of
  electrons (they turn the ``(3,)`` position into a ``(1, 3)`` batch of one, e.g.
  ``x.reshape(-1, 3)`` or ``jnp.atleast_2d(x)``) whose rows, on a few probe positions
  given at once, pool over the electrons or differ from the rows computed one electron
  at a time. Not detectable, and not detected: orbitals that *close over* the walker
  positions (``make_orbitals(positions)``, e.g. orbitals around the electrons'
  centroid, a mean field or backflow written that way). Each call then sees one
  ``(3,)`` position and the row formula silently differentiates only the explicit
  ``r`` dependence, not that through the closure: a wrong Laplacian. Such
  wavefunctions need the Laplacian of the whole log|ψ| (``laplacian`` or
  :func:`~beyondgrad.forward_laplacian.forward_laplacian`).
* The Slater matrix is :math:`A_{ij}=\varphi_j(r_i)` and :math:`\psi=\det A`; we only
  ever form :math:`\log|\psi|` (``jnp.linalg.slogdet`` or one LU factorisation).

Electron :math:`i` enters row :math:`i` of :math:`A` only, so the gradient and the
Laplacian of :math:`\log|\det A|` need the orbitals' value, gradient and Laplacian at
each electron (:func:`orbital_derivatives`, by the forward Laplacian of
:mod:`beyondgrad.forward_laplacian`) and :math:`B = A^{-1}` (:func:`row_formula`).
Wavefunction models built on this live in :mod:`beyondgrad.wavefunctions`; the VMC
energy and gradient in :mod:`beyondgrad.vmc`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np

from beyondgrad import _checks, compat
from beyondgrad.forward_laplacian import forward_jet
from beyondgrad.laplacian import basis

__all__ = [
    "check_positions",
    "logdet_and_inverse",
    "orbital_derivatives",
    "orbital_derivatives_fwdfwd",
    "orbital_jets",
    "row_formula",
    "row_sums",
    "slater_laplacian",
    "slater_log_psi",
    "slater_matrix",
]


def check_positions(positions: jax.Array) -> jax.Array:
    """``positions`` as an array, after checking it is ``(n, 3)`` and floating-point.

    Args:
        positions: electron positions, one row per electron.

    Returns:
        ``positions`` as a JAX array.

    Raises:
        ValueError: the shape is not ``(n, 3)`` with ``n >= 1``.
        TypeError: the dtype is not a real floating-point type.
    """
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[1] != 3 or positions.shape[0] < 1:
        raise ValueError(
            f"positions must have shape (n, 3) (n >= 1 electrons in 3-D), got "
            f"{positions.shape}"
        )
    if not jnp.issubdtype(positions.dtype, jnp.floating):
        raise TypeError(
            f"positions must be a real floating-point array, got dtype "
            f"{positions.dtype} (cast with positions.astype(jnp.float32))"
        )
    return positions


@jax.custom_vjp
def _straight_through(x: jax.Array) -> jax.Array:
    return jnp.round(x)


_straight_through.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))

#: what the all-electron hint's capability probe tries folx on: constructs that
#: all-electron networks contain and that our own methods handle
_FOLX_PROBES: dict[str, Callable[[jax.Array], jax.Array]] = {
    "loops (scan/fori_loop)": lambda x: jnp.sum(
        jax.lax.fori_loop(0, 2, lambda i, c: jnp.tanh(c * x), x)
    ),
    "while_loop": lambda x: jnp.sum(
        jax.lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] * x), (0, x))[
            1
        ]
    ),
    "custom_vjp": lambda x: jnp.sum(jnp.sin(x) * _straight_through(x)),
}


@functools.cache
def _folx_failures() -> tuple[str, ...]:
    """What folx fails on with the running JAX, among :data:`_FOLX_PROBES`
    (``("not installed",)`` without folx).

    Decided by trying (abstractly, no FLOPs), not from version numbers: folx 0.2.30 on
    JAX 0.12 fails on all three (``KeyError: 'num_carry'`` on loops).
    """
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # folx logs its failures on the root logger
    try:
        try:
            import folx
        except ImportError:
            return ("not installed",)
        failed = []
        for name, probe in _FOLX_PROBES.items():
            try:
                out = jax.eval_shape(folx.forward_laplacian(probe), jnp.ones(2))
                if not hasattr(out, "laplacian"):
                    failed.append(name)
            except Exception:  # fails on this JAX: do not recommend it
                failed.append(name)
        return tuple(failed)
    finally:
        logging.disable(before)


def _all_electrons_hint() -> str:
    """What to use for orbitals of all electrons, by what works on the running JAX."""
    failures = _folx_failures()
    if not failures:
        folx_note = (
            "; folx (method='folx', or folx.forward_laplacian(fn, "
            "sparsity_threshold=6) as its README shows for such networks) also works "
            "on this JAX (tried on a loop, a while_loop and a custom_vjp) and skips "
            "the same zero blocks by its own sparsity: the book's benchmark "
            "(chapter 5.5) times both, and which is faster depends on the network"
        )
    elif failures == ("not installed",):
        folx_note = "; not method='folx': folx is not installed"
    else:
        folx_note = "; not method='folx': on this JAX folx fails on " + ", ".join(
            failures
        )
    return (
        "slater_laplacian, slater_matrix and orbital_derivatives need single-particle "
        "orbitals, orbitals(r) of one electron's position r of shape (3,). For "
        "orbitals that read all electrons (as in FermiNet or PsiFormer) the row "
        "structure does not hold: take the Laplacian of the whole log|psi| instead, "
        "with the forward Laplacian, laplacian.grad_and_laplacian(lambda v: "
        "log_psi(v.reshape(n, 3)), x.reshape(-1), method='forward', particles=n) "
        "(the same as forward_laplacian.forward_laplacian(fn, x, particles=n)): one "
        "pass, with structured rules for slogdet, loops, while_loop and custom_jvp "
        "(a custom_vjp makes it fall back to the Hessian), and particles=n keeps "
        "the Jacobian of per-electron and pair features at 3 rows per electron "
        "instead of 3n; or method='loop' (Hessian-vector products, "
        "through a custom_vjp's backward rule; method='vmap' is the same sum with "
        f"more memory){folx_note}"
    )


def _probe_size(n: int) -> int:
    """A number of probe electrons that cannot be confused with 3 coordinates or n."""
    return next(m for m in (2, 4, 5) if m != n)


def _probe_positions(m: int, dtype: Any) -> jax.Array:
    """``m`` fixed, distinct, generic positions (no symmetry that could hide a mix-up)."""
    grid = np.arange(3 * m, dtype=np.float64).reshape(m, 3)
    return jnp.asarray(0.3 * np.sin(1.7 * grid + 0.4) + 0.1 * grid, dtype)


def _orbitals_first(orbitals: Any, positions: Any, name: str) -> None:
    """Refuse ``name(positions, orbitals)``: the arguments in the wrong order."""
    if callable(positions) and not callable(orbitals):
        raise TypeError(
            f"{name} got a {type(orbitals).__name__} as orbitals and a function as "
            f"positions: arguments swapped? The order is {name}(orbitals, positions)"
        )


def _check_orbitals(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> None:
    """Check that ``orbitals`` maps one position ``(3,)`` to ``n`` real values and
    reads one electron only.

    1. ``orbitals`` on one ``(3,)`` position must give ``(n,)`` real floating-point
       values (abstract evaluation, no FLOPs).
    2. Only when ``orbitals`` turns the ``(3,)`` position into a ``(1, 3)`` batch of
       one (:func:`_treats_position_as_batch`: a network written for any number of
       electrons), it is also run on a batch of ``m`` positions: it either returns ``(n,)`` values for any ``m`` (it pools over the
       electrons it is given: refused), or ``m * n`` values (``(m, n)`` rows, or the
       same flattened or transposed). Those are compared with the rows computed one
       electron at a time, on ``m`` fixed probe positions; if they differ, row ``i``
       depended on other electrons: refused (:func:`_check_one_electron`). Parameters
       that ``orbitals`` closes over and that are traced (under ``jit``, ``vmap`` or
       ``grad``) are replaced by fixed stand-in values for this comparison, so the
       check also runs inside a jitted VMC step.
    """
    _checks.function(orbitals, "orbitals", "a function r (3,) -> (n,)")
    n = positions.shape[0]
    try:
        out = jax.eval_shape(orbitals, jax.ShapeDtypeStruct((3,), positions.dtype))
    except Exception as e:  # e.g. a function written for (n, 3) positions
        first = str(e).splitlines()[0] if str(e) else ""
        raise ValueError(
            f"orbitals failed on one electron's position of shape (3,) "
            f"({type(e).__name__}: {first}). {_all_electrons_hint()}"
        ) from e
    shape = getattr(out, "shape", None)
    dtype = getattr(out, "dtype", None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"orbitals return complex values (dtype {dtype}); slater_laplacian, "
            "slater_matrix and orbital_derivatives support real orbitals only (for "
            "complex ones only the real part of the result would be right): use real "
            "orbitals, e.g. the real and imaginary parts as separate orbitals"
        )
    if shape is not None and len(shape) == 1 and shape[0] != n:
        raise ValueError(
            f"orbitals return {shape[0]} values but the positions hold {n} electrons "
            f"(shape {tuple(positions.shape)}): a Slater determinant needs one orbital "
            f"per electron (were the orbitals' parameters made for {shape[0]} "
            "electrons?)"
        )
    if shape != (n,):
        got = shape if shape is not None else type(out).__name__
        raise ValueError(
            f"orbitals must map one position (3,) to the {n} orbital values (n,) for "
            f"n = {n} electrons, got output shape {got}. {_all_electrons_hint()}"
        )
    if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"orbitals must return floating-point values, got dtype {dtype} (integer "
            "orbitals have no derivatives)"
        )
    _check_one_electron(orbitals, n, positions.dtype)


def _check_one_electron(
    orbitals: Callable[[jax.Array], jax.Array], n: int, dtype: Any
) -> None:
    """Step 2 of :func:`_check_orbitals`: refuse orbitals that read several electrons.

    A network written for any number of electrons runs on ``m`` positions at once; its
    output then holds ``n`` values (pooled: refused) or ``m * n`` values, in whatever
    layout (``(m, n)``, flattened, ``(n, m)``). Those are compared, row-major and
    transposed, with the ``m`` rows computed one electron at a time; neither matching
    means that a row read other electrons: refused. The comparison runs on fixed probe
    positions through ``orbitals``' jaxpr, so it also runs when ``orbitals`` closes over
    traced values (parameters under ``jit``, ``vmap`` or ``grad``): those are replaced
    by fixed generic stand-ins of the same shape and dtype, which is enough to see
    whether rows mix.
    """
    if not _treats_position_as_batch(orbitals, dtype):
        return  # never called on a batch: only (3,) -> (n,) is the contract
    m = _probe_size(n)
    shapes = []
    for size in (m, m + 1):
        try:
            batch = jax.eval_shape(orbitals, jax.ShapeDtypeStruct((size, 3), dtype))
        except Exception:  # written for one (3,) position only: fine
            return
        shapes.append(getattr(batch, "shape", None))
    if shapes == [(n,), (n,)]:
        raise ValueError(
            f"orbitals return the same {n} values for one position (3,) and for "
            f"{m} or {m + 1} positions at once: they pool over all the electrons "
            "they are given, so each orbital depends on every electron. If they "
            "really are single-particle orbitals, make a batch of positions give one "
            "row per position (reduce over axis=-1, not over the whole array). "
            f"{_all_electrons_hint()}"
        )
    if shapes[0] is None or int(np.prod(shapes[0])) != m * n:
        return  # neither pooled nor one row per position: nothing to compare
    rows = _rows_together_and_alone(orbitals, m, dtype)
    if rows is None:
        return
    together, alone = rows
    scale = float(np.max(np.abs(alone)))
    gap = min(
        float(np.max(np.abs(layout - alone)))
        for layout in (together.reshape(m, n), together.reshape(n, m).T)
    )
    if not (np.isfinite(gap) and np.isfinite(scale)):
        return  # the stand-in values overflowed: cannot compare
    tol = 100 * float(jnp.finfo(dtype).eps) * max(scale, 1.0)
    if not gap <= tol:
        raise ValueError(
            f"orbitals read all electrons: given {m} positions at once, row i is not "
            f"orbitals(position i) (largest difference {gap:.3g}, at values up to "
            f"{scale:.3g}), so each orbital depends on every electron and the row "
            f"formula would give a wrong Laplacian. {_all_electrons_hint()}"
        )


def _sub_jaxprs(params: dict[str, Any]) -> list[Any]:
    """The jaxprs in an equation's parameters (``pjit``, ``scan``, ``cond``, ...)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", item)  # ClosedJaxpr -> Jaxpr
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def _treats_position_as_batch(
    orbitals: Callable[[jax.Array], jax.Array], dtype: Any
) -> bool:
    """Whether ``orbitals``, traced on one ``(3,)`` position, makes it a batch of one.

    An orbital network written for any number of electrons (``x.reshape(-1, 3)``,
    ``jnp.atleast_2d(x)``) turns the ``(3,)`` position into a ``(1, 3)`` array; only
    such a function is also run on ``m`` positions by :func:`_check_one_electron`
    (within its own contract). A function that never does this is used only as
    ``(3,) -> (n,)`` (the documented contract), whatever it would do on a batch: e.g.
    ``jnp.linalg.norm(r)`` without ``axis=`` is fine. Decided on the jaxpr (no FLOPs),
    nested jaxprs included; when it cannot be traced here, ``True`` (the batch probe
    then decides, as before).
    """
    try:
        closed = jax.make_jaxpr(orbitals)(jax.ShapeDtypeStruct((3,), dtype))
    except Exception:
        return True
    todo = [closed.jaxpr]
    while todo:
        jaxpr = todo.pop()
        for eqn in jaxpr.eqns:
            ins = {tuple(getattr(v.aval, "shape", ())) for v in eqn.invars}
            outs = {tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars}
            if (3,) in ins and (1, 3) in outs:
                return True
            todo.extend(_sub_jaxprs(eqn.params))
    return False


def _stand_in(value: Any, k: int) -> jax.Array:
    """A fixed, generic concrete array shaped like the traced ``value`` (the ``k``-th)."""
    shape, dtype = jnp.shape(value), jnp.result_type(value)
    if jnp.issubdtype(dtype, jnp.inexact):
        size = int(np.prod(shape))
        grid = np.sin(1.3 * np.arange(size, dtype=np.float64) + 0.7 + k)
        return jnp.asarray(0.5 * grid.reshape(shape), dtype)
    return jnp.zeros(shape, dtype)  # indices, counts, flags: the first


def _rows_together_and_alone(
    orbitals: Callable[[jax.Array], jax.Array], m: int, dtype: Any
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(orbitals(P).ravel(), stack of orbitals(P[i]))`` at ``m`` probe positions ``P``,
    as NumPy arrays; traced closed-over values replaced by :func:`_stand_in`. ``None``
    when that cannot be evaluated here (the check is then skipped)."""

    def both(p: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jnp.ravel(orbitals(p)), jnp.stack([orbitals(p[i]) for i in range(m)])

    try:
        # the values orbitals closes over are the jaxpr's constants: the traced ones
        # (under jit, vmap, grad) are replaced by stand-ins
        closed = jax.make_jaxpr(both)(jax.ShapeDtypeStruct((m, 3), dtype))
        with jax.ensure_compile_time_eval():  # concrete, even under jit or vmap
            consts = [
                _stand_in(c, k) if compat.is_tracer(c) else c
                for k, c in enumerate(closed.consts)
            ]
            # jax.core.eval_jaxpr, read through compat
            together, alone = compat.eval_jaxpr(
                closed.jaxpr, consts, _probe_positions(m, dtype)
            )
            if compat.is_tracer(together) or compat.is_tracer(alone):
                return None
            return np.asarray(together), np.asarray(alone)
    except Exception:  # e.g. a closed-over PRNG key: cannot evaluate here, skip
        return None


def slater_matrix(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """The Slater matrix :math:`A_{ij}=\\varphi_j(r_i)`, shape ``(n, n)``.

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        The Slater matrix ``A``, shape ``(n, n)``, with
        ``A[i, j] = orbitals(positions[i])[j]``.

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    _orbitals_first(orbitals, positions, "slater_matrix")
    positions = check_positions(positions)
    _check_orbitals(orbitals, positions)
    return jax.vmap(orbitals)(positions)


def slater_log_psi(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """:math:`\\log|\\det A|` with :math:`A_{ij}=\\varphi_j(r_i)` (``slogdet``, never ``log(det)``).

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        :math:`\\log|\\det A|`, a scalar.

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    return jnp.linalg.slogdet(slater_matrix(orbitals, positions))[1]


def orbital_derivatives(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The Slater matrix and its row derivatives: :math:`\\varphi_j(r_i)`, :math:`\\nabla\\varphi_j(r_i)`, :math:`\\Delta\\varphi_j(r_i)`.

    One forward-Laplacian pass (:func:`forward_laplacian`) per electron, over its 3
    coordinates. Shapes ``(n, n)``, ``(n, n, 3)``, ``(n, n)``, indexed ``[i, j]`` =
    electron, orbital (:func:`orbital_jets` is the same with the gradient as
    ``(n, 3, n)``, the layout :func:`slater_laplacian` contracts).

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        ``(phi, dphi, lphi)``: values ``(n, n)``, gradients ``(n, n, 3)``
        and Laplacians ``(n, n)``, indexed ``[i, j]`` = electron, orbital.

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    _orbitals_first(orbitals, positions, "orbital_derivatives")
    phi, dphi, lphi = orbital_jets(orbitals, positions)
    return phi, jnp.moveaxis(dphi, 1, -1), lphi


def orbital_jets(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`orbital_derivatives` with the gradient as ``(n, 3, n)`` (electron, coordinate, orbital).

    The first of the three parts of :func:`slater_laplacian`: the forward Laplacian of
    ``orbitals`` at one position, ``jax.vmap``-ed over the ``n`` electrons, so each
    of the orbitals' operations runs once on all electrons together (a matrix product
    of the orbitals becomes one batched product, not ``n`` small ones).

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        ``(phi, dphi, lphi)``: values ``(n, n)`` (electron, orbital), gradients
        ``(n, 3, n)`` (electron, coordinate, orbital) and Laplacians ``(n, n)``
        (electron, orbital).

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    _orbitals_first(orbitals, positions, "orbital_jets")
    positions = check_positions(positions)
    _check_orbitals(orbitals, positions)
    jet = jax.vmap(lambda r: forward_jet(orbitals, r))(positions)
    return jet.val, jet.jac, jnp.zeros_like(jet.val) if jet.lap is None else jet.lap


def orbital_derivatives_fwdfwd(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`orbital_derivatives` by forward over forward mode along the 3 coordinate axes.

    The textbook route (and the reference the forward Laplacian is tested against): for
    each direction :math:`e_k`, ``jax.jvp`` of ``jax.jvp`` gives the first and second
    directional derivatives; the three second derivatives are summed at the end.

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        ``(phi, dphi, lphi)`` as :func:`orbital_derivatives`: shapes ``(n, n)``,
        ``(n, n, 3)``, ``(n, n)``, indexed ``[i, j]`` = electron, orbital.

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    _orbitals_first(orbitals, positions, "orbital_derivatives_fwdfwd")
    positions = check_positions(positions)
    _check_orbitals(orbitals, positions)

    def derivatives(r: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        def along(e: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
            def value_and_slope(s: jax.Array) -> tuple[jax.Array, jax.Array]:
                return jax.jvp(orbitals, (s,), (e,))

            (value, first), (_, second) = jax.jvp(value_and_slope, (r,), (e,))
            return value, first, second

        value, first, second = jax.vmap(along)(basis(r))  # (3, n) each
        return value[0], first.T, jnp.sum(second, axis=0)

    return jax.vmap(derivatives)(positions)


def row_formula(
    phi: jax.Array, dphi: jax.Array, lphi: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(log|det A|, ∇log|det A|, Δlog|det A|)`` from :func:`orbital_derivatives`' three arrays.

    With :math:`B = A^{-1}` (one LU factorisation, which also gives the log-determinant):

    .. math::
       \\nabla_{r_i}\\log|\\det A| &= \\sum_j B_{ji}\\,\\nabla\\varphi_j(r_i), \\\\
       \\Delta\\log|\\det A| &= \\sum_{i,j} B_{ji}\\,\\Delta\\varphi_j(r_i)
           - |\\nabla\\log|\\det A||^2 .

    Args:
        phi: the Slater matrix, ``(n, n)``, ``phi[i, j]`` = orbital ``j`` at
            electron ``i``.
        dphi: the orbitals' gradients, ``(n, n, 3)`` (electron, orbital,
            coordinate), as from :func:`orbital_derivatives`.
        lphi: the orbitals' Laplacians, ``(n, n)`` (electron, orbital).

    Returns:
        ``(logdet, grad, lap)``: :math:`\\log|\\det A|` (scalar), its gradient
        ``(n, 3)`` and its Laplacian (scalar).

    Raises:
        ValueError: the shapes are not ``(n, n)``, ``(n, n, 3)``, ``(n, n)``.
        TypeError: an array is not real floating-point.
    """
    n = phi.shape[0]
    if phi.shape != (n, n) or dphi.shape != (n, n, 3) or lphi.shape != (n, n):
        raise ValueError(
            f"expected shapes (n, n), (n, n, 3), (n, n) as returned by orbital_derivatives, "
            f"got {phi.shape}, {dphi.shape}, {lphi.shape}"
        )
    logdet, b = logdet_and_inverse(phi)
    grad, lap = row_sums(b, jnp.moveaxis(dphi, -1, 1), lphi)
    return logdet, grad, lap


def row_sums(
    b: jax.Array, dphi: jax.Array, lphi: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The row formula's sums, given :math:`B = A^{-1}` and :func:`orbital_jets`' derivatives.

    ``(∇log|det A|, Δlog|det A|)``, shapes ``(n, 3)`` and scalar:
    :math:`g_{i} = \\sum_j B_{ji}\\,\\nabla\\varphi_j(r_i)` and
    :math:`\\sum_{i,j} B_{ji}\\,\\Delta\\varphi_j(r_i) - \\sum_i |g_i|^2`;
    ``dphi`` is ``(n, 3, n)`` (electron, coordinate, orbital). :math:`O(n^2)`: the
    third part of :func:`slater_laplacian`, after the orbitals and the inverse.

    Args:
        b: the inverse :math:`B = A^{-1}` of the Slater matrix, ``(n, n)``.
        dphi: the orbitals' gradients, ``(n, 3, n)`` (electron, coordinate,
            orbital), as from :func:`orbital_jets`.
        lphi: the orbitals' Laplacians, ``(n, n)`` (electron, orbital).

    Returns:
        ``(grad, lap)``: :math:`\\nabla\\log|\\det A|`, shape ``(n, 3)``, and
        :math:`\\Delta\\log|\\det A|`, a scalar.

    Raises:
        ValueError: the shapes are not ``(n, n)``, ``(n, 3, n)``, ``(n, n)``.
        TypeError: an array is not real floating-point.
    """
    n = b.shape[0] if b.ndim else 0
    if b.shape != (n, n) or dphi.shape != (n, 3, n) or lphi.shape != (n, n):
        raise ValueError(
            "expected shapes (n, n), (n, 3, n), (n, n) (the inverse and orbital_jets' "
            f"derivatives), got {b.shape}, {dphi.shape}, {lphi.shape}"
        )
    for label, a in (("b", b), ("dphi", dphi), ("lphi", lphi)):
        if not jnp.issubdtype(jnp.result_type(a), jnp.floating):
            raise TypeError(
                f"row_sums needs real floating-point arrays, got {label} of dtype "
                f"{jnp.result_type(a)} (cast with .astype(jnp.float32); complex "
                "orbitals are not supported: use their real and imaginary parts as "
                "separate real orbitals)"
            )
    grad = jnp.einsum("ji,idj->id", b, dphi)
    lap = jnp.einsum("ji,ij->", b, lphi) - jnp.sum(grad * grad)
    return grad, lap


def slater_laplacian(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(log|ψ|, ∇log|ψ|, Δlog|ψ|)`` for single-particle orbitals, in :math:`O(n^3)`.

    Electron :math:`i` only enters row :math:`i` of :math:`A`, so the derivatives of
    :math:`\\log|\\det A|` need only the orbitals' own value, gradient and Laplacian at
    each electron and :math:`A^{-1}`. Three parts, each usable alone:
    :func:`orbital_jets` (one forward-Laplacian pass per electron over its 3
    coordinates, batched over the electrons), :func:`logdet_and_inverse` (one LU
    factorisation gives both :math:`\\log|\\det A|` and :math:`A^{-1}`) and
    :func:`row_sums`. ``orbitals`` is any JAX function ``r (3,) -> (n,)``; no
    hand-written derivatives are needed.

    Shapes: scalar, ``(n, 3)``, scalar. Only valid when each orbital depends on one
    electron. Rejected with a ``ValueError``: orbitals that fail on one ``(3,)``
    position or do not return ``(n,)`` (a FermiNet-like network written for ``(n, 3)``
    positions only), and networks written for any number of electrons (they make the
    ``(3,)`` position a ``(1, 3)`` batch, e.g. ``x.reshape(-1, 3)``) whose rows, given
    a few probe positions at once, pool over electrons or differ from the rows computed
    one at a time. Not detected (the limit of any check that sees ``orbitals`` on one
    position at a time): orbitals that close over the walker positions, e.g.
    ``slater_laplacian(make_orbitals(positions), positions)`` with orbitals around the
    electrons' centroid; the result is then silently wrong (it misses the dependence
    through the closure). For all of these take the Laplacian of the whole log|ψ| with
    ``laplacian.grad_and_laplacian`` or
    :func:`~beyondgrad.forward_laplacian.forward_laplacian`.

    Args:
        orbitals: a function mapping one electron's position ``r`` of shape
            ``(3,)`` to the ``n`` real orbital values ``(n,)``.
        positions: electron positions, shape ``(n, 3)``, real floating-point.

    Returns:
        ``(logdet, grad, lap)``: :math:`\\log|\\psi|` (scalar),
        :math:`\\nabla\\log|\\psi|` ``(n, 3)`` and :math:`\\Delta\\log|\\psi|`
        (scalar).

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``; ``orbitals`` fails on one
            ``(3,)`` position, does not return ``(n,)`` values, or reads several
            electrons (see the module docstring).
        TypeError: ``orbitals`` is not callable (or the arguments are swapped),
            ``positions`` is not real floating-point, or ``orbitals`` returns
            complex or integer values.
    """
    _orbitals_first(orbitals, positions, "slater_laplacian")
    # The barrier makes XLA compute the three arrays once, as orbital_jets alone does.
    # Without it, XLA fuses the elementwise producers of the derivatives into each of
    # the row sums that read them and computes them again there: on the benchmark's
    # Gaussian-type orbitals, 1.8 times the flops of the parts (issue 26, item 5).
    phi, dphi, lphi = jax.lax.optimization_barrier(orbital_jets(orbitals, positions))
    logdet, b = logdet_and_inverse(phi)
    grad, lap = row_sums(b, dphi, lphi)
    return logdet, grad, lap


def logdet_and_inverse(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log|det a|, a^{-1})`` from one LU factorisation (the diagonal of U gives the log-determinant).

    With :math:`PA = LU` (:math:`L` unit lower triangular, :math:`P` a permutation),
    :math:`|\\det a| = \\prod_i |U_{ii}|`, so :math:`\\log|\\det a| = \\sum_i
    \\log|U_{ii}|`; the inverse solves :math:`a X = I` with the same factors. A
    singular ``a`` is no error: a zero (or, after rounding, tiny) :math:`U_{ii}` makes
    the log-determinant ``-inf`` (or very negative) and the inverse non-finite (or
    huge).

    Args:
        a: a square real floating-point matrix, shape ``(n, n)`` (a Slater matrix);
            inside ``shard_map`` the identity solved against it takes its varying
            mesh axes.

    Returns:
        The pair ``(logdet, inverse)``, a scalar and an ``(n, n)`` array, both of
        ``a``'s dtype.

    Raises:
        ValueError: ``a`` is not a square matrix ``(n, n)`` (the message gives its shape).
        TypeError: ``a`` is not real floating-point.
    """
    a = jnp.asarray(a)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(
            f"expected a square matrix (n, n), the Slater matrix, got shape {a.shape}"
        )
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(
            f"expected a real floating-point matrix, got dtype {a.dtype} (cast with "
            "a.astype(jnp.float32); complex determinants are not supported)"
        )
    lu, pivots = jax.scipy.linalg.lu_factor(a)
    logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(lu))))
    return logdet, jax.scipy.linalg.lu_solve((lu, pivots), _eye_like(a))


def _eye_like(a: jax.Array) -> jax.Array:
    """``eye(n)`` with ``a``'s dtype and varying mesh axes (a right-hand side solved against ``a``)."""
    return compat.pcast_varying(
        jnp.eye(a.shape[0], dtype=a.dtype), tuple(sorted(compat.varying_axes(a)))
    )
