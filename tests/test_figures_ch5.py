"""Chapter 5's figures and widget callbacks (beyondgrad.figures.ch5)."""

from __future__ import annotations

import json
import math

import matplotlib
import pytest

from beyondgrad.figures import ch5 as figs

matplotlib.use("Agg")

PROFILE = {
    2: {"sample_variance": 4.0, "laplacian": -2.0},
    4: {"sample_variance": 9.0, "laplacian": 3.0},
}


def record(**changes):
    """A record with the benchmark's schema; its numbers are test data, not measurements."""
    rows = [
        {
            "family": fam,
            "n": n,
            "method": m,
            "min_ms": 1.0,
            "median_ms": 1.5,
            "ratio_log_psi": r * n,
            "ratio_folx_best": None if m == "folx" else r,
            "temp_bytes": 1024,
            "rel_err": 1e-6,
        }
        for fam in ("mlp", "gto")
        for n in (32, 8)
        for m, r in (("loop", 2.0), ("folx", 0.5))
    ]
    data = {
        "command": "python benchmarks/laplacian.py --record",
        "machine": "cpu x2",
        "jax": "0.12.0",
        "folx": "0.2.30",
        "date": "2026-11-22",
        "rows": rows,
    }
    data.update(changes)
    return data


def test_tradeoff_counts_cost_in_hessian_vector_products():
    t = figs.hutchinson_tradeoff(PROFILE, 4, 9)
    assert t["hvps"] == 9 and t["exact_hvps"] == 12
    assert t["cost_vs_exact"] == pytest.approx(9 / 12)
    assert t["std_error"] == pytest.approx(1.0)  # sqrt(9 / 9)
    assert t["relative_error"] == pytest.approx(1 / 3)


def test_tradeoff_zero_laplacian_gives_infinite_relative_error():
    t = figs.hutchinson_tradeoff({1: {"sample_variance": 1.0, "laplacian": 0.0}}, 1, 4)
    assert math.isinf(t["relative_error"])


def test_describe_tradeoff_line():
    line = figs.describe_tradeoff(PROFILE, 2, 6)
    assert line == (
        "n = 2 electrons: S = 6 probes cost 6 Hessian-vector products = 1.00 x the "
        "exact loop (6); std. error 0.816 (40.8% of |Laplacian|)"
    )


def test_plot_tradeoff_draws_one_panel_per_size():
    axes = figs.plot_tradeoff(PROFILE, [1, 4, 16])
    assert [ax.get_title() for ax in axes] == ["n = 2 (d = 6)", "n = 4 (d = 12)"]
    y = axes[0].get_lines()[0].get_ydata()
    assert list(y) == pytest.approx([1.0, 0.5, 0.25])  # sqrt(4 / S) / 2


TRADEOFF_BAD = [
    ("profile-not-dict", ([1, 2], 2, 4), TypeError, "profile must be a dict"),
    ("n-unknown", (PROFILE, 3, 4), ValueError, "measured sizes are [2, 4]"),
    ("n-bool", (PROFILE, True, 4), TypeError, "n must be a Python int"),
    ("samples-zero", (PROFILE, 2, 0), ValueError, "num_samples must be a positive int"),
    (
        "samples-float",
        (PROFILE, 2, 2.5),
        TypeError,
        "num_samples must be a Python int, a positive int",
    ),
    (
        "missing-key",
        ({2: {"laplacian": 1.0}}, 2, 4),
        ValueError,
        "lacks ['sample_variance']",
    ),
    (
        "negative-variance",
        ({2: {"sample_variance": -1.0, "laplacian": 1.0}}, 2, 4),
        ValueError,
        ">= 0",
    ),
    (
        "nan-laplacian",
        ({2: {"sample_variance": 1.0, "laplacian": math.nan}}, 2, 4),
        ValueError,
        "finite",
    ),
]


@pytest.mark.parametrize(
    "args, exc, match", [c[1:] for c in TRADEOFF_BAD], ids=[c[0] for c in TRADEOFF_BAD]
)
def test_tradeoff_bad_inputs(args, exc, match):
    with pytest.raises(exc, match=match.replace("[", r"\[").replace("]", r"\]")):
        figs.hutchinson_tradeoff(*args)


def test_plot_tradeoff_bad_inputs():
    with pytest.raises(ValueError, match="sample_counts is empty"):
        figs.plot_tradeoff(PROFILE, [])
    with pytest.raises(ValueError, match="each sample count must be a positive int"):
        figs.plot_tradeoff(PROFILE, [0])


def test_load_benchmark_reads_a_file(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(record()))
    data = figs.load_benchmark(path)
    assert data["machine"] == "cpu x2" and len(data["rows"]) == 8


def test_the_package_ships_a_benchmark_record():
    """The chapter reads the package's own file (importlib.resources), as on Colab."""
    data = figs.load_benchmark()
    assert {r["family"] for r in data["rows"]}
    assert all(
        r["ratio_log_psi"] is None or r["ratio_log_psi"] > 0 for r in data["rows"]
    )


def test_series_are_sorted_by_n_and_skip_missing_values():
    data = record()
    data["rows"][0]["ratio_log_psi"] = None  # mlp, n = 32, loop: not measured
    series = figs.benchmark_series(data, "mlp")
    assert series["folx"] == ([8, 32], [4.0, 16.0])
    assert series["loop"] == ([8], [16.0])


def test_describe_benchmark_names_command_machine_and_versions():
    assert figs.describe_benchmark(record()) == (
        "benchmarks/laplacian.py of the book's repository (its default options) on "
        "cpu x2, JAX 0.12.0, folx 0.2.30, recorded 2026-11-22"
    )
    data = record(command="python benchmarks/laplacian.py --all-electron --record")
    assert figs.describe_benchmark(data).startswith(
        "benchmarks/laplacian.py of the book's repository (options --all-electron) on"
    )


def test_describe_benchmark_adds_the_optional_setup_and_note():
    data = record(
        batch=16, repeats=7, dtype="float32", duration_s=900.0, note="shared machine"
    )
    assert figs.describe_benchmark(data).endswith(
        "recorded 2026-11-22; 16 walkers a batch, 7 repeats, float32; "
        "the whole run took 15.0 min\n"
        "note recorded with the results: shared machine"
    )


def test_float32_accuracy_reads_bounds_and_the_exact_methods_errors():
    data = record()
    for r in data["rows"]:  # loop 2e-6, folx 3e-6; log|psi| and Hutchinson don't count
        r["rel_err"] = 2e-6 if r["method"] == "loop" else 3e-6
    extra = {"n": 32, "min_ms": 1.0, "median_ms": 1.0, "ratio_log_psi": 1.0}
    data["rows"] += [
        {**data["rows"][0], **extra, "method": "log|psi|", "rel_err": None},
        {**data["rows"][0], **extra, "method": "hutchinson(16)", "rel_err": 0.1},
    ]
    data["problems"] = [
        {"family": "mlp", "n": 32, "cond_median": 4e3, "float32_floor": 1e-6},
        {"family": "mlp", "n": 8, "cond_median": 50.0, "float32_floor": 1e-8},
    ]
    assert figs.float32_accuracy(data, 32) == [
        {
            "family": "mlp",
            "cond_median": 4e3,
            "floor": 1e-6,
            "least": 2e-6,
            "most": 3e-6,
        }
    ]
    with pytest.raises(ValueError, match="no float32 bounds .* at n = 16"):
        figs.float32_accuracy(data, 16)
    with pytest.raises(ValueError, match="re-record"):
        figs.float32_accuracy(record(), 32)  # a record from before the bounds


def test_plot_benchmark_one_panel_per_family_one_line_per_method():
    axes = figs.plot_benchmark(record())
    assert [ax.get_title() for ax in axes] == ["gto", "mlp"]
    lines = {ln.get_label(): ln for ln in axes[1].get_lines()}
    assert sorted(lines) == ["folx", "loop"]
    assert list(lines["loop"].get_xdata()) == [8, 32]
    assert list(lines["loop"].get_ydata()) == [16.0, 64.0]


def test_the_legend_names_methods_missing_from_the_last_panel():
    data = record()
    data["rows"].append({**data["rows"][0], "family": "gto", "method": "analytic"})
    axes = figs.plot_benchmark(data)
    legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
    assert legend == ["analytic", "folx", "loop"]


def _without(key):
    data = record()
    del data[key]
    return data


def _row_without(key):
    data = record()
    del data["rows"][3][key]
    return data


BENCH_BAD = [
    ("not-object", [1, 2], "expected a JSON object"),
    ("no-command", _without("command"), "lacks ['command']"),
    ("no-machine", _without("machine"), "lacks ['machine']"),
    ("empty-rows", record(rows=[]), "'rows' must be a non-empty list"),
    ("row-not-object", record(rows=[3]), r"rows\[0\] must be an object"),
    (
        "row-missing-field",
        _row_without("ratio_log_psi"),
        r"rows\[3\] lacks \['ratio_log_psi'\]",
    ),
    (
        "row-bad-n",
        record(rows=[{**record()["rows"][0], "n": 0}]),
        r"rows\[0\]\['n'\] must be a positive int",
    ),
]


@pytest.mark.parametrize(
    "data, match", [c[1:] for c in BENCH_BAD], ids=[c[0] for c in BENCH_BAD]
)
def test_benchmark_bad_records(tmp_path, data, match):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=match.replace("['", r"\['").replace("']", r"'\]")
        if "\\" not in match
        else match,
    ):
        figs.load_benchmark(path)


def test_benchmark_bad_arguments(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        figs.load_benchmark(path)
    with pytest.raises(TypeError, match="path must be a str or pathlib.Path"):
        figs.load_benchmark(3)
    with pytest.raises(ValueError, match="no rows for family 'pw'"):
        figs.benchmark_series(record(), "pw")
    with pytest.raises(ValueError, match="value must be one of"):
        figs.benchmark_series(record(), "mlp", value="speed")
    with pytest.raises(ValueError, match="need 2 axes"):
        figs.plot_benchmark(record(), axes=[None])


def _styles(axes) -> dict[str, set]:
    """{label: the (colour, marker) pairs its lines use} over all panels of a figure."""
    import matplotlib.colors as mcolors

    found: dict[str, set] = {}
    for ax in axes:
        for line in ax.get_lines():
            pair = (mcolors.to_hex(line.get_color()), line.get_marker())
            found.setdefault(str(line.get_label()), set()).add(pair)
    return found


def _many_methods(count: int) -> dict:
    data = record()
    base = data["rows"][0]
    data["rows"] = [
        {**base, "family": fam, "n": n, "method": f"method {k:02d}"}
        for fam in ("mlp", "gto")
        for n in (8, 32)
        for k in range(count)
    ]
    return data


@pytest.mark.parametrize(
    "data",
    [figs.load_benchmark(), _many_methods(12), _many_methods(25)],
    ids=["recorded", "12 methods", "25 methods"],
)
def test_no_two_series_of_the_cost_plot_share_colour_and_marker(data):
    import matplotlib.pyplot as plt

    axes = figs.plot_benchmark(data)
    styles = _styles(axes)
    plt.close(axes[0].figure)
    methods = {r["method"] for r in data["rows"]}
    assert set(styles) == methods
    # each series keeps one style in every panel, and no two series share one
    assert all(len(pairs) == 1 for pairs in styles.values()), styles
    pairs = [next(iter(p)) for p in styles.values()]
    assert len(set(pairs)) == len(pairs), sorted(zip(pairs, styles))


def test_series_styles_are_distinct_up_to_sixty_and_refuse_more():
    styles = figs.series_styles([f"s{k}" for k in range(60)])
    assert len(set(styles.values())) == 60
    with pytest.raises(ValueError, match="at most 60 series"):
        figs.series_styles([f"s{k}" for k in range(61)])
    with pytest.raises(ValueError, match="must be distinct"):
        figs.series_styles(["a", "a"])


def _with_targets(**check):
    data = record()
    data["targets"] = {"ratio_folx_best": 0.5, "growth_exponent": 3.0}
    data["target_checks"] = [
        {
            "family": "mlp",
            "n": 32,
            "ratio_folx_best": 0.6,
            "growth_exponent": None,
            "pass": {"ratio_folx_best": False},
            **check,
        }
    ]
    return data


def test_benchmark_targets_read_the_values_and_verdicts_of_the_record():
    assert figs.benchmark_targets(_with_targets()) == [
        {
            "family": "mlp",
            "n": 32,
            "values": {"ratio_folx_best": 0.6, "growth_exponent": None},
            "met": {"ratio_folx_best": False, "growth_exponent": None},
        }
    ]
    met = figs.benchmark_targets(
        _with_targets(ratio_folx_best=0.5, **{"pass": {"ratio_folx_best": True}})
    )
    assert met[0]["met"]["ratio_folx_best"] is True  # the bound itself is met


def test_benchmark_targets_refuse_verdicts_that_contradict_the_values():
    data = _with_targets(**{"pass": {"ratio_folx_best": True}})
    with pytest.raises(ValueError, match="do not follow from the recorded values"):
        figs.benchmark_targets(data)
    with pytest.raises(ValueError, match="re-record it"):
        figs.benchmark_targets(record())


def test_the_recorded_benchmark_has_targets_and_a_time_split():
    data = figs.load_benchmark()
    targets = figs.benchmark_targets(data)
    assert {t["n"] for t in targets} == {32, 64}
    assert set(targets[0]["values"]) == set(data["targets"])
    split = figs.time_split(data, 64)
    assert {s["family"] for s in split} == {r["family"] for r in data["rows"]}
    for s in split:
        assert set(s["parts_ms"]) == {"orbitals", "LU+inverse", "row sums"}
        assert s["method_ms"] > 0


def test_time_split_pairs_the_method_with_its_parts():
    data = record()
    row = {**data["rows"][0], "method": "slater_laplacian", "min_ms": 3.0}
    data["rows"].append(row)  # mlp, n = 32
    data["parts"] = [
        {"family": "mlp", "n": 32, "part": "orbitals", "min_ms": 2.0},
        {"family": "mlp", "n": 32, "part": "LU+inverse", "min_ms": 0.5},
    ]
    assert figs.time_split(data, 32) == [
        {
            "family": "mlp",
            "method_ms": 3.0,
            "parts_ms": {"orbitals": 2.0, "LU+inverse": 0.5},
        }
    ]
    with pytest.raises(ValueError, match=r"no parts timed alone at n = 8; .*\[32\]"):
        figs.time_split(data, 8)
    data["parts"][0]["family"] = "gto"
    with pytest.raises(ValueError, match="no slater_laplacian row for 'gto'"):
        figs.time_split(data, 32)


# ---------------------------------------------------------------------------------------
# The dependence pattern through one equivariant layer, read from the engine


def _layer(params, r):
    """The first layer of all_electron.ferminet_log_psi, written out here (not the
    package's code): the four intermediates of figs.DEPENDENCE_PANELS."""
    import jax.numpy as jnp

    n = r.shape[0]
    n_up = n // 2

    def rho(v):
        return jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True) + 1.0)

    ((w, b, v, c),) = params["layers"]
    h = jnp.concatenate([r, rho(r)], axis=-1)
    diff = r[:, None, :] - r[None, :, :]
    h2 = jnp.concatenate([diff, rho(diff)], axis=-1)
    means = jnp.concatenate([h[:n_up].mean(0), h[n_up:].mean(0)])
    pooled = jnp.broadcast_to(means, (n, means.shape[0]))
    f = jnp.concatenate(
        [h, pooled, h2[:, :n_up].mean(1), h2[:, n_up:].mean(1)], axis=-1
    )
    return {
        "r": r,
        "h_pair": jnp.tanh(h2 @ v + c),
        "pooled": pooled,
        "h_one": jnp.tanh(f @ w + b),
    }


def _true_patterns(n):
    """name -> bool (rows, n): where jax.jacfwd of the written-out layer is non-zero
    at a random point, by electron (features and coordinates folded in)."""
    import jax
    import numpy as np

    from beyondgrad import all_electron

    params = all_electron.init_ferminet(
        jax.random.key(3),
        n,
        width=figs.LAYER_WIDTH,
        pair_width=figs.LAYER_PAIR_WIDTH,
        layers=1,
        determinants=1,
    )
    r = jax.random.normal(jax.random.key(4), (n, 3))
    jac = jax.jit(jax.jacfwd(_layer, argnums=1))(params, r)
    out = {}
    for name, j in jac.items():
        j = np.asarray(j)  # (*shape, n, 3)
        rows = int(np.prod(j.shape[:-3]))
        out[name] = (j.reshape(rows, -1, n, 3) != 0).any(axis=(1, 3))
    return out


def _mismatches(panels, truth, n):
    """Where a panel's pattern is not what the layer depends on: exact for every
    panel, except that the pair stream's diagonal h_ii (built from r_i - r_i = 0, a
    constant) keeps its electron i."""
    import numpy as np

    wrong = []
    for panel in panels:
        want = truth[panel["name"]].copy()
        if panel["name"] == "h_pair":
            for i in range(n):
                want[i * n + i, i] = True
        if not np.array_equal(panel["pattern"], want):
            wrong.append(panel["name"])
    return wrong


@pytest.mark.parametrize("n", [6, 5])
def test_the_dependence_pattern_is_the_layers_own(n):
    """The engine's particle terms name exactly the electrons each intermediate
    depends on (jax.jacfwd of the layer written out here); the dense engine's
    pattern is wrong where the layer is sparse, so this comparison can fail."""
    import numpy as np

    truth = _true_patterns(n)
    sparse = figs.dependence_patterns(n)
    assert [p["name"] for p in sparse] == list(figs.DEPENDENCE_PANELS)
    assert _mismatches(sparse, truth, n) == []
    # the pattern really is sparse where the figure says so ...
    assert np.array_equal(sparse[0]["pattern"], np.eye(n, dtype=bool))
    pair = sparse[1]["pattern"].reshape(n, n, n)
    for i in range(n):
        for j in range(n):
            assert set(np.flatnonzero(pair[i, j])) == {i, j}
    # ... and dense after the pooling, in the layer itself too
    assert truth["pooled"].all() and truth["h_one"].all()
    dense = figs.dependence_patterns(n, particles=False)
    assert _mismatches(dense, truth, n) == ["r", "h_pair"]


def test_what_the_jets_store():
    n, c = 6, 3
    panels = {p["name"]: p for p in figs.dependence_patterns(n)}
    pair = panels["h_pair"]
    assert pair["shape"] == (n, n, figs.LAYER_PAIR_WIDTH)
    assert pair["sparse"] and pair["terms"] == 2
    assert pair["stored"] == 2 * c * n * n * figs.LAYER_PAIR_WIDTH
    assert pair["dense"] == 3 * n * n * n * figs.LAYER_PAIR_WIDTH
    assert panels["r"]["terms"] == 1 and panels["r"]["stored"] == c * n * c
    for name in ("pooled", "h_one"):
        p = panels[name]
        assert not p["sparse"] and p["terms"] == 0 and p["stored"] == p["dense"]
    assert panels["h_one"]["shape"] == (n, figs.LAYER_WIDTH)
    dense = figs.dependence_patterns(n, particles=False)
    assert all(not p["sparse"] and p["stored"] == p["dense"] for p in dense)


def test_the_picture_draws_the_engines_pattern():
    import matplotlib.pyplot as plt
    import numpy as np

    panels = figs.dependence_patterns(6)
    axes = figs.plot_dependence(panels)
    try:
        for ax, panel in zip(axes, panels):
            drawn = np.asarray(ax.get_images()[0].get_array())
            assert np.array_equal(drawn, panel["image"])
            assert np.array_equal(drawn != figs.ZERO_IN_DENSE, panel["pattern"])
            assert f"{panel['stored']:,} stored" in ax.get_title()
            assert f"dense Jacobian: {panel['dense']:,}" in ax.get_title()
        assert np.array_equal(
            np.asarray(axes[0].get_images()[0].get_array()),
            np.where(np.eye(6, dtype=bool), figs.SPARSE_STORED, figs.ZERO_IN_DENSE),
        )
        assert (np.asarray(axes[3].get_images()[0].get_array()) == 2).all()
    finally:
        plt.close(axes[0].figure)


def test_dependence_bad_inputs():
    with pytest.raises(ValueError, match="n_electrons must be an int >= 2"):
        figs.dependence_patterns(1)
    with pytest.raises(TypeError, match="n_electrons must be a Python int"):
        figs.dependence_patterns(6.0)
    with pytest.raises(TypeError, match="particles must be True or False"):
        figs.dependence_patterns(6, particles=6)
    with pytest.raises(ValueError, match="non-empty list dependence_patterns"):
        figs.plot_dependence([])
    with pytest.raises(ValueError, match="need 4 axes"):
        figs.plot_dependence(figs.dependence_patterns(4), axes=[None])
