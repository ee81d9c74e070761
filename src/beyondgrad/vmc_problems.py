r"""A VMC problem with a known answer, for :func:`beyondgrad.sharded_vmc.train`'s tests
and benchmark: two electrons in a 3-D harmonic trap with Coulomb repulsion at the trap
frequency :math:`\omega = 1/2`,

.. math::
   H = -\tfrac12(\nabla_1^2+\nabla_2^2) + \tfrac18(r_1^2+r_2^2) + \frac1{r_{12}},

whose singlet ground state is known in closed form (M. Taut, Phys. Rev. A 48, 3561
(1993)): :math:`\psi_0 = (1+\tfrac12 r_{12})\,e^{-(r_1^2+r_2^2)/4}`, :math:`E_0 = 2`
Ha exactly. :func:`beyondgrad.vmc.potential_energy` with ``omega=0.5`` is this
:math:`H`'s potential, so :func:`beyondgrad.sharded_vmc.local_energies` with
``omega=TAUT_OMEGA`` is its local energy.

The singlet's spatial part is symmetric in the two electrons, so no determinant is
needed: the ansatz :func:`taut_log_psi`,
:math:`\log\psi_\theta = -a(r_1^2+r_2^2) + \log(1+b\,r_{12})` with
:math:`a = \mathrm{softplus}(\theta_a)`, :math:`b = \mathrm{softplus}(\theta_b)`
(both positive: normalisable and node-free), contains :math:`\psi_0` at
:math:`a = 1/4`, :math:`b = 1/2` and nothing else of energy 2; its
:math:`b` is the electron-electron cusp (Kato: :math:`1/2` for a singlet pair).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from beyondgrad import _checks
from beyondgrad.slater import check_positions

__all__ = [
    "TAUT_ENERGY",
    "TAUT_EXACT",
    "TAUT_OMEGA",
    "taut_log_psi",
    "taut_params",
]

#: The trap frequency at which Taut's closed form holds (:math:`k = \omega^2 = 1/4`).
TAUT_OMEGA = 0.5
#: The singlet ground-state energy at :data:`TAUT_OMEGA`, in Hartree (exact).
TAUT_ENERGY = 2.0
#: :math:`(a, b)` of the exact state in :func:`taut_log_psi`.
TAUT_EXACT = (0.25, 0.5)


def taut_params(
    a: float = 0.4, b: float = 0.05, *, dtype: Any = jnp.float64
) -> dict[str, jax.Array]:
    r"""Parameters of :func:`taut_log_psi` for given :math:`a, b > 0`.

    :math:`\theta = \mathrm{softplus}^{-1}(a), \mathrm{softplus}^{-1}(b)`, where
    :math:`\mathrm{softplus}^{-1}(y) = \log(e^y - 1)`. The defaults start away from
    the exact state (:data:`TAUT_EXACT`): too tight a Gaussian and almost no
    correlation, energy about 2.37 Ha.

    Args:
        a: the Gaussian's exponent, positive.
        b: the pair factor's slope, positive.
        dtype: a floating dtype (``jnp.float64`` needs ``jax.enable_x64``).

    Returns:
        ``{"a": theta_a, "b": theta_b}``, scalar arrays of ``dtype``.

    Raises:
        TypeError: ``a`` or ``b`` not a number.
        ValueError: ``a`` or ``b`` not positive.
    """
    a = _checks.number(a, "a", above=0, where="taut_params: ")
    b = _checks.number(b, "b", above=0, where="taut_params: ")
    return {
        "a": jnp.asarray(math.log(math.expm1(a)), dtype),
        "b": jnp.asarray(math.log(math.expm1(b)), dtype),
    }


def taut_log_psi(params: dict[str, jax.Array], positions: jax.Array) -> jax.Array:
    r""":math:`\log\psi = -a(r_1^2+r_2^2) + \log(1+b\,r_{12})`, :math:`a, b` softplus.

    Args:
        params: ``{"a": theta_a, "b": theta_b}`` (:func:`taut_params`).
        positions: ``(2, 3)`` floating-point positions of the two electrons.

    Returns:
        A scalar: :math:`\log\psi` (:math:`\psi > 0` everywhere).

    Raises:
        ValueError: ``positions`` not ``(2, 3)``.
        TypeError: ``positions`` not floating-point.
    """
    positions = check_positions(positions)
    if positions.shape != (2, 3):
        raise ValueError(
            f"taut_log_psi is a two-electron wavefunction: positions must be (2, 3), "
            f"got {positions.shape}"
        )
    a = jax.nn.softplus(params["a"])
    b = jax.nn.softplus(params["b"])
    diff = positions[0] - positions[1]
    r12 = jnp.sqrt(jnp.sum(diff * diff))
    return -a * jnp.sum(positions * positions) + jnp.log1p(b * r12)
