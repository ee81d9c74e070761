r"""Variational Monte Carlo (Chapter 5): local energies, Metropolis walkers, and the
energy with its parameter gradient, on one device or sharded over a mesh.

The system: ``n`` electrons in a harmonic trap of frequency :math:`\omega` that repel
each other by Coulomb's law, in atomic units (:math:`\hbar = m = e = 1`),

.. math::
   H = -\tfrac12\sum_i \nabla_{r_i}^2 + \tfrac12\omega^2\sum_i |r_i|^2
       + \sum_{i<j} \frac1{|r_i-r_j|}.

A trial wavefunction is given as :math:`\log|\psi_\theta|`. Its local energy
:math:`E_L = H\psi/\psi` is, written with :math:`\log|\psi|` so that
:math:`\psi` itself is never formed,

.. math::
   E_L(x) = -\tfrac12\big(\Delta\log|\psi| + |\nabla\log|\psi||^2\big) + V(x),

and the variational energy :math:`E(\theta) = \langle\psi|H|\psi\rangle /
\langle\psi|\psi\rangle = \mathbb{E}_{x\sim|\psi|^2}[E_L(x)]` is estimated by the
mean of :math:`E_L` over walkers :math:`x_1..x_B` drawn from :math:`|\psi|^2`
(:func:`sample_walkers`). Its gradient is, by default (``estimator="vmc"``), the VMC
estimator :math:`\frac2B\sum_b (E_L(x_b)-\bar E)\nabla_\theta\log|\psi(x_b)|`
(no derivative of the Laplacian needed). Subtracting :math:`\bar E` is part of
that gradient, not a free baseline: for an unnormalised :math:`\psi`,
:math:`\mathbb{E}_{|\psi|^2/Z}[\nabla_\theta\log|\psi|] = \tfrac12\nabla_\theta
\log Z`, so subtracting another constant :math:`c` adds
:math:`(E-c)\nabla_\theta\log Z` (Chapter 5, section 5.7). ``estimator="direct"`` returns instead the
gradient of the batch mean of :math:`E_L` (differentiating through the Laplacian): a
different quantity, right for a fixed set of points, not for the variational energy.

The wavefunction contract
-------------------------
* ``log_psi(params, positions)`` takes a pytree ``params`` and one configuration
  ``positions`` of shape ``(n, 3)`` (electron ``i`` at ``positions[i]``) and returns
  the real scalar :math:`\log|\psi|`; it must be a JAX-traceable pure function. The
  functions here batch over walkers themselves (``jax.vmap``); ``log_psi`` never sees
  the batch axis. :func:`beyondgrad.wavefunctions.mlp_log_psi` is one.
* ``walkers`` are ``(B, n, 3)`` floating-point arrays; ``params`` are floating-point
  wherever a gradient is taken. Sizes are checked before any computation (``log_psi``
  is traced abstractly on one walker), and a mismatch (walkers of 3 electrons,
  parameters made for 4) is reported with both sizes: the walkers' electron count and,
  for any ``log_psi``, the shapes of the parameters' arrays (``mlp_log_psi`` names the
  electron count the parameters were made for).
* Keys are JAX PRNG keys. With ``method="hutchinson"`` walker ``b`` of the (global)
  batch gets the probes of ``fold_in(key, b)`` (:func:`walker_keys`), so the noise
  averages over the batch and a sharded run draws the probes of the single-device run.
* Compiled programs are cached per ``(log_psi, settings)``: calling a driver again with
  the same function and settings reuses the program (``jax.jit`` then retraces only for
  new shapes or dtypes). The cache holds the function weakly and drops the programs when
  it is garbage-collected; a bound method ``model.log_psi``, a new object at each
  attribute access, is keyed on its ``(__func__, __self__)`` pair, so it compiles once
  too.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Hashable
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from beyondgrad import _checks
from beyondgrad.laplacian import Method, check_key, check_method, kinetic_energy
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

#: The gradient estimators of :func:`energy_and_grad`, ``"vmc"`` (the covariance
#: form :math:`\frac2B\sum_b (E_L(x_b)-\bar E)\nabla_\theta\log|\psi(x_b)|`), and
#: ``"direct"`` (:math:`\nabla_\theta \frac1B\sum_b E_L(x_b)`).
Estimator = Literal["vmc", "direct"]


def potential_energy(positions: jax.Array, *, omega: float = 1.0) -> jax.Array:
    """The potential :math:`\\tfrac12\\omega^2\\sum_i|r_i|^2 + \\sum_{i<j}1/|r_i-r_j|`.

    Args:
        positions: ``(n, 3)`` floating-point electron positions.
        omega: the trap frequency, a Python number.

    Returns:
        A scalar of ``positions``' dtype.

    Raises:
        ValueError: ``positions`` is not ``(n, 3)``.
        TypeError: ``positions`` is not floating-point; ``omega`` is not a number.
    """
    positions = check_positions(positions)
    omega = _check_omega(omega)
    n = positions.shape[0]
    trap = 0.5 * omega**2 * jnp.sum(positions * positions)
    diff = positions[:, None, :] - positions[None, :, :]
    eye = jnp.eye(n, dtype=positions.dtype)
    # + eye: no sqrt(0) on the diagonal (masked out by `upper`)
    dist = jnp.sqrt(jnp.sum(diff * diff, axis=-1) + eye)
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
    """:math:`E_L = -\\tfrac12(\\Delta\\log|\\psi|+|\\nabla\\log|\\psi||^2) + V` at one configuration.

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar`` (module contract).
        params: its parameters.
        positions: ``(n, 3)`` floating-point positions.
        method: the Laplacian method (:data:`beyondgrad.laplacian.METHODS`);
            ``"forward"`` runs with ``particles=n`` (each electron's 3 coordinates
            one particle: exact, and cheaper where features depend on few electrons).
        key: the PRNG key of ``method="hutchinson"`` (required there, refused with
            the other methods).
        omega: the trap frequency.

    Returns:
        The local energy, a scalar.

    Raises:
        ValueError: bad shapes (``positions`` not ``(n, 3)``, ``log_psi`` not scalar,
            parameters made for another number of electrons when ``log_psi`` checks
            them), an unknown method, a key missing or given to the wrong method.
        TypeError: ``log_psi`` not callable, integer positions, a bad key or omega.
    """
    check_log_psi(log_psi)
    positions = check_positions(positions)
    omega = _check_omega(omega)
    check_method(method)
    _check_wavefunction(log_psi, params, positions)

    def fn(x: jax.Array) -> jax.Array:
        return log_psi(params, x)

    if method == "forward" and key is None:
        # the forward Laplacian tracks which electron each intermediate depends on
        # (per-electron and pair features keep 3 or 6 Jacobian rows, not 3n)
        kin = kinetic_energy(fn, positions, method=method, particles=positions.shape[0])
    else:
        kin = kinetic_energy(fn, positions, method=method, key=key)
    return kin + potential_energy(positions, omega=omega)


def _check_wavefunction(
    log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    positions: jax.Array,
) -> None:
    """Evaluate ``log_psi`` abstractly on one configuration: it must give a real scalar.

    Traces ``log_psi`` once (no FLOPs). A shape or type error raised while tracing
    (e.g. parameters made for 4 electrons and walkers of 3: JAX's own message from
    deep inside ``log_psi``) is raised again, of the same type, naming both sizes: the
    walkers' configuration shape and the shapes of the parameters' arrays. Errors that
    already name the electron counts (those of
    :func:`~beyondgrad.wavefunctions.mlp_log_psi`) propagate unchanged.
    """
    x = jax.ShapeDtypeStruct(positions.shape, positions.dtype)
    try:
        out = jax.eval_shape(log_psi, params, x)
    except (ValueError, TypeError) as e:
        if "electrons" in str(e):
            raise
        shapes = jax.tree.map(lambda a: tuple(jnp.shape(a)), params)
        first = str(e).splitlines()[0] if str(e) else ""
        raise type(e)(
            f"log_psi(params, positions) failed on one walker of shape "
            f"{tuple(positions.shape)} ({positions.shape[0]} electrons) with "
            f"parameters of shapes {shapes}: {type(e).__name__}: {first} -- were the "
            f"parameters made for another number of electrons than the walkers' "
            f"{positions.shape[0]}?"
        ) from e
    shape = getattr(out, "shape", None)
    if shape != ():
        got = shape if shape is not None else type(out).__name__
        raise ValueError(
            f"log_psi(params, positions) must return the scalar log|psi| of one "
            f"configuration of shape {tuple(positions.shape)}, got {got}; the VMC "
            "functions batch over walkers themselves"
        )
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(
            f"log_psi must return a real floating-point log|psi|, got dtype {out.dtype}"
            " (for a complex wavefunction return log|psi|, e.g. with jnp.abs)"
        )


# ---------------------------------------------------------------------------------------
# Compiled steps per user function, without keeping the function alive


class _CompiledPerFunction:
    """``jax.jit`` programs built for a user's function, dropped when the function is.

    A ``functools.lru_cache`` keyed on the function would keep it (and everything it
    closes over, e.g. parameters) and its compiled programs alive, and fails on callables
    that define ``__eq__`` without ``__hash__``. Here the key is the function's identity,
    held through a weak reference, plus hashable settings; the cached program reaches
    the function only through that weak reference.

    A bound method (``model.log_psi``) is a new object at every attribute access, so
    its own identity would miss the cache on every call. It is keyed on the identities
    of its function and its instance, ``(__func__, __self__)``, and held by a
    ``weakref.WeakMethod``: the entry goes when the instance (or the function) does.
    A function that cannot be weakly referenced is compiled for the call and not cached.
    """

    def __init__(self) -> None:
        self._entries: dict[
            Hashable, tuple[Callable[[], Callable | None], dict[Hashable, Callable]]
        ] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def programs(self, fn: Callable) -> dict[Hashable, Callable]:
        """The programs cached for ``fn`` (empty if none): a view for tests."""
        entry = self._entries.get(self._key(fn))
        return {} if entry is None or not self._alive(entry[0], fn) else entry[1]

    @staticmethod
    def _key(fn: Callable) -> Hashable:
        if inspect.ismethod(fn):
            return ("method", id(fn.__func__), id(fn.__self__))
        return ("function", id(fn))

    @staticmethod
    def _alive(ref: Callable[[], Callable | None], fn: Callable) -> bool:
        """Whether ``ref`` still points at ``fn`` (for a method: the same pair)."""
        target = ref()
        if inspect.ismethod(fn):
            return (
                inspect.ismethod(target)
                and target.__func__ is fn.__func__
                and target.__self__ is fn.__self__
            )
        return target is fn

    def get(
        self,
        fn: Callable,
        settings: Hashable,
        build: Callable[[Callable[[], Callable]], Callable],
    ) -> Callable:
        """The program ``build(get_fn)`` for ``(fn, settings)``; ``get_fn()`` returns ``fn``."""
        key = self._key(fn)
        entry = self._entries.get(key)
        if entry is None or not self._alive(entry[0], fn):

            def forget(dead: object, key: Hashable = key) -> None:
                current = self._entries.get(key)
                if current is not None and current[0] is dead:
                    del self._entries[key]

            ref: Callable[[], Callable | None]
            try:
                if inspect.ismethod(fn):
                    ref = weakref.WeakMethod(fn, forget)
                else:
                    ref = weakref.ref(fn, forget)
            except TypeError:  # not weakly referenceable: no caching
                return build(lambda: fn)
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


def check_log_psi(log_psi: object) -> None:
    """``TypeError`` unless ``log_psi`` is callable (``vmc`` and ``sharded_vmc`` check
    their ``log_psi`` here).

    Args:
        log_psi: the argument, a function ``log_psi(params, positions) -> scalar``.
    """
    _checks.function(
        log_psi,
        "log_psi",
        "a function log_psi(params, positions (n, 3)) -> scalar",
        example="wavefunctions.mlp_log_psi",
    )


def check_walkers(walkers: object) -> jax.Array:
    """``walkers`` as an array of shape ``(batch, n, 3)``, ``batch, n >= 1``
    (``ValueError`` otherwise) and floating-point (``TypeError`` otherwise).

    Args:
        walkers: the argument, one ``(n, 3)`` configuration per walker.

    Returns:
        ``walkers`` as a ``jax.Array``.
    """
    walkers = walkers if isinstance(walkers, jax.Array) else jnp.asarray(walkers)
    if walkers.ndim != 3 or walkers.shape[2] != 3:
        raise ValueError(
            f"walkers must have shape (batch, n, 3), got {walkers.shape} (one "
            "configuration of shape (n, 3)? add a batch axis: walkers[None])"
        )
    if walkers.shape[0] < 1 or walkers.shape[1] < 1:
        raise ValueError(
            f"walkers must hold at least one walker of at least one electron, got "
            f"shape {walkers.shape}"
        )
    if not jnp.issubdtype(walkers.dtype, jnp.floating):
        raise TypeError(
            f"walkers must be a floating-point array, got dtype {walkers.dtype} "
            "(cast with walkers.astype(jnp.float32))"
        )
    return walkers


def _check_params(params: Params) -> None:
    """Every leaf of ``params`` must be floating-point (a gradient is taken)."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    if not leaves:
        raise ValueError(
            "params has no arrays: pass the wavefunction's parameters, e.g. "
            "wavefunctions.init_params(key, n)"
        )
    _checks.float_leaves(
        params,
        "params",
        why="they are differentiated",
        fix="cast with .astype(jnp.float32), or make them with jnp.float32 values",
    )


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
    :math:`\xi`, :math:`\sigma` = ``step_size``, symmetric) and accepts it with
    probability :math:`\min\big(1, |\psi(x')|^2/|\psi(x)|^2\big) =
    \min\big(1, e^{2(\log|\psi(x')| - \log|\psi(x)|)}\big)`, so :math:`|\psi|^2` is
    the chain's stationary distribution. This is where VMC evaluates local energies:
    walkers from :math:`|\psi|^2` rarely sit near a node, unlike arbitrary points.

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar`` (module contract).
        params: its parameters.
        walkers: ``(B, n, 3)`` floating-point starting positions.
        key: a PRNG key (``jax.random.key(0)``).
        steps: the number of Metropolis steps, a positive int.
        step_size: the proposal's standard deviation :math:`\sigma > 0`.

    Returns:
        ``(walkers (B, n, 3), acceptance rate ())``, the rate averaged over steps and
        walkers.

    Raises:
        TypeError: ``log_psi`` not callable, ``key`` not a PRNG key, integer walkers.
        ValueError: walkers not ``(B, n, 3)``, ``steps`` or ``step_size`` not
            positive, ``log_psi`` not scalar on one walker, or parameters made for
            another number of electrons (when ``log_psi`` checks them).
    """
    check_log_psi(log_psi)
    walkers = check_walkers(walkers)
    check_key(key)
    _check_positive_int(steps, "steps", "the number of Metropolis steps")
    _checks.number(
        step_size, "step_size", above=0, meaning="a proposal standard deviation"
    )
    chain = _PROGRAMS.get(
        log_psi, ("metropolis", steps), functools.partial(_metropolis, steps=steps)
    )
    return chain(params, walkers, key, jnp.asarray(step_size, walkers.dtype))


def metropolis_step(
    batch_log_psi: Callable[[Params, jax.Array], jax.Array],
    params: Params,
    sigma: jax.Array | float,
) -> Callable[[tuple, jax.Array], tuple[tuple, None]]:
    """One Metropolis move of every walker, as a ``lax.scan`` step.

    A Gaussian proposal :math:`x' = x + \\sigma\\,\\xi` is accepted with probability
    :math:`\\min(1, |\\psi(x')|^2/|\\psi(x)|^2)`. The carry is ``(walkers (B, n, 3),
    log|psi| (B,), summed acceptance rate)``; the step's input is a PRNG key.

    Args:
        batch_log_psi: ``log|psi|`` of a batch, ``(params, (B, n, 3)) -> (B,)``.
        params: its parameters.
        sigma: the proposal's standard deviation.

    Returns:
        ``step(carry, key) -> (carry, None)``.
    """

    def step(carry: tuple, k: jax.Array) -> tuple[tuple, None]:
        x, logp, accepted = carry
        k_move, k_accept = jax.random.split(k)
        proposal = x + sigma * jax.random.normal(k_move, x.shape, x.dtype)
        logp_new = batch_log_psi(params, proposal)
        u = jax.random.uniform(k_accept, logp.shape, x.dtype)
        ok = jnp.log(u) < 2.0 * (logp_new - logp)
        x = jnp.where(ok[:, None, None], proposal, x)
        logp = jnp.where(ok, logp_new, logp)
        return (x, logp, accepted + jnp.mean(ok.astype(x.dtype))), None

    return step


def _metropolis(get_log_psi: Callable[[], Callable], *, steps: int) -> Callable:
    def chain(
        params: Params, walkers: jax.Array, key: jax.Array, sigma: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        log_psi = get_log_psi()
        _check_wavefunction(log_psi, params, walkers[0])  # at trace time only
        batch_log_psi = jax.vmap(log_psi, in_axes=(None, 0))
        step = metropolis_step(batch_log_psi, params, sigma)
        init = (walkers, batch_log_psi(params, walkers), jnp.zeros((), walkers.dtype))
        (x, _, accepted), _ = jax.lax.scan(step, init, jax.random.split(key, steps))
        return x, accepted / steps

    return jax.jit(chain)


def _check_estimator(estimator: object) -> None:
    if not isinstance(estimator, str) or estimator not in ("vmc", "direct"):
        raise ValueError(f"estimator must be 'vmc' or 'direct', got {estimator!r}")


def _check_omega(omega: object) -> float:
    return _checks.number(omega, "omega", meaning="the trap frequency")


def walker_keys(key: jax.Array, count: int, *, first: jax.Array | int = 0) -> jax.Array:
    """One PRNG key per walker: ``fold_in(key, first + b)`` for ``b = 0 .. count - 1``.

    ``first`` is the global index of this batch's first walker (``axis_index * count``
    inside ``shard_map``), so every walker on every shard gets its own probes and a
    sharded run draws exactly the probes of the single-device run.

    Args:
        key: a PRNG key (``jax.random.key(0)``), concrete or traced.
        count: the number of walkers in this batch, a positive int.
        first: the global index of the batch's first walker (an int or a traced int).

    Returns:
        ``count`` keys, shaped like ``key`` with a leading ``count`` axis.

    Raises:
        TypeError: ``key`` is not a PRNG key.
        ValueError: ``count`` is not a positive int.
    """
    check_key(key)
    _check_positive_int(count, "count", "the number of walkers")
    return jax.vmap(lambda b: jax.random.fold_in(key, b))(first + jnp.arange(count))


def _check_positive_int(value: object, name: str, meaning: str) -> int:
    return _checks.integer(value, name, minimum=1, meaning=meaning)


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
        _check_wavefunction(get_log_psi(), params, walkers[0])  # at trace time only
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
    log_psi: object,
    params: Params,
    walkers: object,
    method: str,
    estimator: str,
    key: object,
) -> jax.Array:
    """The checks shared by :func:`energy_and_grad` and :func:`sharded_energy_and_grad`."""
    check_log_psi(log_psi)
    check_method(method)
    _check_estimator(estimator)
    if method == "hutchinson":
        if key is None:
            raise ValueError(
                "method='hutchinson' needs a PRNG key: pass key=jax.random.key(0)"
            )
        check_key(key)
    elif key is not None:
        _checks.ignored_option("key", key, "hutchinson", method)
    _check_params(params)
    return check_walkers(walkers)


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
    """Mean local energy over ``walkers`` and its parameter gradient, on one device.

    ``estimator="vmc"`` (default) returns
    :math:`\\frac2B\\sum_b (E_L(x_b)-\\bar E)\\nabla_\\theta\\log|\\psi(x_b)|`;
    ``"direct"`` returns :math:`\\nabla_\\theta \\frac1B\\sum_b E_L(x_b)`. ``method``
    picks the Laplacian; ``"hutchinson"`` needs ``key`` and gives walker ``b`` the
    probes of ``fold_in(key, b)`` (:func:`walker_keys`), so the noise averages over the
    batch. The step is compiled once per ``(log_psi, method, estimator, omega)`` (and
    per shape and dtype), bound methods included (module docstring).

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar`` (module contract).
        params: its parameters, a pytree of floating-point arrays.
        walkers: ``(B, n, 3)`` floating-point positions, ``B >= 1``.
        method: the Laplacian method (:data:`beyondgrad.laplacian.METHODS`).
        estimator: ``"vmc"`` or ``"direct"``.
        key: the PRNG key of ``method="hutchinson"`` (refused with other methods).
        omega: the trap frequency, a Python number.

    Returns:
        ``(mean local energy (), gradient)``, the gradient shaped like ``params``.

    Raises:
        ValueError: walkers not ``(B, n, 3)``; an unknown method or estimator; a key
            missing or given to another method; ``log_psi`` not scalar on one walker;
            parameters made for another number of electrons (when ``log_psi`` checks
            them, as :func:`~beyondgrad.wavefunctions.mlp_log_psi` does).
        TypeError: ``log_psi`` not callable; integer walkers or parameters; a bad key
            or omega.
    """
    walkers = _check_step_input(log_psi, params, walkers, method, estimator, key)
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
    be the Chapter 4 device-count bug.

    ``mesh`` may come from ``jax.make_mesh`` with its default axis types (Explicit on
    new JAX, Auto on 0.8) or from :func:`beyondgrad.runtime.demo_mesh`; ``params`` and
    ``walkers`` may be plain (unsharded) arrays: they are placed on the mesh with
    ``jax.device_put`` first (a no-op for arrays already laid out that way). With
    ``method="hutchinson"`` walker ``b`` of the global batch gets ``fold_in(key, b)``
    (shard ``s`` starts at ``b = s * local batch``, from ``lax.axis_index``): the same
    probes as :func:`energy_and_grad` on one device.

    Args:
        log_psi: ``log_psi(params, positions (n, 3)) -> scalar`` (module contract),
            as for :func:`energy_and_grad`.
        params: its parameters, a pytree of floating-point arrays; replicated
            (``P()``) over the mesh.
        walkers: ``(B, n, 3)`` floating-point positions, ``B >= 1`` and divisible by
            the size of the mesh axis ``axis_name``; split over that axis.
        mesh: a ``jax.sharding.Mesh`` that has the axis ``axis_name``.
        axis_name: the mesh axis the walkers are split over, a str; ``"data"`` by
            default.
        method: the Laplacian method (:data:`beyondgrad.laplacian.METHODS`);
            ``"loop"`` by default.
        estimator: ``"vmc"`` (the default) or ``"direct"``, as for
            :func:`energy_and_grad`.
        key: the PRNG key of ``method="hutchinson"`` (refused with other methods).
        omega: the trap frequency, a Python number; 1.0 by default.

    Returns:
        ``(mean local energy (), gradient)``, invariant (replicated) over the mesh.

    Raises:
        ValueError: as :func:`energy_and_grad`; ``axis_name`` not an axis of ``mesh``;
            the number of walkers not divisible by that axis' size.
        TypeError: as :func:`energy_and_grad`; ``mesh`` not a ``Mesh``.
    """
    walkers = _check_step_input(log_psi, params, walkers, method, estimator, key)
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}; make one "
            "with jax.make_mesh((jax.device_count(),), ('data',)) or "
            "runtime.demo_mesh()"
        )
    if not isinstance(axis_name, str) or axis_name not in mesh.axis_names:
        raise ValueError(
            f"axis_name {axis_name!r} is not an axis of the mesh "
            f"{tuple(mesh.axis_names)}"
        )
    size = mesh.shape[axis_name]
    if walkers.shape[0] % size:
        raise ValueError(
            f"the number of walkers ({walkers.shape[0]}) must be divisible by the "
            f"size of mesh axis {axis_name!r} ({size})"
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
