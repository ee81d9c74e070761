"""Tests for beyondgrad.sharding on 8 simulated CPU devices (see tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from beyondgrad import compat, runtime, sharding
from beyondgrad.exercises import ExerciseFailed


@pytest.fixture(scope="module")
def mesh42():
    return runtime.demo_mesh((4, 2), ("x", "y"))


# ----------------------------------------------------------------------------- explainer


def test_explainer_matches_typeof_inside_shard_map(mesh42):
    """Independent reference: compat.varying_axes on the tracers themselves."""
    seen = {}

    def f(a, b, w):
        c = a * w  # {x}
        d = c + b  # {x, y}
        e = lax.psum(d, "x")  # {y}
        g = lax.pmean(e, "y")  # {}
        seen.update(c=compat.varying_axes(c), d=compat.varying_axes(d), e=compat.varying_axes(e),
                    g=compat.varying_axes(g))
        return c, d, e, g

    args = (jnp.ones(8), jnp.ones(4), jnp.ones(2))
    rep = sharding.explain_vma(f, mesh42, (P("x"), P("y"), P()), *args)
    assert rep.out_vma == (seen["c"], seen["d"], seen["e"], seen["g"])
    assert rep.out_vma == (frozenset("x"), frozenset("xy"), frozenset("y"), frozenset())
    assert rep.arg_vma == (frozenset("x"), frozenset("y"), frozenset())
    psums = [r for r in rep.rows if r.primitive in ("psum", "psum_invariant")]
    assert [(r.in_vma, r.out_vma) for r in psums] == [
        ((frozenset("xy"),), (frozenset("y"),)),
        ((frozenset("y"),), (frozenset(),)),
    ]
    # every row's output types print the same varying axes as out_vma
    for r in rep.rows:
        for vma, typ in zip(r.out_vma, r.out_types):
            assert (("{V:" in typ) == bool(vma)), (r, typ)
    table = rep.table()
    assert "psum" in table and "results vary over" in table


def test_explainer_walks_nested_jaxprs(mesh42):
    def f(a):
        s = lax.fori_loop(0, 3, lambda k, c: c + a, jnp.zeros_like(a))
        return lax.cond(True, lambda: s * 2.0, lambda: s)

    rep = sharding.explain_vma(f, mesh42, P("x"), jnp.ones(8))
    nested = [r for r in rep.rows if r.where]
    assert any(r.where.startswith("scan") and r.primitive == "add" and r.out_vma == (frozenset("x"),) for r in nested)
    assert any(r.where.startswith("cond.branches") for r in nested)
    assert rep.count("scan") == 1 and rep.out_vma == (frozenset("x"),)
    assert "scan" in rep.primitives(where="")


def test_explainer_check_vma_false_has_no_types(mesh42):
    rep = sharding.explain_vma(lambda a: lax.psum(a, "x"), mesh42, P("x"), jnp.ones(8), check_vma=False)
    assert all(not v for r in rep.rows for v in r.in_vma + r.out_vma)
    assert rep.primitives() == ["psum"]


def test_explainer_out_specs_are_checked(mesh42):
    with pytest.raises(ValueError, match="out_specs"):
        sharding.explain_vma(lambda a: a, mesh42, P("x"), jnp.ones(8), out_specs=P())
    rep = sharding.explain_vma(lambda a: a, mesh42, P("x"), jnp.ones(8), out_specs=P("x"))
    assert rep.out_vma == (frozenset("x"),)


def test_explainer_bad_input(mesh42):
    x = jnp.ones((8, 4))
    with pytest.raises(ValueError, match="'z'"):
        sharding.explain_vma(lambda a: a, mesh42, P("z"), x)
    with pytest.raises(ValueError, match=r"P\('x', None, 'y'\).*rank 2"):
        sharding.explain_vma(lambda a: a, mesh42, P("x", None, "y"), x)
    with pytest.raises(ValueError, match="not divisible"):
        sharding.explain_vma(lambda a: a, mesh42, P("x"), jnp.ones(6))
    with pytest.raises(ValueError, match="twice"):
        sharding.explain_vma(lambda a: a, mesh42, P("x", "x"), x)
    with pytest.raises(ValueError, match="'q'"):
        sharding.explain_vma(lambda a: a, mesh42, P("x"), x, out_specs=P("q"))
    with pytest.raises(TypeError, match="Mesh"):
        sharding.explain_vma(lambda a: a, {"x": 4}, P("x"), x)
    with pytest.raises(TypeError, match="function"):
        sharding.explain_vma(3, mesh42, P("x"), x)


def test_aval_varying_axes_reads_both_layouts():
    class Old:
        vma = frozenset({"i"})

    class Mat:
        varying = frozenset({"j"})

    class New:
        manual_axis_type = Mat()

    assert sharding.aval_varying_axes(Old()) == {"i"}
    assert sharding.aval_varying_axes(New()) == {"j"}
    assert sharding.aval_varying_axes(object()) == frozenset()


# ------------------------------------------------------------------- data-parallel gradient


def _mlp_params(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"w1": jax.random.normal(k1, (3, 5)) / 2, "b1": 0.1 * jax.random.normal(k3, (5,)), "w2": jax.random.normal(k2, (5,))}


def _mlp_loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_data_parallel_grad_matches_single_device_float64(n):
    with jax.enable_x64(True):
        params = _mlp_params(jax.random.PRNGKey(n))
        kx, ky = jax.random.split(jax.random.PRNGKey(10 + n))
        batch = {"x": jax.random.normal(kx, (16, 3)), "y": jax.random.normal(ky, (16,))}
        mesh = runtime.demo_mesh(n, "data")
        loss, grads = sharding.data_parallel_value_and_grad(_mlp_loss, mesh, "data")(params, batch)
        ref_loss, ref_grads = jax.value_and_grad(_mlp_loss)(params, batch)
        assert grads["w1"].dtype == jnp.float64
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
        for k in ref_grads:
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_data_parallel_grad_closed_form_sum_reduction(n):
    """Sum loss of linear least squares: grad = 2 X^T (X w - y), computed in numpy float64."""
    rng = np.random.default_rng(n)
    X, y, w = rng.normal(size=(24, 4)), rng.normal(size=24), rng.normal(size=4)
    mesh = runtime.demo_mesh(n, "data")
    loss_fn = lambda w, b: jnp.sum((b[0] @ w - b[1]) ** 2)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        loss, g = sharding.data_parallel_value_and_grad(loss_fn, mesh, "data", reduction="sum")(
            jnp.asarray(w, jnp.float32), (jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)))
    np.testing.assert_allclose(g, 2 * X.T @ (X @ w - y), rtol=2e-4, atol=1e-4)
    np.testing.assert_allclose(loss, np.sum((X @ w - y) ** 2), rtol=2e-5)


def test_naive_pmean_is_off_by_device_count():
    """The bug the helper avoids: grad inside shard_map is already summed; pmean on top keeps the sum."""
    mesh = runtime.demo_mesh(8, "data")
    w, X, y = sharding.linear_problem()

    def naive(w, X, y):
        return lax.pmean(jax.grad(sharding.mse_loss)(w, X, y), "data")

    with jax.default_matmul_precision("highest"):
        got = jax.shard_map(naive, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P())(w, X, y)
        ref = jax.grad(sharding.mse_loss)(w, X, y)
    np.testing.assert_allclose(got, 8 * ref, rtol=1e-4)


def test_data_parallel_bad_input():
    mesh = runtime.demo_mesh(4, "data")
    with pytest.raises(ValueError, match="'batch'"):
        sharding.data_parallel_value_and_grad(_mlp_loss, mesh, "batch")
    with pytest.raises(ValueError, match="reduction"):
        sharding.data_parallel_value_and_grad(_mlp_loss, mesh, "data", reduction="max")
    with pytest.raises(TypeError, match="loss_fn"):
        sharding.data_parallel_value_and_grad(None, mesh, "data")
    f = sharding.data_parallel_value_and_grad(lambda w, b: jnp.sum(b * w), mesh, "data")
    with pytest.raises(ValueError, match="not divisible by 4"):
        f(1.0, jnp.ones(6))
    with pytest.raises(ValueError, match="leading size"):
        f(1.0, (jnp.ones(8), jnp.ones(4)))
    g = sharding.data_parallel_value_and_grad(lambda w, b: b * w, mesh, "data")
    with pytest.raises(TypeError, match="scalar"):
        g(1.0, jnp.ones(8))


# ------------------------------------------------------------------------------ error log


def test_error_log_records_class_and_head(mesh42):
    log = sharding.ErrorLog()

    def carry_bug():
        body = lambda a: lax.fori_loop(0, 2, lambda k, c: c + a, jnp.zeros(2))  # noqa: E731
        return jax.shard_map(body, mesh=mesh42, in_specs=P("x"), out_specs=P("x"))(jnp.ones(8))

    rec = log.record("carry", carry_bug, cause="invariant init", fix="zeros_like")
    ok = log.record("fine", lambda: jnp.ones(2) + 1, cause="-", fix="-")
    assert rec.error == "TypeError" and "carry" in rec.head and "\n" not in rec.head
    assert ok.error == "no error"
    html = log.html()
    assert html.count("<tr>") == 3 and "<code>TypeError</code>" in html
    assert "1. carry" in log.table()
    with pytest.raises(TypeError):
        log.record("x", 3, cause="", fix="")


# --------------------------------------------------------------------------------- layout

LAYOUT_CASES = [
    ((2, 4), P("x", "y")),
    ((2, 4), P("y", "x")),
    ((4, 2), P("x")),
    ((4, 2), P(None, "y")),
    ((2, 4), P()),
    ((2, 4), P(("x", "y"))),
    ((2, 4), P(None, ("y", "x"))),
    ((8, 1), P("x", "y")),
]


@pytest.mark.parametrize("shape,spec", LAYOUT_CASES)
def test_block_layout_matches_named_sharding(shape, spec):
    mesh = runtime.demo_mesh(shape, ("x", "y"))
    position = {d: k for k, d in enumerate(mesh.devices.flat)}
    layout = sharding.block_layout(shape, spec, (8, 8))
    for device, index in NamedSharding(mesh, spec).devices_indices_map((8, 8)).items():
        want = tuple((s.start or 0, 8 if s.stop is None else s.stop) for s in index)
        got = tuple((s.start, s.stop) for s in layout.blocks[position[device]])
        assert got == want, (device, got, want)


@pytest.mark.parametrize("shape,spec", LAYOUT_CASES[:5])
def test_block_layout_varying_matches_shard_map(shape, spec):
    mesh = runtime.demo_mesh(shape, ("x", "y"))
    layout = sharding.block_layout(shape, spec, (8, 8))
    rep = sharding.explain_vma(lambda a: a, mesh, spec, jnp.ones((8, 8)))
    assert rep.arg_vma == (layout.varying,)
    assert layout.replicated_over == frozenset("xy") - layout.varying
    assert "varies over" in layout.describe()


def test_block_layout_bad_input():
    with pytest.raises(ValueError, match="'z'"):
        sharding.block_layout((2, 4), P("z"), (8, 8))
    with pytest.raises(ValueError, match="3 entries"):
        sharding.block_layout((2, 4), P("x", None, None), (8, 8))
    with pytest.raises(ValueError, match="not divisible"):
        sharding.block_layout((2, 4), P("y"), (6, 8))
    with pytest.raises(ValueError, match="axis_names"):
        sharding.block_layout((2, 4, 1), P(), (8, 8))


@pytest.mark.parametrize("mesh_shape,d0,d1,distinct", [
    ("2x4", "x", "y", 8), ("4x2", "x", None, 4), ("2x4", None, None, 1), ((1, 8), "x+y", None, 8), ("8x1", "y", "x", 8),
])
def test_layout_figure_callback_headless(mesh_shape, d0, d1, distinct):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = sharding.layout_figure(mesh_shape, d0, d1)
    ax = fig.axes[0]
    assert len(ax.patches) == distinct
    assert "varies over" in ax.get_title()
    plt.close(fig)


def test_layout_figure_rejects_bad_values():
    with pytest.raises(ValueError, match="2x4"):
        sharding.layout_figure("two by four", "x", "y")
    with pytest.raises(ValueError, match="twice"):
        sharding.layout_figure("2x4", "x", "x")


def test_small_multiples_panels():
    import matplotlib.pyplot as plt

    fig = sharding.layout_small_multiples(LAYOUT_CASES[:4])
    assert sum(ax.has_data() for ax in fig.axes) == 4
    plt.close(fig)
    with pytest.raises(ValueError):
        sharding.layout_small_multiples([])


# ------------------------------------------------------------------------------ checkers


def test_check_predict_vma():
    right = {k: set(v) for k, v in sharding.expected_vma().items()}
    assert right["a * w"] == {"x"} and right["pmean(a + b, ('x', 'y'))"] == set()
    assert sharding.check_predict_vma(right, strict=True)
    wrong = dict(right, **{"a + b": {"x"}})
    fb = sharding.check_predict_vma(wrong)
    assert not fb and "a + b" in str(fb)
    with pytest.raises(ExerciseFailed):
        sharding.check_predict_vma(..., strict=True)
    assert not sharding.check_predict_vma({"a * w": "x"})


def test_check_fix_training_step():
    def buggy(w, X, y):
        return w - 0.1 * lax.pmean(jax.grad(sharding.mse_loss)(w, X, y), "data")

    def fixed(w, X, y):
        return w - 0.1 * jax.grad(lambda v: lax.pmean(sharding.mse_loss(v, X, y), "data"))(w)

    def stub(w, X, y):
        raise NotImplementedError

    fb = sharding.check_fix_training_step(buggy)
    assert not fb and "2 x the single-device" in str(fb)
    assert sharding.check_fix_training_step(fixed, strict=True)
    assert "stub" in str(sharding.check_fix_training_step(stub))


def test_check_fix_loop_carry():
    def buggy(x):
        return lax.fori_loop(0, 3, lambda k, acc: acc + (k + 1) * x, jnp.zeros(x.shape))

    def fixed(x):
        return lax.fori_loop(0, 3, lambda k, acc: acc + (k + 1) * x, jnp.zeros_like(x))

    fb = sharding.check_fix_loop_carry(buggy)
    assert not fb and "TypeError" in str(fb)
    assert sharding.check_fix_loop_carry(fixed, strict=True)
    assert not sharding.check_fix_loop_carry(lambda x: 5.0 * x)


def test_check_predict_vma_accepts_functions():
    right = sharding.expected_vma()
    assert sharding.check_predict_vma(lambda: right, strict=True)

    def stub():
        raise NotImplementedError

    assert "stub" in str(sharding.check_predict_vma(stub))
