"""Tests for beyondgrad.sharding on 8 simulated CPU devices (see tests/conftest.py).

Every helper that takes a mesh is run with both mesh axis types: a mesh from
``jax.make_mesh`` with its default axis types (Explicit on new JAX, Auto on 0.8.x),
and the other type stated explicitly, with plain unsharded global arrays.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, runtime, sharding

AXIS_TYPES = ["default", "auto", "explicit"]


def make(shape, names, kind):
    """A mesh as users write it (``jax.make_mesh`` default) or with a stated axis type."""
    if kind == "default":
        with warnings.catch_warnings():  # 0.8.x warns that the default will change
            warnings.simplefilter("ignore", DeprecationWarning)
            return jax.make_mesh(
                tuple(shape), tuple(names), devices=jax.devices()[: int(np.prod(shape))]
            )
    return compat.make_mesh(
        shape, names, axis_types=kind, devices=jax.devices()[: int(np.prod(shape))]
    )


def test_default_make_mesh_axis_type_is_the_documented_one():
    """The reason for the tests below: the default changed inside the supported range."""
    import drift_record

    mesh = make((8,), ("data",), "default")
    # the drift record's probe, read as the probe reads it: "('AxisType.Explicit',)"
    want = drift_record.expected("make_mesh_default_axis_types").value
    assert str(tuple(str(t) for t in mesh.axis_types)) == want
    assert want in (str((str(AxisType.Explicit),)), str((str(AxisType.Auto),)))


@pytest.fixture(scope="module", params=AXIS_TYPES)
def mesh42(request):
    return make((4, 2), ("data", "model"), request.param)


# ----------------------------------------------------------------------------- explainer


def test_explainer_matches_typeof_inside_shard_map(mesh42):
    """Independent reference: compat.varying_axes on the tracers themselves."""
    seen = {}

    def f(a, b, w):
        c = a * w  # {data}
        d = c + b  # {data, model}
        e = lax.psum(d, "data")  # {model}
        g = lax.pmean(e, "model")  # {}
        seen.update(
            c=compat.varying_axes(c),
            d=compat.varying_axes(d),
            e=compat.varying_axes(e),
            g=compat.varying_axes(g),
        )
        return c, d, e, g

    args = (jnp.ones(8), jnp.ones(4), jnp.ones(2))
    rep = sharding.explain_vma(f, mesh42, (P("data"), P("model"), P()), *args)
    assert rep.out_vma == (seen["c"], seen["d"], seen["e"], seen["g"])
    dm = frozenset({"data", "model"})
    assert rep.out_vma == (frozenset({"data"}), dm, frozenset({"model"}), frozenset())
    assert rep.arg_vma == (frozenset({"data"}), frozenset({"model"}), frozenset())
    assert rep.arg_types == ("f32[2]{V:data}", "f32[2]{V:model}", "f32[2]")
    psums = [r for r in rep.rows if r.primitive in ("psum", "psum_invariant")]
    assert [(r.in_vma, r.out_vma) for r in psums] == [
        ((dm,), (frozenset({"model"}),)),
        ((frozenset({"model"}),), (frozenset(),)),
    ]
    for r in rep.rows:  # every row's printed types carry the same varying axes
        for vma, typ in zip(r.out_vma, r.out_types):
            assert ("{V:" in typ) == bool(vma), (r, typ)
    table = rep.table()
    assert "psum" in table and "results: " in table


def test_explainer_accepts_shape_dtype_structs(mesh42):
    structs = (
        jax.ShapeDtypeStruct((8, 4), jnp.float32),
        jax.ShapeDtypeStruct((4,), jnp.int32),
    )
    rep = sharding.explain_vma(
        lambda a, b: a[:, :1] * b, mesh42, (P("data"), P()), *structs
    )
    assert rep.out_types == ("f32[2,4]{V:data}",)


def test_explainer_walks_nested_jaxprs(mesh42):
    def f(a):
        s = lax.fori_loop(0, 3, lambda k, c: c + a, jnp.zeros_like(a))
        return lax.cond(True, lambda: s * 2.0, lambda: s)

    rep = sharding.explain_vma(f, mesh42, P("data"), jnp.ones(8))
    nested = [r for r in rep.rows if r.where]
    assert any(
        r.where.startswith("scan")
        and r.primitive == "add"
        and r.out_vma == (frozenset({"data"}),)
        for r in nested
    )
    assert any(r.where.startswith("cond.branches") for r in nested)
    assert rep.count("scan") == 1 and rep.out_vma == (frozenset({"data"}),)
    assert "scan" in rep.primitives(where="")


def test_explainer_check_vma_false_has_no_types(mesh42):
    rep = sharding.explain_vma(
        lambda a: lax.psum(a, "data"), mesh42, P("data"), jnp.ones(8), check_vma=False
    )
    assert all(not v for r in rep.rows for v in r.in_vma + r.out_vma)
    assert rep.primitives() == ["psum"]


def test_explainer_out_specs_are_checked(mesh42):
    with pytest.raises(ValueError, match="out_specs"):
        sharding.explain_vma(lambda a: a, mesh42, P("data"), jnp.ones(8), out_specs=P())
    rep = sharding.explain_vma(
        lambda a: a, mesh42, P("data"), jnp.ones(8), out_specs=P("data")
    )
    assert rep.out_vma == (frozenset({"data"}),)


# Transposes pinned literally (the rules in jax/_src/lax/parallel.py): all_gather <->
# reduce_scatter (psum_scatter's primitive), psum_scatter <-> all_gather, ppermute and
# all_to_all are their own kind, a cast to varying (pvary) <-> psum_invariant.
TRANSPOSES = [
    ("all_gather", lambda a: lax.all_gather(a, "data"), P("data"), ["reduce_scatter"]),
    (
        "psum_scatter",
        lambda a: lax.psum_scatter(a, "data", tiled=True),
        P("data"),
        ["all_gather"],
    ),
    (
        "ppermute",
        lambda a: lax.ppermute(a, "data", [(k, (k + 1) % 4) for k in range(4)]),
        P("data"),
        ["ppermute"],
    ),
    (
        "all_to_all",
        lambda a: lax.all_to_all(a, "data", 0, 0, tiled=True),
        P("data"),
        ["all_to_all"],
    ),
    ("psum", lambda a: lax.psum(a, "data"), P("data"), ["pvary"]),
    ("pcast", lambda w: compat.pcast_varying(w, "data"), P(), ["psum_invariant"]),
]


@pytest.mark.parametrize(
    "name,op,spec,want", TRANSPOSES, ids=[t[0] for t in TRANSPOSES]
)
def test_explain_transpose_pins_each_collective(mesh42, name, op, spec, want):
    rep = sharding.explain_transpose(op, mesh42, spec, jnp.ones(16))
    assert rep.primitives() == want
    # the transpose returns a value of the argument's type
    assert rep.out_types == rep.arg_types


def test_explain_transpose_of_nonlinear_pmax_raises(mesh42):
    with pytest.raises(NotImplementedError, match="pmax"):
        sharding.explain_transpose(
            lambda a: lax.pmax(a, "data"), mesh42, P("data"), jnp.ones(8)
        )


# ------------------------------------------------------------------- data-parallel gradient


def _mlp_params(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (3, 5)) / 2,
        "b1": 0.1 * jax.random.normal(k3, (5,)),
        "w2": jax.random.normal(k2, (5,)),
    }


def _mlp_loss(params, batch):
    h = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean((h @ params["w2"] - batch["y"]) ** 2)


@pytest.mark.parametrize("kind", AXIS_TYPES)
@pytest.mark.parametrize("n", [1, 2, 8])
def test_data_parallel_grad_matches_single_device_float64(n, kind):
    with jax.enable_x64(True):
        params = _mlp_params(jax.random.PRNGKey(n))
        kx, ky = jax.random.split(jax.random.PRNGKey(10 + n))
        batch = {"x": jax.random.normal(kx, (16, 3)), "y": jax.random.normal(ky, (16,))}
        mesh = make((n,), ("data",), kind)
        loss, grads = sharding.data_parallel_value_and_grad(_mlp_loss, mesh, "data")(
            params, batch
        )
        ref_loss, ref_grads = jax.value_and_grad(_mlp_loss)(params, batch)
        assert grads["w1"].dtype == jnp.float64
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-12)
        for k in ref_grads:
            np.testing.assert_allclose(grads[k], ref_grads[k], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_data_parallel_grad_on_a_2d_mesh_and_presharded_inputs(kind):
    """Batch split over 'data' of a (4, 2) mesh; inputs already placed elsewhere."""
    mesh = make((4, 2), ("data", "model"), kind)
    with jax.enable_x64(True):
        rng = np.random.default_rng(0)
        X, y, w = rng.normal(size=(8, 3)), rng.normal(size=8), rng.normal(size=3)
        X_put = jax.device_put(X, NamedSharding(mesh, P(None, None)))
        loss_fn = lambda w, b: jnp.sum((b[0] @ w - b[1]) ** 2)  # noqa: E731
        loss, g = sharding.data_parallel_value_and_grad(
            loss_fn, mesh, "data", reduction="sum"
        )(w, (X_put, y))
    np.testing.assert_allclose(g, 2 * X.T @ (X @ w - y), rtol=1e-12)
    np.testing.assert_allclose(loss, np.sum((X @ w - y) ** 2), rtol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_data_parallel_grad_closed_form_sum_reduction(n):
    """Sum loss of linear least squares: grad = 2 X^T (X w - y), in numpy float64.

    float32 against float64 (JAX 0.8.2 and 0.12.0.1 alike, n = 1, 2, 4, 8): measured
    max|error| / max|ref| of the gradient <= 7.2e-8, relative error of the loss
    <= 8.6e-8; the tolerances 5e-7 allow 7x and 6x.
    """
    rng = np.random.default_rng(n)
    X, y, w = rng.normal(size=(24, 4)), rng.normal(size=24), rng.normal(size=4)
    mesh = runtime.demo_mesh(n, "data")
    loss_fn = lambda w, b: jnp.sum((b[0] @ w - b[1]) ** 2)  # noqa: E731
    with jax.default_matmul_precision("highest"):
        loss, g = sharding.data_parallel_value_and_grad(
            loss_fn, mesh, "data", reduction="sum"
        )(
            jnp.asarray(w, jnp.float32),
            (jnp.asarray(X, jnp.float32), jnp.asarray(y, jnp.float32)),
        )
    ref = 2 * X.T @ (X @ w - y)
    np.testing.assert_allclose(g, ref, rtol=0, atol=5e-7 * np.abs(ref).max())
    np.testing.assert_allclose(loss, np.sum((X @ w - y) ** 2), rtol=5e-7)


def test_naive_pmean_is_off_by_device_count():
    """The bug the helper avoids: grad inside shard_map is already summed over devices."""
    mesh = runtime.demo_mesh(8, "data")
    rng = np.random.default_rng(3)
    X, y, w = (
        jnp.asarray(a, jnp.float32)
        for a in (rng.normal(size=(16, 3)), rng.normal(size=16), rng.normal(size=3))
    )
    mse = lambda w, X, y: jnp.mean((X @ w - y) ** 2)  # noqa: E731

    def naive(w, X, y):
        return lax.pmean(jax.grad(mse)(w, X, y), "data")

    with jax.default_matmul_precision("highest"):
        got = jax.shard_map(
            naive, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P()
        )(w, X, y)
        ref = jax.grad(mse)(w, X, y)
    np.testing.assert_allclose(got, 8 * ref, rtol=1e-5)


# --------------------------------------------------------------------------------- layout

LAYOUT_CASES = [
    ((2, 4), P("data", "model")),
    ((2, 4), P("model", "data")),
    ((4, 2), P("data")),
    ((4, 2), P(None, "model")),
    ((2, 4), P()),
    ((2, 4), P(("data", "model"))),
    ((2, 4), P(None, ("model", "data"))),
    ((8, 1), P("data", "model")),
]


@pytest.mark.parametrize("shape,spec", LAYOUT_CASES)
def test_block_layout_matches_named_sharding(shape, spec):
    mesh = runtime.demo_mesh(shape, ("data", "model"))
    position = {d: k for k, d in enumerate(mesh.devices.flat)}
    layout = sharding.block_layout(shape, spec, (8, 8))
    for device, index in NamedSharding(mesh, spec).devices_indices_map((8, 8)).items():
        want = tuple((s.start or 0, 8 if s.stop is None else s.stop) for s in index)
        got = tuple((s.start, s.stop) for s in layout.blocks[position[device]])
        assert got == want, (device, got, want)


@pytest.mark.parametrize("kind", ["default", "explicit"])
@pytest.mark.parametrize("shape,spec", LAYOUT_CASES[:5])
def test_block_layout_varying_matches_shard_map(shape, spec, kind):
    mesh = make(shape, ("data", "model"), kind)
    layout = sharding.block_layout(shape, spec, (8, 8))
    rep = sharding.explain_vma(lambda a: a, mesh, spec, jnp.ones((8, 8)))
    assert rep.arg_vma == (layout.varying,)
    assert layout.replicated_over == frozenset({"data", "model"}) - layout.varying
    assert "varies over" in layout.describe()


# ----------------------------------------------------------------------------- bad input

_f = lambda a: a  # noqa: E731

BAD_INPUTS = [
    # (call, exception class, message pattern)
    (
        lambda m: sharding.explain_vma(_f, m, P("z"), jnp.ones((8, 4))),
        ValueError,
        "'z'.*mesh axes are",
    ),
    (
        lambda m: sharding.explain_vma(
            _f, m, P("data", None, "model"), jnp.ones((8, 4))
        ),
        ValueError,
        r"P\('data', None, 'model'\).*rank 2",
    ),
    (
        lambda m: sharding.explain_vma(_f, m, P("data"), jnp.ones(6)),
        ValueError,
        "not divisible by 4",
    ),
    (
        lambda m: sharding.explain_vma(_f, m, P("data", "data"), jnp.ones((8, 8))),
        ValueError,
        "twice",
    ),
    (
        lambda m: sharding.explain_vma(_f, m, P("data"), jnp.ones(8), out_specs=P("q")),
        ValueError,
        "'q'",
    ),
    (
        lambda m: sharding.explain_vma(_f, {"data": 4}, P("data"), jnp.ones(8)),
        TypeError,
        r"jax.sharding.Mesh \(e.g. jax.make_mesh",
    ),
    (
        lambda m: sharding.explain_vma(3, m, P("data"), jnp.ones(8)),
        TypeError,
        "pass the function",
    ),
    (
        lambda m: sharding.explain_vma(_f, m, "data", jnp.ones(8)),
        TypeError,
        r"such as P\('data'\)",
    ),
    (
        lambda m: sharding.explain_vma(_f, m, (P("data"), P()), jnp.ones(8)),
        ValueError,
        "does not match the structure",
    ),
    (
        lambda m: sharding.explain_transpose("psum", m, P("data"), jnp.ones(8)),
        TypeError,
        "function",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(_mlp_loss, m, "batch"),
        ValueError,
        "'batch' is not a mesh axis",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(_mlp_loss, m, ("data",)),
        TypeError,
        "one mesh axis",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(
            _mlp_loss, m, "data", reduction="max"
        ),
        ValueError,
        "'mean' or 'sum'",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(None, m, "data"),
        TypeError,
        "loss_fn",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(_mlp_loss, {"data": 8}),
        TypeError,
        "jax.sharding.Mesh",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(
            lambda w, b: jnp.sum(b * w), m, "data"
        )(1.0, jnp.ones(6)),
        ValueError,
        "not divisible by 4",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(
            lambda w, b: jnp.sum(b[0] * w), m, "data"
        )(1.0, (jnp.ones(8), jnp.ones(4))),
        ValueError,
        "leading size",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(lambda w, b: b * w, m, "data")(
            1.0, jnp.ones(8)
        ),
        TypeError,
        "scalar",
    ),
    (
        lambda m: sharding.data_parallel_value_and_grad(
            lambda w, b: jnp.sum(w), m, "data"
        )(1.0, ()),
        ValueError,
        "no arrays",
    ),
    (lambda m: sharding.block_layout((2, 4), P("z"), (8, 8)), ValueError, "'z'"),
    (
        lambda m: sharding.block_layout((2, 4), P("data", None, None), (8, 8)),
        ValueError,
        "3 entries",
    ),
    (
        lambda m: sharding.block_layout((2, 4), P("model"), (6, 8)),
        ValueError,
        "not divisible",
    ),
    (lambda m: sharding.block_layout((2, 4, 1), P(), (8, 8)), ValueError, "axis_names"),
    (lambda m: sharding.block_layout((2, 0), P(), (8, 8)), ValueError, ">= 1"),
    (lambda m: sharding.block_layout(m, P(), (8, 8)), TypeError, "mesh.devices.shape"),
    (
        lambda m: sharding.block_layout((2, 4), P(), "eight"),
        TypeError,
        "sequences of ints",
    ),
    (lambda m: sharding.validate_spec(m, 3), TypeError, "PartitionSpec"),
    (lambda m: sharding.validate_spec(m, P(("data", 1))), TypeError, "entry"),
]


@pytest.mark.parametrize(
    "call,exc,pattern", BAD_INPUTS, ids=[f"bad{k}" for k in range(len(BAD_INPUTS))]
)
def test_bad_input_is_named(mesh42, call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call(mesh42)


def test_validate_spec_accepts_tuples_none_and_size_maps():
    assert sharding.validate_spec({"data": 4}, None) == P()
    assert sharding.validate_spec({"data": 4}, ("data", None), (8, 3)) == P(
        "data", None
    )
    assert (
        sharding.spec_str(P("data", ("data", "model"), None))
        == "P('data', ('data', 'model'), None)"
    )


# --------------------------------------------------------------- the jvp report's script


def _report_script() -> str:
    """The minimal script of the jvp report (a quoted code block of the appendix)."""
    from tools import book

    text = (book.ROOT / "appendix_jax_bugs.md").read_text()
    section = text[text.index("(jvp-hole-report)=") :]
    start = section.index("> ```python\n") + len("> ```python\n")
    block = section[start : section.index("> ```\n", start)]
    return "\n".join(
        line[2:] if line.startswith("> ") else line.lstrip(">")
        for line in block.splitlines()
    )


def test_jvp_report_script_shows_what_the_report_says():
    """Run the report's script as a maintainer would: the actual outcome it states."""
    import os
    import subprocess
    import sys

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")
    }
    run = subprocess.run(
        [sys.executable, "-c", _report_script()],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.split("\n")
    varying, invariant = "float32[2]{V:data}", "float32[2]"
    by_form: dict[str, list[str]] = {}
    for line in filter(None, lines):
        name, _, rest = line.partition(" | ")
        by_form.setdefault(name, []).append(rest)
    # a bare primitive: the tangent is typed varying and out_specs=P() is refused
    assert by_form["sin"][0] == f"tangent: {varying}"
    assert by_form["sin"][1].startswith("ValueError: shard_map applied to the function")
    # jit, checkpoint, cond, while: typed invariant, device 0's block comes back
    for form in ("jit", "checkpoint", "cond", "while"):
        assert by_form[form] == [
            f"tangent: {invariant}",
            "returned [0.        0.5403023]",  # cos(1) * [0, 1]
        ], form
    # 2 * q (jnp.multiply is jit-ed): block 0 of 2 * [0 1 2 3]
    assert by_form["2*q"] == [f"tangent: {invariant}", "returned [0. 2.]"]
    # scan checks its carry's type: it raises before the body prints
    assert by_form["scan"] == [
        "ValueError: Scan carry input and output got mismatched varying"
    ]


@pytest.mark.parametrize("kind", AXIS_TYPES)
def test_data_parallel_grad_accepts_shape_dtype_structs(kind):
    """Abstract evaluation, as users check shapes before running."""
    mesh = make((8,), ("data",), kind)
    vg = sharding.data_parallel_value_and_grad(
        lambda w, b: jnp.mean((b[0] @ w - b[1]) ** 2), mesh
    )
    w = jax.ShapeDtypeStruct((3,), jnp.float32)
    batch = (
        jax.ShapeDtypeStruct((16, 3), jnp.float32),
        jax.ShapeDtypeStruct((16,), jnp.float32),
    )
    loss, grads = jax.eval_shape(vg, w, batch)
    assert (loss.shape, grads.shape, grads.dtype) == ((), (3,), jnp.float32)


# ------------------------------------------------- figures.ch4: error table and layouts


def test_error_log_records_class_and_head():
    from beyondgrad.figures import ch4 as figures

    mesh = runtime.demo_mesh((4, 2), ("data", "model"))
    log = figures.ErrorLog()

    def carry_bug():
        body = lambda a: lax.fori_loop(0, 2, lambda k, c: c + a, jnp.zeros(2))  # noqa: E731
        return jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"))(
            jnp.ones(8)
        )

    rec = log.record("carry", carry_bug, cause="invariant init", fix="zeros_like")
    ok = log.record("fine", lambda: jnp.ones(2) + 1, cause="-", fix="-")
    assert rec.error == "TypeError" and "carry" in rec.head and "\n" not in rec.head
    assert ok.error == "no error"
    html = log.html()
    assert html.count("<tr>") == 3 and "<code>TypeError</code>" in html
    assert "1. carry" in log.table()
    with pytest.raises(TypeError, match="zero-argument function"):
        log.record("x", 3, cause="", fix="")


@pytest.mark.parametrize(
    "mesh_shape,d0,d1,distinct",
    [
        ("2x4", "data", "model", 8),
        ("4x2", "data", None, 4),
        ("2x4", None, None, 1),
        ((1, 8), "data+model", None, 8),
        ("8x1", "model", "data", 8),
    ],
)
def test_layout_figure_callback_headless(mesh_shape, d0, d1, distinct):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from beyondgrad.figures import ch4 as figures

    fig = figures.layout_figure(mesh_shape, d0, d1)
    ax = fig.axes[0]
    assert len(ax.patches) == distinct
    assert "varies over" in ax.get_title()
    plt.close(fig)


def test_layout_figures_reject_bad_values():
    from beyondgrad.figures import ch4 as figures

    with pytest.raises(ValueError, match="2x4"):
        figures.layout_figure("two by four", "data", "model")
    with pytest.raises(ValueError, match="twice"):
        figures.layout_figure("2x4", "data", "data")
    with pytest.raises(ValueError, match="at least one"):
        figures.layout_small_multiples([])
    with pytest.raises(ValueError, match="2-D"):
        figures.plot_layout(sharding.block_layout((8,), P("data"), (8,), ("data",)))


def test_small_multiples_panels():
    import matplotlib.pyplot as plt

    from beyondgrad.figures import ch4 as figures

    fig = figures.layout_small_multiples(LAYOUT_CASES[:4])
    assert sum(ax.has_data() for ax in fig.axes) == 4
    plt.close(fig)


HVP_FORMS = {
    "sum(v * v)": lambda v: jnp.sum(v * v),
    "sum(v ** 2)": lambda v: jnp.sum(v**2),
    "v @ v": lambda v: v @ v,
    "sum(lax.mul(v, v))": lambda v: jnp.sum(lax.mul(v, v)),
    "lax.dot(v, v)": lambda v: lax.dot(v, v),
    "mean(sin(v) * v**2)": lambda v: jnp.mean(jnp.sin(v) * v**2),
}


@pytest.mark.parametrize("name", sorted(HVP_FORMS))
def test_hvp_direction_with_the_primal_type_matches_float64_blocks(name):
    """Chapter 4's advice for Hessian-vector products inside shard_map: a direction
    built with ones_like or cast to varying gives, on every JAX, the product computed
    block by block without shard_map, in float64 (whatever an invariant direction does
    on this JAX: it raises for some of these forms, differently by release)."""
    f = HVP_FORMS[name]
    mesh = runtime.demo_mesh(8, "data")
    x = jnp.arange(16.0) / 4

    def like(xb):
        return jax.jvp(jax.grad(f), (xb,), (jnp.ones_like(xb),))[1]

    def cast(xb):
        d = compat.pcast_varying(jnp.ones(xb.shape), "data")
        return jax.jvp(jax.grad(f), (xb,), (d,))[1]

    with jax.enable_x64(True):
        blocks = np.asarray(x, np.float64).reshape(8, -1)
        ref = np.concatenate(
            [
                np.asarray(jax.jvp(jax.grad(f), (jnp.asarray(b),), (jnp.ones(2),))[1])
                for b in blocks
            ]
        )
    for fix in (like, cast):
        got = jax.jit(
            jax.shard_map(fix, mesh=mesh, in_specs=P("data"), out_specs=P("data"))
        )(x)
        # float32: each entry is a sum of a few terms of size <= |x|^2 / 2 ~ 7 (the
        # mean's 1/2 and sin/cos <= 1): rounding <= ~10 ulps of 7 ~ 1e-5
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, atol=1e-5, rtol=0)
