import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P
from references import hessian_trace  # tests/references.py

from beyondgrad import compat, runtime


@pytest.fixture(scope="module")
def mesh():
    return runtime.demo_mesh((2, 4), ("data", "model"))


def run_in_shard_map(mesh, fn, x, in_spec=None, out_spec=None):
    """Run fn per shard and return what it recorded (shard_map output itself is unused)."""
    seen = {}

    def body(block):
        seen.update(fn(block))
        return lax.psum(jnp.sum(block), ("data", "model"))

    in_spec = P("data", "model") if in_spec is None else in_spec
    out_spec = P() if out_spec is None else out_spec
    jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec)(x)
    return seen


def test_varying_axes_follow_the_in_specs(mesh):
    x = jnp.arange(16.0).reshape(2, 8)

    def probe(b):
        return {
            "block": compat.varying_axes(b),
            "constant": compat.varying_axes(jnp.ones(3)),
            "row_sum": compat.varying_axes(lax.psum(b, "model")),
            "mixed": compat.varying_axes(b + jnp.ones_like(b)),
        }

    seen = run_in_shard_map(mesh, probe, x)
    assert seen == {
        "block": frozenset({"data", "model"}),
        "constant": frozenset(),
        "row_sum": frozenset({"data"}),
        "mixed": frozenset({"data", "model"}),
    }


def test_varying_axes_outside_shard_map_is_empty():
    assert compat.varying_axes(jnp.ones(3)) == frozenset()
    assert compat.varying_axes(np.ones(3, np.float32)) == frozenset()


def test_pcast_varying_changes_type_not_value(mesh):
    x = jnp.arange(16.0).reshape(2, 8)

    def probe(b):
        c = jnp.arange(3.0)
        tree = compat.pcast_varying({"a": c, "b": (c, c)}, "model")
        both = compat.pcast_varying(c, ("data", "model"))
        again = compat.pcast_varying(both, ("data", "model"))  # idempotent
        return {
            "tree": {
                compat.varying_axes(leaf) for leaf in jax.tree_util.tree_leaves(tree)
            },
            "both": compat.varying_axes(both),
            "again": compat.varying_axes(again),
            "none": compat.varying_axes(compat.pcast_varying(c, ())),
        }

    seen = run_in_shard_map(mesh, probe, x)
    assert seen["tree"] == {frozenset({"model"})}
    assert seen["both"] == seen["again"] == frozenset({"data", "model"})
    assert seen["none"] == frozenset()


def test_pcast_varying_transpose_is_psum(mesh):
    # d/dw of sum over devices of (w * block) = psum of the block sums: the cast's transpose.
    x = jnp.arange(16.0).reshape(2, 8)

    def per_shard_grad(block):
        def loss(w):
            return jnp.sum(compat.pcast_varying(w, ("data", "model")) * block)

        return jax.grad(loss)(1.0)

    g = jax.shard_map(
        per_shard_grad, mesh=mesh, in_specs=P("data", "model"), out_specs=P()
    )(x)
    np.testing.assert_allclose(g, jnp.sum(x))


def test_pcast_varying_rejects_bad_axis_names():
    with pytest.raises(TypeError, match="axis_names"):
        compat.pcast_varying(jnp.ones(2), 3)
    with pytest.raises(TypeError, match="axis_names"):
        compat.pcast_varying(jnp.ones(2), ("data", 1))


def test_make_mesh_states_axis_types():
    from jax.sharding import AxisType

    devices = jax.devices("cpu")[:4]
    auto = compat.make_mesh((4,), ("data",), axis_types="auto", devices=devices)
    explicit = compat.make_mesh(
        (2, 2), ("data", "model"), axis_types="explicit", devices=devices
    )
    assert auto.axis_types == (AxisType.Auto,)
    assert explicit.axis_types == (AxisType.Explicit, AxisType.Explicit)
    with pytest.raises(ValueError, match="'auto' or 'explicit'"):
        compat.make_mesh((4,), ("data",), axis_types="Auto", devices=devices)


# --- each version branch, with fakes where the installed JAX has only one of them


class _FakeManualAxisType:
    def __init__(self, varying):
        self.varying = varying


class _NewAval:  # JAX >= 0.10: the varying axes live in manual_axis_type
    manual_axis_type = _FakeManualAxisType(("data", "model"))


class _OldAval:  # JAX 0.8.x / 0.9.x: the varying axes live in .vma
    vma = frozenset({"data"})


class _NoAxesAval:  # e.g. a token: neither field
    pass


@pytest.mark.parametrize(
    "aval, expected",
    [
        (_NewAval(), frozenset({"data", "model"})),
        (_OldAval(), frozenset({"data"})),
        (_NoAxesAval(), frozenset()),
    ],
    ids=["manual_axis_type", "vma", "neither"],
)
def test_varying_axes_of_aval_reads_either_layout(aval, expected):
    assert compat.varying_axes_of_aval(aval) == expected


def test_the_installed_jax_uses_the_layout_the_drift_record_names():
    """Which field holds the varying axes: the drift record's probe
    ``aval_varying_axes_field`` on this JAX (``vma`` up to 0.9.x, ``manual_axis_type``
    from 0.10), read the way the probe reads it."""
    import drift_record

    recorded = drift_record.expected("aval_varying_axes_field").value
    aval = jax.typeof(jnp.ones(2))
    has_vma = getattr(aval, "vma", None) is not None
    has_mat = getattr(aval, "manual_axis_type", None) is not None
    assert has_vma == ("vma absent" not in recorded), recorded
    assert has_mat == ("manual_axis_type absent" not in recorded), recorded
    assert has_vma or has_mat  # the layout compat.varying_axes_of_aval reads


@pytest.mark.parametrize(
    "info, expected",
    [
        ((0, 8, 2), (0, 8, 2)),
        ((0, 12, 0, 1), (0, 12, 0)),
        ((0, 13, 0, "rc1"), (0, 13, 0)),
    ],
)
def test_jax_version_uses_version_info_not_the_string(monkeypatch, info, expected):
    monkeypatch.setattr(jax, "__version_info__", info)
    monkeypatch.setattr(
        jax, "__version__", "0.13.0rc1.dev20261122"
    )  # int() would fail on this
    assert compat.jax_version() == expected


def test_jit_cache_size_counts_traces_and_rejects_plain_functions():
    f = jax.jit(lambda v: v + 1)
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert compat.jit_cache_size(f) == 2
    with pytest.raises(TypeError, match="made by jax.jit"):
        compat.jit_cache_size(lambda v: v)


_COMPILED_ONCE = """
import sys
import jax, jax.numpy as jnp
from beyondgrad import compat
f = jax.jit(lambda v: jnp.sin(v) * 2)
x = jnp.ones(3)
f(x)
before = compat.jit_cache_size(f)
from beyondgrad import forward_laplacian
forward_laplacian.forward_laplacian(lambda v: jnp.sum(jnp.sin(v) ** 2), x)
eqn = jax.make_jaxpr(lambda v: v + 1.0)(x).jaxpr.eqns[0]
literal = [a for a in eqn.invars if type(a).__name__ == "Literal"][0]
assert float(compat.jaxpr_atom_value(literal, {})) == 1.0
f(x)
print("cache sizes", before, compat.jit_cache_size(f),
      "pallas" if "jax._src.pallas.core" in sys.modules else "no pallas")
"""


def test_a_function_jitted_before_the_first_forward_laplacian_is_not_compiled_again():
    """On JAX 0.12 the first import of ``jax.extend`` registers two jit-key config
    states (pallas's), so every function jitted before it missed its cache once; that
    import was made by ``compat.jaxpr_atom_value``'s first call and by importing
    ``beyondgrad.forward_laplacian``. Now ``compat``'s import makes it. In a fresh
    process: a function jitted after ``from beyondgrad import compat`` keeps its one
    cache entry through the first forward_laplacian call (it had 2 before the fix)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    out = subprocess.run(
        [sys.executable, "-c", _COMPILED_ONCE],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "cache sizes 1 1" in out.stdout, out.stdout


def test_backends_initialized_after_a_computation():
    jnp.ones(1).block_until_ready()
    assert compat.backends_initialized() is True


def test_folx_sparse_forward_laplacian_of_a_slogdet():
    """Chapter 5's folx calls (dense and sparsity_threshold=6) on a 4-electron
    log|det| against trace(hessian), float64. folx 0.2.20-0.2.23 raise a broadcasting
    ValueError in the sparse path on JAX 0.8.2, hence pyproject's folx>=0.2.24.
    Measured |error| / |reference| (dense, sparse): 2.9e-11, 3.3e-11 on JAX 0.8.2
    (folx 0.2.24); 5.4e-11, 3.2e-11 on 0.12.0.1 (folx 0.2.30); 2e-10 is 4x the worst."""
    import folx
    import jax
    import jax.numpy as jnp

    def f(x):
        r = x.reshape(4, 3)
        w = jnp.arange(12.0).reshape(3, 4) / 10
        orbitals = jnp.tanh(r @ w) * jnp.exp(-jnp.sum(r**2, axis=1, keepdims=True))
        return jnp.linalg.slogdet(orbitals)[1]

    with jax.enable_x64(True):
        x = jnp.linspace(-1.0, 1.0, 12)
        reference = float(hessian_trace(f, x))
        dense = float(jax.jit(folx.forward_laplacian(f))(x).laplacian)
        sparse_fn = folx.forward_laplacian(f, sparsity_threshold=6)
        sparse = float(jax.jit(sparse_fn)(x).laplacian)
    for got in (dense, sparse):
        assert abs(got - reference) <= 2e-10 * abs(reference), (got, reference)


def test_custom_root_integer_aux_probe_as_the_drift_record_says():
    """compat's feature probe agrees with the drift record on every JAX: the probe
    custom_root_int_aux raises a TypeError up to 0.11.1 and returns from 0.11.2
    (an unrecorded release is held to the newest recorded one before it)."""
    import drift_record

    recorded = drift_record.expected("custom_root_int_aux")
    assert recorded.kind in ("returns", "raises"), recorded
    if recorded.kind == "raises":
        assert recorded.exc_class == "TypeError", recorded
    assert compat.custom_root_integer_aux_ok() is (recorded.kind == "returns")


def test_derivatives_disabled_reports_each_direct_application_of_a_linearized_map():
    """``linearized_applied`` hears of the linearized map applied directly, under vmap
    and under jit, with the tangents it was given, and not of ``jax.linear_transpose``
    tracing it (nor of a jit inside that trace); outside the block, nothing."""
    seen = []
    primal = {"a": jnp.float32(0.5), "b": jnp.float32(2.0)}
    tangent = {"a": jnp.float32(3.0), "b": jnp.float32(4.0)}
    f = lambda p: jnp.sin(p["a"]) * p["b"]  # noqa: E731
    with compat.derivatives_disabled(
        RuntimeError,
        keep_linear_transpose=True,
        clear_caches=False,
        linearized_applied=seen.append,
    ):
        _, f_jvp = jax.linearize(f, primal)
        direct = f_jvp(tangent)
        jax.vmap(f_jvp)(jax.tree.map(lambda t: jnp.stack([t, t]), tangent))
        jax.jit(lambda t: f_jvp(t))(tangent)
        assert len(seen) == 3, seen
        (back,) = jax.linear_transpose(f_jvp, primal)(jnp.float32(1.0))
        jax.linear_transpose(lambda t: jax.jit(lambda u: f_jvp(u))(t), primal)
        assert len(seen) == 3, seen
    assert seen[0] == (tangent,) and seen[0][0] is tangent
    assert [type(args) for args in seen] == [tuple] * 3
    # the map and its transpose still compute the derivative, against float64 closed
    # forms: float32 cos/sin (<= 2 ulp each) and at most 3 products and a sum, so each
    # value is within 8 u32 of the sum of its terms' magnitudes (all terms positive).
    ca, sa, u32 = np.cos(0.5), np.sin(0.5), 2.0**-24
    assert abs(float(direct) - (ca * 2 * 3 + sa * 4)) <= 8 * u32 * (ca * 6 + sa * 4)
    assert abs(float(back["a"]) - ca * 2) <= 8 * u32 * ca * 2
    assert abs(float(back["b"]) - sa) <= 8 * u32 * sa
    _, after = jax.linearize(f, primal)
    after(tangent)
    assert len(seen) == 3  # the hook is gone
