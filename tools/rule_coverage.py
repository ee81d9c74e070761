"""Does every primitive a neural wavefunction emits reach the forward-Laplacian
interpreter with a rule (or a deliberate fallback), on every supported JAX release?

The catalogue :data:`LAYERS` holds the layers such models are built from (activations,
normalisations, pair distances, determinants, indexing, control flow), each as a
function of a 1-D ``r``. For each one, on the running JAX, :func:`report` walks its
jaxpr (sub-jaxprs included) for floating-point primitives that are in neither
``forward_laplacian.RULES`` nor ``FALLBACK`` (those would take the generic rule and
warn), lists the primitives JAX exports that are classified nowhere
(:func:`unclassified`), and compares ``forward_laplacian``'s Laplacian with ``trace(jax.hessian(f))``,
both in float64.

Usage::

    python3 tools/rule_coverage.py          # every supported release with a drift venv
    python3 tools/rule_coverage.py --here   # the running JAX only

The releases are those of ``tools/drift.py``'s ``VERSIONS`` from the book's floor
(``beyondgrad.JAX_FLOOR``) on; their venvs are the drift report's (``.venv-drift/<v>``,
made by ``tools/drift.py``). ``tests/test_rule_coverage.py`` runs :func:`report` on
the JAX of each CI environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: float64 relative error allowed against the Hessian trace: about 14x the worst
#: measured on 0.8.2 to 0.12.0.1 (7.1e-15, the pair-distance layer)
TOLERANCE = 1e-13


#: public primitives (``jax.lax``, ``jax.extend.core.primitives``) that need no rule:
#: their results are integers, booleans, PRNG keys or tokens (the interpreter binds them
#: on plain values), or they read and write mutable references, which a function of
#: ``r`` given to forward_laplacian does not hold
NO_RULE_NEEDED = {
    "after_all", "axis_index", "clz", "create_token", "eq_to", "le_to", "lt_to",
    "mulhi", "population_count", "random_bits", "random_fold_in", "random_seed",
    "random_split", "random_wrap", "random_unwrap", "reduce_and", "reduce_or",
    "reduce_xor", "rng_bit_generator", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "threefry2x32", "dce_sink",
    "get", "swap", "addupdate", "empty2", "name", "stage",
}  # fmt: skip


def unclassified() -> list[str]:
    """The names of the primitives ``jax.lax`` and ``jax.extend.core.primitives``
    export on the running JAX that are in none of ``RULES``, ``FALLBACK`` and
    :data:`NO_RULE_NEEDED`."""
    from jax import lax
    from jax.extend.core import Primitive
    from jax.extend.core import primitives as core_primitives

    from beyondgrad import forward_laplacian as fl

    exported = {
        getattr(m, n)
        for m in (lax, core_primitives)
        for n in dir(m)
        if isinstance(getattr(m, n), Primitive)
    }
    return sorted(
        p.name
        for p in exported
        if p not in fl.RULES and p not in fl.FALLBACK and p.name not in NO_RULE_NEEDED
    )


def _layers() -> dict[str, Callable[[Any], Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    w = jnp.asarray(np.random.default_rng(0).normal(size=(6, 6)))

    def pre(v):
        return w @ v

    return {
        "relu": lambda v: jnp.sum(jax.nn.relu(pre(v)) ** 2),
        "gelu (tanh)": lambda v: jnp.sum(jax.nn.gelu(pre(v))),
        "gelu (erf)": lambda v: jnp.sum(jax.nn.gelu(pre(v), approximate=False)),
        "silu": lambda v: jnp.sum(jax.nn.silu(pre(v))),
        "sigmoid": lambda v: jnp.sum(jax.nn.sigmoid(pre(v))),
        "softplus": lambda v: jnp.sum(jax.nn.softplus(pre(v))),
        "log cosh": lambda v: jnp.sum(jnp.log(jnp.cosh(pre(v)))),
        "logsumexp": lambda v: jax.nn.logsumexp(pre(v)),
        "softmax": lambda v: jnp.sum(jax.nn.softmax(pre(v)) * v),
        "standardize": lambda v: jnp.sum(jax.nn.standardize(pre(v)) * v),
        "norm": lambda v: jnp.linalg.norm(pre(v)),
        "rsqrt": lambda v: jnp.sum(lax.rsqrt(1.0 + pre(v) ** 2)),
        "expm1, log1p": lambda v: jnp.sum(jnp.log1p(jnp.expm1(0.1 * pre(v)) ** 2)),
        "erf": lambda v: jnp.sum(jax.scipy.special.erf(pre(v))),
        "integer power": lambda v: jnp.sum(pre(v) ** 3),
        "real power": lambda v: jnp.sum(jnp.abs(pre(v)) ** 1.5),
        "arctan2": lambda v: jnp.sum(jnp.arctan2(pre(v), 2.0 + v)),
        "clip": lambda v: jnp.sum(jnp.clip(pre(v), -0.5, 0.5) * v),
        "maximum": lambda v: jnp.sum(jnp.maximum(pre(v), v) ** 2),
        "max reduce": lambda v: jnp.max(pre(v)),
        "where": lambda v: jnp.sum(jnp.where(v > 0, v**2, jnp.sin(v))),
        "cumsum": lambda v: jnp.sum(jnp.cumsum(pre(v)) ** 2),
        "sort": lambda v: jnp.sum(jnp.sort(pre(v)) * jnp.arange(6.0)),
        "pair distances": lambda v: jnp.sum(
            jnp.sqrt(1e-3 + (v[:, None] - v[None, :]) ** 2)
        ),
        "pair exp(-|d|)": lambda v: jnp.sum(jnp.exp(-jnp.abs(v[:, None] - v[None, :]))),
        "slogdet": lambda v: jnp.linalg.slogdet(w + jnp.outer(v, v))[1],
        "det": lambda v: jnp.linalg.det(w + jnp.outer(v, v)),
        "inv": lambda v: jnp.sum(jnp.linalg.inv(w + 3 * jnp.eye(6) + jnp.outer(v, v))),
        "polyval": lambda v: jnp.sum(jnp.polyval(jnp.array([1.0, -2.0, 0.5]), v) * v),
        "sinc": lambda v: jnp.sum(jnp.sinc(pre(v))),
        "fft": lambda v: jnp.sum(jnp.abs(jnp.fft.fft(v * v)) ** 2),
        "rfft, irfft": lambda v: jnp.sum(jnp.fft.irfft(jnp.fft.rfft(jnp.sin(v))) ** 3),
        "top_k": lambda v: jnp.sum(lax.top_k(pre(v) ** 2, 3)[0] ** 2),
        "betainc": lambda v: jnp.sum(
            jax.scipy.special.betainc(2.0, 3.0, jax.nn.sigmoid(pre(v)))
        ),
        "ldexp": lambda v: jnp.sum(jnp.ldexp(jnp.sin(v), 2)),
        "unstack": lambda v: sum(jnp.sin(a) for a in jnp.unstack(v)),
        "split": lambda v: jnp.sum(jnp.split(v, 2)[0] * jnp.split(v, 2)[1]),
        "take": lambda v: jnp.sum(jnp.take(v, jnp.array([0, 2, 2, 5])) ** 3),
        "dynamic_slice": lambda v: jnp.sum(lax.dynamic_slice(v, (1,), (3,)) ** 3),
        "cond": lambda v: lax.cond(
            v[0] > 0, lambda u: jnp.sum(u**3), lambda u: jnp.sum(u**2), v
        ),
        "scan": lambda v: lax.scan(lambda c, x: (c * jnp.tanh(x) + x, c), 1.0, v)[0],
        "fori_loop": lambda v: lax.fori_loop(
            0, 3, lambda i, u: jnp.sin(u) * v, v
        ).sum(),
        "jit, checkpoint": lambda v: jnp.sum(jax.jit(jax.checkpoint(jnp.tanh))(pre(v))),
    }


def primitives(jaxpr: Any, found: set | None = None) -> set:
    """Every primitive with a floating-point result in ``jaxpr`` and its sub-jaxprs."""
    from beyondgrad import forward_laplacian as fl

    found = set() if found is None else found
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in inner.eqns:
        if fl.has_float_result(eqn):
            found.add(eqn.primitive)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    primitives(sub, found)
    return found


def report(values: bool = True) -> dict[str, Any]:
    """On the running JAX: ``{"jax": version, "uncovered": {primitive: [layers]},
    "errors": {layer: relative error}}`` (float64, against the Hessian trace; with
    ``values=False`` only the jaxprs are walked, in under a second, and ``errors`` is
    empty)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from beyondgrad import forward_laplacian as fl

    uncovered: dict[str, list[str]] = {}
    errors: dict[str, float] = {}
    with jax.enable_x64(True):
        r = jnp.linspace(-1.0, 1.3, 6)
        for name, f in _layers().items():
            for prim in primitives(jax.make_jaxpr(f)(r)):
                if prim not in fl.RULES and prim not in fl.FALLBACK:
                    uncovered.setdefault(prim.name, []).append(name)
            if not values:
                continue
            lap = fl.forward_laplacian(f, r)[2]
            ref = jnp.trace(jax.hessian(f)(r))
            errors[name] = float(np.abs(lap - ref) / max(1.0, float(np.abs(ref))))
    return {
        "jax": jax.__version__,
        "uncovered": uncovered,
        "errors": errors,
        "unclassified": unclassified(),
    }


def _supported() -> list[str]:
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    from beyondgrad import JAX_FLOOR
    from tools.drift import VERSIONS, version_key

    return [v for v in VERSIONS if version_key(v) >= version_key(JAX_FLOOR)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--here", action="store_true", help="the running JAX only")
    args = parser.parse_args()
    if args.here:
        print(json.dumps(report()))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    failed = 0
    for version in _supported():
        python = ROOT / ".venv-drift" / version / "bin" / "python"
        if not python.exists():
            print(f"{version}: no venv at {python.parent.parent} (run tools/drift.py)")
            failed += 1
            continue
        out = subprocess.run(
            [str(python), __file__, "--here"], capture_output=True, text=True, env=env
        )
        if out.returncode:
            print(f"{version}: failed\n{out.stderr[-2000:]}")
            failed += 1
            continue
        got = json.loads(out.stdout.strip().splitlines()[-1])
        worst = max(got["errors"], key=got["errors"].get)
        bad = not (
            got["uncovered"] == {}
            and got["unclassified"] == []
            and got["errors"][worst] <= TOLERANCE
        )
        failed += bad
        print(
            f"{version}: {'FAIL' if bad else 'ok'}; {len(got['errors'])} layers; "
            f"no rule: {got['uncovered'] or 'none'}; worst error "
            f"{got['errors'][worst]:.1e} ({worst}); exported primitives not "
            f"classified: {got['unclassified'] or 'none'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
