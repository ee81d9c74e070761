"""What the drift record says the installed JAX does: the expected outcome of a probe.

Tests that depend on the JAX version take their expectation from here, never from an
exact version string. A version the record has not seen is compared with the newest
recorded version not newer than it, so an upgrade runs the tests (and fails them where
the behaviour moved: re-record with ``python3 dev.py drift`` and update the test).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jax

from beyondgrad import drift
from beyondgrad.drift import probes

ROOT = Path(__file__).resolve().parents[1]


def recorded_version(installed: str | None = None) -> str:
    """The recorded version whose row stands for ``installed`` (default: this JAX)."""
    installed = installed or jax.__version__
    key = drift.version_key(_release(installed))
    recorded = [v for v in drift.versions() if drift.version_key(v) <= key]
    if not recorded:
        raise LookupError(
            f"JAX {installed} is older than every recorded version "
            f"({drift.versions()[0]}); it is below the supported floor"
        )
    return recorded[-1]


def expected(probe_id: str, installed: str | None = None) -> drift.Outcome:
    """The recorded outcome of ``probe_id`` that this JAX is expected to reproduce."""
    version = recorded_version(installed)
    got = drift.outcome(probe_id, version)
    if got is None:
        raise LookupError(f"probe {probe_id} has no result for JAX {version}")
    return got


def _release(version: str) -> str:
    """``0.13.0rc1.dev2026`` -> ``0.13.0``: the release part of a version string."""
    m = re.match(r"\d+(\.\d+){1,3}", version)
    if m is None:
        raise ValueError(f"not a JAX version: {version!r}")
    return m.group(0)


def probe_output_here(*args: str) -> str:
    """Every probe on this environment's JAX, each in a fresh process (forked child):
    the ``env`` record and the outcome of each probe, by id. Shared by test_drift and
    test_runtime (whose ``check_my_jax`` test reads the fast probes' outcomes here)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("XLA_FLAGS", None)
    folx_old = (
        ROOT / ".venv-drift" / jax.__version__ / "folx-old"
    )  # made by dev.py drift
    if folx_old.is_dir():
        env[probes.FOLX_OLD_ENV] = str(folx_old)
    # Kept in dev.py's keyed test cache (keyed on every installed version and the
    # package's sources, the probes among them): the probes are a function of both, so
    # a second run of the same commit in the same environment reads their outcomes.
    from tools import executed

    kept = executed.test_cache() / "drift_probes_here.jsonl"
    cacheable = executed.keyed() and not args and probes.FOLX_OLD_ENV not in env
    if cacheable and kept.is_file():
        stdout = kept.read_text()
    else:
        out = subprocess.run(
            [sys.executable, "-m", "beyondgrad.drift.child", "--jobs", "2", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        stdout = out.stdout
        if cacheable:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(stdout)
            tmp.replace(kept)
    return stdout


def run_probes_here(*args: str) -> tuple[dict, dict[str, drift.Outcome]]:
    """:func:`probe_output_here` read: the ``env`` record and each probe's outcome."""
    meta, outcomes = {}, {}
    for line in probe_output_here(*args).splitlines():
        rec = json.loads(line)
        if "env" in rec:
            meta = rec["env"]
        else:
            outcomes[rec["id"]] = drift.Outcome.from_dict(rec["outcome"])
    return meta, outcomes
