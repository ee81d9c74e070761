r"""Slater determinants of single-particle orbitals, and the derivatives of
:math:`\log|\det A|` by the row formula (Chapter 5).

Conventions
-----------
* ``positions`` are ``(n, 3)``: electron ``i`` sits at ``positions[i]``.
* ``orbitals(r)`` maps one position ``r`` of shape ``(3,)`` to the ``n`` single-particle
  orbital values :math:`(\varphi_1(r),\dots,\varphi_n(r))`.
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

from collections.abc import Callable

import jax
import jax.numpy as jnp
import jax.scipy.linalg

from beyondgrad import compat
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
    """``positions`` as an array, after checking it is ``(n, 3)`` and floating-point."""
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(
            f"positions must have shape (n, 3) (n electrons in 3-D), got {positions.shape}"
        )
    if not jnp.issubdtype(positions.dtype, jnp.floating):
        raise TypeError(
            f"positions must be a floating-point array, got dtype {positions.dtype}"
        )
    return positions


_ALL_ELECTRONS_HINT = (
    "slater_laplacian and slater_matrix need single-particle orbitals, orbitals(r) with r "
    "of shape (3,) (one electron). For orbitals that depend on all electrons (as in "
    "FermiNet) the row structure does not hold: use "
    "laplacian.laplacian(lambda v: log_psi(v.reshape(n, 3)), x.reshape(-1), "
    "method='folx') instead"
)


def _check_orbitals(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> None:
    """Cheap structural check (one abstract evaluation, no FLOPs): ``orbitals(r (3,)) -> (n,)``."""
    if not callable(orbitals):
        raise TypeError(
            f"orbitals must be a function r (3,) -> (n,), got {type(orbitals).__name__}"
        )
    n = positions.shape[0]
    try:
        out = jax.eval_shape(orbitals, jax.ShapeDtypeStruct((3,), positions.dtype))
    except Exception as e:  # e.g. a function written for (n, 3) positions
        raise ValueError(
            f"orbitals failed on one electron's position of shape (3,) "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). {_ALL_ELECTRONS_HINT}"
        ) from e
    shape = getattr(out, "shape", None)
    if shape != (n,):
        got = shape if shape is not None else type(out).__name__
        raise ValueError(
            f"orbitals must map one position (3,) to the {n} orbital values (n,) for n = {n} "
            f"electrons, got output shape {got}. {_ALL_ELECTRONS_HINT}"
        )


def slater_matrix(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """The Slater matrix :math:`A_{ij}=\\varphi_j(r_i)`, shape ``(n, n)``."""
    positions = check_positions(positions)
    _check_orbitals(orbitals, positions)
    return jax.vmap(orbitals)(positions)


def slater_log_psi(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """:math:`\\log|\\det A|` with :math:`A_{ij}=\\varphi_j(r_i)` (``slogdet``, never ``log(det)``)."""
    return jnp.linalg.slogdet(slater_matrix(orbitals, positions))[1]


def orbital_derivatives(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The Slater matrix and its row derivatives: :math:`\\varphi_j(r_i)`, :math:`\\nabla\\varphi_j(r_i)`, :math:`\\Delta\\varphi_j(r_i)`.

    One forward-Laplacian pass (:func:`forward_laplacian`) per electron, over its 3
    coordinates. Shapes ``(n, n)``, ``(n, n, 3)``, ``(n, n)``, indexed ``[i, j]`` =
    electron, orbital (:func:`orbital_jets` is the same with the gradient as
    ``(n, 3, n)``, the layout :func:`slater_laplacian` contracts).
    """
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
    """
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
    """
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
    """
    n = b.shape[0] if b.ndim else 0
    if b.shape != (n, n) or dphi.shape != (n, 3, n) or lphi.shape != (n, n):
        raise ValueError(
            "expected shapes (n, n), (n, 3, n), (n, n) (the inverse and orbital_jets' "
            f"derivatives), got {b.shape}, {dphi.shape}, {lphi.shape}"
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
    electron: orbitals of all electrons at once (as in FermiNet) are rejected with a
    ``ValueError`` (the check evaluates ``orbitals`` abstractly on one ``(3,)``
    position); for those use ``laplacian.laplacian(..., method="folx")``.
    """
    phi, dphi, lphi = orbital_jets(orbitals, positions)
    logdet, b = logdet_and_inverse(phi)
    grad, lap = row_sums(b, dphi, lphi)
    return logdet, grad, lap


def logdet_and_inverse(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log|det a|, a^{-1})`` from one LU factorisation (the diagonal of U gives the log-determinant)."""
    lu, pivots = jax.scipy.linalg.lu_factor(a)
    logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(lu))))
    return logdet, jax.scipy.linalg.lu_solve((lu, pivots), _eye_like(a))


def _eye_like(a: jax.Array) -> jax.Array:
    """``eye(n)`` with ``a``'s dtype and varying mesh axes (a right-hand side solved against ``a``)."""
    return compat.pcast_varying(
        jnp.eye(a.shape[0], dtype=a.dtype), tuple(sorted(compat.varying_axes(a)))
    )
