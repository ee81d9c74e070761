"""shard_map and varying manual axes: an explainer, a data-parallel gradient, layouts.

Inside ``jax.shard_map`` every value has a type that says over which mesh axes it
*varies* (devices along the axis may hold different values) and over which it is
*invariant* (all devices along the axis hold the same value). JAX prints it as
``float32[4]{V:data}``. The rules this module makes visible:

* an operation's result varies over the union of its operands' varying axes
  (invariant operands are cast to varying first, a type change with no communication);
* ``psum``/``pmean``/``pmax``/``pmin`` over an axis remove it; ``all_gather`` (by default),
  ``psum_scatter``, ``all_to_all`` and ``ppermute`` keep it; a cast to varying adds it;
* every linear collective has a transpose that is a collective too (``psum`` <->
  cast to varying, ``all_gather`` <-> ``psum_scatter``, ``ppermute`` <-> the inverse
  permutation), so the gradient with respect to invariant parameters of a per-device
  loss is already summed over the devices; under ``vmap`` (per-example gradients,
  ``jacrev``) that ``psum`` sums each local example index over the devices, so cast
  the parameters to varying first (JAX 0.8.2 raises a ``TypeError`` there, newer JAX
  returns the wrong numbers: upgrading is no fix);
* ``pmax``/``pmin`` have no differentiation rule at all (neither JVP nor transpose).

Contents: :func:`explain_vma` (a per-equation table of varying axes),
:func:`explain_transpose` (the same for the transpose of a linear function),
:func:`data_parallel_value_and_grad` (the data-parallel gradient), :func:`block_layout`
(which device holds which block), :func:`validate_spec` / :func:`validate_specs`.

Every function that takes a mesh accepts one from ``jax.make_mesh`` with its default
axis types (Explicit on new JAX, Auto on 0.8.x) and plain, unsharded global arrays
or ``jax.ShapeDtypeStruct`` arguments: they are placed with the specs first.
Exercise checkers are in :mod:`beyondgrad.exercises.ch4`, figures and the chapter's
error table in :mod:`beyondgrad.figures.ch4`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import _checks, compat

__all__ = [
    "BlockLayout",
    "VmaReport",
    "VmaRow",
    "block_layout",
    "data_parallel_value_and_grad",
    "explain_transpose",
    "explain_vma",
    "spec_str",
    "validate_spec",
    "validate_specs",
]

#: A PartitionSpec, or what :func:`validate_spec` turns into one (None, a tuple).
SpecLike = P | tuple | list | None
#: A pytree of specs (a prefix of the arguments' pytree), as ``shard_map`` takes.
Specs = Any

_MESH_HINT = (
    "e.g. jax.make_mesh((8,), ('data',)) or beyondgrad.runtime.demo_mesh(8, 'data')"
)

# --------------------------------------------------------------------------------------
# Validating meshes and specs
# --------------------------------------------------------------------------------------


def _require_mesh(mesh: object, what: str = "mesh") -> Mesh:
    if not isinstance(mesh, Mesh):
        raise TypeError(
            f"{what} must be a jax.sharding.Mesh ({_MESH_HINT}), got {type(mesh).__name__}"
        )
    return mesh


def _spec_axes(entry: object) -> tuple[str, ...]:
    """Mesh axes named by one entry of a PartitionSpec (None, a name, or a tuple)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        return tuple(entry)
    raise TypeError(
        f"a PartitionSpec entry must be None, a mesh axis name or a tuple of names, got {entry!r}"
    )


def _mesh_sizes(mesh: Mesh | Mapping[str, int]) -> dict[str, int]:
    if isinstance(mesh, Mapping):
        return {str(k): int(v) for k, v in mesh.items()}
    return dict(zip(_require_mesh(mesh).axis_names, mesh.devices.shape))


def spec_str(spec: P) -> str:
    """``P('data', None)`` on every JAX version (0.8.x prints ``PartitionSpec(...)``).

    Args:
        spec: a ``jax.sharding.PartitionSpec``.

    Returns:
        ``"P(...)"`` with the ``repr`` of each entry, e.g. ``P('data', None, ('a',
        'b'))``.

    Raises:
        TypeError: ``spec`` is not a ``PartitionSpec``.
    """
    if not isinstance(spec, P):
        raise TypeError(
            f"spec_str(): spec must be a jax.sharding.PartitionSpec, e.g. "
            f"P('data', None), got {type(spec).__name__}"
        )
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def validate_spec(
    mesh: Mesh | Mapping[str, int],
    spec: SpecLike,
    shape: Sequence[int] | None = None,
    *,
    what: str = "spec",
) -> P:
    """Check one PartitionSpec against a mesh (and an argument shape); return it as ``P``.

    ``mesh`` is a ``Mesh`` or a mapping ``{axis name: size}``. Raises ``ValueError``
    naming the offending axis or spec when a mesh axis name is not in the mesh, a mesh
    axis is used twice, the spec has more entries than the argument has dimensions, or
    a dimension's size is not divisible by the product of the sizes of the mesh axes
    it is split over (dimension ``k`` split over ``(a, b)`` has ``size(a) size(b)``
    blocks). A string where a spec belongs is a ``TypeError`` suggesting ``P(name)``.

    Args:
        mesh: a ``jax.sharding.Mesh`` or a mapping ``{axis name: size}`` giving the
            mesh axes the spec may name.
        spec: a ``PartitionSpec``; ``None`` (taken as ``P()``, fully replicated) or a
            tuple/list of entries (taken as ``P(*spec)``) is accepted too.
        shape: the global shape of the argument the spec applies to; ``None`` skips
            the rank and divisibility checks.
        what: the name of the spec in error messages (keyword-only).

    Returns:
        ``spec`` as a ``PartitionSpec``.

    Raises:
        TypeError: ``spec`` is a string or not a spec, a spec entry is not ``None``, a
            name or a tuple of names, or ``mesh`` is neither a ``Mesh`` nor a mapping.
        ValueError: the spec names an axis not in the mesh or one axis twice, has more
            entries than ``shape`` has dimensions, or splits a dimension into a number
            of blocks that does not divide its size.
    """
    sizes = _mesh_sizes(mesh)
    if not isinstance(spec, P):
        if spec is None:
            spec = P()
        elif isinstance(spec, str):
            raise TypeError(
                f"{what} must be a PartitionSpec such as P({spec!r}), got the string {spec!r}"
            )
        elif isinstance(spec, (tuple, list)):
            spec = P(*spec)
        else:
            raise TypeError(
                f"{what} must be a jax.sharding.PartitionSpec, got {type(spec).__name__}: {spec!r}"
            )
    shown = spec_str(spec)
    seen: list[str] = []
    for entry in spec:
        for name in _spec_axes(entry):
            if name not in sizes:
                raise ValueError(
                    f"{what} {shown} names mesh axis {name!r}, which is not in the mesh; "
                    f"the mesh axes are {tuple(sizes)}"
                )
            if name in seen:
                raise ValueError(
                    f"{what} {shown} uses mesh axis {name!r} twice; each mesh axis may shard one dimension"
                )
            seen.append(name)
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if len(spec) > len(shape):
            raise ValueError(
                f"{what} {shown} has {len(spec)} entries but the argument has rank {len(shape)} "
                f"(shape {shape}); use at most {len(shape)} entries"
            )
        for dim, entry in enumerate(spec):
            parts = math.prod(sizes[a] for a in _spec_axes(entry))
            if shape[dim] % parts:
                raise ValueError(
                    f"{what} {shown} splits dimension {dim} (size {shape[dim]}) into {parts} blocks "
                    f"over {_spec_axes(entry)}; {shape[dim]} is not divisible by {parts}"
                )
    return spec


def _is_spec(s: object) -> bool:
    return isinstance(s, P) or s is None


def validate_specs(
    mesh: Mesh | Mapping[str, int], specs: Specs, args: Any, *, what: str = "in_specs"
) -> None:
    """Validate a pytree of PartitionSpecs (a prefix of ``args``) against mesh and shapes.

    Args:
        mesh: a ``jax.sharding.Mesh`` or a mapping ``{axis name: size}``.
        specs: a pytree of ``PartitionSpec`` values (``None`` leaves meaning ``P()``) that is
            a prefix of the pytree ``args``, as ``shard_map``'s ``in_specs``.
        args: the arguments (arrays, ``ShapeDtypeStruct`` values or anything ``np.shape``
            accepts); every leaf under a spec is checked with :func:`validate_spec`.
        what: the name used in error messages, suffixed ``[k]`` for the ``k``-th spec
            when there are several (keyword-only).

    Returns:
        ``None``; the function only raises.

    Raises:
        TypeError: ``specs`` is a string, or a spec is malformed (see
            :func:`validate_spec`).
        ValueError: ``specs`` is not a prefix of the structure of ``args``, or a spec
            does not fit the mesh or a leaf's shape (see :func:`validate_spec`).
    """
    if isinstance(specs, str):
        raise TypeError(
            f"{what} must be a PartitionSpec or a tuple of them, such as P({specs!r}); got a string"
        )
    spec_leaves, spec_def = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec)
    try:
        arg_groups = spec_def.flatten_up_to(args)
    except (ValueError, TypeError) as e:
        raise ValueError(
            f"{what} {specs!r} does not match the structure of the arguments: {e}"
        ) from None
    for k, (spec, sub) in enumerate(zip(spec_leaves, arg_groups)):
        name = f"{what}[{k}]" if len(spec_leaves) > 1 else what
        for leaf in jax.tree_util.tree_leaves(sub):
            validate_spec(mesh, spec, np.shape(leaf), what=name)


def _leaf_struct(leaf: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        shape, dtype = tuple(leaf.shape), leaf.dtype
    else:  # Python scalars and nested lists
        arr = np.asarray(leaf)
        shape, dtype = arr.shape, jnp.asarray(arr).dtype
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _placed_structs(mesh: Mesh, specs: Specs, args: Any) -> Any:
    """``args`` as ShapeDtypeStructs laid out as ``specs`` say on ``mesh``.

    On an Explicit mesh the layout is part of an array's type, and ``shard_map``
    rejects arguments whose type disagrees with ``in_specs``; giving every argument
    the layout of its spec makes plain global arrays acceptable on every axis type.
    """
    return jax.tree_util.tree_map(
        lambda spec, sub: jax.tree_util.tree_map(
            lambda leaf: _leaf_struct(leaf, NamedSharding(mesh, spec or P())), sub
        ),
        specs,
        args,
        is_leaf=_is_spec,
    )


def _place(mesh: Mesh, specs: Specs, args: Any) -> Any:
    """``jax.device_put`` every leaf of ``args`` with the NamedSharding of its spec."""
    return jax.tree_util.tree_map(
        lambda spec, sub: jax.device_put(sub, NamedSharding(mesh, spec or P())),
        specs,
        args,
        is_leaf=_is_spec,
    )


# --------------------------------------------------------------------------------------
# The explainer
# --------------------------------------------------------------------------------------


def _fmt_axes(axes: frozenset[str]) -> str:
    return "{" + ",".join(sorted(axes)) + "}"


@dataclasses.dataclass(frozen=True)
class VmaRow:
    """One equation of the traced ``shard_map`` body.

    Attributes:
        index: the equation's position in the report, depth first: a nested jaxpr's
            rows follow the equation that holds it.
        where: ``""`` for the body itself, else the path of the nested jaxpr,
            ``primitive.param`` per level joined by ``/``, e.g. ``"scan.jaxpr"`` or
            ``"cond.branches[1]"``.
        primitive: the primitive's name, e.g. ``"psum"``.
        in_vma: the mesh axes each operand varies over, in operand order.
        out_vma: the mesh axes each result varies over.
        out_types: each result's short type, e.g. ``"f32[1]{V:data}"`` (the
            ``{V:...}`` suffix lists its varying axes).
    """

    index: int
    where: str  # "" for the body itself, else the path of the nested jaxpr, e.g. "scan"
    primitive: str
    in_vma: tuple[frozenset[str], ...]
    out_vma: tuple[frozenset[str], ...]
    out_types: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class VmaReport:
    """Per-equation varying axes of a function traced under ``shard_map``.

    Made by :func:`explain_vma`; ``str()`` and :meth:`table` give a text table.

    Attributes:
        mesh_axes: the mesh's axis names.
        arg_vma: the mesh axes each argument leaf varies over inside the body.
        arg_types: each argument leaf's short type inside the body (its block),
            e.g. ``"f32[1]{V:data}"``.
        rows: one :class:`VmaRow` per equation, nested jaxprs included.
        out_vma: the mesh axes each result leaf of the function varies over.
        out_types: each result leaf's short type.
    """

    mesh_axes: tuple[str, ...]
    arg_vma: tuple[frozenset[str], ...]
    arg_types: tuple[str, ...]
    rows: tuple[VmaRow, ...]
    out_vma: tuple[frozenset[str], ...]
    out_types: tuple[str, ...]

    def primitives(self, where: str | None = None) -> list[str]:
        """Primitive names in order (all levels, or only those at ``where``).

        Args:
            where: a :attr:`VmaRow.where` path (``""`` for the body's own equations);
                ``None`` (the default): every level.

        Returns:
            The rows' primitive names, in row order, repeats kept.
        """
        return [r.primitive for r in self.rows if where is None or r.where == where]

    def count(self, primitive: str) -> int:
        """How many equations (at any nesting level) use ``primitive``.

        Args:
            primitive: a primitive's name, e.g. ``"psum"`` (a str, not the
                ``Primitive`` object).

        Returns:
            The number of rows whose primitive has that name.

        Raises:
            TypeError: ``primitive`` is not a str (for a ``Primitive`` object the
                message names ``.name``).
        """
        if not isinstance(primitive, str):
            hint = (
                f": pass its name, {primitive.name!r}"
                if isinstance(getattr(primitive, "name", None), str)
                else ""
            )
            raise TypeError(
                f"VmaReport.count(): primitive must be a primitive's name (a str)"
                f"{hint}, got {type(primitive).__name__}"
            )
        return sum(r.primitive == primitive for r in self.rows)

    def table(self) -> str:
        """The report as a fixed-width text table."""
        head = (
            "#",
            "where",
            "primitive",
            "inputs vary over",
            "outputs vary over",
            "output types",
        )
        body = [
            (
                str(r.index),
                r.where or "body",
                r.primitive,
                " ".join(_fmt_axes(a) for a in r.in_vma) or "-",
                " ".join(_fmt_axes(a) for a in r.out_vma) or "-",
                " ".join(r.out_types) or "-",
            )
            for r in self.rows
        ]
        widths = [
            max(len(h), *(len(row[i]) for row in body)) if body else len(h)
            for i, h in enumerate(head)
        ]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

        out = [
            f"mesh axes {self.mesh_axes}; arguments: " + " ".join(self.arg_types),
            line(head),
            line(tuple("-" * w for w in widths)),
            *(line(row) for row in body),
            "results: " + " ".join(self.out_types),
        ]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(self.table())


def _short(aval: Any) -> str:
    try:
        return aval.str_short(short_dtypes=True)
    except (AttributeError, TypeError):
        return str(aval)


def _sub_jaxprs(params: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Nested jaxprs in an equation's params, as (label, core.Jaxpr)."""
    found: list[tuple[str, Any]] = []

    def visit(label: str, value: Any) -> None:
        if hasattr(value, "eqns") and hasattr(value, "invars"):  # core.Jaxpr
            found.append((label, value))
        elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # ClosedJaxpr
            found.append((label, value.jaxpr))
        elif isinstance(value, (tuple, list)):
            for k, v in enumerate(value):
                visit(f"{label}[{k}]", v)

    for key, value in params.items():
        visit(key, value)
    return found


def _walk(jaxpr: Any, where: str, rows: list[VmaRow]) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        rows.append(
            VmaRow(
                index=len(rows),
                where=where,
                primitive=name,
                in_vma=tuple(compat.varying_axes_of_aval(v.aval) for v in eqn.invars),
                out_vma=tuple(compat.varying_axes_of_aval(v.aval) for v in eqn.outvars),
                out_types=tuple(_short(v.aval) for v in eqn.outvars),
            )
        )
        for label, sub in _sub_jaxprs(eqn.params):
            prefix = f"{where}/" if where else ""
            _walk(sub, f"{prefix}{name}.{label}", rows)


def explain_vma(
    f: Callable[..., Any],
    mesh: Mesh,
    in_specs: Specs,
    *args: Any,
    out_specs: Specs = None,
    check_vma: bool = True,
) -> VmaReport:
    """Trace ``f`` under ``jax.shard_map`` and report the varying axes of every value.

    ``args`` are global arrays or ``jax.ShapeDtypeStruct`` values; only their shapes and
    dtypes are used and nothing is computed (each is traced with the layout its spec
    names, so a mesh from ``jax.make_mesh`` with Explicit axes works too). With
    ``out_specs=None`` the results are inspected but not returned from ``shard_map``,
    so no output spec has to be guessed; pass ``out_specs`` to also check them as
    ``shard_map`` does. Nested jaxprs (``scan`` bodies, ``cond`` branches, ``jit``
    calls, custom rules) are walked too; their rows carry a ``where`` path.
    Raises ``ValueError`` naming the axis/spec for specs that do not fit mesh or args.

    Args:
        f: the per-shard function traced inside ``jax.shard_map``; it takes one block
            per argument.
        mesh: the ``jax.sharding.Mesh`` to map over.
        in_specs: ``shard_map``'s ``in_specs``: a pytree of ``PartitionSpec`` values, a prefix
            of ``args``.
        *args: the global arguments (arrays or ``jax.ShapeDtypeStruct`` values); only shapes
            and dtypes are used.
        out_specs: ``shard_map``'s ``out_specs``; ``None`` (the default) inspects the
            results without returning them from ``shard_map``.
        check_vma: passed to ``jax.shard_map``; ``True`` makes JAX check varying axes.

    Returns:
        A :class:`VmaReport` with the mesh axes, the varying axes and types of the
        arguments and results, and one row per equation (nested jaxprs included).

    Raises:
        TypeError: ``f`` is not callable, ``mesh`` is not a ``Mesh``, or a spec is
            malformed (e.g. a string).
        ValueError: ``in_specs`` does not match ``args``' structure, or a spec names an
            axis not in the mesh, repeats an axis, or does not fit an argument's shape.
    """
    _checks.function(f, "f")
    _require_mesh(mesh)
    validate_specs(mesh, in_specs, args, what="in_specs")
    if out_specs is not None:
        for s in jax.tree_util.tree_leaves(out_specs, is_leaf=_is_spec):
            validate_spec(mesh, s, what="out_specs")
    seen: dict[str, Any] = {}

    def body(*inner: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(inner)
        seen["args"] = tuple(compat.varying_axes(x) for x in leaves)
        seen["arg_types"] = tuple(_short(jax.typeof(x)) for x in leaves)
        out = f(*inner)
        leaves = jax.tree_util.tree_leaves(out)
        seen["out"] = tuple(compat.varying_axes(x) for x in leaves)
        seen["types"] = tuple(_short(jax.typeof(x)) for x in leaves)
        return out if out_specs is not None else ()

    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs if out_specs is not None else (),
        check_vma=check_vma,
    )
    structs = _placed_structs(mesh, in_specs, args)
    closed = jax.make_jaxpr(mapped)(*structs)
    inner = [e for e in closed.jaxpr.eqns if e.primitive.name == "shard_map"]
    if len(inner) != 1:  # pragma: no cover - the trace above makes exactly one
        raise RuntimeError(f"expected one shard_map equation, found {len(inner)}")
    rows: list[VmaRow] = []
    _walk(inner[0].params["jaxpr"], "", rows)
    return VmaReport(
        mesh_axes=tuple(mesh.axis_names),
        arg_vma=seen["args"],
        arg_types=seen["arg_types"],
        rows=tuple(rows),
        out_vma=seen["out"],
        out_types=seen["types"],
    )


def explain_transpose(
    f: Callable[..., Any], mesh: Mesh, in_specs: Specs, *args: Any
) -> VmaReport:
    """The :func:`explain_vma` report of the *transpose* of a linear ``f``.

    Inside ``shard_map``, ``f`` is applied to the blocks, and ``jax.linear_transpose(f,
    *blocks)`` is applied to a cotangent of the output's type (``f``'s own output is
    used, so shape and varying axes match). The rows returned are those of the
    transpose only; ``arg_types`` are the types of ``f``'s arguments and ``out_types``
    the types the transpose returns (the same as the arguments', by definition).
    A non-linear ``f`` raises JAX's own error (e.g. ``NotImplementedError`` for a
    primitive with no transpose rule).

    Args:
        f: a linear per-shard function, traced inside ``jax.shard_map``.
        mesh: the ``jax.sharding.Mesh`` to map over.
        in_specs: ``shard_map``'s ``in_specs``: a pytree of ``PartitionSpec`` values, a prefix
            of ``args``.
        *args: the global arguments (arrays or ``jax.ShapeDtypeStruct`` values); only shapes
            and dtypes are used.

    Returns:
        A :class:`VmaReport` whose rows are those of the transpose only, numbered from 0.

    Raises:
        TypeError: ``f`` is not callable, ``mesh`` is not a ``Mesh``, or a spec is
            malformed.
        ValueError: a spec does not fit the mesh or the arguments (as
            :func:`explain_vma`).
    """
    _checks.function(f, "f")
    forward = explain_vma(f, mesh, in_specs, *args)

    def round_trip(*blocks: Any) -> Any:
        return jax.linear_transpose(f, *blocks)(f(*blocks))

    both = explain_vma(round_trip, mesh, in_specs, *args)
    rows = tuple(
        dataclasses.replace(r, index=k)
        for k, r in enumerate(both.rows[len(forward.rows) :])
    )
    return dataclasses.replace(both, rows=rows)


# --------------------------------------------------------------------------------------
# Data-parallel loss and gradient
# --------------------------------------------------------------------------------------


def data_parallel_value_and_grad(
    loss_fn: Callable[[Any, Any], jax.Array],
    mesh: Mesh,
    axis: str = "data",
    *,
    reduction: Literal["mean", "sum"] = "mean",
) -> Callable[[Any, Any], tuple[jax.Array, Any]]:
    """Data-parallel ``value_and_grad``: parameters invariant, batch split over ``axis``.

    ``loss_fn(params, batch)`` computes the loss of one shard of the batch: its mean
    over the shard's examples (``reduction="mean"``) or their sum (``"sum"``). With
    equal shards, the global loss is ``L = pmean_d L_d`` (resp. ``psum_d L_d``). The
    reduction is applied *inside* the differentiated function, so

        grad L = (1/D) sum_d grad L_d   (mean),   sum_d grad L_d   (sum),

    exactly the single-device gradient of the whole batch. (The ``psum`` that the
    transpose of the implicit cast of ``params`` to varying inserts does the summing:
    no extra ``pmean`` on the gradient, which would be a second reduction.)

    Returns a jitted ``f(params, batch) -> (loss, grads)``; every leaf of ``batch`` is
    split along its leading dimension, which must be divisible by the size of ``axis``.
    Plain arrays are placed first (``params`` replicated, ``batch`` split), so any mesh
    works, Explicit or Auto axes.

    Args:
        loss_fn: ``loss_fn(params, batch) -> scalar``, the loss of one shard of the
            batch (its mean or its sum over the shard's examples, per ``reduction``).
        mesh: the ``jax.sharding.Mesh`` to run on.
        axis: the one mesh axis name the batch is split over.
        reduction: ``"mean"`` (combine shard losses with ``pmean``) or ``"sum"``
            (with ``psum``); keyword-only.

    Returns:
        A jitted ``f(params, batch) -> (loss, grads)``: the global loss and the
        gradient with respect to ``params`` (same pytree structure as ``params``).
        ``f`` raises ``ValueError`` if ``batch`` has no leaves, a leaf's leading size
        is not divisible by the size of ``axis`` or leaves differ in leading size, and
        ``TypeError`` if a ``params`` leaf is not floating point (or complex) or
        ``loss_fn`` does not return a scalar.

    Raises:
        TypeError: ``loss_fn`` is not callable, ``mesh`` is not a ``Mesh``, or ``axis``
            is not a str.
        ValueError: ``axis`` is not a mesh axis, or ``reduction`` is not ``"mean"`` or
            ``"sum"``.
    """
    _checks.function(loss_fn, "loss_fn", "a function (params, batch) -> scalar")
    _require_mesh(mesh)
    if not isinstance(axis, str):
        raise TypeError(f"axis must be one mesh axis name (a str), got {axis!r}")
    if axis not in mesh.axis_names:
        raise ValueError(
            f"axis {axis!r} is not a mesh axis; the mesh axes are {tuple(mesh.axis_names)}"
        )
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    collective = lax.pmean if reduction == "mean" else lax.psum

    def per_shard(params: Any, batch: Any) -> tuple[jax.Array, Any]:
        def global_loss(p: Any) -> jax.Array:
            local = loss_fn(p, batch)
            if jnp.ndim(local) != 0:
                raise TypeError(
                    f"loss_fn must return a scalar, got shape {jnp.shape(local)}"
                )
            return collective(local, axis)

        return jax.value_and_grad(global_loss)(params)

    def run(params: Any, batch: Any) -> tuple[jax.Array, Any]:
        leaves = jax.tree_util.tree_leaves(batch)
        if not leaves:
            raise ValueError("batch has no arrays to split")
        for leaf in leaves:
            validate_spec(mesh, P(axis), np.shape(leaf), what="batch")
        _checks.float_leaves(
            params,
            "params",
            complex_ok=True,
            why="data_parallel_value_and_grad differentiates params",
            fix="pass e.g. jnp.asarray(params, jnp.float32) (or close over integer "
            "parameters in loss_fn)",
        )
        n = {np.shape(leaf)[0] for leaf in leaves}
        if len(n) != 1:
            raise ValueError(
                f"every batch leaf must have the same leading size (examples), got {sorted(n)}"
            )
        specs = (P(), P(axis))
        params, batch = _place(mesh, specs, (params, batch))
        mapped = jax.shard_map(
            per_shard, mesh=mesh, in_specs=specs, out_specs=(P(), P())
        )
        return mapped(params, batch)

    return jax.jit(run)


# --------------------------------------------------------------------------------------
# Which device holds which block
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Where each block of a global array lives for ``NamedSharding(mesh, spec)``.

    ``blocks[d]`` is the tuple of ``slice`` objects (one per array dimension) of the block
    held by the device at flat mesh position ``d`` (row-major over ``mesh_shape``).
    Inside ``shard_map`` the argument varies over exactly the mesh axes its spec names.

    Attributes:
        mesh_shape: the mesh's size along each axis.
        axis_names: the mesh's axis names, one per entry of ``mesh_shape``.
        spec: the ``PartitionSpec``.
        array_shape: the global array's shape.
        blocks: per flat mesh position (row-major), one ``slice`` per array
            dimension: the block that device holds.
        varying: the mesh axes the spec names (those the block varies over).
    """

    mesh_shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    spec: P
    array_shape: tuple[int, ...]
    blocks: tuple[tuple[slice, ...], ...]
    varying: frozenset[str]

    @property
    def replicated_over(self) -> frozenset[str]:
        """Mesh axes the spec does not name: devices along them hold identical blocks."""
        return frozenset(self.axis_names) - self.varying

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The shape of each block (all blocks have the same)."""
        return tuple(s.stop - s.start for s in self.blocks[0])

    def holders(self) -> dict[tuple[tuple[int, int], ...], list[int]]:
        """Distinct blocks (as (start, stop) per dim) -> the devices holding a copy."""
        out: dict[tuple[tuple[int, int], ...], list[int]] = {}
        for d, blk in enumerate(self.blocks):
            out.setdefault(tuple((s.start, s.stop) for s in blk), []).append(d)
        return out

    def summary(self) -> str:
        """Blocks, copies and varying axes in one line."""
        copies = len(self.blocks) // len(self.holders())
        return (
            f"{len(self.holders())} block(s) of shape {self.block_shape}, {copies} device(s) each; "
            f"varies over {_fmt_axes(self.varying)}, invariant over {_fmt_axes(self.replicated_over)}"
        )

    def describe(self) -> str:
        """:meth:`summary` prefixed with the mesh, spec and array shape."""
        mesh = dict(zip(self.axis_names, self.mesh_shape))
        return f"mesh {mesh}, spec {spec_str(self.spec)}, array {self.array_shape}: {self.summary()}"


def block_layout(
    mesh_shape: Sequence[int],
    spec: SpecLike,
    array_shape: Sequence[int],
    axis_names: Sequence[str] = ("data", "model"),
) -> BlockLayout:
    """Compute, without devices, which block of the array each mesh position holds.

    Dimension ``k`` split over mesh axes ``(a, b, ...)`` is cut into
    ``n = size(a) * size(b) * ...`` equal blocks; a device at mesh coordinates ``c``
    holds block ``((c_a * size(b) + c_b) * ...)`` (major to minor in the order listed).
    Axes not named by the spec do not split anything: devices along them hold copies.

    Args:
        mesh_shape: the mesh's size along each axis (e.g. ``mesh.devices.shape``); not
            a ``Mesh``.
        spec: the ``PartitionSpec`` (or ``None``/tuple, as :func:`validate_spec`)
            naming axes from ``axis_names``.
        array_shape: the global shape of the array.
        axis_names: the mesh axis names, one per entry of ``mesh_shape``; a single
            string is taken as one name.

    Returns:
        A :class:`BlockLayout` giving, for each flat mesh position (row-major), the
        slices of the block it holds, and the set of mesh axes the spec names.

    Raises:
        TypeError: ``mesh_shape`` is a ``Mesh``, ``mesh_shape`` or ``array_shape`` is
            not a sequence of ints, or ``spec`` is malformed.
        ValueError: ``mesh_shape`` and ``axis_names`` differ in length, a mesh size is
            below 1, or ``spec`` does not fit the mesh or ``array_shape`` (see
            :func:`validate_spec`).
    """
    if isinstance(mesh_shape, Mesh):
        raise TypeError(
            "mesh_shape is a tuple of sizes: pass mesh.devices.shape and mesh.axis_names"
        )
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    try:
        mesh_shape = tuple(int(s) for s in mesh_shape)
        array_shape = tuple(int(s) for s in array_shape)
    except (TypeError, ValueError):
        raise TypeError(
            f"mesh_shape and array_shape must be sequences of ints, got {mesh_shape!r} and {array_shape!r}"
        ) from None
    axis_names = tuple(axis_names)
    if len(mesh_shape) != len(axis_names):
        raise ValueError(
            f"mesh_shape {mesh_shape} has {len(mesh_shape)} axes but axis_names {axis_names} "
            f"has {len(axis_names)}"
        )
    if any(s < 1 for s in mesh_shape):
        raise ValueError(f"mesh_shape entries must be >= 1, got {mesh_shape}")
    sizes = dict(zip(axis_names, mesh_shape))
    spec = validate_spec(sizes, spec, array_shape, what="spec")
    entries = [_spec_axes(e) for e in spec] + [()] * (len(array_shape) - len(spec))
    blocks = []
    for coords in np.ndindex(*mesh_shape):
        at = dict(zip(axis_names, coords))
        blk = []
        for dim, names in enumerate(entries):
            n, k = 1, 0
            for a in names:
                k = k * sizes[a] + at[a]
                n *= sizes[a]
            step = array_shape[dim] // n
            blk.append(slice(k * step, (k + 1) * step))
        blocks.append(tuple(blk))
    varying = frozenset(a for names in entries for a in names)
    return BlockLayout(
        mesh_shape, axis_names, spec, array_shape, tuple(blocks), varying
    )
