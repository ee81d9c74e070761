"""beyondgrad.linear (and figures.ch2, the Chapter 2 part of compat) against
independent references: jax.vjp, jax.jacrev, float64 finite differences, pinned values."""

import inspect
from types import SimpleNamespace

import drift_record
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import compat, drift, linear
from beyondgrad import exercises as ex
from beyondgrad.figures import ch2 as fig2


def _mlp_loss(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return {"loss": jnp.mean((h @ params["w2"]) ** 2), "hidden": h}


def _params(key, dtype=jnp.float32):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "w1": jax.random.normal(k1, (3, 5), dtype),
        "b1": jax.random.normal(k2, (5,), dtype),
        "w2": jax.random.normal(k3, (5, 2), dtype),
    }


def _dense_jacobian(jac_tree, out_example, in_example):
    """Assemble jacrev's nested pytree-of-pytrees into one (out size, in size) matrix."""
    out_leaves = jax.tree_util.tree_leaves(out_example)
    in_leaves = jax.tree_util.tree_leaves(in_example)
    blocks = jax.tree_util.tree_leaves(jac_tree)
    assert len(blocks) == len(out_leaves) * len(in_leaves)
    rows = []
    for i, o in enumerate(out_leaves):
        row = [
            np.asarray(blocks[i * len(in_leaves) + j]).reshape(np.size(o), np.size(x))
            for j, x in enumerate(in_leaves)
        ]
        rows.append(np.concatenate(row, axis=1))
    return np.concatenate(rows, axis=0)


# ------------------------------------------------------------------ vjp_from_linearize


def test_vjp_from_linearize_matches_jax_vjp_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(0))
        x = jax.random.normal(jax.random.key(1), (4, 3))
        out, vjp_fn = linear.vjp_from_linearize(_mlp_loss, params, x)
        ref_out, ref_vjp = jax.vjp(_mlp_loss, params, x)
        ct = {
            "loss": jnp.float32(0.7),
            "hidden": jax.random.normal(jax.random.key(2), (4, 5)),
        }
        assert ex.tree_mismatches(out, ref_out) == []
        got, want = vjp_fn(ct), ref_vjp(ct)
        assert isinstance(got, tuple) and len(got) == 2
        assert ex.tree_mismatches(got, want, rtol=1e-5, atol=1e-6) == []


def test_vjp_from_linearize_gives_grad_and_accepts_python_scalar_cotangent():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(3))
        x = jax.random.normal(jax.random.key(4), (4, 3))
        loss = lambda p: _mlp_loss(p, x)["loss"]  # noqa: E731
        _, vjp_fn = linear.vjp_from_linearize(loss, params)
        (g,) = vjp_fn(1.0)
        assert ex.tree_mismatches(g, jax.grad(loss)(params), rtol=1e-5, atol=1e-6) == []


def test_vjp_from_linearize_against_float64_finite_differences():
    with jax.enable_x64(True):

        def f(p):
            return jnp.sin(p["a"]) * p["b"] ** 2

        p = {"a": jnp.array([0.3, -1.2, 2.0]), "b": jnp.array([1.5, 0.5, -0.7])}
        _, vjp_fn = linear.vjp_from_linearize(f, p)
        v = jnp.array([1.0, -2.0, 0.5])
        (g,) = vjp_fn(v)
        flat, unravel = jax.flatten_util.ravel_pytree(p)
        eps = 1e-6
        fd = np.array(
            [
                float(
                    jnp.vdot(v, f(unravel(flat + eps * e)) - f(unravel(flat - eps * e)))
                )
                / (2 * eps)
                for e in np.eye(flat.size)
            ]
        )
        np.testing.assert_allclose(
            jax.flatten_util.ravel_pytree(g)[0], fd, rtol=1e-7, atol=1e-9
        )


# -------------------------------------------------------------------- dot_product_test


def test_dot_product_test_passes_jax_transpose_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(5))
        x = jax.random.normal(jax.random.key(6), (4, 3))
        out, f_jvp = jax.linearize(lambda p: _mlp_loss(p, x), params)
        f_t = jax.linear_transpose(f_jvp, params)
        for k in range(3):
            assert (
                linear.dot_product_test(f_jvp, f_t, params, out, jax.random.key(k))
                < 1e-5
            )


def test_dot_product_test_catches_wrong_transpose_and_complex_maps():
    a = jax.random.normal(jax.random.key(7), (4, 3))
    assert (
        linear.dot_product_test(
            lambda u: a @ u,
            lambda v: a.T @ v,
            jnp.zeros(3),
            jnp.zeros(4),
            jax.random.key(0),
        )
        < 1e-6
    )
    # forgetting a minus sign, or transposing the wrong way, gives an O(1) mismatch
    assert (
        linear.dot_product_test(
            lambda u: a @ u,
            lambda v: -(a.T @ v),
            jnp.zeros(3),
            jnp.zeros(4),
            jax.random.key(0),
        )
        > 0.01
    )
    sq = jax.random.normal(jax.random.key(8), (3, 3))
    assert (
        linear.dot_product_test(
            lambda u: sq @ u,
            lambda v: sq @ v,
            jnp.zeros(3),
            jnp.zeros(3),
            jax.random.key(0),
        )
        > 0.01
    )
    # complex: JAX's transpose is the plain transpose (no conjugate), not the adjoint
    c = (a + 1j * jax.random.normal(jax.random.key(9), (4, 3))).astype(jnp.complex64)
    z3, z4 = jnp.zeros(3, jnp.complex64), jnp.zeros(4, jnp.complex64)
    assert (
        linear.dot_product_test(
            lambda u: c @ u,
            jax.linear_transpose(lambda u: c @ u, z3),
            z3,
            z4,
            jax.random.key(1),
        )
        < 1e-5
    )


def _real_matrix(fn, n_in, in_complex):
    """The float64 matrix of a real-linear map on (re, im) coordinates, column by
    column: the coordinates of fn(e_j) and fn(1j e_j) (no JAX transpose involved)."""
    cols = []
    for scale in (1.0, 1j) if in_complex else (1.0,):
        for j in range(n_in):
            e = np.zeros(n_in, np.complex128 if in_complex else np.float64)
            e[j] = scale
            dt = jnp.complex64 if in_complex else jnp.float32
            y = np.asarray(fn(jnp.asarray(e, dt)), np.complex128)
            cols.append(np.concatenate([y.real, y.imag]))
    return np.stack(cols, axis=1)


@pytest.mark.parametrize(
    "name",
    ["conj", "real", "real input times 1+2j", "rfft", "complex-linear"],
)
def test_dot_product_test_pairs_real_parts_for_real_linear_maps(name):
    xr, xc = jnp.zeros(8, jnp.float32), jnp.zeros(8, jnp.complex64)
    fn, x = {
        "conj": (jnp.conj, xc),
        "real": (jnp.real, xc),
        "real input times 1+2j": (lambda z: z * (1 + 2j), xr),
        "rfft": (jnp.fft.rfft, xr),
        "complex-linear": (lambda z: (1 + 2j) * z, xc),
    }[name]
    out = fn(x)
    t = jax.linear_transpose(fn, x)
    # independent reference: with <a, b> = Re sum(a b) = a_re.b_re - a_im.b_im, the
    # transpose in (re, im) coordinates is S M^T S, S = diag(1, -1), M the real matrix
    m = _real_matrix(fn, 8, jnp.iscomplexobj(x))
    v = np.asarray(jax.random.normal(jax.random.key(3), out.shape, out.dtype))
    sign_out = np.concatenate([np.ones(out.size), -np.ones(out.size)])
    v_coords = np.concatenate([v.real, v.imag]) * sign_out
    w = m.T @ v_coords
    if jnp.iscomplexobj(x):
        w = w[:8] - 1j * w[8:]
    np.testing.assert_allclose(
        np.asarray(t(jnp.asarray(v))[0], np.complex128), w, rtol=1e-5, atol=1e-5
    )
    for seed in range(3):
        key = jax.random.key(seed)
        assert linear.dot_product_test(fn, t, x, out, key) < 1e-6
    # a transpose off by a factor 1j (right modulus, wrong phase) is caught
    wrong = lambda w: 1j * t(w)[0]  # noqa: E731
    if jnp.iscomplexobj(x):
        assert linear.dot_product_test(fn, wrong, x, out, key) > 0.01


def test_dot_product_test_refuses_the_hermitian_adjoint():
    a = (jnp.arange(1.0, 5.0) + 1j * jnp.array([1.0, -2.0, 0.5, 3.0])).astype(
        jnp.complex64
    )
    z = jnp.zeros(4, jnp.complex64)
    for seed in range(5):
        key = jax.random.key(seed)
        assert (
            linear.dot_product_test(lambda u: a * u, lambda v: a * v, z, z, key) < 1e-6
        )
        assert (
            linear.dot_product_test(
                lambda u: a * u, lambda v: jnp.conj(a) * v, z, z, key
            )
            > 0.01
        )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_low_precision_linear_maps_are_accepted_and_affine_ones_refused(dtype):
    x = jnp.zeros(256, dtype)
    f = lambda u: jnp.cumsum(u) / 16  # noqa: E731
    t = jax.linear_transpose(f, x)
    eps = float(jnp.finfo(dtype).eps)
    keys = [jax.random.key(seed) for seed in range(3)]
    right = max(linear.dot_product_test(f, t, x, x, k) for k in keys)
    # the chapter's wrong transpose (cumsum from the start) stands out of rounding
    wrong_t = lambda v: jnp.cumsum(v) / 16  # noqa: E731
    wrong = max(linear.dot_product_test(f, wrong_t, x, x, k) for k in keys)
    assert right < eps / 2 and wrong > 4 * eps
    dense = np.asarray(linear.materialize(f, x), np.float64)
    reference = np.tril(np.ones((256, 256))) / 16  # the closed form
    np.testing.assert_allclose(dense, reference, rtol=eps, atol=0)
    with pytest.raises(ValueError, match="not linear"):
        linear.dot_product_test(lambda u: u + 1.0, lambda v: v, x, x, _key())
    with pytest.raises(ValueError, match="not linear"):
        linear.materialize(lambda u: u + 1.0, x)


def test_materialize_refuses_maps_that_are_not_complex_linear():
    x = jnp.array([1 + 2j, 0.5j, -1.0], jnp.complex64)
    for fn in (jnp.conj, jnp.real, jax.linearize(lambda z: z * jnp.conj(z), x)[1]):
        with pytest.raises(ValueError, match="not complex-linear"):
            linear.materialize(fn, x)
    with pytest.raises(ValueError, match="is not linear"):
        linear.materialize(lambda z: z + 1.0, x)
    a = jnp.array([1 + 2j, 3.0, -1j], jnp.complex64)
    np.testing.assert_allclose(linear.materialize(lambda z: a * z, x), np.diag(a))
    # the recipe the message gives: real and imaginary parts as real arguments
    dense = linear.materialize(lambda p: jnp.conj(p[0] + 1j * p[1]), (x.real, x.imag))
    np.testing.assert_allclose(dense, np.hstack([np.eye(3), -1j * np.eye(3)]))


# ------------------------------------------------------------------------- materialize


def test_materialize_linearized_map_matches_jacrev_and_jacfwd_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(10))
        x = jax.random.normal(jax.random.key(11), (4, 3))
        f = lambda p: _mlp_loss(p, x)  # noqa: E731
        out, f_jvp = jax.linearize(f, params)
        dense = linear.materialize(f_jvp, params)
        assert dense.shape == (1 + 20, 15 + 5 + 10)
        np.testing.assert_allclose(
            dense,
            _dense_jacobian(jax.jacrev(f)(params), out, params),
            rtol=1e-5,
            atol=1e-6,
        )
        np.testing.assert_allclose(
            dense,
            _dense_jacobian(jax.jacfwd(f)(params), out, params),
            rtol=1e-5,
            atol=1e-6,
        )
        # the transpose, materialized over the output, is the transposed matrix (rows of J)
        _, vjp_fn = jax.vjp(f, params)
        rows = linear.materialize(lambda ct: vjp_fn(ct)[0], out)
        np.testing.assert_allclose(rows, dense.T, rtol=1e-5, atol=1e-6)


def test_materialize_in_float64_against_finite_differences():
    with jax.enable_x64(True):

        def f(x):
            return jnp.stack(
                [x[0] * x[1], jnp.exp(x[2]), jnp.sin(x[0] + x[2]), x[1] ** 3]
            )

        x = jnp.array([0.4, -1.1, 0.3])
        dense = linear.materialize(jax.linearize(f, x)[1], x)
        eps = 1e-6
        fd = np.stack(
            [(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(3)], axis=1
        )
        np.testing.assert_allclose(dense, fd, rtol=1e-7, atol=1e-9)
        assert dense.dtype == jnp.float64


def test_materialize_works_under_jit():
    f, x = fig2.mlp_map(6, 3)
    jitted = jax.jit(lambda x: linear.materialize(jax.linearize(f, x)[1], x))
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(jitted(x), jax.jacrev(f)(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------- bad input, table-driven


def _key():
    return jax.random.key(0)


def _ident(u):
    return u


def _sin_vjp():
    return linear.vjp_from_linearize(jnp.sin, jnp.ones(3))[1]


def _dpt(f_lin, f_t, n_in=3, n_out=3, key=None, **kw):
    key = _key() if key is None else key
    return linear.dot_product_test(
        f_lin, f_t, jnp.zeros(n_in), jnp.zeros(n_out), key, **kw
    )


BAD_INPUTS = [
    # (name, call, exception class, text the message must contain)
    (
        "vjp f not callable",
        lambda: linear.vjp_from_linearize(3.0, 1.0),
        TypeError,
        "f must be a function",
    ),
    (
        "vjp no primals",
        lambda: linear.vjp_from_linearize(jnp.sin),
        TypeError,
        "at least one primal",
    ),
    (
        "vjp int primal",
        lambda: linear.vjp_from_linearize(lambda n: n * 2.0, jnp.arange(3)),
        TypeError,
        "dtype int32",
    ),
    (
        "vjp int output",
        lambda: linear.vjp_from_linearize(lambda x: x.astype(jnp.int32), jnp.ones(3)),
        TypeError,
        "f's output",
    ),
    (
        "vjp empty primal",
        lambda: linear.vjp_from_linearize(lambda d: 1.0, {}),
        ValueError,
        "no array leaves",
    ),
    ("cotangent shape", lambda: _sin_vjp()(jnp.ones(4)), ValueError, "shape (4,)"),
    (
        "cotangent structure",
        lambda: _sin_vjp()((jnp.ones(3), jnp.ones(3))),
        ValueError,
        "structure",
    ),
    (
        "cotangent dtype",
        lambda: _sin_vjp()(jnp.ones(3, jnp.int32)),
        TypeError,
        "astype(float32)",
    ),
    ("dpt not linear", lambda: _dpt(jnp.sin, jnp.cos), ValueError, "not linear"),
    ("dpt affine", lambda: _dpt(lambda u: u + 1.0, _ident), ValueError, "not linear"),
    (
        "dpt out shape",
        lambda: _dpt(_ident, _ident, n_out=4),
        ValueError,
        "f_lin(u) has shape (3,)",
    ),
    (
        "dpt transpose shape",
        lambda: _dpt(lambda u: jnp.concatenate([u, u]), _ident, n_out=6),
        ValueError,
        "f_transpose(v) has shape",
    ),
    ("dpt int key", lambda: _dpt(_ident, _ident, key=0), TypeError, "PRNG key"),
    (
        "dpt int example",
        lambda: linear.dot_product_test(
            _ident, _ident, jnp.zeros(3, jnp.int32), jnp.zeros(3), _key()
        ),
        TypeError,
        "float or complex",
    ),
    (
        "dpt transpose None",
        lambda: _dpt(_ident, None),
        TypeError,
        "f_transpose must be a function",
    ),
    (
        "dpt rtol zero",
        lambda: _dpt(_ident, _ident, linearity_rtol=0.0),
        ValueError,
        "linearity_rtol must be a float > 0",
    ),
    (
        "dpt rtol str",
        lambda: _dpt(_ident, _ident, linearity_rtol="1e-3"),
        TypeError,
        "linearity_rtol must be a float",
    ),
    (
        "materialize f not linear",
        lambda: linear.materialize(jnp.sin, jnp.ones(3)),
        ValueError,
        "not f itself",
    ),
    (
        "materialize affine",
        lambda: linear.materialize(lambda u: 2.0 * u + 1.0, jnp.zeros(3)),
        ValueError,
        "not linear",
    ),
    (
        "materialize int input",
        lambda: linear.materialize(_ident, jnp.arange(3)),
        TypeError,
        "float or complex",
    ),
    (
        "materialize int output",
        lambda: linear.materialize(lambda u: u.astype(jnp.int32), jnp.zeros(3)),
        TypeError,
        "linear_fn's output",
    ),
    (
        "materialize not callable",
        lambda: linear.materialize(jnp.ones(3), jnp.ones(3)),
        TypeError,
        "linear_fn must be a function",
    ),
    (
        "materialize check str",
        lambda: linear.materialize(_ident, jnp.ones(3), check="yes"),
        TypeError,
        "check must be True or False",
    ),
    (
        "tracer name str",
        lambda: linear.grad_tracer_name("no"),
        TypeError,
        "use_direct_linearize must be None, True or False",
    ),
    (
        "set option int",
        lambda: compat.set_direct_linearize(1),
        TypeError,
        "enabled must be True or False",
    ),
    (
        "mlp_map zero",
        lambda: fig2.mlp_map(0, 3),
        ValueError,
        "n_in must be a positive int",
    ),
    (
        "mlp_map float",
        lambda: fig2.mlp_map(4, 2.5),
        TypeError,
        "n_out must be a Python int",
    ),
    (
        "mlp_map bool hidden",
        lambda: fig2.mlp_map(4, 2, hidden=True),
        TypeError,
        "hidden must be a Python int",
    ),
    (
        "plot empty",
        lambda: fig2.plot_jacobian_timings({}),
        ValueError,
        "non-empty dict",
    ),
    (
        "plot missing strategy",
        lambda: fig2.plot_jacobian_timings({(2, 2): {"jacfwd": None}}),
        ValueError,
        "lack ['jacrev', 'linearize + materialize']",
    ),
]


@pytest.mark.parametrize(
    "call, exc, text", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS]
)
def test_bad_input_gets_a_clear_error(call, exc, text):
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), str(info.value)


# ------------------------------------------------------------- tracer names, pinned


def _recorded_tracer_names() -> tuple[str, str, str]:
    """(default, option on, option off) for this JAX, from the drift record: probes
    ch2_tracer_classes ("grad=X, ...") and ch2_direct_linearize_option ("present:
    on=X, off=Y"); 0.10.2 is the first recorded release that ignores the option."""
    classes = drift_record.expected("ch2_tracer_classes").value
    default = dict(p.split("=") for p in classes.split(", "))["grad"]
    option = drift_record.expected("ch2_direct_linearize_option").value
    assert option.startswith("present: "), option
    names = dict(p.split("=") for p in option.removeprefix("present: ").split(", "))
    return default, names["on"], names["off"]


def test_grad_tracer_name_as_the_drift_record_says():
    """Runs on every JAX: an unrecorded version is held to the newest recorded one
    before it (tests/drift_record.py), so a change fails here instead of skipping."""
    default, on, off = _recorded_tracer_names()
    assert linear.grad_tracer_name() == default
    assert linear.grad_tracer_name(True) == on
    assert linear.grad_tracer_name(False) == off
    assert compat.direct_linearize_option() is True  # restored


def test_drift_record_expectation_for_an_unrecorded_version():
    """A version after the last recorded one is held to the last recorded row."""
    last = drift.versions()[-1]
    parts = [int(p) for p in last.split(".")[:3]]
    later = f"{parts[0]}.{parts[1] + 1}.0rc1.dev20270101"
    assert drift_record.recorded_version(later) == last
    assert drift_record.recorded_version("0.8.2") == "0.8.2"
    assert drift_record.expected("ch2_direct_linearize_option", "0.8.2").value == (
        "present: on=LinearizeTracer, off=JVPTracer"
    )


def test_direct_linearize_option_absent(monkeypatch):
    """Where JAX drops the option: None, and a ValueError naming the version."""
    fake = SimpleNamespace(config=SimpleNamespace(values={}), __version__="9.9.9")
    monkeypatch.setattr(compat, "jax", fake)
    assert compat.direct_linearize_option() is None
    with pytest.raises(ValueError, match="JAX 9.9.9 has no jax_use_direct_linearize"):
        compat.set_direct_linearize(False)


def test_set_direct_linearize_returns_previous_and_sets():
    before = compat.set_direct_linearize(False)
    try:
        assert before is True and compat.direct_linearize_option() is False
    finally:
        compat.set_direct_linearize(before)
    assert compat.direct_linearize_option() is True


# ------------------------------------------------------------------ figures.ch2


def test_mlp_map_is_the_stated_formula():
    f, x = fig2.mlp_map(7, 3, hidden=4, seed=5)
    k1, k2, k3 = jax.random.split(jax.random.key(5), 3)
    w1 = np.asarray(jax.random.normal(k1, (4, 7)), np.float64) / np.sqrt(7)
    w2 = np.asarray(jax.random.normal(k2, (3, 4)), np.float64) / np.sqrt(4)
    np.testing.assert_array_equal(x, jax.random.normal(k3, (7,)))
    want = w2 @ np.tanh(w1 @ np.asarray(x, np.float64))
    with jax.default_matmul_precision("highest"):
        got = f(x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # float32 vs float64


def test_jacobian_timings_measures_each_strategy():
    times = fig2.jacobian_timings(3, 2, repeats=2, min_time=0.0)
    assert tuple(times) == fig2.STRATEGIES
    for timing in times.values():
        assert len(timing.samples) == 2
        assert timing.min == min(timing.samples) and timing.min <= timing.median


def test_plot_jacobian_timings_titles_show_the_measured_ratio():
    import matplotlib

    matplotlib.use("Agg")
    from beyondgrad import measure

    def timing(t):
        return measure.Timing(t, t, (t,))

    times = {
        "jacfwd": timing(4e-3),
        "jacrev": timing(1e-3),
        "linearize + materialize": timing(2e-3),
    }
    fig = fig2.plot_jacobian_timings({(1024, 4): times})
    title = fig.axes[0].get_title()
    assert "1024 inputs → 4 outputs" in title and "jacfwd / jacrev time = 4" in title
    heights = [bar.get_height() for bar in fig.axes[0].patches]
    assert heights == pytest.approx([4.0, 1.0, 2.0])


# ------------------------------------------------------------------ measure.temp_bytes


def test_checkpoint_saves_compiled_memory():
    """The chapter's claim: scan + checkpoint plans less scratch memory than plain scan."""
    from beyondgrad import measure

    def body(c, _):
        return jnp.sin(jnp.cos(c) * 1.3) + 0.1 * c, None

    def loss(x, remat):
        c, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, None, length=50)
        return jnp.sum(c)

    x = jnp.ones(2048)
    plain = measure.temp_bytes(jax.grad(lambda x: loss(x, False)), x)
    remat = measure.temp_bytes(jax.grad(lambda x: loss(x, True)), x)
    if plain is None or remat is None:
        pytest.skip("this backend reports no memory analysis")
    assert remat < plain


# --- what is saved for the backward pass -----------------------------------------------


def test_saved_residuals_lists_what_checkpoint_policies_keep():
    def f(x):
        return jnp.sum(jnp.sin(x) ** 2)

    x = jnp.ones(3)
    plain = linear.saved_residuals(f, x)
    assert plain and all(line.startswith("f32[3] ") for line in plain)
    assert all(" from /" not in line for line in plain)  # locations cut to the name
    assert linear.saved_residuals(jax.checkpoint(f), x) == [
        "f32[3] from the argument x"
    ]
    everything = jax.checkpoint(f, policy=jax.checkpoint_policies.everything_saveable)
    assert len(linear.saved_residuals(everything, x)) == len(plain)
    with pytest.raises(TypeError, match="f must be a function"):
        linear.saved_residuals(3, x)


def test_saved_residuals_of_a_checkpointed_scan_body_is_the_carry():
    def body(c, _):
        return jnp.sin(jnp.cos(c)), None

    def loss(c, remat):
        c, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, c, None, length=5)
        return jnp.sum(c)

    c = jnp.ones(4)
    (saved,) = linear.saved_residuals(lambda c: loss(c, True), c)
    assert saved.startswith("f32[5,4] output of scan in ") and saved.endswith("loss")
    assert len(linear.saved_residuals(lambda c: loss(c, False), c)) == 2


# --- compat: the linearization machinery, read from JAX -----------------------------


def test_linearization_rules_are_a_few_primitives_and_jvp_is_the_fallback():
    rules = compat.linearization_rules()
    assert {"sin", "scan", "cond", "jit"} <= set(rules)
    assert "cos" not in rules and "mul" not in rules
    assert "primitive_jvps" in inspect.getsource(compat.fallback_linearize_rule())
    assert "JaxprTrace(" in inspect.getsource(compat.linearize_from_jvp())
    assert "backward_pass3" in inspect.getsource(compat.vjp_backward())


# --- compat: a hijax primitive with reverse rules only (chapter 2) ------------------


def _hi_sin():
    class HiSin(compat.vjp_hi_primitive_base()):
        def __init__(self, aval):
            self.in_avals, self.out_aval, self.params = (aval,), aval, {}
            super().__init__()

        def expand(self, z):
            return jnp.sin(z)

        def fwd(self, z):
            return jnp.sin(z), jnp.cos(z)

        def bwd(self, cos_z, g):
            return (g * cos_z,)

    return lambda z: HiSin(jax.typeof(z))(z)


def test_hijax_primitive_has_grad_and_no_jvp():
    """The counterexample to "reverse mode needs forward rules", on every supported JAX."""
    hi_sin = _hi_sin()
    x = jnp.array([0.1, 0.5, 1.0])
    np.testing.assert_allclose(hi_sin(x), np.sin(np.asarray(x)), rtol=1e-6)
    g = jax.jit(jax.grad(lambda z: hi_sin(z).sum()))(x)
    np.testing.assert_allclose(g, np.cos(np.asarray(x)), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="jvp"):
        jax.jvp(hi_sin, (x,), (jnp.ones(3),))


def test_hijax_primitive_grad_under_checkpoint_needs_a_jvp():
    """jax.checkpoint differentiates its body with the JVP, which a hijax primitive lacks."""
    hi_sin = _hi_sin()
    x = jnp.array([0.1, 0.5, 1.0])
    with pytest.raises(NotImplementedError, match="jvp"):
        jax.grad(jax.checkpoint(lambda z: hi_sin(z).sum()))(x)


def test_vjp_hi_primitive_base_reads_the_signature_not_the_name():
    """vjp_fwd takes nzs_in from JAX 0.9.0 on, still under the name VJPHiPrimitive."""

    class Old:  # 0.8.2
        def vjp_fwd(self, *args):
            raise AssertionError

    class Mid:  # 0.9.0 to 0.11: VJPHiPrimitive, new signature
        def vjp_fwd(self, nzs_in, /, *args):
            raise AssertionError

    class Default:  # the default rule of 0.10-0.12 spells it in_nzs
        def vjp_fwd(self, in_nzs, *args):
            raise AssertionError

    assert not compat._vjp_fwd_takes_nzs(Old)
    assert compat._vjp_fwd_takes_nzs(Mid)
    assert compat._vjp_fwd_takes_nzs(Default)
    from jax.experimental import hijax

    base = getattr(hijax, "HiPrim", None) or getattr(hijax, "VJPHiPrimitive")  # noqa: B009
    params = list(inspect.signature(base.vjp_fwd).parameters)
    assert compat._vjp_fwd_takes_nzs(base) == (params[1] == "nzs_in")
    assert compat._vjp_fwd_takes_nzs(base) == (compat.jax_version() >= (0, 9, 0))


def test_pure_callback_has_rules_that_raise_value_error():
    """pure_callback's JVP and transpose rules exist (and raise ValueError)."""
    from jax.interpreters import ad

    p = compat.primitive("pure_callback")
    assert p is not None
    assert p in ad.primitive_jvps and p in ad.primitive_transposes

    def cb(z):
        out = jax.ShapeDtypeStruct(z.shape, z.dtype)
        return jax.pure_callback(np.sin, out, z, vmap_method="expand_dims")

    with pytest.raises(ValueError, match="Pure callbacks do not support JVP"):
        jax.jvp(cb, (jnp.ones(2),), (jnp.ones(2),))
