"""What the drift record says the installed JAX does: the expected outcome of a probe.

Tests that depend on the JAX version take their expectation from here, never from an
exact version string. A version the record has not seen is compared with the newest
recorded version not newer than it, so an upgrade runs the tests (and fails them where
the behaviour moved: re-record with ``python3 dev.py drift`` and update the test).
"""

from __future__ import annotations

import re

import jax

from beyondgrad import drift


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
