"""The version-drift probes: one small program per behaviour the book teaches.

Each probe is a function of no arguments that imports JAX itself, runs one behaviour
and returns a short string (the value the chapter relies on) or lets the exception
escape. The child runner (``beyondgrad.drift.child``) turns either into an outcome.
Probes run on every JAX from 0.6 to the newest, so API differences are guarded inside
them (``jax.shard_map`` vs ``jax.experimental.shard_map``, ``check_vma`` vs
``check_rep``, ``lax.pcast`` vs ``lax.pvary``) and nothing here imports
``beyondgrad.compat`` (which supports only the book's range). They need 8 CPU devices,
which the child runner asks for before JAX starts. Importing this module imports no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["PROBES", "ChapterRef", "Probe", "probe_ids"]


@dataclasses.dataclass(frozen=True)
class ChapterRef:
    """Where the book teaches a probe's behaviour: the page and its section title."""

    doc: str  # e.g. "chapters/02_linearize_transpose"
    section: str  # the section's title as printed

    def __str__(self) -> str:
        return f"{self.doc} § {self.section}"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One behaviour, the program that checks it, and the chapter that teaches it."""

    id: str
    run: Callable[[], str]
    chapter: ChapterRef
    summary: str
    fast: bool = True  # part of the reader's quick check (runtime.check_my_jax)


CH1 = "chapters/01_tracers"
CH2 = "chapters/02_linearize_transpose"
CH3 = "chapters/03_implicit_diff"
CH3B = "chapters/03b_solvers_costs"
CH4 = "chapters/04_shard_map_vma"
CH5 = "chapters/05_laplacians"
APPENDIX = "appendix_jax_bugs"
APX_SHARDING = "appendix_sharding_types"

#: Every probe, by id (its function's name), in registration order.
PROBES: dict[str, Probe] = {}


def _probe(chapter: str, section: str, summary: str, fast: bool = True):
    def register(fn: Callable[[], str]) -> Callable[[], str]:
        pid = fn.__name__
        if pid in PROBES:
            raise ValueError(f"duplicate probe id {pid!r}")
        PROBES[pid] = Probe(pid, fn, ChapterRef(chapter, section), summary, fast)
        return fn

    return register


def probe_ids() -> list[str]:
    """Every probe id, in the order the report shows them."""
    return list(PROBES)


# ----------------------------------------------------------------------------- helpers
# Small and version-guarded; each probe stays readable on its own.


def _short(x: object, limit: int = 160) -> str:
    """A short, stable text for a result: arrays rounded to 4 decimals."""
    import numpy as np

    if isinstance(x, str):
        text = x
    elif isinstance(x, tuple | list):
        text = "(" + ", ".join(_short(v, limit) for v in x) + ")"
    else:
        arr = np.asarray(x)
        if arr.dtype.kind == "f":
            arr = np.round(arr.astype(np.float64), 4) + 0.0  # + 0.0: no "-0."
        text = np.array2string(arr, separator=", ", threshold=12)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _mesh(n: int = 8, names: tuple[str, ...] = ("data",)):
    """A 1-D Auto mesh of the first ``n`` CPU devices (Mesh's default on every version)."""
    import jax
    import numpy as np

    return jax.sharding.Mesh(np.array(jax.devices("cpu")[:n]), names)


def _shard_map(f, mesh, in_specs, out_specs, check: bool = True):
    """``jax.shard_map`` (0.7+) or ``jax.experimental.shard_map.shard_map``, checks on."""
    import inspect

    import jax

    sm: Any = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm
    params = inspect.signature(sm).parameters
    flag = "check_vma" if "check_vma" in params else "check_rep"
    return sm(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **{flag: check})


def _cast_varying(x, axes: tuple[str, ...], required: bool = True):
    """``lax.pcast(x, axes, to='varying')`` where it exists, else ``lax.pvary``.

    Before 0.6 neither exists (no varying types): ``required=False`` returns ``x``.
    """
    from jax import lax

    if hasattr(lax, "pcast"):
        return lax.pcast(x, axes, to="varying")
    if hasattr(lax, "pvary") or required:
        return lax.pvary(x, axes)  # type: ignore[attr-defined]  # removed in 0.10.0
    return x


def _typeof(x) -> str:
    import jax

    typeof: Any = getattr(jax, "typeof", None)
    if typeof is None:
        from jax._src import core

        typeof = core.get_aval  # type: ignore[attr-defined]  # before jax.typeof
    return str(typeof(x))


def _P(*names):
    from jax.sharding import PartitionSpec

    return PartitionSpec(*names)


def _eager_grad(put_as=None, set_mesh: bool = False) -> str:
    """grad of a shard_map of psum(sum(a**2)) over ("data",) on a default
    jax.make_mesh mesh, called eagerly at arange(8): the argument optionally put on
    the mesh with the spec ``put_as``, the call optionally inside
    `with jax.set_mesh(mesh)`."""
    import contextlib

    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding

    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices("cpu")[:8])
    f = _shard_map(lambda a: lax.psum(jnp.sum(a**2), "data"), mesh, _P("data"), _P())
    x = jnp.arange(8.0)
    if put_as is not None:
        x = jax.device_put(x, NamedSharding(mesh, put_as))
    with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
        return _short(jax.grad(f)(x))


# ----------------------------------------------------------------------------- Chapter 1


@_probe(CH1, "The error family", "jit(jnp.split) with a traced section count")
def ch1_split_traced_sections() -> str:
    import jax
    import jax.numpy as jnp

    return _short(jax.jit(jnp.split)(jnp.arange(4.0), 2))


@_probe(CH1, "The error family", "int() of an abstract tracer under jit")
def ch1_int_of_tracer() -> str:
    import jax
    import jax.numpy as jnp

    return _short(jax.jit(lambda x: jnp.zeros(3) * int(x))(2.0))


@_probe(CH1, "The error family", "range(n) with a traced n under jit")
def ch1_range_of_tracer() -> str:
    import jax
    import jax.numpy as jnp

    def repeat_sin(x, n):
        for _ in range(n):
            x = jnp.sin(x)
        return x

    return _short(jax.jit(repeat_sin)(jnp.ones(3), 2))


@_probe(CH1, "The error family", "a NumPy function applied to a tracer")
def ch1_numpy_on_tracer() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    return _short(jax.jit(lambda x: np.sin(x))(jnp.ones(3)))


@_probe(CH1, "The error family", "a tracer stored in a global and used after its trace")
def ch1_escaped_tracer() -> str:
    import jax

    stash = []

    @jax.jit
    def remember(x):
        stash.append(x)
        return 2 * x

    remember(1.0)
    return _short(jax.jit(lambda y: y + stash[0])(1.0))


@_probe(CH1, "The error family", "boolean-mask indexing x[x > 0] under jit")
def ch1_boolean_mask_under_jit() -> str:
    import jax
    import jax.numpy as jnp

    return _short(jax.jit(lambda x: jnp.sum(x[x > 0]))(jnp.array([-1.0, 2.0, 3.0])))


@_probe(CH1, "Python control flow on traced values", "Python if on a traced value")
def ch1_if_on_tracer() -> str:
    import jax

    return _short(jax.jit(lambda x: x if x > 0 else -x)(1.0))


@_probe(CH1, "The error family", "subclass relations of the concreteness errors")
def ch1_error_hierarchy() -> str:
    import jax

    E = jax.errors
    names = [
        "TracerBoolConversionError",
        "TracerIntegerConversionError",
        "TracerArrayConversionError",
        "NonConcreteBooleanIndexError",
    ]
    parts = []
    for name in names:
        cls = getattr(E, name, None)
        if cls is None:
            parts.append(f"{name}: absent")
            continue
        bases = [
            b.__name__
            for b in cls.__mro__[1:]
            if b.__name__
            not in (
                "object",
                "BaseException",
                "Exception",
                "JAXTypeError",
                "JAXIndexError",
            )
        ]
        parts.append(f"{name} < {','.join(bases)}")
    return "; ".join(parts)


@_probe(
    CH1,
    "Abstract and concrete values, as JAX works today",
    "whether the ConcreteArray aval class still exists",
)
def ch1_concrete_array_class() -> str:
    from jax import core as jcore
    from jax._src import core

    return (
        f"jax.core.ConcreteArray={hasattr(jcore, 'ConcreteArray')}, "
        f"jax._src.core.ConcreteArray={hasattr(core, 'ConcreteArray')}"
    )


@_probe(
    CH2,
    "Why reverse mode needs forward rules",
    "grad of a pure_callback (its JVP rule raises)",
)
def ch1_pure_callback_grad() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    def host_sin(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    return _short(jax.grad(host_sin)(jnp.float32(1.0)))


@_probe(
    CH1,
    "Abstract and concrete values, as JAX works today",
    "which tracer classes override to_concrete_value",
)
def ch1_concreteness_answerers() -> str:
    import jax  # noqa: F401  (imports the tracer classes)
    from jax._src import core

    if not hasattr(core.Tracer, "to_concrete_value"):
        return "Tracer has no to_concrete_value"
    found, todo = set(), list(core.Tracer.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "to_concrete_value" in vars(cls):
            found.add(cls.__name__)
    return ", ".join(sorted(found))


def _jax_log_messages(option: str, run: Callable[[], object]) -> list[str]:
    """What JAX logs while ``run()`` runs with the boolean ``option`` on."""
    import logging

    import jax

    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger = logging.getLogger("jax")
    handlers, propagate = list(logger.handlers), logger.propagate
    logger.handlers, logger.propagate = [Collect()], False
    jax.config.update(option, True)
    try:
        run()
    finally:
        jax.config.update(option, False)
        logger.handlers, logger.propagate = handlers, propagate
    return messages


@_probe(
    CH1,
    "Asking JAX why it traced again",
    "jax_explain_cache_misses text for a new input shape (reason lines)",
)
def ch1_cache_miss_explanation() -> str:
    import re

    import jax
    import jax.numpy as jnp

    fn = jax.jit(lambda x: 2.0 * x)
    a, b = jnp.ones(3), jnp.ones(4)
    messages = _jax_log_messages("jax_explain_cache_misses", lambda: (fn(a), fn(b)))
    misses = [m for m in messages if "CACHE MISS" in m]
    if len(misses) != 2:
        return f"{len(misses)} cache-miss messages for 2 traces"
    reasons = [line.strip() for line in misses[1].splitlines()[1:]]
    text = " / ".join(r for r in reasons if not r.startswith("for "))
    return re.sub(r"costing [0-9.]+ ms ", "", text)


@_probe(
    CH1,
    "Asking JAX why it traced again",
    "traces of jax.jit(model.method) made anew on each of 3 calls",
)
def ch1_bound_method_retrace() -> str:
    import jax
    import jax.numpy as jnp

    traces = []

    class Model:
        def log_psi(self, x):
            traces.append(1)
            return jnp.sum(x**2)

    model, x = Model(), jnp.ones(3)
    for _ in range(3):
        jax.jit(model.log_psi)(x)
    step = jax.jit(model.log_psi)
    once = len(traces)
    for _ in range(3):
        step(x)
    return f"per-call jit: {once} traces; one jit: {len(traces) - once} trace(s)"


@_probe(CH3, "A solver that reverse mode refuses", "grad through lax.while_loop")
def while_loop_reverse_mode() -> str:
    import jax
    from jax import lax

    def double_until_big(x):
        return lax.while_loop(lambda v: v < 10.0, lambda v: 2.0 * v, x)

    lin = jax.linearize(double_until_big, 1.5)[1](1.0)  # forward half works
    return _short((lin, jax.grad(double_until_big)(1.5)))


@_probe(
    CH3,
    "A solver that reverse mode refuses",
    "jit(grad) of fori_loop with a traced trip count",
)
def fori_loop_traced_bounds_grad() -> str:
    import jax

    double = lambda i, v: 2.0 * v
    repeat_double = lambda x, n: jax.lax.fori_loop(0, n, double, x)
    return _short(jax.jit(jax.grad(repeat_double))(1.0, 3))


# ----------------------------------------------------------------------------- Chapter 2


@_probe(
    CH2, "How JAX does it today", "tracer class seen under grad, vjp, linearize, jvp"
)
def ch2_tracer_classes() -> str:
    import jax
    import jax.numpy as jnp

    def name(transform):
        seen: list[str] = []

        def g(z):
            seen.append(type(z).__name__)
            return jnp.sin(z)

        transform(g)
        return seen[0]

    return ", ".join(
        [
            "grad=" + name(lambda g: jax.grad(g)(1.0)),
            "vjp=" + name(lambda g: jax.vjp(g, 1.0)),
            "linearize=" + name(lambda g: jax.linearize(g, 1.0)),
            "jvp=" + name(lambda g: jax.jvp(g, (1.0,), (1.0,))),
        ]
    )


@_probe(
    CH2,
    "How JAX does it today",
    "the jax_use_direct_linearize option and whether it is obeyed",
)
def ch2_direct_linearize_option() -> str:
    import jax
    import jax.numpy as jnp

    if "jax_use_direct_linearize" not in jax.config.values:
        return "absent"

    def grad_tracer(flag):
        seen = []

        def g(z):
            seen.append(type(z).__name__)
            return jnp.sin(z)

        old = jax.config.values["jax_use_direct_linearize"]
        jax.config.update("jax_use_direct_linearize", flag)
        try:
            jax.grad(g)(1.0)
        finally:
            jax.config.update("jax_use_direct_linearize", old)
        return seen[0]

    return f"present: on={grad_tracer(True)}, off={grad_tracer(False)}"


@_probe(
    CH2,
    "How JAX does it today",
    "primitives with a linearization rule of their own (after import jax)",
)
def ch2_linearization_rules() -> str:
    import jax  # noqa: F401
    from jax._src.interpreters import ad

    rules = getattr(ad, "primitive_linearizations", None)
    if rules is None:
        return "no primitive_linearizations table"
    return ", ".join(sorted(p.name for p in rules))


@_probe(
    CH2,
    "A transpose rule for a new linear primitive",
    "JAX functions on the stack when jax.vjp's function calls a transpose rule",
)
def ch2_vjp_transpose_path() -> str:
    import inspect
    from pathlib import Path

    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive  # present from 0.5.3, the oldest recorded
    from jax.interpreters import ad, mlir

    def double_impl(a):
        return 2.0 * a

    prim = Primitive("drift_double")
    prim.def_impl(double_impl)
    prim.def_abstract_eval(lambda a: a)
    mlir.register_lowering(prim, mlir.lower_fun(double_impl, multiple_results=False))
    stacks = []

    def transpose(ct, a):
        jax_dir = Path(jax.__file__).parent
        stacks.append(
            [f.function for f in inspect.stack() if jax_dir in Path(f.filename).parents]
        )
        return [2.0 * ct]

    ad.deflinear2(prim, transpose)
    _, vjp_fn = jax.vjp(prim.bind, jnp.ones(3))
    vjp_fn(jnp.ones(3))
    return " <- ".join(stacks[-1][:3])


def _seed001(cast_to: tuple[str, ...] = ()) -> str:
    import jax
    import jax.numpy as jnp

    def mean_square(z):
        return jnp.mean(z**2)

    def pull_back(p, t):
        if cast_to:
            p = _cast_varying(p, cast_to)
        _, lin = jax.linearize(mean_square, p)
        return jax.linear_transpose(lin, p)(lin(t))[0]

    p, t = jnp.array([1.5]), jnp.arange(1.0, 9.0)
    out = _shard_map(partial(pull_back, p), _mesh(), _P("data"), _P("data"))(t)
    return _short(out)


@_probe(
    CH2,
    "The `shard_map` case: primal and tangent must vary alike",
    "jax#28260: linearize at a closed-over primal, transpose, on a sharded tangent",
)
def seed001_linearize_transpose_no_cast() -> str:
    return _seed001(cast_to=())


@_probe(
    CH2,
    "The `shard_map` case: primal and tangent must vary alike",
    "jax#28260 fixed by casting the primal to varying (pcast, or pvary where older)",
)
def seed001_linearize_transpose_with_cast() -> str:
    return _seed001(cast_to=("data",))


# ----------------------------------------------------------------------------- Chapter 3


@_probe(
    APPENDIX,
    "Chapter 3b's aside: how `custom_root` got its shape",
    "jax#1448: custom_root whose solve closes over traced values, under jit and grad",
)
def seed002_custom_root_closure_jit() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def linear_solve(a, b):
        f = lambda y: a @ y - b
        x_direct = jnp.linalg.solve(a, b)
        return lax.custom_root(
            f,
            jnp.zeros_like(b),
            lambda f, x0: x_direct,
            lambda g, y: jnp.linalg.solve(jax.jacobian(g)(y), y),
        )

    a, b = jnp.array([[2.0, 1.0], [1.0, 3.0]]), jnp.ones(2)
    sol = jax.jit(linear_solve)(a, b)
    grad = jax.jit(jax.grad(lambda a: linear_solve(a, b).sum()))(a)
    return _short((sol, grad))


@_probe(
    CH3B,
    "Diagnostics through `has_aux`",
    "an int32 aux output of custom_root(has_aux=True) under jvp and grad",
)
def custom_root_int_aux() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def kepler(M, e=0.3, tol=1e-6):
        F = lambda E: E - M - e * jnp.sin(E)

        def solve(F, E0):
            go = lambda s: (jnp.abs(F(s[0])) > tol) & (s[1] < 100)
            E, k = lax.while_loop(go, lambda s: (s[0] - F(s[0]), s[1] + 1), (E0, 0))
            return E, k.astype(jnp.int32)  # type: ignore[attr-defined]  # k traced

        return lax.custom_root(
            F, jnp.asarray(M, float), solve, lambda g, y: y / g(1.0), has_aux=True
        )

    (_, _), (dE_jvp, _) = jax.jvp(kepler, (1.0,), (1.0,))
    dE, count = jax.grad(kepler, has_aux=True)(1.0)
    return _short((dE_jvp, dE, count))


@_probe(
    CH3B,
    "Aside: `tangent_solve` even when nothing is differentiated",
    "custom_root with tangent_solve=None, called without any differentiation",
)
def seed002_custom_root_tangent_solve_none() -> str:
    import jax.numpy as jnp
    from jax import lax

    a, b = jnp.array([[2.0, 1.0], [1.0, 3.0]]), jnp.ones(2)
    x_direct = jnp.linalg.solve(a, b)
    no_solver: Any = None  # the case under test: custom_root's annotation forbids it
    sol = lax.custom_root(
        lambda y: a @ y - b, jnp.zeros_like(b), lambda f, x0: x_direct, no_solver
    )
    return _short(sol)


@_probe(
    CH3B,
    "A deep-equilibrium layer",
    "jax_threefry_partitionable's default, the context manager, and a key's draws",
)
def threefry_partitionable_default() -> str:
    import jax
    from jax import random

    flag = jax.config.values.get("jax_threefry_partitionable", "absent")
    has_cm = hasattr(jax, "threefry_partitionable")
    draw = random.normal(random.PRNGKey(1), (2,))
    return f"default={flag}; jax.threefry_partitionable={has_cm}; normal(key 1)={_short(draw)}"


# ----------------------------------------------------------------------------- Chapter 4


@_probe(
    CH4, "4.2 Explicit and Auto mesh axes", "axis types of jax.make_mesh by default"
)
def make_mesh_default_axis_types() -> str:
    import jax

    mesh = jax.make_mesh((8,), ("data",), devices=jax.devices("cpu")[:8])
    return str(tuple(str(t) for t in getattr(mesh, "axis_types", ("(no axis_types)",))))


@_probe(
    CH4, "4.2 Explicit and Auto mesh axes", "shard_map on an Auto mesh without in_specs"
)
def shard_map_omitted_in_specs() -> str:
    import jax
    import jax.numpy as jnp

    sm: Any = getattr(jax, "shard_map", None)
    if sm is None:
        from jax.experimental.shard_map import shard_map as sm
    out = sm(lambda a: 2 * a, mesh=_mesh(), out_specs=_P("data"))(jnp.arange(8.0))
    return _short(out)


@_probe(
    CH4,
    "4.2 Explicit and Auto mesh axes",
    "in_specs=P('data') for a replicated argument on an Explicit mesh",
)
def shard_map_explicit_mismatch() -> str:
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType, NamedSharding

    mesh = jax.make_mesh(
        (8,), ("data",), axis_types=(AxisType.Explicit,), devices=jax.devices("cpu")[:8]
    )
    x_rep = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, _P()))
    out = _shard_map(lambda a: 2 * a, mesh, _P("data"), _P("data"))(x_rep)
    return f"{_typeof(out)} sum {_short(jnp.sum(out))}"


@_probe(
    CH4,
    "4.2 Explicit and Auto mesh axes",
    "eager grad of a shard_map on a default jax.make_mesh mesh, no jax.set_mesh",
)
def shard_map_eager_grad_no_set_mesh() -> str:
    return _eager_grad(put_as=None)


@_probe(
    CH4,
    "4.2 Explicit and Auto mesh axes",
    "the same eager grad, argument put as P('data'), inside `with jax.set_mesh(mesh)`",
)
def shard_map_eager_grad_with_set_mesh() -> str:
    return _eager_grad(put_as=_P("data"), set_mesh=True)


@_probe(
    CH4,
    "4.2 Explicit and Auto mesh axes",
    "the same eager grad with the argument put on the mesh as P('data') first",
)
def shard_map_eager_grad_sharded_input() -> str:
    return _eager_grad(put_as=_P("data"))


@_probe(
    CH4,
    "4.3 The type: varying or invariant",
    "where the varying axes of a type live: aval.vma or aval.manual_axis_type",
)
def aval_varying_axes_field() -> str:
    import jax
    import jax.numpy as jnp

    seen = {}

    def look(a):
        typeof = getattr(jax, "typeof", None)
        aval = typeof(a) if typeof else a.aval
        vma = getattr(aval, "vma", None)
        mat = getattr(aval, "manual_axis_type", None)
        seen["vma"] = "absent" if vma is None else str(sorted(vma))
        seen["mat"] = (
            "absent"
            if mat is None
            else f"varying={sorted(getattr(mat, 'varying', ()))}"
        )
        seen["type"] = str(aval)
        return a

    _shard_map(look, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0))
    return f"type {seen['type']}; vma {seen['vma']}; manual_axis_type {seen['mat']}"


def _cast_type(cast) -> str:
    import jax.numpy as jnp

    seen = []

    def body(w):
        v = cast(w)
        seen.append(_typeof(v))
        return v

    _shard_map(body, _mesh(), _P(), _P("data"))(jnp.arange(2.0))
    return f"{seen[0]}"


@_probe(CH4, "4.5 Casting by hand", "lax.pvary(x, axes) exists and casts to varying")
def api_lax_pvary() -> str:
    from jax import lax

    return _cast_type(lambda w: lax.pvary(w, ("data",)))  # type: ignore[attr-defined]


@_probe(CH4, "4.5 Casting by hand", "lax.pcast(x, axes, to='varying') exists and casts")
def api_lax_pcast() -> str:
    from jax import lax

    return _cast_type(lambda w: lax.pcast(w, ("data",), to="varying"))


@_probe(CH4, "4.5 Casting by hand", "casting to varying a value that already varies")
def pcast_already_varying() -> str:
    import jax.numpy as jnp

    out = _shard_map(
        lambda a: _cast_varying(a, ("data",)), _mesh(), _P("data"), _P("data")
    )(jnp.arange(8.0))
    return _short(out)


@_probe(CH4, "4.4 Collectives change the type", "out_specs=P() for a varying result")
def out_specs_invariant_claim() -> str:
    import jax.numpy as jnp

    return _short(
        _shard_map(lambda a: 2 * a, _mesh(), _P("data"), _P())(jnp.arange(8.0))
    )


@_probe(
    CH4, "4.4 Collectives change the type", "psum of an invariant value over 8 devices"
)
def psum_of_invariant() -> str:
    import jax.numpy as jnp
    from jax import lax

    return _short(
        _shard_map(lambda w: lax.psum(w, "data"), _mesh(), _P(), _P())(jnp.ones(3))
    )


@_probe(
    CH4,
    "4.4 Collectives change the type",
    "the to= values lax.all_gather accepts, and the result type on an Auto mesh",
)
def all_gather_to_values() -> str:
    import inspect

    import jax.numpy as jnp
    from jax import lax

    if "to" not in inspect.signature(lax.all_gather).parameters:
        return "no to= parameter"
    first_seen = {}
    for to in ("varying", "invarying", "invariant", "reduced"):
        seen: list[str] = []

        def body(a, to=to, seen=seen):
            g = lax.all_gather(a, "data", to=to)
            seen.append(_typeof(g))
            return a

        try:
            _shard_map(body, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0))
        except Exception as e:  # the answer is which values are refused
            if "unexpected `to` value" in str(e):
                seen.append("rejected")
            elif not seen:  # accepted, but not for this (Auto-mesh, varying) input
                seen.append(f"accepted, then {type(e).__name__}")
        first_seen[to] = seen[0]
    return "; ".join(f"{to}: {what}" for to, what in first_seen.items())


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp at an invariant primal with a varying tangent, out_specs=P()",
)
def jvp_varying_tangent_hole() -> str:
    import jax
    import jax.numpy as jnp

    p0 = jnp.array([0.5])
    seen = []

    def tangent(t):
        out = jax.jvp(jnp.sin, (p0,), (t,))[1]
        seen.append(_typeof(out))
        return out

    out = _shard_map(tangent, _mesh(), _P("data"), _P())(jnp.arange(1.0, 9.0))
    return f"tangent type {seen[0]}; returned {_short(out)}"


def _jvp_hole(fn_name: str) -> str:
    """jvp of ``fn_name`` at an invariant primal with a varying tangent, out_specs=P().

    The forms differ in the JVP rule that types the output tangent: a primitive's own
    rule (``lax.sin``), the rule of a ``jit``-ed call (``jit(lax.sin)``; jnp functions
    are ``jit``-ed too) and a bilinear primitive's raw ``bind`` (``lax.mul``)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    fns: dict[str, Callable[..., Any]] = {
        "lax.sin": lax.sin,
        "jit(lax.sin)": jax.jit(lax.sin),
        "lax.mul": lambda q: lax.mul(q, jnp.full_like(q, 2.0)),
    }
    p0 = jnp.array([0.5])
    seen = []

    def tangent(t):
        out = jax.jvp(fns[fn_name], (p0,), (t,))[1]
        seen.append(_typeof(out))
        return out

    out = _shard_map(tangent, _mesh(), _P("data"), _P())(jnp.arange(1.0, 9.0))
    return f"tangent type {seen[0]}; returned {_short(out)}"


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp of lax.sin (no jit) at an invariant primal, varying tangent, out_specs=P()",
)
def jvp_hole_lax_sin() -> str:
    return _jvp_hole("lax.sin")


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp of jax.jit(lax.sin) at an invariant primal, varying tangent, out_specs=P()",
)
def jvp_hole_jit_sin() -> str:
    return _jvp_hole("jit(lax.sin)")


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp of lax.mul(q, full_like(q, 2.0)) at an invariant primal, varying tangent",
)
def jvp_hole_lax_mul() -> str:
    return _jvp_hole("lax.mul")


@_probe(
    CH4, "4.8 Loop carries", "fori_loop carry from invariant zeros plus a varying value"
)
def loop_carry_invariant_init() -> str:
    import jax.numpy as jnp
    from jax import lax

    def accumulate(xb):
        return lax.fori_loop(0, 3, lambda k, acc: acc + xb, jnp.zeros(xb.shape))

    return _short(
        _shard_map(accumulate, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0))
    )


# ------------------------------------------------- Chapter 4: the rest of the type system
# Probes added for the global view (Explicit axes, unreduced/reduced), jax_auto_pcast,
# pmap as shard_map, custom rules with varying arguments and Hessian-vector products.


def _explicit_mesh(shape: tuple[int, ...] = (2, 4), names=("x", "y")):
    """A mesh of the first 8 CPU devices whose axes are all Explicit."""
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh(
        shape,
        names,
        axis_types=(AxisType.Explicit,) * len(shape),
        devices=jax.devices("cpu")[:8],
    )


def _mesh_context(mesh):
    """``jax.set_mesh(mesh)`` where it exists, else ``jax.sharding.use_mesh``."""
    import jax

    set_mesh = getattr(jax, "set_mesh", None)
    if set_mesh is None:
        set_mesh = jax.sharding.use_mesh  # type: ignore[attr-defined]  # removed
    return set_mesh(mesh)


@_probe(
    APX_SHARDING,
    "`pbroadcast`: a collective, and an old name for the cast",
    "lax.pbroadcast(a, ('data',), source=0) on a varying block: the result type "
    "(traced only: CPU has no lowering)",
)
def pbroadcast_type() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    if not hasattr(lax, "pbroadcast"):
        return "no lax.pbroadcast"
    seen = []

    def body(a):
        b = lax.pbroadcast(a, ("data",), source=0)
        seen.append(f"{_typeof(a)} -> {_typeof(b)}")
        return b

    jax.make_jaxpr(_shard_map(body, _mesh(), _P("data"), _P("data")))(jnp.arange(8.0))
    return seen[0]


@_probe(
    APX_SHARDING,
    "The automatic casts: `jax_auto_pcast`",
    "the jax_auto_pcast option and its default value (where it exists)",
)
def auto_pcast_default() -> str:
    import jax

    if "jax_auto_pcast" not in jax.config.values:
        return "no jax_auto_pcast option"
    return f"jax_auto_pcast={jax.config.values['jax_auto_pcast']}"


@_probe(
    APX_SHARDING,
    "The automatic casts: `jax_auto_pcast`",
    "psum of an invariant value with jax_auto_pcast=False (the option, where it exists)",
)
def auto_pcast_off_psum_invariant() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    if "jax_auto_pcast" not in jax.config.values:
        return "no jax_auto_pcast option"
    jax.config.update("jax_auto_pcast", False)
    out = _shard_map(lambda w: lax.psum(w, "data"), _mesh(), _P(), _P())(jnp.ones(3))
    return _short(out)


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "custom_jvp rule returning an invariant tangent (jnp.ones) for a varying input",
)
def custom_jvp_invariant_tangent() -> str:
    import jax
    import jax.numpy as jnp

    @jax.custom_jvp
    def f(v):
        return jnp.sin(v)

    @f.defjvp
    def f_jvp(primals, tangents):
        (v,), _ = primals, tangents
        return jnp.sin(v), jnp.ones(v.shape)

    g = jax.grad(lambda v: jnp.sum(f(v)))
    return _short(_shard_map(g, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0)))


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "custom_vjp bwd returning an invariant cotangent (jnp.ones) for a varying input",
)
def custom_vjp_invariant_cotangent() -> str:
    import jax
    import jax.numpy as jnp

    class Sin:  # a callable object: newer JAX's message then names no source file
        def __call__(self, v):
            return jnp.sin(v)

    f = jax.custom_vjp(Sin())
    f.defvjp(lambda v: (jnp.sin(v), v), lambda v, ct: (jnp.ones(v.shape),))
    g = jax.grad(lambda v: jnp.sum(f(v)))
    return _short(_shard_map(g, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0)))


def _hvp_invariant_direction(fun_name: str, cast: bool = False) -> str:
    """jvp of grad at a varying primal (this device's block) in an invariant direction
    (jnp.ones), optionally cast to varying first; out_specs=P('data')."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    funs = {
        "lax.mul": lambda v: lax.reduce_sum(lax.mul(v, v), (0,)),
        "jnp.mean": lambda v: jnp.mean(v**2),
    }

    def hvp(xb):
        d = jnp.ones(xb.shape, xb.dtype)
        if cast:
            d = _cast_varying(d, ("data",))
        return jax.jvp(jax.grad(funs[fun_name]), (xb,), (d,))[1]

    x = jnp.arange(16.0) / 10
    return _short(_shard_map(hvp, _mesh(), _P("data"), _P("data"))(x))


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp(grad(sum(lax.mul(v, v)))) at a varying primal, invariant direction jnp.ones",
)
def hvp_invariant_direction_lax_mul() -> str:
    return _hvp_invariant_direction("lax.mul")


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp(grad(jnp.mean(v**2))) at a varying primal, invariant direction jnp.ones",
)
def hvp_invariant_direction_jnp_mean() -> str:
    return _hvp_invariant_direction("jnp.mean")


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "the same two Hessian-vector products with the direction cast to varying first",
)
def hvp_cast_direction() -> str:
    return "; ".join(
        f"{name}: {_hvp_invariant_direction(name, cast=True)}"
        for name in ("lax.mul", "jnp.mean")
    )


@_probe(
    APX_SHARDING,
    "`pmap` is a `shard_map` with the check off",
    "what jax.pmap traces to: a shard_map with check_vma=False, or xla_pmap",
)
def pmap_traces_to_shard_map() -> str:
    import jax
    import jax.numpy as jnp

    devices = jax.devices("cpu")[:8]
    f = jax.pmap(lambda a: 2 * a, axis_name="data", devices=devices)
    text = str(jax.make_jaxpr(f)(jnp.ones((8, 2))))
    if "shard_map[" in text:
        flags = [f for f in ("check_vma=False", "check_rep=False") if f in text]
        return f"shard_map, {flags[0] if flags else 'checks on'}"
    return "xla_pmap" if "xla_pmap[" in text else text[:120]


@_probe(
    APX_SHARDING,
    "The global view: Auto, Explicit and Manual",
    "typeof of an (8, 4) array put as P('x') on a 2x4 Explicit mesh, and of its "
    "block inside shard_map",
)
def explicit_type_and_block() -> str:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    mesh = _explicit_mesh()
    a = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, _P("x", None)))
    seen = []

    def body(b):
        seen.append(_typeof(b))
        return b

    out = _shard_map(body, mesh, _P("x"), _P("x"))(a)
    return f"global {_typeof(a)}; block {seen[0]}; out {_typeof(out)}"


@_probe(
    APX_SHARDING,
    "Unreduced and reduced",
    "a contraction over a sharded dimension with out_sharding P('x', None, "
    "unreduced={'y'}), then reshard to P('x', None)",
)
def unreduced_contraction() -> str:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    mesh = _explicit_mesh()
    a = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, _P("x", "y")))
    b = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, _P("y", None)))
    spec = jax.sharding.PartitionSpec("x", None, unreduced=frozenset({"y"}))
    reshard = getattr(jax, "reshard", None) or jax.sharding.reshard
    with _mesh_context(mesh):
        c = jnp.matmul(a, b, out_sharding=spec)
        r = reshard(c, _P("x", None))
    import numpy as np

    return f"{_typeof(c)} -> {_typeof(r)}, row 0 = {_short(np.asarray(r)[0])}"


@_probe(
    APX_SHARDING,
    "Unreduced and reduced",
    "inside shard_map: grad with respect to a parameter cast to reduced, then psum",
)
def reduced_param_grad_type() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    seen: list[str] = []

    def body(w, xb):
        wr = lax.pcast(w, "data", to="reduced")
        g = jax.grad(lambda v: jnp.sum(jnp.sin(xb @ v)))(wr)
        s = lax.psum(g, "data")
        seen.extend(_typeof(v) for v in (wr, g, s))
        return s

    X = jnp.arange(32.0).reshape(16, 2) / 10
    f = jax.jit(_shard_map(body, _mesh(), (_P(), _P("data")), _P()))
    out = f(jnp.array([1.0, -1.0]), X)
    return f"w {seen[0]}, grad {seen[1]}, psum {seen[2]}: {_short(out)}"


@_probe(
    APX_SHARDING,
    "Unreduced and reduced",
    "shard_map out_specs P(None, unreduced={'data'}) for per-device partial sums, "
    "on an Explicit mesh, then reshard to P()",
)
def shard_map_out_specs_unreduced() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding

    mesh = _explicit_mesh((8,), ("data",))
    X = jax.device_put(jnp.arange(32.0).reshape(16, 2), NamedSharding(mesh, _P("data")))
    spec = jax.sharding.PartitionSpec(None, unreduced=frozenset({"data"}))

    def body(xb):
        return lax.pcast(jnp.sum(xb, axis=0), "data", to="unreduced")

    reshard = getattr(jax, "reshard", None) or jax.sharding.reshard
    with _mesh_context(mesh):
        out = jax.jit(_shard_map(body, mesh, _P("data"), spec))(X)
        r = reshard(out, _P())
    return f"{_typeof(out)} -> {_typeof(r)} {_short(r)}"


# Chapter 4, issue 24 (round 4): custom_vjp cotangent types, the minimal form of the
# Hessian-vector-product failure, a direction that works, and mul's JVP rule.


def _custom_vjp_wv(reduce_ct_w: bool) -> str:
    """grad of sum(sin(w * v)) through a custom_vjp, w invariant (P()), v varying; the
    bwd rule returns the per-device cotangent of w, psum-ed over 'data' or not."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    class SinWV:  # a callable object: newer JAX's message then names no source file
        def __call__(self, w, v):
            return jnp.sin(w * v)

    f = jax.custom_vjp(SinWV())

    def bwd(res, ct):
        w, v = res
        ct_w = jnp.cos(w * v) * ct * v
        if reduce_ct_w:
            ct_w = lax.psum(ct_w, "data")
        return ct_w, jnp.cos(w * v) * ct * w

    f.defvjp(lambda w, v: (f(w, v), (w, v)), bwd)
    g = jax.grad(lambda w, v: jnp.sum(f(w, v)))
    out = _shard_map(g, _mesh(), (_P(), _P("data")), _P())(
        jnp.ones(2), jnp.arange(16.0) / 10
    )
    return _short(out)


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "custom_vjp bwd returning the per-device (varying) cotangent of an invariant input",
)
def custom_vjp_varying_cotangent_invariant_input() -> str:
    return _custom_vjp_wv(reduce_ct_w=False)


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "the same custom_vjp with the invariant input's cotangent psum-ed inside bwd",
)
def custom_vjp_psum_cotangent() -> str:
    return _custom_vjp_wv(reduce_ct_w=True)


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp(lambda v: lax.mul(v, v)) at a varying primal, invariant tangent jnp.ones "
    "(no grad: the minimal form of the HVP failure)",
)
def jvp_invariant_tangent_lax_mul() -> str:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def body(xb):
        return jax.jvp(lambda v: lax.mul(v, v), (xb,), (jnp.ones(xb.shape),))[1]

    return _short(_shard_map(body, _mesh(), _P("data"), _P("data"))(jnp.arange(8.0)))


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "jvp(grad(jnp.mean(v**2))) with the direction built by jnp.ones_like(primal)",
)
def hvp_ones_like_direction() -> str:
    import jax
    import jax.numpy as jnp

    def hvp(xb):
        grad = jax.grad(lambda v: jnp.mean(v**2))
        return jax.jvp(grad, (xb,), (jnp.ones_like(xb),))[1]

    x = jnp.arange(16.0) / 10
    return _short(_shard_map(hvp, _mesh(), _P("data"), _P("data"))(x))


@_probe(
    CH4,
    "4.6 Autodiff sees the types",
    "which JVP rule lax.mul_p has: defbilinear's prim.bind (no cast) or lax.mul",
)
def mul_jvp_rule() -> str:
    import inspect

    from jax._src.interpreters import ad
    from jax._src.lax import lax as lax_internal

    rule = ad.primitive_jvps[lax_internal.mul_p]
    parts = getattr(rule, "args", ())
    rules = parts[0] if parts and isinstance(parts[0], (list, tuple)) else ()
    texts = []
    for r in rules:
        try:
            texts.append(inspect.getsource(r).strip())
        except (OSError, TypeError):
            texts.append(repr(r))
    if texts and all("prim.bind" in s for s in texts):
        return "prim.bind(g, y) / prim.bind(x, g) (ad.defbilinear: no cast)"
    if texts and all("mul(" in s for s in texts):
        return "lax.mul(xdot, y) / lax.mul(x, ydot) (casts to varying)"
    return "; ".join(s.splitlines()[0][:60] for s in texts) or repr(rule)[:120]


# ----------------------------------------------------------------------------- Chapter 5


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    "jax#33947: grad inside shard_map (check_vma) of a function that splits and "
    "drops a piece",
)
def seed000_split_unused_grad() -> str:
    import jax
    import jax.numpy as jnp

    def f(x):
        used, _unused = jnp.split(x, 2)
        return jnp.sum(jnp.sin(used))

    out = _shard_map(jax.grad(f), _mesh(), _P("data"), _P("data"))(jnp.arange(16.0))
    return _short(out)


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    "jax#33947 variant: the first piece of the split dropped instead of the second",
)
def seed000_split_unused_head_grad() -> str:
    import jax
    import jax.numpy as jnp

    def f(x):
        _unused, used = jnp.split(x, 2)
        return jnp.sum(jnp.sin(used))

    out = _shard_map(jax.grad(f), _mesh(), _P("data"), _P("data"))(jnp.arange(16.0))
    return _short(out)


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    "jax#33947 variant: the same grad of an invariant input (in_specs=P()), "
    "check still on",
)
def seed000_split_unused_invariant_grad() -> str:
    import jax
    import jax.numpy as jnp

    def f(x):
        used, _unused = jnp.split(x, 2)
        return jnp.sum(jnp.sin(used))

    out = _shard_map(jax.grad(f), _mesh(), _P(), _P())(jnp.arange(4.0))
    return _short(out)


#: The folx release of the seed's report era (folx#40 was fixed in 0.2.28; 0.2.27 was
#: never published). The runner installs it apart from the environment's own folx and
#: names the directory in this variable; without it the probe is "unavailable".
FOLX_OLD = "0.2.26"
FOLX_OLD_ENV = "BEYONDGRAD_DRIFT_FOLX_OLD"


def _folx_seed(old_folx_env: str | None = None) -> str:
    """The folx#40 program with the installed folx, or with the old folx installed
    apart at the path in the environment variable ``old_folx_env``."""
    import os
    import sys

    import jax
    import jax.numpy as jnp
    from jax import lax

    if old_folx_env is not None:
        where = os.environ.get(old_folx_env, "")
        if not where or not os.path.isdir(where):
            raise ModuleNotFoundError(
                f"folx {FOLX_OLD} is not installed apart (set {old_folx_env})"
            )
        sys.path.insert(0, where)
    try:
        from importlib.metadata import version

        import folx

        folx_version = version("folx")
    except ImportError as e:  # recorded as "unavailable" by the child runner
        raise ModuleNotFoundError(f"folx is not installed: {e}") from None

    def log_psi(w, x):  # x: 3 coordinates -> a 3x3 matrix
        m = jnp.tanh(jnp.outer(x, w)) + jnp.eye(3)
        return jnp.linalg.slogdet(m)[1]

    def local_energy(w, x):
        res = folx.forward_laplacian(lambda y: log_psi(w, y))(x)
        return res.laplacian + jnp.sum(res.jacobian.dense_array**2)

    def per_device(w, xs):
        w = _cast_varying(w, ("data",), required=False)
        g = jax.grad(lambda w: jnp.mean(jax.vmap(lambda x: local_energy(w, x))(xs)))(w)
        return lax.pmean(g, "data")

    w = jnp.array([0.3, -0.2, 0.5])
    xs = jnp.linspace(-1.0, 1.0, 24).reshape(8, 3)
    out = _shard_map(per_device, _mesh(), (_P(), _P("data")), _P())(w, xs)
    return f"folx {folx_version}: {_short(out)}"


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    "folx#40: grad of a folx forward Laplacian of slogdet inside shard_map "
    "(the newest folx that installs with this JAX)",
    fast=False,
)
def seed000_folx_slogdet_grad() -> str:
    return _folx_seed()


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    f"folx#40 as reported: the same program with folx {FOLX_OLD}",
    fast=False,
)
def seed000_folx_old_slogdet_grad() -> str:
    return _folx_seed(FOLX_OLD_ENV)


@_probe(
    CH5,
    "5.8 Inside shard_map: the seed",
    "Hessian-vector product at a varying primal fed an invariant jnp.eye row",
)
def ch5_hand_built_basis() -> str:
    import jax
    import jax.numpy as jnp

    def kinetic(x):
        g, hvp = jax.linearize(jax.grad(lambda v: jnp.sum(jnp.sin(v) ** 2)), x)
        eye = jnp.eye(g.shape[0], dtype=g.dtype)
        return hvp(eye[0])

    return _short(
        _shard_map(kinetic, _mesh(), _P("data"), _P("data"))(jnp.arange(16.0))
    )
