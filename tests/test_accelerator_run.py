"""tools/accelerator_run.py: offline wheels, running chapters and tests, the report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools import accelerator_run as ar

# Checks the accelerator script's own logic: the same on every JAX release (conftest.py).
pytestmark = pytest.mark.one_env


def test_wheel_distribution_names():
    assert ar.wheel_distribution(Path("folx-0.2.30-py3-none-any.whl")) == "folx"
    assert (
        ar.wheel_distribution(
            Path("PyYAML-6.0.2-cp312-cp312-manylinux_2_17_x86_64.whl")
        )
        == "pyyaml"
    )
    assert (
        ar.wheel_distribution(
            Path("jax_cuda12_plugin-0.8.2-cp311-cp311-manylinux_2_27_x86_64.whl")
        )
        == "jax-cuda12-plugin"
    )
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
    assert sorted(got["skipped"]) == sorted(
        n for n in names if not n.startswith("surely")
    )
    (cmd,) = calls
    assert {"--no-index", "--no-deps", "--target"} <= set(cmd)
    assert cmd[-1].endswith("surely_not_installed_pkg-1.0-py3-none-any.whl")


def test_install_wheels_rejects_a_missing_or_empty_folder(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        ar.install_wheels(tmp_path / "nope", tmp_path / "site")
    with pytest.raises(ValueError, match="no .whl files"):
        ar.install_wheels(tmp_path, tmp_path / "site")


_DEMO = (
    "---\njupytext:\n  text_representation:\n    extension: .md\n    format_name: myst\n"
    "    format_version: 0.13\nkernelspec:\n  display_name: Python 3\n  language: python\n"
    "  name: python3\n---\n\n# demo\n\nThis raises ZeroDivisionError.\n\n"
    "```{code-cell} ipython3\n%load_ext beyondgrad.raises\nfrom beyondgrad import runtime\n"
    "runtime.describe()\n```\n\n"
    "```{code-cell} ipython3\n%%raises ZeroDivisionError\n1 / 0\n```\n\n"
    "This one names the wrong class, KeyError.\n\n"
    "```{code-cell} ipython3\n%%raises KeyError\n[][1]\n```\n\n"
    "```{code-cell} ipython3\nx = 1\n```\n"
)


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """The kernel spec and environment main() sets up, for running one chapter here."""
    ar.write_kernel_spec(tmp_path / "jupyter")
    env = ar.run_environment([], tmp_path / "jupyter")
    for key in ("PYTHONPATH", "JUPYTER_PATH", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.setenv(key, env[key])
    return env


@pytest.mark.timeout(300)
def test_chapter_run_checks_error_cells_with_the_books_parser(tmp_path, kernel_env):
    md = tmp_path / "99_demo.md"
    md.write_text(_DEMO)
    res = ar.run_chapter_nbclient(md, 300, tmp_path / "out")
    assert [(c.expected, c.raised) for c in res.error_cells] == [
        ("ZeroDivisionError", "ZeroDivisionError"),
        ("KeyError", "IndexError"),
    ]
    # The wrong class is not swallowed: the run stops there, as Run all would.
    assert "IndexError" in res.failure and res.ok is False
    assert res.platform in ("cpu", "gpu", "tpu")
    assert (tmp_path / "out" / "99_demo.ipynb").exists()


@pytest.mark.timeout(300)
def test_chapter_run_stops_at_an_untagged_error(tmp_path, kernel_env):
    md = tmp_path / "98_bad.md"
    md.write_text(
        _DEMO.split("# demo")[0]
        + "```{code-cell} ipython3\nraise ValueError('boom')\n```\n\n"
        "```{code-cell} ipython3\nx = 1\n```\n"
    )
    res = ar.run_chapter_nbclient(md, 300, tmp_path / "out")
    assert not res.ok and "CellExecutionError" in res.failure and "boom" in res.failure


def _fake_pytest(monkeypatch, *, returncode=0, junit: str | None = None, timeout=False):
    """Replace subprocess.run in run_tests: write ``junit`` (if any) and return ``returncode``."""

    def run(cmd, **kw):
        if timeout:
            raise subprocess.TimeoutExpired(
                cmd, kw.get("timeout"), output="collected 3 items\n"
            )
        if junit is not None:
            path = next(a for a in cmd if a.startswith("--junitxml=")).split("=", 1)[1]
            Path(path).write_text(junit)
        return subprocess.CompletedProcess(cmd, returncode, stdout="log\n", stderr="")

    monkeypatch.setattr(ar.subprocess, "run", run)


_JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_skip"><skipped message="x"/></testcase>
{extra}</testsuite></testsuites>"""


def test_tests_without_a_report_fail(tmp_path, monkeypatch):
    _fake_pytest(monkeypatch, returncode=-11, junit=None)  # pytest crashed (segfault)
    res = ar.run_tests({}, tmp_path, ["tests"], 60)
    assert res.ran and res.failures == ["pytest exited -11 without a report (crash)"]


def test_tests_that_time_out_fail(tmp_path, monkeypatch):
    (tmp_path / "pytest-junit.xml").write_text(
        _JUNIT.format(extra="")
    )  # left by an earlier run
    _fake_pytest(monkeypatch, timeout=True)
    res = ar.run_tests({}, tmp_path, ["tests"], 60)
    assert res.failures == ["pytest timed out after 60 s (no report)"]
    assert "collected 3 items" in res.note


def test_tests_report_is_read(tmp_path, monkeypatch):
    failing = '<testcase classname="tests.test_b" name="test_bad"><failure message="no"/></testcase>'
    _fake_pytest(monkeypatch, returncode=1, junit=_JUNIT.format(extra=failing))
    res = ar.run_tests({}, tmp_path, ["tests"], 60)
    assert (res.total, res.passed, res.skipped, res.failed) == (3, 1, 1, 1)
    assert res.failures == ["tests.test_b::test_bad"]


def test_tests_report_passing_is_a_pass(tmp_path, monkeypatch):
    _fake_pytest(monkeypatch, returncode=0, junit=_JUNIT.format(extra=""))
    res = ar.run_tests({}, tmp_path, ["tests"], 60)
    assert res.failures == [] and (res.total, res.passed) == (2, 1)


@pytest.mark.parametrize(
    "returncode, junit, failure",
    [
        (
            5,
            '<?xml version="1.0"?><testsuites><testsuite name="pytest"/></testsuites>',
            "pytest ran no tests (exit 5)",
        ),
        (
            3,
            _JUNIT.format(extra=""),
            "pytest exited 3 although every test in its report passed",
        ),
    ],
    ids=["empty-report", "internal-error"],
)
def test_tests_odd_reports_fail(tmp_path, monkeypatch, returncode, junit, failure):
    _fake_pytest(monkeypatch, returncode=returncode, junit=junit)
    assert ar.run_tests({}, tmp_path, ["tests"], 60).failures == [failure]


def _report(platform: str) -> dict:
    return {
        "date": "2026-11-22",
        "timestamp": "2026-11-22 03:00",
        "command": "python tools/accelerator_run.py",
        "environment": {
            "platform": platform,
            "backend": platform,
            "device_kind": "NVIDIA H100" if platform == "gpu" else "cpu",
            "device_count": 1,
            "jax": "0.12.0",
            "jaxlib": "0.12.0",
            "python": "3.12.1",
            "platform_version": "x",
            "packages": {"folx": "0.2.30", "jupytext": None},
        },
        "wheels": None,
        "chapters": [
            {
                "chapter": "01_tracers.md",
                "ok": False,
                "seconds": 3.25,
                "source": "chapters/01_tracers.md",
                "platform": platform,
                "device_count": 1,
                "error_cells": [
                    {"index": 3, "expected": "TypeError", "raised": "ValueError"}
                ],
                "failure": "",
            }
        ],
        "tests": {
            "ran": True,
            "seconds": 12.0,
            "total": 3,
            "passed": 2,
            "failed": 1,
            "errors": 0,
            "skipped": 0,
            "failures": ["tests.test_x::test_y"],
            "note": "",
        },
        "benchmark": {
            "ran": False,
            "ok": False,
            "seconds": 0.0,
            "command": "",
            "output": "",
            "note": "benchmarks/laplacian.py does not exist in this checkout",
        },
    }


def test_report_markdown_says_what_ran_where():
    gpu = ar.render_markdown(_report("gpu"))
    assert gpu.startswith("## GPU run, 1 × NVIDIA H100: 2026-11-22")
    assert (
        "| 01_tracers.md | FAIL | 3.2 | gpu, 1 | 0 of 1 raised the named class; "
        "cell 3: TypeError → ValueError ✗ |"
    ) in gpu
    assert (
        "2 passed, 1 failed, 0 errors, 0 skipped (3 in all)" in gpu
        and "`tests.test_x::test_y`" in gpu
    )
    assert "Not run: benchmarks/laplacian.py does not exist" in gpu
    assert "| not available | jupytext |" in gpu
    assert ar.render_markdown(_report("cpu")).startswith(
        "## CPU dry run (no accelerator): 2026-11-22"
    )


def test_refuses_to_run_on_cpu_without_allow_cpu(tmp_path):
    cmd = [
        sys.executable,
        str(ar.ROOT / "tools" / "accelerator_run.py"),
        "--out",
        str(tmp_path),
        "--skip-chapters",
        "--skip-tests",
        "--skip-benchmark",
    ]  # on an accelerator: a quick, empty run
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=ar.run_environment([], tmp_path),
    )
    if "(cpu)" not in out.stdout:
        pytest.skip("this machine has an accelerator")
    assert out.returncode == 2 and "--allow-cpu" in out.stderr
