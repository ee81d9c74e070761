"""Workshop simulation: likely wrong answers through the real exercise checkers.

A catalogue of submissions per exercise of chapters 1-6: the chapter's solution and the
slips students make (demo copies, off-by-one, per-device reductions, a default left
unchanged, a loose tolerance, NumPy for jnp, ...). Each exercise runs in a fresh
subprocess (8 CPU devices for chapters 4 and 6 and exercise 5.3, as on Colab with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``); every submission goes through
the checker as a student calls it, and the verdict, the first message a student sees
(``messages[0]`` and ``messages[1]``) and the time are written as a markdown table::

    PYTHONPATH=src nice -n 15 python tools/workshop_sim.py --out sim.md [--only 1.1 2.2]

A submission is Python source defining ``answer`` (and ``dot_test`` for 2.1), run in a
namespace holding the chapters' imports; ``want`` says whether it should pass.
Grading the messages (helpful or not) is left to the reader of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

PREAMBLE = """
import functools
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P
from beyondgrad import compat, implicit, linear, vmc, wavefunctions
from beyondgrad.exercises import ch1 as ex1, ch2 as ex2, ch3 as checks
from beyondgrad.exercises import ch4, ch5 as ex5, ch6 as ex6
from beyondgrad.implicit_problems import deq_layer

def mse_loss(w, X, y):
    return jnp.mean((X @ w - y) ** 2)
"""


@dataclass(frozen=True)
class Sub:
    label: str
    want: str  # "pass" or "fail"
    source: str
    call: str | None = None  # overrides the exercise's call


@dataclass(frozen=True)
class Exercise:
    ex: str
    call: str
    subs: tuple[Sub, ...]
    devices: int = 1


def S(label: str, want: str, source: str, call: str | None = None) -> Sub:
    return Sub(label, want, textwrap.dedent(source), call)


# ---------------------------------------------------------------- chapter 1
_EX11 = Exercise(
    "1.1",
    "ex1.check_fix_jit(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
            def answer(x, n, n_max):
                step = lambda i, v: jnp.where(i < n, jnp.sin(v), v)
                return lax.fori_loop(0, n_max, step, x)
        """,
        ),
        S(
            "demo copy: vmapped while_loop (grad fails)",
            "fail",
            """
            def answer(x, n, n_max):
                def one(xj, nj):
                    body = lambda c: (jnp.sin(c[0]), c[1] + 1)
                    return lax.while_loop(lambda c: c[1] < nj, body, (xj, 0))[0]
                return jax.vmap(one)(x, n)
        """,
        ),
        S(
            "off by one: i <= n",
            "fail",
            """
            def answer(x, n, n_max):
                step = lambda i, v: jnp.where(i <= n, jnp.sin(v), v)
                return lax.fori_loop(0, n_max, step, x)
        """,
        ),
        S(
            "fori_loop with traced trip count max(n)",
            "fail",
            """
            def answer(x, n, n_max):
                step = lambda i, v: jnp.where(i < n, jnp.sin(v), v)
                return lax.fori_loop(0, jnp.max(n), step, x)
        """,
        ),
        S(
            "Python loop: the chapter's repeat_sin",
            "fail",
            """
            def answer(x, n, n_max):
                return ex1.repeat_sin(x, n)
        """,
        ),
        S(
            "while_loop to the static n_max (grad fails)",
            "fail",
            """
            def answer(x, n, n_max):
                body = lambda c: (c[0] + 1, jnp.where(c[0] < n, jnp.sin(c[1]), c[1]))
                return lax.while_loop(lambda c: c[0] < n_max, body, (0, x))[1]
        """,
        ),
        S(
            "one extra step n_max + 1 (documented: accepted)",
            "pass",
            """
            def answer(x, n, n_max):
                step = lambda i, v: jnp.where(i < n, jnp.sin(v), v)
                return lax.fori_loop(0, n_max + 1, step, x)
        """,
        ),
    ),
)

_EX12 = Exercise(
    "1.2",
    "ex1.check_predict_retraces(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
            def answer(x, n):
                return jax.typeof(x), n
        """,
        ),
        S(
            "key on shape only (forgets dtype)",
            "fail",
            """
            def answer(x, n):
                return jnp.shape(x), n
        """,
        ),
        S(
            "key on shape+dtype, misses weak type",
            "fail",
            """
            def answer(x, n):
                return jnp.shape(x), jnp.result_type(x), n
        """,
        ),
        S(
            "forgets static n",
            "fail",
            """
            def answer(x, n):
                return jax.typeof(x)
        """,
        ),
        S(
            "type(x) in the key (NumPy array predicted a retrace)",
            "fail",
            """
            def answer(x, n):
                return type(x), jax.typeof(x), n
        """,
        ),
        S(
            "x.shape, x.dtype (Python floats have no .shape)",
            "fail",
            """
            def answer(x, n):
                return x.shape, x.dtype, n
        """,
        ),
    ),
)

_EX13A = Exercise(
    "1.3a",
    "ex1.check_nan_interval(answer)",
    (
        S(
            "correct (solution, bisection)",
            "pass",
            """
            def answer():
                is_nan = lambda x: bool(jnp.isnan(jax.grad(ex1.bump)(jnp.float32(x))))
                def last_nan(sign):
                    lo, hi = 1e-38, 1.0
                    for _ in range(60):
                        mid = float(np.sqrt(lo * hi))
                        lo, hi = (mid, hi) if is_nan(sign * mid) else (lo, mid)
                    return sign * lo
                return last_nan(-1.0), last_nan(1.0)
        """,
        ),
        S(
            "correct: float32 reasoning -1/log(max), sqrt(tiny)",
            "pass",
            """
            def answer():
                f = np.finfo(np.float32)
                return -1 / np.log(f.max), np.sqrt(f.tiny)
        """,
        ),
        S(
            "float64 reasoning: -1/log(f64 max), sqrt(f64 tiny)",
            "fail",
            """
            def answer():
                f = np.finfo(np.float64)
                return -1 / np.log(f.max), np.sqrt(f.tiny)
        """,
        ),
        S(
            "ends swapped (b, a)",
            "fail",
            """
            def answer():
                f = np.finfo(np.float32)
                return np.sqrt(f.tiny), -1 / np.log(f.max)
        """,
        ),
        S(
            "right end from subnormal tiny (smallest_subnormal)",
            "fail",
            """
            def answer():
                f = np.finfo(np.float32)
                return -1 / np.log(f.max), np.sqrt(f.smallest_subnormal)
        """,
        ),
        S(
            "right end 0 (only the overflow side)",
            "fail",
            """
            def answer():
                return -1 / np.log(np.finfo(np.float32).max), 0.0
        """,
        ),
    ),
)

_EX13B = Exercise(
    "1.3b",
    "ex1.check_finite_grad(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
            def answer(x):
                positive = x > 0
                safe_x = jnp.where(positive, jnp.maximum(x, 0.01), 1.0)
                return jnp.where(positive, jnp.exp(-1.0 / safe_x), 0.0)
        """,
        ),
        S(
            "double-where without clamp (tiny x NaN)",
            "fail",
            """
            def answer(x):
                positive = x > 0
                safe_x = jnp.where(positive, x, 1.0)
                return jnp.where(positive, jnp.exp(-1.0 / safe_x), 0.0)
        """,
        ),
        S(
            "demo copy: bump unchanged",
            "fail",
            """
            def answer(x):
                return jnp.where(x > 0, jnp.exp(-1.0 / x), 0.0)
        """,
        ),
        S(
            "returns numpy array (np.where/np.exp)",
            "fail",
            """
            def answer(x):
                positive = x > 0
                safe_x = np.where(positive, np.maximum(x, 0.01), 1.0)
                return np.where(positive, np.exp(-1.0 / safe_x), 0.0)
        """,
        ),
        S(
            "Python if on x",
            "fail",
            """
            def answer(x):
                return jnp.exp(-1.0 / x) if x > 0 else 0.0
        """,
        ),
    ),
)

# ---------------------------------------------------------------- chapter 2
_DOT = """
def dot_test(f, f_transpose, x, y):
    pairs = zip(jax.tree.leaves(x), jax.tree.leaves(f_transpose(y)))
    right = sum(jnp.vdot(a, b) for a, b in pairs)
    left = jnp.vdot(f(x), y)
    return jnp.abs(left - right) / (jnp.abs(left) + jnp.abs(right))
"""
_W = "w = jnp.linspace(1.0, 2.0, 6)\n"
_EX21 = Exercise(
    "2.1",
    "ex2.check_transpose(answer, dot_test)",
    (
        S(
            "correct (solution)",
            "pass",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return {"x": rc - jnp.roll(v, -1), "s": jnp.vdot(w, v)}
"""
            + _DOT,
        ),
        S(
            "roll sign not flipped (roll(v, 1))",
            "fail",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return {"x": rc - jnp.roll(v, 1), "s": jnp.vdot(w, v)}
"""
            + _DOT,
        ),
        S(
            "cumsum kept forward (not reversed)",
            "fail",
            _W
            + """
def answer(v):
    return {"x": jnp.cumsum(v) - jnp.roll(v, -1), "s": jnp.vdot(w, v)}
"""
            + _DOT,
        ),
        S(
            "s left as vector w*v (shape (6,))",
            "fail",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return {"x": rc - jnp.roll(v, -1), "s": w * v}
"""
            + _DOT,
        ),
        S(
            "dot test without abs (signed)",
            "pass",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return {"x": rc - jnp.roll(v, -1), "s": jnp.vdot(w, v)}
def dot_test(f, f_transpose, x, y):
    pairs = zip(jax.tree.leaves(x), jax.tree.leaves(f_transpose(y)))
    right = sum(jnp.vdot(a, b) for a, b in pairs)
    left = jnp.vdot(f(x), y)
    return (left - right) / (jnp.abs(left) + jnp.abs(right))
""",
        ),
        S(
            "dot test pairs only the 'x' leaf (ignores s)",
            "fail",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return {"x": rc - jnp.roll(v, -1), "s": jnp.vdot(w, v)}
def dot_test(f, f_transpose, x, y):
    right = jnp.vdot(x["x"], f_transpose(y)["x"])
    left = jnp.vdot(f(x), y)
    return jnp.abs(left - right) / (jnp.abs(left) + jnp.abs(right))
""",
        ),
        S(
            "returns a tuple (x, s), not a dict",
            "fail",
            _W
            + """
def answer(v):
    rc = jnp.cumsum(v[::-1])[::-1]
    return (rc - jnp.roll(v, -1), jnp.vdot(w, v))
"""
            + _DOT,
        ),
    ),
)

_JACREV_OK = """
def answer(f, params):
    out, f_jvp = jax.linearize(f, params)
    f_transpose = jax.linear_transpose(f_jvp, params)
    leaves, treedef = jax.tree.flatten(out)
    def jacobian_of_leaf(i):
        leaf = leaves[i]
        def pull_back(one_hot):
            cts = [jnp.zeros_like(x) for x in leaves]
            cts[i] = one_hot.reshape(leaf.shape)
            return f_transpose(treedef.unflatten(cts))[0]
        rows = jax.vmap(pull_back)(jnp.eye(leaf.size, dtype=leaf.dtype))
        return jax.tree.map(lambda r: r.reshape(SHAPE), rows)
    return treedef.unflatten([jacobian_of_leaf(i) for i in range(len(leaves))])
"""
_EX22 = Exercise(
    "2.2",
    "ex2.check_rebuilt_jacrev(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            _JACREV_OK.replace("SHAPE", "leaf.shape + r.shape[1:]"),
        ),
        S(
            "transposed: param dims first (param.shape + s)",
            "fail",
            _JACREV_OK.replace("SHAPE", "r.shape[1:] + leaf.shape"),
        ),
        S(
            "one transpose per leaf with ones (sums rows)",
            "fail",
            """
def answer(f, params):
    out, f_jvp = jax.linearize(f, params)
    f_transpose = jax.linear_transpose(f_jvp, params)
    leaves, treedef = jax.tree.flatten(out)
    rows = []
    for i, leaf in enumerate(leaves):
        cts = [jnp.ones_like(x) if j == i else jnp.zeros_like(x)
               for j, x in enumerate(leaves)]
        (summed,) = f_transpose(treedef.unflatten(cts))
        rows.append(jax.tree.map(
            lambda p, s=leaf.shape: jnp.broadcast_to(p, s + p.shape), summed))
    return treedef.unflatten(rows)
""",
        ),
        S(
            "calls jax.jacrev directly",
            "fail",
            """
def answer(f, params):
    return jax.jacrev(f)(params)
""",
        ),
        S(
            "forward mode: linearized map on basis tangents",
            "fail",
            """
from jax.flatten_util import ravel_pytree
def answer(f, params):
    out, f_jvp = jax.linearize(f, params)
    flat, unravel = ravel_pytree(params)
    cols = jax.vmap(lambda e: f_jvp(unravel(e)))(jnp.eye(flat.size, dtype=flat.dtype))
    def leaf(c):
        rows = jax.vmap(unravel)(jnp.moveaxis(c, 0, -1).reshape(-1, flat.size))
        return jax.tree.map(lambda r: r.reshape(c.shape[1:] + r.shape[1:]), rows)
    return jax.tree.map(leaf, cols)
""",
        ),
    ),
)

_RIGHT = (
    '{"mlp_loss": "jacrev", "decoder": "jacfwd", '
    '"per_example_losses": "jacrev", "ode_trajectory": "jacfwd"}'
)
_EX23 = Exercise(
    "2.3",
    "ex2.check_jacobian_strategy(answer)",
    (
        S("correct (solution)", "pass", f"answer = {_RIGHT}"),
        S(
            "all swapped (fwd<->rev rule reversed)",
            "fail",
            f"answer = {{k: {{'jacrev': 'jacfwd', 'jacfwd': 'jacrev'}}[v] "
            f"for k, v in {_RIGHT}.items()}}",
        ),
        S(
            "one wrong (per_example_losses jacfwd)",
            "fail",
            f"answer = {{**{_RIGHT}, 'per_example_losses': 'jacfwd'}}",
        ),
        S(
            "typo in a key ('mlp')",
            "fail",
            'answer = {"mlp": "jacrev", "decoder": "jacfwd", '
            '"per_example_losses": "jacrev", "ode_trajectory": "jacfwd"}',
        ),
        S(
            "a list in the printed order (documented form)",
            "pass",
            'answer = ["jacrev", "jacfwd", "jacrev", "jacfwd"]',
        ),
        S(
            "capitals and spaces ('JacRev ')",
            "pass",
            f"answer = {{k: v.upper() + ' ' for k, v in {_RIGHT}.items()}}",
        ),
    ),
)

# ---------------------------------------------------------------- chapter 3
_FP = """
solution_tol = TOL
def answer(theta):
    M = jnp.asarray(checks.FIXED_POINT_M, theta.dtype)
    F = lambda x: 0.5 * jnp.cos(M @ x) + theta - x
    def solve(F, x0):
        def keep_going(state):
            residual = jnp.linalg.norm(F(state[0]))
            return (residual > solution_tol) & (state[1] < 500)
        step = lambda s: (s[0] + F(s[0]), s[1] + 1)
        return lax.while_loop(keep_going, step, (x0, 0))[0]
    def tangent_solve(g, y):
        return TSOLVE
    x0 = X0
    return lax.custom_root(F, x0, solve, tangent_solve)
"""


def _fp(
    tol: str = "1e-10",
    tsolve: str = "jnp.linalg.solve(jax.jacfwd(g)(y), y)",
    x0: str = "jnp.zeros_like(theta)",
) -> str:
    return _FP.replace("TOL", tol).replace("TSOLVE", tsolve).replace("X0", x0)


_EX31 = Exercise(
    "3.1",
    "checks.check_fixed_point_grad(answer)",
    (
        S("correct (solution)", "pass", _fp()),
        S(
            "demo copy: scalar tangent_solve y / g(1.0)",
            "fail",
            _fp(tsolve="y / g(1.0)"),
        ),
        S(
            "tangent_solve divides elementwise y / g(ones)",
            "fail",
            _fp(tsolve="y / g(jnp.ones_like(y))"),
        ),
        S("x0 float32 constant jnp.zeros(3)", "pass", _fp(x0="jnp.zeros(3)")),
        S("tolerance loose: 1e-5", "fail", _fp(tol="1e-5")),
        S("tolerance a decade loose: 1e-9", "fail", _fp(tol="1e-9")),
        S(
            "tangent solve sign flipped",
            "fail",
            _fp(tsolve="-jnp.linalg.solve(jax.jacfwd(g)(y), y)"),
        ),
        S(
            "no custom_root: while_loop alone",
            "fail",
            """
M = checks.FIXED_POINT_M
def answer(theta):
    body = lambda c: (0.5 * jnp.cos(jnp.asarray(M, theta.dtype) @ c[0]) + theta, c[1] + 1)
    return lax.while_loop(lambda c: c[1] < 100, body, (jnp.zeros_like(theta), 0))[0]
""",
        ),
    ),
)

_SQ = """
def answer(A):
    eye = EYE
    F = lambda X, A: FX
    return implicit.root_find(F, START, A, tol=1e-12)RET
"""


def _sq(
    eye: str = "jnp.eye(A.shape[0], dtype=A.dtype)",
    fx: str = "X @ A @ X - eye",
    start: str = "eye",
    ret: str = "[0]",
) -> str:
    return (
        _SQ.replace("EYE", eye)
        .replace("FX", fx)
        .replace("START", start)
        .replace("RET", ret)
    )


_EX32 = Exercise(
    "3.2",
    "checks.check_sqrtm(answer)",
    (
        S("correct (solution)", "pass", _sq()),
        S("demo copy: X@X - A (the square root)", "fail", _sq(fx="X @ X - A")),
        S("start at -I (negative root)", "fail", _sq(start="-eye")),
        S("returns root_find's (X, info) pair", "fail", _sq(ret="")),
        S("identity hard-coded 3x3", "fail", _sq(eye="jnp.eye(3, dtype=A.dtype)")),
        S("inverse: X @ A - I", "fail", _sq(fx="X @ A - eye")),
        S(
            "eigendecomposition (no custom_root)",
            "fail",
            """
def answer(A):
    w, V = jnp.linalg.eigh(A)
    return (V / jnp.sqrt(w)) @ V.T
""",
        ),
        S(
            "root_find tolerance loose (1e-4)",
            "fail",
            _sq().replace("tol=1e-12", "tol=1e-4"),
        ),
    ),
)

_TF = """
ex3 = checks.exercise3_params()
def series_solve(g, y):
    def add_term(_, carry):
        term, total = carry
        term = g(term) + term
        return term, total + term
    return -lax.fori_loop(0, TERMS, add_term, (y, y))[1]
def answer(b):
    def loss(b):
        z0, p = jnp.zeros_like(b), {**ex3, "b": b}
        z, _ = implicit.fixed_point(deq_layer, z0, p, tol=TOL KW)
        return jnp.sum(z)
    return jax.grad(loss)(b)
"""


def _tf(
    tol: str = "1e-13", kw: str = ", tangent_solver=series_solve", terms: str = "19"
) -> str:
    return _TF.replace("TOL", tol).replace(" KW", kw).replace("TERMS", terms)


_EX33 = Exercise(
    "3.3",
    "checks.check_tolerance_fix(answer)",
    (
        S("correct (solution: default tangent solver)", "pass", _tf(kw="")),
        S("demo copy: suspicious_grad itself", "fail", _tf()),
        S("tightens solver tol to 1e-15, keeps series", "fail", _tf(tol="1e-15")),
        S(
            "loose solver tol 1e-6, default tangent solver",
            "fail",
            _tf(tol="1e-6", kw=""),
        ),
        S(
            "series sign flipped (leading minus dropped)",
            "fail",
            _tf().replace("return -lax.fori_loop", "return lax.fori_loop"),
        ),
        S(
            "series sign inside the term (J - 2I: diverges)",
            "fail",
            _tf().replace("term = g(term) + term", "term = -(g(term) - term)"),
        ),
        S(
            "more series terms (199): converged, numbers right",
            "pass",
            _tf(terms="199"),
        ),
    ),
)

# ---------------------------------------------------------------- chapter 4
_VMA_OK = """
answer = {
    "a * w": {"data"},
    "a + b": {"data", "model"},
    "psum(a * b, 'data')": {"model"},
    "all_gather(a, 'data') + w": {"data"},
    "pmean(a + b, ('data', 'model'))": set(),
}
"""
_EX41 = Exercise(
    "4.1",
    "ch4.check_predict_vma(answer)",
    (
        S("correct (solution)", "pass", _VMA_OK),
        S(
            "all_gather makes invariant",
            "fail",
            _VMA_OK + "answer[\"all_gather(a, 'data') + w\"] = set()\n",
        ),
        S(
            "psum keeps data",
            "fail",
            _VMA_OK + "answer[\"psum(a * b, 'data')\"] = {'data', 'model'}\n",
        ),
        S(
            "strings instead of sets ('data')",
            "pass",
            _VMA_OK + "answer['a * w'] = 'data'\n",
        ),
        S(
            "a list in order, one missing",
            "fail",
            _VMA_OK + "answer = list(answer.values())[:-1]\n",
        ),
        S(
            "a key respaced ('a*w'; not a documented form)",
            "fail",
            _VMA_OK + "answer['a*w'] = answer.pop('a * w')\n",
        ),
    ),
    devices=8,
)

_EX42 = Exercise(
    "4.2",
    "ch4.check_sharded_step(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    def global_loss(wb):
        w_full = lax.all_gather(wb, "data", tiled=True)
        return lax.pmean(mse_loss(w_full, X_block, y_block), "data")
    return w_block - lr * jax.grad(global_loss)(w_block)
""",
        ),
        S(
            "per-device loss, no pmean (sum of grads: x devices)",
            "fail",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    def loss(wb):
        return mse_loss(lax.all_gather(wb, "data", tiled=True), X_block, y_block)
    return w_block - lr * jax.grad(loss)(w_block)
""",
        ),
        S(
            "psum of loss instead of pmean",
            "fail",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    def loss(wb):
        w_full = lax.all_gather(wb, "data", tiled=True)
        return lax.psum(mse_loss(w_full, X_block, y_block), "data")
    return w_block - lr * jax.grad(loss)(w_block)
""",
        ),
        S(
            "demo copy: grad at the gathered w, pmean grad (whole-w shape)",
            "fail",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    w = lax.all_gather(w_block, "data", tiled=True)
    g = lax.pmean(jax.grad(mse_loss)(w, X_block, y_block), "data")
    return w_block - lr * g
""",
        ),
        S(
            "wrong sign (w + lr*grad)",
            "fail",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    def global_loss(wb):
        w_full = lax.all_gather(wb, "data", tiled=True)
        return lax.pmean(mse_loss(w_full, X_block, y_block), "data")
    return w_block + lr * jax.grad(global_loss)(w_block)
""",
        ),
        S(
            "grad of the local block's loss at w_block (no gather)",
            "fail",
            """
def answer(w_block, X_block, y_block, lr=0.1):
    g = jax.grad(mse_loss)(w_block, X_block, y_block)
    return w_block - lr * lax.pmean(g, "data")
""",
        ),
    ),
    devices=8,
)

_EX43 = Exercise(
    "4.3",
    "ch4.check_two_axis_carry(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
def answer(xb):
    row_sums = lax.psum(jnp.sum(xb, axis=1), "model")
    body = lambda k, acc: acc + (k + 1) * row_sums
    init = compat.pcast_varying(jnp.zeros(xb.shape[0], xb.dtype), "data")
    return lax.fori_loop(0, 3, body, init)
""",
        ),
        S(
            "demo copy: buggy (zeros(n) carry)",
            "fail",
            """
def answer(xb):
    row_sums = lax.psum(jnp.sum(xb, axis=1), "model")
    body = lambda k, acc: acc + (k + 1) * row_sums
    return lax.fori_loop(0, 3, body, jnp.zeros(xb.shape[0]))
""",
        ),
        S(
            "zeros_like(xb[:,0]) carry (varies over model)",
            "fail",
            """
def answer(xb):
    row_sums = lax.psum(jnp.sum(xb, axis=1), "model")
    body = lambda k, acc: acc + (k + 1) * row_sums
    return lax.fori_loop(0, 3, body, jnp.zeros_like(xb[:, 0]))
""",
        ),
        S(
            "no loop: 6 * row sums",
            "fail",
            """
def answer(xb):
    return 6 * lax.psum(jnp.sum(xb, axis=1), "model")
""",
        ),
        S(
            "per-device sums (psum forgotten), pcast carry",
            "fail",
            """
def answer(xb):
    row_sums = jnp.sum(xb, axis=1)
    body = lambda k, acc: acc + (k + 1) * row_sums
    init = compat.pcast_varying(jnp.zeros(xb.shape[0], xb.dtype), "data")
    return lax.fori_loop(0, 3, body, init)
""",
        ),
        S(
            "weights k instead of k+1",
            "fail",
            """
def answer(xb):
    row_sums = lax.psum(jnp.sum(xb, axis=1), "model")
    body = lambda k, acc: acc + k * row_sums
    init = compat.pcast_varying(jnp.zeros(xb.shape[0], xb.dtype), "data")
    return lax.fori_loop(0, 3, body, init)
""",
        ),
    ),
    devices=8,
)

# ---------------------------------------------------------------- chapter 5
_FL = """
def answer(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    cross = CROSS
    return u * v, gu * v + u * gv, LAP
"""


def _fl(
    cross: str = "jnp.sum(gu * gv, axis=0)", lap: str = "lu * v + u * lv + 2 * cross"
) -> str:
    return _FL.replace("CROSS", cross).replace("LAP", lap)


_EX51 = Exercise(
    "5.1",
    "ex5.check_fl_multiply(answer)",
    (
        S("correct (solution)", "pass", _fl()),
        S(
            "forgets the cross term factor 2 (factor 1)",
            "fail",
            _fl(lap="lu * v + u * lv + cross"),
        ),
        S("drops the cross term", "fail", _fl(lap="lu * v + u * lv")),
        S(
            "sums the cross term over the wrong axis",
            "fail",
            _fl(cross="jnp.sum(gu * gv, axis=1)"),
        ),
        S("gu*gv unsummed", "fail", _fl(cross="gu * gv")),
        S(
            "gradient u*gv only (product rule half)",
            "fail",
            _fl().replace("gu * v + u * gv", "u * gv"),
        ),
        S(
            "returns a list, not a tuple",
            "pass",
            _fl().replace(
                "return u * v, gu * v + u * gv, lu * v + u * lv + 2 * cross",
                "return [u * v, gu * v + u * gv, lu * v + u * lv + 2 * cross]",
            ),
        ),
    ),
)

_EX52 = Exercise(
    "5.2",
    "ex5.check_row_update_second_derivative(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
def answer(a, i, u):
    e_i = jnp.eye(a.shape[0], dtype=a.dtype)[:, i]
    return -(u @ jnp.linalg.solve(a, e_i)) ** 2
""",
        ),
        S(
            "wrong sign (+)",
            "fail",
            """
def answer(a, i, u):
    e_i = jnp.eye(a.shape[0], dtype=a.dtype)[:, i]
    return (u @ jnp.linalg.solve(a, e_i)) ** 2
""",
        ),
        S(
            "transposed: solve(A.T, e_i)",
            "fail",
            """
def answer(a, i, u):
    e_i = jnp.eye(a.shape[0], dtype=a.dtype)[:, i]
    return -(u @ jnp.linalg.solve(a.T, e_i)) ** 2
""",
        ),
        S(
            "first derivative instead (u @ A^-1 e_i)",
            "fail",
            """
def answer(a, i, u):
    e_i = jnp.eye(a.shape[0], dtype=a.dtype)[:, i]
    return u @ jnp.linalg.solve(a, e_i)
""",
        ),
        S(
            "autodiff of slogdet (numbers right: accepted)",
            "pass",
            """
def answer(a, i, u):
    along = lambda t: jnp.linalg.slogdet(a.at[i].add(t * u))[1]
    return jax.grad(jax.grad(along))(jnp.zeros((), a.dtype))
""",
        ),
    ),
)

_VAR = """
def answer(params, walkers):
    def local_energy(p, x):
        f = lambda v: wavefunctions.mlp_log_psi(p, v.reshape(x.shape))
        g, hvp = jax.linearize(jax.grad(f), x.reshape(-1))
        eye = jnp.eye(g.shape[0], dtype=g.dtype)
        eye = lax.pcast(eye, "data", to="varying")
        kinetic = -0.5 * (jnp.trace(jax.vmap(hvp)(eye)) + g @ g)
        return kinetic + vmc.potential_energy(x)
    def variance(p):
        t = jax.vmap(local_energy, in_axes=(None, 0))(p, walkers)
        count = walkers.shape[0] * lax.axis_size("data")
        MEAN
        return VAR
    value, grad = jax.value_and_grad(variance)(params)
    return value, GRAD
"""


def _var(
    mean: str = 'mean = lax.psum(jnp.sum(t), "data") / count',
    var: str = 'lax.psum(jnp.sum((t - mean) ** 2), "data") / count',
    grad: str = "grad",
) -> str:
    return _VAR.replace("MEAN", mean).replace("VAR", var).replace("GRAD", grad)


_EX53 = Exercise(
    "5.3",
    "ex5.check_sharded_variance_step(answer)",
    (
        S("correct (solution)", "pass", _var()),
        S(
            "per-device mean (local reduction where global needed)",
            "fail",
            _var(
                mean="mean = jnp.mean(t)",
                var='lax.pmean(jnp.mean((t - mean) ** 2), "data")',
            ),
        ),
        S(
            "psum of the gradient (x devices)",
            "fail",
            _var(grad='jax.tree.map(lambda g: lax.psum(g, "data"), grad)'),
        ),
        S(
            "divides by N-1",
            "fail",
            _var(var='lax.psum(jnp.sum((t - mean) ** 2), "data") / (count - 1)'),
        ),
        S(
            "returns the local sum, no psum (not invariant)",
            "fail",
            _var(var="jnp.sum((t - mean) ** 2) / count"),
        ),
    ),
    devices=8,  # the chapter sets up 8 CPU devices before its exercises
)

# ---------------------------------------------------------------- chapter 6
_CLIP = """
def answer(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = MEDIAN
    mad = MAD
    half = SCALE * mad
    return jnp.clip(e_l, median - half, median + half)
"""


def _clip(
    median: str = "jnp.median(everyone)",
    mad: str = 'lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")',
    scale: str = "ex6.CLIP_SCALE",
) -> str:
    return _CLIP.replace("MEDIAN", median).replace("MAD", mad).replace("SCALE", scale)


_EX61 = Exercise(
    "6.1",
    "ex6.check_clip(answer)",
    (
        S("correct (solution)", "pass", _clip()),
        S(
            "per-device median (local where global needed)",
            "fail",
            _clip(median="jnp.median(e_l)"),
        ),
        S(
            "per-device MAD (no pmean)",
            "fail",
            _clip(mad="jnp.mean(jnp.abs(e_l - median))"),
        ),
        S("demo default scale left (2.0, chapter's)", "fail", _clip(scale="2.0")),
        S("std instead of mean abs deviation", "fail", _clip(mad="jnp.std(everyone)")),
        S(
            "float32 (.astype(jnp.float32))",
            "fail",
            _clip().replace(
                "everyone = lax", "e_l = e_l.astype(jnp.float32)\n    everyone = lax"
            ),
        ),
        S("mean instead of median", "fail", _clip(median="jnp.mean(everyone)")),
        S(
            "mean of the devices' medians (pmean of local medians)",
            "fail",
            _clip(median='lax.pmean(jnp.median(e_l), "data")'),
        ),
    ),
    devices=8,
)

_EX62 = Exercise(
    "6.2",
    "ex6.check_per_walker_grads(answer)",
    (
        S(
            "correct (solution)",
            "pass",
            """
def answer(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.vmap(jax.grad(ex6.toy_log_psi), in_axes=(None, 0))(w, x)
""",
        ),
        S(
            "no pcast of w (the error)",
            "fail",
            """
def answer(w, x):
    return jax.vmap(jax.grad(ex6.toy_log_psi), in_axes=(None, 0))(w, x)
""",
        ),
        S(
            "grad of the sum (one gradient, not per walker)",
            "fail",
            """
def answer(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.grad(lambda w: jnp.sum(jax.vmap(ex6.toy_log_psi, (None, 0))(w, x)))(w)
""",
        ),
        S(
            "psum over devices",
            "fail",
            """
def answer(w, x):
    w = compat.pcast_varying(w, "data")
    g = jax.vmap(jax.grad(ex6.toy_log_psi), in_axes=(None, 0))(w, x)
    return lax.psum(g, "data")
""",
        ),
        S(
            "gradient w.r.t. x instead of w",
            "fail",
            """
def answer(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.vmap(jax.grad(ex6.toy_log_psi, argnums=1), in_axes=(None, 0))(w, x)
""",
        ),
        S(
            "float32 w (dtype)",
            "fail",
            """
def answer(w, x):
    w = compat.pcast_varying(w.astype(jnp.float32), "data")
    return jax.vmap(jax.grad(ex6.toy_log_psi), in_axes=(None, 0))(w, x)
""",
        ),
        S(
            "grad without vmap (whole block at once)",
            "fail",
            """
def answer(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.grad(ex6.toy_log_psi)(w, x)
""",
        ),
    ),
    devices=8,
)

EXERCISES = {
    e.ex: e
    for e in (
        _EX11,
        _EX12,
        _EX13A,
        _EX13B,
        _EX21,
        _EX22,
        _EX23,
        _EX31,
        _EX32,
        _EX33,
        _EX41,
        _EX42,
        _EX43,
        _EX51,
        _EX52,
        _EX53,
        _EX61,
        _EX62,
    )
}


def first_message(feedback: object) -> str:
    """What a student reads first: messages[0], and messages[1] after ' ¦ '."""
    messages = list(getattr(feedback, "messages", ()) or ())
    text = " ¦ ".join(" ".join(str(m).split()) for m in messages[:2])
    return text.replace("|", "¦")


def run_child(ex: str) -> None:
    """Runs one exercise's submissions in this process, one JSON line each."""
    exercise = EXERCISES[ex]
    base: dict = {}
    exec(PREAMBLE, base)
    for sub in exercise.subs:
        ns = dict(base)
        start = time.perf_counter()
        try:
            exec(sub.source, ns)
            feedback = eval(sub.call or exercise.call, ns)
            verdict = "pass" if feedback.passed else "fail"
            message = first_message(feedback)
        except Exception as e:  # noqa: BLE001 - the checker itself raised
            verdict, message = "CHECKER RAISED", f"{type(e).__name__}: {e}"
        row = {
            "ex": ex,
            "label": sub.label,
            "want": sub.want,
            "verdict": verdict,
            "message": message,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print("SIM " + json.dumps(row), flush=True)


def run_exercise(ex: str, python: str, timeout: float) -> list[dict]:
    env = dict(os.environ)
    devices = EXERCISES[ex].devices
    if devices > 1:
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={devices}"
        ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    try:
        proc = subprocess.run(
            [python, __file__, "--child", ex],
            env=env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        out, err = (
            (e.stdout or b"").decode()
            if isinstance(e.stdout, bytes)
            else (e.stdout or ""),
            "timeout",
        )
    rows = [
        json.loads(line[4:]) for line in out.splitlines() if line.startswith("SIM ")
    ]
    done = {r["label"] for r in rows}
    for sub in EXERCISES[ex].subs:
        if sub.label not in done:
            rows.append(
                {
                    "ex": ex,
                    "label": sub.label,
                    "want": sub.want,
                    "verdict": "NOT RUN",
                    "message": err.strip()[-300:],
                    "seconds": 0,
                }
            )
    return rows


def table(rows: list[dict], cut: int = 260) -> str:
    lines = [
        "| ex | submission | want | verdict | s | first message |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        msg = r["message"].replace("\n", " ")
        msg = msg if len(msg) <= cut else msg[:cut] + " …"
        flag = "" if r["verdict"] == r["want"] else " **MISMATCH**"
        lines.append(
            f"| {r['ex']} | {r['label']} | {r['want']} | {r['verdict']}{flag} "
            f"| {r['seconds']} | {msg} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="markdown table written here")
    parser.add_argument("--only", nargs="*", help="exercises, e.g. 1.1 4.2")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=900.0, help="per exercise")
    parser.add_argument("--json", help="raw rows appended here (JSON lines)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child)
        return
    if not args.out:
        parser.error("--out is required")
    rows: list[dict] = []
    for ex in args.only or list(EXERCISES):
        new = run_exercise(ex, args.python, args.timeout)
        rows += new
        if args.json:
            with open(args.json, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in new)
        Path(args.out).write_text(table(rows))  # as it goes
        print(
            f"{ex}: " + ", ".join(f"{r['label'][:30]}={r['verdict']}" for r in new),
            flush=True,
        )


if __name__ == "__main__":
    main()
