"""Checkers for Chapter 4 (shard_map and varying manual axes).

* :func:`check_predict_vma` (exercise 4.1): the varying axes of five expressions on a
  4x2 mesh with axes ``("data", "model")``, compared with :func:`sharding.explain_vma`.
* :func:`check_sharded_step` (exercise 4.2): an SGD step with the parameters split over
  ``"data"`` (ZeRO style), compared with one device on meshes of 1, 2, 4 and 8 devices.
* :func:`check_two_axis_carry` (exercise 4.3): a loop whose carry must vary over
  ``"data"`` only, on 4x2 and 2x4 ``("data", "model")`` meshes.

Each checker names the mesh axes it uses in its messages, so a student who wrote
another axis name (``"i"``) learns which names exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from beyondgrad import exercises, runtime, sharding

__all__ = [
    "CARRY_RTOL",
    "STEP_RTOL",
    "VMA_EXPRESSIONS",
    "check_predict_vma",
    "check_sharded_step",
    "check_two_axis_carry",
    "step_problem",
]

#: Mesh axes of every Chapter 4 exercise.
AXES = ("data", "model")

# --------------------------------------------------------------------------------------
# Exercise 4.1: predict the varying axes
# --------------------------------------------------------------------------------------


def _vma_expressions() -> dict[str, Callable[..., Any]]:
    """a: f32[8] with P('data'), b: f32[4] with P('model'), w: f32[2] with P()."""
    return {
        "a * w": lambda a, b, w: a * w,
        "a + b": lambda a, b, w: a + b,
        "psum(a * b, 'data')": lambda a, b, w: lax.psum(a * b, "data"),
        "all_gather(a, 'data') + w": lambda a, b, w: lax.all_gather(a, "data") + w,
        "pmean(a + b, ('data', 'model'))": lambda a, b, w: lax.pmean(
            a + b, ("data", "model")
        ),
    }


#: The expressions of the prediction exercise, in order.
VMA_EXPRESSIONS: tuple[str, ...] = tuple(_vma_expressions())
_VMA_SPECS = (P("data"), P("model"), P())


def _mesh(shape: tuple[int, ...], names: tuple[str, ...] = AXES) -> Mesh:
    return runtime.demo_mesh(shape, names)


def _mesh_words(mesh: Mesh) -> str:
    sizes = ", ".join(
        f"{a!r} of size {n}" for a, n in zip(mesh.axis_names, mesh.devices.shape)
    )
    return (
        f"the checker's mesh has axes {sizes}; every collective must name one of them"
    )


def _run_mapped(
    mapped: Callable[..., Any],
    args: tuple[jax.Array, ...],
    *,
    what: str,
    where: str,
    mesh: Mesh,
    want: jax.Array,
    rtol: float,
    name: str,
    scale: np.ndarray | None = None,
) -> tuple[Any, str | None, list[str]]:
    """Call the student's shard_mapped function on one mesh: ``(got, failure, bad)``.

    ``failure`` is the message when the call raised (prefixed with ``where``, with the
    mesh's axes), ``bad`` the :func:`exercises.tree_mismatches` of ``got`` vs ``want``
    (with ``scale``: :func:`exercises.scaled_mismatches`, ``|got - want| <= rtol *
    scale`` entrywise).
    """
    got = exercises.call_answer(mapped, *args, what=what)
    if exercises.is_stub(got):
        return got, None, []
    msg = exercises.failed(got)
    if msg:
        return got, f"{where}: {msg} ({_mesh_words(mesh)})", []
    if scale is not None:
        bad = exercises.scaled_mismatches(
            got,
            want,
            scale,
            tol=rtol,
            name=name,
            scale_name="|w_j| + lr (2/n) sum_i |X_ij| (sum_k |X_ik w_k| + |y_i|)",
            allow_python_scalars=False,
        )
        return got, None, bad
    bad = exercises.tree_mismatches(
        got, want, rtol=rtol, atol=0.1 * rtol, name=name, allow_python_scalars=False
    )
    return got, None, bad


def _explained_vma() -> dict[str, frozenset[str]]:
    mesh = _mesh((4, 2))
    args = (
        jax.ShapeDtypeStruct((8,), jnp.float32),
        jax.ShapeDtypeStruct((4,), jnp.float32),
        jax.ShapeDtypeStruct((2,), jnp.float32),
    )
    return {
        name: sharding.explain_vma(fn, mesh, _VMA_SPECS, *args).out_vma[0]
        for name, fn in _vma_expressions().items()
    }


_INVARIANT_WORDS = {"", "{}", "set()", "none", "invariant", "()", "[]"}


def _as_axes(value: Any) -> frozenset[str] | str:
    """A prediction as a set of axis names, or a message saying why it cannot be one."""
    if value is None:
        return frozenset()
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _INVARIANT_WORDS:
            return frozenset()
        text = text.strip("{}()[] ")
        parts = [p.strip().strip("'\"") for p in text.replace(",", " ").split()]
        return frozenset(p for p in parts if p)
    if isinstance(value, Iterable) and not isinstance(value, Mapping):
        items = list(value)
        if all(isinstance(a, str) for a in items):
            return frozenset(a.strip().lower() for a in items)
    return f"give a set of mesh axis names such as {{'data'}} or set(), got {value!r}"


@exercises.timed_check("Exercise 4.1 (predict the varying axes)", exercises.TIME_LIMIT)
def check_predict_vma(answers: Any, *, strict: bool = False) -> exercises.Feedback:
    """Compare predicted varying axes (``{expression: set of axes}``, or a function
    returning that dict) with what :func:`sharding.explain_vma` reports for each
    expression on a 4x2 mesh with axes ``("data", "model")``.

    A prediction may be a set, list or tuple of axis names, one name as a string, or
    ``set()`` / ``None`` / ``"{}"`` for invariant; names are compared stripped and
    lower-cased. A function is called under
    :func:`~beyondgrad.exercises.timed_check` (``TIME_LIMIT`` s): an endless loop in
    it, compiled or not, is answered, not waited for.
    """
    name = "Exercise 4.1 (predict the varying axes)"
    answers, early = exercises.given_answer(
        name, answers, what="your predictions", strict=strict
    )
    if early is not None:
        return early
    if not isinstance(answers, Mapping):
        return exercises.verdict(
            name,
            [
                f"answers must be a dict {{expression: set of axes}}, got {type(answers).__name__}"
            ],
            strict=strict,
        )
    want = _explained_vma()
    given = {str(k).strip(): v for k, v in answers.items()}
    problems = []
    for expr, axes in want.items():
        if expr not in given:
            problems.append(f"no prediction for {expr!r}")
            continue
        got = _as_axes(given[expr])
        if isinstance(got, str):
            problems.append(f"{expr}: {got}")
        elif got - set(AXES):
            problems.append(
                f"{expr}: {sorted(got - set(AXES))} is not a mesh axis; the axes are {AXES}"
            )
        elif got != axes:
            problems.append(
                f"{expr}: you predicted {sharding._fmt_axes(got)}, the explainer says {sharding._fmt_axes(axes)}"
            )
    extra = sorted(set(given) - set(want))
    if extra:
        problems.append(f"unknown expression(s) {extra}; the five are {list(want)}")
    return exercises.verdict(
        name, problems, success="all five match the explainer", strict=strict
    )


# --------------------------------------------------------------------------------------
# Exercise 4.2: the parameters split over "data" (a ZeRO-style step)
# --------------------------------------------------------------------------------------


def step_problem(
    n: int = 16, d: int = 8, seed: int = 0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Least squares data for exercise 4.2: ``w`` (d,), ``X`` (n, d), ``y`` (n,)."""
    key_w, key_x, key_n = jax.random.split(jax.random.PRNGKey(seed), 3)
    w = jax.random.normal(key_w, (d,))
    X = jax.random.normal(key_x, (n, d))
    y = X @ jnp.linspace(-1.0, 1.0, d) + 0.1 * jax.random.normal(key_n, (n,))
    return w, X, y


def _mse(w: jax.Array, X: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((X @ w - y) ** 2)


# Exercise 4.2, from a count of float32 roundings (u = 2**-24, first order; a sum of m
# terms in any order, psum's included, errs by <= (m - 1) u sum |terms|). The new
# w_j = w_j - lr (2/n) sum_i X_ij r_i, r_i = sum_k X_ik w_k - y_i, n = 16 rows, d = 8.
# r_i: d + 1 terms, error <= d u R_i, R_i = sum_k |X_ik w_k| + |y_i|; each product
# X_ij r_i adds u |X_ij r_i| <= u |X_ij| R_i; the sum over the n rows (local sums and
# the psum, any order) (n - 1) u sum_i |X_ij| R_i; the factor 2/n (or a mean), lr,
# and the subtraction from w_j 3 u S_j more. So one computation, the sharded
# answer or the one-device reference, errs by <= (d + n + 3) u S_j = 27 u S_j with
# S_j = |w_j| + lr (2/n) sum_i |X_ij| R_i (:func:`_step_scale`, float64 from the
# data), the two by <= 54 u S_j. STEP_RTOL = 128 u = 7.6e-6: 2.4x the bound. The
# slips (no pmean, so D times the gradient; a sign) err by a multiple of lr |g_j|.
# Measured over step_problem seeds 0-299 on 1, 2, 4, 8 devices (JAX 0.12.0.1 and
# 0.8.2): both book solutions <= 1.8 u S_j (71x inside); no pmean >= 1.1e6 u S_j and a
# sign >= 2.2e6 u S_j, 8,700x outside.
#: Exercise 4.2: each new w_j within this times S_j (derived in the comment above).
STEP_RTOL = 128 * exercises.F32_UNIT_ROUNDOFF


def _step_scale(w: jax.Array, X: jax.Array, y: jax.Array, lr: float) -> np.ndarray:
    """S_j of :data:`STEP_RTOL`: ``|w_j| + lr (2/n) sum_i |X_ij| (sum_k |X_ik w_k| +
    |y_i|)``, in float64."""
    w64, X64, y64 = (np.asarray(a, np.float64) for a in (w, X, y))
    r = np.abs(X64) @ np.abs(w64) + np.abs(y64)
    return np.abs(w64) + lr * (2 / len(y64)) * (np.abs(X64).T @ r)


def _block_hint(failure: str, n: int, d: int) -> str | None:
    """A first line for JAX's shape errors of exercise 4.2 on ``n`` > 1 devices (``d``
    parameters): the block of ``w`` used as the whole ``w``, or the whole gradient
    subtracted from the block; None for other failures."""
    if n == 1:
        return None
    block = f"w_block holds {d // n} of the {d} entries of w on {n} devices"
    if "contracting dimensions" in failure:
        return (
            f"{block}, but X_block has all {d} columns: gather the whole w first "
            "(lax.all_gather(w_block, 'data', tiled=True)) and differentiate with "
            "respect to w_block through that gather"
        )
    if "incompatible shapes for broadcasting" in failure:
        return (
            f"{block}; a result or gradient of the whole w's shape ({d},) does not "
            "fit it: differentiate with respect to w_block (a loss of w_block that "
            "gathers w inside: the gather's transpose hands each device its block "
            "of the gradient)"
        )
    return None


@exercises.timed_check(
    "Exercise 4.2 (a step with the parameters split over 'data')", exercises.CHECK_LIMIT
)
def check_sharded_step(
    step: Callable[[jax.Array, jax.Array, jax.Array], jax.Array],
    *,
    lr: float = 0.1,
    strict: bool = False,
) -> exercises.Feedback:
    """``step(w_block, X_block, y_block)`` runs inside ``shard_map`` on a 1-D mesh with
    axis ``"data"`` (w, X and y all ``P("data")``, out ``P("data")``) and must return this
    device's block of ``w - lr * grad(mse)(w, X, y)``, the single-device SGD step, on 1,
    2, 4 and 8 devices (entrywise within :data:`STEP_RTOL` times the magnitudes of the
    terms of the step, :func:`_step_scale`, both computed at "highest"
    matmul precision). A wrong update is reported as a signed ratio to the right one.
    """
    name = "Exercise 4.2 (a step with the parameters split over 'data')"
    msg = exercises.require_callable(step, "your step")
    if msg:
        return exercises.verdict(name, [msg], strict=strict)
    w, X, y = step_problem()
    problems: list[str] = []
    with jax.default_matmul_precision("highest"):
        want = w - lr * jax.grad(_mse)(w, X, y)
        for n in (1, 2, 4, 8):
            mesh = runtime.demo_mesh(n, "data")
            spec = P("data")
            mapped = jax.jit(
                jax.shard_map(
                    step, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec
                )
            )
            got, failure, bad = _run_mapped(
                mapped,
                (w, X, y),
                what="your step",
                where=f"on {n} device(s)",
                mesh=mesh,
                want=want,
                rtol=STEP_RTOL,
                name="new w",
                scale=_step_scale(w, X, y, lr),
            )
            if exercises.is_stub(got):
                return exercises.verdict(name, [], attempted=False, strict=strict)
            if failure:
                hint = _block_hint(failure, n, w.shape[0])
                problems += [*([hint] if hint else []), failure]
                break
            if bad:
                if np.shape(got) == np.shape(want) and np.all(np.isfinite(got)):
                    full, taken = (
                        np.asarray(w - want, np.float64),
                        np.asarray(w - got, np.float64),
                    )
                    ratio = float(taken @ full / (full @ full))
                    problems.append(
                        f"on {n} device(s): your update is {ratio:+.3g} x the single-device update "
                        f"(projected on it); {bad[0]}"
                    )
                else:
                    problems.append(f"on {n} device(s): {bad[0]}")
                break
    return exercises.verdict(
        name,
        problems,
        success="same new parameters as one device on 1, 2, 4 and 8 devices "
        f"(|error| <= {STEP_RTOL:.2g} x S_j, S_j = |w_j| + lr (2/n) sum_i |X_ij| "
        "(sum_k |X_ik w_k| + |y_i|))",
        strict=strict,
    )


# --------------------------------------------------------------------------------------
# Exercise 4.3: a loop carry over two mesh axes
# --------------------------------------------------------------------------------------

_LOOPS = ("scan", "while")
#: Relative tolerance of exercise 4.3: its inputs are multiples of 1/8, so the sums are
#: exact in float32 whatever the order; 1e-6 leaves room for another summation order.
CARRY_RTOL = 1e-6


def _carry_hint(failure: str) -> str | None:
    """A first line, in the exercise's words, for JAX's two refusals of a carry of the
    wrong type (its own message follows): the loop's, when the initial carry's varying
    axes differ from the body output's, and shard_map's, when the result varies over
    ``"model"`` where ``out_specs=P("data")`` needs it the same on every device."""
    if "carry input and carry output must have equal types" in failure:
        return (
            "your loop's initial carry has another type than the body's output (their "
            "varying axes differ, JAX's message below names them): the body returns "
            "acc + (k + 1) * row_sums, which varies over 'data' only once the row sums "
            "are psum-ed over 'model'; start from a carry of that type, "
            "compat.pcast_varying(jnp.zeros(n, xb.dtype), 'data'), not jnp.zeros(n) "
            "(invariant)"
        )
    if "out_specs" in failure and "'model'" in failure:
        return (
            "your result varies over 'model' in its type, and out_specs=P('data') "
            "needs it the same on every 'model' device: an initial carry built from "
            "the block (jnp.zeros_like(xb[:, 0])) varies over 'model', and so does a "
            "row sum without the psum over 'model'; make the carry vary over 'data' "
            "only (compat.pcast_varying(jnp.zeros(n, xb.dtype), 'data'))"
        )
    return None


def _factor_hint(got: Any, want: jax.Array, where: str) -> str | None:
    """A first line for a result that is a constant multiple of the right one (a
    weight or a count of iterations off), or None."""
    try:
        g = np.asarray(got, np.float64)
    except (TypeError, ValueError):
        return None
    w = np.asarray(want, np.float64)
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return None
    c = float(g @ w / (w @ w))
    if abs(c - 1) <= 1e-3 or np.max(np.abs(g - c * w)) > 1e-6 * np.max(np.abs(w)):
        return None
    return (
        f"{where}: your result is {c:.4g} x the expected 6 x row sums, everywhere: "
        "the loop must add (k + 1) x the row sums for k = 0, 1, 2 (1 + 2 + 3 = 6), "
        "so check the weights and the number of iterations"
    )


@exercises.timed_check(
    "Exercise 4.3 (a loop carry over two mesh axes)", exercises.CHECK_LIMIT
)
def check_two_axis_carry(
    weighted_row_sums: Callable[[jax.Array], jax.Array], *, strict: bool = False
) -> exercises.Feedback:
    """``weighted_row_sums(x_block)`` runs inside ``shard_map`` with ``in_specs=P("data",
    "model")`` and ``out_specs=P("data")`` on 4x2 and 2x4 meshes with axes ``("data",
    "model")``; it must return ``sum_{k<3} (k + 1) * (row sums of the whole row) = 6 *
    x.sum(1)`` (relative error <= :data:`CARRY_RTOL`, float32) and contain a loop (``fori_loop``,
    ``scan`` or ``while_loop``: checked in its jaxpr).
    """
    name = "Exercise 4.3 (a loop carry over two mesh axes)"
    msg = exercises.require_callable(weighted_row_sums, "your weighted_row_sums")
    if msg:
        return exercises.verdict(name, [msg], strict=strict)
    x = jnp.arange(64.0).reshape(8, 8) / 8.0
    want = 6.0 * jnp.sum(x, axis=1)
    problems: list[str] = []
    for shape in ((4, 2), (2, 4)):
        mesh = _mesh(shape)
        mapped = jax.jit(
            jax.shard_map(
                weighted_row_sums,
                mesh=mesh,
                in_specs=P("data", "model"),
                out_specs=P("data"),
            )
        )
        where = f"on the {shape[0]}x{shape[1]} mesh"
        got, failure, bad = _run_mapped(
            mapped,
            (x,),
            mesh=mesh,
            want=want,
            rtol=CARRY_RTOL,
            name="row sums",
            what="your weighted_row_sums",
            where=where,
        )
        if exercises.is_stub(got):
            return exercises.verdict(name, [], attempted=False, strict=strict)
        if failure or bad:
            hint = _carry_hint(failure) if failure else _factor_hint(got, want, where)
            problems += [*([hint] if hint else []), failure or f"{where}: {bad[0]}"]
            break
        report = sharding.explain_vma(weighted_row_sums, mesh, P("data", "model"), x)
        if not any(p in _LOOPS for p in report.primitives()):
            problems.append(
                "the values are right but your function has no loop (no scan/while in its jaxpr): "
                "the exercise is about the loop carry; use lax.fori_loop"
            )
            break
    return exercises.verdict(
        name,
        problems,
        success="a loop, and 6 * row sums on 4x2 and 2x4 meshes (relative error <= "
        f"{CARRY_RTOL:g}, absolute {0.1 * CARRY_RTOL:g})",
        strict=strict,
    )
