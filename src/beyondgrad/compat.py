"""The one place that knows JAX's version differences and private APIs (0.8.2 .. newest).

Version differences absorbed here (facts from the version-drift report, ``drift.md``):

* cast to varying: ``lax.pcast(x, axes, to='varying')`` exists from 0.8.2 (the floor);
  ``lax.pvary`` exists up to 0.9.x only, so nothing here uses it (:func:`pcast_varying`).
* varying axes of a type: ``jax.typeof(x).vma`` up to 0.9.x,
  ``jax.typeof(x).manual_axis_type.varying`` from 0.10 (:func:`varying_axes`).
* ``jax.make_mesh``'s default axis types: Auto up to 0.8.x, Explicit from 0.9
  (:func:`make_mesh` always states them).
* ``jax_use_direct_linearize``: obeyed up to 0.9.x, ignored from 0.10
  (:func:`direct_linearize_option`, :func:`set_direct_linearize`).
* ``custom_root`` with an integer aux output fails under ``jvp``/``grad`` up to 0.11.1
  (the drift record) and runs on 0.11.2 and newer (:func:`custom_root_integer_aux_ok`,
  :func:`custom_root_with_aux`), and appears in a jaxpr under one primitive up to 0.10.x
  and another on 0.11.2 and newer (:func:`uses_custom_root`).

Private APIs read here and nowhere else (each tested on both ends of the range):
``jax._src.xla_bridge.backends_are_initialized`` (:func:`backends_initialized`),
``jax._src.core.to_concrete_value`` (:func:`concrete_value`), a ``jit`` function's
``_cache_size()`` (:func:`jit_cache_size`), and a jaxpr equation's bind parameters
(:func:`bind_equation`, :func:`jaxpr_atom_value`). The jaxpr-level API the rest of the
package uses is read here too: ``jax.extend.core``'s ``Primitive`` class and
``primitives`` module, and ``jax.core.eval_jaxpr`` (:func:`eval_jaxpr`).

Versions are compared with :func:`jax_version` (``jax.__version_info__``), never by
parsing the string. Importing this module starts no backend.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import jax

# Imported here, when beyondgrad is, not at a first call: on JAX 0.12 importing
# ``jax.extend`` imports ``jax.extend.pallas`` -> ``jax._src.pallas.core``, which
# registers two config states with ``include_in_jit_key=True``
# (``pallas_grid_context``, ``pallas_dynamic_shapes_export``). That lengthens
# ``config.trace_context()``, the part of every ``jax.jit`` cache key that holds such
# states, so each function jitted before the import misses its cache once and is
# traced and compiled again (measured: ``_cache_size()`` 1 -> 2; JAX 0.8.2's
# ``jax.extend`` imports no pallas and changes nothing). The import starts no backend.
import jax.extend.core  # noqa: F401  (for its side effect, see above)
from jax import core as _jax_core
from jax import lax
from jax.extend.core import Primitive, primitives
from jax.sharding import AxisType

from beyondgrad import _checks

__all__ = [
    "DIRECT_LINEARIZE_OPTION",
    "custom_jvp_sources",
    "function_source",
    "varying_like",
    "AxisNames",
    "Primitive",
    "primitives",
    "eval_jaxpr",
    "backends_initialized",
    "bind_equation",
    "direct_linearize_option",
    "jaxpr_atom_value",
    "set_direct_linearize",
    "concrete_value",
    "concreteness_answerers",
    "fallback_linearize_rule",
    "gloo_loopback_cpu_backend",
    "linearization_rules",
    "linearize_from_jvp",
    "vjp_backward",
    "bypasses_custom_root",
    "custom_root_eqns",
    "custom_root_integer_aux_ok",
    "custom_root_with_aux",
    "derivatives_disabled",
    "is_tracer",
    "jax_version",
    "jit_cache_size",
    "krylov_without_device_put",
    "make_mesh",
    "pcast_varying",
    "primitive",
    "primitive_names",
    "scan_counts",
    "uses_custom_root",
    "varying_axes",
    "varying_axes_of_aval",
    "vjp_hi_primitive_base",
]

#: One mesh axis name or a sequence of them (as ``shard_map``'s ``axis_names``).
AxisNames = str | Sequence[str]


def jax_version() -> tuple[int, ...]:
    """The running JAX's version as integers, e.g. ``(0, 8, 2)`` (rc/dev suffixes dropped)."""
    return tuple(int(p) for p in jax.__version_info__[:3])


def _axis_tuple(axis_names: AxisNames) -> tuple[str, ...]:
    if isinstance(axis_names, str):
        return (axis_names,)
    try:
        names = tuple(axis_names)
    except TypeError:
        raise TypeError(
            f"axis_names must be a str or a sequence of str, got {type(axis_names).__name__}"
        ) from None
    if not all(isinstance(a, str) for a in names):
        raise TypeError(
            f"axis_names must be a str or a sequence of str, got {axis_names!r}"
        )
    return names


# ----------------------------------------------------------------------------- varying types


def varying_axes_of_aval(aval: Any) -> frozenset[str]:
    """The varying mesh axes recorded in an abstract value (empty where it has none)."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:  # JAX >= 0.10
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", None) or frozenset())


def varying_axes(x: Any) -> frozenset[str]:
    """The mesh axes over which ``x`` varies inside ``shard_map`` (empty outside)."""
    return varying_axes_of_aval(jax.typeof(x))


def pcast_varying(x: Any, axis_names: AxisNames) -> Any:
    """Mark every leaf of ``x`` as varying over ``axis_names`` inside ``shard_map``.

    This is ``lax.pcast(leaf, axes, to='varying')`` for the axes a leaf does not
    already vary over (so the call is idempotent; ``pcast`` itself rejects a leaf that
    already varies). The value is unchanged; only the type gains the axes; the
    transpose of the cast is a ``psum`` over them.
    """
    names = _axis_tuple(axis_names)
    if not names:
        return x

    def cast(leaf: Any) -> Any:
        missing = tuple(a for a in names if a not in varying_axes(leaf))
        return lax.pcast(leaf, missing, to="varying") if missing else leaf

    return jax.tree_util.tree_map(cast, x)


def make_mesh(
    shape: Sequence[int],
    axis_names: AxisNames,
    *,
    axis_types: Literal["auto", "explicit"] = "auto",
    devices: Sequence[Any] | None = None,
) -> jax.sharding.Mesh:
    """``jax.make_mesh`` with the axis type always stated (its default changed in 0.9)."""
    kinds = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}
    if axis_types not in kinds:
        raise ValueError(f"axis_types must be 'auto' or 'explicit', got {axis_types!r}")
    names = _axis_tuple(axis_names)
    return jax.make_mesh(
        tuple(shape),
        names,
        axis_types=(kinds[axis_types],) * len(names),
        devices=devices,
    )


# ----------------------------------------------------------------------------- private APIs


def backends_initialized() -> bool:
    """True once JAX has started a backend (after which the CPU device count is fixed)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def concrete_value(x: Any) -> Any | None:
    """The concrete value JAX can reach behind ``x`` (``None`` for ``jit``/``vmap`` tracers).

    A plain array is its own concrete value; an autodiff tracer answers with its
    primal's concrete value. This is the test JAX itself applies before raising a
    concretization error.
    """
    from jax._src import core

    return core.to_concrete_value(x)


def is_tracer(x: Any) -> bool:
    """True if ``x`` is a JAX tracer."""
    return isinstance(x, _jax_core.Tracer)


def jit_cache_size(jitted: Any) -> int:
    """Entries in a ``jax.jit`` function's dispatch cache (one per trace it kept)."""
    size = getattr(jitted, "_cache_size", None)
    if size is None:
        raise TypeError(
            f"expected a function made by jax.jit, got {type(jitted).__name__}"
        )
    return int(size())


# ----------------------------------------------------------------------------- Chapter 1


def concreteness_answerers() -> list[type]:
    """The tracer classes, among those imported so far, that answer concreteness.

    ``core.Tracer.to_concrete_value`` returns ``None``; these subclasses override it
    (on 0.8.2 and 0.12: ``JVPTracer``, ``LinearizeTracer``, which ask their primal,
    and ``ShardMapTracer``, which answers for a value invariant over every mesh axis
    in an eager ``shard_map``). Sorted by module and name.
    """
    from jax._src import core

    found: set[type] = set()
    todo = list(core.Tracer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "to_concrete_value" in vars(cls):
            found.add(cls)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


# ----------------------------------------------------------------------------- Chapter 2

#: The config option that chose between direct linearization and JVP + partial
#: evaluation. Present on 0.8.2 (which obeys ``False``) and on 0.12 (which ignores it).
DIRECT_LINEARIZE_OPTION = "jax_use_direct_linearize"


def direct_linearize_option() -> bool | None:
    """``jax_use_direct_linearize``'s value; ``None`` where JAX has no such option."""
    values = getattr(jax.config, "values", {})
    if DIRECT_LINEARIZE_OPTION not in values:
        return None
    return bool(values[DIRECT_LINEARIZE_OPTION])


def set_direct_linearize(enabled: bool) -> bool:
    """Set ``jax_use_direct_linearize``; return the previous value (to restore it).

    Raises ``TypeError`` for a non-bool and ``ValueError`` where this JAX has no such
    option (the 0.7 migration note announced its removal).
    """
    _checks.boolean(enabled, "enabled")
    before = direct_linearize_option()
    if before is None:
        raise ValueError(
            f"JAX {jax.__version__} has no {DIRECT_LINEARIZE_OPTION} option; "
            "its default, direct linearization, is the only mode"
        )
    jax.config.update(DIRECT_LINEARIZE_OPTION, enabled)
    return before


def linearization_rules() -> list[str]:
    """Names of the primitives with a linearization rule of their own.

    ``jax._src.interpreters.ad.primitive_linearizations``: direct linearization
    (``LinearizeTrace.process_primitive``) uses such a rule where one is registered,
    and otherwise :func:`fallback_linearize_rule` (the JVP rule under partial
    evaluation). Rules register when their module is imported, so the list can grow
    as a program imports more of JAX.
    """
    from jax._src.interpreters import ad

    return sorted(p.name for p in ad.primitive_linearizations)


def fallback_linearize_rule() -> Callable[..., Any]:
    """JAX's linearization of a primitive that has no rule of its own (for reading)."""
    from jax._src.interpreters import ad

    return ad.fallback_linearize_rule  # type: ignore[no-any-return]


def linearize_from_jvp() -> Callable[..., Any]:
    """The function that runs a JVP rule under partial evaluation (for reading)."""
    from jax._src.interpreters import ad

    return ad.linearize_from_jvp  # type: ignore[no-any-return]


def vjp_backward() -> Callable[..., Any]:
    """The function that a ``jax.vjp`` function calls on a cotangent (for reading).

    ``jax._src.api._vjp3_bwd`` on 0.8.2 and 0.12: it runs ``ad.backward_pass3`` on
    the linear jaxpr that ``jax.vjp`` built.
    """
    from jax._src import api

    return api._vjp3_bwd  # type: ignore[no-any-return]


@contextlib.contextmanager
def derivatives_disabled(
    error: Callable[[str], BaseException],
    *,
    keep_linear_transpose: bool = False,
    clear_caches: bool = True,
    linearized_applied: Callable[[tuple[Any, ...]], None] | None = None,
) -> Iterator[None]:
    """Inside the block, JAX's own derivative machinery raises ``error(route)``.

    Banned at the internal functions where the API's routes end, so a name imported
    before (``from jax import vjp``) or a function built before the block
    (``T = jax.linear_transpose(f, x)``) raises too. Not banned: programs compiled or
    exported before the block (they run no Python), and ``jax.experimental.jet``:

    * transposition, ``ad.backward_pass3``: ``jax.vjp``'s backward function,
      ``grad``, ``value_and_grad``, ``jacrev``, ``jacobian``, ``hessian``,
      ``jax.linear_transpose``;
    * forward mode, ``api._jvp``: ``jax.jvp``, ``jacfwd`` (and ``hessian``);
    * linearization, ``ad.linearize``: ``jax.linearize``, and ``jax.vjp``'s forward
      step.

    With ``keep_linear_transpose=True``, ``jax.linearize`` and ``jax.linear_transpose``
    run (a transposition reached through ``ad.backward_pass``), and so does forward
    mode while one of them runs (JAX's own JVP rules call ``jax.jvp``: ``prod``'s
    does); the rest raises. With ``clear_caches`` (the default), JAX's caches are
    cleared on entry, so a function jitted before the block is traced again inside it
    (its compiled program would run no Python); a caller that enters the block several
    times in one check clears them on the first entry only (each clearing costs a
    recompilation of everything after it). ``route`` names what was reached.

    With ``linearized_applied``, each linearized map that ``jax.linearize`` returns
    inside the block (``api._lift_linearized``, which the map calls, also under a
    name imported before) calls ``linearized_applied(tangents)`` when it is applied
    outside a trace of ``jax.linear_transpose`` (``pe.trace_to_jaxpr_nounits`` with a
    function traced for ``"linear_transpose"``): applied directly, under ``jit`` or
    ``vmap`` too, and not when ``jax.linear_transpose`` traces it to build its
    transpose. ``tangents`` is the tuple of arguments the map was given (tracers
    under a transformation); the call may raise, or record and return.
    """
    import inspect

    from jax._src import api
    from jax._src.interpreters import ad
    from jax._src.interpreters import partial_eval as pe

    saved_transpose, saved_pass = ad.backward_pass3, ad.backward_pass
    saved_jvp, saved_linearize = api._jvp, ad.linearize
    saved_lift, saved_trace = api._lift_linearized, pe.trace_to_jaxpr_nounits
    depth = {"pass": 0, "linearize": 0, "linear_transpose": 0}
    # _lift_linearized(jaxpr, ..., consts, *tangents): the bound arguments come
    # first (5 of them on 0.8.2 and 0.10.2, 6 on 0.12), the map's own after them.
    bound = sum(
        p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        for p in inspect.signature(saved_lift).parameters.values()
    )

    def lift(*args: Any) -> Any:
        if linearized_applied is not None and not depth["linear_transpose"]:
            linearized_applied(tuple(args[bound:]))
        return saved_lift(*args)

    def trace(fun: Any, *args: Any, **kwargs: Any) -> Any:
        info = getattr(fun, "debug_info", None)
        if getattr(info, "traced_for", None) != "linear_transpose":
            return saved_trace(fun, *args, **kwargs)
        depth["linear_transpose"] += 1
        try:
            return saved_trace(fun, *args, **kwargs)
        finally:
            depth["linear_transpose"] -= 1

    def counted(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            depth[key] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[key] -= 1

        return run

    def transpose(*args: Any, **kwargs: Any) -> Any:
        if keep_linear_transpose and depth["pass"]:
            return saved_transpose(*args, **kwargs)
        raise error(
            "JAX's transposition (jax.vjp's backward function, grad, jacrev"
            + ("" if keep_linear_transpose else ", linear_transpose")
            + ")"
        )

    def jvp(*args: Any, **kwargs: Any) -> Any:
        if keep_linear_transpose and (depth["pass"] or depth["linearize"]):
            return saved_jvp(*args, **kwargs)
        raise error("JAX's forward mode (jax.jvp, jacfwd, hessian)")

    def linearize(*args: Any, **kwargs: Any) -> Any:
        raise error("JAX's linearization (jax.linearize, jax.vjp)")

    if clear_caches:
        jax.clear_caches()
    ad.backward_pass3, api._jvp = transpose, jvp
    if keep_linear_transpose:
        ad.backward_pass = counted(saved_pass, "pass")
        ad.linearize = counted(saved_linearize, "linearize")
    else:
        ad.linearize = linearize
    if linearized_applied is not None:
        api._lift_linearized, pe.trace_to_jaxpr_nounits = lift, trace
    try:
        yield
    finally:
        ad.backward_pass3, ad.backward_pass = saved_transpose, saved_pass
        api._jvp, ad.linearize = saved_jvp, saved_linearize
        api._lift_linearized, pe.trace_to_jaxpr_nounits = saved_lift, saved_trace


# ----------------------------------------------------------------------------- Chapter 3
# Chapter 3 reads two things that differ across the range (both tested on 0.8.2 and
# the newest, fallbacks with fakes):
#
# * how ``lax.custom_root`` appears in a jaxpr: a ``custom_jvp_call`` of the function
#   ``_custom_root`` up to 0.10.x, a ``call_hi_primitive`` carrying a ``CustomRoot``
#   (a ``hijax.HiPrim``) on 0.11.2 and newer (0.11.0 and 0.11.1 are not installed
#   here; either recording is recognised);
# * whether ``custom_root(..., has_aux=True)`` accepts an integer or bool aux under
#   differentiation: up to 0.10.x it gets an integer tangent instead of ``float0``
#   and fails with ``TypeError`` (the drift record: also on 0.11.0 and 0.11.1); on
#   0.11.2 and newer it is accepted. Detected by a feature
#   probe (abstract evaluation only), not by a version number.


def _is_custom_root_eqn(eqn: Any) -> bool:
    """True if one jaxpr equation is a ``lax.custom_root`` call (either recording)."""
    prim = eqn.params.get("_prim") if hasattr(eqn.params, "get") else None
    if prim is not None and type(prim).__name__ == "CustomRoot":  # 0.11.2 on: a HiPrim
        return True
    call = eqn.params.get("call_jaxpr") if hasattr(eqn.params, "get") else None
    if eqn.primitive.name == "custom_jvp_call" and call is not None:  # up to 0.10.x
        inner = getattr(call, "jaxpr", call)
        debug = getattr(inner, "debug_info", None)
        return getattr(debug, "func_name", None) == "_custom_root"
    return False


def _sub_jaxprs(value: Any) -> list[Any]:
    if hasattr(value, "eqns"):
        return [value]
    if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _sub_jaxprs(v)]
    return []


def primitive_names(jaxpr: Any) -> list[str]:
    """Every equation's primitive name in ``jaxpr`` and its sub-jaxprs, in order.

    A ``lax.custom_root`` call is listed as ``"custom_root"`` whatever this JAX records
    it as (see above); its internals (the solver's loop) are not listed.
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if not hasattr(inner, "eqns"):
        raise TypeError(
            f"expected a jaxpr (from jax.make_jaxpr), got {type(jaxpr).__name__}"
        )
    names: list[str] = []
    for eqn in inner.eqns:
        if _is_custom_root_eqn(eqn):
            names.append("custom_root")
            continue
        names.append(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                names.extend(primitive_names(sub))
    return names


def bypasses_custom_root(jaxpr: Any) -> bool:
    """True if an output of ``jaxpr`` depends on an input other than through ``custom_root``.

    Follows the data flow forward from the inputs: a ``lax.custom_root`` call stops it
    (its result depends on the inputs only through the equation it solves), any other
    equation passes it from its operands to its results, and a call with one inner
    jaxpr of the same arity (``jit``, ``checkpoint``) is followed inside. So an
    unrolled loop whose result is returned, with a ``custom_root`` beside it whose
    result is unused or added times zero, is found.
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if not hasattr(inner, "eqns"):
        raise TypeError(
            f"expected a jaxpr (from jax.make_jaxpr), got {type(jaxpr).__name__}"
        )
    return any(_reached_outputs(inner, [True] * len(inner.invars)))


def _reached_outputs(jaxpr: Any, reached_in: list[bool]) -> list[bool]:
    """Which outputs of ``jaxpr`` the inputs flagged in ``reached_in`` reach."""
    reached = {id(v) for v, r in zip(jaxpr.invars, reached_in) if r}
    for eqn in jaxpr.eqns:
        if _is_custom_root_eqn(eqn):
            continue
        flags = [id(v) in reached for v in eqn.invars]
        if not any(flags):
            continue
        subs = [j for value in eqn.params.values() for j in _sub_jaxprs(value)]
        if (
            len(subs) == 1
            and len(subs[0].invars) == len(eqn.invars)
            and len(subs[0].outvars) == len(eqn.outvars)
        ):
            outs = _reached_outputs(subs[0], flags)
        else:
            outs = [True] * len(eqn.outvars)
        reached.update(id(v) for v, r in zip(eqn.outvars, outs) if r)
    return [id(v) in reached for v in jaxpr.outvars]


def custom_root_eqns(jaxpr: Any) -> list[Any]:
    """The equations of ``jaxpr``'s top level that are ``lax.custom_root`` calls.

    Their ``invars`` are the operands ``custom_root`` was given after closure
    conversion: the initial guess and every value ``f``, ``solve`` and
    ``tangent_solve`` close over (their order differs between JAX versions).
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    if not hasattr(inner, "eqns"):
        raise TypeError(
            f"expected a jaxpr (from jax.make_jaxpr), got {type(jaxpr).__name__}"
        )
    return [eqn for eqn in inner.eqns if _is_custom_root_eqn(eqn)]


def uses_custom_root(jaxpr: Any) -> bool:
    """True if ``jaxpr`` (or a jaxpr nested in it) calls ``lax.custom_root``."""
    return "custom_root" in primitive_names(jaxpr)


_INT_AUX_PROBE: list[bool] = []


def custom_root_integer_aux_ok() -> bool:
    """True if this JAX differentiates ``custom_root`` with an integer ``has_aux`` output.

    Probed once by abstract evaluation (``jax.eval_shape`` of a ``jvp``; nothing runs on
    a device): False on 0.8.2, True on 0.12.
    """
    if not _INT_AUX_PROBE:
        import jax.numpy as jnp

        def root(x: Any) -> Any:
            def solve(f: Any, x0: Any) -> Any:
                return x0, jnp.zeros((), jnp.int32)

            return lax.custom_root(
                lambda y: y - x, x, solve, lambda g, y: y, has_aux=True
            )

        spec = jax.ShapeDtypeStruct((), jnp.float32)
        try:
            jax.eval_shape(lambda x: jax.jvp(root, (x,), (x,)), spec)
            _INT_AUX_PROBE.append(True)
        except TypeError:
            _INT_AUX_PROBE.append(False)
    return _INT_AUX_PROBE[0]


def custom_root_with_aux(
    f: Any, initial_guess: Any, solve: Any, tangent_solve: Any
) -> tuple[Any, Any]:
    """``lax.custom_root(f, initial_guess, solve, tangent_solve, has_aux=True)``, any aux.

    Where this JAX rejects integer/bool aux leaves under differentiation
    (:func:`custom_root_integer_aux_ok` is False), they cross ``custom_root`` as real
    floats at least as wide as float32 (the initial guess's real dtype, widened) and
    are cast back after; integers up to ``2**24`` survive float32 exactly, also when
    the guess is bfloat16 or float16. The aux carries no derivative either way
    (``stop_gradient``).
    """
    import jax.numpy as jnp

    if custom_root_integer_aux_ok():
        root, aux = lax.custom_root(
            f, initial_guess, solve, tangent_solve, has_aux=True
        )
        return root, jax.tree_util.tree_map(lax.stop_gradient, aux)
    return _custom_root_float_aux(f, initial_guess, solve, tangent_solve, jnp)


def _custom_root_float_aux(
    f: Any, initial_guess: Any, solve: Any, tangent_solve: Any, jnp: Any
) -> tuple[Any, Any]:
    # A real float at least as wide as float32, whatever the guess (bfloat16, float16,
    # complex): integers up to 2**24 cross exactly (float64 under x64: up to 2**53).
    guess = jnp.result_type(*jax.tree_util.tree_leaves(initial_guess))
    dtype = jnp.promote_types(jnp.finfo(guess).dtype, jnp.float32)
    dtypes: list[Any] = []

    def solve_float(g: Any, x: Any) -> tuple[Any, Any]:
        root, aux = solve(g, x)
        leaves, treedef = jax.tree_util.tree_flatten(aux)
        dtypes[:] = [treedef, *(jnp.result_type(a) for a in leaves)]
        as_float = [
            a
            if jnp.issubdtype(jnp.result_type(a), jnp.inexact)
            else jnp.asarray(a, dtype)
            for a in leaves
        ]
        return root, as_float

    root, aux = lax.custom_root(
        f, initial_guess, solve_float, tangent_solve, has_aux=True
    )
    treedef, *kinds = dtypes
    leaves = [lax.stop_gradient(a).astype(k) for a, k in zip(aux, kinds)]
    return root, jax.tree_util.tree_unflatten(treedef, leaves)


# ----------------------------------------------------------------------------- Chapter 4


# ----------------------------------------------------------------------------- Chapter 5


def jaxpr_atom_value(atom: Any, env: dict[Any, Any]) -> Any:
    """The value of a jaxpr input ``atom``: a literal's constant, or ``env[atom]`` for a variable.

    Used by the forward-Laplacian interpreter (:mod:`beyondgrad.forward_laplacian`,
    Chapter 5); ``jax.extend.core.Literal`` is public from 0.8.2 to the newest JAX
    (imported with this module: a first import at the first call would make every
    function jitted before it compile again, see the import's comment).
    """
    return atom.val if isinstance(atom, jax.extend.core.Literal) else env[atom]


def bind_equation(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    """Apply one jaxpr equation's primitive to ``invals``; always returns a list of outputs.

    This is what ``jax.core.eval_jaxpr`` does per equation (``get_bind_params`` turns
    stored sub-jaxprs back into what ``bind`` takes), so any primitive, including
    ``jit``, ``custom_jvp_call`` and control flow, can be re-applied under
    ``jax.jvp``/``jax.vmap`` by an interpreter.
    """
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(bind_params, tuple):  # JAX 0.8.x: (sub-functions, params)
        subfuns, params = bind_params
    else:  # newer JAX: the sub-functions stay inside the params
        subfuns, params = (), bind_params
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


# ----------------------------------------------------------------------------- primitives by name

#: Modules searched by :func:`primitive`, public ones first. The private ones hold the
#: primitives JAX does not export (``pvary``/``pcast`` in ``jax._src.lax.parallel``)
#: or exports on part of the range only (``lax.stack_p``, ``lax.tile_p`` on 0.12).
_PRIMITIVE_MODULES = (
    "jax.extend.core.primitives",
    "jax.lax",
    "jax._src.lax.lax",
    "jax._src.lax.slicing",
    "jax._src.lax.parallel",
    "jax._src.lax.special",
    "jax._src.lax.control_flow.loops",
    "jax._src.lax.control_flow.conditionals",
    "jax._src.lax.control_flow.solves",
    "jax._src.lax.linalg",
    "jax._src.pjit",
    "jax._src.shard_map",
    "jax._src.ad_checkpoint",
    "jax._src.custom_derivatives",
    "jax._src.core",
    "jax._src.interpreters.ad",
    "jax._src.callback",
)
_PRIMITIVES_BY_NAME: dict[str, Any] = {}


def eval_jaxpr(jaxpr: Any, consts: Sequence[Any], *args: Any) -> list[Any]:
    """Evaluate a jaxpr on arguments: ``jax.core.eval_jaxpr`` (public on every
    supported JAX, 0.8.2 .. newest).

    Args:
        jaxpr: an open jaxpr (``closed.jaxpr`` of a ``jax.make_jaxpr`` result).
        consts: its constants (``closed.consts``).
        *args: one value per input variable.

    Returns:
        One value per output variable.
    """
    return _jax_core.eval_jaxpr(jaxpr, consts, *args)


def primitive(name: str) -> Any | None:
    """The ``jax.extend.core.Primitive`` called ``name`` on the running JAX, or ``None``.

    The forward-Laplacian rule table (:mod:`beyondgrad.forward_laplacian`) keys its
    rules on primitive objects; this finds those whose object is not public on the whole
    range (0.8.2 .. newest), e.g. ``"pvary"`` (up to 0.9.x), ``"pcast"``, ``"stack"``
    and ``"tile"`` (0.12), ``"log2"``. Searched in :data:`_PRIMITIVE_MODULES`, public
    modules first; the first object with that name wins.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not _PRIMITIVES_BY_NAME:
        import importlib

        for module_name in _PRIMITIVE_MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            for value in vars(module).values():
                if isinstance(value, Primitive):
                    _PRIMITIVES_BY_NAME.setdefault(value.name, value)
    return _PRIMITIVES_BY_NAME.get(name)


def scan_counts(params: Any) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation's parameters.

    Up to 0.9.x(*) ``scan`` records them as ``num_consts``/``num_carry``; 0.12 records
    a flat tree ``ft_in`` of (consts, carry, xs) instead, and the body as an open
    ``Jaxpr``. (*) checked on 0.8.2 and 0.12; the releases between are not pinned here.
    """
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].unpack()
    return len(list(consts)), len(list(carry))


# ----------------------------------------------------------------- multi-process tests


def gloo_loopback_cpu_backend(hostname: str = "127.0.0.1") -> None:
    """Make JAX's Gloo CPU collectives listen on ``hostname`` (loopback by default).

    By default Gloo listens on the address that the machine's hostname resolves to,
    which may be a network interface rather than loopback. This registers a CPU
    backend factory that builds the client with Gloo TCP collectives bound to
    ``hostname``. It uses three private JAX names (``jax._src.distributed``'s
    ``global_state.client``, ``jax._src.xla_bridge``'s ``make_cpu_client`` and
    ``register_backend_factory``, ``jax._src.lib._jax.make_gloo_tcp_collectives``),
    present from 0.8.2 to 0.12; it is for the two-process test
    (``tests/_distributed_worker.py``) only: on a real cluster Gloo must use the
    network.

    Args:
        hostname: The address Gloo listens on.

    Raises:
        RuntimeError: Called before ``jax.distributed.initialize`` (no distributed
            client to build the collectives from).
    """
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax  # pyright: ignore[reportPrivateImportUsage]

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError(
            "gloo_loopback_cpu_backend: call jax.distributed.initialize(...) first; "
            "the Gloo collectives are built from its client"
        )

    def loopback_cpu_client() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=client, hostname=hostname
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory(
        "cpu", loopback_cpu_client, priority=0, fail_quietly=False
    )


#: the logger through which ``jax.debug.callback`` logs a failed host callback's
#: traceback before re-raising (``jax._src.debugging``'s module logger, 0.8.2 to 0.12)
DEBUG_CALLBACK_LOGGER = "jax._src.debugging"


@contextlib.contextmanager
def captured_debug_callback_log() -> Iterator[list[logging.LogRecord]]:
    """Keep, rather than print, what JAX logs when a ``jax.debug.callback`` raises.

    When the host function of a ``jax.debug.callback`` raises, JAX logs
    ``"jax.debug.callback failed"`` with the host traceback (file paths of the machine
    that ran it) to stderr, then re-raises inside the runtime's error. Inside this
    context those records are appended to the yielded list instead (a filter on
    :data:`DEBUG_CALLBACK_LOGGER`, removed on exit); the exception is untouched.
    """
    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        records.append(record)
        return False

    logger = logging.getLogger(DEBUG_CALLBACK_LOGGER)
    logger.addFilter(keep)
    try:
        yield records
    finally:
        logger.removeFilter(keep)


# ----------------------------------------------------------------------------- Chapter 2
# An experimental hijax primitive with reverse-mode rules only. The base class and the
# signature of its forward rule differ across the range:
#
# * 0.8.2: ``jax.experimental.hijax.VJPHiPrimitive``, ``vjp_fwd(self, *args)``;
# * 0.9.x and 0.10.x (0.9.2, 0.10.2 checked): ``VJPHiPrimitive`` with
#   ``vjp_fwd(self, nzs_in, /, *args)``;
# * 0.11.2 and newer: ``jax.experimental.hijax.HiPrim``, same ``vjp_fwd``.
# ``nzs_in`` says which inputs carry a nonzero tangent. The signature, not the class
# name, decides whether it is passed.


def vjp_hi_primitive_base() -> type:
    """A base class for a hijax primitive defined by ``expand``, ``fwd`` and ``bwd``.

    A subclass sets ``in_avals``, ``out_aval`` and ``params`` in ``__init__`` (then calls
    ``super().__init__()``) and defines ``expand(*args)`` (the value),
    ``fwd(*args) -> (value, residuals)`` and ``bwd(residuals, cotangent) -> tuple`` (one
    cotangent per input). This base maps them onto the running JAX's hijax class
    (``VJPHiPrimitive`` up to 0.10.x, ``HiPrim`` on 0.11.2 and newer) and its ``vjp_fwd`` /
    ``vjp_bwd_retval`` signatures (``vjp_fwd`` takes ``nzs_in`` first from 0.9.0 on).
    Calling an instance binds ``call_hi_primitive``.
    """
    from jax.experimental import hijax

    base = getattr(hijax, "HiPrim", None) or getattr(hijax, "VJPHiPrimitive")  # noqa: B009
    takes_nzs = _vjp_fwd_takes_nzs(base)

    class VJPHiPrim(base):  # type: ignore[misc, valid-type]
        def vjp_fwd(self, *args: Any) -> Any:
            return self.fwd(*(args[1:] if takes_nzs else args))

        def vjp_bwd_retval(self, res: Any, ct: Any) -> Any:
            return self.bwd(res, ct)

    return VJPHiPrim


def _vjp_fwd_takes_nzs(base: type) -> bool:
    """Whether ``base.vjp_fwd`` takes ``nzs_in`` before the primal arguments."""
    import inspect

    params = inspect.signature(base.vjp_fwd).parameters  # type: ignore[attr-defined]
    return "nzs_in" in params or "in_nzs" in params


# ----------------------------------------------------------------------------- Chapter 3
@contextlib.contextmanager
def krylov_without_device_put() -> Iterator[None]:
    """Run ``jax.scipy.sparse.linalg``'s ``cg``/``gmres`` without their ``device_put``.

    Both start with ``b, x0 = device_put((b, x0))`` (``jax._src.scipy.sparse.linalg``,
    0.8.2 and 0.12), one equation whose outputs partial evaluation ties to ``b``, so the
    initial guess their inner solve closes over depends on ``b``. Inside this context
    that module sees a ``device_put`` that returns its argument (an experiment for
    Chapter 3: which of the two solvers then transposes); restored on exit.
    """
    import importlib
    import types

    module: Any = importlib.import_module("jax._src.scipy.sparse.linalg")
    original = module.api
    module.api = types.SimpleNamespace(device_put=lambda x: x)
    try:
        yield
    finally:
        module.api = original


def function_source(fun: Any) -> str | None:
    """The ``"name at file:line"`` JAX records for a traced function or closed jaxpr
    (its ``debug_info.func_src_info``), or None where it records none."""
    debug = getattr(getattr(fun, "jaxpr", fun), "debug_info", None)
    return getattr(debug, "func_src_info", None)


def custom_jvp_sources(eqn: Any) -> tuple[str | None, str | None]:
    """The sources (:func:`function_source`) of a ``custom_jvp_call`` equation's primal
    and JVP functions. The JVP's parameter is ``jvp_jaxpr_fun`` on recent JAX and
    ``jvp_jaxpr_thunk`` on older releases."""
    params = eqn.params
    jvp = params.get("jvp_jaxpr_fun", params.get("jvp_jaxpr_thunk"))
    return function_source(params.get("call_jaxpr")), function_source(jvp)


def varying_like(value: Any, like: Any) -> Any:
    """``value`` cast to vary over the mesh axes that ``like`` varies over (a no-op
    outside ``shard_map``, and for axes ``value`` already varies over)."""
    return pcast_varying(value, tuple(sorted(varying_axes(like))))
