"""shard_map and varying manual axes: an explainer, a data-parallel gradient, layouts.

Inside ``jax.shard_map`` every value has a type that says over which mesh axes it
*varies* (different devices along the axis may hold different values) and over which
it is *invariant* (all devices along the axis hold the same value). JAX writes it as
``f32[4]{V:i}``. The rules this module makes visible:

* an operation's result varies over the union of its operands' varying axes
  (invariant operands are cast with ``pvary`` first);
* ``psum``/``pmean`` over an axis remove it (varying -> invariant); ``all_gather`` and
  ``ppermute`` keep it; a cast to varying adds it;
* the transpose of a cast to varying is a ``psum``, so the gradient of a per-device
  loss with respect to invariant parameters is already summed over the devices.

Contents: :func:`explain_vma` (a per-equation table of varying axes),
:func:`data_parallel_value_and_grad` (the correct data-parallel gradient),
:class:`ErrorLog` (collect errors met, for a table), :func:`block_layout` /
:func:`layout_figure` (which device holds which block), and the chapter's checkers.
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
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, exercises

# --------------------------------------------------------------------------------------
# Reading varying axes from avals, and validating specs
# --------------------------------------------------------------------------------------


def aval_varying_axes(aval: Any) -> frozenset[str]:
    """Varying mesh axes recorded in an abstract value (``.vma`` on 0.8.x, later
    ``.manual_axis_type.varying``); empty for avals without them (e.g. tokens)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", None) or frozenset())


def _spec_axes(entry: Any) -> tuple[str, ...]:
    """Mesh axes named by one entry of a PartitionSpec (None, a name, or a tuple)."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        return tuple(entry)
    raise TypeError(f"a PartitionSpec entry must be None, a mesh axis name or a tuple of names, got {entry!r}")


def _mesh_sizes(mesh: Mesh | Mapping[str, int]) -> dict[str, int]:
    if isinstance(mesh, Mapping):
        return dict(mesh)
    return dict(zip(mesh.axis_names, mesh.devices.shape))


def validate_spec(
    mesh: Mesh | Mapping[str, int], spec: Any, shape: Sequence[int] | None = None, *, what: str = "spec"
) -> P:
    """Check one PartitionSpec against a mesh (and an argument shape); return it as ``P``.

    Raises ``ValueError`` naming the offending axis or spec when: a mesh axis name is
    not in the mesh, a mesh axis is used twice, the spec has more entries than the
    argument has dimensions, or a dimension's size is not divisible by the product of
    the mesh axis sizes it is split over.
    """
    sizes = _mesh_sizes(mesh)
    if not isinstance(spec, P):
        if spec is None:
            spec = P()
        elif isinstance(spec, (tuple, list)):
            spec = P(*spec)
        else:
            raise TypeError(f"{what} must be a jax.sharding.PartitionSpec, got {type(spec).__name__}: {spec!r}")
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
                raise ValueError(f"{what} {shown} uses mesh axis {name!r} twice; each mesh axis may shard one dimension")
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


def validate_specs(mesh: Mesh, specs: Any, args: Any, *, what: str = "in_specs") -> None:
    """Validate a pytree of PartitionSpecs (a prefix of ``args``) against mesh and shapes."""
    is_spec = lambda s: isinstance(s, P) or s is None  # noqa: E731
    spec_leaves, spec_def = jax.tree_util.tree_flatten(specs, is_leaf=is_spec)
    try:
        arg_groups = spec_def.flatten_up_to(args)
    except ValueError as e:
        raise ValueError(f"{what} {specs!r} does not match the structure of the arguments: {e}") from None
    for k, (spec, sub) in enumerate(zip(spec_leaves, arg_groups)):
        for leaf in jax.tree_util.tree_leaves(sub):
            validate_spec(mesh, spec, np.shape(leaf), what=f"{what}[{k}]" if len(spec_leaves) > 1 else what)


# --------------------------------------------------------------------------------------
# The explainer
# --------------------------------------------------------------------------------------


def _fmt_axes(axes: frozenset[str]) -> str:
    return "{" + ",".join(sorted(axes)) + "}"


@dataclasses.dataclass(frozen=True)
class VmaRow:
    """One equation of the traced ``shard_map`` body."""

    index: int
    where: str  # "" for the body itself, else the path of the nested jaxpr, e.g. "scan"
    primitive: str
    in_vma: tuple[frozenset[str], ...]
    out_vma: tuple[frozenset[str], ...]
    out_types: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class VmaReport:
    """Per-equation varying axes of a function traced under ``shard_map``."""

    mesh_axes: tuple[str, ...]
    arg_vma: tuple[frozenset[str], ...]
    rows: tuple[VmaRow, ...]
    out_vma: tuple[frozenset[str], ...]
    out_types: tuple[str, ...]

    def primitives(self, where: str | None = None) -> list[str]:
        """Primitive names in order (all levels, or only those at ``where``)."""
        return [r.primitive for r in self.rows if where is None or r.where == where]

    def count(self, primitive: str) -> int:
        """How many equations (at any nesting level) use ``primitive``."""
        return sum(r.primitive == primitive for r in self.rows)

    def table(self) -> str:
        """The report as a fixed-width text table."""
        head = ("#", "where", "primitive", "inputs vary over", "outputs vary over", "output types")
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
        widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
        out = [
            f"mesh axes {self.mesh_axes}; arguments vary over: " + " ".join(_fmt_axes(a) for a in self.arg_vma),
            line(head),
            line(tuple("-" * w for w in widths)),
            *(line(row) for row in body),
            "results vary over: " + " ".join(_fmt_axes(a) for a in self.out_vma) + "   types: " + " ".join(self.out_types),
        ]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle) -> None:
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
                in_vma=tuple(aval_varying_axes(v.aval) for v in eqn.invars),
                out_vma=tuple(aval_varying_axes(v.aval) for v in eqn.outvars),
                out_types=tuple(_short(v.aval) for v in eqn.outvars),
            )
        )
        for label, sub in _sub_jaxprs(eqn.params):
            prefix = f"{where}/" if where else ""
            _walk(sub, f"{prefix}{name}.{label}", rows)


def explain_vma(
    f: Callable[..., Any],
    mesh: Mesh,
    in_specs: Any,
    *args: Any,
    out_specs: Any = None,
    check_vma: bool = True,
) -> VmaReport:
    """Trace ``f`` under ``jax.shard_map`` and report the varying axes of every value.

    ``args`` are global arrays (or ``jax.ShapeDtypeStruct``); nothing is computed. With
    ``out_specs=None`` the results are inspected but not returned from ``shard_map``, so
    no output spec has to be guessed; pass ``out_specs`` to also check them as
    ``shard_map`` does. Nested jaxprs (``scan`` bodies, ``cond`` branches, ``pjit``
    calls, custom rules) are walked too; their rows carry a ``where`` path.
    Raises ``ValueError`` naming the axis/spec for specs that do not fit the mesh or args.
    """
    if not callable(f):
        raise TypeError(f"f must be a function, got {type(f).__name__}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh (e.g. runtime.demo_mesh(...)), got {type(mesh).__name__}")
    validate_specs(mesh, in_specs, args, what="in_specs")
    if out_specs is not None:
        is_spec = lambda s: isinstance(s, P) or s is None  # noqa: E731
        for s in jax.tree_util.tree_leaves(out_specs, is_leaf=is_spec):
            validate_spec(mesh, s, what="out_specs")
    seen: dict[str, Any] = {}

    def body(*inner: Any) -> Any:
        seen["args"] = tuple(compat.varying_axes(x) for x in jax.tree_util.tree_leaves(inner))
        out = f(*inner)
        leaves = jax.tree_util.tree_leaves(out)
        seen["out"] = tuple(compat.varying_axes(x) for x in leaves)
        seen["types"] = tuple(_short(jax.typeof(x)) for x in leaves)
        return out if out_specs is not None else ()

    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=in_specs, out_specs=out_specs if out_specs is not None else (), check_vma=check_vma
    )
    closed = jax.make_jaxpr(mapped)(*args)
    inner = [e for e in closed.jaxpr.eqns if e.primitive.name == "shard_map"]
    if len(inner) != 1:  # pragma: no cover - the trace above makes exactly one
        raise RuntimeError(f"expected one shard_map equation, found {len(inner)}")
    rows: list[VmaRow] = []
    _walk(inner[0].params["jaxpr"], "", rows)
    return VmaReport(
        mesh_axes=tuple(mesh.axis_names),
        arg_vma=seen["args"],
        rows=tuple(rows),
        out_vma=seen["out"],
        out_types=seen["types"],
    )


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
    """
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be a function (params, batch) -> scalar, got {type(loss_fn).__name__}")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    if axis not in mesh.axis_names:
        raise ValueError(f"axis {axis!r} is not a mesh axis; the mesh axes are {tuple(mesh.axis_names)}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    collective = lax.pmean if reduction == "mean" else lax.psum

    def per_shard(params: Any, batch: Any) -> tuple[jax.Array, Any]:
        def global_loss(p: Any) -> jax.Array:
            local = loss_fn(p, batch)
            if jnp.ndim(local) != 0:
                raise TypeError(f"loss_fn must return a scalar, got shape {jnp.shape(local)}")
            return collective(local, axis)

        return jax.value_and_grad(global_loss)(params)

    def run(params: Any, batch: Any) -> tuple[jax.Array, Any]:
        leaves = jax.tree_util.tree_leaves(batch)
        if not leaves:
            raise ValueError("batch has no arrays to split")
        for leaf in leaves:
            validate_spec(mesh, P(axis), np.shape(leaf), what=f"batch spec P({axis!r})")
        n = {np.shape(leaf)[0] for leaf in leaves}
        if len(n) != 1:
            raise ValueError(f"every batch leaf must have the same leading size (examples), got {sorted(n)}")
        mapped = jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(axis)), out_specs=(P(), P()))
        return mapped(params, batch)

    return jax.jit(run)


# --------------------------------------------------------------------------------------
# Collecting the errors a chapter meets
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """One failing snippet: what it raised (or that it did not), why, and the fix."""

    name: str
    error: str  # exception class name, or "no error"
    head: str  # first line of the message
    cause: str
    fix: str


class ErrorLog:
    """Re-run failing snippets, catch what they raise and tabulate it.

    ``log.record(name, thunk, cause=..., fix=...)`` calls ``thunk()``; the exception's
    class and the first line of its message are kept (``"no error"`` if it ran).
    """

    def __init__(self) -> None:
        self.records: list[ErrorRecord] = []

    def record(self, name: str, thunk: Callable[[], Any], *, cause: str, fix: str) -> ErrorRecord:
        if not callable(thunk):
            raise TypeError(f"thunk must be a zero-argument function, got {type(thunk).__name__}")
        try:
            out = thunk()
            jax.block_until_ready(out)
            rec = ErrorRecord(name, "no error", f"ran on JAX {jax.__version__}", cause, fix)
        except Exception as e:  # the point is to catch and tabulate
            msg = str(e).strip()
            head = msg.splitlines()[0] if msg else ""
            rec = ErrorRecord(name, type(e).__name__, head, cause, fix)
        self.records.append(rec)
        return rec

    def table(self, width: int = 90) -> str:
        """Markdown-free text table: name, error class, message head, cause, fix."""
        blocks = []
        for k, r in enumerate(self.records, 1):
            head = r.head if len(r.head) <= width else r.head[: width - 1] + "…"
            blocks.append(
                f"{k}. {r.name}\n   raises: {r.error}: {head}\n   cause:  {r.cause}\n   fix:    {r.fix}"
            )
        return "\n".join(blocks)

    def html(self, width: int = 110) -> str:
        """The records as an HTML table (for ``IPython.display.HTML``)."""
        from html import escape

        def cell(text: str, code: bool = False) -> str:
            text = text if len(text) <= width else text[: width - 1] + "…"
            text = escape(text)
            return f"<code>{text}</code>" if code and text else text

        head = "".join(f"<th>{h}</th>" for h in ("#", "snippet", "raises", "message head", "cause", "fix"))
        rows = [
            f"<tr><td>{k}</td><td>{cell(r.name)}</td><td>{cell(r.error, True)}</td>"
            f"<td>{cell(r.head, True)}</td><td>{cell(r.cause)}</td><td>{cell(r.fix)}</td></tr>"
            for k, r in enumerate(self.records, 1)
        ]
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# --------------------------------------------------------------------------------------
# Which device holds which block (the widget's callback)
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Where each block of a global array lives for ``NamedSharding(mesh, spec)``.

    ``blocks[d]`` is the tuple of ``slice`` objects (one per array dimension) of the block
    held by the device at flat mesh position ``d`` (row-major over ``mesh_shape``).
    Inside ``shard_map`` the argument varies over exactly the mesh axes its spec names.
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
            f"{len(self.holders())} distinct block(s) of shape {self.block_shape}, {copies} device(s) each; "
            f"varies over {_fmt_axes(self.varying)}, invariant over {_fmt_axes(self.replicated_over)}"
        )

    def describe(self) -> str:
        """:meth:`summary` prefixed with the mesh, spec and array shape."""
        mesh = dict(zip(self.axis_names, self.mesh_shape))
        return f"mesh {mesh}, spec {spec_str(self.spec)}, array {self.array_shape}: {self.summary()}"


def block_layout(
    mesh_shape: Sequence[int],
    spec: Any,
    array_shape: Sequence[int],
    axis_names: Sequence[str] = ("x", "y"),
) -> BlockLayout:
    """Compute, without devices, which block of the array each mesh position holds.

    Dimension ``k`` split over mesh axes ``(a, b, ...)`` is cut into
    ``n = size(a) * size(b) * ...`` equal blocks; a device at mesh coordinates ``c``
    holds block ``((c_a * size(b) + c_b) * ...)`` (major to minor in the order listed).
    Axes not named by the spec do not split anything: devices along them hold copies.
    """
    mesh_shape = tuple(int(s) for s in mesh_shape)
    axis_names = tuple(axis_names)
    if len(mesh_shape) != len(axis_names):
        raise ValueError(f"mesh_shape {mesh_shape} has {len(mesh_shape)} axes but axis_names {axis_names} has {len(axis_names)}")
    if any(s < 1 for s in mesh_shape):
        raise ValueError(f"mesh_shape entries must be >= 1, got {mesh_shape}")
    sizes = dict(zip(axis_names, mesh_shape))
    array_shape = tuple(int(s) for s in array_shape)
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
    return BlockLayout(mesh_shape, axis_names, spec, array_shape, tuple(blocks), varying)


def plot_layout(layout: BlockLayout, ax: Any = None) -> Any:
    """Draw a 2-D array's blocks, coloured by block, labelled with the devices holding them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if len(layout.array_shape) != 2:
        raise ValueError(f"plot_layout draws 2-D arrays, got shape {layout.array_shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    rows, cols = layout.array_shape
    cmap = plt.get_cmap("tab20")
    for k, (blk, devs) in enumerate(sorted(layout.holders().items())):
        (r0, r1), (c0, c1) = blk
        ax.add_patch(Rectangle((c0, r0), c1 - c0, r1 - r0, facecolor=cmap(k % 20), edgecolor="black", lw=1.2))
        label = ",".join(str(d) for d in devs)
        if len(devs) > 4:
            label = f"{devs[0]}..{devs[-1]}\n({len(devs)} copies)"
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    mesh = "x".join(str(s) for s in layout.mesh_shape)
    ax.set_title(f"mesh {mesh}, {spec_str(layout.spec)}\nvaries over {_fmt_axes(layout.varying)}", fontsize=8)
    return ax


def spec_str(spec: P) -> str:
    """``P('x', None)`` on every JAX version (older ones print ``PartitionSpec(...)``)."""
    return "P(" + ", ".join(repr(e) for e in spec) + ")"


def _parse_entry(entry: str | None) -> Any:
    if entry in (None, "None", ""):
        return None
    parts = tuple(p.strip() for p in str(entry).split("+"))
    return parts[0] if len(parts) == 1 else parts


def layout_figure(mesh_shape: Sequence[int] | str = (2, 4), dim0: str | None = "x", dim1: str | None = "y",
                  array_shape: Sequence[int] = (8, 8)) -> Any:
    """The widget callback: mesh shape and a spec ``P(dim0, dim1)`` -> figure of the layout.

    ``mesh_shape`` is a tuple or a string like ``"2x4"`` (axes ``x`` and ``y``); ``dim0``/
    ``dim1`` are ``None``, an axis name, or ``"x+y"`` for a dimension split over both.
    Returns the matplotlib figure (its axes title states the varying axes).
    """
    import matplotlib.pyplot as plt

    if isinstance(mesh_shape, str):
        try:
            mesh_shape = tuple(int(s) for s in mesh_shape.lower().split("x"))
        except ValueError:
            raise ValueError(f"mesh_shape must look like '2x4', got {mesh_shape!r}") from None
    layout = block_layout(mesh_shape, P(_parse_entry(dim0), _parse_entry(dim1)), array_shape)
    fig, ax = plt.subplots(figsize=(3.4, 3.4))
    plot_layout(layout, ax)
    fig.text(0.5, 0.01, f"{len(layout.holders())} distinct block(s), each on {len(layout.blocks) // len(layout.holders())} device(s)",
             ha="center", fontsize=8)
    plt.close(fig)  # returned for display; keep pyplot from showing it a second time
    return fig


def layout_small_multiples(
    cases: Sequence[tuple[Sequence[int], Any]], array_shape: Sequence[int] = (8, 8)
) -> Any:
    """Static fallback for the widget: one panel per ``(mesh_shape, spec)`` case."""
    import matplotlib.pyplot as plt

    if not cases:
        raise ValueError("layout_small_multiples needs at least one (mesh_shape, spec) case")
    n = len(cases)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 3.1 * rows), squeeze=False)
    for ax, (shape, spec) in zip(axes.flat, cases):
        plot_layout(block_layout(shape, spec, array_shape), ax)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    plt.close(fig)  # returned for display; keep pyplot from showing it a second time
    return fig


# --------------------------------------------------------------------------------------
# Exercises
# --------------------------------------------------------------------------------------


def _exercise_mesh(n: int = 8) -> Mesh:
    from beyondgrad import runtime

    return runtime.demo_mesh((n // 2, 2), ("x", "y"))


def _vma_expressions() -> dict[str, tuple[Callable[..., Any], tuple[P, ...]]]:
    """The five expressions of the prediction exercise on a 4x2 ('x', 'y') mesh.

    a: f32[8] with P('x'), b: f32[4] with P('y'), w: f32[2] with P(); each shard is f32[2].
    """
    specs = (P("x"), P("y"), P())
    return {
        "a * w": (lambda a, b, w: a * w, specs),
        "a + b": (lambda a, b, w: a + b, specs),
        "psum(a * b, 'x')": (lambda a, b, w: lax.psum(a * b, "x"), specs),
        "all_gather(a, 'x') + w": (lambda a, b, w: lax.all_gather(a, "x") + w, specs),
        "pmean(a + b, ('x', 'y'))": (lambda a, b, w: lax.pmean(a + b, ("x", "y")), specs),
    }


#: The expressions of the prediction exercise, in order (a: P('x'), b: P('y'), w: P()).
VMA_EXPRESSIONS: tuple[str, ...] = tuple(_vma_expressions())


def expected_vma(mesh: Mesh | None = None) -> dict[str, frozenset[str]]:
    """The varying axes of each exercise expression, read off :func:`explain_vma`."""
    mesh = _exercise_mesh() if mesh is None else mesh
    args = (jnp.ones(8), jnp.ones(4), jnp.ones(2))  # every shard has shape (2,) on a 4x2 mesh
    return {name: explain_vma(fn, mesh, specs, *args).out_vma[0] for name, (fn, specs) in _vma_expressions().items()}


def check_predict_vma(answers: Any, *, strict: bool = False) -> exercises.Feedback:
    """Compare predicted varying axes (``{expression: set of axes}``, or a function
    returning that dict) with what :func:`explain_vma` reports for each expression."""
    name = "predict the varying axes"
    if callable(answers):
        answers = exercises.call_answer(answers, what="your predictions")
    msg = exercises.failed(answers)
    if msg:
        return exercises.verdict(name, [msg], strict=strict)
    if answers is ... or answers is None:
        return exercises.verdict(name, ["still the stub: fill in a set of axes for every expression"], strict=strict)
    if not isinstance(answers, Mapping):
        return exercises.verdict(name, [f"answers must be a dict {{expression: set of axes}}, got {type(answers).__name__}"], strict=strict)
    want = expected_vma()
    problems = []
    for expr, axes in want.items():
        if expr not in answers or answers[expr] is ...:
            problems.append(f"no prediction for {expr!r}")
            continue
        got = answers[expr]
        got = frozenset((got,) if isinstance(got, str) else (got or ()))
        if got != axes:
            problems.append(f"{expr}: you predicted {_fmt_axes(got)}, the explainer says {_fmt_axes(axes)}")
    extra = sorted(set(answers) - set(want))
    if extra:
        problems.append(f"unknown expression(s) {extra}; the five are {list(want)}")
    return exercises.verdict(name, problems, success="all five match the explainer", strict=strict)


def linear_problem(n: int = 16, d: int = 3, seed: int = 0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """A small least-squares problem: ``w`` (d,), ``X`` (n, d), ``y = X (1..d) + noise`` (n,)."""
    key_w, key_x, key_n = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = jax.random.normal(key_w, (d,))
    X = jax.random.normal(key_x, (n, d))
    y = X @ jnp.arange(1.0, d + 1.0) + 0.1 * jax.random.normal(key_n, (n,))
    return w, X, y


def mse_loss(w: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error ``mean_n (X_n . w - y_n)^2`` (the exercises' loss)."""
    return jnp.mean((X @ w - y) ** 2)


def check_fix_training_step(step: Callable[[Any, Any, Any], Any], *, lr: float = 0.1, strict: bool = False) -> exercises.Feedback:
    """``step(w, X, y)`` runs inside ``shard_map`` (w: P(), X and y: P('data')) and must return
    ``w - lr * grad(mse_loss)(w, X_all, y_all)``, the single-device SGD step, on 1, 2, 4 and 8 devices."""
    from beyondgrad import runtime

    name = "fix the training step"
    w, X, y = linear_problem()
    with jax.default_matmul_precision("highest"):
        want = w - lr * jax.grad(mse_loss)(w, X, y)
        problems: list[str] = []
        for n in (1, 2, 4, 8):
            mesh = runtime.demo_mesh(n, "data")
            mapped = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())
            got = exercises.call_answer(mapped, w, X, y, what="your step")
            msg = exercises.failed(got)
            if msg:
                problems.append(f"on {n} device(s): {msg}")
                break
            bad = exercises.tree_mismatches(got, want, rtol=1e-4, atol=1e-5, name="new w")
            if bad:
                ratio = float(jnp.linalg.norm(w - jnp.asarray(got)) / jnp.linalg.norm(w - want))
                problems.append(f"on {n} device(s): the update is {ratio:.3g} x the single-device update ({bad[0]})")
    return exercises.verdict(name, problems, success="same update as one device on 1, 2, 4 and 8 devices", strict=strict)


def check_fix_loop_carry(running_total: Callable[[jax.Array], jax.Array], *, strict: bool = False) -> exercises.Feedback:
    """``running_total(x)`` runs inside ``shard_map`` (x: P('data'), out P('data')) and must
    return ``sum_{k<3} (k + 1) * x = 6 x`` computed with a loop whose carry is varying."""
    from beyondgrad import runtime

    name = "fix the loop carry"
    mesh = runtime.demo_mesh(8, "data")
    x = jnp.arange(16.0)
    mapped = jax.shard_map(running_total, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
    got = exercises.call_answer(mapped, x, what="your running_total")
    return exercises.check_allclose(name, got, 6.0 * x, success="the loop runs and gives 6 x on 8 devices", strict=strict)
