"""beyondgrad.linear against independent references: jax.vjp, jax.jacrev, float64 finite differences."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from beyondgrad import exercises as ex
from beyondgrad import linear


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
        row = [np.asarray(blocks[i * len(in_leaves) + j]).reshape(np.size(o), np.size(x)) for j, x in enumerate(in_leaves)]
        rows.append(np.concatenate(row, axis=1))
    return np.concatenate(rows, axis=0)


# ------------------------------------------------------------------ vjp_from_linearize


def test_vjp_from_linearize_matches_jax_vjp_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(0))
        x = jax.random.normal(jax.random.key(1), (4, 3))
        out, vjp_fn = linear.vjp_from_linearize(_mlp_loss, params, x)
        ref_out, ref_vjp = jax.vjp(_mlp_loss, params, x)
        ct = {"loss": jnp.float32(0.7), "hidden": jax.random.normal(jax.random.key(2), (4, 5))}
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
        fd = np.array([
            float(jnp.vdot(v, f(unravel(flat + eps * e)) - f(unravel(flat - eps * e)))) / (2 * eps)
            for e in np.eye(flat.size)
        ])
        np.testing.assert_allclose(jax.flatten_util.ravel_pytree(g)[0], fd, rtol=1e-7, atol=1e-9)


def test_vjp_from_linearize_rejects_bad_input():
    with pytest.raises(TypeError, match="must be a function"):
        linear.vjp_from_linearize(3.0, 1.0)
    with pytest.raises(TypeError, match="at least one primal"):
        linear.vjp_from_linearize(jnp.sin)
    with pytest.raises(TypeError, match="dtype int32"):
        linear.vjp_from_linearize(lambda n: n * 2.0, jnp.arange(3))
    with pytest.raises(TypeError, match="f's output"):
        linear.vjp_from_linearize(lambda x: jnp.round(x).astype(jnp.int32), jnp.ones(3))
    _, vjp_fn = linear.vjp_from_linearize(jnp.sin, jnp.ones(3))
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        vjp_fn(jnp.ones(4))
    with pytest.raises(ValueError, match="structure"):
        vjp_fn((jnp.ones(3), jnp.ones(3)))
    with pytest.raises(TypeError, match="dtype int32"):
        vjp_fn(jnp.ones(3, jnp.int32))


# -------------------------------------------------------------------- dot_product_test


def test_dot_product_test_passes_jax_transpose_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(5))
        x = jax.random.normal(jax.random.key(6), (4, 3))
        out, f_jvp = jax.linearize(lambda p: _mlp_loss(p, x), params)
        f_t = jax.linear_transpose(f_jvp, params)
        for k in range(3):
            assert linear.dot_product_test(f_jvp, f_t, params, out, jax.random.key(k)) < 1e-5


def test_dot_product_test_catches_wrong_transpose_and_complex_maps():
    a = jax.random.normal(jax.random.key(7), (4, 3))
    assert linear.dot_product_test(lambda u: a @ u, lambda v: a.T @ v, jnp.zeros(3), jnp.zeros(4), jax.random.key(0)) < 1e-6
    # forgetting a minus sign, or transposing the wrong way, gives an O(1) mismatch
    assert linear.dot_product_test(lambda u: a @ u, lambda v: -(a.T @ v), jnp.zeros(3), jnp.zeros(4), jax.random.key(0)) > 0.01
    sq = jax.random.normal(jax.random.key(8), (3, 3))
    assert linear.dot_product_test(lambda u: sq @ u, lambda v: sq @ v, jnp.zeros(3), jnp.zeros(3), jax.random.key(0)) > 0.01
    # complex: JAX's transpose is the plain transpose (bilinear pairing), not the adjoint
    c = (a + 1j * jax.random.normal(jax.random.key(9), (4, 3))).astype(jnp.complex64)
    z3, z4 = jnp.zeros(3, jnp.complex64), jnp.zeros(4, jnp.complex64)
    assert linear.dot_product_test(lambda u: c @ u, jax.linear_transpose(lambda u: c @ u, z3), z3, z4, jax.random.key(1)) < 1e-5


def test_dot_product_test_rejects_bad_input():
    key = jax.random.key(0)
    ident = lambda u: u  # noqa: E731
    with pytest.raises(ValueError, match="not linear"):
        linear.dot_product_test(jnp.sin, jnp.cos, jnp.zeros(3), jnp.zeros(3), key)
    with pytest.raises(ValueError, match="not linear"):  # affine is not linear
        linear.dot_product_test(lambda u: u + 1.0, ident, jnp.zeros(3), jnp.zeros(3), key)
    with pytest.raises(ValueError, match=r"f_lin\(u\) has shape \(3,\)"):
        linear.dot_product_test(ident, ident, jnp.zeros(3), jnp.zeros(4), key)
    with pytest.raises(ValueError, match=r"f_transpose\(v\) has shape"):
        linear.dot_product_test(lambda u: jnp.concatenate([u, u]), ident, jnp.zeros(3), jnp.zeros(6), key)
    with pytest.raises(TypeError, match="PRNG key"):
        linear.dot_product_test(ident, ident, jnp.zeros(3), jnp.zeros(3), 0)
    with pytest.raises(TypeError, match="float or complex"):
        linear.dot_product_test(ident, ident, jnp.zeros(3, jnp.int32), jnp.zeros(3), key)
    with pytest.raises(TypeError, match="must be a function"):
        linear.dot_product_test(ident, None, jnp.zeros(3), jnp.zeros(3), key)


# ------------------------------------------------------------------------- materialize


def test_materialize_linearized_map_matches_jacrev_and_jacfwd_on_pytrees():
    with jax.default_matmul_precision("highest"):
        params = _params(jax.random.key(10))
        x = jax.random.normal(jax.random.key(11), (4, 3))
        f = lambda p: _mlp_loss(p, x)  # noqa: E731
        out, f_jvp = jax.linearize(f, params)
        dense = linear.materialize(f_jvp, params)
        assert dense.shape == (1 + 20, 15 + 5 + 10)
        np.testing.assert_allclose(dense, _dense_jacobian(jax.jacrev(f)(params), out, params), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(dense, _dense_jacobian(jax.jacfwd(f)(params), out, params), rtol=1e-5, atol=1e-6)
        # the transpose, materialized over the output, is the transposed matrix (rows of J)
        _, vjp_fn = jax.vjp(f, params)
        rows = linear.materialize(lambda ct: vjp_fn(ct)[0], out)
        np.testing.assert_allclose(rows, dense.T, rtol=1e-5, atol=1e-6)


def test_materialize_in_float64_against_finite_differences():
    with jax.enable_x64(True):
        def f(x):
            return jnp.stack([x[0] * x[1], jnp.exp(x[2]), jnp.sin(x[0] + x[2]), x[1] ** 3])

        x = jnp.array([0.4, -1.1, 0.3])
        dense = linear.materialize(jax.linearize(f, x)[1], x)
        eps = 1e-6
        fd = np.stack([(f(x + eps * e) - f(x - eps * e)) / (2 * eps) for e in np.eye(3)], axis=1)
        np.testing.assert_allclose(dense, fd, rtol=1e-7, atol=1e-9)
        assert dense.dtype == jnp.float64


def test_materialize_works_under_jit_and_rejects_bad_input():
    f, x = linear.mlp_map(6, 3)
    jitted = jax.jit(lambda x: linear.materialize(jax.linearize(f, x)[1], x))
    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(jitted(x), jax.jacrev(f)(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not linear"):
        linear.materialize(f, x)
    with pytest.raises(ValueError, match="not linear"):
        linear.materialize(lambda u: 2.0 * u + 1.0, jnp.zeros(3))
    with pytest.raises(TypeError, match="float or complex"):
        linear.materialize(lambda u: u, jnp.arange(3))
    with pytest.raises(TypeError, match="output"):
        linear.materialize(lambda u: u.astype(jnp.int32), jnp.zeros(3))


# ----------------------------------------------------------------- costs and internals


@pytest.mark.parametrize("n_in,n_out", [(2, 9), (9, 2)])
def test_jacobian_timings_widget_callback(n_in, n_out):
    times = linear.jacobian_timings(n_in, n_out, repeats=2, number=2)
    assert set(times) == {"jacfwd", "jacrev", "linearize + materialize"}
    assert all(isinstance(t, float) and t > 0 for t in times.values())


def test_mlp_map_and_median_seconds_validate():
    f, x = linear.mlp_map(7, 3, hidden=4)
    assert x.shape == (7,) and f(x).shape == (3,)
    with pytest.raises(ValueError, match="n_in"):
        linear.mlp_map(0, 3)
    with pytest.raises(ValueError, match="repeats"):
        linear.median_seconds(f, x, repeats=0)
    assert linear.median_seconds(f, x, repeats=2, number=2) > 0


def test_compiled_temp_bytes_sees_checkpoint_saving_memory():
    def body(c, _):
        return jnp.sin(jnp.cos(c) * 1.3) + 0.1 * c, None

    def loss(x, remat):
        c, _ = jax.lax.scan(jax.checkpoint(body) if remat else body, x, None, length=50)
        return jnp.sum(c)

    x = jnp.ones(2048)
    plain = linear.compiled_temp_bytes(jax.grad(lambda x: loss(x, False)), x)
    remat = linear.compiled_temp_bytes(jax.grad(lambda x: loss(x, True)), x)
    if plain is None or remat is None:
        pytest.skip("this backend reports no memory analysis")
    assert remat < plain
    with pytest.raises(TypeError):
        linear.compiled_temp_bytes(None)


def test_grad_tracer_name():
    assert linear.grad_tracer_name() == "LinearizeTracer"
    assert linear.grad_tracer_name(True) == "LinearizeTracer"
    assert linear.grad_tracer_name(False) in ("LinearizeTracer", "JVPTracer")
    assert jax.config.values["jax_use_direct_linearize"] is True  # restored
    with pytest.raises(TypeError):
        linear.grad_tracer_name("no")


# -------------------------------------------------------------------------- exercises


def _transpose_solution(v):
    return {"x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, -1), "s": jnp.vdot(jnp.linspace(1.0, 2.0, 6), v)}


def test_check_transpose_right_and_wrong():
    assert linear.check_transpose(_transpose_solution, strict=True).passed
    wrong = lambda v: {"x": jnp.cumsum(v) - jnp.roll(v, 1), "s": jnp.sum(v)}  # noqa: E731
    fb = linear.check_transpose(wrong)
    assert not fb.passed and "differs" in str(fb)
    assert "stub" in str(linear.check_transpose(lambda v: (_ for _ in ()).throw(NotImplementedError)))
    with pytest.raises(ex.ExerciseFailed):
        linear.check_transpose(wrong, strict=True)


def _jacrev_solution(f, params):
    out, f_jvp = jax.linearize(f, params)
    f_t = jax.linear_transpose(f_jvp, params)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    rows = []
    for i in range(len(leaves)):
        ct = [jnp.ones_like(l) if j == i else jnp.zeros_like(l) for j, l in enumerate(leaves)]
        rows.append(f_t(treedef.unflatten(ct))[0])
    return treedef.unflatten(rows)


def test_check_rebuilt_jacrev_right_and_wrong():
    assert linear.check_rebuilt_jacrev(_jacrev_solution, strict=True).passed

    def only_first_output(f, params):  # wrong: pulls back all-ones, summing the outputs
        out, f_jvp = jax.linearize(f, params)
        g = jax.linear_transpose(f_jvp, params)(jax.tree_util.tree_map(jnp.ones_like, out))[0]
        return jax.tree_util.tree_map(lambda _: g, out)

    fb = linear.check_rebuilt_jacrev(only_first_output)
    assert not fb.passed and "differs" in str(fb)


def test_check_jacobian_strategy_validates_and_measures():
    fb = linear.check_jacobian_strategy("jacrev", n_in=64, n_out=2)
    assert "measured" in str(fb)
    assert not linear.check_jacobian_strategy("both").passed
    with pytest.raises(TypeError):
        linear.check_jacobian_strategy("jacrev", hidden=3)


def test_checkers_reject_non_functions():
    assert "must be a function" in str(linear.check_rebuilt_jacrev(3))
    assert "must be a function" in str(linear.check_transpose("no"))
    assert "stub" in str(linear.check_rebuilt_jacrev(lambda f, p: (_ for _ in ()).throw(NotImplementedError)))
