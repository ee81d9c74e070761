"""Independent references the tests compare with, compiled as one program each.

``jnp.trace(jax.hessian(f)(x))`` run eagerly dispatches every operation of the Hessian
on its own (hundreds of small compilations for the networks here); under ``jax.jit``
it is one program, which JAX's persistent compilation cache keeps between runs. The
value is the same float64 computation either way.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def hessian_trace(f: Callable, x: jax.Array) -> jax.Array:
    """``trace(jax.hessian(f)(x))`` for a scalar ``f`` of a flat ``x``, jitted."""
    return jax.jit(lambda v: jnp.trace(jax.hessian(f)(v)))(x)
