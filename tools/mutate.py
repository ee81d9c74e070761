"""A small mutation check: deliberate bugs that the tests must catch.

    python3 dev.py mutate                  # every mutant in MUTANTS
    python3 dev.py mutate --only ID,ID     # these mutants
    python3 dev.py mutate --list           # the table, nothing run

Each mutant is one textual change to one file of ``src/beyondgrad`` and the tests that
should fail because of it. The change is applied to a temporary copy of ``src/``
(the checkout is never modified), which is put first on ``PYTHONPATH``; the named tests
run there in one pytest process. A mutant is *caught* when pytest reports failures,
*survived* when the tests pass anyway, *stale* when its ``old`` text is no longer in
the file exactly once (the code moved on: update the mutant), *error* when pytest
could not run the tests. The score is caught / (caught + survived); the exit status is
non-zero unless every mutant is caught. The score of the last full run is recorded in
CONTRIBUTING.md ("Mutation check").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "beyondgrad"
TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to src/beyondgrad
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest arguments: node ids, files, -k expressions
    why: str  # the bug, in words


MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------- sharding
    Mutant(
        "sharding-mean-as-sum",
        "sharding.py",
        'collective = lax.pmean if reduction == "mean" else lax.psum',
        'collective = lax.psum if reduction == "mean" else lax.psum',
        ("tests/test_sharding.py", "-k", "data_parallel"),
        "reduction='mean' sums the shard losses (gradient D times too large)",
    ),
    Mutant(
        "sharding-divisibility-unchecked",
        "sharding.py",
        "            if shape[dim] % parts:",
        "            if shape[dim] % parts and parts < 0:",
        ("tests/test_sharding.py",),
        "a dimension not divisible by its mesh axes passes validation",
    ),
    Mutant(
        "sharding-axis-twice",
        "sharding.py",
        "            if name in seen:",
        "            if name in seen and name not in sizes:",
        ("tests/test_sharding.py",),
        "a mesh axis used twice in one spec passes validation",
    ),
    Mutant(
        "sharding-rank-off-by-one",
        "sharding.py",
        "        if len(spec) > len(shape):",
        "        if len(spec) > len(shape) + 1:",
        ("tests/test_sharding.py",),
        "a spec one entry longer than the argument's rank passes validation",
    ),
    # ---------------------------------------------------------------- linear
    Mutant(
        "linear-pairing-skewed",
        "linear.py",
        "    lhs, rhs = _pairing(au, v), _pairing(u, atv)",
        "    lhs, rhs = _pairing(au, v), 1.0001 * _pairing(u, atv)",
        ("tests/test_linear.py", "-k", "dot_product"),
        "the dot-product test compares slightly different pairings",
    ),
    Mutant(
        "linear-linearity-check-off",
        "linear.py",
        "    if residual > rtol * scale:",
        "    if residual > 1e6 * rtol * scale:",
        ("tests/test_linear.py", "-k", "dot_product or linear"),
        "a nonlinear map passes the linearity pre-check",
    ),
    Mutant(
        "linear-vjp-scaled",
        "linear.py",
        "        return f_transpose(cotangent)",
        "        return f_transpose(jax.tree_util.tree_map(lambda c: 2 * c, cotangent))",
        ("tests/test_linear.py", "-k", "vjp"),
        "vjp_from_linearize returns twice the cotangent",
    ),
    # ---------------------------------------------------------------- tracers
    Mutant(
        "tracers-total-is-mean",
        "tracers.py",
        "sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(out))",
        "sum(jnp.mean(leaf) for leaf in jax.tree_util.tree_leaves(out))",
        ("tests/test_tracers.py",),
        "grad/vjp differentiate the mean instead of the sum of the output",
    ),
    # ---------------------------------------------------------------- compat
    Mutant(
        "compat-version-two-parts",
        "compat.py",
        "    return tuple(int(p) for p in jax.__version_info__[:3])",
        "    return tuple(int(p) for p in jax.__version_info__[:2])",
        ("tests/test_compat.py",),
        "jax_version() drops the patch number",
    ),
    # ---------------------------------------------------------------- measure
    Mutant(
        "measure-per-loop-time",
        "measure.py",
        "            samples[k].append(dt / n)",
        "            samples[k].append(dt)",
        ("tests/test_runtime.py", "-k", "time_call or measure"),
        "a sample is the whole loop's time, not the time per call",
    ),
    Mutant(
        "measure-negative-min-time",
        "measure.py",
        '    _checks.number(min_time, "min_time", at_least=0, meaning="seconds")',
        '    _checks.number(min_time, "min_time", at_least=-1, meaning="seconds")',
        ("tests/test_bad_input.py", "-k", "measure"),
        "a negative min_time is accepted",
    ),
    # ---------------------------------------------------------------- raises
    Mutant(
        "raises-subclass-accepted",
        "raises.py",
        "        if type(error) is not exception:",
        "        if not isinstance(error, exception):",
        ("tests/test_raises.py",),
        "expect_error accepts a subclass of the pinned exception class",
    ),
    # ---------------------------------------------------------------- drift
    Mutant(
        "drift-first-version-inverted",
        "drift/__init__.py",
        "        if got is not None and got.kind == kind:",
        "        if got is not None and got.kind != kind:",
        ("tests/test_drift.py",),
        "first_version finds the first release without the behaviour",
    ),
    Mutant(
        "drift-frame-ignored",
        "drift/__init__.py",
        "            and self.frame == other.frame\n",
        "",
        ("tests/test_drift.py",),
        "an exact comparison of outcomes ignores the raising frame",
    ),
    # ---------------------------------------------------------------- runtime
    Mutant(
        "runtime-mesh-names-not-distinct",
        "runtime.py",
        "    if len(set(names)) != len(names):",
        "    if len(set(names)) > len(names):",
        ("tests/test_runtime.py", "tests/test_bad_input.py", "-k", "mesh"),
        "demo_mesh accepts the same axis name twice",
    ),
    # -------------------------------- implicit / laplacian (re-check after the rewrite)
    Mutant(
        "implicit-unrolled-no-stop",
        "implicit.py",
        "            done = lax.stop_gradient(method.norm(state)) <= tol",
        "            done = lax.stop_gradient(method.norm(state)) < -1.0",
        ("tests/test_implicit.py", "-k", "unrolled"),
        "fixed_point(adjoint='unrolled') no longer stops at its tolerance (issue #27's "
        "survivor)",
    ),
    Mutant(
        "implicit-float32-tangent-tol",
        "implicit.py",
        "    return 1e-12 if jnp.finfo(dtype).bits >= 64 else 1e-6",
        "    return 1e-12 if jnp.finfo(dtype).bits >= 64 else 1e-5",
        ("tests/test_implicit.py", "-k", "float32_gmres"),
        "the float32 tolerance of the GMRES/CG tangent solves loosened 10x (issue #27's "
        "survivor)",
    ),
    Mutant(
        "implicit-throw-ignored",
        "implicit.py",
        "    if not throw:\n        return\n",
        "    if not throw or throw:\n        return\n",
        ("tests/test_implicit.py", "-k", "converge or nan"),
        "throw=True no longer raises on a solve that did not converge",
    ),
    Mutant(
        "implicit-ignored-option-accepted",
        "implicit.py",
        "            if value is not None:\n                users",
        "            if value is not None and False:\n                users",
        (
            "tests/test_implicit.py",
            "tests/test_bad_input.py",
            "-k",
            "anderson or memory",
        ),
        "memory= for a solver other than Anderson is silently ignored",
    ),
    # ------------------------------------------- exercise checkers (issue #27 survivors)
    Mutant(
        "ex3-fixed-point-tol-1000x",
        "exercises/ch3.py",
        "FIXED_POINT_TOL = 3e-10\n",
        "FIXED_POINT_TOL = 3e-7\n",
        ("tests/test_exercises_ch3.py", "-k", "tolerance_is_pinned"),
        "Exercise 3.1's tolerance loosened 1000x",
    ),
    Mutant(
        "ex3-sqrtm-tol-1000x",
        "exercises/ch3.py",
        "SQRTM_TOL = 1e-8\n",
        "SQRTM_TOL = 1e-5\n",
        ("tests/test_exercises_ch3.py", "-k", "tolerance_is_pinned"),
        "Exercise 3.2's tolerance loosened 1000x",
    ),
    Mutant(
        "ex3-tolerance-fix-rtol-1000x",
        "exercises/ch3.py",
        "TOLERANCE_FIX_RTOL = 3e-12\n",
        "TOLERANCE_FIX_RTOL = 3e-9\n",
        ("tests/test_exercises_ch3.py", "-k", "tolerance_is_pinned"),
        "Exercise 3.3's relative tolerance loosened 1000x",
    ),
    Mutant(
        "ex6-clip-accepts-1e-3",
        "exercises/ch6.py",
        "        if r > TOL:  # every case is tried",
        "        if r > 1e-3:  # every case is tried",
        ("tests/test_exercises_tolerances.py", "-k", "clip_tolerance"),
        "Exercise 6.1 accepts answers off by 1e-3 while its message says 1e-12 (#44)",
    ),
    Mutant(
        "ex6-grads-accepts-2x",
        "exercises/ch6.py",
        "        if r <= TOL:\n            continue",
        "        if r <= 2 * TOL:\n            continue",
        ("tests/test_exercises_tolerances.py", "-k", "grads_tolerance"),
        "Exercise 6.2 accepts answers off by twice its tolerance",
    ),
    Mutant(
        "laplacian-probes-gaussian-scale",
        "laplacian.py",
        "    v = jax.random.rademacher(key, (num_samples, x.shape[0]), dtype=x.dtype)",
        "    v = 2 * jax.random.rademacher(key, (num_samples, x.shape[0]), dtype=x.dtype)",
        ("tests/test_laplacian.py", "-k", "hutchinson"),
        "Hutchinson probes of entries +-2: the estimate is 4x the Laplacian",
    ),
)


def apply(mutant: Mutant, src: Path) -> str | None:
    """Apply ``mutant`` inside the copied package ``src``; why not, if it cannot."""
    path = src / "beyondgrad" / mutant.file
    if not path.is_file():
        return f"no file src/beyondgrad/{mutant.file}"
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        return f"its text occurs {count} times in src/beyondgrad/{mutant.file}"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def run_one(mutant: Mutant, python: str) -> tuple[str, str, float]:
    """(status, detail, seconds) for one mutant."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.id}-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(
            PACKAGE, src / "beyondgrad", ignore=shutil.ignore_patterns("__pycache__")
        )
        why = apply(mutant, src)
        if why is not None:
            return "stale", why, time.perf_counter() - t0
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT)])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        # pyproject's pythonpath = ["src", "."] would put the checkout's unmutated
        # src/ before PYTHONPATH: emptied here, so the mutated copy is imported
        cmd = [
            python,
            *("-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"),
            *("-o", "pythonpath="),
        ]
        try:
            proc = subprocess.run(
                [*cmd, *mutant.tests],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return "error", f"timeout after {TIMEOUT_S} s", time.perf_counter() - t0
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        # pytest: 0 all passed, 1 some failed, 5 none collected, other: usage/internal
        status = {0: "survived", 1: "caught"}.get(proc.returncode, "error")
        return status, last, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="dev.py mutate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true", help="print the mutants, run none")
    ap.add_argument(
        "--python", default=sys.executable, help="the interpreter that runs pytest"
    )
    ns = ap.parse_args(argv)
    mutants = list(MUTANTS)
    if ns.only:
        wanted = [s.strip() for s in ns.only.split(",") if s.strip()]
        known = {m.id for m in MUTANTS}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            print(f"[mutate] unknown mutant id(s) {unknown}; known: {sorted(known)}")
            return 2
        mutants = [m for m in MUTANTS if m.id in wanted]
    if ns.list:
        for m in mutants:
            print(f"{m.id:36} {m.file:18} {m.why}")
        return 0
    counts: dict[str, int] = {}
    for m in mutants:
        status, detail, seconds = run_one(m, ns.python)
        counts[status] = counts.get(status, 0) + 1
        print(f"[mutate] {status:8} {m.id:36} {seconds:5.0f} s  {detail}", flush=True)
    caught, survived = counts.get("caught", 0), counts.get("survived", 0)
    scored = caught + survived
    score = f"{caught}/{scored}" if scored else "n/a"
    print(
        f"[mutate] score {score} caught; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    return 0 if caught == len(mutants) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
