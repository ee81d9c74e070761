"""Particle sparsity in the forward Laplacian against folx, on the all-electron models.

For each model (``ferminet``, ``psiformer`` of :mod:`beyondgrad.all_electron`, built
with the defaults of ``init_ferminet`` / ``init_psiformer``), each ``n`` and each
method, a walker batch in float32 goes through ``jax.jit(jax.vmap(...))`` of the
gradient and Laplacian of ``log|psi|``:

* ``engine dense``: ``forward_laplacian(f, x)``;
* ``engine particles``: ``forward_laplacian(f, x, particles=n)``;
* ``folx(s=0)``, ``folx(s=6)``: ``folx.forward_laplacian(f, sparsity_threshold=s)(x)``
  as folx's users call it (6: its README's setting for FermiNet and PsiFormer).

Printed per row: the compiled program's flops (XLA's ``cost_analysis``) and temporary
bytes (``memory_analysis``), deterministic; compile seconds; and, for illustration
only, the min and median of interleaved repeats (``beyondgrad.measure.time_calls``),
which depend on the machine and its load. Every method's Laplacian is checked
against the float64 Hessian trace on the first walker (``rel_err``).

Run: ``PYTHONPATH=src nice python3 benchmarks/sparsity_probe.py [--n 16 32]
[--walkers 16] [--repeats 5] [--models ferminet psiformer]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from beyondgrad import all_electron, measure
from beyondgrad.forward_laplacian import forward_laplacian

MODELS = {
    "ferminet": (all_electron.init_ferminet, all_electron.ferminet_log_psi),
    "psiformer": (all_electron.init_psiformer, all_electron.psiformer_log_psi),
}


def method_fns(log_psi: Callable, n: int) -> dict[str, Callable]:
    """``name -> fn(params, x)`` returning ``(gradient (3n,), Laplacian ())``."""

    def engine(particles: int | None) -> Callable:
        def fn(params, x):
            f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
            _, jac, lap = forward_laplacian(f, x, particles=particles)
            return jac, lap

        return fn

    def folx_fn(sparsity: int) -> Callable:
        import folx

        def fn(params, x):
            f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
            out = folx.forward_laplacian(f, sparsity_threshold=sparsity)(x)
            return out.jacobian.dense_array, out.laplacian

        return fn

    return {
        "engine dense": engine(None),
        "engine particles": engine(n),
        "folx(s=0)": folx_fn(0),
        "folx(s=6)": folx_fn(6),
    }


def reference(log_psi: Callable, params, x: jax.Array, n: int) -> float:
    """The Hessian trace of ``log_psi(params, x.reshape(n, 3))`` (float64 inputs)."""
    f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
    return float(jnp.trace(jax.jit(jax.hessian(f))(x)))


def _cost(compiled) -> float:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float((cost or {}).get("flops", float("nan")))


def run(models: list[str], ns: list[int], walkers: int, repeats: int) -> list[dict]:
    rows = []
    for name in models:
        init, log_psi = MODELS[name]
        for n in ns:
            params = init(jax.random.key(0), n)
            x = jax.random.normal(jax.random.key(1), (walkers, 3 * n), jnp.float32)
            with jax.enable_x64(True):
                p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
                ref = reference(log_psi, p64, x[0].astype(jnp.float64), n)
            fns = {
                k: jax.jit(jax.vmap(f, in_axes=(None, 0)))
                for k, f in method_fns(log_psi, n).items()
            }
            stats = {}
            for k, f in fns.items():
                t0 = time.perf_counter()
                compiled = f.lower(params, x).compile()
                seconds = time.perf_counter() - t0
                lap = float(f(params, x)[1][0])
                stats[k] = {
                    "flops": _cost(compiled),
                    "temp_bytes": compiled.memory_analysis().temp_size_in_bytes,
                    "compile_s": seconds,
                    "rel_err": abs(lap - ref) / abs(ref),
                }
            timings = measure.time_calls(
                [(f, (params, x)) for f in fns.values()], repeats=repeats
            )
            for (k, s), t in zip(stats.items(), timings):
                rows.append(
                    {
                        "model": name,
                        "n": n,
                        "method": k,
                        **s,
                        "min_s": t.min,
                        "median_s": t.median,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(MODELS))
    parser.add_argument("--n", nargs="+", type=int, default=[16, 32])
    parser.add_argument("--walkers", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"jax {jax.__version__}, {jax.devices()[0].device_kind}, float32, "
        f"{args.walkers} walkers, jit(vmap)"
    )
    header = (
        f"{'model':9} {'n':>3} {'method':17} {'GFLOP':>8} {'temp MiB':>9} "
        f"{'compile s':>9} {'min ms':>8} {'median ms':>9} {'rel_err':>8}"
    )
    print(header)
    rows = run(args.models, args.n, args.walkers, args.repeats)
    for r in rows:
        print(
            f"{r['model']:9} {r['n']:>3} {r['method']:17} {r['flops'] / 1e9:8.3f} "
            f"{r['temp_bytes'] / 2**20:9.2f} {r['compile_s']:9.1f} "
            f"{1e3 * r['min_s']:8.2f} {1e3 * r['median_s']:9.2f} {r['rel_err']:8.1e}"
        )
    by = {(r["model"], r["n"], r["method"]): r for r in rows}
    print("\nratios to engine dense / folx(s=6) (flops, temp bytes, min time):")
    for model in args.models:
        for n in args.n:
            p = by[(model, n, "engine particles")]
            for other in ("engine dense", "folx(s=6)"):
                o = by[(model, n, other)]
                print(
                    f"{model:9} {n:>3} particles / {other:12}: "
                    f"{p['flops'] / o['flops']:.2f} {p['temp_bytes'] / o['temp_bytes']:.2f} "
                    f"{p['min_s'] / o['min_s']:.2f}"
                )


if __name__ == "__main__":
    main()
