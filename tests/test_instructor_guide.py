"""The instructor guide quotes what the exercise checkers print: keep those quotes true.

Each case below is a mistake the guide describes. The test gives the mistaken answer to
the real checker and asserts that (1) the checker rejects it, (2) the quoted text is in
the FIRST message the student sees (what an instructor reads over a shoulder), (3) a
quoted follow-up line, where the guide gives one, comes after it, and (4) the guide
contains the same texts. A checker whose wording or order changes, or a guide that
drifts from the checkers, fails here with both texts in the message.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.flatten_util import ravel_pytree

from beyondgrad import exercises, implicit
from beyondgrad import implicit_problems as problems
from beyondgrad.exercises import ch1 as ex1
from beyondgrad.exercises import ch2 as ex2
from beyondgrad.exercises import ch3 as ch3_checks
from beyondgrad.exercises import ch4
from beyondgrad.exercises import ch5 as ex5
from beyondgrad.exercises import ch6 as ex6
from tools import book

GUIDE = book.ROOT / "instructor_guide.md"
CHAPTER_MODULES = {
    "01_tracers": "tracers",
    "02_linearize_transpose": "linear",
    "03_implicit_diff": "implicit",
    "03b_solvers_costs": "implicit",
    "04_shard_map_vma": "sharding",  # its checkers: beyondgrad.exercises.ch4
    "05_laplacians": "laplacian",
}


def normalized(text: str) -> str:
    """Whitespace collapsed, so that a quote may wrap over lines in the guide."""
    return re.sub(r"\s+", " ", text).strip()


def guide_text() -> str:
    return normalized(GUIDE.read_text())


def _stub(*args, **kwargs):
    raise NotImplementedError


_M = ch3_checks.FIXED_POINT_M


def _while_loop_solve(theta):
    body = lambda c: (0.5 * jnp.cos(_M @ c[0]) + theta, c[1] + 1)  # noqa: E731
    return lax.while_loop(lambda c: c[1] < 100, body, (jnp.zeros_like(theta), 0))[0]


def _scalar_tangent_solve(theta):
    F = lambda x: 0.5 * jnp.cos(_M @ x) + theta - x  # noqa: E731

    def solve(F, x0):
        return lax.fori_loop(0, 200, lambda i, x: x + F(x), x0)

    return lax.custom_root(F, jnp.zeros_like(theta), solve, lambda g, y: y / g(1.0))


def _five_iterations(theta):
    x = jnp.zeros_like(theta)
    for _ in range(5):
        x = 0.5 * jnp.cos(jnp.asarray(_M, x.dtype) @ x) + theta
    return x


def _loose_tolerance_grad(b):
    # the tangent solver of the chapter's suspicious_grad kept: only the tolerance
    # tightened, which is what a student who did not diagnose would try first
    params = ch3_checks.exercise3_params()

    def series_solve(g, y):
        def add_term(_, carry):
            term, total = carry
            term = g(term) + term
            return term, total + term

        return -lax.fori_loop(0, 19, add_term, (y, y))[1]

    def total(bb):
        p = {**params, "b": bb}
        z, _ = implicit.fixed_point(
            problems.deq_layer,
            jnp.zeros_like(bb),
            p,
            tol=1e-14,
            max_iter=1000,
            tangent_solver=series_solve,
        )
        return jnp.sum(z)

    return jax.grad(total)(b)


def _loose_tolerance_check(strict: bool = False):
    with jax.enable_x64(True):
        return ch3_checks.check_tolerance_fix(_loose_tolerance_grad, strict=strict)


def _scan_fixed_point(theta):
    step = lambda x, _: (0.5 * jnp.cos(_M @ x) + theta, None)  # noqa: E731
    return lax.scan(step, jnp.zeros_like(theta), length=200)[0]


def _negative_sqrtm(a):
    f = lambda x, a: x @ a @ x - jnp.eye(a.shape[0], dtype=a.dtype)  # noqa: E731
    return implicit.root_find(f, -jnp.eye(a.shape[0], dtype=a.dtype), a, tol=1e-12)[0]


def _eigh_sqrtm(a):
    w, q = jnp.linalg.eigh(a)
    return (q / jnp.sqrt(w)) @ q.T


def _square_root(a):
    f = lambda x, a: x @ x - a  # noqa: E731
    return implicit.root_find(f, jnp.eye(a.shape[0], dtype=a.dtype), a, tol=1e-12)[0]


def _ch4_mse(w, X, y):
    return jnp.mean((X @ w - y) ** 2)


def _step_local_loss_through_gather(w_block, X, y):
    gathered_loss = lambda v: _ch4_mse(lax.all_gather(v, "data", tiled=True), X, y)  # noqa: E731
    return w_block - 0.1 * jax.grad(gathered_loss)(w_block)


def _step_sign_error(w_block, X, y):
    return w_block + 0.1 * jax.grad(
        lambda v: lax.pmean(
            _ch4_mse(lax.all_gather(v, "data", tiled=True), X, y), "data"
        )
    )(w_block)


def _step_axis_i(w_block, X_block, y_block, lr=0.1):
    # the chapter's solution with the pmap-era axis name "i" for "data"
    def global_loss(wb):
        w_full = lax.all_gather(wb, "i", tiled=True)
        return lax.pmean(jnp.mean((X_block @ w_full - y_block) ** 2), "i")

    return w_block - lr * jax.grad(global_loss)(w_block)


def _ch4_body(xb):
    return lambda k, acc: acc + (k + 1) * lax.psum(jnp.sum(xb, axis=1), "model")


def _invariant_carry(xb):
    return lax.fori_loop(0, 3, _ch4_body(xb), jnp.zeros(xb.shape[0]))


def _carry_like_block(xb):
    return lax.fori_loop(0, 3, _ch4_body(xb), jnp.zeros_like(xb[:, 0]))


def _fl_multiply_no_cross(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv


def _row_second_derivative_wrong_sign(a, i, u):
    return (u @ jnp.linalg.solve(a, jnp.eye(a.shape[0], dtype=a.dtype)[:, i])) ** 2


def _sharded_variance(
    params, walkers, *, cast_basis=True, varying_init=True, psum_grad=False, ddof=0
):
    from beyondgrad import vmc, wavefunctions

    def kinetic(p, x):  # the local energy E_L = T + V
        f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))  # noqa: E731
        g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
        eye = jnp.eye(g.shape[0], dtype=g.dtype)
        if cast_basis:
            eye = lax.pcast(eye, "data", to="varying")
        init = jnp.zeros_like(g[0]) if varying_init else 0.0
        lap = lax.fori_loop(0, g.shape[0], lambda i, acc: acc + hvp(eye[i])[i], init)
        return -0.5 * (lap + g @ g) + vmc.potential_energy(x)

    def variance(p):
        t = jax.vmap(kinetic, in_axes=(None, 0))(p, walkers)
        if ddof == "per-device":  # each device's own variance, then a pmean
            return lax.pmean(jnp.var(t), "data")
        count = walkers.shape[0] * lax.axis_size("data")
        mean = lax.psum(jnp.sum(t), "data") / count
        return lax.psum(jnp.sum((t - mean) ** 2), "data") / (count - ddof)

    value, grad = jax.value_and_grad(variance)(params)
    if psum_grad:
        grad = jax.tree.map(lambda t: lax.psum(t, "data"), grad)
    return value, grad


def _bump_threshold_03(
    x,
):  # Chapter 1, exercise 1.3: the threshold is not the function's own
    return jnp.where(x > 0.3, jnp.exp(-1.0 / jnp.where(x > 0.3, x, 1.0)), 0.0)


def _vmap_while(x, n, n_max):  # Chapter 1: the chapter's vmap of a while_loop
    def one(n, v):
        body = lambda c: (c[0] + 1, jnp.sin(c[1]))  # noqa: E731
        return lax.while_loop(lambda c: c[0] < n, body, (0, v))[1]

    return jax.vmap(one)(n, x)


def _bound_200(x, n, n_max):  # Chapter 1: a bound written into the code
    return lax.fori_loop(0, 200, lambda i, v: jnp.where(i < n, jnp.sin(v), v), x)


def _bound_8(x, n, n_max):  # Chapter 1: a bound written into the code, below n_max
    for i in range(8):
        x = jnp.where(i < n, jnp.sin(x), x)
    return x


def _endless(x, n, n_max):  # Chapter 1: a Python loop whose condition never turns false
    steps = 0
    while steps >= 0:  # the checker's time limit stops it (a Python loop, so for good)
        steps += 1
    return x


_WEIGHTS = jnp.linspace(1.0, 2.0, 6)


_X_PART_HINT = (
    "the 'x' part is wrong: transpose cumsum and roll(x, 1) one at a time and check each "
    "with linear.dot_product_test"
)


@dataclass(frozen=True)
class Mistake:
    name: str
    check: Callable[[], object]  # returns the checker's Feedback
    quote: str  # text of the first message the student sees, as the guide quotes it
    then: str = ""  # text of a later message the guide quotes too (the diagnosis)


def _retyped_map(p):
    return jnp.cumsum(p["x"]) - jnp.roll(p["x"], 1) + p["s"] * _WEIGHTS


def _prebuilt_transpose():
    """JAX's transpose of a jnp copy of the map, built before the checker runs."""
    transpose = jax.linear_transpose(_retyped_map, ex2.exercise_map_input())
    return lambda v: transpose(v)[0]


def _transpose_of_map_matrix(v):
    """The map's matrix from its values on the basis vectors, transposed."""
    eye = jnp.eye(7, dtype=jnp.float32)
    cols = [ex2.exercise_linear_map({"x": e[:6], "s": e[6]}) for e in eye]
    back = jnp.stack(cols, axis=1).T @ v
    return {"x": back[:6], "s": back[6]}


def _ones_per_output_leaf(f, params):
    """One transpose per output leaf, its cotangent ones_like(leaf): the sum of the
    leaf's rows, repeated in every row."""
    out, f_jvp = jax.linearize(f, params)
    transpose = jax.linear_transpose(f_jvp, params)
    leaves, treedef = jax.tree.flatten(out)
    rows = []
    for k, leaf in enumerate(leaves):
        cotangent = [
            jnp.ones_like(o) if j == k else jnp.zeros_like(o)
            for j, o in enumerate(leaves)
        ]
        (summed,) = transpose(jax.tree.unflatten(treedef, cotangent))
        rows.append(
            jax.tree.map(
                lambda p, s=leaf.shape: jnp.broadcast_to(p, s + p.shape), summed
            )
        )
    return jax.tree.unflatten(treedef, rows)


def _jacobian_by_columns(f, params):
    """Exercise 2.2 by forward mode: the linearized map applied to basis tangents."""
    out, f_jvp = jax.linearize(f, params)
    flat, unravel = ravel_pytree(params)
    cols = jax.vmap(lambda e: f_jvp(unravel(e)))(jnp.eye(flat.size, dtype=flat.dtype))

    def leaf(c):
        rows = jax.vmap(unravel)(jnp.moveaxis(c, 0, -1).reshape(-1, flat.size))
        return jax.tree.map(lambda r: r.reshape(c.shape[1:] + r.shape[1:]), rows)

    return jax.tree.map(leaf, cols)


MISTAKES = [
    Mistake(
        "stub",
        lambda: ex1.check_fix_jit(_stub),
        "not attempted yet: replace `raise NotImplementedError` with your code",
    ),
    Mistake(
        "ch1-vmap-while-copied",
        lambda: ex1.check_fix_jit(_vmap_while, seed=0),
        ex1.TRACED_TRIP_COUNT,
        "jax.grad of the sum of your function raised ValueError: Reverse-mode "
        "differentiation does not work for lax.while_loop or lax.fori_loop with dynamic "
        "start/stop values",
    ),
    Mistake(
        "ch1-python-loop",
        lambda: ex1.check_fix_jit(lambda x, n, n_max: ex1.repeat_sin(x, n), seed=0),
        "range(n), int(n) and n.max() in Python need concrete numbers; under jit n is "
        "traced: the number of steps you may use in Python is n_max",
    ),
    Mistake(
        "ch1-fori-array-bound",
        lambda: ex1.check_fix_jit(
            lambda x, n, n_max: lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x),
            seed=0,
        ),
        "a loop primitive's trip count is one scalar for the whole loop, and here each "
        "entry has its own n: loop n_max times and keep finished entries with jnp.where",
    ),
    Mistake(
        "ch1-bound-in-the-code",
        lambda: ex1.check_fix_jit(_bound_200, seed=0),
        "a bound written into the code: your program applies sin 200 times whatever "
        "n_max is",
    ),
    Mistake(
        "ch1-bound-below-n-max",
        lambda: ex1.check_fix_jit(_bound_8, seed=0),  # case 1: n_max = 10 > 8
        "result differs from the reference",
        "a bound written into the code, too small for n_max",
    ),
    Mistake(
        "ch1-endless-loop",
        lambda: ex1.check_fix_jit(_endless, seed=0),
        "your code did not finish within 10 s (stopped waiting after",
    ),
    Mistake(
        "ch1-nan-left-of-zero",
        lambda: ex1.check_nan_interval((-float("inf"), 0.0)),
        "left end -inf: at x = -0.112711, between your end and the true one, grad(bump) "
        "is 0; your interval contains it: move the left end toward 0",
        "right end 0: at x = 1.0842e-20, between your end and the true one, grad(bump) "
        "is nan; your interval misses it: move the right end away from 0",
    ),
    Mistake(
        "ch1-nan-positive-side",
        # the left end right (as measured), the positive side missed
        lambda: ex1.check_nan_interval((ex1.nan_interval_measured()[0], 0.0)),
        "right end 0: at x = 1.0842e-20, between your end and the true one, grad(bump) "
        "is nan; your interval misses it: move the right end away from 0",
    ),
    Mistake(
        "ch1-key-without-weak-type",
        lambda: ex1.check_predict_retraces(
            lambda x, n: (np.shape(x), jnp.result_type(x), n), seed=0
        ),
        "in a quiz drawn for this check (the next check draws another)",
        "so you predict a cache hit, but jit traced again: the two differ in something "
        "jit's key includes",
    ),
    Mistake(
        "ch1-key-with-class",
        lambda: ex1.check_predict_retraces(
            lambda x, n: (type(x), jax.typeof(x), n), seed=0
        ),
        "in a quiz drawn for this check (the next check draws another)",
        "so you predict a retrace, but jit reused an earlier trace: your key includes "
        "something jit's key does not",
    ),
    Mistake(
        "ch1-list-of-booleans",
        lambda: ex1.check_predict_retraces([True] * 9),
        "my_cache_key should be a function, but you passed a value (list)",
    ),
    Mistake(
        "ch1-inner-where-only",
        lambda: ex1.check_finite_grad(
            lambda x: jnp.exp(-1.0 / jnp.where(x > 0, x, 1.0))
        ),
        "value on the grid differs from the reference at index (0,): got 0.36787945 (float32), "
        "expected 0 (float64)",
    ),
    Mistake(
        "ch1-one-where",
        lambda: ex1.check_finite_grad(ex1.bump),
        "gradient on the grid has 5 entries whose nan/inf does not match the reference "
        "(first at index (52,): got nan, expected 0.0) [x = -0.01]",
        "the gradient is not finite for tiny x > 0 (the right end of part (a))",
    ),
    Mistake(
        "ch1-threshold-0.3",
        lambda: ex1.check_finite_grad(_bump_threshold_03),
        "got 0 (float32), expected 0.0356739981 (float64); relative error 1.00e+00, "
        "allowed 1e-30 + 1e-05*|expected| [x = 0.3]",
    ),
    Mistake(
        "ch1-python-if",
        lambda: ex1.check_finite_grad(lambda x: jnp.exp(-1.0 / x) if x > 0 else 0.0),
        exercises.PYTHON_BOOL_ON_TRACER,
        "vmap(bump_safe) raised TracerBoolConversionError",
    ),
    Mistake(
        "ch1-numpy-on-the-input",
        lambda: ex1.check_finite_grad(
            lambda x: np.where(x > 0, np.exp(-1.0 / np.where(x > 0, x, 1.0)), 0.0)
        ),
        exercises.NUMPY_ON_TRACER,
        "vmap(bump_safe) raised TracerArrayConversionError",
    ),
    Mistake(
        "ch2-forgot-s",
        lambda: ex2.check_transpose(
            lambda v: {
                "x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, -1),
                "s": jnp.zeros(()),
            }
        ),
        "your 's' is 0, but s changes the output (by s * w): the transpose's 's' is "
        "not zero",
        "your_transpose(v0)['s'] differs from the reference: got 0 (float32), expected",
    ),
    Mistake(
        "ch2-cumsum-not-reversed",
        lambda: ex2.check_transpose(
            lambda v: {"x": jnp.cumsum(v) - jnp.roll(v, -1), "s": jnp.vdot(_WEIGHTS, v)}
        ),
        "your 'x' part uses cumsum(v): cumsum is not its own transpose",
        "your_transpose(v0)['x'] differs from the reference at index (",
    ),
    Mistake(
        "ch2-x-part-hint",
        lambda: ex2.check_transpose(
            lambda v: {
                "x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, 1),
                "s": jnp.vdot(_WEIGHTS, v),
            }
        ),
        "your 'x' part uses roll(v, 1), the map's own shift: the transpose of a shift "
        "shifts the other way",
        "your_transpose(v0)['x'] differs from the reference at index (",
    ),
    Mistake(
        "ch2-dot-test-always-zero",
        lambda: ex2.check_transpose(
            lambda v: {
                "x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, -1),
                "s": jnp.vdot(_WEIGHTS, v),
            },
            lambda f, f_transpose, x, y: 0.0,
        ),
        "your dot test gives at most 0 for a wrong transpose (cumsum kept as cumsum) at "
        "3 drawn x and y, so it would pass it: that is as small as for the right "
        "transpose, so it cannot tell them apart",
    ),
    Mistake(
        "ch2-x-part-other",
        lambda: ex2.check_transpose(
            lambda v: {
                "x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, -1) + 0.1 * v[0],
                "s": jnp.vdot(_WEIGHTS, v),
            }
        ),
        _X_PART_HINT,
    ),
    Mistake(
        "ch2-jax-transpose",
        lambda: ex2.check_transpose(
            lambda v: jax.linear_transpose(
                ex2.exercise_linear_map, ex2.exercise_map_input()
            )(v)
        ),
        "your transpose raised RuntimeError: your answer called jax.linear_transpose: "
        "write the transpose by hand",
    ),
    Mistake(
        "ch2-transpose-built-before",
        lambda: ex2.check_transpose(_prebuilt_transpose()),
        "your answer reached JAX's transposition (",
    ),
    Mistake(
        "ch2-matrix-of-the-map",
        lambda: ex2.check_transpose(_transpose_of_map_matrix),
        "your transpose called ex2.exercise_linear_map",
    ),
    Mistake(
        "ch2-grad-of-dict",
        lambda: ex2.check_rebuilt_jacrev(lambda f, p: jax.grad(f)(p)),
        "your function raised RuntimeError: your answer called jax.grad: build the "
        "Jacobian from jax.linearize and jax.linear_transpose",
    ),
    Mistake(
        "ch2-jacobian-by-columns",
        lambda: ex2.check_rebuilt_jacrev(_jacobian_by_columns, seed=0),
        "you built the Jacobian by columns, applying the linearized map to basis "
        "vectors; 2.2 asks for rows: transpose the linearized map with "
        "jax.linear_transpose and apply it to one-hot cotangents",
    ),
    Mistake(
        "ch2-ones-per-output-leaf",
        lambda: ex2.check_rebuilt_jacrev(_ones_per_output_leaf, seed=0),
        ex2.SUMMED_ROWS_MESSAGE,
        "differs from the reference",
    ),
    Mistake(
        "ch2-per-example-jacfwd",
        lambda: ex2.check_jacobian_strategy(
            {
                "mlp_loss": "jacrev",
                "decoder": "jacfwd",
                "per_example_losses": "jacfwd",
                "ode_trajectory": "jacfwd",
            }
        ),
        "per_example_losses: you said jacfwd, but the input has 650 numbers and the output 128: "
        "jacfwd runs 650 JVPs, jacrev 128 VJPs (jacfwd needs 5x more passes)",
    ),
    Mistake(
        "ch2-strategy-string",
        lambda: ex2.check_jacobian_strategy("jacrev"),
        "answer with a dict {case: 'jacfwd' or 'jacrev'} for the cases",
    ),
    Mistake(
        "ch3-while-loop",
        lambda: ch3_checks.check_fixed_point_grad(_while_loop_solve),
        "your function does not call lax.custom_root; its jaxpr has while but no "
        "custom_root",
        "jax.jacrev of your function raised ValueError: Reverse-mode differentiation "
        "does not work for lax.while_loop or lax.fori_loop with dynamic start/stop values",
    ),
    Mistake(
        "ch3-scalar-tangent-solve",
        lambda: ch3_checks.check_fixed_point_grad(_scalar_tangent_solve),
        "a scalar division such as y / g(1.0) only works for a scalar x",
    ),
    Mistake(
        "ch3-scan",
        lambda: ch3_checks.check_fixed_point_grad(_scan_fixed_point),
        "your function does not call lax.custom_root; its jaxpr has scan but no custom_root",
    ),
    Mistake(
        "ch3-value-not-function",
        lambda: ch3_checks.check_fixed_point_grad(_five_iterations(jnp.full(3, 0.3))),
        "my_fixed_point should be a function, but you passed a value (ArrayImpl of shape (3,)); "
        "pass the function itself, without calling it",
    ),
    Mistake(
        "ch3-scipy-sqrtm",
        lambda: ch3_checks.check_sqrtm(jax.scipy.linalg.sqrtm),
        "jax.jvp of your function raised NotImplementedError: Differentiation rule for 'schur' not implemented",
    ),
    Mistake(
        "ch3-eigh",
        lambda: ch3_checks.check_sqrtm(_eigh_sqrtm),
        "its jaxpr has eigh but no custom_root",
    ),
    Mistake(
        "ch3-negative-root",
        lambda: ch3_checks.check_sqrtm(_negative_sqrtm),
        "you found -X, the negative root",
    ),
    Mistake(
        "ch3-square-root",
        lambda: ch3_checks.check_sqrtm(_square_root),
        "you returned A^(1/2), the square root; the exercise asks for X = A^(-1/2), the "
        "X with X A X = I: change the equation, not the start",
    ),
    Mistake(
        "ch3-loose-tolerance",
        _loose_tolerance_check,
        "as suspicious_grad's: its solve converged (its SolverInfo residual is below "
        "1e-13, far below this error), so this error does not come from the solve and "
        "a tighter tolerance will not remove it",
        "gradient at drawn b number 1 differs from the reference at index (",
    ),
    Mistake(
        "ch3-sqrtm-tuple",
        lambda: ch3_checks.check_sqrtm(
            lambda a: implicit.root_find(
                lambda x, a: x @ a @ x - jnp.eye(a.shape[0], dtype=a.dtype),
                jnp.eye(a.shape[0], dtype=a.dtype),
                a,
                tol=1e-12,
            )
        ),
        "your inv_sqrtm returns a tuple of 2 items; return the matrix X alone "
        "(implicit.root_find returns (X, SolverInfo): take [0])",
    ),
    Mistake(
        "ch4-list",
        lambda: ch4.check_predict_vma([1, 2]),
        "answers must be a dict {expression: set of axes}, got list",
    ),
    Mistake(
        "ch4-all-invariant",
        lambda: ch4.check_predict_vma({e: set() for e in ch4.VMA_EXPRESSIONS}),
        "a * w: you predicted {}, the explainer says {data}",
        "a + b: you predicted {}, the explainer says {data,model}",
    ),
    Mistake(
        "ch4-all-gather-invariant",
        # the other four right, only all_gather's result predicted invariant
        lambda: ch4.check_predict_vma(
            {
                **{e: set() for e in ch4.VMA_EXPRESSIONS},
                "a * w": {"data"},
                "a + b": {"data", "model"},
                "psum(a * b, 'data')": {"model"},
            }
        ),
        "all_gather(a, 'data') + w: you predicted {}, the explainer says {data}",
    ),
    Mistake(
        "ch4-local-loss",
        lambda: ch4.check_sharded_step(_step_local_loss_through_gather),
        "on 2 device(s): your update is +2 x the single-device update",
    ),
    Mistake(
        "ch4-sign",
        lambda: ch4.check_sharded_step(_step_sign_error),
        "on 1 device(s): your update is -1 x the single-device update",
    ),
    Mistake(
        "ch4-axis-i",
        lambda: ch4.check_sharded_step(_step_axis_i),
        "on 1 device(s): your step raised NameError: unbound axis name: i (the "
        "checker's mesh has axes 'data' of size 1; every collective must name one of "
        "them)",
    ),
    Mistake(
        "ch5-no-cross-term",
        lambda: ex5.check_fl_multiply(_fl_multiply_no_cross),
        "your Laplacian is u*lv + v*lu: it misses the cross term 2 (grad u . grad v), "
        "summed over the d inputs",
        "the Laplacian differs from the reference at index (",
    ),
    Mistake(
        "ch5-sign",
        lambda: ex5.check_row_update_second_derivative(
            _row_second_derivative_wrong_sign
        ),
        "the sign is flipped: along a rank-one update of one row, log|det| is concave",
        "answer differs from the reference: got",
    ),
    Mistake(
        "ch5-per-device-variance",
        lambda: ex5._check_variance(
            functools.partial(_sharded_variance, ddof="per-device"), False, 3
        ),
        "your variance is the mean of each device's own variance: the deviations must "
        "be taken from the mean over all walkers",
        "walkers per device: the variance differs from the reference",
    ),
    Mistake(
        "ch5-n-minus-1",
        lambda: ex5._check_variance(
            functools.partial(_sharded_variance, ddof=1), False, 3
        ),
        "you divided by N - 1",
        "walkers per device: the variance differs from the reference",
    ),
    Mistake(
        "ch5-uncast-eye",
        lambda: ex5._check_variance(
            functools.partial(_sharded_variance, cast_basis=False), False, 3
        ),
        "your step inside shard_map raised ValueError: linearized function called on tangent values "
        "inconsistent with the original primal values",
    ),
    Mistake(
        "ch5-invariant-init",
        lambda: ex5._check_variance(
            functools.partial(_sharded_variance, varying_init=False), False, 3
        ),
        "your step inside shard_map raised TypeError: scan body function carry input and carry output "
        "must have equal types, but they differ",
    ),
    Mistake(
        "ch5-psum-of-grad",
        lambda: ex5._check_variance(
            functools.partial(_sharded_variance, psum_grad=True), False, 3
        ),
        "your gradient is 8 x the single-device gradient (8 devices): the device-count "
        "bug",
        "walkers per device: the gradient['b1'] differs from the reference at index (",
    ),
    Mistake(
        "ch4-invariant-carry",
        lambda: ch4.check_two_axis_carry(_invariant_carry),
        "your loop's initial carry has another type than the body's output",
        "your weighted_row_sums raised TypeError: scan body function carry input and carry output must have "
        "equal types, but they differ",
    ),
    Mistake(
        "ch4-carry-like-block",
        lambda: ch4.check_two_axis_carry(_carry_like_block),
        "your result varies over 'model' in its type, and out_specs=P('data') needs it "
        "the same on every 'model' device",
        "your weighted_row_sums raised ValueError",
    ),
]


def comparable(quote: str) -> str:
    """The part of a quote that must match on this backend.

    The guide's numbers were printed on CPU (where CI runs). On a GPU, float32 matmuls may
    use TF32 and move the last digits, so there only the text up to the first number is
    compared.
    """
    if jax.default_backend() == "cpu" or " got " not in quote:
        return quote
    return quote.split(" got ")[0] + " got "


#: Quotes of a checker's time limit: each waits the limit out on the wall clock, so
#: they run in one CI environment (conftest.py's ``one_env``); the time-limit tests
#: themselves are tests/test_time_limit_loaded.py.
TIME_LIMIT_QUOTES = {
    "ch1-endless-loop",
    "python-loop-never-ends",
    "compiled-loop-never-ends",
}


def _case(value, name: str):
    marks = [pytest.mark.one_env] if name in TIME_LIMIT_QUOTES else []
    return pytest.param(*value, id=name, marks=marks)


@pytest.mark.parametrize("mistake", [_case((m,), m.name) for m in MISTAKES])
def test_guide_quotes_what_the_checker_prints(mistake):
    """The quote is in the first message the student sees (:func:`first_message`);
    a follow-up quote, if any, is on a later line (of that message or a later one)."""
    feedback = mistake.check()
    assert not feedback, (
        f"the checker accepted the mistaken answer of {mistake.name!r}: {feedback}"
    )
    first = normalized(first_message(feedback))
    assert comparable(mistake.quote) in first, (
        f"the guide quotes {mistake.quote!r} for {mistake.name!r}, but the first "
        f"message the student sees is:\n{first}\n(all of it:\n{feedback})"
    )
    assert mistake.quote in guide_text(), (
        f"instructor_guide.md does not quote {mistake.quote!r}, which the checker prints"
    )
    if mistake.then:
        # a later line: of the first message (JAX's error after the checker's line)
        # or of a later message
        first_rest = feedback.messages[0].split("\n")[1:] if feedback.messages else []
        later = normalized(" ".join([*first_rest, *feedback.messages[1:]]))
        assert comparable(mistake.then) in later, (
            f"the guide quotes {mistake.then!r} after the first message for "
            f"{mistake.name!r}; the checker prints:\n{feedback}"
        )
        assert mistake.then in guide_text(), (
            f"instructor_guide.md does not quote {mistake.then!r}"
        )


def test_guide_quotes_the_setup_check_fix():
    """The setup check's fix for too few devices, as the guide quotes it (for 8 devices)."""
    from beyondgrad import runtime

    have = len(jax.devices("cpu"))
    lines = normalized("\n".join(str(c) for c in runtime.check_setup(have + 1)))
    fix = "restart the kernel and call beyondgrad.runtime.ensure_cpu_devices({n}) before any JAX computation"
    assert fix.format(n=have + 1) in lines, (
        f"check_setup no longer prints {fix!r}:\n{lines}"
    )
    assert fix.format(n=runtime.BOOK_DEVICE_COUNT) in guide_text()


def test_every_checker_the_guide_names_exists_and_its_chapter_uses_it():
    """Each chapter section names its checkers; they live in beyondgrad.exercises.chN,
    the chapter calls each one, and the guide names every checker the module exports."""
    text = GUIDE.read_text()
    numbers = sorted({int(p.stem[:2]) for p in book.CHAPTERS.glob("0[1-9]*_*.md")})
    assert numbers, "no chapters"
    for n in numbers:
        section = re.search(
            rf"^### Chapter {n}\b.*?(?=^### |^## |\Z)", text, re.M | re.S
        )
        assert section, f"the guide has no Chapter {n} section"
        named = set(re.findall(r"`[\w.]*\.(check_\w+)`", section.group(0)))
        module = importlib.import_module(f"beyondgrad.exercises.ch{n}")
        exported = {name for name in module.__all__ if name.startswith("check_")}
        assert named == exported, (
            f"Chapter {n}: guide names {sorted(named)}, module has {sorted(exported)}"
        )
        chapter = _chapter_text(n)
        for func in named:
            assert re.search(rf"\b\w+\.{func}\(", chapter), (
                f"chapter {n}'s pages do not call {func}"
            )


def test_chapter1_checkers_the_guide_names_exist_and_the_chapter_calls_them():
    """Chapter 1's checkers live in beyondgrad.exercises.ch1, imported as ``ex1``."""
    text = GUIDE.read_text()
    section = re.search(
        r"^### Chapter 1\b.*?(?=^### )", text, re.MULTILINE | re.DOTALL
    ).group(0)
    named = sorted(set(re.findall(r"`ex1\.(check_\w+)`", section)))
    assert named == [
        "check_finite_grad",
        "check_fix_jit",
        "check_nan_interval",
        "check_predict_retraces",
    ]
    chapter = (book.CHAPTERS / "01_tracers.md").read_text()
    for func in named:
        assert callable(getattr(ex1, func))
        assert re.search(rf"\bex1\.{func}\(", chapter), (
            f"01_tracers.md does not call ex1.{func}"
        )


def test_every_chapter4_checker_the_guide_names_exists_and_chapter4_calls_it():
    """Chapter 4's checkers live in beyondgrad.exercises.ch4 (named ``ch4.check_*``)."""
    named = sorted(set(re.findall(r"`ch4\.(check_\w+)`", GUIDE.read_text())))
    assert len(named) == 3, named
    text = (book.CHAPTERS / "04_shard_map_vma.md").read_text()
    for func in named:
        assert callable(getattr(ch4, func, None)), (
            f"the guide names ch4.{func}, which does not exist"
        )
        assert re.search(rf"\bch4\.{func}\(", text), (
            f"Chapter 4 does not call ch4.{func}"
        )


def test_every_exercise_function_the_guide_names_is_defined_in_a_chapter():
    """Stub and fixture names the guide tells students to edit (``my_*`` and the like) exist."""
    pattern = r"`(my_\w+|repeat_sin_each|bump_safe|suspicious_grad|fixed_grad|inv_sqrtm|buggy_\w+|kinetic_\w+)[`(]"
    named = sorted(set(re.findall(pattern, GUIDE.read_text())))
    assert named, "the guide names no exercise function"
    chapters = "\n".join(p.read_text() for p in book.chapter_sources())
    missing = [
        name
        for name in named
        if not re.search(rf"^def {name}\(", chapters, re.MULTILINE)
    ]
    assert not missing, (
        f"the guide names exercise functions that no chapter defines: {missing}"
    )


def test_chapter3_checkers_the_guide_names_exist_and_the_chapter_calls_them():
    section = GUIDE.read_text().split("### Chapter 3")[1].split("### Chapter 4")[0]
    named = sorted(set(re.findall(r"`ch3\.(check_\w+)`", section)))
    assert len(named) == 3, named
    chapter = _chapter_text(3)
    for func in named:
        assert callable(getattr(ch3_checks, func, None)), f"exercises.ch3 has no {func}"
        assert re.search(rf"\bchecks\.{func}\(", chapter), (
            f"chapter 3 does not call {func}"
        )


def test_guide_covers_every_chapter_and_both_formats():
    text = GUIDE.read_text()
    for n in range(6):
        assert re.search(rf"^### Chapter {n}\b", text, re.MULTILINE), (
            f"no section for Chapter {n}"
        )
    assert "### One-day workshop" in text and "### 90-minute taster" in text
    assert "{{ jax_floor }}" in text, (
        "the supported range must come from the jax_floor substitution"
    )
    for chapter in book.chapter_sources():
        stem = chapter.stem
        assert f"](chapters/{stem}.md)" in text, (
            f"the guide does not link {chapter.name}: give it a section"
        )
        if stem in CHAPTER_MODULES and stem != "00_setup":
            section = re.search(
                rf"^### Chapter {int(stem[:2])}\b.*?(?=^### |^## |\Z)",
                text,
                re.MULTILINE | re.DOTALL,
            )
            assert section and "had not landed" not in section.group(0), (
                f"{chapter.name} exists now: align its section of the guide with it and drop the 'had not landed' note"
            )


def test_chapter2_checkers_the_guide_names_exist_and_the_chapter_calls_them():
    """Chapter 2's checkers live in beyondgrad.exercises.ch2, imported as ``ex2``."""
    named = sorted(set(re.findall(r"`ex2\.(check_\w+)`", GUIDE.read_text())))
    assert named == [
        "check_jacobian_strategy",
        "check_rebuilt_jacrev",
        "check_transpose",
    ]
    chapter = (book.CHAPTERS / "02_linearize_transpose.md").read_text()
    assert "from beyondgrad.exercises import ch2 as ex2" in chapter
    for func in named:
        assert callable(getattr(ex2, func, None)), (
            f"the guide names ex2.{func}, which does not exist"
        )
        assert re.search(rf"\bex2\.{func}\(", chapter), (
            f"the chapter does not call ex2.{func}"
        )


def test_chapter5_checkers_the_guide_names_exist_and_the_chapter_calls_them():
    """Chapter 5's checkers live in beyondgrad.exercises.ch5 (imported as ex5)."""
    named = sorted(set(re.findall(r"`exercises\.ch5\.(check_\w+)`", GUIDE.read_text())))
    assert named == sorted(n for n in ex5.__all__ if n.startswith("check_"))
    chapter = (book.CHAPTERS / "05_laplacians.md").read_text()
    for func in named:
        assert re.search(rf"\bex5\.{func}\(", chapter), (
            f"05_laplacians.md does not call ex5.{func}"
        )


# ------------------------------------------------------------------ the answer key

ANSWER_KEY = book.ROOT / "answer_key.md"
ANSWER_KEY_HEAD = """# Answer key

Every exercise's solution, for instructors: the code of the chapters' solution cells
(tagged `solution`), collected on one page to print or to use without a kernel. Each
solution ends with its checker call, which prints the check and the tolerance. The
common wrong answers and what the checkers print for them are in the
[instructor guide](instructor_guide.md). This page is generated from the chapters:
after changing a solution, run
`PYTHONPATH=src:. python tests/test_instructor_guide.py --write-answer-key`.
"""


def render_answer_key() -> str:
    """The answer-key page, generated from the solution cells of the chapters."""
    parts = [ANSWER_KEY_HEAD]
    for source in book.chapter_sources():
        nb = book._read_chapter(source)
        cells = [c for c in nb.cells if book.is_solution(c)]
        if not cells:
            continue
        title = next(
            (
                line[2:].strip()
                for c in nb.cells
                if c.cell_type == "markdown"
                for line in c.source.splitlines()
                if line.startswith("# ")
            ),
            source.stem,
        )
        parts.append(f"\n## {title}\n\nChapter page: [](chapters/{source.stem}.md).\n")
        seen: set[str] = set()
        for cell in cells:
            exercise = book.solution_exercise(cell.source)
            if exercise not in seen:
                parts.append(f"\n### Exercise {exercise}\n")
                seen.add(exercise)
            parts.append(f"\n```python\n{cell.source.strip()}\n```\n")
    return "".join(parts)


def test_answer_key_is_the_chapters_solutions():
    """answer_key.md holds exactly the solution cells of the chapters, in order."""
    want = render_answer_key()
    assert ANSWER_KEY.exists(), (
        "answer_key.md is missing: run this file with --write-answer-key"
    )
    assert ANSWER_KEY.read_text() == want, (
        "answer_key.md differs from the chapters' solution cells: "
        "PYTHONPATH=src:. python tests/test_instructor_guide.py --write-answer-key"
    )
    toc = (book.ROOT / "_toc.yml").read_text()
    assert "file: answer_key" in toc


if __name__ == "__main__":
    import sys

    if "--write-answer-key" in sys.argv:
        ANSWER_KEY.write_text(render_answer_key())
        print(f"wrote {ANSWER_KEY}")


# ------------------------------------------------- timings, and errors the guide names


def _minutes(pattern: str, text: str) -> list[int]:
    return [int(m) for m in re.findall(pattern, text)]


def _pages(n: int) -> list:
    """The pages of chapter ``n`` in reading order (chapter 3 spans 03 and 03b)."""
    return sorted(book.CHAPTERS.glob(f"0{n}*_*.md"))


def _chapter_text(n: int) -> str:
    return "".join(page.read_text() for page in _pages(n))


def _exercise_statements(n: int) -> str:
    """The ``## Exercises`` sections of chapter ``n``'s pages, in reading order."""
    return "".join(page.read_text().split("## Exercises")[-1] for page in _pages(n))


def _chapter_sections(text: str) -> dict[int, str]:
    return {
        int(m.group(1)): m.group(0)
        for m in re.finditer(
            r"^### Chapter (\d)\b.*?(?=^### |^## |\Z)", text, re.M | re.S
        )
    }


def test_workshop_timings_add_up():
    """The day's table is contiguous; each chapter's row lasts its section's Time; each
    Time is demo + exercises; the exercises' minutes are the statements' minutes."""
    text = GUIDE.read_text()
    table = text.split("### One-day workshop")[1].split("### 90-minute taster")[0]
    rows = re.findall(r"^\| (\d+):(\d\d)–(\d+):(\d\d) \| ([^|]+)\|", table, re.M)
    assert rows, "no rows in the workshop table"
    spans = [
        (int(h1) * 60 + int(m1), int(h2) * 60 + int(m2), what.strip())
        for h1, m1, h2, m2, what in rows
    ]
    for (_, end, what), (start, _, nxt) in zip(spans, spans[1:]):
        assert end == start, f"the table jumps from {what} (ends {end}) to {nxt}"
    sections = _chapter_sections(text)
    for start, end, what in spans:
        m = re.fullmatch(r"Chapter (\d)", what)
        if not m:
            continue
        n = int(m.group(1))
        times = _minutes(r"\*\*Time:\*\* (\d+)", sections[n])
        if n == 0:
            assert end - start <= 20
            continue
        assert times and times[0] == end - start, (
            f"Chapter {n}: the table gives {end - start} min, its section {times}"
        )
        split = re.search(
            r"\*\*Time:\*\* (\d+) minutes[^(]*\((\d+) demo[^,;]*[,;]\s+(\d+) exercises",
            sections[n],
        )
        assert split, f"Chapter {n}: Time without a demo/exercises split"
        total, demo, exercises = map(int, split.groups())
        assert demo + exercises == total, (
            f"Chapter {n}: {demo} + {exercises} != {total}"
        )
        listed = sections[n].split("**Exercises, in order")[1].split("- **Mistakes")[0]
        assert sum(_minutes(r"\((\d+) min", listed)) == exercises, (
            f"Chapter {n}: the exercises listed do not sum to {exercises} min"
        )
        stated = sum(_minutes(r"\((?:about )?(\d+) minutes", _exercise_statements(n)))
        assert stated == exercises, (
            f"Chapter {n}: the statements sum to {stated} min, the guide {exercises}"
        )
    head = re.search(r"about (\S+) hours of teaching, (\S+) with breaks", text)
    assert head
    teaching = sum(
        e - s for s, e, w in spans if w.startswith("Chapter") or w == "close"
    )
    day = spans[-1][1] - spans[0][0]
    frac = {"": 0, "¼": 15, "½": 30, "¾": 45}

    def as_minutes(words: str) -> int:
        return int(words.rstrip("¼½¾")) * 60 + frac[words.lstrip("0123456789")]

    assert abs(as_minutes(head.group(1)) - teaching) <= 10, (head.group(1), teaching)
    assert abs(as_minutes(head.group(2)) - day) <= 10, (head.group(2), day)


def test_three_hour_plan_adds_up():
    """The 3-hour table is contiguous from 0:00 to 3:00; each chapter row is its demo
    plus the exercises it names, each with its statement's minutes; the measured time
    to run the student notebook down to its exercises fits in the demo (students run it
    while the demo goes on), and the notebook exists."""
    text = GUIDE.read_text()
    table = re.split(r"\n##", text.split("### Three-hour workshop")[1])[0]
    rows = re.findall(
        r"^\| (\d+):(\d\d)–(\d+):(\d\d) \| ([^|]+)\| ([^|]*)\| ([^|]*)\|",
        table,
        re.M,
    )
    assert rows, "no rows in the three-hour table"
    spans = [
        (int(h1) * 60 + int(m1), int(h2) * 60 + int(m2), what.strip(), ex, run)
        for h1, m1, h2, m2, what, ex, run in rows
    ]
    assert spans[0][0] == 0 and spans[-1][1] == 180, "the plan is not 3 hours"
    for a, b in zip(spans, spans[1:]):
        assert a[1] == b[0], f"the table jumps from {a[2]} to {b[2]}"
    chapters = set()
    for start, end, what, ex, run in spans:
        m = re.fullmatch(r"Chapter (\d)", what)
        if not m:
            continue
        n = int(m.group(1))
        chapters.add(n)
        notebook = next((book.ROOT / "notebooks" / "student").glob(f"0{n}_*.ipynb"))
        seconds = re.fullmatch(r"\s*(\d+) s\s*", run)
        assert seconds, f"Chapter {n}: no measured notebook time in {run!r}"
        if n == 0:
            continue
        demo = re.search(r"demo (\d+)", ex)
        assert demo, f"Chapter {n}: no demo minutes in {ex!r}"
        assert int(seconds.group(1)) <= int(demo.group(1)) * 60 // 2, (
            f"Chapter {n}: {notebook.name} takes {seconds.group(1)} s to its "
            f"exercises, more than half the {demo.group(1)}-minute demo"
        )
        named = re.findall(rf"\b{n}\.(\d) \((\d+)\)", ex)
        assert named, f"Chapter {n}: no exercises in {ex!r}"
        stated = _minutes(r"\((?:about )?(\d+) minutes", _exercise_statements(n))
        for k, minutes in named:
            assert stated[int(k) - 1] == int(minutes), (
                f"exercise {n}.{k}: the plan gives {minutes} min, its statement "
                f"{stated[int(k) - 1]}"
            )
        used = int(demo.group(1)) + sum(int(mm) for _, mm in named)
        assert used == end - start, f"Chapter {n}: {used} min in a {end - start} row"
    assert {0, 1, 2, 4, 6} <= chapters, chapters


def test_every_error_the_guide_names_is_on_its_chapter_page():
    """Each ``FooError`` a chapter section of the guide names appears in that chapter's
    source (a ``%%raises`` cell or its text) or in what its checkers print (quoted
    above), so the guide never names an error the page does not show."""
    text = GUIDE.read_text()
    quoted = " ".join(f"{m.quote} {m.then}" for m in MISTAKES)
    # and the marked quotes, each checked against what its wrong answer prints
    quoted += " " + " ".join(quote for _, quote in MARKED)
    for n, section in _chapter_sections(text).items():
        # Chapter 0 describes install failures that its page cannot show
        if n == 0:
            continue
        source = _chapter_text(n)
        for name in sorted(set(re.findall(r"\b([A-Z]\w*Error)\b", section))):
            assert name in source or name in quoted, (
                f"the guide's Chapter {n} names {name}, which chapter {n} never shows"
            )


def test_guide_says_how_to_recover_a_hung_kernel():
    text = normalized(GUIDE.read_text())
    assert "Runtime → Restart session" in text and "does not stop it" in text
    chapter = (book.CHAPTERS / "01_tracers.md").read_text().split("## Exercises")[-1]
    assert "Runtime → Restart session" in chapter and "while_loop" in chapter


# ------------------------------------------------------ what a student sees first
#
# A quote in the guide can be tied to the wrong answer that produces it: an inline
# comment ``<!-- first-message: NAME -->`` right before the quote (the next code span,
# single or double backticks). The test runs NAME's wrong answer and asserts that the
# quote is in the FIRST thing the student sees: a checker's first message (or its
# only line, for an unattempted stub), the first failing line of the setup check, the
# install cell's sentence. NAME is a Mistake above or an entry of FIRST_SEEN below.

MARKER = re.compile(
    r"<!--\s*first-message:\s*(?P<name>[\w-]+)\s*-->\s*(?P<ticks>`{1,2})(?P<quote>.+?)(?P=ticks)",
    re.S,
)


def first_message(feedback) -> str:
    """The first line a student reads in a checker's verdict that says what is wrong
    (the not-attempted line of a stub, else the first message)."""
    if not feedback.attempted or not feedback.messages:
        return str(feedback).splitlines()[0]
    return feedback.messages[0]


def _setup_too_few_devices() -> str:
    from beyondgrad import runtime

    have = len(jax.devices("cpu"))
    failed = [c for c in runtime.check_setup(have + 1) if not c.ok]
    return failed[0].fix.replace(str(have + 1), str(runtime.BOOK_DEVICE_COUNT))


def _install_below_floor() -> str:
    import importlib.metadata
    import importlib.util
    import sys
    import types

    class Dist:
        metadata, version = {"Name": "jax"}, "0.7.2"

    saved = (importlib.util.find_spec, importlib.metadata.distributions)
    sys.modules["google.colab"] = types.ModuleType("google.colab")
    importlib.util.find_spec = lambda name, *a: None
    importlib.metadata.distributions = lambda: [Dist()]
    try:
        exec(book.colab_install_cell(), {})
    except SystemExit as stopped:
        return str(stopped)
    finally:
        importlib.util.find_spec, importlib.metadata.distributions = saved
        del sys.modules["google.colab"]
    raise AssertionError("the install cell did not stop below the floor")


def _python_loop_never_ends() -> str:
    from beyondgrad.exercises import ch2

    def endless(v):
        while True:
            v = v + 1

    # a real checker with its real budget (CHECK_LIMIT, 30 s): what the guide quotes
    return first_message(ch2.check_transpose(endless))


def _compiled_loop_message() -> str:
    from beyondgrad import exercises

    # The message a checker gives when the answer's thread still runs after the stop
    # (running an endless compiled loop here would keep a core busy until the process
    # ends; tests/test_time_limit_loaded.py runs one in a subprocess): its wording.
    return exercises._timeout_message(
        "your answer", exercises.CHECK_LIMIT, exercises.CHECK_LIMIT + 1.0, stopped=False
    )


def _ch3_starter() -> str:
    """The chapter's 3.3 cell before any edit: the starter, under its own name."""

    def suspicious_grad(b):
        return _loose_tolerance_grad(b)  # the starter's series, a converged solve

    with jax.enable_x64(True):
        fb = ch3_checks.check_tolerance_fix(suspicious_grad, seed=0)
    return str(fb).splitlines()[0]


def _axis_i_psum(xb):
    row_sums = lax.psum(jnp.sum(xb, axis=1), "i")
    return lax.fori_loop(0, 3, _ch4_body_with(row_sums), jnp.zeros_like(xb[:, 0]))


def _ch4_body_with(row_sums):
    return lambda k, acc: acc + (k + 1) * row_sums


# ------------------------------------------------------------------ chapter 6


def _ch6_clip(scale=3.0, local_median=False, local_mad=False, std=False):
    """Exercise 6.1's answer with one slip or more (as the chapter writes clip)."""

    def clip(e_l):
        everyone = lax.all_gather(e_l, "data", tiled=True)
        median = jnp.median(e_l) if local_median else jnp.median(everyone)
        mad = jnp.mean(jnp.abs(e_l - median))
        if std:
            mad = jnp.std(everyone)
        elif not local_mad:
            mad = lax.pmean(mad, "data")
        return jnp.clip(e_l, median - scale * mad, median + scale * mad)

    return clip


def _ch6_uncast(w, x):
    return jax.vmap(jax.grad(ex6.toy_log_psi), in_axes=(None, 0))(w, x)


def _ch6_uncast_first(raises: bool) -> str:
    """The first message for exercise 6.2 without the cast, on the end where the
    answer raises (``raises``) or returns sums over devices; skipped on the other."""
    fb = ex6.check_per_walker_grads(_ch6_uncast, seed=1)
    if ("TypeError" in str(fb)) != raises:
        pytest.skip(
            f"JAX {jax.__version__}: the uncast answer "
            + ("returns values" if raises else "raises")
            + " here (the guide quotes each end's message)"
        )
    return first_message(fb)


FIRST_SEEN: dict[str, Callable[[], str]] = {
    "ch6-local-median": lambda: first_message(
        ex6.check_clip(_ch6_clip(local_median=True), seed=0)
    ),
    "ch6-chapter-scale": lambda: first_message(
        ex6.check_clip(_ch6_clip(scale=2.0), seed=0)
    ),
    "ch6-local-mad": lambda: first_message(
        ex6.check_clip(_ch6_clip(local_mad=True), seed=0)
    ),
    "ch6-std": lambda: first_message(ex6.check_clip(_ch6_clip(std=True), seed=0)),
    "ch6-uncast-sum": lambda: _ch6_uncast_first(raises=False),
    "ch6-uncast-raises": lambda: _ch6_uncast_first(raises=True),
    "ch3-starter": _ch3_starter,
    **{m.name: (lambda m=m: first_message(m.check())) for m in MISTAKES},
    "setup-too-few-devices": _setup_too_few_devices,
    "install-below-floor": _install_below_floor,
    "python-loop-never-ends": _python_loop_never_ends,
    "compiled-loop-never-ends": _compiled_loop_message,
    "ch4-axis-i-psum": lambda: first_message(ch4.check_two_axis_carry(_axis_i_psum)),
}


def marked_quotes(text: str) -> list[tuple[str, str]]:
    return [(m["name"], normalized(m["quote"])) for m in MARKER.finditer(text)]


def test_marked_quotes_are_found():
    text = "prints <!-- first-message: a-b --> ``x `y` z``, and <!-- first-message: c -->\n `w`"
    assert marked_quotes(text) == [("a-b", "x `y` z"), ("c", "w")]


MARKED = marked_quotes(GUIDE.read_text())


def test_the_guide_marks_its_general_quotes():
    assert {"stub", "setup-too-few-devices", "install-below-floor"} <= {
        n for n, _ in MARKED
    }


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name, quote", [_case((n, q), n) for n, q in MARKED])
def test_a_marked_quote_is_what_the_student_sees_first(name, quote):
    assert name in FIRST_SEEN, (
        f"instructor_guide.md marks a quote with {name!r}, which names no wrong answer "
        "in tests/test_instructor_guide.py (a Mistake or FIRST_SEEN)"
    )
    seen = normalized(FIRST_SEEN[name]())
    if name == "stub":
        seen = re.sub(r"Exercise \d+\.\d+ \([^)]*\)", "Exercise N.k", seen)
    assert comparable(quote) in seen, (
        f"the guide quotes {quote!r} for {name!r}, but what the student sees first "
        f"is:\n{seen}"
    )


def test_the_time_limit_quotes_are_quotes_of_the_guide():
    """Each name of TIME_LIMIT_QUOTES is a case above (a renamed one would run in
    every environment again, silently)."""
    names = {m.name for m in MISTAKES} | {n for n, _ in MARKED}
    assert TIME_LIMIT_QUOTES <= names, TIME_LIMIT_QUOTES - names
