"""Chapter 4's figures and tables: block layouts (and the widget's callback), the error table.

Nothing here is needed to *use* shard_map; the reusable pieces (``block_layout``,
``explain_vma``) are in :mod:`beyondgrad.sharding`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from beyondgrad import _checks
from beyondgrad.sharding import BlockLayout, block_layout, spec_str

__all__ = [
    "ErrorLog",
    "ErrorRecord",
    "layout_figure",
    "layout_small_multiples",
    "plot_layout",
]


def _fmt_axes(axes: frozenset[str]) -> str:
    return "{" + ",".join(sorted(axes)) + "}"


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

    def record(
        self, name: str, thunk: Callable[[], Any], *, cause: str, fix: str
    ) -> ErrorRecord:
        """Call ``thunk()`` and keep what it raised (or ``"no error"``) as a row."""
        _checks.function(thunk, "thunk", "a zero-argument function")
        try:
            out = thunk()
            jax.block_until_ready(out)
            rec = ErrorRecord(
                name, "no error", f"ran on JAX {jax.__version__}", cause, fix
            )
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

        head = "".join(
            f"<th>{h}</th>"
            for h in ("#", "snippet", "raises", "message head", "cause", "fix")
        )
        rows = [
            f"<tr><td>{k}</td><td>{cell(r.name)}</td><td>{cell(r.error, True)}</td>"
            f"<td>{cell(r.head, True)}</td><td>{cell(r.cause)}</td><td>{cell(r.fix)}</td></tr>"
            for k, r in enumerate(self.records, 1)
        ]
        return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


# --------------------------------------------------------------------------------------
# Which device holds which block (figures and the widget's callback)
# --------------------------------------------------------------------------------------


def plot_layout(layout: BlockLayout, ax: Any = None) -> Any:
    """Draw a 2-D array's blocks, coloured by block, labelled with the devices holding them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if len(layout.array_shape) != 2:
        raise ValueError(
            f"plot_layout draws 2-D arrays, got shape {layout.array_shape}"
        )
    if ax is None:
        _, ax = plt.subplots(figsize=(3.2, 3.2))
    rows, cols = layout.array_shape
    cmap = plt.get_cmap("tab20")
    for k, (blk, devs) in enumerate(sorted(layout.holders().items())):
        (r0, r1), (c0, c1) = blk
        ax.add_patch(
            Rectangle(
                (c0, r0),
                c1 - c0,
                r1 - r0,
                facecolor=cmap(k % 20),
                edgecolor="black",
                lw=1.2,
            )
        )
        label = ",".join(str(d) for d in devs)
        if len(devs) > 4:
            label = f"{devs[0]}..{devs[-1]}\n({len(devs)} copies)"
        ax.text(
            (c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center", fontsize=7
        )
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    mesh = "x".join(str(s) for s in layout.mesh_shape)
    title = (
        f"mesh {mesh}, {spec_str(layout.spec)}\nvaries over {_fmt_axes(layout.varying)}"
    )
    ax.set_title(title, fontsize=8)
    return ax


def _parse_entry(entry: str | None) -> str | tuple[str, ...] | None:
    if entry in (None, "None", ""):
        return None
    parts = tuple(p.strip() for p in str(entry).split("+"))
    return parts[0] if len(parts) == 1 else parts


def layout_figure(
    mesh_shape: Sequence[int] | str = (2, 4),
    dim0: str | None = "data",
    dim1: str | None = "model",
    array_shape: Sequence[int] = (8, 8),
) -> Any:
    """The widget callback: mesh shape and a spec ``P(dim0, dim1)`` -> figure of the layout.

    ``mesh_shape`` is a tuple or a string like ``"2x4"`` (axes ``data`` and ``model``);
    ``dim0``/``dim1`` are ``None``, an axis name, or ``"data+model"`` for a dimension
    split over both. Returns the matplotlib figure (its title states the varying axes).
    """
    import matplotlib.pyplot as plt

    if isinstance(mesh_shape, str):
        try:
            mesh_shape = tuple(int(s) for s in mesh_shape.lower().split("x"))
        except ValueError:
            raise ValueError(
                f"mesh_shape must look like '2x4', got {mesh_shape!r}"
            ) from None
    layout = block_layout(
        mesh_shape, P(_parse_entry(dim0), _parse_entry(dim1)), array_shape
    )
    fig, ax = plt.subplots(figsize=(3.4, 3.4))
    plot_layout(layout, ax)
    copies = len(layout.blocks) // len(layout.holders())
    fig.text(
        0.5,
        0.01,
        f"{len(layout.holders())} distinct block(s), each on {copies} device(s)",
        ha="center",
        fontsize=8,
    )
    plt.close(fig)  # returned for display; keep pyplot from showing it a second time
    return fig


def layout_small_multiples(
    cases: Sequence[tuple[Sequence[int], Any]], array_shape: Sequence[int] = (8, 8)
) -> Any:
    """Static fallback for the widget: one panel per ``(mesh_shape, spec)`` case."""
    import matplotlib.pyplot as plt

    if not cases:
        raise ValueError(
            "layout_small_multiples needs at least one (mesh_shape, spec) case"
        )
    n = len(cases)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.0 * cols, 3.1 * rows), squeeze=False
    )
    for ax, (shape, spec) in zip(axes.flat, cases):
        plot_layout(block_layout(shape, spec, array_shape), ax)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    plt.close(fig)  # returned for display; keep pyplot from showing it a second time
    return fig
