"""Chapter 2's exercise checkers: a hand transpose, ``jacrev`` rebuilt, the cost model.

* Exercise 2.1: :func:`check_transpose` — the transpose of
  :func:`exercise_linear_map`, a linear map computed on the host with NumPy
  (``jax.pure_callback``), which JAX can neither differentiate nor transpose: the
  student must write it.
* Exercise 2.2: :func:`check_rebuilt_jacrev` — the Jacobian of a pytree-valued
  function with vector and matrix outputs, at drawn sizes, built without ``jax.jacrev``,
  ``jacfwd``, ``jacobian``, ``hessian``, ``grad``, ``value_and_grad``, ``vjp``'s
  backward function or ``jvp`` (those raise while the answer runs, also under a name
  imported before; ``jax.linearize`` and ``jax.linear_transpose`` run), by rows: the
  linearized map may only be transposed, and an answer that applies it (the Jacobian
  by columns) is refused with :data:`COLUMNS_MESSAGE`.
* Exercise 2.3: :func:`check_jacobian_strategy` — ``"jacfwd"`` or ``"jacrev"`` for
  each case of :func:`strategy_cases`, graded on the cost model (passes = input size for
  ``jacfwd``, output size for ``jacrev``), never on a clock.

Every checker prints "not attempted yet" for a bare stub and raises only with
``strict=True``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import compat, linear
from beyondgrad import exercises as ex
from beyondgrad.linear import PyTree

__all__ = [
    "COLUMNS_MESSAGE",
    "DOT_PRODUCT_TOL",
    "EXERCISE_MAP_SIZE",
    "JACREV_BANNED",
    "JACREV_RTOL",
    "SUMMED_OUTPUTS_MESSAGE",
    "SUMMED_ROWS_MESSAGE",
    "TRANSPOSE_BANNED",
    "TRANSPOSE_RTOL",
    "check_jacobian_strategy",
    "check_rebuilt_jacrev",
    "check_transpose",
    "exercise_linear_map",
    "exercise_losses",
    "exercise_map_input",
    "strategy_cases",
]

# ------------------------------------------------------------------ exercise 2.1

#: Length of the vector ``x`` of :func:`exercise_linear_map`.
EXERCISE_MAP_SIZE = 6

#: The unit roundoff of float32, 2**-24 (defined once in beyondgrad.exercises).
F32_UNIT_ROUNDOFF = ex.F32_UNIT_ROUNDOFF

# Exercise 2.1, from a count of roundings (float32, u = 2**-24; a sum of m terms in any
# order, or any tree of m - 1 additions, errs by at most (m - 1) u sum |terms| to
# first order). The transpose is x'_j = sum_{i >= j} v_i - v_{j+1 mod n} and
# s' = sum_i w_i v_i, n = 6. A correct student may sum in another order, e.g.
# total - cumsum(v) + v - roll(v, -1): its terms are all v_i (the total), v_0..v_j
# (the prefix), v_j and v_{j+1}, so every reasonable formula's terms have magnitudes
# summing to at most S_j = 2 sum_i |v_i| + |v_{j+1}| (:func:`_transpose_scale`), with
# m <= 2n + 2 = 14 terms: error <= 13 u S_j. For s', S = sum_i |w_i v_i|: n products
# (n u S), n - 1 additions, and a weight rounded differently (jnp.linspace in float32
# against NumPy's, 1 u S): <= (2n) u S = 12 u S. The checker's reference (JAX's
# transpose of the map in jnp, float32) errs as much again, so a correct answer is
# within 26 u S of the reference entrywise. TRANSPOSE_RTOL = 64 u = 3.8e-6: 2.5x the
# bound. A slip (a term dropped, the shift not reversed, s unweighted) errs by the
# size of a drawn v_i, ~1e5 times more for all but freak draws. Measured, 2,000 seeds
# x 3 cotangents (JAX 0.12.0.1 and 0.8.2): the book's reverse-cumsum transpose and
# total - cumsum(v) + v - roll(v, -1) both within 2.9 u S_j of the reference (22x
# inside).
#: Exercise 2.1: each entry of a transpose must be within this times the sum of the
#: magnitudes of its terms, S_j (derived in the comment above).
TRANSPOSE_RTOL = 64 * F32_UNIT_ROUNDOFF
# Exercise 2.1's own dot-product test: |<f(a), b> - <a, f^T(b)>| for drawn a = (x, s) and
# b, both pairings accumulated in float64 (their rounding is ~1e-16 of D below, not
# counted). The host map's entry i, a sum of at most n + 2 terms (cumsum, the shift, s
# w_i), errs by <= (n + 1) u (|A| |a|)_i; the student's transpose entry j by <= 13 u
# S_j (above; S_6 = sum |w_i b_i| for s'). So the mismatch is at most
# (n + 1) u |b|^T |A| |a| + 13 u sum_j |a_j| S_j <= 20 u D, D = sum_j |a_j| S_j (since
# (|A|^T |b|)_j <= S_j), computed per draw in float64. DOT_PRODUCT_TOL = 64 u = 3.8e-6,
# 3.2x the bound. A transpose off by a factor 1 + e shows e |<a, f^T b>|, which for
# drawn vectors is a fraction of D, so slips far above rounding are caught. Measured,
# 2,000 seeds (both ends): <= 0.66 u D (97x inside).
#: Exercise 2.1: the checker's dot-product test allows this times ``D = sum_j |a_j| S_j``.
DOT_PRODUCT_TOL = 64 * F32_UNIT_ROUNDOFF


def _weights_np() -> np.ndarray:
    return np.linspace(1.0, 2.0, EXERCISE_MAP_SIZE, dtype=np.float32)


def _transpose_scale(v: Any) -> dict[str, np.ndarray]:
    """S of :data:`TRANSPOSE_RTOL` for the cotangent ``v``, float64: ``{"x": 2 sum
    |v| + |roll(v, -1)|, "s": sum |w v|}``, the magnitudes of the terms any reasonable
    formula for the transpose sums."""
    a = np.abs(np.asarray(v, np.float64))
    return {
        "x": 2 * a.sum() + np.roll(a, -1),
        "s": np.asarray(np.abs(_weights_np().astype(np.float64)) @ a),
    }


#: True while a student's transpose runs: the map raises then (exercise 2.1 asks for
#: its transpose without calling it, so not as a matrix built from its values).
_MAP_LOCKED = [False]
_MAP_LOCKED_MESSAGE = (
    "your transpose called ex2.exercise_linear_map: write the transpose from the "
    "map's formula, without calling the map (not from its values on basis vectors)"
)


def _map_on_host(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    if _MAP_LOCKED[0]:
        raise RuntimeError(_MAP_LOCKED_MESSAGE)
    x = np.asarray(x, np.float32)
    return (np.cumsum(x) - np.roll(x, 1) + np.float32(s) * _weights_np()).astype(
        np.float32
    )


def exercise_map_input() -> dict[str, jax.Array]:
    """Example input of :func:`exercise_linear_map`: zeros ``{x: f32[6], s: f32[]}``."""
    return {
        "x": jnp.zeros(EXERCISE_MAP_SIZE, jnp.float32),
        "s": jnp.zeros((), jnp.float32),
    }


def exercise_linear_map(p: Mapping[str, jax.Array]) -> jax.Array:
    """``{x: f32[6], s: f32[]} -> f32[6]``: ``cumsum(x) - roll(x, 1) + s * w``.

    ``w = linspace(1, 2, 6)``. Computed on the host with NumPy through
    ``jax.pure_callback``, so ``jax.linear_transpose`` and ``jax.vjp`` raise
    ``ValueError`` on it: its transpose has to be written by hand.
    """
    if _MAP_LOCKED[0]:
        raise RuntimeError(_MAP_LOCKED_MESSAGE)
    if not isinstance(p, Mapping) or set(p) != {"x", "s"}:
        raise TypeError("exercise_linear_map takes a dict {'x': f32[6], 's': f32[]}")
    x, s = jnp.asarray(p["x"], jnp.float32), jnp.asarray(p["s"], jnp.float32)
    if x.shape != (EXERCISE_MAP_SIZE,) or s.shape != ():
        raise ValueError(
            f"expected x: f32[6] and s: f32[], got {x.shape} and {s.shape}"
        )
    out = jax.ShapeDtypeStruct((EXERCISE_MAP_SIZE,), jnp.float32)
    return jax.pure_callback(_map_on_host, out, x, s, vmap_method="sequential")


def _map_in_jax(p: Mapping[str, jax.Array]) -> jax.Array:
    """The same map in jnp (the checker's reference transpose comes from it)."""
    w = jnp.asarray(_weights_np())
    return jnp.cumsum(p["x"]) - jnp.roll(p["x"], 1) + p["s"] * w


def _unwrap(result: Any) -> Any:
    if (
        isinstance(result, tuple)
        and len(result) == 1
        and isinstance(result[0], Mapping)
    ):
        return result[0]  # what jax.linear_transpose returns: a 1-tuple
    return result


def _dtype_problems(got: Any, name: str) -> list[str]:
    problems = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(got)[0]:
        dtype = getattr(leaf, "dtype", None)
        if (
            dtype is not None
            and np.issubdtype(dtype, np.floating)
            and dtype != np.float32
        ):
            where = f"{name}{jax.tree_util.keystr(path)}"
            problems.append(f"{where} has dtype {dtype}; the map works in float32")
    return problems


def _transpose_hint(got: Any, v: jax.Array, want: Mapping[str, jax.Array]) -> str:
    """What a wrong transpose most likely is, and what to change (never the answer)."""
    if isinstance(got, (tuple, list)):
        return (
            f"your transpose returns a {type(got).__name__}; return a dict "
            "{'x': ..., 's': ...}: a transpose's output has the structure of the map's "
            "input"
        )
    if not isinstance(got, Mapping) or set(got) != {"x", "s"}:
        return (
            "return a dict {'x': f32[6], 's': f32[]}: a transpose's output has the "
            "structure of the map's input"
        )
    gx, gs = np.asarray(got["x"], np.float64), np.asarray(got["s"], np.float64)
    wx, ws = np.asarray(want["x"], np.float64), np.asarray(want["s"], np.float64)
    if gx.shape != wx.shape or gs.shape != ws.shape:
        if gs.shape != ws.shape:
            return (
                f"your 's' has shape {gs.shape}: s is a scalar in the map's input, so "
                "its part of the transpose is one number (a sum over the output)"
            )
        return f"your 'x' has shape {gx.shape}; x is f32[{EXERCISE_MAP_SIZE}]"
    if not (np.all(np.isfinite(gx)) and np.all(np.isfinite(gs))):
        return ""  # the nan/inf message says it
    vn = np.asarray(v, np.float64)
    both = np.concatenate([gx, gs[None]])
    right = np.concatenate([wx, ws[None]])
    near = lambda a, b: bool(  # noqa: E731
        np.allclose(a, b, rtol=1e-4, atol=1e-4 * max(1.0, float(np.max(np.abs(b)))))
    )
    factor = float(both @ right / (right @ right)) if right @ right else 1.0
    if abs(factor - 1) > 1e-3 and near(both, factor * right):
        return (
            f"your transpose is {factor:.4g} times the right one: a constant factor "
            "is missing or extra (a transpose carries no scaling of its own)"
        )
    # Which part is wrong is the checker's own verdict (TRANSPOSE_RTOL x S_j), so a
    # rejected part always gets a line; `near` only recognises which slip it is.
    scale = _transpose_scale(vn)
    wrong = {
        part: bool(np.any(np.abs(g - w) > TRANSPOSE_RTOL * scale[part]))
        for part, g, w in (("x", gx, wx), ("s", gs, ws))
    }
    said = []
    if wrong["x"]:
        cum = {
            "right": np.cumsum(vn[::-1])[::-1],
            "cumsum": np.cumsum(vn),
            "none": np.zeros_like(vn),
        }
        rolls = {
            "right": -np.roll(vn, -1),
            "same": -np.roll(vn, 1),
            "sign": np.roll(vn, -1),
            "none": np.zeros_like(vn),
        }
        found = [
            (c, r)
            for c in cum
            for r in rolls
            if (c, r) != ("right", "right") and near(gx, cum[c] + rolls[r])
        ]
        if not found:
            said.append(
                "the 'x' part is wrong: transpose cumsum and roll(x, 1) one at a time "
                "and check each with linear.dot_product_test"
            )
        else:
            c, r = found[0]
            if c == "cumsum":
                said.append(
                    "your 'x' part uses cumsum(v): cumsum is not its own transpose "
                    "(its matrix is lower triangular, the transpose's upper): "
                    "transpose it on its own and check it with linear.dot_product_test"
                )
            if c == "none":
                said.append("your 'x' part has no term for cumsum(x)")
            if r == "same":
                said.append(
                    "your 'x' part uses roll(v, 1), the map's own shift: the transpose "
                    "of a shift shifts the other way"
                )
            if r == "sign":
                said.append(
                    "your roll term has the wrong sign: the map subtracts roll(x, 1), "
                    "and a transpose keeps each term's sign"
                )
            if r == "none":
                said.append("your 'x' part has no term for - roll(x, 1)")
    if wrong["s"]:
        w = _weights_np().astype(np.float64)
        if not np.any(gs):
            said.append(
                "your 's' is 0, but s changes the output (by s * w): the transpose's "
                "'s' is not zero; transpose the map s -> s * w on its own"
            )
        elif near(gs, vn.sum()):
            said.append(
                "your 's' is sum(v): s enters the map multiplied by w = "
                "linspace(1, 2, 6), and its transpose must weigh v by w too"
            )
        elif near(gs, -ws):
            said.append("your 's' has the wrong sign: s enters the map as + s * w")
        elif near(gs, w[::-1] @ vn):
            said.append("your 's' weighs v with w reversed: w is linspace(1, 2, 6)")
        else:
            said.append(
                "your 's' is wrong: transpose the map s -> s * w on its own and check "
                "it with linear.dot_product_test"
            )
    return "; ".join(said) if said else ""


def _right_transpose(v: jax.Array) -> dict[str, jax.Array]:
    w = jnp.asarray(_weights_np())
    return {"x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, -1), "s": jnp.vdot(w, v)}


#: Wrong transposes a student's dot-product test must reject (exercise 2.1), each
#: with what it gets wrong: the usual slips, one per part of the map.
DOT_TEST_WRONG: dict[str, Callable[[jax.Array], dict[str, jax.Array]]] = {
    "cumsum kept as cumsum": lambda v: {
        **_right_transpose(v),
        "x": jnp.cumsum(v) - jnp.roll(v, -1),
    },
    "roll(v, 1) not reversed": lambda v: {
        **_right_transpose(v),
        "x": jnp.cumsum(v[::-1])[::-1] - jnp.roll(v, 1),
    },
    "'s' left at 0": lambda v: {**_right_transpose(v), "s": jnp.zeros((), v.dtype)},
    "'s' as sum(v), without the weights": lambda v: {
        **_right_transpose(v),
        "s": jnp.sum(v),
    },
}

#: A student's dot-product test must return at most this for the right transpose,
#: and more than :data:`DOT_TEST_WRONG_MIN` for each of :data:`DOT_TEST_WRONG` at one
#: of three drawn (x, y) at least (one draw can pair a slip's error with a y nearly
#: orthogonal to it). Error analysis for the right transpose: both pairings
#: <A x, y> and <x, A^T y> sum the same products A_ij x_j y_i, each rounded with the
#: sums inside A x (or A^T y) and the dot product, at most m = 16 float32 roundings
#: deep, so each is within gamma = 16 u (u = 2**-24, gamma < 1e-6) times
#: S = sum_ij |A_ij x_j y_i| of the exact value, and they differ by at most 2 gamma S.
#: The checker draws only (x, y) with S <= DOT_TEST_MAX_TERMS (an absolute test then
#: gives at most 2 gamma S < 1e-4) and S <= DOT_TEST_MAX_CANCELLATION |<A x, y>| (a
#: test relative to |left| + |right| then gives at most about gamma * 20 < 2e-5): a
#: relative test at a (x, y) whose pairing nearly cancels is otherwise unbounded
#: (seed 1950 gave 1.4e-4 before these bounds). A wrong transpose's mismatch is
#: usually 0.1 to 10.
DOT_TEST_RIGHT_MAX = 1e-4
DOT_TEST_WRONG_MIN = 1e-3
#: Largest S = sum_ij |A_ij x_j y_i| of a drawn (x, y) (see DOT_TEST_RIGHT_MAX).
DOT_TEST_MAX_TERMS = 40.0
#: Largest S / |<A x, y>| of a drawn (x, y) (see DOT_TEST_RIGHT_MAX).
DOT_TEST_MAX_CANCELLATION = 20.0
#: How many (x, y) a check draws for each transpose it gives the student's test.
DOT_TEST_DRAWS = 3


@functools.lru_cache(maxsize=1)
def _exercise_map_matrix() -> np.ndarray:
    """The matrix of :func:`exercise_linear_map` in float64, columns ``x`` then ``s``
    (its entries are 0, 1, -1, sums of these and ``linspace(1, 2, 6)``, computed here
    from the definition, not from the map)."""
    n = EXERCISE_MAP_SIZE
    cumsum = np.tril(np.ones((n, n)))
    roll = np.roll(np.eye(n), 1, axis=0)  # (roll(x, 1))_i = x_{i-1}
    w = np.linspace(1.0, 2.0, n, dtype=np.float32).astype(np.float64)
    return np.concatenate([cumsum - roll, w[:, None]], axis=1)


def _dot_test_problems(
    dot_test: Any, rng: np.random.Generator
) -> tuple[list[str], bool]:
    """What is wrong with the student's ``dot_test(f, f_transpose, x, y)`` (a number
    near 0 for a right transpose, far from 0 for a wrong one), and whether it is the
    stub. The checker draws ``x`` and ``y`` and runs it on the map with the right
    transpose and with each of :data:`DOT_TEST_WRONG`."""

    matrix = _exercise_map_matrix()

    def draw() -> tuple[dict[str, jax.Array], jax.Array]:
        # Standard normal (x, y), drawn again while their pairing cancels or its terms
        # are large (DOT_TEST_RIGHT_MAX says why); about 1 draw in 5 is drawn again.
        while True:
            xs = rng.normal(size=EXERCISE_MAP_SIZE + 1).astype(np.float32)
            y = rng.normal(size=EXERCISE_MAP_SIZE).astype(np.float32)
            terms = matrix * np.outer(y, xs).astype(np.float64)
            total = np.sum(np.abs(terms))
            if total <= DOT_TEST_MAX_TERMS and total <= (
                DOT_TEST_MAX_CANCELLATION * abs(np.sum(terms))
            ):
                break
        x = {"x": jnp.asarray(xs[:-1]), "s": jnp.asarray(xs[-1])}
        return x, jnp.asarray(y)

    def run(
        transpose: Callable, what: str, pick: Callable[[list[float]], float]
    ) -> tuple[float | None, str | None]:
        values = []
        for _ in range(DOT_TEST_DRAWS):
            x, y = draw()
            with _banned_dot_product_test():
                got = ex.call_answer(
                    dot_test, exercise_linear_map, transpose, x, y, what="your dot test"
                )
            if ex.is_stub(got):
                return None, "stub"
            if ex.failed(got):
                return None, ex.failed(got)
            if np.shape(got) != ():
                return None, (
                    f"your dot test returned shape {np.shape(got)} {what}; return one "
                    "number, |<f(x), y> - <x, f_transpose(y)>| (relative or absolute)"
                )
            try:
                values.append(float(np.abs(np.asarray(got, np.float64))))
            except (TypeError, ValueError):
                return None, (
                    f"your dot test returned {type(got).__name__} {what}; return one "
                    "number, |<f(x), y> - <x, f_transpose(y)>| (relative or absolute)"
                )
        return pick(values), None

    value, error = run(_right_transpose, "for the right transpose", max)
    if error == "stub":
        return [], True
    if error:
        return [error], False
    assert value is not None
    if not np.isfinite(value) or value > DOT_TEST_RIGHT_MAX:
        return [
            f"your dot test gives {value:.3g} for the right transpose (allowed "
            f"{DOT_TEST_RIGHT_MAX:g}): it must be 0 up to rounding there; compare "
            "<f(x), y> with <x, f_transpose(y)>, each a sum over every leaf"
        ], False
    for slip, transpose in DOT_TEST_WRONG.items():
        wrong, error = run(transpose, f"for a transpose with {slip}", max)
        if error:
            return [error], False
        assert wrong is not None
        if not wrong > DOT_TEST_WRONG_MIN:
            seen = (
                f"your dot test gives at most {wrong:.3g} for a wrong transpose "
                f"({slip}) at {DOT_TEST_DRAWS} drawn x and y, so it would pass it"
            )
            if wrong <= 10 * value:  # no larger than for the right transpose
                return [
                    f"{seen}: that is as small as for the right transpose, so it "
                    "cannot tell them apart; return |<f(x), y> - <x, f_transpose(y)>|, "
                    "with f_transpose(y) from the f_transpose it is given"
                ], False
            return [
                f"{seen}: it must exceed {DOT_TEST_WRONG_MIN:g}; a relative test "
                "divides by the size of the two pairings, not by a larger scale"
            ], False
    return [], False


@contextlib.contextmanager
def _map_locked() -> Any:
    """:func:`exercise_linear_map` raises inside the block."""
    _MAP_LOCKED[0] = True
    try:
        yield
    finally:
        _MAP_LOCKED[0] = False


@contextlib.contextmanager
def _banned_dot_product_test() -> Any:
    """``linear.dot_product_test`` raises inside the block: write your own."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "your dot test called linear.dot_product_test: write the two pairings "
            "yourself (jnp.vdot over each leaf)"
        )

    saved = linear.dot_product_test
    linear.dot_product_test = stub  # type: ignore[assignment]
    try:
        yield
    finally:
        linear.dot_product_test = saved  # type: ignore[assignment]


def _dot_mismatch(
    answer: Callable[[jax.Array], PyTree], rng: np.random.Generator
) -> float:
    """The checker's dot-product test of a transpose at a drawn ``(x, s)`` and ``v``:
    ``|<f(x, s), v> - <(x, s), answer(v)>|`` (pairings in float64) in units of its
    allowed value ``DOT_PRODUCT_TOL * sum_j |(x, s)_j| S_j`` (see
    :data:`DOT_PRODUCT_TOL`); at most 1 passes."""
    n = EXERCISE_MAP_SIZE
    x, s = rng.normal(size=n).astype(np.float32), np.float32(rng.normal())
    v = rng.normal(size=n).astype(np.float32)
    image = np.asarray(
        exercise_linear_map({"x": jnp.asarray(x), "s": jnp.asarray(s)}), np.float64
    )
    back = _unwrap(answer(jnp.asarray(v)))
    left = float(image @ v.astype(np.float64))
    right = float(
        x.astype(np.float64) @ np.asarray(back["x"], np.float64)
        + np.float64(s) * np.float64(np.asarray(back["s"]))
    )
    scale = _transpose_scale(v)
    d = float(np.abs(x) @ scale["x"] + abs(float(s)) * float(scale["s"]))
    return abs(left - right) / (DOT_PRODUCT_TOL * d)


@ex.timed_check("Exercise 2.1, transpose of exercise_linear_map", ex.CHECK_LIMIT)
def check_transpose(
    answer: Callable[[jax.Array], PyTree],
    dot_test: Callable[..., Any] | None = None,
    *,
    strict: bool = False,
    seed: int | None = None,
) -> ex.Feedback:
    """Exercise 2.1: ``answer(v)`` must be the transpose of :func:`exercise_linear_map`,
    and ``dot_test(f, f_transpose, x, y)`` the student's own dot-product test.

    For three cotangents ``v: f32[6]`` drawn afresh at every check the answer must
    return ``{"x": f32[6], "s": f32[]}`` (a 1-tuple of it is accepted) matching the
    reference transpose entrywise to ``TRANSPOSE_RTOL`` times the sum of the magnitudes
    of the entry's terms; then the checker's dot-product test against the host map, at
    drawn vectors, must be within ``DOT_PRODUCT_TOL`` times its own sum of magnitudes
    (both derived from a count of float32 roundings). A wrong transpose gets first a line
    naming the wrong part and the usual slip (cumsum kept, the shift not reversed, a
    sign, s dropped or unweighted, a factor), never the answer. While the answer runs,
    the names in :data:`TRANSPOSE_BANNED` raise, and so do JAX's transposition,
    linearization and forward mode reached through JAX's API, also under a name
    imported before or in a function built or jitted before
    (:func:`beyondgrad.compat.derivatives_disabled`), and :func:`exercise_linear_map`:
    re-typing the map in ``jnp`` and transposing it with JAX is not the exercise. Not
    detected: work done before the check (a matrix from the map's values, a transpose
    compiled ahead of time, exported or made a jaxpr), ``jax.experimental.jet``, and a
    matrix made by applying a ``jnp`` copy of the map to basis vectors.

    Then the student's ``dot_test`` (required for a pass; ``linear.dot_product_test``
    raises while it runs) must return at most :data:`DOT_TEST_RIGHT_MAX` for the map
    and its right transpose and more than :data:`DOT_TEST_WRONG_MIN` for each wrong
    transpose of :data:`DOT_TEST_WRONG`, at ``x`` and ``y`` it draws. ``seed`` repeats
    a draw (tests, or a student who asks).
    """
    name = "Exercise 2.1, transpose of exercise_linear_map"
    example = exercise_map_input()
    reference = jax.linear_transpose(_map_in_jax, example)
    rng = ex.case_rng(seed)
    for k in range(3):
        v = jnp.asarray(rng.normal(size=EXERCISE_MAP_SIZE), jnp.float32)
        with (
            _banned_jax_derivatives(
                TRANSPOSE_BANNED,
                "write the transpose by hand, in jnp, and check it with the dot-product "
                "test (linear.dot_product_test)",
                clear_caches=k == 0,  # a failure at v0 ends the check
            ),
            _map_locked(),
        ):
            got = ex.call_answer(answer, v, what="your transpose")
        early = ex.early_verdict(name, got, strict=strict)
        if early is not None:
            return early
        got = _unwrap(got)
        label = f"your_transpose(v{k})"
        want = reference(v)[0]
        problems = ex.tree_mismatches(
            got, want, rtol=0.0, atol=np.inf, name=label, allow_python_scalars=False
        )
        if not problems:  # entrywise against S_j, the magnitudes of the terms
            scale = _transpose_scale(v)
            for part in ("x", "s"):
                problems += ex.scaled_mismatches(
                    got[part],
                    want[part],
                    scale[part],
                    tol=TRANSPOSE_RTOL,
                    name=f"{label}[{part!r}]",
                    scale_name="the sum of the magnitudes of its terms",
                    allow_python_scalars=False,
                )
        problems += [] if problems else _dtype_problems(got, label)
        if problems:
            kind = ex.return_kind_problem(got, want) or any(
                "dtype" in p or "Python" in p for p in problems
            )
            hint = "" if kind else _transpose_hint(got, v, want)
            return ex.verdict(
                name, [hint, *problems] if hint else problems, strict=strict
            )
    if dot_test is None:
        problem = (
            "your transpose matches on 3 drawn cotangents; the exercise has a second "
            "part: pass your dot-product test too, "
            "check_transpose(my_transpose, my_dot_test)"
        )
        return ex.verdict(name, [problem], strict=strict)
    not_a_function = ex.require_callable(dot_test, "my_dot_test")
    if not_a_function:
        return ex.verdict(name, [not_a_function], strict=strict)
    problems, stub = _dot_test_problems(dot_test, rng)
    if stub:
        problem = (
            "your transpose matches on 3 drawn cotangents; my_dot_test is not "
            "attempted yet: write it, and the checker tries it on wrong transposes"
        )
        return ex.verdict(name, [problem], strict=strict)
    if problems:
        return ex.verdict(name, problems, strict=strict)
    worst = max(_dot_mismatch(answer, rng) for _ in range(3))
    if worst > 1.0:
        problem = (
            f"dot-product test mismatch {worst:.3g} x the allowed "
            f"{DOT_PRODUCT_TOL:.2g} x sum_j |x_j| S_j (float32 rounding of the terms): "
            "your transpose is close but not exact; compute every term in float32 "
            "from v alone (no rounded constants, no scaling)"
        )
        return ex.verdict(name, [problem], strict=strict)
    success = (
        f"matches the transpose on 3 drawn cotangents (|error| <= {TRANSPOSE_RTOL:.2g} "
        "x the sum of the magnitudes of each entry's terms); "
        f"worst dot-product mismatch {worst:.2g} x the allowed {DOT_PRODUCT_TOL:.2g} "
        "x sum_j |x_j| S_j; "
        f"your dot test tells the right transpose from {len(DOT_TEST_WRONG)} wrong ones"
    )
    return ex.verdict(name, [], success=success, strict=strict)


# ------------------------------------------------------------------ exercise 2.2


def exercise_losses(params: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Outputs of a tiny model with ``params = {w: f32[n, h], b: f32[h]}``.

    ``{"fit": f32[], "hidden": f32[h], "reg": f32[]}``: a scalar loss, the mean hidden
    activation over four inputs (a vector), and a penalty.
    """
    w = params["w"]
    n = w.shape[0]
    x = jnp.linspace(-1.0, 1.0, 4 * n, dtype=w.dtype).reshape(4, n)
    y = jnp.tanh(x @ w + params["b"])
    return {
        "fit": jnp.mean((y - 0.5) ** 2),
        "hidden": jnp.mean(y, axis=0),
        "reg": 0.1 * jnp.sum(w**2),
    }


def _exercise_triple(params: Mapping[str, jax.Array]) -> tuple[jax.Array, ...]:
    w, b = params["w"], params["b"]
    return jnp.sin(w) * b, jnp.prod(b + 2.0), jnp.cumsum(w[0] * w[-1])


#: What :func:`check_rebuilt_jacrev` makes unavailable while the answer runs.
JACREV_BANNED = (
    "jacrev",
    "jacfwd",
    "jacobian",
    "hessian",
    "grad",
    "value_and_grad",
    "vjp",
)


#: What :func:`check_transpose` makes unavailable while the answer runs.
TRANSPOSE_BANNED = (*JACREV_BANNED, "linearize", "linear_transpose")


@contextlib.contextmanager
def _banned_jax_derivatives(
    names: Sequence[str],
    advice: str,
    *,
    keep_linear_transpose: bool = False,
    clear_caches: bool = True,
    linearized_applied: Callable[[tuple[Any, ...]], None] | None = None,
) -> Any:
    """``jax.<name>`` for each of ``names`` raises (with ``advice``) inside the block,
    and so does JAX's derivative machinery reached through its API
    (:func:`beyondgrad.compat.derivatives_disabled`: a name imported before, a
    transpose built or jitted before; not one compiled ahead of time); with ``keep_linear_transpose``, ``jax.linearize`` and
    ``jax.linear_transpose`` still run. ``clear_caches`` and ``linearized_applied``
    (told of each application of a linearized map outside ``jax.linear_transpose``):
    as in :func:`beyondgrad.compat.derivatives_disabled`."""

    def banned(name: str) -> Callable[..., Any]:
        def stub(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"your answer called jax.{name}: {advice}")

        return stub

    def reached(route: str) -> RuntimeError:
        return RuntimeError(f"your answer reached {route}: {advice}")

    saved = {name: getattr(jax, name) for name in names}
    try:
        for name in names:
            setattr(jax, name, banned(name))
        with compat.derivatives_disabled(
            reached,
            keep_linear_transpose=keep_linear_transpose,
            clear_caches=clear_caches,
            linearized_applied=linearized_applied,
        ):
            yield
    finally:
        for name, fn in saved.items():
            setattr(jax, name, fn)


#: Exercise 2.2: the first line when the answer applies the linearized map itself.
COLUMNS_MESSAGE = (
    "you built the Jacobian by columns, applying the linearized map to basis vectors; "
    "2.2 asks for rows: transpose the linearized map with jax.linear_transpose and "
    "apply it to one-hot cotangents"
)


class _Text(str):
    """A string that prints without quotes inside a container's repr."""

    def __repr__(self) -> str:
        return str(self)


def _aval_text(x: Any) -> str:
    """``f32[2,3]``: the dtype and shape of an array, a tracer or a
    ``ShapeDtypeStruct`` (never its values)."""
    shape = x.shape if hasattr(x, "shape") else np.shape(x)
    dtype = np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)
    kind = {"f": "f", "i": "i", "u": "u", "c": "c"}.get(dtype.kind)
    short = f"{kind}{8 * dtype.itemsize}" if kind else dtype.name
    return f"{short}[{','.join(str(int(d)) for d in shape)}]"


def _tree_text(tree: Any) -> str:
    """A pytree with each leaf written as :func:`_aval_text`, e.g. ``{'b': f32[3]}``."""
    return repr(jax.tree.map(lambda x: _Text(_aval_text(x)), tree))


def _record_tangents(into: list[str], tangents: tuple[Any, ...]) -> None:
    """Append what the linearized map was applied to (:func:`_tree_text`) to ``into``."""
    into.append(_tree_text(tangents[0] if len(tangents) == 1 else tangents))


def _columns_message(label: str, given: str, out: Any) -> str:
    """:data:`COLUMNS_MESSAGE` with where, got and expected: ``given``, the tangent the
    answer gave the linearized map (:func:`_tree_text`), and the cotangents a row is
    pulled back from (shaped like ``out``)."""
    return (
        f"{COLUMNS_MESSAGE}. In {label}: got the linearized map applied by your code "
        f"to a tangent {given} (what it gives is a column of the Jacobian), expected "
        "it only passed to jax.linear_transpose, and the transpose applied to one-hot "
        f"cotangents {_tree_text(out)} (each gives a row)"
    )


def _call_jitted(answer: Any, f: Callable[..., PyTree], params: PyTree) -> Any:
    """``answer(f, params)`` under ``jax.jit`` (one compilation, fast); if that fails
    for any reason but the stub, run it eagerly, so the student sees their own error
    (or gets the value when only ``jit`` was the problem)."""
    if not callable(answer):
        return ex.call_answer(answer, what="your function")
    got = ex.call_answer(jax.jit(partial(answer, f)), params, what="your function")
    if ex.failed(got) and not ex.is_stub(got):
        got = ex.call_answer(answer, f, params, what="your function")
    return got


# Exercise 2.2, from a count of float32 roundings (u = 2**-24, "highest" matmul
# precision, first order): each Jacobian entry must be within JACREV_RTOL * S of
# jax.jacrev's, S computed per entry from the drawn parameters (:func:`_jacrev_scale`).
# exercise_losses, x: f32[4, n], n <= 4: z = x w + b sums n + 1 terms, error <= n u Z
# with Z = |x| |w| + |b|; y = tanh z (<= 3 ulp) errs by dy <= (n + 4) u (1 + Z), and
# t = 1 - y^2 by <= 2 dy + 2 u. An entry of "fit" is (1/2h) sum_r (y - 1/2) t x_rj
# (x_rj -> 1 for b): each term errs by <= |x_rj|/(2h) (dy + 1.5 dt + 6 u), the
# 4-term sum and 1/(4h) add <= 5 u |x_rj|/(2h): <= (4n + 30) u S <= 46 u S with
# S = sum_r |x_rj| (1 + Z_rk) / (2h). "hidden" (1/4 sum_r t x_rj) likewise, <= (2n +
# 15) u S with S = sum_r |x_rj| (1 + Z_rk) / 4; "reg" (0.2 w), 2 u |w|. The triple:
# cos(w) b and sin(w) (<= 3 u |b| and 2 u: S = |b|, 1), the product rule of
# prod(b + 2) (h <= 5 products and additions of exact zeros: <= 2h u S, S = prod_{l !=
# k} |b_l + 2|), cumsum(w_0 w_-1) (a one-hot pulled back through cumsum is exact, times
# one weight: S = |w_0| + |w_-1|); entries that are structurally zero are 0 on both
# sides (S = 0 where no rule above gives a term). So one computation errs by <= 46 u
# S, the reference and a correct answer by <= 92 u S apart. JACREV_RTOL = 256 u =
# 1.5e-5: 2.8x the bound. The slips (a cotangent of ones pulling back a sum, a
# transposed layout, a missing output) err by O(1) x S. Measured, seeds 0-499 (JAX
# 0.12.0.1 and 0.8.2): the book's linearize/linear_transpose answer equals jacrev
# bitwise; jax.jacfwd (forward mode, another rounding order) is within 2.8 u S.
#: Exercise 2.2: each Jacobian entry within this times its S (derived above).
JACREV_RTOL = 256 * F32_UNIT_ROUNDOFF


def _jacrev_scale(f: Callable[..., PyTree], params: Mapping[str, Any]) -> PyTree:
    """S of :data:`JACREV_RTOL` for each entry of ``jax.jacrev(f)(params)``, float64,
    with the Jacobian's structure, for :func:`exercise_losses` and
    :func:`_exercise_triple`."""
    w = np.asarray(params["w"], np.float64)
    b = np.asarray(params["b"], np.float64)
    n, h = w.shape
    if f is exercise_losses:
        x = np.abs(np.linspace(-1.0, 1.0, 4 * n, dtype=np.float32).astype(np.float64))
        g = 1.0 + x.reshape(4, n) @ np.abs(w) + np.abs(b)  # 1 + Z, (4, h)
        xr = x.reshape(4, n)
        hidden_w = np.broadcast_to((xr.T @ g / 4)[None], (h, n, h))
        hidden_b = np.broadcast_to(g.sum(0)[None] / 4, (h, h))
        return {
            "fit": {"b": g.sum(0) / (2 * h), "w": xr.T @ g / (2 * h)},
            "hidden": {"b": hidden_b, "w": hidden_w},
            "reg": {"b": np.zeros(h), "w": np.abs(w)},
        }
    c = np.abs(b + 2.0)
    rest = np.array([np.prod(np.delete(c, k)) for k in range(h)])
    row = np.abs(w[0]) + np.abs(w[-1])
    return (
        {
            "b": np.ones((n, h, h)),
            "w": np.broadcast_to(np.abs(b), (n, h, n, h)),
        },
        {"b": rest, "w": np.zeros((n, h))},
        {"b": np.zeros((h, h)), "w": np.broadcast_to(row, (h, n, h))},
    )


#: Exercise 2.2: the first line when every row of an output leaf's Jacobian is the sum
#: of its rows (one transpose per output leaf, with a cotangent of ones).
SUMMED_ROWS_MESSAGE = (
    "a cotangent of ones gives the sum of the rows: transposing once per output leaf "
    "with ones_like(leaf) pulls back the sum of the leaf's entries, not each one; "
    "transpose once per output entry, with a one-hot cotangent (1 at that entry, 0 "
    "elsewhere)"
)
#: Exercise 2.2: the same when one transpose pulled back ones for every output at once.
SUMMED_OUTPUTS_MESSAGE = (
    "a cotangent of ones gives the sum of the rows: one transpose with ones for every "
    "output at once pulls back the gradient of the sum of all outputs; transpose once "
    "per output entry, with a one-hot cotangent (1 at that entry, 0 elsewhere)"
)


def _summed_rows_message(
    f: Callable[..., PyTree], params: PyTree, got: PyTree, want: PyTree
) -> str | None:
    """:data:`SUMMED_ROWS_MESSAGE` when each output leaf's part of ``got`` is the sum
    of ``want``'s rows over that leaf's entries (shaped as a parameter, or that sum
    repeated in every row), :data:`SUMMED_OUTPUTS_MESSAGE` when every output's part is
    the sum over all outputs' entries, else None. Not a verdict (the answer has failed
    already): it names the slip. Close means within ``JACREV_RTOL`` times the sum over
    the rows of the magnitudes ``S`` (:func:`_jacrev_scale`) and of the reference's
    entries: a correct row errs by <= 92 u S (see ``JACREV_RTOL``), and a sum of rows
    computed in one pull-back adds one rounding per entry summed, <= u sum |row|."""
    out = jax.eval_shape(f, params)
    out_def = jax.tree.structure(out)
    shapes = [tuple(o.shape) for o in jax.tree.leaves(out)]
    if all(math.prod(s) == 1 for s in shapes):
        return None  # a sum of one row is the row
    try:
        mine = out_def.flatten_up_to(got)
        ref = out_def.flatten_up_to(want)
        scale = out_def.flatten_up_to(_jacrev_scale(f, params))
        leaves = [
            [
                (
                    np.asarray(g, np.float64),
                    np.asarray(w, np.float64),
                    np.asarray(c, np.float64),
                )
                for g, w, c in zip(
                    jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(sc)
                )
            ]
            for a, b, sc in zip(mine, ref, scale)
        ]
    except (TypeError, ValueError):
        return None  # another structure: tree_mismatches has named it
    if any(
        len(jax.tree.leaves(a)) != len(jax.tree.leaves(b)) for a, b in zip(mine, ref)
    ):
        return None

    def row_sums(k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Output leaf k's rows summed, per parameter leaf: (sum, its tolerance)."""
        axes = tuple(range(len(shapes[k])))
        return [
            (
                w.sum(axes),
                JACREV_RTOL
                * (np.broadcast_to(c, w.shape).sum(axes) + np.abs(w).sum(axes)),
            )
            for _, w, c in leaves[k]
        ]

    def is_sum(k: int, sums: list[tuple[np.ndarray, np.ndarray]]) -> bool:
        """Whether every row of output leaf k's part of ``got`` is ``sums``."""
        for (g, _, _), (total, tol) in zip(leaves[k], sums):
            if g.shape not in (total.shape, shapes[k] + total.shape):
                return False
            if not np.all(np.abs(g - total) <= tol):
                return False
        return True

    sums = [row_sums(k) for k in range(len(shapes))]
    if all(is_sum(k, sums[k]) for k in range(len(shapes))):
        return SUMMED_ROWS_MESSAGE
    everything = [
        (
            np.sum([s[j][0] for s in sums], axis=0),
            np.sum([s[j][1] for s in sums], axis=0),
        )
        for j in range(len(sums[0]))
    ]
    if len(shapes) > 1 and all(is_sum(k, everything) for k in range(len(shapes))):
        return SUMMED_OUTPUTS_MESSAGE
    return None


@ex.timed_check(
    "Exercise 2.2, the Jacobian of a pytree-valued function", ex.CHECK_LIMIT
)
def check_rebuilt_jacrev(
    answer: Callable[[Callable[[PyTree], PyTree], PyTree], PyTree],
    *,
    strict: bool = False,
    seed: int | None = None,
) -> ex.Feedback:
    """Exercise 2.2: ``answer(f, params)``: the Jacobian of ``f``, as ``jax.jacrev``.

    The result has ``f``'s output structure; at an output leaf of shape ``s`` it holds
    the params structure with leaves of shape ``s + leaf.shape`` (what
    ``jax.jacrev(f)(params)`` returns). Checked on :func:`exercise_losses` (dict output:
    two scalars and a vector) and a tuple-valued function (a matrix, a scalar, a
    vector), at two parameter sizes drawn per call, float32, each entry to
    ``JACREV_RTOL`` times the magnitudes of its terms (:func:`_jacrev_scale`), with
    both sides at ``"highest"`` matmul precision. While the answer runs, the names in
    :data:`JACREV_BANNED` raise, and so do transposition not reached through
    ``jax.linear_transpose`` and forward mode outside ``jax.linearize`` (also under a
    name imported before): the exercise is to build the Jacobian from
    ``jax.linearize`` and ``jax.linear_transpose``, by rows. The linearized map that
    ``jax.linearize`` returns may only be transposed: applied by the answer itself
    (to basis tangents: the Jacobian by columns, forward mode), also under ``jit`` or
    ``vmap``, it refuses the answer with :data:`COLUMNS_MESSAGE`, the case, the
    tangent it was given and the cotangents expected instead; ``jax.linear_transpose``
    tracing it (how its transpose is built) is not such an application.
    ``seed`` repeats a draw (tests, or a repeatable run); ``None`` draws afresh.
    """
    name = "Exercise 2.2, the Jacobian of a pytree-valued function"
    rng = ex.case_rng(seed)
    problems: list[str] = []
    sizes = [(int(rng.integers(2, 5)), int(rng.integers(2, 6))) for _ in range(2)]
    cases = [(f, n, h) for (n, h) in sizes for f in (exercise_losses, _exercise_triple)]
    for f, n, h in cases:
        params = {
            "w": jnp.asarray(rng.normal(size=(n, h)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(h,)), jnp.float32),
        }
        with jax.default_matmul_precision("highest"):
            want = jax.jit(jax.jacrev(f))(params)
            applied: list[
                str
            ] = []  # tangents the linearized map got outside a transpose
            with _banned_jax_derivatives(
                JACREV_BANNED,
                "build the Jacobian from jax.linearize and jax.linear_transpose (one "
                "transpose per output entry)",
                keep_linear_transpose=True,
                clear_caches=(f, n, h) == cases[0],  # a failure ends the check
                linearized_applied=partial(_record_tangents, applied),
            ):
                got = _call_jitted(answer, f, params)
            if ex.is_stub(got):
                return ex.verdict(name, [], attempted=False, strict=strict)
        label = f"my_jacrev({f.__name__}, params with w: f32[{n},{h}])"
        if applied:  # columns: the map applied, never (or not only) transposed
            out = jax.eval_shape(f, params)
            problem = _columns_message(label, applied[0], out)
            return ex.verdict(name, [problem], strict=strict)
        early = ex.early_verdict(name, got, strict=strict)
        if early is not None:
            return early
        found = ex.tree_mismatches(
            got, want, rtol=0.0, atol=np.inf, name=label, allow_python_scalars=False
        )
        if not found:  # entrywise against S, the magnitudes of the terms
            paths = jax.tree_util.tree_flatten_with_path(want)[0]
            for (path, leaf), mine, scale in zip(
                paths,
                jax.tree.leaves(got),
                jax.tree.leaves(_jacrev_scale(f, params)),
            ):
                found += ex.scaled_mismatches(
                    mine,
                    leaf,
                    scale,
                    tol=JACREV_RTOL,
                    name=f"{label}{jax.tree_util.keystr(path)}",
                    scale_name="the magnitudes of its terms, counted",
                    allow_python_scalars=False,
                )
        if found:
            summed = _summed_rows_message(f, params, got, want)
            if summed:
                problems.append(summed)
            problems += found
            if not summed and any("has shape" in m for m in found):
                problems.append(
                    "an output leaf of shape s needs one transpose per entry, and its "
                    "Jacobian leaves have shape s + param.shape: a cotangent of "
                    "ones_like(leaf) pulls back the sum of the entries, not each one"
                )
            break
    success = (
        "matches jax.jacrev on a dict-valued and a tuple-valued function with vector "
        f"and matrix outputs, at two drawn sizes (|error| <= {JACREV_RTOL:.2g} x the "
        "magnitudes of each entry's terms)"
    )
    return ex.verdict(name, problems, success=success, strict=strict)


# ------------------------------------------------------------------ exercise 2.3

_STRATEGIES = ("jacfwd", "jacrev")


def strategy_cases() -> dict[str, tuple[PyTree, PyTree]]:
    """Exercise 2.3's four functions, as (input, output) pytrees of shapes/dtypes."""

    def s(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    mlp = {"w1": s(4, 16), "b1": s(16), "w2": s(16, 16), "b2": s(16), "w3": s(16, 1)}
    return {
        "mlp_loss": ({**mlp, "b3": s(1)}, s()),
        "decoder": (s(8), s(32, 32)),
        "per_example_losses": ({"w": s(64, 10), "b": s(10)}, s(128)),
        "ode_trajectory": ({"y0": s(3), "k": s(2)}, {"t": s(100), "y": s(100, 3)}),
    }


def _size(tree: PyTree) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(tree))


def _normalise(value: Any) -> str | None:
    if isinstance(value, (str, np.str_)):
        text = str(value).strip().lower().removeprefix("jax.")
        return text if text in _STRATEGIES else None
    return None


@ex.timed_check("Exercise 2.3, the cheaper Jacobian", ex.TIME_LIMIT)
def check_jacobian_strategy(prediction: Any, *, strict: bool = False) -> ex.Feedback:
    """Exercise 2.3: ``"jacfwd"`` or ``"jacrev"`` per case of :func:`strategy_cases`.

    ``prediction`` is a dict ``{case: answer}``, a sequence of answers in the order of
    :func:`strategy_cases`, or a function returning either. Answers are normalised
    (``" JacRev "`` and ``"jax.jacrev"`` count as ``"jacrev"``). Graded on the cost
    model only: ``jacfwd`` runs one JVP per input number, ``jacrev`` one VJP per
    output number; the cheaper has at least 5x fewer passes in every case. A function
    is called under :func:`~beyondgrad.exercises.timed_check` (``TIME_LIMIT`` s): an
    endless loop in it, compiled or not, is answered, not waited for.
    """
    name = "Exercise 2.3, the cheaper Jacobian"
    cases = strategy_cases()
    prediction, early = ex.given_answer(
        name, prediction, what="your prediction", strict=strict
    )
    if early is not None:
        return early
    if isinstance(prediction, Sequence) and not isinstance(prediction, (str, bytes)):
        if len(prediction) != len(cases):
            problem = (
                f"got {len(prediction)} answers for {len(cases)} cases; "
                f"answer each of {list(cases)}"
            )
            return ex.verdict(name, [problem], strict=strict)
        prediction = dict(zip(cases, prediction))
    if not isinstance(prediction, Mapping):
        problem = (
            "answer with a dict {case: 'jacfwd' or 'jacrev'} for the cases "
            f"{list(cases)}, got {type(prediction).__name__}"
        )
        return ex.verdict(name, [problem], strict=strict)
    problems = []
    unknown = [k for k in prediction if k not in cases]
    if unknown:
        problems.append(f"unknown case(s) {unknown}; the cases are {list(cases)}")
    missing = [k for k in cases if k not in prediction]
    if missing:
        problems.append(f"no answer for {missing}")
    for case, (inputs, outputs) in cases.items():
        if case not in prediction:
            continue
        said = _normalise(prediction[case])
        if said is None:
            problems.append(
                f"{case}: answer 'jacfwd' or 'jacrev', got {prediction[case]!r}"
            )
            continue
        n_in, n_out = _size(inputs), _size(outputs)
        best = "jacfwd" if n_in < n_out else "jacrev"
        if said != best:
            ratio = max(n_in, n_out) / min(n_in, n_out)
            problems.append(
                f"{case}: you said {said}, but the input has {n_in} numbers and the "
                f"output {n_out}: jacfwd runs {n_in} JVPs, jacrev {n_out} VJPs "
                f"({said} needs {ratio:.0f}x more passes)"
            )
    success = (
        f"all {len(cases)} cases match the cost model "
        "(jacfwd: one pass per input number; jacrev: one per output number)"
    )
    return ex.verdict(name, problems, success=success, strict=strict)
