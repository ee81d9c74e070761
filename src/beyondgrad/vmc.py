"""Variational Monte Carlo for a wavefunction ``log_psi(params, positions)``: local
energies, Metropolis walkers, and the energy and its parameter gradient (Chapter 5).

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
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad.laplacian import Method, _check_method, kinetic_energy
from beyondgrad.slater import check_positions
from beyondgrad.wavefunctions import Params

__all__ = [
    "Estimator",
    "energy_and_grad",
    "local_energy",
    "potential_energy",
    "sample_walkers",
    "sharded_energy_and_grad",
    "walker_keys",
]

Estimator = Literal["vmc", "direct"]


def potential_energy(positions: jax.Array, *, omega: float = 1.0) -> jax.Array:
    """:math:`\\tfrac12\\omega^2\\sum_i|r_i|^2 + \\sum_{i<j}1/|r_i-r_j|` for ``(n, 3)`` positions."""
    positions = check_positions(positions)
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
    positions = check_positions(positions)
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
            f"{type(log_psi).__name__} (e.g. pass wavefunctions.mlp_log_psi)"
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
