"""The checker-draws ledger: each checker on the book's own solution, seed by seed, at
each point of the version matrix, accumulated across runs.

    python3 dev.py draws --points 0.12.0.1@3.12 --exercises 5.1 2.1 --seeds 0:500
    python3 dev.py draws --points floor@3.11 --seeds 0:2000     # every checker
    python3 dev.py draws --render      # rewrite the "Tested on" table from the ledger

A seed is one call of a checker (``tests/test_exercises_draws.py``'s ``CHECKERS``: the
checker and the chapter's solution), which draws its own cases from the seed. The
target is :data:`TARGET` seeds per checker per point with no rejection (issue: checker
tolerances from error analysis; 2,000 draws per checker on each matrix point).

An XLA compilation per drawn case made a seed of all 14 checkers cost about 17 s on
one core of a 2-core machine. The worker keeps JAX's persistent compilation cache in
``.cache/draws-jax/<point>``: a drawn case whose program (shapes, dtypes, sharding)
was compiled before at that point loads that executable instead of compiling it
again, so a seed costs 1.7 to 2.3 s once the cache is warm (the ledger's block times,
two points side by side) and every number stays the same (the same executable runs).
2,000 seeds still take about 1 to 1.3 hours per point, so the runs are done in pieces:
each block of :data:`BLOCK` seeds is appended, as soon as it is done, to
``records/checker_draws.jsonl`` (point, exercise, seeds, rejected seeds with their
messages, the JAX version, date, commit, and the digest of the files the verdict
depends on). A run cut short keeps its finished blocks; a later run with other
seeds adds to them. A block counts only while its digest is that of today's files
(:data:`FILES`, their code without comments and docstrings): a change to a checker or
a solution starts that chapter's count again.

The table between the ``draws`` markers of ``tested_on.md`` is the ledger's rendering
at today's files; ``tests/test_matrix.py`` checks that it is current.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEDGER = ROOT / "records" / "checker_draws.jsonl"
PAGE = ROOT / "tested_on.md"
START, END = "<!-- draws:start -->", "<!-- draws:end -->"
#: Seeds per checker per point with no rejection that the issue asks for.
TARGET = 2000
#: Seeds per appended block (JAX's caches are cleared at each block: a long run in one
#: process otherwise runs XLA's CPU compiler out of memory, see the test's CLEAR_EVERY).
BLOCK = 50
#: The files a verdict depends on: every checker's (the exercises package, the test
#: file with the solutions, and what they import), plus each chapter's own modules.
COMMON = (
    "src/beyondgrad/exercises/__init__.py",
    "src/beyondgrad/compat.py",
    "src/beyondgrad/runtime.py",
    "tests/test_exercises_draws.py",
)
FILES = {
    "1": ("src/beyondgrad/exercises/ch1.py",),
    "2": ("src/beyondgrad/exercises/ch2.py",),
    "3": (
        "src/beyondgrad/exercises/ch3.py",
        "src/beyondgrad/implicit.py",
        "src/beyondgrad/implicit_problems.py",
    ),
    "5": (
        "src/beyondgrad/exercises/ch5.py",
        "src/beyondgrad/wavefunctions.py",
        "src/beyondgrad/vmc.py",
    ),
    "6": ("src/beyondgrad/exercises/ch6.py",),
}

_WORKER = r"""
import json, sys, time
sys.path.insert(0, "tests")
import jax
import test_exercises_draws as t
names, first, stop, block = sys.argv[1].split(","), *map(int, sys.argv[2:5])
unknown = [n for n in names if n not in t.CHECKERS]
if unknown:
    sys.exit(f"unknown exercises {unknown}; choose from {list(t.CHECKERS)}")
for name in names:
    check, answer = t.CHECKERS[name]
    for a in range(first, stop, block):
        b = min(a + block, stop)
        jax.clear_caches()
        t0, rejected = time.perf_counter(), {}
        for seed in range(a, b):
            fb = check(answer, seed)
            if not fb.passed:
                rejected[str(seed)] = str(fb)[:600]
        print("DRAWS-BLOCK " + json.dumps({
            "exercise": name, "seeds": [a, b], "rejected": rejected,
            "seconds": round(time.perf_counter() - t0, 1), "jax": jax.__version__,
        }), flush=True)
"""


def exercises() -> list[str]:
    """The exercise names of the test's CHECKERS, read without importing JAX."""
    import ast

    tree = ast.parse((ROOT / "tests" / "test_exercises_draws.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and "CHECKERS" in ast.unparse(node)
            and isinstance(node.value, ast.Dict)
        ):
            return [ast.literal_eval(k) for k in node.value.keys if k is not None]
    raise SystemExit("tests/test_exercises_draws.py has no CHECKERS dict")


def digest(exercise: str) -> str:
    """The digest of the files ``exercise``'s verdict depends on, as they are now."""
    chapter = exercise.split(".")[0]
    if chapter not in FILES:
        raise SystemExit(f"[draws] no files listed for chapter {chapter} (FILES)")
    h = hashlib.sha256()
    for rel in (*COMMON, *FILES[chapter]):
        h.update(rel.encode() + b"\0" + _code((ROOT / rel).read_text()) + b"\0")
    return h.hexdigest()[:16]


def _code(source: str) -> bytes:
    """The code of a Python file: its syntax tree without comments and docstrings, so
    that a reworded comment or docstring keeps the blocks already run."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return repr(_canonical(tree)).encode()


def _canonical(node: object) -> object:
    """A syntax tree as nested tuples that every supported Python writes alike: node
    types and fields, leaving out fields that are ``None`` or empty (``ast.dump``
    shows the fields a newer Python added, such as 3.12's ``type_params=[]``, so the
    same file dumped by 3.11 and 3.12 differs)."""
    import ast

    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append((name, _canonical(value)))
        return (type(node).__name__, tuple(fields))
    if isinstance(node, list):
        return tuple(_canonical(v) for v in node)
    return repr(node)


def _dirty(exercise: str) -> list[str]:
    chapter = exercise.split(".")[0]
    out = subprocess.run(
        ["git", "status", "--porcelain", "--", *COMMON, *FILES[chapter]],
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return [line[3:] for line in out.splitlines()]


def read() -> list[dict]:
    if not LEDGER.exists():
        return []
    return [json.loads(ln) for ln in LEDGER.read_text().splitlines() if ln.strip()]


def tally(entries: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (point, exercise), over the blocks at today's digest: the distinct seeds
    run, and the rejected ones."""
    now = {e: digest(e) for e in exercises()}
    out: dict[tuple[str, str], dict] = {}
    for e in entries:
        if now.get(e["exercise"]) != e["digest"]:
            continue
        t = out.setdefault((e["point"], e["exercise"]), {"seeds": set(), "bad": {}})
        t["seeds"].update(range(*e["seeds"]))
        t["bad"].update({int(k): v for k, v in e["rejected"].items()})
    return out


def render(entries: list[dict]) -> str:
    from tools.matrix import MATRIX

    counts = tally(entries)
    names = exercises()
    points = [p.name for p in MATRIX]
    lines = [
        f"Each checker on the book's own solution, seed by seed (`python3 dev.py draws`;"
        f" ledger `records/checker_draws.jsonl`). A cell: seeds run at today's "
        f"checker and solution files, ✓ none rejected; target {TARGET:,} per checker "
        "per point. Each seed is one call of the checker, which draws its own cases.",
        "",
        "| exercise | " + " | ".join(points) + " |",
        "|---|" + "---|" * len(points),
    ]
    for name in names:
        cells = []
        for p in points:
            t = counts.get((p, name))
            if t is None:
                cells.append("·")
                continue
            n, bad = len(t["seeds"]), sorted(t["bad"])
            mark = "✓" if not bad else f"✗ {len(bad)} rejected (seeds {bad[:5]})"
            cells.append(f"{n:,} {mark}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    now = {e: digest(e) for e in names}
    done = [e["date"] for e in entries if now.get(e["exercise"]) == e["digest"]]
    if done:
        lo, hi = min(done), max(done)
        lines += [
            "",
            f"*Blocks counted ran {f'on {lo}' if lo == hi else f'{lo} to {hi}'}.*",
        ]
    return "\n".join(lines)


def write_page(entries: list[dict]) -> None:
    from tools.matrix import write_between

    write_between(PAGE, START, END, render(entries))


#: XLA's CPU loader of cached executables on older JAX (0.8.2) logs an error line per
#: load naming two pseudo-features (``prefer-no-scatter``, ``prefer-no-gather``) of the
#: compiling machine, which is this machine: the worker's output drops those lines.
_AOT_NOISE = "cpu_aot_loader.cc"


def compilation_cache(point_name: str) -> dict[str, str]:
    """The environment that gives the worker at ``point_name`` its own persistent
    compilation cache, every program cached whatever its compile time or size."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(ROOT / ".cache" / "draws-jax" / point_name),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }


def run(point_name: str, names: list[str], first: int, stop: int) -> int:
    """Run ``names`` over seeds ``first .. stop-1`` at the point, appending each block
    to the ledger as it finishes; the number of rejected seeds."""
    from tools.matrix import MATRIX, _env, git_commit, setup

    point = next((p for p in MATRIX if p.name == point_name), None)
    if point is None:
        raise SystemExit(
            f"[draws] unknown point {point_name}; see dev.py matrix --list"
        )
    dirty = sorted({f for n in names for f in _dirty(n)})
    if dirty:
        raise SystemExit(
            f"[draws] commit these first (the ledger names a commit): {dirty}"
        )
    digests = {n: digest(n) for n in names}
    py = setup(point)
    commit = git_commit()
    proc = subprocess.Popen(
        [str(py), "-c", _WORKER, ",".join(names), str(first), str(stop), str(BLOCK)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**_env(point), **compilation_cache(point.name)},
        stderr=subprocess.STDOUT,
    )
    rejected = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        if not line.startswith("DRAWS-BLOCK "):
            if _AOT_NOISE not in line:
                print(line, end="", file=sys.stderr)
            continue
        block = json.loads(line.removeprefix("DRAWS-BLOCK "))
        entry = {
            "point": point.name,
            **block,
            "digest": digests[block["exercise"]],
            "commit": commit,
            "date": _dt.date.today().isoformat(),
        }
        rejected += len(block["rejected"])
        LEDGER.parent.mkdir(exist_ok=True)
        with LEDGER.open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
        print(
            f"[draws] {point.name} {block['exercise']} seeds {block['seeds']}: "
            f"{len(block['rejected'])} rejected ({block['seconds']} s)",
            flush=True,
        )
    if proc.wait() != 0:
        raise SystemExit(f"[draws] {point.name}: the worker exited {proc.returncode}")
    return rejected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", nargs="*", default=[], help="names like 0.10.2@3.11")
    ap.add_argument("--exercises", nargs="*", help="names of CHECKERS (default: all)")
    ap.add_argument("--seeds", default="0:50", help="first:stop (stop excluded)")
    ap.add_argument("--render", action="store_true", help="only rewrite the table")
    ns = ap.parse_args(argv)
    names = ns.exercises or exercises()
    try:
        first, stop = (int(s) for s in ns.seeds.split(":"))
    except ValueError:
        raise SystemExit(
            f"[draws] --seeds takes first:stop, got {ns.seeds!r}"
        ) from None
    if not 0 <= first < stop:
        raise SystemExit(f"[draws] --seeds needs 0 <= first < stop, got {ns.seeds!r}")
    bad = 0
    for p in [] if ns.render else ns.points:
        bad += run(p, names, first, stop)
        write_page(read())
    write_page(read())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
