"""Chapter 1's widget callback: what ``sum(sin(x))`` receives under a transformation.

The chapter's table (:func:`beyondgrad.tracers.format_table`) shows every
transformation at once; the widget lets a reader pick one and read it in words.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad.tracers import inspect_transformations

__all__ = ["demo_function", "receives"]


def demo_function(x: jax.Array) -> jax.Array:
    """The function the widget inspects: ``f(x) = sum_i sin(x_i)``."""
    return jnp.sum(jnp.sin(x))


def receives(transformation: str, x: jax.Array | np.ndarray | None = None) -> str:
    """What :func:`demo_function` receives under ``transformation``, in plain text.

    The tracer chain (outermost first), whether a concrete value is reachable (and
    which), and which Python conversions work. ``x`` defaults to ``[0., 1., 2.]``.
    Raises ``ValueError`` (listing the valid names) for an unknown transformation.
    """
    if not isinstance(transformation, str):
        raise TypeError(
            "transformation must be a name such as 'jit' or 'jit(grad)', "
            f"got {type(transformation).__name__}"
        )
    if x is None:
        x = jnp.arange(3.0)
    elif not isinstance(x, (jax.Array, np.ndarray)):
        raise TypeError(f"x must be a JAX or NumPy array, got {type(x).__name__}")
    (obs,) = inspect_transformations(
        demo_function, x, transformations=(transformation,)
    )
    lines = [
        f"under {transformation}: f receives a {obs.tracer_type} with aval {obs.aval}"
    ]
    for depth, layer in enumerate(obs.layers[1:], 1):
        lines.append("  " * depth + f"which wraps: {layer}")
    if obs.concrete:
        lines.append(f"a concrete value is reachable: {np.asarray(x).tolist()}")
    elif obs.layers and not obs.layers[-1].type_name.endswith("Tracer"):
        # a concrete array inside, of another shape: vmap's whole batch
        lines.append(
            f"no single concrete value: the array inside ({obs.layers[-1].aval})\n"
            f"  is the whole batch, not the one {obs.aval} f computes with"
        )
    else:
        lines.append("no concrete value is reachable: only shape and dtype are known")
    lines.append("conversions, with s = jnp.sum(x):")
    for label, err in obs.conversions.items():
        lines.append(f"  {label:<22} {'works' if err is None else 'raises ' + err}")
    if obs.error:
        lines.append(f"the call raised {obs.error}: {obs.message}")
    return "\n".join(lines)
