"""Chapter 6's checkers: right answers, near misses, and bad input.

Answers are written here independently of the checkers' references, and the tests pin
what the checkers print.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from beyondgrad import compat, runtime
from beyondgrad import exercises as ex
from beyondgrad.exercises import ch6

runtime.ensure_cpu_devices(8)


def stub(*args):
    raise NotImplementedError


def clip_right(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_sorted(e_l):  # another way to the median: sort all values
    everyone = jnp.sort(lax.all_gather(e_l, "data", tiled=True))
    n = everyone.shape[0]
    median = 0.5 * (everyone[(n - 1) // 2] + everyone[n // 2])
    mad = jnp.mean(jnp.abs(everyone - median))
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_local_median(e_l):
    median = jnp.median(e_l)
    mad = jnp.mean(jnp.abs(e_l - median))
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_std(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    std = jnp.std(everyone)
    return jnp.clip(e_l, median - 3.0 * std, median + 3.0 * std)


def clip_scale_2(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = jnp.mean(jnp.abs(everyone - median))
    return jnp.clip(e_l, median - 2.0 * mad, median + 2.0 * mad)


def grads_right(w, x):
    w = compat.pcast_varying(w, "data")
    return jax.vmap(jax.grad(ch6.toy_log_psi), in_axes=(None, 0))(w, x)


def grads_by_hand(w, x):  # d/dW sum tanh(x W) = x outer (1 - tanh^2)
    t = jnp.tanh(x @ w)
    return x[:, :, None] * (1 - t * t)[:, None, :]


def grads_uncast(w, x):
    return jax.vmap(jax.grad(ch6.toy_log_psi), in_axes=(None, 0))(w, x)


def grads_flat(w, x):
    return grads_by_hand(w, x).reshape(x.shape[0], -1)


@pytest.mark.parametrize("answer", [clip_right, clip_sorted])
def test_clip_right_answers_pass(answer):
    for seed in (0, 1):
        fb = ch6.check_clip(answer, seed=seed)
        assert fb.passed, str(fb)


def test_clip_stub_and_value():
    assert not ch6.check_clip(stub).attempted
    fb = ch6.check_clip(jnp.ones(3))
    assert not fb.passed and "pass the function itself" in str(fb)


def clip_chapter_copy(e_l, scale=2.0):  # the chapter's cell, its default kept
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")
    return jnp.clip(e_l, median - scale * mad, median + scale * mad)


def clip_chapter_per_device(e_l, scale=3.0):  # the chapter's wrong cell, scale fixed
    median = jnp.median(e_l)
    mad = lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")
    return jnp.clip(e_l, median - scale * mad, median + scale * mad)


def clip_no_pmean(e_l):  # a per-device reduction: the MAD of this device only
    everyone = lax.all_gather(e_l, "data", tiled=True)
    median = jnp.median(everyone)
    mad = jnp.mean(jnp.abs(e_l - median))
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


def clip_mean_std(e_l):
    everyone = lax.all_gather(e_l, "data", tiled=True)
    mean, std = jnp.mean(everyone), jnp.std(everyone)
    return jnp.clip(e_l, mean - 3.0 * std, mean + 3.0 * std)


def clip_mean_of_medians(e_l):  # each device's median, averaged (workshop sim 9)
    median = lax.pmean(jnp.median(e_l), "data")
    mad = lax.pmean(jnp.mean(jnp.abs(e_l - median)), "data")
    return jnp.clip(e_l, median - 3.0 * mad, median + 3.0 * mad)


CLIP_SLIPS = [
    (clip_local_median, ["each device's own median", "the MAD is each device's own"]),
    (clip_chapter_per_device, ["each device's own median"]),
    (clip_no_pmean, ["the MAD is each device's own"]),
    (clip_std, ["the half-width uses the standard deviation"]),
    (clip_mean_std, ["centred on the mean", "the standard deviation"]),
    (clip_mean_of_medians, ["centred on the mean of the devices' own medians"]),
    (clip_scale_2, ["the window is 2 deviations wide", "asks for 3"]),
    (clip_chapter_copy, ["the window is 2 deviations wide"]),
    (lambda e: e, ["nothing was clipped"]),
]


@pytest.mark.parametrize(
    "answer, words", CLIP_SLIPS, ids=[f"{a.__name__}" for a, _ in CLIP_SLIPS]
)
@pytest.mark.parametrize("seed", [0, 3])
def test_clip_slips_named_first_then_where(answer, words, seed):
    """The slip comes first, in words (whatever the drawn sizes: seed 3 draws 2 walkers
    per device first, where a per-device window clips nothing); then the walker, the
    value got and the one expected, from the first case that fails."""
    fb = ch6.check_clip(answer, seed=seed)
    assert not fb.passed
    first, where = fb.messages[0], fb.messages[1]
    assert all(w in first for w in words), str(fb)
    if "nothing" not in words[0]:
        assert "nothing was clipped" not in str(fb), str(fb)
    found = re.search(
        r"walker (\d+) \(device (\d), local index (\d)\): got (\S+), expected "
        r"(\S+); off by (\S+) of the largest \|expected\| \S+ \(allowed 1e-12\)",
        where,
    )
    assert found, str(fb)
    walker, device, local = (int(found.group(k)) for k in (1, 2, 3))
    per_device = int(where.split(" walkers per device")[0])
    assert (device, local) == divmod(walker, per_device)
    # the values quoted are the walker's: the reference recomputed here with NumPy
    rng = np.random.default_rng(seed + 1)
    for k in ch6._sizes(seed, 2, 7):
        e = rng.uniform(-5, 5) + rng.standard_t(2, k * 8)
        if k == per_device:
            break
    med = np.median(e)
    mad = np.mean(np.abs(e - med))
    want = np.clip(e, med - 3 * mad, med + 3 * mad)
    assert float(found.group(5)) == pytest.approx(want[walker], rel=1e-15)
    with jax.enable_x64(True):  # as the checker runs the answer
        got = np.asarray(jax.jit(_sharded(answer))(jnp.asarray(e)))
    assert float(found.group(4)) == pytest.approx(got[walker], rel=1e-15)
    assert f"seed={seed}" in fb.messages[-1]
    with pytest.raises(ex.ExerciseFailed):
        ch6.check_clip(answer, seed=seed, strict=True)


def _sharded(body):
    mesh = runtime.demo_mesh(8, "data")
    return jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"))


def test_clip_sizes_are_drawn():
    sizes = {tuple(ch6._sizes(seed, 2, 7)) for seed in range(6)}
    assert len(sizes) > 1 and all(len(set(s)) == ch6.CASES for s in sizes)


@pytest.mark.parametrize("answer", [grads_right, grads_by_hand])
def test_grads_right_answers_pass(answer):
    fb = ch6.check_per_walker_grads(answer, seed=0)
    assert fb.passed, str(fb)


def test_grads_uncast_is_named_on_either_end():
    fb = ch6.check_per_walker_grads(grads_uncast, seed=1)
    assert not fb.passed
    first = fb.messages[0]  # the hint first: summed (0.12) or raised (0.8.2)
    assert "cast" in first and "varying" in first, str(fb)


def grads_mean_over_devices(w, x):
    return lax.pmean(grads_right(w, x), "data")


def grads_local_sum(w, x):
    g = grads_right(w, x)
    return jnp.broadcast_to(jnp.sum(g, axis=0), g.shape)


@pytest.mark.parametrize(
    "answer, words",
    [
        (grads_mean_over_devices, "the mean over devices"),
        (grads_local_sum, "the sum of its device's gradients"),
    ],
)
def test_grads_slips_named_first_then_where(answer, words):
    fb = ch6.check_per_walker_grads(answer, seed=0)
    assert not fb.passed and words in fb.messages[0], str(fb)
    found = re.search(
        r"point (\d+) \(device (\d), local index (\d)\), entry \((\d), (\d)\): "
        r"got (\S+), expected (\S+); off by",
        fb.messages[1],
    )
    assert found, str(fb)
    per_device = int(fb.messages[1].split(" points per device")[0].split(", ")[-1])
    walker = int(found.group(1))
    assert (int(found.group(2)), int(found.group(3))) == divmod(walker, per_device)


def test_grads_transposed_layout_named():
    def transposed(w, x):
        return jnp.swapaxes(grads_right(w, x), 1, 2)

    fb = ch6.check_per_walker_grads(transposed, seed=0)
    assert not fb.passed
    text = str(fb)
    hidden = int(text.split("H=")[1].split(",")[0])
    if hidden == 3:
        assert "each gradient is transposed" in fb.messages[0], text
    else:
        assert "each gradient transposed" in fb.messages[0], text


def test_grads_wrong_layout_and_stub():
    fb = ch6.check_per_walker_grads(grads_flat, seed=2)
    assert not fb.passed and "return (" in str(fb)
    assert not ch6.check_per_walker_grads(stub).attempted


def test_tolerance_pinned():
    assert ch6.TOL == 1e-12
    with pytest.raises(TypeError, match="seed"):
        ch6.check_clip(clip_right, seed="0")


# ---------------------------------------------- first messages that name the slip (#44)


def grads_psum(w, x):  # cast, then a psum over the devices: the same numbers as uncast
    return lax.psum(grads_right(w, x), "data")


def grads_of_sum(w, x):  # one gradient per device, of the sum over its points
    w = compat.pcast_varying(w, "data")
    return jax.grad(lambda v: jnp.sum(jax.vmap(ch6.toy_log_psi, (None, 0))(v, x)))(w)


def grads_float32(w, x):
    return grads_right(w.astype(jnp.float32), x.astype(jnp.float32))


def clip_float32(e_l):
    return clip_right(e_l.astype(jnp.float32))


@pytest.mark.parametrize(
    "answer,first",
    [
        (grads_psum, "a psum over 'data' adds the devices' gradients: drop it"),
        (grads_of_sum, "you returned one (3, "),
        (grads_float32, "your result is float32: the checker runs in float64"),
    ],
)
def test_grads_first_message_names_the_slip(answer, first):
    fb = ch6.check_per_walker_grads(answer, seed=0)
    assert not fb.passed and first in fb.messages[0], str(fb)
    assert "points per device" in fb.messages[1], str(fb)  # then where


def test_clip_float32_named_first():
    fb = ch6.check_clip(clip_float32, seed=0)
    assert not fb.passed, str(fb)
    assert fb.messages[0].startswith("your result is float32"), str(fb)
    assert "walkers per device" in fb.messages[1], str(fb)


def test_clip_per_device_mad_that_clips_nothing_is_named():
    """Seed 2 draws cases where a per-device MAD clips nothing in every failing case
    (the device holding the outlier gets the widest window): the first line must not
    read as if the answer had no clip at all (#44)."""
    fb = ch6.check_clip(clip_no_pmean, seed=2)
    assert not fb.passed
    assert fb.messages[0].startswith("nothing was clipped in the cases that fail"), str(
        fb
    )
    assert "a MAD of each device's own" in fb.messages[0], str(fb)
