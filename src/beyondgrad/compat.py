"""The one place that knows JAX's version differences and private APIs (0.8.2 .. newest).

=============================  ==================================  =====================================
what                           JAX 0.8.2 .. 0.9.x                  JAX 0.10 and newer
=============================  ==================================  =====================================
cast to varying                ``lax.pcast(x, axes, to='varying')`` (``lax.pvary`` also exists, but not from 0.10)
varying axes of a type         ``jax.typeof(x).vma``               ``jax.typeof(x).manual_axis_type.varying``
``jax.make_mesh`` default      ``AxisType.Auto`` on 0.8.x, ``Explicit`` from 0.9: :func:`make_mesh` always states it
=============================  ==================================  =====================================

Private APIs read here and nowhere else (each stable across the range, tested):
``jax._src.xla_bridge.backends_are_initialized`` (:func:`backends_initialized`),
``jax._src.core.to_concrete_value`` (:func:`concrete_value`), and a ``jit`` function's
``_cache_size()`` (:func:`jit_cache_size`).

Versions are compared with :func:`jax_version` (``jax.__version_info__``), never by
parsing the string. Importing this module starts no backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import jax
from jax import lax
from jax.sharding import AxisType

__all__ = [
    "AxisNames",
    "backends_initialized",
    "concrete_value",
    "is_tracer",
    "jax_version",
    "jit_cache_size",
    "make_mesh",
    "pcast_varying",
    "varying_axes",
    "varying_axes_of_aval",
]

AxisNames = str | Sequence[str]


def jax_version() -> tuple[int, ...]:
    """The running JAX's version as integers, e.g. ``(0, 8, 2)`` (rc/dev suffixes dropped)."""
    return tuple(int(p) for p in jax.__version_info__[:3])


def _axis_tuple(axis_names: AxisNames) -> tuple[str, ...]:
    if isinstance(axis_names, str):
        return (axis_names,)
    try:
        names = tuple(axis_names)
    except TypeError:
        raise TypeError(
            f"axis_names must be a str or a sequence of str, got {type(axis_names).__name__}"
        ) from None
    if not all(isinstance(a, str) for a in names):
        raise TypeError(f"axis_names must be a str or a sequence of str, got {axis_names!r}")
    return names


# ----------------------------------------------------------------------------- varying types


def varying_axes_of_aval(aval: Any) -> frozenset[str]:
    """The varying mesh axes recorded in an abstract value (empty where it has none)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:  # JAX >= 0.10
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", None) or frozenset())


def varying_axes(x: Any) -> frozenset[str]:
    """The mesh axes over which ``x`` varies inside ``shard_map`` (empty outside)."""
    return varying_axes_of_aval(jax.typeof(x))


def pcast_varying(x: Any, axis_names: AxisNames) -> Any:
    """Mark every leaf of ``x`` as varying over ``axis_names`` inside ``shard_map``.

    This is ``lax.pcast(leaf, axes, to='varying')`` for the axes a leaf does not
    already vary over (so the call is idempotent; ``pcast`` itself rejects a leaf that
    already varies). The value is unchanged; only the type gains the axes; the
    transpose of the cast is a ``psum`` over them.
    """
    names = _axis_tuple(axis_names)
    if not names:
        return x

    def cast(leaf: Any) -> Any:
        missing = tuple(a for a in names if a not in varying_axes(leaf))
        return lax.pcast(leaf, missing, to="varying") if missing else leaf

    return jax.tree_util.tree_map(cast, x)


def make_mesh(
    shape: Sequence[int],
    axis_names: AxisNames,
    *,
    axis_types: Literal["auto", "explicit"] = "auto",
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` with the axis type always stated (its default changed in 0.9)."""
    kinds = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}
    if axis_types not in kinds:
        raise ValueError(f"axis_types must be 'auto' or 'explicit', got {axis_types!r}")
    names = _axis_tuple(axis_names)
    return jax.make_mesh(
        tuple(shape), names, axis_types=(kinds[axis_types],) * len(names), devices=devices
    )


# ----------------------------------------------------------------------------- private APIs


def backends_initialized() -> bool:
    """True once JAX has started a backend (after which the CPU device count is fixed)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def concrete_value(x: Any) -> Any | None:
    """The concrete value JAX can reach behind ``x`` (``None`` for ``jit``/``vmap`` tracers).

    A plain array is its own concrete value; an autodiff tracer answers with its
    primal's concrete value. This is the test JAX itself applies before raising a
    concretization error.
    """
    from jax._src import core

    return core.to_concrete_value(x)


def is_tracer(x: Any) -> bool:
    """True if ``x`` is a JAX tracer."""
    return isinstance(x, jax.core.Tracer)


def jit_cache_size(jitted: Any) -> int:
    """Entries in a ``jax.jit`` function's dispatch cache (one per trace it kept)."""
    size = getattr(jitted, "_cache_size", None)
    if size is None:
        raise TypeError(f"expected a function made by jax.jit, got {type(jitted).__name__}")
    return int(size())


# ----------------------------------------------------------------------------- Chapter 1


# ----------------------------------------------------------------------------- Chapter 2


# ----------------------------------------------------------------------------- Chapter 3


# ----------------------------------------------------------------------------- Chapter 4


# ----------------------------------------------------------------------------- Chapter 5


def jaxpr_atom_value(atom: Any, env: dict[Any, Any]) -> Any:
    """The value of a jaxpr input ``atom``: a literal's constant, or ``env[atom]`` for a variable.

    Used by :mod:`beyondgrad.slater`'s forward-Laplacian interpreter (Chapter 5);
    ``jax.extend.core.Literal`` is public from 0.8.2 to the newest JAX.
    """
    from jax.extend.core import Literal

    return atom.val if isinstance(atom, Literal) else env[atom]


def bind_equation(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    """Apply one jaxpr equation's primitive to ``invals``; always returns a list of outputs.

    This is what ``jax.core.eval_jaxpr`` does per equation (``get_bind_params`` turns
    stored sub-jaxprs back into what ``bind`` takes), so any primitive, including
    ``jit``, ``custom_jvp_call`` and control flow, can be re-applied under
    ``jax.jvp``/``jax.vmap`` by an interpreter.
    """
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(bind_params, tuple):  # JAX 0.8.x: (sub-functions, params)
        subfuns, params = bind_params
    else:  # newer JAX: the sub-functions stay inside the params
        subfuns, params = (), bind_params
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]
