"""Chapter 5's exercise checkers (Laplacians of log|det|).

* :func:`check_fl_multiply` (5.1): the forward-Laplacian rule for an elementwise
  product, compared part by part with ``jax.hessian`` in float64.
* :func:`check_row_update_second_derivative` (5.2): the second derivative of
  ``log|det(A + t e_i u^T)|`` at ``t = 0``, compared with JAX's in float64.
* :func:`check_sharded_variance_step` (5.3): a ``shard_map`` body over the mesh axis
  ``"data"`` (8 devices) returning the variance over all walkers of the local energy
  and its parameter gradient, compared with one device, at sizes drawn at random for
  each check.

Every check draws its cases afresh (no seed printed; ``seed=`` repeats a draw for
5.1 and 5.2), and a wrong answer gets first a line naming the usual mistake it
matches, then the mismatch. Each returns a :class:`~beyondgrad.exercises.Feedback`;
a bare stub is reported as not
attempted, and ``strict=True`` raises :class:`~beyondgrad.exercises.ExerciseFailed`
for a wrong or missing answer. Checkers check values only; the statements say so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks
from beyondgrad import exercises as ex

__all__ = [
    "FL_DIM",
    "FL_POINTS",
    "FL_TOL",
    "MESH_AXIS",
    "ROW_MATRICES",
    "ROW_TOL",
    "SHARDED_DEVICES",
    "SOLUTION_ERROR_BOUND",
    "VAR_CASES",
    "VAR_ELECTRONS",
    "VAR_HIDDEN",
    "VAR_TOL",
    "VAR_WALKERS_PER_DEVICE",
    "check_fl_multiply",
    "check_row_update_second_derivative",
    "check_sharded_variance_step",
]

#: The mesh axis the sharded exercise runs over, and its size.
MESH_AXIS = "data"
#: The size of the mesh axis the sharded exercise runs over.
SHARDED_DEVICES = 8
#: Exercise 5.3: cases per check (each compiles the answer once); electron counts and
#: walkers per device are drawn from these for every check, distinct within one
#: check in both, so an answer with either size written in fails at least one case.
VAR_CASES = 2
#: Exercise 5.3: the electron counts a case draws from (see :data:`VAR_CASES`).
VAR_ELECTRONS = (4, 5, 6)
#: Exercise 5.3: the walkers per device a case draws from (see :data:`VAR_CASES`).
VAR_WALKERS_PER_DEVICE = (1, 2, 3)
#: Exercise 5.3: the hidden width of the drawn wavefunction.
VAR_HIDDEN = 12
#: Exercise 5.1: the largest number of variables a check draws, and the number of
#: cases it checks: each case draws its own d (2 to FL_DIM) and number of outputs m
#: (from :data:`FL_OUTPUTS`), distinct within one check, its functions and its point.
FL_DIM = 5
#: Exercise 5.1: the number of cases one check draws (see :data:`FL_DIM`).
FL_POINTS = 3
FL_OUTPUTS = (2, 3, 4, 5)
#: Exercise 5.2: number of (matrix, row, update) cases a check draws, with distinct
#: sizes from :data:`ROW_SIZES` (singular values of A in [0.5, 2]: cond(A) <= 4).
ROW_MATRICES = 3
ROW_SIZES = (2, 3, 4, 5, 6)

Triple = tuple[jax.Array, jax.Array, jax.Array]

# Accuracy required (the statements and the checkers print them), float64, each a
# multiple of the unit roundoff u = 2**-53 (1.1e-16) from a count of roundings.
#
# Exercise 5.1: ``|got - want| <= FL_TOL * S`` entrywise, S the sum of the magnitudes
# of the terms the exact entry is made of (:func:`_fl_scale`), not ``|want|``: the
# Laplacian ``lu v + u lv + 2 sum_k gu_k gv_k`` cancels (lv = e (s^2 |x|^2 - d s) and
# gv_k = -s x_k e + V_k cancel inside too), and then its rounding error follows the
# terms, not the result (the old ``3e-15 (1 + |want|)`` rejected the book's own
# solution 1 call in 40 for that reason). Count, per entry, for the two independent
# computations compared (the student's formula on the triples of u and v, and
# jax.hessian of u v): the argument z = x W + c (d + 1 <= 6 roundings) and exp's
# argument, tanh and exp (<= 4 ulp each), the derivatives' products (<= 10 per Hessian
# entry, forward over reverse), the trace over d <= 5 variables (5), and the formula
# (d + 4 <= 9): about 25 per computation, 2 x 25 + 9 < 64 in all, each of at most u
# times a term's magnitude. FL_TOL = 64 u = 7.1e-15. Measured worst error of the
# book's formula, 300 draws (900 cases): 1.84 u S (JAX 0.12.0.1), 1.16 u S (0.8.2):
# 35x inside. A float32 answer errs by ~2**-24 S = 5e8 u S, and a missing or halved
# cross term by |sum_k gu_k gv_k|, a fraction of S far above 64 u for drawn weights:
# both are rejected (tests/test_exercises_ch5.py).
#: The tolerance of the check (derived in the comment above).
FL_TOL = 64 * ex.F64_UNIT_ROUNDOFF
# Exercise 5.2: ``|got - want| <= ROW_TOL * S`` with S = n cond2(A) P^2, P =
# |u|_2 |A^{-1} e_i|_2 (:func:`_row_scale`), not ``|want|``: the answer -(u . c)^2,
# c = A^{-1} e_i, is small when u is nearly orthogonal to c, while JAX's reference,
# -tr(A^{-1} R A^{-1} R) with R = e_i u^T, sums n^2 products X_jk X_kj of X = c u^T
# that cancel down to it, each of magnitude up to P^2 (the old ``5e-15 (1 + |want|)``
# was 22x exceeded by the reference itself at seed 84, c = 0.0018, P = 2.0, checked
# against exact rational arithmetic). Count (n <= 6, growth factor rho <= 2 of LU
# with partial pivoting at these sizes): the reference's trace, n^2 terms, n^2 u P^2
# <= 6 u S; its two LU solves, backward error 3 n rho u each, forward cond(A) times
# that, in both factors of X X: 12 rho u S <= 24 u S; the student's solve and dot,
# 2|u . c| (3 rho n cond + n) u P <= 14 u S: 44 u S in all; ROW_TOL = 64 u
# = 7.1e-15. Measured worst error, 300 draws (900 cases), answers by solve, inv,
# NumPy and autodiff: 1.84 u S (JAX 0.12.0.1), 1.37 u S (0.8.2): 35x inside. The
# usual slips (sign, a factor, row for column) err by about |want| = (u . c)^2, above
# 64 u S unless |u . c| < 3e-7 P; float32 errs by ~2**-24 cond P^2.
#: The tolerance of the check (derived in the comment above).
ROW_TOL = 64 * ex.F64_UNIT_ROUNDOFF
#: Exercise 5.3: ``|got - want| <= VAR_TOL (1 + max|want|)``, the maximum over the
#: variance, or over all leaves of the gradient (its rounding error follows its largest
#: entries). Measured, not derived: the book's solution (autodiff of the Laplacian)
#: against the hand-derived reference errs by 2e-15 to 2.5e-14 of the largest entry in
#: 8 cases on 0.8.2, but by 1.1e-13 in one draw of the version matrix (JAX 0.8.2,
#: 5 electrons x 16 walkers, gradient['w2'], entries up to 349), so the error's tail is
#: heavy (it follows cond(A); Gaussian walkers gave up to 2.5e-12, hence the
#: best-conditioned walkers). VAR_TOL is 9x the worst seen; the nearest slip, N - 1
#: for N, errs by 1/N >= 1/48 relative, ten orders of magnitude above it.
VAR_TOL = 1e-12
#: The book's solutions to 5.1 and 5.2 agree with the references to better than this.
SOLUTION_ERROR_BOUND = 1e-14


#: XLA options for the checker's compiles: the programs run once, on a few walkers,
#: so optimising them costs more time than it saves (about 40% of the compile time).
_FAST_COMPILE = {"xla_backend_optimization_level": 0}


def _close(a: Any, b: Any, rtol: float) -> bool:
    try:
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    except (TypeError, ValueError):
        return False
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=1e-12))


# ---------------------------------------------------------------------------------------
# Exercise 5.1: the forward-Laplacian rule for a product


def _triple(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> Triple:
    """Exact (value, gradient (d, m), Laplacian (m,)) of ``fn`` at ``x``."""
    hessian = jax.hessian(fn)(x)  # (m, d, d)
    return fn(x), jax.jacfwd(fn)(x).T, jnp.trace(hessian, axis1=1, axis2=2)


def _fl_draw(rng: np.random.Generator, d: int, m: int) -> list[np.ndarray]:
    """One drawn case of exercise 5.1 (float64): weights ``(d, m)``, biases ``(m,)``,
    scales in [0.5, 1.5] ``(m,)``, second weights ``(d, m)`` and the point ``(d,)``."""
    return [
        rng.normal(size=(d, m)),
        rng.normal(size=m),
        rng.uniform(0.5, 1.5, size=m),
        rng.normal(size=(d, m)),
        rng.uniform(-1.0, 1.0, size=d),
    ]


@functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
def _fl_case(
    w: jax.Array, c: jax.Array, s: jax.Array, vw: jax.Array, x: jax.Array
) -> tuple[Triple, Triple, Triple]:
    """The exact triples of ``u``, ``v`` and ``u * v`` at ``x`` for drawn weights:
    ``u(x) = tanh(x W + c)`` and ``v(x) = exp(-s |x|² / 2) + x V``."""

    def u(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w + c)

    def v(x: jax.Array) -> jax.Array:
        return jnp.exp(-0.5 * s * jnp.sum(x * x)) + x @ vw

    def uv(x: jax.Array) -> jax.Array:
        return u(x) * v(x)

    return _triple(u, x), _triple(v, x), _triple(uv, x)


def _fl_scale(
    w: np.ndarray, c: np.ndarray, s: np.ndarray, vw: np.ndarray, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The magnitudes a rounding error of u v's triple is made on: for each entry of
    (value, gradient, Laplacian), the sum over its terms of |term|, with each factor
    of u = tanh(z), z = x W + c, and v = e + x V, e = exp(-s |x|^2 / 2), replaced by
    the sum of the magnitudes of its own terms, widened by the error of its argument
    (z's error, about u times Z = |x| |W| + |c|, moves tanh^(k) by at most 2 Z;
    e's relative error follows its argument, 1 + s |x|^2). See :data:`FL_TOL`."""
    t = np.tanh(x @ w + c)
    t1 = 1 - t * t  # tanh'
    t2 = 2 * np.abs(t) * t1  # |tanh''|
    big_z = np.abs(x) @ np.abs(w) + np.abs(c)
    e = np.exp(-0.5 * s * np.sum(x * x)) * (1 + s * np.sum(x * x))
    u = np.abs(t) + t1 * big_z
    gu = np.abs(w) * (t1 + t2 * big_z)  # (d, m)
    uu = w * w * (t2 + 2 * big_z)  # second derivatives, (d, m)
    v = e + np.abs(x) @ np.abs(vw)
    gv = s * np.abs(x)[:, None] * e + np.abs(vw)
    vv = e * (s * s * (x * x)[:, None] + s)
    return u * v, gu * v + u * gv, np.sum(uu * v + u * vv + 2 * gu * gv, axis=0)


def _fl_cases(
    seed: int | None,
) -> list[tuple[Triple, Triple, Triple, tuple[np.ndarray, ...]]]:
    """:data:`FL_POINTS` cases drawn from ``seed``: distinct d (2 to :data:`FL_DIM`)
    and distinct m (:data:`FL_OUTPUTS`), drawn weights and point (float64); each is
    ``(a, b, want, scale)``, scale from :func:`_fl_scale`."""
    rng = ex.case_rng(seed)
    dims = rng.choice(np.arange(2, FL_DIM + 1), size=FL_POINTS, replace=False)
    outs = rng.choice(FL_OUTPUTS, size=FL_POINTS, replace=False)
    cases: list[tuple[Triple, Triple, Triple, tuple[np.ndarray, ...]]] = []
    for d, m in zip(dims, outs):
        d, m = int(d), int(m)
        draw = _fl_draw(rng, d, m)
        a, b, want = _fl_case(*(jnp.asarray(t, jnp.float64) for t in draw))
        cases.append((a, b, want, _fl_scale(*draw)))
    return cases


def _fl_hint(got: Any, a: Triple, b: Triple, want: Triple) -> str | None:
    """What a wrong triple most likely is, and what to change (None if unknown)."""
    (u, gu, lu), (v, gv, lv) = a, b
    if any(getattr(g, "dtype", None) == np.float32 for g in got):
        return (
            "your triple is float32 for float64 inputs: compute in the inputs' dtype "
            "(no float32 constants, no .astype(jnp.float32)); float32 cannot reach "
            "the tolerance"
        )
    part_ok = [
        not ex.tree_mismatches(g, w, rtol=1e-9, atol=1e-9) for g, w in zip(got, want)
    ]
    if not part_ok[0]:
        if _close(got[0], u + v, 1e-6):
            return "your value is u + v: the triple is that of the product u * v"
        return "your value is wrong: the value of the product is u * v, entrywise"
    if not part_ok[1]:
        if _close(got[1], gu * v, 1e-6) or _close(got[1], u * gv, 1e-6):
            return "your gradient has one half of the product rule: it is gu*v + u*gv"
        if _close(got[1], gu * gv, 1e-6):
            return (
                "your gradient is gu * gv: the gradient of a product follows the "
                "product rule, gu*v + u*gv"
            )
        if np.shape(got[1]) == np.shape(gu)[::-1]:
            return (
                f"your gradient has shape {np.shape(got[1])}: it is (d, m) = "
                f"{np.shape(gu)}, as gu and gv are (one row per input variable)"
            )
        return "your gradient is wrong (the value is right): it is gu*v + u*gv"
    if part_ok[2]:
        return None
    no_cross = lu * v + u * lv
    cross = jnp.sum(gu * gv, axis=0)
    if _close(got[2], no_cross, 1e-6):
        return (
            "your Laplacian is u*lv + v*lu: it misses the cross term 2 (grad u . grad v), "
            "summed over the d inputs"
        )
    if _close(got[2], no_cross + cross, 1e-6):
        return "your Laplacian has the cross term grad u . grad v once; it needs 2x"
    if _close(got[2], no_cross - 2 * cross, 1e-6):
        return (
            "your Laplacian subtracts the cross term: it is + 2 (grad u . grad v), "
            "as (u v)'' = u'' v + 2 u' v' + u v''"
        )
    if _close(got[2], lu * lv, 1e-6) or _close(got[2], lu * lv + 2 * cross, 1e-6):
        return (
            "your Laplacian multiplies the two Laplacians: the Laplacian of a "
            "product follows the product rule twice, lu*v + u*lv + 2 (grad u . grad v)"
        )
    if gu.shape[0] == gu.shape[1] and _close(
        got[2], no_cross + 2 * jnp.sum(gu * gv, axis=1), 1e-6
    ):
        return (
            "your cross term sums over the outputs (axis 1): grad u . grad v sums "
            "over the d inputs, axis 0 of the (d, m) gradients"
        )
    if np.shape(got[2]) != np.shape(lu):
        return (
            f"your Laplacian has shape {np.shape(got[2])}, one entry per output is "
            f"{np.shape(lu)}: sum the cross term over the d inputs (axis 0 of the "
            "(d, m) gradients)"
        )
    return (
        "your Laplacian is wrong (the value and gradient are right): "
        "apply the product rule twice, and sum over the d inputs"
    )


def _start(
    name: str, fn: Any, what: str, probe: tuple[Any, ...], strict: bool
) -> ex.Feedback | None:
    """The verdict before any reference work: not a function, or ``fn(*probe)`` is the
    stub; None when there is an answer to grade."""
    msg = ex.require_callable(fn, what)
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    if ex.is_stub(ex.call_answer(fn, *probe)):
        return ex.verdict(name, [], attempted=False, strict=strict)
    return None


#: Exercise 5.3's budget in seconds, the whole check (its cases compile a sharded
#: Hessian-heavy step; a right answer takes well under this on a 2-core Colab).
VARIANCE_CHECK_LIMIT = 90.0


@ex.timed_check("Exercise 5.1 (forward Laplacian of a product)", ex.CHECK_LIMIT)
def check_fl_multiply(
    fn: Callable[..., Any], strict: bool = False, *, seed: int | None = None
) -> ex.Feedback:
    """Exercise 5.1: ``fn((u, gu, lu), (v, gv, lv))`` is the triple of ``u * v``.

    Checks the value, gradient ``(d, m)`` and Laplacian ``(m,)`` in :data:`FL_POINTS`
    cases drawn afresh at every check (distinct ``d`` and ``m``, drawn functions and
    points), each against ``jax.hessian`` of the product in float64:
    ``|error| <= FL_TOL * S``, S the sum of the magnitudes of the terms of the exact
    entry (see :data:`FL_TOL`). A wrong triple gets first a line naming
    the wrong part and, for the usual slips, the slip. ``seed`` repeats a draw (tests,
    or a student who asks).
    """
    name = "Exercise 5.1 (forward Laplacian of a product)"
    problems: list[str] = []
    with jax.enable_x64(True):
        zeros = (jnp.zeros(4), jnp.zeros((5, 4)), jnp.zeros(4))
        early = _start(name, fn, "my_fl_multiply", (zeros, zeros), strict)
        if early is not None:
            return early
        for k, (a, b, want, scale) in enumerate(_fl_cases(seed)):
            d, m = np.shape(a[1])
            got = ex.call_answer(fn, a, b, what="your function")
            failure = ex.failed(got) or ""
            if "incompatible shapes for broadcasting" in failure:
                hint = (
                    f"your function fails on shapes for d = {d} inputs and m = {m} "
                    f"outputs: u, v and the Laplacians have shape ({m},), the "
                    f"gradients ({d}, {m}) (one row per input variable); a sum "
                    "over the inputs is over axis 0 (grad u . grad v = "
                    "jnp.sum(gu * gv, axis=0))"
                )
                return ex.verdict(name, [hint, failure], strict=strict)
            early = ex.early_verdict(name, got, strict=strict)
            if early is not None:
                return early
            returned = ex.return_kind_problem(got, want, name="your result")
            if returned:
                problems.append(
                    f"{returned}; return the triple (value, gradient, Laplacian)"
                )
                break
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                kind = type(got).__name__
                size = (
                    f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
                )
                problems.append(
                    f"return a triple (value, gradient, Laplacian), got a {kind}{size}"
                )
                break
            for part, got_part, want_part, part_scale in zip(
                ("the value", "the gradient", "the Laplacian"), got, want, scale
            ):
                problems += ex.scaled_mismatches(
                    got_part,
                    want_part,
                    part_scale,
                    tol=FL_TOL,
                    name=f"case {k + 1} (d = {d}, m = {m}): {part}",
                    scale_name="the sum of the magnitudes of its terms",
                    allow_python_scalars=False,
                )
            if problems:
                kinds = [p for p in problems if "dtype" in p or "Python" in p]
                slip = None if kinds else _fl_hint(got, a, b, want)
                if slip:
                    problems = [slip, *problems]
                break
    return ex.verdict(
        name,
        problems,
        success=f"value, gradient and Laplacian of u*v match jax.hessian in "
        f"{FL_POINTS} drawn cases (float64, |error| <= {FL_TOL:.2g} x the sum of the "
        "magnitudes of the terms of each entry)",
        strict=strict,
    )


# ---------------------------------------------------------------------------------------
# Exercise 5.2: the row update


@functools.partial(jax.jit, static_argnums=1, compiler_options=_FAST_COMPILE)
def _row_reference(a: jax.Array, i: int, u: jax.Array) -> jax.Array:
    """JAX's second derivative of log|det(A + t e_i u^T)| at t = 0."""
    row = jnp.zeros_like(a).at[i].set(u)

    def along(t: jax.Array) -> jax.Array:
        return jnp.linalg.slogdet(a + t * row).logabsdet

    return jax.grad(jax.grad(along))(jnp.zeros((), a.dtype))


def _row_scale(a: Any, i: int, u: Any) -> float:
    """``n cond2(A) (|u|_2 |A^{-1} e_i|_2)^2``, the magnitude the rounding error of
    the row update's second derivative is made on (see :data:`ROW_TOL`)."""
    a = np.asarray(a, np.float64)
    column = np.linalg.solve(a, np.eye(a.shape[0])[:, i])
    size = np.linalg.norm(np.asarray(u, np.float64)) * np.linalg.norm(column)
    return float(a.shape[0] * np.linalg.cond(a) * size**2)


def _row_cases(
    seed: int | None,
) -> list[tuple[jax.Array, int, jax.Array, jax.Array]]:
    """:data:`ROW_MATRICES` cases ``(A, i, u, expected)`` drawn from ``seed``: distinct
    sizes from :data:`ROW_SIZES`, ``A = Q1 diag(σ) Q2^T`` with σ in [0.5, 2], a row
    ``i`` and ``u`` drawn too (float64)."""
    rng = ex.case_rng(seed)
    sizes = rng.choice(ROW_SIZES, size=ROW_MATRICES, replace=False)
    cases = []
    for n in (int(k) for k in sizes):
        q1, _ = np.linalg.qr(rng.normal(size=(n, n)))
        q2, _ = np.linalg.qr(rng.normal(size=(n, n)))
        a = jnp.asarray((q1 * rng.uniform(0.5, 2.0, size=n)) @ q2.T, jnp.float64)
        i = int(rng.integers(n))
        u = jnp.asarray(rng.normal(size=n), jnp.float64)
        cases.append((a, i, u, _row_reference(a, i, u)))
    return cases


def _row_hint(got: Any, a: jax.Array, i: int, u: jax.Array, want: Any) -> str | None:
    """What a wrong row-update answer most likely is, and what to change."""
    if getattr(got, "dtype", None) == np.float32:
        return (
            "your answer is float32 for float64 inputs: compute in the inputs' dtype "
            "(no float32 constants, no .astype(jnp.float32))"
        )
    if np.shape(got) != ():
        return None  # the shape message says what is wrong
    try:
        value = float(np.asarray(got, np.float64))
    except (TypeError, ValueError):
        return None
    if not np.isfinite(value):
        return None  # the nan/inf message says it
    b = np.linalg.inv(np.asarray(a))
    un = np.asarray(u)
    column, row = un @ b[:, i], un @ b[i]
    near = lambda x, y: abs(x - y) <= 1e-6 * (1 + abs(y))  # noqa: E731
    w = float(want)
    if near(value, -w):
        return (
            "the sign is flipped: along a rank-one update of one row, "
            "log|det| is concave, so the answer is -(u . A^{-1} e_i)^2 <= 0"
        )
    if near(value, -(row**2)) or near(value, row**2):
        return "you used row i of A^{-1}; the formula needs column i, A^{-1} e_i"
    if near(value, column) or near(value, -column):
        return (
            "you returned the first derivative, u . A^{-1} e_i (or its negative); "
            "the second derivative is -(u . A^{-1} e_i)^2"
        )
    others = [j for j in range(a.shape[0]) if j != i]
    for j in others:
        if near(value, -((un @ b[:, j]) ** 2)):
            return (
                f"your answer is the one for row {j}, the checker asked for row {i}: "
                "use the i passed in (e_i is column i of the identity)"
            )
    ratio = value / w if w else 1.0
    if (
        abs(ratio - round(ratio * 4) / 4) <= 1e-6
        and ratio > 0
        and abs(ratio - 1) > 1e-3
    ):
        return (
            f"your answer is {value / w:g} times the right one: a constant factor is "
            "missing or extra (the second derivative has no 1/2 and no 2)"
        )
    return None


@ex.timed_check("Exercise 5.2 (row update)", ex.CHECK_LIMIT)
def check_row_update_second_derivative(
    fn: Callable[..., Any], strict: bool = False, *, seed: int | None = None
) -> ex.Feedback:
    """Exercise 5.2: ``fn(a, i, u)`` = d²/dt² log|det(A + t e_i uᵀ)| at t = 0.

    Compares the value with JAX's second derivative of ``slogdet`` in
    :data:`ROW_MATRICES` cases drawn afresh at every check (distinct sizes, a drawn
    row and update), in float64: ``|error| <= ROW_TOL * n cond(A) (|u| |A^{-1} e_i|)^2``
    (see :data:`ROW_TOL`). Any method is accepted, and a Python float too. A wrong value gets first a line naming the slip where it is a usual one
    (sign, row for column, first derivative, another row, a factor, float32). ``seed``
    repeats a draw (tests, or a student who asks).
    """
    name = "Exercise 5.2 (row update)"
    problems: list[str] = []
    with jax.enable_x64(True):
        probe = (jnp.eye(3), 0, jnp.ones(3))
        early = _start(name, fn, "my_row_second_derivative", probe, strict)
        if early is not None:
            return early
        for a, i, u, want in _row_cases(seed):
            n = a.shape[0]
            got = ex.call_answer(fn, a, i, u, what="your function")
            early = ex.early_verdict(name, got, strict=strict)
            if early is not None:
                return early
            problems += ex.scaled_mismatches(
                got,
                want,
                _row_scale(a, i, u),
                tol=ROW_TOL,
                name=f"for n = {n}, row {i}: answer",
                scale_name="n cond(A) (|u| |A^-1 e_i|)^2",
            )
            if problems:
                hint = _row_hint(got, a, i, u, want)
                problems = [hint, *problems] if hint else problems
                break
    return ex.verdict(
        name,
        problems,
        success="matches JAX's second derivative of slogdet along the row update "
        f"({ROW_MATRICES} drawn matrices, float64, |error| <= {ROW_TOL:.2g} "
        "n cond(A) (|u| |A^-1 e_i|)^2)",
        strict=strict,
    )


# ---------------------------------------------------------------------------------------
# Exercise 5.3: a sharded variance step


def _variance_sizes(seed: int) -> list[tuple[int, int]]:
    """``[(electrons, walkers per device), ...]``, one per case, drawn from ``seed``:
    distinct electron counts from :data:`VAR_ELECTRONS` and distinct walkers per device
    from :data:`VAR_WALKERS_PER_DEVICE`, so that an answer with either size written in
    fails at least one case."""
    rng = np.random.default_rng(seed)
    electrons = rng.choice(VAR_ELECTRONS, size=VAR_CASES, replace=False)
    walkers = rng.choice(VAR_WALKERS_PER_DEVICE, size=VAR_CASES, replace=False)
    return [(int(e), int(w)) for e, w in zip(electrons, walkers)]


@functools.lru_cache(maxsize=16)
def _variance_cases(
    sizes: tuple[tuple[int, int], ...], seed: int
) -> list[dict[str, Any]]:
    """Each case's problem (parameters and walkers, float64), its one-device
    reference (the variance of E_L over all walkers and its gradient) and the numbers
    of the usual mistakes, as NumPy.

    The walkers are the best-conditioned third of Gaussian candidates (by the condition
    number of their Slater matrix), so that the rounding error of a correct answer,
    which follows cond(A), stays within a small range from seed to seed.
    """
    cases = []
    with jax.enable_x64(True):
        keys = jax.random.split(jax.random.key(seed), len(sizes))
        for k, (electrons, per_device) in zip(keys, sizes):
            params, walkers = _problem(electrons, per_device * SHARDED_DEVICES, k)
            case = _reference(params, walkers)
            cases.append(
                jax.tree.map(np.asarray, {**case, "params": params, "walkers": walkers})
            )
    return cases


@functools.partial(jax.jit, static_argnums=(0, 1), compiler_options=_FAST_COMPILE)
def _problem(
    electrons: int, count: int, key: jax.Array
) -> tuple[dict[str, jax.Array], jax.Array]:
    from beyondgrad import slater, wavefunctions

    kp, kw = jax.random.split(key)
    params = wavefunctions.init_params(
        kp, electrons, hidden=VAR_HIDDEN, dtype=jnp.float64
    )
    candidates = jax.random.normal(kw, (3 * count, electrons, 3), jnp.float64)
    orbitals = functools.partial(wavefunctions.mlp_orbitals, params)
    matrices = jax.vmap(lambda x: slater.slater_matrix(orbitals, x))(candidates)
    best = jnp.sort(jnp.argsort(jnp.linalg.cond(matrices))[:count])
    return params, candidates[best]


@functools.partial(jax.jit, compiler_options=_FAST_COMPILE)
def _reference(params: Any, walkers: jax.Array) -> dict[str, Any]:
    """One device: the variance of E_L over all walkers, its gradient, and the
    numbers of the usual mistakes (for the hints)."""

    def variance(p: Any) -> jax.Array:
        e_l = _local_energies(p, walkers)
        return jnp.mean((e_l - jnp.mean(e_l)) ** 2)

    value, grad = jax.value_and_grad(variance)(params)
    e_l = _local_energies(params, walkers)
    t = e_l - jax.vmap(_potential)(walkers)
    count = walkers.shape[0]
    return {
        "value": value,
        "grad": grad,
        "mean": jnp.mean(e_l),
        "per_device": jnp.mean(jnp.var(e_l.reshape(SHARDED_DEVICES, -1), axis=1)),
        "unbiased": jnp.var(e_l) * count / (count - 1),
        "kinetic_only": jnp.var(t),
    }


def _potential(x: jax.Array) -> jax.Array:
    from beyondgrad import vmc

    return vmc.potential_energy(x)


def _local_energies(params: Any, walkers: jax.Array) -> jax.Array:
    """E_L(x) = -(Δlog|ψ| + |∇log|ψ||²)/2 + V(x) per walker, from the hand-derived
    Laplacian (``wavefunctions.mlp_slater_laplacian``), which shares no code with
    autodiff, and ``vmc.potential_energy`` (harmonic trap and Coulomb repulsion)."""
    from beyondgrad import wavefunctions

    def local(x: jax.Array) -> jax.Array:
        _, grad, lap = wavefunctions.mlp_slater_laplacian(params, x)
        return -0.5 * (lap + jnp.sum(grad * grad)) + _potential(x)

    return jax.vmap(local)(walkers)


def _signed_ratio(got: Any, want: Any) -> float | None:
    """The best c with got ≈ c * want over all leaves (least squares), or None."""
    try:
        g = np.concatenate(
            [np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(got)]
        )
        w = np.concatenate(
            [np.ravel(np.asarray(a, np.float64)) for a in jax.tree.leaves(want)]
        )
    except (TypeError, ValueError):
        return None
    if g.shape != w.shape or not np.all(np.isfinite(g)) or not w @ w:
        return None
    c = float(g @ w / (w @ w))
    residual = np.linalg.norm(g - c * w) / np.linalg.norm(w)
    return c if residual < 1e-3 * max(abs(c), 1.0) else None


def _mesh_hint(message: str) -> str:
    hint = (
        f"(the checker's mesh has {SHARDED_DEVICES} devices on one axis named "
        f"{MESH_AXIS!r}; params come in as P(), walkers as P({MESH_AXIS!r}), and both "
        "outputs must be invariant, out_specs=P())"
    )
    return f"{message}\n    {hint}"


def _largest(tree: Any) -> float:
    """max |entry| over all leaves of ``tree``."""
    return max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(tree))


def _variance_hints(got: Any, ref: dict[str, Any], count: int) -> list[str]:
    """What a wrong variance most likely is, and what to change."""
    if getattr(got, "dtype", None) == np.float32:
        return [
            "your variance is float32: the checker runs in float64 (params and "
            "walkers are float64); compute in their dtype (no float32 constants)"
        ]
    if isinstance(got, dict):
        return [
            "the first item of your pair is a dict (the gradient?): return "
            "(variance, gradient) in that order, as jax.value_and_grad does"
        ]
    try:
        array = np.asarray(got, np.float64)
    except (TypeError, ValueError):
        return []
    if array.shape != ():
        return []  # the shape message already says what is wrong
    value = float(array)
    near = lambda a, b: abs(a - b) <= 1e-6 * (1 + abs(b))  # noqa: E731
    if near(value, float(ref["kinetic_only"])):
        return [
            "your variance is that of the kinetic energy T alone: the local energy is "
            "E_L = T + V, with V = vmc.potential_energy(x) (trap and Coulomb terms)"
        ]
    if near(value, float(ref["per_device"])):
        return [
            "your variance is the mean of each device's own variance: the deviations "
            "must be taken from the mean over all walkers (a psum over "
            f"{MESH_AXIS!r} of the sums, divided by the global count), then summed "
            "over all devices too"
        ]
    if near(value, float(ref["unbiased"])):
        return [
            f"you divided by N - 1 = {count - 1}; the checker wants the variance of "
            f"the {count} values, divided by N = {count}"
        ]
    if near(value, float(ref["mean"])):
        return ["you returned the mean local energy; return its variance"]
    ratio = value / float(ref["value"]) if float(ref["value"]) else None
    if ratio is not None and near(ratio, SHARDED_DEVICES):
        return [
            f"your variance is {SHARDED_DEVICES} x the right one: divide by the number "
            f"of walkers on all devices ({count}), not on one"
        ]
    # a count written in: sum((t - S/c)^2)/c for another c than the N walkers
    mean, var = float(ref["mean"]), float(ref["value"])
    total, squares = count * mean, count * (var + mean * mean)
    for c in range(1, 4 * count + 1):
        if c != count and near(
            value, (squares - 2 * total * total / c + count * total * total / c**2) / c
        ):
            return [
                f"your variance divides by {c}, but this case has {count} walkers on "
                f"all devices: is a count written in? Use walkers.shape[0] * "
                f"lax.axis_size({MESH_AXIS!r}) (the checker draws the sizes)"
            ]
    return []


def _collective_hint(failure: str) -> str:
    """A first line for JAX's refusal of an output that varies across devices."""
    if "out_specs" in failure and ("replicat" in failure or "vary" in failure):
        return (
            "an output of your step still varies across the devices (out_specs=P() "
            "needs it invariant): the variance must combine the walkers of all "
            f"devices, so a psum over {MESH_AXIS!r} (of the sums, then of the squared "
            "deviations) is missing\n    "
        )
    return ""


@ex.timed_check("Exercise 5.3 (sharded variance step)", VARIANCE_CHECK_LIMIT)
def check_sharded_variance_step(
    fn: Callable[..., Any], strict: bool = False
) -> ex.Feedback:
    """Exercise 5.3: ``fn(params, walkers)`` as the body of a ``shard_map`` over
    ``"data"`` returns the variance over all walkers of the local energy
    :math:`E_L = T + V` and its gradient with respect to ``params`` (walkers fixed),
    both invariant.

    Runs ``jax.shard_map(fn, in_specs=(P(), P("data")), out_specs=P(),
    check_vma=True)`` on :data:`SHARDED_DEVICES` devices for :data:`VAR_CASES` cases
    whose sizes are drawn afresh for every check (distinct electron counts from
    :data:`VAR_ELECTRONS`, distinct walkers per device from
    :data:`VAR_WALKERS_PER_DEVICE`). Compares with a one-device float64 reference built
    on the hand-derived Laplacian and ``vmc.potential_energy``: ``|got - want| <=
    VAR_TOL (1 + max|want|)`` entrywise, the maximum over the variance, or over all
    leaves of the gradient.

    Args:
        fn: the answer, ``fn(params, walkers) -> (variance, gradient)``.
        strict: raise :class:`~beyondgrad.exercises.ExerciseFailed` when not passed.
    """
    return _check_variance(fn, strict, int(np.random.default_rng().integers(2**31)))


def _check_variance(fn: Callable[..., Any], strict: bool, seed: int) -> ex.Feedback:
    """:func:`check_sharded_variance_step` at the sizes drawn from ``seed`` (tests)."""
    from jax.sharding import PartitionSpec as P

    from beyondgrad import runtime

    name = "Exercise 5.3 (sharded variance step)"
    msg = ex.require_callable(fn, "my_sharded_variance_step")
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    given = _checks.seed(seed)
    seed = int(np.random.default_rng().integers(2**31)) if given is None else given
    sizes = _variance_sizes(int(seed))
    drawn = ", ".join(
        f"{e} electrons x {w * SHARDED_DEVICES} walkers" for e, w in sizes
    )
    mesh = runtime.demo_mesh(SHARDED_DEVICES, MESH_AXIS)
    step = jax.jit(
        jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=(P(), P(MESH_AXIS)),
            out_specs=P(),  # every output invariant
            check_vma=True,
        ),
        compiler_options=_FAST_COMPILE,
    )
    # The student's function first, on the first case's shapes (traced, nothing
    # compiled): a bare stub is answered before any reference work.
    if ex.is_stub(_trace_answer(step, *sizes[0])):
        return ex.verdict(name, [], attempted=False, strict=strict)
    problems: list[str] = []
    for (electrons, per_device), ref in zip(
        sizes, _variance_cases(tuple(sizes), int(seed))
    ):
        case = f"{electrons} electrons, {per_device} walkers per device"
        with jax.enable_x64(True):
            got = ex.call_answer(
                step, ref["params"], ref["walkers"], what="your step inside shard_map"
            )
        problems += _variance_problems(got, ref, case, name, strict)
        if problems:
            break
    if problems and isinstance(problems[0], ex.Feedback):
        return problems[0]
    if problems:
        problems.append(
            f"(sizes drawn for this check: {drawn}; the next check draws anew)"
        )
    return ex.verdict(
        name,
        problems,
        success=f"runs in shard_map over {MESH_AXIS!r} ({SHARDED_DEVICES} devices, "
        f"check_vma=True) at {len(sizes)} sizes drawn at random ({drawn}); the "
        "variance of E_L = T + V and its gradient "
        f"match one device (float64, |error| <= {VAR_TOL:g} (1 + max|expected|), the "
        "maximum over the variance or over the whole gradient)",
        strict=strict,
    )


def _trace_answer(step: Any, electrons: int, per_device: int) -> Any:
    """``step`` traced at one case's shapes (``jax.eval_shape``: parameters and walkers
    as abstract float64 arrays, nothing runs or compiles), through
    :func:`~beyondgrad.exercises.call_answer`: a stub's verdict, a failure, or the
    result's shapes."""
    from beyondgrad import wavefunctions

    with jax.enable_x64(True):
        init = functools.partial(
            wavefunctions.init_params,
            n_electrons=electrons,
            hidden=VAR_HIDDEN,
            dtype=jnp.float64,
        )
        params = jax.eval_shape(init, jax.random.key(0))
        walkers = jax.ShapeDtypeStruct(
            (per_device * SHARDED_DEVICES, electrons, 3), jnp.float64
        )
        return ex.call_answer(
            jax.eval_shape, step, params, walkers, what="your step inside shard_map"
        )


def _variance_problems(
    got: Any, ref: dict[str, Any], case: str, name: str, strict: bool
) -> list[Any]:
    """What is wrong with one case's answer ``got``: messages, the hint first (a
    one-item ``[Feedback]`` for a stub)."""
    if ex.is_stub(got):
        return [ex.verdict(name, [], attempted=False, strict=strict)]
    failure = ex.failed(got)
    if failure:
        return [_collective_hint(failure) + _mesh_hint(f"{case}: {failure}")]
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return [
            "return a pair (variance, gradient), as jax.value_and_grad does; got "
            f"{type(got).__name__}"
            + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        ]
    count = ref["walkers"].shape[0]
    value_problems, grad_problems = [
        ex.tree_mismatches(
            part,
            want,
            rtol=0.0,
            atol=VAR_TOL * (1 + _largest(want)),
            name=f"{case}: {label}",
            allow_python_scalars=False,
        )
        for part, want, label in zip(
            got, (ref["value"], ref["grad"]), ("the variance", "the gradient")
        )
    ]
    if value_problems:
        return _variance_hints(got[0], ref, count) + value_problems + grad_problems
    if grad_problems:
        ratio = _signed_ratio(got[1], ref["grad"])
        if ratio is not None and abs(ratio - SHARDED_DEVICES) < 1e-2:
            grad_problems.insert(
                0,
                f"your gradient is {SHARDED_DEVICES} x the single-device gradient "
                f"({SHARDED_DEVICES} devices): the device-count bug; the gradient "
                "of the invariant params is already summed over the devices, so "
                "take no psum/pmean of it",
            )
        elif ratio is not None and abs(ratio - 1) > 1e-3:
            grad_problems.insert(
                0,
                f"your gradient is {ratio:+.4g} x the right one: differentiate "
                "the variance itself (jax.value_and_grad of the function that "
                "returns it), with the walkers fixed",
            )
    return grad_problems
