"""tools/accelerator_run.py: chapter parsing, offline wheels, plain-script mode, the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jupytext
import pytest

from tools import accelerator_run as ar

SOURCES = ar.default_sources()


@pytest.mark.parametrize("source", SOURCES, ids=[s.stem for s in SOURCES])
def test_own_myst_reader_matches_jupytext(source):
    # the plain-script mode must see exactly the cells (and tags) the book executes
    want = [{"source": c.source, "tags": list(c.metadata.get("tags", []))}
            for c in jupytext.read(source).cells if c.cell_type == "code"]
    assert ar.notebook_cells(source) == want


def test_myst_reader_handles_both_option_styles(tmp_path):
    md = tmp_path / "x.md"
    md.write_text(
        "# t\n\n```{code-cell} ipython3\n:tags: [hide-input, raises-exception]\n\n1 / 0\n```\n\n"
        "```{code-cell} ipython3\n---\nmystnb:\n  figure:\n    caption: c\ntags:\n- remove-cell\n---\nx = 1\n```\n"
        "\n```{code-cell} ipython3\ny = 2\n```\n"
    )
    assert ar.notebook_cells(md) == [
        {"source": "1 / 0", "tags": ["hide-input", "raises-exception"]},
        {"source": "x = 1", "tags": ["remove-cell"]},
        {"source": "y = 2", "tags": []},
    ]


def test_wheel_distribution_names():
    assert ar.wheel_distribution(Path("folx-0.2.30-py3-none-any.whl")) == "folx"
    assert ar.wheel_distribution(Path("PyYAML-6.0.2-cp312-cp312-manylinux_2_17_x86_64.whl")) == "pyyaml"
    assert ar.wheel_distribution(Path("jax_cuda12_plugin-0.8.2-cp311-cp311-manylinux_2_27_x86_64.whl")) == "jax-cuda12-plugin"
    with pytest.raises(ValueError, match="not a wheel"):
        ar.wheel_distribution(Path("folx-0.2.30.tar.gz"))


def test_install_wheels_never_takes_jax_or_installed_packages(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    names = [
        "jax-0.12.0-py3-none-any.whl",
        "jaxlib-0.12.0-cp312-cp312-manylinux2014_x86_64.whl",
        "jax_cuda12_plugin-0.12.0-cp312-cp312-manylinux2014_x86_64.whl",
        "nvidia_cublas_cu12-12.9.1-py3-none-manylinux_2_27_x86_64.whl",
        "libtpu-0.0.20-py3-none-any.whl",
        "numpy-1.0.0-cp312-cp312-manylinux2014_x86_64.whl",  # installed here already
        "surely_not_installed_pkg-1.0-py3-none-any.whl",
    ]
    for n in names:
        (wheels / n).write_bytes(b"")
    calls = []
    monkeypatch.setattr(ar.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    got = ar.install_wheels(wheels, tmp_path / "site")
    assert got["installed"] == ["surely_not_installed_pkg-1.0-py3-none-any.whl"]
    assert sorted(got["skipped"]) == sorted(n for n in names if not n.startswith("surely"))
    (cmd,) = calls
    assert {"--no-index", "--no-deps", "--target"} <= set(cmd)
    assert cmd[-1].endswith("surely_not_installed_pkg-1.0-py3-none-any.whl")


def test_install_wheels_rejects_a_missing_or_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        ar.install_wheels(tmp_path / "nope", tmp_path / "site")
    with pytest.raises(ValueError, match="no .whl files"):
        ar.install_wheels(tmp_path, tmp_path / "site")


def test_plain_script_mode_checks_error_cells(tmp_path):
    md = tmp_path / "99_demo.md"
    md.write_text(
        "# demo\n\nThis raises ZeroDivisionError.\n\n"
        "```{code-cell} ipython3\n:tags: [raises-exception]\n\n# raises ZeroDivisionError\n1 / 0\n```\n\n"
        "This one names the wrong class, KeyError.\n\n"
        "```{code-cell} ipython3\n:tags: [raises-exception]\n\n# raises KeyError\n[][1]\n```\n\n"
        "```{code-cell} ipython3\nfrom beyondgrad import runtime\nruntime.describe()\n```\n"
    )
    env = ar.run_environment([], tmp_path / "jupyter")
    res = ar.run_chapter_script(md, 300, tmp_path / "out", env)
    assert [(c.expected, c.raised) for c in res.error_cells] == [("ZeroDivisionError", "ZeroDivisionError"),
                                                                 ("KeyError", "IndexError")]
    assert res.failure == "" and res.ok is False  # all cells ran; one error cell raised the wrong class
    assert res.platform in ("cpu", "gpu", "tpu")


def test_plain_script_mode_stops_at_an_untagged_error(tmp_path):
    md = tmp_path / "98_bad.md"
    md.write_text("```{code-cell} ipython3\nraise ValueError('boom')\n```\n\n```{code-cell} ipython3\nx = 1\n```\n")
    res = ar.run_chapter_script(md, 300, tmp_path / "out", ar.run_environment([], tmp_path / "jupyter"))
    assert not res.ok and "code cell 0 raised ValueError" in res.failure


def _report(platform: str) -> dict:
    return {
        "date": "2026-11-22", "timestamp": "2026-11-22 03:00", "command": "python tools/accelerator_run.py",
        "environment": {"platform": platform, "backend": platform, "device_kind": "NVIDIA H100" if platform == "gpu"
                        else "cpu", "device_count": 1, "jax": "0.12.0", "jaxlib": "0.12.0", "python": "3.12.1",
                        "platform_version": "x", "packages": {"folx": "0.2.30", "jupytext": None}},
        "wheels": None,
        "chapters": [{"chapter": "01_tracers.md", "ok": False, "seconds": 3.25, "mode": "nbclient",
                      "source": "chapters/01_tracers.md", "platform": platform, "device_count": 1,
                      "error_cells": [{"index": 3, "expected": "TypeError", "raised": "ValueError"}], "failure": ""}],
        "tests": {"ran": True, "seconds": 12.0, "total": 3, "passed": 2, "failed": 1, "errors": 0, "skipped": 0,
                  "failures": ["tests.test_x::test_y"], "note": ""},
        "benchmark": {"ran": False, "ok": False, "seconds": 0.0, "command": "", "output": "",
                      "note": "benchmarks/laplacian.py does not exist in this checkout"},
    }


def test_report_markdown_says_what_ran_where():
    gpu = ar.render_markdown(_report("gpu"))
    assert gpu.startswith("## GPU run, 1 × NVIDIA H100: 2026-11-22")
    assert ("| 01_tracers.md | FAIL | 3.2 | nbclient | gpu, 1 | 0 of 1 raised the named class; "
            "cell 3: TypeError → ValueError ✗ |") in gpu
    assert "2 passed, 1 failed, 0 errors, 0 skipped (3 in all)" in gpu and "`tests.test_x::test_y`" in gpu
    assert "Not run: benchmarks/laplacian.py does not exist" in gpu
    assert "| not available | jupytext |" in gpu
    assert ar.render_markdown(_report("cpu")).startswith("## CPU dry run (no accelerator): 2026-11-22")


def test_refuses_to_run_on_cpu_without_allow_cpu(tmp_path):
    cmd = [sys.executable, str(ar.ROOT / "tools" / "accelerator_run.py"), "--out", str(tmp_path),
           "--skip-chapters", "--skip-tests", "--skip-benchmark"]  # on an accelerator: a quick, empty run
    out = subprocess.run(cmd,
                         capture_output=True, text=True, timeout=300, env=ar.run_environment([], tmp_path))
    if "(cpu)" not in out.stdout:
        pytest.skip("this machine has an accelerator")
    assert out.returncode == 2 and "--allow-cpu" in out.stderr
