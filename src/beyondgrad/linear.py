"""Reverse mode as linearize-then-transpose (Chapter 2).

For ``f: X -> Y`` and a point ``x``, ``jax.linearize`` returns ``f(x)`` and the linear
map ``A = J_f(x)`` (``u -> A u``, the JVP); ``jax.linear_transpose`` turns ``A`` into
``A^T`` (``v -> A^T v``, the VJP). This module builds ``vjp`` from those two pieces,
checks a transpose numerically (the dot-product test
``<A u, v> = <u, A^T v>``), turns a linear map into a dense matrix, measures the cost of
Jacobian strategies and compiled memory, and holds the chapter's exercise checkers.

Pytrees are welcome everywhere: a pytree of arrays is treated as the vector obtained by
concatenating its raveled leaves (``jax.flatten_util.ravel_pytree`` order), and the
pairing ``<a, b>`` is ``sum_leaves sum(a * b)`` (bilinear, no complex conjugate, which is
the convention ``jax.linear_transpose`` follows).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from beyondgrad import exercises as ex

__all__ = [
    "vjp_from_linearize",
    "dot_product_test",
    "materialize",
    "median_seconds",
    "mlp_map",
    "jacobian_timings",
    "plot_jacobian_timings",
    "compiled_temp_bytes",
    "grad_tracer_name",
    "exercise_linear_map",
    "EXERCISE_MAP_INPUT",
    "check_transpose",
    "exercise_losses",
    "check_rebuilt_jacrev",
    "STRATEGY_SHAPE",
    "check_jacobian_strategy",
]


# ---------------------------------------------------------------------------- validation


def _require_callable(fn: Any, name: str) -> None:
    if not callable(fn):
        raise TypeError(f"{name} must be a function, got {type(fn).__name__}")


def _require_inexact(tree: Any, name: str) -> None:
    """Every leaf of ``tree`` must be a float or complex array (linear maps live there)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if not leaves:
        raise ValueError(f"{name} has no array leaves; pass at least one float array")
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        dtype = jnp.result_type(leaf)
        if not jnp.issubdtype(dtype, jnp.inexact):
            raise TypeError(
                f"{name}{jax.tree_util.keystr(path)} has dtype {dtype}; linear maps here act on float or "
                "complex arrays. Cast it, e.g. x.astype(jnp.float32), or close over integer arguments."
            )


def _match_tree(value: Any, example: Any, name: str, example_name: str) -> None:
    """Raise ValueError for a structure/shape mismatch, TypeError for a dtype mismatch."""
    v_leaves, v_def = jax.tree_util.tree_flatten(value)
    e_leaves, e_def = jax.tree_util.tree_flatten(example)
    if v_def != e_def:
        raise ValueError(f"{name} has pytree structure {v_def}, but {example_name} has {e_def}")
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(example)[0]]
    for path, v, e in zip(paths, v_leaves, e_leaves):
        if jnp.shape(v) != jnp.shape(e):
            raise ValueError(f"{name}{path} has shape {jnp.shape(v)}, but {example_name}{path} has shape {jnp.shape(e)}")
        if jnp.result_type(v) != jnp.result_type(e):
            raise TypeError(
                f"{name}{path} has dtype {jnp.result_type(v)}, but {example_name}{path} has dtype "
                f"{jnp.result_type(e)}; cast it with .astype({jnp.result_type(e)})"
            )


def _require_key(key: Any) -> None:
    is_new_style = isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    is_raw = isinstance(key, jax.Array) and key.dtype == jnp.uint32 and key.shape == (2,)
    if not (is_new_style or is_raw):
        raise TypeError(f"key must be a JAX PRNG key such as jax.random.key(0), got {type(key).__name__}")


def _python_scalar_as(value: Any, like: Any) -> Any:
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        return jnp.asarray(value, dtype=jnp.result_type(like))
    return value


def _unwrap_single(result: Any, example: Any) -> Any:
    """``jax.linear_transpose`` and ``vjp`` return a tuple, one entry per primal: unwrap a 1-tuple."""
    if (
        isinstance(result, tuple)
        and len(result) == 1
        and jax.tree_util.tree_structure(result) != jax.tree_util.tree_structure(example)
    ):
        return result[0]
    return result


# --------------------------------------------------------------------- pytree linear algebra


def _random_like(key: jax.Array, tree: Any) -> Any:
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten(
        [jax.random.normal(k, jnp.shape(x), jnp.result_type(x)) for k, x in zip(keys, leaves)]
    )


def _as64(x: Any) -> np.ndarray:
    a = np.asarray(x)
    return a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)


def _pairing(a: Any, b: Any) -> complex:
    """``<a, b> = sum over leaves of sum(a * b)``, accumulated in float64/complex128."""
    pairs = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    return complex(sum(np.sum(_as64(x) * _as64(y)) for x, y in pairs))


def _norm(a: Any) -> float:
    return math.sqrt(sum(float(np.sum(np.abs(_as64(x)) ** 2)) for x in jax.tree_util.tree_leaves(a)))


def _combine(alpha: float, a: Any, beta: float, b: Any) -> Any:
    return jax.tree_util.tree_map(lambda x, y: alpha * x + beta * y, a, b)


# ------------------------------------------------------------------------------ the helpers


def vjp_from_linearize(f: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[[Any], tuple[Any, ...]]]:
    """``jax.vjp`` rebuilt from ``jax.linearize`` and ``jax.linear_transpose`` only.

    With ``A = J_f(primals)``: ``linearize`` gives ``out = f(*primals)`` and ``u -> A u``;
    ``linear_transpose`` of that map gives ``v -> A^T v``. Returns ``(out, vjp_fn)``;
    ``vjp_fn(cotangent)`` takes a pytree shaped like ``out`` and returns a tuple with one
    cotangent per primal, exactly like ``jax.vjp``.

    Raises ``TypeError`` if ``f`` is not callable or a primal/output leaf is not a float
    array, ``ValueError``/``TypeError`` if a cotangent's structure, shape or dtype differs
    from ``out``.
    """
    _require_callable(f, "f")
    if not primals:
        raise TypeError("vjp_from_linearize(f, *primals) needs at least one primal argument")
    _require_inexact(primals, "primals")
    out, f_jvp = jax.linearize(f, *primals)
    _require_inexact(out, "f's output")
    f_transpose = jax.linear_transpose(f_jvp, *primals)

    out_tree = jax.tree_util.tree_structure(out)

    def vjp_fn(cotangent: Any) -> tuple[Any, ...]:
        if jax.tree_util.tree_structure(cotangent) == out_tree:  # Python scalars take the output's dtype
            cotangent = jax.tree_util.tree_map(_python_scalar_as, cotangent, out)
        _match_tree(cotangent, out, "cotangent", "f's output")
        return f_transpose(cotangent)

    return out, vjp_fn


def dot_product_test(
    f_lin: Callable[[Any], Any],
    f_transpose: Callable[[Any], Any],
    in_example: Any,
    out_example: Any,
    key: jax.Array,
    *,
    linearity_rtol: float = 1e-3,
) -> float:
    """Relative mismatch of the adjoint identity ``<A u, v> = <u, A^T v>``.

    ``u`` (shaped like ``in_example``) and ``v`` (like ``out_example``) are standard
    normal draws from ``key``. Returns
    ``|<A u, v> - <u, A^T v>| / max(|A u| |v|, |u| |A^T v|)``, which is at rounding level
    (about 1e-7 or below in float32) for a correct transpose and orders of magnitude
    larger for a wrong one. The
    denominator is the Cauchy-Schwarz bound of both sides, so the number is meaningful
    even when the pairing itself happens to be near zero.

    ``f_transpose`` may return a 1-tuple (as ``jax.linear_transpose`` and ``vjp`` do).
    Raises ``ValueError`` when ``f_lin`` is not linear (``A(2u - 3w) != 2Au - 3Aw`` beyond
    ``linearity_rtol``) or when an output's structure/shape does not match the examples,
    ``TypeError`` for non-callables, non-float examples, dtype mismatches or a bad key.
    """
    _require_callable(f_lin, "f_lin")
    _require_callable(f_transpose, "f_transpose")
    _require_inexact(in_example, "in_example")
    _require_inexact(out_example, "out_example")
    _require_key(key)
    if not linearity_rtol > 0:
        raise ValueError(f"linearity_rtol must be > 0, got {linearity_rtol}")
    k_u, k_w, k_v = jax.random.split(key, 3)
    u, w = _random_like(k_u, in_example), _random_like(k_w, in_example)
    v = _random_like(k_v, out_example)

    au = f_lin(u)
    _match_tree(au, out_example, "f_lin(u)", "out_example")
    atv = _unwrap_single(f_transpose(v), in_example)
    _match_tree(atv, in_example, "f_transpose(v)", "in_example")

    aw = f_lin(w)
    a_comb = f_lin(_combine(2.0, u, -3.0, w))
    residual = _norm(_combine(1.0, a_comb, -1.0, _combine(2.0, au, -3.0, aw)))
    scale = 2.0 * _norm(au) + 3.0 * _norm(aw)
    if residual > linearity_rtol * max(scale, np.finfo(np.float64).tiny):
        raise ValueError(
            f"f_lin is not linear: f_lin(2u - 3w) differs from 2 f_lin(u) - 3 f_lin(w) by a relative "
            f"{residual / max(scale, np.finfo(np.float64).tiny):.2e}. The dot-product test applies to linear maps "
            "only: pass the linearized map (jax.linearize(f, x)[1]), not f itself."
        )

    lhs, rhs = _pairing(au, v), _pairing(u, atv)
    denom = max(_norm(au) * _norm(v), _norm(u) * _norm(atv), np.finfo(np.float64).tiny)
    return float(abs(lhs - rhs) / denom)


def materialize(linear_fn: Callable[[Any], Any], in_example: Any, *, check: bool = True) -> jax.Array:
    """The dense matrix ``A`` of a linear map, one column per input coordinate.

    Column ``j`` is ``A e_j``, computed for all ``j`` at once by ``vmap`` over the rows of
    the identity. Input and output pytrees are raveled (``ravel_pytree`` order), so the
    result has shape ``(output size, input size)``. Materializing the linearized function
    (``jax.linearize(f, x)[1]``) gives the Jacobian column by column, like ``jacfwd``;
    materializing a VJP function over ``out_example`` gives ``A^T``, row by row, like
    ``jacrev``.

    With ``check=True`` (skipped under ``jit``/``vmap``, where values are abstract) the
    matrix is compared with ``linear_fn`` on a random vector and a ``ValueError`` says so
    when ``linear_fn`` is not linear (or affine). ``TypeError`` for non-float inputs or
    outputs.
    """
    _require_callable(linear_fn, "linear_fn")
    _require_inexact(in_example, "in_example")
    flat_in, unravel_in = ravel_pytree(in_example)
    out_shape = jax.eval_shape(linear_fn, in_example)
    _require_inexact(out_shape, "linear_fn's output")

    def flat_apply(e: jax.Array) -> jax.Array:
        return ravel_pytree(linear_fn(unravel_in(e)))[0]

    basis = jnp.eye(flat_in.size, dtype=flat_in.dtype)
    matrix = jax.vmap(flat_apply)(basis).T  # vmap stacks columns as rows: transpose back
    if check and not isinstance(matrix, jax.core.Tracer):
        u = jax.random.normal(jax.random.key(0), flat_in.shape, flat_in.dtype)
        direct = _as64(flat_apply(u))
        via_matrix = _as64(matrix) @ _as64(u)
        err = float(np.linalg.norm(direct - via_matrix))
        scale = max(float(np.linalg.norm(direct)), float(np.linalg.norm(via_matrix)), np.finfo(np.float64).tiny)
        if err > 1e-3 * scale:
            raise ValueError(
                f"linear_fn is not linear: applying it to a random vector differs from its materialized "
                f"matrix times that vector by a relative {err / scale:.2e}. materialize() needs a linear map, "
                "e.g. jax.linearize(f, x)[1], not f itself."
            )
    return matrix


# ------------------------------------------------------------------------- costs, measured


def median_seconds(fn: Callable[..., Any], *args: Any, repeats: int = 7, number: int = 1) -> float:
    """Median wall time of ``fn(*args)`` (after one warm-up call that also compiles).

    Each of ``repeats`` samples times ``number`` back-to-back calls, waits for the result
    (``jax.block_until_ready``) and divides by ``number``.
    """
    _require_callable(fn, "fn")
    if repeats < 1 or number < 1:
        raise ValueError(f"repeats and number must be >= 1, got repeats={repeats}, number={number}")
    jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def mlp_map(n_in: int, n_out: int, *, hidden: int = 32, seed: int = 0) -> tuple[Callable[[jax.Array], jax.Array], jax.Array]:
    """A smooth map ``R^n_in -> R^n_out``, ``x -> W2 tanh(W1 x)``, and a point ``x``.

    Its Jacobian costs about ``n_in`` JVPs column by column or ``n_out`` VJPs row by row,
    each of ``O(hidden * (n_in + n_out))`` work: the test function for Jacobian strategies.
    """
    for name, n in (("n_in", n_in), ("n_out", n_out), ("hidden", hidden)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    w1 = jax.random.normal(k1, (hidden, n_in)) / math.sqrt(n_in)
    w2 = jax.random.normal(k2, (n_out, hidden)) / math.sqrt(hidden)
    x = jax.random.normal(k3, (n_in,))

    def f(x: jax.Array) -> jax.Array:
        return w2 @ jnp.tanh(w1 @ x)

    return f, x


def jacobian_timings(
    n_in: int, n_out: int, *, hidden: int = 32, repeats: int = 9, number: int = 10
) -> dict[str, float]:
    """Median seconds to compute the ``n_out x n_in`` Jacobian of :func:`mlp_map` three ways.

    ``jacfwd`` (``n_in`` JVPs), ``jacrev`` (``n_out`` VJPs), and ``linearize + materialize``
    (one linearization, then ``n_in`` applications of the linear map). All three are
    jitted and compiled before timing; each value is the median of ``repeats`` samples
    of ``number`` calls (see :func:`median_seconds`). This is the chapter's widget callback.
    """
    f, x = mlp_map(n_in, n_out, hidden=hidden)
    strategies = {
        "jacfwd": jax.jit(jax.jacfwd(f)),
        "jacrev": jax.jit(jax.jacrev(f)),
        "linearize + materialize": jax.jit(lambda x: materialize(jax.linearize(f, x)[1], x, check=False)),
    }
    return {name: median_seconds(fn, x, repeats=repeats, number=number) for name, fn in strategies.items()}


def plot_jacobian_timings(timings_by_shape: dict[tuple[int, int], dict[str, float]]):
    """Small multiples: one bar chart of :func:`jacobian_timings` per ``(n_in, n_out)``.

    Returns the matplotlib figure. Bars are in milliseconds; each panel's title names the
    shape and the measured ``jacfwd / jacrev`` time ratio.
    """
    import matplotlib.pyplot as plt

    if not timings_by_shape:
        raise ValueError("timings_by_shape is empty: pass {(n_in, n_out): jacobian_timings(n_in, n_out), ...}")
    n = len(timings_by_shape)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.0), squeeze=False)
    colors = {"jacfwd": "tab:blue", "jacrev": "tab:orange", "linearize + materialize": "tab:green"}
    for ax, ((n_in, n_out), times) in zip(axes[0], timings_by_shape.items()):
        names = list(times)
        ax.bar(range(len(names)), [times[k] * 1e3 for k in names], color=[colors.get(k, "grey") for k in names])
        ax.set_xticks(range(len(names)), [k.replace(" + ", "\n+ ") for k in names], fontsize=8)
        ratio = times["jacfwd"] / times["jacrev"]
        ax.set_title(f"{n_in} inputs → {n_out} outputs\njacfwd / jacrev time = {ratio:.2g}", fontsize=9)
        ax.set_ylabel("median time per Jacobian (ms)", fontsize=8)
    fig.tight_layout()
    return fig


def compiled_temp_bytes(fn: Callable[..., Any], *args: Any) -> int | None:
    """Scratch memory (bytes) XLA plans for ``jax.jit(fn)(*args)``, or None if not reported.

    Reads ``temp_size_in_bytes`` from ``jax.jit(fn).lower(*args).compile().memory_analysis()``;
    some backends/versions return no analysis, in which case this returns None.
    """
    _require_callable(fn, "fn")
    compiled = jax.jit(fn).lower(*args).compile()
    try:
        stats = compiled.memory_analysis()
    except (NotImplementedError, jax.errors.JaxRuntimeError):
        return None
    value = getattr(stats, "temp_size_in_bytes", None) if stats is not None else None
    return None if value is None else int(value)


_DIRECT_FLAG = "jax_use_direct_linearize"


def grad_tracer_name(use_direct_linearize: bool | None = None) -> str:
    """The class name of the tracer that ``jax.grad`` passes to the function it differentiates.

    ``use_direct_linearize=None`` uses JAX's current setting. ``True``/``False`` sets the
    ``jax_use_direct_linearize`` config option for this one call and restores it; a
    ``ValueError`` says so when this JAX no longer has that option.
    """
    if use_direct_linearize is not None and not isinstance(use_direct_linearize, bool):
        raise TypeError(f"use_direct_linearize must be None, True or False, got {use_direct_linearize!r}")
    seen: list[str] = []

    def f(x: jax.Array) -> jax.Array:
        seen.append(type(x).__name__)
        return jnp.sin(x)

    if use_direct_linearize is None:
        jax.grad(f)(1.0)
        return seen[0]
    if _DIRECT_FLAG not in jax.config.values:
        raise ValueError(f"JAX {jax.__version__} has no {_DIRECT_FLAG} option any more; call grad_tracer_name()")
    before = jax.config.values[_DIRECT_FLAG]
    try:
        jax.config.update(_DIRECT_FLAG, use_direct_linearize)
        jax.grad(f)(1.0)
    finally:
        jax.config.update(_DIRECT_FLAG, before)
    return seen[0]


# ------------------------------------------------------------------------------ exercises

#: Example input of :func:`exercise_linear_map`: a vector ``x`` and a scalar ``s``.
EXERCISE_MAP_INPUT = {"x": jnp.zeros(6, jnp.float32), "s": jnp.zeros((), jnp.float32)}
_EXERCISE_WEIGHTS = jnp.linspace(1.0, 2.0, 6, dtype=jnp.float32)


def exercise_linear_map(p: dict[str, jax.Array]) -> jax.Array:
    """``{x: f32[6], s: f32[]} -> f32[6]``: ``cumsum(x) - roll(x, 1) + s * weights``.

    ``weights = linspace(1, 2, 6)``. Its transpose maps ``v: f32[6]`` to
    ``{x: reverse-cumsum(v) - roll(v, -1), s: <weights, v>}``.
    """
    return jnp.cumsum(p["x"]) - jnp.roll(p["x"], 1) + p["s"] * _EXERCISE_WEIGHTS


def check_transpose(answer: Callable[[jax.Array], Any], *, strict: bool = False) -> ex.Feedback:
    """Exercise 1: ``answer(v)`` must be the transpose of :func:`exercise_linear_map`.

    Checks the returned structure against ``jax.linear_transpose`` and runs the
    dot-product test on three random pairs.
    """
    name = "transpose of exercise_linear_map"
    out_example = jnp.zeros(6, jnp.float32)
    reference = jax.linear_transpose(exercise_linear_map, EXERCISE_MAP_INPUT)
    v = jax.random.normal(jax.random.key(1), (6,), jnp.float32)
    got = ex.call_answer(answer, v, what="your transpose")
    msg = ex.failed(got)
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    got = _unwrap_single(got, EXERCISE_MAP_INPUT)
    problems = ex.tree_mismatches(got, reference(v)[0], rtol=1e-5, atol=1e-5, name="your_transpose(v)")
    if not problems:
        worst = max(
            dot_product_test(exercise_linear_map, answer, EXERCISE_MAP_INPUT, out_example, jax.random.key(k))
            for k in range(3)
        )
        if worst > 1e-5:
            problems.append(f"dot-product test mismatch {worst:.2e} (should be ~1e-7)")
        success = f"matches jax.linear_transpose; worst dot-product mismatch {worst:.1e}"
    else:
        success = ""
    return ex.verdict(name, problems, success=success, strict=strict)


def exercise_losses(params: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """A pytree-valued function: two scalar losses of a tiny linear model's parameters."""
    x = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32).reshape(4, 2)
    y = jnp.tanh(x @ params["w"] + params["b"])
    return {"fit": jnp.mean((y - 0.5) ** 2), "reg": 0.1 * jnp.sum(params["w"] ** 2)}


def _exercise_triple(params: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    return jnp.sum(jnp.sin(params["w"])), jnp.prod(params["b"] + 2.0), jnp.vdot(params["w"][0], params["w"][1])


def check_rebuilt_jacrev(answer: Callable[[Callable[[Any], Any], Any], Any], *, strict: bool = False) -> ex.Feedback:
    """Exercise 2: ``answer(f, params)`` returns, for every scalar output of ``f``, its gradient.

    The result has ``f``'s output structure with a params-shaped gradient at each leaf,
    i.e. what ``jax.jacrev(f)(params)`` returns. Tested on :func:`exercise_losses` (a dict
    output) and on a tuple-valued function, both in float32 with tolerance 1e-5.
    """
    name = "grad of every output, from linearize + linear_transpose"
    if not callable(answer):
        problem = f"your answer must be a function (f, params) -> gradients, got {type(answer).__name__}"
        return ex.verdict(name, [problem], strict=strict)
    k1, k2 = jax.random.split(jax.random.key(2))
    params = {"w": jax.random.normal(k1, (2, 3)), "b": jax.random.normal(k2, (3,))}
    problems: list[str] = []
    for f in (exercise_losses, _exercise_triple):
        # jit: one compilation instead of dozens of eager dispatches (keeps the check fast)
        got = ex.call_answer(jax.jit(partial(answer, f)), params, what="your function")
        msg = ex.failed(got)
        if msg:
            problems.append(msg)
            break
        with jax.default_matmul_precision("highest"):
            want = jax.jit(jax.jacrev(f))(params)
        problems += [f"for {f.__name__}: {p}" for p in ex.tree_mismatches(got, want, rtol=1e-5, atol=1e-5)]
    return ex.verdict(name, problems, success="matches jax.jacrev on a dict- and a tuple-valued function", strict=strict)


#: The map of exercise 3: ``mlp_map(n_in, n_out)`` with this shape.
STRATEGY_SHAPE = {"n_in": 1024, "n_out": 4}


def check_jacobian_strategy(prediction: Any, *, strict: bool = False, **shape: int) -> ex.Feedback:
    """Exercise 3: predict ``"jacfwd"`` or ``"jacrev"``, whichever is faster for the shape.

    Times both on :func:`mlp_map` with ``STRATEGY_SHAPE`` (or the ``n_in``/``n_out`` given)
    and reports the measured medians and their ratio.
    """
    unknown = set(shape) - set(STRATEGY_SHAPE)
    if unknown:
        raise TypeError(f"unexpected keyword(s) {sorted(unknown)}; only n_in and n_out can be given")
    sizes = {**STRATEGY_SHAPE, **shape}
    name = f"cheaper Jacobian strategy for n_in={sizes['n_in']}, n_out={sizes['n_out']}"
    if callable(prediction):
        prediction = ex.call_answer(prediction, what="your prediction")
        msg = ex.failed(prediction)
        if msg:
            return ex.verdict(name, [msg], strict=strict)
    if prediction not in ("jacfwd", "jacrev"):
        return ex.verdict(name, [f"answer 'jacfwd' or 'jacrev', got {prediction!r}"], strict=strict)
    times = jacobian_timings(sizes["n_in"], sizes["n_out"])
    fwd, rev = times["jacfwd"], times["jacrev"]
    fastest = "jacfwd" if fwd < rev else "jacrev"
    report = f"measured: jacfwd {fwd * 1e3:.3f} ms, jacrev {rev * 1e3:.3f} ms (ratio {max(fwd, rev) / min(fwd, rev):.1f}x)"
    problems = [] if prediction == fastest else [f"{prediction} was slower; {report}"]
    return ex.verdict(name, problems, success=report, strict=strict)
