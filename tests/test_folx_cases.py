"""folx's own test cases, as ours (issue 26, item 3).

The functions that microsoft/folx's test suite differentiates (``test/test_layers.py``,
``test_complex.py``, ``test_customjvp.py``, ``test_composite.py``, ``test_scatter.py``,
``test_index_mask.py``, ``test_shard_map.py``, ``test_vmap.py``), rewritten with small
sizes, plus the extra cases of the issue (``scan``, ``fori_loop``, ``while_loop``,
``lax.map``, ``cond``, ``checkpoint``, integer and boolean outputs, ``custom_jvp``, a
straight-through ``custom_vjp``, complex ``abs``, a constant ``f``, an empty input).
The variants of one folx test are concatenated into one case (:func:`together`): one
compiled program per case keeps the file fast.

Every case is a function ``fn`` of one flat float64 vector ``x``, checked for every
method of :func:`beyondgrad.laplacian.laplacian` and for
:func:`beyondgrad.forward_laplacian.forward_laplacian` against an independent float64
reference: the Jacobian from ``jax.jacfwd`` and the Laplacian as
``jnp.trace(jax.hessian(s))``, where ``s = sum(w * Re fn) + sum(w' * Im fn)`` with fixed
generic weights is a real scalar that every output entry enters.

* The scalar methods (``"hessian"``, ``"loop"``, ``"vmap"``, ``"folx"``,
  ``"hutchinson"``) get ``s``; their gradient and Laplacian are compared.
  ``"hutchinson"`` is compared with the same probes applied to the reference Hessian,
  ``mean_s v_s^T H v_s``: exact, not statistical.
* ``forward_laplacian`` gets ``fn`` itself (any output shape; real, complex, integer or
  boolean): its value and Jacobian are compared entry by entry, and its Laplacian
  projected with the weights of ``s`` (a wrong entry changes the projection, the
  weights being generic) with the trace of the Hessian of ``s``.
* ``"folx"`` runs where folx runs: a case on which folx raises is an ``xfail`` that
  names folx's error (decided by trying). Measured: folx 0.2.30 with JAX 0.12.0.1
  fails on scan, fori_loop and lax.map (``KeyError: 'num_carry'``), while_loop and the
  custom_vjp; folx 0.2.24 with JAX 0.8.2 fails on the same and also on the integer
  cases and on "split, pad, add_any", and gives wrong cumprod, cholesky and
  cumlogsumexp (:data:`FOLX_WRONG`).
* Reverse mode does not apply to ``while_loop``: only ``forward_laplacian`` and
  ``"folx"`` are checked there, against forward over forward mode. Forward mode does
  not apply to ``custom_vjp``: its reference Jacobian is ``jax.jacrev``.

The error of a case is ``max |got - want| / max(1, max |want|)`` over the compared
arrays; each case's tolerance is 10 x the largest error measured over the methods
that are right, on JAX 0.12.0.1 and 0.8.2 (:data:`MEASURED`), and at least 1e-15 where
every measured error was 0. Cases that fail because of our interpreter are strict
xfails naming the defect (:data:`INTERPRETER_DEFECTS`).

Left out: the properties of folx's tests that are about folx's own data structures
(``is_jacobian_weak``, the shape of ``jacobian.data``, the index-mask helpers, which
slogdet kernel ran, ``register_function``); their functions are kept.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondgrad import forward_laplacian as FL
from beyondgrad import laplacian as L
from beyondgrad import runtime

SCALAR_METHODS = ("hessian", "loop", "vmap", "folx", "hutchinson")
METHODS = (*SCALAR_METHODS, "forward_laplacian")
HUTCHINSON_KEY_SEED, HUTCHINSON_SAMPLES = 11, 4


#: XLA options of this file's programs: no LLVM optimisation. Each program runs once on
#: a few numbers, so compiling is nearly all of the time (measured on JAX 0.12.0.1, each
#: method of each case compiled alone: 1.5 s running, 198 s compiling, 31 s tracing);
#: these options cut the compile time of the joint programs of "det", "elementwise
#: real-only", "scatter add" and "mlp" by 21%, 33%, 28% and 51%. The HLO passes
#: (simplification, fusion) still run.
FAST_COMPILE = {
    "xla_backend_optimization_level": 0,
    "xla_llvm_disable_expensive_passes": True,
}


def compiled(fn: Callable, *args: object) -> Callable:
    """``jax.jit(fn)`` for ``args``' types, compiled with :data:`FAST_COMPILE`."""
    return jax.jit(fn).lower(*args).compile(compiler_options=FAST_COMPILE)


def hutchinson_key() -> jax.Array:
    """The probes' key: an ``rbg`` key, whose generator is one XLA op. Measured (compile
    time of a program that draws the probes minus one that does not): the default
    threefry key 0.25-0.34 s on JAX 0.12.0.1 and 0.41-0.59 s on 0.8.2, ``rbg`` 0.05-0.1 s
    and 0.04 s."""
    return jax.random.key(HUTCHINSON_KEY_SEED, impl="rbg")


@dataclass(frozen=True)
class Case:
    """One function of a flat float64 vector ``x`` of size ``d``."""

    name: str
    source: str  #: the folx test it comes from, or "issue 26"
    d: int
    fn: Callable[[jax.Array], jax.Array]
    #: methods this case does not apply to, with the reason
    skip: dict[str, str] = field(default_factory=dict)


_RNG = np.random.default_rng(26)


def _normal(*shape: int) -> np.ndarray:
    """Fixed float64 parameters (NumPy: they become float64 under enable_x64)."""
    return _RNG.normal(size=shape)


def _complex(*shape: int) -> np.ndarray:
    return _normal(*shape) + 1j * _normal(*shape)


CASES: list[Case] = []


def case(name: str, source: str, d: int, **kw: object) -> Callable:
    def register(fn: Callable) -> Callable:
        CASES.append(Case(name, source, d, fn, **kw))  # type: ignore[arg-type]
        return fn

    return register


def together(*fns: Callable) -> Callable[[jax.Array], jax.Array]:
    """One case from several functions of folx's test: their outputs, flattened and
    concatenated (complex if any is; a failure names the group, the error shows which
    entries)."""

    def fn(x: jax.Array) -> jax.Array:
        return jnp.concatenate([jnp.ravel(f(x)) for f in fns])

    return fn


def _to_complex(x: jax.Array) -> jax.Array:
    """A complex vector made from a real one (folx's tests draw complex inputs; our
    input is real, so the complex numbers are made inside the function)."""
    return x * (0.8 + 0.3j) + 0.5j * x[::-1] + 0.2


# --- test_layers.py ----------------------------------------------------------------

case("sum", "test_layers::test_summation", 6)(
    together(jnp.sum, lambda x: jnp.sum(_to_complex(x)))
)

# test_elementwise: real; complex holomorphic; complex through abs (not holomorphic)
_HOLOMORPHIC = [jnp.sin, jnp.cos, jnp.tanh, jnp.exp, jnp.square]
_THROUGH_ABS = [jnp.abs, lambda z: jnp.log(jnp.abs(z)), lambda z: jnp.sqrt(jnp.abs(z))]
case("elementwise", "test_layers::test_elementwise", 6)(
    together(*_HOLOMORPHIC, *_THROUGH_ABS)
)
case("elementwise complex", "test_layers::test_elementwise", 6)(
    together(*(lambda x, g=g: g(_to_complex(x)) for g in _HOLOMORPHIC))
)
case("elementwise complex abs", "test_layers::test_elementwise", 6)(
    together(*(lambda x, g=g: g(_to_complex(x)) for g in _THROUGH_ABS))
)


# test_binary: both arguments from x, left only, right only; real and complex
def _binary_cases(prep: Callable, other: np.ndarray) -> list[Callable]:
    fns = []
    for g in (jnp.add, jnp.subtract, jnp.multiply, jnp.divide):
        fns += [
            lambda x, g=g: g(prep(x)[:3], prep(x)[3:] + 3.0),
            lambda x, g=g: g(prep(x), other + 3.0),
            lambda x, g=g: g(other, prep(x) + 3.0),
        ]
    return fns


case("binary", "test_layers::test_binary", 6)(
    together(*_binary_cases(lambda x: x, _normal(6)))
)
case("binary complex", "test_layers::test_binary", 6)(
    together(*_binary_cases(_to_complex, _complex(6)))
)

# test_matmul: real or complex on either side, under jit
_W6 = _normal(6, 6)
case("matmul", "test_layers::test_matmul", 6)(
    together(
        *(
            lambda x, lc=lc, rc=rc: jax.jit(jnp.matmul)(
                x * 1j if lc else x, _W6 * 1j if rc else _W6
            )
            for lc in (False, True)
            for rc in (False, True)
        )
    )
)


# test_matmul_both_sparse
def _attn(x):
    x = x.reshape(4, 2)
    return jnp.matmul(jnp.exp(jnp.matmul(x, jnp.swapaxes(x, -2, -1))), x)


def _rect(x):
    x = x.reshape(4, 2)
    return jnp.matmul(jnp.sin(x), jnp.cos(jnp.swapaxes(x, -2, -1)))


case("matmul both depend on x", "test_layers::test_matmul_both_sparse", 8)(
    together(_attn, _rect)
)

# test_matmul_degenerate_broadcast_shapes
case("einsum degenerate broadcasts", "test_layers::test_matmul_degenerate", 12)(
    together(
        *(
            lambda x, g=g: g(x.reshape(4, 3))
            for g in (
                lambda x: jnp.einsum("nk,mk->nm", x, jnp.sin(x[:1])),
                lambda x: jnp.einsum("nk,mk->nm", x[:1], jnp.sin(x)),
                lambda x: jnp.einsum("k,mk->m", x[0], jnp.sin(x[:3])),
                lambda x: jnp.einsum(
                    "ijh,jh->ih", jnp.sin(x[:, None, :] * x[None, :, :]), jnp.cos(x)
                ),
            )
        )
    )
)


# test_matmul_preferred_element_type: a low-precision product accumulated wider
@case("dot_general preferred_element_type", "test_layers::test_matmul_preferred", 6)
def _preferred(x):
    lo = x.reshape(3, 2).astype(jnp.float32)
    s = jnp.exp(lo @ lo.T)
    return lax.dot_general(
        s, lo, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float64
    )


# test_dot: two vectors (folx passes them as a tuple), and a polynomial
_W_LIN, _W_QUAD = _normal(4, 5), _normal(4, 4, 5)
case("dot", "test_layers::test_dot", 8)(
    together(
        lambda x: jax.jit(jnp.dot)(x[:4], x[4:]),
        lambda x: (
            jnp.dot(x[:4], _W_LIN)
            + jnp.einsum("...i,...j,...ijk->...k", x[:4], x[:4], _W_QUAD)
        ),
    )
)

# test_slogdet, real and complex matrices: log|det|, and the sign of the complex one
_W_SLOG = _normal(9, 9)
_W_SLOG_C = _W_SLOG + 1j * _normal(9, 9)


def _slogdet_of(w: np.ndarray, part: int) -> Callable:
    return lambda x: jnp.linalg.slogdet(jnp.tanh((x @ w).reshape(3, 3)))[part]


case("slogdet", "test_layers::test_slogdet", 9)(
    together(_slogdet_of(_W_SLOG, 1), _slogdet_of(_W_SLOG_C, 1))
)
case("slogdet sign complex", "test_layers::test_slogdet", 9)(_slogdet_of(_W_SLOG_C, 0))

# test_slogdet_sparse (rows, columns, two of each per coordinate, shared, batched)
# and test_slogdet_element_sparse
_W_ORB = _normal(3, 2, 3)
_PERM = np.stack([np.roll(np.arange(3), s) for s in range(3)])


def _slogdet_mode(x, mode):
    x = x.reshape(3, 2)
    if mode == "element sparse":
        return jnp.linalg.slogdet(2 * jnp.eye(3) + 0.5 * jnp.tanh(x[:, 0])[_PERM])[1]
    if mode in ("columns", "two columns"):
        a = jnp.einsum("jd,jdi->ij", x, _W_ORB)
        if mode == "two columns":
            a = a + jnp.roll(a, 1, axis=1)
    else:
        a = jnp.einsum("id,idj->ij", x, _W_ORB)
        if mode == "two rows":
            a = a + jnp.roll(a, 1, axis=0)
        elif mode == "shared rows":
            a = a + x.sum()
    if mode == "batched":  # (molecule, determinant, electron, orbital)
        return jnp.linalg.slogdet(jnp.stack([jnp.tanh(a), jnp.sin(a)])[None])[1]
    return jnp.linalg.slogdet(jnp.tanh(a))[1]


case("slogdet sparsity patterns", "test_layers::test_slogdet_sparse", 6)(
    together(
        *(
            functools.partial(_slogdet_mode, mode=m)
            for m in (
                "row sparse",
                "two rows",
                "columns",
                "two columns",
                "shared rows",
                "batched",
                "element sparse",
            )
        )
    )
)

# test_det (real and complex), test_solve, test_inv
_W_DET = _normal(3, 2, 3)
_W_DET_C = _W_DET + 1j * _normal(3, 2, 3)
_A_CONST = 3 * np.eye(3) + np.tril(_normal(3, 3), -1)
_B_VEC, _B_MAT = _normal(3), _normal(3, 2)
_W_BATCHED = _normal(2, 3, 2, 3)


def _mat(x, w):
    return 3 * jnp.eye(3) + jnp.tanh(jnp.einsum("id,idj->ij", x.reshape(3, 2), w))


def _rhs(x):
    return jnp.tanh(x.reshape(3, 2)).sum(-1)


def _batched_mat(x):
    return 3 * jnp.eye(3) + jnp.tanh(
        jnp.einsum("id,kidj->kij", x.reshape(3, 2), _W_BATCHED)
    )


case("det", "test_layers::test_det", 6)(
    together(
        lambda x: jnp.linalg.det(_mat(x, _W_DET)),
        lambda x: jnp.linalg.det(_mat(x, _W_DET_C)),
    )
)
case("solve", "test_layers::test_solve", 6)(
    together(
        lambda x: jnp.linalg.solve(_mat(x, _W_DET), _B_VEC),
        lambda x: jnp.linalg.solve(_mat(x, _W_DET), _B_MAT),
        lambda x: jnp.linalg.solve(_mat(x, _W_DET), _rhs(x)),
        lambda x: jnp.linalg.solve(_A_CONST, _rhs(x)),
        lambda x: jnp.linalg.solve(_batched_mat(x), _rhs(x)[None, :, None]),
    )
)
case("inv", "test_layers::test_inv", 6)(lambda x: jnp.linalg.inv(_mat(x, _W_DET)))

# test_dtype: conversions to float and complex types (integer and boolean types: the
# integer-output cases of issue 26 below); float16 alone, its error sets its tolerance
case("convert to float16", "test_layers::test_dtype", 5)(
    lambda x: jnp.sin(x).astype(jnp.float16) * x.astype(jnp.float16)
)
case("convert to float32, complex64, complex128", "test_layers::test_dtype", 5)(
    together(
        *(
            lambda x, dt=dt: jnp.sin(x).astype(dt) * x.astype(dt)
            for dt in (jnp.float32, jnp.complex64, jnp.complex128)
        )
    )
)


# test_multi_output: custom_jvp functions with several outputs, and a jitted one
@jax.custom_jvp
def _sincos(x):
    return jnp.sin(x), jnp.cos(x)


@_sincos.defjvp
def _sincos_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _sincos(x), (jnp.cos(x) * dx, -jnp.sin(x) * dx)


@jax.custom_jvp
def _sumdiff(a, b):
    return a + b, a - b


@_sumdiff.defjvp
def _sumdiff_jvp(primals, tangents):
    (a, b), (da, db) = primals, tangents
    return _sumdiff(a, b), (da + db, da - db)


case("several outputs", "test_layers::test_multi_output", 6)(
    together(
        lambda x: jnp.stack(_sincos(x)) * x,
        lambda x: jnp.stack(_sumdiff(jnp.sin(x), jnp.cos(x))) ** 2,
        lambda x: jnp.stack(
            jax.jit(lambda a, b: (a + b, a * b))(jnp.sin(x), jnp.cos(x))
        ),
    )
)

# test_split, test_pad, test_add_any (jax.grad inside f emits add_any)
case("split, pad, add_any", "test_layers::test_split/test_pad/test_add_any", 6)(
    together(
        lambda z: jnp.split(z, 2)[0] * jnp.split(z, 2)[1] ** 2,
        lambda z: jnp.pad(z.reshape(2, 3), ((1, 0), (0, 2))) ** 2,
        lambda z: lax.pad(z.reshape(2, 3), 7.0, ((1, 0, 1), (0, 2, 0))) * z[0],
        lambda z: lax.pad(z[:5], z[5], ((2, 1, 1),)) ** 3,  # varying pad value
        lambda z: jnp.sin(lax.pad(z, 0.0, ((-1, -2, 0),))),  # negative padding
        lambda z: jax.grad(lambda y: jnp.sin(y).sum() + (y**2).sum())(z) * z,
    )
)

# test_elementwise_real
case("elementwise real-only", "test_layers::test_elementwise_real", 6)(
    together(
        jax.scipy.special.erf,
        jax.scipy.special.erfc,
        lambda z: jax.scipy.special.erfinv(jnp.tanh(z)),
        jnp.sinh,
        jnp.cosh,
        jnp.arcsinh,
        lambda z: jnp.arccosh(jnp.abs(z) + 1.5),
        lambda z: jnp.arctanh(0.9 * jnp.tanh(z)),
        lambda z: jnp.cbrt(jnp.abs(z) + 0.5),
        jnp.exp2,
        lambda z: jax.scipy.special.gammaln(jnp.abs(z) + 0.5),
        lambda z: jax.scipy.special.digamma(jnp.abs(z) + 0.5),
        lambda z: jax.nn.gelu(z, approximate=False),
    )
)

# test_piecewise (zero second derivative almost everywhere) and test_cumprod
case("piecewise and cumulative", "test_layers::test_piecewise", 6)(
    together(
        lambda z: jnp.clip(z, -0.5, 0.5) * z,
        lambda z: lax.rem(z, 0.7) * z,
        lambda z: jnp.floor(z * 3) * z,
        lambda z: jnp.ceil(z * 3) * z,
        lambda z: jnp.round(z * 3) * z,
        lambda z: lax.cummax(z, axis=0) ** 2,
        lambda z: lax.cummin(z, axis=0) ** 2,
    )
)
# shape-preserving but not elementwise: its Hessian has off-diagonal blocks
case("cumprod", "test_layers::test_cumprod", 6)(lambda z: jnp.cumprod(jnp.sin(z)))
# review of issue 26: folx 0.2.24 on JAX 0.8.2 is silently wrong on these two as well
# (laplacian.FOLX_PROBES: method="folx" warns there)
case("cholesky", "review 26", 9)(
    lambda z: jnp.linalg.cholesky(
        (z.reshape(3, 3) + 3 * jnp.eye(3)) @ (z.reshape(3, 3) + 3 * jnp.eye(3)).T
    )
)
case("cumlogsumexp", "review 26", 6)(lambda z: lax.cumlogsumexp(z, axis=0))

# test_indexing_primitives and test_indexing_with_constants_stays_sparse
case("indexing", "test_layers::test_indexing_primitives", 6)(
    together(
        lambda z: jnp.stack([z, z * 2], axis=1) * z[0],
        lambda z: jnp.stack([z, jnp.ones(6)], axis=0) ** 2,
        lambda z: jnp.unstack(z.reshape(2, 3))[1] ** 2,
        lambda z: jnp.tile(z.reshape(2, 3), (2, 2)) ** 2,
        lambda z: jnp.copy(z) * z,
        lambda z: lax.dynamic_update_slice(z, z[:2] ** 2, (3,)),
        lambda z: lax.dynamic_update_slice(jnp.zeros(8), z**2, (1,)),
        lambda z: jnp.concatenate([z, jnp.ones(4)]) ** 2,
        lambda z: jnp.pad(z, (1, 2)) ** 2,
    )
)


# --- test_complex.py ---------------------------------------------------------------

_WC1, _WC2 = _normal(6, 6), _normal(6, 6)
_WM1, _WM2 = _complex(6, 6), _complex(6, 6)
case("complex parts and mlp", "test_complex::test_parts/test_complex_mlp", 6)(
    together(
        lambda x: jnp.real(x @ _WC1 + 1j * x @ _WC2) ** 2,
        lambda x: jnp.imag(x @ _WC1 + 1j * x @ _WC2) ** 2,
        lambda x: jnp.tanh(x @ _WM1) @ _WM2,
    )
)
_WA = _complex(6, 6)
case("complex abs", "test_complex::test_complex_abs", 6)(
    lambda x: jnp.abs(jnp.tanh(x @ _WA))
)


# --- test_customjvp.py -------------------------------------------------------------


@jax.custom_jvp
def _sin_twice_slope(x):
    return jnp.sin(x)


@_sin_twice_slope.defjvp
def _sin_twice_slope_jvp(primals, tangents):
    # the rule differs from the true derivative by a factor 2: the rule must be used
    (x,), (dx,) = primals, tangents
    return _sin_twice_slope(x), 2 * dx * jnp.cos(x)


case("custom_jvp rule used", "test_customjvp::test_customjvp", 6)(_sin_twice_slope)


# --- test_composite.py -------------------------------------------------------------

_LAYERS = [(_normal(8, 8) / 2, _normal(8)) for _ in range(4)]


@case("mlp", "test_composite::test_mlp", 8)
def _mlp(x):
    for w, b in _LAYERS:
        x = jnp.tanh(jnp.dot(x, w) + b)
    return x.sum()


_QKV = [_normal(3, 8) / 2 for _ in range(3)]
_INPUT_WEIGHTS = _normal(12)


def _attention(x):
    x = x.reshape(4, 3)
    q, k, v = (jnp.dot(x, w) for w in _QKV)
    return jnp.dot(jax.nn.softmax(jnp.dot(q, k.T), axis=-1), v).sum()


# folx's weighted Laplacian sum_i w_i^2 d^2/dx_i^2 is the Laplacian of f(w * x)
case("attention, plain and weighted", "test_composite::test_attention", 12)(
    together(_attention, lambda x: _attention(_INPUT_WEIGHTS * x))
)


# --- test_scatter.py ---------------------------------------------------------------

_IDX = jnp.array([0, 2, 5])
_DUP = jnp.array([1, 1, 3])


def _rows_into_zeros(x):
    d = jnp.sqrt(jnp.sum(jnp.square(x.reshape(-1, 3)), axis=1))
    return jnp.zeros((2, d.shape[0])).at[0].set(d).at[1].set(d * 5.0)


case("scatter set", "test_scatter::test_scatter_set", 12)(
    together(
        _rows_into_zeros,
        lambda x: jnp.sin(x).at[_IDX].set(x[:3] * 2),
        lambda x: jnp.sin(x).at[_IDX].set(1.5),
        lambda x: jnp.sin(x).at[3].set(x[0] * x[1]),
        lambda x: jnp.sin(x).at[jnp.array([1, 100])].add(x[:2] * 3),  # dropped
    )
)
case("scatter add", "test_scatter::test_scatter_add", 12)(
    together(
        lambda x: (
            jnp.zeros((2,))
            .at[jnp.array([0, 1, 0, 1])]
            .add(jnp.sqrt(jnp.sum(jnp.square(x.reshape(-1, 3)), axis=1)))
        ),
        lambda x: jnp.sin(x).at[_DUP].add(x[:3] ** 2),
        lambda x: (
            jnp.sin(x)
            .reshape(4, 3)
            .at[jnp.array([0, 2])]
            .add(jnp.cos(x[:6]).reshape(2, 3))
        ),
        lambda x: (
            jnp.sin(x)
            .reshape(4, 3)
            .at[jnp.array([0, 3, 0]), jnp.array([1, 2, 1])]
            .add(x[:3] * x[3:6])
        ),
        lambda x: jnp.sin(x).at[_DUP].add(2.5),
    )
)
case("scatter min and max", "test_scatter::test_scatter_min_max", 12)(
    together(
        lambda x: jnp.sin(x).at[_IDX].min(x[6:9] * 2),
        lambda x: jnp.sin(x).at[_IDX].max(x[6:9] * 2),
        lambda x: jnp.sin(x).at[_IDX].min(0.1),
        lambda x: jnp.sin(x).at[_IDX].max(-0.1),
    )
)
case("scatter with cumsum parts", "test_scatter::test_scatter_mixed_sparsity", 12)(
    together(
        lambda x: jnp.cumsum(x).at[_IDX].set(x[:3] * 2),
        lambda x: jnp.sin(x).at[_IDX].set(jnp.cumsum(x)[:3]),
        lambda x: jnp.cumsum(x).at[_IDX].add(x[:3] * 2),
        lambda x: jnp.sin(x).at[_IDX].add(jnp.cumsum(x)[:3]),
        lambda x: jnp.sin(x).at[_IDX].min(jnp.cumsum(x)[:3]),
    )
)
case("dynamic_update_slice", "test_scatter::test_dynamic_update_slice", 12)(
    together(
        lambda x: lax.dynamic_update_slice(jnp.sin(x), x[:3] * 2, (4,)),
        lambda x: lax.dynamic_update_slice(jnp.sin(x), jnp.ones(3), (4,)),
    )
)
case("scatter summed under jit", "test_scatter::test_scatter_jit_laplacian", 12)(
    lambda x: jax.jit(lambda v: jnp.sum(_rows_into_zeros(v)))(x)
)


# --- test_index_mask.py: which output reads which input ------------------------------
# folx's test checks the index bookkeeping of its sparse Jacobians; the property it
# protects is that each derivative lands at the input it came from. Gathers with
# repeated, negative and constant indices check that placement here.

_GATHER = jnp.array([[4, 0, 4], [-1, 2, 2]])
case("gather placement", "test_index_mask", 6)(
    together(
        lambda x: jnp.sin(x[_GATHER]) * x[_GATHER[::-1]],
        lambda x: (
            jnp.take_along_axis(x.reshape(2, 3), jnp.array([[2, 2, 0], [1, 0, 1]]), 1)
            ** 3
        ),
    )
)

# --- test_shard_map.py: integer_pow with exponent 1 (folx issue 38) ---------------------
# (inside shard_map: test_inside_shard_map below)
_W_POW = _normal(6, 6)
case("integer_pow 1", "test_shard_map", 6)(
    lambda x: lax.integer_pow(x @ _W_POW, 1) ** 2
)


# --- issue 26: loops, integer outputs, custom rules, degenerate inputs ---------------


@case("scan", "issue 26", 6)
def _scan(x):
    def step(c, xi):
        c = jnp.tanh(c * xi + 0.3 * c**2)
        return c, c * xi

    c, ys = lax.scan(step, x[:2], x.reshape(3, 2))
    return jnp.sum(ys**2) + jnp.sum(c)


case("fori_loop", "issue 26", 6)(
    lambda x: jnp.sum(lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c * x + 0.1 * i), x))
)

_NO_REVERSE = "reverse mode does not apply to lax.while_loop (JAX raises ValueError)"


@case(
    "while_loop",
    "issue 26",
    6,
    skip=dict.fromkeys(("hessian", "loop", "vmap", "hutchinson"), _NO_REVERSE),
)
def _while(x):
    def body(state):
        i, c = state
        return i + 1, jnp.sin(c) * x + c

    return jnp.sum(lax.while_loop(lambda s: s[0] < 3, body, (0, x))[1] ** 2)


case("lax.map", "issue 26", 6)(
    lambda x: lax.map(lambda r: jnp.sum(jnp.sin(r) * r), x.reshape(3, 2)) ** 2
)
case("cond and checkpoint", "issue 26", 6)(
    together(
        lambda x: lax.cond(x[0] > 0, lambda v: jnp.sin(v) * v, lambda v: v**3, x),
        lambda x: jax.checkpoint(lambda v: jnp.tanh(v) ** 2 * v[0])(x),
    )
)
case("integer intermediate", "issue 26", 6)(
    lambda x: x**2 * (jnp.floor(3 * x).astype(jnp.int32) % 2) + jnp.argmax(x)
)
case("integer output", "issue 26", 6)(
    lambda x: jnp.floor(3 * x).astype(jnp.int32) + jnp.argmax(x)
)
case("boolean output", "issue 26", 6)(lambda x: x > 0.1)


@jax.custom_jvp
def _softplus(x):
    return jnp.logaddexp(x, 0.0)


@_softplus.defjvp
def _softplus_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    return _softplus(x), jax.nn.sigmoid(x) * dx


case("custom_jvp softplus", "issue 26", 6)(lambda x: _softplus(x) * x)


@jax.custom_vjp
def _straight_through_round(x):
    return jnp.round(x)


def _st_fwd(x):
    return jnp.round(x), None


def _st_bwd(_, g):
    return (g,)  # identity backward: the derivative of round is taken to be 1


_straight_through_round.defvjp(_st_fwd, _st_bwd)
case("straight-through custom_vjp", "issue 26", 6)(
    lambda x: jnp.sin(x) * _straight_through_round(2 * x)
)
case("complex abs of a sum", "issue 26", 6)(lambda x: jnp.abs(_to_complex(x)) ** 2)
case("constant", "issue 26", 6)(lambda x: jnp.float64(2.5) * jnp.ones(3))
case("size-0 input", "issue 26", 0)(lambda x: jnp.sum(x**2) + jnp.cos(jnp.sum(x)))

CASE_BY_NAME = {c.name: c for c in CASES}
assert len(CASE_BY_NAME) == len(CASES), "case names must be unique"


# --- the reference, and the methods, one compiled program per case -------------------


def _point(c: Case) -> np.ndarray:
    """The case's point: standard normal, seeded by the case's name."""
    return np.random.default_rng(zlib.crc32(c.name.encode())).normal(size=c.d)


def _weights(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The fixed generic weights ``w, w'`` of :func:`_project`, shaped like ``fn``'s output."""
    rng = np.random.default_rng(1000)
    return rng.normal(size=shape), rng.normal(size=shape)


def _project(c: Case, y: jax.Array) -> jax.Array:
    """``sum(w * Re y) + sum(w' * Im y)`` with fixed generic weights ``w, w'`` shaped like
    ``fn``'s output (integer outputs cast to float)."""
    w_re, w_im = _weights(y.shape)
    if jnp.issubdtype(y.dtype, jnp.complexfloating):
        return jnp.sum(w_re * jnp.real(y)) + jnp.sum(w_im * jnp.imag(y))
    return jnp.sum(w_re * y.astype(jnp.float64))


def _project_jacobian(jac: jax.Array) -> jax.Array:
    """The gradient of the scalar functional from ``fn``'s Jacobian ``(*out, d)``: the
    same projection applied to each column (the weights are constants)."""
    w_re, w_im = (w[..., None] for w in _weights(jac.shape[:-1]))
    axes = tuple(range(jac.ndim - 1))
    if jnp.issubdtype(jac.dtype, jnp.complexfloating):
        return jnp.sum(w_re * jnp.real(jac), axes) + jnp.sum(w_im * jnp.imag(jac), axes)
    return jnp.sum(w_re * jac.astype(jnp.float64), axes)


def _scalar(c: Case) -> Callable[[jax.Array], jax.Array]:
    """``x -> _project(fn(x))``: a real scalar that every output entry enters (integer
    outputs: zero derivatives)."""
    return lambda x: _project(c, c.fn(x))


def _jacobian(f: Callable, x: jax.Array) -> jax.Array:
    """``jax.jacfwd`` (forward mode does not apply to custom_vjp: ``jax.jacrev`` there)."""
    try:
        return jax.jacfwd(f)(x)
    except (
        TypeError
    ):  # "can't apply forward-mode autodiff (jvp) to a custom_vjp function"
        return jax.jacrev(f)(x)


def _hessian(c: Case, f: Callable, x: jax.Array) -> jax.Array:
    """``jax.hessian``; ``jacfwd(jacfwd)`` where reverse mode does not apply (the case
    skips the reverse-mode methods: while_loop, on which ``jax.hessian`` raises
    ValueError on JAX 0.12.0.1 and TypeError on 0.8.2)."""
    if "hessian" in c.skip:
        return jax.jacfwd(jax.jacfwd(f))(x)
    return jax.hessian(f)(x)


def _reference(c: Case, x: jax.Array) -> dict[str, jax.Array]:
    """Value and Jacobian ``(*out, d)`` of ``fn``; gradient and Hessian of the scalar
    functional (whose trace is the projected Laplacian of ``fn``). The gradient is the
    Jacobian projected (:func:`_project_jacobian`): forward mode, like the Jacobian, and
    no second Jacobian of ``fn`` in the program."""
    val = c.fn(x)
    if jnp.issubdtype(val.dtype, jnp.inexact):
        jac = _jacobian(c.fn, x)
    else:  # integer or boolean outputs: no derivatives
        jac = jnp.zeros((*val.shape, c.d))
    grad = _project_jacobian(jac)
    return {"val": val, "jac": jac, "grad": grad, "hess": _hessian(c, _scalar(c), x)}


def _options(method: str) -> dict:
    if method == "hutchinson":
        return {
            "key": hutchinson_key(),
            "num_samples": HUTCHINSON_SAMPLES,
        }
    return {}


def _run(c: Case, method: str, x: jax.Array) -> dict[str, jax.Array]:
    if method == "forward_laplacian":
        val, jac, lap = FL.forward_laplacian(c.fn, x)
        # the Laplacian of every entry, projected as the scalar functional projects fn
        return {"val": val, "jac": jac, "slap": _project(c, lap)}
    grad, lap = L.grad_and_laplacian(_scalar(c), x, method=method, **_options(method))
    return {"grad": grad, "slap": lap}


@functools.cache
def results(name: str) -> tuple[dict, dict[str, BaseException]]:
    """The reference and every method on case ``name``, as NumPy arrays, from one jitted
    program (one compilation per case, the tests of its methods share it; compilation
    is nearly all of this file's time); a method that raises while being traced (folx
    where it does not apply) is left out of the program and its error kept."""
    c = CASE_BY_NAME[name]
    errors: dict[str, BaseException] = {}

    def program(x: jax.Array) -> dict:
        out = {"reference": _reference(c, x)}
        for method in METHODS:
            if method in c.skip:
                continue
            try:
                out[method] = _run(c, method, x)
            except Exception as e:  # kept for the method's test to raise
                errors[method] = e
        return out

    with jax.enable_x64(True):
        x = jnp.asarray(_point(c))
        out = jax.tree.map(np.asarray, compiled(program, x)(x))
        probes = L.hutchinson_probes(hutchinson_key(), x, HUTCHINSON_SAMPLES)
        out["probes"] = np.asarray(probes)
    return out, errors


def expected(name: str, method: str) -> dict[str, np.ndarray]:
    out, _ = results(name)
    ref = out["reference"]
    slap = np.asarray(np.trace(ref["hess"]) if ref["hess"].size else 0.0)
    if method == "forward_laplacian":
        return {"val": ref["val"], "jac": ref["jac"], "slap": slap}
    if method == "hutchinson":  # the same probes, applied to the reference Hessian
        v = out["probes"]
        if v.size:
            slap = np.mean(np.einsum("si,ij,sj->s", v, ref["hess"], v))
    return {"grad": ref["grad"], "slap": np.asarray(slap)}


def error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """``max |got - want| / max(1, max |want|)`` over the compared arrays."""
    worst = 0.0
    for k, w in want.items():
        g = got[k]
        assert np.shape(g) == np.shape(w), f"{k}: shape {np.shape(g)} != {np.shape(w)}"
        if np.size(w) == 0:
            continue
        gap = float(np.max(np.abs(g.astype(complex) - w.astype(complex))))
        worst = max(worst, gap / max(1.0, float(np.max(np.abs(w)))))
    return worst


# --- tolerances: 10 x the largest error measured over all methods, both JAX versions --

#: the largest error measured per case, over every method that runs and is right, on
#: JAX 0.12.0.1 (folx 0.2.30) and 0.8.2 (folx 0.2.24), CPU, float64; the float16 and
#: float32 cases measure those types' rounding. Measured on 2026-11-26 with this file's
#: ``method_result``/``expected``/``error`` (programs compiled with
#: :data:`FAST_COMPILE`, the ``rbg`` Hutchinson key, the gradient from the Jacobian):
#: the complex-abs and custom_vjp errors of 0.59 to 2.1 that the interpreter had before
#: the engine branch are gone; a folx that raises or is wrong (:data:`FOLX_WRONG`) is
#: left out
MEASURED: dict[str, float] = {
    "sum": 0,
    "cholesky": 8.4e-16,
    "cumlogsumexp": 4e-16,
    "elementwise": 2.3e-16,
    "elementwise complex": 6.5e-16,
    "elementwise complex abs": 1.6e-15,
    "binary": 2e-16,
    "binary complex": 4e-16,
    "matmul": 1.6e-16,
    "matmul both depend on x": 1.3e-15,
    "einsum degenerate broadcasts": 3.7e-16,
    "dot_general preferred_element_type": 5.3e-08,
    "dot": 3.2e-16,
    "slogdet": 2.4e-15,
    "slogdet sign complex": 8.6e-16,
    "slogdet sparsity patterns": 6.2e-16,
    "det": 2.5e-16,
    "solve": 3.3e-16,
    "inv": 3.9e-16,
    "convert to float16": 0.00032,
    "convert to float32, complex64, complex128": 2.4e-07,
    "several outputs": 3.7e-16,
    "split, pad, add_any": 9.9e-16,
    "elementwise real-only": 2.1e-16,
    "piecewise and cumulative": 4.3e-17,
    "cumprod": 2.1e-16,
    "indexing": 1.5e-16,
    "complex parts and mlp": 3.6e-16,
    "complex abs": 1.1e-15,
    "custom_jvp rule used": 1.5e-16,
    "mlp": 3.1e-16,
    "attention, plain and weighted": 1.2e-14,
    "scatter set": 2e-15,
    "scatter add": 1.1e-15,
    "scatter min and max": 3.3e-16,
    "scatter with cumsum parts": 3.2e-16,
    "dynamic_update_slice": 2.8e-16,
    "scatter summed under jit": 4.7e-16,
    "gather placement": 1.6e-16,
    "integer_pow 1": 5.1e-16,
    "scan": 2.8e-16,
    "fori_loop": 2.1e-16,
    "while_loop": 2.3e-16,
    "lax.map": 1.3e-16,
    "cond and checkpoint": 3.9e-16,
    "integer intermediate": 1.4e-16,
    "integer output": 0,
    "boolean output": 0,
    "custom_jvp softplus": 4.7e-16,
    "straight-through custom_vjp": 3.3e-16,
    "complex abs of a sum": 8.7e-17,
    "constant": 0,
    "size-0 input": 0,
}
FLOOR = 1e-15


def tolerance(name: str) -> float:
    return max(10 * MEASURED[name], FLOOR)


#: (case, method) pairs that fail because of a defect of our forward-Laplacian
#: interpreter (strict: the day they pass, the test says so). Empty since the engine
#: branch's interpreter: before it, complex abs (the cases "elementwise complex abs",
#: "complex abs", "complex abs of a sum": errors 0.59 to 2.1, abs treated as
#: holomorphic) and "straight-through custom_vjp" (0.8: the primal round was
#: differentiated, not the backward rule) failed here.
INTERPRETER_DEFECTS: dict[tuple[str, str], str] = {}


#: cases on which an installed folx returned a wrong value (a folx bug, not ours): an
#: xfail when it does, a pass where the installed folx gets it right
FOLX_WRONG: dict[str, str] = {
    "cumprod": "folx 0.2.24 (with JAX 0.8.2) gives 6.25 where the Hessian trace is "
    "0.026, as if cumprod were elementwise; folx 0.2.30 (JAX 0.12.0.1) is right",
    "cholesky": "folx 0.2.24 (with JAX 0.8.2) is wrong (review 26: -0.17809 vs "
    "-0.16061 on sum(log(diag(cholesky))); laplacian.FOLX_PROBES measures it)",
    "cumlogsumexp": "folx 0.2.24 (with JAX 0.8.2) is wrong (review 26: 5.6e-16 vs "
    "5.7725 on sum(cumlogsumexp); laplacian.FOLX_PROBES measures it)",
}


def _params():
    for c in CASES:
        for m in METHODS:
            marks = []
            reason = INTERPRETER_DEFECTS.get((c.name, m))
            if reason is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            yield pytest.param(c.name, m, id=f"{c.name}-{m}", marks=marks)


def method_result(name: str, method: str) -> dict[str, np.ndarray]:
    """What ``method`` computes on case ``name`` (raises what the method raised)."""
    out, errors = results(name)
    if method in errors:
        raise errors[method]
    return out[method]


@pytest.mark.parametrize("name,method", list(_params()))
def test_case_matches_float64_reference(name, method):
    c = CASE_BY_NAME[name]
    if method in c.skip:
        pytest.skip(c.skip[method])
    try:
        got = method_result(name, method)
    except Exception as e:
        if method == "folx":  # decided by trying: folx does not run this case here
            pytest.xfail(f"folx fails on this JAX: {type(e).__name__}: {str(e)[:120]}")
        raise
    err = error(got, expected(name, method))
    if method == "folx" and err > tolerance(name) and name in FOLX_WRONG:
        pytest.xfail(f"folx is wrong here (error {err:.3g}): {FOLX_WRONG[name]}")
    assert err <= tolerance(name), f"error {err:.3g} > tolerance {tolerance(name):.3g}"


# --- test_vmap.py and test_shard_map.py: the same numbers batched and sharded --------


def _laplacian_of(f: Callable, method: str) -> Callable[[jax.Array], jax.Array]:
    """``x -> Laplacian of f at x`` by ``method`` (scalar ``f``)."""
    if method == "forward_laplacian":
        return lambda x: FL.forward_laplacian(f, x)[2]
    return lambda x: L.laplacian(f, x, method=method, **_options(method))


def _call_or_xfail(method: str, thunk: Callable) -> np.ndarray:
    try:
        return np.asarray(thunk())
    except Exception as e:
        if method == "folx":
            pytest.xfail(f"folx fails on this JAX: {type(e).__name__}: {str(e)[:120]}")
        raise


@pytest.mark.parametrize("method", METHODS)
def test_batched_as_one_at_a_time(method):
    """folx's test_vmap (its chunked ``batched_vmap`` equals ``vmap``, batch sizes that
    do and do not divide the batch): here ``vmap`` and ``lax.map`` with
    ``batch_size`` 1, 3 (7 points: uneven) and 7 give the numbers of one point at a
    time. Measured largest relative difference (over the batchings and methods) 2.4e-15
    on JAX 0.12.0.1, 1.9e-15 on 0.8.2: bound 2.5e-14."""
    f = _mlp
    lap = _laplacian_of(f, method)
    with jax.enable_x64(True):
        xs = jnp.asarray(np.random.default_rng(5).normal(size=(7, 8)))
        one = _call_or_xfail(
            method, lambda: np.stack(list(map(compiled(lap, xs[0]), xs)))
        )

        def batchings(v: jax.Array) -> dict[str, jax.Array]:  # one program, not four
            out = {"vmap": jax.vmap(lap)(v)}
            for size in (1, 3, 7):
                out[f"lax.map {size}"] = lax.map(lap, v, batch_size=size)
            return out

        batched = compiled(batchings, xs)(xs)
    scale = max(1.0, float(np.max(np.abs(one))))
    gaps = {
        label: float(np.max(np.abs(np.asarray(got) - one))) / scale
        for label, got in batched.items()
    }
    assert max(gaps.values()) <= 2.5e-14, f"relative differences {gaps}"


@pytest.mark.parametrize("method", METHODS)
def test_inside_shard_map(method):
    """folx's test_shard_map (folx issue 38: ``integer_pow`` with exponent 1 inside
    ``shard_map`` over a vmapped batch): the Laplacians computed per shard equal the
    float64 Hessian trace of each point (for ``"hutchinson"``: the same probes applied to
    the float64 Hessian). Measured largest relative error 4.3e-16 (JAX 0.12.0.1),
    1.3e-15 (0.8.2), over the methods: bound 1.4e-14."""
    mesh = runtime.demo_mesh(4, "data")

    def f(w, x):
        return jnp.sum(jnp.tanh(lax.integer_pow(x @ w, 1)) ** 2)

    with jax.enable_x64(True):
        w = jnp.asarray(_W_POW)
        xs = jnp.asarray(np.random.default_rng(6).normal(size=(8, 6)))
        hessians = np.asarray(jax.vmap(lambda x: jax.hessian(f, 1)(w, x))(xs))
        want = np.trace(hessians, axis1=-2, axis2=-1)
        if method == "hutchinson":  # the same probes, applied to the float64 Hessian
            v = np.asarray(
                L.hutchinson_probes(hutchinson_key(), xs[0], HUTCHINSON_SAMPLES)
            )
            want = np.mean(np.einsum("si,bij,sj->bs", v, hessians, v), axis=-1)

        def per_shard(w, block):
            return jax.vmap(
                lambda x: _laplacian_of(functools.partial(f, w), method)(x)
            )(block)

        sharded = jax.shard_map(
            per_shard, mesh=mesh, in_specs=(P(), P("data")), out_specs=P("data")
        )
        got = _call_or_xfail(method, lambda: compiled(sharded, w, xs)(w, xs))
    gap = float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want))))
    assert gap <= 1.4e-14, f"relative error {gap:.3g}"
