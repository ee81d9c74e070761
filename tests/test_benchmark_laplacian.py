"""The Laplacian benchmark's machinery on a tiny size (the timings themselves are not asserted)."""

import importlib.util
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_laplacian", ROOT / "benchmarks" / "laplacian.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_runs_every_method_and_agrees_with_float64(bench, capsys):
    with jax.enable_x64(True):
        rows, extra = bench.run([3], batch=4, hidden=None, repeats=1, budget_s=60.0)
    names = {r["method"] for r in rows}
    assert names == set(bench.method_fns(3))
    for r in rows:
        assert r["time"] > 0 and r["vs_eval"] > 0
        limit = 1.0 if r["method"].startswith("hutchinson") else 1e-4
        assert r["err"] < limit, r
    assert min(r["vs_folx"] for r in rows if r["method"].startswith("folx")) == pytest.approx(1.0)
    assert 0.0 < extra[3]["acceptance"] <= 1.0
    bench.print_table(rows)
    bench.print_sampling(extra)
    bench.check_targets(rows)
    out = capsys.readouterr().out
    assert "slater (analytic MLP)" in out and "targets are stated at n = 32" in out


def test_error_budget_separates_the_sources(bench):
    with jax.enable_x64(True):
        params, walkers, _, _ = bench.make_problem(4, batch=4, hidden=None)
        budget = bench.error_budget(params, walkers)
    assert set(budget) == {"all float32", "determinant part in float64", "float64 from rounded inputs"}
    for rel, med, mx in budget.values():
        assert 0 < med <= mx and rel < 1e-4
