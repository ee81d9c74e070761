"""Particle sparsity in the forward Laplacian (``forward_jet(..., particles=n)``):
the same value, gradient and Laplacian as the float64 Hessian trace and ``jax.grad``
on pair features (with their ``i == j`` diagonal), pooling over electrons, mixed
sparse and dense operands, control flow and both all-electron models (under ``jit``,
``vmap`` over walkers and the parameter gradient of the kinetic energy:
tests/test_all_electron.py, dense and sparse against one reference); and the
sparsity itself, measured: the pair stream's carried derivative has ``(c, n, n, w)``
storage and the compiled program fewer flops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from beyondgrad import all_electron, laplacian
from beyondgrad import forward_laplacian as fl
from beyondgrad.forward_laplacian import cost as fl_cost

N = 4  # electrons in the small cases (d = 12)


def _points(n=N, count=2, seed=0):
    return jax.random.normal(jax.random.key(seed), (count, 3 * n), jnp.float64)


def _check(f, xs, settings=(None, N), rtol=1e-11):
    """``jit(vmap(forward_laplacian(f, ., particles=p)))`` over the points ``xs``, for
    each ``p`` of ``settings``, against ``f``, ``jax.grad`` and the trace of
    ``jax.hessian`` (float64)."""

    def reference(v):
        return f(v), jax.grad(f)(v), jnp.trace(jax.hessian(f)(v))

    value, grad, want = jax.jit(jax.vmap(reference))(xs)
    assert float(jnp.min(jnp.abs(want))) > 1e-3  # a case that tests something
    scale = float(jnp.max(jnp.abs(grad)))
    for particles in settings:
        got = jax.jit(
            jax.vmap(lambda v, p=particles: fl.forward_laplacian(f, v, particles=p))
        )(xs)
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(value), rtol=1e-13)
        np.testing.assert_allclose(
            np.asarray(got[1]), np.asarray(grad), rtol=rtol, atol=rtol * scale
        )
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want), rtol=rtol)


def _pair(r):
    """Pair features of FermiNet's kind: ``r_i - r_j`` and a smoothed length (zero
    displacement on the diagonal ``i == j``, where both particle terms meet)."""
    diff = r[:, None, :] - r[None, :, :]
    return jnp.concatenate(
        [diff, jnp.sqrt(jnp.sum(diff * diff, -1, keepdims=True) + 1.0)], -1
    )


W = jnp.linspace(-1.0, 1.0, 20).reshape(4, 5)


def pair_energy(v):
    """Every pair, the diagonal included: sum_ij g(h_ij) with the (i, i) terms."""
    h = jnp.tanh(_pair(v.reshape(N, 3)) @ W + 0.1)
    return jnp.sum(h**2) + jnp.sum(h[..., 0] * h[..., 1].T)


def diagonal_only(v):
    """Only the diagonal i == j (constant in r: both terms cancel there), plus one
    off-diagonal sum so the result depends on r: a sum of squares without the
    owner mask double counts the diagonal."""
    h = _pair(v.reshape(N, 3))
    sq = jnp.sum(jnp.tanh(h) ** 2, -1)
    return jnp.sum(sq * jnp.eye(N)) + jnp.sum(sq[0])


def pooled(v):
    """A mean over the owner axis j (the term with owner j becomes dense, the term
    with owner i stays), then per-electron features again."""
    r = v.reshape(N, 3)
    h = jnp.tanh(_pair(r) @ W)
    pool = jnp.mean(h, axis=1)  # (N, 5)
    one = jnp.concatenate([r, jnp.ones((N, 1))], -1) @ W  # sparse, owner i
    return jnp.sum(jnp.sin(pool * one)) + jnp.sum(jnp.cos(h[:, :2].sum(1)))


def mixed(v):
    """Sparse and dense operands together: a per-electron feature plus a
    mean-pooled (dense) one, a division by a per-electron value, slices, a
    transpose and a reshape that splits and merges the owner axis."""
    r = v.reshape(N, 3)
    rho = jnp.sqrt(jnp.sum(r * r, -1, keepdims=True) + 1.0)  # (N, 1), owner i
    g = r / rho + jnp.mean(r, axis=0)  # sparse + dense
    t = jnp.reshape(r.T, (3, 2, N // 2))  # owner split over two axes
    u = jnp.reshape(jnp.transpose(t, (1, 2, 0)), (N, 3))
    return jnp.sum(g**3) + jnp.sum(jnp.exp(-u * rho)) + jnp.sum(r[1:3] * r[:2])


def products(v):
    """dot_general in its forms: the jet on the right, a batch axis that is the owner
    axis, and a contraction over the owner axis (which mixes particles: dense)."""
    r = v.reshape(N, 3)
    h = jnp.tanh(r @ W[:3])  # (N, 5), owner i
    m = jnp.linspace(-1.0, 1.0, 15).reshape(3, 5)
    a = jnp.einsum("fg,ig->fi", m, h)  # right operand, owner on the result's axis 1
    outer = h[:, :, None] * h[:, None, :2]  # (N, 5, 2)
    b = jnp.einsum("nab,nbc->nac", outer, jnp.ones((N, 2, 3)))  # batch over owners
    c = r.T @ h  # contraction over the owner axis
    return jnp.sum(jnp.sin(a)) + jnp.sum(b**2) + jnp.sum(jnp.cos(c))


def attention(v):
    """dot_general with both operands on r: attention logits ``q @ k.T`` (owners i
    and j, meeting on the diagonal), the same batched over heads, a self-product
    ``r @ r.T``, a complex product, and logits contracted with a per-particle value
    (``softmax(s) @ v``, where the sum over keys mixes particles: dense)."""
    r = v.reshape(N, 3)
    q, k = jnp.tanh(r @ W[:3]), jnp.sin(r**2 @ W[1:])  # (N, 5), owner i
    s = q @ k.T
    heads = jnp.stack([q, 2.0 * k])  # (2, N, 5)
    sh = jnp.einsum("hif,hjf->hij", heads, jnp.cos(heads))
    gram = r @ r.T
    z = jnp.exp(1j * q) @ (1j * k).T
    out = jax.nn.softmax(s, axis=-1) @ k
    return (
        jnp.sum(jnp.sin(s))
        + jnp.sum(sh**2)
        + jnp.sum(jnp.exp(-gram / 4))
        + jnp.real(jnp.sum(z * z))
        + jnp.sum(jnp.tanh(out))
    )


def tangled(v):
    """A term whose owner follows no single axis (the concatenation of a value with
    owners along axis 0 and one with owners along axis 1), summed either way."""
    r = v.reshape(N, 3)
    a = jnp.broadcast_to(jnp.sin(r[:, :1]), (N, N))  # owner i
    t = jnp.concatenate([a, a.T], axis=1)  # owner i on the left, j on the right
    return jnp.sum(jnp.cos(t.sum(1))) + jnp.sum(jnp.tanh(t.sum(0))) + jnp.sum(t**3)


def custom_and_complex(v):
    """An elementwise custom_jvp activation (softplus) and a complex plane wave of
    the pair displacements."""
    diff = _pair(v.reshape(N, 3))[..., :3]
    wave = jnp.exp(1j * (diff @ jnp.array([0.3, -0.2, 0.5])))
    return jnp.sum(jax.nn.softplus(diff)) + jnp.real(jnp.sum(wave * wave.conj().T))


def with_control_flow(v):
    """A pair stream through jit, cond and a scan over layers."""
    r = v.reshape(N, 3)
    h = jax.jit(lambda x: jnp.tanh(_pair(x) @ W))(r)
    h = lax.cond(jnp.sum(r) > -100.0, lambda a: a * 2.0, lambda a: -a, h)

    def layer(carry, w):
        return jnp.tanh(carry * w + carry), None

    h, _ = lax.scan(layer, h, jnp.array([0.5, -0.3]))
    return jnp.sum(h**2)


CASES = [
    pair_energy,
    diagonal_only,
    pooled,
    mixed,
    products,
    attention,
    tangled,
    custom_and_complex,
]


@pytest.mark.parametrize("f", [*CASES, with_control_flow], ids=lambda f: f.__name__)
def test_small_cases_match_the_hessian_trace(f):
    """With and without particles, under jit and vmap over two points."""
    with jax.enable_x64(True):
        _check(f, _points())


def test_the_diagonal_needs_the_owner_mask():
    """At i == j the pair displacement has two terms of opposite sign naming the same
    particle: its squared Jacobian is 0 there (the cross term cancels the squares)."""
    with jax.enable_x64(True):
        x = _points()[0]

        def f(v):
            diff = _pair(v.reshape(N, 3))[..., :3]
            return jnp.sum(jnp.cos(diff) * jnp.eye(N)[..., None]) + jnp.sum(
                jnp.sin(diff[0])
            )

        _check(f, x[None], (N,))
        _, _, lap = jax.jit(lambda v: fl.forward_laplacian(f, v, particles=N))(x)
        r = x.reshape(N, 3)
        # by hand: the diagonal cos(0) is constant; row 0 gives -sin twice per pair
        want = -2.0 * jnp.sum(jnp.sin(r[0] - r[1:]))
        np.testing.assert_allclose(float(lap), float(want), rtol=1e-12)


def test_sums_mixing_particles_and_point_coordinates():
    """particles = 2 over d = 12: blocks of 6 coordinates (two 3-D points per
    particle), and particles = d: one coordinate each."""
    with jax.enable_x64(True):
        _check(pair_energy, _points(), (1, 2, 12))
        _check(mixed, _points(), (1, 2, 12))


MODELS = {
    "ferminet": (all_electron.init_ferminet, all_electron.ferminet_log_psi),
    "psiformer": (all_electron.init_psiformer, all_electron.psiformer_log_psi),
}


def _model(name, n=5, layers=2):
    init, log_psi = MODELS[name]
    params = init(jax.random.key(3), n, width=8, layers=layers, dtype=jnp.float64)
    return params, log_psi


def _kinetic(log_psi, params, x, n, particles):
    f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
    _, jac, lap = fl.forward_laplacian(f, x, particles=particles)
    return -0.5 * (lap + jnp.sum(jac * jac))


def _kinetic_hessian(log_psi, params, x, n):
    f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
    return -0.5 * (jnp.trace(jax.hessian(f)(x)) + jnp.sum(jax.grad(f)(x) ** 2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_match_the_hessian_trace(name):
    n = 5
    with jax.enable_x64(True):
        params, log_psi = _model(name, n)
        f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
        _check(f, _points(n), (n,))  # dense: tests/test_all_electron.py


def test_laplacian_entry_point_forwards_particles():
    n = 5
    with jax.enable_x64(True):
        params, log_psi = _model("ferminet", n)
        f = lambda v: log_psi(params, v.reshape(n, 3))  # noqa: E731
        x = _points(n)[0]
        got = jax.jit(
            lambda v: laplacian.laplacian(f, v, method="forward", particles=n)
        )(x)
        want = jax.jit(lambda v: jnp.trace(jax.hessian(f)(v)))(x)
        np.testing.assert_allclose(float(got), float(want), rtol=1e-11)
        with pytest.raises(TypeError, match="particles"):
            laplacian.laplacian(f, x, method="hessian", particles=n)


# ----------------------------------------------------------------------------- the sparsity


def _shapes(jaxpr):
    """Every intermediate's shape in ``jaxpr`` and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            yield tuple(getattr(var.aval, "shape", ()))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _shapes(sub)


def _ferminet(n):
    params = all_electron.init_ferminet(jax.random.key(3), n)
    f = lambda v: all_electron.ferminet_log_psi(params, v.reshape(n, 3))  # noqa: E731
    x = jax.random.normal(jax.random.key(0), (3 * n,), jnp.float32)
    return f, x, params["layers"][0][2].shape[1]


def test_the_pair_stream_is_carried_in_particle_blocks():
    """With particles, the pair stream's derivative is stored as (c, n, n, w) (c = 3
    coordinates per electron), and no intermediate is as large as the dense pair
    Jacobian (3n, n, n, w); without, that dense Jacobian is there."""
    n = 16
    f, x, w = _ferminet(n)
    dense = jax.make_jaxpr(lambda v: fl.forward_jet(f, v))(x).jaxpr
    sparse = jax.make_jaxpr(lambda v: fl.forward_jet(f, v, particles=n))(x).jaxpr
    dense_shapes, sparse_shapes = set(_shapes(dense)), set(_shapes(sparse))
    assert (3 * n, n, n, w) in dense_shapes
    assert (3, n, n, w) in sparse_shapes
    pair_jacobian = 3 * n * n * n * w  # elements of the dense pair Jacobian
    assert max(int(np.prod(s)) for s in sparse_shapes) < pair_jacobian
    # every pair-stream array carries at most one block of rows (c = 3)
    pair = [s for s in sparse_shapes if s[-3:] == (n, n, w)]
    assert pair and max(int(np.prod(s)) for s in pair) == 3 * n * n * w


def test_attention_logits_are_carried_in_particle_blocks():
    """``q @ k.T`` with both operands on r keeps two particle terms of (c, n, n)
    rows each (owner i from q, j from k): with particles, no intermediate is the
    dense (3n, n, n) Jacobian of the logits, which the dense engine builds."""
    n = 8
    with jax.enable_x64(True):
        x = _points(n, 1)[0]
        w = jnp.linspace(-1.0, 1.0, 15).reshape(3, 5)

        def f(v):
            r = v.reshape(n, 3)
            return jnp.sum(jnp.sin(jnp.tanh(r @ w) @ jnp.cos(r @ w).T))

        dense = jax.make_jaxpr(lambda v: fl.forward_jet(f, v))(x).jaxpr
        sparse = jax.make_jaxpr(lambda v: fl.forward_jet(f, v, particles=n))(x).jaxpr
        assert (3 * n, n, n) in set(_shapes(dense))
        assert (3 * n, n, n) not in set(_shapes(sparse))
        assert (3, n, n) in set(_shapes(sparse))
        _check(f, x[None], (n,))


def dense_and_sparse(v):
    """A dense operand (a mean over electrons) times and over a sparse one (pair
    features, whose i == j diagonal has both owners equal), and a softmax over
    keys (``e / sum(e)``: a sparse numerator over a dense sum)."""
    r = v.reshape(N, 3)
    pair = _pair(r)  # (N, N, 4), owners i and j
    dense = jnp.broadcast_to(jnp.mean(jnp.sin(r), axis=0), (N, N, 3))
    a = pair[..., :3] * dense
    b = dense / (2.0 + pair[..., 3:])
    c = pair[..., :3] / (1.5 + jnp.cos(dense))
    att = jax.nn.softmax(pair[..., 3] * jnp.tanh(r[:, :1]), axis=-1)
    return jnp.sum(jnp.sin(a)) + jnp.sum(b**2) + jnp.sum(jnp.tanh(c)) + jnp.sum(att**2)


def test_a_dense_operand_times_a_sparse_one_reads_the_owners_only(monkeypatch):
    """mul and div with one dense and one sparse operand go through the mixed
    product (the cross term read at the sparse operand's owners), and match the
    float64 Hessian trace."""
    from beyondgrad.forward_laplacian import sparse

    calls = []
    real = sparse._mixed_product
    monkeypatch.setattr(
        sparse, "_mixed_product", lambda *a: calls.append(1) or real(*a)
    )
    with jax.enable_x64(True):
        _check(dense_and_sparse, _points())
    assert len(calls) >= 4  # a, b, c and the softmax's division


def dense_contracted_with_sparse(v):
    """A dense operand contracted with a sparse one over the owner axis, each side:
    attention weights ``softmax(s) @ v`` and ``v.T @ softmax(s).T``; a contraction
    over the owner axis and a feature axis at once; and weights times pair logits
    (owners i and j), which the mixed product does not cover (the dense rule)."""
    r = v.reshape(N, 3)
    vals = jnp.tanh(r @ W[:3])  # (N, 5), owner i
    weights = jax.nn.softmax(jnp.sin(r[:, :1] * r[:, 1]), axis=-1)  # (N, N), dense
    out1 = weights @ vals
    out2 = vals.T @ weights.T
    both = jnp.einsum("ij,jf->i", weights @ jnp.eye(N), vals)
    pairs = weights @ (vals @ jnp.cos(vals).T)
    return (
        jnp.sum(jnp.sin(out1))
        + jnp.sum(out2**2)
        + jnp.sum(jnp.cos(both))
        + jnp.sum(jnp.tanh(pairs))
    )


def test_a_dense_operand_contracted_with_a_sparse_one(monkeypatch):
    """dot_general of a dense and a sparse operand over the sparse one's owner axis
    (attention's weights times values, either side) goes through the mixed product,
    a batched one through the dense rule; all match the float64 Hessian trace."""
    from beyondgrad.forward_laplacian import sparse

    answers = []
    real = sparse._mixed_dot
    monkeypatch.setattr(
        sparse, "_mixed_dot", lambda *a: answers.append(real(*a)) or answers[-1]
    )
    with jax.enable_x64(True):
        _check(dense_contracted_with_sparse, _points())
    covered = [a is not None for a in answers]
    assert covered.count(True) >= 3 and covered.count(False) >= 1


def test_sparsity_cuts_compiled_flops_and_temporaries():
    """FermiNet-like at n = 16 (float32, the default sizes): the compiled forward
    Laplacian with particles needs at most 0.8 of the dense program's flops and
    temporary bytes (measured: 0.69 and 0.66 on the CPU backend)."""
    n = 16
    f, x, _ = _ferminet(n)

    def measure(particles):
        compiled = (
            jax.jit(lambda v: fl.forward_laplacian(f, v, particles=particles)[2])
            .lower(x)
            .compile()
        )
        flops = fl_cost.compiled_flops(compiled)
        return flops, compiled.memory_analysis().temp_size_in_bytes

    (flops_dense, temp_dense), (flops_sparse, temp_sparse) = measure(None), measure(n)
    assert flops_dense > 0 and temp_dense > 0
    assert flops_sparse < 0.8 * flops_dense
    assert temp_sparse < 0.8 * temp_dense


def test_rule_table_declares_sparsity():
    """The rules that keep particle sparsity say so (Rule.sparse); the others receive
    dense jets."""
    keeps = [lax.mul_p, lax.add_p, lax.tanh_p, lax.reduce_sum_p, lax.dot_general_p]
    keeps += [lax.reshape_p, lax.broadcast_in_dim_p, lax.concatenate_p, lax.div_p]
    for primitive in keeps:
        assert fl.RULES[primitive].sparse is not None, primitive
    for primitive in [lax.cumsum_p, lax.scan_p, lax.while_p, lax.sort_p, lax.max_p]:
        assert fl.rule_for(primitive).sparse is None, primitive


def test_a_registered_rule_receives_dense_jets():
    """A rule without sparse support (registered by a user) gets dense Jets."""
    seen = []

    def my_sin(eqn, ins):
        seen.append(type(ins[0]).__name__)
        (x,) = ins
        lap = -jnp.sin(x.val) * jnp.sum(x.jac**2, 0)
        if x.lap is not None:
            lap = lap + jnp.cos(x.val) * x.lap
        return [fl.Jet(jnp.sin(x.val), jnp.cos(x.val) * x.jac, lap)]

    with jax.enable_x64(True), fl.rules_overridden({lax.sin_p: fl.custom(my_sin)}):
        x = _points()[0]
        _check(lambda v: jnp.sum(jnp.sin(_pair(v.reshape(N, 3)))), x[None], (N,))
    assert seen and set(seen) == {"Jet"}


@pytest.mark.parametrize(
    ("particles", "error", "match"),
    [
        (5, ValueError, "does not divide"),
        (0, ValueError, "positive"),
        (2.0, TypeError, "particles"),
        (True, TypeError, "particles"),
    ],
)
def test_bad_particles(particles, error, match):
    with pytest.raises(error, match=match):
        fl.forward_laplacian(jnp.sum, jnp.ones(12), particles=particles)


# ----------------------------------------------------------------------------- folx's cases

#: folx's own test functions (tests/test_folx_cases.py) that exercise the sparse rules:
#: broadcasting, complex parts, products of two jets, degenerate einsums, indexing,
#: attention, calls and cond; each with blocks of 3 coordinates where d allows, else 1
FOLX_CASES = [
    "elementwise complex",
    "binary",
    "matmul both depend on x",
    "einsum degenerate broadcasts",
    "slogdet sparsity patterns",
    "convert to float32, complex64, complex128",
    "split, pad, add_any",
    "indexing",
    "complex parts and mlp",
    "attention, plain and weighted",
    "cond and checkpoint",
    "custom_jvp softplus",
]


@pytest.mark.parametrize("name", FOLX_CASES)
def test_folx_cases_with_particles_as_without(name):
    """Particles change the bookkeeping, never the numbers: value, Jacobian and
    Laplacian as the dense engine's (itself checked against the float64 Hessian trace
    by test_folx_cases) to float64 rounding."""
    import test_folx_cases as cases

    case = cases.CASE_BY_NAME[name]
    particles = case.d // 3 if case.d % 3 == 0 else case.d
    with jax.enable_x64(True):
        x = jnp.asarray(np.random.default_rng(case.d).normal(size=case.d))

        def run(p):
            return cases.compiled(
                lambda v: fl.forward_laplacian(case.fn, v, particles=p), x
            )(x)

        for got, want in zip(run(particles), run(None)):
            got, want = np.asarray(got), np.asarray(want)
            scale = max(1.0, float(np.max(np.abs(want))))
            assert float(np.max(np.abs(got - want))) <= 1e-13 * scale


def test_inside_shard_map():
    """Walkers sharded over 4 devices (shard_map, vmap inside): the per-shard
    Laplacians with particles equal the float64 Hessian trace of each walker."""
    from jax.sharding import PartitionSpec

    from beyondgrad import runtime

    mesh = runtime.demo_mesh(4, "data")
    with jax.enable_x64(True):
        xs = _points(count=8, seed=6)
        want = np.asarray(
            jax.jit(jax.vmap(lambda v: jnp.trace(jax.hessian(pair_energy)(v))))(xs)
        )

        def per_shard(block):
            return jax.vmap(
                lambda v: fl.forward_laplacian(pair_energy, v, particles=N)[2]
            )(block)

        sharded = jax.shard_map(
            per_shard,
            mesh=mesh,
            in_specs=PartitionSpec("data"),
            out_specs=PartitionSpec("data"),
        )
        got = np.asarray(jax.jit(sharded)(xs))
    np.testing.assert_allclose(got, want, rtol=1e-11)
