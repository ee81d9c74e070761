import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, runtime


@pytest.fixture(scope="module")
def mesh():
    return runtime.demo_mesh((2, 4), ("x", "y"))


def run_in_shard_map(mesh, fn, x, in_spec=P("x", "y"), out_spec=P()):
    """Run fn per shard and return what it recorded (shard_map output itself is unused)."""
    seen = {}

    def body(block):
        seen.update(fn(block))
        return lax.psum(jnp.sum(block), ("x", "y"))

    jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec)(x)
    return seen


def test_varying_axes_follow_the_in_specs(mesh):
    x = jnp.arange(16.0).reshape(2, 8)

    def probe(b):
        return {
            "block": compat.varying_axes(b),
            "constant": compat.varying_axes(jnp.ones(3)),
            "row_sum": compat.varying_axes(lax.psum(b, "y")),
            "mixed": compat.varying_axes(b + jnp.ones_like(b)),
        }

    seen = run_in_shard_map(mesh, probe, x)
    assert seen == {
        "block": frozenset({"x", "y"}),
        "constant": frozenset(),
        "row_sum": frozenset({"x"}),
        "mixed": frozenset({"x", "y"}),
    }


def test_varying_axes_outside_shard_map_is_empty():
    assert compat.varying_axes(jnp.ones(3)) == frozenset()
    assert compat.varying_axes(np.ones(3, np.float32)) == frozenset()


def test_pcast_varying_changes_type_not_value(mesh):
    x = jnp.arange(16.0).reshape(2, 8)

    def probe(b):
        c = jnp.arange(3.0)
        tree = compat.pcast_varying({"a": c, "b": (c, c)}, "y")
        both = compat.pcast_varying(c, ("x", "y"))
        again = compat.pcast_varying(both, ("x", "y"))  # idempotent
        return {
            "tree": {compat.varying_axes(leaf) for leaf in jax.tree_util.tree_leaves(tree)},
            "both": compat.varying_axes(both),
            "again": compat.varying_axes(again),
            "none": compat.varying_axes(compat.pcast_varying(c, ())),
        }

    seen = run_in_shard_map(mesh, probe, x)
    assert seen["tree"] == {frozenset({"y"})}
    assert seen["both"] == seen["again"] == frozenset({"x", "y"})
    assert seen["none"] == frozenset()


def test_pcast_varying_transpose_is_psum(mesh):
    # d/dw of sum over devices of (w * block) = psum of the block sums: the cast's transpose.
    x = jnp.arange(16.0).reshape(2, 8)

    def per_shard_grad(block):
        def loss(w):
            return jnp.sum(compat.pcast_varying(w, ("x", "y")) * block)

        return jax.grad(loss)(1.0)

    g = jax.shard_map(per_shard_grad, mesh=mesh, in_specs=P("x", "y"), out_specs=P())(x)
    np.testing.assert_allclose(g, jnp.sum(x))


def test_pcast_varying_rejects_bad_axis_names():
    with pytest.raises(TypeError, match="axis_names"):
        compat.pcast_varying(jnp.ones(2), 3)
    with pytest.raises(TypeError, match="axis_names"):
        compat.pcast_varying(jnp.ones(2), ("x", 1))


def test_make_mesh_states_axis_types():
    from jax.sharding import AxisType

    devices = jax.devices("cpu")[:4]
    auto = compat.make_mesh((4,), ("d",), axis_types="auto", devices=devices)
    explicit = compat.make_mesh((2, 2), ("a", "b"), axis_types="explicit", devices=devices)
    assert auto.axis_types == (AxisType.Auto,)
    assert explicit.axis_types == (AxisType.Explicit, AxisType.Explicit)
    with pytest.raises(ValueError, match="'auto' or 'explicit'"):
        compat.make_mesh((4,), ("d",), axis_types="Auto", devices=devices)
