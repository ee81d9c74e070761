"""Checkers for the exercises of Chapter 3 (implicit differentiation).

* 3.1 :func:`check_fixed_point_grad`: ``x* = ½ cos(M x*) + θ`` in R^3 through
  ``lax.custom_root`` (the jaxpr is checked for ``custom_root``); value and
  ``jax.jacrev`` to :data:`FIXED_POINT_TOL`.
* 3.2 :func:`check_sqrtm`: the inverse square root ``A^{-1/2}`` through ``custom_root``
  (directly or via ``implicit.root_find``); value and ``jax.jvp`` to
  :data:`SQRTM_TOL`.
* 3.3 :func:`check_tolerance_fix`: a DEQ gradient right to
  :data:`TOLERANCE_FIX_RTOL` (any method); the chapter's ``suspicious_grad`` is off by
  a truncated tangent solve, not by its solver tolerance.

All comparisons run in float64 (inside ``jax.enable_x64``). Method checks read the
jaxpr through :func:`beyondgrad.compat.uses_custom_root`, which knows how each JAX
version records ``custom_root``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import compat
from beyondgrad.exercises import (
    Feedback,
    call_answer,
    call_within,
    early_verdict,
    failed,
    is_stub,
    require_callable,
    tree_mismatches,
    verdict,
)
from beyondgrad.implicit import fixed_point
from beyondgrad.implicit_problems import deq_layer, deq_params

__all__ = [
    "FIXED_POINT_M",
    "FIXED_POINT_TOL",
    "SQRTM_TOL",
    "TIME_LIMIT",
    "TOLERANCE_FIX_ATOL",
    "TOLERANCE_FIX_RTOL",
    "check_fixed_point_grad",
    "check_sqrtm",
    "check_tolerance_fix",
    "exercise3_params",
]

#: Exercise 3.1: value and Jacobian must agree to this (absolute + relative, float64).
#: A solve stopped at a residual norm of 1e-10 is off by 3.4e-11 in x* and 6.6e-12 in
#: the Jacobian, Newton at 1e-12 by 1e-16 (measured, JAX 0.8.2 and 0.12): about 10x.
FIXED_POINT_TOL = 3e-10
#: Exercise 3.2: X = A^{-1/2} and dX must agree to this (absolute + relative, float64).
#: Newton on X A X - I from the identity is off by 1.3e-14 (it converges
#: quadratically), Denman-Beavers by 1.4e-16 (measured, JAX 0.8.2 and 0.12): ~8x below.
SQRTM_TOL = 1e-13
#: Exercise 3.3: the gradient must agree to this (relative, float64), plus
#: :data:`TOLERANCE_FIX_ATOL`. A solve stopped at 1e-13 passes at 1e-15 (measured); one
#: stopped at 1e-10 is off by 1e-9..1e-8, so the fix is a tolerance near rounding.
TOLERANCE_FIX_RTOL = 1e-12
TOLERANCE_FIX_ATOL = 1e-14

#: Seconds a student's function may run before a checker gives up on it (3.1).
TIME_LIMIT = 6.0

_EX1 = "Exercise 3.1 (fixed-point gradient)"
_EX2 = "Exercise 3.2 (inverse matrix square root)"
_EX3 = "Exercise 3.3 (diagnose a wrong gradient)"


def _method_problem(fn: Callable, arg: jax.Array, exercise: str) -> str | None:
    """A message if ``fn``'s jaxpr at ``arg`` does not call ``lax.custom_root``."""
    jaxpr = call_answer(jax.make_jaxpr(fn), arg, what="tracing your function")
    if failed(jaxpr):
        return failed(jaxpr)
    if compat.uses_custom_root(jaxpr):
        return None
    names = sorted(set(compat.primitive_names(jaxpr)))
    loops = [n for n in names if n in ("scan", "while", "eigh")]
    seen = f"; its jaxpr has {', '.join(loops)} but no custom_root" if loops else ""
    return (
        f"your function does not call lax.custom_root{seen}. {exercise} asks for the "
        "implicit derivative: put your loop inside the `solve` argument of "
        "lax.custom_root (or implicit.root_find), so that JAX differentiates the "
        "equation, not the iterations"
    )


def _dtype_hint(text: str) -> str:
    """What to change when float32 meets float64 in the student's code (or ``""``)."""
    if "float32" in text and "float64" in text:
        return (
            "\n    The checker runs in float64 (inside jax.enable_x64) and part of your "
            "code is float32: build starting points and constants from the input "
            "(jnp.zeros_like(theta), jnp.eye(n, dtype=A.dtype)) rather than with a "
            "fixed float32 dtype"
        )
    return ""


def _run_limited(fn: Callable, arg: jax.Array, what: str) -> object:
    """``fn(arg)`` compiled first (untimed), then run with :data:`TIME_LIMIT` seconds.

    Tracing and compiling a loop that never stops do terminate; only running it does
    not. Timing the run alone keeps a slow compilation on a busy machine from being
    mistaken for a loop that never stops.
    """
    compiled = call_answer(lambda: jax.jit(fn).lower(arg).compile(), what=what)
    if failed(compiled):
        return compiled
    return call_within(TIME_LIMIT, compiled, arg, what=what)


def _kind_problem(value: object, name: str) -> str | None:
    """A message if ``value`` is not an array at all (a function, None, a container)."""
    if value is None:
        return f"your function returned None instead of {name}: is a `return` missing?"
    if callable(value):
        return (
            f"your function returned a function ({type(value).__name__}) instead of "
            f"{name}: return the computed array (call the function you built)"
        )
    if isinstance(value, (tuple, list, dict)):
        return (
            f"your function returned a {type(value).__name__} instead of {name}: "
            "return the array alone"
        )
    return None  # arrays, and Python scalars (tree_mismatches names those)


def _value_hint(got: object, want: object, tolerance_hint: str) -> str:
    """Say what kind of wrong a mismatched float64 answer is (one line, no guessing).

    Non-finite or far too large: a diverged solve. A float32 answer: the dtype. The
    answer a constant multiple of the reference: a missing or extra factor. A relative
    error above 1e-4: a wrong equation or derivative (no tolerance does that). Only an
    error below that, the scale a loose solver tolerance gives, gets ``tolerance_hint``.
    """
    a = np.asarray(got, dtype=np.float64)
    r = np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(r))) or 1.0
    if np.asarray(got).dtype == np.float32:
        return (
            "your result is float32 for a float64 input: compute in the input's dtype "
            "(jnp.zeros_like(x), jnp.eye(n, dtype=x.dtype)); float32 cannot reach the "
            "required tolerance"
        )
    if not np.all(np.isfinite(a)):
        return (
            "your result has nan or inf: the solve diverged or its arithmetic broke "
            "(a step away from the root, a division by zero)"
        )
    if float(np.max(np.abs(a))) > 1e3 * scale:
        return (
            f"your result reaches {float(np.max(np.abs(a))):.3g} where the answer is "
            f"of size {scale:.3g}: the iteration diverged (check that your step "
            "moves towards the root, e.g. x <- x + F(x) for x = f(x), not x - F(x))"
        )
    rel = float(np.max(np.abs(a - r))) / scale
    denom = float(np.vdot(r, r))
    factor = float(np.vdot(r, a)) / denom if denom > 0 else 1.0
    if abs(factor - 1.0) > 1e-6 and float(np.max(np.abs(a - factor * r))) <= (
        1e-6 * scale * abs(factor)
    ):
        return (
            f"your result is {factor:.6g} times the right one everywhere: a constant "
            "factor is missing or extra (a scaled equation, a dropped 1/2, a wrong sign)"
        )
    if rel > 1e-4:
        return (
            f"largest error {rel:.1e} relative to the answer's size: far more than a "
            "converged solve's tolerance causes; check that the solve converged (its "
            "iteration cap), the equation (F(x) = 0 exactly at the answer) and the "
            "tangent solve"
        )
    return f"largest error {rel:.1e} relative: {tolerance_hint}"


def _failed_with_hint(value: object) -> str:
    """The failure message of ``value`` with a dtype hint ("" if it did not fail)."""
    msg = failed(value) or ""
    return msg + _dtype_hint(msg)


#: Exercise 3.1: the fixed point is ``x* = ½ cos(M x*) + θ`` for ``θ`` in R^3, with this
#: ``M`` (spectral norm 1.5, so the map contracts by at most 0.75).
FIXED_POINT_M: np.ndarray = np.array(
    [[1.0, 0.5, 0.0], [0.0, 1.0, 0.5], [0.5, 0.0, 1.0]], np.float64
)


def _fp_map(x: jax.Array, theta: jax.Array) -> jax.Array:
    return 0.5 * jnp.cos(jnp.asarray(FIXED_POINT_M, x.dtype) @ x) + theta


def _exercise1_reference(theta: jax.Array) -> jax.Array:
    """x* = ½ cos(M x*) + θ to float64 precision (400 steps of a 0.75-contraction)."""

    def one(t: jax.Array) -> jax.Array:
        x, _ = fixed_point(_fp_map, jnp.zeros_like(t), t, tol=0.0, max_iter=400)
        return x

    return jax.vmap(one)(theta)


def _exercise1_jacobian(x: jax.Array) -> jax.Array:
    """dx*/dθ = (I + ½ diag(sin(M x*)) M)^{-1}, one per row of ``x``."""
    m = jnp.asarray(FIXED_POINT_M, x.dtype)

    def one(xs: jax.Array) -> jax.Array:
        a = jnp.eye(3, dtype=x.dtype) + 0.5 * jnp.sin(m @ xs)[:, None] * m
        return jnp.linalg.inv(a)

    return jax.vmap(one)(x)


def _tangent_hint(text: str) -> str:
    if any(
        k in text
        for k in ("primal and tangent shapes", "tangent shape", "tangent aval")
    ):
        return (
            "\n    For a vector x, tangent_solve(g, y) must solve the linear system "
            "g(t) = y for t, where g is a linear map on vectors like x: a scalar "
            "division such as y / g(1.0) only works for a scalar x (materialise g with "
            "jax.jacfwd(g)(y) and use jnp.linalg.solve)"
        )
    return ""


def check_fixed_point_grad(
    fn: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 3.1: ``fn(theta)`` returns ``x*`` with ``x* = ½ cos(M x*) + theta``.

    ``theta`` has shape ``(3,)`` and ``M`` is :data:`FIXED_POINT_M`. Checks, in float64,
    at four ``theta``: the value under ``vmap``; that ``jax.jacrev`` runs; that ``fn``
    calls ``lax.custom_root`` (its jaxpr); the Jacobian against the closed form
    ``(I + ½ diag(sin(M x*)) M)^{-1}``; and ``jit``. Values and Jacobians must agree to
    :data:`FIXED_POINT_TOL` (absolute + relative).

    Args:
        fn: The student's ``my_fixed_point(theta)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    tol = FIXED_POINT_TOL
    not_a_function = require_callable(fn, "my_fixed_point")
    if not_a_function:
        return verdict(_EX1, [not_a_function], strict=strict)
    with jax.enable_x64(True):
        thetas = jnp.array(
            [[-1.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.3, -0.2, 0.1], [2.0, 1.0, -1.0]],
            jnp.float64,
        )
        got = _run_limited(jax.vmap(fn), thetas, "your function (under vmap)")
        if is_stub(got):
            return verdict(_EX1, [], attempted=False, strict=strict)
        if failed(got):
            msg = _failed_with_hint(got)
            return verdict(_EX1, [msg + _tangent_hint(msg)], strict=strict)
        kind = _kind_problem(got, "the array x*")
        if kind:
            return verdict(_EX1, [kind], strict=strict)
        want = _exercise1_reference(thetas)
        problems = tree_mismatches(got, want, rtol=tol, atol=tol, name="x*")
        if problems:
            if np.shape(got) == np.shape(want):
                problems.append(
                    _value_hint(
                        got,
                        want,
                        f"at the scale of a loose solver tolerance (required {tol:g}): "
                        "stop your solve at a residual norm <= 1e-10",
                    )
                )
            return verdict(_EX1, problems, strict=strict)
        jac = _run_limited(
            jax.vmap(jax.jacrev(fn)), thetas, "jax.jacrev of your function"
        )
        if failed(jac):
            msg = _failed_with_hint(jac)
            return verdict(_EX1, [msg + _tangent_hint(msg)], strict=strict)
        # right numbers from an unrolled loop are not the exercise: read the jaxpr
        method = _method_problem(fn, thetas[2], _EX1)
        if method:
            return verdict(_EX1, [method], strict=strict)
        problems = tree_mismatches(
            jac, _exercise1_jacobian(want), rtol=tol, atol=tol, name="dx*/dθ"
        )
        jitted = call_answer(jax.jit(fn), thetas[2], what="your function under jit")
        if failed(jitted):
            problems.append(_failed_with_hint(jitted))
        success = (
            f"calls custom_root; x* and jax.jacrev match the closed form to {tol:g} "
            "(absolute plus relative) under vmap, and jit works"
        )
        return verdict(_EX1, problems, success=success, strict=strict)


def _sqrtm_reference(
    a: jax.Array,
) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """``A^{-1/2}`` of SPD ``a`` (positive eigenvalues) and its derivative ``dA -> dX``.

    With ``a = Q diag(λ) Q^T``, ``X = Q diag(λ^{-1/2}) Q^T`` and, by the Daleckii-Krein
    formula for ``f(λ) = λ^{-1/2}``, ``(Q^T dX Q)_ij = (Q^T dA Q)_ij D_ij`` with the
    divided difference ``D_ij = (f(λ_i) - f(λ_j)) / (λ_i - λ_j) =
    -1 / (s_i s_j (s_i + s_j))``, ``s = λ^{1/2}`` (``f'(λ_i)`` on the diagonal).
    """
    evals, q = jnp.linalg.eigh(a)
    s = jnp.sqrt(evals)
    x = (q / s) @ q.T
    divided = -1.0 / (s[:, None] * s[None, :] * (s[:, None] + s[None, :]))

    def deriv(da: jax.Array) -> jax.Array:
        return q @ ((q.T @ da @ q) * divided) @ q.T

    return x, deriv


def check_sqrtm(
    fn: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 3.2: ``fn(A)`` returns ``X = A^{-1/2}`` (SPD ``A``; ``X A X = I``, ``X``
    with positive eigenvalues).

    Checks, in float64 on a 3×3 SPD matrix: that ``fn`` returns one 3×3 matrix; that it
    calls ``lax.custom_root`` (directly or through ``implicit.root_find``: an
    eigendecomposition is not the exercise); then ``jax.jvp`` along a symmetric
    direction, the value and the tangent against an eigendecomposition and the
    Daleckii-Krein formula (:func:`_sqrtm_reference`), to :data:`SQRTM_TOL`. The negative
    root (``-X``) and the square root ``A^{1/2}`` get their own messages.

    Args:
        fn: The student's ``inv_sqrtm(A)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    tol = SQRTM_TOL
    not_a_function = require_callable(fn, "inv_sqrtm")
    if not_a_function:
        return verdict(_EX2, [not_a_function], strict=strict)
    with jax.enable_x64(True):
        m = jnp.array([[2.0, 0.3, 0.0], [0.1, 1.5, 0.2], [0.0, 0.4, 1.0]], jnp.float64)
        a = m @ m.T + 0.5 * jnp.eye(3, dtype=jnp.float64)
        da = jnp.array(
            [[1.0, 0.5, -0.2], [0.5, 0.0, 0.3], [-0.2, 0.3, -1.0]], jnp.float64
        )
        x_ref, deriv = _sqrtm_reference(a)
        value = call_answer(fn, a, what="your inv_sqrtm")
        if is_stub(value):
            return verdict(_EX2, [], attempted=False, strict=strict)
        if failed(value):
            return verdict(_EX2, [_failed_with_hint(value)], strict=strict)
        if isinstance(value, (tuple, list)):
            return verdict(
                _EX2,
                [
                    f"your inv_sqrtm returns a {type(value).__name__} of "
                    f"{len(value)} items; return the matrix X alone "
                    "(implicit.root_find returns (X, SolverInfo): take [0])"
                ],
                strict=strict,
            )
        if np.shape(value) != (3, 3):
            return verdict(
                _EX2,
                [
                    f"your inv_sqrtm returns shape {np.shape(value)} for a 3x3 A; "
                    "return X with the shape of A"
                ],
                strict=strict,
            )
        out = call_answer(
            lambda: jax.jvp(fn, (a,), (da,)), what="jax.jvp of your function"
        )
        if failed(out):
            return verdict(_EX2, [_failed_with_hint(out)], strict=strict)
        method = _method_problem(fn, a, _EX2)
        if method:
            return verdict(_EX2, [method], strict=strict)
        x, dx = out
        if np.shape(x) == (3, 3) and np.allclose(
            np.asarray(x), -np.asarray(x_ref), rtol=tol
        ):
            return verdict(
                _EX2,
                [
                    "you found -X, the negative root: A^(-1/2) has positive "
                    "eigenvalues; start Newton from a positive multiple of the identity"
                ],
                strict=strict,
            )
        root = (x_ref @ a) if np.shape(x) == (3, 3) else None
        if root is not None and np.allclose(np.asarray(x), np.asarray(root), rtol=1e-6):
            return verdict(
                _EX2,
                [
                    "you returned A^(1/2), the square root; the exercise asks for "
                    "X = A^(-1/2), the X with X A X = I: change the equation, not the "
                    "start"
                ],
                strict=strict,
            )
        problems = tree_mismatches(x, x_ref, rtol=tol, atol=tol, name="X")
        problems += tree_mismatches(dx, deriv(da), rtol=tol, atol=tol, name="dX")
        if problems:
            bad_x = bool(tree_mismatches(x, x_ref, rtol=tol, atol=tol, name="X"))
            got_, want_ = (x, x_ref) if bad_x else (dx, deriv(da))
            problems.append(
                _value_hint(
                    got_,
                    want_,
                    f"at the scale of a loose solver tolerance (required {tol:g}): "
                    "iterate until the residual is at rounding level, e.g. "
                    "root_find(..., tol=1e-12)",
                )
            )
        success = (
            f"calls custom_root; X = A^(-1/2) and its jvp match the eigendecomposition "
            f"to {tol:g} (absolute plus relative)"
        )
        return verdict(_EX2, problems, success=success, strict=strict)


def exercise3_params() -> dict[str, jax.Array]:
    """The DEQ parameters of Exercise 3.3 (float64, d=8; contraction factor 0.95).

    Returns:
        The dict ``{"W", "U", "b", "x"}`` of :func:`beyondgrad.implicit_problems.deq_params`.
    """
    with jax.enable_x64(True):
        return deq_params(
            jax.random.key(3), d=8, d_in=3, radius=0.95, dtype=jnp.float64
        )


def check_tolerance_fix(
    fn: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> Feedback:
    """Exercise 3.3: ``fn(b)`` returns ``∂(Σ z*)/∂b`` for the DEQ of :func:`exercise3_params`.

    Compared with the closed form ``D (I - W^T D)^{-1} 1`` (``D = diag(1 - z*²)``) at
    two values of ``b``, to :data:`TOLERANCE_FIX_RTOL` relative (float64). Any method
    is accepted.

    Args:
        fn: The student's ``fixed_grad(b)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    rtol = TOLERANCE_FIX_RTOL
    with jax.enable_x64(True):
        params = exercise3_params()

        @jax.jit
        def reference(b: jax.Array) -> jax.Array:
            p = {**params, "b": b}
            z, _ = fixed_point(
                deq_layer, jnp.zeros_like(b), p, tol=1e-14, max_iter=10_000
            )
            dz = 1.0 - z**2
            a = jnp.eye(b.shape[0], dtype=b.dtype) - dz[:, None] * p["W"]
            return dz * jnp.linalg.solve(a.T, jnp.ones_like(b))

        not_a_function = require_callable(fn, "fixed_grad")
        if not_a_function:
            return verdict(_EX3, [not_a_function], strict=strict)
        problems: list[str] = []
        for scale in (1.0, -2.0):
            b = scale * params["b"]
            got = call_answer(fn, b, what="your gradient function")
            early = early_verdict(_EX3, got, strict=strict)
            if early is not None:
                return early
            kind = _kind_problem(got, "the gradient array")
            if kind:
                return verdict(_EX3, [kind], strict=strict)
            want = reference(b)
            problems = tree_mismatches(
                got,
                want,
                rtol=rtol,
                atol=TOLERANCE_FIX_ATOL,
                name=f"gradient at b = {scale:g} × b0",
                allow_python_scalars=False,
            )
            if problems:
                break
        if problems and np.shape(got) == np.shape(want):
            problems.append(
                _value_hint(
                    got,
                    want,
                    f"required {rtol:g}; compare it with the residual in your "
                    "solve's SolverInfo; an error far above that residual does not "
                    "come from the solve",
                )
            )
        success = (
            f"the gradient matches the exact one to {rtol:g} relative plus "
            f"{TOLERANCE_FIX_ATOL:g}"
        )
        return verdict(_EX3, problems, success=success, strict=strict)
