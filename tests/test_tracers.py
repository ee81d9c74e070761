"""Tests for beyondgrad.tracers: inspector, trace counter, exercise checkers, widget callback."""

import builtins

import matplotlib

matplotlib.use("Agg")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

from beyondgrad import exercises, tracers  # noqa: E402


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
    np.testing.assert_allclose(got, expected(X.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_transform_jvp_matches_finite_difference():
    x = X.astype(np.float64)
    eps = 1e-6
    fd = (np.sum(np.sin(x + eps)) - np.sum(np.sin(x - eps))) / (2 * eps)  # direction = ones
    got = float(tracers.transform(f_sin, "jvp")(jnp.asarray(X)))
    assert abs(got - fd) < 1e-4


# --- inspect_transformations --------------------------------------------------------------


def test_concreteness_per_transformation():
    obs = {o.transformation: o for o in tracers.inspect_transformations(f_sin, jnp.asarray(X))}
    assert set(obs) == set(tracers.DEFAULT_TRANSFORMATIONS)
    concrete = {name for name, o in obs.items() if o.concrete}
    assert concrete == {"eager", "grad", "jvp", "linearize", "vjp"}
    assert all(o.called and o.error is None for o in obs.values())
    # every tracer is a jax Tracer except in eager mode; avals are the per-example shape
    assert obs["eager"].tracer_type == "ArrayImpl"
    assert all(o.aval == "float32[3]" for o in obs.values())
    # vmap: the tracer's value is the whole batch of 2
    assert obs["vmap"].layers[-1].aval == "float32[2,3]"
    # the chain of jit(grad) ends in an abstract jit tracer; grad(jit) is a jit tracer alone
    assert len(obs["jit(grad)"].layers) == 2 and len(obs["grad(jit)"].layers) == 1
    assert obs["jit"].tracer_type == obs["grad(jit)"].tracer_type == obs["jit(grad)"].layers[-1].type_name


def test_conversions_follow_concreteness():
    for o in tracers.inspect_transformations(f_sin, jnp.asarray(X)):
        bool_ok = o.conversions["bool(x > 0)"] is None
        assert bool_ok == o.concrete, o
        assert (o.conversions["range(x)"] is None) == o.concrete
        if o.transformation != "eager":  # float and numpy never concretize a tracer
            assert o.conversions["float(x)"] == "ConcretizationTypeError"
            assert o.conversions["np.asarray(x)"] == "TracerArrayConversionError"
        if not o.concrete:
            assert o.conversions["bool(x > 0)"] == "TracerBoolConversionError"
            assert o.conversions["range(x)"] == "TracerIntegerConversionError"


def test_errors_are_recorded_with_their_class():
    obs = {o.transformation: o for o in tracers.inspect_transformations(
        leaky_relu, 2.0, transformations=["eager", "grad", "jit", "vmap", "jit(grad)"])}
    assert obs["eager"].error is None and obs["grad"].error is None
    for name in ("jit", "vmap", "jit(grad)"):
        assert obs[name].error == "TracerBoolConversionError"
        assert obs[name].jax_error
        assert obs[name].called  # the function ran, then failed
        assert "boolean" in obs[name].message
    # a non-JAX error is recorded too, and not flagged as a jax.errors class
    (o,) = tracers.inspect_transformations(lambda x: 1 / 0, 1.0, transformations=["jit"])
    assert o.error == "ZeroDivisionError" and not o.jax_error


def test_pytree_arguments_and_argnum():
    def loss(params, data):
        return jnp.sum(params["w"] * data) + params["b"]

    params = {"b": jnp.float32(0.5), "w": jnp.ones(3)}
    obs = tracers.inspect_transformations(loss, params, jnp.arange(3.0), transformations=["grad", "jit"])
    assert obs[0].concrete and not obs[1].concrete
    assert obs[0].aval == "float32[]"  # first leaf of the dict: "b"
    obs = tracers.inspect_transformations(loss, params, jnp.arange(3.0), transformations=["grad"], argnum=1)
    # grad is w.r.t. argument 0: argument 1 is a plain (closed-over) array
    assert obs[0].tracer_type == "ArrayImpl" and obs[0].concrete


def test_format_table_has_one_row_per_transformation():
    obs = tracers.inspect_transformations(f_sin, jnp.asarray(X), transformations=["jit", "grad"])
    lines = tracers.format_table(obs).splitlines()
    assert len(lines) == 2 + 2
    assert lines[2].startswith("jit") and "no" in lines[2]
    with pytest.raises(ValueError):
        tracers.format_table([])


def test_concrete_value():
    x = jnp.arange(3.0)
    assert tracers.concrete_value(x) is x
    seen = []
    jax.jit(lambda v: seen.append(tracers.concrete_value(v)) or v)(x)
    jax.grad(lambda v: seen.append(tracers.concrete_value(v)) or jnp.sum(v))(x)
    assert seen[0] is None
    np.testing.assert_array_equal(np.asarray(seen[1]), np.asarray(x))


@pytest.mark.parametrize("bad", [None, 3, "f"])
def test_non_callable_is_a_type_error(bad):
    with pytest.raises(TypeError, match="callable"):
        tracers.inspect_transformations(bad, 1.0)
    with pytest.raises(TypeError, match="callable"):
        tracers.transform(bad, "jit")


@pytest.mark.parametrize("name", ["pmap", "jit(pmap)", "Grad", "jit(grad", "jit()", "jit(eager)", ""])
def test_bad_transformation_name_lists_valid_ones(name):
    with pytest.raises(ValueError) as info:
        tracers.inspect_transformations(f_sin, 1.0, transformations=[name])
    if name != "jit(eager)":
        for valid in ("jit", "grad", "vmap", "jvp", "linearize"):
            assert valid in str(info.value)


def test_other_bad_arguments():
    with pytest.raises(TypeError):
        tracers.inspect_transformations(f_sin, 1.0, transformations=[jax.jit])
    with pytest.raises(TypeError):
        tracers.inspect_transformations(f_sin, 1.0, transformations=[])
    with pytest.raises(ValueError, match="argnum"):
        tracers.inspect_transformations(f_sin, 1.0, argnum=1)
    with pytest.raises(ValueError, match="argnum"):
        tracers.inspect_transformations(f_sin)
    assert tracers.parse_transformation("jit( grad (vmap))") == ("jit", "grad", "vmap")


# --- the jax.errors family ----------------------------------------------------------------


def test_error_tree_matches_issubclass():
    classes = tracers.jax_error_classes()
    assert {"ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
            "TracerArrayConversionError", "UnexpectedTracerError", "NonConcreteBooleanIndexError"} <= set(classes)
    for name, bases in classes.items():
        cls = getattr(jax.errors, name)
        for base in bases:
            parent = getattr(jax.errors, base, None) or getattr(builtins, base)
            assert issubclass(cls, parent)
    lines = tracers.error_tree().splitlines()
    indent = {line.strip(): len(line) - len(line.lstrip()) for line in lines}
    assert indent["jax.errors.TracerBoolConversionError"] == indent["jax.errors.ConcretizationTypeError"] + 4
    assert indent["jax.errors.NonConcreteBooleanIndexError"] > indent["IndexError"]
    assert len(lines) == len(set(lines))  # each class appears once


# --- counting traces ------------------------------------------------------------------------


def test_counter_counts_one_trace_per_static_value():
    counter = tracers.CompilationCounter(lambda x, k: x * k, static_argnums=1)
    x = jnp.ones(3)
    for k in [1, 2, 1, 3, 2]:
        counter(x, k)
    assert counter.traces == 3
    assert counter.cache_size() == 3


def test_count_traces_agrees_with_jit_cache():
    calls = [tracers.call(jnp.ones(3)), (jnp.zeros(3),), (jnp.ones(4),), (jnp.ones(3, jnp.int32),), (jnp.ones(4),)]
    log = tracers.count_traces(lambda x: x + 1, calls)
    assert log.retraced == (True, False, True, True, False)
    assert log.traces == 3
    sizes = (0, *log.cache_sizes)
    # second method: for jax.Array arguments, a new cache entry appears exactly at each trace
    assert tuple(b > a for a, b in zip(sizes, sizes[1:])) == log.retraced
    assert "3 trace(s) over 5 call(s)" in str(log)


def test_count_traces_bad_input():
    with pytest.raises(TypeError):
        tracers.count_traces(lambda x: x, [])
    with pytest.raises(TypeError, match="calls\\[0\\]"):
        tracers.count_traces(lambda x: x, [jnp.ones(3)])
    with pytest.raises(TypeError, match="callable"):
        tracers.CompilationCounter(3)
    with pytest.raises(TypeError, match="unsupported jit option"):
        tracers.CompilationCounter(lambda x: x, backend="cpu")


# --- exercise checkers -------------------------------------------------------------------------


def _stub(*args):
    raise NotImplementedError


def test_check_fix_jit_accepts_both_fixes():
    static = tracers.check_fix_jit(jax.jit(tracers.repeat_sin, static_argnums=1), strict=True)
    loop = tracers.check_fix_jit(lambda x, n: lax.fori_loop(0, n, lambda i, v: jnp.sin(v), x), strict=True)
    assert static and loop
    assert "4 new compilation(s)" in str(static) and "1 new compilation(s)" in str(loop)


@pytest.mark.parametrize("answer, reason", [
    (_stub, "stub"),
    (tracers.repeat_sin, "TracerIntegerConversionError"),
    (jax.jit(tracers.repeat_sin), "TracerIntegerConversionError"),
    (lambda x, n: jnp.sin(x), "differs"),
    ("not a function", "must be a function"),
])
def test_check_fix_jit_rejects(answer, reason):
    fb = tracers.check_fix_jit(answer)
    assert not fb and reason in str(fb)
    with pytest.raises(exercises.ExerciseFailed):
        tracers.check_fix_jit(answer, strict=True)


RIGHT = [True, False, True, True, True, False, True, True, False]


def test_check_predict_retraces():
    assert tracers.check_predict_retraces(RIGHT, strict=True)
    assert tracers.check_predict_retraces(lambda: RIGHT, strict=True)  # a function returning the list
    wrong = list(RIGHT)
    wrong[5] = True  # the NumPy call
    fb = tracers.check_predict_retraces(wrong)
    assert not fb and "call 5" in str(fb) and "np.ndarray" in str(fb)
    with pytest.raises(exercises.ExerciseFailed):
        tracers.check_predict_retraces(wrong, strict=True)
    for bad in (RIGHT[:-1], [1] * 9, "yes", _stub):
        assert not tracers.check_predict_retraces(bad)


def test_check_finite_grad():
    def safe(x):
        pos = x > 0
        return jnp.where(pos, jnp.exp(-1.0 / jnp.where(pos, x, 1.0)), 0.0)

    assert tracers.check_finite_grad(safe, strict=True)
    fb = tracers.check_finite_grad(tracers.bump)
    assert not fb and "non-finite" in str(fb)
    assert not tracers.check_finite_grad(lambda x: jnp.where(x > 0, x, 0.0))  # finite but wrong
    assert not tracers.check_finite_grad(_stub)
    with pytest.raises(exercises.ExerciseFailed):
        tracers.check_finite_grad(tracers.bump, strict=True)


def test_bump_reference_against_finite_differences():
    x = np.array([-1.0, 0.2, 0.5, 1.0, 3.0])
    h = 1e-6
    value, slope = tracers._bump_reference(x)
    fd = (tracers._bump_reference(x + h)[0] - tracers._bump_reference(x - h)[0]) / (2 * h)
    np.testing.assert_allclose(slope, fd, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(value, np.where(x > 0, np.exp(-1 / np.where(x > 0, x, 1)), 0))


# --- widget callback and figures ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["eager", "jit", "grad", "vmap", "jit(grad)", "vmap(grad)"])
def test_receives_reports_the_inspector_view(name):
    (obs,) = tracers.inspect_transformations(tracers.demo_function, jnp.arange(3.0), transformations=[name])
    text = tracers.receives(name)
    assert text.startswith(f"under {name}: f receives a {obs.tracer_type}")
    assert ("a concrete value is reachable" in text) == obs.concrete
    assert ("raises TracerBoolConversionError" in text) == (not obs.concrete)


def test_receives_bad_name():
    with pytest.raises(ValueError, match="valid names"):
        tracers.receives("pjit")


def test_figures():
    obs = tracers.inspect_transformations(f_sin, jnp.asarray(X), transformations=["eager", "jit", "grad", "vmap", "jit(grad)"])
    fig = tracers.plot_concreteness(obs)
    (ax,) = fig.axes
    assert len(ax.texts) == len(obs) * (1 + len(tracers.CONVERSIONS))
    fig2 = tracers.plot_layers(obs, ncols=3)
    titled = [a for a in fig2.axes if a.get_title()]
    assert [a.get_title() for a in titled] == [o.transformation for o in obs]
    assert len(titled[4].patches) == 2  # jit(grad): two nested boxes
    with pytest.raises(ValueError):
        tracers.plot_concreteness([])
    with pytest.raises(ValueError):
        tracers.plot_layers(obs, ncols=0)
    import matplotlib.pyplot as plt

    plt.close("all")
