"""The version matrix: every notebook, Run all, under every minor JAX release supported.

    python3 dev.py matrix                   # every point of MATRIX, 2 notebooks at a time
    python3 dev.py matrix --points 0.10.2@3.11 0.12.0.1@3.12 --jobs 1
    python3 dev.py matrix --list            # the points, and which Pythons are found
    python3 dev.py matrix --notebooks 06_ --checkers "6_1 or 6_2"   # a partial rerun

For each point (a JAX version on a Python version) it installs an environment with
``dev.py --jax VERSION`` (uv.lock's toolchain, jax and jaxlib at that version; the
floor point uses ``--jax floor``: every direct dependency at its lower bound), then runs
*Run all* with Colab's semantics (:func:`tools.execute.run_all`: a fresh kernel, every
cell in order, the first error stops the notebook) on every self-study notebook
(``chapters/*.ipynb``: its solution cells call each checker on the book's own solution
with ``strict=True``, so a rejected solution stops it) and every student notebook. Then,
where the test file exists, the checker draws (``tests/test_exercises_draws.py``:
each checker on its own solution over ``--draws`` drawn cases).

The result goes to ``records/matrix.json`` (one entry per point and notebook: reached
the last cell, or the first failing cell and its error) and into the table on the
"Tested on" page (``tested_on.md``, between the ``matrix`` markers), with the date and
the commit it ran on. ``tests/test_matrix.py`` checks that the table is the record's.

A partial rerun (``--notebooks``: the notebooks whose path contains one of the given
strings; ``--checkers``: a pytest ``-k`` expression over the checker draws) replaces only
those entries of each point run; each replaced entry names its own date and commit, shown
with a mark on the page. ``--list`` also prints, per point, the notebooks whose code
cells changed since the commit their entry ran on, and whether ``src/`` changed since:
what a partial rerun has left stale.

Standard library only in this process; the notebooks run in each point's environment.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "records" / "matrix.json"
PAGE = ROOT / "tested_on.md"
START, END = "<!-- matrix:start -->", "<!-- matrix:end -->"


@dataclass(frozen=True)
class Point:
    """One point of the matrix: a JAX release (or ``floor``) on a Python version."""

    jax: str  # "floor" or "X.Y.Z"
    python: str  # "3.11", "3.12"
    why: str

    @property
    def name(self) -> str:
        return f"{self.jax}@{self.python}"

    @property
    def venv(self) -> Path:
        return ROOT / f".venv-matrix-{self.jax}-py{self.python}"


#: The supported range, one point per minor release (its latest patch), plus the lock's
#: resolution on both Pythons. Python 3.11 stops at JAX 0.10.x (jax 0.11 needs 3.12).
#: When JAX releases a new minor version, add its latest patch here.
MATRIX: tuple[Point, ...] = (
    Point(
        "floor", "3.11", "the supported floor (0.8.2), every dependency at its floor"
    ),
    Point("0.9.2", "3.12", "the latest 0.9.x"),
    Point("0.10.2", "3.11", "uv.lock's JAX on Python 3.11 (what a 3.11 newcomer gets)"),
    Point("0.10.2", "3.12", "the latest 0.10.x on Colab's Python"),
    Point("0.11.2", "3.12", "the latest 0.11.x"),
    Point("0.12.0.1", "3.12", "the newest release (uv.lock's JAX on Python 3.12)"),
)


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` ("3.12"): pyenv's, else ``pythonX.Y`` on PATH."""
    if shutil.which("pyenv"):
        out = subprocess.run(
            ["pyenv", "versions", "--bare"], capture_output=True, text=True
        ).stdout.split()
        for full in sorted(
            (v for v in out if v.startswith(version + ".")),
            key=lambda v: [int(x) for x in v.split(".") if x.isdigit()],
            reverse=True,
        ):
            found = subprocess.run(
                ["pyenv", "which", "python3"],
                capture_output=True,
                text=True,
                env={**os.environ, "PYENV_VERSION": full},
            ).stdout.strip()
            if found:
                return found
    return shutil.which(f"python{version}")


def notebooks() -> list[Path]:
    """Every self-study and student notebook, in chapter order."""
    own = sorted((ROOT / "chapters").glob("*.ipynb"))
    student = sorted((ROOT / "notebooks" / "student").glob("*.ipynb"))
    return [*own, *student]


def setup(point: Point) -> Path:
    """Install the point's environment with dev.py (reused when nothing changed)."""
    python = find_python(point.python)
    if python is None:
        raise SystemExit(f"[matrix] no Python {point.python} found (pyenv or PATH)")
    cmd = [python, str(ROOT / "dev.py"), "--venv", str(point.venv)]
    cmd += ["--jax", point.jax, "setup"]
    subprocess.run(cmd, check=True, cwd=ROOT)
    return point.venv / "bin" / "python"


#: Runs inside the point's environment: one notebook, Run all, a JSON line out.
_WORKER = r"""
import json, sys, time, traceback
from pathlib import Path
from tools.execute import RunAllStopped, run_all
path = Path(sys.argv[1])
t0 = time.perf_counter()
try:
    run_all(path, timeout=int(sys.argv[2]))
    status, error = "ok", ""
except RunAllStopped as e:
    status, error = "stopped", str(e)
except Exception as e:
    status, error = "error", f"{type(e).__name__}: {e}"[-1500:]
print("MATRIX-RESULT " + json.dumps({"status": status, "error": error,
      "seconds": round(time.perf_counter() - t0, 1)}))
"""

_VERSIONS = (
    "import importlib.metadata as m, platform, json\n"
    "print(json.dumps({n: m.version(n) for n in ('jax', 'jaxlib', 'numpy', 'folx')}"
    " | {'python': platform.python_version()}))"
)


def _env(point: Point) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["BEYONDGRAD_JAX"] = point.jax
    env.pop("CI", None)  # a notebook run as a reader runs it
    return env


def run_notebook(py: Path, point: Point, path: Path, timeout: int) -> dict:
    """Run all on one notebook in the point's environment; its result entry."""
    out = subprocess.run(
        [str(py), "-c", _WORKER, str(path), str(timeout)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(point),
    )
    for line in out.stdout.splitlines():
        if line.startswith("MATRIX-RESULT "):
            entry = json.loads(line.removeprefix("MATRIX-RESULT "))
            break
    else:
        entry = {
            "status": "error",
            "error": (out.stderr or out.stdout)[-1500:],
            "seconds": None,
        }
    entry["notebook"] = path.relative_to(ROOT).as_posix()
    return entry


def checker_draws(
    py: Path, point: Point, draws: int, select: str | None = None
) -> dict | None:
    """Each checker on the book's own solution over ``draws`` drawn cases, if the test
    file exists: its pytest summary line. ``select``: a ``-k`` expression (those only)."""
    test = ROOT / "tests" / "test_exercises_draws.py"
    if not test.exists() or draws <= 0:
        return None
    env = {**_env(point), "BEYONDGRAD_CHECKER_DRAWS": str(draws)}
    t0 = time.perf_counter()
    only = ["-k", select] if select else []
    out = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), *only],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    tail = [ln for ln in out.stdout.splitlines() if ln.strip()][-1:]
    return {
        "draws": draws,
        **({"select": select} if select else {}),
        "returncode": out.returncode,
        "summary": tail[0] if tail else out.stderr[-500:],
        "seconds": round(time.perf_counter() - t0, 1),
    }


def selected(patterns: list[str] | None) -> list[Path]:
    """The notebooks whose repository path contains one of ``patterns`` (all: None)."""
    every = notebooks()
    if patterns is None:
        return every
    chosen = [
        nb
        for nb in every
        if any(s in nb.relative_to(ROOT).as_posix() for s in patterns)
    ]
    if not chosen:
        raise SystemExit(f"[matrix] no notebook path contains any of {patterns}")
    return chosen


def run_point(
    point: Point,
    jobs: int,
    timeout: int,
    draws: int,
    only: list[str] | None = None,
    checkers: str | None = None,
) -> dict:
    """Run the point: every notebook and every checker's draws, or (a partial rerun,
    ``only``/``checkers`` given) those selected, merged into the point's earlier entry."""
    partial = only is not None or checkers is not None
    print(f"[matrix] {point.name}: environment", flush=True)
    py = setup(point)
    versions = json.loads(
        subprocess.run(
            [str(py), "-c", _VERSIONS], capture_output=True, text=True, check=True
        ).stdout
    )
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        chosen = selected(only) if (only is not None or not partial) else []
        futures = [pool.submit(run_notebook, py, point, nb, timeout) for nb in chosen]
        for f in futures:
            entry = f.result()
            print(
                f"[matrix] {point.name} {entry['notebook']}: {entry['status']} "
                f"({entry['seconds']} s) {entry['error'][:200]}",
                flush=True,
            )
            results.append(entry)
    draw = (
        checker_draws(py, point, draws, checkers)
        if (checkers is not None or not partial)
        else None
    )
    if draw is not None:
        print(f"[matrix] {point.name} checker draws: {draw['summary']}", flush=True)
    if partial:
        return merge(point, versions, results, draw)
    return {
        "point": point.name,
        "date": _dt.date.today().isoformat(),
        "commit": git_commit(),
        "why": point.why,
        "versions": versions,
        "notebooks": results,
        "checker_draws": draw,
    }


def merge(point: Point, versions: dict, results: list[dict], draw: dict | None) -> dict:
    """The point's earlier entry with ``results`` and ``draw`` (a partial rerun) in
    place of the entries they rerun; each carries its own date and commit."""
    kept = json.loads(RECORD.read_text())["points"] if RECORD.exists() else []
    old = next((p for p in kept if p["point"] == point.name), None)
    if old is None:
        raise SystemExit(f"[matrix] {point.name} has no full run to rerun parts of")
    if versions != old["versions"]:
        raise SystemExit(
            f"[matrix] {point.name}'s environment changed since its full run "
            f"({old['versions']} -> {versions}): run the whole point"
        )
    stamp = {"date": _dt.date.today().isoformat(), "commit": git_commit()}
    new = {e["notebook"]: {**e, **stamp} for e in results}
    entry = dict(old)
    # a notebook the full run did not have (a chapter added since) joins the point
    merged = {e["notebook"]: e for e in old["notebooks"]} | new
    order = [n.relative_to(ROOT).as_posix() for n in notebooks()]
    entry["notebooks"] = sorted(
        merged.values(),
        key=lambda e: (
            order.index(e["notebook"]) if e["notebook"] in order else len(order)
        ),
    )
    if draw is not None:
        entry["checker_reruns"] = [
            r
            for r in old.get("checker_reruns", [])
            if r.get("select") != draw.get("select")
        ] + [{**draw, **stamp}]
    return entry


def stale(record: dict) -> list[str]:
    """Per point: the notebooks whose code cells differ from those at the commit their
    entry ran on, and a line when ``src/`` changed since such a commit (a Python file
    whose code is the same without comments and docstrings does not count)."""
    out = []
    for p in record["points"]:
        commits = {}
        for e in p["notebooks"]:
            c = e.get("commit", p["commit"]).split()[0]
            if _code_cells(e["notebook"], c) != _code_cells(e["notebook"], None):
                out.append(f"{p['point']}: {e['notebook']} changed since {c}")
            commits[c] = True
        for c in commits:
            changed = subprocess.run(
                ["git", "diff", "--name-only", c, "--", "src"],
                capture_output=True,
                text=True,
                cwd=ROOT,
            ).stdout.split()
            changed = [f for f in changed if not _same_code(f, c)]
            if changed:
                out.append(f"{p['point']}: src/ changed since {c}: {' '.join(changed)}")
    return out


def _same_code(path: str, commit: str) -> bool:
    """Whether the Python file ``path`` has the same code (syntax tree without comments
    and docstrings) now as at ``commit``; False for other files and for a file that is
    new or gone."""
    from tools.draws import _code

    now = ROOT / path
    if not path.endswith(".py") or not now.exists():
        return False
    got = subprocess.run(
        ["git", "show", f"{commit}:{path}"], capture_output=True, text=True, cwd=ROOT
    )
    return got.returncode == 0 and _code(got.stdout) == _code(now.read_text())


def _code_cells(notebook: str, commit: str | None) -> list[str] | None:
    if commit is None:
        path = ROOT / notebook
        text = path.read_text(encoding="utf-8") if path.exists() else None
    else:
        got = subprocess.run(
            ["git", "show", f"{commit}:{notebook}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        text = got.stdout if got.returncode == 0 else None
    if text is None:
        return None
    cells = json.loads(text)["cells"]
    return [
        c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code"
    ]


def git_commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "chapters", "notebooks", "src"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def _cell(entry: dict, commit: str | None = None) -> str:
    """One notebook's cell; marked when it ran on another commit than its point."""
    mark = " †" if entry.get("commit", commit) != commit else ""
    if entry["status"] == "ok":
        return f"✓ {entry['seconds']:.0f} s{mark}"
    first = entry["error"].splitlines()[0] if entry["error"] else entry["status"]
    # "X.ipynb: Run all stopped at cell 41 (code cell 20 of 60) with Name: message"
    if "Run all stopped at" in first:
        first = first.split("Run all stopped at ", 1)[1]
    first = first.replace("|", "\\|")
    return f"✗ {first[:160]}{mark}"


def _counts(summary: str) -> str:
    """pytest's summary line without what does not fit a table cell: the tests
    deselected and the time ('2 passed, 13 deselected in 62.82s' -> '2 passed')."""
    kept = [
        part.strip()
        for part in summary.split(" in ")[0].split(",")
        if "deselected" not in part
    ]
    return ", ".join(kept) or summary


def render(record: dict) -> str:
    """The Markdown table of the Tested-on page, from the record."""
    points = record["points"]
    head = ["notebook"] + [
        f"JAX {p['versions']['jax']}, Python {p['versions']['python'][:4]}"
        for p in points
    ]
    rows = [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    names = [e["notebook"] for e in points[0]["notebooks"]] if points else []
    for name in names:
        cells = []
        for p in points:
            entry = next((e for e in p["notebooks"] if e["notebook"] == name), None)
            cells.append(
                "not run"
                if entry is None
                else _cell(entry, p.get("commit", record["commit"]))
            )
        rows.append(f"| `{name}` | " + " | ".join(cells) + " |")
    draws = [p.get("checker_draws") for p in points]
    if any(draws):
        cells = [
            "not run"
            if d is None
            else f"{'✓' if d['returncode'] == 0 else '✗'} {d['draws']} draws: "
            f"{d['summary']}"
            for d in draws
        ]
        rows.append(
            "| checkers on their own solutions, drawn cases per checker | "
            + " | ".join(cells)
            + " |"
        )
    # the reruns' selections are long: the table says how many and whether they
    # passed, the list under it what each one was (a table cell of them scrolled
    # sideways at 1280 px)
    rerun_lines: list[str] = []
    if any(p.get("checker_reruns") for p in points):
        cells = []
        for p in points:
            done = p.get("checker_reruns", [])
            ok = all(r["returncode"] == 0 for r in done)
            cells.append(f"{'✓' if ok else '✗'} {len(done)} †" if done else "–")
            if done:
                rerun_lines.append(
                    f"- {p['point']}: "
                    + "; ".join(
                        f"{'✓' if r['returncode'] == 0 else '✗'} `-k {r['select']}`, "
                        f"{r['draws']} draws: {_counts(r['summary'])} †"
                        for r in done
                    )
                )
        rows.append("| checkers rerun after a change | " + " | ".join(cells) + " |")
    reruns = sorted(
        {
            (e["date"], e["commit"])
            for p in points
            for e in [*p["notebooks"], *p.get("checker_reruns", [])]
            if "commit" in e and e["commit"] != p.get("commit", record["commit"])
        }
    )
    runs = sorted(
        {
            (p.get("date", record["date"]), p.get("commit", record["commit"]))
            for p in points
        }
    )
    when = "; ".join(
        f"{date} on commit `{commit}` ("
        + ", ".join(
            p["point"]
            for p in points
            if (p.get("date", record["date"]), p.get("commit", record["commit"]))
            == (date, commit)
        )
        + ")"
        for date, commit in runs
    )
    lines = [
        f"*Matrix runs: {when}* (`python3 dev.py matrix`; machine: "
        f"{record['machine']}, shared with other work, so the seconds are inflated). "
        "✓: Run all reached the last cell (seconds: the whole notebook); ✗: the first "
        "cell that stopped it.",
        "",
        *rows,
        "",
        *(["Checker reruns:", "", *rerun_lines, ""] if rerun_lines else []),
        *(
            [
                "†: rerun on its own, "
                + "; ".join(f"{d} on commit `{c}`" for d, c in reruns)
                + " (`python3 dev.py matrix --notebooks ... --checkers ...`).",
                "",
            ]
            if reruns
            else []
        ),
        "numpy and folx at each point: "
        + "; ".join(
            f"JAX {p['versions']['jax']}: numpy {p['versions']['numpy']}, "
            f"folx {p['versions']['folx']}"
            for p in points
        )
        + ".",
    ]
    return "\n".join(lines)


def write_between(page: Path, start: str, end: str, body: str) -> None:
    """Replace what lies between the markers ``start`` and ``end`` of ``page``."""
    text = page.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{page.name} has no {start} ... {end} markers")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    page.write_text(f"{before}{start}\n{body}\n{end}{after}", encoding="utf-8")


def write_page(record: dict) -> None:
    write_between(PAGE, START, END, render(record))


def save(ran: list[dict]) -> dict:
    """Write the record and the page with the points in ``ran``; points not run now
    keep their earlier entry (each entry names its own date and commit)."""
    kept = json.loads(RECORD.read_text())["points"] if RECORD.exists() else []
    by_name = {p["point"]: p for p in kept} | {p["point"]: p for p in ran}
    order = [p.name for p in MATRIX]
    record = {
        "date": _dt.date.today().isoformat(),
        "commit": git_commit(),
        "machine": f"{os.cpu_count()} CPU cores, CPU only",
        "points": [by_name[n] for n in order if n in by_name],
    }
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    write_page(record)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="*", help="names like 0.10.2@3.11 (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="notebooks run at once")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    ap.add_argument("--draws", type=int, default=200, help="checker draws per checker")
    ap.add_argument(
        "--notebooks",
        nargs="+",
        help="rerun only notebooks whose path contains one of these (e.g. 06_)",
    )
    ap.add_argument(
        "--checkers", help="rerun only these checker draws (a pytest -k expression)"
    )
    ap.add_argument(
        "--list",
        action="store_true",
        help="print the points, and what changed since each entry ran, and exit",
    )
    ns = ap.parse_args(argv)
    if ns.list:
        for p in MATRIX:
            print(f"{p.name:16s} {find_python(p.python) or 'NOT FOUND':40s} {p.why}")
        if RECORD.exists():
            for line in stale(json.loads(RECORD.read_text())) or ["record current"]:
                print(f"[matrix] stale: {line}" if line != "record current" else line)
        return 0
    chosen = [p for p in MATRIX if not ns.points or p.name in ns.points]
    unknown = set(ns.points or ()) - {p.name for p in MATRIX}
    if unknown:
        raise SystemExit(f"[matrix] unknown points {sorted(unknown)}; see --list")
    t0 = time.perf_counter()
    ran = []
    for p in chosen:
        ran.append(
            run_point(p, ns.jobs, ns.timeout, ns.draws, ns.notebooks, ns.checkers)
        )
        save(ran)  # after each point: a run cut short keeps the points it finished
    bad = [
        f"{p['point']} {e['notebook']}"
        for p in ran
        for e in p["notebooks"]
        if e["status"] != "ok"
    ]
    print(
        f"[matrix] {len(chosen)} point(s) in {time.perf_counter() - t0:.0f} s; "
        f"{len(bad)} notebook(s) did not reach the last cell"
        + ("".join(f"\n  {b}" for b in bad))
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
