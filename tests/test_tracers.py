"""Tests for beyondgrad.tracers and the Chapter 1 widget callback (beyondgrad.figures.ch1).

Expected outputs are pinned literally (the same on JAX 0.8.2 and 0.12 unless a test
says otherwise), so a change in what JAX hands a function fails here.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondgrad import compat, tracers
from beyondgrad.figures import ch1 as fig1


def _parse(name):
    """Name parsing, through the public entry point (``transform``)."""
    return tracers.transform(f_sin, name)


def f_sin(x):
    return jnp.sum(jnp.sin(x))


def leaky_relu(x):
    if x > 0:
        return x
    return 0.1 * x


X = np.array([0.3, 1.1, 2.0], np.float32)


# --- transform: each named transformation computes what it says ------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("eager", lambda x: np.sum(np.sin(x))),
        ("jit", lambda x: np.sum(np.sin(x))),
        ("vmap", lambda x: np.sum(np.sin(x))),
        ("grad", lambda x: np.cos(x)),
        ("vjp", lambda x: np.cos(x)),
        ("jvp", lambda x: np.sum(np.cos(x))),  # tangent of ones
        ("linearize", lambda x: np.sum(np.cos(x))),
        ("jit(grad)", lambda x: np.cos(x)),
        ("grad(jit)", lambda x: np.cos(x)),
        ("vmap(grad)", lambda x: np.cos(x)),
        ("grad(grad)", lambda x: -np.sin(x)),  # grad of sum(cos)
    ],
)
def test_transform_matches_closed_form(name, expected):
    got = np.asarray(tracers.transform(f_sin, name)(jnp.asarray(X)), np.float64)
    # float32 sin/cos against float64: measured error < 1.2e-7; 1e-6 is a margin of 8
    np.testing.assert_allclose(
        got, expected(X.astype(np.float64)), rtol=1e-6, atol=1e-6
    )


def test_transform_jvp_matches_finite_difference():
    x = X.astype(np.float64)
    eps = 1e-6
    fd = (np.sum(np.sin(x + eps)) - np.sum(np.sin(x - eps))) / (
        2 * eps
    )  # direction = ones
    got = float(tracers.transform(f_sin, "jvp")(jnp.asarray(X)))
    assert abs(got - fd) < 1e-6 * 10  # float32 result, |fd| ~ 0.9: measured 4e-8


# --- inspect_transformations and the table --------------------------------------------

TABLE = (
    "transform   tracer type         aval        concrete?  works                    inside\n"
    "----------  ------------------  ----------  ---------  -----------------------  "
    "-----------------------------------------------------\n"
    "eager       ArrayImpl           float32[3]  yes        bool,int,range,float,np  -\n"
    "jit         DynamicJaxprTracer  float32[3]  no         none                     -\n"
    "grad        LinearizeTracer     float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "vmap        BatchTracer         float32[3]  no         none                     ArrayImpl float32[2,3]\n"
    "jvp         JVPTracer           float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "linearize   LinearizeTracer     float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "vjp         LinearizeTracer     float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "jit(grad)   LinearizeTracer     float32[3]  no         none                     DynamicJaxprTracer float32[3]\n"
    "grad(jit)   DynamicJaxprTracer  float32[3]  no         none                     -\n"
    "vmap(grad)  LinearizeTracer     float32[3]  no         none                     "
    "BatchTracer float32[3] > ArrayImpl float32[2,3]\n"
    "grad(vmap)  BatchTracer         float32[3]  no         none                     "
    "LinearizeTracer float32[2,3] > ArrayImpl float32[2,3]\n"
    "jit(vmap)   BatchTracer         float32[3]  no         none                     "
    "DynamicJaxprTracer float32[2,3]\n"
    "jacfwd      JVPTracer           float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "jacrev      LinearizeTracer     float32[3]  yes        bool,int,range           ArrayImpl float32[3]\n"
    "hessian     LinearizeTracer     float32[3]  yes        bool,int,range           "
    "JVPTracer float32[3] > ArrayImpl float32[3]"
)


def test_jacobian_transformations_match_closed_forms():
    """jacfwd/jacrev of f_sin = sum(sin(x)) is cos(x); its Hessian is -diag(sin(x))."""
    x = jnp.asarray(X)
    want_jac = np.cos(X.astype(np.float64))
    want_hess = -np.diag(np.sin(X.astype(np.float64)))
    for name in ("jacfwd", "jacrev"):
        got = np.asarray(tracers.transform(f_sin, name)(x), np.float64)
        # float32 cos/sin of O(1) arguments: a few ulp, 2**-23 ~ 1.2e-7 each
        np.testing.assert_allclose(got, want_jac, rtol=0, atol=1e-6)
    got = np.asarray(tracers.transform(f_sin, "hessian")(x), np.float64)
    np.testing.assert_allclose(got, want_hess, rtol=0, atol=1e-6)


def test_python_if_works_unless_the_primal_is_batched():
    """Concreteness follows the primal: jacfwd/jacrev/hessian keep it, vmap(grad) not."""

    def branchy(x):
        return jnp.sum(jnp.sin(x)) if jnp.sum(x) > 0 else jnp.sum(x)

    x = jnp.asarray(X)
    for name in ("grad", "jacfwd", "jacrev", "hessian"):
        tracers.transform(branchy, name)(x)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        tracers.transform(branchy, "vmap(grad)")(x)


def test_the_chapter_table_is_pinned():
    """The whole table of Chapter 1, literally (the same on JAX 0.8.2 and 0.12)."""
    obs = tracers.inspect_transformations(f_sin, jnp.arange(3.0))
    assert tracers.format_table(obs) == TABLE


def test_concrete_values_are_the_primal():
    seen = {}

    def probe(x):
        seen.setdefault("v", compat.concrete_value(x))
        return jnp.sum(x)

    (o,) = tracers.inspect_transformations(
        probe, jnp.asarray(X), transformations=["jvp"]
    )
    assert o.concrete
    np.testing.assert_array_equal(np.asarray(seen["v"]), X)


def test_errors_are_recorded_with_their_class():
    obs = tracers.inspect_transformations(
        leaky_relu, 2.0, transformations=["eager", "grad", "jit", "vmap", "jit(grad)"]
    )
    assert [o.error for o in obs] == [
        None,
        None,
        "TracerBoolConversionError",
        "TracerBoolConversionError",
        "TracerBoolConversionError",
    ]
    assert [o.jax_error for o in obs] == [False, False, True, True, True]
    assert (
        obs[2].message
        == "Attempted boolean conversion of traced array with shape bool[]."
    )
    # a non-JAX error is recorded too, and not flagged as a jax.errors class
    (o,) = tracers.inspect_transformations(
        lambda x: 1 / 0, 1.0, transformations=["jit"]
    )
    assert (o.error, o.jax_error, o.called) == ("ZeroDivisionError", False, True)
    table = tracers.format_table(obs).splitlines()
    assert table[0].endswith("raised")  # the column appears when a call raised
    assert table[4].endswith("jax.errors.TracerBoolConversionError")
    assert table[2].endswith("-")


def test_pytree_arguments_and_argnum():
    def loss(params, data):
        return jnp.sum(params["w"] * data) + params["b"]

    params = {"b": jnp.float32(0.5), "w": jnp.ones(3)}
    obs = tracers.inspect_transformations(
        loss, params, jnp.arange(3.0), transformations=["grad", "jit"]
    )
    assert [(o.tracer_type, o.aval, o.concrete) for o in obs] == [
        ("LinearizeTracer", "float32[]", True),  # first leaf of the dict: "b"
        ("DynamicJaxprTracer", "float32[]", False),
    ]
    (o,) = tracers.inspect_transformations(
        loss, params, jnp.arange(3.0), transformations=["grad"], argnum=1
    )
    # grad is w.r.t. argument 0: argument 1 is a plain (closed-over) array
    assert (o.tracer_type, o.concrete) == ("ArrayImpl", True)


def test_nesting_names_allow_spaces():
    (o,) = tracers.inspect_transformations(
        f_sin, jnp.asarray(X), transformations=["jit( grad (vmap))"]
    )
    assert (o.tracer_type, o.error) == ("BatchTracer", None)


# --- the widget callback ---------------------------------------------------------------

RECEIVES_JIT_GRAD = (
    "under jit(grad): f receives a LinearizeTracer with aval float32[3]\n"
    "  which wraps: DynamicJaxprTracer float32[3]\n"
    "no concrete value is reachable: only shape and dtype are known\n"
    "conversions, with s = jnp.sum(x):\n"
    "  bool(s > 0)            raises TracerBoolConversionError\n"
    "  int(s)                 raises ConcretizationTypeError\n"
    "  range(s.astype(int32)) raises TracerIntegerConversionError\n"
    "  float(s)               raises ConcretizationTypeError\n"
    "  np.asarray(x)          raises TracerArrayConversionError"
)
RECEIVES_GRAD = (
    "under grad: f receives a LinearizeTracer with aval float32[3]\n"
    "  which wraps: ArrayImpl float32[3]\n"
    "a concrete value is reachable: [0.0, 1.0, 2.0]\n"
    "conversions, with s = jnp.sum(x):\n"
    "  bool(s > 0)            works\n"
    "  int(s)                 works\n"
    "  range(s.astype(int32)) works\n"
    "  float(s)               raises ConcretizationTypeError\n"
    "  np.asarray(x)          raises TracerArrayConversionError"
)
RECEIVES_VMAP = (
    "under vmap: f receives a BatchTracer with aval float32[3]\n"
    "  which wraps: ArrayImpl float32[2,3]\n"
    "no single concrete value: the array inside (float32[2,3])\n"
    "  is the whole batch, not the one float32[3] f computes with\n"
)


def test_receives_is_pinned():
    assert fig1.receives("jit(grad)") == RECEIVES_JIT_GRAD
    assert fig1.receives("grad") == RECEIVES_GRAD
    assert fig1.receives("vmap").startswith(RECEIVES_VMAP)
    assert "only shape and dtype" in fig1.receives("jit(vmap)")


# --- the jax.errors family ---------------------------------------------------------------

ERROR_TREE_COMMON = [
    "BaseException",
    "    Exception",
    "        LookupError",
    "            IndexError",
    "                jax.errors.JAXIndexError",
    "                    jax.errors.NonConcreteBooleanIndexError",
    "        RuntimeError",
    "            jax.errors.JaxRuntimeError",
    "        TypeError",
    "            jax.errors.JAXTypeError",
    "                jax.errors.ConcretizationTypeError",
    "                    jax.errors.TracerBoolConversionError",
    "                jax.errors.KeyReuseError",
    "                jax.errors.TracerArrayConversionError",
    "                jax.errors.TracerIntegerConversionError",
    "                jax.errors.UnexpectedTracerError",
]


#: classes that ``jax.errors`` exports on part of the range (0.12.0.1: both, 0.8.2:
#: neither), with the line each adds to the tree and where
ERROR_TREE_OPTIONAL = {
    "InconclusiveDimensionOperation": (
        2,
        "        jax.errors.InconclusiveDimensionOperation",
    ),
    "JaxprTypeError": (None, "            jax.errors.JaxprTypeError"),  # None: the end
}


def test_error_tree_is_pinned_on_both_ends():
    """The tree for the classes this JAX exports (a feature probe: ``hasattr``, not a
    version string): the common lines plus each optional class at its place."""
    expected = list(ERROR_TREE_COMMON)
    for name, (at, line) in ERROR_TREE_OPTIONAL.items():
        if hasattr(jax.errors, name):
            expected.insert(len(expected) if at is None else at, line)
    assert tracers.error_tree().splitlines() == expected


def test_error_classes_agree_with_issubclass():
    classes = tracers._jax_error_classes()
    assert classes["TracerBoolConversionError"][:3] == [
        "ConcretizationTypeError",
        "JAXTypeError",
        "TypeError",
    ]
    assert not issubclass(
        jax.errors.TracerIntegerConversionError, jax.errors.ConcretizationTypeError
    )
    assert "ConcretizationTypeError" not in classes["TracerIntegerConversionError"]


# --- counting traces ------------------------------------------------------------------------


def test_counter_counts_one_trace_per_static_value():
    counter = tracers.CompilationCounter(lambda x, k: x * k, static_argnums=1)
    x = jnp.ones(3)
    for k in [1, 2, 1, 3, 2]:
        counter(x, k)
    assert (counter.traces, counter.cache_size()) == (3, 3)


def test_each_counter_is_a_fresh_cache():
    """Two counters on the same function trace independently (a fresh wrapper each)."""

    def double(x):
        return 2 * x

    jax.jit(double)(jnp.ones(3))  # fill the cache of `double` itself
    counts = []
    for _ in range(2):
        counter = tracers.CompilationCounter(double)
        counter(jnp.ones(3))
        counts.append((counter.traces, counter.cache_size()))
    assert counts == [(1, 1), (1, 1)]


def test_count_traces_pinned():
    calls = [
        tracers.call(jnp.ones(3)),
        (jnp.zeros(3),),
        (jnp.ones(4),),
        (jnp.ones(3, jnp.int32),),
        (np.ones(4, np.float32),),
        (jnp.ones(4),),
    ]
    log = tracers.count_traces(lambda x: x + 1, calls)
    assert log.retraced == (True, False, True, True, False, False)
    # the NumPy call reuses the trace but adds a dispatch-cache entry
    assert log.cache_sizes == (1, 1, 2, 3, 4, 4)
    assert str(log).splitlines()[-1] == "3 trace(s) over 6 call(s)"
    assert str(log).splitlines()[5] == "4     no           4  (np.ndarray float32[4])"


def test_fori_loop_with_traced_bound_traces_once():
    def loop(x, n):
        return lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x)

    log = tracers.count_traces(loop, [(jnp.ones(3), n) for n in (0, 1, 3, 6)])
    assert log.retraced == (True, False, False, False)


# --- bad input: a clear TypeError/ValueError for every public helper -----------------------

_OBS = None


def _obs():
    global _OBS
    if _OBS is None:
        _OBS = tracers.inspect_transformations(f_sin, 1.0, transformations=["jit"])
    return _OBS


BAD_INPUTS = [
    (
        "name: not a str",
        lambda: _parse(3),
        TypeError,
        "must be a str",
    ),
    (
        "name: unknown",
        lambda: _parse("pmap"),
        ValueError,
        "valid names",
    ),
    (
        "name: case",
        lambda: _parse("Grad"),
        ValueError,
        "valid names",
    ),
    (
        "name: open paren",
        lambda: _parse("jit(grad"),
        ValueError,
        "outer",
    ),
    (
        "name: empty inner",
        lambda: _parse("jit()"),
        ValueError,
        "outer",
    ),
    (
        "name: empty",
        lambda: _parse(""),
        ValueError,
        "valid names",
    ),
    (
        "name: eager nested",
        lambda: _parse("jit(eager)"),
        ValueError,
        "cannot be nested",
    ),
    (
        "transform: value",
        lambda: tracers.transform(jnp.ones(3), "jit"),
        TypeError,
        "pass the function itself",
    ),
    (
        "transform: name",
        lambda: tracers.transform(f_sin, "pjit"),
        ValueError,
        "valid names",
    ),
    (
        "inspect: value",
        lambda: tracers.inspect_transformations(None, 1.0),
        TypeError,
        "must be callable",
    ),
    (
        "inspect: empty list",
        lambda: tracers.inspect_transformations(f_sin, 1.0, transformations=[]),
        TypeError,
        "non-empty sequence",
    ),
    (
        "inspect: function as name",
        lambda: tracers.inspect_transformations(f_sin, 1.0, transformations=[jax.jit]),
        TypeError,
        "must be a str",
    ),
    (
        "inspect: argnum out of range",
        lambda: tracers.inspect_transformations(f_sin, 1.0, argnum=1),
        ValueError,
        "argnum",
    ),
    (
        "inspect: argnum bool",
        lambda: tracers.inspect_transformations(f_sin, 1.0, argnum=True),
        TypeError,
        "argnum",
    ),
    (
        "inspect: no arguments",
        lambda: tracers.inspect_transformations(f_sin),
        ValueError,
        "argnum",
    ),
    ("table: empty", lambda: tracers.format_table([]), ValueError, "non-empty"),
    (
        "table: not observations",
        lambda: tracers.format_table([1, 2]),
        TypeError,
        "inspect_transformations",
    ),
    (
        "layers: pytree",
        lambda: tracers.tracer_layers({"a": 1.0}),
        TypeError,
        "one leaf",
    ),
    ("layers: str", lambda: tracers.tracer_layers("x"), TypeError, "one leaf"),
    (
        "counter: value",
        lambda: tracers.CompilationCounter(3),
        TypeError,
        "pass the function itself",
    ),
    (
        "counter: option",
        lambda: tracers.CompilationCounter(f_sin, backend="cpu"),
        TypeError,
        "allowed",
    ),
    (
        "count: empty",
        lambda: tracers.count_traces(f_sin, []),
        TypeError,
        "non-empty list",
    ),
    (
        "count: str",
        lambda: tracers.count_traces(f_sin, "abc"),
        TypeError,
        "non-empty list",
    ),
    (
        "count: bare array",
        lambda: tracers.count_traces(f_sin, [jnp.ones(3)]),
        TypeError,
        r"calls\[0\]",
    ),
    (
        "count: value",
        lambda: tracers.count_traces(3, [(1.0,)]),
        TypeError,
        "pass the function itself",
    ),
    ("receives: not a str", lambda: fig1.receives(3), TypeError, "name such as"),
    ("receives: unknown", lambda: fig1.receives("pjit"), ValueError, "valid names"),
    ("receives: list", lambda: fig1.receives("jit", [1.0, 2.0]), TypeError, "array"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_a_clear_error(case):
    _, thunk, cls, match = case
    with pytest.raises(cls, match=match):
        thunk()


def test_bad_input_table_size():
    assert len(BAD_INPUTS) == 28


# --- the compat functions Chapter 1 builds on -------------------------------------------------


def test_compat_concrete_value_per_tracer_kind():
    x = jnp.arange(3.0)
    seen = {}

    def probe(tag):
        def f(v):
            seen[tag] = compat.concrete_value(v)
            return jnp.sum(v)

        return f

    assert compat.concrete_value(x) is x
    jax.jit(probe("jit"))(x)
    jax.grad(probe("grad"))(x)
    jax.grad(lambda v: jnp.sum(jax.grad(probe("grad(grad)"))(v)))(x)
    jax.jit(jax.grad(probe("jit(grad)")))(x)
    jax.vmap(probe("vmap"))(jnp.stack([x, x]))
    assert seen["jit"] is None and seen["jit(grad)"] is None and seen["vmap"] is None
    np.testing.assert_array_equal(np.asarray(seen["grad"]), [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(np.asarray(seen["grad(grad)"]), [0.0, 1.0, 2.0])


def test_compat_is_tracer():
    seen = []
    jax.jit(lambda v: seen.append(compat.is_tracer(v)) or v)(1.0)
    assert seen == [True]
    assert not compat.is_tracer(jnp.ones(2)) and not compat.is_tracer(np.ones(2))


def test_compat_jit_cache_size_and_its_bad_input():
    jitted = jax.jit(lambda v: v * 3)
    sizes = [compat.jit_cache_size(jitted)]
    for v in (jnp.ones(2), jnp.ones(2), jnp.ones(3)):
        jitted(v)
        sizes.append(compat.jit_cache_size(jitted))
    assert sizes == [0, 1, 1, 2]

    class NotJitted:  # a fake without the private method: the fallback branch
        def __call__(self, v):
            return v

    for bad in (NotJitted(), lambda v: v):
        with pytest.raises(TypeError, match="expected a function made by jax.jit"):
            compat.jit_cache_size(bad)


# --- narrow tables ---------------------------------------------------------------------


def test_format_table_columns_in_the_order_given_after_transformation():
    obs = tracers.inspect_transformations(
        f_sin, jnp.arange(3.0), transformations=["eager", "vmap"]
    )
    table = tracers.format_table(obs, ["works", "concrete?"]).splitlines()
    assert table[0].split() == ["transform", "works", "concrete?"]
    assert table[2].split() == ["eager", "bool,int,range,float,np", "yes"]
    assert table[3].split() == ["vmap", "none", "no"]
    assert (
        max(len(line) for line in tracers.format_table(obs, ["aval"]).splitlines()) < 30
    )


def test_format_table_bad_columns():
    obs = tracers.inspect_transformations(
        f_sin, jnp.arange(3.0), transformations=["eager"]
    )
    with pytest.raises(ValueError, match="no column 'shape'; choose from"):
        tracers.format_table(obs, ["shape"])
    with pytest.raises(TypeError, match="list of column names"):
        tracers.format_table(obs, "aval")


# --- what answers concreteness ---------------------------------------------------------


def test_concreteness_answerers_are_the_three_overriding_classes():
    from jax._src import core

    answerers = compat.concreteness_answerers()
    assert [c.__name__ for c in answerers] == [
        "JVPTracer",
        "LinearizeTracer",
        "ShardMapTracer",
    ]
    for cls in answerers:
        assert issubclass(cls, core.Tracer)
        assert cls.to_concrete_value is not core.Tracer.to_concrete_value


def test_shard_map_tracer_is_concrete_only_when_invariant():
    mesh = compat.make_mesh((len(jax.devices()),), ("d",))
    seen = {}

    def body(shared, shard):
        seen["type"] = type(shared).__name__
        seen["shared"] = compat.concrete_value(shared)
        seen["shard"] = compat.concrete_value(shard)
        return shard

    P = jax.sharding.PartitionSpec
    n = len(jax.devices())
    jax.shard_map(body, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d"))(
        jnp.arange(3.0), jnp.arange(float(n))
    )
    assert seen["type"] == "ShardMapTracer"
    np.testing.assert_array_equal(np.asarray(seen["shared"]), [0.0, 1.0, 2.0])
    assert seen["shard"] is None


# --- what JAX logs ---------------------------------------------------------------------


def test_jax_log_explains_a_shape_change_and_restores_the_option():
    fn = jax.jit(lambda v: v + 1.0)
    a, b = jnp.ones(3), jnp.ones(4)
    before = jax.config.jax_explain_cache_misses
    with tracers.jax_log("jax_explain_cache_misses") as messages:
        assert jax.config.jax_explain_cache_misses is True
        fn(a)
        fn(a)  # a cache hit: no message
        fn(b)
    assert jax.config.jax_explain_cache_misses == before
    assert len(messages) == 2
    assert all(m.startswith("TRACING CACHE MISS") for m in messages)
    assert "f32[4]" in messages[1] and "f32[3]" in messages[1]
    fn(jnp.ones(5))  # outside the block: nothing more collected
    assert len(messages) == 2


def test_jax_log_counts_compilations_of_a_bound_method_per_call():
    class Model:
        def f(self, v):
            return v * 2.0

    model, x = Model(), jnp.ones(2)
    with tracers.jax_log("jax_log_compiles") as messages:
        for _ in range(3):
            jax.jit(model.f)(x)
    assert sum(m.startswith("Compiling") for m in messages) == 3


def test_jax_log_rejects_unknown_options():
    with pytest.raises(ValueError, match="option must be one of"):
        with tracers.jax_log("jax_enable_x64"):
            pass


def test_format_log_cuts_paths_ids_and_wraps():
    message = (
        "TRACING CACHE MISS at /tmp/ipykernel_1/123.py:4:2 (<module>):\n"
        "  never seen function:\n"
        "    f id=140123 defined at /a/b/c.py:5\n"
        "  " + "word " * 30
    )
    text = tracers.format_log([message, "second"], width=60)
    assert "TRACING CACHE MISS at 123.py:4:2 (<module>):" in text
    assert "    f defined at c.py:5" in text and "id=" not in text
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "\n    word" in text  # wrapped lines keep their indentation, plus two
    assert text.endswith("\n\nsecond")
    with pytest.raises(TypeError, match="list of strings"):
        tracers.format_log("one message")
    with pytest.raises(ValueError, match="width"):
        tracers.format_log([message], width=5)


# --- where it raised -------------------------------------------------------------------


def test_innermost_frames_run_from_the_callers_line_to_the_raise():
    before = jax.config.jax_traceback_filtering

    def user_code(v):
        return int(v)  # the caller's innermost line

    found = tracers.innermost_frames(jax.jit(user_code), 1.0)
    assert isinstance(found.error, jax.errors.ConcretizationTypeError)
    assert found.frames[0].name == "user_code"
    assert found.frames[-1].filename.endswith("core.py")
    assert jax.config.jax_traceback_filtering == before
    text = str(found)
    assert text.startswith("ConcretizationTypeError: ")
    assert all(len(line) <= 78 for line in text.splitlines())
    assert "in user_code" in text


def test_innermost_frames_needs_a_call_that_raises():
    with pytest.raises(ValueError, match="returned without raising"):
        tracers.innermost_frames(lambda: 1)
    with pytest.raises(TypeError, match="fn must be callable"):
        tracers.innermost_frames(3)
