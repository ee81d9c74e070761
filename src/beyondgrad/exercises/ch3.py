"""Checkers for the exercises of Chapter 3 (implicit differentiation).

* 3.1 :func:`check_fixed_point_grad`: ``x* = ½ cos(M x*) + θ`` in R^3 through
  ``lax.custom_root`` (the jaxpr is checked for ``custom_root``, on the path from
  ``θ`` to ``x*``); value and
  ``jax.jacrev`` to :data:`FIXED_POINT_TOL`.
* 3.2 :func:`check_sqrtm`: the inverse square root ``A^{-1/2}`` through ``custom_root``
  (directly or via ``implicit.root_find``); value and ``jax.jvp`` to
  :data:`SQRTM_TOL`.
* 3.3 :func:`check_tolerance_fix`: a DEQ gradient right to
  :data:`TOLERANCE_FIX_RTOL` (any method); the chapter's ``suspicious_grad`` is off by
  a truncated tangent solve, not by its solver tolerance.

Every check draws its cases afresh through
:func:`~beyondgrad.exercises.case_rng` (``seed=`` repeats a draw; none is printed),
and a wrong value gets first a line saying what kind of wrong it is
(:func:`_value_hint`), then the worst entry. All comparisons run in float64 (inside
``jax.enable_x64``). Method checks read the
jaxpr through :func:`beyondgrad.compat.uses_custom_root`, which knows how each JAX
version records ``custom_root``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import compat
from beyondgrad.exercises import (
    CHECK_LIMIT,
    ExerciseFailed,
    Feedback,
    call_answer,
    call_within,
    case_rng,
    early_verdict,
    failed,
    is_stub,
    require_callable,
    timed_check,
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
# Exercise 3.2: X = A^{-1/2} and dX must agree to this (absolute + relative, float64),
# set far from both legitimate and wrong answers so that the verdict on an answer does
# not depend on the drawn matrices (the old 1e-12 passed a solve stopped at 1e-10, the
# number 3.1 uses, on 9 seeds of 12). A solve stopped at a residual R = X A X - I of
# norm r (Newton from I stays among matrices commuting with A, so R = 2 E A^{1/2} for
# an error E) is off by |E| <= r |A^{-1/2}| / 2 <= 0.71 r (eigenvalues of A in
# [0.5, 3]); the tangent, from the Sylvester equation dX A X + X A dX = -X dA X whose
# inverse has norm <= 1 / (2 sqrt(0.5)), moves by at most about 8 |dA| |E|. With the
# statement's r <= 1e-10: <= 7.1e-11 in X, a few 1e-10 in dX for drawn |dA| (a
# symmetric Gaussian, 4x4 at most). Measured worst, 300 draws (600 matrices), in
# this measure: root_find at tol 1e-10 1.9e-11 (X), 1.0e-11 (dX); at 1e-9 1.7e-10;
# at 1e-12 2.1e-13 (JAX 0.12.0.1; 0.8.2 alike): 500x inside. Wrong answers (the
# negative root, A^{1/2}, A^{-1}, a wrong tangent, a solve stopped at 1e-4) are off
# by 1e-5 or more: 1000x outside. Only a solver tolerance of about 1e-8 to 1e-6,
# which the statement rules out, lands on either side depending on the draw.
#: The tolerance of the check (derived in the comment above).
SQRTM_TOL = 1e-8
#: Exercise 3.3: every entry of the gradient must agree to this times its largest
#: entry (float64), plus :data:`TOLERANCE_FIX_ATOL`. Over 200 drawn b (JAX 0.8.2 and
#: 0.12) a fixed-point solve stopped at 1e-13 is off by up to 2.2e-13 in this measure,
#: the closed form at a Newton root stopped at 1e-13 by 4.1e-13: ~7x below. A solve
#: stopped at 1e-10 is off by 1e-9..1e-8. The starter's 20-term series is off by 3e-5
#: at b0 and, over drawn b (two samples of 300, both ends), by about 1e-12 to 3e-2
#: (median about 5e-5, 90 % between 2e-8 and 3e-3): below this bound on about one
#: draw in 300 (tanh saturated), so it passes a two-draw check about once in 1e5.
TOLERANCE_FIX_RTOL = 3e-12
#: Exercise 3.3: the absolute part of the tolerance (:data:`TOLERANCE_FIX_RTOL`).
TOLERANCE_FIX_ATOL = 1e-14

#: Seconds a student's function may run before a checker gives up on it (3.1).
TIME_LIMIT = 6.0

_EX1 = "Exercise 3.1 (fixed-point gradient)"
_EX2 = "Exercise 3.2 (inverse matrix square root)"
_EX3 = "Exercise 3.3 (diagnose a wrong gradient)"


def _method_problem(
    fn: Callable, arg: jax.Array, exercise: str, *, follow: bool = False
) -> str | None:
    """A message if ``fn``'s jaxpr at ``arg`` does not call ``lax.custom_root``.

    With ``follow``, also if the output depends on ``arg`` along a path that does not
    go through the ``custom_root`` call (:func:`beyondgrad.compat.bypasses_custom_root`).
    """
    jaxpr = call_answer(jax.make_jaxpr(fn), arg, what="tracing your function")
    if failed(jaxpr):
        return failed(jaxpr)
    if compat.uses_custom_root(jaxpr):
        if follow and compat.bypasses_custom_root(jaxpr):
            return (
                "your function calls lax.custom_root, but its result also depends on "
                "θ along a path around it (a loop or formula whose result is returned "
                f"beside the root). {exercise} asks for the implicit derivative: "
                "return the solution custom_root gives, so that every dependence on θ "
                "goes through the equation"
            )
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


def _value_hint(
    got: object,
    want: object,
    tolerance_hint: str,
    *,
    large: str = (
        "check that your solve converged (an iteration cap it hits) and the equation "
        "(F(x) = 0 exactly at the answer)"
    ),
    zero: str = "",
    tolerance_scale: float = 1e-4,
    stopped_early: str = "",
) -> str:
    """Say what kind of wrong a mismatched float64 answer is (one line, no guessing).

    Non-finite or far too large: a diverged solve. A float32 answer: the dtype. Zero
    (every entry at most 1e-9 of the answer's largest) where the answer is not:
    ``zero`` (or, when not given, a line saying it is zero).
    The answer a nonzero multiple of the reference: a missing or extra factor (a sign
    for -1). A relative error above
    ``tolerance_scale``: ``large`` (a wrong equation or derivative: no tolerance the
    statement allows does that). Only an error below that, the scale a loose solver
    tolerance gives, gets ``tolerance_hint``. With ``stopped_early``, an error up to
    0.1 gets that text instead of ``large``: a solve stopped far too early and one of
    another equation are not told apart by the numbers, so it names both.
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
    # zero, or rounding-level (an unrolled solve started at b): not "0 times"
    if float(np.max(np.abs(a))) <= 1e-9 * scale and np.any(r):
        return zero or "your result is zero everywhere, and the answer is not"
    rel = float(np.max(np.abs(a - r))) / scale
    denom = float(np.vdot(r, r))
    factor = float(np.vdot(r, a)) / denom if denom > 0 else 1.0
    if abs(factor - 1.0) > 1e-3 and float(np.max(np.abs(a - factor * r))) <= (
        1e-6 * scale * abs(factor)
    ):
        if abs(factor + 1.0) <= 1e-6:
            return (
                "your result is -1 times the right one everywhere: a sign is wrong "
                "(the equation F, or what your tangent_solve returns: t with g(t) = y)"
            )
        return (
            f"your result is {factor:.6g} times the right one everywhere: a constant "
            "factor is missing or extra (a scaled equation, a dropped 1/2, a mean "
            "where a sum belongs)"
        )
    if stopped_early and tolerance_scale < rel <= 0.1:
        return f"largest error {rel:.1e} relative to the answer's size: {stopped_early}"
    if rel > tolerance_scale:
        return (
            f"largest error {rel:.1e} relative to the answer's size: far more than a "
            f"converged solve's tolerance causes; {large}"
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


def _hint_first(failure: str) -> list[str]:
    """The messages for a failed call in 3.1: the tangent-solve hint, when JAX's error
    shows a scalar tangent solve on a vector, first (the slip, in the exercise's
    words), then JAX's error."""
    hint = _tangent_hint(failure).strip()
    return [hint, failure] if hint else [failure]


#: Exercise 3.1: number of ``theta`` drawn per check, and the range of their entries.
FIXED_POINT_CASES = 4
FIXED_POINT_THETA = 1.5


@timed_check(_EX1, CHECK_LIMIT)
def check_fixed_point_grad(
    fn: Callable[[jax.Array], jax.Array],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> Feedback:
    """Exercise 3.1: ``fn(theta)`` returns ``x*`` with ``x* = ½ cos(M x*) + theta``.

    ``theta`` has shape ``(3,)`` and ``M`` is :data:`FIXED_POINT_M`. Checks, in float64,
    at :data:`FIXED_POINT_CASES` ``theta`` drawn afresh at every check (entries uniform
    in ±:data:`FIXED_POINT_THETA`): the value under ``vmap``; that ``jax.jacrev`` runs;
    that ``fn`` calls ``lax.custom_root`` (its jaxpr); the Jacobian against the closed
    form ``(I + ½ diag(sin(M x*)) M)^{-1}``; and ``jit``. Values and Jacobians must
    agree to :data:`FIXED_POINT_TOL` (absolute + relative). A wrong value or Jacobian
    gets first a line saying what kind of wrong it is, then the worst entry.

    Args:
        fn: The student's ``my_fixed_point(theta)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).
        seed: Draw the same ``theta`` again (tests, or a repeatable run); ``None``
            draws fresh ones.

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    tol = FIXED_POINT_TOL
    not_a_function = require_callable(fn, "my_fixed_point")
    if not_a_function:
        return verdict(_EX1, [not_a_function], strict=strict)
    rng = case_rng(seed)
    drawn = rng.uniform(-FIXED_POINT_THETA, FIXED_POINT_THETA, (FIXED_POINT_CASES, 3))
    with jax.enable_x64(True):
        thetas = jnp.asarray(drawn, jnp.float64)
        got = _run_limited(jax.vmap(fn), thetas, "your function (under vmap)")
        if "is not a valid JAX type" in (failed(got) or ""):
            # vmap refuses a function or a string as output: say which, from one call
            one = call_within(TIME_LIMIT, fn, thetas[0], what="your function")
            kind = _kind_problem(one, "the array x*")
            if kind:
                return verdict(_EX1, [kind], strict=strict)
        if is_stub(got):
            return verdict(_EX1, [], attempted=False, strict=strict)
        if failed(got):
            msg = _failed_with_hint(got)
            return verdict(_EX1, _hint_first(msg), strict=strict)
        kind = _kind_problem(got, "the array x*")
        if kind:
            return verdict(_EX1, [kind], strict=strict)
        want = _exercise1_reference(thetas)
        problems = tree_mismatches(got, want, rtol=tol, atol=tol, name="x*")
        if problems:
            if np.shape(got) == np.shape(want):
                hint = _value_hint(
                    got,
                    want,
                    f"at the scale of a loose solver tolerance (required {tol:g}): "
                    "stop your solve at a residual norm <= 1e-10",
                    large=(
                        "check the equation: x* = ½ cos(M x*) + θ, so F(x) = "
                        "½ cos(M x) + θ - x is zero exactly there"
                    ),
                    stopped_early=(
                        "either your solve stops far too early (a loose tolerance, or "
                        "an iteration cap it hits: stop at ||F(x)|| <= 1e-10, with a "
                        "cap of a few hundred steps) or it solves another equation "
                        "(F(x) = ½ cos(M x) + θ - x must be zero exactly at x*)"
                    ),
                )
                problems = [f"x*: {hint}", *problems]
            return verdict(_EX1, problems, strict=strict)
        jac = _run_limited(
            jax.vmap(jax.jacrev(fn)), thetas, "jax.jacrev of your function"
        )
        if failed(jac):
            msg = _failed_with_hint(jac)
            # a while_loop alone: JAX's error suggests a scan, which the exercise
            # refuses too; the missing custom_root is the slip, so it comes first
            method = _method_problem(fn, thetas[2], _EX1)
            first = [method] if method and "custom_root" in method else []
            return verdict(_EX1, [*first, *_hint_first(msg)], strict=strict)
        # right numbers from an unrolled loop are not the exercise: read the jaxpr
        method = _method_problem(fn, thetas[2], _EX1, follow=True)
        if method:
            return verdict(_EX1, [method], strict=strict)
        want_jac = _exercise1_jacobian(want)
        problems = tree_mismatches(jac, want_jac, rtol=tol, atol=tol, name="dx*/dθ")
        if problems and np.shape(jac) == np.shape(want_jac):
            hint = _value_hint(
                jac,
                want_jac,
                f"at the scale of a loose solver tolerance (required {tol:g}): "
                "stop your solve at a residual norm <= 1e-10",
                large=(
                    "x* is right, so the derivative rule is wrong: your tangent_solve "
                    "must return t with g(t) = y, for the g and y it receives"
                ),
                zero=(
                    "jax.jacrev of your function is zero: x* does not depend on θ in "
                    "your code's derivative (a stop_gradient, or θ used outside the F "
                    "you pass to custom_root)"
                ),
            )
            problems = [f"dx*/dθ: {hint}", *problems]
        jitted = call_answer(jax.jit(fn), thetas[2], what="your function under jit")
        if failed(jitted):
            problems.append(_failed_with_hint(jitted))
        success = (
            f"calls custom_root; x* and jax.jacrev match the closed form to {tol:g} "
            f"(absolute plus relative) under vmap at {FIXED_POINT_CASES} drawn θ, and "
            "jit works"
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


#: Exercise 3.2: matrix sizes a check draws from (two distinct ones per check), and
#: the range of the eigenvalues of each drawn ``A`` (its condition number is at most 6).
SQRTM_SIZES = (2, 3, 4)
SQRTM_EIGENVALUES = (0.5, 3.0)


def _sqrtm_case(rng: np.random.Generator, n: int) -> tuple[jax.Array, jax.Array]:
    """A drawn SPD ``A = Q diag(λ) Q^T`` (λ in :data:`SQRTM_EIGENVALUES`) and a
    symmetric direction ``dA``, float64."""
    q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    lam = rng.uniform(*SQRTM_EIGENVALUES, size=n)
    a = (q * lam) @ q.T
    d = rng.normal(size=(n, n))
    return jnp.asarray(0.5 * (a + a.T)), jnp.asarray(0.5 * (d + d.T))


@timed_check(_EX2, CHECK_LIMIT)
def check_sqrtm(
    fn: Callable[[jax.Array], jax.Array],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> Feedback:
    """Exercise 3.2: ``fn(A)`` returns ``X = A^{-1/2}`` (SPD ``A``; ``X A X = I``, ``X``
    with positive eigenvalues).

    Checks, in float64, on two SPD matrices drawn afresh at every check (two distinct
    sizes from :data:`SQRTM_SIZES`, eigenvalues in :data:`SQRTM_EIGENVALUES`): that
    ``fn`` returns one matrix of ``A``'s shape; that it calls ``lax.custom_root``
    (directly or through ``implicit.root_find``: an eigendecomposition is not the
    exercise); then ``jax.jvp`` along a drawn symmetric direction, the value and the
    tangent against an eigendecomposition and the Daleckii-Krein formula
    (:func:`_sqrtm_reference`), to :data:`SQRTM_TOL`. The negative root (``-X``) and
    the square root ``A^{1/2}`` get their own messages; any other wrong value a first
    line saying what kind of wrong it is.

    Args:
        fn: The student's ``inv_sqrtm(A)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).
        seed: Draw the same matrices again (tests, or a repeatable run); ``None``
            draws fresh ones.

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    tol = SQRTM_TOL
    not_a_function = require_callable(fn, "inv_sqrtm")
    if not_a_function:
        return verdict(_EX2, [not_a_function], strict=strict)
    rng = case_rng(seed)
    sizes = [int(n) for n in rng.choice(SQRTM_SIZES, size=2, replace=False)]
    with jax.enable_x64(True):
        for n in sizes:
            a, da = _sqrtm_case(rng, n)
            problems = _sqrtm_problems(fn, a, da, strict)
            if isinstance(problems, Feedback):
                return problems
            if problems:
                return verdict(_EX2, problems, strict=strict)
    success = (
        f"calls custom_root; X = A^(-1/2) and its jvp match the eigendecomposition "
        f"to {tol:g} (absolute plus relative) on drawn {sizes[0]}x{sizes[0]} and "
        f"{sizes[1]}x{sizes[1]} matrices"
    )
    return verdict(_EX2, [], success=success, strict=strict)


def _size_hint(failure: str, n: int) -> list[str]:
    """A first line when ``inv_sqrtm`` failed on shapes: a size written in (the
    identity built for a fixed n) where the checker draws the size ([] otherwise)."""
    if not any(
        k in failure
        for k in ("contracting dimensions", "incompatible shapes", "shapes must")
    ):
        return []
    return [
        f"your inv_sqrtm fails on shapes for a {n}x{n} A: is a size written in? The "
        f"checker draws sizes from {SQRTM_SIZES}: build the identity from A, "
        "jnp.eye(A.shape[0], dtype=A.dtype)"
    ]


def _sqrtm_problems(
    fn: Callable[[jax.Array], jax.Array], a: jax.Array, da: jax.Array, strict: bool
) -> list[str] | Feedback:
    """What is wrong with ``fn`` on one matrix (a Feedback for a stub or a failure)."""
    tol = SQRTM_TOL
    n = a.shape[0]
    x_ref, deriv = _sqrtm_reference(a)
    value = call_answer(fn, a, what="your inv_sqrtm")
    if is_stub(value):
        return verdict(_EX2, [], attempted=False, strict=strict)
    if failed(value):
        return [*_size_hint(failed(value) or "", n), _failed_with_hint(value)]
    if isinstance(value, (tuple, list)):
        return [
            f"your inv_sqrtm returns a {type(value).__name__} of "
            f"{len(value)} items; return the matrix X alone "
            "(implicit.root_find returns (X, SolverInfo): take [0])"
        ]
    kind = _kind_problem(value, "the matrix X")
    if kind:
        return [kind]
    if np.shape(value) != (n, n):
        return [
            f"your inv_sqrtm returns shape {np.shape(value)} for a {n}x{n} A; "
            "return X with the shape of A (the checker draws the size: build "
            "the identity as jnp.eye(A.shape[0], dtype=A.dtype))"
        ]
    if np.asarray(value).dtype == np.float32:  # rejected whatever the draw
        return [f"X: {_value_hint(value, x_ref, '')}"]
    out = call_answer(lambda: jax.jvp(fn, (a,), (da,)), what="jax.jvp of your function")
    if failed(out):
        return [_failed_with_hint(out)]
    method = _method_problem(fn, a, _EX2)
    if method:
        return [method]
    x, dx = out
    if np.shape(x) == (n, n) and np.allclose(
        np.asarray(x), -np.asarray(x_ref), rtol=tol
    ):
        return [
            "you found -X, the negative root: A^(-1/2) has positive "
            "eigenvalues; start Newton from a positive multiple of the identity"
        ]
    root = (x_ref @ a) if np.shape(x) == (n, n) else None
    if root is not None and np.allclose(np.asarray(x), np.asarray(root), rtol=1e-6):
        return [
            "you returned A^(1/2), the square root; the exercise asks for "
            "X = A^(-1/2), the X with X A X = I: change the equation, not the "
            "start"
        ]
    loose = (
        f"at the scale of a loose solver tolerance (required {tol:g}): iterate "
        "until the residual is 1e-10 or below, e.g. root_find(..., tol=1e-10)"
    )
    problems = tree_mismatches(x, x_ref, rtol=tol, atol=tol, name=f"X ({n}x{n})")
    if problems:
        if np.shape(x) == (n, n):
            inverse = np.linalg.inv(np.asarray(a))
            if np.allclose(np.asarray(x), inverse, rtol=1e-6):
                hint = (
                    "you returned A^(-1), the inverse: X = A^(-1/2) solves "
                    "X A X = I, not X A = I"
                )
            else:
                hint = _value_hint(
                    x,
                    x_ref,
                    loose,
                    large=("check the equation: its root must be A^(-1/2), X A X = I"),
                    stopped_early=(
                        "either your iteration stops far too early (a loose tol, or "
                        "an iteration cap it hits: Newton reaches rounding level with "
                        "tol=1e-12) or your equation's root is not A^(-1/2)"
                    ),
                )
            problems = [f"X: {hint}", *problems]
        return problems
    problems = tree_mismatches(dx, deriv(da), rtol=tol, atol=tol, name=f"dX ({n}x{n})")
    if problems and np.shape(dx) == (n, n):
        hint = _value_hint(
            dx,
            deriv(da),
            loose,
            large=(
                "X is right, so its derivative is wrong: let custom_root (or "
                "root_find) differentiate the equation, with A passed through it, "
                "and a tangent solve that solves g(t) = y"
            ),
            zero=(
                "jax.jvp of your function gives dX = 0: X does not depend on A in "
                "your code's derivative (a stop_gradient, or A used outside the "
                "equation you pass to custom_root)"
            ),
        )
        problems = [f"dX: {hint}", *problems]
    return problems


def exercise3_params() -> dict[str, jax.Array]:
    """The DEQ parameters of Exercise 3.3 (float64, d=8; contraction factor 0.95).

    Returns:
        The dict ``{"W", "U", "b", "x"}`` of :func:`beyondgrad.implicit_problems.deq_params`.
    """
    with jax.enable_x64(True):
        return deq_params(
            jax.random.key(3), d=8, d_in=3, radius=0.95, dtype=jnp.float64
        )


#: Exercise 3.3: ``b`` values drawn per check (``b0 + TOLERANCE_FIX_SPREAD * normal``).
TOLERANCE_FIX_CASES = 2
TOLERANCE_FIX_SPREAD = 0.5
#: The number of terms of the series in the chapter's ``suspicious_grad``.
SUSPICIOUS_TERMS = 20


@functools.partial(jax.jit, static_argnums=2)
def _deq_gradients(
    params: dict[str, jax.Array], b: jax.Array, terms: int
) -> tuple[jax.Array, jax.Array]:
    """The exact ``∂(Σ z*)/∂b = D (I - W^T D)^{-1} 1`` (``D = diag(1 - z*²)``), and
    the same with ``(I - W^T D)^{-1}`` replaced by the series ``Σ_{k<K} (W^T D)^k``
    for K = 1 … ``terms`` (rows), what a truncated tangent series gives."""
    p = {**params, "b": b}
    z, _ = fixed_point(deq_layer, jnp.zeros_like(b), p, tol=1e-14, max_iter=10_000)
    dz = 1.0 - z**2
    a = jnp.eye(b.shape[0], dtype=b.dtype) - dz[:, None] * p["W"]
    exact = dz * jnp.linalg.solve(a.T, jnp.ones_like(b))
    wtd = p["W"].T * dz[None, :]

    def add(carry: tuple[jax.Array, jax.Array], _: None) -> tuple[tuple, jax.Array]:
        term, total = carry
        return (wtd @ term, total + wtd @ term), total

    ones = jnp.ones_like(b)
    _, partial = jax.lax.scan(add, (ones, ones), None, length=terms)
    return exact, dz * partial


#: Exercise 3.3: how far (relative to the largest entry) a K-term series computed at
#: a converged solve (residual 1e-13) may sit from the exact K-term series and still
#: be recognised as it: measured 1.7e-14 to 5.9e-14 over 6 draws (JAX 0.12).
SERIES_MATCH = 1e-13


def _series_terms(got: object, want: np.ndarray, series: np.ndarray) -> int | None:
    """K if ``got`` is the K-term series gradient, else None.

    A K counts when that series' own truncation error (against the exact gradient
    ``want``) fails the check, i.e. exceeds :data:`TOLERANCE_FIX_RTOL`, and ``got``
    is within 1 % of that error, or within :data:`SERIES_MATCH`, of the series. The
    truncation error is compared with the check's bound, not with a fixed size: on
    a draw of ``b`` that saturates tanh, 20 terms are off by only 7e-11."""
    a = np.asarray(got, np.float64)
    if a.shape != series.shape[1:]:
        return None
    scale = float(np.max(np.abs(want))) or 1.0
    off = np.max(np.abs(series - want), axis=1) / scale
    err = np.max(np.abs(series - a), axis=1) / scale
    close = err <= np.maximum(1e-2 * off, SERIES_MATCH)
    err = np.where((off > TOLERANCE_FIX_RTOL) & (err < 0.1 * off) & close, err, np.inf)
    k = int(np.argmin(err))
    return k + 1 if np.isfinite(err[k]) else None


def _tolerance_fix_hint(
    got: object, want: jax.Array, series: np.ndarray, at_b0: jax.Array
) -> str:
    """What kind of wrong a 3.3 gradient is, and what to change."""
    a = np.asarray(got, np.float64)
    r = np.asarray(want, np.float64)
    rel = float(np.max(np.abs(a - r)) / np.max(np.abs(r)))
    if np.asarray(got).dtype != np.float32 and np.all(np.isfinite(a)):
        if np.allclose(a, np.asarray(at_b0), rtol=1e-9, atol=0) and not np.allclose(
            r, np.asarray(at_b0), rtol=1e-6, atol=0
        ):
            return (
                "your gradient is the one at exercise3_params()['b'], not at the b "
                "your function receives: put that b into the parameters, "
                "{**ex3, 'b': b}, and differentiate with respect to it"
            )
        terms = _series_terms(a, r, series)
        flipped = None if terms is not None else _series_terms(-a, r, series)
        if flipped is not None:  # a truncated series with its sign flipped
            return (
                f"your gradient is -1 times the series I + J + ... + J^{flipped - 1} "
                f"for (I - J)^-1 cut after {flipped} terms: a sign is wrong (the "
                "tangent solve must return t with g(t) = y, and for g = J - I that "
                "is t = -(y + J y + J^2 y + ...)); the series' remainder is a second "
                "error: solve the tangent system exactly (the default dense tangent "
                "solve)"
            )
        if terms == SUSPICIOUS_TERMS:
            return (
                f"largest error {rel:.1e} relative, as suspicious_grad's: its solve "
                "converged (its SolverInfo residual is below 1e-13, far below this "
                "error), so this error does not come from the solve and a tighter "
                "tolerance will not remove it; change another ingredient of the "
                "gradient, one at a time"
            )
        if terms == 1:
            return (
                f"largest error {rel:.1e} relative: your gradient is D·1 with "
                "D = diag(1 - z*²), the Jacobian-free (phantom) gradient: it drops the "
                "tangent solve with (I - J)ᵀ; solve that linear system exactly"
            )
        if terms is not None:
            return (
                f"largest error {rel:.1e} relative: your gradient equals the series "
                f"I + J + ... + J^{terms - 1} for (I - J)^-1 cut after {terms} terms, "
                "and this error is the series' remainder: sum terms until it is "
                "below the tolerance, or solve the tangent system exactly (the "
                "default dense tangent solve)"
            )
    return _value_hint(
        got,
        want,
        f"at the scale of a solver tolerance (required {TOLERANCE_FIX_RTOL:g}): "
        "a solve stopped at residual r leaves an error up to about 20 r here (the map "
        "contracts by 0.95): compare it with the residual in your solve's "
        "SolverInfo, and stop the solve at 1e-13",
        large=(
            "the solve is not the cause: check the equation (z = tanh(W z + U x + b)) "
            "and the derivative rule (the tangent solve must solve its system exactly)"
        ),
        zero=(
            "your gradient is zero: b does not reach the equation's derivative (passed "
            "as x0, whose derivative is zero by the contract, or left out of the "
            "params: {**ex3, 'b': b})"
        ),
        tolerance_scale=1e-2,
    )


def _starter_verdict(
    fn: Callable, got: object, want: jax.Array, series: Any, hint: str, strict: bool
) -> Feedback | None:
    """The verdict for the starter itself: ``suspicious_grad`` (by name) whose value is
    the starter's (the 20-term series), as the chapter's cell checks it before any
    edit. It is not the student's attempt: the line says "not attempted yet", gives
    what the checker finds wrong with the starter, and asks for ``fixed_grad``."""
    if getattr(fn, "__name__", "") != "suspicious_grad":
        return None
    a = np.asarray(got, np.float64)
    if _series_terms(a, np.asarray(want, np.float64), series) != SUSPICIOUS_TERMS:
        return None
    fb = Feedback(
        _EX3,
        False,
        (
            "not attempted yet: this is the starter suspicious_grad, wrong as the "
            "statement says; find out why, then write fixed_grad",
            hint,
        ),
        attempted=False,
    )
    if strict:
        raise ExerciseFailed(str(fb))
    return fb


@timed_check(_EX3, CHECK_LIMIT)
def check_tolerance_fix(
    fn: Callable[[jax.Array], jax.Array],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> Feedback:
    """Exercise 3.3: ``fn(b)`` returns ``∂(Σ z*)/∂b`` for the DEQ of :func:`exercise3_params`.

    Compared with the closed form ``D (I - W^T D)^{-1} 1`` (``D = diag(1 - z*²)``) at
    :data:`TOLERANCE_FIX_CASES` values of ``b`` drawn afresh at every check (``b0``,
    the parameters' own, plus :data:`TOLERANCE_FIX_SPREAD` times a normal draw), to
    :data:`TOLERANCE_FIX_RTOL` times the gradient's largest entry plus
    :data:`TOLERANCE_FIX_ATOL` (float64). Any
    method is accepted. A wrong gradient gets first a line saying what kind of wrong
    it is: the starter's error, a tangent series cut after K terms, the gradient at
    ``b0`` whatever ``b``, float32, a constant factor, an error at a solver
    tolerance's scale or far above it.

    Args:
        fn: The student's ``fixed_grad(b)``; a bare stub (``raise NotImplementedError``)
            is reported as not attempted.
        strict: Raise when the answer is wrong (for solution cells).
        seed: Draw the same ``b`` again (tests, or a repeatable run); ``None`` draws
            fresh ones.

    Returns:
        The :class:`~beyondgrad.exercises.Feedback` (printable), passed or not.

    Raises:
        ExerciseFailed: With ``strict=True``, when the answer is wrong.
    """
    rtol = TOLERANCE_FIX_RTOL
    not_a_function = require_callable(fn, "fixed_grad")
    if not_a_function:
        return verdict(_EX3, [not_a_function], strict=strict)
    rng = case_rng(seed)
    with jax.enable_x64(True):
        params = exercise3_params()
        b0 = params["b"]
        noise = rng.normal(size=(TOLERANCE_FIX_CASES, b0.shape[0]))
        problems: list[str] = []
        for k in range(TOLERANCE_FIX_CASES):
            b = b0 + TOLERANCE_FIX_SPREAD * jnp.asarray(noise[k])
            got = call_answer(fn, b, what="your gradient function")
            early = early_verdict(_EX3, got, strict=strict)
            if early is not None:
                return early
            kind = _kind_problem(got, "the gradient array")
            if kind:
                return verdict(_EX3, [kind], strict=strict)
            want, series = _deq_gradients(params, b, 2000)
            problems = tree_mismatches(
                got,
                want,
                rtol=0.0,  # relative to the largest entry: small ones round alike
                atol=TOLERANCE_FIX_ATOL + rtol * float(jnp.max(jnp.abs(want))),
                name=f"gradient at drawn b number {k + 1}",
                allow_python_scalars=False,
            )
            if problems:
                if np.shape(got) == np.shape(want):
                    at_b0, _ = _deq_gradients(params, b0, 1)
                    hint = _tolerance_fix_hint(got, want, np.asarray(series), at_b0)
                    problems = [hint, *problems]
                    starter = _starter_verdict(fn, got, want, series, hint, strict)
                    if starter is not None:
                        return starter
                break
        success = (
            f"the gradient matches the exact one to {rtol:g} times its largest entry "
            f"plus {TOLERANCE_FIX_ATOL:g} at {TOLERANCE_FIX_CASES} drawn b"
        )
        return verdict(_EX3, problems, success=success, strict=strict)
