"""Slater-determinant wavefunctions and their VMC energy and gradient (Chapter 5).

Conventions
-----------
* ``positions`` are ``(n, 3)``: electron ``i`` sits at ``positions[i]``.
* ``orbitals(r)`` maps one position ``r`` of shape ``(3,)`` to the ``n`` single-particle
  orbital values :math:`(\\varphi_1(r),\\dots,\\varphi_n(r))`.
* The Slater matrix is :math:`A_{ij}=\\varphi_j(r_i)` and :math:`\\psi=\\det A`; we only
  ever form :math:`\\log|\\psi|` (``jnp.linalg.slogdet``).
* A wavefunction ``log_psi(params, positions) -> scalar`` takes ``(n, 3)`` positions.
  :func:`mlp_log_psi` is a ready-made one, with parameters from :func:`init_params`.

Local energy (atomic units, ħ = m = e = 1) of ``n`` electrons in a harmonic trap
(frequency ``omega``) that repel each other by Coulomb's law:

.. math::
   E_L(x) &= -\\tfrac12\\big(\\Delta\\log|\\psi| + |\\nabla\\log|\\psi||^2\\big) \\\\
            &\\quad + \\tfrac12\\omega^2\\sum_i |r_i|^2 + \\sum_{i<j} \\frac1{|r_i-r_j|}.

The gradient returned by :func:`energy_and_grad` is, by default (``estimator="vmc"``),
the VMC estimator :math:`2\\,\\mathbb{E}[(E_L-\\bar E)\\nabla_\\theta\\log|\\psi|]` of the
gradient of the energy expectation :math:`\\langle\\psi|H|\\psi\\rangle/\\langle\\psi|\\psi\\rangle`
with walkers drawn from :math:`|\\psi|^2`. With ``estimator="direct"`` it is the gradient
of the batch mean of :math:`E_L` (differentiating through the Laplacian), which is a
different quantity: right for a fixed set of points, not for the variational energy.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import compat
from beyondgrad.laplacian import Method, _check_method, basis, kinetic_energy

__all__ = [
    "Estimator",
    "Params",
    "energy_and_grad",
    "forward_laplacian",
    "init_params",
    "local_energy",
    "mlp_log_psi",
    "mlp_orbitals",
    "mlp_slater_laplacian",
    "orbital_derivatives",
    "orbital_derivatives_fwdfwd",
    "potential_energy",
    "row_formula",
    "sample_walkers",
    "sharded_energy_and_grad",
    "slater_laplacian",
    "slater_log_psi",
    "slater_matrix",
    "walker_keys",
]

#: parameters of a wavefunction: any pytree of arrays (``init_params`` makes a dict)
Params = Any
Estimator = Literal["vmc", "direct"]


def _check_positions(positions: jax.Array) -> jax.Array:
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[1] != 3:
        raise ValueError(
            f"positions must have shape (n, 3) (n electrons in 3-D), got {positions.shape}"
        )
    if not jnp.issubdtype(positions.dtype, jnp.floating):
        raise TypeError(
            f"positions must be a floating-point array, got dtype {positions.dtype}"
        )
    return positions


_ALL_ELECTRONS_HINT = (
    "slater_laplacian and slater_matrix need single-particle orbitals, orbitals(r) with r "
    "of shape (3,) (one electron). For orbitals that depend on all electrons (as in "
    "FermiNet) the row structure does not hold: use "
    "laplacian.laplacian(lambda v: log_psi(v.reshape(n, 3)), x.reshape(-1), "
    "method='folx') instead"
)


def _check_orbitals(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> None:
    """Cheap structural check (one abstract evaluation, no FLOPs): ``orbitals(r (3,)) -> (n,)``."""
    if not callable(orbitals):
        raise TypeError(
            f"orbitals must be a function r (3,) -> (n,), got {type(orbitals).__name__}"
        )
    n = positions.shape[0]
    try:
        out = jax.eval_shape(orbitals, jax.ShapeDtypeStruct((3,), positions.dtype))
    except Exception as e:  # e.g. a function written for (n, 3) positions
        raise ValueError(
            f"orbitals failed on one electron's position of shape (3,) "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). {_ALL_ELECTRONS_HINT}"
        ) from e
    shape = getattr(out, "shape", None)
    if shape != (n,):
        got = shape if shape is not None else type(out).__name__
        raise ValueError(
            f"orbitals must map one position (3,) to the {n} orbital values (n,) for n = {n} "
            f"electrons, got output shape {got}. {_ALL_ELECTRONS_HINT}"
        )


def slater_matrix(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """The Slater matrix :math:`A_{ij}=\\varphi_j(r_i)`, shape ``(n, n)``."""
    positions = _check_positions(positions)
    _check_orbitals(orbitals, positions)
    return jax.vmap(orbitals)(positions)


def slater_log_psi(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> jax.Array:
    """:math:`\\log|\\det A|` with :math:`A_{ij}=\\varphi_j(r_i)` (``slogdet``, never ``log(det)``)."""
    return jnp.linalg.slogdet(slater_matrix(orbitals, positions))[1]


# ---------------------------------------------------------------------------------------
# The forward Laplacian of a function of one electron


class _Jet(NamedTuple):
    """A value that depends on the input ``r`` (shape ``(d,)``), with its derivatives.

    ``jac[k]`` is :math:`\\partial v/\\partial r_k` (shape ``(d, *v.shape)``) and ``lap``
    is :math:`\\sum_k \\partial^2 v/\\partial r_k^2` (``None``: known to be zero).
    Values that do not depend on ``r`` are kept as plain arrays.
    """

    val: jax.Array
    jac: jax.Array
    lap: jax.Array | None


#: primitives linear in the inputs at these positions (the other inputs must not depend on r)
_LINEAR = {
    **dict.fromkeys(
        [
            "neg",
            "reshape",
            "broadcast_in_dim",
            "transpose",
            "squeeze",
            "expand_dims",
            "slice",
            "convert_element_type",
            "copy",
            "copy_p",
            "rev",
            "real",
            "cumsum",
            "reduce_precision",
            "dynamic_slice",
            "gather",
            "sharding_constraint",
            "pvary",
            "pcast",
        ],
        (0,),
    ),
    "add": (0, 1),
    "sub": (0, 1),
    "add_any": (0, 1),
    "pad": (0, 1),
    "dynamic_update_slice": (0, 1),
    "scatter-add": (0, 2),
    "scatter_add": (0, 2),
}
#: bilinear primitives: linear in each input when the other one is fixed
_BILINEAR = {"mul", "dot_general"}
#: elementwise functions of one input: f' and f'' from forward over forward mode
_UNARY = {
    "tanh",
    "exp",
    "exp2",
    "log",
    "log1p",
    "expm1",
    "sin",
    "cos",
    "tan",
    "logistic",
    "sqrt",
    "rsqrt",
    "cbrt",
    "integer_pow",
    "square",
    "erf",
    "erfc",
    "atan",
    "asin",
    "acos",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "lgamma",
    "digamma",
    "abs",
}
#: primitives holding a sub-jaxpr that is interpreted in place (custom rules are not used:
#: the primal program is differentiated, as forward-mode JAX does for custom_vjp)
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
}


def _is_float(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _zeros_if_none(lap: jax.Array | None, like: jax.Array) -> jax.Array:
    return jnp.zeros_like(like) if lap is None else lap


def _linear_rule(apply: Callable, ins: list, positions: tuple[int, ...]) -> list:
    """``apply`` is linear in the inputs at ``positions`` (the others do not depend on r)."""
    vals = [x.val if isinstance(x, _Jet) else x for x in ins]
    outs = apply(vals)

    def with_(parts: dict[int, jax.Array]) -> list:
        return apply(
            [parts.get(k, v) if k in positions else v for k, v in enumerate(vals)]
        )

    dep = [k for k in positions if k < len(ins) and isinstance(ins[k], _Jet)]
    zero = {
        k: jnp.zeros_like(vals[k]) for k in positions if k < len(ins) and k not in dep
    }
    jacs = jax.vmap(lambda *js: with_({**zero, **dict(zip(dep, js))}))(
        *[ins[k].jac for k in dep]
    )
    if all(ins[k].lap is None for k in dep):
        laps = [None] * len(outs)
    else:
        laps = with_({**zero, **{k: _zeros_if_none(ins[k].lap, vals[k]) for k in dep}})
    return [_Jet(o, j, lp) if _is_float(o) else o for o, j, lp in zip(outs, jacs, laps)]


#: summed axes at most this long are summed slice by slice (see :func:`_sum_axes`)
_UNROLL_SUM = 16


def _sum_axes(x: jax.Array, axes: tuple[int, ...]) -> jax.Array:
    """``jnp.sum(x, axes)``, short axes as a sum of their slices (elementwise adds).

    Short reductions (3 coordinates, 10 polynomial terms) are the common case in
    orbitals; as adds they fuse with their neighbours instead of being a separate
    reduction over a short innermost axis, which the CPU compiler does slowly.
    """
    long_axes = tuple(a for a in axes if x.shape[a] > _UNROLL_SUM)
    short = sorted((a for a in axes if x.shape[a] <= _UNROLL_SUM), reverse=True)
    if long_axes:
        x = jnp.sum(x, axis=long_axes, keepdims=True)
    for a in short:  # from the last axis, so earlier axis numbers stay valid
        parts = [
            jax.lax.index_in_dim(x, k, a, keepdims=False) for k in range(x.shape[a])
        ]
        x = functools.reduce(jnp.add, parts) if parts else jnp.sum(x, axis=a)
    return jnp.squeeze(x, axis=tuple(a - sum(b < a for b in short) for a in long_axes))


def _reduce_sum_rule(x: _Jet, axes: tuple[int, ...]) -> list:
    """``reduce_sum`` is linear: the same sum of each part (jac's axes are shifted by one)."""
    jac = _sum_axes(x.jac, tuple(a + 1 for a in axes))
    lap = None if x.lap is None else _sum_axes(x.lap, axes)
    return [_Jet(_sum_axes(x.val, axes), jac, lap)]


def _bilinear_rule(apply: Callable, a: _Jet, b: _Jet) -> list:
    """``apply(a, b)`` bilinear, both inputs depending on r: the product rule, twice."""
    (out,) = apply([a.val, b.val])
    jac = jax.vmap(lambda ja, jb: apply([ja, b.val])[0] + apply([a.val, jb])[0])(
        a.jac, b.jac
    )
    cross = _sum_axes(jax.vmap(lambda ja, jb: apply([ja, jb])[0])(a.jac, b.jac), (0,))
    lap = 2.0 * cross
    if a.lap is not None:
        lap = lap + apply([a.lap, b.val])[0]
    if b.lap is not None:
        lap = lap + apply([a.val, b.lap])[0]
    return [_Jet(out, jac, lap)]


def _unary_rule(apply: Callable, x: _Jet) -> list:
    """Elementwise ``f``: jac = f'(x) jac_x, lap = f'(x) lap_x + f''(x) sum_k jac_x[k]^2."""
    ones = jnp.ones_like(x.val)

    def slope(v: jax.Array) -> tuple[jax.Array, jax.Array]:
        return jax.jvp(lambda u: apply([u])[0], (v,), (ones,))

    (out, d1), (_, d2) = jax.jvp(slope, (x.val,), (ones,))
    lap = d2 * _sum_axes(x.jac * x.jac, (0,))
    if x.lap is not None:
        lap = lap + d1 * x.lap
    return [_Jet(out, d1 * x.jac, lap)]


def _generic_rule(apply: Callable, ins: list) -> list:
    """Any primitive: forward over forward mode on it alone, along each jac direction."""
    vals = [x.val if isinstance(x, _Jet) else x for x in ins]
    dep = [k for k, x in enumerate(ins) if isinstance(x, _Jet)]

    def f(*dep_vals: jax.Array) -> list:
        full = list(vals)
        for k, v in zip(dep, dep_vals):
            full[k] = v
        return apply(full)

    primals = tuple(vals[k] for k in dep)

    def along(*tangents: jax.Array) -> tuple[list, list]:
        def first(*p: jax.Array) -> list:
            return jax.jvp(f, p, tangents)[1]

        return jax.jvp(first, primals, tangents)

    outs = f(*primals)
    float_out = [_is_float(o) for o in outs]
    if not any(float_out):
        return outs
    firsts, seconds = jax.vmap(along)(*[ins[k].jac for k in dep])
    laps_in = tuple(_zeros_if_none(ins[k].lap, vals[k]) for k in dep)
    _, lin = jax.jvp(f, primals, laps_in)
    return [
        _Jet(o, j, lp + _sum_axes(s, (0,))) if fl else o
        for o, j, s, lp, fl in zip(outs, firsts, seconds, lin, float_out)
    ]


def _forward_laplacian_jaxpr(jaxpr: Any, consts: list, args: list) -> list:
    """Interpret ``jaxpr`` on inputs that are arrays or :class:`_Jet` s."""
    env: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts):
        env[var] = value
    for var, value in zip(jaxpr.invars, args):
        env[var] = value
    for eqn in jaxpr.eqns:
        ins = [compat.jaxpr_atom_value(a, env) for a in eqn.invars]
        name = eqn.primitive.name

        def apply(invals: list, eqn: Any = eqn) -> list:
            return compat.bind_equation(eqn, invals)

        dep = [k for k, x in enumerate(ins) if isinstance(x, _Jet)]
        if not dep:
            outs = apply(ins)
        elif name in _CALLS and _CALLS[name] in eqn.params:
            sub = eqn.params[_CALLS[name]]
            inner, inner_consts = (
                (sub.jaxpr, list(sub.consts)) if hasattr(sub, "consts") else (sub, [])
            )
            outs = _forward_laplacian_jaxpr(inner, inner_consts, ins)
        elif name == "reduce_sum":  # linear; short axes summed slice by slice
            outs = _reduce_sum_rule(ins[0], tuple(eqn.params["axes"]))
        elif name in _LINEAR and set(dep) <= set(_LINEAR[name]):
            outs = _linear_rule(apply, ins, _LINEAR[name])
        elif name == "select_n" and 0 not in dep:  # piecewise linear in the cases
            outs = _linear_rule(apply, ins, tuple(range(1, len(ins))))
        elif name in ("concatenate", "stack"):  # newer JAX has a stack primitive
            outs = _linear_rule(apply, ins, tuple(range(len(ins))))
        elif name in _BILINEAR and len(dep) == 1:
            outs = _linear_rule(apply, ins, tuple(dep))
        elif name in _BILINEAR:
            outs = _bilinear_rule(apply, ins[0], ins[1])
        elif name == "div" and dep == [0]:
            outs = _linear_rule(apply, ins, (0,))
        elif name in _UNARY and len(ins) == 1:
            outs = _unary_rule(apply, ins[0])
        else:
            outs = _generic_rule(apply, ins)
        for var, value in zip(eqn.outvars, outs):
            env[var] = value
    return [compat.jaxpr_atom_value(a, env) for a in jaxpr.outvars]


def forward_laplacian(
    fn: Callable[[jax.Array], jax.Array], r: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(f(r), ∂f/∂r, Σ_k ∂²f/∂r_k²)`` of ``fn`` at a 1-D ``r``, in one forward pass.

    The forward Laplacian (Li et al., Nature Machine Intelligence 2024): every
    intermediate value :math:`v` travels with its Jacobian :math:`\\partial v/\\partial r`
    (``d`` rows) and its Laplacian :math:`\\Delta v`, and each operation maps the triple
    on: a linear map applies to all three, a product :math:`ab` gives
    :math:`\\Delta(ab) = a\\Delta b + b\\Delta a + 2\\sum_k\\partial_k a\\,\\partial_k b`,
    an elementwise :math:`f` gives :math:`f'(v)\\Delta v + f''(v)\\sum_k(\\partial_k v)^2`,
    and any other operation is differentiated on its own by forward over forward mode.
    Values that do not depend on ``r`` (parameters) carry no derivatives. Compared with
    forward over forward mode along the ``d`` directions, the summed second derivative is
    carried once instead of ``d`` times, and no first derivative is computed twice.

    Returns shapes ``out``, ``(*out, d)`` (Jacobian, last axis = input coordinate) and
    ``out`` (``fn`` returns one array of shape ``out``).
    """
    r = jnp.asarray(r)
    if r.ndim != 1 or not jnp.issubdtype(r.dtype, jnp.floating):
        raise ValueError(
            f"r must be a 1-D floating-point array, got shape {r.shape}, dtype {r.dtype}"
        )
    val, jac, lap = _forward_laplacian_rows_first(fn, r)
    return val, jnp.moveaxis(jac, 0, -1), lap


def _forward_laplacian_rows_first(
    fn: Callable[[jax.Array], jax.Array], r: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`forward_laplacian` with the Jacobian's input axis first: ``(d, *out)``."""
    closed = jax.make_jaxpr(fn)(r)
    if len(closed.jaxpr.outvars) != 1:
        raise ValueError(
            f"fn must return one array, got {len(closed.jaxpr.outvars)} outputs"
        )
    (out,) = _forward_laplacian_jaxpr(
        closed.jaxpr, list(closed.consts), [_Jet(r, basis(r), None)]
    )
    if not isinstance(out, _Jet):  # fn does not depend on r
        out = _Jet(out, jnp.zeros((r.shape[0], *jnp.shape(out)), r.dtype), None)
    return out.val, out.jac, _zeros_if_none(out.lap, out.val)


def orbital_derivatives(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The Slater matrix and its row derivatives: :math:`\\varphi_j(r_i)`, :math:`\\nabla\\varphi_j(r_i)`, :math:`\\Delta\\varphi_j(r_i)`.

    One forward-Laplacian pass (:func:`forward_laplacian`) per electron, over its 3
    coordinates. Shapes ``(n, n)``, ``(n, n, 3)``, ``(n, n)``, indexed ``[i, j]`` =
    electron, orbital.
    """
    phi, dphi, lphi = _orbital_derivatives_rows_first(orbitals, positions)
    return phi, jnp.moveaxis(dphi, 1, -1), lphi


def _orbital_derivatives_rows_first(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`orbital_derivatives` with the gradient as ``(n, 3, n)`` (electron, coordinate, orbital)."""
    positions = _check_positions(positions)
    _check_orbitals(orbitals, positions)
    return jax.vmap(lambda r: _forward_laplacian_rows_first(orbitals, r))(positions)


def orbital_derivatives_fwdfwd(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`orbital_derivatives` by forward over forward mode along the 3 coordinate axes.

    The textbook route (and the reference the forward Laplacian is tested against): for
    each direction :math:`e_k`, ``jax.jvp`` of ``jax.jvp`` gives the first and second
    directional derivatives; the three second derivatives are summed at the end.
    """
    positions = _check_positions(positions)
    _check_orbitals(orbitals, positions)

    def derivatives(r: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        def along(e: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
            def value_and_slope(s: jax.Array) -> tuple[jax.Array, jax.Array]:
                return jax.jvp(orbitals, (s,), (e,))

            (value, first), (_, second) = jax.jvp(value_and_slope, (r,), (e,))
            return value, first, second

        value, first, second = jax.vmap(along)(basis(r))  # (3, n) each
        return value[0], first.T, jnp.sum(second, axis=0)

    return jax.vmap(derivatives)(positions)


def row_formula(
    phi: jax.Array, dphi: jax.Array, lphi: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(log|det A|, ∇log|det A|, Δlog|det A|)`` from :func:`orbital_derivatives`' three arrays.

    With :math:`B = A^{-1}` (one LU factorisation, which also gives the log-determinant):

    .. math::
       \\nabla_{r_i}\\log|\\det A| &= \\sum_j B_{ji}\\,\\nabla\\varphi_j(r_i), \\\\
       \\Delta\\log|\\det A| &= \\sum_{i,j} B_{ji}\\,\\Delta\\varphi_j(r_i)
           - |\\nabla\\log|\\det A||^2 .
    """
    n = phi.shape[0]
    if phi.shape != (n, n) or dphi.shape != (n, n, 3) or lphi.shape != (n, n):
        raise ValueError(
            f"expected shapes (n, n), (n, n, 3), (n, n) as returned by orbital_derivatives, "
            f"got {phi.shape}, {dphi.shape}, {lphi.shape}"
        )
    return _row_formula_rows_first(phi, jnp.moveaxis(dphi, -1, 1), lphi)


def _row_formula_rows_first(
    phi: jax.Array, dphi: jax.Array, lphi: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`row_formula` with the gradient as ``(n, 3, n)`` (electron, coordinate, orbital)."""
    logdet, b = _logdet_and_inverse(phi)
    grad = jnp.einsum("ji,idj->id", b, dphi)
    lap = jnp.einsum("ji,ij->", b, lphi) - jnp.sum(grad * grad)
    return logdet, grad, lap


def slater_laplacian(
    orbitals: Callable[[jax.Array], jax.Array], positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(log|ψ|, ∇log|ψ|, Δlog|ψ|)`` for single-particle orbitals, in :math:`O(n^3)`.

    Electron :math:`i` only enters row :math:`i` of :math:`A`, so the derivatives of
    :math:`\\log|\\det A|` need only the orbitals' own value, gradient and Laplacian at
    each electron (:func:`orbital_derivatives`: one forward-Laplacian pass per electron
    over its 3 coordinates) and :math:`A^{-1}` (:func:`row_formula`: one LU factorisation
    gives both :math:`\\log|\\det A|` and :math:`A^{-1}`). ``orbitals`` is any JAX
    function ``r (3,) -> (n,)``; no hand-written derivatives are needed.

    Shapes: scalar, ``(n, 3)``, scalar. Only valid when each orbital depends on one
    electron: orbitals of all electrons at once (as in FermiNet) are rejected with a
    ``ValueError`` (the check evaluates ``orbitals`` abstractly on one ``(3,)``
    position); for those use ``laplacian.laplacian(..., method="folx")``.
    """
    return _row_formula_rows_first(
        *_orbital_derivatives_rows_first(orbitals, positions)
    )


def _logdet_and_inverse(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(log|det a|, a^{-1})`` from one LU factorisation (the diagonal of U gives the log-determinant)."""
    lu, pivots = jax.scipy.linalg.lu_factor(a)
    logdet = jnp.sum(jnp.log(jnp.abs(jnp.diagonal(lu))))
    return logdet, jax.scipy.linalg.lu_solve((lu, pivots), _eye_like(a))


def _eye_like(a: jax.Array) -> jax.Array:
    """``eye(n)`` with ``a``'s dtype and varying mesh axes (a right-hand side solved against ``a``)."""
    return compat.pcast_varying(
        jnp.eye(a.shape[0], dtype=a.dtype), tuple(sorted(compat.varying_axes(a)))
    )


# ---------------------------------------------------------------------------------------
# A ready-made wavefunction: MLP orbitals times a Gaussian envelope


def init_params(
    key: jax.Array, n_electrons: int, *, hidden: int = 32, dtype: Any = jnp.float32
) -> Params:
    """Parameters of :func:`mlp_orbitals` for ``n_electrons`` orbitals and one hidden layer.

    The ``n`` orbitals are combinations of ``hidden + 4`` functions (the hidden features,
    1, x, y, z) times their envelopes, so keep ``hidden`` comfortably above ``n``: with
    ``hidden + 4 < n`` the determinant is close to 0 everywhere.

    Returns ``{"w1": (3, hidden), "b1": (hidden,), "w2": (hidden, n), "b2": (n,),
    "wl": (3, n), "decay": (n,)}``.
    """
    if (
        isinstance(n_electrons, bool)
        or not isinstance(n_electrons, int)
        or n_electrons < 1
    ):
        raise ValueError(f"n_electrons must be a positive int, got {n_electrons!r}")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden must be a positive int, got {hidden!r}")
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    n = n_electrons
    return {
        "w1": jax.random.normal(k1, (3, hidden), dtype),
        "b1": 0.5 * jax.random.normal(k2, (hidden,), dtype),
        "w2": jax.random.normal(k3, (hidden, n), dtype)
        / jnp.sqrt(jnp.asarray(hidden, dtype)),
        "b2": 0.1 * jax.random.normal(k4, (n,), dtype),
        "wl": jax.random.normal(k5, (3, n), dtype),
        "decay": jnp.linspace(
            -1.0, 1.0, n, dtype=dtype
        ),  # distinct envelope widths per orbital
    }


def _mlp_parts(
    params: Params, r: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """The pieces of :func:`mlp_orbitals` at positions ``r`` ``(..., 3)``: the one definition of the architecture.

    Returns ``(h, u, envelope, s, r2)``: hidden features :math:`\\tanh(rW_1+b_1)` ``(..., H)``,
    read-out :math:`u = hW_2 + b_2 + rW_l` ``(..., n)``, envelopes
    :math:`e^{-s|r|^2/2}` ``(..., n)``, widths :math:`s=\\mathrm{softplus}(d)` ``(n,)`` and
    :math:`|r|^2` ``(..., 1)``; the orbitals are ``u * envelope``.
    """
    h = jnp.tanh(r @ params["w1"] + params["b1"])
    u = h @ params["w2"] + params["b2"] + r @ params["wl"]
    s = jax.nn.softplus(params["decay"])
    r2 = jnp.sum(r * r, axis=-1, keepdims=True)
    return h, u, jnp.exp(-0.5 * s * r2), s, r2


def mlp_orbitals(params: Params, r: jax.Array) -> jax.Array:
    """:math:`\\varphi(r) = (\\tanh(rW_1+b_1)W_2 + b_2 + rW_l)\\,\\odot\\,e^{-\\mathrm{softplus}(d)|r|^2/2}`, shape ``(n,)``."""
    _, u, envelope, _, _ = _mlp_parts(params, r)
    return u * envelope


_MLP_SHAPES = {
    "w1": ("3", "H"),
    "b1": ("H",),
    "w2": ("H", "n"),
    "b2": ("n",),
    "wl": ("3", "n"),
    "decay": ("n",),
}


def _check_mlp_params(params: Params, n: int) -> None:
    """Raise ``ValueError`` unless ``params`` has the :func:`init_params` layout for ``n`` electrons."""
    if not isinstance(params, dict) or set(params) != set(_MLP_SHAPES):
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(
            f"params must be the dict of init_params with keys {sorted(_MLP_SHAPES)}, got {got}"
        )
    hidden = jnp.shape(params["w1"])[-1] if jnp.ndim(params["w1"]) == 2 else None
    sizes = {"3": 3, "H": hidden, "n": n}
    for name, dims in _MLP_SHAPES.items():
        want = tuple(sizes[d] for d in dims)
        if jnp.shape(params[name]) != want:
            raise ValueError(
                f"params[{name!r}] must have shape {want} for {n} electrons and hidden width {hidden} "
                f"(as made by init_params(key, {n}, hidden=...)), got {jnp.shape(params[name])}"
            )


def mlp_slater_laplacian(
    params: Params, positions: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""``(log|ψ|, ∇log|ψ|, Δlog|ψ|)`` for :func:`mlp_log_psi`, with the orbital derivatives by hand.

    The classical quantum Monte Carlo route: when the orbitals are known, differentiate
    them analytically, and contract with :math:`B=A^{-1}` as early as possible. With
    :math:`h_i=\tanh(r_iW_1+b_1)`, :math:`h'_i=1-h_i^2`, :math:`u_{ij}=(h_iW_2+b_2+r_iW_l)_j`,
    envelopes :math:`e_{ij}=\exp(-\tfrac12 s_j|r_i|^2)`, :math:`s=\mathrm{softplus}(d)`, so
    :math:`A_{ij}=u_{ij}e_{ij}`, and the weights :math:`E_{ij}=B_{ji}e_{ij}`,
    :math:`F_{ij}=s_jE_{ij}`, :math:`C=EW_2^\top`, :math:`D=FW_2^\top` (``(n, H)`` each):

    .. math::
       \nabla_{r_i}\log|\psi| &= W_1(h'_i\odot C_i) + W_lE_i^\top
            - r_i\textstyle\sum_j F_{ij}u_{ij},\\
       \frac{\Delta\psi}{\psi} &= \sum_i\Big[-2\,(h_i\odot h'_i\odot C_i)\cdot w
            - 2\,r_i\cdot\big(W_1(h'_i\odot D_i)+W_lF_i^\top\big)\\
       &\qquad + \textstyle\sum_j E_{ij}u_{ij}(s_j^2|r_i|^2-3s_j)\Big],

    with :math:`w_h=\sum_k (W_1)_{kh}^2`, and
    :math:`\Delta\log|\psi| = \Delta\psi/\psi - |\nabla\log|\psi||^2`. Contracting
    :math:`B` into the read-out :math:`W_2` first leaves three ``(n, n) x (n, H)`` products
    (:math:`u`, :math:`C`, :math:`D`) where forward mode needs five (value, three
    gradient components, Laplacian) and forward-over-forward more. Exact, :math:`O(n^3 + n^2H)`,
    valid for :func:`mlp_orbitals` only; :func:`slater_laplacian` takes any orbitals.
    """
    positions = _check_positions(positions)
    n = positions.shape[0]
    _check_mlp_params(params, n)
    w1, w2, wl = params["w1"], params["w2"], params["wl"]
    hid = w1.shape[1]
    h, u, env, s, r2 = _mlp_parts(
        params, positions
    )  # (n, H), (n, n), (n, n), (n,), (n, 1)
    logdet, b = _logdet_and_inverse(u * env)
    e = b.T * env  # E_ij = B_ji e_ij
    f = e * s  # F_ij = s_j E_ij
    # one product for C, D and the linear read-out terms: [E; F] @ [W2; Wl]^T -> (2n, H + 3)
    cd = jnp.concatenate([e, f], axis=0) @ jnp.concatenate([w2, wl], axis=0).T
    c, ew, d, fw = cd[:n, :hid], cd[:n, hid:], cd[n:, :hid], cd[n:, hid:]
    dh = 1.0 - h * h
    back = (
        jnp.concatenate([c * dh, d * dh], axis=0) @ w1.T
    )  # (2n, 3): W1(h' ⊙ C_i), W1(h' ⊙ D_i)
    grad = back[:n] + ew - positions * jnp.sum(f * u, axis=1, keepdims=True)
    lap_psi = (
        -2.0 * jnp.sum(c * dh * h * jnp.sum(w1 * w1, axis=0))
        - 2.0 * jnp.sum(positions * (back[n:] + fw))
        + jnp.sum(e * u * (s * s * r2 - 3.0 * s))
    )
    return logdet, grad, lap_psi - jnp.sum(grad * grad)


def mlp_log_psi(params: Params, positions: jax.Array) -> jax.Array:
    """log|ψ| of the Slater determinant of :func:`mlp_orbitals`; ``positions`` ``(n, 3)``."""
    return slater_log_psi(functools.partial(mlp_orbitals, params), positions)


# ---------------------------------------------------------------------------------------
# Energies


def potential_energy(positions: jax.Array, *, omega: float = 1.0) -> jax.Array:
    """:math:`\\tfrac12\\omega^2\\sum_i|r_i|^2 + \\sum_{i<j}1/|r_i-r_j|` for ``(n, 3)`` positions."""
    positions = _check_positions(positions)
    n = positions.shape[0]
    trap = 0.5 * omega**2 * jnp.sum(positions * positions)
    diff = positions[:, None, :] - positions[None, :, :]
    eye = jnp.eye(n, dtype=positions.dtype)
    dist = jnp.sqrt(
        jnp.sum(diff * diff, axis=-1) + eye
    )  # + eye: no sqrt(0) on the diagonal
    upper = jnp.triu(jnp.ones((n, n), dtype=positions.dtype), k=1)
    return trap + jnp.sum(upper / dist)


def local_energy(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    positions: jax.Array,
    *,
    method: Method = "loop",
    key: jax.Array | None = None,
    omega: float = 1.0,
) -> jax.Array:
    """:math:`E_L = -\\tfrac12(\\Delta\\log|\\psi|+|\\nabla\\log|\\psi||^2) + V` at ``(n, 3)`` positions."""
    _check_log_psi(log_psi)
    positions = _check_positions(positions)
    kin = kinetic_energy(
        lambda x: log_psi(params, x), positions, method=method, key=key
    )
    return kin + potential_energy(positions, omega=omega)


# ---------------------------------------------------------------------------------------
# Compiled steps per user function, without keeping the function alive


class _CompiledPerFunction:
    """``jax.jit`` programs built for a user's function, dropped when the function is.

    A ``functools.lru_cache`` keyed on the function would keep it (and everything it
    closes over, e.g. parameters) and its compiled programs alive, and fails on callables
    that define ``__eq__`` without ``__hash__``. Here the key is the function's identity,
    held through a weak reference, plus hashable settings; the cached program reaches
    the function only through that weak reference. A function that cannot be weakly
    referenced is compiled for the call and not cached.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, dict[Hashable, Callable]]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self,
        fn: Callable,
        settings: Hashable,
        build: Callable[[Callable[[], Callable]], Callable],
    ) -> Callable:
        """The program ``build(get_fn)`` for ``(fn, settings)``; ``get_fn()`` returns ``fn``."""
        try:
            ref = weakref.ref(fn)
        except TypeError:  # not weakly referenceable: no caching
            return build(lambda: fn)
        key = id(fn)
        entry = self._entries.get(key)
        if entry is None or entry[0]() is not fn:

            def forget(dead: weakref.ref, key: int = key) -> None:
                if self._entries.get(key, (None,))[0] is dead:
                    del self._entries[key]

            ref = weakref.ref(fn, forget)
            entry = (ref, {})
            self._entries[key] = entry
        programs = entry[1]
        if settings not in programs:
            weak = entry[0]

            def get_fn() -> Callable:
                target = weak()
                if target is None:  # only reachable if a program outlives its function
                    raise ReferenceError(
                        "the wavefunction this program was built for is gone"
                    )
                return target

            programs[settings] = build(get_fn)
        return programs[settings]


_PROGRAMS = _CompiledPerFunction()


def _check_log_psi(log_psi: object) -> None:
    if not callable(log_psi):
        raise TypeError(
            f"log_psi must be a function log_psi(params, positions (n, 3)) -> scalar, got "
            f"{type(log_psi).__name__} (e.g. pass slater.mlp_log_psi)"
        )


def _check_walkers(walkers: jax.Array) -> jax.Array:
    walkers = walkers if isinstance(walkers, jax.Array) else jnp.asarray(walkers)
    if walkers.ndim != 3 or walkers.shape[2] != 3:
        raise ValueError(f"walkers must have shape (batch, n, 3), got {walkers.shape}")
    if not jnp.issubdtype(walkers.dtype, jnp.floating):
        raise TypeError(
            f"walkers must be a floating-point array, got dtype {walkers.dtype}"
        )
    return walkers


def sample_walkers(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    walkers: jax.Array,
    key: jax.Array,
    *,
    steps: int,
    step_size: float,
) -> tuple[jax.Array, jax.Array]:
    r"""Move ``walkers`` ``(B, n, 3)`` by ``steps`` Metropolis steps towards :math:`|\psi|^2`.

    Each step proposes :math:`x' = x + \sigma\,\xi` for every walker (Gaussian
    :math:`\xi`, :math:`\sigma` = ``step_size``, symmetric) and accepts it with probability
    :math:`\min\big(1, |\psi(x')|^2/|\psi(x)|^2\big) = \min\big(1, e^{2(\log|\psi(x')| - \log|\psi(x)|)}\big)`,
    so :math:`|\psi|^2` is the chain's stationary distribution. This is where VMC evaluates
    local energies: walkers from :math:`|\psi|^2` rarely sit near a node, unlike arbitrary
    points. Returns ``(walkers, acceptance rate)`` (the rate averaged over steps and walkers).
    """
    _check_log_psi(log_psi)
    walkers = _check_walkers(walkers)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if isinstance(step_size, bool) or not (
        isinstance(step_size, (int, float)) and step_size > 0
    ):
        raise ValueError(
            f"step_size must be a positive number (a proposal standard deviation), got {step_size!r}"
        )
    chain = _PROGRAMS.get(
        log_psi, ("metropolis", steps), functools.partial(_metropolis, steps=steps)
    )
    return chain(params, walkers, key, jnp.asarray(step_size, walkers.dtype))


def _metropolis(get_log_psi: Callable[[], Callable], *, steps: int) -> Callable:
    def chain(
        params: Params, walkers: jax.Array, key: jax.Array, sigma: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        batch_log_psi = jax.vmap(get_log_psi(), in_axes=(None, 0))

        def step(carry: tuple, k: jax.Array) -> tuple[tuple, None]:
            x, logp, accepted = carry
            k_move, k_accept = jax.random.split(k)
            proposal = x + sigma * jax.random.normal(k_move, x.shape, x.dtype)
            logp_new = batch_log_psi(params, proposal)
            u = jax.random.uniform(k_accept, logp.shape, x.dtype)
            ok = jnp.log(u) < 2.0 * (logp_new - logp)
            x = jnp.where(ok[:, None, None], proposal, x)
            return (
                x,
                jnp.where(ok, logp_new, logp),
                accepted + jnp.mean(ok.astype(x.dtype)),
            ), None

        init = (walkers, batch_log_psi(params, walkers), jnp.zeros((), walkers.dtype))
        (x, _, accepted), _ = jax.lax.scan(step, init, jax.random.split(key, steps))
        return x, accepted / steps

    return jax.jit(chain)


def _check_estimator(estimator: str) -> None:
    if estimator not in ("vmc", "direct"):
        raise ValueError(f"estimator must be 'vmc' or 'direct', got {estimator!r}")


def _check_omega(omega: object) -> float:
    if isinstance(omega, bool) or not isinstance(omega, (int, float)):
        raise TypeError(
            f"omega must be a Python number (the trap frequency), got {type(omega).__name__}"
        )
    return float(omega)


def walker_keys(key: jax.Array, count: int, *, first: jax.Array | int = 0) -> jax.Array:
    """One PRNG key per walker: ``fold_in(key, first + b)`` for ``b = 0 .. count - 1``.

    ``first`` is the global index of this batch's first walker (``axis_index * count``
    inside ``shard_map``), so every walker on every shard gets its own probes and a
    sharded run draws exactly the probes of the single-device run.
    """
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(first + jnp.arange(count))


def _step(
    get_log_psi: Callable[[], Callable],
    method: Method,
    estimator: str,
    omega: float,
    count: int | None,
    axis_name: str | None = None,
    local: int = 0,
) -> Callable:
    """The per-batch step: on one device (``axis_name=None``) it sums over the batch;
    inside ``shard_map`` it sums over all shards and numbers walkers globally.
    ``count`` is the global number of walkers (``None``: the batch's own size, read
    from each call's argument, so one compiled program serves every batch size)."""

    def total(v: jax.Array) -> jax.Array:
        return jnp.sum(v) if axis_name is None else jax.lax.psum(jnp.sum(v), axis_name)

    def step(
        params: Params, walkers: jax.Array, key: jax.Array | None
    ) -> tuple[jax.Array, Params]:
        first = 0 if axis_name is None else jax.lax.axis_index(axis_name) * local
        n = walkers.shape[0] if count is None else count
        return _batch_energy_and_grad(
            get_log_psi(),
            params,
            walkers,
            method=method,
            estimator=estimator,
            key=key,
            omega=omega,
            total=total,
            count=n,
            first=first,
        )

    return step


def _batch_energy_and_grad(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    walkers: jax.Array,
    *,
    method: Method,
    estimator: str,
    key: jax.Array | None,
    omega: float,
    total: Callable[[jax.Array], jax.Array],
    count: int,
    first: jax.Array | int = 0,
) -> tuple[jax.Array, Params]:
    """Shared body: ``total`` sums over this batch (``jnp.sum``) or over all shards (psum of sums)."""
    keys = (
        walker_keys(key, walkers.shape[0], first=first)
        if method == "hutchinson" and key is not None  # checked by _check_step_input
        else None
    )

    def energies(p: Params) -> jax.Array:
        def one(x: jax.Array, k: jax.Array | None) -> jax.Array:
            return local_energy(log_psi, p, x, method=method, key=k, omega=omega)

        return jax.vmap(one)(walkers, keys)

    if estimator == "direct":

        def mean_energy(p: Params) -> jax.Array:
            return total(energies(p)) / count

        return jax.value_and_grad(mean_energy)(params)
    e_l = energies(params)
    mean = total(e_l) / count
    centred = jax.lax.stop_gradient(e_l - mean)

    def surrogate(p: Params) -> jax.Array:  # its gradient is 2 E[(E_L - Ē) ∇θ log|ψ|]
        return 2.0 * total(centred * jax.vmap(lambda x: log_psi(p, x))(walkers)) / count

    return mean, jax.grad(surrogate)(params)


def _check_step_input(
    log_psi: object, method: str, estimator: str, key: object
) -> None:
    _check_log_psi(log_psi)
    _check_method(method)
    _check_estimator(estimator)
    if method == "hutchinson" and key is None:
        raise ValueError(
            "method='hutchinson' needs a PRNG key: pass key=jax.random.key(0)"
        )


def energy_and_grad(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    walkers: jax.Array,
    *,
    method: Method = "loop",
    estimator: Estimator = "vmc",
    key: jax.Array | None = None,
    omega: float = 1.0,
) -> tuple[jax.Array, Params]:
    """Mean local energy over ``walkers`` ``(B, n, 3)`` and its parameter gradient, on one device.

    ``log_psi(params, positions)`` takes ``(n, 3)`` positions. ``estimator="vmc"`` (default)
    returns :math:`\\frac2B\\sum_b (E_L(x_b)-\\bar E)\\nabla_\\theta\\log|\\psi(x_b)|`;
    ``"direct"`` returns :math:`\\nabla_\\theta \\frac1B\\sum_b E_L(x_b)`. ``method`` picks the
    Laplacian; ``"hutchinson"`` needs ``key`` and gives walker ``b`` the probes of
    ``fold_in(key, b)`` (:func:`walker_keys`), so the noise averages over the batch.
    """
    _check_step_input(log_psi, method, estimator, key)
    walkers = _check_walkers(walkers)
    settings = ("one device", method, estimator, _check_omega(omega))

    def build(get_log_psi: Callable[[], Callable]) -> Callable:
        step = _step(get_log_psi, method, estimator, settings[3], count=None)
        return jax.jit(step)

    return _PROGRAMS.get(log_psi, settings, build)(params, walkers, key)


def sharded_energy_and_grad(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    walkers: jax.Array,
    mesh: jax.sharding.Mesh,
    *,
    axis_name: str = "data",
    method: Method = "loop",
    estimator: Estimator = "vmc",
    key: jax.Array | None = None,
    omega: float = 1.0,
) -> tuple[jax.Array, Params]:
    """:func:`energy_and_grad` inside ``jax.shard_map`` (``check_vma=True``), walkers sharded over ``axis_name``.

    Parameters are invariant (``P()``), walkers ``P(axis_name)``. Each shard sums its
    local energies; a ``psum`` over ``axis_name`` gives the global sums, divided by the
    global batch size. The loss is thus the same global mean as on one device, and
    the gradient of the invariant parameters (whose transpose already sums over the
    shards) equals the single-device gradient. No ``pmean`` is applied to it: that would
    be the Chapter 4 device-count bug. Returns invariant (replicated) outputs.

    ``mesh`` may come from ``jax.make_mesh`` with its default axis types (Explicit on
    new JAX, Auto on 0.8) or from :func:`beyondgrad.runtime.demo_mesh`; ``params`` and
    ``walkers`` may be plain (unsharded) arrays: they are placed on the mesh with
    ``jax.device_put`` first (a no-op for arrays already laid out that way). With
    ``method="hutchinson"`` walker ``b`` of the global batch gets ``fold_in(key, b)``
    (shard ``s`` starts at ``b = s * local batch``, from ``lax.axis_index``): the same
    probes as :func:`energy_and_grad` on one device.
    """
    _check_step_input(log_psi, method, estimator, key)
    walkers = _check_walkers(walkers)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; make one with "
            "jax.make_mesh((jax.device_count(),), ('data',)) or runtime.demo_mesh()"
        )
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(
            f"axis_name {axis_name!r} is not an axis of the mesh {tuple(mesh.axis_names)}"
        )
    size = mesh.shape[axis_name]
    if walkers.shape[0] % size:
        raise ValueError(
            f"the number of walkers ({walkers.shape[0]}) must be divisible by the size of mesh axis "
            f"{axis_name!r} ({size})"
        )
    settings = (
        "sharded",
        mesh,
        axis_name,
        method,
        estimator,
        _check_omega(omega),
        walkers.shape[0],
    )
    local = walkers.shape[0] // size

    def build(get_log_psi: Callable[[], Callable]) -> Callable:
        step = _step(
            get_log_psi, method, estimator, settings[5], settings[6], axis_name, local
        )
        sharded = jax.shard_map(
            step,
            mesh=mesh,
            in_specs=(P(), P(axis_name), P()),
            out_specs=(P(), P()),
            check_vma=True,
        )
        return jax.jit(sharded)

    replicated = NamedSharding(mesh, P())
    params = jax.device_put(params, replicated)
    walkers = jax.device_put(walkers, NamedSharding(mesh, P(axis_name)))
    key = None if key is None else jax.device_put(key, replicated)
    return _PROGRAMS.get(log_psi, settings, build)(params, walkers, key)
