"""The code Chapter 5 shows agrees with the package functions that pack it up.

The chapter's functions are read from ``chapters/05_laplacians.md`` itself (the
function definitions of its code cells, by name), so the test follows the page. Each is
compared with its counterpart in ``beyondgrad.slater`` / ``beyondgrad.laplacian`` on a
small case in float64, where both agree to about 1e-13; the tolerance 1e-10 leaves a
margin of three orders of magnitude.
"""

from __future__ import annotations

import ast
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from references import hessian_trace  # tests/references.py

from beyondgrad import laplacian as L
from beyondgrad import runtime, slater, vmc, wavefunctions
from tools import book

runtime.ensure_cpu_devices(8)

RTOL = 1e-10
NAMES = [
    "loop_laplacian",
    "vmap_laplacian",
    "fl_affine",
    "fl_tanh",
    "orbital_derivatives",
    "row_formula",
    "local_energy",
    "vmc_energy_and_grad",
    "direct_energy_and_grad",
    "sharded_loop_laplacian",
    "sharded_vmc_step",
    "loop_laplacian_cast_basis",
]


@functools.lru_cache(maxsize=1)
def chapter() -> dict:
    """The chapter's function definitions, executed in a namespace like the page's."""
    text = (book.CHAPTERS / "05_laplacians.md").read_text()
    cells = re.findall(r"```\{code-cell\} ipython3\n(.*?)```", text, re.S)
    defs = {}
    for cell in cells:
        # drop the cell's options: ":key: value" lines or a YAML block between "---"
        cell = re.sub(r"\A---\n.*?\n---\n", "", cell, flags=re.S)
        if cell.startswith("%%"):  # a cell magic (%%raises): not a definition
            continue
        source = "\n".join(  # drop options and line magics (%load_ext)
            line for line in cell.splitlines() if not line.startswith((":", "%"))
        )
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name in NAMES:
                defs[node.name] = ast.get_source_segment(source, node)
    missing = sorted(set(NAMES) - set(defs))
    assert not missing, f"the chapter no longer defines {missing}"
    ns = {
        "jax": jax,
        "jnp": jnp,
        "lax": lax,
        "slater": slater,
        "vmc": vmc,
        "wavefunctions": wavefunctions,
        "functools": functools,
        "P": P,
    }
    ns["batch_log_psi"] = jax.vmap(wavefunctions.mlp_log_psi, in_axes=(None, 0))
    for name in NAMES:  # definition order: local_energy's default needs loop_laplacian
        exec(defs[name], ns)
    return ns


def rel(a, b) -> float:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b))
    return max(
        float(
            np.max(np.abs(np.asarray(x) - np.asarray(y)))
            / np.max(np.abs(np.asarray(y)))
        )
        for x, y in leaves
    )


@pytest.fixture(scope="module")
def case():
    with jax.enable_x64(True):
        params = wavefunctions.init_params(
            jax.random.key(5), 3, hidden=8, dtype=jnp.float64
        )
        walkers = jax.random.normal(jax.random.key(6), (16, 3, 3), jnp.float64)
    return params, walkers


def test_loop_and_vmap_laplacians_match_the_package(case):
    params, walkers = case
    ns = chapter()
    with jax.enable_x64(True):
        x = walkers[0].reshape(-1)
        f = lambda v: wavefunctions.mlp_log_psi(params, v.reshape(3, 3))  # noqa: E731
        for name, method in [("loop_laplacian", "loop"), ("vmap_laplacian", "vmap")]:
            g, lap = jax.jit(lambda v, fn=ns[name]: fn(f, v))(x)
            g_ref, lap_ref = L.grad_and_laplacian(f, x, method=method)
            assert rel((g, lap), (g_ref, lap_ref)) < RTOL, name
            assert rel(lap, hessian_trace(f, x)) < RTOL


def test_forward_laplacian_rules_match_the_hessian_trace():
    ns = chapter()
    with jax.enable_x64(True):
        k1, k2, k3 = jax.random.split(jax.random.key(8), 3)
        w1 = jax.random.normal(k1, (6, 16), jnp.float64)
        b1 = jax.random.normal(k2, (16,), jnp.float64)
        w2 = jax.random.normal(k3, (16, 2), jnp.float64)
        x = jnp.linspace(-1.0, 1.0, 6)
        start = (x, jnp.eye(6), jnp.zeros(6))
        value, grad, lap = ns["fl_affine"](
            ns["fl_tanh"](ns["fl_affine"](start, w1, b1)), w2, jnp.zeros(2)
        )
        mlp = lambda v: jnp.tanh(v @ w1 + b1) @ w2  # noqa: E731
        assert rel(value, mlp(x)) < RTOL
        assert rel(grad, jax.jacfwd(mlp)(x).T) < RTOL
        assert rel(lap, jnp.trace(jax.hessian(mlp)(x), axis1=1, axis2=2)) < RTOL


def test_row_formula_matches_the_package(case):
    params, walkers = case
    ns = chapter()
    with jax.enable_x64(True):
        orbitals = functools.partial(wavefunctions.mlp_orbitals, params)
        mine = ns["orbital_derivatives"](orbitals, walkers[0])
        theirs = slater.orbital_derivatives(orbitals, walkers[0])
        assert rel(mine, theirs) < RTOL
        assert (
            rel(ns["row_formula"](*mine), slater.slater_laplacian(orbitals, walkers[0]))
            < RTOL
        )


@pytest.mark.parametrize("estimator", ["vmc", "direct"])
def test_energy_and_gradient_match_the_package(case, estimator):
    params, walkers = case
    ns = chapter()
    fn = ns[f"{estimator}_energy_and_grad"]
    with jax.enable_x64(True):
        mine = jax.jit(fn)(params, walkers)
        theirs = vmc.energy_and_grad(
            wavefunctions.mlp_log_psi,
            params,
            walkers,
            method="loop",
            estimator=estimator,
        )
        assert rel(mine, theirs) < RTOL


def test_sharded_step_matches_one_device_and_the_package(case):
    params, walkers = case
    ns = chapter()
    ns["count"] = walkers.shape[0]
    mesh = runtime.demo_mesh(8, "data")
    step = jax.jit(
        jax.shard_map(
            ns["sharded_vmc_step"],
            mesh=mesh,
            in_specs=(P(), P("data")),
            out_specs=(P(), P()),
            check_vma=True,
        )
    )
    with jax.enable_x64(True):
        mine = step(params, walkers)
        one = jax.jit(ns["vmc_energy_and_grad"])(params, walkers)
        theirs = vmc.sharded_energy_and_grad(
            wavefunctions.mlp_log_psi, params, walkers, mesh, method="loop"
        )
        assert rel(mine, one) < RTOL
        assert rel(mine, theirs) < RTOL


def test_the_cast_basis_alone_still_fails_in_shard_map(case):
    """The chapter's TypeError cell: a cast basis with FermiNet's invariant 0.0 start."""
    params, walkers = jax.tree.map(lambda a: a.astype(jnp.float32), case)
    ns = chapter()
    mesh = runtime.demo_mesh(8, "data")

    def kinetic(x):
        f = lambda v: wavefunctions.mlp_log_psi(params, v.reshape(x.shape))  # noqa: E731
        g, lap = ns["loop_laplacian_cast_basis"](f, x.reshape(-1))
        return lap + g @ g

    run = jax.shard_map(
        jax.vmap(kinetic), mesh=mesh, in_specs=P("data"), out_specs=P("data")
    )
    with pytest.raises(
        TypeError, match="carry input and carry output must have equal types"
    ):
        jax.jit(run)(walkers)
