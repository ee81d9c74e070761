"""What users get wrong, across the public functions: each case names the call, the
exception class it must raise, and words the message must contain: the problem (the
argument or the offending value) and what is expected instead.

A case that cannot pass yet is marked ``xfail(strict=True)`` with the reason: when
the fix lands, the strict xfail turns into a failure and the mark must go.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from beyondgrad import (
    compat,
    drift,
    forward_laplacian,
    implicit,
    laplacian,
    linear,
    measure,
    raises,
    runtime,
    sharding,
    slater,
    tracers,
    vmc,
    wavefunctions,
)

KEY = jax.random.key(0)
X3 = jnp.ones(3)


def _sq(x):
    return jnp.sum(x**2)


def _mse(w, batch):
    return jnp.mean((batch[0] @ w - batch[1]) ** 2)


def _fp(x, p):
    return 0.5 * x + p


def _mesh():
    return runtime.demo_mesh(8, "data")


def _batch(n=16):
    return jnp.ones((n, 3)), jnp.ones(n)


def _walk(key, walkers=None, **kw):
    params = wavefunctions.init_params(KEY, 2, hidden=4)
    walkers = jnp.zeros((8, 2, 3)) if walkers is None else walkers
    opts = {"steps": 2, "step_size": 0.1, **kw}
    return vmc.sample_walkers(wavefunctions.mlp_log_psi, params, walkers, key, **opts)


def _energy(**kw):
    params = wavefunctions.init_params(KEY, 2, hidden=4)
    return vmc.local_energy(wavefunctions.mlp_log_psi, params, jnp.zeros((2, 3)), **kw)


def _params(n=2, **kw):
    return wavefunctions.init_params(KEY, n, hidden=4, **kw)


def _walkers(batch=8, n=2):
    grid = jnp.arange(batch * n * 3, dtype=jnp.float32).reshape(batch, n, 3)
    return 0.3 * jnp.sin(grid)


def _step(params=None, walkers=None, log_psi=None, **kw):
    params = _params() if params is None else params
    walkers = _walkers() if walkers is None else walkers
    log_psi = wavefunctions.mlp_log_psi if log_psi is None else log_psi
    return vmc.energy_and_grad(log_psi, params, walkers, **kw)


def _sharded(walkers=None, mesh=None, **kw):
    walkers = _walkers() if walkers is None else walkers
    mesh = _mesh() if mesh is None else mesh
    return vmc.sharded_energy_and_grad(
        wavefunctions.mlp_log_psi, _params(), walkers, mesh, **kw
    )


def _pooling_orbitals(x):
    """Written for (m, 3) positions, any m: pools over the electrons it is given."""
    xs = x.reshape(-1, 3)
    pooled = jnp.mean(jnp.tanh(xs @ jnp.ones((3, 4))), axis=0)
    return jnp.tanh(pooled * jnp.arange(1.0, 5.0)) * jnp.exp(-jnp.mean(xs * xs))


def _row_mixing_orbitals(x):
    """(..., 3) -> (..., 4); every row reads the mean of all rows (FermiNet-like)."""
    mean = jnp.mean(jnp.atleast_2d(x), axis=0)
    h = jnp.tanh((x + mean) @ jnp.arange(12.0).reshape(3, 4) / 10)
    return h * jnp.exp(-0.5 * jnp.sum(x * x, axis=-1, keepdims=True))


def _slater(orbitals, positions=None):
    positions = _walkers(1, 4)[0] if positions is None else positions
    return slater.slater_laplacian(orbitals, positions)


class Case(NamedTuple):
    id: str
    call: Callable[[], object]
    exc: type[BaseException]
    words: tuple[str, ...]  # each must appear in the message


CASES = [
    # ---- keys
    Case(
        "sample_walkers-key-int",
        lambda: _walk(0),
        TypeError,
        ("key", "jax.random.key"),
    ),
    Case(
        "sample_walkers-key-floats",
        lambda: _walk(jnp.zeros(2)),
        TypeError,
        ("key", "jax.random.key"),
    ),
    Case(
        "init_params-key-int",
        lambda: wavefunctions.init_params(0, 2),
        TypeError,
        ("key", "jax.random.key"),
    ),
    Case(
        "walker_keys-key-int",
        lambda: vmc.walker_keys(1, 4),
        TypeError,
        ("key", "jax.random.key"),
    ),
    Case(
        "hutchinson_probes-key-int",
        lambda: laplacian.hutchinson_probes(0, X3, 4),
        TypeError,
        ("key", "jax.random.key(0)", "int"),
    ),
    Case(
        "dot_product_test-key-int",
        lambda: linear.dot_product_test(lambda u: u, lambda v: v, X3, X3, 0),
        TypeError,
        ("key", "jax.random.key(0)", "int"),
    ),
    Case(
        "laplacian-hutchinson-without-key",
        lambda: laplacian.laplacian(_sq, X3, method="hutchinson"),
        ValueError,
        ("hutchinson", "needs a PRNG key", "key=jax.random.key(0)"),
    ),
    Case(
        "local_energy-hutchinson-without-key",
        lambda: _energy(method="hutchinson"),
        ValueError,
        ("hutchinson", "key=jax.random.key(0)"),
    ),
    # ---- dtypes
    Case(
        "data_parallel-int-params",
        lambda: sharding.data_parallel_value_and_grad(_mse, _mesh())(
            jnp.arange(3), _batch()
        ),
        TypeError,
        ("params", "int32", "floating-point", "jnp.float32"),
    ),
    Case(
        "data_parallel-python-int-params",
        lambda: sharding.data_parallel_value_and_grad(_mse, _mesh())(3, _batch()),
        TypeError,
        ("params", "int", "floating-point"),
    ),
    Case(
        "laplacian-int-x",
        lambda: laplacian.laplacian(_sq, jnp.arange(3)),
        TypeError,
        ("x", "floating-point", "int32", "astype"),
    ),
    Case(
        "vjp_from_linearize-int-primal",
        lambda: linear.vjp_from_linearize(_sq, jnp.arange(3)),
        TypeError,
        ("primals[0]", "int32", "float", "astype"),
    ),
    Case(
        "fixed_point-int-x0",
        lambda: implicit.fixed_point(_fp, jnp.arange(3), X3),
        TypeError,
        ("x0", "int32", "float"),
    ),
    # ---- shapes
    Case(
        "sample_walkers-walkers-2d",
        lambda: _walk(KEY, walkers=jnp.zeros((8, 6))),
        ValueError,
        ("walkers", "(batch, n, 3)", "(8, 6)"),
    ),
    Case(
        "laplacian-x-2d",
        lambda: laplacian.laplacian(_sq, jnp.ones((2, 3))),
        ValueError,
        ("1-D", "(2, 3)", "reshape(-1)"),
    ),
    Case(
        "data_parallel-batch-not-divisible",
        lambda: sharding.data_parallel_value_and_grad(_mse, _mesh())(
            jnp.ones(3), _batch(12)
        ),
        ValueError,
        ("batch", "size 12", "8 blocks", "not divisible by 8"),
    ),
    Case(
        "validate_spec-rank",
        lambda: sharding.validate_spec(_mesh(), P("data", None), (8,)),
        ValueError,
        ("2 entries", "rank 1", "at most 1"),
    ),
    Case(
        "validate_spec-not-divisible",
        lambda: sharding.validate_spec(_mesh(), P("data"), (12,)),
        ValueError,
        ("size 12", "not divisible by 8"),
    ),
    Case(
        "demo_mesh-shape-names-mismatch",
        lambda: runtime.demo_mesh((2, 2), ("a",)),
        ValueError,
        ("(2, 2)", "2 axes", "('a',)", "has 1"),
    ),
    Case(
        "demo_mesh-more-devices-than-exist",
        lambda: runtime.demo_mesh(64),
        RuntimeError,
        ("64 devices", "ensure_cpu_devices(64)"),
    ),
    # ---- counts
    Case(
        "sample_walkers-steps-0",
        lambda: _walk(KEY, steps=0),
        ValueError,
        ("steps", "positive int", "0"),
    ),
    Case(
        "sample_walkers-steps-float",
        lambda: _walk(KEY, steps=2.5),
        TypeError,
        ("steps", "positive int", "2.5"),
    ),
    Case(
        "sample_walkers-negative-step-size",
        lambda: _walk(KEY, step_size=-1.0),
        ValueError,
        ("step_size", "positive", "-1.0"),
    ),
    Case(
        "init_params-no-electrons",
        lambda: wavefunctions.init_params(KEY, 0),
        ValueError,
        ("n_electrons", "positive int", "0"),
    ),
    Case(
        "walker_keys-count-0",
        lambda: vmc.walker_keys(KEY, 0),
        ValueError,
        ("count", "positive", "0"),
    ),
    Case(
        "hutchinson_probes-no-samples",
        lambda: laplacian.hutchinson_probes(KEY, X3, 0),
        ValueError,
        ("num_samples", "positive int", "0"),
    ),
    Case(
        "ensure_cpu_devices-0",
        lambda: runtime.ensure_cpu_devices(0),
        ValueError,
        ("n", ">= 1", "0"),
    ),
    Case(
        "ensure_cpu_devices-str",
        lambda: runtime.ensure_cpu_devices("8"),
        TypeError,
        ("n", "int", "str"),
    ),
    Case(
        "demo_mesh-shape-0",
        lambda: runtime.demo_mesh(0),
        ValueError,
        ("positive ints", "(0,)"),
    ),
    Case(
        "measure-time_calls-repeats-0",
        lambda: measure.time_calls([(_sq, (X3,))], repeats=0),
        ValueError,
        ("repeats", "int >= 1", "0"),
    ),
    Case(
        "measure-time_call-repeats-bool",
        lambda: measure.time_call(_sq, X3, repeats=True),
        TypeError,
        ("repeats", "int >= 1", "True"),
    ),
    Case(
        "measure-time_calls-negative-min-time",
        lambda: measure.time_calls([(_sq, (X3,))], min_time=-1.0),
        ValueError,
        ("min_time", ">= 0", "-1.0"),
    ),
    Case(
        "measure-time_calls-empty",
        lambda: measure.time_calls([]),
        ValueError,
        ("at least one", "(function, args)"),
    ),
    Case(
        "measure-time_calls-not-a-pair",
        lambda: measure.time_calls([_sq]),
        TypeError,
        ("calls[0]", "(function, args_tuple) pair"),
    ),
    Case(
        "fixed_point-max-iter-0",
        lambda: implicit.fixed_point(_fp, X3, X3, max_iter=0),
        ValueError,
        ("max_iter", "int >= 1", "0"),
    ),
    Case(
        "fixed_point-negative-tol",
        lambda: implicit.fixed_point(_fp, X3, X3, tol=-1.0),
        ValueError,
        ("tol", ">= 0", "-1.0"),
    ),
    Case(
        "tracers-argnum-out-of-range",
        lambda: tracers.inspect_transformations(_sq, X3, argnum=2),
        ValueError,
        ("argnum", "1 positional argument", "2"),
    ),
    Case(
        "dot_product_test-rtol-0",
        lambda: linear.dot_product_test(
            lambda u: u, lambda v: v, X3, X3, KEY, linearity_rtol=0.0
        ),
        ValueError,
        ("linearity_rtol", "> 0", "0.0"),
    ),
    # ---- option names and values
    Case(
        "laplacian-unknown-method",
        lambda: laplacian.laplacian(_sq, X3, method="nope"),
        ValueError,
        ("'nope'", "'hessian'", "'hutchinson'"),
    ),
    Case(
        "laplacian-option-of-another-method",
        lambda: laplacian.laplacian(_sq, X3, method="loop", num_samples=4),
        TypeError,
        ("num_samples", "hutchinson", "loop"),
    ),
    Case(
        "local_energy-unknown-method",
        lambda: _energy(method="nope"),
        ValueError,
        ("'nope'", "'loop'", "'folx'"),
    ),
    Case(
        "data_parallel-unknown-reduction",
        lambda: sharding.data_parallel_value_and_grad(_mse, _mesh(), reduction="avg"),
        ValueError,
        ("reduction", "'mean' or 'sum'", "'avg'"),
    ),
    Case(
        "data_parallel-axis-not-in-mesh",
        lambda: sharding.data_parallel_value_and_grad(_mse, _mesh(), "model"),
        ValueError,
        ("'model'", "('data',)"),
    ),
    Case(
        "data_parallel-mesh-is-a-dict",
        lambda: sharding.data_parallel_value_and_grad(_mse, {"data": 8}),
        TypeError,
        ("mesh", "jax.sharding.Mesh", "dict"),
    ),
    Case(
        "data_parallel-loss-not-callable",
        lambda: sharding.data_parallel_value_and_grad(3, _mesh()),
        TypeError,
        ("loss_fn", "function", "int"),
    ),
    Case(
        "validate_spec-string",
        lambda: sharding.validate_spec(_mesh(), "data"),
        TypeError,
        ("PartitionSpec", "P('data')", "string"),
    ),
    Case(
        "validate_spec-unknown-axis",
        lambda: sharding.validate_spec(_mesh(), P("model")),
        ValueError,
        ("'model'", "not in the mesh", "('data',)"),
    ),
    Case(
        "validate_spec-axis-twice",
        lambda: sharding.validate_spec({"a": 2, "b": 2}, P("a", "a")),
        ValueError,
        ("'a' twice", "one dimension"),
    ),
    Case(
        "explain_vma-in-specs-string",
        lambda: sharding.explain_vma(lambda a: a, _mesh(), "data", jnp.ones(8)),
        TypeError,
        ("in_specs", "P('data')", "string"),
    ),
    Case(
        "demo_mesh-names-twice",
        lambda: runtime.demo_mesh((2, 2), ("a", "a")),
        ValueError,
        ("axis_names", "distinct", "('a', 'a')"),
    ),
    Case(
        "demo_mesh-axis-types",
        lambda: runtime.demo_mesh(2, axis_types="manual"),
        ValueError,
        ("axis_types", "'auto' or 'explicit'", "'manual'"),
    ),
    Case(
        "compat-make_mesh-axis-types",
        lambda: compat.make_mesh((2,), ("a",), axis_types="manual"),
        ValueError,
        ("axis_types", "'auto' or 'explicit'", "'manual'"),
    ),
    Case(
        "compat-set_direct_linearize-str",
        lambda: compat.set_direct_linearize("yes"),
        TypeError,
        ("True or False", "'yes'"),
    ),
    Case(
        "glue-name-not-str",
        lambda: runtime.glue(3, 1.0),
        TypeError,
        ("glue name", "str", "int"),
    ),
    Case(
        "glue-name-empty",
        lambda: runtime.glue("  ", 1.0),
        ValueError,
        ("glue name", "non-empty"),
    ),
    Case(
        "fixed_point-unknown-tangent-solver",
        lambda: implicit.fixed_point(_fp, X3, X3, tangent_solver="qr"),
        ValueError,
        ("tangent_solver", "'dense'", "'qr'"),
    ),
    Case(
        "tracers-unknown-transformation",
        lambda: tracers.transform(_sq, "jitt"),
        ValueError,
        ("'jitt'", "valid names", "jit(grad)"),
    ),
    Case(
        "tracers-not-callable",
        lambda: tracers.transform(3, "jit"),
        TypeError,
        ("fn", "callable", "int"),
    ),
    Case(
        "linear-grad_tracer_name-str",
        lambda: linear.grad_tracer_name("yes"),
        TypeError,
        ("use_direct_linearize", "None, True or False", "'yes'"),
    ),
    Case(
        "drift-unknown-probe",
        lambda: drift.outcome("nope", "0.8.2"),
        ValueError,
        ("'nope'", "drift.probe_ids()"),
    ),
    Case(
        "drift-version-not-a-release",
        lambda: drift.outcome(drift.probe_ids()[0], "latest"),
        ValueError,
        ("'latest'", "'0.8.2'"),
    ),
    Case(
        "drift-unknown-kind",
        lambda: drift.first_version(drift.probe_ids()[0], "ok"),
        ValueError,
        ("kind", "'returns'", "'ok'"),
    ),
    Case(
        "drift-table-of-one-str",
        lambda: drift.table("abc"),
        TypeError,
        ("probe_ids", "list", "[probe_id]"),
    ),
    Case(
        "raises-expect_error-not-a-class",
        lambda: raises.expect_error(3).__enter__(),
        TypeError,
        ("exception class", "TypeError", "3"),
    ),
    Case(
        "raises-unknown-exception-name",
        lambda: raises.resolve_exception("NoSuchError", {}),
        ValueError,
        ("'NoSuchError'", "import it first", "full dotted name"),
    ),
    # ---- vmc, wavefunctions, slater: sizes that do not match
    Case(
        "energy_and_grad-params-for-4-walkers-of-3",
        lambda: _step(params=_params(4), walkers=_walkers(8, 3)),
        ValueError,
        ("made for 4 electrons", "hold 3 electrons", "init_params(key, 3)"),
    ),
    Case(
        "sample_walkers-params-for-4-walkers-of-3",
        lambda: vmc.sample_walkers(
            wavefunctions.mlp_log_psi,
            _params(4),
            _walkers(8, 3),
            KEY,
            steps=1,
            step_size=0.1,
        ),
        ValueError,
        ("made for 4 electrons", "hold 3 electrons"),
    ),
    Case(
        "local_energy-params-for-2-positions-of-3",
        lambda: vmc.local_energy(
            wavefunctions.mlp_log_psi, _params(2), _walkers(1, 3)[0]
        ),
        ValueError,
        ("made for 2 electrons", "hold 3 electrons", "shape (2, 3)"),
    ),
    Case(
        "mlp_slater_laplacian-params-for-4-positions-of-3",
        lambda: wavefunctions.mlp_slater_laplacian(_params(4), _walkers(1, 3)[0]),
        ValueError,
        ("made for 4 electrons", "hold 3 electrons"),
    ),
    Case(
        "slater_matrix-5-orbitals-4-electrons",
        lambda: slater.slater_matrix(
            functools.partial(wavefunctions.mlp_orbitals, _params(5)),
            _walkers(1, 4)[0],
        ),
        ValueError,
        ("return 5 values", "hold 4 electrons", "one orbital per electron"),
    ),
    Case(
        "energy_and_grad-one-configuration-not-a-batch",
        lambda: _step(walkers=_walkers(1, 2)[0]),
        ValueError,
        ("walkers", "(batch, n, 3)", "(2, 3)", "walkers[None]"),
    ),
    Case(
        "energy_and_grad-no-walkers",
        lambda: _step(walkers=jnp.zeros((0, 2, 3))),
        ValueError,
        ("at least one walker", "(0, 2, 3)"),
    ),
    Case(
        "energy_and_grad-log_psi-not-scalar",
        lambda: _step(log_psi=lambda p, x: jnp.sum(x, axis=1) * p["b2"][0]),
        ValueError,
        ("scalar log|psi|", "(2, 3)", "got (2,)"),
    ),
    Case(
        "sample_walkers-log_psi-batched",
        lambda: vmc.sample_walkers(
            lambda p, x: jnp.sum(x, axis=-1),
            _params(),
            _walkers(),
            KEY,
            steps=1,
            step_size=0.1,
        ),
        ValueError,
        ("scalar log|psi|", "got (2,)", "batch over walkers"),
    ),
    Case(
        "potential_energy-positions-2-columns",
        lambda: vmc.potential_energy(jnp.ones((2, 2))),
        ValueError,
        ("positions", "(n, 3)", "(2, 2)"),
    ),
    Case(
        "mlp_orbitals-r-of-2-coordinates",
        lambda: wavefunctions.mlp_orbitals(_params(), jnp.ones((4, 2))),
        ValueError,
        ("r", "(..., 3)", "(4, 2)"),
    ),
    Case(
        "mlp_log_psi-params-missing-keys",
        lambda: wavefunctions.mlp_log_psi({"w1": jnp.ones((3, 4))}, jnp.ones((2, 3))),
        ValueError,
        ("init_params", "keys", "['w1']"),
    ),
    Case(
        "row_formula-mismatched-shapes",
        lambda: slater.row_formula(jnp.eye(3), jnp.zeros((3, 3)), jnp.zeros((3, 3))),
        ValueError,
        ("(n, n), (n, n, 3), (n, n)", "(3, 3)"),
    ),
    # ---- slater: orbitals that are not single-particle, or not real
    Case(
        "slater_laplacian-complex-orbitals",
        lambda: _slater(lambda r: jnp.exp(1j * r[0]) * jnp.arange(1.0, 5.0)),
        TypeError,
        ("complex", "complex64", "real orbitals only"),
    ),
    Case(
        "slater_laplacian-integer-orbitals",
        lambda: _slater(lambda r: jnp.arange(4)),
        TypeError,
        ("floating-point", "int32"),
    ),
    Case(
        "slater_laplacian-orbitals-pool-over-electrons",
        lambda: _slater(_pooling_orbitals),
        ValueError,
        ("pool over all the electrons", "laplacian.grad_and_laplacian", "loop"),
    ),
    Case(
        "slater_laplacian-rows-read-all-electrons",
        lambda: _slater(_row_mixing_orbitals),
        ValueError,
        (
            "read all electrons",
            "row i is not orbitals(position i)",
            "forward_laplacian",
        ),
    ),
    Case(
        "slater_laplacian-orbitals-for-(n,3)-only",
        lambda: _slater(lambda x: x.reshape(4, 3) @ jnp.ones((3, 4))),
        ValueError,
        ("failed on one electron's position of shape (3,)", "single-particle"),
    ),
    Case(
        "slater_laplacian-orbitals-not-callable",
        lambda: _slater(jnp.ones(4)),
        TypeError,
        ("orbitals", "function r (3,) -> (n,)"),
    ),
    Case(
        "slater_laplacian-int-positions",
        lambda: _slater(jnp.sin, jnp.ones((4, 3), jnp.int32)),
        TypeError,
        ("positions", "floating-point", "int32", "astype"),
    ),
    # ---- vmc, wavefunctions: keys, dtypes, counts and options
    Case(
        "energy_and_grad-int-params",
        lambda: _step(params=jax.tree.map(lambda a: a.astype(jnp.int32), _params())),
        TypeError,
        ("params['b1']", "int32", "floating-point"),
    ),
    Case(
        "energy_and_grad-log_psi-complex",
        lambda: _step(log_psi=lambda p, x: jnp.sum(x) * (1 + 1j) * p["b2"][0]),
        TypeError,
        ("real floating-point", "complex64", "jnp.abs"),
    ),
    Case(
        "energy_and_grad-log_psi-not-callable",
        lambda: _step(log_psi={"w1": 1}),
        TypeError,
        ("log_psi", "function", "dict"),
    ),
    Case(
        "energy_and_grad-key-given-to-loop",
        lambda: _step(method="loop", key=KEY),
        TypeError,
        ("key", "method='hutchinson'", "method='loop'"),
    ),
    Case(
        "energy_and_grad-hutchinson-key-int",
        lambda: _step(method="hutchinson", key=3),
        TypeError,
        ("key", "jax.random.key(0)", "int 3"),
    ),
    Case(
        "energy_and_grad-unknown-estimator",
        lambda: _step(estimator="exact"),
        ValueError,
        ("estimator", "'vmc' or 'direct'", "'exact'"),
    ),
    Case(
        "sample_walkers-int-walkers",
        lambda: _walk(KEY, walkers=jnp.zeros((8, 2, 3), jnp.int32)),
        TypeError,
        ("walkers", "floating-point", "int32", "astype"),
    ),
    Case(
        "walker_keys-count-float",
        lambda: vmc.walker_keys(KEY, 2.5),
        TypeError,
        ("count", "positive int", "2.5"),
    ),
    Case(
        "potential_energy-omega-str",
        lambda: vmc.potential_energy(jnp.ones((2, 3)), omega="1"),
        TypeError,
        ("omega", "Python number", "str"),
    ),
    Case(
        "sharded-mesh-is-a-dict",
        lambda: _sharded(mesh={"data": 8}),
        TypeError,
        ("mesh", "jax.sharding.Mesh", "dict"),
    ),
    Case(
        "sharded-walkers-not-divisible",
        lambda: _sharded(walkers=_walkers(6)),
        ValueError,
        ("number of walkers (6)", "divisible", "'data' (8)"),
    ),
    Case(
        "sharded-axis-not-in-mesh",
        lambda: _sharded(axis_name="model"),
        ValueError,
        ("'model'", "not an axis", "('data',)"),
    ),
    Case(
        "init_params-int-dtype",
        lambda: wavefunctions.init_params(KEY, 2, dtype=jnp.int32),
        TypeError,
        ("dtype", "floating-point", "int32"),
    ),
    Case(
        "init_params-hidden-0",
        lambda: wavefunctions.init_params(KEY, 2, hidden=0),
        ValueError,
        ("hidden", "positive int", "0"),
    ),
    # ---- laplacian: options of another method, bad keys and shapes
    Case(
        "laplacian-key-given-to-loop",
        lambda: laplacian.laplacian(_sq, X3, method="loop", key=KEY),
        TypeError,
        ("key", "method='hutchinson'", "method='loop'"),
    ),
    Case(
        "laplacian-sparsity-given-to-vmap",
        lambda: laplacian.laplacian(_sq, X3, method="vmap", sparsity_threshold=2),
        TypeError,
        ("sparsity_threshold", "method='folx'", "method='vmap'"),
    ),
    Case(
        "laplacian-folx-negative-sparsity",
        lambda: laplacian.laplacian(_sq, X3, method="folx", sparsity_threshold=-1),
        ValueError,
        ("sparsity_threshold", ">= 0", "-1"),
    ),
    Case(
        "laplacian-hutchinson-key-floats",
        lambda: laplacian.laplacian(_sq, X3, method="hutchinson", key=jnp.zeros(2)),
        TypeError,
        ("key", "jax.random.key(0)", "float32"),
    ),
    Case(
        "laplacian-f-not-scalar",
        lambda: laplacian.laplacian(jnp.sin, X3),
        ValueError,
        ("scalar", "(3,)"),
    ),
    Case(
        "laplacian-check_method-not-a-str",
        lambda: laplacian.check_method(None),
        ValueError,
        ("unknown Laplacian method None", "'loop'", "'folx'"),
    ),
    Case(
        "kinetic_energy-int-x",
        lambda: laplacian.kinetic_energy(_sq, jnp.ones((2, 3), jnp.int32)),
        TypeError,
        ("x", "floating-point", "int32"),
    ),
    Case(
        "hutchinson_probes-x-2d",
        lambda: laplacian.hutchinson_probes(KEY, jnp.ones((2, 3)), 4),
        ValueError,
        ("1-D", "(2, 3)", "reshape(-1)"),
    ),
    Case(
        "row_sums-gradient-orbital-last",
        lambda: slater.row_sums(jnp.eye(3), jnp.zeros((3, 3, 2)), jnp.zeros((3, 3))),
        ValueError,
        ("(n, 3, n)", "orbital_jets", "(3, 3, 2)"),
    ),
    # ------------------------------------------ solvers (issue #27 items 3 and 6)
    Case(
        "fixed_point-nan-param",
        lambda: implicit.fixed_point(_fp, X3, jnp.asarray([1.0, jnp.nan, 1.0])),
        implicit.SolverError,
        ("did not converge", "residual is nan", "params", "throw=False"),
    ),
    Case(
        "fixed_point-not-converged",
        lambda: implicit.fixed_point(lambda x, p: 2 * x + p, X3, X3, max_iter=5),
        implicit.SolverError,
        ("did not converge", "max_iter=5", "tol = 1e-06", "throw=False"),
    ),
    Case(
        "fixed_point-throw-not-bool",
        lambda: implicit.fixed_point(_fp, X3, X3, throw="yes"),
        TypeError,
        ("throw", "True", "False", "'yes'"),
    ),
    Case(
        "fixed_point-unrolled-tangent-solver",
        lambda: implicit.fixed_point(
            _fp, X3, X3, adjoint="unrolled", tangent_solver="gmres"
        ),
        TypeError,
        ("tangent_solver='gmres'", "ignored", "adjoint='implicit'"),
    ),
    Case(
        "fixed_point-memory-without-anderson",
        lambda: implicit.fixed_point(_fp, X3, X3, memory=3),
        TypeError,
        ("memory=3", "solver='anderson'", "solver='iterate' would ignore it"),
    ),
    Case(
        "fixed_point-unknown-solver",
        lambda: implicit.fixed_point(_fp, X3, X3, solver="broyden"),
        ValueError,
        ("solver must be one of", "'anderson'", "'broyden'"),
    ),
    Case(
        "root_find-unknown-adjoint",
        lambda: implicit.root_find(_fp, X3, X3, adjoint="backsolve"),
        ValueError,
        ("adjoint must be one of", "'unrolled'", "'backsolve'"),
    ),
    # ---- issue 26 item 4 (folxcases): shapes and dtypes named at the boundary
    Case(
        "logdet_and_inverse-not-square",
        lambda: slater.logdet_and_inverse(jnp.ones((3, 4))),
        ValueError,
        ("square matrix (n, n)", "(3, 4)"),
    ),
    Case(
        "logdet_and_inverse-1d",
        lambda: slater.logdet_and_inverse(jnp.ones(3)),
        ValueError,
        ("square matrix (n, n)", "(3,)"),
    ),
    Case(
        "logdet_and_inverse-int",
        lambda: slater.logdet_and_inverse(jnp.eye(3, dtype=jnp.int32)),
        TypeError,
        ("floating-point", "int32"),
    ),
    Case(
        "laplacian-f-complex-valued",
        lambda: laplacian.laplacian(lambda x: jnp.sum(x) * 1j, X3),
        TypeError,
        ("real floating-point scalar", "complex64", "jnp.real"),
    ),
    Case(
        "laplacian-f-integer-valued",
        lambda: laplacian.laplacian(lambda x: jnp.sum(x).astype(jnp.int32), X3),
        TypeError,
        ("real floating-point scalar", "int32"),
    ),
    Case(
        "basis-x-2d",
        lambda: laplacian.basis(jnp.ones((2, 3))),
        ValueError,
        ("1-D", "(2, 3)", "reshape(-1)"),
    ),
    Case(
        "slater_laplacian-orbitals-made-for-3-positions-of-4",
        lambda: _slater(lambda r: jnp.tanh(r * jnp.arange(1.0, 4.0))),
        ValueError,
        ("return 3 values", "hold 4 electrons", "(4, 3)"),
    ),
    # fixes (review of issue 26): swapped arguments, dtypes of row_sums, floor's
    # while_loop error, a plain-jnp log_psi with parameters made for another size
    Case(
        "mlp_log_psi-arguments-swapped",
        lambda: wavefunctions.mlp_log_psi(_walkers(1, 2)[0], _params()),
        TypeError,
        ("arguments swapped?", "mlp_log_psi(params, positions)"),
    ),
    Case(
        "slater_laplacian-arguments-swapped",
        lambda: slater.slater_laplacian(_walkers(1, 4)[0], jnp.tanh),
        TypeError,
        ("arguments swapped?", "slater_laplacian(orbitals, positions)"),
    ),
    Case(
        "row_sums-integer-inverse",
        lambda: slater.row_sums(
            jnp.eye(3, dtype=jnp.int32), jnp.ones((3, 3, 3)), jnp.ones((3, 3))
        ),
        TypeError,
        ("real floating-point", "b of dtype int32"),
    ),
    Case(
        "row_sums-complex-inverse",
        lambda: slater.row_sums(
            jnp.eye(3, dtype=jnp.complex64), jnp.ones((3, 3, 3)), jnp.ones((3, 3))
        ),
        TypeError,
        ("real floating-point", "b of dtype complex64"),
    ),
    Case(
        "laplacian-loop-while_loop",
        lambda: laplacian.laplacian(_while_sum, X3, method="loop"),
        ValueError,
        ("while_loop", "forward_laplacian"),
    ),
    Case(
        "laplacian-vmap-while_loop",
        lambda: laplacian.laplacian(_while_sum, X3, method="vmap"),
        ValueError,
        ("while_loop", "forward_laplacian"),
    ),
    Case(
        "energy_and_grad-own-log_psi-params-for-4-walkers-of-3",
        lambda: vmc.energy_and_grad(
            _own_log_psi, {"w": jnp.ones((3, 4))}, _walkers(2, 3)
        ),
        ValueError,
        ("(3, 3)", "3 electrons", "(3, 4)", "another number of electrons"),
    ),
    Case(
        "elementwise-holomorphic-str",
        lambda: forward_laplacian.elementwise(holomorphic="no"),
        TypeError,
        ("holomorphic", "True or False", "str"),
    ),
    Case(
        "generic-reason-int",
        lambda: forward_laplacian.generic(reason=3),
        TypeError,
        ("reason", "a str", "int"),
    ),
    Case(
        "check_setup-n_devices-float",
        lambda: runtime.check_setup(8.0),
        TypeError,
        ("n_devices", "int", "float"),
    ),
    Case(
        "check_setup-n_devices-zero",
        lambda: runtime.check_setup(0),
        ValueError,
        ("n_devices", "positive", "0"),
    ),
    Case(
        "spec_str-a-tuple",
        lambda: sharding.spec_str(("data", None)),
        TypeError,
        ("spec", "PartitionSpec", "tuple"),
    ),
    Case(
        "VmaReport.count-a-Primitive",
        lambda: sharding.explain_vma(
            lambda x: 2 * x, _mesh(), P("data"), jnp.ones(8), out_specs=P("data")
        ).count(jax.lax.psum_p),
        TypeError,
        ("primitive", "a str", f"pass its name, {jax.lax.psum_p.name!r}"),
    ),
]


def _while_sum(v):
    """A ``lax.while_loop`` (reverse mode cannot differentiate it)."""
    state = jax.lax.while_loop(
        lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] * v), (0, v)
    )
    return jnp.sum(state[1])


def _own_log_psi(params, positions):
    """A plain-jnp log_psi that checks nothing itself."""
    return jnp.linalg.slogdet(jnp.tanh(positions @ params["w"]))[1]


def _id(param) -> str:
    case = param.values[0] if hasattr(param, "values") else param
    return case.id


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_bad_input_is_refused_with_a_clear_message(case: Case):
    with pytest.raises(case.exc) as info:
        case.call()
    message = str(info.value)
    missing = [w for w in case.words if w not in message]
    assert not missing, f"message lacks {missing}: {message}"


def test_the_table_is_large_and_ids_are_unique():
    ids = [_id(c) for c in CASES]
    assert len(ids) >= 40 and len(set(ids)) == len(ids)


# ---- the one checking policy (issue 36 item 5) --------------------------------------

_CHECKS_HELPERS = (
    "function",
    "integer",
    "number",
    "boolean",
    "choice",
    "ignored_option",
    "float_leaves",
)
_NUMERIC_KINDS = {"bool", "int", "float", "complex", "_is_int", "_is_real"}
# checks of a callable that are not "is it a function" (allowed outside _checks):
# arguments in the wrong order, and the shape of a (function, args) pair
_CALLABLE_ALLOWED = {
    ("slater.py", "_orbitals_first"),
    ("measure.py", "_check_calls"),
}
# a recorded benchmark file read back (its content, not an argument: ValueError)
_NUMERIC_ALLOWED = {("ch5.py", "_check_record")}


def _kind_checks_outside_the_module() -> list[str]:
    """Every ``if`` in the package that tests whether a value is callable, a bool, an
    int or a float and raises: such checks belong in ``beyondgrad._checks``."""
    import ast
    from pathlib import Path

    import beyondgrad

    root = Path(beyondgrad.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "_checks.py":
            continue
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if not isinstance(node, ast.If):
                    continue
                if not any(isinstance(s, ast.Raise) for s in node.body):
                    continue
                names = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                calls = {
                    n.func.id
                    for n in ast.walk(node.test)
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                }
                numeric = "isinstance" in calls and names & _NUMERIC_KINDS
                numeric = numeric or calls & {"_is_int", "_is_real"}
                numeric = numeric and (path.name, func.name) not in _NUMERIC_ALLOWED
                is_callable = "callable" in calls and (
                    (path.name, func.name) not in _CALLABLE_ALLOWED
                )
                if numeric or is_callable:
                    found.append(
                        f"{path.relative_to(root)}:{node.lineno} ({func.name})"
                    )
    return sorted(set(found))


def test_kind_checks_go_through_the_one_checking_module():
    """The package's functions check 'is it a function / an int / a number / a bool'
    through ``beyondgrad._checks`` only (one policy: wrong kind -> TypeError, wrong
    value -> ValueError, an option the method ignores -> TypeError)."""
    assert _kind_checks_outside_the_module() == []


def test_the_checking_module_raises_by_the_policy():
    from beyondgrad import _checks

    kind = [
        lambda: _checks.function(3, "f"),
        lambda: _checks.integer(2.0, "n", minimum=1),
        lambda: _checks.integer(True, "n"),
        lambda: _checks.number("1", "tol", above=0),
        lambda: _checks.number(False, "tol"),
        lambda: _checks.boolean(1, "check"),
        lambda: _checks.float_leaves({"a": jnp.zeros(2, jnp.int32)}, "params"),
        lambda: _checks.ignored_option("key", KEY, "hutchinson", "loop"),
    ]
    value = [
        lambda: _checks.integer(0, "n", minimum=1),
        lambda: _checks.number(0.0, "tol", above=0),
        lambda: _checks.number(float("nan"), "tol", at_least=0),
        lambda: _checks.number(1.0, "radius", above=0, below=1),
        lambda: _checks.choice("x", "method", ("a", "b")),
        lambda: _checks.float_leaves({}, "params", empty="pass a float array"),
    ]
    for call in kind:
        with pytest.raises(TypeError, match="must be|applies only to"):
            call()
    for call in value:
        with pytest.raises(ValueError, match="must be|has no array leaves"):
            call()
    # accepted values pass and come back
    assert _checks.integer(3, "n", minimum=1) == 3
    assert _checks.number(2, "tol", above=0) == 2.0
    assert _checks.boolean(None, "flag", none_ok=True) is None
    _checks.float_leaves(
        {"a": jnp.zeros(2), "b": jnp.zeros(1, jnp.complex64)}, "p", complex_ok=True
    )


def test_the_table_reaches_every_helper_of_the_checking_module(monkeypatch):
    """Each helper of ``beyondgrad._checks`` raises for at least one case of the
    table (called through a public function), with the class the policy says."""
    from beyondgrad import _checks

    raised: dict[str, type[BaseException]] = {}

    def recording(name, helper):
        def wrapped(*args, **kwargs):
            try:
                return helper(*args, **kwargs)
            except (TypeError, ValueError) as e:
                raised.setdefault(name, type(e))
                raise

        return wrapped

    for name in _CHECKS_HELPERS:
        monkeypatch.setattr(_checks, name, recording(name, getattr(_checks, name)))
    for case in CASES:
        if set(_CHECKS_HELPERS) <= set(raised):
            break
        try:
            case.call()
        except Exception:
            pass
    assert sorted(raised) == sorted(_CHECKS_HELPERS)
    assert raised["ignored_option"] is TypeError and raised["function"] is TypeError
    assert raised["choice"] is ValueError
