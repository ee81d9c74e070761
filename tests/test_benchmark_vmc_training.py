"""The VMC training benchmark's machinery on a tiny run, and the committed record
(timings are recorded, never asserted)."""

import importlib.util
import json
from pathlib import Path

import jax
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_vmc_training", ROOT / "benchmarks" / "vmc_training.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KEYS = {"command", "machine", "jax", "date", "duration_s", "note", "settings"}
KEYS |= {"train_seconds", "exact_energy", "final", "curve"}


def test_benchmark_run_and_record(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "RECORD", tmp_path / "vmc_training.json")
    argv = ["--steps", "20", "--walkers", "16", "--devices", "8", "--last", "20"]
    bench.main(argv + ["--record"])
    record = json.loads((tmp_path / "vmc_training.json").read_text())
    assert set(record) == KEYS
    assert record["jax"] == jax.__version__
    assert record["command"].endswith("--record")
    curve = record["curve"]
    assert set(curve) == {"energy", "variance", "acceptance", "width", "dropped"}
    assert all(len(v) == 20 for v in curve.values())
    f = record["final"]
    # the summary is the blocked mean of the curve's last 20 energies, by hand
    means = np.asarray(curve["energy"]).reshape(10, 2).mean(1)
    assert f["energy"] == pytest.approx(means.mean(), rel=1e-14)
    assert f["error"] == pytest.approx(means.std(ddof=1) / np.sqrt(10), rel=1e-12)
    assert f["bias_bound"] == pytest.approx(np.mean(curve["variance"]) / 0.5)
    assert "E = " in capsys.readouterr().out


def test_committed_record_reaches_the_exact_energy():
    """The committed full run: within 4 blocked errors plus the bias bound of E = 2,
    its variance down by more than 1e4, on the settings the script states."""
    record = json.loads((ROOT / "records" / "vmc_training.json").read_text())
    assert set(record) == KEYS
    f, s = record["final"], record["settings"]
    assert record["exact_energy"] == 2.0 and s["steps"] >= 200
    assert len(record["curve"]["energy"]) == s["steps"]
    assert record["curve"]["energy"][0] > 2.1
    assert abs(f["energy"] - 2.0) < 4 * f["error"] + f["bias_bound"]
    assert f["error"] < 1e-3
    assert f["variance_last"] < 1e-4 * f["variance_first"]
