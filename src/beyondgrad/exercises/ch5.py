"""Chapter 5's exercise checkers (Laplacians of log|det|).

* :func:`check_fl_multiply` (5.1): the forward-Laplacian rule for an elementwise
  product, compared part by part with ``jax.hessian`` in float64.
* :func:`check_row_update_second_derivative` (5.2): the second derivative of
  ``log|det(A + t e_i u^T)|`` at ``t = 0``, compared with JAX's in float64.
* :func:`check_sharded_kinetic_step` (5.3): a ``shard_map`` body over the mesh axis
  ``"data"`` (8 devices) returning the global mean kinetic energy and its parameter
  gradient, compared with one device.

Each returns a :class:`~beyondgrad.exercises.Feedback`; a bare stub is reported as not
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

from beyondgrad import exercises as ex

__all__ = [
    "ELECTRONS",
    "FL_DIM",
    "FL_POINTS",
    "FL_ATOL",
    "FL_RTOL",
    "MESH_AXIS",
    "ROW_MATRICES",
    "ROW_ATOL",
    "ROW_RTOL",
    "SHARDED_DEVICES",
    "SOLUTION_ERROR_BOUND",
    "STEP_ATOL",
    "STEP_RTOL",
    "WALKERS_PER_DEVICE",
    "check_fl_multiply",
    "check_row_update_second_derivative",
    "check_sharded_kinetic_step",
]

#: The mesh axis the sharded exercise runs over, and its size.
MESH_AXIS = "data"
SHARDED_DEVICES = 8
#: Exercise 5.3: walkers per device, and electrons per walker.
WALKERS_PER_DEVICE = 2
ELECTRONS = 3
#: Exercise 5.1: number of variables, and number of points checked.
FL_DIM = 5
FL_POINTS = 3
#: Exercise 5.2: number of (matrix, row, update) cases checked.
ROW_MATRICES = 3

Triple = tuple[jax.Array, jax.Array, jax.Array]

#: Accuracy required (the statements quote them): ``|got - want| <= atol + rtol |want|``
#: entrywise, float64. Measured worst errors of correct answers (JAX 0.8.2 and 0.12):
#: 5.1, the book's formula: 8.8e-16 relative on entries above 1e-2 (9.2e-15 on one
#: entry of size 1.4e-3, absolute 1.3e-17); 5.2, the solution, ``inv`` and autodiff
#: answers: 6.5e-16 relative; 5.3, the solution (a basis loop) and a ``jax.hessian``
#: answer: absolute 5.5e-13 (relative up to 1.2e-11 on entries below 0.05, 3.4e-14 on
#: the largest). Each tolerance is about 10x the worst of these; the tests pin each one
#: (an answer 3x the tolerance off is rejected, one 0.3x off accepted).
#: The book's solutions to 5.1 and 5.2 agree with the references to better than this.
SOLUTION_ERROR_BOUND = 1e-14
FL_RTOL, FL_ATOL = 1e-14, 1e-16
ROW_RTOL, ROW_ATOL = 5e-15, 1e-16
STEP_RTOL, STEP_ATOL = 1e-11, 5e-12


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


@functools.lru_cache(maxsize=1)
def _fl_cases() -> list[tuple[Triple, Triple, Triple]]:
    d, m = FL_DIM, 4
    w = jnp.sin(jnp.arange(d * m, dtype=jnp.float64)).reshape(d, m)
    c = jnp.cos(jnp.arange(m, dtype=jnp.float64))
    s = jnp.linspace(0.5, 1.5, m, dtype=jnp.float64)
    vw = jnp.cos(jnp.arange(d * m, dtype=jnp.float64) * 0.7).reshape(d, m)

    def u(x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w + c)

    def v(x: jax.Array) -> jax.Array:
        return jnp.exp(-0.5 * s * jnp.sum(x * x)) + x @ vw

    def uv(x: jax.Array) -> jax.Array:
        return u(x) * v(x)

    points = [jnp.linspace(-1.0, 1.0, d), 0.3 * jnp.ones(d), jnp.linspace(0.8, -0.4, d)]
    assert len(points) == FL_POINTS
    triples = jax.jit(lambda x: (_triple(u, x), _triple(v, x), _triple(uv, x)))
    return [triples(x) for x in points]


def _fl_hints(got: Any, a: Triple, b: Triple) -> list[str]:
    """Pointed messages for the usual slips in the product rule."""
    (u, gu, lu), (v, gv, lv) = a, b
    hints = []
    no_cross = lu * v + u * lv
    cross = jnp.sum(gu * gv, axis=0)
    if _close(got[2], no_cross, 1e-6):
        hints.append(
            "your Laplacian is u*lv + v*lu: it misses the cross term 2 (grad u . grad v), "
            "summed over the d inputs"
        )
    elif _close(got[2], no_cross + cross, 1e-6):
        hints.append(
            "your Laplacian has the cross term grad u . grad v once; it needs 2x"
        )
    if _close(got[1], gu * v, 1e-6) or _close(got[1], u * gv, 1e-6):
        hints.append(
            "your gradient has one half of the product rule: it is gu*v + u*gv"
        )
    return hints


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


def check_fl_multiply(fn: Callable[..., Any], strict: bool = False) -> ex.Feedback:
    """Exercise 5.1: ``fn((u, gu, lu), (v, gv, lv))`` is the triple of ``u * v``.

    Checks the value, gradient ``(d, m)`` and Laplacian ``(m,)`` at three points, each
    against ``jax.hessian`` of the product in float64, to :data:`FL_RTOL` (relative) plus :data:`FL_ATOL`.
    """
    name = "Exercise 5.1 (forward Laplacian of a product)"
    problems: list[str] = []
    with jax.enable_x64(True):
        zeros = (jnp.zeros(4), jnp.zeros((5, 4)), jnp.zeros(4))
        early = _start(name, fn, "my_fl_multiply", (zeros, zeros), strict)
        if early is not None:
            return early
        for k, (a, b, want) in enumerate(_fl_cases()):
            got = ex.call_answer(fn, a, b, what="your function")
            early = ex.early_verdict(name, got, strict=strict)
            if early is not None:
                return early
            if not isinstance(got, (tuple, list)) or len(got) != 3:
                kind = type(got).__name__
                size = (
                    f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
                )
                problems.append(
                    f"return a triple (value, gradient, Laplacian), got a {kind}{size}"
                )
                break
            for part, got_part, want_part in zip(
                ("the value", "the gradient", "the Laplacian"), got, want
            ):
                problems += ex.tree_mismatches(
                    got_part,
                    want_part,
                    rtol=FL_RTOL,
                    atol=FL_ATOL,
                    name=f"at point {k}: {part}",
                    allow_python_scalars=False,
                )
            if problems:
                problems += _fl_hints(got, a, b)
                break
    return ex.verdict(
        name,
        problems,
        success=f"value, gradient and Laplacian of u*v match jax.hessian at {FL_POINTS} "
        f"points (float64, |error| <= {FL_ATOL:g} + {FL_RTOL:g}*|expected|)",
        strict=strict,
    )


# ---------------------------------------------------------------------------------------
# Exercise 5.2: the row update


@functools.lru_cache(maxsize=1)
def _row_cases() -> list[tuple[jax.Array, int, jax.Array, jax.Array]]:
    matrices = []
    cases = [(3, 0), (4, 2), (5, 4)]
    assert len(cases) == ROW_MATRICES
    for seed, (n, i) in enumerate(cases):
        ka, ku = jax.random.split(jax.random.key(seed))
        a = jax.random.normal(ka, (n, n), jnp.float64) + 2.0 * jnp.eye(n)
        u = jax.random.normal(ku, (n,), jnp.float64)
        matrices.append((a, i, u))

    def second_derivatives(cases: list) -> list[jax.Array]:
        out = []
        for a, i, u in cases:
            row = jnp.zeros_like(a).at[i].set(u)

            def along(
                t: jax.Array, a: jax.Array = a, row: jax.Array = row
            ) -> jax.Array:
                return jnp.linalg.slogdet(a + t * row).logabsdet

            out.append(jax.grad(jax.grad(along))(jnp.zeros((), a.dtype)))
        return out

    # one compilation for the three references; the rows i stay Python ints
    rows = [i for _, i, _ in matrices]
    wants = jax.jit(
        lambda arrays: second_derivatives(
            [(a, i, u) for (a, u), i in zip(arrays, rows)]
        )
    )([(a, u) for a, _, u in matrices])
    return [(a, i, u, w) for (a, i, u), w in zip(matrices, wants)]


def check_row_update_second_derivative(
    fn: Callable[..., Any], strict: bool = False
) -> ex.Feedback:
    """Exercise 5.2: ``fn(a, i, u)`` = d²/dt² log|det(A + t e_i uᵀ)| at t = 0.

    Compares the value with JAX's second derivative of ``slogdet`` for three
    matrices in float64, to :data:`ROW_RTOL` plus :data:`ROW_ATOL`. Any method is
    accepted.
    """
    name = "Exercise 5.2 (row update)"
    problems: list[str] = []
    with jax.enable_x64(True):
        probe = (jnp.eye(3), 0, jnp.ones(3))
        early = _start(name, fn, "my_row_second_derivative", probe, strict)
        if early is not None:
            return early
        for a, i, u, want in _row_cases():
            n = a.shape[0]
            got = ex.call_answer(fn, a, i, u, what="your function")
            early = ex.early_verdict(name, got, strict=strict)
            if early is not None:
                return early
            problems += ex.tree_mismatches(
                got,
                want,
                name=f"for n = {n}, row {i}: answer",
                rtol=ROW_RTOL,
                atol=ROW_ATOL,
                allow_python_scalars=False,
            )
            if problems:
                b = jnp.linalg.inv(a)
                if _close(got, -want, 1e-6):
                    problems.append(
                        "the sign is flipped: along a rank-one update of one row, "
                        "log|det| is concave, so the answer is -(u . A^{-1} e_i)^2 <= 0"
                    )
                elif _close(got, -((u @ b[i]) ** 2), 1e-6):
                    problems.append(
                        "you used row i of A^{-1}; the formula needs column i, A^{-1} e_i"
                    )
                break
    return ex.verdict(
        name,
        problems,
        success="matches JAX's second derivative of slogdet along the row update "
        f"({ROW_MATRICES} matrices, float64, |error| <= {ROW_ATOL:g} + "
        f"{ROW_RTOL:g}*|expected|)",
        strict=strict,
    )


# ---------------------------------------------------------------------------------------
# Exercise 5.3: a sharded kinetic-energy step


def _kinetic_problem() -> tuple[dict[str, jax.Array], jax.Array]:
    """Parameters and 16 walkers of 3 electrons, float64 (call under enable_x64)."""
    from beyondgrad import wavefunctions

    params = wavefunctions.init_params(
        jax.random.key(0), ELECTRONS, hidden=8, dtype=jnp.float64
    )
    shape = (WALKERS_PER_DEVICE * SHARDED_DEVICES, ELECTRONS, 3)
    walkers = jax.random.normal(jax.random.key(1), shape, jnp.float64)
    return params, walkers


@functools.lru_cache(maxsize=1)
def _kinetic_reference() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Mean kinetic energy and its parameter gradient on one device, in float64.

    The Laplacian is the hand-derived one (``wavefunctions.mlp_slater_laplacian``), which
    shares no code with the autodiff methods a student uses.
    """
    from beyondgrad import wavefunctions

    with jax.enable_x64(True):
        params, walkers = _kinetic_problem()

        def mean_kinetic(p: dict[str, jax.Array]) -> jax.Array:
            def kinetic(x: jax.Array) -> jax.Array:
                _, grad, lap = wavefunctions.mlp_slater_laplacian(p, x)
                return -0.5 * (lap + jnp.sum(grad * grad))

            return jnp.mean(jax.vmap(kinetic)(walkers))

        energy, grad = jax.jit(jax.value_and_grad(mean_kinetic))(params)
        return np.asarray(energy), jax.tree.map(np.asarray, grad)


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


def check_sharded_kinetic_step(
    fn: Callable[..., Any], strict: bool = False
) -> ex.Feedback:
    """Exercise 5.3: ``fn(params, walkers)`` as the body of a ``shard_map`` over ``"data"``.

    Runs ``jax.shard_map(fn, in_specs=(P(), P("data")), out_specs=P(),
    check_vma=True)`` on 8 devices for 16 walkers of 3 electrons and compares
    ``(mean kinetic energy, its gradient)`` with a one-device reference, all in
    float64, to :data:`STEP_RTOL` plus :data:`STEP_ATOL`. Values only: any correct Laplacian passes.
    """
    from jax.sharding import PartitionSpec as P

    from beyondgrad import runtime

    name = "Exercise 5.3 (sharded kinetic step)"
    msg = ex.require_callable(fn, "my_sharded_kinetic_step")
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    mesh = runtime.demo_mesh(SHARDED_DEVICES, MESH_AXIS)
    step = jax.jit(
        jax.shard_map(
            fn,
            mesh=mesh,
            in_specs=(P(), P(MESH_AXIS)),
            out_specs=P(),  # every output invariant
            check_vma=True,
        )
    )
    with jax.enable_x64(True):
        params, walkers = _kinetic_problem()
        got = ex.call_answer(step, params, walkers, what="your step inside shard_map")
    if ex.is_stub(got):
        return ex.verdict(name, [], attempted=False, strict=strict)
    failure = ex.failed(got)
    if failure:
        return ex.verdict(name, [_mesh_hint(failure)], strict=strict)
    want = _kinetic_reference()
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return ex.verdict(
            name,
            [
                f"return a pair (mean kinetic energy, gradient), got {type(got).__name__}"
            ],
            strict=strict,
        )
    problems, grad_problems = [
        ex.tree_mismatches(
            part,
            ref,
            rtol=STEP_RTOL,
            atol=STEP_ATOL,
            name=label,
            allow_python_scalars=False,
        )
        for part, ref, label in zip(got, want, ("the energy", "the gradient"))
    ]
    ratio = _signed_ratio(got[0], want[0]) if problems else None
    if ratio is not None and abs(ratio - 1) > 1e-3:
        problems.append(
            f"your energy is {ratio:+.4g} x the mean over all {walkers.shape[0]} walkers"
            + (
                f": divide the psum of the sums by the global count ({walkers.shape[0]})"
                if abs(ratio - SHARDED_DEVICES) < 1e-2
                or abs(ratio * SHARDED_DEVICES - 1) < 1e-2
                else ""
            )
        )
    if grad_problems:
        ratio = _signed_ratio(got[1], want[1])
        if ratio is not None and abs(ratio - 1) > 1e-3:
            note = f"your gradient is {ratio:+.4g} x the single-device gradient"
            if abs(ratio - SHARDED_DEVICES) < 1e-2:
                note += (
                    f" ({SHARDED_DEVICES} devices): the device-count bug; the gradient of "
                    "the invariant params is already summed over devices, so no psum/pmean "
                    "of it, and the loss must be the global mean"
                )
            grad_problems = [*grad_problems[:1], note]
    problems += grad_problems
    return ex.verdict(
        name,
        problems,
        success=f"runs in shard_map over {MESH_AXIS!r} ({SHARDED_DEVICES} devices, "
        "check_vma=True); energy and gradient match one device (float64, |error| <= "
        f"{STEP_ATOL:g} + {STEP_RTOL:g}*|expected|)",
        strict=strict,
    )
