"""Benchmark: the Laplacian of log|ψ| for a Slater determinant, by every method, vs n.

For n electrons (d = 3n coordinates) and a batch of walkers, time the jitted
``vmap`` over the batch of ``(∇log|ψ|, Δlog|ψ|)`` for each method, side by side in one
run (median of repeats, after a warm-up call that compiles). Report

* each time as a ratio to folx at its best sparsity setting and to one batched
  evaluation of log|ψ|;
* the relative error of Δlog|ψ| in float32 against a float64 reference (the generic
  ``vmap`` method in float64), ``max_b |Δ32 - Δ64| / max_b |Δ64|`` ("max err") and the
  median over walkers of ``|Δ32 - Δ64| / |Δ64|`` ("med err");
* "min/min": the fastest repeat of the method over the fastest evaluation of log|ψ|
  (less sensitive to other processes on a shared machine than the medians);
* the growth exponent of the fastest exact method from n = 32 to 64, log(t64/t32)/log 2.

Targets (issue 7), at n = 32: fastest exact method ≤ 0.5 × folx-best and ≤ 4 × one
log|ψ| evaluation, relative error ≤ 1e-5, exponent ≤ 3.

Usage::

    python benchmarks/laplacian.py            # n in 4 8 16 32 64, batch 16
    python benchmarks/laplacian.py --quick    # n in 4 8 16, fewer repeats
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import laplacian as L
from beyondgrad import slater

#: methods timed; the generic ones see log|ψ| as a black box of 3n inputs
GENERIC = ("hessian", "loop", "vmap")
FOLX_SPARSITY = (0, 0.6)


def make_problem(n: int, batch: int, hidden: int, dtype) -> tuple[dict, jax.Array]:
    params = slater.init_params(jax.random.key(n), n, hidden=hidden or 2 * n)
    params = jax.tree.map(lambda a: a.astype(dtype), params)
    walkers = 1.5 * jax.random.normal(jax.random.key(100 + n), (batch, n, 3), jnp.float32).astype(dtype)
    return params, walkers


def method_fns(n: int) -> dict[str, callable]:
    """name -> f(params, positions (n,3)) returning (grad (3n,), laplacian)."""

    def generic(method: str, **kw):
        def fn(params, pos):
            flat = lambda v: slater.mlp_log_psi(params, v.reshape(n, 3))  # noqa: E731
            return L.grad_and_laplacian(flat, pos.reshape(-1), method=method, **kw)

        return fn

    def structured(params, pos):
        _, g, lap = slater.slater_laplacian(functools.partial(slater.mlp_orbitals, params), pos)
        return g.reshape(-1), lap

    fns = {m: generic(m) for m in GENERIC}
    for s in FOLX_SPARSITY:
        fns[f"folx(sparsity={s})"] = generic("folx", sparsity_threshold=s)
    fns["slater (row structure)"] = structured
    fns["hutchinson (16 probes)"] = generic("hutchinson", key=jax.random.key(0), num_samples=16)
    return fns


def timed(fn, *args, repeats: int) -> tuple[float, float, object, float]:
    """(compile+first call seconds, median seconds of ``repeats`` calls, output, fastest call)."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), out, min(times)


def run(sizes, batch: int, hidden: int, repeats: int, budget_s: float) -> list[dict]:
    rows = []
    skip: set[str] = set()
    for n in sizes:
        params, walkers = make_problem(n, batch, hidden, jnp.float32)
        params64, walkers64 = jax.tree.map(lambda a: a.astype(jnp.float64), (params, walkers))
        log_psi = jax.jit(jax.vmap(slater.mlp_log_psi, in_axes=(None, 0)))
        _, t_eval, _, t_eval_min = timed(log_psi, params, walkers, repeats=repeats)
        fns = method_fns(n)
        ref = jax.jit(jax.vmap(fns["vmap"], in_axes=(None, 0)))(params64, walkers64)[1]
        ref = np.asarray(ref)
        for name, fn in fns.items():
            if name in skip:
                rows.append({"n": n, "method": name, "skipped": True})
                continue
            batched = jax.jit(jax.vmap(fn, in_axes=(None, 0)))
            first, t, (_, lap), t_min = timed(batched, params, walkers, repeats=repeats)
            diff = np.abs(np.asarray(lap, np.float64) - ref)
            err = float(np.max(diff) / np.max(np.abs(ref)))
            err_med = float(np.median(diff / np.abs(ref)))
            rows.append({"n": n, "method": name, "time": t, "compile": first - t, "eval": t_eval, "err": err,
                         "err_median": err_med, "min_vs_eval": t_min / t_eval_min})
            if t * repeats > budget_s:  # too slow to repeat at the next size
                skip.add(name)
        folx_best = min(r["time"] for r in rows if r["n"] == n and r["method"].startswith("folx") and "time" in r)
        for r in rows:
            if r["n"] == n and "time" in r:
                r["vs_folx"] = r["time"] / folx_best
                r["vs_eval"] = r["time"] / t_eval
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'n':>3} {'method':<24} {'median ms':>10} {'compile s':>9} {'/folx-best':>10} "
          f"{'/log|ψ|':>8} {'min/min':>8} {'max err':>9} {'med err':>9}")
    for r in rows:
        if r.get("skipped"):
            print(f"{r['n']:>3} {r['method']:<24} {'skipped (too slow at the previous n)':>52}")
            continue
        print(f"{r['n']:>3} {r['method']:<24} {1e3 * r['time']:>10.3f} {r['compile']:>9.2f} "
              f"{r['vs_folx']:>10.3f} {r['vs_eval']:>8.2f} {r['min_vs_eval']:>8.2f} {r['err']:>9.1e} "
              f"{r['err_median']:>9.1e}")


def check_targets(rows: list[dict]) -> None:
    exact = [r for r in rows if "time" in r and not r["method"].startswith("hutchinson")]
    at = {n: sorted((r for r in exact if r["n"] == n), key=lambda r: r["time"]) for n in {r["n"] for r in exact}}
    if 32 not in at:
        print("\n(targets are stated at n = 32; run without --quick to check them)")
        return
    best = at[32][0]
    print(f"\nfastest exact method at n = 32: {best['method']}")
    print(f"  time / folx-best     = {best['vs_folx']:.3f}   target <= 0.5   {'met' if best['vs_folx'] <= 0.5 else 'NOT met'}")
    print(f"  time / one log|psi|  = {best['vs_eval']:.2f}    target <= 4     {'met' if best['vs_eval'] <= 4 else 'NOT met'}")
    print(f"  time / one log|psi| using the fastest of the repeats = {best['min_vs_eval']:.2f}")
    print(f"  rel. error vs f64    = {best['err']:.2e} target <= 1e-5  {'met' if best['err'] <= 1e-5 else 'NOT met'}"
          f"  (median per walker {best['err_median']:.1e})")
    if 64 in at:
        t64 = next((r for r in at[64] if r["method"] == best["method"]), None)
        if t64 is not None:
            k = math.log(t64["time"] / best["time"]) / math.log(2.0)
            print(f"  growth 32 -> 64      = n^{k:.2f}  target <= n^3   {'met' if k <= 3 else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n in 4 8 16 only, 3 repeats")
    ap.add_argument("--sizes", type=int, nargs="*", help="electron counts (default 4 8 16 32 64)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=None, help="MLP width (default 2n, so the orbitals are independent)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--budget", type=float, default=6.0,
                    help="skip a method at larger n once repeats*median exceeds this many seconds")
    args = ap.parse_args()
    jax.config.update("jax_enable_x64", True)  # for the float64 reference; timed arrays are float32
    sizes = args.sizes or ([4, 8, 16] if args.quick else [4, 8, 16, 32, 64])
    repeats = args.repeats or (3 if args.quick else 7)
    dev = jax.devices()[0]
    print(f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind}), batch {args.batch}, float32, "
          f"hidden {args.hidden or '2n'}, median of {repeats}")
    t0 = time.perf_counter()
    rows = run(sizes, args.batch, args.hidden, repeats, args.budget)
    print_table(rows)
    check_targets(rows)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
