"""Chapter 5's figures and widget callbacks.

* Hutchinson's trade-off (the widget *probes against electrons*): what ``S`` probes cost
  and how noisy the estimate is. Cost is counted in Hessian-vector products (one per
  probe; the exact loop needs :math:`d = 3n`), never in wall-clock time, so the widget
  gives the same answer on every machine.
* The Laplacian benchmark's recorded results (``laplacian_benchmark.json``, package
  data written by ``benchmarks/laplacian.py --record``): loaded with
  :mod:`importlib.resources` (so Colab reads it too) and plotted as time per method
  divided by the time of one evaluation of log|ψ|, against the number of electrons.
* Particle sparsity (:func:`dependence_patterns`, :func:`plot_dependence`): which
  electrons each intermediate of one equivariant layer of the FermiNet-like model can
  depend on, read from the forward Laplacian's own jets (their particle terms' owner
  arrays) while it traces the model, beside what a dense ``(3n, ...)`` Jacobian stores.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # matplotlib is imported only when a plot is drawn
    from matplotlib.axes import Axes

__all__ = [
    "BENCHMARK_FIELDS",
    "BENCHMARK_RESOURCE",
    "DENSE_STORED",
    "DEPENDENCE_PANELS",
    "DEPENDENCE_TITLES",
    "LAYER_PAIR_WIDTH",
    "LAYER_WIDTH",
    "SPARSE_STORED",
    "ZERO_IN_DENSE",
    "ROW_FIELDS",
    "MARKERS",
    "benchmark_series",
    "benchmark_targets",
    "describe_benchmark",
    "dependence_patterns",
    "describe_tradeoff",
    "float32_accuracy",
    "hutchinson_tradeoff",
    "load_benchmark",
    "plot_benchmark",
    "plot_dependence",
    "plot_tradeoff",
    "series_styles",
    "time_split",
]

#: The recorded benchmark, a file of this package.
BENCHMARK_RESOURCE = "laplacian_benchmark.json"
#: Top-level keys of the benchmark record.
BENCHMARK_FIELDS = ("command", "machine", "jax", "folx", "date", "rows")
#: Keys of each row of the benchmark record.
ROW_FIELDS = (
    "family",
    "n",
    "method",
    "min_ms",
    "median_ms",
    "ratio_log_psi",
    "ratio_folx_best",
    "temp_bytes",
    "rel_err",
)

#: Markers of the benchmark plot's series; with the 10 colours of matplotlib's default
#: cycle, (colour, marker) repeats only after lcm(10, 12) = 60 series.
MARKERS = "os^vD<>ph*XP"

Profile = Mapping[int, Mapping[str, float]]


# ---------------------------------------------------------------------------------------
# Hutchinson's trade-off


def _positive_int(value: object, name: str) -> int:
    from beyondgrad import _checks

    return _checks.integer(value, name, minimum=1)


def hutchinson_tradeoff(profile: Profile, n: int, num_samples: int) -> dict[str, float]:
    r"""Cost and statistical error of an ``num_samples``-probe Hutchinson Laplacian.

    ``profile[n]`` holds two measured numbers for ``n`` electrons:
    ``"sample_variance"`` (the variance :math:`\sigma^2` of one probe's estimate
    :math:`v^\top H v`) and ``"laplacian"`` (the exact value :math:`\Delta`). With
    :math:`S` probes the estimate's standard error is :math:`\sigma/\sqrt S`; its cost
    is :math:`S` Hessian-vector products against :math:`3n` for the exact loop.

    Returns ``{"hvps", "exact_hvps", "cost_vs_exact", "std_error",
    "relative_error"}`` (the last is the standard error over :math:`|\Delta|`).
    """
    if not isinstance(profile, Mapping):
        raise TypeError(
            f"profile must be a dict {{n: measurements}}, got {type(profile).__name__}"
        )
    _positive_int(n, "n")
    _positive_int(num_samples, "num_samples")
    if n not in profile:
        raise ValueError(
            f"no measurements for n = {n}; measured sizes are {sorted(profile)}"
        )
    entry = profile[n]
    missing = [k for k in ("sample_variance", "laplacian") if k not in entry]
    if missing:
        raise ValueError(
            f"profile[{n}] lacks {missing}: give 'sample_variance' and 'laplacian'"
        )
    variance, exact = float(entry["sample_variance"]), float(entry["laplacian"])
    if not (math.isfinite(variance) and variance >= 0):
        raise ValueError(
            f"profile[{n}]['sample_variance'] must be finite and >= 0, got {variance}"
        )
    if not math.isfinite(exact):
        raise ValueError(f"profile[{n}]['laplacian'] must be finite, got {exact}")
    std_error = math.sqrt(variance / num_samples)
    return {
        "hvps": float(num_samples),
        "exact_hvps": float(3 * n),
        "cost_vs_exact": num_samples / (3 * n),
        "std_error": std_error,
        "relative_error": std_error / abs(exact) if exact else math.inf,
    }


def describe_tradeoff(profile: Profile, n: int, num_samples: int) -> str:
    """One line for the widget: what ``num_samples`` probes cost and how noisy they are."""
    t = hutchinson_tradeoff(profile, n, num_samples)
    return (
        f"n = {n} electrons: S = {num_samples} probes cost {num_samples} Hessian-vector "
        f"products = {t['cost_vs_exact']:.2f} x the exact loop ({3 * n}); std. error "
        f"{t['std_error']:.3g} ({100 * t['relative_error']:.1f}% of |Laplacian|)"
    )


def plot_tradeoff(
    profile: Profile, sample_counts: Sequence[int], axes: Sequence[Axes] | None = None
) -> Sequence[Axes]:
    """One panel per ``n``: relative standard error (left axis) and cost / exact (right)."""
    import matplotlib.pyplot as plt

    counts = [_positive_int(s, "each sample count") for s in sample_counts]
    if not counts:
        raise ValueError("sample_counts is empty: give probe counts such as [1, 4, 16]")
    sizes = sorted(profile)
    if axes is None:
        _, grid = plt.subplots(
            1, len(sizes), figsize=(3.2 * len(sizes), 2.8), sharey=True, squeeze=False
        )
        axes = list(grid[0])
    if len(axes) != len(sizes):
        raise ValueError(f"need {len(sizes)} axes (one per n), got {len(axes)}")
    for ax, n in zip(axes, sizes):
        rows = [hutchinson_tradeoff(profile, n, s) for s in counts]
        ax.loglog(counts, [r["relative_error"] for r in rows], "o-", color="C0")
        ax.set_title(f"n = {n} (d = {3 * n})")
        ax.set_xlabel("probes S")
        twin = ax.twinx()
        twin.loglog(counts, [r["cost_vs_exact"] for r in rows], "s--", color="C1")
        twin.axhline(1.0, color="C1", lw=0.8, ls=":")
        if n == sizes[-1]:
            twin.set_ylabel("cost / exact loop", color="C1")
    axes[0].set_ylabel("relative std. error", color="C0")
    return axes


# ---------------------------------------------------------------------------------------
# The benchmark's recorded results


def _check_record(data: object, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in BENCHMARK_FIELDS if k not in data]
    if missing:
        raise ValueError(
            f"{where} lacks {missing}: re-record it with benchmarks/laplacian.py --record"
        )
    rows = data["rows"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: 'rows' must be a non-empty list of measurements")
    for k, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(
                f"{where}: rows[{k}] must be an object, got {type(row).__name__}"
            )
        lacking = [f for f in ROW_FIELDS if f not in row]
        if lacking:
            raise ValueError(f"{where}: rows[{k}] lacks {lacking}")
        if isinstance(row["n"], bool) or not isinstance(row["n"], int) or row["n"] < 1:
            raise ValueError(
                f"{where}: rows[{k}]['n'] must be a positive int, got {row['n']!r}"
            )
    return data


def load_benchmark(path: str | Path | None = None) -> dict[str, Any]:
    """The recorded Laplacian benchmark (the package's ``laplacian_benchmark.json``).

    ``path`` reads another file with the same schema instead. Raises ``ValueError``
    if a key of :data:`BENCHMARK_FIELDS` or of :data:`ROW_FIELDS` is missing.
    """
    if path is None:
        resource = importlib.resources.files("beyondgrad.figures") / BENCHMARK_RESOURCE
        if not resource.is_file():
            raise FileNotFoundError(
                f"beyondgrad/figures/{BENCHMARK_RESOURCE} is missing: run "
                "`python benchmarks/laplacian.py --record` to write it"
            )
        text, where = resource.read_text(encoding="utf-8"), BENCHMARK_RESOURCE
    else:
        if not isinstance(path, (str, Path)):
            raise TypeError(
                f"path must be a str or pathlib.Path, got {type(path).__name__}"
            )
        text, where = Path(path).read_text(encoding="utf-8"), str(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON: {e}") from None
    return _check_record(data, where)


def benchmark_series(
    data: Mapping[str, Any], family: str, value: str = "ratio_log_psi"
) -> dict[str, tuple[list[int], list[float]]]:
    """``{method: (sizes n, values)}`` for one orbital ``family``, sorted by ``n``.

    ``value`` is a row field (default: time divided by one evaluation of log|ψ|).
    Rows whose value is ``None`` (a method that does not apply) are left out.
    """
    rows = _check_record(dict(data), "data")["rows"]
    if value not in ROW_FIELDS:
        raise ValueError(f"value must be one of {ROW_FIELDS}, got {value!r}")
    families = sorted({r["family"] for r in rows})
    if family not in families:
        raise ValueError(
            f"no rows for family {family!r}; recorded families are {families}"
        )
    series: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(rows, key=lambda r: (r["method"], r["n"])):
        if row["family"] != family or row[value] is None:
            continue
        ns, values = series.setdefault(row["method"], ([], []))
        ns.append(int(row["n"]))
        values.append(float(row[value]))
    return series


def describe_benchmark(data: Mapping[str, Any]) -> str:
    """Where the recorded numbers come from: the benchmark's options (the record's
    ``command`` without its script and ``--record``: the script is in the book's
    repository, not in a notebook's runtime), machine, versions and date.

    Optional keys of the record (``batch``, ``repeats``, ``dtype``, ``duration_s``,
    ``note``) are appended when present.
    """
    d = _check_record(dict(data), "data")
    words = str(d["command"]).split()
    options = [w for w in words[2:] if w != "--record"]  # after python <script>
    how = f"options {' '.join(options)}" if options else "its default options"
    text = (
        f"benchmarks/laplacian.py of the book's repository ({how}) on "
        f"{d['machine']}, JAX {d['jax']}, folx {d['folx']}, recorded {d['date']}"
    )
    setup = [
        f"{d[key]} {label}"
        for key, label in (
            ("batch", "walkers a batch"),
            ("repeats", "repeats"),
            ("dtype", ""),
        )
        if d.get(key) is not None
    ]
    if setup:
        text += "; " + ", ".join(s.strip() for s in setup)
    if d.get("duration_s") is not None:
        text += f"; the whole run took {d['duration_s'] / 60:.1f} min"
    if d.get("note"):
        text += f"\nnote recorded with the results: {d['note']}"
    return text


def _is_exact(method: str) -> bool:
    """Methods that compute the Laplacian exactly (not log|ψ| itself, not Hutchinson)."""
    return method != "log|psi|" and not method.startswith("hutchinson")


def float32_accuracy(data: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Per orbital family at ``n`` electrons: what bounds float32 accuracy, and the errors.

    Reads the record's ``problems`` (written by ``benchmarks/laplacian.py``): the median
    condition number of the Slater matrices and the *float32 floor* (the error left when
    only the orbital values and derivatives are rounded to float32), and the relative
    errors of the exact methods' rows. Returns one dict per family with ``family``,
    ``cond_median``, ``floor``, ``least`` and ``most`` (the smallest and largest error
    of an exact method).
    """
    d = _check_record(dict(data), "data")
    problems = [p for p in d.get("problems", []) if p["n"] == n]
    if not problems:
        raise ValueError(
            f"the record has no float32 bounds ('problems') at n = {n}: re-record it "
            "with benchmarks/laplacian.py --record"
        )
    table = []
    for p in problems:
        errs = [
            r["rel_err"]
            for r in d["rows"]
            if r["family"] == p["family"] and r["n"] == n and _is_exact(r["method"])
        ]
        if not errs:
            raise ValueError(f"no exact method's row for {p['family']!r} at n = {n}")
        table.append(
            {
                "family": p["family"],
                "cond_median": p["cond_median"],
                "floor": p["float32_floor"],
                "least": min(errs),
                "most": max(errs),
            }
        )
    return table


def series_styles(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``{name: (colour, marker)}``, a different pair for each of up to 60 names.

    Colours cycle through matplotlib's ten (``C0``-``C9``) and markers through the
    twelve of :data:`MARKERS`, so the k-th name gets ``(C{k % 10}, MARKERS[k % 12])``.
    """
    names = list(names)
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {names}")
    limit = math.lcm(10, len(MARKERS))
    if len(names) > limit:
        raise ValueError(
            f"at most {limit} series get distinct (colour, marker) pairs, got "
            f"{len(names)}: split the plot"
        )
    return {
        name: (f"C{k % 10}", MARKERS[k % len(MARKERS)]) for k, name in enumerate(names)
    }


def benchmark_targets(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The recorded targets of ``benchmarks/laplacian.py`` (issue 26 item 5) and
    whether the recorded run met them.

    One dict per family and size with ``family``, ``n`` and, per target name of the
    record's ``targets`` (each an upper bound), ``values[name]`` (the measured value, or
    ``None`` where the record has none, e.g. growth at the smaller size) and
    ``met[name]`` (``True``/``False``, or ``None`` with the value). Read from the
    record's ``target_checks``; nothing is re-measured.
    """
    d = _check_record(dict(data), "data")
    if "targets" not in d or "target_checks" not in d:
        raise ValueError(
            "the record has no 'targets'/'target_checks': re-record it with "
            "benchmarks/laplacian.py --record"
        )
    limits = dict(d["targets"])
    table = []
    for check in d["target_checks"]:
        values = {name: check.get(name) for name in limits}
        met = {
            name: None if v is None else bool(v <= limits[name])
            for name, v in values.items()
        }
        recorded = check.get("pass", {})
        wrong = [k for k, ok in recorded.items() if k in met and met[k] != ok]
        if wrong:
            raise ValueError(
                f"{check['family']} n={check['n']}: the recorded verdicts {wrong} do "
                "not follow from the recorded values and targets: re-record it"
            )
        table.append(
            {"family": check["family"], "n": check["n"], "values": values, "met": met}
        )
    return table


def time_split(data: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """Where ``slater_laplacian``'s time goes at ``n`` electrons, per family.

    Each dict has ``family``, ``method_ms`` (the method's recorded minimum time) and
    ``parts_ms`` (``{part: minimum time}`` of the parts timed alone in the same run:
    the orbitals' value and derivatives, the LU and inverse, the row sums).
    """
    d = _check_record(dict(data), "data")
    parts = [p for p in d.get("parts", []) if p["n"] == n]
    if not parts:
        raise ValueError(
            f"the record has no parts timed alone at n = {n}; recorded sizes: "
            f"{sorted({p['n'] for p in d.get('parts', [])})}"
        )
    split = []
    for family in dict.fromkeys(p["family"] for p in parts):
        row = [
            r
            for r in d["rows"]
            if (r["family"], r["n"], r["method"]) == (family, n, "slater_laplacian")
        ]
        if not row:
            raise ValueError(f"no slater_laplacian row for {family!r} at n = {n}")
        split.append(
            {
                "family": family,
                "method_ms": row[0]["min_ms"],
                "parts_ms": {
                    p["part"]: p["min_ms"] for p in parts if p["family"] == family
                },
            }
        )
    return split


def plot_benchmark(
    data: Mapping[str, Any], axes: Sequence[Axes] | None = None
) -> Sequence[Axes]:
    """One panel per orbital family: time / one log|ψ| against ``n``, one line per method."""
    import matplotlib.pyplot as plt

    rows = _check_record(dict(data), "data")["rows"]
    families = sorted({r["family"] for r in rows})
    if axes is None:
        _, grid = plt.subplots(
            1,
            len(families),
            figsize=(3.3 * len(families), 3.2),
            sharey=True,
            squeeze=False,
        )
        axes = list(grid[0])
    if len(axes) != len(families):
        raise ValueError(f"need {len(families)} axes (one per family), got {len(axes)}")
    styles = series_styles(sorted({r["method"] for r in rows}))
    for ax, family in zip(axes, families):
        series = benchmark_series(data, family)
        for method, (ns, ratios) in series.items():
            color, marker = styles[method]
            ax.loglog(ns, ratios, marker=marker, color=color, label=method)
        sizes = sorted({n for ns, _ in series.values() for n in ns})
        ax.minorticks_off()
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.set_title(family, fontsize=9)
        ax.set_xlabel("electrons n")
    axes[0].set_ylabel("time / one log|ψ|")
    # Every method once, also those missing from the last panel.
    handles: dict[str, Any] = {}
    for ax in axes:
        for line in ax.get_lines():
            handles.setdefault(str(line.get_label()), line)
    labels = sorted(handles)
    axes[-1].legend(
        [handles[k] for k in labels],
        labels,
        fontsize=7,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
    )
    return axes


# ---------------------------------------------------------------------------------------
# Particle sparsity: the dependence pattern through one equivariant layer

#: The intermediates of :func:`dependence_patterns`, in the order of the layer.
DEPENDENCE_PANELS = ("r", "h_pair", "pooled", "h_one")
#: One-electron stream width of the FermiNet-like layer the figure traces
#: (``beyondgrad.all_electron``).
LAYER_WIDTH = 16
#: Pair stream width of that layer.
LAYER_PAIR_WIDTH = 8
#: Value of a cell of :func:`dependence_patterns`' ``image``: a zero that only a
#: dense ``(3n, ...)`` Jacobian stores.
ZERO_IN_DENSE = 0
#: Value of a cell whose derivative a particle term stores.
SPARSE_STORED = 1
#: Value of a cell whose derivative a dense Jacobian stores.
DENSE_STORED = 2


def _recorded_layer(n: int, particles: bool) -> list[tuple[str, tuple[int, ...], Any]]:
    """``(primitive name, result shape, first result)`` of every equation the forward
    Laplacian's interpreter runs on the FermiNet-like model with one layer, as its
    rules return them (a ``SparseJet`` with owner arrays, a dense ``Jet`` or a plain
    array). Parameters and input are shapes only: the program is traced
    (``jax.make_jaxpr``), never run or compiled."""
    import dataclasses

    import jax

    from beyondgrad import all_electron
    from beyondgrad import forward_laplacian as fl

    seen: list[tuple[str, tuple[int, ...], Any]] = []

    def note(eqn: Any, outs: Any) -> Any:
        if outs is not None:
            seen.append((eqn.primitive.name, tuple(eqn.outvars[0].aval.shape), outs[0]))
        return outs

    def recording(rule: fl.Rule) -> fl.Rule:
        sparse = rule.sparse
        return dataclasses.replace(
            rule,
            apply=lambda eqn, ins: note(eqn, rule(eqn, ins)),
            sparse=None
            if sparse is None
            else lambda eqn, ins: note(eqn, sparse(eqn, ins)),
        )

    init = functools.partial(
        all_electron.init_ferminet,
        n_electrons=n,
        width=LAYER_WIDTH,
        pair_width=LAYER_PAIR_WIDTH,
        layers=1,
        determinants=1,
    )
    params = jax.eval_shape(init, jax.random.key(0))  # shapes only: nothing runs

    def laplacian(p: Any, r: jax.Array) -> Any:
        fn = lambda v: all_electron.ferminet_log_psi(p, v.reshape(n, 3))  # noqa: E731
        return fl.forward_jet(fn, r, particles=n if particles else None).lap

    r = jax.ShapeDtypeStruct((3 * n,), jax.numpy.float32)
    with fl.rules_overridden({p: recording(rule) for p, rule in fl.RULES.items()}):
        jax.make_jaxpr(laplacian)(params, r)
    return seen


def _pick(
    seen: Sequence[tuple[str, tuple[int, ...], Any]],
    primitive: str,
    shape: tuple[int, ...],
) -> Any:
    found = [out for name, s, out in seen if (name, s) == (primitive, shape)]
    if not found:
        raise RuntimeError(
            f"the traced layer has no {primitive} of shape {shape}: has "
            "beyondgrad.all_electron.ferminet_log_psi changed? Update _pick's choices"
        )
    return found[0]


def dependence_patterns(
    n_electrons: int = 6, *, particles: bool = True
) -> list[dict[str, Any]]:
    r"""Which electrons each intermediate of one equivariant layer can depend on, as
    the forward Laplacian's jets store it (read from the engine, not derived by hand).

    The FermiNet-like model of :mod:`beyondgrad.all_electron` with one layer
    (widths :data:`LAYER_WIDTH`, :data:`LAYER_PAIR_WIDTH`) is traced through
    :func:`beyondgrad.forward_laplacian.forward_jet` with ``particles=n`` (or dense,
    ``particles=False``), every rule wrapped to record what it returns. Four
    intermediates (:data:`DEPENDENCE_PANELS`): the positions ``r`` ``(n, 3)``; the
    pair stream after the layer, :math:`h_{ij} = \tanh(h^0_{ij} V + c)`,
    ``(n, n, pair width)``; the pooled means of the one-electron stream over each
    spin, broadcast to every electron, ``(n, 8)``; and the one-electron stream after
    the layer, ``(n, width)``.

    Each intermediate's elements are grouped into rows by their electron axes (``i``,
    or the pair ``(i, j)``, the feature axis folded in), and ``pattern[row, p]`` is
    True where the jet stores a derivative with respect to electron ``p``'s
    coordinates: the owners of its particle terms, or every electron for a dense
    Jacobian. (A stored derivative may still be zero: on the diagonal ``i = j`` of
    the pair stream both terms name electron ``i``, though :math:`h_{ii}` is built
    from :math:`r_i - r_i = 0` and is constant.)

    Args:
        n_electrons: ``n >= 2`` (``n // 2`` spin up).
        particles: True: the particle-sparse jets (``particles=n``); False: the dense
            engine, every Jacobian ``(3n, ...)``.

    Returns:
        One dict per intermediate: ``name``, ``shape`` (of the value), ``rows`` (row
        labels), ``pattern`` (bool ``(rows, n)``), ``sparse`` (True for particle
        terms), ``terms`` (their number, 0 for dense), ``stored`` (numbers the jet
        stores: terms × 3 × size, or 3n × size), ``dense`` (3n × size) and ``image``
        (``int`` ``(rows, n)``: :data:`SPARSE_STORED` or :data:`DENSE_STORED` where
        ``pattern`` holds, :data:`ZERO_IN_DENSE` elsewhere).
    """
    import numpy as np

    from beyondgrad import _checks
    from beyondgrad._sparse_jets import SparseJet

    n = _checks.integer(
        n_electrons, "n_electrons", minimum=2, where="dependence_patterns: "
    )
    _checks.boolean(particles, "particles", where="dependence_patterns: ")
    seen = _recorded_layer(n, particles)
    chosen = {
        "r": _pick(seen, "reshape", (n, 3)),
        "h_pair": _pick(seen, "tanh", (n, n, LAYER_PAIR_WIDTH)),
        "pooled": _pick(seen, "broadcast_in_dim", (n, 8)),
        "h_one": _pick(seen, "tanh", (n, LAYER_WIDTH)),
    }
    panels = []
    for name in DEPENDENCE_PANELS:
        jet = chosen[name]
        shape = tuple(jet.val.shape)
        lead = shape[:-1]  # electron axes; the last axis is features/coordinates
        rows = [
            str(idx[0]) if len(idx) == 1 else f"{idx[0]},{idx[1]}"
            for idx in np.ndindex(*lead)
        ]
        size = int(np.prod(shape))
        if isinstance(jet, SparseJet):
            pattern = np.zeros((len(rows), n), bool)
            for term in jet.terms:
                owner = np.broadcast_to(term.owner, shape).reshape(len(rows), -1)
                for row, owners in enumerate(owner):
                    pattern[row, np.unique(owners)] = True
            terms, stored = len(jet.terms), len(jet.terms) * jet.block * size
            image = np.where(pattern, SPARSE_STORED, ZERO_IN_DENSE)
        else:
            pattern = np.ones((len(rows), n), bool)
            terms, stored = 0, 3 * n * size
            image = np.full(pattern.shape, DENSE_STORED)
        panels.append(
            {
                "name": name,
                "shape": shape,
                "rows": rows,
                "pattern": pattern,
                "sparse": isinstance(jet, SparseJet),
                "terms": terms,
                "stored": stored,
                "dense": 3 * n * size,
                "image": image,
            }
        )
    return panels


#: Panel titles of :func:`plot_dependence`.
DEPENDENCE_TITLES = {
    "r": "input r",
    "h_pair": "pair stream h_ij",
    "pooled": "pooled means",
    "h_one": "one-electron h_i",
}


def plot_dependence(
    panels: Sequence[Mapping[str, Any]], axes: Sequence[Axes] | None = None
) -> Sequence[Axes]:
    """One panel per intermediate of :func:`dependence_patterns`: rows (an electron
    ``i`` or a pair ``i,j``) against the electron ``p`` a derivative is taken by;
    dark blue where a particle term stores it, orange where a dense Jacobian does,
    light grey the zeros a dense ``(3n, ...)`` Jacobian would store there. The
    title gives the shape and the numbers stored against the dense Jacobian's."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    panels = list(panels)
    if not panels or not all(isinstance(p, Mapping) for p in panels):
        raise ValueError(
            "panels must be the non-empty list dependence_patterns() returns"
        )
    if axes is None:
        _, grid = plt.subplots(
            1,
            len(panels),
            figsize=(2.6 * len(panels), 3.4),
            squeeze=False,
            gridspec_kw={"wspace": 0.45},
        )
        axes = list(grid[0])
    if len(axes) != len(panels):
        raise ValueError(f"need {len(panels)} axes (one per panel), got {len(axes)}")
    colours = ListedColormap(["#e6e6e6", "#1f4e9c", "#e8822a"])
    for ax, panel in zip(axes, panels):
        image = panel["image"]
        n = image.shape[1]
        ax.imshow(
            image,
            cmap=colours,
            vmin=ZERO_IN_DENSE,
            vmax=DENSE_STORED,
            aspect="auto",
            interpolation="nearest",
        )
        rows = panel["rows"]
        step = max(1, len(rows) // 6)
        ax.set_yticks(range(0, len(rows), step), rows[::step], fontsize=7)
        ax.set_xticks(range(n), [str(p) for p in range(n)], fontsize=7)
        ax.set_xlabel("electron p", fontsize=8)
        shape = "×".join(map(str, panel["shape"]))
        kind = f"{panel['terms']} term(s)" if panel["sparse"] else "dense"
        ax.set_title(
            f"{DEPENDENCE_TITLES.get(panel['name'], panel['name'])} ({shape})\n"
            f"{kind}: {panel['stored']:,} stored\n"
            f"dense Jacobian: {panel['dense']:,}",
            fontsize=8,
        )
    axes[0].set_ylabel("element row (i or i,j)", fontsize=8)
    keys = [
        ("a particle term stores it", colours(SPARSE_STORED)),
        ("the dense Jacobian stores it", colours(DENSE_STORED)),
        ("zero, stored by a dense Jacobian only", colours(ZERO_IN_DENSE)),
    ]
    axes[0].figure.legend(
        handles=[Patch(color=c, label=label) for label, c in keys],
        loc="lower center",
        ncol=3,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, -0.12),
    )
    return axes
