"""Tests for the forward-Laplacian interpreter's rule registry (issue 26 item 2).

References are float64: ``jnp.trace`` of ``jax.hessian`` (``jacfwd`` over ``jacfwd``
where reverse mode does not apply: ``while`` loops) for the Laplacian, ``jax.jacfwd``
for the Jacobian.
"""

import functools
import importlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

from beyondgrad import compat, slater, wavefunctions
from beyondgrad import forward_laplacian as fl
from beyondgrad.forward_laplacian import generic_rule as fl_generic_rule
from beyondgrad.forward_laplacian import interpreter as fl_interpreter
from beyondgrad.forward_laplacian import registry as fl_registry
from tools import book, rule_coverage

R = (0.3, -0.7, 0.45)
R2 = (-0.35, 0.8, 0.2)  # the other side of every branch on r[0]


def _reference(f, r, reverse=True):
    hess = jax.hessian(f) if reverse else jax.jacfwd(jax.jacfwd(f))
    return f(r), jax.jacfwd(f)(r), jnp.trace(hess(r), axis1=-2, axis2=-1)


def _check(f, r, reverse=True, rtol=1e-12, atol=1e-13):
    """forward_laplacian (under jit) against the float64 references."""
    value, jac, lap = jax.jit(lambda v: fl.forward_laplacian(f, v))(r)
    want_value, want_jac, want_lap = _reference(f, r, reverse)
    np.testing.assert_allclose(np.asarray(value), np.asarray(want_value), rtol, atol)
    np.testing.assert_allclose(np.asarray(jac), np.asarray(want_jac), rtol, atol)
    np.testing.assert_allclose(np.asarray(lap), np.asarray(want_lap), rtol, atol)
    return lap


@pytest.fixture
def no_generic(monkeypatch):
    """Fail if the generic rule (forward over forward on one primitive) is used."""

    def refuse(apply, ins):
        raise AssertionError("the generic rule was used")

    monkeypatch.setattr(fl_generic_rule, "generic_rule", refuse)


# --- (a) the table's keys --------------------------------------------------------------------


def test_every_table_key_is_a_primitive_of_the_running_jax():
    assert fl.RULES and fl.FALLBACK
    for table in (fl.RULES, fl.FALLBACK):
        for key in table:
            assert isinstance(key, Primitive), key
    assert all(isinstance(rule, fl.Rule) for rule in fl.RULES.values())
    assert not set(fl.RULES) & fl.FALLBACK  # one decision per primitive
    names = [p.name for p in fl.RULES] + [p.name for p in fl.FALLBACK]
    assert len(names) == len(set(names)), "two primitive objects share a name"


@pytest.mark.parametrize(
    "emit, kind",
    [
        (lambda r: jax.jit(jnp.sin)(r), "call"),
        (lambda r: jax.checkpoint(jnp.sin)(r), "call"),
        (lambda r: lax.scan(lambda c, x: (c * x, c), r[0], r)[1], "control"),
        (lambda r: lax.while_loop(lambda c: c[0] < 1, lambda c: c * 2, r), "control"),
        (lambda r: lax.cond(r[0] > 0, jnp.sin, jnp.cos, r), "control"),
        (lambda r: lax.select_n(r[0] > 0, r, 2 * r), "linear"),
        (lambda r: jax.nn.relu(r), "custom"),  # custom_jvp_call: its own dispatcher
        (lambda r: _straight_through(r), "custom_vjp"),
    ],
)
def test_what_jax_emits_has_a_rule_or_a_deliberate_fallback(emit, kind):
    """jit/pjit, checkpoint/remat2, scan, while, cond, select_n and custom_jvp_call,
    whatever this JAX names them: the first equation that depends on r."""
    eqn = jax.make_jaxpr(emit)(jnp.ones(3)).jaxpr.eqns[-1]
    prim = eqn.primitive
    assert fl.RULES[prim].kind == kind, prim.name


def test_primitives_named_differently_across_versions_are_found_through_compat():
    assert compat.primitive("custom_vjp_call") in fl.RULES
    assert compat.primitive("no such primitive") is None
    assert compat.primitive("mul") is lax.mul_p
    with pytest.raises(TypeError, match="name must be a str"):
        compat.primitive(lax.mul_p)
    # the scan of the running JAX records its operand counts one way or the other
    eqn = jax.make_jaxpr(lambda r: lax.scan(lambda c, x: (c * x, c), r[0], r))(
        jnp.ones(3)
    ).jaxpr.eqns[-1]
    assert compat.scan_counts(eqn.params) == (0, 1)


# --- (b) the functions the book and the tests differentiate ---------------------------------


def _primitives(jaxpr, found):
    """Every primitive in ``jaxpr`` and its sub-jaxprs with a floating-point result
    (integer and boolean results need no rule: they carry no derivative)."""
    return rule_coverage.primitives(jaxpr, found)


def _module(name):
    return importlib.import_module(name)


def _differentiated_functions():
    """(name, fn, r): the functions forward_laplacian / slater_laplacian are given."""
    fast = _module("tests.test_slater_fast")
    lap = _module("tests.test_laplacian")
    bench = _module("benchmarks.laplacian")
    params = wavefunctions.init_params(jax.random.key(0), 4, hidden=8)
    cases = [
        ("mlp_orbitals", functools.partial(wavefunctions.mlp_orbitals, params), 3),
        (
            "mlp_log_psi",
            lambda v: wavefunctions.mlp_log_psi(params, v.reshape(4, 3)),
            12,
        ),
        (
            "slater_log_psi(gto)",
            lambda v: slater.slater_log_psi(fast._gto, v.reshape(4, 3)),
            12,
        ),
        ("all-electron log_psi", fast._all_electron_log_psi, 12),
        ("ferminet_like", fast._ferminet_like, 3),
    ]
    cases += [(name, f, 3) for name, f in fast.ORBITAL_FUNCTIONS.items()]
    cases += [(f.__name__, f, 6) for f in lap.FUNCTIONS]
    cases += [("slater_fn", lap.slater_fn, 9)]
    for family, (make, orbitals) in bench.FAMILIES.items():
        p = make(jax.random.key(1), 8)
        cases.append((f"benchmark {family}", functools.partial(orbitals, p), 3))
    return cases


def test_every_primitive_of_the_differentiated_functions_has_a_rule_or_a_fallback():
    missing = {}
    with jax.enable_x64(True):
        for name, f, d in _differentiated_functions():
            for prim in _primitives(jax.make_jaxpr(f)(jnp.linspace(-1, 1, d)), set()):
                if prim not in fl.RULES and prim not in fl.FALLBACK:
                    missing.setdefault(prim.name, []).append(name)
    assert not missing, f"primitives with no rule and no deliberate fallback: {missing}"


# --- (c) the generic fallback warns once per primitive ---------------------------------------


def test_the_generic_rule_warns_once_per_primitive_and_is_right():
    prim = lax.nextafter_p  # stands in for a primitive nobody wrote a rule for
    with fl.rules_overridden({}):
        fl_registry.WARNED.discard(lax.cos_p)
        del fl.RULES[lax.cos_p]  # restored on exit
        f = lambda r: jnp.cos(r) * r[0]  # noqa: E731
        with jax.enable_x64(True), warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            r = jnp.array(R)
            _check(f, r)
            _check(lambda v: jnp.cos(v**2), r)  # the same primitive: no second warning
        mine = [w for w in got if issubclass(w.category, fl.GenericRuleWarning)]
        share = [w for w in mine if "of this program's derivative work" in str(w)]
        assert len(share) <= 1  # the cost warning, once for the set {cos}
        mine = [w for w in mine if w not in share]
        assert len(mine) == 1
        message = str(mine[0].message)
        assert "'cos'" in message and "2*d = 6 extra JVPs" in message
    assert fl.RULES[lax.cos_p].kind == "elementwise"
    assert prim in fl.FALLBACK  # a deliberate fallback does not warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fl.rule_for(prim)


def test_register_rule_checks_its_arguments_and_the_context_manager_restores():
    with pytest.raises(TypeError, match=r"jax.extend.core.Primitive .* got str 'mul'"):
        fl.register_rule("mul", fl.bilinear())
    with pytest.raises(TypeError, match="must be a Rule"):
        fl.register_rule(lax.mul_p, lambda eqn, ins: ins)
    with pytest.raises(TypeError, match="Primitive"):
        with fl.rules_overridden({"mul": fl.bilinear()}):
            pass
    before = dict(fl.RULES)
    with pytest.raises(RuntimeError), fl.rules_overridden({lax.mul_p: fl.generic()}):
        assert fl.RULES[lax.mul_p].kind == "generic"
        raise RuntimeError
    assert fl.RULES == before
    try:
        old = fl.register_rule(lax.mul_p, fl.generic("test"))
        assert old is before[lax.mul_p] and fl.rule_for(lax.mul_p).detail == "test"
    finally:
        fl.register_rule(lax.mul_p, old)
    assert fl.RULES == before


# --- exercise 5.1's rule plugged in -----------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _solution_fl_multiply():
    """The book's solution to exercise 5.1, read from chapter 5."""
    text = (book.CHAPTERS / "05_laplacians.md").read_text()
    found = re.search(
        r"^def solution_fl_multiply\(a, b\):\n(?:    .*\n|\n)+", text, re.M
    )
    assert found, "chapter 5 no longer defines solution_fl_multiply"
    ns = {"jnp": jnp}
    exec(found.group(0), ns)
    return ns["solution_fl_multiply"]


def _wrong_multiply(a, b):
    (u, gu, lu), (v, gv, lv) = a, b
    return u * v, gu * v + u * gv, lu * v + u * lv  # the cross term forgotten


def test_exercise_5_1_rule_registered_for_mul_gives_the_same_results():
    with jax.enable_x64(True):
        params = wavefunctions.init_params(jax.random.key(2), 4, hidden=8)
        params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
        orbitals = functools.partial(wavefunctions.mlp_orbitals, params)
        pos = 0.8 * jax.random.normal(jax.random.key(3), (4, 3), jnp.float64)
        gto = _module("tests.test_slater_fast")._gto

        def results():  # fresh functions: traced under the rules in force now
            return [
                jax.jit(lambda p: slater.slater_laplacian(orbitals, p))(pos),
                jax.jit(lambda r: fl.forward_laplacian(gto, r))(pos[0]),
            ]

        base = results()
        with fl.rules_overridden({lax.mul_p: fl.from_triples(_solution_fl_multiply())}):
            assert fl.RULES[lax.mul_p].kind == "triples"
            mine = results()
        with fl.rules_overridden({lax.mul_p: fl.from_triples(_wrong_multiply)}):
            wrong = results()
        assert fl.RULES[lax.mul_p].kind == "bilinear"
        for a, b in zip(jax.tree.leaves(base), jax.tree.leaves(mine)):
            np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-13)
        # the wrong rule changes the Laplacians (so the registered rule is used)
        assert abs(float(wrong[0][2]) - float(base[0][2])) > 1e-3
        assert np.max(np.abs(np.asarray(wrong[1][2] - base[1][2]))) > 1e-3


def test_from_triples_reports_a_wrong_shape():
    bad = lambda a, b: (a[0] * b[0], a[1], a[0])  # noqa: E731
    bad_jac = lambda a, b: (a[0] * b[0], a[1][0], a[2])  # noqa: E731
    with fl.rules_overridden({lax.mul_p: fl.from_triples(bad_jac)}):
        with pytest.raises(ValueError, match=r"returned shapes .* expected"):
            fl.forward_laplacian(lambda r: r * r, jnp.ones(3))
    with fl.rules_overridden({lax.mul_p: fl.from_triples(lambda a, b: a[0])}):
        with pytest.raises(TypeError, match=r"\(val, jac, lap\) triples"):
            fl.forward_laplacian(lambda r: r * r, jnp.ones(3))
    with pytest.raises(TypeError, match="from_triples"):
        fl.from_triples(3)
    del bad


# --- (d) each rule kind against the float64 Hessian trace -----------------------------------

KINDS = {
    "linear": lambda r: (
        jnp.concatenate([r[::-1], -r[:2]]).reshape(5, 1).T @ jnp.ones(5)
        + jnp.cumsum(jnp.pad(r, (1, 2), constant_values=0.5)).sum()
    ),
    "bilinear": lambda r: (jnp.outer(r, r) @ r) * r,
    "elementwise": lambda r: jnp.tanh(r) + jnp.exp(r) * jnp.sqrt(2.0 + r) + r**3,
    "reduction": lambda r: jnp.sum(jnp.sin(jnp.outer(r, jnp.arange(20.0))), axis=1),
    "constant": lambda r: jnp.floor(3 * r) * r + (r > 0) * r**2,
    "call": lambda r: (
        jax.jit(lambda u: jnp.sin(u) * u)(r)
        + jax.checkpoint(lambda u: jnp.cos(u) * u[0])(r)
    ),
    "division": lambda r: jnp.sin(r) / (2.0 + r**2) + 1.0 / (3.0 + r[0]),
    "custom_jvp (generic)": lambda r: jax.nn.softplus(r * r[1]) + jax.nn.relu(r),
    "select_n": lambda r: jnp.where(r > 0, jnp.sin(r), r**3),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("point", [R, R2])
def test_each_rule_kind_matches_the_hessian_trace_and_jacfwd(kind, point):
    with jax.enable_x64(True):
        _check(KINDS[kind], jnp.array(point))


# --- control flow: the body is re-interpreted on jets (no generic rule) ---------------------


def _fori(r):
    return lax.fori_loop(0, 4, lambda i, c: jnp.sin(c) * r + c * r[0], r)


def _fori_dynamic(r):  # a while loop with a trip count that depends on the sign of r[0]
    n = 3 + (r[0] > 0).astype(jnp.int32)
    return lax.fori_loop(0, n, lambda i, c: jnp.sin(c) * r + c * r[0], r)


def _lax_map(r):
    return lax.map(lambda x: jnp.tanh(x * r[1]) * jnp.sum(r**2), r)


def _scan_xs(r):
    def step(c, x):
        return c * jnp.cos(x) + x * c[0], jnp.exp(c * x)

    c, ys = lax.scan(step, jnp.ones_like(r), jnp.stack([r, r**2, jnp.sin(r)]))
    return c + jnp.sum(ys, axis=0)


def _scan_reverse_mixed(r):  # a carry that starts constant, an integer carry
    def step(c, x):
        acc, i = c
        return (acc + x * r[2], i + 1), (acc * x, 3.0)

    (acc, i), (ys, k) = lax.scan(step, (0.5, 0), r**2, reverse=True)
    return ys * acc * i + k


def _while_value(r):  # the trip count depends on r's value
    def body(s):
        i, x = s
        return i + 1, x * 0.5 + jnp.sin(x) * r

    return lax.while_loop(
        lambda s: jnp.sum(s[1] ** 2) > 0.05 * (1 + s[0]), body, (0, r)
    )[1]


def _cond(r):
    return lax.cond(r[0] > 0, lambda u: jnp.sin(u) * u[1], lambda u: u**3, r)


def _cond_constant_branch(r):
    return lax.cond(r[0] > 0, lambda u: jnp.ones_like(u), lambda u: u**3, r)


def _switch(r):
    branches = [lambda u: u, jnp.exp, lambda u: jnp.cos(u) * r[0]]
    return lax.switch((r[1] > 0).astype(jnp.int32) + 1, branches, r)


def _nested(r):
    def outer(c, x):
        inner = lax.fori_loop(0, 2, lambda i, v: jnp.tanh(v * x), c)
        return lax.cond(x > 0, lambda v: v * 2.0, lambda v: v * v, inner), inner[0]

    c, ys = lax.scan(outer, r, r)
    return c * jnp.sum(ys)


LOOPS = {
    "fori_loop": (_fori, True),
    "fori_loop, trip count from r": (_fori_dynamic, False),
    "lax.map": (_lax_map, True),
    "scan with xs and ys": (_scan_xs, True),
    "reverse scan, mixed carries": (_scan_reverse_mixed, True),
    "while, trip count from r's value": (_while_value, False),
    "cond on r": (_cond, True),
    "cond, a constant branch": (_cond_constant_branch, True),
    "switch": (_switch, True),
    "nested scan/fori/cond": (_nested, True),
}


@pytest.mark.parametrize("name", list(LOOPS))
@pytest.mark.parametrize("point", [R, R2])
def test_control_flow_keeps_the_structured_rules(name, point, no_generic):
    f, reverse = LOOPS[name]
    with jax.enable_x64(True):
        _check(f, jnp.array(point), reverse=reverse)


def test_a_loop_stays_a_loop():
    f, _ = LOOPS["scan with xs and ys"]
    jaxpr = jax.make_jaxpr(lambda v: fl.forward_laplacian(f, v))(jnp.array(R))
    assert [e.primitive for e in jaxpr.jaxpr.eqns].count(lax.scan_p) == 1
    jaxpr = jax.make_jaxpr(lambda v: fl.forward_laplacian(_while_value, v))(jnp.ones(3))
    assert [e.primitive for e in jaxpr.jaxpr.eqns].count(lax.while_p) == 1


def _unstacked(r):
    """``jnp.unstack`` along both axes and iteration over a traced array (all three
    emit ``unstack`` on JAX 0.12), each slice then used nonlinearly."""
    m = jnp.stack([r, r**2, jnp.sin(r)])
    a, b, c = jnp.unstack(m)
    cols = jnp.unstack(m, axis=1)
    x, y, z = r
    return a * b + jnp.tanh(c) * cols[0] + cols[2] ** 2 + jnp.exp(x * y) * z


@pytest.mark.parametrize("point", [R, R2])
def test_unstack_has_a_linear_rule_and_matches_the_hessian_trace(point, no_generic):
    """``unstack`` (JAX 0.12; 0.8.2's ``jnp.unstack`` is a ``jit`` of ``split`` and
    ``squeeze``) goes through the linear rule, with no GenericRuleWarning."""
    prim = compat.primitive("unstack")
    emitted = _primitives(jax.make_jaxpr(_unstacked)(jnp.ones(3)), set())
    if prim is not None:
        assert prim in emitted and fl.RULES[prim].kind == "linear"
        fl_registry.WARNED.discard(
            prim
        )  # a warning issued before this test would hide one
    with jax.enable_x64(True), warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        lap = _check(_unstacked, jnp.array(point))
    assert not [w for w in got if issubclass(w.category, fl.GenericRuleWarning)]
    assert np.min(np.abs(np.asarray(lap))) > 1e-3  # second derivatives took part


def test_composite_is_interpreted_through_its_decomposition(no_generic):
    """``lax.composite`` has no JVP in JAX (so ``jax.hessian`` refuses it); the
    interpreter runs its decomposition on jets, checked against the decomposition."""
    inner = lambda u: jnp.tanh(u) * u[::-1]  # noqa: E731
    f = lambda v: jnp.sum(lax.composite(inner, name="bg.test")(v) ** 2)  # noqa: E731
    plain = lambda v: jnp.sum(inner(v) ** 2)  # noqa: E731
    assert "composite" in str(jax.make_jaxpr(f)(jnp.ones(3)))
    with jax.enable_x64(True):
        r = jnp.array(R)
        got = jax.jit(lambda v: fl.forward_laplacian(f, v))(r)
        want = _reference(plain, r)
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), 1e-12, 1e-13)
        with pytest.raises(ValueError, match="JVP rule for composite"):
            jax.hessian(f)(r)


def test_polynomial_is_elementwise_with_constant_coefficients(no_generic):
    """``jnp.polyval`` emits ``polynomial`` on JAX 0.12 (0.8.2: multiplies and adds);
    with constant coefficients it takes the elementwise rule."""
    f = lambda v: jnp.sum(jnp.polyval(jnp.array([0.5, -2.0, 3.0, 1.0]), v) * v)  # noqa: E731
    prim = compat.primitive("polynomial")
    if prim is not None:
        assert prim in _primitives(jax.make_jaxpr(f)(jnp.ones(3)), set())
    with jax.enable_x64(True):
        lap = _check(f, jnp.array(R))
    assert abs(float(lap)) > 1e-3


def test_polynomial_with_coefficients_that_depend_on_r():
    prim = compat.primitive("polynomial")
    if prim is None:  # JAX without the primitive: polyval is built of mul and add
        assert not hasattr(lax, "polynomial")
        return
    f = lambda v: jnp.sum(lax.polynomial(v, [v[0], 2.0 * v[1], v[2]]))  # noqa: E731
    plain = lambda v: jnp.sum(v[0] + 2.0 * v[1] * v + v[2] * v * v)  # noqa: E731
    with jax.enable_x64(True):
        got = jax.jit(lambda v: fl.forward_laplacian(f, v))(jnp.array(R))
        want = _reference(plain, jnp.array(R))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), 1e-12, 1e-13)


def test_psum_and_ppermute_inside_shard_map(no_generic):
    """A function of a replicated ``r`` whose weights are sharded by rows over 4
    devices: each device's part, a ``ppermute`` to the next device and a ``psum``; the
    Laplacian equals the float64 Hessian trace of the whole (unsharded) function."""
    from jax.sharding import PartitionSpec as P

    from beyondgrad import runtime

    mesh = runtime.demo_mesh(4, "data")
    ring = [(i, (i + 1) % 4) for i in range(4)]

    def part(wb, v):
        h = jnp.tanh(wb @ v)
        shifted = lax.ppermute(h, "data", ring)
        return lax.psum(jnp.sum(h**2) + jnp.sum(h * shifted), "data")

    def whole(w, v):
        h = jnp.tanh(w @ v).reshape(4, 2)
        return jnp.sum(h**2) + jnp.sum(h * jnp.roll(h, 1, axis=0))

    sharded = jax.jit(
        jax.shard_map(
            lambda wb, v: fl.forward_laplacian(functools.partial(part, wb), v),
            mesh=mesh,
            in_specs=(P("data"), P()),
            out_specs=P(),
        )
    )
    with jax.enable_x64(True):
        w = jnp.asarray(np.random.default_rng(3).normal(size=(8, 3)))
        r = jnp.array(R)
        got = sharded(w, r)
        want = _reference(functools.partial(whole, w), r)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), 1e-12, 1e-13)


def test_every_public_primitive_has_a_rule_a_fallback_or_needs_none():
    """Every ``Primitive`` that ``jax.lax`` and ``jax.extend.core.primitives`` export
    on the running JAX is in RULES, in FALLBACK, or in rule_coverage.NO_RULE_NEEDED
    (and in one of them only): a primitive new in a JAX release fails here until it is
    classified."""
    assert rule_coverage.unclassified() == []
    classified = {p.name for p in fl.RULES} | {p.name for p in fl.FALLBACK}
    assert not classified & rule_coverage.NO_RULE_NEEDED


def test_scan_over_a_zero_length_input_that_depends_on_r():
    """A scan over no steps (e.g. the electrons of an empty spin channel) returns its
    initial carry; the interpreter traces the body on stand-in slices."""
    for k in (0, 2):
        f = lambda v: jnp.sum(lax.scan(lambda c, a: (c * a, a), v[0], v[:k])[0] * v)  # noqa: B023, E731
        with jax.enable_x64(True):
            lap = _check(f, jnp.linspace(0.1, 1.0, 4))
        assert float(lap) == pytest.approx(2.0 if k == 0 else 1.94, rel=1e-12)


@pytest.mark.parametrize(
    "rule, match",
    [
        (lambda eqn, ins: ins[0], "returned a Jet; a rule returns a list"),
        (lambda eqn, ins: [ins[0], ins[0]], "returned a list of 2"),
        (
            lambda eqn, ins: [fl.Jet(ins[0].val, ins[0].jac[:2], None)],
            r"jac of shape \(2, 3\); expected \(3, 3\)",
        ),
    ],
)
def test_a_registered_rule_with_a_slip_fails_at_trace_time(rule, match):
    f = lambda v: jnp.sum(v * jnp.sin(v))  # noqa: E731
    with fl.rules_overridden({lax.mul_p: fl.custom(rule)}):
        with pytest.raises((TypeError, ValueError), match=match):
            fl.forward_laplacian(f, jnp.array(R))


def test_rule_builders_and_lookups_refuse_wrong_arguments():
    with pytest.raises(TypeError, match="rule_for needs a jax.extend.core.Primitive"):
        fl.rule_for("sin")
    with pytest.raises(TypeError, match="operand positions as ints"):
        fl.linear("0")
    with pytest.raises(TypeError, match="names of the sub-jaxpr parameter"):
        fl.call(3)
    with pytest.raises(TypeError, match="fn must return one array"):
        fl.forward_laplacian(lambda v: {"a": v[0], "b": v[1]}, jnp.array(R))


def test_shard_map_inside_the_function_is_a_deliberate_fallback():
    """The body runs per device with its own axis names, so it is not inlined: the
    generic rule (forward over forward on the whole shard_map), with no warning."""
    from jax.sharding import PartitionSpec as P

    from beyondgrad import runtime

    mesh = runtime.demo_mesh(4, "data")
    w = jnp.asarray(np.random.default_rng(4).normal(size=(8, 3)))

    def f(v):
        rows = jax.shard_map(
            lambda wb: jnp.tanh(wb @ v),
            mesh=mesh,
            in_specs=P("data"),
            out_specs=P("data"),
        )(w)
        return jnp.sum(rows**2)

    def whole(v):  # the reference: reverse mode through shard_map fails on 0.8.2
        return jnp.sum(jnp.tanh(w @ v) ** 2)

    assert compat.primitive("shard_map") in fl.FALLBACK
    with jax.enable_x64(True), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", fl.GenericRuleWarning)
        r = jnp.array(R)
        got = jax.jit(lambda v: fl.forward_laplacian(f, v))(r)
        # a deliberate fallback: no "no rule" warning, only the cost one
        assert not [w for w in seen if "no rule for" in str(w.message)]
        for a, b in zip(got, _reference(whole, r)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), 1e-12, 1e-13)


# --- complex values, custom_jvp and custom_vjp semantics ------------------------------------


def test_complex_abs_is_not_treated_as_holomorphic():
    def f(r):
        z = jnp.exp(1j * r) * (1.0 + r[0] + 0.5j * r[1])
        return jnp.abs(z) ** 2 + jnp.abs(z * z) + jnp.real(z * jnp.conj(z[::-1]))

    with jax.enable_x64(True):
        for point in (R, R2):
            _check(f, jnp.array(point))


@jax.custom_jvp
def _frozen_sin(x):  # the primal program has a zero derivative; the rule the true one
    return lax.stop_gradient(jnp.sin(x))


_frozen_sin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


def test_custom_jvp_rule_is_used_as_jax_jvp_uses_it():
    f = lambda r: _frozen_sin(r) * r[0]  # noqa: E731
    with jax.enable_x64(True):
        for point in (R, R2):
            r = jnp.array(point)
            lap = _check(f, r)  # jax.hessian uses the custom rule too
            plain = lambda v: jnp.sin(v) * v[0]  # noqa: E731
            np.testing.assert_allclose(
                np.asarray(lap), np.asarray(_reference(plain, r)[2]), rtol=1e-12
            )
            # differentiating the primal program instead would give another value
            primal = lambda v: lax.stop_gradient(jnp.sin(v)) * v[0]  # noqa: E731
            assert np.max(np.abs(np.asarray(lap - _reference(primal, r)[2]))) > 0.1


@jax.custom_vjp
def _straight_through(x):
    return jnp.round(x)


_straight_through.defvjp(lambda x: (jnp.round(x), None), lambda _, g: (g,))


@pytest.mark.parametrize(
    "f",
    [
        lambda r: jnp.sum(jnp.sin(r) * _straight_through(3.0 * r)),
        lambda r: jnp.sin(_straight_through(2.0 * r) + r) * r,
    ],
)
def test_straight_through_custom_vjp_agrees_with_method_hessian(f):
    from beyondgrad import laplacian

    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.GenericRuleWarning)
        r = jnp.array(R)
        value, jac, lap = jax.jit(lambda v: fl.forward_laplacian(f, v))(r)
        want = jnp.trace(jax.hessian(f)(r), axis1=-2, axis2=-1)
        np.testing.assert_allclose(np.asarray(lap), np.asarray(want), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jac), np.asarray(jax.jacrev(f)(r)))
        if jnp.ndim(value) == 0:
            want_lap = laplacian.laplacian(f, r, method="hessian")
            np.testing.assert_allclose(float(lap), float(want_lap), rtol=1e-12)
        assert np.max(np.abs(np.asarray(want))) > 0.1  # not the primal's 0 second term


# --- issue 35: slogdet/det by their trace identities, elementwise custom_jvp, choosers ------

_W4 = np.random.default_rng(35).normal(size=(3, 2, 4, 4))


def _matrices(r):
    """A batch of two 4 x 4 matrices that depend on r nonlinearly."""
    return jnp.tanh(jnp.einsum("i,iskl->skl", r, _W4)) + 1.5 * jnp.eye(4)


@pytest.mark.parametrize(
    "f",
    [
        lambda r: jnp.linalg.slogdet(_matrices(r)[0])[1],
        lambda r: jnp.sum(jnp.linalg.slogdet(_matrices(r))[1] * r[:2]),  # batched
        lambda r: jnp.linalg.slogdet(_matrices(r))[1],  # several results
        lambda r: jnp.linalg.det(_matrices(r)[1]) * r[0],
        lambda r: jnp.linalg.det(_matrices(r)),
    ],
)
def test_slogdet_and_det_take_their_rule_not_the_generic_one(f, no_generic):
    with jax.enable_x64(True):
        for point in (R, R2):
            _check(f, jnp.array(point))


def test_slogdet_rule_factorises_once_per_determinant():
    """The compiled forward Laplacian of a two-spin, two-determinant model: one LU
    factorisation and two triangular solves per (batched) slogdet. The generic rule
    compiled to 12 triangular solves for the same model."""
    from beyondgrad import all_electron

    n = 6
    params = all_electron.init_ferminet(jax.random.key(0), n)
    x = jnp.linspace(-1.0, 1.0, 3 * n)
    g = lambda v: all_electron.ferminet_log_psi(params, v.reshape(n, 3))  # noqa: E731
    hlo = jax.jit(lambda v: fl.forward_laplacian(g, v)[2]).lower(x).compile()
    text = hlo.as_text()
    assert len(re.findall(r"getrf", text)) == 2  # up and down, K batched
    assert len(re.findall(r"trsm", text)) == 4


@pytest.mark.parametrize(
    "act",
    [
        jax.nn.softplus,
        jax.nn.silu,
        jax.nn.gelu,
        jax.nn.relu,
        jax.nn.elu,
        jax.nn.celu,
        jax.nn.selu,
        jax.nn.log_sigmoid,
        jax.nn.soft_sign,
        lambda x: jnp.logaddexp(x, 0.3),
        lambda x: jnp.logaddexp(0.3, x),
    ],
)
def test_elementwise_custom_jvp_keeps_the_elementwise_rule(act, no_generic):
    f = lambda r: act(r * r[1] + 0.2) * r  # noqa: E731
    with jax.enable_x64(True):
        for point in (R, R2):
            _check(f, jnp.array(point))


def test_non_elementwise_custom_jvp_uses_the_generic_rule(no_generic):
    """A custom_jvp whose rule mixes elements is not taken as elementwise, though its
    primal program is: the call goes to the generic rule (through the custom rule)."""

    @jax.custom_jvp
    def mix(x):
        return jnp.sin(x)

    mix.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0][::-1]))
    with pytest.raises(AssertionError, match="the generic rule was used"):
        fl.forward_laplacian(lambda r: mix(r * r[0]) * r, jnp.array(R))
    fl.forward_laplacian(lambda r: jnp.sin(r * r[0]) * r, jnp.array(R))


def test_custom_rule_of_an_elementwise_function_is_the_one_used(no_generic):
    """_sin_twice_slope-like: the rule, not the primal, gives g' and g'' (the result
    is not multiplied by another function of r: there jax.hessian mixes the rule and
    the primal, module docstring)."""

    @jax.custom_jvp
    def twice(x):
        return jnp.sin(x)

    twice.defjvp(lambda p, t: (jnp.sin(p[0]), 2 * jnp.cos(p[0]) * t[0]))
    f = lambda r: twice(r * r[1]) + r[0] ** 2  # noqa: E731
    with jax.enable_x64(True):
        lap = _check(f, jnp.array(R))
        plain = lambda v: jnp.sin(v * v[1]) + v[0] ** 2  # noqa: E731
        assert (
            np.max(np.abs(np.asarray(lap - _reference(plain, jnp.array(R))[2]))) > 0.1
        )


@pytest.mark.parametrize(
    "f",
    [
        lambda r: jnp.maximum(jnp.sin(r), r[::-1] ** 2),
        lambda r: jnp.minimum(r * r[0], 0.1),
        lambda r: jnp.maximum(r * r[0], r * r[0]),  # ties everywhere: 1/2 each
        lambda r: jnp.max(jnp.sin(3 * r) * r[1]) + jnp.min(r * r, axis=0),
        lambda r: jnp.max(jnp.outer(r, r) ** 2, axis=1),
        lambda r: jax.nn.logsumexp(r * r[0]) + jax.nn.softmax(r * r[2]),
        lambda r: 1.0 / (r * r[0] + 2.0),  # a scalar over an array
        lambda r: (r * r[1]) / jnp.sum(r * r),  # an array over a scalar Jet
    ],
)
def test_choosers_and_broadcasting_div_have_their_own_rules(f, no_generic):
    with jax.enable_x64(True):
        for point in (R, R2):
            _check(f, jnp.array(point))


def test_generic_report_names_the_primitives_and_their_cost():
    def f(r):
        a = jnp.outer(r, r) + 3.0 * jnp.eye(r.shape[0])
        return jnp.sum(jnp.linalg.cholesky(a)) + jnp.sum(jnp.sin(r))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.GenericRuleWarning)
        report = fl.generic_report(f, jnp.ones(4))
    assert [u.primitive for u in report.uses] == ["cholesky"]
    assert report.uses[0].jvps == 9 and report.uses[0].shapes == ((4, 4),)
    assert 0 < report.generic_flops < report.total_flops
    assert report.share > 0.5  # the cholesky's 9 JVPs are most of this program
    clean = fl.generic_report(lambda r: jnp.sum(jnp.sin(r) * r), jnp.ones(4))
    assert clean.uses == () and clean.share == 0.0 and clean.total_flops > 0


def test_a_dominant_generic_rule_warns_even_for_a_fallback():
    def f(r):  # cholesky is in FALLBACK: no "no rule" warning, but the cost one
        a = jnp.outer(r, r) + 3.0 * jnp.eye(r.shape[0])
        return jnp.sum(jnp.linalg.cholesky(a))

    fl_interpreter.WARNED_SHARE.discard(("cholesky",))
    with pytest.warns(fl.GenericRuleWarning, match=r"about \d+% .*cholesky"):
        fl.forward_laplacian(f, jnp.ones(5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.GenericRuleWarning)
        fl.forward_laplacian(
            lambda r: jnp.linalg.slogdet(jnp.outer(r, r) + 3.0 * jnp.eye(5))[1],
            jnp.ones(5),
        )


def test_nested_loops_interpret_each_body_a_linear_number_of_times(monkeypatch):
    """Depth 1-4 of nested fori_loops: the bodies are interpreted 2 * depth + 1 times
    in all (masks found once per body and cached; a body traced only for its mask
    does not trace the loops inside it). Without that: 4, 13, 40, 121 (x3 a level)."""
    calls = []
    interpret = fl_interpreter.interpret

    def counting(*args):
        calls.append(1)
        return interpret(*args)

    monkeypatch.setattr(fl_interpreter, "interpret", counting)

    def nested(depth):
        f = lambda i, x: jnp.sin(x) * 1.01  # noqa: E731
        for _ in range(depth - 1):
            f = (lambda g: lambda i, x: lax.fori_loop(0, 2, g, x) * 0.99)(f)
        return lambda r: jnp.sum(lax.fori_loop(0, 2, f, r))

    counts = []
    for depth in range(1, 5):
        calls.clear()
        g = nested(depth)
        jax.jit(lambda v, g=g: fl.forward_laplacian(g, v)).lower(jnp.ones(3))
        counts.append(len(calls))
    assert counts == [3, 5, 7, 9]
    with jax.enable_x64(True):
        monkeypatch.setattr(fl_interpreter, "interpret", interpret)
        _check(nested(3), jnp.array(R))


def test_swapped_arguments_get_our_error():
    with pytest.raises(TypeError, match=r"call forward_laplacian\(fn, r\)"):
        fl.forward_laplacian(jnp.ones(3), jnp.sin)


def test_a_point_of_the_wrong_kind_or_shape_is_the_same_mistake_as_in_laplacian():
    """One exception class for one mistake (issue 45 item 3): an integer point is a
    TypeError (wrong kind) and a 2-D point a ValueError (wrong value) from
    forward_laplacian as from laplacian(), each naming the fix."""
    from beyondgrad import laplacian as L

    f = lambda r: jnp.sum(r * r)  # noqa: E731
    for call in (fl.forward_laplacian, L.laplacian):
        with pytest.raises(TypeError, match=r"floating-point array .*astype"):
            call(f, jnp.arange(3))
        with pytest.raises(ValueError, match=r"must be a 1-D array .*reshape\(-1\)"):
            call(f, jnp.ones((2, 3)))
