"""The Laplacian benchmark's machinery on a tiny size (timings are recorded, never asserted)."""

import importlib.util
import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import laplacian as L
from beyondgrad.figures import ch5 as figs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_laplacian", ROOT / "benchmarks" / "laplacian.py"
    )
    module = importlib.util.module_from_spec(spec)
    before = dict(os.environ)
    spec.loader.exec_module(module)  # the script sets OPENBLAS_NUM_THREADS for itself
    os.environ.clear()
    os.environ.update(before)
    return module


@pytest.mark.parametrize("family", ["mlp", "gto", "pw-jastrow"])
def test_every_family_and_method_agrees_with_float64_hessian(bench, family):
    n = 3
    with jax.enable_x64(True):
        params = jax.tree.map(
            lambda a: jnp.asarray(a, jnp.float64),
            bench.FAMILIES[family][0](jax.random.key(n), n),
        )
        pos = 0.7 * jax.random.normal(jax.random.key(1), (n, 3), jnp.float64)
        flat = lambda v: bench.family_log_psi(family)(params, v.reshape(n, 3))  # noqa: E731
        want_g = jax.jit(jax.grad(flat))(pos.reshape(-1))
        want = jax.jit(lambda v: jnp.trace(jax.hessian(flat)(v)))(pos.reshape(-1))
        for name, fn in bench.method_fns(family, n).items():
            if name.startswith("hutchinson"):
                continue
            g, lap = jax.jit(fn)(params, pos)
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-11, err_msg=name
            )
            np.testing.assert_allclose(float(lap), float(want), rtol=1e-9, err_msg=name)


def test_benchmark_run_rows_and_record(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "RECORD", tmp_path / "laplacian_benchmark.json")
    bench.main(
        [
            "--sizes",
            "3",
            "--families",
            "pw-jastrow",
            "--repeats",
            "1",
            "--steps",
            "5",
            "--record",
        ]
    )
    record = json.loads((tmp_path / "laplacian_benchmark.json").read_text())
    assert set(record) >= {
        "command",
        "machine",
        "jax",
        "folx",
        "date",
        "rows",
        "duration_s",
    }
    assert record["jax"] == jax.__version__
    rows = record["rows"]
    keys = {
        "family",
        "n",
        "method",
        "min_ms",
        "median_ms",
        "ratio_log_psi",
        "ratio_folx_best",
        "temp_bytes",
        "flops",
        "rel_err",
    }
    assert all(set(r) == keys for r in rows)
    # the parts of slater_laplacian, timed in the same run, with their flops
    parts = record["parts"]
    assert [p["part"] for p in parts] == list(bench.PARTS)
    assert all(p["min_ms"] > 0 and p["flops"] > 0 for p in parts)
    assert record["target_checks"] == []  # targets are stated at n = 32 and 64 only
    assert all(p["gflop_per_s"] > 0 for p in parts)
    # the lower bounds: orbital values and one LU+inverse alone, against folx-best
    (bound,) = record["bounds"]
    assert (bound["family"], bound["n"]) == ("pw-jastrow", 3)
    assert bound["bound_x_folx"] == pytest.approx(
        bound["values_x_folx"] + bound["lu_inverse_x_folx"]
    )
    assert bound["folx_target_reachable"] == (
        bound["bound_x_folx"] <= bench.TARGETS["ratio_folx_best"]
    )
    assert set(bound["hardware_gflop_per_s"]) == set(bench.BOUND_CALLS[1:])
    assert all(v > 0 for v in bound["hardware_gflop_per_s"].values())
    assert set(bound["gflop_per_s"]) == {"orbital values", *bench.PARTS}
    assert {r["method"] for r in rows} == {
        "log|psi|",
        *bench.method_fns("pw-jastrow", 3),
    }
    folx = [r["ratio_folx_best"] for r in rows if r["method"].startswith("folx(")]
    assert min(folx) == pytest.approx(1.0)
    by_method = {r["method"]: r for r in rows}
    assert by_method["log|psi|"]["ratio_log_psi"] == pytest.approx(1.0)
    # float32 against float64: exact methods measured at ~1e-6 here (tolerance 10x that)
    for r in rows:
        if r["rel_err"] is not None and not r["method"].startswith("hutchinson"):
            assert r["rel_err"] < 1e-5, r
    (problem,) = record["problems"]
    assert (problem["family"], problem["n"]) == ("pw-jastrow", 3)
    assert 1.0 <= problem["cond_median"] <= problem["cond_max"]
    # only the orbital values rounded to float32: measured ~1e-7 here
    assert 0.0 < problem["float32_floor"] < 1e-5
    assert "OPENBLAS_NUM_THREADS=" in record["note"]
    # the chapter reads the written record back through figures.ch5
    saved = figs.load_benchmark(tmp_path / "laplacian_benchmark.json")
    (accuracy,) = figs.float32_accuracy(saved, 3)
    assert accuracy["floor"] == problem["float32_floor"]
    assert accuracy["least"] <= accuracy["most"] < 1e-5
    out = capsys.readouterr().out
    assert "targets are stated at n = 32 and 64" in out
    assert "float32 floor" in out
    assert "lower bounds, as multiples of folx-best" in out


def test_hutchinson_row_error_is_the_statistical_error(bench):
    # 16 probes per walker: the error of the batch should be about the standard error
    # predicted from the spread of single probes (computed here from 4096 probes).
    n, family = 3, "gto"
    params, walkers, _ = bench.make_problem(family, n, batch=8, steps=20)
    fn = bench.method_fns(family, n)["hutchinson(16)"]
    with jax.enable_x64(True):
        p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        w64 = walkers.astype(jnp.float64)
        flat = lambda p, x: bench.family_log_psi(family)(p, x.reshape(n, 3))  # noqa: E731
        exact = jax.vmap(
            lambda x: L.laplacian(lambda v: flat(p64, v), x.reshape(-1), method="vmap")
        )(w64)
        spread = jax.vmap(
            lambda x: jnp.std(
                L.hutchinson_samples(
                    lambda v: flat(p64, v), x.reshape(-1), jax.random.key(9), 4096
                )
            )
        )(w64)
    got = jax.jit(jax.vmap(fn, in_axes=(None, 0)))(params, walkers)[1]
    err = bench.relative_error(got, np.asarray(exact))
    predicted = float(
        np.sqrt(np.sum(np.asarray(spread) ** 2) / 16)
        / np.linalg.norm(np.asarray(exact))
    )
    assert 0 < err < 4 * predicted, (err, predicted)


def test_check_targets_reads_the_rows(bench, capsys):
    def row(n, ms, folx, flops, err):
        return {
            "family": "f",
            "n": n,
            "method": "slater_laplacian",
            "min_ms": ms,
            "median_ms": ms,
            "ratio_folx_best": folx,
            "ratio_log_psi": 2.0,
            "temp_bytes": 2**20,
            "flops": flops,
            "rel_err": err,
        }

    def part(n, name, ms, flops):
        return {"family": "f", "n": n, "part": name, "min_ms": ms, "flops": flops}

    rows = [row(32, 1.0, 0.4, 110.0, 2e-6), row(64, 16.0, 0.6, 1000.0, 2e-5)]
    parts = [part(32, p, 0.5, 50.0) for p in ("orbitals", "LU+inverse")]
    parts += [part(64, p, 4.0, 400.0) for p in ("orbitals", "LU+inverse")]
    results = bench.check_targets(rows, parts)
    assert [r["n"] for r in results] == [32, 64]
    small, large = results
    assert small["ratio_parts"] == pytest.approx(1.0)  # 1.0 / (0.5 + 0.5)
    assert small["ratio_flops_floor"] == pytest.approx(1.1)  # 110 / (50 + 50)
    assert small["pass"] == {
        "ratio_folx_best": True,
        "ratio_parts": True,
        "ratio_flops_floor": True,
    }
    assert large["growth_exponent"] == pytest.approx(4.0)  # 16x for 2x the size
    assert large["ratio_parts"] == pytest.approx(2.0)  # 16 / (4 + 4)
    assert large["ratio_flops_floor"] == pytest.approx(1.25)  # 1000 / 800
    assert not any(large["pass"].values())
    bench.print_targets(results)
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("n "))
    for column in ("x folx", "x parts", "x floor", "growth", "temp MiB"):
        assert column in header
    assert "0.40 PASS" in out and "0.60 MISS" in out
    assert "4.00 MISS" in out  # the growth exponent


@pytest.mark.parametrize(
    "model, methods",
    [("ferminet", None), ("psiformer", ("folx(s=0)", "hessian", "vmap"))],
)
def test_all_electron_methods_agree_with_float64_hessian(bench, model, methods):
    """Every method of the all-electron table (the engine's settings, folx dense and
    sparse, the Hessian, vmap) against jax.grad and the float64 Hessian trace, at n = 3;
    the methods are wired alike for both models, so each is checked on one of them
    (compiling them all twice took a minute)."""
    n = 3
    init, log_psi = bench.ALL_ELECTRON[model]
    with jax.enable_x64(True):
        params = init(jax.random.key(n), n, dtype=jnp.float64)
        pos = 0.7 * jax.random.normal(jax.random.key(1), (n, 3), jnp.float64)
        flat = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
        want_g = jax.jit(jax.grad(flat))(pos.reshape(-1))
        want = jax.jit(lambda v: jnp.trace(jax.hessian(flat)(v)))(pos.reshape(-1))
        fns = bench.all_electron_fns(model, n)
        assert {"forward_laplacian", "folx(s=0)", "folx(s=6)", "hessian"} <= set(fns)
        for name, fn in fns.items():
            if methods is None and name in ("hessian", "vmap", "folx(s=0)"):
                continue  # checked on the psiformer model
            if methods is not None and name not in methods:
                continue
            g, lap = jax.jit(fn)(params, pos)
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-11, err_msg=name
            )
            np.testing.assert_allclose(float(lap), float(want), rtol=1e-9, err_msg=name)


def test_all_electron_run_record_and_targets(bench, tmp_path, monkeypatch, capsys):
    """--all-electron adds its rows and target checks to the record (the single-particle
    part is kept); each row has compile time, temporary bytes and flops."""
    path = tmp_path / "laplacian_benchmark.json"
    path.write_text(json.dumps({"rows": ["kept"]}))
    monkeypatch.setattr(bench, "RECORD", path)
    every = bench.all_electron_fns
    kept = ("forward_laplacian", "folx(s=0)", "vmap")  # the rest is compiled above
    monkeypatch.setattr(
        bench,
        "all_electron_fns",
        lambda model, n: {k: f for k, f in every(model, n).items() if k in kept},
    )
    bench.main(
        ["--all-electron", "--models", "ferminet", "--sizes", "3", "--repeats", "1"]
        + ["--record"]
    )
    record = json.loads(path.read_text())
    assert record["rows"] == ["kept"]
    part = record["all_electron"]
    rows = part["rows"]
    assert {r["method"] for r in rows} == {"log|psi|", *kept}
    for r in rows:
        assert r["compile_s"] > 0 and r["min_ms"] > 0 and r["flops"] > 0, r
        assert r["temp_bytes"] is None or r["temp_bytes"] >= 0
        if r["rel_err"] is not None:
            assert r["rel_err"] < 1e-4, r  # float32 against float64
    (check,) = part["target_checks"]
    assert check["method"].startswith(bench.THE_ENGINE)
    assert check["folx_method"].startswith("folx(")
    assert check["ratio_folx_best"] == pytest.approx(
        check["min_ms"] / check["folx_best_ms"]
    )
    assert "ratio_folx_best_n64" not in check["pass"]  # stated at n = 64 only
    assert set(check["pass"]) <= set(bench.ALL_ELECTRON_TARGETS)
    assert "targets for forward_laplacian" in capsys.readouterr().out


def test_all_electron_targets_read_the_best_settings(bench):
    """The target check compares the engine's fastest setting with folx's fastest."""
    row = dict(temp_bytes=100, compile_s=2.0, flops=1.0, rel_err=0.0)
    rows = [
        {"family": "m", "n": 64, "method": "forward_laplacian", "min_ms": 9.0, **row},
        {
            "family": "m",
            "n": 64,
            "method": "forward_laplacian(particles)",
            "min_ms": 3.0,
            **row,
        },
        {"family": "m", "n": 64, "method": "folx(s=0)", "min_ms": 8.0, **row},
        {
            "family": "m",
            "n": 64,
            "method": "folx(s=6)",
            "min_ms": 5.0,
            **row,
        },
        {"family": "m", "n": 64, "method": "hessian", "min_ms": 1.0, **row},
    ]
    (c,) = bench.check_all_electron_targets(rows)
    assert (c["method"], c["folx_method"]) == (
        "forward_laplacian(particles)",
        "folx(s=6)",
    )
    assert c["ratio_folx_best"] == pytest.approx(0.6)
    assert c["pass"] == {
        "ratio_folx_best": True,
        "ratio_folx_best_n64": True,
        "temp_ratio_folx": True,
        "compile_ratio_folx": True,
    }
    rows[1]["min_ms"] = 4.0
    (c,) = bench.check_all_electron_targets(rows)
    assert c["pass"]["ratio_folx_best"] and not c["pass"]["ratio_folx_best_n64"]
