"""The forward-Laplacian interpreter on the layers neural wavefunctions are built from
(``tools/rule_coverage.py``): every floating-point primitive they emit on the running
JAX has a rule or a deliberate fallback. ``python3 tools/rule_coverage.py`` runs the
same walk on every supported release and also compares each layer's Laplacian with the
float64 Hessian trace (the values are checked here by ``tests/test_folx_cases.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tools import rule_coverage


def test_no_layer_reaches_the_generic_rule():
    got = rule_coverage.report(values=False)
    assert got["jax"] == jax.__version__ and got["errors"] == {}
    assert got["uncovered"] == {}, "primitives with no rule and no fallback"


def test_the_walk_sees_inside_sub_jaxprs():
    jaxpr = jax.make_jaxpr(lambda v: jax.jit(jnp.tanh)(v))(jnp.ones(2))
    assert "tanh" in {p.name for p in rule_coverage.primitives(jaxpr)}
