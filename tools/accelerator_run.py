#!/usr/bin/env python3
"""Run the book on an accelerator and write the "Tested on" report.

On a machine with a GPU or TPU and a preinstalled JAX (Colab, a cloud VM, a cluster
node without internet access), from the repository root::

    python tools/accelerator_run.py --out accel-report

It

1. checks which devices JAX sees (it refuses to run on CPU unless ``--allow-cpu``),
   and which of the book's other packages are importable;
2. executes every chapter (``chapters/*.md``, read with jupytext) and every executable
   appendix (``appendix_*.md``) top to bottom in a fresh kernel of *this* interpreter
   (nbclient), with JAX's default
   backend left alone: the chapters' ``runtime.ensure_cpu_devices(8)`` adds CPU devices
   but keeps the accelerator as the default device, so their arrays live on it;
3. runs the test suite (``pytest tests``); the chapter tests reuse the notebooks just
   executed on the accelerator (they are written to the build folder's ``test_execute``).
   A test run that leaves no report (pytest crashed, or ran past ``--test-timeout``)
   is a failure;
4. runs the Laplacian benchmark (``benchmarks/laplacian.py --quick``; change the
   arguments with ``--benchmark-args``) if it exists;
5. writes ``report.md`` (paste it into ``tested_on.md``), ``report.json`` and the
   executed notebooks to ``--out``.

It never installs or upgrades JAX and never touches the network. Memory preallocation is
switched off (``XLA_PYTHON_CLIENT_PREALLOCATE=false``) because the test process and a
chapter kernel hold the GPU at the same time. The ``beyondgrad`` package is taken from
``src/`` through ``PYTHONPATH``; nothing is installed into the interpreter.

Packages the machine lacks (say folx or jupytext) come along as wheels. On a machine with
internet access and the same Python version::

    python -m pip download -d wheels folx matplotlib ipywidgets jupytext nbclient \\
        ipykernel pytest pytest-timeout pyyaml scipy

copy ``wheels/`` over, and pass ``--wheels wheels``: every wheel whose distribution is
not installed yet is installed with ``pip install --no-index --no-deps --target``
into ``--out``/site-packages, which goes on ``PYTHONPATH``. Wheels of JAX itself
(jax, jaxlib, jax-cuda*, libtpu, nvidia-*) and of anything already installed are
skipped, so the preinstalled JAX stays the one that runs. ``--check`` prints what is
missing (and the ``pip download`` line for it) without running anything.

jupytext, nbclient, nbformat and ipykernel are required (pure-Python wheels): without
them the script stops and prints the ``pip download`` line that fetches them. Cells
whose first line is ``%%raises ClassName`` must raise exactly that class (the magic
stops the run otherwise), checked by the same code as the book's tests
(``tools.execute.error_cells``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
BENCHMARK = ROOT / "benchmarks" / "laplacian.py"
#: import names this script cannot run chapters without (pure-Python wheels).
REQUIRED_TO_RUN = ("jupytext", "nbclient", "nbformat", "ipykernel")

#: import name -> distribution name, for the packages besides JAX that the book uses.
NEEDED = {
    "numpy": "numpy",
    "scipy": "scipy",
    "matplotlib": "matplotlib",
    "ipywidgets": "ipywidgets",
    "folx": "folx",
    "pytest": "pytest",
    "pytest_timeout": "pytest-timeout",
    "yaml": "pyyaml",
    "nbformat": "nbformat",
    "nbclient": "nbclient",
    "ipykernel": "ipykernel",
    "jupytext": "jupytext",
    "IPython": "ipython",
}
#: distributions never taken from --wheels: the machine's own JAX must be the one that runs.
NEVER_FROM_WHEELS = ("jax", "jaxlib", "libtpu", "libtpu-nightly")
NEVER_FROM_WHEELS_PREFIXES = ("jax-cuda", "jax-rocm", "jax-tpu", "nvidia-")


# --------------------------------------------------------------------------- environment


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar`` -> ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_distribution(path: Path) -> str:
    """The distribution name of a wheel file (``name-version-...-platform.whl``)."""
    if path.suffix != ".whl" or path.name.count("-") < 4:
        raise ValueError(
            f"{path.name} is not a wheel file (name-version-pyver-abi-platform.whl)"
        )
    return normalize(path.name.split("-", 1)[0])


def _installed(dist: str) -> bool:
    import importlib.metadata

    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def install_wheels(wheels: Path, target: Path) -> dict[str, list[str]]:
    """Install the wheels in ``wheels`` that this interpreter lacks into ``target``.

    Offline and without dependency resolution (``--no-index --no-deps``). Returns the
    file names installed and skipped (JAX's own wheels, and distributions already present).
    """
    if not wheels.is_dir():
        raise ValueError(
            f"--wheels {wheels} is not a directory; create it with `pip download -d DIR ...`"
        )
    files = sorted(wheels.glob("*.whl"))
    if not files:
        raise ValueError(f"--wheels {wheels} contains no .whl files")
    take, skipped = [], []
    for f in files:
        dist = wheel_distribution(f)
        if (
            dist in NEVER_FROM_WHEELS
            or dist.startswith(NEVER_FROM_WHEELS_PREFIXES)
            or _installed(dist)
        ):
            skipped.append(f.name)
        else:
            take.append(f)
    if take:
        target.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "--upgrade",
            "--target",
            str(target),
            *map(str, take),
        ]
        subprocess.run(cmd, check=True)
    return {"installed": [f.name for f in take], "skipped": skipped}


def run_environment(extra_path: list[Path], kernels: Path) -> dict[str, str]:
    """Environment for every child process: PYTHONPATH, no preallocation, the kernel spec."""
    env = dict(os.environ)
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("MPLBACKEND", "Agg")
    env["PYTHONPATH"] = os.pathsep.join(
        [
            str(ROOT / "src"),
            str(ROOT),
            *map(str, extra_path),
            *filter(None, [env.get("PYTHONPATH", "")]),
        ]
    )
    env["JUPYTER_PATH"] = os.pathsep.join(
        filter(None, [str(kernels), env.get("JUPYTER_PATH", "")])
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


KERNEL_NAME = "beyondgrad-accelerator"


def write_kernel_spec(kernels: Path) -> None:
    """A kernel spec that starts *this* interpreter (not whatever 'python3' points to)."""
    spec = kernels / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [
                    sys.executable,
                    "-m",
                    "ipykernel_launcher",
                    "-f",
                    "{connection_file}",
                ],
                "display_name": f"Python {platform.python_version()} (accelerator run)",
                "language": "python",
            },
            indent=1,
        )
    )


_PROBE = r"""
import importlib.util, importlib.metadata, json, platform, sys
needed = json.loads(sys.argv[1])
mods = {}
for mod, dist in needed.items():
    if importlib.util.find_spec(mod) is None:
        mods[mod] = None
    else:
        try:
            mods[mod] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            mods[mod] = "?"
import jax, jaxlib
devices = jax.devices()
backend = jax.default_backend()
info = {
    "platform": "gpu" if backend in ("gpu", "cuda", "rocm") else backend,
    "backend": backend,
    "device_kind": ", ".join(sorted({d.device_kind for d in devices})),
    "device_count": len(devices),
    "process_count": jax.process_count(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "python": platform.python_version(),
    "executable": sys.executable,
    "host": platform.node(),
    "packages": mods,
}
try:
    import jax.extend.backend
    info["platform_version"] = jax.extend.backend.get_backend().platform_version
except Exception as e:
    info["platform_version"] = f"unknown ({type(e).__name__})"
import shutil, subprocess
if shutil.which("nvidia-smi"):
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True)
    info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
try:
    import jax.numpy as jnp
    x = jnp.ones((256, 256))
    info["smoke"] = float((x @ x).sum())
    info["smoke_device"] = str(list(x.devices())[0])
except Exception as e:
    info["smoke"] = f"{type(e).__name__}: {e}"
print("PROBE" + json.dumps(info))
"""


def probe(env: dict[str, str]) -> dict:
    """Devices, versions and available packages, as a child process with ``env`` sees them."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(NEEDED)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    for line in out.stdout.splitlines():
        if line.startswith("PROBE"):
            return json.loads(line[5:])
    raise RuntimeError(
        f"could not start JAX in this interpreter:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )


def pip_download_line(missing: list[str]) -> str:
    dists = " ".join(NEEDED[m] for m in missing)
    return (
        f"python{sys.version_info.major}.{sys.version_info.minor} -m pip download -d wheels {dists}"
        "   # on a networked machine with the same Python; then --wheels wheels"
    )


# --------------------------------------------------------------------------- chapters


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


@dataclass
class ErrorCellResult:
    index: int
    expected: str | None
    raised: str | None

    @property
    def ok(self) -> bool:
        return self.expected is not None and self.raised == self.expected


@dataclass
class ChapterResult:
    chapter: str
    ok: bool
    seconds: float
    source: str  # the file executed
    platform: str | None = None  # what the chapter's own runtime.describe() reported
    device_count: int | None = None
    error_cells: list[ErrorCellResult] = field(default_factory=list)
    failure: str = ""


def default_sources() -> list[Path]:
    """Every chapter (``chapters/*.md``) and every executable appendix (``appendix_*.md``)."""
    appendices = [
        p for p in sorted(ROOT.glob("appendix_*.md")) if "code-cell" in p.read_text()
    ]
    return sorted(CHAPTERS.glob("*.md")) + appendices


def load_chapter(source: Path):
    """The chapter as an nbformat notebook, read from its MyST source by jupytext."""
    import jupytext

    return jupytext.read(source)


def _runtime_record(nb) -> dict | None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            rec = out.get("metadata", {}).get("beyondgrad_runtime")
            if rec:
                return dict(rec)
    return None


def _check_error_cells(nb) -> list[ErrorCellResult]:
    from tools.execute import error_cells  # the book's own convention checker

    return [ErrorCellResult(c.index, c.expected, c.raised) for c in error_cells(nb)]


def run_chapter_nbclient(source: Path, timeout: int, save: Path) -> ChapterResult:
    import nbformat
    from nbclient import NotebookClient

    from tools.execute import test_cache

    nb = load_chapter(source)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL_NAME,
        resources={"metadata": {"path": str(source.parent)}},
    )
    t0 = time.perf_counter()
    failure = ""
    try:
        client.execute()
    except (
        Exception
    ) as e:  # CellExecutionError, timeouts, dead kernels: report and go on
        failure = f"{type(e).__name__}: {str(e)[-1500:]}"
    seconds = time.perf_counter() - t0
    save.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, save / f"{source.stem}.ipynb")
    if not failure and source.parent == CHAPTERS:  # tests/test_chapters.py reuses it
        test_cache().mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, test_cache() / f"{source.stem}.ipynb")
    cells = _check_error_cells(nb)
    rec = _runtime_record(nb) or {}
    return ChapterResult(
        source.name,
        not failure and all(c.ok for c in cells),
        seconds,
        _rel(source),
        rec.get("platform"),
        rec.get("device_count"),
        cells,
        failure,
    )


# --------------------------------------------------------------------------- tests, benchmark


@dataclass
class TestResult:
    ran: bool
    seconds: float = 0.0
    total: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    note: str = ""


def run_tests(
    env: dict[str, str], out: Path, pytest_args: list[str], timeout: int
) -> TestResult:
    """Run pytest and read its JUnit report; no report (crash, timeout) is a failure."""
    junit = out / "pytest-junit.xml"
    junit.unlink(missing_ok=True)  # a report left by an earlier run must not count
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        *pytest_args,
    ]
    t0 = time.perf_counter()
    returncode: int | None
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        log, returncode = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out_text = (
            e.stdout.decode(errors="replace")
            if isinstance(e.stdout, bytes)
            else (e.stdout or "")
        )
        log, returncode = f"pytest timed out after {timeout} s\n{out_text}", None
    seconds = time.perf_counter() - t0
    (out / "pytest.log").write_text(log)
    if returncode is None:
        return TestResult(
            True,
            seconds,
            failures=[f"pytest timed out after {timeout} s (no report)"],
            note=f"pytest timed out after {timeout} s; last lines:\n{log[-1500:]}",
        )
    if not junit.exists():
        return TestResult(
            True,
            seconds,
            failures=[f"pytest exited {returncode} without a report (crash)"],
            note=f"pytest wrote no report; last lines:\n{log[-1500:]}",
        )
    return read_junit(junit, returncode, seconds)


def read_junit(junit: Path, returncode: int, seconds: float) -> TestResult:
    """Counts from a JUnit report; an empty report or a failing exit without failures fails."""
    res = TestResult(True, seconds)
    for case in ET.parse(junit).getroot().iter("testcase"):
        res.total += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            res.failed += 1
            res.failures.append(name)
        elif case.find("error") is not None:
            res.errors += 1
            res.failures.append(name + " (error)")
        elif case.find("skipped") is not None:
            res.skipped += 1
        else:
            res.passed += 1
    if res.total == 0:
        res.failures.append(f"pytest ran no tests (exit {returncode})")
    elif returncode != 0 and not res.failures:
        res.failures.append(
            f"pytest exited {returncode} although every test in its report passed"
        )
    return res


@dataclass
class BenchmarkResult:
    ran: bool
    ok: bool = False
    seconds: float = 0.0
    command: str = ""
    output: str = ""
    note: str = ""


def run_benchmark(
    env: dict[str, str], timeout: int, args: list[str]
) -> BenchmarkResult:
    if not BENCHMARK.exists():
        return BenchmarkResult(
            False, note=f"{BENCHMARK.relative_to(ROOT)} does not exist in this checkout"
        )
    cmd = [sys.executable, str(BENCHMARK.relative_to(ROOT)), *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
        ok, text = (
            proc.returncode == 0,
            proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr[-3000:],
        )
    except subprocess.TimeoutExpired as e:
        ok, text = False, f"timed out after {timeout} s\n{e.stdout or ''}"
    return BenchmarkResult(
        True, ok, time.perf_counter() - t0, "python " + " ".join(cmd[1:]), text.strip()
    )


# --------------------------------------------------------------------------- report


def _error_cells_summary(cells: list[dict]) -> str:
    """``"3 of 3 raised the named class"``, plus every cell that did not (expected → raised)."""
    if not cells:
        return "none"
    bad = [e for e in cells if e["expected"] is None or e["expected"] != e["raised"]]
    text = f"{len(cells) - len(bad)} of {len(cells)} raised the named class"
    if bad:
        text += "; " + "; ".join(
            f"cell {e['index']}: {e['expected']} → {e['raised']} ✗" for e in bad
        )
    return text


def render_markdown(report: dict) -> str:
    """The report as Markdown for ``tested_on.md`` (section headings start at ``##``)."""
    env, when = report["environment"], report["date"]
    kind = f"{env['device_count']} × {env['device_kind']}"
    title = (
        f"CPU dry run (no accelerator): {when}"
        if env["platform"] == "cpu"
        else f"{env['platform'].upper()} run, {kind}: {when}"
    )
    lines = [
        f"## {title}",
        "",
        "| | |",
        "|---|---|",
        f"| date (UTC) | {report['timestamp']} |",
        f"| JAX default backend | {env['platform']} ({env['backend']}) |",
        f"| devices | {kind} |",
        f"| JAX / jaxlib | {env['jax']} / {env['jaxlib']} |",
        f"| backend platform version | {env.get('platform_version', 'unknown')} |",
        f"| Python | {env['python']} |",
        f"| command | `{report['command']}` |",
    ]
    if env.get("nvidia_smi"):
        lines.append(f"| nvidia-smi | {'; '.join(env['nvidia_smi'].splitlines())} |")
    pk = ", ".join(f"{m} {v}" for m, v in env["packages"].items() if v)
    missing = [m for m, v in env["packages"].items() if not v]
    lines.append(f"| other packages | {pk} |")
    if missing:
        lines.append(f"| not available | {', '.join(missing)} |")
    if report.get("wheels"):
        lines.append(
            f"| from --wheels | {', '.join(report['wheels']['installed']) or 'none needed'} |"
        )
    lines += ["", "### Chapters", ""]
    chapters = report["chapters"]
    if not chapters:
        lines.append("Not run (`--skip-chapters`).")
    else:
        lines += [
            "| chapter | result | time (s) | chapter's platform, devices | error cells |",
            "|---|---|---:|---|---|",
        ]
        for c in chapters:
            cells = _error_cells_summary(c["error_cells"])
            where = (
                f"{c['platform']}, {c['device_count']}"
                if c["platform"]
                else "not reported"
            )
            lines.append(
                f"| {c['chapter']} | {'pass' if c['ok'] else 'FAIL'} | {c['seconds']:.1f} | "
                f"{where} | {cells} |"
            )
        for c in chapters:
            if c["failure"]:
                lines += [
                    "",
                    f"{c['chapter']} failed:",
                    "",
                    "```text",
                    c["failure"].strip()[-1500:],
                    "```",
                ]
    lines += ["", "### Test suite", ""]
    t = report["tests"]
    if not t["ran"]:
        lines.append(t["note"] or "Not run (`--skip-tests`).")
    else:
        lines.append(
            f"`pytest {report.get('pytest_args', 'tests')}`: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
            f"{t['skipped']} skipped ({t['total']} in all) in {t['seconds']:.0f} s."
        )
        if t["failures"]:
            lines += ["", "Not passing:", ""] + [f"- `{f}`" for f in t["failures"]]
        if t["note"]:
            lines += ["", "```text", t["note"].strip()[-1500:], "```"]
    lines += ["", "### Laplacian benchmark", ""]
    b = report["benchmark"]
    if not b["ran"]:
        lines.append(f"Not run: {b['note']}.")
    else:
        lines += [
            f"`{b['command']}` ({'ok' if b['ok'] else 'FAILED'}, {b['seconds']:.0f} s):",
            "",
            "```text",
            b["output"],
            "```",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="See the module docstring (or the book's 'Tested on' page) for details.",
    )
    ap.add_argument(
        "chapters",
        nargs="*",
        help="chapter sources to execute (default: chapters/*.md, appendix_*.md)",
    )
    ap.add_argument(
        "--out",
        default="accelerator-report",
        help="output folder (default: accelerator-report)",
    )
    ap.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run even if JAX finds no GPU/TPU (a dry run)",
    )
    ap.add_argument(
        "--wheels",
        help="folder of wheels for packages this machine lacks (installed offline)",
    )
    ap.add_argument(
        "--check", action="store_true", help="only report devices and missing packages"
    )
    ap.add_argument("--skip-chapters", action="store_true")
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-benchmark", action="store_true")
    ap.add_argument(
        "--chapter-timeout",
        type=int,
        default=1200,
        help="seconds per chapter (default 1200)",
    )
    ap.add_argument(
        "--test-timeout",
        type=int,
        default=3600,
        help="seconds for the test suite (default 3600)",
    )
    ap.add_argument(
        "--pytest-args", default="tests", help="arguments for pytest (default: 'tests')"
    )
    ap.add_argument(
        "--benchmark-args",
        default="--quick",
        help="arguments for benchmarks/laplacian.py (default: '--quick'; '' for the full sizes)",
    )
    ns = ap.parse_args(argv)

    out = Path(ns.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extra: list[Path] = []
    wheels = None
    if ns.wheels:
        wheels = install_wheels(Path(ns.wheels).resolve(), out / "site-packages")
        extra.append(out / "site-packages")
        print(
            f"[accel] wheels installed: {wheels['installed'] or 'none'}; skipped: {len(wheels['skipped'])}"
        )
    write_kernel_spec(out / "jupyter")
    env = run_environment(extra, out / "jupyter")
    os.environ.update(
        {
            k: env[k]
            for k in (
                "XLA_PYTHON_CLIENT_PREALLOCATE",
                "MPLBACKEND",
                "PYTHONPATH",
                "JUPYTER_PATH",
                "PYTHONUNBUFFERED",
            )
        }
    )  # kernels inherit this
    for p in reversed([ROOT / "src", ROOT, *extra]):
        sys.path.insert(0, str(p))

    info = probe(env)
    missing = [m for m, v in info["packages"].items() if not v]
    print(
        f"[accel] JAX {info['jax']} (jaxlib {info['jaxlib']}), Python {info['python']}: "
        f"{info['device_count']} x {info['device_kind']} ({info['platform']}); smoke test on {info.get('smoke_device')}"
    )
    if missing:
        print(
            f"[accel] missing packages: {', '.join(missing)}\n        {pip_download_line(missing)}"
        )
    if ns.check:
        return 0
    if info["platform"] == "cpu" and not ns.allow_cpu:
        print(
            "[accel] JAX found no GPU or TPU here (default backend: cpu). Install JAX for the accelerator, "
            "or pass --allow-cpu for a dry run on CPU.",
            file=sys.stderr,
        )
        return 2

    lacking = [m for m in REQUIRED_TO_RUN if m in missing]
    if lacking:
        print(
            f"[accel] {', '.join(lacking)} missing: the chapters run in a Jupyter kernel (nbclient) "
            f"and are read with jupytext. Fetch them with\n        {pip_download_line(lacking)}",
            file=sys.stderr,
        )
        return 2
    sources = [Path(p).resolve() for p in ns.chapters] or default_sources()
    chapters: list[ChapterResult] = []
    if not ns.skip_chapters:
        for source in sources:
            print(f"[accel] executing {source.name} ...", flush=True)
            res = run_chapter_nbclient(source, ns.chapter_timeout, out / "executed")
            chapters.append(res)
            print(
                f"[accel]   {'pass' if res.ok else 'FAIL'} in {res.seconds:.1f} s on {res.platform}"
                + (f": {res.failure[:300]}" if res.failure else ""),
                flush=True,
            )
    if ns.skip_tests:
        tests = TestResult(False, note="Not run (`--skip-tests`).")
    else:
        print("[accel] running the test suite ...", flush=True)
        tests = run_tests(env, out, shlex.split(ns.pytest_args), ns.test_timeout)
        print(
            f"[accel]   {tests.passed} passed, {tests.failed} failed, {tests.errors} errors, "
            f"{tests.skipped} skipped in {tests.seconds:.0f} s",
            flush=True,
        )
    if ns.skip_benchmark:
        bench = BenchmarkResult(False, note="`--skip-benchmark` was given")
    else:
        print("[accel] running the Laplacian benchmark ...", flush=True)
        bench = run_benchmark(env, ns.chapter_timeout, shlex.split(ns.benchmark_args))
    now = _dt.datetime.now(_dt.UTC)
    report = {
        "date": now.date().isoformat(),
        "timestamp": now.strftime("%Y-%m-%d %H:%M"),
        "command": "python tools/accelerator_run.py "
        + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "environment": info,
        "wheels": wheels,
        "chapters": [asdict(c) for c in chapters],
        "tests": asdict(tests),
        "pytest_args": ns.pytest_args,
        "benchmark": asdict(bench),
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    print(f"[accel] wrote {out / 'report.md'} and {out / 'report.json'}")
    ok = (
        all(c.ok for c in chapters)
        and not tests.failures
        and (not bench.ran or bench.ok)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
