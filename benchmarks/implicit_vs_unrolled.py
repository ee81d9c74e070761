"""Implicit vs unrolled gradients of a deep-equilibrium layer: ``implicit.fixed_point``
with ``adjoint="implicit"`` (custom_root) and ``adjoint="unrolled"`` (scan).

    python benchmarks/implicit_vs_unrolled.py            # 100 .. 10 000 iterations, d=64
    python benchmarks/implicit_vs_unrolled.py --quick    # fewer counts, shorter timing

Times follow beyondgrad.measure's policy (wall clock, warm-up, interleaved repeats).
Prints minimum times (ms) and compiled temporary memory of the jitted gradient per
iteration count, the ratios the book's targets are about, then the three solvers
(``solver="iterate"``, ``"anderson"``, ``"newton"``) under the same custom_root,
solved to a tolerance.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

from beyondgrad import implicit_problems as problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="3 iteration counts, shorter timing"
    )
    ap.add_argument(
        "--d", type=int, default=64, help="state size of the DEQ layer (default 64)"
    )
    ap.add_argument("--tangent-solver", default="dense", choices=["dense", "gmres"])
    ns = ap.parse_args(argv)
    counts = (100, 1000, 10_000) if ns.quick else (100, 300, 1000, 3000, 10_000)
    repeats, min_time = (7, 0.01) if ns.quick else (15, 0.02)
    print(
        f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; DEQ layer d={ns.d}, "
        f"tangent solver {ns.tangent_solver!r}; "
        "times are wall-clock minima over repeats (beyondgrad.measure) in ms"
    )
    rows = problems.benchmark_implicit_vs_unrolled(
        counts, ns.d, repeats, min_time, ns.tangent_solver
    )
    head = (
        "iters",
        "fwd impl",
        "fwd nochk",
        "grad impl",
        "bwd impl",
        "fwd unrl",
        "grad unrl",
        "bwd unrl",
        "mem impl KiB",
        "mem unrl KiB",
    )
    print(" | ".join(f"{h:>12}" for h in head))
    for r in rows:
        vals = [
            r.fwd_implicit,
            r.fwd_nocheck,
            r.grad_implicit,
            r.bwd_implicit,
            r.fwd_unrolled,
            r.grad_unrolled,
            r.bwd_unrolled,
        ]
        print(
            " | ".join(
                [
                    f"{r.iterations:>12}",
                    *(f"{1e3 * v:>12.3f}" for v in vals),
                    f"{r.mem_implicit / 1024:>12.1f}",
                    f"{r.mem_unrolled / 1024:>12.1f}",
                ]
            )
        )
    first, last = rows[0], rows[-1]
    at1k = next(r for r in rows if r.iterations == 1000)
    print("\nratios (targets in brackets)")
    print(
        f"  implicit temp memory, {last.iterations} / {first.iterations} iters: "
        f"{last.mem_implicit / first.mem_implicit:.2f}  [1.00: constant]"
    )
    print(
        f"  unrolled / implicit temp memory at 1000 iters: {at1k.mem_unrolled / at1k.mem_implicit:.1f}  [>= 10]"
    )
    print(
        f"  implicit backward (pullback alone), {last.iterations} / {first.iterations} iters: "
        f"{last.bwd_implicit / first.bwd_implicit:.2f}  [<= 1.2]"
    )
    print(
        f"  implicit value+grad minus forward (ms): {1e3 * (first.grad_implicit - first.fwd_implicit):.3f} at "
        f"{first.iterations}, {1e3 * (last.grad_implicit - last.fwd_implicit):.3f} at {last.iterations} iters "
        "(difference of two minima; the pullback column measures the same cost directly)"
    )
    for r in rows:
        if r.iterations >= 1000:
            print(
                f"  unrolled / implicit gradient time at {r.iterations} iters: "
                f"{r.grad_unrolled / r.grad_implicit:.2f}  [>= 1]"
            )
    for r in rows:
        print(
            f"  cost of the convergence check at {r.iterations} iters (fwd with / without): "
            f"{r.fwd_implicit / r.fwd_nocheck:.2f}"
        )
    print(
        "\nsame custom_root, three solvers, tol=1e-5 (float32), slowly contracting layer (||W||=0.999)"
    )
    comp = problems.compare_solvers(ns.d, 1e-5, repeats, min_time)
    for s in comp:
        print(
            f"  {s.name:>22}: {s.iterations:>5} iterations, residual {s.residual:.1e}, "
            f"gradient {1e3 * s.grad_time:.3f} ms"
        )
    plain = comp[0]
    for s in comp[1:]:
        rel = np.linalg.norm(s.grad - plain.grad) / np.linalg.norm(plain.grad)
        print(
            f"  {s.name} vs plain iteration: iterations {plain.iterations / s.iterations:.1f}x fewer; "
            f"gradient time ratio plain / {s.name} (> 1: {s.name} faster): "
            f"{plain.grad_time / s.grad_time:.2f}; gradients agree to {rel:.1e} (relative)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
