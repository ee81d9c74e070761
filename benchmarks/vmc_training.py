"""VMC training to a known exact energy, recorded.

Trains :func:`beyondgrad.vmc_problems.taut_log_psi` (two electrons in a 3-D harmonic
trap at omega = 1/2 with Coulomb repulsion; exact singlet ground state E = 2 Ha, Taut
1993) with :func:`beyondgrad.sharded_vmc.train` in float64, from a = 0.4, b = 0.05 (E
about 2.37 Ha) on all CPU devices it is given (8 by default, split over the walkers),
then prints and (``--record``) writes ``records/vmc_training.json``: the curve (energy,
variance, acceptance, width, walkers dropped per step), the final energy with its
error, the parameters, JAX's version, the machine and the wall time.

The final energy is the mean of the per-step energies over the last ``--last`` steps
and its error the blocked standard error (:func:`beyondgrad.sharded_vmc.blocked_mean`,
10 blocks: a block of several steps is longer than the correlation between steps), and
``bias_bound`` the mean variance over those steps divided by 0.5 Ha, Temple's bound
sigma^2 / gap on the variational bias with the gap taken as half of 2 omega = 1 Ha.

    python benchmarks/vmc_training.py                 # 300 steps, 512 walkers, print
    python benchmarks/vmc_training.py --record        # also write the record
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import runtime
from beyondgrad import sharded_vmc as sv
from beyondgrad import vmc_problems as vp

RECORD = Path(__file__).resolve().parents[1] / "records" / "vmc_training.json"
#: Temple's bound's gap (Ha): half the centre-of-mass gap 2 omega = 1, for room
GAP = 0.5


def machine() -> str:
    cores = (
        len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count()
    )
    dev = jax.devices()[0]
    return (
        f"{platform.processor() or platform.machine()}, {cores} cores available, "
        f"{jax.device_count()} {dev.platform} devices ({dev.device_kind})"
    )


def run(args: argparse.Namespace) -> dict:
    """The training and its summary (a dict, the record without the provenance)."""
    with jax.enable_x64(True):
        params = vp.taut_params(0.4, 0.05)
        x = jax.random.normal(jax.random.key(1), (args.walkers, 2, 3), jnp.float64)
        x, _ = sv.metropolis(
            vp.taut_log_psi, params, x, jax.random.key(2), steps=100, step_size=1.0
        )
        mesh = None if args.devices == 1 else runtime.demo_mesh(args.devices, "data")
        start = time.perf_counter()
        theta, _, history = sv.train(
            vp.taut_log_psi,
            params,
            x,
            jax.random.key(args.seed),
            steps=args.steps,
            learning_rate=args.learning_rate,
            damping=1e-3,
            width=1.0,
            sweeps=args.sweeps,
            method=args.method,
            target_acceptance=0.5,
            omega=vp.TAUT_OMEGA,
            mesh=mesh,
        )
        jax.block_until_ready(history)
        seconds = time.perf_counter() - start
        a, b = (float(jax.nn.softplus(theta[k])) for k in ("a", "b"))
    h = {k: np.asarray(v) for k, v in history._asdict().items()}
    last = min(args.last, args.steps)
    mean, error = sv.blocked_mean(h["energy"][-last:], blocks=10)
    bias = float(np.mean(h["variance"][-last:])) / GAP
    return {
        "settings": {
            "steps": args.steps,
            "walkers": args.walkers,
            "devices": args.devices,
            "sweeps": args.sweeps,
            "method": args.method,
            "learning_rate": args.learning_rate,
            "damping": 1e-3,
            "width": 1.0,
            "target_acceptance": 0.5,
            "burn_in_sweeps": 100,
            "start": {"a": 0.4, "b": 0.05},
            "dtype": "float64",
            "seed": args.seed,
        },
        "train_seconds": round(seconds, 1),
        "exact_energy": vp.TAUT_ENERGY,
        "final": {
            "last_steps": last,
            "blocks": 10,
            "energy": mean,
            "error": error,
            "bias_bound": bias,
            "deviation": mean - vp.TAUT_ENERGY,
            "deviation_in_errors": (mean - vp.TAUT_ENERGY) / error,
            "variance_first": float(h["variance"][0]),
            "variance_last": float(h["variance"][-1]),
            "a": a,
            "b": b,
        },
        "curve": {k: v.tolist() for k, v in h.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--walkers", type=int, default=512)
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--sweeps", type=int, default=5)
    ap.add_argument("--learning-rate", type=float, default=0.05)
    ap.add_argument("--method", choices=("sr", "minsr"), default="sr")
    ap.add_argument("--last", type=int, default=100, help="steps of the final energy")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--record", action="store_true", help=f"write {RECORD.name}")
    args = ap.parse_args(argv)
    runtime.ensure_cpu_devices(max(args.devices, 1))
    t0 = time.perf_counter()
    result = run(args)
    duration = time.perf_counter() - t0
    f = result["final"]
    c = result["curve"]
    for t in sorted({0, 1, 2, 5, 10, 20, 50, 100, 200, args.steps - 1}):
        if t < args.steps:
            print(
                f"step {t:4d}  E {c['energy'][t]:.6f}  var {c['variance'][t]:.2e}  "
                f"acc {c['acceptance'][t]:.3f}  width {c['width'][t]:.3f}  "
                f"dropped {c['dropped'][t]}"
            )
    print(
        f"E = {f['energy']:.6f} +- {f['error']:.1e} (last {f['last_steps']} steps, "
        f"blocked; bias <= {f['bias_bound']:.1e}), exact {vp.TAUT_ENERGY}: "
        f"{f['deviation_in_errors']:+.2f} errors; variance {f['variance_first']:.2e} "
        f"-> {f['variance_last']:.2e}; a {f['a']:.5f} b {f['b']:.5f}; "
        f"total {duration:.0f} s (training {result['train_seconds']} s)"
    )
    if args.record:
        command = "python benchmarks/vmc_training.py " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        record = {
            "command": command.strip(),
            "machine": machine(),
            "jax": jax.__version__,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "duration_s": round(duration, 1),
            "note": (
                f"1-minute load average {os.getloadavg()[0]:.2f} at the end; wall "
                "times include compilation (train compiles once per call)"
            ),
            **result,
        }
        RECORD.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
