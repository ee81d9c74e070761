"""Chapter 6's natural-gradient updates against NetKet's own SR and SRt (issue #43).

NetKet is not a dependency of the book (it pins its own JAX), so this runs in an
environment of its own, with the book's package on ``PYTHONPATH``::

    uv venv /tmp/nk && VIRTUAL_ENV=/tmp/nk uv pip install netket
    PYTHONPATH=src /tmp/nk/bin/python tools/netket_compare.py --record

On one problem (chapter 6's model, float64, a few walkers sampled from it) it builds:

- the per-walker Jacobian twice: ``beyondgrad.sharded_vmc.per_walker_grads`` and
  NetKet's ``netket.jax.jacobian`` (``mode="real"``), compared entry by entry;
- NetKet's centred and scaled inputs: ``netket.jax.jacobian(..., center=True)`` and
  its ``_prepare_input`` (the driver's own preparation of ``O`` and ``dv``);
- NetKet's updates: ``_compute_sr_update`` (SR, solved by ``cholesky``) and
  ``_compute_srt_update`` (SRt, the walker-space form), the functions behind
  ``netket.driver.VMC_SR``, with ``diag_shift`` = the damping;
- the book's ``natural_gradient`` with every method, inside ``shard_map`` on 8 CPU
  devices and on one.

It prints each relative difference and the bound it is held to: the condition number
of ``S + damping I`` times the float64 rounding unit, times 100 (the solves), and
``CG_TOL`` times the condition number, times 10 (CG). ``--record`` writes
``records/netket_compare.json``. Exit status 1 if a difference exceeds its bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec as P

from beyondgrad import runtime

runtime.ensure_cpu_devices(8)
jax.config.update("jax_enable_x64", True)

from beyondgrad import sharded_vmc as sv  # noqa: E402
from beyondgrad import vmc, wavefunctions  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "records" / "netket_compare.json"
#: CG's stopping tolerance here (as tests/test_sharded_vmc.py's CG_TOL).
CG_TOL = 1e-12


def _rel(a: object, b: object) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="write the record")
    parser.add_argument("--walkers", type=int, default=64)
    parser.add_argument("--damping", type=float, default=1e-3)
    args = parser.parse_args(argv)
    # NetKet's default sets a global one-axis mesh ("S") over every device, which
    # the book's shard_map over its own mesh cannot run under: NetKet runs on one
    # device here (its updates are the same numbers)
    os.environ["NETKET_SHARDING"] = "0"
    try:
        import netket as nk
        from netket._src.ngd.sr import _compute_sr_update
        from netket._src.ngd.sr_srt_common import _prepare_input
        from netket._src.ngd.srt import _compute_srt_update
    except ImportError as e:
        print(f"netket is not importable here ({e}); see this tool's docstring")
        return 2

    log_psi = wavefunctions.mlp_log_psi
    n_el = 3
    params = wavefunctions.init_params(
        jax.random.key(1), n_el, hidden=6, dtype=jnp.float64
    )
    start = jax.random.normal(jax.random.key(2), (args.walkers, n_el, 3), jnp.float64)
    walkers, _ = vmc.sample_walkers(
        log_psi, params, start, jax.random.key(3), steps=20, step_size=0.5
    )
    e_l = sv.local_energies(log_psi, params, walkers)
    o, _ = sv.per_walker_grads(log_psi, params, walkers)
    flat, unravel = ravel_pytree(params)
    n, p = o.shape

    # NetKet's Jacobian of the same log psi, as its drivers compute it
    def apply(variables: dict, x: jax.Array) -> jax.Array:
        theta = unravel(variables["params"])  # NetKet passes {"params": ...}
        return jax.vmap(lambda xi: log_psi(theta, xi.reshape(n_el, 3)))(x)

    samples = walkers.reshape(n, 3 * n_el)
    o_nk = nk.jax.jacobian(apply, flat, samples, mode="real", dense=True)
    o_nk_c = nk.jax.jacobian(apply, flat, samples, mode="real", dense=True, center=True)
    o_l, dv = _prepare_input(o_nk_c, e_l, mode="real", scaling_factor=1.0 / n)
    solver = nk.optimizer.solver.cholesky
    common = dict(
        diag_shift=args.damping, solver_fn=solver, mode="real", params_structure=flat
    )
    sr_nk = _compute_sr_update(o_l, dv, **common)[0]
    srt_nk = _compute_srt_update(o_l, dv, **common)[0]

    o_c = (np.asarray(o) - np.asarray(o).mean(0)) / np.sqrt(n)
    cond = float(np.linalg.cond(o_c.T @ o_c + args.damping * np.eye(p)))
    bound_solve = 100 * cond * 2.2e-16
    rows: dict[str, tuple[float, float]] = {
        "per_walker_grads vs netket.jax.jacobian": (_rel(o, o_nk), 1e-13),
        "NetKet SRt vs NetKet SR": (_rel(srt_nk, sr_nk), bound_solve),
    }
    mesh = runtime.demo_mesh(8, "data")
    for method in sv.METHODS:
        options = {"tol": CG_TOL} if method == "cg" else {}
        bound = 10 * cond * CG_TOL if method == "cg" else bound_solve
        body = lambda a, b, m=method, kw=options: sv.natural_gradient(  # noqa: E731
            a, b, damping=args.damping, method=m, axis_name="data", **kw
        )
        program = jax.jit(
            jax.shard_map(
                body,
                mesh=mesh,
                in_specs=(P("data"), P("data")),
                out_specs=P(),
                check_vma=True,
            )
        )
        g, delta = program(o, e_l)
        _, delta1 = sv.natural_gradient(
            o, e_l, damping=args.damping, method=method, **options
        )
        rows[f"g ({method}, 8 devices) vs NetKet's F = O^T dv"] = (
            _rel(g, o_l.T @ dv),
            1e-13,
        )
        for name, ref in (("SR", sr_nk), ("SRt", srt_nk)):
            rows[f"{method}, 8 devices vs NetKet {name}"] = (_rel(delta, ref), bound)
            rows[f"{method}, 1 device vs NetKet {name}"] = (_rel(delta1, ref), bound)
    width = max(map(len, rows))
    failed = False
    for name, (err, bound) in rows.items():
        ok = err <= bound
        failed |= not ok
        print(
            f"{name:{width}}  {err:.1e}  (bound {bound:.1e}) {'ok' if ok else 'FAIL'}"
        )
    print(
        f"N = {n} walkers, P = {p} parameters, damping {args.damping}, "
        f"cond(S + damping I) = {cond:.2e}"
    )
    versions = {
        "jax": jax.__version__,
        "netket": nk.__version__,
        "python": platform.python_version(),
    }
    print(versions)
    if args.record:
        record = {
            "versions": versions,
            "walkers": n,
            "parameters": p,
            "damping": args.damping,
            "condition_number": cond,
            "rows": {k: {"error": e, "bound": b} for k, (e, b) in rows.items()},
            "passed": not failed,
        }
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {RECORD.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
