"""Checkers of Chapter 3: right answers pass, near misses and bad input get their message.

The right answers here are written independently of the chapter's solution cells (a
different solver, or the helpers), and the references inside the checkers are closed
forms, so no checker is tested against its own answer key.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from beyondgrad import implicit
from beyondgrad import implicit_problems as problems
from beyondgrad.exercises import NOT_ATTEMPTED, ExerciseFailed, ch3


def _stub(*args):
    raise NotImplementedError


def _failing(*args):
    raise ValueError("boom in the student's code")


# ---------------------------------------------------------------------------- 3.1


M = ch3.FIXED_POINT_M


def _fp_root(theta, tol=1e-10, cos_scale=0.5, stop=False, sign=1.0, scalar=False):
    """custom_root for x = cos_scale cos(M x) + theta; knobs make near misses."""
    F = lambda x: cos_scale * jnp.cos(M @ x) + theta - x  # noqa: E731

    def solve(F, x0):
        keep_going = lambda s: (jnp.linalg.norm(F(s[0])) > tol) & (s[1] < 500)  # noqa: E731
        return lax.while_loop(
            keep_going, lambda s: (s[0] + F(s[0]), s[1] + 1), (x0, 0)
        )[0]

    def dense(g, y):
        return sign * jnp.linalg.solve(jax.jacfwd(g)(y), y)

    tangent = (lambda g, y: y / g(1.0)) if scalar else dense
    x = lax.custom_root(F, jnp.zeros_like(theta), solve, tangent)
    return lax.stop_gradient(x) if stop else x


def _fp_helper(theta):  # the helper, Newton instead of plain iteration
    F = lambda x, t: 0.5 * jnp.cos(M @ x) + t - x  # noqa: E731
    return implicit.root_find(F, jnp.zeros_like(theta), theta, tol=1e-12)[0]


def _fp_scan(theta):
    step = lambda x, _: (0.5 * jnp.cos(M @ x) + theta, None)  # noqa: E731
    return lax.scan(step, jnp.zeros_like(theta), length=200)[0]


def _fp_while_loop(theta):
    body = lambda c: (0.5 * jnp.cos(M @ c[0]) + theta, c[1] + 1)  # noqa: E731
    return lax.while_loop(lambda c: c[1] < 200, body, (jnp.zeros_like(theta), 0))[0]


def _fp_python_loop(theta):
    x = jnp.zeros_like(theta)
    for _ in range(150):
        x = 0.5 * jnp.cos(M @ x) + theta
    return x


def _fp_beside_a_dummy_root(theta, times_zero=True):
    """An unrolled loop returned, with a custom_root beside it (unused, or times 0)."""
    dummy = lax.custom_root(
        lambda x: x - 1.0,
        jnp.zeros_like(theta),
        lambda f, x0: x0 + 1.0,
        lambda g, y: y,
    )
    x = _fp_python_loop(theta)
    return x + 0.0 * dummy if times_zero else x


@pytest.mark.parametrize(
    "answer",
    [_fp_root, lambda t: _fp_root(t, tol=1e-13), _fp_helper],
    ids=["tol-1e-10", "tol-1e-13", "root_find"],
)
def test_fixed_point_right_answers(answer):
    fb = ch3.check_fixed_point_grad(answer, strict=True)
    assert fb.passed and "calls custom_root" in str(fb)


@pytest.mark.parametrize(
    "answer, quote",
    [
        (_fp_scan, "its jaxpr has scan but no custom_root"),
        (_fp_python_loop, "your function does not call lax.custom_root"),
        (_fp_beside_a_dummy_root, "depends on θ along a path around it"),
        (
            lambda t: _fp_beside_a_dummy_root(t, times_zero=False),
            "depends on θ along a path around it",
        ),
        (
            jax.jit(_fp_beside_a_dummy_root),
            "depends on θ along a path around it",
        ),
        (
            _fp_while_loop,
            "jax.jacrev of your function raised ValueError: Reverse-mode",
        ),
        (
            lambda t: _fp_root(t, scalar=True),
            "a scalar division such as y / g(1.0) only works for a scalar x",
        ),
        (lambda t: _fp_root(t, tol=3e-3), "x* differs from the reference at index"),
        (
            lambda t: _fp_root(t, cos_scale=0.49),
            "x* differs from the reference at index",
        ),
        (
            lambda t: _fp_root(t, stop=True),
            "dx*/dθ differs from the reference at index",
        ),
        (
            lambda t: _fp_root(t, sign=-1.0),
            "dx*/dθ differs from the reference at index",
        ),
    ],
    ids=[
        "scan",
        "python-loop",
        "unrolled-beside-root-times-zero",
        "unrolled-beside-unused-root",
        "unrolled-beside-root-under-jit",
        "while-loop",
        "scalar-tangent-solve",
        "loose-tol",
        "wrong-equation",
        "stop-gradient",
        "sign",
    ],
)
def test_fixed_point_near_misses(answer, quote):
    fb = ch3.check_fixed_point_grad(answer)
    assert not fb.passed and fb.attempted
    assert quote in str(fb), str(fb)
    with pytest.raises(ExerciseFailed):
        ch3.check_fixed_point_grad(answer, strict=True)


@pytest.mark.parametrize(
    "answer, quote",
    [
        (_fp_root(jnp.full(3, 0.3)), "you passed a value (ArrayImpl of shape (3,))"),
        (0.3, "you passed a value (float)"),
        (lambda t: _fp_root(t) * jnp.nan, "nan/inf does not match"),
        (
            lambda t: jnp.stack([_fp_root(t)] * 2),
            "has shape (4, 2, 3), expected (4, 3)",
        ),
        (lambda t: _fp_root(t).astype(jnp.int32), "expected a floating dtype"),
        (lambda t: float(_fp_root(t)[0]), "raised ConcretizationTypeError"),
        (_failing, "raised ValueError: boom in the student's code"),
    ],
    ids=[
        "value-not-function",
        "python-float",
        "nan",
        "shape",
        "dtype",
        "python-scalar",
        "exception",
    ],
)
def test_fixed_point_bad_input(answer, quote):
    fb = ch3.check_fixed_point_grad(answer)
    assert not fb.passed
    assert quote in str(fb), str(fb)


def test_fixed_point_stub_is_not_attempted():
    fb = ch3.check_fixed_point_grad(_stub)
    assert (
        not fb.attempted
        and str(fb) == f"… Exercise 3.1 (fixed-point gradient): {NOT_ATTEMPTED}"
    )
    with pytest.raises(ExerciseFailed):
        ch3.check_fixed_point_grad(_stub, strict=True)


# ---------------------------------------------------------------------------- 3.2


def _sqrtm(A, start=1.0, tol=1e-12):
    """A^(-1/2) by Newton on X A X - I (the helper)."""
    F = lambda X, A: X @ A @ X - jnp.eye(A.shape[0], dtype=A.dtype)  # noqa: E731
    return implicit.root_find(
        F, start * jnp.eye(A.shape[0], dtype=A.dtype), A, tol=tol
    )[0]


def _sqrtm_direct(A):  # custom_root by hand: Denman-Beavers, then X^-1; dense tangent
    F = lambda X: jnp.linalg.inv(X @ X) - A  # noqa: E731

    def solve(F, X0):
        def step(_, carry):
            Y, Z = carry
            return 0.5 * (Y + jnp.linalg.inv(Z)), 0.5 * (Z + jnp.linalg.inv(Y))

        eye = jnp.eye(A.shape[0], dtype=A.dtype)
        return lax.fori_loop(0, 30, step, (A, eye))[1]  # Z -> A^(-1/2)

    return lax.custom_root(
        F, jnp.eye(A.shape[0], dtype=A.dtype), solve, implicit.dense_tangent_solve
    )


def _square_root(A):  # the chapter's square-root pattern, renamed: the wrong root
    F = lambda X, A: X @ X - A  # noqa: E731
    return implicit.root_find(F, jnp.eye(A.shape[0], dtype=A.dtype), A, tol=1e-12)[0]


def _sqrtm_eigh(A):
    w, q = jnp.linalg.eigh(A)
    return (q / jnp.sqrt(w)) @ q.T


@pytest.mark.parametrize(
    "answer", [_sqrtm, _sqrtm_direct], ids=["root_find", "custom_root"]
)
def test_sqrtm_right_answers(answer):
    assert ch3.check_sqrtm(answer, strict=True).passed


@pytest.mark.parametrize(
    "answer, quote",
    [
        (_sqrtm_eigh, "its jaxpr has eigh but no custom_root"),
        (jax.scipy.linalg.sqrtm, "Differentiation rule for 'schur' not implemented"),
        (lambda A: _sqrtm(A, start=-1.0), "you found -X, the negative root"),
        (_square_root, "you returned A^(1/2), the square root"),
        (lambda A: _sqrtm(A, tol=1e-1), "differs from the reference at index"),
        (
            lambda A: _sqrtm(A) + 0.1 * (A - lax.stop_gradient(A)),
            "- dX (",
        ),
    ],
    ids=[
        "eigh",
        "scipy-sqrtm",
        "negative-root",
        "square-root",
        "loose-newton",
        "wrong-tangent",
    ],
)
def test_sqrtm_near_misses(answer, quote):
    fb = ch3.check_sqrtm(answer)
    assert not fb.passed and fb.attempted
    assert quote in str(fb), str(fb)


@pytest.mark.parametrize(
    "answer, quote",
    [
        (jnp.eye(3), "you passed a value (ArrayImpl of shape (3, 3))"),
        (lambda A: _sqrtm(A) * jnp.nan, "nan/inf does not match"),
        (lambda A: _sqrtm(A)[:1], "your inv_sqrtm returns shape (1, "),
        (
            lambda A: implicit.root_find(
                lambda X, A: X @ A @ X - jnp.eye(A.shape[0], dtype=A.dtype),
                jnp.eye(A.shape[0], dtype=A.dtype),
                A,
                tol=1e-12,
            ),
            "your inv_sqrtm returns a tuple of 2 items; return the matrix X alone "
            "(implicit.root_find returns (X, SolverInfo): take [0])",
        ),
        (
            lambda A: _sqrtm(A.astype(jnp.float32), tol=1e-5),  # float32 can reach
            "your result is float32 for a float64 input",
        ),
        (_failing, "raised ValueError: boom in the student's code"),
    ],
    ids=["value-not-function", "nan", "shape", "exception", "tuple", "float32"],
)
def test_sqrtm_bad_input(answer, quote):
    fb = ch3.check_sqrtm(answer)
    assert not fb.passed
    assert quote in str(fb), str(fb)


def test_sqrtm_stub_is_not_attempted():
    assert not ch3.check_sqrtm(_stub).attempted


# ---------------------------------------------------------------------------- 3.3


def _grad_at(tol):
    p = ch3.exercise3_params()

    def fn(b):
        def loss(b):
            z, _ = implicit.fixed_point(
                problems.deq_layer, jnp.zeros_like(b), {**p, "b": b}, tol=tol
            )
            return jnp.sum(z)

        return jax.grad(loss)(b)

    return fn


def _grad_closed_form(b):  # any method is accepted: the closed form itself, via Newton
    p = {**ch3.exercise3_params(), "b": b}
    F = lambda z, p: problems.deq_layer(z, p) - z
    z, _ = implicit.root_find(F, jnp.zeros_like(b), p, tol=1e-13)
    d = 1.0 - z**2
    return d * jnp.linalg.solve((jnp.eye(8) - d[:, None] * p["W"]).T, jnp.ones(8))


def _b_as_x0(b):  # the slip: b passed as x0, the parameters left as they are
    p = ch3.exercise3_params()
    loss = lambda b: jnp.sum(  # noqa: E731
        implicit.fixed_point(problems.deq_layer, b, p, tol=1e-13)[0]
    )
    return jax.grad(loss)(b)


def _b_as_x0_unrolled(b):  # the same slip, unrolled: a gradient of ~1e-14, not 0
    p = ch3.exercise3_params()
    loss = lambda b: jnp.sum(  # noqa: E731
        implicit.fixed_point(
            problems.deq_layer, b, p, tol=1e-13, adjoint="unrolled", max_iter=2000
        )[0]
    )
    return jax.grad(loss)(b)


def _b_left_out(b):  # the slip: the parameters' own b, the argument unused
    p = ch3.exercise3_params()
    loss = lambda b: (
        jnp.sum(  # noqa: E731
            implicit.fixed_point(problems.deq_layer, jnp.zeros_like(b), p, tol=1e-13)[0]
        )
        + 0.0 * jnp.sum(b)
    )
    return jax.grad(loss)(b)


@pytest.mark.parametrize(
    "answer", [_grad_at(1e-13), _grad_closed_form], ids=["tight-tol", "closed-form"]
)
def test_tolerance_fix_right_answers(answer):
    with jax.enable_x64(True):
        assert ch3.check_tolerance_fix(answer, strict=True).passed


@pytest.mark.parametrize(
    "tol, quote",
    [
        (1e-3, "gradient at drawn b number 1 differs"),
        (1e-6, "differs from the reference"),
    ],
    ids=["the-suspicious-tol", "not-tight-enough"],
)
def test_tolerance_fix_near_misses(tol, quote):
    with jax.enable_x64(True):
        fb = ch3.check_tolerance_fix(_grad_at(tol))
    assert not fb.passed and quote in str(fb), str(fb)


@pytest.mark.parametrize(
    "answer, quote",
    [
        (jnp.zeros(8), "you passed a value (ArrayImpl of shape (8,))"),
        (
            lambda b: float(_grad_closed_form(b)[0]),
            "is a Python float, expected an array",
        ),
        (lambda b: _grad_closed_form(b) * jnp.nan, "nan/inf does not match"),
        (lambda b: _grad_closed_form(b)[:4], "has shape (4,), expected (8,)"),
        (lambda b: jnp.ones(8, jnp.int32), "expected a floating dtype"),
        (_failing, "raised ValueError: boom in the student's code"),
    ],
    ids=["value-not-function", "python-scalar", "nan", "shape", "dtype", "exception"],
)
def test_tolerance_fix_bad_input(answer, quote):
    with jax.enable_x64(True):
        fb = ch3.check_tolerance_fix(answer)
    assert not fb.passed
    assert quote in str(fb), str(fb)


def _series_grad(tol, terms=20):
    """The chapter's suspicious_grad: a converged solve, a truncated tangent series."""
    p = ch3.exercise3_params()

    def series_solve(g, y):
        def add_term(_, carry):
            term, total = carry
            term = g(term) + term
            return term, total + term

        return -lax.fori_loop(0, terms - 1, add_term, (y, y))[1]

    def fn(b):
        def loss(b):
            z, _ = implicit.fixed_point(
                problems.deq_layer,
                jnp.zeros_like(b),
                {**p, "b": b},
                tol=tol,
                tangent_solver=series_solve,
            )
            return jnp.sum(z)

        return jax.grad(loss)(b)

    return fn


@pytest.mark.parametrize(
    "answer, quote, not_quote",
    [
        (_series_grad(1e-13), "does not come from the solve", "tighten"),
        (_series_grad(1e-15), "does not come from the solve", "tighten"),
        (
            lambda b: _grad_closed_form(b) / 8,
            "0.125 times the right one everywhere",
            "SolverInfo",
        ),
        (
            lambda b: _grad_closed_form(b).astype(jnp.float32),
            "your result is float32",
            "SolverInfo",
        ),
        (lambda b: _grad_closed_form(b) * 1e300, "diverged", "SolverInfo"),
        (lambda b: _grad_closed_form, "returned a function", "shape ()"),
        (lambda b: None, "returned None", "shape ()"),
        (lambda b: (_grad_closed_form(b), 0), "returned a tuple", "shape"),
        (
            lambda b: _grad_closed_form(b) + jnp.sin(b),
            "far more than a converged solve's tolerance",
            "SolverInfo",
        ),
    ],
    ids=[
        "suspicious",
        "suspicious-tighter",
        "factor-1/8",
        "float32",
        "diverged",
        "function",
        "none",
        "tuple",
        "wrong-formula",
    ],
)
def test_tolerance_fix_messages_say_what_is_wrong(answer, quote, not_quote):
    with jax.enable_x64(True):
        fb = ch3.check_tolerance_fix(answer)
    assert not fb.passed and quote in str(fb), str(fb)
    assert not_quote not in str(fb), str(fb)


def test_tolerance_fix_series_with_enough_terms_passes():
    # the diagnosis, confirmed: the same series with enough terms passes for every
    # drawn b. W's spectral radius is 0.95 and tanh' <= 1, so 800 terms leave a
    # truncation below 0.95**800 ~ 1e-18 (100 terms left 1.2e-8 on one draw in CI).
    with jax.enable_x64(True):
        assert ch3.check_tolerance_fix(_series_grad(1e-13, terms=800)).passed


def test_fixed_point_messages_say_what_is_wrong():
    half = ch3.check_fixed_point_grad(lambda t: 0.5 * _fp_root(t))
    assert "0.5 times the right one everywhere" in str(half), str(half)
    assert "tolerance" not in str(half)
    none = ch3.check_fixed_point_grad(lambda t: None)
    assert "returned None" in str(none) and "shape" not in str(none), str(none)


def test_fixed_point_stops_a_function_that_does_not_return(monkeypatch):
    import time

    monkeypatch.setattr(ch3, "TIME_LIMIT", 1.0)

    def host(t):
        time.sleep(4.0)  # when it runs, not when it is traced or compiled
        return t

    def slow(theta):  # stands in for a compiled while_loop that never stops
        out = jax.ShapeDtypeStruct(theta.shape, theta.dtype)
        t = jax.pure_callback(host, out, theta, vmap_method="expand_dims")
        return _fp_root(t)

    start = time.perf_counter()
    fb = ch3.check_fixed_point_grad(slow)
    assert time.perf_counter() - start < 3.5
    assert not fb.passed and "did not finish within 1 s" in str(fb), str(fb)
    assert "restart the kernel" in str(fb)


def test_tolerance_fix_stub_is_not_attempted():
    assert not ch3.check_tolerance_fix(_stub).attempted


def test_tolerance_fix_starter_itself_is_not_attempted_yet():
    """The chapter's cell checks the starter suspicious_grad before any edit: an
    untouched notebook shows "not attempted yet" (no ✗), with what is wrong with the
    starter; the same gradient under another name is an attempt, and gets ✗."""
    suspicious_grad = _series_grad(1e-13)
    suspicious_grad.__name__ = "suspicious_grad"
    with jax.enable_x64(True):
        fb = ch3.check_tolerance_fix(suspicious_grad, seed=0)
        text = str(fb)
        assert not fb.attempted and not fb.passed, text
        assert text.startswith(
            "… Exercise 3.3 (diagnose a wrong gradient): not attempted yet: this is "
            "the starter suspicious_grad"
        ), text
        assert "✗" not in text and "does not come from the solve" in text, text
        with pytest.raises(ExerciseFailed):
            ch3.check_tolerance_fix(suspicious_grad, seed=0, strict=True)
        copy = _series_grad(1e-13)  # named fn: the student's attempt
        attempt = ch3.check_tolerance_fix(copy, seed=0)
        assert attempt.attempted and str(attempt).startswith("✗"), str(attempt)
        # a suspicious_grad the student changed so that it is right is graded as usual
        fixed = _series_grad(1e-13, terms=800)
        fixed.__name__ = "suspicious_grad"
        assert ch3.check_tolerance_fix(fixed, seed=0).passed


# ------------------------------------------------------- tolerances, pinned (all three)


def _times(fn, factor):
    return lambda *args: fn(*args) * factor


# The perturbations below are literal numbers, not multiples of the checker's
# constant: a test that scaled with the constant would pass whatever its value (a
# 1000x looser tolerance survived tools/mutate.py that way).


def test_fixed_point_tolerance_is_pinned():
    # a solve stopped at |F(x)| <= 1e-10 is off by 3.4e-11; FIXED_POINT_TOL is 3e-10
    far = ch3.check_fixed_point_grad(_times(_fp_helper, 1 + 1e-9))
    assert not far.passed and "x* differs from the reference" in str(far), str(far)
    assert "(required 3e-10)" in str(far)
    assert ch3.check_fixed_point_grad(_times(_fp_root, 1 + 1e-10)).passed


def test_fixed_point_float32_answer_is_told_the_dtype():
    def fp32(theta):
        x0 = jnp.zeros(3, jnp.float32)
        F = lambda x: 0.5 * jnp.cos(M @ x) + theta - x  # noqa: E731
        solve = lambda F, x0: lax.fori_loop(0, 60, lambda i, x: x + F(x), x0)  # noqa: E731
        return lax.custom_root(F, x0, solve, implicit.dense_tangent_solve)

    fb = ch3.check_fixed_point_grad(fp32)
    assert not fb.passed
    assert "The checker runs in float64 (inside jax.enable_x64)" in str(fb), str(fb)


def test_sqrtm_tolerance_is_pinned():
    # SQRTM_TOL is 1e-8 (absolute plus relative, so an entry of size ~1 may be off by
    # ~2e-8): Newton stopped at 1e-10 is off by up to 1.9e-11 on drawn matrices;
    # 0.5x and 2x the allowed error are in test_exercises_tolerances.py
    far = ch3.check_sqrtm(_times(_sqrtm, 1 + 1e-6))
    assert not far.passed and "differs from the reference" in str(far), str(far)
    assert ch3.check_sqrtm(_times(_sqrtm_direct, 1 + 1e-9)).passed


def test_tolerance_fix_tolerance_is_pinned():
    # a solve stopped at 1e-13 is off by up to 4e-13 of the largest entry;
    # TOLERANCE_FIX_RTOL is 3e-12
    with jax.enable_x64(True):
        far = ch3.check_tolerance_fix(_times(_grad_closed_form, 1 + 2e-11))
        assert not far.passed and "differs from the reference" in str(far), str(far)
        assert "compare it with the residual in your solve's SolverInfo" in str(far)
        assert ch3.check_tolerance_fix(_times(_grad_closed_form, 1 + 5e-13)).passed


def test_sqrtm_reference_derivative_matches_finite_differences():
    """The checker's Daleckii-Krein tangent against central differences (float64)."""
    with jax.enable_x64(True):
        m = jnp.array([[2.0, 0.3, 0.0], [0.1, 1.5, 0.2], [0.0, 0.4, 1.0]])
        a = m @ m.T + 0.5 * jnp.eye(3)
        da = jnp.array([[1.0, 0.5, -0.2], [0.5, 0.0, 0.3], [-0.2, 0.3, -1.0]])
        x, deriv = ch3._sqrtm_reference(a)
        assert float(jnp.max(jnp.abs(x @ a @ x - jnp.eye(3)))) < 1e-14
        eps = 1e-6
        fd = (
            ch3._sqrtm_reference(a + eps * da)[0]
            - ch3._sqrtm_reference(a - eps * da)[0]
        ) / (2 * eps)
        # measured 2.3e-10 (the O(eps^2) truncation of central differences)
        assert float(jnp.max(jnp.abs(fd - deriv(da)))) < 2e-9


# ------------------------------------------------ the first message names the mistake


def first(fb) -> str:
    assert not fb.passed and fb.attempted, str(fb)
    return fb.messages[0]


@pytest.mark.parametrize(
    "answer, quote",
    [
        (
            lambda t: _fp_root(t, tol=3e-3),
            "x*: largest error",  # then: stops far too early, or another equation
        ),
        (lambda t: _fp_root(t, cos_scale=0.49), "or it solves another equation"),
        (
            lambda t: _fp_root(t, tol=1e-7),
            "at the scale of a loose solver tolerance (required 3e-10)",
        ),
        (lambda t: 0.5 * _fp_root(t), "0.5 times the right one everywhere"),
        (lambda t: _fp_root(t, stop=True), "jax.jacrev of your function is zero"),
        (
            lambda t: _fp_root(t, sign=-1.0),
            "dx*/dθ: your result is -1 times the right one everywhere: a sign",
        ),
        (lambda t: _fp_root(t) * 1e6, "the iteration diverged"),
        (lambda t: None, "your function returned None"),
        (lambda t: _fp_root, "your function returned a function"),
    ],
    ids=[
        "loose-tol",
        "wrong-equation",
        "tol-1e-7",
        "factor-1/2",
        "stop-gradient",
        "sign",
        "diverged",
        "none",
        "function",
    ],
)
def test_fixed_point_first_message_names_the_mistake(answer, quote):
    fb = ch3.check_fixed_point_grad(answer)
    assert quote in first(fb), str(fb)
    if "tolerance" not in quote:
        assert "tolerance (required" not in first(fb), str(fb)


@pytest.mark.parametrize(
    "answer, quote",
    [
        (lambda A: _sqrtm(A, tol=1e-1), "or your equation's root is not A^(-1/2)"),
        (
            lambda A: _sqrtm(A) + 0.1 * (A - lax.stop_gradient(A)),
            "X is right, so its derivative is wrong",
        ),
        (
            lambda A: lax.stop_gradient(_sqrtm(A)),
            "jax.jvp of your function gives dX = 0",
        ),
        (lambda A: 2.0 * _sqrtm(A), "2 times the right one everywhere"),
        (
            lambda A: implicit.root_find(
                lambda X, A: X @ A - jnp.eye(A.shape[0], dtype=A.dtype),
                jnp.eye(A.shape[0], dtype=A.dtype),
                A,
                tol=1e-12,
            )[0],
            "you returned A^(-1), the inverse",
        ),
        (lambda A: _sqrtm(A, start=-1.0), "you found -X, the negative root"),
        (lambda A: None, "your function returned None"),
    ],
    ids=[
        "loose-newton",
        "wrong-tangent",
        "no-derivative",
        "factor-2",
        "inverse",
        "negative",
        "none",
    ],
)
def test_sqrtm_first_message_names_the_mistake(answer, quote):
    assert quote in first(ch3.check_sqrtm(answer)), str(ch3.check_sqrtm(answer))


@pytest.mark.parametrize(
    "answer, quote",
    [
        (_series_grad(1e-13), "does not come from the solve"),
        (_series_grad(1e-15), "does not come from the solve"),
        (_series_grad(1e-13, terms=8), "cut after 8 terms"),
        (_series_grad(1e-13, terms=1), "the Jacobian-free (phantom) gradient"),
        (
            lambda b: -_series_grad(1e-13)(b),
            "your gradient is -1 times the series I + J + ... + J^19 for (I - J)^-1 "
            "cut after 20 terms: a sign is wrong",
        ),
        (_grad_at(1e-6), "at the scale of a solver tolerance (required 3e-12)"),
        (lambda b: _grad_closed_form(b) / 8, "0.125 times the right one everywhere"),
        (lambda b: -_grad_closed_form(b), "-1 times the right one everywhere"),
        (
            lambda b: _grad_closed_form(ch3.exercise3_params()["b"]),
            "your gradient is the one at exercise3_params()['b'], not at the b",
        ),
        (
            lambda b: _grad_closed_form(b).astype(jnp.float32),
            "your result is float32",
        ),
        (lambda b: _grad_closed_form(b) + jnp.sin(b), "the solve is not the cause"),
        (_b_as_x0, "your gradient is zero: b does not reach"),
        (_b_left_out, "your gradient is zero: b does not reach"),
        (_b_as_x0_unrolled, "your gradient is zero: b does not reach"),
    ],
    ids=[
        "starter",
        "starter-tighter",
        "8-terms",
        "jacobian-free",
        "starter-sign-flipped",
        "tol-1e-6",
        "mean",
        "sign",
        "b0-written-in",
        "float32",
        "wrong-formula",
        "b-as-x0",
        "b-left-out",
        "b-as-x0-unrolled",
    ],
)
def test_tolerance_fix_first_message_names_the_mistake(answer, quote):
    # Fixed draws keep the messages repeatable; the rare saturated draw has its own
    # test below.
    for seed in (0, 1, 2):
        with jax.enable_x64(True):
            fb = ch3.check_tolerance_fix(answer, seed=seed)
        assert quote in first(fb), (seed, str(fb))
        if "tolerance (required" not in quote:
            assert "SolverInfo, and stop" not in str(fb), (seed, str(fb))


def test_tolerance_fix_names_the_series_on_a_saturated_draw():
    # Seed 138 draws a b that saturates tanh: the starter's 20-term series is off by
    # only 7.3e-11 there, which once read as a tolerance error. The series is named
    # because its truncation fails the check's bound, whatever its size.
    with jax.enable_x64(True):
        fb = ch3.check_tolerance_fix(_series_grad(1e-13), seed=138)
    assert "does not come from the solve" in first(fb), str(fb)
    assert "7.3e-11" in first(fb) and "SolverInfo, and stop" not in str(fb), str(fb)


def test_chapter3_checkers_draw_their_cases_and_print_no_seed():
    """Hard-coded sizes and values fail: 3.2 draws two distinct sizes, so a size 3
    written in fails; an answer for one theta fails; no check prints a seed."""
    eye3 = lambda A: _sqrtm(A[:3, :3]) if A.shape[0] >= 3 else jnp.eye(3)  # noqa: E731
    for seed in range(6):
        assert not ch3.check_sqrtm(eye3, seed=seed).passed
    one_theta = lambda t: _fp_helper(jnp.full_like(t, 0.3))  # noqa: E731
    fb = ch3.check_fixed_point_grad(one_theta)
    assert not fb.passed and "seed" not in str(fb), str(fb)
    for check, answer in (
        (ch3.check_fixed_point_grad, _fp_helper),
        (ch3.check_sqrtm, _sqrtm),
    ):
        fb = check(answer)
        assert fb.passed and "seed" not in str(fb), str(fb)


@pytest.mark.parametrize("seed", range(4))
def test_chapter3_right_answers_pass_at_drawn_cases(seed):
    assert ch3.check_fixed_point_grad(_fp_root, seed=seed).passed
    assert ch3.check_sqrtm(_sqrtm, seed=seed).passed
    assert ch3.check_sqrtm(_sqrtm_direct, seed=seed).passed
    with jax.enable_x64(True):
        assert ch3.check_tolerance_fix(_grad_at(1e-13), seed=seed).passed


def _sqrtm_size_written_in(A):  # the identity built for 3x3 whatever A's size
    eye = jnp.eye(3, dtype=A.dtype)
    return implicit.root_find(lambda X, A: X @ A @ X - eye, eye, A, tol=1e-12)[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sqrtm_size_written_in_is_named_first(seed):
    """JAX's shape error comes second; first the slip: a size written in (#44)."""
    fb = ch3.check_sqrtm(_sqrtm_size_written_in, seed=seed)
    assert not fb.passed and fb.attempted, str(fb)
    assert fb.messages[0].startswith("your inv_sqrtm fails on shapes for a "), str(fb)
    assert "jnp.eye(A.shape[0], dtype=A.dtype)" in fb.messages[0], str(fb)
    assert "your inv_sqrtm raised TypeError" in fb.messages[1], str(fb)


def test_fixed_point_scalar_tangent_solve_is_named_first():
    """The chapter's scalar tangent solve copied: the hint first, JAX's shape error
    second (#44)."""
    fb = ch3.check_fixed_point_grad(lambda t: _fp_root(t, scalar=True), seed=0)
    assert not fb.passed and fb.attempted, str(fb)
    assert fb.messages[0].startswith(
        "For a vector x, tangent_solve(g, y) must solve the linear system"
    ), str(fb)
    assert (
        "a scalar division such as y / g(1.0) only works for a scalar x"
        in (fb.messages[0])
    )
    # JAX's error second: from jacrev on JAX 0.12, already under vmap on 0.8.2
    assert " raised ValueError: " in fb.messages[1], str(fb)


def test_fixed_point_while_loop_alone_names_custom_root_first():
    """A plain while_loop (no custom_root): JAX's reverse-mode error alone pointed to
    a scan or a static fori_loop, which the checker refuses as well; the missing
    custom_root comes first, JAX's error after it (#44, workshop simulation 9)."""
    fb = ch3.check_fixed_point_grad(_fp_while_loop, seed=0)
    assert fb.messages[0].startswith(
        "your function does not call lax.custom_root; its jaxpr has while but no "
        "custom_root"
    ), str(fb)
    assert fb.messages[1].startswith(
        "jax.jacrev of your function raised ValueError: Reverse-mode"
    ), str(fb)
