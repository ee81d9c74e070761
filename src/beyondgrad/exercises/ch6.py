"""Chapter 6's exercise checkers (a sharded VMC step).

* :func:`check_clip` (6.1): a ``shard_map`` body over ``"data"`` that clips local
  energies to the median +- :data:`CLIP_SCALE` mean absolute deviations over all
  walkers, compared with NumPy in float64 at sizes and values drawn for each check.
* :func:`check_per_walker_grads` (6.2): a ``shard_map`` body returning one gradient
  of :func:`toy_log_psi` per point with respect to replicated parameters, compared
  with ``vmap(grad)`` on one device in float64, at drawn sizes.

Each returns a :class:`~beyondgrad.exercises.Feedback`; a bare stub is reported as not
attempted, and ``strict=True`` raises :class:`~beyondgrad.exercises.ExerciseFailed`
for a wrong or missing answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beyondgrad import _checks
from beyondgrad import exercises as ex

__all__ = [
    "CASES",
    "CLIP_SCALE",
    "DEVICES",
    "MESH_AXIS",
    "TOL",
    "check_clip",
    "check_per_walker_grads",
    "toy_log_psi",
]

#: The mesh axis and its size.
MESH_AXIS = "data"
#: The number of devices on the mesh axis.
DEVICES = 8
#: Exercise 6.1: the clipping window's half-width in mean absolute deviations.
CLIP_SCALE = 3.0
#: Cases per check; walkers per device are drawn from 2..7 and the hidden width of
#: 6.2 from 2..6 (distinct sizes within one check), so no size can be hard-coded.
CASES = 3
# Relative accuracy required, float64: ``|got - want| <= TOL * max|want|``, for both
# exercises. Error count (u = 2**-53), for each of the two computations compared:
# 6.1: the median is an entry (exact) or the mean of two (1 rounding); the MAD is a
# mean of N <= 56 terms |e - median| of one sign, off by <= (N + 2) u MAD whatever
# the summation order (pmean of per-device means included); the window's ends
# median +- 3 MAD then by <= (N + 4) u (|median| + 3 MAD) <= (N + 4) u max|want|, and
# a clipped energy is an end, an unclipped one exact: <= 60 u each, 120 u = 1.3e-14
# between two right answers. 6.2: an entry x_k (1 - tanh(z_h)^2), z = x W (3 terms,
# off by 3 u sum|x_k W_kh|, about 10 for Gaussian x and W), tanh (2 u) and 1 - t^2
# (2 u), so |x_k| (4 + 2 (3 sum|x W| + 2)) u, about 4 x 68 u, against a largest
# entry of 1 or more (some walker has |z| small and |x_k| ~ 2): ~270 u each, 540 u =
# 6e-14 between two. TOL is 16x the larger bound; answers with a slip (a per-device
# median, a standard deviation for the MAD, a scale of 2, a gradient summed over the
# devices) are off by more than 1e-3. The book's solutions measured below 1e-15.
#: The tolerance of the check (derived in the comment above).
TOL = 1e-12


def toy_log_psi(w: jax.Array, x: jax.Array) -> jax.Array:
    """A small scalar model of a point ``x`` ``(3,)`` with parameters ``w`` ``(3, H)``:
    :math:`\\sum_h \\tanh((x W)_h) - \\tfrac12|x|^2`."""
    return jnp.sum(jnp.tanh(x @ w)) - 0.5 * jnp.sum(x * x)


def _seed(seed: int | None) -> int:
    given = _checks.seed(seed)
    return int(np.random.default_rng().integers(2**31)) if given is None else given


def _sizes(seed: int, low: int, high: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(v) for v in rng.choice(np.arange(low, high + 1), CASES, False)]


def _shard(fn: Callable, in_specs: Any, out_specs: Any) -> Callable:
    from jax.sharding import PartitionSpec as P  # noqa: F401

    from beyondgrad import runtime

    mesh = runtime.demo_mesh(DEVICES, MESH_AXIS)
    return jax.jit(
        jax.shard_map(
            fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=True
        )
    )


def _rel(got: Any, want: np.ndarray) -> float | None:
    """``max|got - want| / max|want|`` (the checks' measure), or None when ``got`` is
    not an array of ``want``'s shape."""
    try:
        got = np.asarray(got, np.float64)
    except (TypeError, ValueError):
        return None
    if got.shape != want.shape:
        return None
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300))


def _near(got: Any, want: np.ndarray, rtol: float = 1e-9) -> bool:
    """Whether ``got`` is ``want`` up to rounding: how a slip is recognised (a slip
    moves the answer by far more than 1e-9, see :data:`TOL`'s comment)."""
    r = _rel(got, want)
    return r is not None and r <= rtol


def _worst(got: Any, want: np.ndarray, per_device: int, what: str) -> str:
    """Where ``got`` is furthest from ``want`` (the first axis counts walkers), what it
    holds there and what was expected, and how far off that is in the checks'
    measure: ``|got - want| / max|want|`` against :data:`TOL`."""
    g = np.asarray(got, np.float64)
    err = np.abs(g - want)
    i = np.unravel_index(int(np.argmax(err)), err.shape)
    walker = int(i[0])
    rest = f", entry {tuple(int(k) for k in i[1:])}" if len(i) > 1 else ""
    largest = float(np.max(np.abs(want)))
    return (
        f"{what} {walker} (device {walker // per_device}, local index "
        f"{walker % per_device}){rest}: got {g[i]:.17g}, expected {want[i]:.17g}; off "
        f"by {float(err[i]) / max(largest, 1e-300):.2e} of the largest |expected| "
        f"{largest:.3g} (allowed {TOL:g})"
    )


def _float32_slip(got: Any) -> str | None:
    """A first line for a float32 answer (the checks run in float64), or None."""
    if getattr(got, "dtype", None) != np.float32:
        return None
    return (
        "your result is float32: the checker runs in float64 (its inputs are "
        "float64), and float32 rounding (1e-7) cannot reach the tolerance; compute "
        "in the input's dtype (no .astype(jnp.float32), no float32 constants)"
    )


def _clip_reference(e: np.ndarray, median: float, mad: float) -> np.ndarray:
    return np.clip(e, median - CLIP_SCALE * mad, median + CLIP_SCALE * mad)


#: The window the chapter's ``clip`` uses by default (Section 6.4): a copy of its
#: cell that keeps ``scale=2.0`` clips to 2 deviations, not :data:`CLIP_SCALE`.
_CHAPTER_SCALE = 2.0


def _clip_slip(got: Any, e: np.ndarray, per_device: int) -> str | None:
    """The likely slip that gives ``got`` for energies ``e`` (one window of
    median/mean, over all walkers or per device, or the mean of per-device medians, MAD over all walkers or per device,
    or the standard deviation, at :data:`CLIP_SCALE` or the chapter's default), in
    words, or None when ``got`` is none of them, or clips nothing (a slip that clips
    nothing at this size is told apart at another)."""
    if _near(got, e, TOL):
        return None
    blocks = e.reshape(DEVICES, per_device)
    centres = {
        "median": np.full_like(blocks, np.median(e)),
        "local median": np.broadcast_to(
            np.median(blocks, axis=1, keepdims=True), blocks.shape
        ),
        # before "mean": with 1 or 2 walkers per device the two are the same number
        "mean of local medians": np.full_like(
            blocks, np.mean(np.median(blocks, axis=1))
        ),
        "mean": np.full_like(blocks, np.mean(e)),
    }
    words = {
        "local median": (
            "you used each device's own median: the median is over all walkers "
            "(lax.all_gather(e_l, 'data', tiled=True) first)"
        ),
        "mean of local medians": (
            "the window is centred on the mean of the devices' own medians (with 1 or "
            "2 walkers per device, that is also the mean): the median is over all "
            "walkers (lax.all_gather(e_l, 'data', tiled=True), then jnp.median)"
        ),
        "mean": "the window is centred on the mean: centre it on the median",
        "local mad": (
            "the MAD is each device's own: average |e - median| over all walkers "
            "(lax.pmean of the per-device mean over 'data')"
        ),
        "std": (
            "the half-width uses the standard deviation: use the mean absolute "
            "deviation from the median"
        ),
    }
    for centre_name, centre in centres.items():
        dev = np.abs(blocks - centre)
        spreads = {
            "mad": np.full_like(blocks, np.mean(dev)),
            "local mad": np.broadcast_to(
                np.mean(dev, axis=1, keepdims=True), blocks.shape
            ),
            "std": np.full_like(blocks, np.std(e)),
        }
        for spread_name, spread in spreads.items():
            for scale in (CLIP_SCALE, _CHAPTER_SCALE):
                if (centre_name, spread_name, scale) == ("median", "mad", CLIP_SCALE):
                    continue  # the right answer
                half = scale * spread
                candidate = np.clip(blocks, centre - half, centre + half).reshape(-1)
                if not _near(got, candidate):
                    continue
                said = [words[n] for n in (centre_name, spread_name) if n in words]
                if scale != CLIP_SCALE:
                    said.append(
                        f"the window is {scale:g} deviations wide on each side (the "
                        f"chapter's default scale); the exercise asks for "
                        f"{CLIP_SCALE:g}: half = {CLIP_SCALE:g} * mad"
                    )
                return "; and ".join(said)
    return None


@ex.timed_check("Exercise 6.1 (clip across devices)", ex.CHECK_LIMIT)
def check_clip(
    fn: Callable[[jax.Array], jax.Array], strict: bool = False, seed: int | None = None
) -> ex.Feedback:
    """Exercise 6.1: ``fn(e_l)`` inside ``shard_map`` (``P("data")`` in and out)
    clips to the global median +- :data:`CLIP_SCALE` global mean absolute deviations.

    :data:`CASES` cases; walkers per device drawn from 2..7 and energies from a
    heavy-tailed (Student t, 2 degrees of freedom) distribution around a drawn centre,
    from ``seed`` (fresh when ``None``; the messages name a seed only when given). An
    answer passes when ``max|got - want| <= TOL * max|want|`` in every case. A wrong
    one gets first the slip it shows in any case, where one is recognised
    (:func:`_clip_slip`), then, for the first case it fails, the walker furthest off
    with the value got and the one expected.
    """
    from jax.sharding import PartitionSpec as P

    name = "Exercise 6.1 (clip across devices)"
    msg = ex.require_callable(fn, "my_clip")
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    asked = seed is not None  # a seed is named only to a student who chose one
    seed = _seed(seed)
    drawn = f"seed={seed}" if asked else "a fresh draw at every check"
    step = _shard(fn, P(MESH_AXIS), P(MESH_AXIS))
    rng = np.random.default_rng(seed + 1)
    problems: list[str] = []
    wrong: list[tuple[str, Any, np.ndarray, np.ndarray, int]] = []
    for per_device in _sizes(seed, 2, 7):
        n = per_device * DEVICES
        e = rng.uniform(-5, 5) + rng.standard_t(2, n)
        with jax.enable_x64(True):
            got = ex.call_answer(step, jnp.asarray(e), what="my_clip inside shard_map")
        if ex.is_stub(got):
            return ex.verdict(name, [], attempted=False, strict=strict)
        failure = ex.failed(got)
        case = f"{per_device} walkers per device ({n} in all)"
        if failure:
            problems.append(f"{case}: {failure}")
            break
        median = float(np.median(e))
        want = _clip_reference(e, median, float(np.mean(np.abs(e - median))))
        r = _rel(got, want)
        if r is None:
            problems.append(
                f"{case}: return one clipped energy per walker, shape ({per_device},) "
                f"on each device ({n},) in all; got {np.shape(got)}"
            )
            break
        if r > TOL:  # every case is tried: a slip may show in one size only
            wrong.append((case, got, e, want, per_device))
    if wrong and not problems:
        # the first slip recognised in any case (with 2 walkers per device a
        # per-device window may clip nothing, and look like no clipping at all)
        slips = [_float32_slip(wrong[0][1])]
        slips += [_clip_slip(got, e, k) for _, got, e, _, k in wrong]
        slip = next((s for s in slips if s), None)
        if slip is None and all(_near(got, e, TOL) for _, got, e, _, _ in wrong):
            slip = (
                "nothing was clipped in the cases that fail, where the right window "
                "clips: your window is missing, or too wide there (a MAD of each "
                "device's own: the device holding an outlier gets a wider window); "
                f"clip every energy to median +- {CLIP_SCALE:g} x MAD, both over all "
                "walkers (jnp.clip(e_l, median - half, median + half))"
            )
        case, got, _, want, per_device = wrong[0]
        problems = [
            *([slip] if slip else []),
            f"{case}: {_worst(got, want, per_device, 'walker')}",
        ]
    if problems:
        problems.append(f"(cases drawn with {drawn})")
    return ex.verdict(
        name,
        problems,
        success=f"matches NumPy in float64 (relative error <= {TOL:g}) on {CASES} "
        f"drawn cases ({drawn})",
        strict=strict,
    )


def _grads_slip(got: Any, want: np.ndarray, per_device: int) -> str | None:
    """The likely slip that gives ``got`` instead of the per-point gradients ``want``
    (``(N, 3, H)``), in words, or None when ``got`` is none of them."""
    hidden = want.shape[2]
    blocks = want.reshape(DEVICES, per_device, 3, hidden)
    summed = np.tile(blocks.sum(axis=0), (DEVICES, 1, 1))
    if _near(got, summed):
        return (
            "each gradient is the sum over devices of the gradients at its local "
            "index: w is invariant, so its cotangent is summed over devices; cast "
            "w to varying first (compat.pcast_varying(w, 'data')); if you did, a "
            "psum over 'data' adds the devices' gradients: drop it"
        )
    if _near(got, summed / DEVICES):
        return (
            "each gradient is the mean over devices of the gradients at its local "
            "index: no pmean (or psum) belongs here; cast w to varying first "
            "(compat.pcast_varying(w, 'data')) and return one gradient per point"
        )
    if np.shape(got) == (DEVICES * 3, hidden):
        return (
            f"you returned one (3, {hidden}) gradient per device, the gradient of a "
            "sum over its points: take one gradient per point "
            "(jax.vmap(jax.grad(...), in_axes=(None, 0)))"
        )
    if hidden == 3 and _near(got, np.swapaxes(want, 1, 2)):
        return "each gradient is transposed: dlogpsi/dW has W's shape (3, H)"
    local_sum = np.repeat(blocks.sum(axis=1), per_device, axis=0)
    if _near(got, local_sum):
        return (
            "each point got the sum of its device's gradients: take one gradient "
            "per point (jax.vmap(jax.grad(...), in_axes=(None, 0)))"
        )
    return None


@ex.timed_check("Exercise 6.2 (per-walker gradients)", ex.CHECK_LIMIT)
def check_per_walker_grads(
    fn: Callable[[jax.Array, jax.Array], jax.Array],
    strict: bool = False,
    seed: int | None = None,
) -> ex.Feedback:
    """Exercise 6.2: ``fn(w, x)`` inside ``shard_map`` (``in_specs=(P(), P("data"))``,
    ``out_specs=P("data")``) returns the ``(B, 3, H)`` gradients of
    :func:`toy_log_psi` with respect to the replicated ``w``, one per point.

    :data:`CASES` cases; ``H`` drawn from 2..6 and points per device from 2..7, from
    ``seed`` (fresh when ``None``; the messages name a seed only when given).
    """
    from jax.sharding import PartitionSpec as P

    name = "Exercise 6.2 (per-walker gradients)"
    msg = ex.require_callable(fn, "my_per_walker_grads")
    if msg:
        return ex.verdict(name, [msg], strict=strict)
    asked = seed is not None  # a seed is named only to a student who chose one
    seed = _seed(seed)
    drawn = f"seed={seed}" if asked else "a fresh draw at every check"
    step = _shard(fn, (P(), P(MESH_AXIS)), P(MESH_AXIS))
    rng = np.random.default_rng(seed + 2)
    problems: list[str] = []
    per_walker = jax.jit(jax.vmap(jax.grad(toy_log_psi), in_axes=(None, 0)))
    for hidden, per_device in zip(_sizes(seed, 2, 6), _sizes(seed + 3, 2, 7)):
        n = per_device * DEVICES
        case = f"H={hidden}, {per_device} points per device"
        with jax.enable_x64(True):
            w = jnp.asarray(rng.normal(size=(3, hidden)))
            x = jnp.asarray(rng.normal(size=(n, 3)))
            got = ex.call_answer(
                step, w, x, what="my_per_walker_grads inside shard_map"
            )
            want = np.asarray(per_walker(w, x))
        if ex.is_stub(got):
            return ex.verdict(name, [], attempted=False, strict=strict)
        failure = ex.failed(got)
        if failure:
            if "TypeError" in failure:
                problems.append(
                    "w is invariant (replicated): cast it to varying first, "
                    "compat.pcast_varying(w, 'data') or lax.pcast(w, 'data', "
                    "to='varying')"
                )
            problems.append(f"{case}: {failure}")
            break
        r = _rel(got, want)
        if r is None:
            slip = _grads_slip(got, want, per_device)
            if slip:
                problems.append(slip)
            transposed = (n, hidden, 3)
            problems.append(
                f"{case}: return ({per_device}, 3, {hidden}) gradients per device "
                f"(({n}, 3, {hidden}) in all); got {np.shape(got)}"
                + (
                    ": each gradient transposed (dlogpsi/dW has W's shape (3, H))"
                    if np.shape(got) == transposed
                    else ""
                )
            )
            break
        if r <= TOL:
            continue
        slip = _float32_slip(got) or _grads_slip(got, want, per_device)
        if slip:
            problems.append(slip)
        problems.append(f"{case}: {_worst(got, want, per_device, 'point')}")
        break
    if problems:
        problems.append(f"(cases drawn with {drawn})")
    return ex.verdict(
        name,
        problems,
        success=f"matches vmap(grad) on one device in float64 (relative error <= "
        f"{TOL:g}) on {CASES} drawn cases ({drawn})",
        strict=strict,
    )
