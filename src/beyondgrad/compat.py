"""One spelling for JAX APIs that moved inside the supported range (0.8.2 .. newest).

=====================  ==========================================  ==========================================
what                   JAX 0.8.x                                   newer JAX
=====================  ==========================================  ==========================================
cast to varying        ``lax.pvary(x, axes)``                      ``lax.pcast(x, axes, to='varying')``
varying axes of aval   ``jax.typeof(x).vma``                       ``jax.typeof(x).manual_axis_type.varying``
``jax.make_mesh``      default axis types Auto                     default axis types Explicit
=====================  ==========================================  ==========================================

The chapters call these helpers, so they read the same on every version.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
from jax import lax
from jax.sharding import AxisType

AxisNames = str | Sequence[str]


def _axis_tuple(axis_names: AxisNames) -> tuple[str, ...]:
    if isinstance(axis_names, str):
        return (axis_names,)
    try:
        names = tuple(axis_names)
    except TypeError:
        raise TypeError(f"axis_names must be a str or a sequence of str, got {type(axis_names).__name__}") from None
    if not all(isinstance(a, str) for a in names):
        raise TypeError(f"axis_names must be a str or a sequence of str, got {axis_names!r}")
    return names


def pcast_varying(x: Any, axis_names: AxisNames) -> Any:
    """Mark ``x`` (a pytree) as varying over ``axis_names`` inside ``shard_map``.

    The value is unchanged; only its type gains the axes. Its transpose is a ``psum``
    over those axes. Uses ``lax.pcast(..., to='varying')`` where it exists and
    ``lax.pvary`` on older JAX. Axes the value already varies over are skipped, so the
    call is idempotent.
    """
    names = _axis_tuple(axis_names)
    if not names:
        return x

    def cast(leaf: Any) -> Any:
        missing = tuple(a for a in names if a not in varying_axes(leaf))
        if not missing:
            return leaf
        if hasattr(lax, "pcast"):
            return lax.pcast(leaf, missing, to="varying")
        return lax.pvary(leaf, missing)  # JAX < 0.8.2

    return jax.tree_util.tree_map(cast, x)


def varying_axes(x: Any) -> frozenset[str]:
    """The mesh axes over which ``x`` varies inside ``shard_map`` (empty outside)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:  # JAX >= 0.10
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", frozenset()))


def make_mesh(
    shape: Sequence[int],
    axis_names: Sequence[str],
    *,
    axis_types: Literal["auto", "explicit"] = "auto",
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` with the axis type always stated (its default changed in 0.9)."""
    kinds = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}
    if axis_types not in kinds:
        raise ValueError(f"axis_types must be 'auto' or 'explicit', got {axis_types!r}")
    names = _axis_tuple(axis_names)
    return jax.make_mesh(tuple(shape), names, axis_types=(kinds[axis_types],) * len(names), devices=devices)
